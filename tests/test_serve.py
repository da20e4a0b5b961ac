"""tools.serve with --triton-home: an existing Triton install laid out as in NGC containers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient

from tools.lib.client import infer
from tools.lib.triton import TritonInstall

from .conftest import ROOT, free_port, processes_matching


def test_serves_from_an_existing_triton_home(tmp_path, repository):
    wheel = TritonInstall.from_wheel()
    home = tmp_path / "tritonserver"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "tritonserver").symlink_to(wheel.binary)
    shutil.copytree(wheel.python_backend, home / "backends" / "python")
    shutil.copy(wheel.stub, home / "backends" / "python" / "triton_python_backend_stub")
    # In a container the libraries are on the system path; here they come from the wheel.
    env = {**os.environ, "LD_LIBRARY_PATH": str(wheel.libs)}
    grpc_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.serve", "--triton-home", str(home), "--model-repository", str(repository),
         "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port())],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        for line in process.stdout:
            if "Triton is ready" in line:
                break
        assert process.poll() is None, "tools.serve exited early"
        threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            answer = infer(client, "resnet_like", {"image": np.ones((2, 3, 32, 32), np.float32)})
        assert answer["logits"].shape == (2, 10)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    time.sleep(0.1)
    assert not processes_matching(f"--grpc-port={grpc_port}")


def test_a_killed_serve_leaves_no_tritonserver_behind(tmp_path):
    """SIGKILL gives tools.serve no chance to stop Triton: the kernel stops it for us, and the
    ports are free again."""
    grpc_port = free_port()
    (tmp_path / "empty").mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.serve", "--model-repository", str(tmp_path / "empty"),
         "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port())],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    for line in process.stdout:
        if "Triton is ready" in line:
            break
    assert processes_matching(f"--grpc-port={grpc_port}")
    process.kill()
    process.wait(10)
    deadline = time.monotonic() + 30
    while processes_matching(f"--grpc-port={grpc_port}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_matching(f"--grpc-port={grpc_port}")

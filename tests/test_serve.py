"""tools.serve with --triton-home: an existing Triton install laid out as in NGC containers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tools.lib.client import infer
from tools.lib.processes import children_of, in_group
from tools.lib.triton import BACKENDS_PREFIX, REGION_PREFIX, SHARED_MEMORY, Server, TritonInstall, remove_orphans

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
    log = tmp_path / "serve.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tools.serve", "--triton-home", str(home), "--model-repository", str(repository),
             "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port())],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True,
        )
    try:
        deadline = time.monotonic() + 300
        while "Triton is ready" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.25)
        assert process.poll() is None, "tools.serve exited early: " + log.read_text()[-2000:]
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            answer = infer(client, "resnet_like", {"image": np.ones((2, 3, 32, 32), np.float32)})
        assert answer["logits"].shape == (2, 10)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"tools.serve ended with {code}: " + log.read_text()[-3000:]
    time.sleep(0.1)
    assert not processes_matching(f"--grpc-port={grpc_port}")


def test_a_killed_serve_leaves_no_tritonserver_behind(tmp_path):
    """SIGKILL gives tools.serve no chance to stop Triton: the kernel stops it for us, and the
    ports are free again. The backend folder it assembled is left, for the next server to remove."""
    grpc_port = free_port()
    (tmp_path / "empty").mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.serve", "--model-repository", str(tmp_path / "empty"),
         "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port())],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "Triton is ready" in line:
            break
    # (once it failed here with no tritonserver found; had it exited before it was ready, this says why)
    assert seen and "Triton is ready" in seen[-1], "tools.serve exited early: " + "".join(seen)[-2000:]
    assert processes_matching(f"--grpc-port={grpc_port}")
    process.kill()
    process.wait(10)
    deadline = time.monotonic() + 30
    while processes_matching(f"--grpc-port={grpc_port}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_matching(f"--grpc-port={grpc_port}")
    left = list(Path(tempfile.gettempdir()).glob(f"{BACKENDS_PREFIX}{process.pid}-*"))  # its backend folder
    assert left and set(left) <= set(remove_orphans())  # as the next server started removes it


def _serve(repository, *more: str) -> tuple[subprocess.Popen, int]:
    """tools.serve on ``repository`` (resnet_like loaded, in a stub), returned once it is ready."""
    grpc_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.serve", "--model-repository", str(repository), "--grpc-port", str(grpc_port),
         "--http-port", str(free_port()), "--metrics-port", str(free_port()), *more,
         "--", "--model-control-mode=explicit", "--load-model=resnet_like"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if "Triton is ready" in line:
            return process, grpc_port
    raise AssertionError(f"tools.serve exited early: {process.wait()}")



def _tritonserver(serve: subprocess.Popen) -> int:
    [pid] = [pid for pid, args in children_of(serve.pid).items() if args[0].endswith(b"tritonserver")]
    return pid


def _regions(serve: subprocess.Popen, grpc_port: int) -> list[Path]:
    """The Python backend's shared-memory regions of the tritonserver ``serve`` started."""
    return list(SHARED_MEMORY.glob(f"{REGION_PREFIX}{serve.pid}_{grpc_port}_*"))


def test_a_killed_tritonserver_leaves_no_stub_and_serve_says_so(repository):
    """SIGKILL on tritonserver itself (what the OOM killer does): its backend stubs, which ignore
    SIGTERM, are ended by pid, the stub's shared-memory region, which tritonserver removes only
    when it stops, is removed, and tools.serve exits with status 1 saying how Triton died."""
    serve, grpc_port = _serve(repository)
    triton = _tritonserver(serve)
    deadline = time.monotonic() + 30
    while len(in_group(triton)) < 2 and time.monotonic() < deadline:  # tritonserver and resnet_like's stub
        time.sleep(0.1)
    assert len(in_group(triton)) >= 2 and _regions(serve, grpc_port)
    os.kill(triton, signal.SIGKILL)
    assert serve.wait(60) == 1
    said = serve.stdout.read()
    assert "tritonserver killed by SIGKILL" in said and "backend stub(s) it left were ended" in said, said
    assert "and 1 shared-memory region(s) removed" in said, said
    assert not in_group(triton), "a stub outlived tritonserver"
    assert not _regions(serve, grpc_port)


def test_what_a_server_whose_starting_process_is_gone_left_is_removed_and_nothing_else():
    """A server's shared-memory regions and backend folder are named after the process that
    started it (``Server.region_prefix``, ``BACKENDS_PREFIX``): where that process no longer runs
    (killed with its tritonserver), the next server started removes them; a running process's,
    and files of other names, stay."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    mine, temp = os.getpid(), Path(tempfile.gettempdir())
    files = [SHARED_MEMORY / name for name in (f"{REGION_PREFIX}{gone.pid}_8001_test-{mine}",
                                               f"{REGION_PREFIX}{mine}_8001_test", f"{REGION_PREFIX}x_8001_test-{mine}",
                                               f"other_{gone.pid}_test-{mine}")]
    folders = [temp / f"{BACKENDS_PREFIX}{gone.pid}-test{mine}", temp / f"{BACKENDS_PREFIX}{mine}-test"]
    try:
        for path in files:
            path.write_bytes(b"0")
        for folder in folders:
            (folder / "python").mkdir(parents=True)
        removed = remove_orphans()  # (with any a killed server left on this host)
        assert {files[0], folders[0]} <= set(removed) and not set(removed) & {*files[1:], *folders[1:]}
        assert [p.exists() for p in files + folders] == [False, True, True, True, False, True]
    finally:
        for path in files:
            path.unlink(missing_ok=True)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_serve_restarts_a_dead_tritonserver_when_asked(repository):
    """--restart 1: the server comes back on the same port and serves; SIGTERM then stops it
    cleanly, and nothing of either tritonserver is left."""
    serve, grpc_port = _serve(repository, "--restart", "1")
    first = _tritonserver(serve)
    os.kill(first, signal.SIGKILL)
    for line in serve.stdout:
        if "Triton is ready" in line:
            break
    threading.Thread(target=serve.stdout.read, daemon=True).start()  # keep the pipe drained
    second = _tritonserver(serve)
    assert second != first and not in_group(first)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        deadline = time.monotonic() + 60
        while not client.is_model_ready("resnet_like") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert infer(client, "resnet_like", {"image": np.ones((1, 3, 32, 32), np.float32)})["logits"].shape == (1, 10)
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(60) == 0
    assert not in_group(second) and not _regions(serve, grpc_port)


def test_a_server_that_exits_before_it_logs_an_error_says_its_logs_first_line(tmp_path):
    """tritonserver refusing its command line exits 1 with no error line in its log (a fresh
    clone's soak once saw such an exit and said nothing more): the message carries the log's
    first line, which names what was refused."""
    (tmp_path / "repository").mkdir()
    server = Server(model_repository=tmp_path / "repository", grpc_port=free_port(), http_port=free_port(),
                    metrics_port=free_port(), log=tmp_path / "triton.log", extra_args=["--no-such-option=1"])
    with pytest.raises(RuntimeError, match="(?s)before it was ready.*unrecognized option '--no-such-option=1'"):
        server.start()


def test_a_server_that_cannot_start_says_its_models_errors_where_its_log_is_gone(tmp_path):
    """Tools serve from scratch folders they remove as the error rises (``tools.soak`` under a
    policy its model cannot run), so the message itself carries the log's error lines."""
    model = tmp_path / "repository" / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "dvabatch"\nmax_batch_size: 4\n'
                                        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
                                        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    server = Server(model_repository=tmp_path / "repository", grpc_port=free_port(), http_port=free_port(),
                    metrics_port=free_port(), log=tmp_path / "triton.log")
    try:
        server.start()
    except RuntimeError as exc:
        message = str(exc)
    else:
        server.stop()
        raise AssertionError("tritonserver started with a model that cannot load")
    assert "before it was ready" in message and "failed to load 'broken'" in message, message

"""The README's first command: build the example repository and run the demo against it."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT, free_port, processes_matching


def test_demo_prints_real_answers_from_triton(tmp_path):
    env = {**os.environ, "DVABATCH_CACHE": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "tools.build_examples"], cwd=ROOT, env=env, check=True)
    grpc_port = free_port()
    ports = ["--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port())]
    done = subprocess.run([sys.executable, "-m", "tools.demo", *ports], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"gRPC 127.0.0.1:{grpc_port}" in out
    for model in ("resnet_like", "unet_like", "bert_like"):
        assert model in out
    assert "Largest difference from the unsliced models" in out
    assert "data-type is 'FP64'" in out and "Triton stopped." in out
    assert not processes_matching(f"--grpc-port={grpc_port}")

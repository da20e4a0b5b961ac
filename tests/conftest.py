"""Fixtures: source models built here, a sliced repository, a real tritonserver over gRPC."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from slicer.slicing import SliceOptions, slice_model
from tools.lib import synthetic
from tools.lib.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
E2E_STAGES = {"resnet_like": 3, "unet_like": 3, "bert_like": 4}
MAX_BATCH = 8
# Short profiles: the tests check what the slicer does with its numbers, not the numbers' precision.
FAST = SliceOptions(max_batch_size=MAX_BATCH, lengths=(8, 64), warmup=1, node_repeats=3, stage_repeats=5)


def pytest_configure(config):
    config.addinivalue_line("markers", "wallclock: asserts times on the wall clock, which a loaded machine can "
                                       "miss by a scheduling delay: run once more where it fails")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("wallclock"):
            item.add_marker(pytest.mark.flaky(reruns=1))


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    return {name: synthetic.save(build(), folder / f"{name}.onnx") for name, build in synthetic.BUILDERS.items()}


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory) -> Path:
    """A tokenizer.json whose ids fit bert_like's vocabulary."""
    return synthetic.bert_like_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def repository(tmp_path_factory, sources) -> Path:
    repo = tmp_path_factory.mktemp("model_repository")
    for name, stages in E2E_STAGES.items():
        # The backend's default policy: tests choose their own knobs.
        slice_model(sources[name], repo / name, replace(FAST, stages=stages, policy_defaults=False))
    return repo


@pytest.fixture(scope="session")
def numpy_2_python(tmp_path_factory) -> Path:
    """A virtualenv's python3 with numpy 2 first, then every package of ours: a Python as the lent
    GPU machines have (numpy 2.5 beside torch), for the backend stubs (tests/test_stub_python.py)."""
    folder = tmp_path_factory.mktemp("numpy2")
    venv.create(folder, with_pip=False)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--target", str(site), "numpy>=2,<3"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"numpy 2 could not be installed here: {done.stderr.strip()[-200:]}")
    (site / "ours.pth").write_text("\n".join(sysconfig.get_path(k) for k in ("purelib", "platlib")) + "\n")
    return folder / "bin" / "python3"


@contextmanager
def serving(client, repository: Path, *names: str):
    """Models a test wrote into the shared repository, loaded for it, then unloaded and removed:
    tests that start a server on the whole repository later (``tools.serve`` loads every model
    in it) must not pay for them."""
    try:
        for name in names:
            client.load_model(name)
        yield
    finally:
        for name in names:
            client.unload_model(name)
            shutil.rmtree(repository / name, ignore_errors=True)


def processes_matching(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


class RunningServer:
    def __init__(self, process: subprocess.Popen, grpc_port: int, http_port: int, metrics_port: int, log: Path):
        self.process = process
        self.log = log  # what tools.serve and tritonserver printed, models' logs included
        self.url = f"127.0.0.1:{grpc_port}"
        self.http_url = f"127.0.0.1:{http_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.grpc_port = grpc_port


@pytest.fixture(scope="session")
def server(repository, tmp_path_factory) -> RunningServer:
    """`python -m tools.serve` as a user runs it (its output in ``server.log`` of a temporary
    folder); stopped with SIGTERM at the end of the session."""
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed at the end
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.serve", "--model-repository", str(repository),
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
         "--", "--model-control-mode=explicit", "--load-model=*"],  # tests load more models later
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        while True:
            assert process.poll() is None, "tools.serve exited before Triton was ready"
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            assert time.monotonic() < deadline, "Triton was not ready in 180 s"
            time.sleep(0.25)
    yield RunningServer(process, grpc_port, http_port, metrics_port, log_path)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    log.close()
    assert not processes_matching(f"--grpc-port={grpc_port}"), "tritonserver still running"
    assert not processes_matching(f"dvabatch_{process.pid}_"), "a Python backend stub still running"

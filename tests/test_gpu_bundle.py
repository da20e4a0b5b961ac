"""The bundle for a GPU host without network (``tools.gpu_bundle``), built for this machine's
Python: what it holds, its size, the host script's dry run, and its tritonserver serving a model
from the bundled project under the virtualenv the host script makes (the bundled numpy<2 first)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend.engines import OnnxRuntimeEngine
from backend.manifest import Manifest
from backend.sample import sample_inputs
from slicer.slicing import VERSION
from tools.lib.processes import children_of, free_port
from tools.lib.client import infer

from .conftest import ROOT
from tools.lib.bundle import LIMIT, TOP, TREE_BUDGET, bundle_files, tree_bytes

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    archive = folder / "dvabatch-gpu.tar.xz"
    done = subprocess.run([sys.executable, "-m", "tools.gpu_bundle", str(archive), "--python", PYTHON],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(folder)
    return archive, names, folder / TOP


def test_the_bundle_holds_what_the_host_needs_and_fits(bundle):
    archive, names, _ = bundle
    assert archive.stat().st_size <= LIMIT
    have = {name.removeprefix(f"{TOP}/") for name in names}
    for needed in ("host.sh", "BUNDLE.txt", "triton/bin/tritonserver", "triton/backends/python/libtriton_python.so",
                   f"triton/python_backend_stubs/{PYTHON}/triton_python_backend_stub",
                   "perf_analyzer/bin/perf_analyzer", "perf_analyzer/lib/perf_analyzer/libcudart.so.12",
                   "glue/RTE/dev.tsv", "glue/SST-2/dev.tsv", "project/backend/engines/onnx_torch.py",
                   "project/Makefile"):
        assert needed in have, needed
    assert any(n.startswith("triton/lib/libtritonserver") for n in have)
    assert any(n.startswith("wheels/numpy-1.") for n in have)
    assert any(n.startswith("wheels/tritonclient-") for n in have)
    assert not any(n.endswith((".onnx", ".plan")) for n in have), "no model files travel"
    without = bundle_files(PYTHON, project=False)
    assert "host.sh" in without and not any(name.startswith("project/") for name in without)


def test_the_working_tree_leaves_the_bundle_its_room_on_a_lent_machine():
    """A lent GPU machine takes the working tree and the bundle built without the project together,
    at most LIMIT: the tree must stay within its share, or a session's device time is lost to a
    carry that does not fit (the plots of docs/results had grown to 6 MB before they were saved
    in a palette)."""
    tree = tree_bytes()
    assert tree <= TREE_BUDGET, (f"the working tree is {tree / 2**20:.1f} MiB, more than the {TREE_BUDGET / 2**20:.0f} "
                                 f"MiB it may take beside the GPU bundle: shrink what docs/results keeps")


def test_the_host_script_dry_run_checks_and_plans_every_step(bundle):
    _, _, top = bundle
    done = subprocess.run([str(top / "host.sh"), "--dry-run", "all", "cost", "auto", "gpu_test", "dispatch", "send"],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for said in ("matches the bundled stub", "every library found", "perf_analyzer 2.51.0 runs",
                 "tools.models bert_base resnet50_tv --target torch --device cuda", "tests/test_cuda.py",
                 "tools.compare", "glue:RTE", "glue:SST-2", "tools.bench_cost",
                 "zero_2stages.json --models plain,auto --concurrency 1", "DVABATCH_TRACE=",
                 "tools.check_auto --concurrency 1,16,64", "tools.send_cost --rounds 2",
                 "tools.bench_dispatch docs/profiles/bert_base_trt_a100_2stages.json"):
        assert said in done.stdout, said
    exports = subprocess.run([str(top / "host.sh"), "env"], capture_output=True, text=True,
                             env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert exports.returncode == 0, exports.stdout + exports.stderr
    for export in (f"export PYTHONPATH={top / 'project'}", f"export PATH={top / 'work' / 'venv' / 'bin'}:"):
        assert export in exports.stdout, exports.stdout
    wrong = subprocess.run([str(top / "host.sh"), "measur"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown step" in wrong.stderr


def test_one_short_lease_runs_every_gpu_step_on_a_checkout_beside_the_bundle(bundle, tmp_path):
    """``gpu``: models in FP16 up to 64 rows, the engine benchmark, the cost benchmark and the GPU
    tests, then one archive; ``--project`` runs a checkout (a bundle built with --no-project has
    none, and says so)."""
    _, _, top = bundle
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run([str(top / "host.sh"), "--dry-run", "--project", str(ROOT), "--out", str(tmp_path / "r"),
                           "gpu"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line[3:] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert steps == ["check", "setup", "models", "gpu_test", "cost", "engine", "archive"]
    for said in ("--precision fp16 --max-batch-size 64", "tools.engine_bench", "--reference bert_base",
                 "--reference resnet50", "tools.bench_cost", "--rounds 1", "--seconds 2",
                 f"tar czf {tmp_path / 'r'}.tar.gz",
                 f"cd \"{ROOT}\" && DVABATCH_TEST_DEVICE=GPU"):
        assert said in done.stdout, said
    missing = subprocess.run([str(top / "host.sh"), "--project", str(tmp_path), "env"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert missing.returncode == 2 and "no project at" in missing.stderr


def test_on_a_host_whose_python_has_numpy_2_the_bundled_stack_serves_the_bundled_project(bundle, repository, sources,
                                                                                       numpy_2_python):
    """host.sh setup on a Python whose numpy is 2 (as the lent GPU machines' is), then tools.serve
    from the bundled project on the bundled tritonserver (its libraries from the bundle alone) with
    the virtualenv setup made: its stubs get numpy<2 (the one Python they run), and a sliced model
    answers as the unsliced one does."""
    _, _, top = bundle
    env = {**os.environ, "PYTHON": str(numpy_2_python)}
    done = subprocess.run([str(top / "host.sh"), "setup"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "numpy 1." in done.stdout
    env |= {"PYTHONPATH": str(top / "project"), "DVABATCH_TRITON_HOME": str(top / "triton")}
    port = free_port()
    serve_python = top / "work" / "venv" / "bin" / "python3"
    server = subprocess.Popen([str(serve_python), "-m", "tools.serve", "--model-repository", str(repository),
                               "--grpc-port", str(port), "--http-port", str(free_port()),
                               "--metrics-port", str(free_port()), "--", "--model-control-mode=explicit",
                               "--load-model=resnet_like"], cwd=top / "project", env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            for _ in range(600):
                try:
                    if client.is_model_ready("resnet_like"):
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                assert server.poll() is None, server.stdout.read().decode()
                time.sleep(0.2)
            triton = [pid for pid, args in children_of(server.pid).items() if args[0].endswith(b"tritonserver")]
            assert [os.readlink(f"/proc/{pid}/exe") for pid in triton] == [str(top / "triton" / "bin" / "tritonserver")]
            manifest = Manifest.load(repository / "resnet_like" / VERSION)
            feed = sample_inputs(manifest.inputs, 2, {}, seed=5)
            answer = infer(client, "resnet_like", feed)
        expected = OnnxRuntimeEngine(sources["resnet_like"], [o.name for o in manifest.outputs]).run(feed)
        for name, value in expected.items():
            np.testing.assert_allclose(answer[name], value, atol=1e-4)
    finally:
        server.terminate()
        server.communicate(timeout=60)

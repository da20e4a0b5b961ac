"""The CUDA path: streams per executor, events per buffer, rows handed over without the host
waiting. Needs a GPU and torch with CUDA; skipped elsewhere. Timed stages keep their stream busy
(``torch.cuda._sleep``) and copy rows on it, so a missing event wait shows up as wrong rows."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from backend.config import RuntimeConfig
from backend.device import CudaDevice, make_device
from backend.engines import OnnxRuntimeEngine, load_engines, run_stages
from backend.manifest import Manifest
from backend.policy import RandomPolicy
from backend.query import Query
from backend.runtime import Runtime
from backend.sample import sample_inputs
from slicer.slicing import VERSION, slice_model

from .conftest import FAST
from .test_faults import Flaky, FlakyEngine, FlakyPolicy, assert_recovered
from .timed import timed_manifest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


TABLE = {"batch_sizes": [1, 2, 4, 8], "mean": [1.0, 1.5, 2.0, 3.0]}


def own_rows(key: int, rows: int) -> np.ndarray:
    return (np.arange(rows * 16) + 1000 * key).astype(np.float32).reshape(rows, 16)


def test_rows_copied_out_land_once_the_stream_is_finished_and_the_host_goes_on_meanwhile():
    """``copy_out`` queues the copy behind the stream's work (here a timed engine's 50 ms) and
    returns at once, the stream still busy; the rows are in the host array once the stream is
    finished: what lets ``WholeBatch`` build its responses while the engines compute. (How long
    the spinning kernel takes follows the GPU's clock, which changes under load: the ordering is
    what the device promises, not the 50 ms.)"""
    device = CudaDevice(0)
    device.busy(0)  # measures the GPU's clock first
    stream = device.stream()
    with device.running_on(stream):
        x = device.from_host(own_rows(1, 4))
        # Not what is tested, both seen on an H200: the first pinned block of a process takes a
        # while, and the first launch of a kernel waits for the device (CUDA loads its module
        # lazily: `x * 2` took the whole 0.2 s spin the first time, 0.1 ms after).
        device.copy_out(x * 2)
        device.finish(stream)
        device.busy(0.2)
        host = device.copy_out(x * 2)
        assert not stream.query(), "copy_out waited for the stream"
    device.finish(stream)
    assert stream.query() and np.array_equal(host, own_rows(1, 4) * 2)


def burst(runtime: Runtime, count: int, seed: int) -> dict[int, list]:
    """``count`` queries of 1-3 rows that only they have, some back to back: key -> answers."""
    answers: dict[int, list] = {}
    done = threading.Condition()

    def query(key: int, rows: int) -> Query:
        def respond(outputs, failure):
            with done:
                answers.setdefault(key, []).append((outputs, failure))
                done.notify_all()
        return Query({"x": own_rows(key, rows)}, respond)

    rng = np.random.default_rng(seed)
    for key in range(count):
        runtime.submit([query(key, int(rng.integers(1, 4)))])
        if key % 3 == 0:
            threading.Event().wait(0.001 * int(rng.integers(0, 3)))
    with done:
        assert done.wait_for(lambda: len(answers) == count, timeout=120)
    for key, got in answers.items():
        assert len(got) == 1, f"query {key} answered {len(got)} times"
    return answers


def answer_all(runtime: Runtime, feeds: list[dict], pause=lambda: None) -> dict[int, list]:
    """Every feed submitted as a query of its own (``pause()`` after each); key -> its answers,
    once every query has one."""
    answers: dict[int, list] = {}
    done = threading.Condition()

    def query(key: int) -> Query:
        def respond(outputs, failure):
            with done:
                answers.setdefault(key, []).append((outputs, failure))
                done.notify_all()
        return Query(feeds[key], respond)

    for key in range(len(feeds)):
        runtime.submit([query(key)])
        pause()
    with done:
        assert done.wait_for(lambda: len(answers) == len(feeds), timeout=120)
    return answers


def assert_own_rows(key: int, outputs: dict) -> None:
    x = outputs["x"]
    np.testing.assert_array_equal(x, own_rows(key, len(x)))


@pytest.mark.parametrize("pairs", [1, 2, 3])
def test_random_meta_operations_keep_rows_exact_on_cuda(pairs):
    manifest = timed_manifest([TABLE] * 4, dims=(16,))
    device = make_device("GPU")
    runtime = Runtime(manifest, load_engines(manifest, ".", device),
                      RuntimeConfig(buffer_pairs=pairs, policy=RandomPolicy(seed=pairs, stretch_probability=0.9,
                                                                            split_probability=0.4)), device)
    answers = burst(runtime, 300, seed=pairs)
    runtime.close()
    for key, [(outputs, failure)] in answers.items():
        assert failure is None, failure
        assert_own_rows(key, outputs)


class FlakyCuda(CudaDevice):
    """Fails at random after recording an event: the launch happened, the hand-over did not."""

    def __init__(self, flaky: Flaky):
        super().__init__()
        self.flaky = flaky

    def record(self, event, stream):
        super().record(event, stream)
        self.flaky.maybe("device")


@pytest.mark.parametrize("pairs", [1, 2])
def test_faults_on_cuda_return_buffers_and_keep_rows_exact(pairs):
    """Engine, device and policy faults at random under random meta operations, on streams and
    events: every query answered once, every good answer its own rows, nothing left held, and
    the model serves as before once the faults stop."""
    flaky = Flaky(seed=pairs, p=0.05)
    manifest = timed_manifest([TABLE] * 3, dims=(16,))
    device = FlakyCuda(flaky)
    runtime = Runtime(manifest, [FlakyEngine(e, flaky) for e in load_engines(manifest, ".", device)],
                      RuntimeConfig(buffer_pairs=pairs, policy=FlakyPolicy(flaky, pairs)), device)
    answers = burst(runtime, 200, seed=pairs)
    good = {key for key, [(_, failure)] in answers.items() if failure is None}
    assert 0 < len(good) < len(answers), "faults happened, and not to everything"
    for key in good:
        assert_own_rows(key, answers[key][0][0])
    flaky.on = False
    assert_recovered(runtime)
    for key, [(outputs, failure)] in burst(runtime, 60, seed=100 + pairs).items():
        assert failure is None, failure
        assert_own_rows(key, outputs)
    runtime.close()


def test_torch_stages_run_real_kernels_through_the_pipeline(sources, tmp_path):
    """bert_like sliced for torch on the GPU (a KIND_GPU model), served by the pipeline on
    streams and events under random meta operations: every answer equals the unsliced model's
    on ONNX Runtime (TF32 off), and the model serves fused too."""
    out = tmp_path / "bert_torch"
    slice_model(sources["bert_like"], out, replace(FAST, stages=3, target="torch", device="cuda"))
    manifest = Manifest.load(out / VERSION)
    assert manifest.slicing.device == "cuda" and "kind: KIND_GPU" in (out / "config.pbtxt").read_text()
    device = make_device("GPU")
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    rng = np.random.default_rng(1)
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, {"sequence": 24}, seed=i) for i in range(60)]
    runtime = Runtime(manifest, load_engines(manifest, out / VERSION, device),
                      RuntimeConfig(policy=RandomPolicy(seed=3, stretch_probability=0.5, split_probability=0.3)),
                      device)
    answers = answer_all(runtime, feeds, lambda: threading.Event().wait(0.002) if rng.random() < 0.3 else None)
    runtime.close()
    [fused] = load_engines(manifest, out / VERSION, device, fused=True)
    for key, [(outputs, failure)] in answers.items():
        assert failure is None, failure
        for name, expected in reference.run(feeds[key]).items():
            np.testing.assert_allclose(outputs[name], expected, atol=1e-4, rtol=0)
            got = device.to_host(fused.run({k: device.from_host(v) for k, v in feeds[key].items()})[name])
            np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_torch_stages_replay_a_cuda_graph_per_bucket_as_the_interpreter_computes(sources, tmp_path):
    """Every bucket of every stage is captured at load (none falls back to eager), and a batch
    between buckets replays the next one's graph with the interpreter's results."""
    from backend.engines import describe_graphs, graph_buckets

    device = make_device("GPU")
    for name, length in (("bert_like", 8), ("resnet_like", None)):
        out = tmp_path / name
        slice_model(sources[name], out, replace(FAST, stages=2, target="torch", device="cuda"))
        manifest = Manifest.load(out / VERSION)
        rows, lengths = graph_buckets(manifest)
        engines = load_engines(manifest, out / VERSION, device, graphs=True)
        eager = load_engines(manifest, out / VERSION, device)
        for engine in engines:
            assert not engine.graphs.failures, engine.graphs.failures
            assert engine.graphs.graphs == len(rows) * max(1, len(lengths))
        assert "MiB" in describe_graphs(engines)
        feed = sample_inputs(manifest.inputs, 3, {"sequence": length} if length else {}, seed=2)
        with device.running_on(device.stream()):
            got = run_stages(engines, manifest.stages, {k: device.from_host(v) for k, v in feed.items()})
            want = run_stages(eager, manifest.stages, {k: device.from_host(v) for k, v in feed.items()})
            for key, value in want.items():
                np.testing.assert_allclose(device.to_host(got[key]), device.to_host(value), atol=1e-5, rtol=0)


def test_a_model_served_with_cuda_graphs_answers_every_length_as_the_source(sources, tmp_path):
    """The backend's own wiring on a GPU instance (cuda_graphs auto): random meta operations in
    the pipeline, each batch padded to a length bucket, every answer cut back to its own length
    and equal to the unsliced model's on ONNX Runtime; the fused model too."""
    from backend.metrics import Metrics
    from backend.serving import serve

    out = tmp_path / "bert_torch"
    slice_model(sources["bert_like"], out, replace(FAST, stages=3, target="torch", device="cuda"))
    manifest = Manifest.load(out / VERSION)
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    config = RuntimeConfig(policy=RandomPolicy(seed=5, stretch_probability=0.5, split_probability=0.3))
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, {"sequence": 3 + 5 * (i % 12)}, seed=i) for i in range(40)]
    for feed in feeds:  # as in real text: a row whose every token is masked changes with its padding
        feed["attention_mask"][:, 0] = 1
    decision, runtime = serve(manifest, out / VERSION, config, make_device("GPU"), Metrics())
    assert "graphs" in decision.graphs and "eager" not in decision.graphs, decision.graphs
    answers = answer_all(runtime, feeds)
    runtime.close()
    for key, [(outputs, failure)] in answers.items():
        assert failure is None, failure
        for name, expected in reference.run(feeds[key]).items():
            np.testing.assert_allclose(outputs[name], expected, atol=1e-4, rtol=0)


def test_fp16_stages_on_the_gpu_agree_with_the_fp32_source(sources, tmp_path):
    for name in ("bert_like", "resnet_like"):
        result = slice_model(sources[name], tmp_path / name, replace(FAST, stages=2, target="torch", device="cuda",
                                                                    precision="fp16"))
        assert result.cosine >= 0.9999, (name, result.cosine, result.max_abs_error)


def test_the_host_time_spent_waiting_for_the_gpu_is_counted_apart_from_serving():
    """CUDA spins while the host waits for a stream (one context on a many-core host), so a
    process's CPU time counts the engines' time as serving work; the device counts the waits
    (``Device.waited_s``) for ``calibrate.host_cpu_s`` to take them out: 50 ms of a spinning
    kernel waited for adds about 50 ms there and far less to the host's serving CPU."""
    from backend.calibrate import host_cpu_s

    device = CudaDevice()
    stream = device.stream()
    with device.running_on(stream):
        device.busy(0.001)
    device.finish(stream)
    waited, cpu = device.waited_s, host_cpu_s(device)
    with device.running_on(stream):
        device.busy(0.05)
    device.finish(stream)
    assert device.waited_s - waited >= 0.04
    assert host_cpu_s(device) - cpu < 0.02


def test_the_gpus_energy_counter_rises_while_it_computes():
    """NVML's counter for the instance's GPU, found by its CUDA UUID (``policy: smdp``'s energy
    per batch): it rises while the GPU spins for half a second. Where the driver has no NVML or
    the GPU no counter, ``energy_counter`` says why (skipped: the policy keeps its proxy)."""
    from backend.nvml import NvmlError

    device = CudaDevice(0)
    try:
        counter = device.energy_counter()
    except NvmlError as exc:
        pytest.skip(str(exc))
    before = counter()
    device.busy(0.5)
    torch.cuda.synchronize()
    assert counter() - before > 1.0  # joules: an H100 idles at some 70 W


def test_policy_smdp_with_a_power_weight_measures_the_gpus_energy_per_batch(tmp_path):
    """Loading ``policy: smdp`` with a power weight on a GPU instance: every size's batches run
    through the timed stages, and the policy weighs the joules NVML counted (more for 8 rows,
    which spin the GPU longer, than for one)."""
    from backend.config import make_policy
    from backend.metrics import Metrics
    from backend.nvml import NvmlError
    from backend.serving import serve

    try:
        CudaDevice(0).energy_counter()
    except NvmlError as exc:
        pytest.skip(str(exc))
    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [5.0, 20.0]}] * 2, dims=(16,))
    policy = make_policy("smdp", {"power_weight": "1"})
    said: list[str] = []
    _, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=policy), make_device("GPU"), Metrics(),
                       said=said.append)
    runtime.close()
    assert any("from the GPU's counter" in line for line in said), said
    energy = policy.problem(None, 100.0).energy
    assert energy[7] > energy[0] > 0, energy

"""Pure logic without Triton or CUDA: buffer states, the batch table, executor states, knobs."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from backend.batch_table import BatchItem, BatchTable
from backend.buffers import Boundary, BufferState
from backend.config import RuntimeConfig
from backend.device import CpuDevice
from backend.engines import describe_pins, load_engines, ort_options
from backend.executor import ExecutorState
from backend.host import Cpus, Machine, cgroup_quota, core_groups, cpus, instances_of, machine
from backend.interface import InterfaceError, check
from backend.errors import ConfigError
from backend.manifest import Manifest, TensorSpec
from backend.metrics import Metrics
from backend.padding import cut, stack
from backend.policy import FixedPolicy, RandomPolicy
from backend.query import Query
from slicer.slicing import VERSION

from .timed import Clock, flat, timed_manifest

A, V, R, W = BufferState.AVAILABLE, BufferState.INVALID, BufferState.INREADING, BufferState.INWRITING


def query(rows: int = 1, width: int = 4) -> Query:
    return Query({"x": np.zeros((rows, width), np.float32)}, lambda outputs, failure: None)


def test_buffer_states_follow_write_read_release():
    boundary = Boundary(0, buffer_pairs=2)
    out = boundary.claim_output(keep=None)
    assert boundary.states() == [W, A]
    boundary.written(out, claims=1)
    assert boundary.states() == [V, A]
    second = boundary.claim_output(keep=None)  # the other buffer: parallel manner
    assert second.index == 1 and boundary.states() == [V, W]
    boundary.written(second, claims=1)
    with pytest.raises(RuntimeError, match="no available buffer"):
        boundary.claim_output(keep=None)
    reading = boundary.start_reading(0)
    assert boundary.states() == [R, V]
    boundary.done_reading(reading)
    assert boundary.states() == [V, V], "read rows stay invalid until the consumer goes active"
    boundary.release()
    assert boundary.states() == [A, V]


def test_a_buffer_with_rows_for_several_items_is_released_after_the_last():
    boundary = Boundary(0, buffer_pairs=1)
    out = boundary.claim_output(keep=None)
    boundary.written(out, claims=2)  # a split pushes two parts reading the same buffer
    for expected in (V, A):
        boundary.done_reading(boundary.start_reading(0))
        boundary.release()
        assert boundary.states() == [expected]


def test_kept_rows_are_written_beside_not_over():
    boundary = Boundary(0, buffer_pairs=1)
    out = boundary.claim_output(keep=None)
    boundary.written(out, claims=1)  # a batch keeps its rows here while late rows catch up
    assert boundary.claim_output(keep=0) is out and boundary.states() == [W]
    boundary.written(out, claims=0)
    with pytest.raises(RuntimeError, match="expected invalid"):
        boundary.start_reading(0) and boundary.start_reading(0)


def test_producers_take_the_buffer_free_longest_and_reuse_storage_across_lengths():
    """On a GPU a buffer's readers may still run when the host frees it, so the producer takes
    the one freed longest ago; and rows of varying lengths reuse one growing allocation."""
    boundary = Boundary(0, buffer_pairs=2)
    first = boundary.claim_output(None)
    boundary.written(first, 1)
    boundary.done_reading(boundary.start_reading(first.index))
    boundary.release()
    assert boundary.claim_output(None).index != first.index
    device, buffer = CpuDevice(), boundary.buffers[0]
    allocations = []
    for length in (8, 64, 16, 64, 8):
        rows = buffer.rows("x", np.ones((2, length), np.float32), 4, device.empty)
        assert rows.shape == (4, length)
        rows[:2] = length
        allocations.append(id(buffer.storage["x"]))
    assert len(set(allocations)) == 2  # 8, then 64; 16 and 8 fit in it


def test_batch_table_new_stretch_merge_split_and_rows():
    table = BatchTable(stages=3, max_batch_size=8)
    q0, q1, q2 = query(2), query(1), query(3)
    first = table.new([q0], now=0.0)
    assert first == BatchItem(0, 0, 2)
    assert table.stretch_candidate(query(1, width=5)) is None, "different shapes never merge"
    assert table.complete(0, first, buffer=1) == [BatchItem(0, 0, 2, 1)]
    late = table.stretch(0, [q1, q2])
    assert late == BatchItem(0, 2, 4) and table.get(0).bs == 6
    assert table.complete(1, BatchItem(0, 0, 2, 1), buffer=0) == [], "held until the late rows catch up"
    assert table.kept_buffer(1, 0) == 0
    assert table.complete(0, late, buffer=0) == [BatchItem(0, 2, 4, 0)]
    merged = table.complete(1, BatchItem(0, 2, 4, 0), buffer=0)
    assert merged == [BatchItem(0, 0, 6, 0)] and table.get(0).status == [6, 6, 0]
    parts = table.split(1, merged[0], [3, 3])
    assert [p.num for p in parts] == [3, 3] and all(p.buffer == 0 for p in parts)
    second = table.get(parts[1].batch_id)
    assert second.offset == 3 and not second.stretchable and second.status == [3, 3, 0]
    # q2's three rows are batch rows 3..5: the second part holds all of them; q1 is the first part's row 2.
    assert [(m.query, m.query_row, m.row, m.rows) for m in second.members] == [(q2, 0, 0, 3)]
    assert table.complete(2, parts[0], None) == [parts[0]] and len(table) == 1
    assert table.complete(2, parts[1], None) == [parts[1]] and len(table) == 0


def test_split_batches_are_never_stretched():
    table = BatchTable(stages=2, max_batch_size=8)
    table.new([query()], now=0.0, stretchable=False)
    assert table.stretch_candidate(query()) is None
    with pytest.raises(ValueError):
        table.split(0, BatchItem(0, 0, 1), [1, 0])


def test_executor_states_serial_manner():
    """One buffer pair: while a batch is in the last stage the earlier executors are inactive,
    and every executor goes active, checking, working in that order for each batch."""
    clock = Clock(timed_manifest([flat(30)] * 3), RuntimeConfig(buffer_pairs=1))
    clock.submit(clock.query(0, length=8), clock.query(1, length=16))
    seen = []
    while len(clock.answers) < 1:
        seen.append([e.state for e in clock.runtime.executors])
        threading.Event().wait(0.005)
    clock.wait(2)
    assert [ExecutorState.INACTIVE, ExecutorState.INACTIVE, ExecutorState.WORKING] in seen
    for executor in clock.runtime.executors:
        history = [s for s in executor.history if s is not ExecutorState.INACTIVE]
        assert history[:4] == [ExecutorState.ACTIVE, ExecutorState.CHECKING, ExecutorState.WORKING,
                               ExecutorState.ACTIVE]


@pytest.mark.parametrize("parameters, message", [
    ({"buffer_pairs": "0"}, "'buffer_pairs' must be at least 1"),
    ({"buffer_pairs": "two"}, "'buffer_pairs' must be an int"),
    ({"batch_window_ms": "-2"}, "'batch_window_ms' must be >= 0, or -1"),
    ({"pad_value.ids": "x"}, "'pad_value.ids' must be a float"),
    ({"policy": "auto", "policy.statistic": "p50"}, "'policy.statistic' is 'p50'"),
    ({"policy": "fastest"}, "'policy' is 'fastest'"),
    ({"policy": "fixed", "policy.split_after": "x"}, "'policy.split_after' must be an int"),
    ({"policy": "random", "policy.speed": "1"}, "'policy.speed' is not a setting"),
    ({"policy": "random", "policy.split_probability": "2"}, "'policy.split_probability' must be between"),
    ({"buffer_pair": "2"}, "'buffer_pair' is unknown"),
])
def test_invalid_knobs_name_the_parameter(parameters, message):
    with pytest.raises(ConfigError, match=message):
        RuntimeConfig.from_parameters(parameters)


def test_knobs_have_working_defaults_and_parse():
    assert RuntimeConfig.from_parameters({}).buffer_pairs == 3
    config = RuntimeConfig.from_parameters({"policy": "fixed", "policy.stretch_latest": "true",
                                            "policy.split_after": "1", "buffer_pairs": "1"})
    assert config.policy == FixedPolicy(stretch_latest=True, split_after=1) and config.buffer_pairs == 1
    assert isinstance(RuntimeConfig.from_parameters({"policy": "random", "policy.seed": "3"}).policy, RandomPolicy)


def test_a_cpu_stream_stays_busy_with_a_timed_engines_work_while_the_host_goes_on():
    """``busy`` queues simulated work on the thread's current stream and returns at once, as
    work queued on a GPU's stream does; ``finish`` and ``to_host`` wait it out, ``copy_out``
    does not."""
    device = CpuDevice()
    stream = device.stream()
    with device.running_on(stream):
        began = time.monotonic()
        device.busy(0.05)
        device.busy(0.05)  # after the first
        assert stream.due >= began + 0.1
        rows = device.copy_out(np.ones(3))
        returned = time.monotonic()
        assert returned < stream.due and rows.sum() == 3  # it did not wait (else it returns after due)
        device.to_host(rows)
        assert time.monotonic() >= stream.due
        device.busy(0.05)
    device.finish(stream)
    assert time.monotonic() - began >= 0.15


def test_engines_and_devices_fail_clearly_where_they_cannot_run(tmp_path):
    from backend.device import CpuDevice, make_device
    from backend.engines import load_engine
    from backend.manifest import StageSpec, TensorSpec

    x = (TensorSpec("x", "float32", (4,)),)
    trt_stage = StageSpec(0, "stage_0.plan", "tensorrt", x, x)
    with pytest.raises(ValueError, match="tensorrt stage cannot run on cpu"):
        load_engine(trt_stage, tmp_path, CpuDevice())
    with pytest.raises(ValueError, match="a timed stage needs a 'latency' table"):
        load_engine(StageSpec(0, "", "timed", x, x), tmp_path)
    with pytest.raises(ValueError, match="unknown engine 'tvm'"):
        load_engine(StageSpec(0, "", "tvm", x, x), tmp_path)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        with pytest.raises(RuntimeError, match="CUDA device needs"):
            make_device("GPU")


def test_spinning_is_automatic_only_where_one_session_runs_at_a_time():
    auto = RuntimeConfig.from_parameters({})
    assert auto.spins(alone=True) and not auto.spins(alone=False)
    assert not RuntimeConfig.from_parameters({"allow_spinning": "false"}).spins(alone=True)
    assert RuntimeConfig.from_parameters({"allow_spinning": "true"}).spins(alone=False)
    with pytest.raises(ConfigError, match="allow_spinning"):
        RuntimeConfig.from_parameters({"allow_spinning": "sometimes"})


def _cgroup(tmp_path, lines: str, files: dict[str, str]):
    """A /proc/self/cgroup and a cgroup mount holding ``files`` (path under the mount: text)."""
    (tmp_path / "proc").write_text(lines)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    return tmp_path / "proc", tmp_path / "fs"


@pytest.mark.parametrize("lines, files, quota", [
    # v2 in a container (a cgroup namespace: its own cgroup is the mount's root), docker --cpus=1.5
    ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),
    # v2 on a host: the tightest along the path binds (a slice's limit over its service's none)
    ("0::/kube.slice/pod1/c1\n", {"cpu.max": "max 100000", "kube.slice/cpu.max": "400000 100000",
                                   "kube.slice/pod1/cpu.max": "200000 100000",
                                   "kube.slice/pod1/c1/cpu.max": "max 100000"}, 2.0),
    # v1, its path absent under a mount bound to the container's own cgroup (docker without cgroupns)
    ("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.5),
    # v1 with no quota (-1), v2 unified beside it (a hybrid host) with none either
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
                          "unified/cgroup.procs": ""}, None),
    ("0::/\n", {}, None),  # nothing readable: no quota
])
def test_the_cgroup_cpu_quota_is_read_in_either_version(tmp_path, lines, files, quota):
    assert cgroup_quota(*_cgroup(tmp_path, lines, files)) == quota


def test_tables_measured_on_another_machine_are_said_to_be_so(tmp_path):
    """A model sliced on one machine and served on another decides on the first one's times: the
    CPU's model and its cores on the CPU, the GPU's model on a GPU (whatever its host); a manifest
    written by a later slicer, with more to say of the machine, still reads."""
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\n")
    here = machine(lent=Cpus(2), cpuinfo=tmp_path / "cpuinfo")
    assert here == Machine("AMD EPYC 7B13", 2) and machine(cpuinfo=tmp_path / "none").cpu == ""
    assert here.moved_from(Machine("AMD EPYC 7B13", 2.0)) == ""
    assert "measured on 16 CPUs of Intel Xeon; it serves on 2 CPUs of AMD EPYC 7B13" in here.moved_from(
        Machine("Intel Xeon", 16))
    assert here.moved_from(Machine("AMD EPYC 7B13", 1))  # fewer cores: ONNX Runtime's sessions took other times
    h200 = Machine("AMD EPYC 7B13", 2, "NVIDIA H200")
    assert h200.moved_from(Machine("Intel Xeon", 16, "NVIDIA H200")) == ""
    assert "NVIDIA H100" in h200.moved_from(Machine("AMD EPYC 7B13", 2, "NVIDIA H100"))
    assert Machine.from_json({"cpu": "x", "cpus": 4, "gpu": "", "memory": "1 TB"}) == Machine("x", 4)
    assert Machine.from_json({"cpus": "two"}) is None and Machine.from_json([]) is None  # unreadable: no verdict


def test_a_cpu_quota_caps_the_cores_and_threads_a_model_takes(tmp_path):
    assert (Cpus(64, 2.0).limit, Cpus(64, 2.0).threads) == (2.0, 2)
    assert (Cpus(64, 1.5).limit, Cpus(64, 1.5).threads) == (1.5, 1)  # the rest of the quota: the stub, tritonserver
    assert (Cpus(64, 0.25).threads, Cpus(2, 8.0).limit, Cpus(4).threads, Cpus(64, 2.5).threads) == (1, 2, 4, 2)
    assert Cpus(2).describe() == "2 cores"
    assert "quota" in Cpus(64, 2.5).describe() and "2 threads" in Cpus(64, 2.5).describe()
    unread = cpus(1, tmp_path / "no-proc", tmp_path / "no-mount", tmp_path / "no-sysfs")
    assert unread == Cpus(len(os.sched_getaffinity(0))) and unread.threads == unread.pinned
    # instances on the CPU share it: each instance's sessions take its share
    assert (Cpus(16, None, 2).threads, Cpus(16, 4.0, 3).threads, Cpus(2, None, 4).threads) == (8, 1, 1)
    assert Cpus(16, None, 2).describe() == "16 cores shared by 2 instances: 8 threads a session"
    assert cpus(2, tmp_path / "no-proc").instances == 2
    # ... and of what the mode switch credits the stub and tritonserver with
    assert (Cpus(16, None, 4).share, Cpus(64, 1.5, 2).share) == (4.0, 0.75)
    # every instance counts, a GPU group's once per GPU it lists (Triton's config JSON)
    groups = [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}, {"kind": "KIND_CPU", "count": 3}, {"kind": "KIND_GPU"}]
    assert (instances_of({"instance_group": groups}), instances_of({})) == (8, 1)


def test_a_session_takes_physical_cores_not_their_hyperthreads(tmp_path):
    for cpu, siblings in enumerate(("0,2", "1,3", "0,2", "1,3")):  # two cores, two threads each
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "core_cpus_list").write_text(siblings + "\n")
    assert (core_groups({0, 1, 2, 3}, tmp_path), core_groups({0, 2}, tmp_path)) == (((0, 2), (1, 3)), ((0, 2),))
    assert core_groups({0, 4}, tmp_path) == ()  # a CPU whose topology cannot be read: count them all
    smt = tuple((core, core + 16) for core in range(16))  # 32 CPUs, 16 cores
    assert (Cpus(32, None, 1, smt).threads, Cpus(32, 4.0, 1, smt).threads, Cpus(32, None, 2, smt).threads) == (16, 4, 8)
    assert Cpus(32, None, 1, smt).describe() == "32 CPUs (16 physical cores): 16 threads a session"


def test_a_lone_sessions_workers_are_pinned_a_core_each_as_onnx_runtimes_default_pins_them():
    smt = ((0, 2), (1, 3))  # two cores, two threads each
    # the caller's thread keeps the first core free of workers; each worker has a core of its own
    assert (Cpus(4, None, 1, smt).pins(2), Cpus(4, None, 1, smt).pins(1)) == (((1, 3),), ())
    assert Cpus(4, None, 1, smt).pins(3) == ()  # more threads than cores: none pinned
    assert (Cpus(4, None, 2, smt).pins(1), Cpus(4).pins(2)) == ((), ())  # shared by instances; topology unread
    pinned = ort_options(3, spinning=True, between_runs=True, pins=((1, 3), (4,)))
    assert pinned.get_session_config_entry("session.intra_op_thread_affinities") == "2,4;5"  # counted from 1


def test_spinning_threads_stop_at_the_end_of_a_run_unless_their_session_runs_alone():
    spinning, sleeping = ort_options(2, spinning=True), ort_options(2, spinning=False)
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert spinning.get_session_config_entry("session.force_spinning_stop") == "1"
    assert sleeping.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    alone = ort_options(2, spinning=True, between_runs=True)  # as a plain model's session: ONNX Runtime's default
    assert alone.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert alone.get_session_config_entry("session.force_spinning_stop") == "0"


def test_a_fused_model_spins_between_runs_on_pinned_workers_and_a_pipelines_stages_stop(repository):
    manifest = Manifest.load(repository / "bert_like" / VERSION)
    two_cores = Cpus(2, None, 1, ((0,), (1,)))

    def entry(engine, key: str) -> str | None:
        try:
            return engine._session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # not set
            return None
    [fused] = load_engines(manifest, repository / "bert_like" / VERSION, spinning=True, fused=True, cpus=two_cores)
    staged = load_engines(manifest, repository / "bert_like" / VERSION, spinning=True, cpus=two_cores)
    assert entry(fused, "session.force_spinning_stop") == "0" and len(staged) > 1
    assert {entry(e, "session.force_spinning_stop") for e in staged} == {"1"}
    # the one session's worker on the second core, as ONNX Runtime's default has a plain model's;
    # the stages, which share the cores, unpinned
    assert entry(fused, "session.intra_op_thread_affinities") == "2"
    assert {entry(e, "session.intra_op_thread_affinities") for e in staged} == {None}
    assert describe_pins([fused]) == "ONNX Runtime's workers pinned to CPUs 1" and describe_pins(staged) == ""


@pytest.mark.parametrize("dims, shapes", [
    (("sequence",), [(1, 5), (2, 3), (1, 7)]),  # text: the copy with the plainest index
    (("sequence", 4), [(1, 5, 4), (2, 3, 4), (3, 7, 4)]),
    ((3, "sequence"), [(1, 3, 5), (2, 3, 2), (1, 3, 7)]),
    (("height", "width"), [(1, 3, 5), (2, 2, 2), (1, 3, 1)]),
    (("height", "width"), [(1, 3, 5), (2, 3, 5)]),  # equal: concatenated as they are
])
@pytest.mark.parametrize("value", [0, -1.5])  # 0, the usual pad value, takes another allocation
def test_padding_stacks_each_query_at_the_start_of_its_rows_and_cuts_it_back(dims, shapes, value):
    """Queries padded at the end of every named axis to the batch's size with the pad value, in
    order along the batch axis; each query's rows cut back to its own sizes give it back."""
    spec = TensorSpec("x", "float32", dims)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    own = [{dim: a.shape[axis] for axis, dim in spec.named} for a in arrays]
    sizes = {dim: max(o[dim] for o in own) for dim in own[0]}
    batch = stack(arrays, spec, sizes, value)
    assert batch.shape == (sum(len(a) for a in arrays), *(sizes.get(d, d) for d in dims))
    row = 0
    for array, sizes_of in zip(arrays, own):
        rows = slice(row, row + len(array))
        assert np.array_equal(cut([("x", spec.named, batch)], sizes_of, rows)["x"], array)
        padding = np.ones(batch[rows].shape, bool)
        padding[tuple(slice(n) for n in array.shape)] = False
        assert (batch[rows][padding] == value).all()
        row += len(array)


def _interface(inputs: list[dict], outputs: list[dict], max_batch_size: int = 4) -> dict:
    return {"max_batch_size": max_batch_size, "input": inputs, "output": outputs}


def test_config_pbtxt_may_be_stricter_than_the_model_never_disagree():
    """``interface.check``: what Triton's config JSON may say about a sliced model's tensors.
    Stricter is fine (a fixed length where it varies, a subset of its outputs, -1 where a size is
    fixed: the backend checks each request), and ``reshape`` is what the backend reads; a name,
    type, rank or size the model does not have fails, every disagreement named at once."""
    manifest = Manifest(source_file="m.onnx", source_sha256="", max_batch_size=4,
                        inputs=(TensorSpec("ids", "int64", ("sequence",)), TensorSpec("flag", "float32", ())),
                        outputs=(TensorSpec("hidden", "float32", ("sequence", 8)),
                                 TensorSpec("pooled", "float32", (8,))), stages=())
    ids = {"name": "ids", "data_type": "TYPE_INT64", "dims": [128]}
    flag = {"name": "flag", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}
    check(_interface([ids, flag], [{"name": "pooled", "data_type": "TYPE_FP32", "dims": [-1]}]), manifest)
    with pytest.raises(InterfaceError) as raised:
        check(_interface([{**ids, "data_type": "TYPE_INT32"}],
                         [{"name": "pooled", "data_type": "TYPE_FP32", "dims": [8, 1]},
                          {"name": "logits", "data_type": "TYPE_FP32", "dims": [2]}], max_batch_size=8), manifest)
    said = str(raised.value)
    for part in ("max_batch_size 8 exceeds the 4", "input 'ids' has data_type TYPE_INT32, the model's is TYPE_INT64",
                 "lists no input flag", "output 'pooled' has dims [8, 1], the model's are [8]",
                 "output 'logits' is not one of the model's outputs (hidden, pooled)"):
        assert part in said, said
    with pytest.raises(InterfaceError, match=r"input 'flag' has dims \[1\]"):
        check(_interface([ids, {**flag, "reshape": None}], []), manifest)


def test_metrics_count_the_seconds_served_each_way_from_the_end_of_loading():
    """``dvabatch_serving_seconds_total{mode}``: the seconds since loading's measurements ended
    (``clear``) go to the way the model served in them, a switch's (``serving``) to the new way."""
    metrics = Metrics()
    metrics.serving("pipeline", {})
    time.sleep(0.2)
    metrics.clear()  # loading measured the host: its seconds are not served
    time.sleep(0.05)
    metrics.serving("fused", {})
    time.sleep(0.1)
    served = {dict(k[1])["mode"]: v for k, v in metrics.snapshot().items() if k[0] == "dvabatch_serving_seconds_total"}
    assert set(served) == {"pipeline", "fused"}
    assert 0.05 <= served["pipeline"] < 0.15 and 0.1 <= served["fused"] < 0.2, served
    time.sleep(0.05)
    later = metrics.snapshot()[("dvabatch_serving_seconds_total", (("mode", "fused"),))]
    assert later >= served["fused"] + 0.05
    assert metrics.snapshot()[("dvabatch_serving_seconds_total", (("mode", "pipeline"),))] == served["pipeline"]


def test_metrics_sum_what_every_thread_counted_while_they_count_and_clear_keeps_the_gauges():
    """Several threads record at once, without a lock: a reader sees their counts grow while
    they write and loses none once they are done; clearing forgets the counters, not the gauges."""
    metrics = Metrics()
    metrics.serving("in_turn", {"plain": 900.0})
    metrics.ran_inline(1, 0.5, 1, [(1, [0.0, 1.0, 3.0])])
    metrics.clear()  # what loading ran is not the model's; the mode it serves in stays
    assert {k: v for k, v in metrics.snapshot().items() if k[0] != "dvabatch_serving_seconds_total"} == {
        ("dvabatch_serving", (("mode", "in_turn"),)): 1.0,
        ("dvabatch_predicted_capacity", (("serving", "plain"),)): 900.0}

    def count():
        for _ in range(20000):
            metrics.stage_ran(0, 4, 1e-6)
    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    seen = []
    while any(thread.is_alive() for thread in threads):
        seen.append(metrics.snapshot().get(("dvabatch_batches_total", (("stage", "0"), ("rows", "4"))), 0.0))
    for thread in threads:
        thread.join()
    metrics.ran_inline(2, 0.5, 1, [(2, [0.0, 1.0, 3.0])])
    totals = metrics.snapshot()
    assert seen == sorted(seen)
    assert totals[("dvabatch_batches_total", (("stage", "0"), ("rows", "4")))] == 80000
    assert totals[("dvabatch_stage_busy_us_total", (("stage", "0"),))] == pytest.approx(80000 + 1e6)
    assert totals[("dvabatch_stage_busy_us_total", (("stage", "1"),))] == pytest.approx(2e6)
    assert totals[("dvabatch_entry_queries_total", ())] == 2
    assert totals[("dvabatch_meta_operations_total", (("kind", "new"),))] == 1

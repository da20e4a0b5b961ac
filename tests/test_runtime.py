"""The runtime with real ONNX Runtime stages: validation, batching, answers, meta operations."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from backend.config import RuntimeConfig, make_policy
from backend.device import CpuDevice
from backend.engines import OnnxRuntimeEngine, load_engines
from backend.errors import ConfigError
from backend.host import Machine, machine
from backend.manifest import Manifest, SlicingReport
from backend.metrics import ENTRY_ADMITTED, EXECUTE_WAITS, Metrics
from backend.policy import FixedPolicy, RandomPolicy
from backend.query import Failure, Handover, Query, refuse_invalid, take_batch, validate
from backend.runtime import BACKPRESSURE_MAX_S, Runtime
from backend.decide import HostCosts, LoneRuns, Mode, Window, choose, waits
from backend.instances import SharedMode
from backend.serving import WINDOW_S, Reading, Watch, serve
from backend.whole import WholeBatch
from backend.sample import sample_inputs
from slicer.slicing import VERSION, slice_model
from tools.lib import synthetic

from .conftest import E2E_STAGES, FAST, MAX_BATCH
from .timed import flat, timed_manifest as timed_stages, with_tables


class Inbox:
    """Collects answers; each query must be answered exactly once."""

    def __init__(self):
        self.answers: dict[int, list] = {}
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def query(self, key: int, inputs) -> Query:
        def respond(outputs, failure):
            with self.lock:
                self.answers.setdefault(key, []).append((outputs, failure))
                self.done.notify_all()
        return Query(inputs=inputs, respond=respond)

    def wait(self, count: int) -> None:
        with self.lock:
            assert self.done.wait_for(lambda: len(self.answers) >= count, timeout=60)


@pytest.fixture
def bert(repository):
    version_dir = repository / "bert_like" / VERSION
    manifest = Manifest.load(version_dir)
    runtime = Runtime(manifest, load_engines(manifest, version_dir))
    yield manifest, runtime
    runtime.close()


def test_validate_names_what_is_wrong(bert):
    manifest, _ = bert
    check = lambda inputs: validate(manifest, Inbox().query(0, inputs))  # noqa: E731
    good = sample_inputs(manifest.inputs, 2, {"sequence": 6})
    assert check(good) is None
    assert "input 'attention_mask' is missing" in check({"input_ids": good["input_ids"]})
    wrong_dtype = {**good, "input_ids": good["input_ids"].astype(np.int32)}
    assert check(wrong_dtype) == "input 'input_ids' has dtype int32, expected int64"
    assert "expected [batch, sequence]" in check({**good, "attention_mask": good["attention_mask"][:, :, None]})
    assert "sequence=5" in check({**good, "attention_mask": good["attention_mask"][:, :5]})
    assert "rows" in check({**good, "attention_mask": good["attention_mask"][:1]})
    too_many = sample_inputs(manifest.inputs, MAX_BATCH + 1, {"sequence": 6})
    assert "more than max_batch_size" in check(too_many)


def test_judgements_kept_across_calls_still_refuse_and_fill_in_sizes(bert):
    """A model keeps the judgement of each input signature it has seen (unpadded text repeats
    lengths): a query judged before gets the same refusal, or its sizes, from the memo."""
    manifest, _ = bert
    judged: dict = {}
    good = sample_inputs(manifest.inputs, 1, {"sequence": 6})
    bad = {**good, "input_ids": good["input_ids"].astype(np.int32)}
    for _ in range(2):
        refused: list = []
        queries = [Query(dict(good), lambda o, f: None),
                   Query(dict(bad), lambda o, f, refused=refused: refused.append(f))]
        kept = refuse_invalid(manifest, queries, judged=judged)
        assert kept == queries[:1] and kept[0].sizes == {"sequence": 6}
        assert [f.message for f in refused] == ["input 'input_ids' has dtype int32, expected int64"]
    assert len(judged) == 2


def test_take_batch_stacks_matching_shapes_in_order_up_to_max_rows():
    inbox = Inbox()
    shapes = [(2, 4), (1, 6), (3, 4), (4, 4), (2, 4), (1, 6)]
    queries = [inbox.query(i, {"x": np.zeros(s)}) for i, s in enumerate(shapes)]
    waiting = deque(queries)
    taken = []
    while waiting:
        batch = take_batch(waiting, max_rows=7)
        taken.append([queries.index(q) for q in batch])
        waiting = deque(q for q in waiting if q not in batch)
    assert taken == [[0, 2, 4], [1, 5], [3]]


def test_every_query_answered_once_with_its_own_rows(bert, sources):
    manifest, runtime = bert
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % MAX_BATCH, {"sequence": 4 + i % 3}, seed=i) for i in range(12)]
    bad = {**feeds[0], "attention_mask": feeds[0]["attention_mask"][:, :2]}
    out_of_vocabulary = {**feeds[1], "input_ids": feeds[1]["input_ids"] + 1000}
    queries = [inbox.query(i, f) for i, f in enumerate(feeds)]
    queries += [inbox.query(100, bad), inbox.query(101, out_of_vocabulary)]
    runtime.submit(queries[:5])
    runtime.submit(queries[5:])
    inbox.wait(len(queries))
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    for i, feed in enumerate(feeds):
        outputs, failure = inbox.answers[i][0]
        assert failure is None
        expected = reference.run(feed)
        for name in expected:
            np.testing.assert_allclose(outputs[name], expected[name], atol=1e-5)
    outputs, failure = inbox.answers[100][0]
    assert outputs is None and failure.bad_input and "sequence" in failure.message
    outputs, failure = inbox.answers[101][0]
    assert outputs is None and isinstance(failure, Failure) and not failure.bad_input
    assert "inference failed" in failure.message


class Holdable:
    """A stage engine whose runs wait while ``open`` is clear (it starts set)."""

    def __init__(self, engine):
        self.engine, self.open = engine, threading.Event()
        self.open.set()

    def run(self, inputs):
        self.open.wait(30)
        return self.engine.run(inputs)


class GatedEngine:
    """A real stage engine that records batch sizes and holds its first run until released."""

    def __init__(self, engine):
        self.engine, self.rows, self.release = engine, [], threading.Event()

    def run(self, inputs):
        self.rows.append(len(next(iter(inputs.values()))))
        self.release.wait(30)
        return self.engine.run(inputs)


def test_waiting_queries_are_stacked_into_full_batches(repository):
    version_dir = repository / "resnet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    gate = GatedEngine(engines[0])
    runtime = Runtime(manifest, [gate, *engines[1:]])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, rows, seed=i) for i, rows in enumerate([1, 3, 3, 2, 5, 1])]
    runtime.submit([inbox.query(0, feeds[0])])
    while not gate.rows:  # the first stage holds the first query alone
        threading.Event().wait(0.01)
    runtime.submit([inbox.query(i, f) for i, f in enumerate(feeds) if i])
    gate.release.set()
    inbox.wait(len(feeds))
    runtime.close()
    assert gate.rows == [1, 3 + 3 + 2, 5 + 1]
    assert all(len(a) == 1 and a[0][1] is None for a in inbox.answers.values())


def test_queries_a_model_reads_the_padding_of_batch_with_their_own_length_only(tmp_path):
    """A mean over the sequence with no mask: padding a shorter query would change its answer,
    so the slicer gives the model no length axis and no policy pads, not even one that pads
    wherever there is a length axis (``slo``): queries of one length batch together."""
    src = synthetic.save(synthetic.unmasked_mean(), tmp_path / "unmasked.onnx")
    slice_model(src, tmp_path / "unmasked", replace(FAST, stages=2, optimize="none"))
    version_dir = tmp_path / "unmasked" / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    gate = GatedEngine(engines[0])
    runtime = Runtime(manifest, [gate, *engines[1:]], RuntimeConfig(policy=make_policy("slo", {})))
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, {"sequence": n}, seed=i) for i, n in enumerate([4, 3, 6, 3, 6])]
    runtime.submit([inbox.query(0, feeds[0])])
    while not gate.rows:  # the first query holds stage 0; the others wait together
        threading.Event().wait(0.01)
    runtime.submit([inbox.query(i, feed) for i, feed in enumerate(feeds) if i])
    gate.release.set()
    inbox.wait(len(feeds))
    runtime.close()
    assert sorted(gate.rows) == [1, 2, 2]  # alone, then each length apart
    assert_like_reference(inbox, feeds, OnnxRuntimeEngine(src, [o.name for o in manifest.outputs]))


def assert_like_reference(inbox: Inbox, feeds, reference) -> None:
    for i, feed in enumerate(feeds):
        outputs, failure = inbox.answers[i][0]
        assert failure is None, failure
        for out, expected in reference.run(feed).items():
            np.testing.assert_allclose(outputs[out], expected, atol=1e-5, err_msg=f"query {i} output {out}")


class Slowed:
    """A real stage engine that takes at least 3 ms, so batches stay in the pipeline long enough
    for late queries to stretch them."""

    def __init__(self, engine):
        self.engine = engine

    def run(self, inputs):
        threading.Event().wait(0.003)
        return self.engine.run(inputs)


@pytest.mark.parametrize("pairs", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(E2E_STAGES))
def test_random_meta_operations_keep_outputs_exact(repository, sources, name, pairs):
    """Random new/stretch/split decisions under bursts of queries: every query is answered once
    and equals ONNX Runtime on the unsliced model, whatever happened to its batch."""
    version_dir = repository / name / VERSION
    manifest = Manifest.load(version_dir)
    policy = RandomPolicy(seed=pairs, stretch_probability=0.9, split_probability=0.4)
    runs = []
    runtime = Runtime(manifest, [Slowed(e) for e in load_engines(manifest, version_dir)],
                      RuntimeConfig(buffer_pairs=pairs, policy=policy),
                      trace=lambda stage, item, *_: runs.append((stage, item)))
    reference = OnnxRuntimeEngine(sources[name], [o.name for o in manifest.outputs])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, {"sequence": 4 + i // 20}, seed=i) for i in range(40)]
    for i, feed in enumerate(feeds):  # one by one, about a stage apart: late queries find batches running
        runtime.submit([inbox.query(i, feed)])
        threading.Event().wait(0.002 * (i % 3))
    inbox.wait(len(feeds))
    runtime.close()
    entered = {item.batch_id for stage, item in runs if stage == 0}
    assert {item.batch_id for stage, item in runs} - entered, "nothing was split"
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    assert_like_reference(inbox, feeds, reference)


def stretch_while_held(repository, gate_type=None) -> tuple:
    """unet_like with stage 1 held (by ``gate_type``, a GatedEngine) on query 0 while query 1
    arrives and stretches batch 0; returns once both are answered: (manifest, runtime, inbox,
    feeds, runs) with ``runs`` the (stage, batch, start, num) of every item run."""
    version_dir = repository / "unet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    gate = (gate_type or GatedEngine)(engines[1])
    runs = []
    runtime = Runtime(manifest, [engines[0], gate, engines[2]], RuntimeConfig(policy=FixedPolicy(stretch_latest=True)),
                      trace=lambda stage, item, *_: runs.append((stage, item.batch_id, item.start, item.num)))
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, seed=1), sample_inputs(manifest.inputs, 2, seed=2)]
    runtime.submit([inbox.query(0, feeds[0])])
    while not gate.rows:
        threading.Event().wait(0.005)
    runtime.submit([inbox.query(1, feeds[1])])
    while len(runs) < 2:  # batch 0 in stage 0, then its late rows in stage 0
        threading.Event().wait(0.005)
    gate.release.set()
    inbox.wait(2)
    return manifest, runtime, inbox, feeds, runs


def test_stretched_rows_merge_into_the_running_batch(repository, sources):
    """Query 1 arrives while batch 0 is held in stage 1, stretches it, catches up, and stage 2
    runs both as one batch of 3 rows; each query gets exactly its own outputs."""
    manifest, runtime, inbox, feeds, runs = stretch_while_held(repository)
    runtime.close()
    assert runs == [(0, 0, 0, 1), (0, 0, 1, 2), (1, 0, 0, 1), (1, 0, 1, 2), (2, 0, 0, 3)]
    assert_like_reference(inbox, feeds, OnnxRuntimeEngine(sources["unet_like"], [o.name for o in manifest.outputs]))


def test_split_parts_leave_one_by_one(repository, sources):
    """A batch of four queries split into rows after stage 0: every part runs the later stages on
    its own rows and its query is answered as soon as that part leaves."""
    version_dir = repository / "resnet_like" / VERSION
    manifest = Manifest.load(version_dir)
    runs, answered = [], []
    runtime = Runtime(manifest, load_engines(manifest, version_dir),
                      RuntimeConfig(buffer_pairs=1, policy=FixedPolicy(split_after=0, split_size=2)),
                      trace=lambda stage, item, *_: runs.append((stage, item.batch_id, item.start, item.num)))
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, rows, seed=i) for i, rows in enumerate([1, 2, 1])]
    queries = [inbox.query(i, f) for i, f in enumerate(feeds)]
    for i, query in enumerate(queries):
        respond = query.respond
        query.respond = lambda o, f, i=i, respond=respond: (answered.append((i, len(runs))), respond(o, f))
    runtime.submit(queries)
    inbox.wait(3)
    runtime.close()
    last = len(manifest.stages) - 1
    assert [r for r in runs if r[0] == 0] == [(0, 0, 0, 4)]
    assert [r[1:] for r in runs if r[0] == last] == [(1, 0, 2), (2, 0, 2)]
    # Query 0 (row 0) left with the first part, before the second part ran the last stage;
    # query 1 (rows 1-2) straddles both parts and is answered when its last row leaves.
    assert answered[0][0] == 0 and answered[0][1] < len(runs)
    assert sorted(i for i, _ in answered) == [0, 1, 2]
    assert_like_reference(inbox, feeds, OnnxRuntimeEngine(sources["resnet_like"], [o.name for o in manifest.outputs]))


def timed_manifest(folder, one_ms: float, full_ms: float, rows: int, stages: int = 2,
                   max_batch_size: int = 64) -> Manifest:
    """A timed model written by ``tools.simulate`` from a linear engine profile."""
    from tools.lib.profiles import profile
    from tools.lib.timed import from_profile, write_timed

    path = folder / f"{one_ms}-{full_ms}-{stages}-{max_batch_size}.json"
    path.write_text(json.dumps(profile("p", one_ms, full_ms, rows, stages=stages, max_batch_size=max_batch_size)))
    profiled = from_profile(path)[1]
    return write_timed("p", profiled.inputs, [s.latency for s in profiled.stages], profiled.max_batch_size,
                       profiled.source_file, profiled.source_sha256, folder / path.stem, {})


def test_execute_waits_until_stage_0_has_computed_its_queries(tmp_path):
    """Back-pressure: ``submit(wait_s=...)`` returns once stage 0 has computed the queries (so
    Triton batches what arrives meanwhile), not before and not after the whole pipeline; the
    answer that comes later goes to the request's sender."""
    manifest = timed_manifest(tmp_path, 400, 400, 2)  # two stages of 200 ms
    runtime = Runtime(manifest, load_engines(manifest, tmp_path), RuntimeConfig(policy=make_policy("pass", {})))
    feed = sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=0)
    sent = []
    try:
        handover = Handover([sent.append])
        runtime.wait_s = 5
        runtime.submit([Query(inputs=dict(feed), respond=lambda o, f: handover.deliver(0, (o, f)))])
        ran = {dict(k)["stage"] for (family, k) in runtime.metrics.snapshot() if family == "dvabatch_batches_total"}
        assert ran == {"0"}  # stage 0 has computed it; stage 1 (200 ms more) has not
        assert handover.close() == [None]
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        [(outputs, failure)] = sent
        assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
    finally:
        runtime.close()


def test_execute_that_waits_returns_at_once_when_the_entry_refuses_all_it_handed_over(tmp_path):
    """A query whose timeout expired before stage 0 took it is answered with Triton's timeout
    error, not computed; ``execute``, waiting for stage 0 to compute what it handed over, returns
    then too, with or without a batch in the pipeline, not after the back-pressure's bound (5 s:
    nothing else would tell it that nothing is left to compute)."""
    manifest = timed_manifest(tmp_path, 400, 400, 2)  # two stages of 200 ms
    runtime = Runtime(manifest, load_engines(manifest, tmp_path), RuntimeConfig(policy=make_policy("pass", {})))
    runtime.wait_s = BACKPRESSURE_MAX_S
    feed = sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=0)
    inbox = Inbox()
    try:
        for key, in_flight in enumerate((False, True)):
            if in_flight:  # a batch in the pipeline meanwhile (stage 0 computes it in 200 ms)
                runtime.submit([inbox.query(10, dict(feed))])
            expired = inbox.query(key, dict(feed))
            expired.deadline = time.monotonic() - 1
            began = time.monotonic()
            runtime.submit([expired])
            assert time.monotonic() - began < BACKPRESSURE_MAX_S / 2
            inbox.wait(key + 1)
            [(_, failure)] = inbox.answers[key]
            assert failure is not None and "timeout expired" in failure.message
        inbox.wait(3)
        assert inbox.answers[10][0][1] is None
    finally:
        runtime.close()


def test_a_pipeline_holds_execute_where_the_cpu_caps_it_and_returns_at_once_where_the_engines_do(tmp_path):
    """Back-pressure keeps Triton's batching where serving each request is what is dear; where
    the engines are, ``execute`` returns at once so that the entry sees every query as it
    arrives. ``execute_waits`` decides instead when set; a bad value fails the load by name.
    Whether the CPU caps the pipeline is read from the host's measured cost: the same slow
    engines on a host whose stub spends 1 ms a request are CPU-bound."""
    zero, slow = (timed_manifest(tmp_path, *line) for line in ((0, 0, 64), (9, 132, 64)))
    costs = HostCosts(pipeline_batch_s=200e-6, pipeline_request_s=100e-6)
    held, why = waits(zero, "auto", costs)
    assert held and "the CPU caps" in why
    free, why = waits(slow, "auto", costs)
    assert not free and "the engines cap" in why
    assert waits(slow, "auto", HostCosts(pipeline_request_s=1e-3))[0]
    assert waits(slow, "true", costs)[0]
    assert not waits(zero, RuntimeConfig.from_parameters({"execute_waits": "FALSE"}).execute_waits, costs)[0]

def test_a_lone_batch_runs_inside_execute_while_nothing_else_arrives_during_one(tmp_path):
    """A batch that finds the pipeline empty runs through every stage in the caller's thread and
    is answered before ``run`` returns (as a plain model answers in ``execute``'s list), except
    that now and then one enters the pipeline to see whether requests arrive during one: after 4
    inline runs, then 8, then 16 while nothing does. A look that sees one stops the inline runs
    until a look sees none, and the looks come every 4 again; a batch never runs inline while
    another is in the pipeline. The metrics count where lone batches ran. (A rule under which
    inline pays while under a quarter of an arrival is expected a run, under 22 % of the looks
    saw one, none seen yet.)"""
    manifest = timed_manifest(tmp_path, 40, 40, 2)  # two stages of 20 ms
    first, second = load_engines(manifest, tmp_path)
    held = Holdable(second)  # a look's batch stays in stage 1 until the test lets it go
    runtime = Runtime(manifest, [first, held], RuntimeConfig(policy=make_policy("pass", {})))
    runtime.lone, runtime.wait_s = LoneRuns(saved_s=0.25e-3, runs_s={None: ((2e-3, 0.0),)}, share=0.0), 5
    feed = sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=0)
    inbox = Inbox()

    def execute(key: int) -> bool:
        """What the backend's ``execute`` does with one request; whether it ran inline."""
        query = inbox.query(key, dict(feed))
        if runtime.runs_inline():
            runtime.run([query])
            assert key in inbox.answers
            return True
        runtime.submit([query])  # returns once stage 0 computed it: stage 1 still runs it
        return False

    def one_at_a_time(keys: range) -> list[bool]:
        """One client in a closed loop: each request once the one before was answered."""
        ran = []
        for key in keys:
            ran.append(execute(key))
            inbox.wait(key + 1)
            assert runtime.table.wait_empty(5)
        return ran

    try:
        assert one_at_a_time(range(30)) == [True] * 4 + [False] + [True] * 8 + [False] + [True] * 16
        held.open.clear()
        assert not execute(30)  # a look ...
        assert not execute(31)  # ... during which another request arrives
        held.open.set()
        inbox.wait(32)
        assert runtime.table.wait_empty(5)
        assert one_at_a_time(range(32, 38)) == [False] + [True] * 4 + [False]  # a look without, then every 4
        counted = {dict(k)["ran"]: v for (family, k), v in runtime.metrics.snapshot().items()
                   if family == "dvabatch_lone_batches_total"}
        assert counted == {"inline": 32, "pipeline": 5}
        for key, [(outputs, failure)] in inbox.answers.items():
            assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"]), key
    finally:
        runtime.close()


def test_a_lone_batch_is_judged_at_the_rows_and_the_length_its_requests_bring(tmp_path):
    """``execute`` hands ``runs_inline`` its requests' inputs, and the runtime counts their rows
    and reads their longest length for ``LoneRuns`` (only where the pipeline is idle: served plain
    a call pays nothing for them): under a rule by which a lone row of 4 tokens runs inline and a
    lone batch of 8 rows, or of 16 tokens, would keep an arrival waiting too long, one request of a
    row of 4 tokens runs inline, two of 4 rows enter the pipeline, and one row of 16 tokens too."""
    manifest = timed_manifest(tmp_path, 40, 40, 2)
    runtime = Runtime(manifest, load_engines(manifest, tmp_path), RuntimeConfig(policy=make_policy("pass", {})))
    try:
        runtime.lone = LoneRuns(saved_s=0.3e-3, runs_s={4: ((0.4e-3, 0.0),) * 4 + ((4e-3, 0.0),) * 4,
                                                        16: ((8e-3, 0.0),) * 8}, share=0.2)
        one, four = (sample_inputs(manifest.inputs, rows, {"sequence": 4}, seed=0) for rows in (1, 4))
        assert runtime.runs_inline([one])
        assert not runtime.runs_inline([four, four])
        assert not runtime.runs_inline([sample_inputs(manifest.inputs, 1, {"sequence": 16}, seed=0)])
    finally:
        runtime.close()


def test_a_lone_batch_inline_runs_straight_from_its_inputs_and_counts_in_the_arrival_rate(tmp_path):
    """A lone batch that runs inside ``execute`` runs straight from its requests' inputs, as a call
    served plain does (no queries to make: ``WholeBatch.run_straight``; the first of its shape
    runs as a query, judged), and its requests still count in the arrival rate the pipeline's
    policy reads: ten lone requests one after another are answered with their own rows and read
    as a load."""
    manifest = timed_manifest(tmp_path, 40, 40, 2)
    runtime = Runtime(manifest, load_engines(manifest, tmp_path), RuntimeConfig(policy=make_policy("pass", {})))
    try:
        runtime.lone = LoneRuns(saved_s=1.0, runs_s={None: ((2e-3, 0.0),)}, every=10, share=0.0)
        feeds = [sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=seed) for seed in range(10)]
        replies, straight = [], []
        for feed in feeds:
            assert runtime.runs_inline([feed])
            straight.append(runtime.run_straight([feed], replies.extend))
            if not straight[-1]:  # the first of its signature: judged as a query (``model.py`` does so)
                runtime.run([Query(dict(feed), lambda outputs, failure: replies.append((outputs, failure)))])
        assert straight == [0] + [1] * 9
        assert [failure for _, failure in replies] == [None] * 10
        for (outputs, _), feed in zip(replies, feeds):
            assert np.array_equal(outputs["input_ids_out"], feed["input_ids"])
        assert runtime.entry.steady_rate() > 0
        assert not len(runtime.table)  # nothing entered the pipeline
    finally:
        runtime.close()


def test_a_model_sliced_on_another_machine_loads_and_says_so(tmp_path):
    """The stage tables hold for the machine they were measured on (``host.Machine``): a model
    sliced elsewhere still serves, and its decision says where its tables come from and what to
    do; sliced here, or without a record of it (a simulated profile), it says nothing."""
    manifest = timed_manifest(tmp_path, 40, 40, 2)
    for machine_, said in [(None, False), (asdict(machine()), False), (asdict(Machine("Intel Xeon", 96)), True)]:
        sliced = replace(manifest, slicing=SlicingReport("onnxruntime", "extended", 8, None, 1.0, None, 1.0,
                                                         machine=machine_))
        decision, runtime = serve(sliced, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(),
                                  Metrics())
        runtime.close()
        assert bool(decision.moved) == said and ("96 CPUs of Intel Xeon" in decision.moved) == said


def test_lone_batches_run_inline_only_under_auto_or_where_the_user_asks(tmp_path):
    """Under a configured policy every batch enters the pipeline (multi-entry): a query arriving
    while another is past stage 0 enters stage 0 at once. ``auto`` may run a lone batch inline,
    ``lone_inline: true`` asks for it under any policy, ``false`` turns it off under ``auto``."""
    manifest = timed_manifest(tmp_path, 40, 40, 2)

    def lone(parameters: dict) -> bool:
        _, runtime = serve(manifest, tmp_path, RuntimeConfig.from_parameters(parameters), CpuDevice(), Metrics())
        runtime.close()
        return runtime.lone is not None

    assert not lone({"policy": "pass"}) and not lone({"policy": "fixed"}) and not lone({"policy": "input+load"})
    assert lone({"policy": "auto"}) and lone({"policy": "pass", "lone_inline": "true"})
    assert not lone({"policy": "auto", "lone_inline": "false"})
    with pytest.raises(ConfigError, match="lone_inline"):
        RuntimeConfig.from_parameters({"lone_inline": "sometimes"})


def test_a_handover_returns_what_came_before_execute_returned_and_sends_the_rest():
    sent = []
    handover = Handover([lambda r: sent.append(("a", r)), lambda r: sent.append(("b", r))])
    handover.deliver(1, "early")
    assert handover.close() == [None, "early"] and not sent
    handover.deliver(0, "late")
    assert sent == [("a", "late")]


def test_auto_measures_the_host_and_starts_pipelined_on_engines_that_overlap(tmp_path):
    """Timed stages (as on a GPU: they overlap) at TensorRT speed: ``auto`` measures what
    serving costs this host's stub each way when it loads (a pipelined batch, with its
    hand-offs, costs more than one run inside ``execute``), predicts both ways' capacity from
    that and the tables (in the metrics), starts pipelined (multi-entry), runs lone batches
    inline where the looks allow, and watches serving to switch. A configured policy pipelines
    and runs no lone batch inline; its watch decides whether ``execute`` waits and never
    switches (its switch pinned), unless ``policy.auto`` asks (``policy:
    smdp`` then dispatches whichever way it serves: served plain, with a power weight, by
    holding queries, as its log says: ``hold.py``; and, as it waits for its control limit, it
    runs no lone batch inline)."""
    trt = timed_manifest(tmp_path, 0.62, 15.15, 128)
    metrics = Metrics()
    decision, runtime = serve(trt, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    try:
        costs = decision.costs
        assert decision.mode is Mode.PIPELINE and decision.choice.switches and costs.how.startswith("measured")
        assert costs.stub_s(Mode.PIPELINE, 1) > costs.stub_s(Mode.IN_TURN, 1) > 0
        assert runtime.watch.is_alive() and runtime.lone is not None and runtime.mode is Mode.PIPELINE
        counted = metrics.snapshot()
        assert {dict(k)["serving"] for (family, k) in counted if family == "dvabatch_predicted_capacity"} \
            == {"plain", "pipeline"}
        assert not [k for k in counted if k[0] == "dvabatch_batches_total"]  # the calibration's are not counted
    finally:
        runtime.close()
    decision, runtime = serve(trt, tmp_path, RuntimeConfig(policy=make_policy("pass", {})), CpuDevice(), Metrics())
    runtime.close()
    assert decision.mode is Mode.PIPELINE and runtime.watch.switch.pinned and runtime.lone is None
    smdp, said = make_policy("smdp", {"auto": "true", "power_weight": "1"}), []
    decision, runtime = serve(trt, tmp_path, RuntimeConfig(policy=smdp), CpuDevice(), Metrics(), said=said.append)
    runtime.close()
    assert decision.choice.switches and runtime.watch is not None and runtime.held is not None
    assert runtime.scheduler.policy is smdp and runtime.lone is None  # a lone batch inline would not wait
    assert any("served plain, the queries are held back while the policy waits for more" in line for line in said)


def test_auto_begins_plain_where_loadings_costs_say_the_pipeline_loses_at_both_ends(tmp_path):
    """Near-zero compute on timed stages: what a pipelined batch costs the stub, measured as the
    model loads, is all a request's time and caps what the pipeline carries, so ``auto`` serves
    plain from its first ``execute`` (``ModeSwitch.begin``), says so in its decision, and its
    watch is free to pipeline later; a query is answered through the plain path."""
    zero = timed_manifest(tmp_path, 0.001, 0.002, 128)
    metrics = Metrics()
    decision, runtime = serve(zero, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    feed = sample_inputs(zero.inputs, 1, {"sequence": 4}, seed=0)
    inbox = Inbox()
    try:
        assert decision.mode is Mode.PIPELINE and decision.choice.switches and runtime.mode is not Mode.PIPELINE
        assert "begins plain: a lone request" in decision.describe() and runtime.watch.switch.mode is runtime.mode
        assert {dict(k)["mode"] for (family, k), v in metrics.snapshot().items()
                if family == "dvabatch_serving" and v} == {runtime.mode.value}
        assert runtime.runs_inline()
        runtime.run([inbox.query(0, dict(feed))])
        inbox.wait(1)
        [(outputs, failure)] = inbox.answers[0]
        assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
    finally:
        runtime.close()


def test_a_models_instances_serve_the_way_the_instance_that_decides_serves(tmp_path):
    """``instance_group`` count 2: the instance that takes the file's lock first leads
    (``SharedMode``) and writes each way it takes; another follows: its watch wakes as soon as the
    way written is not the one it serves, serves it (plain as its own engines serve plain) and
    decides nothing of its own; what it would write goes nowhere. Once the leader lets go (it
    unloaded, or its process ended), the next to try takes the lead; the leader's file goes when
    it unloads; a model with one instance shares nothing."""
    assert SharedMode.of("m", 1, folder=tmp_path) is None and SharedMode.of("m", 2, folder=tmp_path / "absent") is None
    leader, follower = SharedMode.of("m", 2, folder=tmp_path), SharedMode.of("m", 2, folder=tmp_path)
    assert leader.leads and not follower.leads and follower.read() is None and not follower.elect()
    zero = timed_manifest(tmp_path, 0.001, 0.002, 128)
    metrics = Metrics()
    _, runtime = serve(zero, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    runtime.watch.stop()
    watch = Watch(runtime, runtime.watch.switch, metrics, CpuDevice(), 2, None, None, alone=False, shared=follower)
    try:
        plain = runtime.mode
        assert plain is not Mode.PIPELINE and watch.follows  # (near-zero compute begins plain)
        leader.write("pipeline")
        began = time.monotonic()
        assert not watch._waited() and time.monotonic() - began < WINDOW_S / 2
        assert watch._led() is Mode.PIPELINE and watch.switch.mode is Mode.PIPELINE
        watch.serve(Mode.PIPELINE)
        assert runtime.mode is Mode.PIPELINE and watch._led() is None and follower.read() == "pipeline"
        leader.write("plain")
        assert watch._led() is plain
    finally:
        runtime.close()
    os.close(leader.fd)  # (its process ended: the file stays, its lock goes)
    leader.fd = None
    assert follower.elect() and follower.leads and not SharedMode.of("m", 2, folder=tmp_path).leads
    follower.close()
    assert not follower.path.exists() and SharedMode.of("m", 2, folder=tmp_path).leads


def test_a_switch_to_plain_serving_drains_the_pipeline_before_a_batch_runs_inline(tmp_path):
    """Two stages of 100 ms. A query handed to the pipeline, then the switch says plain: the next
    ``execute`` runs inline only once the pipeline has answered the first (nothing lost,
    duplicated or overtaken), and back in pipeline mode batches are handed over again."""
    slow = timed_manifest(tmp_path, 200, 200, 2)
    _, runtime = serve(slow, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), Metrics())
    runtime.watch.stop()
    runtime.lone = None
    feed = sample_inputs(slow.inputs, 1, {"sequence": 4}, seed=0)
    inbox, order = Inbox(), []
    try:
        first = inbox.query(0, dict(feed))
        respond = first.respond
        first.respond = lambda o, f: (order.append(0), respond(o, f))
        runtime.submit([first])
        runtime.mode = Mode.IN_TURN
        assert runtime.runs_inline() and order == [0]
        runtime.run([inbox.query(1, dict(feed))])
        runtime.mode = Mode.PIPELINE
        assert not runtime.runs_inline()
        runtime.submit([inbox.query(2, dict(feed))])
        inbox.wait(3)
        for key in range(3):
            [(outputs, failure)] = inbox.answers[key]
            assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
    finally:
        runtime.close()


def test_the_watch_shows_the_switch_the_execute_calls_of_a_lone_instance(tmp_path):
    """The window the mode switch reads counts ``execute`` calls and the time inside them (what
    ``decide.round_trip_s`` reads the round trip from), but not where the model has other
    instances (an instance then sits idle while another serves), nor where a hold sent answers
    (its calls return at once, and one runs the batch it held: ``hold.py``)."""
    metrics = Metrics()
    _, runtime = serve(timed_manifest(tmp_path, 20, 20, 2), tmp_path, RuntimeConfig(policy=make_policy("auto", {})),
                       CpuDevice(), metrics)
    runtime.watch.stop()
    try:
        before = Reading(0.0, 0.0, None, metrics.snapshot(), 0, metrics.longest_idle_s())
        for seconds, idle in ((0.01, 0.5), (0.02, 0.002), (0.03, 0.003)):
            metrics.executed(seconds, idle)
        now = Reading(1.0, 0.0, None, metrics.snapshot(), 0, metrics.longest_idle_s())
        window = runtime.watch._window(before, now)
        assert window.executes == 3 and window.execute_s == pytest.approx(0.06)
        assert window.idle_s == pytest.approx(0.505) and window.longest_idle_s == pytest.approx(0.5)
        assert metrics.longest_idle_s() == 0.0  # since the last reading
        assert runtime.watch._window(before, replace(now, sent=2)).executes == 0
        runtime.watch.alone = False
        assert runtime.watch._window(before, now).executes == 0
    finally:
        runtime.close()


def test_the_watch_shows_the_switch_how_many_rows_a_request_brought(tmp_path):
    """A client may send several rows in one request. The window counts requests as answers
    and the rows stage 0 ran as rows, so the switch can put the stub's work on requests and the
    engines' on rows (``Window.requests``): here requests of 4 rows, pipelined and inline."""
    metrics = Metrics()
    manifest = timed_manifest(tmp_path, 2, 8, 8)
    _, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    runtime.watch.stop()
    runtime.lone = None
    feed = sample_inputs(manifest.inputs, 4, {"sequence": 4}, seed=0)
    inbox = Inbox()
    try:
        before = Reading(0.0, 0.0, None, metrics.snapshot(), 0, metrics.longest_idle_s())
        runtime.submit([inbox.query(key, dict(feed)) for key in range(2)])
        inbox.wait(2)
        runtime.mode = runtime.watch.switch.plain
        runtime.run([inbox.query(2, dict(feed))])
        now = Reading(1.0, 0.0, None, metrics.snapshot(), 0, metrics.longest_idle_s())
        window = runtime.watch._window(before, now)
        assert window.answered == 3 and window.rows_a_request == pytest.approx(4.0)
        assert window.requests == pytest.approx(window.rows / 4)
    finally:
        runtime.close()


def test_after_a_window_of_too_few_answers_the_watch_starts_the_next_with_the_load(tmp_path):
    """An idle model's next window begins when a query is admitted, not up to a window before,
    so that a load's first two windows are whole ones and a switch may agree on them
    (``Watch._resumed``): the watch sleeps while nothing arrives (woken by the counters' next
    record, ``Metrics.wake``: it does not poll them, which cost an idle model about 1 % of a
    core), its reading, taken once a query is admitted, counts it, and ``stop`` wakes it."""
    manifest = timed_manifest(tmp_path, 2, 2, 2)
    metrics = Metrics()
    _, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    runtime.watch.stop()
    runtime.lone = None
    watch, inbox, resumed = runtime.watch, Inbox(), []
    watch._stopping.clear()
    looked = []
    snapshot = metrics.snapshot
    metrics.snapshot = lambda: looked.append(1) or snapshot()
    try:
        idle = watch._read()
        waiter = threading.Thread(target=lambda: resumed.append(watch._resumed(idle)))
        waiter.start()
        time.sleep(0.3)
        assert not resumed and len(looked) <= 2  # nothing admitted: no window yet, and no polling meanwhile
        sent = time.monotonic()
        runtime.submit([inbox.query(0, sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=0))])
        inbox.wait(1)
        waiter.join(5)
        [reading] = resumed
        assert sent <= reading.clock <= sent + 1.0 and reading.counters[ENTRY_ADMITTED] == 1
        stopped = threading.Thread(target=lambda: resumed.append(watch._resumed(reading)))
        stopped.start()
        time.sleep(0.1)
        watch.stop()
        stopped.join(2)
        assert not stopped.is_alive() and resumed[-1] is reading  # stopping, it returns what it had
    finally:
        watch._stopping.set()
        runtime.close()


def test_the_watch_has_a_pipelined_execute_wait_for_stage_0_while_the_host_is_saturated(tmp_path):
    """Under ``auto`` with ``execute_waits: auto``, the windows served pipelined decide again
    whether ``execute`` waits for stage 0 (``decide.EntryWait``): two windows with the stub's
    interpreter saturated make it wait, two with room at a lighter load make it return at once; the runtime, the
    mode switch's predictions and the ``dvabatch_execute_waits`` gauge follow. Set by the user,
    ``execute_waits`` stays as set. Under a configured policy (``pass``) the watch decides the
    same, and nothing else: its switch is pinned to the pipeline."""
    metrics = Metrics()
    manifest = timed_manifest(tmp_path, 20, 20, 2)
    _, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    runtime.watch.stop()
    try:
        watch = runtime.watch
        assert runtime.wait_s == 0.0 and runtime.gauges()[EXECUTE_WAITS] == 0.0  # the engines cap 20 ms stages
        saturated, room = Window(1.0, 1000, 0.99, None, (0.3, 0.3), 4.0), Window(1.0, 300, 0.1, None, (0.1, 0.1), 2.0)
        assert watch._entry(saturated) is None and watch._entry(saturated) is True
        assert runtime.wait_s == BACKPRESSURE_MAX_S and watch.switch.entry_waits
        assert runtime.gauges()[EXECUTE_WAITS] == 1.0
        assert watch._entry(room) is None and watch._entry(None) is None and watch._entry(room) is None
        assert watch._entry(room) is False and runtime.wait_s == 0.0 and not watch.switch.entry_waits
    finally:
        runtime.close()
    config = RuntimeConfig.from_parameters({"policy": "auto", "execute_waits": "false"})
    _, runtime = serve(manifest, tmp_path, config, CpuDevice(), Metrics())
    runtime.watch.stop()
    try:
        assert runtime.watch.entry is None and runtime.watch._entry(saturated) is None and runtime.wait_s == 0.0
    finally:
        runtime.close()
    decision, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy("pass", {})), CpuDevice(),
                              Metrics())
    runtime.watch.stop()
    try:
        watch = runtime.watch
        assert not decision.choice.switches and watch.switch.pinned and runtime.wait_s == 0.0
        assert watch._entry(saturated) is None and watch._entry(saturated) is True
        assert runtime.wait_s == BACKPRESSURE_MAX_S and watch.switch.observe(saturated) is None
        assert runtime.mode is Mode.PIPELINE
    finally:
        runtime.close()
    config = RuntimeConfig.from_parameters({"policy": "pass", "execute_waits": "true"})
    _, runtime = serve(manifest, tmp_path, config, CpuDevice(), Metrics())
    try:
        assert runtime.watch is None and runtime.wait_s == BACKPRESSURE_MAX_S
    finally:
        runtime.close()


def test_a_model_that_takes_one_query_a_batch_loads_and_pipelines_them(tmp_path):
    """``max_batch_size: 1`` (a model that cannot batch: the pipeline is all it can gain): the
    calibration times batches of one alone, and all of their cost is the request's. It had handed
    the pipeline a batch of two, which no stage takes, and the load failed after 60 s."""
    manifest = timed_manifest(tmp_path, 8, 8, 2, stages=4, max_batch_size=1)  # four stages of 2 ms
    feed = sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=0)
    for policy in ("pass", "auto"):
        decision, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy(policy, {})), CpuDevice(),
                                  Metrics())
        try:
            costs = decision.costs
            assert decision.mode is Mode.PIPELINE and costs.how.startswith("measured at load, batches of 1")
            assert costs.pipeline_batch_s == costs.plain_batch_s == 0.0 < costs.plain_request_s, costs
            answered = []
            runtime.submit([Query(dict(feed), lambda o, f: answered.append(f)) for _ in range(4)])
            deadline = time.monotonic() + 5
            while len(answered) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert answered == [None] * 4
            ran = {dict(k)["stage"]: n for (family, k), n in runtime.metrics.snapshot().items()
                   if family == "dvabatch_batches_total"}
            assert ran == {"0": 4, "1": 4, "2": 4, "3": 4}, ran  # one query a batch at every stage
        finally:
            runtime.close()


def test_the_counters_of_calls_served_plain_add_up_with_the_pipelines_own():
    """``Metrics``: what each ``execute`` records (``executed``, ``ran_inline``), summed when the
    reader folds it, adds up with what the pipeline's executors record one update at a time."""
    metrics = Metrics()
    metrics.stage_ran(0, 2, 0.001)
    metrics.ran_inline(2, 0.004, 1, [(2, [0.0, 0.003, 0.005])])
    metrics.executed(0.01, 0.5, returned=2)
    metrics.ran_inline(1, 0.0, 1, [(1, [1.0, 1.002, 1.003])])
    metrics.executed(0.02, 0.25, returned=1)
    metrics.admitted(3, 0.001, "new")
    metrics.executed(0.001, 0.1)  # handed to the pipeline: its answers are the pipeline's
    counted = metrics.snapshot()
    assert counted[("dvabatch_executes_total", ())] == 3
    assert counted[("dvabatch_execute_us_total", ())] == pytest.approx(31_000)
    assert counted[("dvabatch_execute_idle_us_total", ())] == pytest.approx(850_000)
    assert counted[("dvabatch_returned_answers_total", ())] == 3
    assert counted[("dvabatch_returned_answer_us_total", ())] == pytest.approx(2 * 10_000 + 20_000)
    assert counted[("dvabatch_entry_queries_total", ())] == 6
    assert counted[("dvabatch_entry_wait_us_total", ())] == pytest.approx(5_000)
    assert counted[("dvabatch_meta_operations_total", (("kind", "new"),))] == 3
    assert {(family, dict(k)["stage"], dict(k)["rows"]): v for (family, k), v in counted.items()
            if family == "dvabatch_batches_total"} == {("dvabatch_batches_total", "0", "2"): 2,
                                                       ("dvabatch_batches_total", "1", "2"): 1,
                                                       ("dvabatch_batches_total", "0", "1"): 1,
                                                       ("dvabatch_batches_total", "1", "1"): 1}
    assert counted[("dvabatch_stage_busy_us_total", (("stage", "0"),))] == pytest.approx(1_000 + 3_000 + 2_000)
    assert counted[("dvabatch_stage_busy_us_total", (("stage", "1"),))] == pytest.approx(2_000 + 1_000)
    assert metrics.longest_idle_s() == pytest.approx(0.5)


def served_plain(manifest: Manifest, folder: Path) -> tuple[Runtime, Metrics]:
    """``auto``'s runtime on ``manifest``, its mode switch stopped, serving plain (timed stages fused)."""
    metrics = Metrics()
    _, runtime = serve(manifest, folder, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), metrics)
    runtime.watch.stop()
    runtime.mode = runtime.watch.switch.plain
    return runtime, metrics


def test_a_timed_model_of_one_stage_switches_without_a_second_engine(tmp_path):
    """One stage on engines that overlap: the mode switch chooses between the pipeline (its
    batch computes while the host forms the next) and serving plain, which runs the one engine
    it has (no fused copy is loaded); it used to pipeline always, every answer a ``send()``."""
    one = timed_manifest(tmp_path, 0.62, 15.15, 128, stages=1)
    decision, runtime = serve(one, tmp_path, RuntimeConfig(policy=make_policy("auto", {})), CpuDevice(), Metrics())
    try:
        assert decision.choice.switches and runtime.watch is not None and len(runtime.plain.engines) == 1
        runtime.watch.stop()
        runtime.mode = runtime.watch.switch.plain
        inbox = Inbox()
        feed = sample_inputs(one.inputs, 2, {"sequence": 16}, seed=0)
        runtime.run([inbox.query(0, feed)])
        [(outputs, failure)] = inbox.answers[0]
        assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
    finally:
        runtime.close()


def test_a_model_served_plain_runs_a_ragged_batch_once_or_in_two_by_length_on_engines_that_overlap(tmp_path):
    """Triton hands over queries of different lengths in one batch (allow_ragged_batch); served
    plain on engines that overlap (here timed, at TensorRT speed) every query is answered when
    the last run is done, so the runs' time together decides (``form_inline``): 8 queries, half
    of 16 tokens and half of 128, run once, padded to 128 (1.42 ms by the tables, against 0.56 +
    0.96 ms and the host's part of a second run); 32 run as two, the short ones padded only to
    16 (0.73 + 2.34 against 4.17 ms). Every answer is cut back to its own length. (ONNX Runtime
    stages run the policy's clusters by length instead.) The host's part of a run is set, 50 µs:
    as measured at load it is this host's at that moment, and once, on a slow host in a full run,
    it made one run of the 32 pay."""
    trt = timed_manifest(tmp_path, 0.62, 15.15, 128)
    runtime, metrics = served_plain(trt, tmp_path)
    runtime.plain.policy.measured(HostCosts(pipeline_batch_s=100e-6, plain_batch_s=50e-6), len(trt.stages))
    try:
        for count in (8, 32):
            inbox = Inbox()
            feeds = [sample_inputs(trt.inputs, 1, {"sequence": 16 if i % 2 else 128}, seed=i) for i in range(count)]
            assert runtime.runs_inline()
            runtime.run([inbox.query(i, feed) for i, feed in enumerate(feeds)])
            for i, feed in enumerate(feeds):
                [(outputs, failure)] = inbox.answers[i]
                assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
        assert {dict(k)["rows"]: v for (family, k), v in metrics.snapshot().items()
                if family == "dvabatch_batches_total"} == {"8": 1, "16": 2}
    finally:
        runtime.close()


def test_a_lone_query_served_plain_is_its_own_batch_and_counted_as_one_engine_run(tmp_path):
    """A model served plain at low load runs one query a call: its inputs go through the whole
    model as one engine (timed stages fuse) as they are (nothing stacked, padded or cut) and its
    answer is that engine's outputs, while the counters read by the mode switch and Triton's
    metrics (queries admitted, new batches, batches by rows and busy time) count it as a run of
    stage 0, the one engine; so does a query that fails validation beside it, answered on its own."""
    trt = timed_manifest(tmp_path, 0.62, 15.15, 128)
    runtime, metrics = served_plain(trt, tmp_path)
    try:
        inbox = Inbox()
        feed = sample_inputs(trt.inputs, 1, {"sequence": 16}, seed=0)
        bad = {**feed, "input_ids": feed["input_ids"].astype(np.int32)}
        assert runtime.runs_inline()
        runtime.run([inbox.query(0, feed)])
        runtime.run([inbox.query(1, bad), inbox.query(2, feed)])
        [(outputs, failure)] = inbox.answers[0]
        assert failure is None and all(np.array_equal(outputs[f"{name}_out"], feed[name]) for name in feed)
        assert inbox.answers[1][0][1].bad_input and inbox.answers[2][0][1] is None
        counted = metrics.snapshot()
        assert counted[("dvabatch_entry_queries_total", ())] == 2
        assert counted[("dvabatch_meta_operations_total", (("kind", "new"),))] == 2
        assert runtime.mode is Mode.FUSED and len(runtime.plain.engines) == 1
        assert {dict(k)["stage"]: v for (family, k), v in counted.items() if family == "dvabatch_batches_total"} \
            == {"0": 2}
        assert all(v > 0 for (family, _), v in counted.items() if family == "dvabatch_stage_busy_us_total")
    finally:
        runtime.close()


def test_requests_without_a_deadline_run_from_their_inputs_once_their_signatures_were_judged_valid(tmp_path):
    """``run_straight``: served plain, the requests of a call, none with a deadline, run from
    their inputs alone, no ``Query`` made, and their replies go to ``meanwhile``, in order; they
    are counted as queries' runs are: one alone, several of one shape as one batch. It declines,
    doing nothing, wherever more is needed: inputs of a signature not judged yet (the general way
    judges it) or judged invalid (the general way answers why), requests of different lengths
    (the policy forms them), a policy that learns from each run (``slo``), and several where the
    former may split requests of one shape (on the host's cores, the policy's ``form``): it says
    so by 0 rows run."""
    trt = timed_manifest(tmp_path, 0.62, 15.15, 128)
    runtime, metrics = served_plain(trt, tmp_path)
    try:
        feed = sample_inputs(trt.inputs, 2, {"sequence": 16}, seed=0)
        bad = {**feed, "input_ids": feed["input_ids"].astype(np.int32)}
        replies: list = []
        assert runtime.runs_inline()
        assert not runtime.run_straight([feed], replies.extend) and not replies and not metrics.snapshot().get(
            ("dvabatch_entry_queries_total", ()))
        inbox = Inbox()
        one = sample_inputs(trt.inputs, 1, {"sequence": 16}, seed=3)
        runtime.run([inbox.query(0, feed), inbox.query(1, bad), inbox.query(2, one)])  # judged: valid, invalid
        assert inbox.answers[1][0][1].bad_input
        assert not runtime.run_straight([bad], replies.extend) and not replies
        other = sample_inputs(trt.inputs, 2, {"sequence": 16}, seed=1)
        assert runtime.run_straight([other], replies.extend) == 2  # the rows it ran
        [(outputs, failure)] = replies
        assert failure is None and all(np.array_equal(outputs[f"{name}_out"], other[name]) for name in other)
        counted = metrics.snapshot()
        assert counted[("dvabatch_entry_queries_total", ())] == 3
        assert counted[("dvabatch_meta_operations_total", (("kind", "new"),))] == 2
        assert {dict(k)["rows"]: v for (family, k), v in counted.items() if family == "dvabatch_batches_total"} \
            == {"3": 1, "2": 1}
        replies.clear()
        assert runtime.run_straight([other, one, feed], replies.extend) == 5  # one batch of 5 rows
        assert [r[1] for r in replies] == [None] * 3
        for reply, sent in zip(replies, (other, one, feed)):
            assert all(np.array_equal(reply[0][f"{name}_out"], sent[name]) for name in sent)
        counted = metrics.snapshot()
        assert counted[("dvabatch_batches_total", (("stage", "0"), ("rows", "5")))] == 1
        longer = sample_inputs(trt.inputs, 1, {"sequence": 24}, seed=4)
        runtime.run([Inbox().query(0, longer)])  # judged valid
        assert not runtime.run_straight([one, longer], replies.extend) and len(replies) == 3
    finally:
        runtime.close()
    engines = load_engines(trt, tmp_path, CpuDevice())
    learns = WholeBatch(trt, engines, CpuDevice(), Metrics(), policy=make_policy("slo", {}))
    learns.run([Inbox().query(0, feed)])
    assert not learns.run_straight([feed], replies.extend) and len(replies) == 3
    splits = WholeBatch(trt, engines, CpuDevice(), Metrics(), form=lambda queries: [[q] for q in queries])
    splits.run([Inbox().query(0, feed)])
    assert splits.run_straight([feed], replies.extend) and not splits.run_straight([feed, feed], replies.extend)


@pytest.mark.wallclock
def test_a_model_served_as_a_plain_one_answers_while_its_engines_run_and_returns_once_they_are_done(tmp_path):
    """On engines that run ahead of the host (a GPU; timed), ``WholeBatch.run`` answers every
    query with the arrays its results land in and calls ``meanwhile`` (where the backend builds
    its responses) before it waits for the engines, so that work does not add to theirs; it
    returns once they are done, and the stage's busy time counts the wait."""
    slow = timed_manifest(tmp_path, 200, 200, 2)  # two stages of 100 ms
    server, metrics = served_plain(slow, tmp_path)
    inbox = Inbox()
    feeds = [sample_inputs(slow.inputs, 1, {"sequence": 4 + i}, seed=i) for i in range(3)]
    seen = {}
    began = time.monotonic()

    def meanwhile():
        seen["after_s"], seen["answered"] = time.monotonic() - began, sorted(inbox.answers)

    server.run([inbox.query(i, feed) for i, feed in enumerate(feeds)], meanwhile)
    took = time.monotonic() - began
    assert seen["answered"] == [0, 1, 2] and seen["after_s"] < 0.1 and took >= 0.2
    for i, feed in enumerate(feeds):
        [(outputs, failure)] = inbox.answers[i]
        assert failure is None and np.array_equal(outputs["input_ids_out"], feed["input_ids"])
    busy = [v for (family, _), v in metrics.snapshot().items() if family == "dvabatch_stage_busy_us_total"]
    assert sum(busy) >= 0.2e6
    server.close()


def test_auto_serves_as_a_plain_model_where_the_pipeline_cannot_pay(repository, sources):
    """ONNX Runtime stages whose time grows with the rows: ``auto`` serves the stages as one
    session that runs each batch as it comes (a split would save nothing, and stages on shared
    cores only take turns): no runtime threads, answered before ``run`` returns, and answers
    for mixed lengths still equal the unsliced model. With a first stage that batching pays for
    and later ones that it does not (operator diversity: splitting saves), the pipeline stays."""
    version_dir = repository / "bert_like" / VERSION
    source = Manifest.load(version_dir)
    sizes = source.stages[0].latency.batch_sizes
    per_row = {"batch_sizes": list(sizes), "mean": [1.0 * b for b in sizes]}
    fixed = {"batch_sizes": list(sizes), "mean": [1.0] * len(sizes)}
    manifest = with_tables(source, [per_row] * len(source.stages))
    config = lambda: RuntimeConfig(policy=make_policy("auto", {}))  # noqa: E731
    assert choose(with_tables(source, [fixed] + [per_row] * (len(source.stages) - 1)), True, True).pipeline
    assert not choose(manifest, True, True).pipeline
    assert choose(manifest, False, True).pipeline  # a policy configured by name
    one = with_tables(source, [fixed] * len(source.stages)).fused()  # batching pays, but one stage overlaps nothing
    assert not choose(one, True, True).pipeline and choose(one, True, False).switches
    decision, server = serve(manifest, version_dir, config(), CpuDevice(), Metrics())
    assert decision.mode is Mode.FUSED and isinstance(server, WholeBatch) and len(server.engines) == 1
    assert server.manifest.stages[0].latency.mean == tuple(len(source.stages) * b for b in sizes)
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % 2, {"sequence": 3 + i}, seed=i) for i in range(10)]
    for feed in feeds:  # a batch of mixed lengths is padded to its longest: the padding is masked out
        feed["attention_mask"][:] = 1
    for first in range(0, len(feeds), 4):
        server.run([inbox.query(i, feeds[i]) for i in range(first, min(first + 4, len(feeds)))])
        assert len(inbox.answers) == min(first + 4, len(feeds))  # answered inside run, as inside execute
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    assert_like_reference(inbox, feeds, OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs]))
    assert {labels for (family, labels) in server.metrics.snapshot() if family == "dvabatch_stage_busy_us_total"} \
        == {(("stage", "0"),)}
    assert server.metrics.snapshot()[("dvabatch_serving", (("mode", "fused"),))] == 1
    # A call of several requests of one judged shape runs straight from their inputs, as one
    # batch: the fused session's Policy I forms one batch of one length (``forms_alike_whole``).
    # On ``bert_like`` at 4 / 8 / 32 in flight that cut the stub's CPU a request by 75 / 19 / 24 us
    # (docs/results/fused-calls-straight).
    alike = [sample_inputs(manifest.inputs, 1, {"sequence": 3}, seed=20 + i) for i in range(3)]
    for feed in alike:
        feed["attention_mask"][:] = 1
    replies: list = []
    assert server.run_straight(alike, replies.extend) == 3 and [failure for _, failure in replies] == [None] * 3
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    for (outputs, _), feed in zip(replies, alike):
        for name, expected in reference.run(feed).items():
            np.testing.assert_allclose(outputs[name], expected, rtol=1e-4, atol=1e-5)


def test_a_model_folder_that_disagrees_with_itself_fails_to_load_naming_the_file(repository, tmp_path):
    """Stage files from another slicing (here two stages' files swapped in manifest.json) would
    fail every batch: loading refuses them, naming the stage and its tensors; a stage file that
    is no ONNX model, or a manifest.json that is no JSON, is named too."""
    version_dir = tmp_path / "resnet_like"
    shutil.copytree(repository / "resnet_like" / VERSION, version_dir)
    data = json.loads((version_dir / "manifest.json").read_text())
    data["stages"][1]["file"], data["stages"][2]["file"] = data["stages"][2]["file"], data["stages"][1]["file"]
    (version_dir / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"stage 1 \(stage_2.onnx\) takes .* different slicings"):
        load_engines(Manifest.load(version_dir), version_dir)
    load_engines(Manifest.load(version_dir), version_dir, fused=True)  # joined by tensor names: whatever the order
    (version_dir / "stage_2.onnx").write_bytes(b"not a model")
    for fused in (False, True):
        with pytest.raises(RuntimeError, match="stage_2.onnx cannot be"):
            load_engines(Manifest.load(version_dir), version_dir, fused=fused)
    (version_dir / "manifest.json").write_text(json.dumps(data)[:100])
    with pytest.raises(ValueError, match="manifest.json cannot be read"):
        Manifest.load(version_dir)


class _Reusing:
    """An engine that writes every batch's outputs into the same array (as engines with fixed
    output bindings do), around a timed one."""

    def __init__(self, engine):
        self._engine, self._out = engine, None

    def names(self):
        return self._engine.names()

    def run(self, inputs):
        computed = self._engine.run(inputs)
        if self._out is None:
            self._out = {name: np.empty((8, *array.shape[1:]), array.dtype) for name, array in computed.items()}
        for name, array in computed.items():
            self._out[name][:len(array)] = array
        return {name: self._out[name][:len(array)] for name, array in computed.items()}


def test_an_answer_still_being_sent_keeps_its_rows_when_the_engine_reuses_its_output_array():
    """The exit sends answers from threads of their own, after the last stage moved on. Query 0's
    answer is held (its send still under way) while query 1 runs through the same output array
    of the last stage's engine: query 0's answer is still its own rows."""
    manifest = timed_stages([flat(0.1)] * 2)
    engines = load_engines(manifest, ".", CpuDevice())
    runtime = Runtime(manifest, [engines[0], _Reusing(engines[1])], RuntimeConfig(policy=make_policy("pass", {})))
    sending, second_answered, held = threading.Event(), threading.Event(), {}

    def slow_send(outputs, failure):
        sending.set()
        second_answered.wait(5)
        held.update(x=outputs["x"].copy(), failure=failure)

    first = np.full((1, 8), 1.0, np.float32)
    runtime.submit([Query({"x": first}, slow_send)])
    assert sending.wait(5)
    runtime.submit([Query({"x": np.full((1, 8), 2.0, np.float32)}, lambda outputs, failure: second_answered.set())])
    assert second_answered.wait(5)
    runtime.close()
    assert held["failure"] is None
    np.testing.assert_array_equal(held["x"], first)

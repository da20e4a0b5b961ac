"""Faults inside the runtime, with real ONNX Runtime stages: whatever fails, every query is
answered exactly once, the buffers and the batch table recover, and the model keeps serving."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from backend.buffers import BufferState
from backend.config import QueuePolicy, RuntimeConfig
from backend.device import CpuDevice
from backend.engines import OnnxRuntimeEngine, load_engines
from backend.manifest import Manifest
from backend.metrics import Metrics
from backend.policy import Policy, RandomPolicy
from backend.query import Code
from backend.entry import SCAN
from backend.runtime import CANCEL_IN_FLIGHT_S, Runtime
from backend.sample import sample_inputs
from backend.whole import WholeBatch
from slicer.slicing import VERSION

from .conftest import MAX_BATCH
from .test_runtime import GatedEngine, Inbox, assert_like_reference, stretch_while_held


def served(repository, name: str, config: RuntimeConfig, device=None, wrap=None) -> tuple[Manifest, Runtime]:
    version_dir = repository / name / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    return manifest, Runtime(manifest, wrap(engines) if wrap else engines, config, device)


def reference(sources, name: str, manifest: Manifest) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine(sources[name], [o.name for o in manifest.outputs])


def assert_recovered(runtime: Runtime) -> None:
    """Nothing left behind: no batch in the table, every buffer available (a consumer releases
    what it read when it next goes active, just after the answers), every executor alive."""
    assert runtime.table.wait_empty(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
            state is not BufferState.AVAILABLE for boundary in runtime.boundaries for state in boundary.states()):
        time.sleep(0.01)
    for boundary in runtime.boundaries:
        assert boundary.states() == [BufferState.AVAILABLE] * len(boundary.buffers)
        assert all(buffer.claims == 0 for buffer in boundary.buffers)
    assert all(executor.is_alive() for executor in runtime.executors)


def serve_and_check(runtime: Runtime, manifest: Manifest, engine: OnnxRuntimeEngine, count: int, seed: int = 0):
    """``count`` good queries in bursts: each answered once, equal to the unsliced model."""
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, seed=seed + i) for i in range(count)]
    for start in range(0, count, 4):
        runtime.submit([inbox.query(i, feeds[i]) for i in range(start, min(start + 4, count))])
        time.sleep(0.002)
    inbox.wait(count)
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    assert_like_reference(inbox, feeds, engine)


class BrokenPolicy(Policy):
    """Every hook a policy has raises, or splits into sizes that do not add up."""

    name = "broken"

    def __init__(self, bad_sizes: bool):
        self.bad_sizes = bad_sizes

    def window_end(self, waiting, rows, outlook, now):
        raise RuntimeError("window")

    def form(self, waiting, room, now, outlook=None):
        raise RuntimeError("form")

    def stretchable(self, queries, now):
        raise RuntimeError("stretchable")

    def split(self, batch, stage, now):
        if self.bad_sizes:
            return [batch.bs, 1]
        raise RuntimeError("split")


@pytest.mark.parametrize("bad_sizes", [False, True])
def test_a_broken_policy_costs_its_decisions_not_the_queries(repository, sources, bad_sizes):
    """A policy raising at admission (window, batches, stretching) and at every split, or
    splitting into sizes that do not add up: the queries run as plain new batches, all right."""
    manifest, runtime = served(repository, "resnet_like", RuntimeConfig(buffer_pairs=1,
                                                                        policy=BrokenPolicy(bad_sizes)))
    serve_and_check(runtime, manifest, reference(sources, "resnet_like", manifest), 16)
    assert_recovered(runtime)
    runtime.close()


class FaultyDevice(CpuDevice):
    """Fails the first time stage ``stage`` records an event (a device error outside the engine)."""

    def __init__(self, stage: int):
        self.thread, self.failed = f"dvabatch-stage-{stage}", threading.Event()

    def record(self, event, stream):
        if threading.current_thread().name == self.thread and not self.failed.is_set():
            self.failed.set()
            raise RuntimeError("injected device fault")


@pytest.mark.parametrize("pairs", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_fault_outside_the_engine_fails_its_batch_and_nothing_else(repository, sources, stage, pairs):
    """A device fault while a stage hands its batch on: that batch's query is answered once (with
    the error, unless its answer had already left), its buffers and table row are returned, and
    every later query is served right, with one buffer pair or two."""
    device = FaultyDevice(stage)
    manifest, runtime = served(repository, "resnet_like", RuntimeConfig(buffer_pairs=pairs), device)
    inbox = Inbox()
    runtime.submit([inbox.query(0, sample_inputs(manifest.inputs, 2, seed=99))])
    inbox.wait(1)
    assert device.failed.is_set() and len(inbox.answers[0]) == 1
    outputs, failure = inbox.answers[0][0]
    if stage < len(manifest.stages) - 1:  # the last stage's answers leave before it records
        assert outputs is None and failure.code is Code.INTERNAL and f"stage {stage}" in failure.message
    serve_and_check(runtime, manifest, reference(sources, "resnet_like", manifest), 12)
    assert_recovered(runtime)
    runtime.close()


class FailsOnce(GatedEngine):
    """Holds its first run until released, then fails it."""

    def run(self, inputs):
        if not self.rows:
            self.rows.append(len(next(iter(inputs.values()))))
            self.release.wait(30)
            raise RuntimeError("injected engine fault")
        return super().run(inputs)


def test_late_rows_survive_a_failure_of_the_rows_they_joined(repository, sources):
    """Query 1 stretches batch 0 while stage 1 holds it; stage 1 then fails on query 0's rows.
    Query 0 gets the error; query 1's rows catch up all the same and its answer is right."""
    manifest, runtime, inbox, feeds, runs = stretch_while_held(repository, FailsOnce)
    assert (0, 0, 1, 2) in runs and (2, 0, 0, 3) in runs, "query 1 stretched batch 0"
    outputs, failure = inbox.answers[0][0]
    assert outputs is None and "injected engine fault" in failure.message
    assert_like_reference(type("One", (), {"answers": {0: inbox.answers[1]}})(), feeds[1:],
                          reference(sources, "unet_like", manifest))
    assert_recovered(runtime)
    runtime.close()


class FirstRowOnly:
    """A broken engine: returns only the first row of every output, whatever it was given."""

    def __init__(self, engine):
        self.engine = engine

    def run(self, inputs):
        return {name: value[:1] for name, value in self.engine.run(inputs).items()}


class FailsOnNan:
    """A stage that cannot run a batch holding a NaN (a bad input validation cannot see)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0

    def run(self, inputs):
        self.calls += 1
        if any(np.isnan(value).any() for value in inputs.values() if value.dtype.kind == "f"):
            raise RuntimeError("a NaN in the batch")
        return self.engine.run(inputs)


def test_served_plain_a_query_the_engines_fail_on_fails_alone_and_the_model_keeps_serving(repository, sources):
    """A model served plain (``WholeBatch``, every batch inside ``execute``): a lone query whose
    input the engines fail on gets its own error naming what failed, and is run once; the next
    lone query, and the good queries of a batch holding a bad one, get their right answers."""
    version_dir = repository / "resnet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    first = FailsOnNan(engines[0])
    metrics = Metrics()
    server = WholeBatch(manifest, [first, *engines[1:]], CpuDevice(), metrics)
    feeds = [sample_inputs(manifest.inputs, 1, seed=i) for i in range(5)]
    for i in (0, 3):
        next(iter(feeds[i].values()))[0, 0] = np.nan
    inbox = Inbox()
    server.run([inbox.query(0, feeds[0])])
    [(outputs, failure)] = inbox.answers[0]
    assert outputs is None and failure.code is Code.INTERNAL and "a NaN in the batch" in failure.message
    assert first.calls == 1  # a lone query is its own batch: nothing to run again one by one
    server.run([inbox.query(1, feeds[1])])
    server.run([inbox.query(i, feeds[i]) for i in (2, 3, 4)])
    assert all(len(inbox.answers[i]) == 1 for i in range(5))
    assert inbox.answers[3][0][1] is not None and "a NaN in the batch" in inbox.answers[3][0][1].message
    good = Inbox()
    good.answers = dict(enumerate(inbox.answers[i] for i in (1, 2, 4)))
    assert_like_reference(good, [feeds[i] for i in (1, 2, 4)], reference(sources, "resnet_like", manifest))
    assert metrics.snapshot()[("dvabatch_entry_queries_total", ())] == 5


def test_an_engine_returning_too_few_rows_never_broadcasts_them(repository, sources):
    """Three queries batched together, a stage answering one row for three: the runtime notices,
    runs them one by one, and each query gets its own rows."""
    manifest, runtime = served(repository, "resnet_like", RuntimeConfig(),
                               wrap=lambda engines: [engines[0], FirstRowOnly(engines[1]), *engines[2:]])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, seed=i) for i in range(3)]
    runtime.submit([inbox.query(i, feed) for i, feed in enumerate(feeds)])
    inbox.wait(3)
    runtime.close()
    assert_like_reference(inbox, feeds, reference(sources, "resnet_like", manifest))


def gated(repository, name: str, config: RuntimeConfig) -> tuple[Manifest, Runtime, GatedEngine]:
    version_dir = repository / name / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    gate = GatedEngine(engines[0])
    return manifest, Runtime(manifest, [gate, *engines[1:]], config), gate


def test_cancelled_and_expired_queries_are_answered_without_running(repository):
    """While stage 0 holds query 0: query 1 is cancelled by its client, query 2's timeout expires,
    query 3 waits patiently. Only queries 0 and 3 run; 1 gets CANCELLED, 2 UNAVAILABLE."""
    manifest, runtime, gate = gated(repository, "resnet_like", RuntimeConfig())
    inbox = Inbox()
    feed = lambda seed: sample_inputs(manifest.inputs, 1, seed=seed)  # noqa: E731
    runtime.submit([inbox.query(0, feed(0))])
    while not gate.rows:
        time.sleep(0.005)
    cancelled, expired, patient = inbox.query(1, feed(1)), inbox.query(2, feed(2)), inbox.query(3, feed(3))
    cancelled.cancelled = lambda: True
    expired.deadline = time.monotonic() + 0.01
    runtime.submit([cancelled, expired, patient])
    time.sleep(0.05)
    gate.release.set()
    inbox.wait(4)
    runtime.close()
    assert gate.rows == [1, 1]
    assert inbox.answers[1][0][1].code is Code.CANCELLED
    assert inbox.answers[2][0][1].code is Code.UNAVAILABLE and "timeout expired" in inbox.answers[2][0][1].message
    assert inbox.answers[0][0][1] is None and inbox.answers[3][0][1] is None


def test_a_query_cancelled_in_flight_is_answered_at_the_next_stage(repository, sources):
    """Queries 0 and 1 run stage 0 together; meanwhile 0's client cancels. At the next stage
    boundary 0 is answered CANCELLED, and 1 goes on and gets its right answer."""
    manifest, runtime, gate = gated(repository, "resnet_like", RuntimeConfig())
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, seed=i) for i in range(2)]
    queries = [inbox.query(i, feed) for i, feed in enumerate(feeds)]
    runtime.submit(queries)
    while not gate.rows:
        time.sleep(0.005)
    queries[0].cancelled = lambda: True
    time.sleep(CANCEL_IN_FLIGHT_S * 1.2)
    gate.release.set()
    inbox.wait(2)
    runtime.close()
    assert gate.rows == [2] and inbox.answers[0][0][1].code is Code.CANCELLED
    assert_like_reference(type("One", (), {"answers": {0: inbox.answers[1]}})(), feeds[1:],
                          reference(sources, "resnet_like", manifest))


class Fatal(BaseException):
    """Not an Exception: nothing in the executor's loop catches it, so its thread ends."""


class DiesOnSecond:
    """A stage that kills its executor thread on its second batch, holding it until released."""

    def __init__(self, engine):
        self.engine, self.runs, self.release = engine, 0, threading.Event()

    def run(self, inputs):
        self.runs += 1
        if self.runs == 2:
            self.release.wait(30)
            raise Fatal("injected thread death")
        return self.engine.run(inputs)


def test_an_executor_thread_that_dies_answers_everything_and_refuses_more(repository, sources):
    """Stage 1's thread dies on a batch while more queries wait: the batch's queries get INTERNAL
    naming the stage, the waiting ones and every later one UNAVAILABLE, each exactly once; the
    backend hears of it once; close does not wait out its timeout."""
    deaths = []
    version_dir = repository / "resnet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = load_engines(manifest, version_dir)
    dying = DiesOnSecond(engines[1])
    runtime = Runtime(manifest, [engines[0], dying, *engines[2:]], RuntimeConfig(), on_death=deaths.append)
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, seed=i) for i in range(8)]
    runtime.submit([inbox.query(0, feeds[0])])
    inbox.wait(1)
    assert runtime.ready  # what the model's is_ready() tells Triton 26.03+
    runtime.submit([inbox.query(1, feeds[1])])
    while dying.runs < 2:
        time.sleep(0.005)
    runtime.submit([inbox.query(i, feeds[i]) for i in range(2, 6)])
    dying.release.set()
    inbox.wait(6)
    runtime.submit([inbox.query(i, feeds[i]) for i in range(6, 8)])
    inbox.wait(8)
    assert not runtime.ready
    started = time.monotonic()
    runtime.close()
    assert time.monotonic() - started < 5
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    assert inbox.answers[0][0][1] is None
    died = inbox.answers[1][0][1]
    assert died.code is Code.INTERNAL and "stage 1's executor died (Fatal: injected thread death)" in died.message
    later = [inbox.answers[i][0][1] for i in range(2, 8)]
    assert all(f is not None and f.code in (Code.UNAVAILABLE, Code.INTERNAL) for f in later)
    assert all(inbox.answers[i][0][1].code is Code.UNAVAILABLE for i in (6, 7))
    assert len(deaths) == 1 and "must be loaded again" in deaths[0]


def test_a_full_queue_refuses_at_once_with_unavailable(repository):
    """max_queue_size 2 while stage 0 holds query 0: of four more queries, two wait and run, two
    are refused at once, as Triton's queue policy would."""
    manifest, runtime, gate = gated(repository, "resnet_like", RuntimeConfig(queue=QueuePolicy(max_queue_size=2)))
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1, seed=i) for i in range(5)]
    runtime.submit([inbox.query(0, feeds[0])])
    while not gate.rows:
        time.sleep(0.005)
    runtime.submit([inbox.query(i, feeds[i]) for i in range(1, 5)])
    inbox.wait(2)
    refused = {key for key, answers in inbox.answers.items() if answers[0][1] is not None}
    assert refused == {3, 4}
    assert all("Exceeds maximum queue size" in inbox.answers[k][0][1].message for k in refused)
    assert all(inbox.answers[k][0][1].code is Code.UNAVAILABLE for k in refused)
    gate.release.set()
    inbox.wait(5)
    runtime.close()
    assert all(inbox.answers[k][0][1] is None for k in (0, 1, 2))


def test_queue_policy_reads_triton_config_json():
    """As Triton hands config.pbtxt to a Python backend (64-bit numbers as strings)."""
    config = {"dynamic_batching": {"max_queue_delay_microseconds": "100", "default_queue_policy": {
        "max_queue_size": "4", "default_timeout_microseconds": "1000", "allow_timeout_override": True,
        "timeout_action": "DELAY"}}}
    policy = QueuePolicy.from_model_config(config)
    assert policy == QueuePolicy(max_queue_size=4, default_timeout_us=1000, allow_timeout_override=True, reject=False,
                                 delay_us=100)
    assert policy.timeout_us(0) == 1000 and policy.timeout_us(50) == 50
    assert policy.timeout_us(5000) == 1000  # an override only shortens the default, as Triton's queue takes it
    assert policy.any_deadline([0, 0]) and QueuePolicy().any_deadline([0, 7]) and not QueuePolicy().any_deadline([0, 0])
    strict = QueuePolicy(default_timeout_us=1000)
    assert strict.timeout_us(50) == 1000  # no override allowed
    assert QueuePolicy().timeout_us(50) == 50 and QueuePolicy().timeout_us(0) == 0
    assert QueuePolicy.from_model_config({}) == QueuePolicy()
    assert np.isfinite(policy.max_queue_size)


class Flaky:
    """Raises with probability ``p`` (from a seeded generator) while ``on``."""

    def __init__(self, seed: int, p: float):
        self.rng, self.p, self.on, self.lock = random.Random(seed), p, True, threading.Lock()

    def maybe(self, what: str) -> None:
        with self.lock:
            fail = self.on and self.rng.random() < self.p
        if fail:
            raise RuntimeError(f"injected {what} fault")


class FlakyEngine:
    def __init__(self, engine, flaky: Flaky):
        self.engine, self.flaky = engine, flaky

    def run(self, inputs):
        self.flaky.maybe("engine")
        return self.engine.run(inputs)


class FlakyDevice(CpuDevice):
    def __init__(self, flaky: Flaky):
        self.flaky = flaky

    def record(self, event, stream):
        self.flaky.maybe("device")


class FlakyPolicy(RandomPolicy):
    """Random meta operations, and random faults in the policy's own decisions."""

    def __init__(self, flaky: Flaky, seed: int):
        super().__init__(seed=seed, stretch_probability=0.7, split_probability=0.4)
        self.flaky = flaky

    def stretch(self, candidate, queries, now, backlog=0):
        self.flaky.maybe("stretch")
        return super().stretch(candidate, queries, now, backlog)

    def split(self, batch, stage, now):
        self.flaky.maybe("split")
        return super().split(batch, stage, now)


@pytest.mark.parametrize("pairs", [1, 2])
def test_random_faults_under_random_meta_operations(repository, sources, pairs):
    """Engine, device and policy faults at random while new/stretch/split happen at random, from
    three client threads: every query is answered exactly once, every answer that is not an
    error equals the unsliced model, and once the faults stop the model serves as before."""
    flaky = Flaky(seed=pairs, p=0.08)
    version_dir = repository / "unet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = [FlakyEngine(e, flaky) for e in load_engines(manifest, version_dir)]
    runtime = Runtime(manifest, engines, RuntimeConfig(buffer_pairs=pairs, policy=FlakyPolicy(flaky, pairs)),
                      FlakyDevice(flaky))
    engine = reference(sources, "unet_like", manifest)
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, seed=i) for i in range(90)]

    def client(offset: int) -> None:
        for i in range(offset, len(feeds), 3):
            runtime.submit([inbox.query(i, feeds[i])])
            time.sleep(0.001 * (i % 4))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    inbox.wait(len(feeds))
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    good = {i for i, answers in inbox.answers.items() if answers[0][1] is None}
    assert all(inbox.answers[i][0][1].code is Code.INTERNAL for i in set(inbox.answers) - good)
    assert 0 < len(good) < len(feeds), "faults happened, and not to everything"
    for i in good:
        for name, expected in engine.run(feeds[i]).items():
            np.testing.assert_allclose(inbox.answers[i][0][0][name], expected, atol=1e-5, err_msg=f"query {i}")
    flaky.on = False
    assert_recovered(runtime)
    serve_and_check(runtime, manifest, engine, 12, seed=1000)
    runtime.close()


class Watching(Policy):
    """Pass-through, noting how many waiting queries each admission was shown."""

    def __init__(self):
        self.shown: list[int] = []

    def form(self, waiting, room, now, outlook=None):
        self.shown.append(len(waiting))
        return super().form(waiting, room, now, outlook)


def test_admission_looks_at_a_bounded_head_of_the_queue(repository):
    """500 queries waiting behind a held batch: each admission is shown the oldest 64 at most
    (its cost does not grow with the queue), and every query is still answered, in order."""
    policy = Watching()
    manifest, runtime, gate = gated(repository, "resnet_like", RuntimeConfig(policy=policy))
    inbox = Inbox()
    feed = sample_inputs(manifest.inputs, 1, seed=0)
    runtime.submit([inbox.query(0, feed)])
    while not gate.rows:
        time.sleep(0.005)
    runtime.submit([inbox.query(i, feed) for i in range(1, 501)])
    gate.release.set()
    inbox.wait(501)
    runtime.close()
    assert max(policy.shown) == SCAN and all(len(a) == 1 and a[0][1] is None for a in inbox.answers.values())
    assert gate.rows[1:] == [MAX_BATCH] * (500 // MAX_BATCH) + [500 % MAX_BATCH]

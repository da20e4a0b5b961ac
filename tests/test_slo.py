"""``policy: slo`` (Orloj): the learned execution-time distribution, feasible batch sizes, the
batch-aware priority, refusing what cannot meet its deadline, in process and through Triton."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backend import slo
from backend.arrival import TritonQueue
from backend.config import RuntimeConfig, make_policy
from backend.device import make_device
from backend.engines import load_engines
from backend.sample import sample_inputs
from backend.serving import Mode, serve
from backend.manifest import LatencyTable, Manifest, StageSpec, TensorSpec
from backend.metrics import Metrics
from backend.policy import Outlook
from backend.query import BatchShape, Query, refuse_invalid
from backend.whole import WholeBatch
from tools.lib.client import infer
from tools.lib.timed import write_timed

from .conftest import serving
from slicer.slicing import VERSION

from .timed import Clock, timed_manifest, with_tables

# Two stages, each 10 ms for one query and 4 ms more for each further one: a batch of k takes
# 20 + 8 (k - 1) ms through both (28 for 2, 36 for 3, 76 for 8).
TABLE = {"batch_sizes": list(range(1, 9)), "mean": [10.0 + 4 * k for k in range(8)]}


def _bimodal(rng: np.random.Generator, count: int) -> np.ndarray:
    return np.where(rng.random(count) < 0.7, 0.25, 1.0)  # 70 % leave at a quarter of the time


def test_each_querys_distribution_is_learned_from_the_batches_it_ran_in():
    """Runs of b rows take their slowest row's time (the largest of b ratios); inverting F^b
    gives each query's own distribution: 70 % at a quarter of the tables' time. A lone query's
    median is then the short mode; a batch of 4 most likely holds a long one (0.7^4 < 0.5)."""
    rng = np.random.default_rng(0)
    runs = [(b, float(_bimodal(rng, b).max())) for b in (1, 2, 4) for _ in range(600)]
    learned = slo.learn(runs)
    assert learned.chance(np.array([0.3]), 1)[0] == pytest.approx(0.7, abs=0.04)
    assert learned.quantile(0.5) == 0.25 and learned.quantile(0.5, rows=4) == 1.0
    assert learned.chance(np.array([0.2]), 1)[0] == 0.0 and learned.chance(np.array([1.0]), 8)[0] == 1.0
    # Mostly batches of 16, which almost never run all-short: the batches of 4 still tell.
    runs = [(b, float(_bimodal(rng, b).max())) for b, count in ((16, 1000), (4, 200)) for _ in range(count)]
    assert slo.learn(runs).chance(np.array([0.3]), 1)[0] == pytest.approx(0.7, abs=0.06)


def _policy(**settings: str):
    policy = make_policy("slo", settings)
    manifest = timed_manifest([TABLE] * 2, dims=(8,))
    policy.bind(manifest)
    return policy, manifest


def _queries(manifest, now: float, deadlines_ms: list[float | None]) -> list[Query]:
    queries = [Query({"x": np.zeros((1, 8), np.float32)}, None, arrived=now,
                     deadline=now + ms / 1000 if ms is not None else None) for ms in deadlines_ms]
    refuse_invalid(manifest, queries)
    return queries


def test_the_earliest_deadline_goes_in_the_largest_batch_in_time_for_it():
    """Eight queries due in 100 ms fit one batch of 8 (76 ms). With one due in 30 ms, the largest
    batch in time for it is 2 (28 ms; 3 take 36): it goes with the other query of highest
    priority, the one whose deadline (60 ms) a later batch would miss, not those due in 500."""
    policy, manifest = _policy()
    now = time.monotonic()
    relaxed = _queries(manifest, now, [100.0] * 8)
    assert [len(batch) for batch, _ in policy.form(relaxed, 8, now)] == [8]
    mixed = _queries(manifest, now, [500.0, 500.0, 60.0, 500.0, 30.0, 500.0])
    (batch, _), = policy.form(mixed, 8, now)
    assert batch == [mixed[4], mixed[2]]


def test_under_a_load_that_needs_larger_batches_the_batch_keeps_up():
    """A batch of k holds a stage 10 + 4 (k - 1) ms: at 200 queries a second the pipeline keeps
    up only with batches of 6 or more (60 ms for 6 rows through both stages). The query due in
    30 ms is in time only in a batch of 2: at no load it gets one (as Orloj's rule has it); at
    200 a second the seven due in 100 ms go first, in one batch (7 rows: 68 ms), and the tight
    one waits, or it would shrink every batch and the backlog would grow."""
    policy, manifest = _policy()
    now = time.monotonic()
    mixed = _queries(manifest, now, [100.0, 100.0, 30.0, 100.0, 100.0, 100.0, 100.0, 100.0])
    (batch, _), = policy.form(mixed, 8, now)
    assert len(batch) == 2 and batch[0] is mixed[2]
    (batch, _), = policy.form(mixed, 8, now, Outlook(steady_per_s=200.0))
    assert len(batch) == 7 and mixed[2] not in batch


def test_everyone_goes_together_where_a_second_batch_would_be_late():
    """Stages of 50 ms and 1 ms more a row (a large fixed cost). The query due in 101 ms makes
    it only alone (100 ms; 2 rows take 102); seven more due in 150 would then run after it and
    finish at 162, all late: one batch of all eight (114 ms) finishes seven in time instead of
    one. Due in 250 they make it after it, and the urgent query's batch stays its own."""
    policy = make_policy("slo", {})
    manifest = timed_manifest([{"batch_sizes": list(range(1, 9)), "mean": [50.0 + k for k in range(8)]}] * 2,
                              dims=(8,))
    policy.bind(manifest)
    now = time.monotonic()
    for later, together in ((150.0, 8), (250.0, 1)):
        waiting = _queries(manifest, now, [later] * 3 + [101.0] + [later] * 4)
        (batch, _), = policy.form(waiting, 8, now)
        assert len(batch) == together and waiting[3] in batch


def test_a_busy_pipeline_shrinks_what_is_in_time():
    """A batch of 8 ahead at stage 0 (it began now) holds stage 0 for 38 ms and stage 1 until
    76: of eight queries due in 100 ms, a batch of 4 still makes it (stage 1 from 76 ms, done
    at 98), 5 would not (102); on an empty pipeline all 8 did."""
    from backend.batch_table import Flight
    from backend.policy import Outlook

    policy, manifest = _policy()
    now = time.monotonic()
    waiting = _queries(manifest, now, [100.0] * 8)
    ahead = Outlook((Flight(8, {}, 0, now),))
    (batch, _), = policy.form(waiting, 8, now, ahead)
    assert len(batch) == 4


def test_what_cannot_meet_its_deadline_alone_is_hopeless_and_edf_refuses_only_the_expired():
    """A lone query takes 20 ms by the tables: due in 15 ms it is hopeless, in 25 it is not;
    once the model saw queries take a quarter of that, 15 ms is enough.
    ``deadline_ms`` is the deadline of a request that sets none. EDF refuses only expired ones."""
    policy, manifest = _policy(deadline_ms="15")
    now = time.monotonic()
    tight, fine, default = _queries(manifest, now, [15.0, 25.0, None])
    assert policy.hopeless(tight, now) and not policy.hopeless(fine, now) and policy.hopeless(default, now)
    rng = np.random.default_rng(1)
    batch = policy.form([fine], 8, now)[0][0]
    for ratio in _bimodal(rng, 400):
        policy.observe(range(1), 1, BatchShape.of([fine]), fine, 0.010 * ratio)
    policy._seen.learn_now()
    assert not policy.hopeless(tight, now) and batch == [fine]
    edf, _ = _policy(rule="edf")
    assert not edf.hopeless(tight, now) and edf.hopeless(tight, now + 0.016)


def test_edf_serves_the_earliest_deadlines_first_and_queries_without_one_last():
    policy, manifest = _policy(rule="edf")
    now = time.monotonic()
    waiting = _queries(manifest, now, [None, 300.0, 100.0, 200.0])
    (batch, _), = policy.form(waiting, 3, now)
    assert batch == [waiting[2], waiting[3], waiting[1]]
    with pytest.raises(Exception, match="policy.rule"):
        make_policy("slo", {"rule": "fifo"})


@pytest.mark.wallclock  # answered within 5 ms of submitting: a loaded host once took 5.9
def test_the_pipeline_refuses_hopeless_queries_at_once_and_answers_the_rest():
    """Through the runtime: of three queries, the one due before a lone run could end is
    answered at once with Triton's timeout error; the others are computed."""
    policy, manifest = _policy()
    clock = Clock(manifest, RuntimeConfig(policy=policy))
    clock.submit(clock.query(0, deadline_ms=200), clock.query(1, deadline_ms=5), clock.query(2, deadline_ms=200))
    at = clock.wait(3)
    failures = {key: failure for key, (_, _, failure) in clock.answers.items()}
    assert failures[0] is None and failures[2] is None
    assert "timeout expired" in failures[1].message and at[1] < 5


def test_served_as_a_plain_model_hopeless_queries_are_refused_too():
    """Inside ``execute`` (a model served plain, or ``batching: triton``) the policy judges the
    queries Triton hands over as the entry would: the hopeless one gets Triton's timeout error,
    the others run together; with ``deadline_ms``, queries whose requests set no timeout too."""
    policy, manifest = _policy()
    device = make_device("CPU")
    whole = WholeBatch(manifest, load_engines(manifest, ".", device), device, Metrics(), policy=policy)
    now = time.monotonic()
    queries = _queries(manifest, now, [200.0, 5.0, None])
    whole.run(queries)
    assert [q.reply[1] is None for q in queries] == [True, False, True]
    assert "timeout expired" in queries[1].reply[1].message
    # ``deadline_ms`` gives requests that set no timeout one: a lone run takes 20 ms, so 5 is hopeless.
    strict, _ = _policy(deadline_ms="5")
    whole = WholeBatch(manifest, whole.engines, device, Metrics(), policy=strict)
    queries = _queries(manifest, time.monotonic(), [None, None])
    whole.run(queries)
    assert all("timeout expired" in q.reply[1].message for q in queries)


def test_inside_execute_the_queries_their_batch_would_make_late_are_refused():
    """Served plain, the queries Triton batched run as one and are answered when it ends. Seven
    due in 100 ms and one in 40: 8 rows take 76 ms, 7 take 68, so only the one due in 40 (in
    time alone: 20 ms) is refused. Due in 30 and 45 with three more: 5 rows take 52 ms, 4 take
    44: the one due in 30 goes, and then the rest are in time. Its timeout error comes at once;
    the others are computed. EDF refuses only expired queries."""
    policy, manifest = _policy()
    now = time.monotonic()
    queries = _queries(manifest, now, [100.0] * 7 + [40.0])
    assert policy.late_together(queries, now) == [queries[7]] and policy.late_together(queries[:7], now) == []
    tight = _queries(manifest, now, [45.0, 100.0, 30.0, 100.0, 100.0])
    assert policy.late_together(tight, now) == [tight[2]]
    assert _policy(rule="edf")[0].late_together(tight, now) == []
    device = make_device("CPU")
    whole = WholeBatch(manifest, load_engines(manifest, ".", device), device, Metrics(), policy=policy)
    queries = _queries(manifest, time.monotonic(), [100.0] * 7 + [40.0])
    whole.run(queries)
    assert [q.reply[1] is None for q in queries] == [True] * 7 + [False]
    assert "timeout expired" in queries[7].reply[1].message


def test_a_deadline_counts_the_wait_in_tritons_queue_while_the_instance_was_busy():
    """``execute`` is not told when a request reached Triton. Called on an idle instance, its
    requests came within the batcher's delay; called right after a call that took fewer rows
    than the largest batch (Triton's queue emptied then), they came since that call began,
    evenly spread in order; right after a full call, since that call's last one came."""
    queue = TritonQueue(max_rows=8, delay_s=0.002)

    def arrivals(rows: list[int], now: float) -> list[float]:
        since, step = queue.spread(len(rows), sum(rows), now)
        return [since + step * (i + 0.5) for i in range(len(rows))]
    assert arrivals([1], 10.0) == [pytest.approx(9.999)]
    assert queue.ended(10.0, 10.100) == 0.0  # a 100 ms call of one row: Triton's queue was empty at 10.0
    assert arrivals([1, 2, 1, 4], 10.1002) == pytest.approx([10.0125, 10.0376, 10.0626, 10.0877], abs=1e-4)
    # that call was full (8 rows), 0.2 ms after the first ended: the next came after its last, at 10.0877
    assert queue.ended(10.1002, 10.200) == pytest.approx(0.0002)
    assert arrivals([1], 10.2001) == [pytest.approx((10.0877 + 10.2001) / 2, abs=1e-4)]
    queue.ended(10.2001, 10.300)
    assert arrivals([1], 11.0) == [pytest.approx(10.999)]  # idle since 10.3: the batcher's delay only
    # A call whose requests had no deadline (``called``: nothing reads its figures) leaves the
    # next call what ``spread`` would have: after a call of fewer rows, since it began ...
    queue.ended(11.0, 11.1)
    queue.called(2, 3, 11.1001)
    queue.ended(11.1001, 11.2)
    assert arrivals([1, 1], 11.2001) == pytest.approx([11.1251, 11.1751])
    # ... and after a full one, since its last request came, as ``spread`` takes it (the call
    # came since 11.2001, 50 ms a request: its last at 11.2751)
    queue.ended(11.2001, 11.3)
    queue.called(2, 8, 11.3001)
    queue.ended(11.3001, 11.4)
    assert arrivals([1], 11.4001) == [pytest.approx((11.2751 + 11.4001) / 2)]


def _early_exit(tables: list[dict]) -> Manifest:
    """Timed stages passing ``x`` and ``work`` (the share of its table's time a batch takes)."""
    specs = (TensorSpec("x", "float32", (8,)), TensorSpec("work", "float32", (1,)))
    stages = tuple(StageSpec(i, "", "timed", specs, specs, latency=LatencyTable.from_json(table))
                   for i, table in enumerate(tables))
    return Manifest("timed.onnx", "", 8, specs, specs, stages)


def test_served_plain_the_policy_learns_how_long_queries_take_from_the_batches_it_runs():
    """Inside ``execute`` every batch run as one is a sample, as a pipeline stage's run is.
    Queries that need a quarter of the tables' 20 ms: before any ran, one due in 15 ms is
    hopeless; after thirty lone runs, it is not, and it is answered in time."""
    policy = make_policy("slo", {})
    manifest = _early_exit([TABLE] * 2)
    policy.bind(manifest)
    device = make_device("CPU")
    whole = WholeBatch(manifest, load_engines(manifest, ".", device), device, Metrics(), policy=policy)

    def query(deadline_ms: float) -> Query:
        now = time.monotonic()
        return Query({"x": np.zeros((1, 8), np.float32), "work": np.full((1, 1), 0.25, np.float32)}, None,
                     arrived=now, deadline=now + deadline_ms / 1000)

    assert policy.hopeless(query(15.0), time.monotonic())
    for _ in range(30):
        whole.run([query(1000.0)])
    policy._seen.learn_now()
    tight = query(15.0)
    whole.run([tight])
    assert tight.reply[1] is None and time.monotonic() < tight.deadline


def test_policy_slo_with_auto_serves_plain_where_auto_does_and_judges_each_batch(repository):
    """``policy.auto: true`` lets ``auto`` decide how ``policy: slo`` serves: ONNX Runtime stages
    whose time grows with the rows run as one fused session inside ``execute``, as ``auto``
    serves them, with the slo rule judging each batch Triton hands over: of four, the one due
    before four rows' tabulated time (but not one row's) is refused at once, the rest answered;
    the run is learned from."""
    version_dir = repository / "bert_like" / VERSION
    source = Manifest.load(version_dir)
    sizes = source.stages[0].latency.batch_sizes
    manifest = with_tables(source, [{"batch_sizes": list(sizes), "mean": [10.0 * b for b in sizes]}]
                           * len(source.stages))
    policy = make_policy("slo", {"auto": "true"})
    decision, server = serve(manifest, version_dir, RuntimeConfig(policy=policy), make_device("CPU"), Metrics())
    assert decision.mode is Mode.FUSED and isinstance(server, WholeBatch) and server.policy is policy
    lone_ms = 10.0 * len(source.stages)  # the fused table: one row through every stage
    now = time.monotonic()
    feeds = [sample_inputs(manifest.inputs, 1, {"sequence": 4}, seed=i) for i in range(4)]
    queries = [Query(feed, None, arrived=now, deadline=now + ms / 1000)
               for feed, ms in zip(feeds, [10_000.0, 2.5 * lone_ms, 10_000.0, 10_000.0])]
    server.run(queries)
    assert [q.reply[1] is None for q in queries] == [True, False, True, True]
    assert "timeout expired" in queries[1].reply[1].message
    policy._seen.learn_now()
    assert policy._seen.ratios(None) is not slo.CERTAIN
    server.close()


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


@pytest.mark.parametrize("name, parameters", [("slo_timed", {"policy": "slo"}),
                                              ("slo_plain", {"policy": "slo", "batching": "triton"})])
def test_policy_slo_through_tritonserver_learns_and_refuses_by_the_request_timeout(client, repository, name,
                                                                                 parameters):
    """A timed early-exit model (its ``work`` input scales the time: 100 ms alone at full work)
    served with ``policy: slo``, pipelined and plain (each batch inside ``execute``): requests
    with generous timeouts get their own rows, and teach the policy that most need a quarter of
    the time; then one with a 60 ms timeout is computed in time, one whose timeout no run can
    meet gets Triton's timeout error at once, and the model goes on serving."""
    table = LatencyTable.from_json({"batch_sizes": [1, 8], "mean": [50.0, 80.0]})
    inputs = (TensorSpec("x", "float32", (4,)), TensorSpec("work", "float32", (1,)))
    write_timed(name, inputs, [table] * 2, 8, "timed.onnx", "", repository / name, parameters)
    with serving(client, repository, name):
        def ask(key: int, work: float, timeout_us: int) -> np.ndarray:
            feed = {"x": np.full((1, 4), key, np.float32), "work": np.full((1, 1), work, np.float32)}
            return infer(client, name, feed, timeout_us=timeout_us)["x_out"]

        for key in range(20):
            assert ask(key, 0.25 if key % 3 else 1.0, 5_000_000)[0, 0] == key
        time.sleep(2 * slo.REFRESH_S)  # learned
        assert ask(50, 0.25, 60_000)[0, 0] == 50
        began = time.monotonic()
        with pytest.raises(InferenceServerException, match="timeout expired"):
            ask(99, 1.0, 1_000)
        assert time.monotonic() - began < 0.5
        assert ask(100, 1.0, 5_000_000)[0, 0] == 100

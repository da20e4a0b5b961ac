"""SMDP dynamic batching (issue 40): the solver against the paper's own numbers, its policies
against the paper's benchmarks, ``policy: smdp`` deciding at the entry, and served by a real
tritonserver."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend import smdp
from backend.config import make_policy
from backend.manifest import Manifest
from backend.policy import Outlook
from backend.query import Query, refuse_invalid
from tools.lib.client import infer
from tools.lib.paths import ROOT
from tools.lib.timed import from_profile, write_timed

from .conftest import serving
from .timed import timed_manifest, with_tables

# The paper's setting (its section V): GoogLeNet on a Tesla P4, in ms and mJ, Bmax 32.
B = 32
TAU = tuple(0.3051 * b + 1.052 for b in range(1, B + 1))
ZETA = tuple(19.90 * b + 19.60 for b in range(1, B + 1))
CAPACITY = B / TAU[-1]  # 2.96 requests/ms


def paper(load: float, power_weight: float) -> smdp.Problem:
    return smdp.Problem(TAU, ZETA, load * CAPACITY, 1.0, power_weight)


def test_the_solver_reproduces_the_papers_average_cost():
    """Its Table I: rho 0.9, weights (1, 1), average cost 66.1374 to 66.1384 per ms whatever the
    truncation. Ours: within 0.01 % of it, on 64 states (it needed 70 with c_o = 100)."""
    solution = smdp.solve(paper(0.9, 1.0))
    assert solution.average_cost == pytest.approx(66.1377, rel=1e-4)
    assert solution.s_max <= 128 and solution.overflow_cost <= smdp.TOLERANCE * solution.average_cost


@pytest.mark.parametrize("load", [0.1, 0.5, 0.9])
def test_solved_policies_have_a_control_limit_growing_with_the_power_weight(load):
    """Its Fig. 4: every solution waits below a number of requests and serves at and above it;
    the limit grows with the weight of power, is near 1 where only latency counts and Bmax
    where power dominates (weight 500)."""
    limits = []
    for weight in (0.0, 0.1, 1.0, 20.0, 500.0):
        solution = smdp.solve(paper(load, weight))
        assert solution.has_control_limit, solution.actions
        limits.append(solution.control_limit)
    assert limits == sorted(limits) and limits[0] <= 2 and limits[-1] == B


@pytest.mark.parametrize("load", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("weight", [0.0, 1.0, 20.0])
def test_the_solved_policy_beats_every_benchmark_of_the_paper(load, weight):
    """Its Fig. 5, by its eq. 14: the solved policy's average cost is at most the work-conserving
    policy's and every static batch size's (8, 16, 32: static 8 cannot keep up at 0.9 and costs
    without end)."""
    problem = paper(load, weight)
    solved = smdp.solve(problem).average_cost
    benchmarks = [smdp.evaluate(problem, smdp.work_conserving(B)),
                  *(smdp.evaluate(problem, smdp.static(b)) for b in (8, 16, 32))]
    assert all(solved <= cost * (1 + 1e-6) for cost in benchmarks), (solved, benchmarks)
    assert smdp.evaluate(problem, smdp.static(8)) == np.inf or load < 0.8


@pytest.mark.parametrize("profile", ["slow_2stages", "bert_base_trt_a100_2stages"])
def test_policies_solved_over_timed_profiles_have_a_control_limit(profile):
    """The pipeline's tables as ``policy: smdp`` reads them (its slowest stage per batch size, at
    the middle tabulated length): at loads 0.1, 0.5 and 0.9 of its capacity, with and without a
    weight on power, a control limit. The state bound (s_max) stays at or under 256 and each
    solution takes well under a second (on this 2-core CPU: 10-400 ms)."""
    _, manifest, _ = from_profile(ROOT / "docs" / "profiles" / f"{profile}.json")
    policy = make_policy("smdp", {})
    policy.bind(manifest)
    problem = policy.problem(manifest.stages[0].latency.lengths[1], 1.0)
    for load in (0.1, 0.5, 0.9):
        for weight in (0.0, 1.0):
            solution = smdp.solve(replace(problem, arrivals_per_s=load * problem.capacity, power_weight=weight))
            assert solution.has_control_limit and solution.s_max <= 256, solution.describe()


def _queries(count: int, at: float) -> list[Query]:
    return [Query({"x": np.zeros((1, 8), np.float32)}, None, arrived=at) for _ in range(count)]


def _solved(policy, queries, rate: float, plain: bool = False):
    deadline = time.monotonic() + 30
    while (solution := policy.solution(queries, rate, plain)) is None or solution.problem.arrivals_per_s < rate / 1.2:
        assert time.monotonic() < deadline, "the SMDP was not solved"
        time.sleep(0.01)
    return solution


def _waiting(settings: dict[str, str], *counts: int):
    """``policy: smdp`` with ``settings`` bound to two stages of 10 ms at any batch size (max
    batch 8), the model, now, and validated queries waiting in groups of ``counts``."""
    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [10.0, 10.0]}] * 2, dims=(8,))
    policy = make_policy("smdp", settings)
    policy.bind(manifest)
    now = time.monotonic()
    groups = [_queries(count, now) for count in counts]
    for queries in groups:
        refuse_invalid(manifest, queries)
    return policy, manifest, now, groups


def test_the_entry_waits_below_the_control_limit_and_serves_what_the_policy_says():
    """Two stages of 10 ms at any batch size, power weighed heavily (every batch costs the
    engines 20 ms, whatever its size): at 400 queries/s the solved policy waits for a full
    batch of 8. With fewer waiting the window stays open, bounded by twice the time the limit's
    arrivals take (2 * 8 / 400 s after the oldest); with 8 it closes and forms them; with no
    arrival rate known yet it serves what waits (work-conserving). Its batches stay open to
    late queries (Policy III's stretch)."""
    policy, _, now, (few, full) = _waiting({"power_weight": "100"}, 3, 8)
    outlook = Outlook((), 400.0, 400.0)
    solution = _solved(policy, few, 400.0)
    assert solution.control_limit == 8 and solution.has_control_limit
    assert policy.window_end(few, 3, outlook, now) == pytest.approx(now + 2 * 8 / 400.0, abs=1e-9)
    assert policy.window_end(full, 8, outlook, now) == now
    assert [len(batch) for batch, _ in policy.form(full, 8, now, outlook)] == [8]
    assert policy.window_end(few, 3, Outlook(), now) == now
    assert policy.stretchable(full, now)  # late queries may still stretch into its batches (Policy III)


def test_served_plain_the_smdp_holds_queries_below_its_control_limit(tmp_path):
    """``policy: smdp`` with ``policy.auto: true`` and power weighed heavily, served plain (as
    its mode switch serves it where the pipeline cannot pay): at 200 queries/s the policy solved
    for the instance as the server (both 10 ms stages in turn) waits for a full batch of 8.
    ``execute`` then hands its requests over: 3 are held, unanswered, and run with the next 5
    once 8 wait, each answered once with its own rows. A query held alone runs once the wait
    bound ends (2 x 8 / 200 s after it came), although no more come. Where queries arrive
    faster than the host has room for every held answer's ``send()`` (``Hold.most_per_s``, which
    the mode switch sets), none is held. Held when the model pipelines again, they enter the
    pipeline before the next queries."""
    from backend.config import RuntimeConfig
    from backend.decide import Mode
    from backend.device import make_device
    from backend.metrics import Metrics
    from backend.serving import serve

    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [10.0, 10.0]}] * 2, dims=(8,))
    policy = make_policy("smdp", {"power_weight": "100", "auto": "true"})
    _, runtime = serve(manifest, tmp_path, RuntimeConfig(policy=policy), make_device("CPU"), Metrics())
    runtime.watch.stop()
    runtime.mode = Mode.FUSED
    answers: dict[int, list] = {}

    def queries(first: int, count: int) -> list[Query]:
        def respond(key):
            return lambda outputs, failure: answers.setdefault(key, []).append((outputs, failure))
        return [Query({"x": np.full((1, 8), key, np.float32)}, respond(key)) for key in range(first, first + count)]

    def own_rows(keys) -> bool:
        return all(len(answers.get(k, ())) == 1 and answers[k][0][1] is None
                   and np.array_equal(answers[k][0][0]["x"], np.full((1, 8), k, np.float32)) for k in keys)
    try:
        now = time.monotonic()
        runtime.entry.arrived(now - 1 + i / 200 for i in range(200))  # 200/s so far
        assert _solved(policy, _queries(1, now), 200.0, plain=True).control_limit == 8
        assert not runtime.runs_inline()  # every batch is handed over (Handover: senders)
        runtime.submit(queries(0, 3))
        assert not answers and len(runtime.held) == 3
        runtime.submit(queries(3, 5))
        assert own_rows(range(8)) and not len(runtime.held)
        runtime.submit(queries(8, 1))
        assert not answers.get(8)
        time.sleep(2 * 8 / 200 + 0.3)
        assert own_rows([8])
        runtime.held.most_per_s = 50.0
        runtime.submit(queries(20, 1))
        assert own_rows([20])
        runtime.held.most_per_s = float("inf")
        runtime.submit(queries(9, 2))
        assert len(runtime.held) == 2
        runtime.mode = Mode.PIPELINE
        runtime.submit(queries(11, 1))
        deadline = time.monotonic() + 5
        while not own_rows(range(9, 12)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert own_rows(range(12))
    finally:
        runtime.close()


def test_a_model_served_by_its_whole_batch_alone_holds_for_a_static_size():
    """Where ``auto`` steps aside on the host's cores, a ``WholeBatch`` alone serves: with
    ``policy.static: 4`` it holds too (``HeldBatch``). Eight queries arriving at 100/s run at
    once (4 or more wait); 3 more are held until a fourth comes; one alone runs once the wait
    bound ends (2 x 4 / 100 s after it came), and so do the next two; with 3 of its latest 5
    waits run out starved (no query came meanwhile), the one after runs at once. Each is
    answered once, with its own rows."""
    from backend.device import make_device
    from backend.engines import load_engines
    from backend.hold import HeldBatch
    from backend.metrics import Metrics
    from backend.whole import WholeBatch

    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [1.0, 1.0]}] * 2, dims=(8,))
    policy = make_policy("smdp", {"static": "4", "auto": "true"})
    policy.bind(manifest)
    device = make_device("CPU")
    server = HeldBatch(WholeBatch(manifest, load_engines(manifest, ".", device), device, Metrics(), policy=policy),
                       policy)
    answers: dict[int, list] = {}

    def queries(first: int, count: int) -> list[Query]:
        def respond(key):
            return lambda outputs, failure: answers.setdefault(key, []).append((outputs, failure))
        now = time.monotonic()
        return [Query({"x": np.full((1, 8), key, np.float32)}, respond(key), now - (first + count - key) / 100)
                for key in range(first, first + count)]

    def own_rows(keys) -> bool:
        return all(len(answers.get(k, ())) == 1 and answers[k][0][1] is None
                   and np.array_equal(answers[k][0][0]["x"], np.full((1, 8), k, np.float32)) for k in keys)
    try:
        assert not server.runs_inline()
        server.submit(queries(0, 8))
        assert own_rows(range(8))
        server.submit(queries(8, 3))
        assert not any(k in answers for k in range(8, 11)) and len(server.hold) == 3
        server.submit(queries(11, 1))
        assert own_rows(range(12))
        server.submit(queries(12, 1))
        assert 12 not in answers
        time.sleep(2 * 4 / 100 + 0.3)
        assert own_rows(range(13))
        for key in (13, 14):  # alone again: the waits run out (the later, the lower the rate, the longer)
            server.submit(queries(key, 1))
            assert key not in answers
            deadline = time.monotonic() + 5
            while key not in answers and time.monotonic() < deadline:
                time.sleep(0.01)
            assert own_rows(range(key + 1))
        server.submit(queries(15, 1))  # 3 of the latest 5 ran out starved: the load does not come while queries wait
        assert own_rows(range(16))
    finally:
        server.close()


def test_held_queries_run_in_order_in_batches_of_at_most_the_largest():
    """A hold lets go of up to twice the largest batch (it held fewer than its limit, and
    Triton hands over a batch more): they run oldest first, each batch as full as the next query
    allows, a query larger than the largest alone."""
    from backend.hold import batches

    held = [Query({"x": np.zeros((rows, 8), np.float32)}, None) for rows in (3, 4, 2, 9, 1)]
    assert [[q.rows for q in batch] for batch in batches(held, 8)] == [[3, 4], [2], [9], [1]]


def test_energy_per_batch_is_the_counters_rise_over_each_sizes_runs():
    """``calibrate.energy`` on a timed model whose device spends 100 W through each batch's time
    in the table (both stages): each size's joules per batch are the counter's rise over its
    measured runs, the warm-up run left out; the policy then weighs them, between the sizes
    measured, in place of the engines' busy seconds. (The counter follows the runs, not the
    clock: a loaded host's stalls would land in a clock's reading, CI's 1-2 ms a run.)"""
    from backend import calibrate
    from backend.device import make_device
    from backend.engines import load_engines
    from backend.metrics import Metrics
    from backend.whole import WholeBatch

    table = {"batch_sizes": [1, 2, 4, 8], "mean": [4.0, 5.0, 7.0, 11.0]}
    manifest = timed_manifest([table] * 2, dims=(8,))
    device = make_device("CPU")
    plain = WholeBatch(manifest, load_engines(manifest, ".", device), device, Metrics())
    busy = {rows: 100.0 * 2 * ms / 1000 for rows, ms in zip(table["batch_sizes"], table["mean"])}
    spent = [0.0]

    def run(queries):
        plain.run(queries)
        spent[0] += busy[len(queries)]

    joules = calibrate.energy(manifest, run, lambda: spent[0], run_s=0.05)
    assert joules == pytest.approx(busy), joules
    policy = make_policy("smdp", {"power_weight": "1"})
    policy.bind(manifest)
    assert policy.problem(None, 100.0).energy[7] == pytest.approx(0.022, rel=0.01)  # 8 rows: busy 2 x 11 ms
    policy.energy_measured({1: 1.0, 8: 8.0})
    assert policy.problem(None, 100.0).energy[:8] == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8])


def test_a_cpu_instance_weighs_the_engines_time_and_says_why(tmp_path):
    """Loading with a power weight on a CPU instance: no energy counter, the proxy stays, and
    the model's log says so."""
    from backend.config import RuntimeConfig
    from backend.device import make_device
    from backend.metrics import Metrics
    from backend.serving import serve

    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [1.0, 2.0]}] * 2, dims=(8,))
    said: list[str] = []
    config = RuntimeConfig(policy=make_policy("smdp", {"power_weight": "1"}))
    _, server = serve(manifest, tmp_path, config, make_device("CPU"), Metrics(), said=said.append)
    server.close()
    assert any("busy seconds, a proxy (a CPU instance has no energy counter)" in line for line in said), said


def test_the_calibrations_queries_are_no_load_to_solve_for(tmp_path):
    """Loading measures the host's serving cost with bursts of queries (``calibrate.py``); read
    as arrivals, they had the SMDP solved on the stub's cores meanwhile, which measured five
    times the cost. They count in no arrival rate: nothing is solved until queries come."""
    from backend.config import RuntimeConfig
    from backend.device import make_device
    from backend.metrics import Metrics
    from backend.serving import serve

    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [1.0, 2.0]}] * 2, dims=(8,))
    said: list[str] = []
    decision, server = serve(manifest, tmp_path, RuntimeConfig(policy=make_policy("smdp", {})), make_device("CPU"),
                             Metrics(), said=said.append)
    time.sleep(0.3)  # (a solution asked for would be solved by now)
    server.close()
    assert decision.costs.measured
    assert not [line for line in said if line.startswith("smdp at length")], said


def test_the_live_objective_counts_every_batch_at_its_tables_time():
    """``tools.bench_dispatch``'s power term: the engines' busy ms per query of the batches a
    window ran. Three batches of 2 through two stages of 4 ms (2 rows) and one of 1 row (3 ms)
    through both: (3 x 2 x 4 + 2 x 3) / 7 queries."""
    from tools.lib.timed import engine_ms_per_query

    tables = timed_manifest([{"batch_sizes": [1, 2], "mean": [3.0, 4.0]}] * 2, dims=(8,)).stages
    batches = {(0, 2): 3, (1, 2): 3, (0, 1): 1, (1, 1): 1}
    assert engine_ms_per_query(batches, [s.latency for s in tables], 8) == pytest.approx((3 * 2 * 4 + 2 * 3) / 7)


def test_the_steady_rate_the_smdp_is_solved_for_forgets_a_pause():
    """The steady rate is over the latest 512 arrivals, none more than 2 s before the latest:
    40 queries at 100/s after a pause of 10 s read 100/s, not the 7/s that 140 arrivals over 20 s
    average to (a benchmark's pause between two windows had the SMDP solved for 7.5-9.3/s)."""
    from backend.config import RuntimeConfig
    from backend.device import make_device
    from backend.engines import load_engines
    from backend.runtime import Runtime

    manifest = timed_manifest([{"batch_sizes": [1, 8], "mean": [1.0, 2.0]}] * 2, dims=(8,))
    device = make_device("CPU")
    runtime = Runtime(manifest, load_engines(manifest, ".", device), RuntimeConfig(policy=make_policy("smdp", {})),
                      device)
    now = time.monotonic()
    before = [now - 20 + i * 0.1 for i in range(100)]  # 10/s, until 10 s ago
    after = [now - 0.4 + i * 0.01 for i in range(40)]
    runtime.entry.arrived(before + after)
    steady = runtime.entry.steady_rate()
    runtime.close()
    assert steady == pytest.approx(100, rel=0.05)


def test_where_its_waits_run_out_starved_it_serves_what_waits_for_a_while():
    """A closed loop of fewer clients than the control limit (perf_analyzer's concurrency mode)
    sends no query while its others wait: its waits run out at their bound, none arriving in
    their second half (starved), and the batches stay as small. At 400 queries/s the policy
    waits for 8 (bound 2 x 8 / 400 s). A wait that ran out counts once, however often it is
    asked, and only starved: one a query came late in is a load. Where 3 of the latest 8 waits ran
    out starved (in a row, or between waits the limit ended) it serves what waits for
    ``EAGER_S``, says so once, and then waits again; one wait starved before its waits went
    well, it serves what waits twice as long."""
    from backend.dispatch import EAGER_S

    policy, _, now, (full,) = _waiting({"power_weight": "100"}, 8)
    said: list[str] = []
    policy.said = said.append
    outlook = Outlook((), 400.0, 400.0)
    _solved(policy, full, 400.0)
    bound = 2 * 8 / 400

    def ran_out(at: float, late: bool = False) -> None:
        """A query waits from ``at`` until its bound (with another arriving at 3/4 of it where
        ``late``), and is asked again there."""
        waiting = _queries(1, at) + (_queries(1, at + 0.75 * bound) if late else [])
        assert policy.window_end(waiting[:1], 1, outlook, at) == pytest.approx(at + bound)
        for _ in range(2):
            assert policy.window_end(waiting, len(waiting), outlook, at + bound) <= at + bound

    def starved() -> list[str]:
        return [line for line in said if "waits ran out" in line]

    for k in range(3):
        ran_out(now + k, late=True)
    ran_out(now + 3)
    assert policy.window_end(full, 8, outlook, now + 4) == now + 4  # the limit ended this one
    ran_out(now + 5)
    assert not starved()
    ran_out(now + 6)  # (``ran_out`` asserts that it still waited)
    assert len(starved()) == 1 and "3 of its latest 8 waits ran out with no query arriving" in starved()[0]
    at = now + 7
    assert policy.window_end(_queries(1, at), 1, outlook, at) == at  # serves what waits
    at += EAGER_S
    assert policy.window_end(_queries(1, at), 1, outlook, at) == pytest.approx(at + bound)  # and then waits again
    ran_out(at + 1)
    at += 1 + bound  # starved again before its waits went well (one look tells): twice as long
    for later in (at + 0.1, at + 2 * EAGER_S - 0.1):
        assert policy.window_end(_queries(1, later), 1, outlook, later) == later
    at += 2 * EAGER_S
    assert policy.window_end(_queries(1, at), 1, outlook, at) == pytest.approx(at + bound)
    assert len(starved()) == 1  # said once until the waits go well again


def test_a_static_batch_size_waits_for_exactly_that_many_and_serves_them():
    """``policy.static: 4`` (the paper's static benchmark, served as the policy is): with 3
    waiting the window stays open (bounded as the solved policy's), with 6 it closes and serves
    the oldest 4, which no late query stretches; nothing is solved for it. A size past
    max_batch_size is refused."""
    policy, manifest, now, (few, many) = _waiting({"static": "4"}, 3, 6)
    outlook = Outlook((), 400.0, 400.0)
    assert policy.window_end(few, 3, outlook, now) == pytest.approx(now + 2 * 4 / 400.0)
    assert policy.window_end(many, 6, outlook, now) == now
    assert [batch for batch, _ in policy.form(many, 8, now, outlook)] == [many[:4]]
    assert policy._solver is None  # nothing solved
    assert not policy.stretchable(many[:4], now)  # a static batch is that many
    with pytest.raises(Exception, match="'policy.static' must lie in 0..8"):
        make_policy("smdp", {"static": "9"}).bind(manifest)


def test_an_unknown_setting_or_a_negative_weight_is_refused():
    with pytest.raises(Exception, match="power_weight"):
        make_policy("smdp", {"power_weight": "-1"})
    with pytest.raises(Exception, match="not a setting of policy 'smdp'"):
        make_policy("smdp", {"control_limit": "4"})


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


@pytest.mark.parametrize("setting", [("power_weight", "10"), ("static", "4")])
def test_policy_smdp_serves_every_request_its_own_rows_through_tritonserver(client, repository, setting):
    """A timed model of two 5 ms stages served with ``policy: smdp``, power weighed (so it
    waits for fuller batches while the load lasts) or with a static batch of 4: 200 requests
    from 16 clients at once, each answered with its own rows; then one alone, answered although
    the arrivals the control limit (the static size) waits for never come."""
    from backend.manifest import LatencyTable, TensorSpec

    name = f"smdp_{setting[0]}"
    table = LatencyTable.from_json({"batch_sizes": [1, 8], "mean": [5.0, 6.0]})
    write_timed(name, (TensorSpec("x", "float32", (4,)),), [table] * 2, 8, "timed.onnx", "",
                repository / name, {"policy": "smdp", f"policy.{setting[0]}": setting[1]})
    with serving(client, repository, name):
        def ask(key: int) -> bool:
            x = np.full((1, 4), key, np.float32)
            return np.array_equal(infer(client, name, {"x": x})["x_out"], x)

        with ThreadPoolExecutor(16) as pool:
            assert all(pool.map(ask, range(200)))
        time.sleep(0.5)
        assert ask(1000)


def test_served_plain_on_the_cpus_cores_requests_are_held_for_a_static_size_through_tritonserver(
        client, repository, sources, server):
    """``policy: smdp`` with ``policy.auto: true`` and ``policy.static: 4`` on a CPU model
    (``auto`` steps aside on the host's cores: a ``WholeBatch`` alone serves, through a
    ``HeldBatch``): the model's log says it holds; 48 requests from 8 clients at once are each
    answered as the unsliced model answers them, and a request alone is answered once the wait
    bound ends."""
    import shutil

    from backend.engines import OnnxRuntimeEngine

    name = "resnet_like_held"
    shutil.copytree(repository / "resnet_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "resnet_like"', f'name: "{name}"')
    config += "".join(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n' for key, value in
                      {"policy": "smdp", "policy.static": "4", "policy.auto": "true"}.items())
    (repository / name / "config.pbtxt").write_text(config)
    # Tables whose time grows with the rows, so that no split pays and ``auto`` steps aside on any
    # host (the slicing's own tables are this host's, and a noisy profile once had one pay).
    version_dir = repository / name / "1"
    manifest = Manifest.load(version_dir)
    sizes = manifest.stages[0].latency.batch_sizes
    with_tables(manifest, [{"batch_sizes": list(sizes), "mean": [0.1 * b for b in sizes]}] * len(manifest.stages)
                ).save(version_dir)
    reference = OnnxRuntimeEngine(sources["resnet_like"], ["logits"])
    feeds = [{"image": np.random.default_rng(i).random((1, 3, 32, 32), np.float32)} for i in range(48)]
    with serving(client, repository, name):
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda feed: infer(client, name, feed, []), feeds))
        time.sleep(0.5)
        answers.append(infer(client, name, feeds[0], []))
    for feed, answer in zip([*feeds, feeds[0]], answers):
        np.testing.assert_allclose(answer["logits"], reference.run(feed)["logits"], atol=1e-5)
    said = server.log.read_text()
    assert f"{name}: smdp: served plain, the queries are held back" in said, said[-3000:]

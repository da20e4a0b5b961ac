"""The paper's policies (I, II, III, auto) deciding from the latency tables, with timed stages:
which meta operation happens, with which sizes, and when each query leaves, computed by hand."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from backend.batch_table import BatchTable, Flight
from backend.manifest import LatencyTable
from backend.decide import (EntryWait, HostCosts, LoneRuns, Mode, ModeSwitch, ServedLine, Trial, Window, beyond_first,
                            capacities, fuses, interpreted, measured_s, round_trip_s)
from backend.decide.switch import RETRY_WINDOWS
from backend.config import RuntimeConfig, make_policy
from backend.policy import Outlook
from backend.errors import ConfigError
from backend.query import Query, refuse_invalid
from backend.scheduler import Scheduler

from .test_schedule import T, assert_times, check_rows
from .timed import BATCH_SIZES, Clock, flat, timed_manifest

PER_ROW = {"batch_sizes": BATCH_SIZES, "mean": [T / 4 * b for b in BATCH_SIZES]}  # time grows with the rows


def policy(name: str, **settings) -> RuntimeConfig:
    return RuntimeConfig(policy=make_policy(name, {k: str(v) for k, v in settings.items()}))


def split_runs(clock: Clock, stage: int) -> list[int]:
    return [num for s, _, _, num, _, _ in sorted(clock.runs, key=lambda r: r[4]) if s == stage]


@pytest.mark.wallclock
def test_policy2_splits_in_halves_and_runs_the_parts_serially():
    """Figure 3, Case II: A takes T for up to 4 rows, B, C and D T/4 per row. After A,
    T_remain(4) = 3T >= 2 x T_remain(2), and again for 2: four parts of 1 that run one after
    another whatever the buffer pairs: they leave at 1.75T, 2.5T, 3.25T, 4T (mean 2.875T)."""
    clock = Clock(timed_manifest([flat(T), PER_ROW, PER_ROW, PER_ROW]), policy("operator"))
    clock.submit(*[clock.query(k) for k in range(4)])
    got = clock.wait(4)
    assert_times(got, {0: 1.75 * T, 1: 2.5 * T, 2: 3.25 * T, 3: 4 * T}, steps=13)
    assert split_runs(clock, 0) == [4] and split_runs(clock, 1) == [1, 1, 1, 1]
    assert clock.runtime.metrics.snapshot()[("dvabatch_meta_operations_total", (("kind", "split"),))] == 1
    check_rows(clock)


@pytest.mark.wallclock
def test_policy2_keeps_a_batch_whole_where_the_tables_say_batching_pays():
    """B, C and D take T at any batch size: splitting would only repeat them. One batch, 4T."""
    clock = Clock(timed_manifest([flat(T)] * 4), policy("operator"))
    clock.submit(*[clock.query(k) for k in range(4)])
    assert_times(clock.wait(4), {k: 4 * T for k in range(4)}, steps=4)
    assert split_runs(clock, 3) == [4]


def stretch_case(tables: list[dict], backlog: bool) -> Clock:
    """Query 0 at 0; at 1.2T (batch 0 in stage 1) query 1 of the same shape, and with ``backlog``
    query 2 of another shape, which cannot join and waits."""
    clock = Clock(timed_manifest(tables), policy("load"))
    clock.submit(clock.query(0))
    time.sleep(T / 1000 * 1.2)
    clock.submit(clock.query(1), *([clock.query(2, length=16)] if backlog else []))
    return clock


@pytest.mark.wallclock
def test_policy3_never_slows_a_lone_batch_down():
    """Nothing else queued: query 1 follows batch 0 as a new batch (leaves 5.2T), and query 0
    leaves at 4T instead of waiting for it to catch up."""
    clock = stretch_case([flat(T)] * 4, backlog=False)
    assert_times(clock.wait(2), {0: 4 * T, 1: 5.2 * T}, steps=5)
    assert {r[1] for r in clock.runs if r[0] == 0} == {0, 1}


@pytest.mark.wallclock
def test_policy3_stretches_when_others_wait_and_merging_saves_work():
    """Stages cost T at any size: merging saves 2T in stages 2-3, the early query loses 1.2T.
    With query 2 waiting, query 1 stretches batch 0: both leave at 5.2T; query 2 enters stage 0
    after the late row (2.2T) and follows one stage behind, leaving at 6.2T."""
    clock = stretch_case([flat(T)] * 4, backlog=True)
    assert_times(clock.wait(3), {0: 5.2 * T, 1: 5.2 * T, 2: 6.2 * T}, steps=6)
    assert [(r[2], r[3]) for r in clock.runs if r[0] == 3 and r[1] == 0] == [(0, 2)]
    check_rows(clock)


def test_policy3_does_not_stretch_where_time_grows_with_the_rows():
    """A CPU-like table (T/4 per row): merging saves nothing, so no stretch even with a backlog."""
    clock = stretch_case([PER_ROW] * 4, backlog=True)
    clock.wait(3)
    assert {r[1] for r in clock.runs if r[0] == 0} == {0, 1, 2}


GROWING = {"batch_sizes": BATCH_SIZES, "mean": [1.0, 1.07, 1.21, 1.49]}  # 1 ms, 0.07 ms more a row


def test_policy3_stretches_for_rows_left_queued_and_weighs_every_row_it_delays():
    """Six stages of 1 ms a query and 0.07 ms more a row. A batch of 2 entered stage 0 0.1 ms
    ago and a late query arrives: stretching answers the early rows 1.35 ms later and the late
    one 0.35 ms later than following as a new batch, to save 4.65 ms of stage work, which pays
    only where a queue waits for it. With a batch ahead in the pipeline and nothing left queued
    it enters as a new batch (this stretched, and six such stages at 840 Poisson queries/s
    answered in 1.16x-1.21x the mean of ``policy: pass``); with a query of another shape left
    waiting it stretches (3.05 ms lost, summed). A batch of 4 would lose 5.75 ms, summed: no
    stretch even with a queue."""
    config = policy("load")
    config.bind(timed_manifest([GROWING] * 6))

    def query(length: int = 8) -> Query:
        return Query({"x": np.zeros((1, length), np.float32)}, lambda outputs, failure: None)

    def admit(waiting: list[Query]) -> tuple[BatchTable, list[Query], int]:
        """A batch ahead, the latest of 2 rows entered at 0; ``waiting`` admitted at 0.1 ms."""
        table = BatchTable(stages=6, max_batch_size=8)
        table.new([query()], now=-0.003)
        table.new([query(), query()], now=0.0)
        taken, item, _ = Scheduler(table, config.policy, clock=lambda: 0.0001).admit(waiting, room=8)
        return table, taken, item.batch_id

    late = query()
    table, taken, batch = admit([late])
    assert taken == [late] and batch == 2, "nothing left queued: a new batch"
    late = query()
    table, taken, batch = admit([late, query(16)])
    assert taken == [late] and batch == 1 and table.get(1).bs == 3, "a query left queued: stretched"
    four = table.get(table.new([query() for _ in range(4)], now=0.0).batch_id)
    assert not config.policy.stretch(four, [query()], 0.0001, backlog=1)


PER_LENGTH = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [8, 16],
              "mean": [[T / 2] * len(BATCH_SIZES), [T] * len(BATCH_SIZES)]}


@pytest.mark.wallclock
def test_policy1_clusters_by_length_and_pads_within_a_cluster():
    """Figure 3, Case I with lengths 5, 6, 8 and 16 (stages T/2 up to 8 tokens, T up to 16):
    padded into one batch all leave at 4T. Policy I puts 5, 6 and 8 in one batch padded to 8
    (2T) and 16 in its own, entering after it; every query gets its own rows back, cut to its
    own length."""
    clock = Clock(timed_manifest([PER_LENGTH] * 4), policy("input"))
    clock.submit(*[clock.query(k, length=n) for k, n in enumerate([5, 6, 8, 16])])
    got = clock.wait(4)
    assert_times(got, {0: 2 * T, 1: 2 * T, 2: 2 * T, 3: 4.5 * T}, steps=5)
    assert split_runs(clock, 0) == [3, 1]
    assert [clock.answers[k][1]["x"].shape for k in range(4)] == [(1, 5), (1, 6), (1, 8), (1, 16)]
    check_rows(clock)


@pytest.mark.wallclock
def test_policy1_lone_query_never_waits_for_the_window():
    clock = Clock(timed_manifest([PER_LENGTH] * 2), policy("input", window_ms=5 * T))
    clock.submit(clock.query(0, length=16))
    assert_times(clock.wait(1), {0: 2 * T}, steps=2)


@pytest.mark.wallclock
def test_policy1_keeps_rows_in_flight_within_the_bound():
    """Ten one-row queries with room for 8 in flight (the paper's bound, the maximum batch
    size): 8 enter, the last two when those leave."""
    clock = Clock(timed_manifest([flat(T)] * 2), policy("input", max_in_flight=8))
    clock.submit(*[clock.query(k) for k in range(10)])
    got = clock.wait(10)
    assert_times(got, {**{k: 2 * T for k in range(8)}, 8: 4 * T, 9: 4 * T}, steps=4)


def test_auto_takes_the_policies_of_the_recorded_diversities():
    per_length = timed_manifest([PER_LENGTH] * 2)
    auto = make_policy("auto", {})
    auto.bind(per_length)
    assert (auto.input, auto.operator, auto.load, auto.max_in_flight) == (True, False, True, 24)
    fixed_shape = timed_manifest([flat(T)] * 2, dims=(4,))
    auto = make_policy("auto", {})
    auto.bind(fixed_shape)
    assert (auto.input, auto.operator, auto.load, auto.max_in_flight) == (False, False, True, 0)
    # One query a batch pads nothing: no Policy I, and no bound of one query a stage in flight,
    # which idled stage 0 on each hand-off (four 2 ms stages under Poisson 353/s in process:
    # 16.3 ms a query with it, 14.4 with ``pass``, 14.0 without it).
    one = timed_manifest([{"batch_sizes": [1], "mean": [2.0]}] * 4, max_batch_size=1)
    auto = make_policy("auto", {})
    auto.bind(one)
    assert (auto.input, auto.max_in_flight) == (False, 0)
    with pytest.raises(ConfigError, match="needs inputs with a named length axis"):
        make_policy("input", {}).bind(fixed_shape)
    untimed = timed_manifest([flat(T)])
    untimed = type(untimed)(**{**untimed.__dict__, "stages": tuple(
        type(s)(**{**s.__dict__, "latency": None}) for s in untimed.stages)})
    with pytest.raises(ConfigError, match="stage 0 has none"):
        make_policy("auto", {}).bind(untimed)


def test_a_policy_says_whether_it_forms_queries_of_one_shape_as_one_batch():
    """``forms_alike_whole``: whether a call of requests of one shape, served plain on the host's
    cores, may run straight as one batch. Policy I on several stages cuts a crowd of one length
    into pieces; on one stage (a fused model) it keeps it whole; SMDP's solution and Orloj's rule
    may serve fewer than wait."""
    stages, fused = timed_manifest([PER_LENGTH] * 2), timed_manifest([PER_LENGTH])
    assert make_policy("pass", {}).forms_alike_whole()
    for name, several, one in [("auto", False, True), ("input", False, True), ("load", True, True),
                               ("smdp", False, False), ("slo", False, False)]:
        chosen = make_policy(name, {})
        chosen.bind(stages)
        assert chosen.forms_alike_whole() is several, name
        chosen.bind(fused)
        assert chosen.forms_alike_whole() is one, name


@pytest.mark.wallclock
def test_deadlines_stop_a_stretch_that_would_make_the_early_query_late():
    """The backlog case of Policy III, but query 0 must be answered within 4.5T: stretching
    would answer it at 5.2T, a new batch lets it leave at 4T, so query 1 enters on its own."""
    clock = Clock(timed_manifest([flat(T)] * 4), policy("load"))
    clock.submit(clock.query(0, deadline_ms=4.5 * T))
    time.sleep(T / 1000 * 1.2)
    clock.submit(clock.query(1), clock.query(2, length=16))
    got = clock.wait(3)
    assert_times(got, {0: 4 * T, 1: 5.2 * T}, steps=5)
    assert {r[1] for r in clock.runs if r[0] == 0} == {0, 1, 2}


@pytest.mark.wallclock
def test_deadlines_keep_a_long_query_with_the_short_ones():
    """Case I again, but the long query must be answered within 4.2T: after the short batch it
    would leave at 4.5T, so all four run as one batch padded to 16 and leave at 4T."""
    clock = Clock(timed_manifest([PER_LENGTH] * 4), policy("input"))
    clock.submit(*[clock.query(k, length=n) for k, n in enumerate([5, 6, 8])],
                 clock.query(3, length=16, deadline_ms=4.2 * T))
    assert_times(clock.wait(4), {k: 4 * T for k in range(4)}, steps=4)
    assert split_runs(clock, 0) == [4]
    check_rows(clock)


@pytest.mark.wallclock
@pytest.mark.parametrize("name", ["input+load", "operator+load"])
def test_many_queries_from_many_threads_all_answered_with_their_own_rows(name):
    """A stress of admission against batches leaving (the entry's lock and the table's are taken
    in one order only): 1,200 queries of mixed lengths from four threads, every one answered."""
    import threading

    fast = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [8, 16],
            "mean": [[0.2, 0.25, 0.3, 0.4], [0.3, 0.4, 0.5, 0.8]]}
    clock = Clock(timed_manifest([fast] * 3), policy(name))

    def client(offset: int) -> None:
        for k in range(offset, 1200, 4):
            clock.submit(clock.query(k, length=1 + k % 16))
            if k % 16 == 0:
                time.sleep(0.001)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    clock.wait(1200)
    check_rows(clock)


@pytest.mark.wallclock
def test_a_query_larger_than_the_in_flight_bound_still_runs():
    clock = Clock(timed_manifest([flat(T)] * 2), policy("input", max_in_flight=2))
    clock.submit(clock.query(0, rows=4))
    assert_times(clock.wait(1), {0: 2 * T}, steps=2)
    check_rows(clock)


def test_no_query_waits_at_an_idle_pipeline_whatever_the_load():
    """The entry never holds a query back while nothing is in flight, however fast queries
    arrive and however much batching pays: the stages have room, and a busy pipeline batches
    by itself. Policy III's load window (half a query's time in the slowest stage where the
    tables said the load would keep it 2/3 busy unbatched) answered an early-exit model in 1.27x
    the forced pipeline's mean under Poisson 0.3 (docs/results/load-window). Policy I's window
    is waited only behind batches in flight."""
    oldest = Query({"x": np.zeros((1, 16), np.float32)}, lambda outputs, failure: None)
    now, per_s = oldest.arrived, 1000 / T  # one query per T: the slowest stage busy all the time unbatched
    for name, settings, dims in (("load", {}, (16,)), ("auto", {}, ("sequence",)),
                                 ("input+load", {"window_ms": "-1"}, ("sequence",))):
        chosen = make_policy(name, settings)
        chosen.bind(timed_manifest([flat(T), flat(T / 2)], dims=dims))
        for rate in (0.6 * per_s, per_s, 4 * per_s):
            assert chosen.window_end([oldest], 1, Outlook((), rate), now) == now, (name, rate)
        in_stage_1 = (Flight(1, {}, 1, now),)  # stage 1 (T/2) just began a batch: a busy pipeline batches by itself,
        waited = chosen.window_end([oldest], 1, Outlook(in_stage_1, per_s), now)  # ... and the paper's window is waited
        assert waited > now if "window_ms" in settings else waited == now, name


def test_policy1_forms_fuller_batches_when_others_wait():
    """One stage, T/2 up to 8 tokens and T up to 16. Lengths 5, 6, 8, 16 alone: two batches
    (5-8 done at T/2, 16 at 1.5T: 3T summed, against 4T padded together). With three more
    queries left waiting behind them, who wait for every batch, one padded batch (4T + 3T)
    beats two (3T + 4.5T)."""
    manifest = timed_manifest([PER_LENGTH])
    auto = make_policy("input", {})
    auto.bind(manifest)
    queries = refuse_invalid(manifest, [Query({"x": np.zeros((1, n), np.float32)}, lambda o, f: None)
                                        for n in [5, 6, 8, 16, 16, 16, 16]])
    alone = auto.form(queries[:4], 4, time.monotonic())
    assert [len(group) for group, _ in alone] == [3, 1]
    crowded = auto.form(queries, 4, time.monotonic())
    assert [len(group) for group, _ in crowded] == [4] and dict(crowded[0][1].sizes) == {"sequence": 16}


def test_policy1_takes_the_waiting_queries_nearest_the_oldest_in_length():
    """Where more wait than a batch takes, the batch is the oldest and those nearest it in length,
    not the next in arrival order: alternating lengths 16 and 8, a batch of four takes the four
    of the oldest's length, unpadded (Triton's order padded two of 8 to 16 in each batch; RTE's
    length deciles on two timed stages of 8 rows, 64 in flight: 545 answers/s before, 615 after).
    Of the runs that fill the batch, the one that pads least; all that wait where they fit."""
    manifest = timed_manifest([PER_LENGTH])
    auto = make_policy("input", {})
    auto.bind(manifest)

    def waiting(*lengths):
        return refuse_invalid(manifest, [Query({"x": np.zeros((1, n), np.float32)}, lambda o, f: None)
                                         for n in lengths])

    def formed(queries, room):
        return [[q.sizes["sequence"] for q in group] for group, _ in auto.form(queries, room, time.monotonic())]

    queries = waiting(16, 8, 16, 8, 16, 8, 16, 8)
    assert formed(queries, 4) == [[16, 16, 16, 16]]
    assert formed(queries[1:], 4) == [[8, 8, 8, 8]]
    # The oldest (12) with the three longer ones pads 4 tokens, with the three shorter ones 3 + 2
    # + 1: the longer run; beside three of 11 (1 + 1 + 1), the shorter.
    assert formed(waiting(12, 16, 9, 16, 10, 16, 11), 4) == [[12, 16, 16, 16]]
    assert formed(waiting(12, 16, 11, 16, 11, 16, 11), 4) == [[11, 11, 11, 12]]
    assert formed(waiting(12, 16, 9), 4) == [[9, 12, 16]]  # all fit: all taken, as before (one tabulated length)


def test_policy1_forms_fuller_batches_under_load():
    """The same four queries with nobody left waiting, but queries arriving: those that arrive
    by the time a group is done wait for it too. Two batches cost 3T, plus 1.75T x (arrivals
    per T) for those arriving meanwhile; one padded batch 4T, plus T x (arrivals per T): from
    4/3 arrivals per T on, one batch."""
    manifest = timed_manifest([PER_LENGTH])
    auto = make_policy("input", {})
    auto.bind(manifest)
    queries = refuse_invalid(manifest, [Query({"x": np.zeros((1, n), np.float32)}, lambda o, f: None)
                                        for n in [5, 6, 8, 16]])
    light, heavy = Outlook((), 1 * 1000 / T), Outlook((), 2 * 1000 / T)
    assert [len(group) for group, _ in auto.form(queries, 4, time.monotonic(), light)] == [3, 1]
    assert [len(group) for group, _ in auto.form(queries, 4, time.monotonic(), heavy)] == [4]


def test_policy1_cuts_a_crowd_of_one_length_to_fill_the_pipeline():
    """Eight queries of one length, two stages. Where time grows with the rows, four groups of
    two overlap in the pipeline (leaving at T, 1.5T, 2T, 2.5T: 14T summed, against 32T in one
    batch); where a run costs T at any size, one batch."""
    def groups(tables: list[dict]) -> list[int]:
        manifest = timed_manifest(tables)
        auto = make_policy("input", {})
        auto.bind(manifest)
        queries = refuse_invalid(manifest, [Query({"x": np.zeros((1, 8), np.float32)}, lambda o, f: None)
                                            for _ in range(8)])
        return [len(group) for group, _ in auto.form(queries, 8, time.monotonic())]

    assert groups([PER_ROW, PER_ROW]) == [2, 2, 2, 2]
    assert groups([flat(T), flat(T)]) == [8]
    assert groups([PER_ROW]) == [8]  # one stage (a fused model): nothing to overlap


def test_policy1_reads_between_the_tabulated_lengths():
    """A CPU-like table, tabulated at 64 and 128 tokens: 3T per batch and T per row of 64
    tokens. Queries of 70 and 128 tokens padded together finish at 2 x 7T (14T summed); run
    one after the other, 70 costs about half of 128 (4.1T, then 9.1T: 13.2T). Policy I runs them
    as two batches (rounding 70 up to 128 made them look as cheap to pad as two of 128), and
    120 with 128 as one (14T against 4.9T + 9.9T)."""
    per_token = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [64, 128],
                 "mean": [[3 * T + T * b for b in BATCH_SIZES], [3 * T + 2 * T * b for b in BATCH_SIZES]]}
    manifest = timed_manifest([per_token])
    table = manifest.stages[0].latency
    assert table.predict(1, 96) == pytest.approx(4.5 * T)  # halfway between 64 and 128
    assert table.predict(1, 32) == table.predict(1, 64) and table.lookup(1, 70) == table.predict(1, 128)
    input_policy = make_policy("input", {})
    input_policy.bind(manifest)

    def lengths(*ns: int) -> list[list[int]]:
        queries = refuse_invalid(manifest, [Query({"x": np.zeros((1, n), np.float32)}, lambda o, f: None) for n in ns])
        return [[q.sizes["sequence"] for q in group] for group, _ in input_policy.form(queries, 8, time.monotonic())]

    assert lengths(70, 128) == [[70], [128]]
    assert lengths(120, 128) == [[120, 128]]


def test_policy1_inside_execute_cuts_a_batch_in_two_only_where_the_runs_take_less_in_all():
    """A model served as a plain one on engines that overlap answers every query when its last
    run is done. A GPU-like table, tabulated at 64 and 128 tokens: 3T per run and T (at 64) or 2T
    (at 128) per row. Four queries of 64 and four of 128 take 19T padded together and 7T + 11T
    as two runs: two, unless the host's part of a run costs more than the T saved. One of each
    take 7T together against 4T + 5T: one run. Sorted by length, whatever order they came in."""
    per_token = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [64, 128],
                 "mean": [[3 * T + T * b for b in BATCH_SIZES], [3 * T + 2 * T * b for b in BATCH_SIZES]]}
    manifest = timed_manifest([per_token])

    def lengths(ns: list[int], run_s: float = 0.0) -> list[list[int]]:
        auto = make_policy("auto", {})
        auto.bind(manifest)
        auto.measured(HostCosts(plain_batch_s=run_s), 1)
        queries = refuse_invalid(manifest, [Query({"x": np.zeros((1, n), np.float32)}, lambda o, f: None) for n in ns])
        return [[q.sizes["sequence"] for q in group] for group in auto.form_inline(queries)]

    assert lengths([128, 64] * 4) == [[64] * 4, [128] * 4]
    assert lengths([128, 64] * 4, run_s=T / 1000 * 1.5) == [[64] * 4 + [128] * 4]
    assert lengths([128, 64]) == [[64, 128]]
    assert lengths([64] * 8) == [[64] * 8]


def _queue(reject: bool, **config) -> RuntimeConfig:
    from backend.config import QueuePolicy

    return RuntimeConfig(policy=make_policy("pass", {}), queue=QueuePolicy(reject=reject), **config)


@pytest.mark.wallclock
def test_a_query_whose_timeout_passes_in_the_pipeline_is_answered_before_more_compute():
    """Four stages of T; query 0 must be done within 1.5T, query 1 has no timeout, and they share
    a batch. At the boundary after stage 1 (2T) query 0 is answered UNAVAILABLE, as Triton's queue
    policy words an expired request; query 1 leaves at 4T with its rows. A batch of only an expired
    query passes the stages left without computing."""
    clock = Clock(timed_manifest([flat(T)] * 4), _queue(reject=True))
    clock.submit(clock.query(0, deadline_ms=1.5 * T), clock.query(1))
    time.sleep(T / 1000 * 0.5)
    clock.submit(clock.query(2, deadline_ms=1.2 * T))  # a batch of its own, behind the first
    got = clock.wait(3)
    assert_times(got, {0: 2 * T, 1: 4 * T}, steps=4)
    for key in (0, 2):
        failure = clock.answers[key][2]
        assert (failure.code.name, failure.message) == ("UNAVAILABLE", "Request timeout expired")
    assert clock.answers[1][2] is None
    lone = {r[1] for r in clock.runs if r[0] == 0 and r[3] == 1}
    late = [r[5] - r[4] for r in clock.runs if r[1] in lone and r[0] >= 2]
    assert late and max(late) < T / 4, f"stages 2-3 computed an expired batch: {late} ms"


@pytest.mark.wallclock
def test_with_timeout_action_delay_an_expired_query_still_runs():
    clock = Clock(timed_manifest([flat(T)] * 4), _queue(reject=False))
    clock.submit(clock.query(0, deadline_ms=1.5 * T))
    assert_times(clock.wait(1), {0: 4 * T}, steps=4)
    check_rows(clock)


@pytest.mark.wallclock
def test_the_batch_window_never_takes_more_than_half_of_a_deadline():
    """A fixed window of 20T, and a query that must be done within 6T: the window closes at 3T
    (half its time) and the query leaves through two stages at 5T, with its rows."""
    clock = Clock(timed_manifest([flat(T)] * 2), _queue(reject=True, batch_window_ms=20 * T))
    clock.submit(clock.query(0, deadline_ms=6 * T))
    assert_times(clock.wait(1), {0: 5 * T}, steps=3)
    check_rows(clock)


def _profile(name: str):
    """The timed model of a profile in docs/profiles."""
    from tools.lib.paths import ROOT
    from tools.lib.timed import from_profile

    return from_profile(ROOT / "docs" / "profiles" / f"{name}.json")[1]


def _on(profile: str, engine: str):
    """An H200 profile's tables (docs/profiles) on ``engine``."""
    from dataclasses import replace

    manifest = _profile(f"{profile}_torch_h200_2stages")
    return replace(manifest, stages=tuple(replace(s, engine=engine) for s in manifest.stages))


def test_pipelining_interpreted_torch_stages_frees_almost_nothing():
    """Tables measured on an H200: BERT-base's two torch stages take about the same at 1 and at
    16 rows, so their time is the interpreter's host dispatch, which the stages of one process
    take in turns: pipelined they answer under 1.1x what they answer plain. The same tables on
    engines that overlap (timed) nearly double, and so do ResNet-50's torch stages, whose time
    grows with the batch (the GPU's share)."""
    def pipelined_over_plain(manifest) -> float:
        rates = capacities([s.latency for s in manifest.stages], HostCosts(), 16, shared_host=interpreted(manifest))
        return rates["pipeline"] / rates["plain"]

    assert pipelined_over_plain(_on("bert_base", "torch")) < 1.1
    assert pipelined_over_plain(_on("bert_base", "timed")) > 1.5
    assert pipelined_over_plain(_on("resnet50", "torch")) > 1.5


def _window(stub_s: float, busy_s: tuple[float, ...], answered: int = 1000, rows: float = 8.0,
            server_s: float | None = None) -> Window:
    return Window(1.0, answered, stub_s, server_s, busy_s, rows)


def _decides(switch: ModeSwitch, window: Window) -> Mode | None:
    """What the switch does at a load seen steady: ``window`` twice (one alone never switches)."""
    return switch.observe(window) or switch.observe(window)


def test_the_mode_switch_begins_plain_only_where_loadings_costs_favour_it_at_both_ends():
    """Before any window, the way served is plain only where loading's costs and the tables say
    it answers a lone request sooner and carries more at capacity, each by the switch's margin.
    Two stages of 0.05 ms, a pipelined batch costing the stub 1,200 us against 500 plain (the
    shape of BERT-base's CUDA-graph stages on an H100): plain at both ends, so it begins plain.
    Stages of 0.7 ms a row each, the same costs: a lone request is still sooner plain, but the
    pipeline carries more at capacity, so it begins pipelined (multi-entry) and the windows
    decide. Stages of 20 ms: pipelined at both ends. The log says what it began from."""
    costs = HostCosts(pipeline_batch_s=1200e-6, pipeline_request_s=70e-6, plain_batch_s=500e-6,
                      plain_request_s=10e-6, handoff_s=60e-6)

    def begins(table: dict) -> ModeSwitch:
        manifest = timed_manifest([table] * 2)
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=16)
        switch.begin()
        return switch

    assert begins(flat(0.05)).mode is Mode.IN_TURN
    growing = {"batch_sizes": BATCH_SIZES, "mean": [0.7 * rows for rows in BATCH_SIZES]}
    mid = begins(growing)
    assert mid.mode is Mode.PIPELINE and "plain" in mid.last and "answers/s pipelined" in mid.last
    assert begins(flat(20.0)).mode is Mode.PIPELINE
    unmeasured = ModeSwitch([s.latency for s in timed_manifest([flat(0.05)] * 2).stages], HostCosts(), cores=16)
    assert unmeasured.begin() is Mode.PIPELINE  # no costs: nothing says the pipeline costs more


def test_the_mode_switch_serves_plain_where_the_pipelines_own_cost_is_the_nearer_limit():
    """Two stages of 1 ms a batch (timed, so the tables are all the engines take); the
    pipeline's stub costs three times the plain path's. At 1,000 answers/s in batches of 8 the
    stub is 90 % busy pipelined, where plain would keep it 30 % busy and the engines 25 %: the
    switch serves plain. There, at 3,000 answers/s, the engines are 75 % busy and pipelined the
    stub would be saturated: it stays, and at 400/s too (the stub 36 % busy pipelined against
    12 %: requests would queue more), and when the load falls to 100/s: a batch's own time is
    less plain at every load (the multi-entry of stages this short saves less than the pipeline's
    stub costs), so no light window between two loads pipelines again (the next load would
    queue at the pipeline's lower capacity until a window switched back). A window with hardly
    any answers changes nothing."""
    manifest = timed_manifest([flat(1.0)] * 2)
    costs = HostCosts(pipeline_request_s=900e-6, plain_request_s=300e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=4)
    assert _decides(switch, _window(0.9, (0.125, 0.125))) is Mode.IN_TURN
    assert _decides(switch, _window(0.9, (0.375, 0.375), answered=3000)) is None and switch.mode is Mode.IN_TURN
    assert _decides(switch, _window(0.12, (0.05, 0.05), answered=400)) is None
    assert _decides(switch, _window(0.03, (0.0125, 0.0125), answered=100, rows=1.0)) is None
    assert "plain" in switch.last and switch.mode is Mode.IN_TURN
    switch.mode = Mode.PIPELINE
    assert switch.observe(_window(0.001, (0.0, 0.0), answered=3)) is None  # too little to go by


def test_a_request_of_several_rows_costs_the_stub_one_request_and_the_engines_its_rows():
    """The setting above, pipelined, the rows arriving as requests of 8: 125 answers/s, a run
    of 8 rows a request, the stub 11 % busy. Plain would answer a little sooner (2.8 against
    3.0 ms), not by the 15 % a switch needs: the mode stays. Taken as 8 requests each, a run
    cost the stub 7.2 ms pipelined against 2.4 plain, and the switch served plain; a closed
    loop of 8 requests of 8 rows at TensorRT speed went plain and back every 2.5 s. The same
    rows as requests of one (the first test) cost the stub 90 % pipelined: plain."""
    manifest = timed_manifest([flat(1.0)] * 2)
    costs = HostCosts(pipeline_request_s=900e-6, plain_request_s=300e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=4)
    window = Window(1.0, 125, 0.1125, None, (0.125, 0.125), 8.0, rows_a_request=8.0)
    assert window.requests == 1.0 and Window(1.0, 125, 0.1, None, (0.1,), 0.5, rows_a_request=0.9).requests == 1.0
    assert _decides(switch, window) is None and switch.mode is Mode.PIPELINE
    assert "8.0 rows a run (1.0 requests)" in switch.last
    assert _decides(switch, dataclasses.replace(window, answered=1000, stub_s=0.9, rows_a_request=1.0)) is Mode.IN_TURN


def test_a_hold_holds_up_to_the_rate_a_window_served_plain_shows_the_host_can_carry():
    """Served plain on one core, the stub 30 us a request and tritonserver 100 (seen): a window
    at 2,000 answers/s keeps the host 26 % busy, so it carries 7,692/s at least, and a hold may
    hold up to that where the window's answers were mostly sent (held), as the sends are in
    what it measured. Where they went back in ``execute``'s list, a send() (50 us of the stub,
    and about as much of tritonserver) makes each 230 us where it was 130: up to 4,348/s.
    A pipelined window, or one with too few answers, says nothing."""
    manifest = timed_manifest([flat(0.01)] * 2)
    costs = HostCosts(pipeline_request_s=300e-6, plain_request_s=30e-6, send_s=50e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    window = _window(0.06, (0.01, 0.01), answered=2000, rows=1.0, server_s=0.2)
    switch.observe(window)
    assert switch.server[Mode.IN_TURN] == pytest.approx(100e-6)
    assert switch.hold_rate(window, held=True) == pytest.approx(2000 / 0.26)
    assert switch.hold_rate(window, held=False) == pytest.approx(2000 / 0.26 * 130 / 230)
    assert switch.hold_rate(_window(0.003, (0.0, 0.0), answered=100, rows=1.0), held=True) is None
    switch.mode = Mode.PIPELINE
    switch.observe(window)
    assert switch.hold_rate(window, held=True) is None


def test_a_switch_needs_two_windows_in_a_row_at_about_one_rate_and_a_light_one_keeps_no_costs():
    """The setting above: pipelined at 1,000 answers/s in batches of 8, plain answers sooner. One
    window alone does not switch, nor one at 3,000/s after it (a load that stopped or started
    within a window shows a rate that is neither's: the slower engine once went plain on such a
    window at 128 answers/s between two loads, and stayed plain through a closed loop the
    pipeline served 1.5x faster); a second at about its rate does. A window of fewer than
    ``CORRECT_AFTER`` answers changes none of the costs the switch keeps: in a server shared
    with other models, their requests weigh in tritonserver's CPU. Between the two, the switch
    leans to plain (``leaning``: the watch tries nothing else on the pipeline meanwhile)."""
    manifest = timed_manifest([flat(1.0)] * 2)
    costs = HostCosts(pipeline_request_s=900e-6, plain_request_s=300e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=4)
    assert not switch.leaning
    assert switch.observe(_window(0.9, (0.125, 0.125), server_s=0.1)) is None and switch.leaning
    assert switch.observe(_window(2.7, (0.375, 0.375), answered=3000, server_s=0.3)) is None
    assert switch.observe(_window(2.6, (0.375, 0.375), answered=2900, server_s=0.29)) is Mode.IN_TURN
    assert not switch.leaning
    assert switch.server == {Mode.PIPELINE: pytest.approx(100e-6)}
    switch.observe(_window(0.1, (0.01, 0.01), answered=64, server_s=0.17))  # served plain now
    assert Mode.IN_TURN not in switch.server and Mode.IN_TURN not in switch.excess


def test_the_mode_switch_pipelines_again_once_the_wait_multi_entry_saves_outweighs_its_cost():
    """Two stages of 10 ms a batch, served plain, with the pipeline's stub a little dearer. At
    5 answers/s (one row a run) either way answers in about a batch's own 20 ms: the mode stays.
    At 40/s a request arriving during a run waits for the whole run plain (the engines 80 %
    busy, some 41 ms more on average) but only for stage 0 pipelined (the slower stage 40 %
    busy, 3 ms): the switch pipelines, the paper's multi-entry at a load well below capacity."""
    manifest = timed_manifest([flat(10.0)] * 2)
    costs = HostCosts(pipeline_request_s=600e-6, plain_request_s=300e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=4, mode=Mode.IN_TURN)
    assert switch.observe(_window(0.003, (0.1, 0.1), answered=10, rows=1.0)) is None  # too few answers
    assert switch.observe(Window(4.0, 40, 0.012, None, (0.4, 0.4), 1.0)) is None
    assert _decides(switch, _window(0.012, (0.4, 0.4), answered=40, rows=1.0)) is Mode.PIPELINE


def test_served_plain_the_whole_model_runs_as_one_engine_where_it_is_no_slower_and_the_switch_reads_its_table():
    """Two stages of 10 ms a batch. The whole model as one engine runs where its table (a
    profile's ``whole``, else the stages' summed) says it takes no longer than the stages in
    turn; one measured slower stays apart. Served so, the switch predicts plain serving from
    the whole's table: at 40 answers/s of one row, the stages in turn would be 80 % busy and the
    pipeline answers sooner (the test above), while a whole engine of 10 ms is 40 % busy and
    answers sooner than a pipeline's 20 ms: it stays fused."""
    manifest = timed_manifest([flat(10.0)] * 2)
    assert fuses(manifest)
    assert fuses(dataclasses.replace(manifest, whole=LatencyTable.from_json(flat(20.0))))
    assert not fuses(dataclasses.replace(manifest, whole=LatencyTable.from_json(flat(21.0))))
    assert not fuses(timed_manifest([flat(10.0)]))  # one stage is one engine already: no copy to load
    costs = HostCosts(pipeline_request_s=600e-6, plain_request_s=300e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=4, mode=Mode.FUSED,
                        whole=LatencyTable.from_json(flat(10.0)))
    assert switch.plain is Mode.FUSED
    assert _decides(switch, _window(0.012, (0.4, 0.0), answered=40, rows=1.0)) is None and switch.mode is Mode.FUSED
    switch.mode = Mode.PIPELINE
    assert _decides(switch, _window(0.024, (0.4, 0.4), answered=40, rows=1.0)) is Mode.FUSED


def test_a_window_adds_to_the_costs_measured_at_load_what_a_request_cost_beyond_them():
    """Costs measured at load: 100 us a request pipelined, 50 plain. Served pipelined, a window
    whose stub shows 150 us a request adds 50 to both ways (what loading leaves out, the stub's
    work on Triton's requests and responses, is about as much a request either way); the next,
    agreeing with loading, takes it back (corrections do not compound); one showing a tenth of
    loading's takes each way to half of its own, no lower."""
    manifest = timed_manifest([flat(1.0)] * 2)
    switch = ModeSwitch([s.latency for s in manifest.stages], HostCosts(pipeline_request_s=100e-6,
                                                                          plain_request_s=50e-6), cores=16)
    for stub_s, pipelined, plain in ((0.15, 150e-6, 100e-6), (0.1, 100e-6, 50e-6), (0.01, 50e-6, 25e-6)):
        switch.mode = Mode.PIPELINE  # each window served pipelined (what it switches to is beside the point)
        switch.observe(_window(stub_s, (0.01, 0.01)))
        assert switch.costs.pipeline_request_s == pytest.approx(pipelined)
        assert switch.costs.plain_request_s == pytest.approx(plain)


def test_each_way_keeps_the_correction_its_own_windows_showed():
    """Costs measured at load: 100 us a request pipelined, 50 plain. Served pipelined, a window
    shows the pipeline's stub at 150 us; served plain next, one shows plain's as measured. The
    pipeline stays corrected to 150 us (before, the plain window put it back at 100: the way
    not served looked as cheap as loading had measured it, and the switch flipped back to it)."""
    manifest = timed_manifest([flat(1.0)] * 2)
    switch = ModeSwitch([s.latency for s in manifest.stages], HostCosts(pipeline_request_s=100e-6,
                                                                          plain_request_s=50e-6), cores=16)
    switch.observe(_window(0.15, (0.01, 0.01)))
    switch.mode = Mode.IN_TURN
    switch.observe(_window(0.05, (0.01, 0.01)))
    assert switch.costs.pipeline_request_s == pytest.approx(150e-6)
    assert switch.costs.plain_request_s == pytest.approx(50e-6)


def test_a_way_seen_at_a_lighter_load_or_through_lone_batches_inline_is_as_far_off_as_the_way_served():
    """The TensorRT-speed check (docs/results/served-plain-bookkeeping): loading measured the
    pipeline's stub at 263 us a batch + 51 a request, plain's at 31 + 4, on one core. Served
    pipelined at one request in flight (731 answers/s), the stub showed what loading measured,
    and the switch went plain; then, served plain at 1,017 Poisson answers/s in runs of 1.7 rows,
    the pipeline taken as loading measured it was predicted sooner, and pipelined (served so, it
    cost more than loading's too, and went back). Plain served at 215 us a request (the stub's
    work on Triton's requests and responses, which loading leaves out: TensorRT speed held plain
    at 2 rows read 205-226, docs/results/served-cost-lines), the pipeline is taken to cost as much
    more than loading's: seen at a lighter load, it is taken as far off as the way served now at
    least, and the switch stays plain. At one request in flight lone batches run inside
    ``execute`` (``LoneRuns``): a window of them shows plain serving's costs beside the
    pipeline's, in their shares, and what it shows beyond loading's bounds plain's excess alone
    (a pipelined request costs no less beyond loading's): plain not taken dearer yet stays at
    loading's."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=263e-6, pipeline_request_s=51e-6, plain_batch_s=31e-6, plain_request_s=4e-6,
                      handoff_s=31e-6, send_s=23e-6, how="measured")

    def served(rate: int, rows: float, stub_us: float, execute_s: float = 0.0, idle_s: float = 0.0,
               inline: int = 0) -> Window:
        busy = tuple(rate / rows * t.predict(round(rows), None) / 1000 for t in tables)
        return Window(1.0, rate, rate * stub_us * 1e-6, rate * 320e-6, busy, rows, execute_s,
                      round(rate / rows) if execute_s else 0, idle_s, 2e-3 if execute_s else 0.0, inline=inline)

    for inline in (0, 700):
        switch = ModeSwitch(tables, costs, cores=1)
        assert _decides(switch, served(731, 1.0, 263 + 51, inline=inline)) is Mode.IN_TURN
        assert (Mode.PIPELINE in switch.excess) == (inline == 0)
        if inline:  # plain at most 267 us a request beyond loading's: as loading measured it
            assert (switch.costs.pipeline_request_s, switch.costs.plain_request_s) == (51e-6, 4e-6)
        heavier = served(1017, 1.7, 215, execute_s=0.45, idle_s=0.51)
        assert _decides(switch, heavier) is None and switch.mode is Mode.IN_TURN
        assert switch.costs.pipeline_request_s == pytest.approx(51e-6 + 215e-6 - (31e-6 / 1.7 + 4e-6))


def test_requests_that_never_find_a_batch_ahead_wait_for_none_whichever_way_serves():
    """TensorRT-speed BERT-base on one core, one request of 8 rows in flight (a closed loop):
    served pipelined at 500 answers/s, nearly every lone batch inline, every ``execute`` call
    found the pipeline empty. Taken as random arrivals, plain serving (the instance 53 % busy)
    was predicted to keep a request 0.6 ms behind another, and the model kept pipelining, its
    stub 100 us a request dearer than the plain model's (0.91x-0.97x its answers/s). Counted,
    the calls show no request ever had a batch ahead: each way is its batch's own time, plain
    sooner by the pipeline's stub and hand-offs, and the switch serves plain. Where the calls
    found the pipeline busy as often as random arrivals would, it stays."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=359e-6, pipeline_request_s=90e-6, plain_batch_s=86e-6, plain_request_s=6e-6,
                      handoff_s=17e-6, send_s=27e-6, how="measured")
    looks = (30 * 0.48e-3,) * 2  # the stages ran only the lone batches sent to look

    def served(lone: int) -> Window:
        return Window(1.0, 500, 500 * 380e-6, 500 * 300e-6, looks, 8.0, 0.6, 500, 0.4, 0.002, lone=lone,
                      inline=470, rows_a_request=8.0)

    for lone in (500, 250, 0):
        switch = ModeSwitch(tables, costs, cores=1)
        assert switch.observe(served(lone)) is None  # (one window alone never switches)
        assert ("requests overlapping 0% as often as at random" in switch.last) == (lone == 500), switch.last
        # Found better, plain is served outright; within the model's error, from a bound of its
        # stub's cost (the lone batches inline), it may only be tried (``_bounded``).
        decided = switch.observe(served(lone))
        assert (decided is Mode.IN_TURN and switch.trying is None) == (lone == 500), switch.last
    # Served plain, one request a call: none found the instance busy either. Where the pipeline's
    # stub costs less (200 us a batch + 50 a request), plain taken to queue 0.7 ms had the pipeline
    # predicted sooner (1.60 against 1.98 ms), and pipelined it would have gone plain again; it
    # stays plain. Calls of as many requests as random arrivals bring (1.12 at 500/s of 1.06 ms)
    # overlap as often, and the wait counts in full.
    cheaper = dataclasses.replace(costs, pipeline_batch_s=200e-6, pipeline_request_s=50e-6)

    def plain(calls: int) -> Window:
        return Window(1.0, 500, 500 * 300e-6, 500 * 250e-6, (0.0, 0.0), 8.0, calls * 1.06e-3, calls, 0.4, 0.002,
                      rows_a_request=8.0)

    switch = ModeSwitch(tables, cheaper, cores=1, mode=Mode.IN_TURN)
    assert _decides(switch, plain(500)) is None and "overlapping 0%" in switch.last, switch.last
    switch = ModeSwitch(tables, cheaper, cores=1, mode=Mode.IN_TURN)
    assert switch.observe(plain(447)) is None and "overlapping" not in switch.last, switch.last


def test_what_other_processes_spend_on_the_servers_cores_counts_against_either_way():
    """The TensorRT-speed check on one core, its clients there too (docs/results/check-auto-poisson-peak):
    served plain at 16 in flight, 1,418 answers/s in runs of 9.2 rows, the instance 99 % busy
    with each request's round trip in series. With the host's cores taken as the stub's and
    tritonserver's alone, the pipeline is predicted 69 % busy (78 % in the check) and the switch pipelines (it then
    answered 0.86x the plain model). The clients' 0.6 s a second on that core are spent at this
    load whichever way serves it: counted, the pipeline would be overloaded, and plain stays."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=249e-6, pipeline_request_s=57e-6, plain_batch_s=31e-6, plain_request_s=4e-6,
                      handoff_s=30e-6, send_s=18e-6, how="measured")
    rate, rows = 1418, 9.2
    busy = tuple(rate / rows * t.predict(round(rows), None) / 1000 for t in tables)
    for others_s, switched in ((0.0, Mode.PIPELINE), (0.6, None)):
        switch = ModeSwitch(tables, costs, cores=1, mode=Mode.IN_TURN)
        window = Window(1.0, rate, rate * 2 * (31 / rows + 4) * 1e-6, rate * 246e-6, busy, rows, 0.3, 154, 0.70,
                        0.005, others_s)
        assert _decides(switch, window) is switched, switch.last


def test_the_busy_seconds_of_a_processs_cores_are_read_from_proc_stat(tmp_path):
    """``host.busy_s``: user, nice, system, irq and softirq of each CPU asked for (not idle,
    iowait or steal), in clock ticks; None where a CPU's line is missing. This machine's own
    cores count up while one of them spins (what the mode switch reads: ``Watch.others_s``)."""
    import os

    from backend.host import TICK_S, busy_s

    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 100 50 4 5 70 0 0\ncpu1 10 0 0 100 0 0 0 0 0 0\n")
    assert busy_s([0], stat) == pytest.approx(15 * TICK_S)
    assert busy_s([0, 1], stat) == pytest.approx(25 * TICK_S)
    assert busy_s([2], stat) is None and busy_s([0], tmp_path / "none") is None
    mine = os.sched_getaffinity(0)
    before = busy_s(mine)
    began = time.process_time()
    while time.process_time() - began < 0.1:
        pass
    assert busy_s(mine) - before >= 0.05


def test_the_watch_counts_what_the_cores_ran_beyond_this_process_and_tritonserver():
    """``Watch.others_s`` between two readings: the cores' busy seconds less this process's own
    and tritonserver's; none where the cores or tritonserver were not read, never below 0."""
    from backend.serving import Reading, Watch

    def reading(busy, process) -> Reading:
        return Reading(0.0, 0.0, None, {}, 0, 0.0, busy, process)

    assert Watch.others_s(reading(10.0, 1.0), reading(11.0, 1.2), 0.3) == pytest.approx(0.5)
    assert Watch.others_s(reading(10.0, 1.0), reading(10.4, 1.2), 0.3) == 0.0
    assert Watch.others_s(reading(None, 1.0), reading(None, 1.2), 0.3) == 0.0
    assert Watch.others_s(reading(10.0, 1.0), reading(11.0, 1.2), None) == 0.0


def _scaled(table: LatencyTable, factor: float) -> LatencyTable:
    """``table`` as a machine ``1 / factor`` times as fast would have measured it."""
    def scale(values: tuple) -> tuple:
        return tuple(scale(v) if isinstance(v, tuple) else v * factor for v in values)
    return dataclasses.replace(table, mean=scale(table.mean), p99=None)


def test_engines_off_their_tables_are_read_off_them_for_the_way_not_served():
    """The slower engine's two stages (docs/profiles/slow_2stages.json) pipelined at 16 in
    flight on one core, as a window showed them: 825 answers/s in runs of 5.3 rows, each stage
    97 % busy. Against its own tables (1.06x the tables' seconds, within what the host's CPU
    explains) the engines are taken as tabled, and the pipeline stays: plain, in runs that size,
    would be overloaded. Against tables a sixteenth of that (a profile of a machine 16x as
    fast) plain read 31 % busy where it was 97 % and the model went plain and back every few
    windows, at 0.81x the forced pipeline; now the window reads the engines 15x their tables,
    takes the plain engines to be as far off (not served yet), and stays pipelined. A window
    served plain whose engine ran less than its table, by no more than the responses built
    meanwhile, reads as tabled."""
    manifest = _profile("slow_2stages")
    costs = HostCosts(pipeline_batch_s=234e-6, pipeline_request_s=38e-6, plain_batch_s=32e-6, plain_request_s=6e-6,
                      handoff_s=40e-6, send_s=11e-6)
    window = Window(1.0, 825, 0.15, 825 * 169e-6, (0.97, 0.96), 5.3)
    for factor in (1.0, 1 / 16):
        switch = ModeSwitch([_scaled(s.latency, factor) for s in manifest.stages], costs, cores=1,
                            whole=_scaled(manifest.fused().stages[0].latency, factor))
        assert _decides(switch, window) is None and switch.mode is Mode.PIPELINE
        assert (switch.engines[Mode.PIPELINE] == 1.0) if factor == 1.0 else (14 < switch.engines[Mode.PIPELINE] < 16)
        assert switch.off(Mode.IN_TURN) == switch.off(Mode.PIPELINE)  # plain not served yet: as far off
    plain = Window(1.0, 900, 0.05, 0.09, (0.08,), 9.0, execute_s=0.9, executes=100, idle_s=0.1, longest_idle_s=0.002)
    switch = ModeSwitch([LatencyTable.from_json(flat(0.5))], costs, cores=1, mode=Mode.IN_TURN)
    switch.observe(plain)  # the engines' 0.1 s a window by the table, 0.08 measured: the 0.14 s of host CPU explain it
    assert switch.engines[Mode.IN_TURN] == 1.0


def test_the_mode_switch_pipelines_where_the_engines_are_the_nearer_limit():
    """Two stages of 10 ms a batch, served plain at 700 answers/s in batches of 8: the engines
    are 88 % busy one after another, and pipelined the slower stage would be 44 % busy while the
    stub (cheap next to the engines) stays under 10 %: the switch pipelines, and there it stays
    at twice the load."""
    manifest = timed_manifest([flat(10.0)] * 2)
    costs = HostCosts(pipeline_batch_s=200e-6, pipeline_request_s=60e-6, plain_batch_s=100e-6, plain_request_s=30e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=2, mode=Mode.IN_TURN)
    assert _decides(switch, _window(0.03, (0.44, 0.44), answered=700)) is Mode.PIPELINE
    assert _decides(switch, _window(0.06, (0.9, 0.9), answered=1400)) is None and switch.mode is Mode.PIPELINE


def test_served_plain_in_a_closed_loop_the_requests_round_trip_counts_in_series_and_the_switch_pipelines():
    """The slower engine's two stages (36 ms each for 64 rows), 64 requests in flight from clients
    that wait on their answers, served plain on a one-core server: 640 answers/s in batches of
    64, the engines 72 % busy, the core 43 % (tritonserver 650 us a request). The pipeline's stub,
    corrected by what serving showed, costs 2.3 ms a batch and 349 us a request. Read as an open
    load at that rate, plain is predicted within 15 % of the pipeline and stays (what happened:
    docs/results/check-auto-fused-plain, 0.72x). But ``execute`` was busy 74 % of the time and
    idle 26 ms before each batch, where arrivals that did not wait on the answers would have
    queued during a 74 ms call: each request held the next batch back 406 us, in series. With
    that, the instance is saturated, the load is plain's capacity, and the pipeline, predicted
    76 % busy, carries more: the switch pipelines. Pipelined at 1,000/s, plain is predicted
    overloaded and it stays; a load under 85 % of the 640/s where the round trip was seen is
    another load, where plain is predicted without it. An open load of lone batches leaves the
    instance idle no longer than its arrivals explain: no round trip, nor what Triton's batcher
    waits for more where its max_queue_delay lets it. A load that starts within a
    window leaves the instance idle too: a round trip is taken only where two windows in a row, at
    about the same rate, showed it."""
    tables = [{"batch_sizes": [1, 64], "mean": [4.0, 36.0]}] * 2
    manifest = timed_manifest(tables, max_batch_size=64)
    costs = HostCosts(pipeline_batch_s=2.3e-3, pipeline_request_s=349e-6, plain_request_s=40e-6)
    closed = Window(1.0, 640, 640 * 40e-6, 640 * 650e-6, (0.36, 0.36), 64.0, execute_s=0.74, executes=10,
                    idle_s=0.26, longest_idle_s=0.026)
    assert round_trip_s(closed) == pytest.approx(0.26 / 640)
    unseen = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    assert _decides(unseen, dataclasses.replace(closed, executes=0)) is None, unseen.last  # what it did before
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    starting = dataclasses.replace(closed, answered=320, stub_s=320 * 40e-6, server_s=320 * 650e-6,
                                   busy_s=(0.18, 0.18), execute_s=0.37, executes=5, idle_s=0.6, longest_idle_s=0.5)
    assert switch.observe(starting) is None  # one window never switches
    assert switch.observe(closed) is None  # the window before, at half the rate: a load starting
    assert switch.observe(closed) is Mode.PIPELINE, switch.last
    assert "406 us a request's round trip in series" in switch.last
    pipelined = Window(1.0, 1000, 1000 * 420e-6, 1000 * 650e-6, (0.6, 0.6), 32.0)
    assert _decides(switch, pipelined) is None and "overloaded plain" in switch.last
    assert switch._series_s(1000) == pytest.approx(0.26 / 640) and switch._series_s(500) == 0.0
    lone = Window(1.0, 100, 100 * 40e-6, None, (0.4, 0.4), 1.0, execute_s=0.8, executes=100, idle_s=0.2,
                  longest_idle_s=0.002)
    assert round_trip_s(lone) == 0.0  # idle 2 ms a call, where Poisson arrivals leave 4.5
    # Triton's batcher, told to wait up to 5 ms for more, leaves the instance idle that much longer
    # a call under an open load: not a round trip.
    batched = Window(1.0, 200, 200 * 40e-6, None, (0.1, 0.1), 2.0, execute_s=0.1, executes=100, idle_s=0.9,
                     longest_idle_s=0.009)
    assert round_trip_s(batched) > 2e-3 and round_trip_s(batched, delay_s=5e-3) == 0.0


def test_the_pause_between_two_loads_is_no_round_trip_and_no_window_before_it_agrees_with_one_after():
    """Near-zero stages served plain, a closed loop of 16 starting 0.8 s into a window after a
    3.5 s pause: 605 answers/s in runs of 7.6 rows, 2 ms idle before each call but the first.
    Counting the pause, the instance read 12 ms idle a call and 1.4 ms a request in series: such
    a window, agreeing with one before the pause at about the same rate, sent the model to the
    pipeline for the rest of the check (docs/results/lone-request-straight). Without the longest
    idle, it reads about 0.1 ms. And a window with hardly any answers (the pause) breaks the two
    in a row a switch needs: the closed loop that pipelines (the slower engine at 64 in flight)
    switches only on its second window after it."""
    start = Window(1.0, 605, 605 * 14.5e-6, 605 * 276e-6, (0.0004, 0.0004), 7.6, execute_s=0.04, executes=80,
                   idle_s=3.5 + 79 * 0.002, longest_idle_s=3.5)
    assert round_trip_s(start) == pytest.approx(103e-6, rel=0.05)
    assert round_trip_s(dataclasses.replace(start, idle_s=0.96 * 79 / 80, longest_idle_s=0.0)) > 1.4e-3
    tables = [{"batch_sizes": [1, 64], "mean": [4.0, 36.0]}] * 2
    manifest = timed_manifest(tables, max_batch_size=64)
    costs = HostCosts(pipeline_batch_s=2.3e-3, pipeline_request_s=349e-6, plain_request_s=40e-6)
    closed = Window(1.0, 640, 640 * 40e-6, 640 * 650e-6, (0.36, 0.36), 64.0, execute_s=0.74, executes=10,
                    idle_s=0.26, longest_idle_s=0.026)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    assert switch.observe(closed) is None
    assert switch.observe(Window(1.0, 3, 0.001, None, (0.0, 0.0), 1.0, executes=3)) is None  # the pause
    assert switch.observe(closed) is None, switch.last
    assert switch.observe(closed) is Mode.PIPELINE


def test_a_pipeline_whose_execute_waits_pays_the_hand_off_between_calls_as_plain_serving_does():
    """TensorRT-speed BERT-base (its A100 tables, timed) served plain on a one-core server at 908
    Poisson answers/s, 1.7 rows a call: the instance sat idle 240 us a request more than such
    arrivals explain, mostly Triton's hand-off from one call to the next. Counted for plain
    alone, it made plain's predicted wait the longer one and sent the model to the pipeline,
    which answered in 3.1 ms where plain had in 2.3 (issue 38's check at 5d4520c). But where the
    pipeline's ``execute`` waits for stage 0 (the CPU caps it, ``waits``), its calls hold the
    instance one after another too, each with that hand-off: counted for both, it stays plain."""
    from tools.lib.paths import ROOT
    from tools.lib.timed import from_profile

    manifest = from_profile(ROOT / "docs" / "profiles" / "bert_base_trt_a100_2stages.json")[1]
    tables, whole = [s.latency for s in manifest.stages], manifest.fused().stages[0].latency
    costs = HostCosts(pipeline_batch_s=321e-6, pipeline_request_s=62e-6, plain_batch_s=155e-6, plain_request_s=19e-6,
                      handoff_s=4e-6)
    took, idle = 807e-6, 941e-6  # a call's time inside execute (the whole model and the stub), and the idle before it
    window = Window(1.0, 908, 534 * 187e-6, 908 * 330e-6, (0.1, 0.1), 1.7, execute_s=534 * took, executes=534,
                    idle_s=534 * idle, longest_idle_s=3 * idle)
    assert round_trip_s(window) == pytest.approx(240e-6, rel=0.05)
    for waits, then in ((False, Mode.PIPELINE), (True, None)):
        switch = ModeSwitch(tables, costs, cores=1, mode=Mode.FUSED, whole=whole, entry_waits=waits)
        switch.server_at = {Mode.PIPELINE: {0: 426e-6}, Mode.FUSED: {0: 330e-6}}
        assert _decides(switch, window) is then, switch.last


def test_the_entry_tries_returning_at_once_where_waiting_leaves_the_host_room_and_keeps_what_answers_more():
    """Three timed stages of 0.7 ms for one query, pipelined on a one-core server (issue 38's
    held-out check). At 16 in flight, waiting for stage 0 left the host 70 % busy at 1,630
    answers/s: after two such windows the entry tries returning at once, which answered 1,834
    (a closed loop sends more when answered sooner): kept, and it stays so at 83-90 % busy. At
    64 in flight returning at once saturates the host at 2,700 answers/s: the entry waits after
    two windows, and at that load tries no more even where the host reads under 85 % (it did
    85-91 % waiting); at a load clearly lighter it tries again. Under an open load of 1,300/s
    returning at once answers no more (the arrivals' rate): it waits again, and tries no more
    until the load moves. A window not served pipelined, or with too few answers (None), breaks
    a run of two."""
    entry = EntryWait(waits=True)
    assert entry.observe(0.70, 1630) is None and entry.waits
    assert entry.observe(None) is None  # a window served plain between the two
    assert entry.observe(0.70, 1630) is None
    assert entry.observe(0.70, 1630) is False and not entry.waits
    assert "a trial: the host 70% busy waiting for stage 0 at 1630 answers/s, under 85%" in entry.last
    assert entry.observe(0.83, 1820) is None and entry.observe(0.84, 1848) is False and not entry.waits
    assert "answered 1834/s where waiting for stage 0 answered 1630" in entry.last
    assert entry.observe(0.83, 1834) is None and entry.observe(0.90, 1834) is None and not entry.waits
    assert entry.observe(1.02, 2700) is None and entry.observe(0.97, 2700) is True and entry.waits
    assert "97% busy returning at once at 2700 answers/s, at or past 95%" in entry.last
    assert all(entry.observe(0.80, 2600) is None for _ in range(3)) and entry.waits  # the same load
    assert entry.observe(0.60, 1300) is None and entry.observe(0.60, 1300) is False  # a lighter one: a trial
    assert entry.observe(0.66, 1302) is None and entry.observe(0.66, 1298) is True and entry.waits
    assert "answered 1300/s where waiting for stage 0 answered 1300: not 5% more" in entry.last
    assert all(entry.observe(0.60, 1310) is None for _ in range(3)) and entry.waits
    assert entry.observe(0.35, 700) is None and entry.observe(0.35, 700) is False  # the load moved
    entry = EntryWait(waits=True)  # an open load of 700/s starting: its first window is no baseline
    assert entry.observe(0.30, 380) is None and entry.observe(0.58, 694) is None and entry.waits
    assert entry.observe(0.58, 700) is False and "at 700 answers/s" in entry.last
    assert entry.observe(0.60, 657) is None and entry.observe(0.60, 700) is True and entry.waits
    entry = EntryWait(waits=True)  # a closed loop of 16 that moves during a trial: no verdict
    assert entry.observe(0.70, 1630) is None and entry.observe(0.70, 1630) is False
    assert entry.observe(0.83, 1834) is None and entry.observe(0.5, 939) is None and not entry.waits
    assert entry.observe(0.5, 941) is True and entry.waits and "ended with its load: 939/s after 1834/s" in entry.last
    assert entry.observe(0.70, 1630) is None and entry.observe(0.70, 1630) is False  # free to try again
    assert entry.observe(None) is None and not entry.waits and "paused" in entry.last  # ... and one that stops


def test_a_trial_of_returning_at_once_cut_by_its_loads_end_resumes_with_the_next():
    """Three 0.7 ms stages at 16 in flight in rounds of 3.5 s, waiting for stage 0 from loading:
    each round tried returning at once 2 s in, and the round's end cut the trial (its last window
    a load ending, then none), which then waited again for the model's life (0.86x-0.95x the
    forced pipeline, as logged: docs/results/check-process-lives). Now the entry goes on
    returning at once through the pause, skips the next load's first window (a load starting),
    and runs the trial's windows again against the same baseline: kept where they answer more.
    A second pause before the load is back changes nothing; a trial once paused is decided as
    any other (not kept at the same answers)."""
    entry = EntryWait(waits=True)
    assert entry.observe(0.66, 1746, 9.5e-3) is None and entry.observe(0.66, 1746, 9.5e-3) is False
    assert entry.observe(0.80, 1900, 8.4e-3) is None and entry.observe(0.3, 279, 8.1e-3) is None
    assert entry.observe(None) is None and entry.observe(None) is None and not entry.waits
    assert entry.last == ("a trial of returning at once paused with its load: 279/s in 8.10 ms a request after "
                          "1900/s in 8.40 ms a request, until the next one")
    assert entry.observe(0.5, 900, 8.0e-3) is None and not entry.waits  # the load starting: skipped
    assert entry.observe(0.80, 1890, 8.4e-3) is None and entry.observe(0.80, 1910, 8.4e-3) is False
    assert not entry.waits and "returning at once answered 1900/s where waiting for stage 0 answered 1746" in entry.last
    entry = EntryWait(waits=True)
    assert entry.observe(0.66, 1746, 9.5e-3) is None and entry.observe(0.66, 1746, 9.5e-3) is False
    assert entry.observe(0.70, 1750, 9.5e-3) is None and entry.observe(None) is None and not entry.waits
    assert entry.observe(0.4, 800, 9.0e-3) is None and entry.observe(0.70, 1750, 9.5e-3) is None
    assert entry.observe(0.70, 1748, 9.5e-3) is True and entry.waits and "not 5% more" in entry.last

    entry = EntryWait(waits=True)  # the load stopped and started again within a window: not a load that moved
    assert entry.observe(0.66, 1746, 9.5e-3) is None and entry.observe(0.66, 1746, 9.5e-3) is False
    assert entry.observe(0.80, 1900, 8.4e-3) is None and entry.observe(0.3, 279, 8.1e-3) is None
    assert entry.observe(0.6, 1100, 8.3e-3, paused=True) is None and not entry.waits
    assert entry.last == "a trial of returning at once paused: its load stopped and started again at 1100/s"
    assert entry.observe(0.80, 1890, 8.4e-3) is None and entry.observe(0.80, 1910, 8.4e-3) is False
    assert not entry.waits and "answered 1900/s" in entry.last, entry.last


def test_returning_at_once_kept_by_a_trial_holds_for_that_load_alone():
    """Six timed 1 ms stages on a one-core server (a held-out profile): at 1 in flight a trial of
    returning at once answered 145/s where waiting had answered 136 and was kept; at 16 in flight,
    the host unsaturated, it had then stayed so at 0.87x the forced pipeline, which waited. Now
    two windows at a load moved by more than ``SWITCH_GAIN`` from the trial's make the entry wait
    again, free to try at the new load, where returning at once answers less: it waits. A load
    within ``SWITCH_GAIN`` of the trial's keeps it, and so does the same load starting again after
    a pause: the windows of a load starting are not at one rate."""
    entry = EntryWait(waits=True)
    assert entry.observe(0.14, 136) is None and entry.observe(0.14, 136) is False
    assert entry.observe(0.15, 144) is None and entry.observe(0.15, 146) is False and not entry.waits
    assert entry.observe(0.16, 150) is None and entry.observe(0.16, 155) is None and not entry.waits
    assert entry.observe(None) is None and entry.observe(0.05, 40) is None and entry.observe(0.09, 90) is None
    assert entry.observe(0.15, 143) is None and entry.observe(0.15, 146) is None and not entry.waits
    assert entry.observe(0.70, 800) is None and entry.observe(0.72, 810) is True and entry.waits
    assert "kept at 145 answers/s and the load moved to 810" in entry.last
    assert entry.observe(0.75, 950) is None and entry.observe(0.75, 950) is False  # a trial at this load
    assert entry.observe(0.80, 850) is None and entry.observe(0.80, 860) is True and entry.waits
    assert "not 5% more" in entry.last
    assert all(entry.observe(0.75, 950) is None for _ in range(3)) and entry.waits


def test_returning_at_once_kept_holds_where_the_same_requests_in_the_model_are_answered_sooner():
    """Three 0.7 ms stages at 16 in flight (``docs/profiles/mid_3stages.json``, the figures as
    logged): waiting for stage 0 answered 1,548/s in 9.75 ms a request, a trial of returning at
    once 1,591/s in 9.16 ms, kept. Served so, the closed loop then answered 1,888/s in 8.0 ms: as
    many requests in the model (15 against 14.6), the same load answered sooner, where answers/s
    alone read a load moved by 19 %, waited again, tried again, and round after round did so
    (``auto`` 0.96x [0.90, 1.02] the forced pipeline after 18 rounds: docs/results/entry-wait-kept-load).
    It keeps returning at once; 64 in flight, as many answers/s with four times the requests in
    the model, is another load, and it waits."""
    entry = EntryWait(waits=True)
    assert entry.observe(0.78, 1512, 9.75e-3) is None and entry.observe(0.78, 1512, 9.75e-3) is False
    assert entry.observe(0.80, 1591, 9.16e-3) is None and entry.observe(0.80, 1591, 9.16e-3) is False
    assert not entry.waits and "kept" not in entry.last and "9.16 ms" in entry.last, entry.last
    assert all(entry.observe(0.82, 1888, 8.0e-3) is None for _ in range(4)) and not entry.waits
    assert entry.observe(0.83, 1900, 33e-3) is None and entry.observe(0.83, 1900, 33e-3) is True and entry.waits
    assert "kept at 1591 answers/s and the load moved to 1900" in entry.last, entry.last


def test_the_windows_of_a_trial_of_returning_at_once_learn_costs_but_switch_nothing():
    """``EntryWait`` tries returning at once: Triton's batches shrink meanwhile (three uneven
    timed stages at 64 in flight: 9.3 rows a run where waiting formed 17), and the pipeline they
    show is not the one that serves after the trial. In the setting where plain answers sooner
    (two 1 ms stages, the pipeline's stub three times the plain path's), two windows of a trial
    switch nothing and their costs are learnt; a window after the trial does not pair with
    them, the next one does."""
    manifest = timed_manifest([flat(1.0)] * 2)
    switch = ModeSwitch([s.latency for s in manifest.stages],
                        HostCosts(pipeline_request_s=900e-6, plain_request_s=300e-6), cores=4)
    entry = EntryWait(waits=True)
    assert entry.observe(0.5, 1000) is None and entry.observe(0.5, 1000) is False and entry.trying
    dearer = _window(1.1, (0.125, 0.125), server_s=0.1)
    assert switch.observe(dearer, trial=entry.trying) is None and entry.observe(0.5, 1000) is None
    assert switch.observe(dearer, trial=entry.trying) is None and entry.observe(0.5, 1000) is True
    assert not entry.trying  # not 5 % more: waits again
    assert switch.excess[Mode.PIPELINE][0] == pytest.approx(200e-6) and switch.server[Mode.PIPELINE] > 0
    assert switch.observe(_window(0.9, (0.125, 0.125)), trial=entry.trying) is None
    assert switch.observe(_window(0.9, (0.125, 0.125)), trial=entry.trying) is Mode.IN_TURN


def test_a_way_served_at_batch_sizes_far_apart_is_costed_by_its_own_line():
    """Three uneven timed stages on one core, plain held from 1 to 64 in flight
    (docs/results/served-cost-lines): loading measured the plain path at 75 us a batch and 10 a
    request, the pipeline at 739 and 134, and plain served at about 314 and 106. At 1 in flight
    (420 us a request) plain's excess over loading's, 335 us, is added to each way's request (the
    pipeline, not seen yet, is taken to be as far off). Seen again at 45 rows a run (113 us a
    request), plain is costed by the line through the two, 314 + 106, and the pipeline by
    loading's and the excess plain shows now, 101 us. A pipelined window whose batches mostly
    ran inline (``LoneRuns``) shows plain serving's costs as much as the pipeline's: it draws
    neither way's line, and what it shows beyond loading's costs in those shares is plain's
    excess at most."""
    tables = [s.latency for s in _profile("uneven_3stages").stages]
    costs = HostCosts(pipeline_batch_s=739e-6, pipeline_request_s=134e-6, plain_batch_s=75e-6, plain_request_s=10e-6,
                      how="measured")
    switch = ModeSwitch(tables, costs, cores=1, mode=Mode.IN_TURN)
    switch.observe(Window(1.0, 240, 240 * 420e-6, None, (0.1, 0.1, 0.1), 1.0))
    assert (switch.costs.plain_request_s, switch.costs.pipeline_request_s) == (pytest.approx(345e-6),
                                                                               pytest.approx(469e-6))
    switch.observe(Window(1.0, 1500, 1500 * 113e-6, None, (0.5, 0.5, 0.5), 45.0))
    assert (switch.costs.plain_batch_s, switch.costs.plain_request_s) == (pytest.approx(314e-6, rel=0.01),
                                                                          pytest.approx(106e-6, rel=0.01))
    assert switch.costs.pipeline_request_s == pytest.approx(134e-6 + 113e-6 - (75e-6 / 45 + 10e-6))
    assert switch.costs.pipeline_batch_s == 739e-6 and "plain as served" in switch.costs.how

    pipelined = ModeSwitch(tables, costs, cores=1)
    bound = 400e-6 - (200 / 240 * (75e-6 + 10e-6) + 40 / 240 * (739e-6 + 134e-6))  # 184 us
    pipelined.observe(Window(1.0, 240, 240 * 400e-6, None, (0.1, 0.1, 0.1), 1.0, inline=200))
    assert not pipelined.lines and Mode.PIPELINE not in pipelined.excess and bound > 0
    assert (pipelined.costs.pipeline_request_s, pipelined.costs.plain_request_s) == (134e-6, 10e-6)  # within it


def test_a_served_line_needs_batch_sizes_apart_and_puts_no_cost_below_zero():
    """``ServedLine``: no line from windows at about one batch size; where the seconds a request
    do not fall with the batch size, all of them are a request's; where they fall faster than a
    batch's cost explains, all are a batch's; each half octave counts as the median of its latest
    windows (one that held other work moves nothing)."""
    line = ServedLine()
    line.add(10.0, 100e-6)
    line.add(16.0, 90e-6)
    assert line.fit() is None
    line.add(40.0, 110e-6)
    assert line.fit() == (0.0, pytest.approx(100e-6))
    steep = ServedLine()
    steep.add(1.0, 500e-6)
    steep.add(10.0, 10e-6)
    batch_s, request_s = steep.fit()
    assert request_s == 0.0 and batch_s == pytest.approx((500e-6 + 0.1 * 10e-6) / (1 + 0.01))
    for seconds in (900e-6, 800e-6, 700e-6, 600e-6):
        steep.add(1.0, seconds)
    assert steep.fit() == (pytest.approx((700e-6 + 0.1 * 10e-6) / 1.01), 0.0)  # the median of 800, 700, 600


def test_a_trial_ends_at_its_first_window_that_answers_clearly_less():
    """``Trial``: kept after two windows at 5 % more than the way before; a window 15 % short of
    it ends the trial at once, not kept (the way tried carries less, or the load fell)."""
    assert Trial(1000.0).take(840.0) is False
    trial = Trial(1000.0)
    assert trial.take(900.0) is None and trial.take(1300.0) is True
    trial = Trial(1000.0)
    assert trial.take(1040.0) is None and trial.take(1040.0) is False
    # An open load answers as many either way: a window answered 15 % later, as measured, ends it too.
    assert Trial(1000.0, 5e-3).take(1010.0, 5.8e-3) is False
    assert Trial(1000.0, 5e-3).take(1010.0, 5.7e-3) is None and Trial(1000.0, None).take(1010.0, 9e-3) is None
    assert Trial(1000.0, 5e-3).take(1060.0, 5.8e-3) is None  # answered more: a closed loop taking hold


def test_a_trial_window_holding_twice_the_requests_in_the_model_is_falling_behind_whatever_it_answered():
    """TensorRT speed over HTTP under Poisson 3,120/s, as logged (docs/results/trial-in-model): plain
    at 3,102 answers/s in 2.67 ms a request (8 in the model) tried the pipeline, whose first window
    answered 3,590/s, each request in 29.8 ms (107 in the model): more answers, read as a closed
    loop taking hold, kept it running for two windows more. Twice the requests in the model is an
    open load queueing on the way tried: it ends the trial at once. A closed loop answered sooner
    holds as many (16 in flight: 1,000/s in 16 ms, then 1,100/s in 14.5), and goes on."""
    trial = Trial(3102.0, 2.67e-3)
    assert trial.take(3590.0, 29.84e-3) is False
    assert trial.refused == "2x the requests in the model or more: falling behind"
    assert Trial(1000.0, 16e-3).take(1100.0, 14.5e-3) is None
    assert Trial(3102.0, None).take(3590.0, 29.84e-3) is None  # the way before unmeasured: nothing to hold it to


def test_the_host_the_entry_reads_is_the_switchs_own_utilisation_of_the_window():
    """``ModeSwitch.host_busy``: the stub's interpreter, or the cores with tritonserver's CPU (as
    the window showed it, learnt in ``observe``) and the other processes there; None for a
    window with too few answers."""
    manifest = timed_manifest([flat(0.7)] * 3, max_batch_size=64)
    switch = ModeSwitch([s.latency for s in manifest.stages], HostCosts(pipeline_request_s=200e-6), cores=1)
    window = Window(1.0, 1600, 1600 * 230e-6, 1600 * 200e-6, (0.5, 0.5, 0.5), 5.0, others_s=0.05)
    switch.observe(window)
    assert switch.host_busy(window) == pytest.approx(0.368 + 0.32 + 0.05)
    assert switch.host_busy(dataclasses.replace(window, answered=5)) is None


def test_a_configured_policys_switch_reads_the_host_and_never_changes_the_way():
    """Under a configured policy the switch is ``pinned``: a pipeline whose stub costs three
    times the plain path's, which ``auto`` leaves for plain, stays pipelined window after window,
    while ``host_busy`` reads each window as the unpinned switch does (``EntryWait`` decides
    whether its ``execute`` waits from it)."""
    manifest = timed_manifest([flat(1.0)] * 2)
    tables, costs = [s.latency for s in manifest.stages], HostCosts(pipeline_request_s=900e-6, plain_request_s=300e-6)
    window = _window(0.9, (0.125, 0.125), server_s=0.1)
    assert _decides(ModeSwitch(tables, costs, cores=4), window) is Mode.IN_TURN
    pinned, free = ModeSwitch(tables, costs, cores=4, pinned=True), ModeSwitch(tables, costs, cores=4)
    assert all(pinned.observe(window) is None for _ in range(4)) and pinned.mode is Mode.PIPELINE
    assert pinned.trying is None
    free.observe(window)
    assert pinned.host_busy(window) == pytest.approx(free.host_busy(window)) == pytest.approx(0.9)


def test_a_pipeline_does_not_shorten_the_round_trip_so_where_it_is_all_the_cycle_plain_stays():
    """Near-zero stages, 64 in flight served plain on a one-core server: 1,750 answers/s in
    batches of 50, ``execute`` busy 8 % of the time, and idle 26 ms before each batch: a round
    trip of 526 us a request, 92 % of the window. The instance is saturated, but a pipeline would
    not shorten the round trip that fills it, only overlap it with the engines, which here have
    nothing to do: the round trip's share caps it too, and it is not clearly less busy (92 %,
    where its stub costs alone predict 83 %): the switch does not pipeline on that (it switched,
    and the pipeline answered 1,200/s where plain had answered 1,752) but tries it; the first
    window of the trial, at 1,200/s, 15 % short of plain's, sends it back plain at once (a
    second would cost as much again), and at that load it tries no more."""
    manifest = timed_manifest([flat(0.01)] * 2, max_batch_size=64)
    costs = HostCosts(pipeline_batch_s=665e-6, pipeline_request_s=121e-6, plain_batch_s=25e-6, plain_request_s=14e-6)
    window = Window(1.0, 1750, 1750 * 14.5e-6, 1750 * 276e-6, (0.0004, 0.0004), 50.0, execute_s=0.08, executes=35,
                    idle_s=0.92, longest_idle_s=0.92 / 35)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    assert _decides(switch, window) is Mode.PIPELINE and switch.trying is not None
    assert "a trial, plain at capacity" in switch.last and "(92% busy)" in switch.last
    assert "526 us a request's round trip" in switch.last
    tried = dataclasses.replace(window, answered=1200, stub_s=1200 * 121e-6, execute_s=0.0, executes=0, idle_s=0.0)
    assert switch.observe(tried) is Mode.IN_TURN
    assert "answered 1200/s where plain answered 1750: not 5% more" in switch.last and switch.trying is None
    assert _decides(switch, window) is None and _decides(switch, window) is None


def test_the_mode_switch_weighs_tritonserver_by_what_each_way_cost_it_when_served_that_way():
    """Two stages of 1 ms a batch on a one-core host, served plain at 3,000 answers/s in batches
    of 8: the engines are 75 % busy one after another, and tritonserver took 90 us a request.
    Pipelined, the slower stage would be 38 % busy, and with tritonserver at 90 us the core 53 %:
    a switch that has only seen plain serving pipelines. But a pipelined answer is a ``send()`` of
    its own, which cost tritonserver 250 us a request when the model last pipelined (on this CPU
    2-3x an answer in ``execute``'s list: docs/results/send-cost-2core): the core would be
    saturated, and the switch that saw it stays plain."""
    manifest = timed_manifest([flat(1.0)] * 2)
    costs = HostCosts(pipeline_batch_s=200e-6, pipeline_request_s=60e-6, plain_batch_s=100e-6, plain_request_s=30e-6)
    plain = _window(3000 * 42.5e-6, (0.375, 0.375), answered=3000, server_s=3000 * 90e-6)
    unseen = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    assert _decides(unseen, plain) is Mode.PIPELINE
    seen = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1)
    seen.observe(_window(700 * 85e-6, (0.0875, 0.0875), answered=700, server_s=700 * 250e-6))
    seen.mode = Mode.IN_TURN
    assert _decides(seen, plain) is None
    assert "250 us a request pipelined" in seen.last and "90 us a request plain" in seen.last


def test_a_sight_of_the_other_way_at_another_load_is_scaled_as_the_way_served_now_changed_since():
    """tritonserver's cost a request falls as a call brings more requests. At TensorRT speed,
    requests of 8 rows, the pipeline cost it 652 us a request at 1 in flight (400 answers/s);
    plain serving 500 there and 340 at 8 in flight (940/s). The pipeline's sight is taken as
    plain's changed since: 652 x 340 / 500 = 443 us, where it cost 406 (carried as it was, it
    had the pipeline predicted overloaded, and the switch waited two rounds to pipeline). Where
    the way served now was never seen at the other's load, the sight stands (a pipelined answer
    costs tritonserver more than a listed one at any load)."""
    manifest = timed_manifest([flat(1.0)] * 2, max_batch_size=64)
    costs = HostCosts(pipeline_request_s=100e-6, plain_request_s=30e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1)
    switch.observe(Window(1.0, 400, 0.04, 400 * 652e-6, (0.4, 0.4), 1.0))
    switch.mode = Mode.IN_TURN
    switch.observe(Window(1.0, 400, 0.012, 400 * 500e-6, (0.4, 0.4), 1.0))
    switch.observe(Window(1.0, 940, 0.03, 940 * 340e-6, (0.19, 0.19), 5.0))
    assert "tritonserver 443 us a request pipelined, 340 us a request plain" in switch.last
    unseen = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1)
    unseen.observe(Window(1.0, 400, 0.04, 400 * 652e-6, (0.4, 0.4), 1.0))
    unseen.mode = Mode.IN_TURN
    unseen.observe(Window(1.0, 940, 0.03, 940 * 340e-6, (0.19, 0.19), 5.0))
    assert "tritonserver 652 us a request pipelined, 340 us a request plain" in unseen.last


def test_a_sight_of_the_other_way_at_another_load_never_makes_a_pipelined_request_cheaper_for_tritonserver():
    """One core, near-zero stages. Pipelined in a light first second, tritonserver took 150 us a
    request; served plain later, overloaded, it takes 320 us (3,000 answers/s, 64 rows a run).
    Read as it was, the stale 150 us would predict the pipeline 75 % busy, clearly less, and
    switch to a pipeline that carries less (a pipelined answer is a ``send()`` of its own, which
    costs tritonserver as much as an answer in ``execute``'s list or more): taken at no less than
    the 320 us plain serving shows now, it is overloaded too, and the mode stays. The other way
    round, a plain sight of 500 us taken overloaded is read as no more than the 200 us a
    request the pipeline shows now."""
    manifest = timed_manifest([flat(0.01)] * 2)
    costs = HostCosts(pipeline_request_s=100e-6, plain_request_s=20e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1)
    switch.observe(_window(0.1, (0.01, 0.01), answered=1000, rows=50.0, server_s=1000 * 150e-6))
    switch.mode = Mode.IN_TURN
    overloaded = _window(0.06, (0.01, 0.01), answered=3000, rows=64.0, server_s=3000 * 320e-6)
    assert _decides(switch, overloaded) is None, switch.last
    assert switch._server_s(Mode.PIPELINE) == pytest.approx(320e-6)
    switch.server_at.update({Mode.IN_TURN: {0: 500e-6}, Mode.PIPELINE: {0: 200e-6}})  # seen at one load
    switch.mode = Mode.PIPELINE
    assert switch._server_s(Mode.IN_TURN) == pytest.approx(200e-6)


def test_near_capacity_the_other_way_is_weighed_as_busier_by_the_models_error():
    """Served plain on one core at 2,000 answers/s, 64 rows a run: the stub (180 us a request)
    and tritonserver (317 us) keep the core 99.4 % busy, a finite but long wait. A pipeline whose
    stub costs 168 us a request would be predicted 97 % busy, and its shorter bottleneck would
    predict a far shorter wait; but its host is a prediction from costs measured elsewhere,
    within the model's error, and 97 % is within it of capacity: the mode stays (the near-zero
    profile switched so and back 1.5 s later, its pipeline overloaded). A pipeline at 50 us a
    request, predicted 73 %, is clearly less busy: the switch pipelines."""
    manifest = timed_manifest([flat(0.01)] * 2)
    window = _window(2000 * 180e-6, (0.01, 0.01), answered=2000, rows=64.0, server_s=2000 * 317e-6)
    for pipeline_request_s, switched in ((168e-6, None), (50e-6, Mode.PIPELINE)):
        costs = HostCosts(pipeline_request_s=pipeline_request_s, plain_request_s=180e-6)
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
        assert _decides(switch, window) is switched, switch.last


def test_an_overloaded_way_gives_way_only_to_one_that_would_be_clearly_less_busy():
    """Served plain on one core at 10,000 answers/s, ten rows a run: the stub (30 us a request)
    and tritonserver (71 us) keep the core 101 % busy, overloaded, so those answers are the plain
    way's capacity and the load may be more. The pipeline, predicted at that rate 98 % busy (its
    stub 27 us a request), would carry no more within the model's error (it switched before, and
    back within seconds, docs/results/check-auto-client-core): it is tried, and kept where its
    two windows answer 5 % more. With a stub that cost it nothing it would be 71 % busy, clearly
    less: the switch pipelines, no trial."""
    manifest = timed_manifest([flat(0.01)] * 2)
    window = _window(0.3, (0.01, 0.01), answered=10000, rows=10.0, server_s=0.71)
    for pipeline_request_s, on_trial in ((27e-6, True), (0.0, False)):
        costs = HostCosts(pipeline_request_s=pipeline_request_s, plain_request_s=30e-6)
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
        assert _decides(switch, window) is Mode.PIPELINE and (switch.trying is not None) is on_trial, switch.last
    tried = _window(0.3, (0.01, 0.01), answered=10600, rows=10.0, server_s=0.75)
    switch = ModeSwitch([s.latency for s in manifest.stages], HostCosts(pipeline_request_s=27e-6,
                        plain_request_s=30e-6), cores=1, mode=Mode.IN_TURN)
    assert _decides(switch, window) is Mode.PIPELINE
    assert switch.observe(tried) is None and switch.observe(tried) is Mode.PIPELINE  # 6 % more: kept
    assert switch.trying is None
    assert switch.last == "a trial pipelined answered 10600/s where plain answered 10000: kept"


def test_a_load_at_capacity_is_tried_again_after_a_pause_or_with_a_longer_queue():
    """Served plain at capacity, the pipeline predicted a little less busy is tried once a load
    (``ModeSwitch._another_load``). A trial whose load stops within it pauses, serving the way
    tried, and runs its windows on the next load (ResNet-50's stages from an H200 on one core: 16
    in flight at 12 rows a run, then 64 at 16, both at plain's capacity, where the forced pipeline
    answered 1.13x as many). A load that answers as many a second but gathers a longer queue is
    another, tried afresh. A trial that failed holds at that load, across a pause too: MiniLM's
    one stage under Poisson 3,216/s, plain 100 % busy, tried the pipeline after every pause
    between a check's rounds, refused each time (docs/results/check-held-out-rest)."""
    manifest = timed_manifest([flat(0.01)] * 2)
    costs = HostCosts(pipeline_request_s=27e-6, plain_request_s=30e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    sixteen = _window(0.3, (0.01, 0.01), answered=10000, rows=11.5, server_s=0.71)
    assert _decides(switch, sixteen) is Mode.PIPELINE and switch.trying is not None
    assert switch.observe(_window(0.0, (0.0, 0.0), answered=3)) is None  # the load stopped: the trial pauses
    assert switch.mode is Mode.PIPELINE and switch.trying is not None
    assert switch.last == "a trial pipelined paused with its load, until the next one"
    sixty_four = dataclasses.replace(sixteen, rows=16.0)
    more = dataclasses.replace(sixty_four, answered=11300, stub_s=11300 * 27e-6, server_s=11300 * 71e-6)
    assert switch.observe(more) is None and switch.observe(more) is Mode.PIPELINE  # the next load keeps it
    assert switch.trying is None and switch.last.endswith("where plain answered 10000: kept"), switch.last
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    assert _decides(switch, sixty_four) is Mode.PIPELINE and switch.trying is not None
    short = dict(answered=8000, stub_s=8000 * 27e-6, server_s=8000 * 71e-6)  # as dear a request as predicted
    assert switch.observe(dataclasses.replace(sixty_four, **short)) is Mode.IN_TURN  # ... but it carries less
    assert _decides(switch, sixty_four) is None and _decides(switch, sixteen) is None  # within twice SWITCH_GAIN
    assert _decides(switch, dataclasses.replace(sixteen, rows=8.0)) is Mode.PIPELINE  # a shorter queue
    switch.observe(dataclasses.replace(sixteen, rows=8.0, **short))
    assert _decides(switch, dataclasses.replace(sixteen, rows=8.0)) is None
    switch.observe(_window(0.0, (0.0, 0.0), answered=3))  # a pause
    assert _decides(switch, dataclasses.replace(sixteen, rows=8.0)) is None and switch.trying is None, switch.last
    assert _decides(switch, dataclasses.replace(sixteen, rows=5.0)) is Mode.PIPELINE  # ... but another load is


def test_a_load_at_capacity_is_another_where_the_requests_in_the_model_move_not_its_rows_a_run():
    """Served plain at capacity under an open load, the rows a run move with the host's speed:
    TensorRT speed under Poisson 2,208/s, plain 94-98 % busy in runs of 3.2 to 4.8 rows, each
    answered in 2.1-3.3 ms, tried the pipeline five times in six rounds, each refused (8 ms a
    request pipelined; docs/results/calibration-whole-batches). The requests in the model
    (Little's law: answers/s times their measured latency) moved 1.5x at most: not another load.
    A closed loop four times as deep at the same answers/s is (16 to 64 in flight)."""
    manifest = timed_manifest([flat(0.01)] * 2)
    costs = HostCosts(pipeline_request_s=27e-6, plain_request_s=30e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)

    def plain(rows: float, took_ms: float) -> Window:
        return Window(1.0, 10000, 0.3, 0.71, (0.01, 0.01), rows, 0.99, round(10000 / rows), 0.01, 0.001,
                      returned=10000, returned_s=10000 * took_ms / 1000)

    first, faster, deeper = plain(3.3, 2.1), plain(4.8, 3.2), plain(4.8, 8.4)
    assert 1.4 < measured_s(faster) / measured_s(first) < 1.6 and measured_s(deeper) / measured_s(first) > 3
    assert _decides(switch, first) is Mode.PIPELINE and switch.trying is not None
    later = Window(1.0, 8000, 8000 * 27e-6, 0.57, (0.01, 0.01), 3.3)  # the pipeline carries less
    assert switch.observe(later) is Mode.IN_TURN and switch.last.endswith("not 5% more"), switch.last
    assert _decides(switch, faster) is None and switch.trying is None, "rows a run 45 % more: the same load"
    assert _decides(switch, deeper) is Mode.PIPELINE and switch.trying is not None, switch.last


def test_a_trial_cut_by_its_load_moving_is_tried_again_after_a_pause_not_while_the_load_goes_on():
    """TensorRT speed at 64 in flight on this project's 2-core host: plain at capacity, 3,696
    answers/s in 17.43 ms a request (64 in the model), tried the pipeline, whose first window
    answered 2,780/s in 15.14 ms (42 in the model as measured: the rest waited on the host's cores
    for the pipelined answers' sends). That reads as a load that fell, and the trial ends saying
    nothing; but the load went on, and was tried again every 4 s (docs/results/calibration-whole-
    batches). Now the trial ends once the window after shows the load went on, and its load is
    tried again once a pause shows it stopped."""
    manifest = timed_manifest([flat(0.01)] * 2)
    costs = HostCosts(pipeline_request_s=27e-6, plain_request_s=30e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
    plain = Window(1.0, 10000, 0.3, 0.71, (0.01, 0.01), 40.0, 0.99, 250, 0.01, 0.001,
                   returned=10000, returned_s=10000 * 6.4e-3)
    assert _decides(switch, plain) is Mode.PIPELINE and switch.trying is not None
    cut = Window(1.0, 7500, 7500 * 27e-6, 0.53, (0.01, 0.01), 10.0, 0.5, 750, 0.5, 0.001,
                 piped=7500, piped_s=7500 * 4e-3)
    assert measured_s(cut) < 0.95 * measured_s(plain)
    assert switch.observe(cut) is None and switch.mode is Mode.PIPELINE  # a load that fell, or one carried less
    assert switch.observe(cut) is Mode.IN_TURN and "ended with its load" in switch.last, switch.last  # it went on
    assert _decides(switch, plain) is None and switch.trying is None, "the same load goes on"
    switch.observe(Window(1.0, 3, 0.0, None, (0.0, 0.0), 1.0))  # a pause: the load stopped
    assert _decides(switch, plain) is Mode.PIPELINE and switch.trying is not None, switch.last


def test_a_plain_instance_busy_all_the_time_is_tried_against_the_pipeline_not_left_for_it():
    """MiniLM's six FP16 stages from an H100 (a profile no check had run), served plain on a
    one-core server under a Poisson load of about 1,000 answers/s: 4 rows a call, the instance
    busy 98 % of the time, idle 260 us a request between calls beyond what such arrivals explain
    (Triton's hand-off from one call to the next). That reads as a closed loop at plain's
    capacity, and the pipeline, predicted 79 % busy, was switched to at once; under the open load
    it answered what arrived, in 10.8 ms where the plain model took 7.3, and tried plain, and
    switched back and forth (docs/results/check-minilm-fp16-six). A loop is a guess at the load's
    kind: the pipeline is tried, and where it answers no more than plain did, plain stays at that
    load, however much less busy the pipeline is predicted (the windows as logged)."""
    manifest = _profile("minilm_h100_fp16_6stages")
    tables, whole = [s.latency for s in manifest.stages], manifest.fused().stages[0].latency
    costs = HostCosts(pipeline_batch_s=1309e-6, pipeline_request_s=63e-6, plain_batch_s=541e-6,
                      plain_request_s=59e-6, handoff_s=293e-6)
    plain = Window(1.0, 1002, 0.191, 0.27, (0.0065, 0.0035, 0.0022, 0.0017, 0.0016, 0.631), 4.04, 0.725, 248, 0.278,
                   0.005, 0.059)
    tried = [Window(1.0, 1032, 0.553, 0.33, (0.40, 0.31, 0.27, 0.30, 0.28, 0.32), 2.65, 0.695, 390, 0.305, 0.009),
             Window(1.0, 940, 0.513, 0.32, (0.37, 0.29, 0.24, 0.27, 0.25, 0.28), 2.71, 0.633, 347, 0.368, 0.063, 0.037)]
    later = Window(1.0, 1079, 0.155, 0.24, (0.0054, 0.0035, 0.0019, 0.0016, 0.0014, 0.700), 3.92, 0.784, 275, 0.217,
                   0.006, 0.015)
    switch = ModeSwitch(tables, costs, cores=1, mode=Mode.FUSED, whole=whole)
    switch.server_at = {Mode.PIPELINE: {0: 340e-6}, Mode.FUSED: {0: 269e-6}}
    assert switch.observe(plain) is None and switch.observe(plain) is Mode.PIPELINE
    assert switch.trying is not None and switch.last.startswith("a trial, plain at capacity"), switch.last
    assert [switch.observe(window) for window in tried] == [None, Mode.FUSED]
    assert switch.last == "a trial pipelined answered 986/s where plain answered 1002: not 5% more"
    assert [switch.observe(later) for _ in range(4)] == [None] * 4 and switch.trying is None, switch.last
    assert "pipelined (81% busy)" in switch.last and "plain (98%" in switch.last


def test_a_model_that_takes_one_request_a_call_busy_all_the_time_is_tried_against_the_pipeline():
    """``max_batch_size`` 1, four stages of 2 ms: a call holds one request however many wait, so
    its calls show no queue (``beyond_first``: random arrivals bring none beyond the first
    either), and 16 in flight served plain, 96 % busy at 117 answers/s, read as a lone request's
    loop answered in 8 ms: it stayed plain where the pipeline answered 403/s (0.29x), and a
    Poisson load of 200/s waited a second a request. An instance busy all the time is at its
    capacity whatever the load: the pipeline is tried, kept where it answers more (16 in flight),
    and refused where it answers less (one in flight); a load that reads the same, tried again
    after ever more windows (``RETRY_WINDOWS``)."""
    manifest = timed_manifest([{"batch_sizes": [1], "mean": [2.0]}] * 4, dims=(8,), max_batch_size=1)
    costs = HostCosts(pipeline_request_s=640e-6, plain_request_s=80e-6, handoff_s=200e-6)

    def plain(rate: int, idle_s: float) -> Window:
        return Window(1.0, rate, rate * 260e-6, rate * 400e-6, (rate * 2e-3,) * 4, 1.0, 1 - idle_s, rate, idle_s,
                      idle_s / rate * 2, returned=rate, returned_s=rate * 8.2e-3)

    def piped(rate: int, took_s: float) -> Window:
        return Window(1.0, rate, rate * 640e-6, rate * 400e-6, (rate * 2.2e-3,) * 4, 1.0, rate * 0.1e-3, rate,
                      1 - rate * 0.1e-3, 0.005, piped=rate, piped_s=rate * took_s)

    assert beyond_first(0.96, 0) == 0.0 and beyond_first(0.96, 63) == pytest.approx(0.96 + math.exp(-0.96) - 1)
    loads = {"16 in flight": (plain(117, 0.04), [piped(400, 0.0395)] * 2, Mode.PIPELINE),
             "Poisson 200/s": (plain(117, 0.04), [piped(360, 0.3), piped(200, 0.0105)], Mode.PIPELINE),  # (the queue)
             "1 in flight": (plain(112, 0.13), [piped(103, 0.0097)] * 2, Mode.IN_TURN)}
    for load, (served, tried, kept) in loads.items():
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.IN_TURN)
        assert _decides(switch, served) is Mode.PIPELINE and switch.trying is not None, (load, switch.last)
        assert [switch.observe(window) for window in tried] == [None, kept], (load, switch.last)
        assert switch.trying is None and switch.mode is kept, (load, switch.last)
    # Refused at one in flight, a load that reads the same (16 in flight following it) is tried
    # again after 4 windows at capacity, then 8, and so on.
    for retry in (RETRY_WINDOWS, 2 * RETRY_WINDOWS):
        assert [switch.observe(served) for _ in range(retry + 1)] == [None] * retry + [Mode.PIPELINE], switch.last
        assert [switch.observe(window) for window in tried] == [None, Mode.IN_TURN], switch.last


def test_the_mode_switch_serves_plain_where_the_pipelines_hand_offs_outweigh_its_multi_entry():
    """Two stages of 0.3 ms (TensorRT speed), a fast host's stub (150 us a request pipelined, 30
    plain), 500 answers/s one row a run: by CPU alone both ways answer in about 0.77 ms and the
    mode stays. On a lent H200's 16 cores the forced pipeline answered one request in flight in
    2.42 ms where the plain model took 1.43 (threads woken on other cores: latency, not CPU), and
    `auto` kept pipelining (0.78x the plain model): with the hand-offs' 0.8 ms measured at load
    (``HostCosts.handoff_s``) the switch serves plain."""
    manifest = timed_manifest([flat(0.3)] * 2)
    window = Window(1.0, 500, 500 * 150e-6, None, (0.15, 0.15), 1.0)
    for handoff_s, switched in ((0.0, None), (0.8e-3, Mode.IN_TURN)):
        costs = HostCosts(pipeline_request_s=150e-6, plain_request_s=30e-6, handoff_s=handoff_s)
        assert _decides(ModeSwitch([s.latency for s in manifest.stages], costs, cores=16), window) is switched
    lone = LoneRuns.of(manifest, HostCosts(pipeline_request_s=150e-6, plain_request_s=30e-6, handoff_s=0.8e-3))
    assert lone.saved_s == pytest.approx(0.92e-3)  # what a lone batch inline saves: CPU and hand-offs


def test_loading_measures_the_latency_the_pipelines_hand_offs_add_beyond_their_cpu():
    """``calibrate.measure`` with a pipeline that answers 3 ms after it is handed a batch, on
    another thread, spending no CPU meanwhile, and a plain path that answers at once: the
    hand-offs' latency is those 3 ms (the CPU shows none of it)."""
    import threading

    from backend import calibrate
    from backend.device import make_device

    def pipeline(queries) -> None:
        threading.Timer(3e-3, lambda: [q.respond({}, None) for q in queries]).start()

    def plain(queries) -> None:
        for query in queries:
            query.respond({}, None)

    manifest = timed_manifest([flat(0.1)] * 2)
    costs = calibrate.measure(manifest, make_device("CPU"), pipeline, plain, budget_s=0.2)
    assert 2.5e-3 < costs.handoff_s < 10e-3, costs
    assert "hand-offs" in costs.describe()
    # A decoupled model answers every request by a send(), served plain too: a request costs a
    # round trip more both ways (here one that takes 1 ms).
    trip = lambda: time.sleep(1e-3)  # noqa: E731
    sends = [calibrate.measure(manifest, make_device("CPU"), pipeline, plain, trip, budget_s=0.2, plain_sends=both)
             for both in (False, True)]
    assert sends[0].pipeline_request_s > 0.8e-3 > sends[0].plain_request_s, sends[0]
    assert sends[1].plain_request_s > 0.8e-3, sends[1]


def test_loading_reads_each_ways_cost_from_its_median_run():
    """A run the scheduler delayed or another process slowed says nothing of the way: one of
    the pipeline's runs of a batch of one (here it answers as it is handed the batch) spins
    50 ms of CPU, where every other run spends next to none, and its cost stays where the
    other runs put it (a mean had a quarter of the loads of three 0.7 ms stages wait for stage
    0: docs/results/calibration-medians). The ways and sizes take turns, ``TURN`` runs each after
    one unmeasured."""
    from backend import calibrate
    from backend.device import make_device

    runs = []

    def answer(queries) -> None:
        for query in queries:
            query.respond({}, None)

    def pipeline(queries) -> None:
        runs.append(len(queries))
        if runs.count(1) == 3 and len(queries) == 1:
            began = time.process_time()
            while time.process_time() - began < 50e-3:
                pass
        answer(queries)

    manifest = timed_manifest([flat(0.1)] * 2)
    costs = calibrate.measure(manifest, make_device("CPU"), pipeline, answer, budget_s=0.2)
    assert costs.pipeline_batch_s + costs.pipeline_request_s < 1e-3, costs
    turn = [1] * (calibrate.TURN + 1) + [8] * (calibrate.TURN + 1)
    assert runs[:2 * len(turn)] == turn * 2, runs


def test_loading_times_a_batch_of_many_as_one_where_the_policy_would_cut_it():
    """Policy I cuts a crowd of one length into pieces where the pipeline is idle (here two
    stages whose time grows with the rows: 8 one-row queries run as several batches). Timed that
    way at load, the pieces' fixed cost went on the requests (three 0.7 ms stages: 80 us a
    request pipelined under ``auto``, 30 under ``policy: pass``), so loading hands its batches
    over whole (``Runtime.submit(whole=True)``, as ``serving.serve`` does): every batch it runs
    at stage 0 is one of 1 or of the many it times."""
    from backend import calibrate
    from backend.device import make_device

    growing = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [8],
               "mean": [[0.2 * rows for rows in BATCH_SIZES]]}
    manifest = timed_manifest([growing] * 2)
    crowd = Clock(manifest, policy("input"))
    crowd.submit(*[crowd.query(k) for k in range(8)])
    crowd.wait(8)
    assert len(split_runs(crowd, 0)) > 1, "the policy cuts a crowd handed over as queries"
    clock = Clock(manifest, policy("input"))
    runtime = clock.runtime
    try:
        calibrate.measure(manifest, make_device("CPU"), lambda queries: runtime.submit(queries, whole=True),
                          runtime.plain.run, budget_s=0.05)
    finally:
        runtime.close()
    assert set(split_runs(clock, 0)) == {1, 8}


def test_a_lone_batch_is_judged_at_its_own_rows_and_by_the_arrivals_its_looks_imply():
    """Two stages of 0.3 ms at one row and 0.7 ms at 8 (TensorRT-speed BERT-base at 128 tokens),
    0.2 ms saved inline. An arrival waits 0.225 ms more behind a lone row run inline, 0.525 ms
    behind 8 rows. Where 60 % of the looks saw an arrival, 0.92 arrive a run on average (a Poisson
    count: 1 - exp(-0.92) = 0.6), not 0.6: a lone row waits them 0.21 ms more, and enters the
    pipeline; where 40 % saw one (0.51 a run), one row runs inline (0.12 against 0.2 ms saved)
    and a batch of 8 rows does not (0.27). Once the looks were of lone rows, a run of 8 rows, 2.3x
    as long, is taken to see 2.3x the arrivals (0.63 ms). Nothing seen yet, none runs inline."""
    rows_ms = {"batch_sizes": BATCH_SIZES, "mean": [0.3, 0.4, 0.5, 0.7]}
    rule = LoneRuns.of(timed_manifest([rows_ms] * 2), HostCosts(pipeline_request_s=0.2e-3, plain_request_s=0.0))
    assert rule.saved_s == pytest.approx(0.2e-3)
    assert [t for rows in (1, 8) for t in rule.run_s(rows)] == pytest.approx([0.6e-3, 0.3e-3, 1.4e-3, 0.7e-3])
    assert rule.waits_s(64) == rule.waits_s(8) == math.inf  # beyond the tables: their largest batch
    rule.share = 0.6
    assert rule.waits_s(1) == pytest.approx(0.206e-3, rel=0.01) and not rule.inline(idle=True, rows=1)
    rule = dataclasses.replace(rule, share=0.4)  # no look under way
    assert rule.waits_s(1) < rule.saved_s < rule.waits_s(8) == pytest.approx(0.268e-3, rel=0.01)
    assert not rule.inline(idle=True, rows=8)
    rule = dataclasses.replace(rule, share=0.4)
    assert rule.inline(idle=True, rows=1)
    rule = dataclasses.replace(rule, share=0.4, looked_s=0.6e-3)  # the looks were of lone rows
    assert rule.waits_s(8) == pytest.approx(0.268e-3 * 1.4 / 0.6, rel=0.01)


def test_a_lone_batch_is_judged_by_what_its_engines_take_served_not_by_their_tables():
    """The rows test's stages where serving reads the engines at 4x their tables
    (``ModeSwitch.off``: tables from a machine 4x as fast): a lone row's run is 2.4 ms, not 0.6, and
    where 40 % of the looks saw an arrival it waits each 0.48 ms more, over the 0.2 saved: it enters
    the pipeline, where judged by the tables it ran inline and held the arrivals behind it."""
    rows_ms = {"batch_sizes": BATCH_SIZES, "mean": [0.3, 0.4, 0.5, 0.7]}
    rule = LoneRuns.of(timed_manifest([rows_ms] * 2), HostCosts(pipeline_request_s=0.2e-3, plain_request_s=0.0))
    tabled = dataclasses.replace(rule, share=0.4)
    served = dataclasses.replace(rule, share=0.4, scale=4.0)
    assert served.run_s(1) == pytest.approx((2.4e-3, 1.2e-3))
    assert served.waits_s(1) == pytest.approx(4 * tabled.waits_s(1)) and served.waits_s(1) > rule.saved_s
    assert tabled.inline(idle=True) and not served.inline(idle=True)


def test_a_lone_batch_is_judged_at_its_own_length_and_the_looks_at_theirs():
    """Queries of diverse lengths (input diversity): two stages of 0.2 ms at 16 tokens and 1 ms at
    128, 0.3 ms saved inline. After a look at 16 tokens that saw nothing, a lone query of 16
    tokens runs inline (1.4 arrivals a run taken, each waiting 0.15 ms more), where one of 128
    (five times as long, five times the arrivals expected, each waiting five times longer) enters
    the pipeline; looks of 128 tokens that see
    as little say arrivals are rarer still, and then it runs inline too. A length beyond the
    tables is taken at their longest, one between two at the longer."""
    lengths_ms = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [16, 128],
                  "mean": [[0.2] * 4, [1.0] * 4]}
    rule = LoneRuns.of(timed_manifest([lengths_ms] * 2), HostCosts(pipeline_request_s=0.3e-3, plain_request_s=0.0))
    assert [t for length in (16, 17, 128, 512) for t in rule.run_s(1, length)] == pytest.approx(
        [0.4e-3, 0.2e-3] + [2e-3, 1e-3] * 3)
    assert rule.run_s(1) == rule.run_s(1, 128)  # no length seen: the tables' middle one
    assert not rule.inline(idle=True, length=16)  # nothing seen yet: a look
    assert rule.inline(idle=True, length=16)  # it saw no arrival
    assert rule.waits_s(1, 16) < rule.saved_s < rule.waits_s(1, 128)
    assert not rule.inline(idle=True, length=128)  # a look, at 128 tokens
    for _ in range(20):
        rule.inline(idle=True, length=128)
    assert rule.looked_s > 1.5e-3 and rule.waits_s(1, 128) < rule.saved_s
    assert rule.inline(idle=True, length=128)


def test_a_lone_batch_runs_inline_only_once_looks_show_arrivals_are_rare_enough_for_what_it_saves():
    """Nothing seen yet, every lone batch enters the pipeline (multi-entry). Where running one
    inline saves 0.3 ms and an arrival during a run would wait 1 ms longer, inline pays once
    under 0.3 arrivals a run are expected (under 26 % of the looks saw one): after five looks
    without one. On stages of 100 ms
    (an arrival waits some 150 ms longer) it takes far more looks; and where the pipeline costs
    no more than the plain path, never. One arrival seen sends lone batches to the pipeline
    again."""
    def looks_until_inline(rule: LoneRuns) -> int:
        for look in range(100):
            if rule.inline(idle=True):
                return look
        return -1

    assert looks_until_inline(LoneRuns(saved_s=0.3e-3, runs_s={None: ((2e-3, 0.0),)})) == 5
    assert looks_until_inline(LoneRuns(saved_s=0.3e-3, runs_s={None: ((300e-3, 0.0),)})) > 15
    assert looks_until_inline(LoneRuns(saved_s=0.0, runs_s={None: ((2e-3, 0.0),)})) == -1
    rule = LoneRuns(saved_s=0.3e-3, runs_s={None: ((2e-3, 0.0),)})
    looks_until_inline(rule)
    while rule.inline(idle=True):  # inline, until a look is due
        pass
    assert not rule.inline(idle=False)  # the look saw an arrival
    assert not rule.inline(idle=True)


def test_a_pipeline_near_capacity_tries_plain_in_the_batches_plain_would_gather():
    """Six stages of 0.7-1 ms (BERT-base in FP16 on an H100, a profile no check had run) at 64 in
    flight on a one-core server: pipelined at 17.6 rows a run, 97-100 % busy at 2,200-2,950
    answers/s. Plain at those rows reads 90-103 % busy, and the pipeline stayed, at 0.82x the plain
    model, which ran 48 rows a call. In batches as large as the tables go, plain reads clearly
    less busy: plain is tried. Light, the pipeline tries nothing; served plain at capacity, the
    pipeline is predicted at plain's own rows, as before (the windows as logged, costs as loading
    measured them)."""
    manifest = _profile("bert_base_h100_fp16_6stages")
    costs = HostCosts(pipeline_batch_s=1129e-6, pipeline_request_s=36e-6, plain_batch_s=174e-6,
                      plain_request_s=3e-6, handoff_s=237e-6)
    tables = [s.latency for s in manifest.stages]
    switch = ModeSwitch(tables, costs, cores=1)
    light = Window(1.0, 1940, 0.306, 0.30, (0.23, 0.17, 0.15, 0.16, 0.15, 0.15), 16.5, 0.43, 117, 0.22, 0.01)
    assert _decides(switch, light) is None and switch.trying is None
    near = [Window(1.0, 2236, 0.501, 0.49, (0.35, 0.23, 0.21, 0.23, 0.20, 0.20), 17.6, 0.71, 126, 0.29, 0.006),
            Window(1.0, 2714, 0.502, 0.48, (0.35, 0.27, 0.23, 0.23, 0.23, 0.23), 17.3, 0.69, 159, 0.32, 0.01),
            Window(1.0, 2961, 0.492, 0.48, (0.34, 0.25, 0.25, 0.24, 0.24, 0.24), 17.3, 0.67, 170, 0.33, 0.007)]
    switched = [switch.observe(window) for window in near]
    assert switched[-1] is Mode.IN_TURN and switch.trying is not None, switch.last
    assert "a trial, pipelined at capacity" in switch.last
    plain = Window(1.0, 3019, 0.297, 0.48, (0.003, 0.001, 0.001, 0.001, 0.001, 0.239), 47.9, 0.36, 63, 0.64, 0.018)
    assert switch.observe(plain) is None and switch.observe(plain) is Mode.IN_TURN and switch.trying is None
    assert "answered 3019/s where pipelined answered" in switch.last and switch.last.endswith("kept")
    assert _decides(switch, plain) is None  # the pipeline at plain's 48 rows: no better, no trial


def test_a_stub_cost_seen_in_runs_of_one_request_is_not_carried_to_runs_of_twenty():
    """BERT-base's three FP16 stages from an H100 on a one-core server (a profile no check had
    run). Served plain at one request in flight, the stub spent 160 us a request where loading
    had measured 33: mostly a call's own cost, which one request carried alone. At 64 in flight,
    pipelined in runs of 21 rows, 93 % busy, that excess taken a request had plain predicted
    164 % busy in its largest batches, busier than the pipeline: no trial, 0.91x [0.88, 0.94] the
    plain model, which spent 37 us a request in runs of 42. Seen in runs of half as many requests
    or fewer, a way's excess is taken at most as the way served now's: plain is tried (the
    windows as logged, costs as loading measured them)."""
    manifest = _profile("bert_base_h100_fp16_3stages")
    costs = HostCosts(pipeline_batch_s=303e-6, pipeline_request_s=22e-6, plain_batch_s=31e-6,
                      plain_request_s=2e-6, handoff_s=84e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, entry_waits=True, mode=Mode.IN_TURN)
    alone = Window(1.0, 205, 0.0327, 0.03, (0.0016, 0.0007, 0.924), 1.0, 0.937, 205, 0.064, 0.0005)
    assert switch.observe(alone) is None
    switch.mode = Mode.PIPELINE
    full = [Window(1.0, 4595, 0.446, 0.48, (0.49, 0.46, 0.42), 21.2, 0.73, 216, 0.27, 0.004),
            Window(1.0, 4698, 0.454, 0.49, (0.52, 0.48, 0.45), 20.7, 0.76, 228, 0.25, 0.002)]
    switched = [switch.observe(window) for window in full]
    assert switched[-1] is Mode.IN_TURN and switch.trying is not None, switch.last
    assert "a trial, pipelined at capacity" in switch.last


def test_a_trial_whose_answers_rise_as_its_requests_are_answered_sooner_is_no_load_that_moved():
    """Returning at once at 64 in flight on tables 16x too fast, against waiting's 1,150
    answers/s in 55 ms: a first window still taking hold at 1,200/s, a second at 1,450/s in 43
    ms. A closed loop answered sooner sends more: the trial goes on, and keeps the way tried.
    Answers that rise as requests wait longer are an open load that grew, and one that falls a
    load that stopped: either ends the trial, as does a rise with nothing measured."""
    trial = Trial(1150.0, 55e-3)
    assert trial.take(1200.0, 50e-3) is None
    assert not trial.moved(1450.0, 43e-3) and trial.take(1450.0, 43e-3) is True
    trial = Trial(1150.0, 55e-3)
    assert trial.take(1200.0, 50e-3) is None
    assert trial.moved(1450.0, 60e-3) and trial.moved(900.0, 40e-3) and trial.moved(1450.0)
    entry = EntryWait(waits=True)
    assert entry.observe(0.4, 1150, 55e-3) is None and entry.observe(0.4, 1150, 55e-3) is False
    assert entry.observe(0.45, 1200, 50e-3) is None and entry.observe(0.5, 1450, 43e-3) is False
    assert not entry.waits and "answered 1325/s where waiting for stage 0 answered 1150" in entry.last


def test_a_trial_whose_answers_fall_as_more_requests_wait_is_falling_behind_not_a_load_that_moved():
    """TensorRT speed over HTTP under Poisson 3,120/s, plain tried the pipeline against its
    3,109 answers/s (docs/results/http-clients): a first window answered 3,235/s in 11.4 ms a
    request, the next 2,614/s in 16.0 ms, 37 then 42 requests in the model. A load that falls
    leaves fewer in the model; more, answered less, is the way tried falling behind: not a
    load that moved (the trial ran a window more and "ended with its load", to run again
    after the next pause), but a trial refused. Fewer in the model is the load falling."""
    trial = Trial(3109.0)
    assert not trial.moved(3235.0, 11.37e-3) and trial.take(3235.0, 11.37e-3) is None
    assert not trial.moved(2614.0, 16.02e-3) and trial.take(2614.0, 16.02e-3) is False
    trial = Trial(3109.0)
    assert trial.take(3235.0, 11.37e-3) is None
    assert trial.moved(1500.0, 5e-3) and trial.moved(2614.0)  # fewer in the model; unmeasured


def test_a_trial_whose_first_window_answers_fewer_sooner_saw_its_load_fall():
    """A round of 64 in flight on tables 16x too fast ending within a trial's first window:
    938 answers/s in 42 ms a request, where waiting answered 1,186 in 53. Fewer requests in the
    model (answers/s times latency) are a load that fell, not the way tried carrying less: the
    trial ends with its load (``EntryWait`` waits again, free to try again at that load, where
    the trial had refused returning at once for the rest of it, as logged). Fewer answered later,
    or with the latency unmeasured, are the way tried carrying less: not kept."""
    trial = Trial(1186.0, 52.75e-3)
    assert trial.moved(938.0, 42.15e-3)
    assert not trial.moved(938.0, 60e-3) and trial.take(938.0, 60e-3) is False
    assert not Trial(1186.0, None).moved(938.0, 42.15e-3) and not Trial(1186.0, 52.75e-3).moved(938.0)
    entry = EntryWait(waits=True)
    assert entry.observe(0.41, 1178, 52.75e-3) is None and entry.observe(0.41, 1194, 52.75e-3) is False
    assert entry.observe(0.35, 938, 42.15e-3) is None and entry.observe(None) is None and not entry.waits
    assert "paused with its load: 938/s in 42.15 ms a request after 1186/s in 52.75 ms a request" in entry.last
    assert entry.observe(0.41, 1190, 52e-3) is None  # the next round starting
    assert entry.observe(0.5, 1440, 43e-3) is None and entry.observe(0.5, 1457, 43e-3) is False
    assert not entry.waits and "returning at once answered 1448/s" in entry.last


def test_a_trial_under_an_open_load_keeps_the_way_that_answers_sooner():
    """The same three stages under Poisson 1,800/s, served plain: calls of 10 rows take 4.85 ms
    (the stages barely grow with their rows) and 0.8 ms of hand-off, the instance held all the
    time, read as a loop at capacity: the pipeline is tried. It answers what arrives, as plain
    did, not 5 % more; measured from Triton's queue to the answer, plain's requests took 8.4 ms
    and the pipeline's 7.3 (the clients: 9.6 and 7.6), so the pipeline is kept, where it had
    been left after each trial, at 1.10x its forced mean (the windows as logged)."""
    manifest = _profile("bert_base_h100_fp16_3stages")
    costs = HostCosts(pipeline_batch_s=305e-6, pipeline_request_s=20e-6, plain_batch_s=36e-6,
                      plain_request_s=3e-6, handoff_s=92e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, entry_waits=True, mode=Mode.IN_TURN)
    plain = [Window(1.0, 1785, 0.0992, 0.16, (0.0017, 0.0009, 0.818), 10.0, 0.863, 178, 0.140, 0.0013,
                    returned=1785, returned_s=1785 * 0.863 / 178),  # every request in its call
             Window(1.0, 1835, 0.0989, 0.15, (0.0017, 0.0008, 0.817), 10.3, 0.863, 178, 0.137, 0.0016,
                    returned=1835, returned_s=1835 * 0.863 / 178)]
    switched = [switch.observe(window) for window in plain]
    assert switched[-1] is Mode.PIPELINE and switch.trying is not None, switch.last
    assert measured_s(plain[-1]) == pytest.approx(8.4e-3, abs=0.1e-3)
    pipelined = [Window(1.0, 1811, 0.328, 0.27, (0.80, 0.71, 0.70), 4.25, 0.901, 424, 0.099, 0.0016,
                        piped=1809, piped_s=11.02),
                 Window(1.0, 1668, 0.307, 0.27, (0.76, 0.67, 0.66), 4.18, 0.850, 400, 0.152, 0.060,
                        piped=1669, piped_s=10.26)]
    assert switch.observe(pipelined[0]) is None
    assert switch.observe(pipelined[1]) is Mode.PIPELINE and switch.trying is None, switch.last
    assert switch.last.endswith("(measured_s): kept"), switch.last
    trial = Trial(1800.0, 8.4e-3)
    assert trial.take(1650.0, 7.0e-3) is None and trial.take(1650.0, 7.0e-3) is False  # 8 % fewer: not kept
    trial = Trial(1800.0, 8.4e-3)
    assert trial.take(1790.0, 8.2e-3) is None and trial.take(1800.0, 8.2e-3) is False  # 2 % sooner: not kept
    trial = Trial(1800.0, None)
    assert trial.take(1800.0, 7.0e-3) is None and trial.take(1800.0, 7.0e-3) is False  # the way before unmeasured
    trial = Trial(1764.0, 7.4e-3)  # returning at once against waiting for stage 0, as logged (``EntryWait``)
    assert trial.take(1861.0, 8.2e-3) is None and trial.take(1861.0, 8.2e-3) is False and "later" in trial.refused
    trial = Trial(1764.0, None)
    assert trial.take(1861.0, 8.2e-3) is None and trial.take(1861.0, 8.2e-3) is True  # unmeasured: answers decide


def test_a_pipeline_busy_in_small_batches_under_an_open_load_tries_no_plain_that_carries_less():
    """The slower engine's two stages under Poisson 400/s: pipelined in runs of 2.3 rows, 88 %
    busy, plain overloaded at those rows and 53 % busy in its largest batches. The pipeline in
    batches as large would be 34 % busy, so plain carries less whatever the load: no trial (each,
    after every pause, had served two windows of an overloaded plain: the window and costs as
    logged). Near capacity in its own batches, with plain the one to carry more in full ones,
    the trial stays: the test above."""
    manifest = _profile("slow_2stages")
    costs = HostCosts(pipeline_batch_s=673e-6, pipeline_request_s=111e-6, plain_batch_s=180e-6,
                      plain_request_s=7e-6, handoff_s=57e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1)
    open_load = Window(1.0, 400, 0.25, 0.2, (0.88, 0.85), 2.3)
    assert _decides(switch, open_load) is None and switch.trying is None, switch.last
    assert "(88% busy)" in switch.last and "overloaded plain" in switch.last


def test_the_way_served_is_read_as_measured_and_the_other_as_late_as_it_was_served_at_that_load():
    """TensorRT-speed BERT-base under Poisson 1,026/s (the costs as logged): served plain, whose
    requests take 1.59 ms as measured (``measured_s``), 0.58x its model. The pipeline, never
    served, is taken at its model, 2.00 ms, and plain stays (borrowing plain's lateness it was
    predicted at 1.16 ms, and the switch pipelined). Served pipelined there, its requests take
    3.48 ms, 2.5 times its prediction (hand-offs between threads waiting for the interpreter,
    which the model does not see): it goes to plain, and stays there, the pipeline taken as late
    as it was served at that load. Predicted alone, the pipeline had been kept for the load's four
    minutes at 1.50x the plain model's mean (docs/results/switch-measured-latency). Near capacity
    the measure says nothing of the model's error: a window 90 % busy keeps no lateness."""
    manifest = _profile("bert_base_trt_a100_2stages")
    costs = HostCosts(pipeline_batch_s=272e-6, pipeline_request_s=145e-6, plain_batch_s=178e-6,
                      plain_request_s=83e-6, handoff_s=24e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.FUSED, whole=manifest.whole)
    plain = Window(1.0, 1026, 0.25, 0.27, (0.55,), 1.5, 0.78, 684, 0.20, 0.002, returned=1026,
                   returned_s=1026 * 0.78 / 684)  # every request in its call
    piped = Window(1.0, 1026, 0.30, 0.27, (0.35, 0.33), 1.5, 0.05, 684, 0.9, 0.002, piped=1026, piped_s=1026 * 3.4e-3)
    assert measured_s(plain) == pytest.approx(1.59e-3, abs=0.01e-3)
    assert _decides(switch, plain) is None, switch.last
    assert "2.00 ms pipelined" in switch.last and "1.59 ms plain" in switch.last and "measured" in switch.last
    switch.mode = Mode.PIPELINE  # served pipelined at that load
    assert _decides(switch, piped) is Mode.FUSED, switch.last
    assert "3.48 ms pipelined (57% busy, measured)" in switch.last, switch.last
    assert all(switch.observe(plain) is None for _ in range(4)), switch.last
    assert "2.5x its model as measured served so at this load" in switch.last, switch.last
    busy = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.FUSED, whole=manifest.whole)
    busy.observe(dataclasses.replace(plain, execute_s=0.9))
    assert not busy.late and "series, measured" not in busy.last, busy.last


def test_a_way_never_served_borrows_no_earliness_from_the_way_served():
    """A life carried over from 64 in flight, whose pipeline was served only at capacity (where
    no lateness is kept), served plain under Poisson 1,537/s at 0.3 of capacity (TensorRT speed
    over HTTP, the windows and costs as logged): plain's requests took 1.40 and then 1.32 ms as
    measured, under half its model. Borrowing that, the pipeline was predicted at 0.59 ms and the
    switch pipelined, where it answered in 3.09 and then 2.47 ms, and went back two windows later
    (docs/results/trial-in-model/check-trt-borrowed.txt). Plain's error is its own: the pipeline
    is taken at its model, 1.43 ms, and plain stays."""
    manifest = _profile("bert_base_trt_a100_2stages")
    costs = HostCosts(pipeline_batch_s=215e-6, pipeline_request_s=106e-6, plain_batch_s=151e-6,
                      plain_request_s=45e-6, handoff_s=46e-6, send_s=18e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.FUSED, whole=manifest.whole)
    windows = [Window(1.0, 1537, 1537 * 127e-6, 1537 * 169e-6, (0.55,), 1.8, 0.63, 833, 0.37, 0.0051,
                      returned=1537, returned_s=1537 * 0.63 / 833),
               Window(1.0, 1539, 1539 * 119e-6, 1539 * 156e-6, (0.57,), 1.8, 0.64, 870, 0.36, 0.0038,
                      returned=1539, returned_s=1539 * 0.64 / 870)]
    assert [switch.observe(window) for window in windows] == [None, None], switch.last
    assert "1.43 ms pipelined (57% busy)," in switch.last and "1.32 ms plain" in switch.last, switch.last
    assert [way for way, _ in switch.late] == [Mode.FUSED]  # the pipeline never measured


@pytest.mark.parametrize("late", [0.66, 1.43])
def test_the_other_way_seen_only_at_loads_far_off_is_taken_no_sooner_than_its_model(late):
    """What a way's model leaves out changes with the load: the pipeline of the test above, served
    at 2,900 answers/s in runs of 12.8 rows, answered in 0.66x its model's latency. Carried to
    1,026/s, three half octaves off, that put it at 0.92 ms against plain's measured 1.59, and
    the switch pipelined (TensorRT speed over HTTP, as logged: 1.22 and 0.88 ms against 1.45
    and 1.37, where the forced pipeline answered in 3.43 ms: docs/results/http-clients). Seen
    only that far off, it is taken no sooner than its model (1.39 ms), and plain stays; a
    lateness that makes it later (1.43x) still counts."""
    manifest = _profile("bert_base_trt_a100_2stages")
    costs = HostCosts(pipeline_batch_s=272e-6, pipeline_request_s=145e-6, plain_batch_s=178e-6,
                      plain_request_s=83e-6, handoff_s=24e-6)
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, whole=manifest.whole)
    heavy = Window(1.0, 2900, 0.3, 0.35, (0.5, 0.45), 12.8, 0.05, 226, 0.5, 0.002, piped=2900,
                   piped_s=2900 * {0.66: 2.0e-3, 1.43: 5.0e-3}[late])
    assert switch.observe(heavy) is None and list(switch.late.values()) == [[pytest.approx(late, abs=0.01)]]
    switch.mode = Mode.FUSED  # served plain from here on, at a lighter load
    plain = Window(1.0, 1026, 0.25, 0.27, (0.55,), 1.5, 0.78, 684, 0.20, 0.002, returned=1026,
                   returned_s=1026 * 0.78 / 684)
    assert all(switch.observe(plain) is None for _ in range(4)), switch.last
    assert f"{max(late, 1):.2g}x its model as measured served so at 2896 answers/s" in switch.last, switch.last
    assert "1.59 ms plain" in switch.last


def test_a_pipelined_window_whose_lone_batches_ran_inline_is_measured_with_them():
    """The load of the test above pipelined, a third of its calls lone batches run inside
    ``execute`` (``LoneRuns``), as the windows of TensorRT-speed BERT-base under Poisson 1,059/s
    were: the pipeline's own answers take 3.6 ms, the inline ones their call, 1.3 ms, and its
    hand-off. Measured with both, its requests take 3.2 ms, where plain was measured at 1.6: it
    goes plain. Left out, the window could not be measured, and the pipeline was kept on its
    prediction. At a load plain was not served at (730/s), plain is taken as late as at the
    nearest load it was (0.58x its model): taken as late as the pipeline, it was predicted at
    3.0 ms against the pipeline's 2.9, and the pipeline kept (docs/results/switch-mixed-windows)."""
    manifest = _profile("bert_base_trt_a100_2stages")
    costs = HostCosts(pipeline_batch_s=272e-6, pipeline_request_s=145e-6, plain_batch_s=178e-6,
                      plain_request_s=83e-6, handoff_s=24e-6)
    plain = Window(1.0, 1026, 0.25, 0.27, (0.55,), 1.5, 0.78, 684, 0.20, 0.002, returned=1026,
                   returned_s=1026 * 0.78 / 684)  # every request in its call
    mixed = Window(1.0, 1026, 0.30, 0.27, (0.35, 0.33), 1.5, 0.35, 684, 0.6, 0.002, inline=228, lone=300,
                   piped=684, piped_s=684 * 3.6e-3, returned=342, returned_s=342 * 1.3e-3)
    took = measured_s(mixed)
    handoff = round_trip_s(mixed) * 1026 / 684
    inside = (684 * 3.6e-3 + 342 * (1.3e-3 + handoff)) / 1026
    assert took == pytest.approx(inside + min(0.35 + 684 * handoff, 1.0) * (0.35 / 684 + handoff) / 2)
    assert 3.0e-3 < took < 3.3e-3, took
    assert measured_s(dataclasses.replace(mixed, piped=10, returned=9)) is None  # too few answers timed
    for faster in (1.0, 0.71):  # the same window's counts in 1 s, and in 1.41
        window = dataclasses.replace(mixed, seconds=1 / faster)
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=1, mode=Mode.FUSED,
                            whole=manifest.whole)
        assert _decides(switch, plain) is None, switch.last
        switch.mode = Mode.PIPELINE  # served pipelined at that load
        assert _decides(switch, window) is Mode.FUSED, switch.last
        assert "pipelined (57% busy, measured)" in switch.last or faster < 1, switch.last
        at = "this load" if faster == 1 else "1024 answers/s"
        assert f"x its model as measured served so at {at})" in switch.last, switch.last


def _fresh_start(stub_us: float = 252) -> tuple[ModeSwitch, Window]:
    """A fresh server's first load, 64 in flight at TensorRT speed, as a lent H200 host's 12 server
    cores served it (docs/results/h200-cpu-fresh-start, run 2, the costs as logged): pipelined at
    3,577 answers/s in runs of 11.9 rows, the stub at ``stub_us`` a request beyond its 427 a batch,
    tritonserver 270 us a request, ``execute`` waiting for stage 0."""
    manifest = _profile("bert_base_trt_a100_2stages")
    costs = HostCosts(pipeline_batch_s=427e-6, pipeline_request_s=76e-6, plain_batch_s=31e-6, plain_request_s=6e-6,
                      handoff_s=142e-6, send_s=19e-6, how="measured at load")
    switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores=12, entry_waits=True,
                        whole=manifest.fused().stages[0].latency)
    rate, rows, seconds = 3577, 11.9, 1.5
    answered = round(rate * seconds)
    runs = answered / rows
    busy = tuple(runs * s.latency.predict(12, None) / 1000 for s in manifest.stages)
    return switch, Window(seconds, answered, answered * (427e-6 / rows + stub_us * 1e-6), answered * 270e-6, busy,
                          rows, runs * 1.5e-3, round(runs), 0.1, 0.001, piped=answered, piped_s=answered * 12e-3)


def _served_plain(rate: float, rows: float, stub_us: float, seconds: float = 1.5) -> Window:
    answered = round(rate * seconds)
    runs = answered / rows
    busy = (runs * _profile("bert_base_trt_a100_2stages").fused().stages[0].latency.predict(round(rows), None) / 1000,)
    return Window(seconds, answered, answered * stub_us * 1e-6, answered * 200e-6, busy, rows, runs * 2.5e-3,
                  round(runs), 0.05, 0.001, returned=answered, returned_s=answered * 3e-3)


def test_a_trial_cut_by_its_loads_end_teaches_nothing_and_runs_on_the_next_load():
    """The fresh server above: plain, never served, is costed with the pipeline's excess over
    loading's (+176 us a request where loading measured 6), 102 % busy against the pipeline's
    103 %, and tried. The trial's first window served 3,585 answers/s; in its second the load
    stopped (796/s in runs of 5 rows, the stub's second's work on a fifth of the answers). That
    window held two loads and neither way's costs. Learnt, plain's line through it and the first
    window made plain's calls dear, kept plain from being tried again, and the rest of the load
    was served pipelined at 0.66x the plain model (docs/results/h200-cpu-fresh-start). Now it
    teaches nothing; where a pause follows, the trial goes on serving plain and runs its windows
    on the next load (on one core, lives whose trial the first load's end cut served the next
    load's first seconds pipelined: docs/results/check-one-core-pauses); where the load goes on,
    the trial ends, and after a pause that load is tried again."""
    switch, window = _fresh_start()
    assert _decides(switch, window) is Mode.FUSED
    assert switch.last.startswith("a trial, pipelined at capacity"), switch.last
    assert "overloaded pipelined (103% busy), overloaded plain (102%" in switch.last, switch.last
    steady, ending, pause = _served_plain(3585, 40, 120), _served_plain(796, 5, 400), _served_plain(2, 1, 400)
    assert switch.observe(steady) is None
    lines, excess = {m: dict(line._kept) for m, line in switch.lines.items()}, dict(switch.excess)
    assert switch.observe(ending) is None and switch.mode is Mode.FUSED
    assert {m: dict(line._kept) for m, line in switch.lines.items()} == lines and switch.excess == excess
    assert switch.observe(pause) is None and switch.mode is Mode.FUSED and switch.trying is not None
    assert switch.last.startswith("a trial plain paused with its load: 796/s in 3.54 ms a request after 3585/s"), \
        switch.last
    assert switch.observe(steady) is None and switch.observe(steady) is Mode.FUSED, switch.last
    assert switch.trying is None and switch.last.endswith("(measured_s): kept"), switch.last

    switch, window = _fresh_start()
    assert _decides(switch, window) is Mode.FUSED and switch.observe(steady) is None
    assert switch.observe(ending) is None and switch.observe(ending) is Mode.PIPELINE  # the load went on
    assert switch.last.startswith("a trial plain ended with its load: 796/s"), switch.last
    assert switch.observe(pause) is None and _decides(switch, window) is Mode.FUSED, switch.last


def test_a_trial_whose_load_stopped_and_started_again_within_a_window_pauses():
    """On one core at TensorRT speed under Poisson 0.6, a trial of plain saw the warm-up load end
    in a window, and the next window held the gap between two perf_analyzer runs and the measured
    run's start: its answers/s read as a load that moved, the trial ended, and the measured run
    began pipelined, 1.59x and 3.02x the plain model's mean in two of nine lives
    (docs/results/check-one-core-pauses). An idle of ``SWITCH_GAIN`` of a window's seconds before
    one of its calls (``Window.paused``) is a load that stopped and started again: the trial
    pauses, the window teaches nothing, and the trial's windows run from the next window on. A
    quiet spell of a steady load does not pause it."""
    switch, window = _fresh_start()
    assert _decides(switch, window) is Mode.FUSED
    steady, ending = _served_plain(3585, 40, 120), _served_plain(796, 5, 400)
    restarted = dataclasses.replace(_served_plain(2400, 30, 150), longest_idle_s=0.4)
    assert not steady.paused and restarted.paused and not dataclasses.replace(restarted, longest_idle_s=0.2).paused
    assert switch.observe(steady) is None and switch.observe(ending) is None
    lines, excess = {m: dict(line._kept) for m, line in switch.lines.items()}, dict(switch.excess)
    assert switch.observe(restarted) is None and switch.mode is Mode.FUSED and switch.trying is not None
    assert {m: dict(line._kept) for m, line in switch.lines.items()} == lines and switch.excess == excess
    assert switch.last == ("a trial plain paused with its load: an idle of 400.00 ms in a window of 1.50 s, "
                           "2400 answers/s, until the next one"), switch.last
    assert switch.observe(steady) is None and switch.observe(steady) is Mode.FUSED, switch.last
    assert switch.trying is None and switch.last.endswith("(measured_s): kept"), switch.last


def test_a_window_describes_what_it_measured_for_the_log():
    """``DVABATCH_LOG_WINDOWS``'s line: a request's share of each CPU time and the figures the switch reads."""
    _, window = _fresh_start()
    said = window.describe()
    assert said.startswith("5366 answers in 1.50 s, 11.9 rows a run; stub 288 us a request, tritonserver 270 us"), said
    assert "stages busy 0.15, 0.15 s" in said and "lone 0, inline 0" in said and "measured 12." in said, said
    assert "tritonserver not read" in dataclasses.replace(window, server_s=None).describe()


def test_windows_that_ran_their_lone_batches_inline_bound_plains_cost_and_plain_is_tried():
    """The life logged in docs/results/one-core-knee-served-lean (TensorRT-speed BERT-base on one
    core under Poisson 2,268/s, ``execute`` waiting for stage 0): two starved windows after
    loading (346 us a request) put 278 us more on each request of both ways, and plain, never
    served, read 126-143 % busy for the rest of the life, because the later windows, most of
    their runs inline, taught nothing; the pipeline ran 97-99 % busy, and the plain model
    answered that load 1.1x-75x sooner. Those windows served both ways at 127-132 us a request
    in all, which plain's cost cannot exceed: bounded by them, plain reads less busy than the
    pipeline, which is near capacity, and is tried."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=423e-6, pipeline_request_s=45e-6, plain_batch_s=78e-6, plain_request_s=8e-6,
                      handoff_s=53e-6, send_s=28e-6, how="measured at load")
    switch = ModeSwitch(tables, costs, cores=1, entry_waits=True)

    def served(seconds: float, answered: int, stub_us: float, server_us: float, busy: tuple[float, float],
               rows: float, calls: int, execute_s: float, idle_s: float, longest_ms: float, others_us: float,
               lone: int, inline: int, took_ms: float) -> Window:
        return Window(seconds, answered, answered * stub_us * 1e-6, answered * server_us * 1e-6, busy, rows,
                      execute_s, calls, idle_s, longest_ms / 1e3, answered * others_us * 1e-6, inline=inline,
                      lone=lone, piped=answered, piped_s=answered * took_ms / 1e3)

    assert switch.observe(served(1.0, 1133, 316, 327, (0.45, 0.30), 18.0, 18, 0.38, 0.58, 91.3, 231, 12, 0,
                                 83.92)) is None
    assert switch.observe(served(1.03, 847, 346, 437, (0.40, 0.24), 18.4, 16, 0.40, 0.66, 100.7, 422, 11, 3,
                                 119.20)) is None
    assert switch.costs.plain_request_s > 270e-6
    assert switch.observe(served(1.01, 1728, 132, 255, (0.04, 0.03), 52.4, 27, 0.21, 0.81, 50.8, 192, 27, 25,
                                 56.08)) is None
    assert switch.costs.plain_request_s < 130e-6 and "(lone batches inline)" in switch.costs.how
    assert switch.observe(served(1.0, 1856, 127, 226, (0.08, 0.03), 53.0, 29, 0.20, 0.79, 53.9, 169, 30, 28,
                                 50.06)) is Mode.IN_TURN
    assert switch.trying is not None and switch.last.startswith("a trial, pipelined at capacity")


def test_plain_not_yet_served_and_predicted_within_the_models_error_is_tried():
    """A life logged in docs/results/http-clients (TensorRT-speed BERT-base, clients over HTTP,
    the server on one core, Poisson 1,530/s): pipelined in 2.6-3.0 ms a request, plain, never
    served, was predicted at 2.6-2.7 ms from upper bounds of its costs (tritonserver's as the
    pipeline's 229 us a request, the stub's from windows whose lone batches ran inline), not
    sooner by the gain, and the life stayed pipelined for 35 s. Within the model's error, plain
    is now tried; served, it answered in 1.4 ms (stub 116, tritonserver 164 us a request) and is
    kept. Once served, plain's costs are its own, and nothing is tried on that account again."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=215e-6, pipeline_request_s=34e-6, plain_batch_s=29e-6, plain_request_s=4e-6,
                      handoff_s=43e-6, send_s=23e-6, how="measured at load")
    switch = ModeSwitch(tables, costs, cores=1, entry_waits=True)

    def served(answered: int, stub_us: float, server_us: float, busy: tuple[float, float], rows: float, calls: int,
               execute_s: float, lone: int, inline: int, took_ms: float) -> Window:
        return Window(1.0, answered, answered * stub_us * 1e-6, answered * server_us * 1e-6, busy, rows, execute_s,
                      calls, 1.0 - execute_s, 0.005, lone=lone, inline=inline, piped=answered,
                      piped_s=answered * took_ms / 1e3)

    assert switch.observe(served(1439, 312, 229, (0.41, 0.34), 2.1, 671, 0.64, 170, 59, 2.6)) is None
    assert switch.leaning, switch.last
    assert switch.observe(served(1528, 303, 229, (0.45, 0.37), 2.0, 781, 0.70, 186, 79, 2.3)) is Mode.IN_TURN
    assert switch.trying is not None and switch.last.startswith("a trial, plain not yet served"), switch.last
    plain = [Window(1.0, answered, answered * 116e-6, answered * 164e-6, (0.55, 0.0), 1.8, 0.63, 836, 0.37, 0.005,
                    returned=answered, returned_s=answered * 0.7e-3) for answered in (1522, 1525)]
    assert switch.observe(plain[0]) is None
    assert switch.observe(plain[1]) is Mode.IN_TURN and switch.trying is None and switch.last.endswith("kept")
    assert not switch._bounded(Mode.IN_TURN, {Mode.PIPELINE: 1.0, Mode.IN_TURN: 1.0})


def test_lone_batches_inline_from_loading_leave_plain_at_loadings_cost():
    """Near-zero compute on the 2-core split, one request in flight (docs/results/mixed-windows-teach):
    from loading every call found the pipeline empty and 94 % ran inline, the stub at 160-180 us a
    request. Taken as plain's excess as well, that put plain at 145-166 us a request (served, it
    spent 104-132), within ``SWITCH_GAIN`` of the pipeline, and lives stayed pipelined at
    0.84x-0.90x the plain model. It bounds plain's excess from above only: plain stays at
    loading's, and the switch serves plain a window later."""
    tables = [s.latency for s in _profile("zero_2stages").stages]
    costs = HostCosts(pipeline_batch_s=132e-6, pipeline_request_s=34e-6, plain_batch_s=6e-6, plain_request_s=3e-6,
                      send_s=24e-6, how="measured at load")
    switch = ModeSwitch(tables, costs, cores=1, entry_waits=True)
    for answered, stub_us, server_us, inline, decided in ((1975, 163, 218, 1858, None), (2155, 160, 227, 2029,
                                                                                          Mode.IN_TURN)):
        window = Window(1.0, answered, answered * stub_us * 1e-6, answered * server_us * 1e-6, (0.0, 0.0), 1.0,
                        0.18, answered, 0.82, 0.02, lone=answered, inline=inline, piped=answered,
                        piped_s=answered * 0.11e-3)
        assert switch.observe(window) is decided, switch.last
        assert (switch.costs.plain_batch_s, switch.costs.plain_request_s) == (6e-6, 3e-6)
    assert "plain bounded at 2155 answers/s in runs of 1.0 requests (lone batches inline)" in switch.costs.how


def test_the_log_says_which_window_each_ways_corrected_cost_is_from():
    """TensorRT-speed BERT-base on one core under Poisson 2,268/s, as logged: loading measured the
    pipeline's stub at 423 us a batch + 45 a request, plain's at 78 + 8. The first windows after
    loading, starved (824 answers/s in runs of 18.4 requests, 346 us a request), put about 278 us
    more on each request of both ways; the later windows, most of their runs inline, teach
    nothing, and the figures held for the model's life while the log called them "measured at
    load". The costs now say which window each way's correction is from, and that a way not yet
    served is taken as far off. A later window, most of its runs inline, served both ways: what it
    shows beyond loading's costs in those shares (97 us a request in all) bounds plain's excess,
    and the log says so. Served plain, plain's own window takes its place."""
    tables = [s.latency for s in _profile("bert_base_trt_a100_2stages").stages]
    costs = HostCosts(pipeline_batch_s=423e-6, pipeline_request_s=45e-6, plain_batch_s=78e-6, plain_request_s=8e-6,
                      handoff_s=53e-6, send_s=28e-6, how="measured at load")
    switch = ModeSwitch(tables, costs, cores=1)
    starved = Window(1.0, 824, 824 * 346e-6, 824 * 437e-6, (0.40, 0.24), 18.4, 0.40, 16, 0.66, 0.10, inline=3, lone=11)
    switch.observe(starved)
    excess = 346e-6 - (423e-6 / 18.4 + 45e-6)
    assert switch.costs.pipeline_request_s == pytest.approx(45e-6 + excess)
    assert switch.costs.plain_request_s == pytest.approx(8e-6 + excess)
    said = ("measured at load; a request's cost over it as last served: pipelined at 824 answers/s in runs of "
            "18.4 requests, plain taken as far off as pipelined")
    assert switch.costs.how == said
    mixed = Window(1.0, 2496, 2496 * 97e-6, 2496 * 176e-6, (0.18, 0.06), 46.2, 0.26, 39, 0.80, 0.036, inline=32,
                   lone=36)
    switch.observe(mixed)
    share = 32 * 46.2 / 2496
    bound = 97e-6 - (share * (78e-6 / 46.2 + 8e-6) + (1 - share) * (423e-6 / 46.2 + 45e-6))
    assert switch.costs.pipeline_request_s == pytest.approx(45e-6 + excess)
    assert switch.costs.plain_request_s == pytest.approx(8e-6 + bound) and bound < excess / 3
    said = ("measured at load; a request's cost over it as last served: pipelined at 824 answers/s in runs of "
            "18.4 requests, plain bounded at 2496 answers/s in runs of 46.2 requests (lone batches inline)")
    assert switch.costs.how == said and switch.costs.describe().endswith(f"({said})")
    switch.mode = Mode.IN_TURN
    switch.observe(Window(1.0, 2304, 2304 * 94e-6, 2304 * 187e-6, (0.04, 0.03), 64.0, 0.20, 36, 0.82, 0.037))
    assert switch.costs.plain_request_s == pytest.approx(8e-6 + 94e-6 - (78e-6 / 64 + 8e-6))
    assert switch.costs.how == ("measured at load; a request's cost over it as last served: pipelined at 824 "
                                "answers/s in runs of 18.4 requests, plain at 2304 answers/s in runs of 64.0 requests")

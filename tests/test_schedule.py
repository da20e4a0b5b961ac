"""Schedules of the multi-entry multi-exit runtime, timed exactly with the timed engine.

Stages sleep for their tabulated latency and pass rows through, so the expected answer times
follow from the schedule alone. Each stage run costs about 0.7 ms of overhead (thread hand-over,
sleep overshoot) on a 2-core machine, with spikes of a few ms, hence a tolerance of 5 ms plus
2 ms per stage run on the critical path.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from backend.config import RuntimeConfig
from backend.policy import FixedPolicy, Policy
from backend.query import Code

from .timed import BATCH_SIZES, Clock, flat, timed_manifest

pytestmark = pytest.mark.wallclock  # every test here times a schedule on the wall clock

T = 100.0  # ms, the paper's time unit


def assert_times(got: dict[int, float], expected: dict[int, float], steps: int) -> None:
    tolerance = 5 + 2 * steps
    off = {k: round(got[k] - expected[k], 1) for k in expected}
    assert all(abs(d) <= tolerance for d in off.values()), f"got {got}, expected {expected} (off {off} ms)"


def check_rows(clock: Clock) -> None:
    """A timed model passes rows through: every query must get back exactly its own rows."""
    for key, (_, outputs, failure) in clock.answers.items():
        assert failure is None
        expected = (np.arange(outputs["x"].size).reshape(outputs["x"].shape) + 1000 * key).astype(np.float32)
        np.testing.assert_array_equal(outputs["x"], expected)


@pytest.mark.parametrize("pairs, second_done", [(1, 6 * T), (2, 4 * T)])
def test_one_buffer_pair_runs_serially_two_run_in_parallel(pairs, second_done):
    """Two batches, three stages of T: with one buffer pair the second batch enters only after
    the first has left the last stage; with two it follows one stage behind."""
    clock = Clock(timed_manifest([flat(T)] * 3), RuntimeConfig(buffer_pairs=pairs))
    clock.submit(clock.query(0, length=8), clock.query(1, length=16))  # different shapes: two batches
    assert_times(clock.wait(2), {0: 3 * T, 1: second_done}, steps=6)
    check_rows(clock)


def test_new_batches_co_run_in_different_stages():
    """A batch entering while an earlier one is in stage 1 runs stage 0 at the same time."""
    clock = Clock(timed_manifest([flat(T)] * 3), RuntimeConfig())
    clock.submit(clock.query(0))
    time.sleep(T / 1000 * 1.2)
    clock.submit(clock.query(1))
    got = clock.wait(2)
    assert_times(got, {0: 3 * T, 1: 1.2 * T + 3 * T}, steps=4)
    stage0_of_1 = next(r for r in clock.runs if r[0] == 0 and r[1] == 1)
    stage1_of_0 = next(r for r in clock.runs if r[0] == 1 and r[1] == 0)
    assert stage0_of_1[4] < stage1_of_0[5], "the two batches did not overlap"
    check_rows(clock)


@pytest.mark.parametrize("arrival, stage", [(1.2, 1), (2.2, 2)])
def test_stretch_catches_up_and_merges(arrival, stage):
    """Query 1 arrives while batch 0 is in ``stage`` and stretches it: batch 0 waits after that
    stage until the late row has caught up, then the remaining stages run both rows as one
    batch, and both queries leave together with their own rows."""
    clock = Clock(timed_manifest([flat(T)] * 4), RuntimeConfig(policy=FixedPolicy(stretch_latest=True)))
    clock.submit(clock.query(0))
    time.sleep(T / 1000 * arrival)
    clock.submit(clock.query(1))
    done = (arrival + 4) * T
    assert_times(clock.wait(2), {0: done, 1: done}, steps=4)
    runs = sorted((r[0], r[2], r[3]) for r in clock.runs)  # (stage, start, num)
    assert runs == sorted([*((s, 0, 1) for s in range(stage + 1)), *((s, 1, 1) for s in range(stage + 1)),
                           *((s, 0, 2) for s in range(stage + 1, 4))])
    assert {r[1] for r in clock.runs} == {0}, "the late query joined batch 0"
    check_rows(clock)


def test_one_buffer_pair_admits_only_when_the_batch_has_left():
    """In the serial manner the first stage stays inactive until the batch has left the last
    stage, so a late query finds nothing to stretch and runs after it."""
    clock = Clock(timed_manifest([flat(T)] * 3),
                  RuntimeConfig(buffer_pairs=1, policy=FixedPolicy(stretch_latest=True)))
    clock.submit(clock.query(0))
    time.sleep(T / 1000 * 1.2)
    clock.submit(clock.query(1))
    assert_times(clock.wait(2), {0: 3 * T, 1: 6 * T}, steps=6)
    assert {r[1] for r in clock.runs} == {0, 1}


def test_pass_policy_does_not_stretch():
    clock = Clock(timed_manifest([flat(T)] * 3), RuntimeConfig(policy=Policy()))
    clock.submit(clock.query(0))
    time.sleep(T / 1000 * 1.2)
    clock.submit(clock.query(1))
    assert_times(clock.wait(2), {0: 3 * T, 1: 4.2 * T}, steps=4)


def case_two(pairs: int, split: bool) -> Clock:
    """Paper, Figure 3, Case II: operator A prefers batch size 4 (T at any size up to 4); B, C
    and D prefer 1 (T/4 per row). Four queries arrive together."""
    per_row = {"batch_sizes": BATCH_SIZES, "mean": [T / 4 * b for b in BATCH_SIZES]}
    policy = FixedPolicy(split_after=0, split_size=1) if split else Policy()
    config = RuntimeConfig(buffer_pairs=pairs, policy=policy)
    clock = Clock(timed_manifest([flat(T), per_row, per_row, per_row]), config)
    clock.submit(*[clock.query(k) for k in range(4)])
    return clock


def test_figure3_case2_split_in_serial_manner():
    """Split into four batches after A, run serially (one buffer pair): queries leave at 1.75T,
    2.5T, 3.25T and 4T, average 2.875T as in the paper, instead of all at 4T."""
    baseline = case_two(pairs=1, split=False)
    assert_times(baseline.wait(4), {k: 4 * T for k in range(4)}, steps=4)
    clock = case_two(pairs=1, split=True)
    got = clock.wait(4)
    assert_times(got, {0: 1.75 * T, 1: 2.5 * T, 2: 3.25 * T, 3: 4 * T}, steps=13)
    assert abs(sum(got.values()) / 4 - 2.875 * T) <= 5 + 2 * 13
    check_rows(clock)


def test_figure3_case2_split_parts_overlap_with_two_buffer_pairs():
    """With two buffer pairs the split parts pipeline through B, C and D: T/4 apart."""
    clock = case_two(pairs=2, split=True)
    assert_times(clock.wait(4), {0: 1.75 * T, 1: 2 * T, 2: 2.25 * T, 3: 2.5 * T}, steps=7)
    check_rows(clock)


def test_figure3_case1_short_queries_leave_early():
    """Paper, Figure 3, Case I: four operators of T for a long query, T/2 for short ones.
    Padded to the longest, all four leave at 4T. Batched by length, the three short queries
    leave at 2T; the long one follows its batch one stage behind (here one executor per stage
    runs one batch at a time, so it leaves at 4.5T rather than the paper's overlapped 4T)."""
    per_length = {"batch_sizes": BATCH_SIZES, "axis": "sequence", "lengths": [8, 16],
                  "mean": [[T / 2] * len(BATCH_SIZES), [T] * len(BATCH_SIZES)]}
    manifest = timed_manifest([per_length] * 4)
    padded = Clock(manifest, RuntimeConfig())
    padded.submit(*[padded.query(k, length=16) for k in range(4)])
    assert_times(padded.wait(4), {k: 4 * T for k in range(4)}, steps=4)
    clock = Clock(manifest, RuntimeConfig())
    clock.submit(*[clock.query(k, length=8) for k in range(3)], clock.query(3, length=16))
    got = clock.wait(4)
    assert_times(got, {0: 2 * T, 1: 2 * T, 2: 2 * T, 3: 4.5 * T}, steps=5)
    check_rows(clock)


def test_batch_window_gathers_queries_into_one_batch():
    """With a window of T/2 the second query (arriving at T/5) joins the first in one batch that
    enters at T/2; both leave at 3.5T."""
    clock = Clock(timed_manifest([flat(T)] * 3), RuntimeConfig(batch_window_ms=T / 2))
    clock.submit(clock.query(0))
    time.sleep(T / 1000 / 5)
    clock.submit(clock.query(1))
    assert_times(clock.wait(2), {0: 3.5 * T, 1: 3.5 * T}, steps=3)
    assert [(r[0], r[3]) for r in clock.runs] == [(0, 2), (1, 2), (2, 2)]
    check_rows(clock)


def test_batch_window_waits_for_rows_that_stack():
    """Seven queries of another length waiting beside the first do not close its window: the
    query of its own length arriving at T/5 still joins it, and both leave at 3.5T."""
    clock = Clock(timed_manifest([flat(T)] * 3), RuntimeConfig(batch_window_ms=T / 2))
    clock.submit(clock.query(0, length=8), *[clock.query(k, length=16) for k in range(1, 8)])
    time.sleep(T / 1000 / 5)
    clock.submit(clock.query(8, length=8))
    got = clock.wait(9)
    assert_times({k: got[k] for k in (0, 8)}, {0: 3.5 * T, 8: 3.5 * T}, steps=3)
    check_rows(clock)


def test_a_batch_cancelled_in_flight_skips_the_stages_left():
    """Query 0's client cancels while stage 0 runs it: at the next boundary it is answered
    CANCELLED and stages 1 and 2 pass its batch on without computing; query 1, queued behind
    it, is served as usual."""
    slow = 1.5 * T  # longer than CANCEL_IN_FLIGHT_S, so the boundary asks
    clock = Clock(timed_manifest([flat(slow)] * 3), RuntimeConfig())
    first = clock.query(0)
    clock.submit(first)
    first.cancelled = lambda: True
    time.sleep(T / 1000 / 5)  # query 0 has entered alone
    clock.submit(clock.query(1))
    got = clock.wait(2)
    assert clock.answers[0][2].code is Code.CANCELLED and clock.answers[1][2] is None
    assert_times(got, {0: slow, 1: 4 * slow}, steps=4)
    skipped = [t1 - t0 for stage, batch, _, _, t0, t1 in clock.runs if stage > 0 and batch == clock.runs[0][1]]
    assert len(skipped) == 2 and max(skipped) < 10

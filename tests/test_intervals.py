"""The interval arithmetic of comparisons: pooled statistics, paired bootstrap ratios, verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tools.lib.check_cell import Cell, Served, in_turn, looks
from tools.lib.harness import Measured
from tools.lib.intervals import Ratio, against_margin, across_rounds, pooled, ratio, t_quantile
from tools.lib.perf_analyzer import Load, Window

RATE = Load(rate=100)


def window(latency_ms, seconds: float = 1.0, load: Load = RATE) -> Window:
    latency = np.asarray(latency_ms, dtype=float)
    return Window(load, np.arange(len(latency)) / len(latency), latency, seconds,
                  seconds if load.closed else len(latency) / load.offered())


def test_pooled_statistics_take_every_request_of_every_window():
    a, b = window([1, 2, 3, 4]), window([5, 5, 5, 5, 5, 5], seconds=2)
    assert pooled([a, b], "mean") == pytest.approx(4.0)
    assert pooled([a, b], "p99") == 5
    assert pooled([a, b], "throughput") == pytest.approx(10 / 3)
    assert pooled([a, b], "goodput", qos_ms=3) == pytest.approx(3 / 0.1)  # 3 in time over 10 requests at 100/s
    assert np.isnan(pooled([], "mean"))


def test_a_real_difference_is_better_or_worse_and_noise_is_within_noise():
    rng = np.random.default_rng(1)
    base = [window(rng.exponential(10, 400)) for _ in range(4)]
    slower = [window(w.latency_ms * 1.5) for w in base]
    same = [window(rng.exponential(10, 400)) for _ in range(4)]
    r = ratio(slower, base, "mean")
    assert r.value == pytest.approx(1.5) and r.verdict == "worse" and r.low > 1.3
    assert ratio(base, slower, "mean").verdict == "better"
    noise = ratio(same, base, "mean")
    assert noise.low < 1 < noise.high and noise.verdict == "within noise"
    assert noise.high - noise.low < 0.3, "400 requests in each of 4 rounds pin a mean to a few percent"


def test_rounds_are_paired_and_unequal_counts_use_the_common_rounds():
    base = [window([10.0] * 50), window([20.0] * 50)]
    ours = [window([5.0] * 50), window([10.0] * 50), window([999.0] * 50)]
    r = ratio(ours, base, "mean")
    assert r.value == pytest.approx(0.5) and r.low == pytest.approx(0.5) and r.high == pytest.approx(0.5)
    assert r.verdict == "better"


def test_throughput_is_better_when_higher_and_identical_schedules_tie_on_goodput():
    closed = Load(concurrency=4)
    faster = [window([1.0] * 200, seconds=1.0, load=closed) for _ in range(3)]
    slower = [window([1.0] * 100, seconds=1.0, load=closed) for _ in range(3)]
    assert ratio(faster, slower, "throughput").verdict == "better"
    on_time = [window(np.full(100, 5.0)) for _ in range(3)]
    also = [window(np.full(100, 50.0)) for _ in range(3)]
    tie = ratio(also, on_time, "goodput", qos_ms=200)
    assert (tie.value, tie.low, tie.high, tie.verdict) == (1.0, 1.0, 1.0, "within noise")
    assert str(Ratio(0.8, 0.7, 0.9, True)) == "0.80x [0.70, 0.90]"
    assert ratio([], on_time, "mean").verdict == "within noise"


def test_a_ratio_is_shown_within_a_margin_outside_it_or_unresolved_between():
    """``tools.check_auto``'s verdict on a cell: ``auto``'s mean latency (lower is better) or
    answers/s against the better way's, a t interval over the rounds' paired ratios. 3 % slower
    in every round is within 5 %; 20 % slower is outside; 3 % slower in three rounds and 40 % in
    a fourth, where the host slowed, is unresolved; one round says yes or no by its ratio alone;
    no round at all is no."""
    assert against_margin(across_rounds([1.03] * 4, lower_is_better=True), 0.05) == "yes"
    assert against_margin(across_rounds([1.20] * 4, lower_is_better=True), 0.05) == "NO"
    moving = across_rounds([1.03, 1.03 * 1.4, 1.03, 1.03], lower_is_better=True)
    assert moving.low < 1.05 < moving.high and against_margin(moving, 0.05) == "unresolved"
    assert against_margin(across_rounds([1.03], lower_is_better=True), 0.05) == "yes"
    assert against_margin(across_rounds([1.2], lower_is_better=True), 0.05) == "NO"
    assert str(across_rounds([1.2], lower_is_better=True)) == "1.20x"
    assert against_margin(across_rounds([0.97, 0.98, 0.97], lower_is_better=False), 0.05) == "yes"
    assert against_margin(across_rounds([0.80, 0.82, 0.81], lower_is_better=False), 0.05) == "NO"
    assert against_margin(across_rounds([], lower_is_better=False), 0.05) == "NO"


def test_a_cell_with_fewer_paired_rounds_than_asked_for_is_unresolved():
    """A round that lost a window (perf_analyzer hung every time) has no ratio: where three rounds
    were asked for and one is left, its ratio alone says nothing (``tools.check_auto`` then runs
    more rounds, up to ``--max-rounds``); with the rounds asked for, the interval decides."""
    def cell(autos: list[float | None], wanted: int) -> Cell:
        answers = lambda per_s: window([1.0] * int(per_s), load=Load(concurrency=1))  # noqa: E731
        return Cell("slow", "1 in flight", True, {"plain": [answers(100)] * len(autos), "pipeline": [None] * len(autos),
                                                   "auto": [a and answers(a) for a in autos]}, wanted=wanted)

    assert cell([None, None, 87], 3).verdict(0.05) == "unresolved"
    assert cell([87], 1).verdict(0.05) == "NO"  # one round asked for: its ratio says
    assert cell([87, 86, 88], 3).verdict(0.05) == "NO"
    assert cell([None, None, None], 3).verdict(0.05) == "NO"  # nothing measured: no ratio at all


def test_a_verdict_reads_the_models_lives_not_their_rounds():
    """A model's process keeps a speed of its own while it lives, so ``tools.check_auto`` loads
    the models afresh every few rounds (``--reload-every``) and reads a cell over these lives:
    each life's rounds make one ratio (their geometric mean), and the interval is over lives.
    Six rounds that agree within one life show nothing (the next process may read otherwise);
    where two or more rounds were asked for, a cell needs two lives. Loaded once (``lives``
    None), each round is read as a life of its own."""
    answers = lambda per_s: window([1.0] * int(per_s), load=Load(concurrency=1))  # noqa: E731
    rounds = {"plain": [answers(100)] * 6, "pipeline": [answers(80)] * 6,
              "auto": [answers(a) for a in (97, 98, 97, 99, 98, 99)]}
    once = Cell("slow", "1 in flight", True, rounds, wanted=3, lives=[0])
    assert len(once.by_life()) == 1 and once.verdict(0.05) == "unresolved" and math.isnan(once.versus().low)
    halves = Cell("slow", "1 in flight", True, rounds, wanted=3, lives=[0, 3])
    assert halves.by_life() == pytest.approx([(0.97 * 0.98 * 0.97) ** (1 / 3), (0.99 * 0.98 * 0.99) ** (1 / 3)])
    assert halves.verdict(0.05) == "unresolved"  # two lives: one degree of freedom, a wide interval
    lived = Cell("slow", "1 in flight", True, rounds, wanted=3, lives=[0, 2, 4])
    assert lived.verdict(0.05) == "yes" and lived.paired() == pytest.approx([0.97, 0.98, 0.97, 0.99, 0.98, 0.99])
    assert lived.clearly_better(0.05) == "plain"  # the pipeline 0.8x plain in each life
    assert Cell("slow", "1 in flight", True, rounds, wanted=3).by_life() == pytest.approx(lived.paired())


def test_across_rounds_is_the_geometric_mean_with_a_t_interval_that_widens_as_rounds_get_fewer():
    four = across_rounds([0.9, 1.0, 1.1, 1.0], lower_is_better=True)
    assert four.value == pytest.approx((0.9 * 1.1) ** 0.25) and four.low < four.value < four.high
    two = across_rounds([0.9, 1.1], lower_is_better=True)
    assert two.high - two.low > 2 * (four.high - four.low)  # t at 1 degree of freedom is 12.7
    assert across_rounds([1.2, 1.2, 1.2], lower_is_better=True).verdict == "worse"
    assert math.isnan(across_rounds([], lower_is_better=False).value)


def test_t_quantiles_are_the_printed_tables_and_any_level_a_sequential_check_asks_for():
    """Student's t inverted: the 97.5 % points every table prints (1, 2, 9 and 30 degrees of
    freedom; the normal's 1.96 far out), the 99.5 % and 99.95 % ones, and a wider interval at a
    higher confidence (``tools.check_auto --max-rounds`` reads one at each look)."""
    for df, printed in [(1, 12.706), (2, 4.303), (9, 2.262), (30, 2.042), (100_000, 1.960)]:
        assert t_quantile(0.975, df) == pytest.approx(printed, abs=5e-4)
    assert t_quantile(0.995, 9) == pytest.approx(3.250, abs=5e-4)
    assert t_quantile(0.9995, 1) == pytest.approx(636.62, abs=0.01)
    rounds = [0.97, 0.93, 1.01, 0.95]
    once, looked = across_rounds(rounds, False), across_rounds(rounds, False, confidence=0.99)
    assert looked.value == once.value and looked.low < once.low and looked.high > once.high


def test_the_check_says_whether_auto_served_as_the_clearly_better_way():
    """``tools.check_auto``'s choice from a cell's windows (``tools.lib.check_cell``): the better way is clear where the
    other is shown outside the margin of it; ``auto``'s seconds pipelined in which its lone
    batches ran inline count as plain (the slower engine at 1 in flight read ``wrong`` before);
    ``either`` where the two ways are not shown apart."""
    closed = Load(concurrency=1)

    def cell(plain: list[float], pipeline: list[float], served: Served) -> Cell:
        answers = lambda per_s: window([1.0] * int(per_s), load=closed)  # noqa: E731  one second's answers
        rounds = {"plain": [answers(a) for a in plain], "pipeline": [answers(a) for a in pipeline],
                  "auto": [answers(a) for a in plain]}
        return Cell("slow", "1 in flight", True, rounds, wanted=3, served=[served] * 3)

    pipelined = Served({"pipeline": 5.0})
    apart = cell([103, 104, 102], [93, 92, 94], pipelined)
    assert apart.clearly_better(0.05) == "plain" and apart.choice(0.05) == "wrong"
    lone = cell([103, 104, 102], [93, 92, 94], Served({"pipeline": 5.0}, inline=0.94))
    assert lone.served_label() == "plain 94% / pipeline 6%" and lone.choice(0.05) == "right"
    assert str(lone.served[0]) == "pipeline:5.0 (lone inline 94%)"
    assert cell([103, 104, 102], [93, 92, 94], Served({"fused": 2.5, "pipeline": 2.5})).choice(0.05) == "mixed"
    close = cell([103, 104, 102], [101, 102, 103], pipelined)
    assert close.clearly_better(0.05) is None and close.choice(0.05) == "either"
    assert cell([103, 104, 102], [93, 92, 94], Served.of(None)).choice(0.05) == "-"  # a window lost
    # a window half pipelined: its calls split by seconds, of which the lone inline ones are a share
    measured = Measured(window([1.0]), served={"fused": 2.0, "pipeline": 2.0}, calls={"executes": 200, "inline": 50})
    assert Served.of(measured).inline == pytest.approx(0.5)
    assert Served.of(Measured(window([1.0]), served={"fused": 4.0}, calls={"executes": 200})).inline == 0.0


def test_a_cell_is_read_at_looks_spaced_apart_and_leaves_the_clearly_worse_way_out():
    """``tools.check_auto --max-rounds`` reads a cell after each 1.5 times the rounds of the look
    before (``looks``), where it had read it after every round: fewer looks, each a narrower
    interval. Once plain and the pipeline are shown more than the margin apart, the worse runs no
    more (``Cell.drop_worse``): its later rounds hold no window and write no line, and the verdict,
    the better way and the choice read on."""
    assert looks(2, 24) == (2, 3, 5, 8, 12, 18, 24)
    assert looks(3, 3) == (3,) and looks(2, 3) == (2, 3) and looks(2, 6) == (2, 3, 5, 6)
    closed = Load(concurrency=1)
    answers = lambda per_s: window([1.0] * int(per_s), load=closed)  # noqa: E731  one second's answers
    rounds = {"plain": [answers(a) for a in (103, 104, 102)], "pipeline": [answers(a) for a in (93, 92, 94)],
              "auto": [answers(a) for a in (97, 104, 96)]}
    cell = Cell("slow", "1 in flight", True, rounds, wanted=3, served=[Served({"fused": 5.0})] * 3)
    close = Cell("slow", "1 in flight", True, {**rounds, "pipeline": [answers(a) for a in (103, 102, 101)]}, wanted=3)
    close.drop_worse(0.05)
    assert close.dropped == {} and close.running(3) == ("plain", "pipeline", "auto")
    cell.drop_worse(0.05)
    assert cell.dropped == {"pipeline": 3}
    assert cell.running(2) == ("auto", "plain", "pipeline") and cell.running(3) == ("auto", "plain")
    assert cell.running(4) == ("plain", "auto")
    for turn, per_s in ((3, (102, 101)), (4, (103, 102))):
        for model, figure in zip(cell.running(turn), per_s):
            cell.rounds[model].append(answers(figure))
        cell.rounds["pipeline"].append(None)
        cell.served.append(Served({"fused": 5.0}))
    assert cell.best == "plain" and len(cell.paired()) == 5 and cell.choice(0.05) == "right"
    lines = cell.windows()
    assert [(line[2], line[3]) for line in lines[9:]] == [("4", "auto"), ("4", "plain"), ("5", "plain"), ("5", "auto")]


def test_each_way_takes_each_place_in_a_round_alike_and_none_runs_twice_in_a_row():
    """A window's place in its round read a copy of one model 1.05x-1.09x another copy (the
    middle of a round, reversed every other round, against its ends), so rounds rotate."""
    ways = ("plain", "pipeline", "auto", "ensemble")
    for count in (3, 4):
        order = [in_turn(ways[:count], turn) for turn in range(count)]
        assert all(sorted(places) == sorted(ways[:count]) for places in zip(*order))
        run = [way for round_ in order * 2 for way in round_]
        assert all(a != b for a, b in zip(run, run[1:]))
    assert in_turn(("auto", "plain"), 1) == ("plain", "auto")

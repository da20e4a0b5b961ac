"""The host's serving costs, measured when a model loads, on the host where it serves.

What the stub's interpreter spends to serve one batch through the pipeline (the entry, the
executors' hand-offs, the exit) and inside ``execute`` (as served plain), at one request a
batch and at many, on the model's own engines and inputs shaped like its own: CPU time of this
process, so engines that run beside the host (a GPU; timed) add only what launching them costs
it. A batch's fixed cost and a request's follow from the two sizes. A pipelined request is also
answered by a ``send()``, a round trip to tritonserver that no run here makes: ``round_trip``
(the backend's: one call to Triton's process) is timed for it. A lone batch's wall time each
way is timed too: what the pipeline adds to it beyond its CPU is the hand-offs' latency (threads
woken on other cores), which the CPU does not show (a lent H200's 16 cores: the forced pipeline
answered one request in flight in 2.42 ms where the plain model took 1.43). ``decide`` reads
the result; serving corrects it with what it shows (``decide.ModeSwitch``). Where a policy weighs
power (``policy: smdp``), the device's energy per batch size is measured too, from its own
counter (``energy``).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .decide import HostCosts
from .host import TICK_S
from .device import Device
from .manifest import Manifest
from .query import Query
from .sample import feed_at

log = logging.getLogger(__name__)
BUDGET_S = 1.5  # the engines' own time the measurement may take, at most (it takes 2 runs a way and size at least)
ROUNDS = 30  # runs a size at most
TRIPS = 50  # round trips timed
TURN = 5  # runs of one way and size in a row (``_per_batch``)
ENERGY_RUN_S = 0.25  # each batch size's runs last this long at least: NVML's counter moves in steps of 10-100 ms


def process_cpu_s(pid: int, thread: int | None = None) -> float | None:
    """User + system CPU seconds of process ``pid`` (of its thread ``thread`` alone, where given)
    so far; None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_S
    except (OSError, IndexError, ValueError):
        return None


def host_cpu_s(device: Device, process_s: float | None = None) -> float:
    """This process's CPU seconds so far (``process_s``, where the caller read them), less what
    its threads spent waiting for ``device`` (CUDA spins while it waits: engine time, not serving
    work)."""
    return (time.process_time() if process_s is None else process_s) - device.waited_s


def measure(manifest: Manifest, device: Device, pipeline: Callable[[Sequence[Query]], None],
            plain: Callable[[Sequence[Query]], None], round_trip: Callable[[], None] | None = None,
            budget_s: float = BUDGET_S, plain_sends: bool = False) -> HostCosts:
    """``pipeline`` hands queries over as one batch (they are answered later, from other
    threads: a policy that cut the batch of many in pieces would have their fixed cost put on
    the requests, as Policy I, cutting a crowd of one length into four to fill an idle pipeline,
    had three 0.7 ms stages measure 80 us a request pipelined where ``policy: pass`` measured
    30, and the slower engine 130 against 33: docs/results/calibration-whole-batches);
    ``plain`` runs and answers them before it returns; both on ``device``. ``plain_sends``: a
    plain request is answered by a ``send()`` too (a decoupled model: no response goes in the
    list ``execute`` returns)."""
    tables = [s.latency for s in manifest.stages]
    length, feed = _typical(manifest)
    many = min(manifest.max_batch_size, 32)  # (a batch beyond the largest is one no stage takes)
    sizes = sorted({1, many})
    serves = {"pipeline": lambda qs: _through(pipeline, qs), "plain": plain}

    def runs(rows: int) -> int:
        took = sum(t.predict(rows, length) for t in tables) / 1000 if all(tables) else 0.0
        return int(max(1, min(ROUNDS, budget_s / 4 / took))) if took > 0 else ROUNDS
    costs, walls = _per_batch(serves, device, feed, {(way, rows): runs(rows) for rows in sizes for way in serves})
    trip = _round_trip_s(round_trip)
    handoff = max(0.0, walls["pipeline", 1] - walls["plain", 1] - (costs["pipeline", 1] - costs["plain", 1]))

    def line(way: str) -> tuple[float, float]:
        """(per batch, per request): the line through a batch of one and one of ``many``; where
        every batch is one request (``max_batch_size`` 1), all of its cost is the request's."""
        if many == 1:
            return 0.0, costs[way, 1]
        per_request = max(0.0, (costs[way, many] - costs[way, 1]) / (many - 1))
        return max(0.0, costs[way, 1] - per_request), per_request

    (pipe_batch, pipe_request), (plain_batch, plain_request) = line("pipeline"), line("plain")
    return HostCosts(pipeline_batch_s=pipe_batch, pipeline_request_s=pipe_request + trip,
                     plain_batch_s=plain_batch, plain_request_s=plain_request + (trip if plain_sends else 0.0),
                     handoff_s=handoff, send_s=0.0 if plain_sends else trip,
                     how=f"measured at load, batches of {' and '.join(map(str, sizes))}"
                     + (f", send {trip * 1e6:.0f} us" if trip else ""))


def energy(manifest: Manifest, plain: Callable[[Sequence[Query]], None], counter: Callable[[], float],
           run_s: float = ENERGY_RUN_S) -> dict[int, float]:
    """Joules per batch of 1, 2, 4, ... one-row queries up to the largest batch, run by ``plain``
    (every stage, waited for): ``counter``'s rise (the device's energy so far, ``nvml.py``) over
    runs of each size repeated for ``run_s``, divided by the runs. What the device draws between
    two runs counts too: serving has such gaps as well."""
    _, feed = _typical(manifest)
    top = manifest.max_batch_size
    joules = {}
    for rows in sorted({*(2 ** i for i in range(top.bit_length()) if 2 ** i <= top), top}):
        def batch() -> list[Query]:
            return [Query({k: v.copy() for k, v in feed.items()}, _ignore) for _ in range(rows)]
        plain(batch())  # (warm)
        runs, began, before = 0, time.monotonic(), counter()
        while runs < 2 or time.monotonic() - began < run_s:
            plain(batch())
            runs += 1
        joules[rows] = max(counter() - before, 0.0) / runs
    return joules


def _typical(manifest: Manifest) -> tuple[int | None, dict]:
    """The middle tabulated length, and one query's inputs at it."""
    table = manifest.stages[0].latency
    lengths = table.lengths if table is not None else ()
    length = lengths[len(lengths) // 2] if lengths else None
    return length, feed_at(manifest.inputs, 1, length, manifest.length_axis if length else None, {})


def _per_batch(serves: dict[str, Callable[[Sequence[Query]], None]], device: Device, feed: dict,
               rounds: dict[tuple[str, int], int]) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """This process's CPU seconds and the wall seconds per batch of ``rows`` one-row queries
    served each way, for every (way, rows) in ``rounds``, each the median run's: a run the
    scheduler delayed or another process slowed says nothing of the way, and a mean takes it
    in. The ways and sizes take turns, ``TURN`` runs each after one unmeasured (what the turn
    before left to do, and the pipeline's threads to wake, would land in it), so that a CPU
    slowed for a while (this host's dip up to 30 % for seconds: docs/results/check-process-lives)
    slows every way and size alike, not the one measured then: a request's cost is the
    difference of two sizes' (three 0.7 ms stages loaded forty times, each way and size measured
    in one turn and a mean taken, measured 33-66 us a request pipelined, and 9 of the loads had
    ``execute`` wait for stage 0 at 50-65 % of the stub's interpreter where the rest read
    35-50 %: docs/results/calibration-medians)."""
    spent: dict[tuple[str, int], list[float]] = {key: [] for key in rounds}
    walls: dict[tuple[str, int], list[float]] = {key: [] for key in rounds}
    while due := {key: min(TURN, runs - len(spent[key])) for key, runs in rounds.items() if len(spent[key]) < runs}:
        for (way, rows), turn in due.items():
            for run in range(turn + 1):
                queries = [Query({k: v.copy() for k, v in feed.items()}, _ignore) for _ in range(rows)]
                began, started = host_cpu_s(device), time.perf_counter()
                serves[way](queries)
                if run:
                    spent[way, rows].append(host_cpu_s(device) - began)
                    walls[way, rows].append(time.perf_counter() - started)
    return ({key: statistics.median(values) for key, values in spent.items()},
            {key: statistics.median(values) for key, values in walls.items()})


def _through(pipeline: Callable[[Sequence[Query]], None], queries: Sequence[Query]) -> None:
    """Hand ``queries`` to the pipeline and return once every one is answered."""
    done, left, lock = threading.Event(), [len(queries)], threading.Lock()

    def answered(outputs, failure) -> None:
        with lock:
            left[0] -= 1
            if not left[0]:
                done.set()

    for query in queries:
        query.respond = answered
    pipeline(queries)
    if not done.wait(60):
        raise TimeoutError("the pipeline did not answer the calibration's queries in 60 s")


def _round_trip_s(round_trip: Callable[[], None] | None) -> float:
    """Seconds of one round trip to Triton's process; 0 where there is none to time (or it fails:
    serving then learns the cost of a ``send()`` from what it shows)."""
    if round_trip is None:
        return 0.0
    try:
        round_trip()
    except Exception:  # a probe must never cost the model its load
        log.exception("could not time a round trip to Triton's process")
        return 0.0
    began = time.perf_counter()  # wall time: the stub may hold its interpreter's lock through one
    for _ in range(TRIPS):
        round_trip()
    return (time.perf_counter() - began) / TRIPS


def _ignore(outputs, failure) -> None:
    """The calibration's answers go nowhere."""

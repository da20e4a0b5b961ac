"""What the backend counts while it serves, for Prometheus beside Triton's own metrics.

The runtime records plain in-process counters (an append to a deque: cheap enough for every
batch item); the backend's entry file copies them, and the runtime's gauges, into Triton's custom
metrics API about once a second, so the hot path never pays for a round trip to the Triton
process. No Triton or CUDA here.

Families (every metric also carries Triton's ``model`` and ``version`` labels, and each gauge
its instance's name: ``model.MetricsExporter``):

- ``dvabatch_meta_operations_total{kind}``: meta operations applied, ``new``, ``stretch``, ``split``;
- ``dvabatch_batches_total{stage, rows}``: batch items each stage ran, by the rows in the item
  (the batch sizes formed, exactly; rows per batch is their weighted mean);
- ``dvabatch_stage_busy_us_total{stage}``: wall time each stage spent on its items;
- ``dvabatch_entry_queries_total``, ``dvabatch_entry_wait_us_total``: queries admitted and the time
  they waited at the entry (the pipeline's queue; Triton's own queue is ``nv_inference_queue_*``);
- ``dvabatch_pipeline_answers_total``, ``dvabatch_pipeline_answer_us_total``: queries answered from
  the pipeline (a ``send()`` each, after ``execute`` returned) and their time from arriving in
  ``execute`` to the send returning: a pipelined request's latency inside the model;
- ``dvabatch_queries_waiting``, ``dvabatch_queries_in_flight``: queries at the entry, and queries
  handed to the backend and not yet answered;
- ``dvabatch_executes_total``, ``dvabatch_execute_us_total``, ``dvabatch_execute_idle_us_total``:
  calls of ``execute``, the wall time inside them and the time between one call's end and the
  next's start (served plain: the instance's busy and idle time, which ``decide.ModeSwitch``
  reads);
- ``dvabatch_lone_batches_total{ran}``: batches that found the pipeline empty, by where they ran:
  ``inline`` (every stage inside ``execute``, answered in its list) or ``pipeline``
  (``decide.LoneRuns``);
- ``dvabatch_serving{mode}``: 1 for the way the model serves now, 0 for those it served in
  before (``pipeline``; ``fused``: one session inside ``execute`` as a plain model; ``in_turn``:
  the stages one after another inside ``execute``; ``decide``, ``decide.ModeSwitch``);
- ``dvabatch_serving_seconds_total{mode}``: the seconds the model has served each way since it
  loaded: where ``auto`` switches, how much of a stretch of load it served pipelined and how much
  plain, which the gauge, read once, cannot say (``tools.check_auto`` reads it around each window);
- ``dvabatch_execute_waits``: 1 where a pipelined ``execute`` waits until stage 0 has computed
  its queries, 0 where it returns at once (``decide.waits`` at load; on engines that
  overlap, ``decide.EntryWait`` while it serves);
- ``dvabatch_predicted_capacity{serving}``: the requests/s predicted at load for ``plain`` and
  ``pipeline`` serving from the tables and the host's measured costs (``decide.capacities``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "counter" or "gauge"
    description: str


META_OPERATIONS = Family("dvabatch_meta_operations_total", "counter",
                         "Meta operations applied to ongoing batches, by kind (new, stretch, split)")
BATCHES = Family("dvabatch_batches_total", "counter", "Batch items each stage ran, by stage and rows in the item")
STAGE_BUSY = Family("dvabatch_stage_busy_us_total", "counter",
                    "Microseconds each stage spent running batch items (wall time)")
ENTRY_QUERIES = Family("dvabatch_entry_queries_total", "counter", "Queries admitted into the pipeline")
ENTRY_WAIT = Family("dvabatch_entry_wait_us_total", "counter",
                    "Microseconds admitted queries waited at the entry of the pipeline")
ANSWERS = Family("dvabatch_pipeline_answers_total", "counter", "Queries answered from the pipeline (send())")
ANSWER_TIME = Family("dvabatch_pipeline_answer_us_total", "counter",
                     "Microseconds from a query's arrival in execute to its answer sent from the pipeline")
WAITING = Family("dvabatch_queries_waiting", "gauge", "Queries waiting at the entry of the pipeline")
IN_FLIGHT = Family("dvabatch_queries_in_flight", "gauge", "Queries handed to the backend and not yet answered")
EXECUTES = Family("dvabatch_executes_total", "counter", "Calls of the model's execute")
EXECUTE_TIME = Family("dvabatch_execute_us_total", "counter",
                      "Microseconds spent inside the model's execute (wall time)")
EXECUTE_IDLE = Family("dvabatch_execute_idle_us_total", "counter",
                      "Microseconds between one call of the model's execute ending and the next beginning")
RETURNED = Family("dvabatch_returned_answers_total", "counter",
                  "Queries answered in the list execute returns, run inside it (served plain, a lone batch inline)")
RETURNED_TIME = Family("dvabatch_returned_answer_us_total", "counter",
                       "Microseconds of the execute calls that ran and returned their queries, once for each query")
LONE = Family("dvabatch_lone_batches_total", "counter",
              "Batches that found the pipeline empty, by where they ran (inline: inside execute; pipeline)")
SERVING = Family("dvabatch_serving", "gauge",
                 "1 for how the model serves: pipeline, fused (one session inside execute) or in_turn")
SERVED = Family("dvabatch_serving_seconds_total", "counter",
                "Seconds the model has served each way (pipeline, fused or in_turn) since it loaded")
EXECUTE_WAITS = Family("dvabatch_execute_waits", "gauge",
                       "1 where a pipelined execute waits for stage 0 to run its queries, 0 where it returns at once")
CAPACITY = Family("dvabatch_predicted_capacity", "gauge",
                  "Requests/s predicted at load for plain and pipeline serving, from the tables and the host's costs")
FAMILIES = {f.name: f for f in (META_OPERATIONS, BATCHES, STAGE_BUSY, ENTRY_QUERIES, ENTRY_WAIT, ANSWERS, ANSWER_TIME,
                                WAITING, IN_FLIGHT, EXECUTES, EXECUTE_TIME, EXECUTE_IDLE, RETURNED, RETURNED_TIME, LONE,
                                SERVING, SERVED, EXECUTE_WAITS, CAPACITY)}


Key = tuple[str, Labels]
FOLD_AT = 65536  # updates recorded before the recorder folds them itself
ENTRY_ADMITTED: Key = (ENTRY_QUERIES.name, ())  # the queries admitted, as the windows read them (``serving.Watch``)
_ENTRY_WAIT: Key = (ENTRY_WAIT.name, ())
_ANSWERS: Key = (ANSWERS.name, ())
_ANSWER_TIME: Key = (ANSWER_TIME.name, ())
_EXECUTES: Key = (EXECUTES.name, ())
_EXECUTE_TIME: Key = (EXECUTE_TIME.name, ())
_EXECUTE_IDLE: Key = (EXECUTE_IDLE.name, ())
_RETURNED: Key = (RETURNED.name, ())
_RETURNED_TIME: Key = (RETURNED_TIME.name, ())
_INLINE: Key = ("", ())  # a record of ``Metrics.ran_inline``, counted when folded
_EXECUTED: Key = ("", (("", ""),))  # a record of ``Metrics.executed``, counted when folded


@functools.cache
def _meta_key(kind: str) -> Key:
    return META_OPERATIONS.name, (("kind", kind),)


LONE_INLINE: Key = (LONE.name, (("ran", "inline"),))
LONE_PIPELINE: Key = (LONE.name, (("ran", "pipeline"),))
_LONE: dict[bool, Key] = {True: LONE_INLINE, False: LONE_PIPELINE}


@functools.cache
def _stage_keys(stage: int, rows: int) -> tuple[Key, Key]:
    return (BATCHES.name, (("stage", str(stage)), ("rows", str(rows)))), (STAGE_BUSY.name, (("stage", str(stage)),))


class Metrics:
    """Counters the runtime updates; ``snapshot`` gives their totals. Recording appends to a
    deque (atomic, no lock, the keys made once per label value): a plain model's whole Python
    cost is some 20 us a request, and the counters of a batch must cost a small part of that.
    The reader folds what was recorded into the totals, under a lock (about once a second), in
    one loop that runs on warm caches, where each ``execute`` meets caches tritonserver has just
    used: timed inside a real stub at one request in flight, a call served plain paid 3.5 us for
    its counters this way, and 13 us counting them into a dict per thread at once (which a warm
    loop outside a stub had shown cheaper, 2 us against 7 with the fold). A call served plain
    records one item for its ``execute`` and one for its batch (``executed``, ``ran_inline``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counters: dict[Key, float] = {}
        self._recorded: deque[tuple[Key, float]] = deque()
        self._longest_idle_us = 0.0
        self._mode: Key | None = None  # the serving seconds' key of the way it serves now (``serving``)
        self._since = 0.0  # when those seconds were last counted
        self._woken: threading.Event | None = None  # set at the next record (``wake``)

    def meta_operation(self, kind: str) -> None:
        self._add((_meta_key(kind), 1))

    def stage_ran(self, stage: int, rows: int, seconds: float) -> None:
        batches, busy = _stage_keys(stage, rows)
        self._add((batches, 1), (busy, seconds * 1e6))

    def admitted(self, queries: int, waited_s: float, operation: str, batches: int = 1) -> None:
        """``queries`` taken from the entry, having waited ``waited_s`` seconds there in all, by
        ``batches`` meta operations of kind ``operation`` (``new`` batches, or a ``stretch``)."""
        self._add((ENTRY_ADMITTED, queries), (_ENTRY_WAIT, waited_s * 1e6), (_meta_key(operation), batches))

    def ran_inline(self, queries: int, waited_s: float, batches: int,
                   runs: Sequence[tuple[int, Sequence[float]]]) -> None:
        """A call served inside ``execute`` (``whole.py``): ``queries`` admitted, having waited
        ``waited_s`` in all, as ``batches`` new batches, which ran as ``runs`` (each its rows and the
        clock before and after each stage; more than ``batches`` where a batch failed and its
        queries ran alone). Recorded as it is and counted by the reader: a model served plain
        pays for its counters on every ``execute``."""
        self._add((_INLINE, (queries, waited_s, batches, runs)))

    def answered(self, seconds: float) -> None:
        """A query answered from the pipeline ``seconds`` after it arrived in ``execute``."""
        self._add((_ANSWERS, 1), (_ANSWER_TIME, seconds * 1e6))

    def executed(self, seconds: float, idle_s: float, returned: int = 0) -> None:
        """An ``execute`` call took ``seconds``, ``idle_s`` after the previous one ended, and ran
        and returned ``returned`` queries (0 where it handed them to the pipeline): each of those
        took the whole call, which the pipeline's answers' time (``answered``) does not see."""
        self._add((_EXECUTED, (seconds * 1e6, idle_s * 1e6, returned)))

    def longest_idle_s(self) -> float:
        """The longest idle before an ``execute`` call (``executed``) since the last time asked:
        where a load stopped or started, the one gap that is no client's round trip."""
        with self._lock:
            self._fold()
            longest, self._longest_idle_us = self._longest_idle_us, 0.0
        return longest / 1e6

    def lone(self, inline: bool) -> None:
        """A batch found the pipeline empty and ran ``inline`` inside ``execute``, or in the pipeline."""
        self._add((_LONE[inline], 1))

    def serving(self, mode: str, capacity: Mapping[str, float]) -> None:
        """Set when the model loads and when it switches: gauges kept beside the counters,
        exported with them (1 for the mode it serves in, 0 for those it served in before)."""
        with self._lock:
            self._count_served()
            for key in self._counters:
                if key[0] == SERVING.name:
                    self._counters[key] = 0.0
            self._counters[(SERVING.name, (("mode", mode),))] = 1.0
            self._mode = (SERVED.name, (("mode", mode),))
            for way, rate in capacity.items():
                self._counters[(CAPACITY.name, (("serving", way),))] = rate

    def clear(self) -> None:
        """Forget every counter (what loading ran to measure the host is not the model's)."""
        with self._lock:
            self._recorded.clear()
            self._longest_idle_us = 0.0
            self._since = time.monotonic()
            self._counters = {k: v for k, v in self._counters.items() if k[0] in (SERVING.name, CAPACITY.name)}

    def snapshot(self) -> dict[Key, float]:
        """Every counter's total, keyed by (family name, labels)."""
        with self._lock:
            self._fold()
            self._count_served()
            return dict(self._counters)

    def _count_served(self) -> None:
        """Add the seconds since they were last counted to the way the model serves now (under the lock)."""
        now = time.monotonic()
        if self._mode is not None:
            self._counters[self._mode] = self._counters.get(self._mode, 0.0) + now - self._since
        self._since = now

    def wake(self, event: threading.Event) -> None:
        """Set ``event`` at the next record, once: a thread that waits for serving to resume
        sleeps until it does (``serving.Watch._resumed``) instead of polling the counters."""
        self._woken = event

    def _add(self, *updates: tuple[Key, float]) -> None:
        self._recorded.extend(updates)
        if self._woken is not None:  # (two recorders at once may both set it: harmless)
            woken, self._woken = self._woken, None
            if woken is not None:
                woken.set()
        if len(self._recorded) > FOLD_AT:  # nobody reads (a model outside Triton): keep it small
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Count what was recorded. The two records every call served plain makes (``executed``,
        ``ran_inline``) are summed in locals first and counted once: the reader's fold took 7 ms
        for 2,000 such calls, counted a record's update at a time, and it shares the stub's
        interpreter with ``execute`` (near-zero compute under Poisson loads, 2-4 us a request)."""
        recorded, counters = self._recorded, self._counters
        executes = execute_us = idle_us = returned = returned_us = queries = wait_us = new = 0.0
        inline = False
        longest = self._longest_idle_us
        ran: dict[tuple[int, int], list[float]] = {}  # (stage, rows) -> [items, busy us]
        while recorded:
            record, value = recorded.popleft()
            if record is _EXECUTED:
                executes += 1
                execute_us += value[0]
                idle_us += value[1]
                returned += value[2]
                returned_us += value[0] * value[2]
                if value[1] > longest:
                    longest = value[1]
            elif record is _INLINE:
                inline = True
                count, waited_s, batches, runs = value
                queries += count
                wait_us += waited_s * 1e6
                new += batches
                for rows, clock in runs:
                    for stage in range(len(clock) - 1):
                        item = ran.get((stage, rows))
                        if item is None:
                            item = ran[stage, rows] = [0.0, 0.0]
                        item[0] += 1
                        item[1] += (clock[stage + 1] - clock[stage]) * 1e6
            else:
                counters[record] = counters.get(record, 0.0) + value
        self._longest_idle_us = longest
        updates = [(_EXECUTES, executes), (_EXECUTE_TIME, execute_us), (_EXECUTE_IDLE, idle_us),
                   (_RETURNED, returned), (_RETURNED_TIME, returned_us)] if executes else []
        if inline:
            updates += ((ENTRY_ADMITTED, queries), (_ENTRY_WAIT, wait_us), (_meta_key("new"), new))
        for (stage, rows), (items, busy_us) in ran.items():
            batches_key, busy_key = _stage_keys(stage, rows)
            updates += ((batches_key, items), (busy_key, busy_us))
        for key, value in updates:
            counters[key] = counters.get(key, 0.0) + value

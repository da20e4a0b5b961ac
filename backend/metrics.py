"""What the backend counts while it serves, for Prometheus beside Triton's own metrics.

The runtime updates plain in-process counters (a lock and a dict: cheap enough for every batch
item); the backend's entry file copies them, and the runtime's gauges, into Triton's custom
metrics API about once a second, so the hot path never pays for a round trip to the Triton
process. No Triton or CUDA here.

Families (every metric also carries Triton's ``model`` and ``version`` labels):

- ``dvabatch_meta_operations_total{kind}``: meta operations applied, ``new``, ``stretch``, ``split``;
- ``dvabatch_batches_total{stage, rows}``: batch items each stage ran, by the rows in the item
  (the batch sizes formed, exactly; rows per batch is their weighted mean);
- ``dvabatch_stage_busy_us_total{stage}``: wall time each stage spent on its items;
- ``dvabatch_entry_queries_total``, ``dvabatch_entry_wait_us_total``: queries admitted and the time
  they waited at the entry (the pipeline's queue; Triton's own queue is ``nv_inference_queue_*``);
- ``dvabatch_queries_waiting``, ``dvabatch_queries_in_flight``: queries at the entry, and queries
  handed to the backend and not yet answered;
- ``dvabatch_serving{mode}``: 1 for the way the model serves, decided when it loaded (``pipeline``;
  ``fused``: one session inside ``execute`` as a plain model; ``in_turn``: the stages one after
  another inside ``execute``; ``serving.py``);
- ``dvabatch_predicted_capacity{serving}``: the requests/s that decision predicted for ``plain``
  and ``pipeline`` serving, where it compared them (``Policy.choose``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
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
WAITING = Family("dvabatch_queries_waiting", "gauge", "Queries waiting at the entry of the pipeline")
IN_FLIGHT = Family("dvabatch_queries_in_flight", "gauge", "Queries handed to the backend and not yet answered")
SERVING = Family("dvabatch_serving", "gauge",
                 "1 for how the model serves: pipeline, fused (one session inside execute) or in_turn")
CAPACITY = Family("dvabatch_predicted_capacity", "gauge",
                  "Requests/s predicted at load for plain and pipeline serving, where the policy compared them")
FAMILIES = {f.name: f for f in (META_OPERATIONS, BATCHES, STAGE_BUSY, ENTRY_QUERIES, ENTRY_WAIT, WAITING, IN_FLIGHT,
                                SERVING, CAPACITY)}


class Metrics:
    """Counters the runtime updates; ``snapshot`` gives their totals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Labels], float] = {}

    def meta_operation(self, kind: str) -> None:
        self._add(META_OPERATIONS, (("kind", kind),), 1)

    def stage_ran(self, stage: int, rows: int, seconds: float) -> None:
        self._add(BATCHES, (("stage", str(stage)), ("rows", str(rows))), 1)
        self._add(STAGE_BUSY, (("stage", str(stage)),), seconds * 1e6)

    def admitted(self, waits: Iterable[float]) -> None:
        """Queries taken from the entry, with the seconds each waited there."""
        waits = list(waits)
        self._add(ENTRY_QUERIES, (), len(waits))
        self._add(ENTRY_WAIT, (), sum(waits) * 1e6)

    def serving(self, mode: str, capacity: Mapping[str, float]) -> None:
        """Set once, when the model loads: gauges kept beside the counters, exported with them."""
        with self._lock:
            self._counters[(SERVING.name, (("mode", mode),))] = 1.0
            for way, rate in capacity.items():
                self._counters[(CAPACITY.name, (("serving", way),))] = rate

    def snapshot(self) -> dict[tuple[str, Labels], float]:
        """Every counter's total, keyed by (family name, labels)."""
        with self._lock:
            return dict(self._counters)

    def _add(self, family: Family, labels: Labels, value: float) -> None:
        key = (family.name, labels)
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + value

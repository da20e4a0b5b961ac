"""Client queries before they enter the pipeline: what a query is, how it is answered, whether it
can run at all, and which queries can share a batch.

Nothing here imports Triton: the backend's entry file turns requests into ``Query`` objects.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import TypeVar

import numpy as np

from .manifest import Manifest, TensorSpec
from .padding import length_sizes

T = TypeVar("T")

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


def rows_of(tensors: Mapping[str, object]) -> int:
    """A request's rows as Triton counts them toward a batch (1 where it cannot tell: validation
    answers a malformed request later, on its own)."""
    shape = getattr(next(iter(tensors.values()), None), "shape", ())
    return int(shape[0]) if shape else 1


def longest(inputs: Sequence[Mapping[str, object]], at: tuple[str, int] | None) -> int | None:
    """The longest of requests' sizes on the length axis, which a batch of them is padded to
    (``at``: the input that has it and its place, with the batch axis 0; None where the model has
    no length axis or no request shows it: validation answers a malformed request later)."""
    if at is None:
        return None
    name, axis = at
    sizes = [shape[axis] for tensors in inputs
             if len(shape := getattr(tensors.get(name), "shape", ())) > axis]
    return int(max(sizes)) if sizes else None


_ANSWERING = threading.Lock()


class Code(Enum):
    """What kind of failure, as Triton's error codes say it to the client."""

    INVALID_ARG = "invalid_arg"  # the query's own input cannot run
    INTERNAL = "internal"  # running it failed
    UNAVAILABLE = "unavailable"  # not now: the queue is full, its timeout expired, the model is unloading
    CANCELLED = "cancelled"  # the client gave up on it


@dataclass(frozen=True)
class Failure:
    """Why a query got no outputs."""

    message: str
    code: Code = Code.INTERNAL

    @property
    def bad_input(self) -> bool:
        return self.code is Code.INVALID_ARG

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        """An engine's error, as the queries it cost are told."""
        return cls(f"inference failed: {type(error).__name__}: {error}")


EXPIRED = Failure("Request timeout expired", Code.UNAVAILABLE)  # as Triton's queue policy words it


def each_alone(parts: Sequence[T], run: Callable[[T], None], fail: Callable[[T, Exception], None]) -> None:
    """After a batch failed: run each part (a query, a query's rows) on its own, so that only a
    part that cannot run fails, with its own error."""
    for part in parts:
        try:
            run(part)
        except Exception as exc:  # noqa: BLE001 - a part's error is its own
            fail(part, exc)


# Called exactly once per query: with its outputs, or with a Failure.
Responder = Callable[[Tensors | None, Failure | None], None]
Reply = tuple[Tensors | None, Failure | None]  # a query's outputs, or why it has none


@dataclass(eq=False, slots=True)  # a query is itself, whatever its tensors hold
class Query:
    """One client request: its input tensors (rows first) and how to answer it: through
    ``respond``, or, where it is None (a caller that serves it before returning, as a plain
    model's ``execute`` does), by keeping the answer in ``reply`` for the caller to read. It is
    answered with every output: Triton refuses a request for an output the model does not have
    before ``execute``, and the Python backend's stub drops from each response the outputs its
    request did not ask for (python_backend's ``PruneOutputTensors``), so filtering here would
    only do that work twice."""

    inputs: Tensors
    respond: Responder | None
    arrived: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # time.monotonic() by which the client wants its answer (its timeout)
    cancelled: Callable[[], bool] = lambda: False  # whether the client has given up on it
    answered: bool = field(default=False, init=False)
    asked: float = field(default=0.0, init=False)  # when ``cancelled`` was last called
    # Set by validation: the size of the length axis, and the shapes with it left open (where the
    # model has one: the only axis a batch pads).
    sizes: dict[str, int] = field(default_factory=dict, init=False)
    rigid: tuple | None = field(default=None, init=False)
    reply: Reply | None = field(default=None, init=False)
    # Worked out once, when first asked (``inputs`` never change): the pipeline's entry, batch
    # table and exit ask for them several times a query, and at TensorRT speed the stub's own
    # Python per query bounds what a pipeline answers.
    _rows: int = field(default=0, init=False, repr=False)
    _shape_key: tuple | None = field(default=None, init=False, repr=False)

    @property
    def rows(self) -> int:
        if not self._rows:
            self._rows = len(next(iter(self.inputs.values())))
        return self._rows

    def expired(self, now: float) -> bool:
        """Whether its timeout (its request's, or the queue policy's default) has passed."""
        return self.deadline is not None and self.deadline <= now

    def gave_up(self, now: float, every: float) -> bool:
        """Whether the client cancelled it, asked only once it has waited ``every`` seconds and
        at most once per ``every``: asking Triton is a round trip to its process, too dear for
        every query at every step, and a client rarely gives up on a quick answer."""
        if now - self.arrived < every or now - self.asked < every:
            return False
        self.asked = now
        return self.cancelled()

    def answer(self, outputs: Tensors | None = None, failure: Failure | None = None) -> bool:
        """Send the response, once: a query whose rows were split answers when its last rows
        leave, or at its first failure, and never again; whether this call answered it (the
        exit counts the answers it sent). A failure to send (a client gone) must not stop the
        pipeline."""
        with _ANSWERING:
            if self.answered:
                return False
            self.answered = True
        if self.respond is None:
            self.reply = outputs, failure
            return True
        try:
            self.respond(outputs, failure)
        except Exception:  # the response channel is outside our control
            log.exception("could not send a response")
        return True


def waited(queries: Sequence[Query], now: float) -> float:
    """Seconds ``queries`` have waited since they arrived, in all (what the entry counts)."""
    return len(queries) * now - sum(q.arrived for q in queries)


@functools.cache
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


def validate(manifest: Manifest, query: Query, limits: Mapping[str, int] | None = None) -> str | None:
    """Why ``query`` cannot run, or None. Names the tensor and what was expected. ``limits``: the
    largest size of each named axis (by default what the model was profiled for; see
    ``Manifest.size_limits``)."""
    specs = manifest.inputs
    limits = manifest.size_limits if limits is None else limits
    named: dict[str, tuple[int, str]] = {}
    rows: int | None = None
    for spec in specs:
        array = query.inputs.get(spec.name)
        if array is None:
            return f"input '{spec.name}' is missing"
        if array.dtype != _dtype(spec.dtype):
            return f"input '{spec.name}' has dtype {array.dtype.name}, expected {spec.dtype}"
        if array.ndim != 1 + len(spec.dims):
            return (f"input '{spec.name}' has shape {list(array.shape)}, expected "
                    f"[{', '.join(['batch', *(str(d) for d in spec.dims)])}]")
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            return f"input '{spec.name}' has {array.shape[0]} rows, other inputs have {rows}"
        for axis, (size, dim) in enumerate(zip(array.shape[1:], spec.dims), start=1):
            if size == 0:
                return f"input '{spec.name}' is empty on axis {axis} ({dim}), shape {list(array.shape)}"
            if isinstance(dim, str) and limits.get(dim, 0) and size > limits[dim]:
                return (f"input '{spec.name}' has {dim}={size}, more than the {limits[dim]} this model serves "
                        f"(parameter 'max_size.{dim}' in config.pbtxt raises it)")
            if isinstance(dim, int) and dim >= 0 and size != dim:
                return (f"input '{spec.name}' has size {size} on axis {axis}, expected {dim} "
                        f"(shape {list(array.shape)})")
            if isinstance(dim, str):
                first = named.setdefault(dim, (size, spec.name))
                if first[0] != size:
                    return (f"input '{spec.name}' has {dim}={size} but input '{first[1]}' has "
                            f"{dim}={first[0]}")
    if not rows:
        return "the request has no rows"
    if rows > manifest.max_batch_size:
        return f"the request has {rows} rows, more than max_batch_size {manifest.max_batch_size}"
    return None


Judged = dict[tuple, tuple[str | None, dict[str, int], tuple | None]]
JUDGED_MAX = 4096  # input signatures a model remembers the judgement of (then it starts afresh)


def refuse_invalid(manifest: Manifest, queries: Sequence[Query], limits: Mapping[str, int] | None = None,
                   judged: Judged | None = None) -> list[Query]:
    """Answer every query that cannot run with the reason (a client error); return the others,
    with their named sizes and open shapes filled in. ``judged``: the judgements of earlier
    calls for the same model and limits, kept by the caller."""
    good = []
    seen: Judged = {} if judged is None else judged
    if len(seen) > JUDGED_MAX:
        seen.clear()
    for query in queries:
        key = signature(query.inputs)
        judgement = seen.get(key)
        if judgement is None:
            judgement = seen[key] = _judge(manifest, query, limits)
        error, query.sizes, query.rigid = judgement  # the sizes are shared by the queries alike: read only
        if error:
            query.answer(failure=Failure(error, Code.INVALID_ARG))
        else:
            good.append(query)
    return good


_DTYPE, _SHAPE = attrgetter("dtype"), attrgetter("shape")


def signature(inputs: Tensors) -> tuple:
    """What a query's judgement depends on: each input's name, dtype and shape. Queries alike
    are judged once (``refuse_invalid``): a batch of equal shapes costs one validation, and
    unpadded text, whose lengths differ from query to query but recur, one per length the model
    has seen."""
    arrays = inputs.values()  # (built without a comprehension: every served-plain call makes one)
    return tuple(zip(inputs, map(_DTYPE, arrays), map(_SHAPE, arrays)))


def valid_before(judged: Judged, key: tuple) -> bool:
    """Whether inputs of this ``signature`` were judged valid (``refuse_invalid``, with ``judged``)."""
    judgement = judged.get(key)
    return judgement is not None and judgement[0] is None


def refuse_hopeless(queries: Sequence[Query], hopeless: Callable[[Query, float], bool],
                    late_together: Callable[[Sequence[Query], float], list[Query]] | None = None) -> list[Query]:
    """Answer every query that ``hopeless`` says cannot meet its deadline (``Policy.hopeless``: by
    default, whose timeout expired) with Triton's timeout error, and, where the rest run as one
    batch now, those ``late_together`` says that batch would make late (``Policy.late_together``);
    return the others. A policy's bug must not fail them: a query it cannot judge is refused
    only where it expired."""
    now, kept = time.monotonic(), []
    for query in queries:
        try:
            refused = hopeless(query, now)
        except Exception:
            log.exception("the policy failed to say whether a query can meet its deadline")
            refused = query.expired(now)
        if refused:
            query.answer(failure=EXPIRED)
        else:
            kept.append(query)
    if late_together is None or not kept:
        return kept
    try:
        late = {id(query) for query in late_together(kept, now)}
    except Exception:
        log.exception("the policy failed to say which queries a batch would make late")
        return kept
    for query in kept:
        if id(query) in late:
            query.answer(failure=EXPIRED)
    return [query for query in kept if id(query) not in late]


def _judge(manifest: Manifest, query: Query, limits: Mapping[str, int] | None) -> tuple:
    """(why it cannot run or None, its named sizes, its open shapes) of a query."""
    error = validate(manifest, query, limits)
    if error:
        return error, {}, None
    axis = manifest.length_axis
    if axis is None:  # nothing is padded: queries batch with queries of exactly their shape
        return None, {}, None
    return None, length_sizes(manifest.inputs, query.inputs, axis), tuple(
        sorted((spec.name, _open_shape(spec, query.inputs[spec.name], axis)) for spec in manifest.inputs))


def _open_shape(spec: TensorSpec, array: np.ndarray, axis: str) -> tuple:
    """The shape without the batch axis, the length ``axis`` as its name (its size may vary)."""
    return tuple(dim if dim == axis else size for dim, size in zip(spec.dims, array.shape[1:]))


def shape_key(query: Query) -> tuple:
    """Queries with equal keys agree on every axis but the batch axis, so their rows can stack."""
    key = query._shape_key
    if key is None:
        key = query._shape_key = tuple((name, array.shape[1:]) for name, array in sorted(query.inputs.items()))
    return key


@dataclass(frozen=True)
class BatchShape:
    """What the queries of one batch agree on. Exact (``pads`` false): every axis but the batch
    axis, as Triton's batcher without ragged batching requires. Padded: the shapes with named
    axes left open, and the batch's size on each named axis, which no query in it exceeds."""

    key: tuple
    sizes: tuple[tuple[str, int], ...] = ()
    pads: bool = False

    @classmethod
    def of(cls, queries: Sequence[Query], pads: bool = False) -> BatchShape:
        first = queries[0]
        if not pads or first.rigid is None:
            return cls(shape_key(first))
        longest = {name: max(q.sizes[name] for q in queries) for name in first.sizes}
        return cls(first.rigid, tuple(sorted(longest.items())), True)

    def admits(self, query: Query) -> bool:
        if not self.pads:
            return shape_key(query) == self.key
        return query.rigid == self.key and all(query.sizes[name] <= size for name, size in self.sizes)


def take_batch(waiting: Sequence[Query], max_rows: int,
               joins: Callable[[Query, Query], bool] | None = None) -> list[Query]:
    """The first query with every later one that joins it (by default: stacks with it exactly),
    in order, up to ``max_rows`` rows: oldest first, what Triton's dynamic batcher with no delay
    would run next."""
    first = waiting[0]
    batch, rows, shape = [first], first.rows, BatchShape.of([first])
    joins = joins or (lambda _, query: shape.admits(query))
    for query in list(waiting)[1:]:
        if rows + query.rows <= max_rows and joins(first, query):
            batch.append(query)
            rows += query.rows
    return batch


class Handover:
    """The responses of one ``execute`` call through the pipeline. Those ready while ``execute``
    still waits (``Runtime.submit``'s back-pressure) go back in the list it returns, in the one
    message ``execute`` sends anyway; later ones through their requests' own senders, each a
    round trip of its own. Triton takes ``None`` in that list for a request answered through its
    sender (python_backend's ``ProcessReturnedResponses``)."""

    def __init__(self, senders: Sequence[Callable[[object], None]], keeps: bool = True):
        """``keeps`` false: every response goes through its sender (a decoupled model's
        ``execute`` returns none)."""
        self._senders = senders
        self._responses: list[object] = [None] * len(senders)
        self._open = keeps
        self._lock = threading.Lock()

    def deliver(self, index: int, response: object) -> None:
        with self._lock:
            if self._open:
                self._responses[index] = response
                return
        self._senders[index](response)

    def close(self) -> list[object]:
        """The responses delivered so far (None for the rest); later ones are sent."""
        with self._lock:
            self._open = False
            return self._responses

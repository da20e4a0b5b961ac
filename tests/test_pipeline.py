"""The backend's pure runtime with real ONNX Runtime stages: validation, batching, answers."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import pytest

from backend.engine import load_engine
from backend.manifest import Manifest
from backend.pipeline import Failure, Pipeline, Query, take_batch, validate
from slicer.sample import sample_inputs
from slicer.slicing import VERSION

from .conftest import MAX_BATCH


class Inbox:
    """Collects answers; each query must be answered exactly once."""

    def __init__(self):
        self.answers: dict[int, list] = {}
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def query(self, key: int, inputs, requested=()) -> Query:
        def respond(outputs, failure):
            with self.lock:
                self.answers.setdefault(key, []).append((outputs, failure))
                self.done.notify_all()
        return Query(inputs=inputs, respond=respond, requested_outputs=tuple(requested))

    def wait(self, count: int) -> None:
        with self.lock:
            assert self.done.wait_for(lambda: len(self.answers) >= count, timeout=60)


@pytest.fixture
def bert(repository):
    version_dir = repository / "bert_like" / VERSION
    manifest = Manifest.load(version_dir)
    pipeline = Pipeline(manifest, [load_engine(s, version_dir) for s in manifest.stages])
    yield manifest, pipeline
    pipeline.close()


def test_validate_names_what_is_wrong(bert):
    manifest, _ = bert
    check = lambda inputs, req=(): validate(manifest, Inbox().query(0, inputs, req))  # noqa: E731
    good = sample_inputs(manifest.inputs, 2, {"sequence": 6})
    assert check(good) is None
    assert "input 'attention_mask' is missing" in check({"input_ids": good["input_ids"]})
    wrong_dtype = {**good, "input_ids": good["input_ids"].astype(np.int32)}
    assert check(wrong_dtype) == "input 'input_ids' has dtype int32, expected int64"
    assert "expected [batch, sequence]" in check({**good, "attention_mask": good["attention_mask"][:, :, None]})
    assert "sequence=5" in check({**good, "attention_mask": good["attention_mask"][:, :5]})
    assert "rows" in check({**good, "attention_mask": good["attention_mask"][:1]})
    assert "do not exist" in check(good, ["nope"])
    too_many = sample_inputs(manifest.inputs, MAX_BATCH + 1, {"sequence": 6})
    assert "more than max_batch_size" in check(too_many)


def test_take_batch_stacks_matching_shapes_in_order_up_to_max_rows():
    inbox = Inbox()
    shapes = [(2, 4), (1, 6), (3, 4), (4, 4), (2, 4), (1, 6)]
    queries = [inbox.query(i, {"x": np.zeros(s)}) for i, s in enumerate(shapes)]
    waiting = deque(queries)
    taken = []
    while waiting:
        taken.append([queries.index(q) for q in take_batch(waiting, max_rows=7)])
    assert taken == [[0, 2, 4], [1, 5], [3]]


def test_every_query_answered_once_with_its_own_rows(bert, sources):
    manifest, pipeline = bert
    from backend.engine import OnnxRuntimeEngine

    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, 1 + i % MAX_BATCH, {"sequence": 4 + i % 3}, seed=i) for i in range(12)]
    bad = {**feeds[0], "attention_mask": feeds[0]["attention_mask"][:, :2]}
    out_of_vocabulary = {**feeds[1], "input_ids": feeds[1]["input_ids"] + 1000}
    queries = [inbox.query(i, f) for i, f in enumerate(feeds)]
    queries += [inbox.query(100, bad), inbox.query(101, out_of_vocabulary, ["pooler_output"])]
    pipeline.submit(queries[:5])
    pipeline.submit(queries[5:])
    inbox.wait(len(queries))
    assert all(len(answers) == 1 for answers in inbox.answers.values())
    for i, feed in enumerate(feeds):
        outputs, failure = inbox.answers[i][0]
        assert failure is None
        expected = reference.run(feed)
        for name in expected:
            np.testing.assert_allclose(outputs[name], expected[name], atol=1e-5)
    outputs, failure = inbox.answers[100][0]
    assert outputs is None and failure.bad_input and "sequence" in failure.message
    outputs, failure = inbox.answers[101][0]
    assert outputs is None and isinstance(failure, Failure) and not failure.bad_input
    assert "inference failed" in failure.message


class GatedEngine:
    """A real stage engine that records batch sizes and holds its first run until released."""

    def __init__(self, engine):
        self.engine, self.rows, self.release = engine, [], threading.Event()

    def run(self, inputs):
        self.rows.append(len(next(iter(inputs.values()))))
        self.release.wait(30)
        return self.engine.run(inputs)


def test_waiting_queries_are_stacked_into_full_batches(repository):
    version_dir = repository / "resnet_like" / VERSION
    manifest = Manifest.load(version_dir)
    engines = [load_engine(s, version_dir) for s in manifest.stages]
    gate = GatedEngine(engines[0])
    pipeline = Pipeline(manifest, [gate, *engines[1:]])
    inbox = Inbox()
    feeds = [sample_inputs(manifest.inputs, rows, seed=i) for i, rows in enumerate([1, 3, 3, 2, 5, 1])]
    pipeline.submit([inbox.query(0, feeds[0])])
    while not gate.rows:  # the worker holds the first query alone
        threading.Event().wait(0.01)
    pipeline.submit([inbox.query(i, f) for i, f in enumerate(feeds) if i])
    gate.release.set()
    inbox.wait(len(feeds))
    pipeline.close()
    assert gate.rows == [1, 3 + 3 + 2, 5 + 1]
    assert all(len(a) == 1 and a[0][1] is None for a in inbox.answers.values())

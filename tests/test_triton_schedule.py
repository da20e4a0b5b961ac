"""Schedules of the paper's figures through a real tritonserver: timed stages (each keeps its
stream busy for its table's time and passes its rows through) served by the backend, queried
over gRPC at set moments, so the answer times follow from the schedule alone. Multi-entry is
what is checked: a query that arrives while an earlier one is past stage 0 must enter stage 0
at once, under every configured policy and under ``auto``; held back in Triton's queue it would
leave a whole pass later. Tolerance: 60 ms (Triton's queue, gRPC and the stub's hand-offs, on a
2-core machine running the clients too)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend.manifest import LatencyTable, TensorSpec
from tools.lib.timed import write_timed

from .conftest import serving

pytestmark = pytest.mark.wallclock  # every test here times a schedule on the wall clock

T = 100.0  # ms a stage, the paper's time unit
STAGES = 4
TOLERANCE_MS = 60.0
WINDOW_MS = 60.0  # the split schedule's batch window


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


def timed_model(repository, name: str, parameters: dict[str, str]) -> str:
    """Four stages of T at every batch size up to 8, passing ``x`` (float32, a length axis) through."""
    sizes = [1, 2, 4, 8]
    table = LatencyTable.from_json({"batch_sizes": sizes, "mean": [T] * len(sizes)})
    x = (TensorSpec("x", "float32", ("sequence",)),)
    write_timed(name, x, [table] * STAGES, 8, "timed.onnx", "", repository / name, parameters)
    return name


def arrivals(client, model: str, at_ms: list[float]) -> list[float]:
    """Send one query of one row at each of ``at_ms`` (from now); each one's latency in ms, once
    all are answered with their own rows."""
    done, latencies, errors = threading.Event(), {}, []
    began = time.monotonic()

    def send(key: int) -> None:
        x = np.full((1, 4), key, np.float32)
        inputs = [grpcclient.InferInput("x", list(x.shape), "FP32")]
        inputs[0].set_data_from_numpy(x)
        sent = time.monotonic()

        def answered(result, error) -> None:
            if error is not None or not np.array_equal(result.as_numpy("x_out"), x):
                errors.append(error or "rows not its own")
            latencies[key] = (time.monotonic() - sent) * 1000
            if len(latencies) == len(at_ms):
                done.set()
        client.async_infer(model, inputs, answered)

    for key, at in enumerate(at_ms):
        time.sleep(max(0.0, began + at / 1000 - time.monotonic()))
        send(key)
    assert done.wait(30) and not errors, errors
    return [latencies[k] for k in range(len(at_ms))]


@pytest.mark.parametrize("parameters, expected", [
    # Pass-through: the second query enters stage 0 while the first is in stage 1; each takes 4T.
    ({"policy": "pass"}, [4 * T, 4 * T]),
    # auto on an idle model: nothing seen yet, the lone first query enters the pipeline.
    ({"policy": "auto"}, [4 * T, 4 * T]),
    # Stretch (Policy III's meta operation): the second catches up to stage 1 and both leave at 5.2T.
    ({"policy": "fixed", "policy.stretch_latest": "true"}, [5.2 * T, 4 * T]),
], ids=["pass", "auto", "stretch"])
def test_a_query_arriving_while_another_runs_enters_stage_0_at_once(client, repository, parameters, expected):
    name = timed_model(repository, f"timed_{parameters['policy']}_{len(parameters)}", parameters)
    with serving(client, repository, name):
        got = arrivals(client, name, [0, 1.2 * T])
    off = [round(g - e) for g, e in zip(got, expected)]
    assert all(abs(d) <= TOLERANCE_MS for d in off), f"latencies {got} ms, expected {expected} (off {off})"


def test_split_parts_leave_independently(client, repository):
    """Paper, Figure 3, Case II through Triton: four queries together, stage 0 prefers a batch
    of 4, the later stages one row at a time (T/4 a row); split after stage 0 into four parts run
    serially (one buffer pair), they leave at 1.75T, 2.5T, 3.25T and 4T instead of all at 4T,
    after the entry's window of W that gathers the four (one client sends them one after another;
    on a loaded machine Triton may hand them over in separate ``execute`` calls some ms apart)."""
    sizes = [1, 2, 3, 4]
    flat = LatencyTable.from_json({"batch_sizes": sizes, "mean": [T] * 4})
    per_row = LatencyTable.from_json({"batch_sizes": sizes, "mean": [T / 4 * b for b in sizes]})
    x = (TensorSpec("x", "float32", ("sequence",)),)
    name = "timed_split"
    write_timed(name, x, [flat, per_row, per_row, per_row], 4, "timed.onnx", "", repository / name,
                {"policy": "fixed", "policy.split_after": "0", "policy.split_size": "1", "buffer_pairs": "1",
                 "batch_window_ms": str(WINDOW_MS)})
    with serving(client, repository, name):
        got = sorted(arrivals(client, name, [0, 0, 0, 0]))
    expected = [WINDOW_MS + k * T for k in (1.75, 2.5, 3.25, 4)]
    off = [round(g - e) for g, e in zip(got, expected)]
    assert all(abs(d) <= TOLERANCE_MS for d in off), f"latencies {got} ms, expected {expected} (off {off})"

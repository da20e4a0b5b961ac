"""Triton's lifecycle through a real tritonserver (issue 39): request timeouts that pass while a
request waits and while it is in the pipeline, a client that cancels, and ``unload_model`` /
``load_model`` while requests are queued and in flight. Every request gets exactly one answer
(its own rows, or an error that says what happened), nothing hangs, and the server goes on
serving the model (once loaded again) and the models beside it. Each for the pipeline (``policy:
pass``) and the plain path (``batching: triton``: every batch runs inside ``execute``).

The models are timed (3 stages of 200 ms that pass their rows through), so what a request meets
follows from when it is sent; what is asserted is the kind of answer, never how long it took
(answers that depend on a deadline are sent well inside or well past it).

And a model sliced again into the folder a polling tritonserver serves from (``slicer.swap``):
the server sees the old model or the new one, never a mix nor none."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend.engines import OnnxRuntimeEngine
from backend.instances import SHARED
from backend.manifest import LatencyTable, Manifest, TensorSpec
from backend.sample import sample_inputs
from slicer.errors import SliceError
from slicer.slicing import VERSION, slice_model
from tools.lib import prometheus as prom
from tools.lib.client import infer
from tools.lib.processes import free_port
from tools.lib.timed import write_timed
from tools.lib.triton import Server

from .conftest import FAST, serving

T_MS = 200.0
STAGES = 3
PATHS = {"pipeline": {"policy": "pass", "lone_inline": "false"}, "plain": {"batching": "triton"}}


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


def lifecycle_model(repository, name: str, parameters: dict[str, str], max_batch_size: int = 8) -> str:
    """Three stages of T_MS at every batch size, passing ``x`` through, with Triton's queue
    policy honouring each request's own timeout (in Triton's queue too: Triton 24.10 takes a
    request's timeout there only where it is shorter than a default, and without one, none)."""
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch_size]
    table = LatencyTable.from_json({"batch_sizes": sizes, "mean": [T_MS] * len(sizes)})
    write_timed(name, (TensorSpec("x", "float32", ("sequence",)),), [table] * STAGES, max_batch_size,
                "timed.onnx", "", repository / name, parameters)
    config = repository / name / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "dynamic_batching { }", "dynamic_batching { default_queue_policy { allow_timeout_override: true "
        "default_timeout_microseconds: 10000000 } }"))
    return name


@dataclass
class Answers:
    """Each request's answers: its outputs or its error, counted, so that a second answer or a
    missing one shows."""

    expected: int
    results: dict[int, list] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, key: int, x: np.ndarray):
        def answered(result, error) -> None:
            with self.lock:
                own = None if error is not None else np.array_equal(result.as_numpy("x_out"), x)
                self.results.setdefault(key, []).append(error if error is not None else own)
                if len(self.results) == self.expected:
                    self.done.set()
        return answered

    def wait(self, seconds: float = 30) -> dict[int, object]:
        assert self.done.wait(seconds), f"only {sorted(self.results)} of {self.expected} were answered"
        time.sleep(0.2)  # a second answer would come now
        assert all(len(a) == 1 for a in self.results.values()), self.results
        return {key: answers[0] for key, answers in self.results.items()}


def send(client, model: str, key: int, answers: Answers, timeout_us: int | None = None):
    x = np.full((1, 4), key, np.float32)
    inputs = [grpcclient.InferInput("x", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    extra = {"timeout": timeout_us} if timeout_us is not None else {}
    return client.async_infer(model, inputs, answers.callback(key, x), **extra)


def error_text(answer) -> str:
    assert not isinstance(answer, bool), f"expected an error, got an answer (own rows: {answer})"
    return str(answer)


@pytest.mark.parametrize("path", list(PATHS))
def test_timeouts_while_waiting_and_in_the_pipeline(client, repository, path):
    """0: no timeout, runs at once. 1: 100 ms, sent while 0 runs: in the pipeline it waits at the
    entry (the first stage is busy) and expires there. 2: 450 ms and 3: none, sent together
    while 0 runs: they enter together after 0's first stage; 2 expires between stages (due
    100 ms after the first boundary it passes, 100 ms before the second) and is answered there,
    3 goes on to its result. Triton 24.10's batcher now and then holds 2 and 3 for 500 ms (a
    lost wake-up with a queue policy: docs/backend.md, 1 run in 8 here); 2 then expires in
    Triton's queue and gets the same timeout error, 3 its result later. On the plain path
    Triton's batcher has put 1, 2 and 3 in the instance's next batch before they expire (it forms
    it while the instance is busy, and checks timeouts only in its queue), so they may run to
    their results, as a plain model's would: what is asserted there is one answer each."""
    name = lifecycle_model(repository, f"timeouts_{path}", PATHS[path])
    with serving(client, repository, name):
        answers = Answers(4)
        send(client, name, 0, answers)
        time.sleep(T_MS / 4000)
        send(client, name, 1, answers, timeout_us=int(T_MS * 500))
        send(client, name, 2, answers, timeout_us=int(T_MS * 2250))
        send(client, name, 3, answers)
        got = answers.wait()
        assert got[0] is True and got[3] is True, got
        for key in (1, 2):
            assert (path == "plain" and got[key] is True) or "timeout" in error_text(got[key]).lower(), got[key]
        again = Answers(1)
        send(client, name, 4, again)
        assert again.wait() == {4: True}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_request_the_client_cancels(client, repository, path):
    """1 is cancelled by its client while 0 runs: its client hears CANCELLED once, 0 and a
    request after them get their own rows."""
    name = lifecycle_model(repository, f"cancel_{path}", PATHS[path])
    with serving(client, repository, name):
        answers = Answers(2)
        send(client, name, 0, answers)
        time.sleep(T_MS / 4000)
        call = send(client, name, 1, answers)
        time.sleep(T_MS / 2000)
        call.cancel()
        got = answers.wait()
        assert got[0] is True, got
        assert "cancel" in error_text(got[1]).lower(), got[1]
        again = Answers(1)
        send(client, name, 2, again)
        assert again.wait() == {2: True}


@pytest.mark.parametrize("path", list(PATHS))
def test_unload_and_load_while_requests_wait_and_run(client, repository, path):
    """Six requests of one row at a batch size of 2 (one batch runs, the rest wait), then
    ``unload_model``: each of the six is answered once (its rows, or an error), a model beside
    it answers throughout, and once loaded again the model answers."""
    name = lifecycle_model(repository, f"unload_{path}", PATHS[path], max_batch_size=2)
    beside = lifecycle_model(repository, f"beside_{path}", PATHS[path])
    with serving(client, repository, name, beside):
        answers = Answers(6)
        for key in range(6):
            send(client, name, key, answers)
        time.sleep(T_MS / 2000)
        unloading = threading.Thread(target=client.unload_model, args=(name,))
        unloading.start()
        meanwhile = Answers(1)
        send(client, beside, 100, meanwhile)
        got = answers.wait(60)
        unloading.join(60)
        assert not unloading.is_alive(), "unload_model did not return"
        for key, answer in got.items():
            assert answer is True or error_text(answer), (key, answer)
        assert meanwhile.wait() == {100: True}
        client.load_model(name)
        again = Answers(1)
        send(client, name, 7, again)
        assert again.wait() == {7: True}


def test_a_models_instances_serve_one_way_and_leave_nothing_behind(client, repository):
    """Two instances (``instance_group`` count 2) under ``auto``: the one that loads first decides
    for both through one small file named after tritonserver's process and the model
    (``instances.SharedMode``), which says the way they serve; requests spread over both answer
    with their own rows; unloaded, the file is gone, and loaded again, the model makes a new one."""
    name = "lifecycle_two"
    table = LatencyTable.from_json({"batch_sizes": [1, 8], "mean": [2.0, 4.0]})
    write_timed(name, (TensorSpec("x", "float32", ("sequence",)),), [table] * 2, 8, "timed.onnx", "",
                repository / name, {"policy": "auto"})
    config = repository / name / "config.pbtxt"
    config.write_text(re.sub(r"count: \d+", "count: 2", config.read_text()))

    def files(count: int | None = None) -> list[Path]:
        """The model's files, once there are ``count`` (within 10 s: Triton unloads a model's
        instances after ``unload_model`` has returned)."""
        deadline = time.monotonic() + 10
        while len(found := list(SHARED.glob(f"dvabatch-*-{name}.mode"))) != count and time.monotonic() < deadline:
            time.sleep(0.05)
        return found
    with serving(client, repository, name):
        [file] = files(1)
        deadline = time.monotonic() + 10  # (the leader's watch writes the way as it starts)
        while not file.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert file.read_text().split() in (["pipeline"], ["plain"])
        answers = Answers(8)
        for key in range(8):
            send(client, name, key, answers)
        assert answers.wait() == dict.fromkeys(range(8), True)
        client.unload_model(name)
        assert not files(0)
        client.load_model(name)
        assert len(files(1)) == 1
    assert not files(0)


def test_a_model_that_takes_one_request_a_call_loads_and_answers_each(client, repository):
    """``max_batch_size: 1`` through tritonserver, pipelined and under ``auto``: the model loads
    (loading had handed its pipeline a batch of two, which no stage takes, and failed after 60 s)
    and eight requests sent at once are each answered with their own rows."""
    table = LatencyTable.from_json({"batch_sizes": [1], "mean": [2.0]})
    for policy in ("pass", "auto"):
        name = f"lifecycle_one_{policy}"
        write_timed(name, (TensorSpec("x", "float32", ("sequence",)),), [table] * 4, 1, "timed.onnx", "",
                    repository / name, {"policy": policy})
        with serving(client, repository, name):
            answers = Answers(8)
            for key in range(8):
                send(client, name, key, answers)
            assert answers.wait() == dict.fromkeys(range(8), True)


def test_a_polling_server_sees_the_old_model_or_the_new_one_throughout_a_reslice(tmp_path, sources):
    """A tritonserver polling its repository every second serves a model while it is sliced
    again into the same folder (2 stages, then 3), and while a slice that fails verification
    tries to replace it: every request of a client sending throughout is answered, each with the
    unsliced model's outputs; the new model is served once written, and the failed slice changes
    nothing (not a file, not the model served)."""
    repository = tmp_path / "repository"
    out = repository / "resnet"
    slice_model(sources["resnet_like"], out, replace(FAST, stages=2, policy_defaults=False))
    manifest = Manifest.load(out / VERSION)
    feed = sample_inputs(manifest.inputs, 1, seed=3)
    expected = OnnxRuntimeEngine(sources["resnet_like"], [o.name for o in manifest.outputs]).run(feed)
    answers: list[object] = []
    stop = threading.Event()
    server = Server(model_repository=repository, grpc_port=free_port(), http_port=free_port(),
                    metrics_port=free_port(), extra_args=["--model-control-mode=poll", "--repository-poll-secs=1"],
                    log=tmp_path / "server.log")

    def keep_asking(url: str) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            while not stop.is_set():
                try:
                    got = infer(client, "resnet", feed)
                    answers.append(all(np.allclose(got[n], expected[n], atol=1e-4) for n in expected))
                except Exception as exc:  # noqa: BLE001 - what the client heard is the result
                    answers.append(exc)

    def stages_served() -> int:
        served = prom.select(prom.scrape(f"http://127.0.0.1:{server.metrics_port}/metrics"),
                             "dvabatch_batches_total", model="resnet")
        return 1 + max((int(dict(k)["stage"]) for k in served), default=-1)

    with server:
        asking = threading.Thread(target=keep_asking, args=(server.grpc_url,))
        asking.start()
        try:
            slice_model(sources["resnet_like"], out, replace(FAST, stages=3, policy_defaults=False))
            deadline = time.monotonic() + 60
            while stages_served() < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert stages_served() == 3, "the re-sliced model was never served"
            before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
            with pytest.raises(SliceError, match="not written"):
                slice_model(sources["resnet_like"], out, replace(FAST, stages=2, tolerance=-1.0))
            time.sleep(2.5)  # two polls: a changed folder would be reloaded now
            assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
        finally:
            stop.set()
            asking.join(30)
    failures = [a for a in answers if a is not True]
    assert answers and not failures, f"{len(failures)} of {len(answers)} requests failed: {failures[:3]}"
    assert [p.name for p in repository.iterdir()] == ["resnet"]  # no scratch folder in the repository
    assert "failed to load" not in (tmp_path / "server.log").read_text()

"""A real tritonserver started by `python -m tools.serve`, queried over tritonclient gRPC."""

from __future__ import annotations

import os
import queue
import json
import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from backend.engines import OnnxRuntimeEngine
from backend.manifest import Manifest
from backend.sample import sample_inputs
from slicer.slicing import VERSION, slice_model
from tools.lib import prometheus as prom
from tools.lib.client import infer
from tools.lib.processes import children_of, resident_mb
from tools.lib.triton import stubs_of

from .conftest import E2E_STAGES, FAST, MAX_BATCH, serving


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


def test_models_are_served_by_dvabatch(client):
    for name in E2E_STAGES:
        assert client.is_model_ready(name)
        assert client.get_model_config(name, as_json=True)["config"]["backend"] == "dvabatch"


def test_concurrent_requests_equal_unsliced_model(client, repository, sources):
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(36):
        name = list(E2E_STAGES)[i % 3]
        manifest = Manifest.load(repository / name / VERSION)
        rows = int(rng.integers(1, MAX_BATCH + 1))
        feed = sample_inputs(manifest.inputs, rows, {"sequence": int(rng.choice([3, 8, 13]))}, seed=i)
        # Sometimes one output only: the response holds that one (the stub drops the others).
        outputs = [manifest.outputs[-1].name] if i % 5 == 0 else []
        jobs.append((name, feed, outputs))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: infer(client, *job), jobs))
    references = {name: OnnxRuntimeEngine(sources[name], [o.name for o in
                                                           Manifest.load(repository / name / VERSION).outputs])
                  for name in E2E_STAGES}
    for (name, feed, outputs), answer in zip(jobs, answers):
        expected = references[name].run(feed)
        assert set(answer) == set(outputs or expected)
        for output in answer:
            assert answer[output].shape == expected[output].shape
            np.testing.assert_allclose(answer[output], expected[output], atol=1e-5, rtol=0)


def _error(client, model, feed) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        infer(client, model, feed)
    return info.value


def test_bad_requests_get_clear_errors_and_others_succeed(client, repository):
    bert = Manifest.load(repository / "bert_like" / VERSION)
    good_image = {"image": np.ones((2, 3, 32, 32), np.float32)}
    good_text = sample_inputs(bert.inputs, 3, {"sequence": 6})
    bad = {
        "dtype": ("resnet_like", {"image": np.ones((1, 3, 32, 32), np.float64)}),
        "shape": ("resnet_like", {"image": np.ones((1, 3, 31, 32), np.float32)}),
        "sequence": ("bert_like", {**good_text, "attention_mask": good_text["attention_mask"][:, :4]}),
        "vocabulary": ("bert_like", {**good_text, "input_ids": good_text["input_ids"] + 5000}),
        "empty": ("bert_like", sample_inputs(bert.inputs, 1, {"sequence": 0})),
        "too long": ("bert_like", sample_inputs(bert.inputs, 1, {"sequence": 100_000})),
    }
    calls = [("good", "resnet_like", good_image), ("good", "bert_like", good_text)] * 3
    calls += [(kind, model, feed) for kind, (model, feed) in bad.items()]

    def call(item):
        kind, model, feed = item
        try:
            return kind, infer(client, model, feed)
        except InferenceServerException as exc:
            return kind, exc

    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(call, calls))
    for kind, result in results:
        if kind == "good":
            assert isinstance(result, dict), f"a good request failed: {result}"
    errors = {kind: result for kind, result in results if kind != "good"}
    assert all(isinstance(e, InferenceServerException) for e in errors.values())
    assert "data-type is 'FP64'" in errors["dtype"].message()
    assert "unexpected shape for input 'image'" in errors["shape"].message()
    assert "input 'attention_mask' has sequence=4 but input 'input_ids' has sequence=6" in errors["sequence"].message()
    assert errors["sequence"].status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'input_ids' is empty on axis 1 (sequence)" in errors["empty"].message()
    assert "input 'input_ids' has sequence=100000, more than the 64 this model serves" in errors["too long"].message()
    assert "max_size.sequence" in errors["too long"].message()
    assert {errors[k].status() for k in ("empty", "too long")} == {"StatusCode.INVALID_ARGUMENT"}
    assert "inference failed" in errors["vocabulary"].message()
    assert errors["vocabulary"].status() == "StatusCode.INTERNAL"
    # An output the model does not have: Triton refuses the request before execute.
    with pytest.raises(InferenceServerException, match="unexpected inference output 'nope'"):
        infer(client, "bert_like", good_text, outputs=["nope"])
    # The server keeps serving.
    assert client.is_server_live() and client.is_model_ready("bert_like")
    assert infer(client, "bert_like", good_text)["pooler_output"].shape == (3, 32)


def test_memory_stays_at_its_level_after_huge_requests(client, server, repository):
    """Huge lengths are refused before they reach ONNX Runtime, and the largest batches the model
    serves leave its stub's memory where steady serving puts it (the arena grows to the largest
    allowed batch, no further)."""
    bert = Manifest.load(repository / "bert_like" / VERSION)
    longest = bert.size_limits["sequence"]
    triton = next(pid for pid, args in children_of(server.process.pid).items() if args[0].endswith(b"tritonserver"))
    stub = next(pid for pid, model in stubs_of(triton).items() if model == "bert_like")
    largest = sample_inputs(bert.inputs, MAX_BATCH, {"sequence": longest})
    for _ in range(3):
        infer(client, "bert_like", largest)
    steady = resident_mb(stub)
    for length in (10_000, 100_000, 1_000_000):
        _error(client, "bert_like", sample_inputs(bert.inputs, 1, {"sequence": length}))
    for _ in range(10):
        infer(client, "bert_like", largest)
    assert resident_mb(stub) - steady < 20, f"stub grew from {steady:.0f} to {resident_mb(stub):.0f} MiB"


def test_request_larger_than_max_batch_size_is_refused(client):
    with pytest.raises(InferenceServerException, match="batch"):
        infer(client, "resnet_like", {"image": np.ones((MAX_BATCH + 1, 3, 32, 32), np.float32)})


def test_http_json_and_binary_and_shared_memory_clients_get_the_grpc_answers(client, server, repository):
    """A Triton user's other clients: tritonclient HTTP with JSON and with binary tensors, and
    inputs and outputs in system shared memory over gRPC, answer as unary gRPC does; a bad
    request over HTTP is refused with the same message, as a 400."""
    manifest = Manifest.load(repository / "bert_like" / VERSION)
    feed = sample_inputs(manifest.inputs, 3, {"sequence": 7}, seed=3)
    expected = infer(client, "bert_like", feed)

    def over_http(feed: dict, binary: bool = True) -> list:
        tensors = []
        for name, array in feed.items():
            tensors.append(httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            tensors[-1].set_data_from_numpy(array, binary_data=binary)
        return tensors

    with httpclient.InferenceServerClient(server.http_url) as http:
        for binary in (False, True):
            asked = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in expected]
            result = http.infer("bert_like", over_http(feed, binary), outputs=asked)
            for name, array in expected.items():
                np.testing.assert_array_equal(result.as_numpy(name), array)
        bad = dict(feed, attention_mask=feed["attention_mask"][:, :4])
        with pytest.raises(InferenceServerException, match="input 'attention_mask' has sequence=4") as info:
            http.infer("bert_like", over_http(bad))
        assert info.value.status() == "400"
    # Shared memory: the regions named per test run, so a crashed run's leftovers cannot collide.
    tag = f"dvabatch-test-{os.getpid()}"
    regions: dict[str, object] = {}

    def region(name: str, nbytes: int):
        regions[f"{tag}-{name}"] = shm.create_shared_memory_region(f"{tag}-{name}", f"/{tag}-{name}", nbytes)
        client.register_system_shared_memory(f"{tag}-{name}", f"/{tag}-{name}", nbytes)
        return regions[f"{tag}-{name}"]

    try:
        tensors = []
        for name, array in feed.items():
            shm.set_shared_memory_region(region(name, array.nbytes), [array])
            tensors.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            tensors[-1].set_shared_memory(f"{tag}-{name}", array.nbytes)
        pooled = expected["pooler_output"]
        out = region("out", pooled.nbytes)
        asked = grpcclient.InferRequestedOutput("pooler_output")
        asked.set_shared_memory(f"{tag}-out", pooled.nbytes)
        client.infer("bert_like", tensors, outputs=[asked])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out, pooled.dtype, list(pooled.shape)), pooled)
    finally:
        for name, handle in regions.items():
            unregister_when_released(client, name)
            shm.destroy_shared_memory_region(handle)


def unregister_when_released(client, name: str, within_s: float = 10.0) -> None:
    """Unregister a shared-memory region once Triton has released the request that read it.
    Triton 24.10 counts a region's users and refuses to unregister one in use (server PR 7567;
    unregistering deferred until released came after it, PR 7743), and a request is released
    after its response is sent, so a client that unregisters the moment its answer arrives can
    find the region "currently in use" (a fresh clone's CI run at 554f0a0 did, once in many
    runs); the maintainers' advice is to wait until the region is no longer in use."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return client.unregister_system_shared_memory(name)
        except InferenceServerException as exc:
            if "currently in use" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_knobs_come_from_config_pbtxt(client, repository, sources):
    """An invalid knob fails the load naming the parameter; a random policy with one buffer pair
    still answers every concurrent request exactly like the unsliced model."""
    name = "bert_like_knobs"
    shutil.copytree(repository / "bert_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "bert_like"', f'name: "{name}"')
    knob = 'parameters: {{ key: "{}" value: {{ string_value: "{}" }} }}\n'.format
    (repository / name / "config.pbtxt").write_text(config + knob("buffer_pairs", "0"))
    with pytest.raises(InferenceServerException, match="'buffer_pairs' must be at least 1"):
        client.load_model(name)
    sliced = Manifest.load(repository / name / VERSION).max_batch_size
    batch_size = lambda size: re.sub(r"max_batch_size: \d+", f"max_batch_size: {size}", config)  # noqa: E731
    # An interface that disagrees with the sliced model fails the load, naming what disagrees:
    # loaded, it would refuse every request, or answer each one without an output it names.
    for disagrees, says in (
            (batch_size(0), "max_batch_size 0 turns batching off"),
            (batch_size(sliced + 1), f"max_batch_size {sliced + 1} exceeds the {sliced}"),
            (config.replace('"pooler_output"', '"pooled"'), "output 'pooled' is not one of the model's outputs"),
            (config.replace('"input_ids" data_type: TYPE_INT64', '"input_ids" data_type: TYPE_INT32'),
             "input 'input_ids' has data_type TYPE_INT32, the model's is TYPE_INT64"),
            (config.replace("dims: [ 32 ]", "dims: [ 16 ]"), r"output 'pooler_output' has dims \[16\]"),
            (re.sub(r'\s*\{ name: "attention_mask"[^}]*\}', "", config.replace("allow_ragged_batch: true },",
                                                                           "allow_ragged_batch: true }")),
             "lists no input attention_mask")):
        assert disagrees != config
        (repository / name / "config.pbtxt").write_text(disagrees)
        with pytest.raises(InferenceServerException, match=f"disagrees with the sliced model.*{says}"):
            client.load_model(name)
    (repository / name / "config.pbtxt").write_text(
        config + knob("buffer_pairs", "1") + knob("policy", "random") + knob("policy.seed", "11")
        + knob("policy.split_probability", "0.6"))
    client.load_model(name)
    manifest = Manifest.load(repository / name / VERSION)
    feeds = [sample_inputs(manifest.inputs, 1 + i % 4, {"sequence": 5 + i % 2}, seed=i) for i in range(24)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda feed: infer(client, name, feed, []), feeds))
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    for feed, answer in zip(feeds, answers):
        for out, expected in reference.run(feed).items():
            np.testing.assert_allclose(answer[out], expected, atol=1e-5)
    client.unload_model(name)


def test_instances_on_the_cpu_share_its_cores_and_answer_like_the_unsliced_model(client, server, repository,
                                                                                  sources):
    """Two CPU instances (``instance_group`` count 2): each one's sessions take its share of the
    cores (the model's log says so, as Triton's config gave the count), and concurrent requests,
    spread over both stubs, answer as the unsliced model does. The metrics count every query once
    (a counter is the instances' sum) and keep a gauge per instance (one's never overwrites the
    other's)."""
    name = "resnet_like_two"
    shutil.copytree(repository / "resnet_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "resnet_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(re.sub(r"count: \d+", "count: 2", config))
    client.load_model(name)
    try:
        feeds = [{"image": np.random.default_rng(i).random((1 + i % 3, 3, 32, 32), np.float32)} for i in range(16)]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda feed: infer(client, name, feed, []), feeds))
        reference = OnnxRuntimeEngine(sources["resnet_like"], ["logits"])
        for feed, answer in zip(feeds, answers):
            np.testing.assert_allclose(answer["logits"], reference.run(feed)["logits"], atol=1e-5)
        said = [line for line in server.log.read_text().splitlines() if f"{name}: serves" in line]
        assert len(said) == 2 and all("shared by 2 instances" in line for line in said), said
        deadline = time.monotonic() + 30  # each instance exports about once a second, a series at a time
        while True:
            metrics = prom.scrape(server.metrics_url)
            queries = prom.select(metrics, "dvabatch_entry_queries_total", model=name)
            in_flight = prom.select(metrics, "dvabatch_queries_in_flight", model=name)
            if (sum(queries.values()) >= len(feeds) and len(in_flight) == 2) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert list(queries.values()) == [len(feeds)] and all("instance" not in dict(k) for k in queries)
        instances = [f"{name}_0_0", f"{name}_0_1"]
        assert sorted(dict(k)["instance"] for k in in_flight) == instances
        serving = prom.select(metrics, "dvabatch_serving", model=name, mode="pipeline")
        assert sorted(dict(k)["instance"] for k, v in serving.items() if v == 1) == instances
    finally:
        client.unload_model(name)


def test_a_model_sliced_on_another_machine_serves_and_its_log_warns(client, server, repository, sources):
    """The stage tables hold for the machine the slicer measured them on: a model whose manifest
    says another one loads and answers as the unsliced model does, and Triton's log warns, naming
    the command that measures them again here."""
    name = "resnet_like_elsewhere"
    shutil.copytree(repository / "resnet_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "resnet_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(config)
    manifest = json.loads((repository / name / VERSION / "manifest.json").read_text())
    manifest["slicing"]["machine"] = {"cpu": "Intel Xeon Platinum 8480+", "cpus": 112, "gpu": ""}
    (repository / name / VERSION / "manifest.json").write_text(json.dumps(manifest))
    client.load_model(name)
    try:
        feed = {"image": np.random.default_rng(0).random((2, 3, 32, 32), np.float32)}
        np.testing.assert_allclose(infer(client, name, feed, [])["logits"],
                                   OnnxRuntimeEngine(sources["resnet_like"], ["logits"]).run(feed)["logits"], atol=1e-5)
        said = [line for line in server.log.read_text().splitlines() if f"{name}: the stage tables" in line]
        assert len(said) == 1 and "112 CPUs of Intel Xeon Platinum 8480+" in said[0] and "slicer.retime" in said[0]
    finally:
        client.unload_model(name)


@pytest.mark.parametrize("policy", ["pass", "auto"])
def test_a_decoupled_model_answers_each_streamed_request_once_like_the_unsliced_model(client, repository, sources,
                                                                                     policy):
    """``model_transaction_policy { decoupled: true }`` (gRPC streaming clients): every request
    gets one response, flagged final, whether it ran through the pipeline (``pass``) or inside
    ``execute`` (``auto`` serves this CPU model fused), and answers as the unsliced model does."""
    name = f"resnet_like_decoupled_{policy}"
    shutil.copytree(repository / "resnet_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "resnet_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(
        config + "model_transaction_policy { decoupled: true }\n"
        + f'parameters: {{ key: "policy" value: {{ string_value: "{policy}" }} }}\n')
    client.load_model(name)
    answers: queue.Queue = queue.Queue()
    feeds = [np.random.default_rng(i).random((1 + i % 3, 3, 32, 32), np.float32) for i in range(24)]
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, feed in enumerate(feeds):
            tensor = grpcclient.InferInput("image", list(feed.shape), "FP32")
            tensor.set_data_from_numpy(feed)
            client.async_stream_infer(name, [tensor], request_id=str(i))
        got = [answers.get(timeout=30) for _ in feeds]
    finally:
        client.stop_stream()
    assert answers.empty() and all(error is None for _, error in got), [error for _, error in got if error]
    reference = OnnxRuntimeEngine(sources["resnet_like"], ["logits"])
    by_id = {int(result.get_response().id): result for result, _ in got}
    assert sorted(by_id) == list(range(len(feeds)))
    for i, feed in enumerate(feeds):
        assert by_id[i].get_response().parameters["triton_final_response"].bool_param
        np.testing.assert_allclose(by_id[i].as_numpy("logits"), reference.run({"image": feed})["logits"], atol=1e-5)
    client.unload_model(name)


@pytest.mark.parametrize("policy", ["input", "operator", "load", "input+load", "operator+load", "auto", "smdp", "slo"])
def test_every_policy_answers_mixed_lengths_like_the_unsliced_model(client, repository, sources, policy):
    """Unpadded requests of lengths 1-24 sent at once under each of the paper's policies and the
    other papers' (the SMDP's dispatch, Orloj's batching without deadlines): Policy I pads queries
    of different lengths into shared batches (ids and mask padded with 0, so the padding is masked
    out) and cuts the answers back; every answer equals the unsliced model run on that request
    alone, on real ONNX Runtime stages."""
    name = f"bert_like_{policy.replace('+', '_')}"
    shutil.copytree(repository / "bert_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "bert_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(config + f'parameters: {{ key: "policy" value: '
                                                      f'{{ string_value: "{policy}" }} }}\n')
    client.load_model(name)
    assert_mixed_lengths_answered_as_unsliced(client, name, repository, sources["bert_like"], count=40, seed=3)
    client.unload_model(name)


def test_one_request_at_a_time_runs_inside_execute_and_answers_like_the_unsliced_model(client, server, repository,
                                                                                       sources):
    """One client, one request at a time, to a model that pipelines (Policies I and III) and asks
    for lone batches inline (``lone_inline: true``; a configured policy's batches otherwise all
    enter the pipeline): each finds the pipeline empty, so once the first looks saw nothing
    arrive meanwhile most run through every stage inside ``execute`` and go back in its list
    (now and then one enters the pipeline to look again); every answer equals the unsliced
    model's, and Triton's metrics endpoint says where they ran: those inline answered in the list
    ``execute`` returned, the rest from the pipeline."""
    name = "bert_like_lone"
    shutil.copytree(repository / "bert_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "bert_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(config + 'parameters: { key: "policy" value: '
                                                    '{ string_value: "input+load" } }\n'
                                                    'parameters: { key: "lone_inline" value: '
                                                    '{ string_value: "true" } }\n')
    client.load_model(name)
    manifest = Manifest.load(repository / name / VERSION)
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    for i in range(30):
        feed = sample_inputs(manifest.inputs, 1 + i % 2, {"sequence": 3 + i % 10}, seed=i)
        answer = infer(client, name, feed, [])
        for out, expected in reference.run(feed).items():
            np.testing.assert_allclose(answer[out], expected, atol=1e-5, rtol=0)
    deadline, ran, answered = time.monotonic() + 10, {}, {}
    while time.monotonic() < deadline and (sum(ran.values()) < 30 or sum(answered.values()) < 30):
        time.sleep(0.5)  # exported about once a second
        values = prom.scrape(server.metrics_url)
        ran = {dict(labels)["ran"]: value for labels, value in
               prom.select(values, "dvabatch_lone_batches_total", model=name).items()}
        answered = {family: sum(prom.select(values, f"dvabatch_{family}_answers_total", model=name).values())
                    for family in ("returned", "pipeline")}
    assert ran.get("inline", 0) >= 12 and ran.get("pipeline", 0) >= 1, ran
    assert answered == {"returned": ran["inline"], "pipeline": ran["pipeline"]}, (answered, ran)
    client.unload_model(name)


def assert_mixed_lengths_answered_as_unsliced(client, name: str, repository, source, count: int, seed: int) -> None:
    """``count`` unpadded bert_like queries of lengths 1-24 and 1-3 rows sent at once: each answer
    equals the unsliced model run on that query alone."""
    manifest = Manifest.load(repository / name / VERSION)
    rng = np.random.default_rng(seed)
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, {"sequence": int(rng.integers(1, 25))}, seed=i)
             for i in range(count)]
    for feed in feeds:  # unpadded queries, as a tokenizer gives them: every position is a token
        feed["attention_mask"][:] = 1
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda feed: infer(client, name, feed, []), feeds))
    reference = OnnxRuntimeEngine(source, [o.name for o in manifest.outputs])
    for feed, answer in zip(feeds, answers):
        for out, expected in reference.run(feed).items():
            assert answer[out].shape == expected.shape
            np.testing.assert_allclose(answer[out], expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("policy", ["input+load", "auto"])
def test_a_model_sliced_for_torch_answers_like_the_unsliced_model(client, repository, sources, policy):
    """bert_like sliced with --target torch (CPU) through the pipeline (Policy I and III) and as
    auto serves it (stepped aside: the stages fused into one torch graph): mixed unpadded
    lengths at once, every answer equal to the unsliced model's."""
    pytest.importorskip("torch")
    name = f"bert_like_torch_{policy.replace('+', '_')}"
    slice_model(sources["bert_like"], repository / name, replace(FAST, stages=3, target="torch", device="cpu",
                                                                 calibration_rounds=0, policy_defaults=False))
    config = repository / name / "config.pbtxt"
    config.write_text(config.read_text() + f'parameters: {{ key: "policy" value: {{ string_value: "{policy}" }} }}\n')
    client.load_model(name)
    assert_mixed_lengths_answered_as_unsliced(client, name, repository, sources["bert_like"], count=24, seed=5)
    client.unload_model(name)


def test_a_request_with_a_timeout_amid_seconds_of_lone_requests_without_one_is_answered(client, server, sources):
    """Served plain, a lone request without a deadline runs straight from its inputs
    (``WholeBatch.run_straight``), and still tells the backend when its call began: a request's
    wait counts from then (``arrival.TritonQueue``). A request with a timeout of 1 s, sent while
    another client has sent lone requests without one, back to back, for 3 s, is answered, not
    refused as expired."""
    feed = {"image": np.random.default_rng(3).random((1, 3, 32, 32), np.float32)}
    expected = OnnxRuntimeEngine(sources["resnet_like"], ["logits"]).run(feed)["logits"]
    stop = threading.Event()

    def without_timeouts() -> int:
        with grpcclient.InferenceServerClient(server.url) as other:
            sent = 0
            while not stop.is_set():
                infer(other, "resnet_like", feed)
                sent += 1
            return sent
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(without_timeouts)
        time.sleep(3.0)
        try:
            answers = [infer(client, "resnet_like", feed, timeout_us=1_000_000)["logits"] for _ in range(5)]
        finally:
            stop.set()
        assert sent.result() > 100
    for answer in answers:
        np.testing.assert_allclose(answer, expected, atol=1e-5)


# What a Triton user writes around a model: a Python step before it (a tokenizer's stand-in) ...
TOKENS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("ids_out", pb_utils.get_input_tensor_by_name(r, "ids").as_numpy().copy()),
            pb_utils.Tensor("mask_out", pb_utils.get_input_tensor_by_name(r, "mask").as_numpy().copy())])
            for r in requests]
"""
# ... and a Python model that calls it by BLS, the model named in each request, all at once.
BLS_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        return list(await asyncio.gather(*map(self._one, requests)))

    async def _one(self, request):
        called = pb_utils.InferenceRequest(
            model_name=pb_utils.get_input_tensor_by_name(request, "model").as_numpy()[0, 0].decode(),
            requested_output_names=["pooler_output"],
            inputs=[pb_utils.Tensor("input_ids", pb_utils.get_input_tensor_by_name(request, "ids").as_numpy()),
                    pb_utils.Tensor("attention_mask", pb_utils.get_input_tensor_by_name(request, "mask").as_numpy())])
        response = await called.async_exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        pooled = pb_utils.get_output_tensor_by_name(response, "pooler_output").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("pooled", pooled)])
"""


def _python_model(repository, name: str, source: str, inputs: str, outputs: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(source)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH}\ninput [ {inputs} ]\n'
        f'output [ {outputs} ]\ninstance_group [ {{ kind: KIND_CPU count: 1 }} ]\n')


def test_a_users_ensemble_and_bls_model_get_the_unsliced_models_answers(client, repository, sources):
    """What a Triton user builds around a sliced model: an ensemble whose first step is their own
    Python model and whose second is ours, pipelined (``policy: pass``: answers sent through the
    requests' senders after ``execute`` returned), and a Python model calling ours by BLS
    (``async_exec``, several at once), both the pipelined model and the one ``auto`` serves.
    Mixed lengths and rows sent at once: every answer equals the unsliced model's. A request
    ours refuses (longer than it serves) is refused through either, with its message, while
    the others in flight are answered."""
    piped = "bert_like_piped"
    shutil.copytree(repository / "bert_like", repository / piped)
    config = (repository / piped / "config.pbtxt").read_text().replace('name: "bert_like"', f'name: "{piped}"')
    (repository / piped / "config.pbtxt").write_text(config + 'parameters: { key: "policy" value: '
                                                      '{ string_value: "pass" } }\n')
    tokens = '{ name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }, { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] }'
    _python_model(repository, "tokens", TOKENS_MODEL, tokens, tokens.replace('"ids"', '"ids_out"').replace(
        '"mask"', '"mask_out"'))
    _python_model(repository, "bls_caller", BLS_MODEL,
                  tokens + ', { name: "model" data_type: TYPE_STRING dims: [ 1 ] }',
                  '{ name: "pooled" data_type: TYPE_FP32 dims: [ 32 ] }')
    (repository / "ensemble_bert" / "1").mkdir(parents=True)
    (repository / "ensemble_bert" / "config.pbtxt").write_text(f"""name: "ensemble_bert"
platform: "ensemble"
max_batch_size: {MAX_BATCH}
input [ {tokens} ]
output [ {{ name: "pooled" data_type: TYPE_FP32 dims: [ 32 ] }},
         {{ name: "hidden" data_type: TYPE_FP32 dims: [ -1, 32 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "tokens" model_version: -1 input_map {{ key: "ids" value: "ids" }}
     input_map {{ key: "mask" value: "mask" }} output_map {{ key: "ids_out" value: "t_ids" }}
     output_map {{ key: "mask_out" value: "t_mask" }} }},
  {{ model_name: "{piped}" model_version: -1 input_map {{ key: "input_ids" value: "t_ids" }}
     input_map {{ key: "attention_mask" value: "t_mask" }} output_map {{ key: "pooler_output" value: "pooled" }}
     output_map {{ key: "last_hidden_state" value: "hidden" }} }} ] }}
""")
    reference = OnnxRuntimeEngine(sources["bert_like"], ["last_hidden_state", "pooler_output"])
    limit = Manifest.load(repository / "bert_like" / VERSION).size_limits["sequence"]
    rng = np.random.default_rng(11)
    jobs = []
    for i in range(26):
        length = limit + 1 if i in (5, 18) else int(rng.integers(1, 25))
        rows = 1 + i % 3
        feed = {"ids": rng.integers(1, 100, (rows, length)), "mask": np.ones((rows, length), np.int64)}
        if i % 2:  # by BLS, to the pipelined model or the one auto serves
            jobs.append(("bls_caller", {**feed, "model": np.array([[[piped, "bert_like"][i % 4 // 2].encode()]] * rows,
                                                                   dtype=object)}))
        else:
            jobs.append(("ensemble_bert", feed))

    def call(job):
        try:
            return infer(client, *job)
        except InferenceServerException as error:
            return error
    with serving(client, repository, piped, "tokens", "ensemble_bert", "bls_caller"):
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, jobs))
    for i, ((model, feed), answer) in enumerate(zip(jobs, answers)):
        if i in (5, 18):
            assert isinstance(answer, InferenceServerException), (model, answer)
            assert f"input 'input_ids' has sequence={limit + 1}, more than the {limit} this model serves" in \
                answer.message(), answer.message()
            continue
        assert not isinstance(answer, Exception), (model, answer)
        expected = reference.run({"input_ids": feed["ids"], "attention_mask": feed["mask"]})
        np.testing.assert_allclose(answer["pooled"], expected["pooler_output"], atol=1e-4, rtol=0)
        if model == "ensemble_bert":
            np.testing.assert_allclose(answer["hidden"], expected["last_hidden_state"], atol=1e-4, rtol=0)


def test_a_model_whose_stub_was_killed_comes_back(client, repository, server):
    """kill -9 on a model's backend stub: tools.serve notices, loads the model again, and it
    answers right within seconds; the other models never stop."""
    name = "resnet_like_killed"
    shutil.copytree(repository / "resnet_like", repository / name)
    config = (repository / name / "config.pbtxt").read_text().replace('name: "resnet_like"', f'name: "{name}"')
    (repository / name / "config.pbtxt").write_text(config)
    client.load_model(name)
    feed = {"image": np.ones((1, 3, 32, 32), np.float32)}
    expected = infer(client, name, feed)["logits"]
    triton = next(pid for pid, args in children_of(server.process.pid).items() if args[0].endswith(b"tritonserver"))
    stub = next(pid for pid, model in stubs_of(triton).items() if model == name)
    # Killed while it holds the lock of the memory it shares with tritonserver (cleaning up after
    # that answer, or exporting its metrics, once a second, a moment later), a stub takes
    # tritonserver down with it (boost::interprocess::lock_exception in Triton 24.10's Python
    # backend, seen once here; `tools.serve --restart N` then starts it again): this test is
    # about a stub killed while idle.
    time.sleep(2.0)
    os.kill(stub, signal.SIGKILL)
    deadline, answered = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        try:
            answered = infer(client, name, feed)["logits"]
            if stub not in stubs_of(triton):
                break
        except InferenceServerException:
            pass  # dead, or being loaded again: an error, never a hang
        time.sleep(0.5)
    assert answered is not None and stub not in stubs_of(triton), "the model did not come back"
    np.testing.assert_allclose(answered, expected, atol=1e-6)
    assert infer(client, "resnet_like", feed)["logits"].shape == (1, 10)
    client.unload_model(name)

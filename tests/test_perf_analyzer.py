"""The real perf_analyzer (installed by ``make setup``) against the demo models through a real
tritonserver: every answer checked, its CSV and profile export read, its failures reported."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import replace

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from backend.engines import OnnxRuntimeEngine
from backend.manifest import Manifest
from slicer.slicing import VERSION, slice_model
from tools.lib.workload import interface_of, synthetic
import tools.lib.perf_analyzer as perf_analyzer
from tools.lib.perf_analyzer import (ATTEMPTS, HANG_AFTER_S, HANG_FACTOR, Answered, ExportError, Load, after_warmup,
                                     PerfAnalyzerError, WindowLost, check_ended, command, measure, open_counts,
                                     read_csv, read_export, run_once, transport, until_kept, write_bursts)
from tools.lib.perf_analyzer import VERSION as PA_VERSION
from tools.lib.perf_analyzer import installed_version
from tools.lib.perf_analyzer_install import _deb_member, install
from tools.lib.processes import CLIENT_CPUS, CpuSplit
from tools.lib.workload import glue, write_input_data

from .conftest import FAST, ROOT


def test_installed_into_the_virtualenv_and_installing_again_does_nothing():
    wrapper = install()
    assert installed_version(wrapper) == PA_VERSION
    assert install() == wrapper


def test_a_library_comes_out_of_a_debian_package():
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:xz") as tar:
        for name, data in (("./usr/lib/x86_64-linux-gnu/libb64.so.0d", b"\x7fELF lib"), ("./usr/share/doc/x", b"doc")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = body.getvalue()

    def entry(name: str, payload: bytes) -> bytes:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(payload):<10}`\n".encode()
        return header + payload + (b"\n" if len(payload) % 2 else b"")
    deb = b"!<arch>\n" + entry("debian-binary", b"2.0\n") + entry("control.tar.xz", b"") + entry("data.tar.xz", data)
    assert _deb_member(deb, "libb64.so.0d") == b"\x7fELF lib"


@pytest.fixture(scope="module")
def rte(repository, tokenizer, tmp_path_factory):
    """GLUE RTE for bert_like as perf_analyzer's input data, and the unsliced model to check against."""
    requests = glue(interface_of(repository / "bert_like"), "glue:RTE", tokenizer, max_length=64)
    return write_input_data(requests, tmp_path_factory.mktemp("data") / "rte.json")


def _exported(server, repository, sources, load: Load, data, seconds: float, folder) -> tuple[list[dict], object]:
    """perf_analyzer's window of ``load`` on bert_like (run as every window is: again if it hangs;
    it sometimes stops sending mid-window), by the protocol ``$DVABATCH_CLIENT_PROTOCOL`` names:
    its export's requests, and the unsliced model."""
    csv_path, export = folder / "pa.csv", folder / "export.json"
    args = command("bert_like", server.url, load, data, seconds, 0.5, csv_path, export, http_url=server.http_url)
    sends = perf_analyzer.protocol()
    assert args[args.index("-i") + 1] == sends
    assert args[args.index("-u") + 1] == (server.http_url if sends == "http" else server.url)
    done = until_kept(lambda: run_once(args, HANG_AFTER_S + HANG_FACTOR * (seconds + 0.5), load.label,
                                       (csv_path, export)))
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = Manifest.load(repository / "bert_like" / VERSION)
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    return json.loads(export.read_text())["experiments"][0]["requests"], reference


@pytest.mark.parametrize("load,protocol", [(Load(concurrency=2), ""), (Load(rate=40), ""),
                                           (Load(concurrency=2), "http")],
                         ids=["closed", "poisson", "closed-over-http"])
def test_every_answer_is_the_unsliced_models(server, repository, sources, rte, load, protocol, tmp_path, monkeypatch):
    """perf_analyzer drives the sliced bert_like for two seconds, over gRPC or, where
    ``$DVABATCH_CLIENT_PROTOCOL`` says so, HTTP (tritonserver's other frontend, which a user's
    clients may speak); each response in its profile export equals ONNX Runtime on the unsliced
    model for that request's own inputs."""
    monkeypatch.setenv(perf_analyzer.PROTOCOL, protocol)
    requests, reference = _exported(server, repository, sources, load, rte, 2.0, tmp_path)
    assert len(requests) >= 16
    lengths = set()
    for request in requests:
        feed = {name: np.atleast_1d(np.array(values, dtype=np.int64))[None] for name, values in
                request["request_inputs"].items()}
        lengths.add(feed["input_ids"].shape[1])
        (answer,) = request["response_outputs"]
        for name, expected in reference.run(feed).items():
            np.testing.assert_allclose(np.array(answer[name], dtype=np.float32).reshape(expected.shape), expected,
                                       atol=1e-4)
    assert len(lengths) > 5, "queries keep their own lengths"
    row = read_csv(tmp_path / "pa.csv")  # written by _exported
    assert row["Inferences/Second"] > 0 and row["p50 latency"] > 0
    assert row["Server Compute Infer"] > 0
    sent, answered = read_export(tmp_path / "export.json")
    assert len(sent) == len(requests) and (answered > sent).all()


def test_windows_of_each_load(server, rte, tmp_path):
    closed = measure("bert_like", server.url, Load(concurrency=2), rte, seconds=1.5, warmup_s=0.5)
    assert closed.requests > 10 and closed.seconds > 1 and closed.schedule_s == closed.seconds
    assert closed.throughput == pytest.approx(closed.requests / closed.seconds)
    answered = Answered.from_now(server.url, "bert_like", sum(open_counts(Load(rate=30), 1.0, 0.3)), 1.3)
    poisson = measure("bert_like", server.url, Load(rate=30), rte, seconds=1.0, warmup_s=0.3)
    assert poisson.requests == 30 and poisson.schedule_s == pytest.approx(1.0)
    # Triton's statistics show every request the window sent answered (its warm-up too), and not
    # before its schedule is over: a run still going then has hung (``run_once``).
    assert answered(1.3) and not answered(1.2) and not replace(answered, expected=10**9)(1.3)
    assert poisson.goodput(1e9) == pytest.approx(30.0) and poisson.goodput(0) == 0
    assert poisson.percentile_ms(50) > 0
    assert (np.diff(poisson.sent_s) >= 0).all()
    intervals = tmp_path / "burst.txt"  # a burst of 8 requests 1 ms apart, then 200 ms of quiet
    intervals.write_text("\n".join(["1000"] * 7 + ["200000"]) + "\n")
    burst = measure("bert_like", server.url, Load(intervals=intervals), rte, seconds=1.0, warmup_s=0.3)
    assert burst.load.offered() == pytest.approx(8 / 0.207) and burst.requests >= 16
    coming_and_going = Load(intervals=write_bursts(tmp_path / "bursts.txt", (20, 200), 0.25, 1.3))
    bursts = measure("bert_like", server.url, coming_and_going, rte, seconds=1.0, warmup_s=0.3)
    assert bursts.requests == open_counts(coming_and_going, 1.0, 0.3)[1] and (np.diff(bursts.sent_s) >= 0).all()


def test_a_closed_loop_leaves_out_its_warm_up_by_the_clock():
    """perf_analyzer warms a closed loop up by a count of requests only: ``measure`` runs it
    ``warmup_s`` longer and keeps the requests answered after that (``after_warmup``), timed from
    then, so its answers/s are those of the load once warm. Nothing answered after it: all kept."""
    sent = np.array([0, 1, 2, 3, 4, 5], dtype=float) * 1e9
    answered = sent + 1.5e9
    kept_sent, kept_answered, start = after_warmup(sent, answered, 3.0)
    assert start == 3e9 and list(kept_sent) == [2e9, 3e9, 4e9, 5e9] and list(kept_answered) == list(kept_sent + 1.5e9)
    assert after_warmup(sent, answered, 10.0)[2] == 0.0 and len(after_warmup(sent, answered, 10.0)[0]) == 6


def test_bursts_step_their_rate_from_a_fixed_seed_and_start_over_without_a_seam(tmp_path):
    """``write_bursts`` (``tools.check_auto --bursts``): Poisson arrivals at each rate in turn for
    its phase, whole cycles covering the seconds asked for; the same file every time (every model
    of a comparison is sent the same arrivals), and its gaps add up to whole cycles, so that
    perf_analyzer, starting the file over, keeps each phase's rate."""
    path = write_bursts(tmp_path / "a.txt", (100, 1000), 0.5, 2.5)
    gaps = np.array([int(v) for v in path.read_text().split()]) / 1e6
    assert (gaps > 0).all() and gaps.sum() == pytest.approx(3.0, abs=1e-3)  # three cycles of 1 s cover 2.5 s
    at = np.cumsum(gaps) % 1.0
    low, high = (at < 0.5).sum(), (at >= 0.5).sum()
    assert 100 < low < 200 and 1300 < high < 1700, (low, high)  # 150 and 1,500 expected
    assert write_bursts(tmp_path / "b.txt", (100, 1000), 0.5, 2.5).read_text() == path.read_text()
    assert write_bursts(tmp_path / "c.txt", (100, 1000), 0.5, 2.5, seed=1).read_text() != path.read_text()
    for rates, phase in (((100, 0), 0.5), ((100,), 0.0), ((), 1.0), ((0.1,), 0.001)):
        with pytest.raises(ValueError, match="bursts"):
            write_bursts(tmp_path / "d.txt", rates, phase, 1.0)


def _served(repository, server, tmp_path, name: str, nodes: list, inputs: list, outputs: list, weights: list):
    """A one-request-a-row ONNX model sliced in two and loaded, with perf_analyzer's input data."""
    graph = helper.make_graph(nodes, name, inputs, outputs, weights)
    source = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(source))
    slice_model(source, repository / name, replace(FAST, stages=2, calibration_rounds=0, policy_defaults=False))
    with grpcclient.InferenceServerClient(server.url) as client:
        client.load_model(name)
    return write_input_data(synthetic(interface_of(repository / name), 1, {}, count=4), tmp_path / f"{name}.json")


def test_requests_of_large_images_go_through_shared_memory_and_every_window_ends(server, repository, tmp_path):
    """A model taking 224x224 images (600 kB a request): perf_analyzer's export would hold every
    input as JSON text (gigabytes at 16 in flight; it never finished writing them), so such
    windows send through system shared memory, sized by one answer first; text stays on gRPC."""
    weights = numpy_helper.from_array(np.full((4, 3, 8, 8), 0.01, np.float32), "w")
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], strides=[8, 8], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["scores"], name="flatten")]
    data = _served(repository, server, tmp_path, "images", nodes,
                   [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 224, 224])],
                   [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])], [weights])
    assert transport("images", server.url, str(data))[:2] == ("--shared-memory", "system")
    window = measure("images", server.url, Load(concurrency=16), data, seconds=1.0, warmup_s=0.3, timeout_s=60)
    assert window.requests > 16 and window.throughput > 0


def test_large_answers_go_through_shared_memory_and_every_window_ends(server, repository, tmp_path):
    """Small requests, large answers (BERT-base's 64 x 768 floats are 197 kB): the export would
    hold every answer as JSON text, and perf_analyzer hung on every window of BERT-base on a lent
    H200, so answers past the bound go through shared memory too."""
    weights = [numpy_helper.from_array(np.full((4, 8, 1024), 0.5, np.float32), "w"),
               numpy_helper.from_array(np.array([-1, 4, 1, 1], np.int64), "column")]
    nodes = [helper.make_node("Reshape", ["x", "column"], ["c"], name="column"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "w"], ["big"], name="spread")]  # 128 kB an answer
    data = _served(repository, server, tmp_path, "answers", nodes,
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                   [helper.make_tensor_value_info("big", TensorProto.FLOAT, ["batch", 4, 8, 1024])], weights)
    assert transport("answers", server.url, str(data))[:2] == ("--shared-memory", "system")
    window = measure("answers", server.url, Load(concurrency=16), data, seconds=1.0, warmup_s=0.3, timeout_s=60)
    assert window.requests > 16 and window.throughput > 0


def test_text_goes_over_grpc(server, rte):
    assert transport("bert_like", server.url, str(rte)) == ()


def test_a_failing_request_stops_perf_analyzer_with_its_reason(server, tmp_path):
    data = tmp_path / "bad.json"  # token ids far beyond bert_like's vocabulary: the model cannot run them
    data.write_text(json.dumps({"data": [{"input_ids": {"content": [5000] * 6, "shape": [6]},
                                          "attention_mask": {"content": [1] * 6, "shape": [6]}}]}))
    with pytest.raises(PerfAnalyzerError, match="perf_analyzer \\(20/s Poisson on bert_like\\) failed: .*"
                                                "inference failed"):
        measure("bert_like", server.url, Load(rate=20), data, seconds=1.0, warmup_s=0.5)


def test_a_run_that_hangs_is_repeated_then_reported(tmp_path):
    """perf_analyzer 2.51 sometimes stops sending mid-window and never ends: such a run is killed
    and repeated, and a run that hangs every time is reported (a real process that never ends
    stands in for it). Each attempt starts without the files the last one left (perf_analyzer
    refuses a profile export file that exists); an export left empty or cut short (seen with
    shared memory) is no window: ``measure`` runs it again."""
    counter, export = tmp_path / "attempts", tmp_path / "export.json"
    script = f"[ -e {export} ] && echo found >> {counter}; echo x >> {counter}; touch {export}; sleep 30"
    with pytest.raises(WindowLost, match="a hanging window.*hung for 0 s"):
        until_kept(lambda: run_once(["bash", "-c", script], 0.3, "a hanging window", (export,)))
    assert counter.read_text().split() == ["x"] * ATTEMPTS and ATTEMPTS == 3
    export.write_bytes(b"")  # an export left empty, or cut short after a request, is no window
    with pytest.raises(ExportError, match="no requests"):
        read_export(export)
    export.write_bytes(b'{"requests":[{"timestamp":1,"request_inputs":{},"response_timestamps":[2]},'
                       b'{"timestamp":3,"request_inputs":{}')
    with pytest.raises(ExportError, match="2 requests but 1 answer lists"):
        read_export(export)
    # A run that ended without a word is lost, not failed (measure runs it again); one whose
    # request failed says so in perf_analyzer's words.
    silent = subprocess.run(["bash", "-c", "echo 'Request concurrency: 64'; kill -SEGV $$"], capture_output=True,
                            text=True)
    with pytest.raises(WindowLost, match="exit status -11 and no error: Request concurrency: 64"):
        check_ended(silent, export, "c=64")
    failed = subprocess.run(["bash", "-c", "echo 'Thread [0] had error: model not ready'; exit 1"],
                            capture_output=True, text=True)
    with pytest.raises(PerfAnalyzerError, match="failed: Thread .0. had error: model not ready") as raised:
        check_ended(failed, export, "c=64")
    assert not isinstance(raised.value, WindowLost)


def test_a_run_still_going_after_the_server_answered_all_it_sends_is_lost_early(monkeypatch):
    """An open-loop run that hangs although the server answered every request it sends (the race
    ``Answered`` describes) is killed ``SETTLED_S`` after that, not at its long limit; one that
    ends meanwhile is kept."""
    monkeypatch.setattr(perf_analyzer, "SETTLED_S", 0.5)
    began = time.monotonic()
    with pytest.raises(WindowLost, match="a settled window.*hung: the server had answered all its requests"):
        run_once(["sleep", "30"], 25.0, "a settled window", answered=lambda running_s: running_s > 0.2)
    assert time.monotonic() - began < 5
    done = run_once(["bash", "-c", "sleep 0.3; echo finished"], 25.0, "a window", answered=lambda running_s: True)
    assert done.returncode == 0 and done.stdout == "finished\n"



SPLIT_PROBE = """
import json, os, subprocess, sys
import tritonclient.grpc as grpcclient
from tools.lib.processes import children_of, free_port
from tools.lib.triton import Server

with Server(sys.argv[1], grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log=sys.argv[2],
            extra_args=["--model-control-mode=explicit"]) as server:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.load_model("bert_like")
    stubs = [pid for pid, args in children_of(server.process.pid).items() if b"triton_python_backend_stub" in args[0]]
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True)
    print(json.dumps({"server": sorted(os.sched_getaffinity(server.process.pid)),
                      "stubs": [sorted(os.sched_getaffinity(pid)) for pid in stubs],
                      "measuring": sorted(os.sched_getaffinity(0)), "started": json.loads(child.stdout)}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a split needs two CPUs")
def test_client_cpus_split_the_host_between_the_server_and_its_clients(repository, tmp_path):
    """With ``DVABATCH_CLIENT_CPUS``, tritonserver and the stubs it starts run on the other CPUs,
    the measuring process and what it starts (perf_analyzer) on the clients'."""
    first, *rest = sorted(os.sched_getaffinity(0))
    env = {**os.environ, CLIENT_CPUS: str(first)}
    probe = subprocess.run([sys.executable, "-c", SPLIT_PROBE, str(repository), str(tmp_path / "triton.log")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.splitlines()[-1]) == {
        "server": rest, "stubs": [rest], "measuring": [first], "started": [first]}


def test_a_client_cpus_setting_that_cannot_split_the_host_names_why(monkeypatch):
    usable = sorted(os.sched_getaffinity(0))
    for text, why in (("x", "expected CPU numbers"), (str(max(usable) + 1), "may use CPUs"),
                      (f"{usable[0]}-{usable[-1]}", "leaves no CPU to the server")):
        monkeypatch.setenv(CLIENT_CPUS, text)
        with pytest.raises(ValueError, match=why):
            CpuSplit.from_env()
    monkeypatch.setenv(CLIENT_CPUS, "")
    assert CpuSplit.from_env() is None


def test_a_client_protocol_is_grpc_or_http_and_http_needs_its_address(monkeypatch, tmp_path):
    monkeypatch.setenv(perf_analyzer.PROTOCOL, "tcp")
    with pytest.raises(ValueError, match="DVABATCH_CLIENT_PROTOCOL='tcp': expected one of grpc, http"):
        perf_analyzer.protocol()
    monkeypatch.setenv(perf_analyzer.PROTOCOL, " HTTP ")
    assert perf_analyzer.protocol() == "http"
    with pytest.raises(ValueError, match="no HTTP address"):
        command("m", "127.0.0.1:1", Load(concurrency=1), "zero", 1.0, 0.5, tmp_path / "a.csv", tmp_path / "e.json")
    monkeypatch.delenv(perf_analyzer.PROTOCOL)
    assert perf_analyzer.protocol() == "grpc"


def test_a_load_of_requests_of_several_rows_sends_them_as_one_request_each(server, repository, sources, tmp_path):
    """``Load.rows``: perf_analyzer's ``-b``, a client that batches its own. Every request of the
    window carries four rows of one length, successive entries of the data (its export keeps the
    first's inputs), and each row of its answer is the unsliced model's for one of them."""
    queries = synthetic(interface_of(repository / "bert_like"), 1, {}, lengths=(16,), count=8)
    data = write_input_data(queries, tmp_path / "rows.json")
    load = Load(concurrency=2, rows=4)
    assert load.label == "concurrency 2, 4 rows a request" and load.flags()[-2:] == ["-b", "4"]
    with pytest.raises(ValueError, match="one row at least"):
        Load(rate=10, rows=0)
    requests, reference = _exported(server, repository, sources, load, data, 1.0, tmp_path)
    assert len(requests) >= 4
    expected = [reference.run(query.inputs)["pooler_output"][0] for query in queries]
    for request in requests:
        rows = np.array(request["response_outputs"][0]["pooler_output"], dtype=np.float32).reshape(4, -1)
        first = {name: np.array(values, dtype=np.int64)[None] for name, values in request["request_inputs"].items()}
        np.testing.assert_allclose(rows[0], reference.run(first)["pooler_output"][0], atol=1e-4)
        assert all(any(np.allclose(row, one, atol=1e-4) for one in expected) for row in rows)
        assert len({tuple(np.round(row, 3)) for row in rows}) == 4

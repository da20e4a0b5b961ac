"""Baselines, metrics, simulation, comparison and tuning, run briefly on the small models. The
real runs are benchmarks (README); these check what the tools write and that it adds up."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backend.engine import OnnxRuntimeEngine
from backend.manifest import Manifest
from slicer.sample import sample_inputs
from slicer.slicing import VERSION
from tools import metrics as prom
from tools.client import infer
from tools.gpu_profile import groups
from tools.models import MODELS

from .conftest import ROOT


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``python -m ...`` with its own cache (one-stage baselines), as a user runs it."""
    env = {**os.environ, "DVABATCH_CACHE": str(tmp_path_factory.mktemp("cache"))}

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    return run


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.url) as client:
        yield client


def batches(server, model: str) -> dict[tuple[int, int], float]:
    time.sleep(1.3)  # the backend exports its counters about once a second
    values = prom.select(prom.scrape(server.metrics_url), "dvabatch_batches_total", model=model)
    return {(int(dict(k)["stage"]), int(dict(k)["rows"])): v for k, v in values.items()}


def test_ragged_baseline_pads_to_the_longest_and_answers_each_query_its_own(run, client, server, repository,
                                                                           sources):
    """tools.baselines writes DelayBatch with ragged batches: four queries of different lengths
    sent together become one batch, padded, and each answer equals the unsliced model on that
    query alone, cut back to its own length."""
    done = run("tools.baselines", str(repository / "bert_like"), "--source", str(sources["bert_like"]),
               "--delay-us", "300000")
    assert done.returncode == 0, done.stdout + done.stderr
    config = (repository / "bert_like_delay" / "config.pbtxt").read_text()
    assert 'key: "batching" value: { string_value: "triton" }' in config and "allow_ragged_batch: true" in config
    assert "max_queue_delay_microseconds: 300000" in config
    client.load_model("bert_like_delay")
    manifest = Manifest.load(repository / "bert_like" / VERSION)
    feeds = [sample_inputs(manifest.inputs, 1, {"sequence": n}, seed=n) for n in (3, 9, 5, 12)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda feed: infer(client, "bert_like_delay", feed), feeds))
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    for feed, answer in zip(feeds, answers):
        for name, expected in reference.run(feed).items():
            assert answer[name].shape == expected.shape
            np.testing.assert_allclose(answer[name], expected, atol=1e-4)
    assert batches(server, "bert_like_delay") == {(0, 4): 1.0}
    client.unload_model("bert_like_delay")


def test_backend_metrics_count_meta_operations_and_batches(client, server, repository):
    manifest = Manifest.load(repository / "resnet_like" / VERSION)
    feed = sample_inputs(manifest.inputs, 2)
    time.sleep(1.3)  # counts of earlier tests are all exported
    before = prom.scrape(server.metrics_url)
    for _ in range(3):
        infer(client, "resnet_like", feed)
    time.sleep(1.3)
    grown = prom.delta(before, prom.scrape(server.metrics_url))
    meta = prom.select(grown, "dvabatch_meta_operations_total", model="resnet_like", kind="new")
    assert sum(meta.values()) == 3
    rows = prom.select(grown, "dvabatch_batches_total", model="resnet_like", rows="2")
    assert sorted(int(dict(k)["stage"]) for k, v in rows.items() if v == 3) == list(range(len(manifest.stages)))
    busy = prom.select(grown, "dvabatch_stage_busy_us_total", model="resnet_like")
    assert len(busy) == len(manifest.stages) and all(v > 0 for v in busy.values())
    queries = prom.select(grown, "dvabatch_entry_queries_total", model="resnet_like")
    assert sum(queries.values()) == 3
    assert prom.select(prom.scrape(server.metrics_url), "dvabatch_queries_in_flight", model="resnet_like")


def test_simulated_model_and_its_baseline_serve_the_tables_times(run, client, repository):
    """tools.simulate turns a sliced model into timed stages; its baseline is one timed stage."""
    done = run("tools.simulate", str(repository / "bert_like"), "--out", str(repository), "--name", "bert_sim")
    assert done.returncode == 0, done.stdout + done.stderr
    done = run("tools.baselines", str(repository / "bert_sim"))
    assert done.returncode == 0, done.stdout + done.stderr
    sliced = Manifest.load(repository / "bert_like" / VERSION)
    for model in ("bert_sim", "bert_sim_zero"):
        client.load_model(model)
        feed = sample_inputs(sliced.inputs, 2, {"sequence": 7})
        answer = infer(client, model, feed)
        for name, array in feed.items():
            np.testing.assert_array_equal(answer[f"{name}_out"], array)
        client.unload_model(model)
    timed = Manifest.load(repository / "bert_sim" / VERSION)
    assert [s.engine for s in timed.stages] == ["timed"] * len(sliced.stages)
    assert [s.latency for s in timed.stages] == [s.latency for s in sliced.stages]


def test_compare_writes_tables_csv_and_plots(run, repository, sources, tokenizer, tmp_path):
    out = tmp_path / "out"
    done = run("tools.compare", str(repository / "bert_like"), "--source", str(sources["bert_like"]),
               "--dataset", "glue:RTE", "--tokenizer", str(tokenizer),
               "--max-length", "64", "--variant", "pass:policy=pass", "--rounds", "1", "--window", "0.5",
               "--warmup", "0.3", "--step-seconds", "0.5", "--steps", "3", "--delays-us", "500", "--no-spinning",
               "--loads", "0.5", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    peaks = {r["config"]: r for r in csv.DictReader(open(out / "peaks.csv"))}
    assert {"ZeroBatch", "ZeroBatch, ragged", "ZeroBatch, client pads", "DVABatch (bert_like)",
            "DVABatch pass"} <= set(peaks)
    assert all(float(r["peak_rps"]) >= 0 for r in peaks.values())
    loads = list(csv.DictReader(open(out / "loads.csv")))
    assert len(loads) == 4 and {r["round"] for r in loads} == {"1"}  # best zero, best delay, ours, variant
    assert all(int(r["requests"]) > 0 and r["failures"] == "0" for r in loads)
    assert list(csv.DictReader(open(out / "batches.csv")))
    stepping = list(csv.DictReader(open(out / "stepping.csv")))
    assert {r["status"] for r in stepping} == {"OK"} and len({r["length"] for r in stepping}) > 1
    summary = (out / "summary.md").read_text()
    assert "Peak throughput under the QoS" in summary and "(best baseline)" in summary
    for plot in ("latency.png", "stepping.png", "batches.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_picks_a_stage_count_and_installs_it(run, sources, tmp_path):
    out = tmp_path / "repo" / "bert_tuned"
    report = tmp_path / "tune.csv"
    done = run("tools.tune", str(sources["bert_like"]), "--out", str(out), "--stages", "1,2", "--by", "latency",
               "--rate", "30", "--window", "0.5", "--rounds", "1", "--warmup", "0.3", "--lengths", "8,16",
               "--shape", "input_ids:8", "--shape", "attention_mask:8", "--csv", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    tries = list(csv.DictReader(open(report)))
    assert [t["stages"] for t in tries] == ["1", "2"] and sum(t["best"] == "True" for t in tries) == 1
    best = next(t for t in tries if t["best"] == "True")
    assert len(Manifest.load(out / VERSION).stages) == int(best["stages"])
    assert 'name: "bert_tuned"' in (out / "config.pbtxt").read_text()
    assert "Tuning took" in done.stdout


def test_gpu_profile_groups_layers_evenly_and_models_are_declared():
    assert groups([1, 4, 4, 1], 2) == [(0, 2), (2, 4)]
    assert groups([3, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert {m.name for m in MODELS} == {"minilm", "resnet50", "vgg16", "craft"}
    assert all(m.package.count("==") == 1 for m in MODELS)


def test_compare_refuses_a_variant_the_backend_refuses(run, repository, sources, tmp_path):
    done = run("tools.compare", str(repository / "resnet_like"), "--source", str(sources["resnet_like"]),
               "--variant", "typo:policy=fixd", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "DVABatch typo does not load" in done.stdout and "fixd" in done.stdout


def test_soak_checks_every_answer_and_reports_windows(run, repository, sources, tmp_path):
    """The short form of the soak: two models under two policies, a little traffic with bad
    requests among it; every good answer right, every bad one refused, nothing lost."""
    out = tmp_path / "soak.json"
    done = run("tools.soak", str(repository / "resnet_like"), str(repository / "bert_like"),
               "--policies", "auto,random", "--rate", "30", "--seconds", "8", "--window", "4",
               "--bad-share", "0.1", "--source", str(sources["resnet_like"]), "--source", str(sources["bert_like"]),
               "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clean" in done.stdout and "NOT CLEAN" not in done.stdout
    windows = json.loads(out.read_text())
    assert len(windows) == 2 and all(w["rss_mb"] > 0 for w in windows)
    assert sum(w["right"] for w in windows) > 100 and sum(w["refused_right"] for w in windows) > 5
    assert sum(w["sent"] for w in windows) == sum(w["right"] + w["refused_right"] for w in windows)

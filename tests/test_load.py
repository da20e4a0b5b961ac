"""tools.load: workloads, statistics, and the command line against a real tritonserver."""

from __future__ import annotations

import base64
import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from backend.manifest import TensorSpec
from tools.load.stats import Record, percentile, stable, summarize
from tools.load.workload import GLUE_TEXT, ModelInterface, WorkloadError, from_input_data, glue, glue_texts, synthetic

from .conftest import ROOT

PERF_ANALYZER_HEADER = ["Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
                        "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
                        "p50 latency", "p90 latency", "p95 latency", "p99 latency"]
BERT = ModelInterface("bert_like", 8, (TensorSpec("input_ids", "int64", (-1,)),
                                       TensorSpec("attention_mask", "int64", (-1,))), ("pooler_output",))
IMAGE = ModelInterface("resnet_like", 8, (TensorSpec("image", "float32", (3, 4, 4)),), ("logits",))


def load(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.load", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_every_glue_task_gives_its_text_fields():
    for task, columns in GLUE_TEXT.items():
        texts = glue_texts(task)
        assert len(texts) > 50 and all(len(t) == len(columns) and all(t) for t in texts), task
    with pytest.raises(WorkloadError, match="not one of"):
        glue_texts("MNLI")


def test_glue_queries_are_tokenized_unpadded_or_padded_by_the_client(tokenizer):
    unpadded = glue(BERT, "glue:RTE", tokenizer, max_length=64)
    assert len(unpadded) == 277  # RTE dev
    lengths = [r.length for r in unpadded]
    assert min(lengths) < 40 and max(lengths) == 64, "truncated at --max-length"
    for request in unpadded:
        assert request.inputs["input_ids"].shape == (1, request.length)
        assert request.inputs["attention_mask"].sum() == request.length
        assert request.inputs["input_ids"].max() < 100
    padded = glue(BERT, "glue:RTE", tokenizer, max_length=64, pad_to=64)
    assert {r.inputs["input_ids"].shape for r in padded} == {(1, 64)}
    assert [r.length for r in padded] == lengths
    assert all(r.inputs["attention_mask"].sum() == r.length for r in padded)
    with pytest.raises(WorkloadError, match="inputs \\['image'\\]"):
        glue(IMAGE, "glue:RTE", tokenizer)
    with pytest.raises(WorkloadError, match="expected glue:TASK"):
        glue(BERT, "squad", tokenizer)


def test_perf_analyzer_input_data_json(tmp_path):
    image = np.arange(48, dtype=np.float32)
    data = {"data": [{"image": image.tolist()},
                     {"image": {"content": image.tolist(), "shape": [3, 4, 4]}},
                     {"image": {"b64": base64.b64encode(image.tobytes()).decode()}}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    requests = from_input_data(path, IMAGE, rows=1)
    assert len(requests) == 3
    for request in requests:
        np.testing.assert_array_equal(request.inputs["image"], image.reshape(1, 3, 4, 4))
    assert from_input_data(path, IMAGE, rows=3)[0].inputs["image"].shape == (3, 3, 4, 4)
    path.write_text(json.dumps({"data": [{"image": [1.0, 2.0]}]}))
    with pytest.raises(WorkloadError, match="entry 0: input 'image' has 2 values, shape \\[3, 4, 4\\] needs 48"):
        from_input_data(path, IMAGE, rows=1)
    path.write_text(json.dumps({"data": [{"pixels": [1.0]}]}))
    with pytest.raises(WorkloadError, match="entry 0 has no input 'image'"):
        from_input_data(path, IMAGE, rows=1)


def test_synthetic_data_needs_shapes_for_variable_dims():
    with pytest.raises(WorkloadError, match="--shape input_ids:16"):
        synthetic(BERT, rows=2, shapes={})
    requests = synthetic(BERT, rows=2, shapes={"input_ids": (5,), "attention_mask": (5,)}, count=3)
    assert [r.inputs["input_ids"].shape for r in requests] == [(2, 5)] * 3


def test_statistics_follow_perf_analyzer():
    assert percentile([5, 1, 4, 2, 3], 50) == 3 and percentile([5, 1, 4, 2, 3], 99) == 5
    records = [Record(0, i, i * 0.1, i * 0.1, 1, None, received=i * 0.1 + 0.01 * (i + 1), status="OK")
               for i in range(10)]
    records.append(Record(0, 10, 0.95, 0.95, 1, None, received=0.96, status="INTERNAL", error="boom"))
    records.append(Record(0, 11, 0.5, 0.52, 1, None))  # still unanswered
    s = summarize(records, 0.0, 1.0)
    assert (s.requests, s.ok, s.failures) == (12, 10, {"INTERNAL": 1})
    assert s.percentiles_ms[99] == pytest.approx(100) and s.mean_ms == pytest.approx(55)
    assert s.late_sends == 1
    judged = summarize(records, 0.0, 1.0, now=1.0)
    assert judged.percentiles_ms[99] == pytest.approx(480), "an unanswered request counts with its age"
    assert stable([s, s, s], 10, None) and not stable([s, s], 10, None)


def csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_concurrency_sweep_writes_perf_analyzer_csv(server, tmp_path):
    out, requests = tmp_path / "perf.csv", tmp_path / "requests.csv"
    done = load("-m", "resnet_like", "-u", server.url, "--concurrency-range", "1:2", "-p", "300",
                "--max-trials", "3", "-f", str(out), "--requests-csv", str(requests))
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out, newline="") as f:
        header = next(csv.reader(f))
    assert header[0] == "Concurrency" and header[1:13] == PERF_ANALYZER_HEADER
    rows = csv_rows(out)
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 2]
    assert all(float(r["Inferences/Second"]) > 0 and int(r["p99 latency"]) >= int(r["p50 latency"]) > 0
               for r in rows)
    assert all(int(r["Server Compute Infer"]) >= 0 and r["Failures"] == "0" for r in rows)
    sent = csv_rows(requests)
    assert sent and {r["status"] for r in sent} == {"OK"} and {r["label"] for r in sent} == {"1", "2"}


def test_stepping_load_of_glue_text_over_http(server, tokenizer, tmp_path):
    requests = tmp_path / "requests.csv"
    done = load("-m", "bert_like", "-i", "http", "-u", server.http_url, "--dataset", "glue:RTE", "--tokenizer",
                str(tokenizer), "--max-length", "64", "--request-rate-range", "20:60:20", "--request-distribution",
                "poisson", "--stepping", "-p", "500", "--latency-threshold", "5000", "--requests-csv", str(requests))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stepping load" in done.stdout
    rows = csv_rows(requests)
    assert {r["label"] for r in rows} == {"step 0", "step 1", "step 2"}
    assert {r["status"] for r in rows} == {"OK"}
    assert 1 < len({r["length"] for r in rows}), "queries keep their own lengths"


def test_failures_are_counted_not_hidden(server, tmp_path):
    data = tmp_path / "data.json"  # token ids far beyond bert_like's vocabulary: the model cannot run them
    data.write_text(json.dumps({"data": [{"input_ids": {"content": [5000] * 6, "shape": [6]},
                                          "attention_mask": {"content": [1] * 6, "shape": [6]}}]}))
    requests = tmp_path / "requests.csv"
    done = load("-m", "bert_like", "-u", server.url, "--input-data", str(data), "--request-rate-range", "20",
                "--stepping", "-p", "500", "--requests-csv", str(requests))
    assert done.returncode == 1
    assert "requests failed" in done.stdout and "INTERNAL" in done.stdout
    rows = csv_rows(requests)
    assert rows and {r["status"] for r in rows} == {"INTERNAL"} and all("inference failed" in r["error"] for r in rows)


def test_bad_arguments_name_what_is_wrong(server):
    done = load("-m", "bert_like", "-u", server.url)
    assert done.returncode == 2 and "--shape input_ids:16" in done.stdout
    done = load("-m", "no_such_model", "-u", server.url)
    assert done.returncode == 2 and "no_such_model" in done.stdout

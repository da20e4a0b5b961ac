"""tools.workload and tools.input_data: GLUE text and synthetic shapes as perf_analyzer's input data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from backend.manifest import TensorSpec
from tools.lib.workload import GLUE_TEXT, ModelInterface, WorkloadError, glue, glue_texts, input_data, synthetic

from .conftest import ROOT

BERT = ModelInterface("bert_like", 8, (TensorSpec("input_ids", "int64", (-1,)),
                                       TensorSpec("attention_mask", "int64", (-1,))), ("pooler_output",))
IMAGE = ModelInterface("resnet_like", 8, (TensorSpec("image", "float32", (3, 4, 4)),), ("logits",))


def input_data_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.input_data", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


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


def test_synthetic_shapes_and_lengths():
    with pytest.raises(WorkloadError, match="--shape input_ids:16"):
        synthetic(BERT, rows=2, shapes={})
    requests = synthetic(BERT, rows=2, shapes={"input_ids": (5,), "attention_mask": (5,)}, count=3)
    assert [r.inputs["input_ids"].shape for r in requests] == [(2, 5)] * 3
    varied = synthetic(BERT, rows=1, shapes={}, count=5, lengths=(4, 9))
    assert [r.inputs["attention_mask"].shape for r in varied] == [(1, 4), (1, 9), (1, 4), (1, 9), (1, 4)]
    assert [r.length for r in varied] == [4, 9, 4, 9, 4]
    assert synthetic(IMAGE, rows=1, shapes={}, count=1, lengths=(7,))[0].inputs["image"].shape == (1, 3, 4, 4)


def test_input_data_has_one_entry_per_row_each_with_its_own_shape():
    requests = synthetic(BERT, rows=2, shapes={}, count=2, lengths=(3, 6))
    data = input_data(requests)["data"]
    assert len(data) == 4
    assert [e["input_ids"]["shape"] for e in data] == [[3], [3], [6], [6]]
    assert data[1]["attention_mask"]["content"] == requests[0].inputs["attention_mask"][1].tolist()


def test_input_data_command_writes_glue_unpadded_or_padded(repository, tokenizer, tmp_path):
    out = tmp_path / "rte.json"
    done = input_data_command(str(repository / "bert_like"), "-o", str(out), "--dataset", "glue:RTE",
                              "--tokenizer", str(tokenizer), "--max-length", "64")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "277 queries" in done.stdout
    entries = json.loads(out.read_text())["data"]
    assert len(entries) == 277 and len({e["input_ids"]["shape"][0] for e in entries}) > 20
    assert all(sum(e["attention_mask"]["content"]) == e["input_ids"]["shape"][0] for e in entries)
    done = input_data_command(str(repository / "bert_like"), "-o", str(out), "--dataset", "glue:RTE",
                              "--tokenizer", str(tokenizer), "--max-length", "64", "--pad-to", "64")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {tuple(e["input_ids"]["shape"]) for e in json.loads(out.read_text())["data"]} == {(64,)}


def test_input_data_command_names_what_is_missing(repository, tmp_path):
    done = input_data_command(str(repository / "bert_like"), "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "--shape input_ids:16" in done.stderr
    done = input_data_command(str(repository / "bert_like"), "-o", str(tmp_path / "x.json"), "--dataset", "glue:RTE")
    assert done.returncode == 2 and "--tokenizer" in done.stderr
    done = input_data_command(str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "manifest.json" in done.stderr
    done = input_data_command("-m", "bert_like", "-u", "127.0.0.1:1", "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "cannot read model 'bert_like'" in done.stderr

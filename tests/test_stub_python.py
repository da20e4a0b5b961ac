"""The Python the backend stubs run: Triton 24.10's stubs send numpy 2's tensors empty, silently.

Seen on a lent H200 whose Python had numpy 2.5: the stub ignores PYTHONPATH and takes the first
``python3`` on tritonserver's PATH (that machine's virtualenv), so the bundled numpy 1.26 never
reached it, and every model answered empty outputs without an error (perf_analyzer counted them;
only an ensemble's next step noticed). Here the same stub runs under a virtualenv whose numpy is 2
and whose other packages are ours, as that machine's was.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import FAST
from tools.lib.client import infer
from tools.lib.peers import write_plain
from tools.lib.processes import free_port
from tools.lib.triton import Server
from slicer.slicing import slice_model


@pytest.fixture(scope="module")
def models(tmp_path_factory, sources) -> Path:
    """resnet_like sliced for the dvabatch backend, and the plain Python model of it."""
    repository = tmp_path_factory.mktemp("stub_python")
    slice_model(sources["resnet_like"], repository / "ours", replace(FAST, stages=2))
    write_plain(repository / "ours", repository, "plain", source=sources["resnet_like"])
    return repository


def answers(repository: Path, stub_python: Path | None, log: Path) -> dict[str, str | int]:
    """Per model: the bytes of its answer to one image, or why it did not load."""
    found: dict[str, str | int] = {}
    with Server(repository, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log=log,
                extra_args=["--model-control-mode=explicit"], stub_python=stub_python) as server, \
            grpcclient.InferenceServerClient(server.grpc_url) as client:
        for model in ("ours", "plain"):
            try:
                client.load_model(model)
            except InferenceServerException as exc:
                found[model] = str(exc)
                continue
            out = infer(client, model, {"image": np.ones((1, 3, 32, 32), np.float32)})
            found[model] = sum(v.nbytes for v in out.values())
    return found


def test_a_stub_that_would_answer_empty_refuses_to_load_and_says_why(models, numpy_2_python, tmp_path):
    for model, why in answers(models, numpy_2_python, tmp_path / "triton.log").items():
        assert isinstance(why, str), f"{model} loaded under numpy 2 and answered {why} bytes"
        assert "passes numpy 2." in why and "tensors empty" in why and "numpy<2 first on its PATH" in why, why


def test_under_numpy_1_both_load_and_answer_their_bytes(models, tmp_path):
    assert answers(models, None, tmp_path / "triton.log") == {"ours": 10 * 4, "plain": 10 * 4}

"""The CUDA path: streams per executor, events per buffer, rows handed over without the host
waiting. Needs a GPU and torch with CUDA; skipped elsewhere. Timed stages keep their stream busy
(``torch.cuda._sleep``) and copy rows on it, so a missing event wait shows up as wrong rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from backend.config import RuntimeConfig
from backend.device import make_device
from backend.engine import load_engines
from backend.policy import RandomPolicy
from backend.query import Query
from backend.runtime import Runtime

from .timed import timed_manifest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("pairs", [1, 2, 3])
def test_random_meta_operations_keep_rows_exact_on_cuda(pairs):
    table = {"batch_sizes": [1, 2, 4, 8], "mean": [1.0, 1.5, 2.0, 3.0]}
    manifest = timed_manifest([table] * 4, dims=(16,))
    device = make_device("GPU")
    runtime = Runtime(manifest, load_engines(manifest, ".", device),
                      RuntimeConfig(buffer_pairs=pairs, policy=RandomPolicy(seed=pairs, stretch_probability=0.9,
                                                                            split_probability=0.4)), device)
    answers: dict[int, list] = {}
    done = threading.Condition()

    def query(key: int, rows: int) -> Query:
        def respond(outputs, failure):
            with done:
                answers.setdefault(key, []).append((outputs, failure))
                done.notify_all()
        return Query({"x": np.arange(rows * 16, dtype=np.float32).reshape(rows, 16) + 1000 * key}, respond)

    rng = np.random.default_rng(pairs)
    count = 300
    for key in range(count):
        runtime.submit([query(key, int(rng.integers(1, 4)))])
        if key % 3 == 0:
            threading.Event().wait(0.001 * int(rng.integers(0, 3)))
    with done:
        assert done.wait_for(lambda: len(answers) == count, timeout=120)
    runtime.close()
    for key, got in answers.items():
        assert len(got) == 1, f"query {key} answered {len(got)} times"
        outputs, failure = got[0]
        assert failure is None, failure
        x = outputs["x"]
        np.testing.assert_array_equal(x, np.arange(x.size, dtype=np.float32).reshape(x.shape) + 1000 * key)

"""The tracked example repository is what the slicer writes, and the compose file parses."""

from __future__ import annotations

from pathlib import Path

import yaml

from backend.manifest import MANIFEST_FILE
from slicer.slicing import VERSION, slice_model
from tools import synthetic
from tools.build_examples import EXAMPLES
from tools.serve import DEFAULT_REPOSITORY

ROOT = Path(__file__).resolve().parent.parent


def test_tracked_configs_and_manifests_match_the_slicer(tmp_path):
    for example in EXAMPLES:
        src = synthetic.save(synthetic.BUILDERS[example.builder](), tmp_path / example.source.name)
        out = tmp_path / "repo" / example.name
        slice_model(src, out, example.stages, example.max_batch_size)
        tracked = DEFAULT_REPOSITORY / example.name
        assert (out / "config.pbtxt").read_text() == (tracked / "config.pbtxt").read_text()
        assert (out / VERSION / MANIFEST_FILE).read_text() == (tracked / VERSION / MANIFEST_FILE).read_text()


def test_docker_compose_parses_and_mounts_the_backend():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    triton, sdk = compose["services"]["triton"], compose["services"]["sdk"]
    assert any(v.endswith(":/opt/tritonserver/backends/dvabatch") or "/opt/tritonserver/backends/dvabatch" in str(v)
               for v in triton["volumes"])
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:") and triton["image"].endswith("-py3")
    assert sdk["image"].endswith("-py3-sdk")
    assert triton["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert {"8000:8000", "8001:8001", "8002:8002"} <= set(triton["ports"])

"""The example repository builds on this machine, is rebuilt only when stale, and the compose file parses."""

from __future__ import annotations

from pathlib import Path


from backend.manifest import Manifest
from slicer.slicing import VERSION
from tools.lib.examples import EXAMPLES, build

ROOT = Path(__file__).resolve().parent.parent


def test_examples_are_sliced_with_latency_tables_and_rebuilt_only_when_stale(tmp_path):
    repository = tmp_path / "repo"
    assert len(build(repository)) == len(EXAMPLES)
    for example in EXAMPLES:
        manifest = Manifest.load(repository / example.name / VERSION)
        assert len(manifest.stages) == example.stages and manifest.max_batch_size == example.max_batch_size
        assert all(s.latency is not None and s.preferred_batch_size for s in manifest.stages)
        report = manifest.slicing  # balance: the slowest stage over the mean, as the tables say
        at = [s.latency.lookup(report.balance_batch_size, report.balance_length) for s in manifest.stages]
        assert report.balance == round(max(at) / (sum(at) / len(at)), 4)
        assert 'key: "policy"' in (repository / example.name / "config.pbtxt").read_text()
    assert build(repository) == []
    (repository / "unet_like" / VERSION / "stage_0.onnx").unlink()
    assert build(repository) == [repository / "unet_like"]


def test_examples_for_another_target_are_sliced_again_for_it(tmp_path):
    """What docker-compose's slicer service runs, on the CPU: the same examples as torch stages
    in FP16, which a repository sliced for ONNX Runtime does not count as up to date."""
    from slicer.slicing import SliceOptions

    repository = tmp_path / "repo"
    target = SliceOptions(target="torch", device="cpu", precision="fp16", warmup=1, node_repeats=2,
                          stage_repeats=3, calibration_rounds=0)
    assert len(build(repository, target=target)) == len(EXAMPLES)
    for example in EXAMPLES:
        manifest = Manifest.load(repository / example.name / VERSION)
        assert {(s.engine, s.precision) for s in manifest.stages} == {("torch", "fp16")}
    assert build(repository, target=target) == []
    assert len(build(repository, target=SliceOptions(warmup=1, node_repeats=2, stage_repeats=3,
                                                     calibration_rounds=0))) == len(EXAMPLES)


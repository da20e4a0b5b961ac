"""The example models: generated sources (``synthetic``), sliced into ``model_repository/``.

Source ONNX files go to the cache outside git; the model directories are generated on each
machine, none of it tracked: the stages are cut and their latency tables measured here. A model
whose stage files exist and whose manifest matches its source's sha256 is not sliced again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from backend.manifest import Manifest
from slicer.slicing import VERSION, SliceOptions, sha256, slice_model
from tools.lib import synthetic
from tools.lib.paths import DEFAULT_REPOSITORY, SOURCES


@dataclass(frozen=True)
class Example:
    name: str
    builder: str
    stages: int
    max_batch_size: int = 8

    @property
    def source(self) -> Path:
        return SOURCES / f"{self.builder}.onnx"


EXAMPLES = (
    Example("resnet_like", "resnet_like", stages=4),
    Example("unet_like", "unet_like", stages=3),
    Example("bert_like", "bert_like", stages=4),
)


def up_to_date(source: Path, model_dir: Path, options: SliceOptions | None = None) -> bool:
    """Whether ``model_dir`` was sliced from ``source`` as it is now (for the target, device and
    precision of ``options``, where given) and has all its stage files."""
    version_dir = model_dir / VERSION
    try:
        manifest = Manifest.load(version_dir)
    except (FileNotFoundError, ValueError, KeyError):
        return False
    if options is not None and (manifest.slicing is None or manifest.slicing.target != options.target
                                or options.device not in ("auto", manifest.slicing.device)
                                or {s.precision for s in manifest.stages} != {options.precision}):
        return False
    return (source.is_file() and manifest.source_sha256 == sha256(source)
            and all((version_dir / s.file).is_file() for s in manifest.stages))


def build(repository: Path = DEFAULT_REPOSITORY, force: bool = False, target: SliceOptions = SliceOptions()
          ) -> list[Path]:
    """Slice every example into ``repository`` for ``target``'s target, device and precision
    (ONNX Runtime on the CPU by default; a GPU host's replicas take torch stages on CUDA), those
    already sliced so from their current sources left as they are."""
    built = []
    for example in EXAMPLES:
        model_dir = repository / example.name
        options = replace(target, stages=example.stages, max_batch_size=example.max_batch_size)
        # Always regenerated (milliseconds, same bytes each time), so a changed builder is noticed.
        synthetic.save(synthetic.BUILDERS[example.builder](), example.source)
        if force or not up_to_date(example.source, model_dir, options):
            result = slice_model(example.source, model_dir, options)
            print(f"{example.name}: {example.stages} stages for {options.target} on {result.manifest.slicing.device} "
                  f"({options.precision}), balance {result.manifest.slicing.balance:.2f}, max abs error "
                  f"{result.max_abs_error:.2g}, cosine similarity {result.cosine:.7f}")
            built.append(model_dir)
    return built

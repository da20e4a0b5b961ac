"""The configurations a comparison serves, as models of one scratch repository.

- ours: the sliced model as its config.pbtxt says, and variants of it with other parameters
  (``--variant NAME:key=value,...``; setting ``policy`` drops the old policy's settings);
- ZeroBatch and DelayBatch: the unsliced model behind Triton's dynamic batcher (``tools.baselines``)
  at delay 0 and at several delays, ONNX Runtime's threads spinning or not; for a model with a
  length axis, three ways to send text: unpadded with Triton batching only equal shapes (its
  default), unpadded with ragged batches padded to their longest query by the server (the
  paper's baseline), or padded by the client to a fixed length. The best of each is chosen by
  its peak.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from backend.manifest import Manifest
from slicer.triton_config import PARAMETER, parameters_of
from slicer.slicing import VERSION
from tools.baselines import link_version, write_baseline



@dataclass(frozen=True)
class Config:
    """One way of serving the model: a model of the scratch repository and how it is loaded."""

    label: str
    model: str
    kind: str  # "ours", "zero" or "delay"
    sending: str = "exact"  # "exact" shapes batch together, "ragged" batches padded by the server, "client" pads
    delay_us: int = 0
    spinning: bool = False

    @property
    def baseline(self) -> bool:
        return self.kind != "ours"

    @property
    def padded(self) -> bool:
        """The client pads every query to a fixed length."""
        return self.sending == "client"


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:key=value,key=value`` -> (NAME, parameters)."""
    name, _, settings = text.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"--variant {text!r}: expected NAME:key=value,... with a plain NAME")
    parameters = {}
    for item in filter(None, settings.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--variant {text!r}: {item!r} is not key=value")
        parameters[key.strip()] = value.strip()
    return name, parameters


def write_variant(model_dir: Path, repository: Path, name: str, overrides: Mapping[str, str]) -> Path:
    """``model_dir`` as model ``name`` with ``overrides`` on its config.pbtxt parameters; the rest
    of its config (instances, batcher, comments) as the user left it."""
    out = repository / name
    link_version(model_dir, out)
    lines = (model_dir / "config.pbtxt").read_text().splitlines()
    parameters = parameters_of("\n".join(lines))
    if "policy" in overrides:
        parameters = {k: v for k, v in parameters.items() if not k.startswith("policy.")}
    parameters.update(overrides)
    kept = [re.sub(r'^name:\s*".*"', f'name: "{name}"', line) for line in lines if not PARAMETER.match(line.strip())]
    kept += [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()]
    (out / "config.pbtxt").write_text("\n".join(kept) + "\n")
    return out


def ours(model_dir: Path, repository: Path, variants: Sequence[str]) -> list[Config]:
    """The model as configured, and each ``--variant``."""
    configs = [Config(f"DVABatch ({model_dir.name})", f"{model_dir.name}_dva", "ours")]
    write_variant(model_dir, repository, configs[0].model, {})
    for text in variants:
        name, overrides = parse_variant(text)
        configs.append(Config(f"DVABatch {name}", f"{model_dir.name}_dva_{name}", "ours"))
        write_variant(model_dir, repository, configs[-1].model, overrides)
    return configs


SENDING_LABELS = {"exact": "", "ragged": ", ragged", "client": ", client pads"}


def baseline(whole: Path, repository: Path, name: str, delay_us: int, spinning: bool, sending: str) -> Config:
    """One baseline candidate, written into ``repository`` (a model per delay, spinning and raggedness)."""
    model = f"{name}_{'zero' if delay_us == 0 else f'delay{delay_us}us'}" + ("_spin" if spinning else "") \
        + ("_ragged" if sending == "ragged" else "")
    if not (repository / model).is_dir():
        write_baseline(whole, repository, model, delay_us, spinning, ragged=sending == "ragged")
    label = ("ZeroBatch" if delay_us == 0 else f"DelayBatch {delay_us / 1000:g} ms") + SENDING_LABELS[sending] \
        + (", spinning" if spinning else "")
    return Config(label, model, "zero" if delay_us == 0 else "delay", sending, delay_us, spinning)


def delay_candidates(whole: Path) -> list[int]:
    """Delays worth trying (us): half and all of one query's time, and half and all of a full
    batch's time on the whole model (longest length): DelayBatch's window is tuned for its peak."""
    table = Manifest.load(whole / VERSION).stages[0].latency
    row = table.row(table.lengths[-1] if table.lengths else None)
    return sorted({max(100, round(ms * 1000 / 100) * 100) for ms in (row[0] / 2, row[0], row[-1] / 2, row[-1])})

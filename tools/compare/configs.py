"""The configurations a comparison serves, as models of one scratch repository.

- ours: the sliced model as its config.pbtxt says, and variants of it with other parameters
  (``--variant NAME:key=value,...``; setting ``policy`` drops the old policy's settings), sent
  text unpadded and, with ``--ours-sendings exact,client``, also padded by the client;
- plain: the unsliced model as a plain Python-backend model behind Triton's dynamic batcher
  (``tools.baselines``), at delay 0 and tuned delays, ONNX Runtime's threads spinning (its
  default) or sleeping; for a model with a length axis, three ways to send text: unpadded with
  Triton batching equal shapes only (its default), unpadded in ragged batches padded by the model,
  or padded by the client to a fixed length;
- ensemble: the sliced model's stages, each its own plain model with its own dynamic batcher,
  wired by Triton's ensemble scheduler; unpadded (equal shapes) or padded by the client;
- the A/A copy: the best baseline again under another name, measured beside it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from backend.manifest import Manifest
from slicer.slicing import VERSION
from tools.lib.peers import write_variant, Peer, write_ensemble, write_plain


@dataclass(frozen=True)
class Config:
    """One way of serving the model: a model of the scratch repository and how it is loaded."""

    label: str
    model: str
    kind: str  # "ours", "plain" or "ensemble"
    sending: str = "exact"  # "exact" shapes batch together, "ragged" batches padded by the model, "client" pads
    delay_us: int = 0
    spinning: bool = True
    steps: tuple[str, ...] = ()  # models whose batches Triton forms: the plain model, an ensemble's steps
    copy: bool = False  # the A/A copy of another configuration

    @property
    def baseline(self) -> bool:
        return self.kind != "ours"

    @property
    def padded(self) -> bool:
        """The client pads every query to a fixed length."""
        return self.sending == "client"

    @property
    def models(self) -> tuple[str, ...]:
        """Every model to load, the one requests go to last."""
        return (*[s for s in self.steps if s != self.model], self.model)


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


def ours(model_dir: Path, repository: Path, variants: Sequence[str], sendings: Sequence[str] = ("exact",)
         ) -> list[Config]:
    """The model as configured, and each ``--variant``, each sent text as each of ``sendings``
    says: unpadded (``exact``; ours batches every length) or padded by the client (``client``:
    what the plain model's client does; the same model, other data)."""
    served = [(f"DVABatch ({model_dir.name})", f"{model_dir.name}_dva")]
    write_variant(model_dir, repository, served[0][1], {})
    for text in variants:
        name, overrides = parse_variant(text)
        served.append((f"DVABatch {name}", f"{model_dir.name}_dva_{name}"))
        write_variant(model_dir, repository, served[-1][1], overrides)
    return [Config(label + SENDING_LABELS[sending], model, "ours", sending)
            for label, model in served for sending in sendings]


SENDING_LABELS = {"exact": "", "ragged": ", ragged", "client": ", client pads"}


def _label(kind: str, delay_us: int, sending: str, spinning: bool) -> str:
    return (f"{'Plain' if kind == 'plain' else 'Ensemble'} {'delay 0' if not delay_us else f'{delay_us / 1000:g} ms'}"
            + SENDING_LABELS[sending] + ("" if spinning else ", threads sleep"))


def baseline(model_dir: Path, repository: Path, kind: str, delay_us: int, spinning: bool, sending: str,
             source: Path | None = None, copy: bool = False) -> Config:
    """One plain or ensemble candidate (or, with ``copy``, a second copy of it: the A/A row),
    written into ``repository`` unless an earlier candidate wrote the same model (the client
    pads its queries for the same model as sends them unpadded)."""
    model = f"{model_dir.name}_{kind}_{delay_us}us" + ("" if spinning else "_sleep") \
        + ("_ragged" if sending == "ragged" else "") + ("_copy" if copy else "")
    peer = Peer(delay_us=delay_us, spinning=spinning, ragged=sending == "ragged")
    stages = len(Manifest.load(model_dir / VERSION).stages)
    steps = (model,) if kind == "plain" else tuple(f"{model}_s{k}" for k in range(stages))
    if not (repository / model / "config.pbtxt").is_file():
        if kind == "plain":
            write_plain(model_dir, repository, model, peer, source)
        else:
            write_ensemble(model_dir, repository, model, peer)
    label = _label(kind, delay_us, sending, spinning)
    return Config(f"A/A: {label} (copy)" if copy else label, model, kind, sending, delay_us, spinning, steps, copy)

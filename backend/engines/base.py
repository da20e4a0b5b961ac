"""The interface every engine sits behind (its own module, so that each engine's module can name it
without importing the package that loads them all)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

Tensors = dict[str, Any]


class Engine(Protocol):
    """Computes a stage's outputs from its inputs on the executor's current stream; row i of
    every output belongs to input row i."""

    def run(self, inputs: Mapping[str, Any]) -> Tensors: ...

    def names(self) -> tuple[Collection[str], Collection[str]]:
        """The inputs it takes and the outputs it can compute (checked against the manifest at
        load: ``engines.load_engine``)."""

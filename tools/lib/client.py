"""Thin helpers over tritonclient gRPC, shared by the demo, the load tools and the tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype


DEADLINE_S = 60.0  # a request in a stub that died is never answered (Triton 24.10): give up then


def infer(client: grpcclient.InferenceServerClient, model: str, feed: Mapping[str, np.ndarray],
          outputs: Sequence[str] = (), deadline_s: float | None = DEADLINE_S, timeout_us: int | None = None
          ) -> dict[str, np.ndarray]:
    """One unary gRPC request with a deadline; returns the outputs the response holds (those asked
    for, or all outputs when none are named). ``timeout_us``: the request's own timeout, which the
    server's queue policy (and ``policy: slo``) reads as its deadline."""
    inputs = []
    for name, array in feed.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] or None
    result = client.infer(model, inputs, outputs=requested, client_timeout=deadline_s, timeout=timeout_us)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response(as_json=True)["outputs"]}

"""The backend's knobs, read from config.pbtxt ``parameters`` (all values are strings there).

    parameters: { key: "buffer_pairs"    value: { string_value: "2" } }    # >= 1; 1 = serial manner
    parameters: { key: "batch_window_ms" value: { string_value: "0" } }    # >= 0; entry batch window
    parameters: { key: "policy"          value: { string_value: "pass" } } # pass | fixed | random
    parameters: { key: "policy.seed"     value: { string_value: "7" } }    # a setting of the policy
    parameters: { key: "batching"        value: { string_value: "dvabatch" } }  # dvabatch | triton
    parameters: { key: "intra_op_thread_count" value: { string_value: "0" } }   # 0: cores / stages
    parameters: { key: "allow_spinning"  value: { string_value: "false" } }     # ONNX Runtime threads

``batching: triton`` serves the model single-entry single-exit: Triton's dynamic batcher forms
each batch and ``execute`` runs it through every stage to completion. The baselines
(``<name>_zero``, ``<name>_delay``) are served this way, on the same engines as our pipeline.

Anything else, or a value of the wrong kind, fails the model load with a message naming the
parameter, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .policy import ConfigError, Policy, make_policy, parse_value

POLICY_PREFIX = "policy."
BATCHING = ("dvabatch", "triton")


@dataclass(frozen=True)
class RuntimeConfig:
    buffer_pairs: int = 2
    batch_window_ms: float = 0.0
    batching: str = "dvabatch"
    intra_op_thread_count: int = 0  # ONNX Runtime threads per stage; 0: the cores shared among the stages
    allow_spinning: bool = False  # let idle ONNX Runtime threads spin (may win for a lone model on idle cores)
    policy: Policy = field(default_factory=Policy)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> RuntimeConfig:
        known = {f.name: type(f.default) for f in fields(cls) if f.name != "policy"}
        values: dict = {}
        settings = {}
        for key, text in parameters.items():
            if key.startswith(POLICY_PREFIX):
                settings[key[len(POLICY_PREFIX):]] = text
            elif key in known:
                values[key] = parse_value(key, text, known[key])
            elif key != "policy":
                raise ConfigError(f"parameter '{key}' is unknown; known: {', '.join([*known, 'policy', 'policy.*'])}")
        if values.get("buffer_pairs", 1) < 1:
            raise ConfigError(f"parameter 'buffer_pairs' must be at least 1, got {values['buffer_pairs']}")
        if values.get("batch_window_ms", 0) < 0:
            raise ConfigError(f"parameter 'batch_window_ms' must be >= 0, got {values['batch_window_ms']}")
        if values.get("intra_op_thread_count", 0) < 0:
            raise ConfigError("parameter 'intra_op_thread_count' must be >= 0 (0: cores / stages), "
                              f"got {values['intra_op_thread_count']}")
        if values.get("batching", BATCHING[0]) not in BATCHING:
            raise ConfigError(f"parameter 'batching' is {values['batching']!r}; known: {', '.join(BATCHING)}")
        return cls(**values, policy=make_policy(parameters.get("policy", "pass"), settings))


def triton_parameters(model_config: Mapping) -> dict[str, str]:
    """config.pbtxt ``parameters`` as Triton hands them to a Python backend (JSON), as strings."""
    return {key: value["string_value"] for key, value in model_config.get("parameters", {}).items()}

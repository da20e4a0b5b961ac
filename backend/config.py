"""The runtime's knobs, read from config.pbtxt ``parameters`` (all values are strings there).

    parameters: { key: "buffer_pairs"    value: { string_value: "2" } }    # >= 1; 1 = serial manner
    parameters: { key: "batch_window_ms" value: { string_value: "0" } }    # >= 0; entry batch window
    parameters: { key: "policy"          value: { string_value: "pass" } } # pass | fixed | random
    parameters: { key: "policy.seed"     value: { string_value: "7" } }    # a setting of the policy

Anything else, or a value of the wrong kind, fails the model load with a message naming the
parameter, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .policy import ConfigError, Policy, make_policy, parse_value

POLICY_PREFIX = "policy."


@dataclass(frozen=True)
class RuntimeConfig:
    buffer_pairs: int = 2
    batch_window_ms: float = 0.0
    policy: Policy = field(default_factory=Policy)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> RuntimeConfig:
        known = {"buffer_pairs": int, "batch_window_ms": float}
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
        return cls(**values, policy=make_policy(parameters.get("policy", "pass"), settings))


def triton_parameters(model_config: Mapping) -> dict[str, str]:
    """config.pbtxt ``parameters`` as Triton hands them to a Python backend (JSON), as strings."""
    return {key: value["string_value"] for key, value in model_config.get("parameters", {}).items()}

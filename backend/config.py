"""The backend's knobs, read from config.pbtxt ``parameters`` (all values are strings there).

    parameters: { key: "buffer_pairs"    value: { string_value: "3" } }    # >= 1; 1 = serial manner
    parameters: { key: "policy"          value: { string_value: "auto" } } # see POLICIES
    parameters: { key: "policy.statistic" value: { string_value: "p99" } } # a setting of the policy
    parameters: { key: "batch_window_ms" value: { string_value: "-1" } }   # -1: the policy's; >= 0: fixed
    parameters: { key: "pad_value.input_ids" value: { string_value: "0" } }  # what pads an input (0)
    parameters: { key: "max_size.sequence" value: { string_value: "512" } }  # longest named axis served
    parameters: { key: "batching"        value: { string_value: "dvabatch" } }  # dvabatch | triton
    parameters: { key: "intra_op_thread_count" value: { string_value: "0" } }   # 0: every core
    parameters: { key: "allow_spinning"  value: { string_value: "auto" } }      # ONNX Runtime threads
    parameters: { key: "execute_waits"   value: { string_value: "auto" } }      # back-pressure on Triton
    parameters: { key: "lone_inline"     value: { string_value: "auto" } }      # lone batches in execute
    parameters: { key: "cuda_graphs"     value: { string_value: "auto" } }      # torch stages as CUDA graphs

``batching: triton`` serves the model single-entry single-exit: Triton's dynamic batcher forms
each batch and ``execute`` runs it through every stage to completion and returns the responses,
on the same engines and validation as the pipeline (``whole.py``).

Anything else, or a value of the wrong kind, fails the model load with a message naming the
parameter, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from .dispatch import SmdpPolicy
from .diversity import PRESETS, DiversityPolicy
from .manifest import Manifest
from .errors import ConfigError
from .policy import FixedPolicy, Policy, RandomPolicy
from .slo import SloPolicy

POLICY_PREFIX = "policy."
PAD_PREFIX = "pad_value."
SIZE_PREFIX = "max_size."
BATCHING = ("dvabatch", "triton")
POLICIES: dict[str, type[Policy]] = {"pass": Policy, "fixed": FixedPolicy, "random": RandomPolicy,
                                     **{name: DiversityPolicy for name in PRESETS}, "smdp": SmdpPolicy,
                                     "slo": SloPolicy}


@dataclass(frozen=True)
class QueuePolicy:
    """config.pbtxt's ``dynamic_batching { default_queue_policy { ... } }``. Triton applies it in
    its own queue, which our ``execute`` empties whenever stage 0 has computed a batch, so the entry
    applies it too, to the queries waiting for stage 0: a full queue refuses (UNAVAILABLE), a
    query still waiting when its timeout expires is refused (timeout action REJECT) or kept
    (DELAY). With it, the batcher's ``max_queue_delay_microseconds`` (``delay_us``): how long a
    request may have waited in Triton's queue unseen (``arrival.py``), and how long the instance
    may sit idle between two calls while the batcher waits for more (``decide.round_trip_s``)."""

    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    reject: bool = True
    delay_us: int = 0

    @classmethod
    def from_model_config(cls, model_config: Mapping) -> QueuePolicy:
        batching = model_config.get("dynamic_batching", {})
        policy = batching.get("default_queue_policy", {})
        return cls(max_queue_size=int(policy.get("max_queue_size", 0)),
                   default_timeout_us=int(policy.get("default_timeout_microseconds", 0)),
                   allow_timeout_override=bool(policy.get("allow_timeout_override", False)),
                   reject=policy.get("timeout_action", "REJECT") != "DELAY",
                   delay_us=int(batching.get("max_queue_delay_microseconds", 0)))

    def timeout_us(self, requested_us: int) -> int:
        """A request's timeout: its own where the policy allows an override and it is the shorter
        (Triton's queue takes it so: core ``PolicyQueue::Enqueue``), or where the policy sets no
        default (Triton's queue then keeps the request without one, but a client's deadline is
        still its deadline here), else the policy's default; 0: none."""
        if not requested_us or not self.default_timeout_us:
            return requested_us or self.default_timeout_us
        return min(requested_us, self.default_timeout_us) if self.allow_timeout_override else self.default_timeout_us

    def any_deadline(self, requested_us: Iterable[int]) -> bool:
        """Whether any of these requests has a timeout (``timeout_us`` nonzero): every one where
        the policy sets a default, else those that ask for one. No call a request: ``execute``
        asks this of every call served plain."""
        return bool(self.default_timeout_us) or any(requested_us)


@dataclass(frozen=True)
class RuntimeConfig:
    # Three, not the paper's two: with two, stage 0 can run only one batch ahead, and batches of
    # uneven size (a closed loop's bursts) leave each stage waiting for the other.
    buffer_pairs: int = 3
    batch_window_ms: float = -1.0  # the entry's batch window; -1: the policy's (none but Policy I's)
    batching: str = "dvabatch"
    intra_op_thread_count: int = 0  # ONNX Runtime threads per stage; 0: every core (idle threads sleep)
    allow_spinning: str = "auto"  # let idle ONNX Runtime threads spin: true, false, or auto (see ``spins``)
    execute_waits: str = "auto"  # a pipeline's execute waits for stage 0: true, false, or auto (``decide.waits``)
    # A batch finding the pipeline empty may run inside execute (``decide.LoneRuns``): true, false,
    # or auto (only under ``policy: auto``: another policy's every batch enters the pipeline).
    lone_inline: str = "auto"
    cuda_graphs: str = "auto"  # torch stages replay CUDA graphs per shape bucket: true, false, or auto (``graphs``)
    pad_values: Mapping[str, float] = field(default_factory=dict)  # input -> what pads it (default 0)
    max_sizes: Mapping[str, int] = field(default_factory=dict)  # named axis -> largest size served (0: any)
    queue: QueuePolicy = field(default_factory=lambda: QueuePolicy())  # from dynamic_batching, not parameters
    policy: Policy = field(default_factory=Policy)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> RuntimeConfig:
        special = ("policy", "pad_values", "max_sizes", "queue")
        known = {f.name: type(f.default) for f in fields(cls) if f.name not in special}
        values: dict = {}
        settings, pads, sizes = {}, {}, {}
        for key, text in parameters.items():
            if key.startswith(POLICY_PREFIX):
                settings[key[len(POLICY_PREFIX):]] = text
            elif key.startswith(PAD_PREFIX):
                pads[key[len(PAD_PREFIX):]] = parse_value(key, text, float)
            elif key.startswith(SIZE_PREFIX):
                sizes[key[len(SIZE_PREFIX):]] = parse_value(key, text, int)
                if sizes[key[len(SIZE_PREFIX):]] < 0:
                    raise ConfigError(f"parameter '{key}' must be >= 0 (0: any size), got {text!r}")
            elif key in known:
                values[key] = parse_value(key, text, known[key])
            elif key != "policy":
                raise ConfigError(f"parameter '{key}' is unknown; known: "
                                  f"{', '.join([*known, 'policy', 'policy.*', 'pad_value.*', 'max_size.*'])}")
        if values.get("buffer_pairs", 1) < 1:
            raise ConfigError(f"parameter 'buffer_pairs' must be at least 1, got {values['buffer_pairs']}")
        if values.get("batch_window_ms", -1) != -1 and values["batch_window_ms"] < 0:
            raise ConfigError(f"parameter 'batch_window_ms' must be >= 0, or -1 for the policy's window, "
                              f"got {values['batch_window_ms']}")
        if values.get("intra_op_thread_count", 0) < 0:
            raise ConfigError("parameter 'intra_op_thread_count' must be >= 0 (0: every core), "
                              f"got {values['intra_op_thread_count']}")
        for switch in ("allow_spinning", "execute_waits", "cuda_graphs", "lone_inline"):
            if switch in values:
                values[switch] = values[switch].lower()
                if values[switch] not in ("auto", "true", "false"):
                    raise ConfigError(f"parameter '{switch}' is {values[switch]!r}; known: auto, true, false")
        if values.get("batching", BATCHING[0]) not in BATCHING:
            raise ConfigError(f"parameter 'batching' is {values['batching']!r}; known: {', '.join(BATCHING)}")
        policy = make_policy(parameters.get("policy", "pass"), settings)
        return cls(**values, pad_values=pads, max_sizes=sizes, policy=policy)

    def spins(self, alone: bool) -> bool:
        """Whether ONNX Runtime's threads spin between the operators of a run (and when it ends:
        on between runs for a session alone, stopping where sessions share the cores; see
        ``engines.ort_options``). ``auto``: only where one session runs at a time
        (``alone``: a fused model, or Triton's batching): spinning spares the wake-up of the
        threads at each operator, and nothing else waits for those cores; in a pipeline, stages
        that spin take the cores the co-running ones need."""
        return alone if self.allow_spinning == "auto" else self.allow_spinning == "true"

    def graphs(self, manifest: Manifest, gpu: bool) -> bool:
        """Whether torch stages replay a CUDA graph per shape bucket (``engines.graph_buckets``;
        a batch's length padded up to a bucket first): ``auto``, on a GPU instance; ``true``, on
        a CPU one too, where the same buckets run on static buffers (what the tests check without
        a GPU); ``false``, never (the interpreter runs every batch at its own shape)."""
        if not any(stage.engine == "torch" for stage in manifest.stages):
            return False
        return gpu if self.cuda_graphs == "auto" else self.cuda_graphs == "true"

    def bind(self, manifest: Manifest) -> None:
        """Check the knobs against the model and let the policy read its tables."""
        inputs = [spec.name for spec in manifest.inputs]
        for name in self.pad_values:
            if name not in inputs:
                raise ConfigError(f"parameter '{PAD_PREFIX}{name}' names no input; the inputs are {', '.join(inputs)}")
        axes = sorted({d for spec in manifest.inputs for d in spec.dims if isinstance(d, str)})
        built = manifest.size_limits if any(s.engine == "tensorrt" for s in manifest.stages) else {}
        for axis, size in self.max_sizes.items():
            if axis not in axes:
                raise ConfigError(f"parameter '{SIZE_PREFIX}{axis}' names no axis; the named axes are "
                                  f"{', '.join(axes) or 'none'}")
            if axis in built and (size == 0 or size > built[axis]):
                raise ConfigError(f"parameter '{SIZE_PREFIX}{axis}' is {size}, but the TensorRT engines were built "
                                  f"for sizes up to {built[axis]}; slice again with a longer --lengths")
        self.policy.bind(manifest)

    def size_limits(self, manifest: Manifest) -> dict[str, int]:
        """The largest size served on each named axis: the model's profiled one unless set here."""
        return {**manifest.size_limits, **self.max_sizes}


def make_policy(name: str, settings: Mapping[str, str]) -> Policy:
    """The policy called ``name`` with its settings parsed from strings; errors name the parameter."""
    if name not in POLICIES:
        raise ConfigError(f"parameter 'policy' is {name!r}; known policies: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    fields_ = {f.name: f for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else {}
    values: dict = dict(PRESETS.get(name, {}))
    for key, text in settings.items():
        if key not in fields_:
            raise ConfigError(f"parameter 'policy.{key}' is not a setting of policy {name!r}; "
                              f"its settings: {', '.join(fields_) or 'none'}")
        values[key] = parse_value(f"policy.{key}", text, type(fields_[key].default))
    policy = cls(**values)
    policy.name = name
    return policy


def triton_parameters(model_config: Mapping) -> dict[str, str]:
    """config.pbtxt ``parameters`` as Triton hands them to a Python backend (JSON), as strings."""
    return {key: value["string_value"] for key, value in model_config.get("parameters", {}).items()}


def parse_value(parameter: str, text: str, kind: type) -> bool | int | float | str:
    """``text`` as ``kind``; a ConfigError naming ``parameter`` if it is not one."""
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"parameter '{parameter}' must be true or false, got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"parameter '{parameter}' must be {'an' if kind is int else 'a'} {kind.__name__}, "
                          f"got {text!r}") from None

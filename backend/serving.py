"""How a model serves, decided once when it loads: through the pipeline, or as a plain model.

- ``PIPELINE``: the multi-entry multi-exit runtime (``runtime.py``), each query answered as soon
  as its rows leave; a batch that finds the pipeline empty may run to the end inside
  ``execute`` instead, while requests rarely arrive during one (``lone.py``).
- ``FUSED``: the policy stepped aside (``Policy.choose``), so the stages run as one engine
  (``engines.fusable``: one ONNX Runtime session, or one timed engine) on the batch Triton's
  batcher formed, inside ``execute``, and the responses go back in the list ``execute``
  returns: what a plain Python model does, with no threads, hand-offs or per-response round
  trips to pay for.
- ``IN_TURN``: the same single-entry single-exit serving with the stages run one after another:
  where the policy stepped aside on engines that cannot fuse (TensorRT), and for ``batching:
  triton`` (the stages as sliced, for comparisons).

Nothing here imports Triton, so the choice can be tested directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from .config import RuntimeConfig
from .device import CpuDevice, Device
from .diversity import PIPELINE_COST_US, engine_capacity, interpreted
from .engines import cpu_cores, describe_graphs, fusable, graph_buckets, load_engines, on_host_cores
from .executor import Trace
from .manifest import Manifest
from .metrics import Metrics
from .padding import Buckets
from .policy import Choice
from .runtime import Runtime
from .whole import WholeBatch, together


class Mode(Enum):
    PIPELINE = "pipeline"
    FUSED = "fused"
    IN_TURN = "in_turn"


# At the engines' capacity, serving every request through the pipeline would take at least this
# share of the host's cores: the CPU, not the engines, caps the pipeline (see ``waits``).
CPU_BOUND = 0.5


@dataclass(frozen=True)
class Decision:
    mode: Mode
    choice: Choice
    waits: bool = False  # a pipeline's ``execute`` waits until stage 0 has computed its queries
    waits_why: str = ""
    graphs: str = ""  # the torch stages' CUDA graphs, where they have them (``engines.describe_graphs``)


def decide(manifest: Manifest, config: RuntimeConfig, cores: int | None = None,
           device: Device | None = None) -> Decision:
    """How the model serves on ``cores`` (default: those this process may use) of a host whose
    stages run on ``device`` (default: the CPU), and why."""
    if config.batching == "triton":
        return Decision(Mode.IN_TURN, Choice(False, "batching: triton"))
    cores = cores or cpu_cores()
    on_cores = on_host_cores(manifest, device or CpuDevice())
    choice = config.policy.choose(manifest, cores, on_cores)
    if choice.pipeline:
        return Decision(Mode.PIPELINE, choice, *waits(manifest, config, cores, on_cores))
    return Decision(Mode.FUSED if fusable(manifest) else Mode.IN_TURN, choice)


def waits(manifest: Manifest, config: RuntimeConfig, cores: int, on_cores: bool) -> tuple[bool, str]:
    """Whether a pipeline's ``execute`` waits until stage 0 has computed the queries it handed
    over (``Entry.wait_ready``), and why. Waiting keeps Triton's batching alive: the requests
    that arrive meanwhile come in one ``execute``, and the responses ready by then go back in
    its list, not one ``send()`` each: where the host's CPU caps the pipeline (serving costs
    ``pipeline_cost_us`` a request, and at the engines' capacity that would take ``CPU_BOUND``
    of the cores), that is what keeps up (two 1.3 ms stages flat in the batch size, 64 in
    flight: 2,400 against 1,800 requests/s). Where the engines cap it, the requests waiting
    unseen in Triton's queue meanwhile are what costs: they miss the batch stage 0 forms next,
    and the policy's slack and arrival rate cannot count them; returning at once lets the entry
    see every query as it arrives (two slow stages on RTE: 0.72x the ensemble's mean latency at
    medium load against 0.92x waiting, 1.25x its answers at 16 in flight against 1.11x;
    docs/results/sim-slow-rte-nowait). ``execute_waits`` true or false decides
    instead; without latency tables it waits."""
    if config.execute_waits != "auto":
        return config.execute_waits == "true", f"execute_waits is {config.execute_waits}"
    tables = [stage.latency for stage in manifest.stages]
    if any(table is None for table in tables):
        return True, "execute waits: no latency tables to tell whether the engines or the CPU cap the pipeline"
    # The diversity policy knows this host's serving cost (policy.pipeline_cost_us); others take the default.
    cost_us = getattr(config.policy, "pipeline_cost_us", PIPELINE_COST_US)
    # Stages on the host's cores (``on_cores``) hold them for all their time, which the tables
    # already are: only torch stages on a GPU add the interpreter's turns (``interpreted``).
    capacity = engine_capacity(tables, pipelined=True, shared_host=interpreted(manifest) and not on_cores)
    share = capacity * cost_us / 1e6 / cores
    cpu = share >= CPU_BOUND
    return cpu, (f"execute {'waits for stage 0: the CPU caps' if cpu else 'returns at once: the engines cap'} the "
                 f"pipeline (the engines' {capacity:.0f} requests/s at {cost_us:.0f} us of serving each would take "
                 f"{share:.0%} of {cores} cores)")


def serve(manifest: Manifest, version_dir: Path, config: RuntimeConfig, device: Device, metrics: Metrics,
          on_death: Callable[[str], None] | None = None, trace: Trace | None = None
          ) -> tuple[Decision, WholeBatch | Runtime]:
    """The model's engines loaded and its server built: a ``WholeBatch`` (``execute`` runs each
    batch) or a ``Runtime`` (``execute`` hands over and returns once stage 0 has computed them)."""
    graphs = config.graphs(manifest, not isinstance(device, CpuDevice))
    lengths = graph_buckets(manifest)[1] if graphs else ()
    buckets = Buckets({manifest.length_axis: lengths}) if lengths else Buckets()
    if graphs:  # every batch runs at a bucket's length, and a stage costs the host a graph's launch
        manifest = manifest.as_graphs()
    decision = decide(manifest, config, device=device)
    metrics.serving(decision.mode.value, decision.choice.capacity)
    chosen = decision.mode
    fused = chosen is Mode.FUSED
    alone = chosen is not Mode.PIPELINE or len(manifest.stages) == 1  # one session runs at a time
    engines = load_engines(manifest, version_dir, device, config.intra_op_thread_count or cpu_cores(),
                           config.spins(alone), fused, graphs)
    decision = replace(decision, graphs=describe_graphs(engines))
    if chosen is Mode.PIPELINE:
        return decision, Runtime(manifest, engines, config, device, trace=trace, metrics=metrics, on_death=on_death,
                                 buckets=buckets)
    manifest = manifest.fused() if fused else manifest
    config.bind(manifest)
    # Where compute is dear (ONNX Runtime on the CPU's cores) the policy's clusters by length save
    # it; on engines that overlap (a GPU; timed) the host's CPU is dear too, and the policy cuts a
    # batch in two only where the tables save more than one more run costs the host.
    if config.batching == "triton":
        form = together
    elif on_host_cores(manifest, device):
        def form(queries):
            return [batch for batch, _ in config.policy.form(queries, manifest.max_batch_size, time.monotonic())]
    else:
        form = config.policy.form_inline
    return decision, WholeBatch(manifest, engines, device, metrics, config.pad_values, config.size_limits(manifest),
                                form, buckets)

"""Where an ONNX graph may be cut, and the stage graphs on either side of the cuts.

A cut is a position ``k`` in the topological order of the graph's nodes: nodes before ``k`` go to
the earlier stage. Every tensor produced before the cut and still needed at or after it crosses
the cut; skip connections and masks simply cross several cuts. A cut is legal when every tensor
crossing it is *batched* (batch axis first, each row depending only on its own query): only then
can the runtime stretch, split and route batches by rows. Constant subgraphs are cloned into
every stage that uses them. So are *shape subgraphs*: small per-batch values computed only from
``Shape``/``Size`` of batched tensors and constants (the shape vectors torch.export computes once
and reuses in every layer). They never cross a cut; each stage that needs one recomputes it from
the batched tensors its ``Shape`` nodes read (their *roots*), which cross the cut instead. Without
that, one shape vector shared by every layer would block every cut between its first and last use.

Which tensors are batched is measured rather than guessed from shape inference: the graph runs on
ONNX Runtime at two batch sizes with all intermediate tensors exposed, which also gives every
tensor's dtype and which of its axes vary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from backend.engines import ort_options
from backend.manifest import Dim, TensorSpec
from slicer.errors import SliceError
from backend.sample import DEFAULT_DIM_SIZE, sample_inputs

# Two probe runs whose batch sizes and dynamic-axis sizes differ from each other and from the
# sizes a fixed axis is likely to have, so a coincidence cannot make a tensor look batched.
PROBE_BATCHES = (2, 3)
# Nodes that read only constants but must not be cloned: each clone would draw other values.
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Names a node reads, including outer-scope names its subgraphs (If, Loop, Scan) use."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
            defined |= {o for n in graph.node for o in n.output}
            names += [name for n in graph.node for name in node_inputs(n) if name not in defined]
    return names


def topological_order(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes in a dependency-respecting order, as close to file order as possible."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    deps = [{producer[n] for n in node_inputs(node) if n in producer} for node in graph.node]
    order: list[int] = []
    placed: set[int] = set()
    remaining = list(range(len(graph.node)))
    while remaining:
        ready = [i for i in remaining if deps[i] <= placed]
        if not ready:
            raise SliceError("the graph has a cycle")
        order += ready
        placed.update(ready)
        remaining = [i for i in remaining if i not in placed]
    return [graph.node[i] for i in order]


@dataclass(frozen=True)
class TensorFacts:
    """What the probe runs showed about one tensor."""

    dtype: str
    batched: bool
    dims: tuple[Dim, ...]  # without the batch axis; -1 where the probes saw different sizes


@dataclass
class GraphAnalysis:
    """The graph in cut order, with producer and last use of every non-constant tensor."""

    model: onnx.ModelProto
    nodes: list[onnx.NodeProto]  # the nodes cuts fall between (not constant, not shape), topologically ordered
    constants: dict[str, onnx.NodeProto]  # constant tensor name -> node computing it
    initializers: dict[str, onnx.TensorProto]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    facts: dict[str, TensorFacts]
    produced_at: dict[str, int]  # -1 for model inputs
    last_use: dict[str, int]  # len(nodes) for model outputs; a shape value's use counts as its roots'
    shapes: dict[str, onnx.NodeProto] = field(default_factory=dict)  # shape value -> node computing it
    roots: dict[str, frozenset[str]] = field(default_factory=dict)  # shape value -> batched tensors it reads
    rank: dict[int, int] = field(default_factory=dict)  # id(node) -> position in the topological order

    def cloned(self, names) -> list[onnx.NodeProto]:
        """The constant and shape nodes computing ``names`` (transitively), topologically ordered:
        what a stage reading ``names`` computes for itself."""
        needed: dict[int, onnx.NodeProto] = {}
        pending = list(names)
        while pending:
            name = pending.pop()
            node = self.constants.get(name) or self.shapes.get(name)
            if node is not None and id(node) not in needed:
                needed[id(node)] = node
                pending += node_inputs(node)
        return sorted(needed.values(), key=lambda node: self.rank[id(node)])

    def shapes_at(self, names: Sequence[str], batch: int, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """The shapes ``names`` take when the model runs ``batch`` rows with its named axes at
        ``sizes``: how an intermediate tensor's varying axes (stored as -1) follow them."""
        feed = sample_inputs(self.inputs, batch, sizes, seed=batch)
        inner = [n for n in names if n not in feed]
        computed = dict(zip(inner, exposing(self.model, inner).run(inner, feed))) if inner else {}
        return {n: tuple((feed.get(n) if n in feed else computed[n]).shape) for n in names}

    def reads(self, body: list[onnx.NodeProto]) -> set[str]:
        """The tensors a stage of ``body`` needs from outside: what its nodes read, with shape
        values replaced by their roots, less constants."""
        names = {n for node in body for n in node_inputs(node)}
        names |= {n for node in self.cloned(names) for n in node_inputs(node)}
        return {n for n in names if n not in self.constants and n not in self.shapes and n not in self.initializers}

    def blocking(self) -> dict[str, int]:
        """Tensors that make cuts illegal (not batched, yet crossing), with how many cuts each
        blocks, most first: what a model's exporter would have to change for more legal cuts."""
        counts: dict[str, int] = {}
        for k in range(1, len(self.nodes)):
            for t in self.crossing(k):
                if not self.facts[t].batched:
                    counts[t] = counts.get(t, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: -item[1]))

    def crossing(self, cut: int) -> list[str]:
        """Tensors produced before ``cut`` and needed at or after it, in production order."""
        names = [t for t, p in self.produced_at.items() if p < cut <= self.last_use.get(t, -1)]
        return sorted(names, key=lambda t: self.produced_at[t])

    def legal_cuts(self) -> list[int]:
        return [
            k for k in range(1, len(self.nodes))
            if all(self.facts[t].batched for t in self.crossing(k))
        ]

    def row_bytes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Bytes per batch row of every tensor that can cross a cut, with named axes at ``sizes``
        (measured: one run of the model on a single row)."""
        names = [t for t in self.produced_at if t in self.last_use and self.facts[t].batched]
        feed = sample_inputs(self.inputs, 1, sizes)
        return {name: int(np.asarray(v).nbytes) for name, v in zip(names, exposing(self.model, names).run(names, feed))}

    def cut_bytes(self, row_bytes: Mapping[str, int], cut: int) -> int:
        """Bytes per batch row crossing ``cut``."""
        return sum(row_bytes.get(t, 0) for t in self.crossing(cut))

    def spec(self, name: str) -> TensorSpec:
        facts = self.facts[name]
        return TensorSpec(name=name, dtype=facts.dtype, dims=facts.dims)


def _declared_dims(value: onnx.ValueInfoProto) -> list[Dim]:
    dims: list[Dim] = []
    for d in value.type.tensor_type.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else d.dim_param or -1)
    return dims


def input_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    """The model's inputs as batched tensors; refuses an input without a dynamic first axis."""
    graph = model.graph
    skip = {t.name for t in graph.initializer}
    specs = []
    for value in graph.input:
        if value.name in skip:
            continue
        dims = _declared_dims(value)
        if not dims or (isinstance(dims[0], int) and dims[0] > 0):
            raise SliceError(
                f"input {value.name!r} has no dynamic batch axis (dims {dims}); "
                "export the model with its first axis dynamic"
            )
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        specs.append(TensorSpec(name=value.name, dtype=np.dtype(dtype).name, dims=tuple(dims[1:])))
    return tuple(specs)


def exposing(model: onnx.ModelProto, names: list[str]) -> ort.InferenceSession:
    """An unoptimised session of ``model`` whose outputs include every tensor in ``names``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {v.name for v in probe.graph.output}
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for name in names:
        if name not in known:
            value = onnx.ValueInfoProto(name=name)
            if name in typed:
                value.type.tensor_type.elem_type = typed[name].type.tensor_type.elem_type
            probe.graph.output.append(value)
    options = ort_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _probe(model: onnx.ModelProto, names: list[str], inputs: tuple[TensorSpec, ...],
           dim_sizes: Mapping[str, int]) -> list[dict[str, np.ndarray]]:
    """Run the model with every tensor in ``names`` exposed, once per probe batch size."""
    session = exposing(model, names)
    runs = []
    for scale, batch in enumerate(PROBE_BATCHES, start=1):
        sizes = {k: v * scale for k, v in dim_sizes.items()}
        feed = sample_inputs(inputs, batch, sizes, default=DEFAULT_DIM_SIZE * scale, seed=scale)
        runs.append(dict(zip(names, session.run(names, feed))))
    return runs


def _facts(name: str, runs: list[dict[str, np.ndarray]], declared: list[Dim] | None) -> TensorFacts:
    a, b = (np.asarray(run[name]) for run in runs)
    batched = (
        a.ndim == b.ndim >= 1 and a.shape[0] == PROBE_BATCHES[0] and b.shape[0] == PROBE_BATCHES[1]
    )
    dims: list[Dim] = [x if x == y else -1 for x, y in zip(a.shape[1:], b.shape[1:])]
    if declared is not None and len(declared) == len(dims) + 1:
        # Keep the model's own names for its dynamic output axes.
        dims = [d if d != -1 or not isinstance(n, str) else n for d, n in zip(dims, declared[1:])]
    return TensorFacts(dtype=a.dtype.name, batched=batched, dims=tuple(dims))


def tensor_uses(nodes: list[onnx.NodeProto], inputs: tuple[TensorSpec, ...], outputs: list[str], skip: set[str],
                roots: Mapping[str, frozenset[str]]) -> tuple[dict[str, int], dict[str, int]]:
    """Where each tensor is produced and last used among ``nodes`` (``skip``: constants, computed
    in every stage; a read of a shape value is a read of its ``roots``)."""
    produced_at = {spec.name: -1 for spec in inputs}
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node_inputs(node):
            for used in roots.get(name, (name,)):
                if used not in skip:
                    last_use[used] = i
        produced_at.update({o: i for o in node.output if o})
    for name in outputs:
        last_use[name] = len(nodes)
    return produced_at, last_use


def _shape_values(nodes: list[onnx.NodeProto], constants: set[str], facts: Mapping[str, TensorFacts]
                  ) -> tuple[dict[str, onnx.NodeProto], dict[str, frozenset[str]]]:
    """The shape subgraphs (see the module docstring): nodes that read only the shapes of
    tensors (``Shape``, ``Size``), constants and other shape values, and give unbatched values.
    Returns each shape value's node and its roots."""
    shapes: dict[str, onnx.NodeProto] = {}
    roots: dict[str, frozenset[str]] = {}
    for node in nodes:
        outputs = [o for o in node.output if o]
        if not outputs or any(o not in facts or facts[o].batched for o in outputs) or node.op_type in _RANDOM_OPS:
            continue
        reads = [n for n in node_inputs(node) if n not in constants]
        if node.op_type in ("Shape", "Size"):
            found = frozenset(roots.get(reads[0], (reads[0],))) if reads else frozenset()
        elif reads and all(n in shapes for n in reads):
            found = frozenset().union(*(roots[n] for n in reads))
        else:
            continue
        for name in outputs:
            shapes[name], roots[name] = node, found
    return shapes, roots


def analyse(model: onnx.ModelProto, dim_sizes: Mapping[str, int] | None = None) -> GraphAnalysis:
    """Order the graph, find its constant and shape subgraphs and probe every other tensor."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    inputs = input_specs(model)
    constant_names = set(initializers)
    constants: dict[str, onnx.NodeProto] = {}
    nodes: list[onnx.NodeProto] = []
    ordered = topological_order(graph)
    for node in ordered:
        if all(n in constant_names for n in node_inputs(node)) and node.op_type not in _RANDOM_OPS:
            constant_names.update(o for o in node.output if o)
            constants.update({o: node for o in node.output if o})
        else:
            nodes.append(node)
    output_names = [v.name for v in graph.output]
    for name in output_names:
        if name in constant_names:
            raise SliceError(f"output {name!r} is a constant; nothing to serve")

    produced_at, last_use = tensor_uses(nodes, inputs, output_names, constant_names, {})
    probed = [t for t in produced_at if t in last_use]
    runs = _probe(model, probed, inputs, dim_sizes or {})
    declared = {v.name: _declared_dims(v) for v in graph.output}
    facts = {name: _facts(name, runs, declared.get(name)) for name in probed}
    for spec in inputs:  # the model's declared input dims are its interface; keep them as written
        if spec.name in facts and not facts[spec.name].batched:
            raise SliceError(f"input {spec.name!r} does not behave as a batched tensor (batch axis first)")
        facts[spec.name] = TensorFacts(dtype=spec.dtype, batched=True, dims=spec.dims)
    outputs = []
    for name in output_names:
        if not facts[name].batched:
            raise SliceError(f"output {name!r} has no batch axis first; Triton cannot batch this model")
        outputs.append(TensorSpec(name=name, dtype=facts[name].dtype, dims=facts[name].dims))
    shapes, roots = _shape_values(nodes, constant_names, facts)
    cut_between = [node for node in nodes if not any(o in shapes for o in node.output)]
    produced_at, last_use = tensor_uses(cut_between, inputs, output_names, constant_names, roots)
    return GraphAnalysis(
        model=model, nodes=cut_between, constants=constants, initializers=initializers, inputs=inputs,
        outputs=tuple(outputs), facts=facts, produced_at=produced_at, last_use=last_use, shapes=shapes,
        roots=roots, rank={id(node): i for i, node in enumerate(ordered)},
    )


def _value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    shape: list[int | str | None] = ["batch"]
    shape += [None if d == -1 else d for d in spec.dims]
    return helper.make_tensor_value_info(spec.name, elem, shape)


def stage_model(analysis: GraphAnalysis, start: int, end: int, inputs: list[TensorSpec],
                outputs: list[TensorSpec], name: str) -> onnx.ModelProto:
    """A self-contained model of nodes ``start:end`` plus the constant and shape subgraphs they use."""
    body = analysis.nodes[start:end]
    cloned = analysis.cloned({n for node in body for n in node_inputs(node)})
    nodes = sorted([*cloned, *body], key=lambda node: analysis.rank[id(node)])
    used = {n for node in nodes for n in node_inputs(node)}
    initializers = [t for key, t in analysis.initializers.items() if key in used]
    graph = helper.make_graph(
        nodes, name, [_value_info(s) for s in inputs], [_value_info(s) for s in outputs], initializers
    )
    src = analysis.model
    model = helper.make_model(
        graph, opset_imports=src.opset_import, ir_version=src.ir_version,
        functions=src.functions, producer_name="dvabatch-slicer",
    )
    onnx.checker.check_model(model)
    return model

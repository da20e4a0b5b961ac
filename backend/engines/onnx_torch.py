"""An ONNX graph run node by node with torch: the ``torch`` engine's interpreter.

Why our own and not onnx2torch: onnx2torch imports torchvision for two of its converters, and
torchvision cannot be installed beside the CPU torch this project tests with; an interpreter of
the standard operators our models use is a few hundred lines, and it can keep shape arithmetic
off the GPU. Values that only describe shapes (``Shape``, ``Constant`` and what is computed from
them alone) stay in host memory, so ``Reshape``, ``Slice``, ``Expand`` and ``Range`` read their
arguments without waiting for the GPU; data lives on the engine's device. An operator outside
``OPS`` is refused when the graph loads, naming it.

Pure torch and onnx: no Triton, no streams (kernels go to the caller's current stream).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

Op = Callable[..., Any]  # (node attributes, *inputs) -> output or tuple of outputs

DTYPES = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool,
}


def _ints(value: torch.Tensor | None) -> list[int]:
    return [] if value is None else [int(v) for v in value.reshape(-1).tolist()]


def _axes(attrs: dict, value: torch.Tensor | None) -> list[int] | None:
    """Axes given as an input (newer opsets) or an attribute (older ones); None when neither."""
    if value is not None:
        return _ints(value)
    return list(attrs["axes"]) if "axes" in attrs else None


def _gather(a: dict, data, indices):
    axis = a.get("axis", 0) % data.dim()
    indices = torch.where(indices < 0, indices + data.shape[axis], indices)
    picked = data.index_select(axis, indices.reshape(-1))
    return picked.reshape((*data.shape[:axis], *indices.shape, *data.shape[axis + 1:]))


def _gather_elements(a: dict, data, indices):
    axis = a.get("axis", 0) % data.dim()
    return torch.gather(data, axis, indices.remainder(data.shape[axis]))  # (negative indices count from the end)


def _gather_nd(a: dict, data, indices):
    """ONNX GatherND: the first ``batch_dims`` axes shared, the last axis of ``indices`` indexing
    that many axes of ``data`` after them. Negative indices by remainder, and the batch index by
    ``arange`` on the device: nothing is built on the host (a CUDA graph could not capture it)."""
    batch, width = a.get("batch_dims", 0), indices.shape[-1]
    lead = tuple(data.shape[:batch])
    rows = int(np.prod(lead)) if batch else 1
    flat, picks = data.reshape(rows, *data.shape[batch:]), indices.reshape(rows, *indices.shape[batch:])
    where = [torch.arange(rows, device=picks.device).reshape(rows, *[1] * (picks.dim() - 2))]
    where += [picks[..., i].remainder(flat.shape[1 + i]) for i in range(width)]
    return flat[tuple(where)].reshape(*lead, *indices.shape[batch:-1], *data.shape[batch + width:])


def _trilu(a: dict, x, k=None):
    shift = int(k.item()) if k is not None and k.numel() else 0
    return torch.triu(x, shift) if a.get("upper", 1) else torch.tril(x, shift)


def _cumsum(a: dict, x, axis):
    axis = int(axis.item())
    x = x.flip(axis) if a.get("reverse", 0) else x
    out = torch.cumsum(x, axis)
    if a.get("exclusive", 0):
        out = out - x
    return out.flip(axis) if a.get("reverse", 0) else out


def _isinf(a: dict, x):
    found = torch.isinf(x)
    if not a.get("detect_negative", 1):
        found &= x > 0
    if not a.get("detect_positive", 1):
        found &= x < 0
    return found


def _slice(a: dict, data, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    index: list[Any] = [slice(None)] * data.dim()
    for start, end, axis, step in zip(starts, ends, axes, steps):
        cut = slice(start, end, step)
        axis %= data.dim()
        if step > 0:
            index[axis] = cut
            continue
        # torch slices forwards only: the same elements, read forwards from the flipped axis (no
        # index tensor to build and copy to the device, which a CUDA graph could not capture)
        picked = range(*cut.indices(data.shape[axis]))
        last = data.shape[axis] - 1
        data = data.flip(axis)
        index[axis] = slice(last - picked[0], last - picked[-1] + 1, -step) if picked else slice(0, 0)
    return data[tuple(index)]


def _reshape(a: dict, data, shape):
    sizes = _ints(shape)
    if not a.get("allowzero", 0):
        sizes = [data.shape[i] if s == 0 else s for i, s in enumerate(sizes)]
    return data.reshape(sizes)


def _unsqueeze(a: dict, data, axes=None):
    axes = sorted(x % (data.dim() + len(_axes(a, axes))) for x in _axes(a, axes))
    for axis in axes:
        data = data.unsqueeze(axis)
    return data


def _squeeze(a: dict, data, axes=None):
    axes = _axes(a, axes)
    if axes is None:
        return data.squeeze()
    return data.squeeze(tuple(x % data.dim() for x in axes))


def _shape(a: dict, data):
    dims = list(data.shape)[a.get("start", 0):a.get("end", None)]
    return torch.tensor(dims, dtype=torch.int64)


def _constant(a: dict):
    for key in ("value_float", "value_int"):
        if key in a:
            return torch.tensor(a[key])
    for key in ("value_floats", "value_ints"):
        if key in a:
            return torch.tensor(list(a[key]))
    return _tensor(a["value"])


def _constant_of_shape(a: dict, shape):
    fill = _tensor(a["value"]) if "value" in a else torch.zeros(1)
    return torch.full(_ints(shape), fill.reshape(-1)[0].item(), dtype=fill.dtype)


def _range(a: dict, start, limit, delta):
    return torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype, device=start.device)


def _softmax(a: dict, x, log: bool = False):
    fn = torch.log_softmax if log else torch.softmax
    if a["_opset"] >= 13:
        return fn(x, a.get("axis", -1))
    axis = a.get("axis", 1) % x.dim()  # older opsets: the axes from ``axis`` on are one
    return fn(x.reshape(*x.shape[:axis], -1), -1).reshape(x.shape) if axis else fn(x.reshape(-1), 0).reshape(x.shape)


def _gemm(a: dict, x, w, c=None):
    x = x.t() if a.get("transA", 0) else x
    w = w.t() if a.get("transB", 0) else w
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if c is not None and c.dtype == x.dtype:  # one GEMM, the bias added in its epilogue
        return torch.addmm(c, x, w, beta=beta, alpha=alpha)
    out = alpha * (x @ w)
    return out if c is None else out + beta * c


def _pads(a: dict, spatial: int) -> tuple[list[int], bool]:
    """ONNX pads (begins then ends) as F.pad's list (last axis first), and whether symmetric."""
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise NotImplementedError("auto_pad SAME_UPPER / SAME_LOWER")
    pads = list(a.get("pads", [0] * 2 * spatial))
    begins, ends = pads[:spatial], pads[spatial:]
    flat = [p for pair in zip(reversed(begins), reversed(ends)) for p in pair]
    return flat, begins == ends


def _conv(a: dict, x, w, b=None):
    spatial = x.dim() - 2
    pads, even = _pads(a, spatial)
    if not even:
        x, padding = F.pad(x, pads), 0
    else:
        padding = pads[::2][::-1]
    fn = (F.conv1d, F.conv2d, F.conv3d)[spatial - 1]
    return fn(x, w, b, stride=list(a.get("strides", [1] * spatial)), padding=padding,
              dilation=list(a.get("dilations", [1] * spatial)), groups=a.get("group", 1))


def _pool(kind: str) -> Op:
    def pool(a: dict, x):
        spatial = x.dim() - 2
        pads, even = _pads(a, spatial)
        kernel = list(a["kernel_shape"])
        if not even:
            x = F.pad(x, pads, value=float("-inf") if kind == "max" else 0.0)
        padding = pads[::2][::-1] if even else 0
        strides, ceil = list(a.get("strides", [1] * spatial)), bool(a.get("ceil_mode", 0))
        if kind == "max":
            fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[spatial - 1]
            return fn(x, kernel, strides, padding, list(a.get("dilations", [1] * spatial)), ceil)
        fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[spatial - 1]
        return fn(x, kernel, strides, padding, ceil, bool(a.get("count_include_pad", 0)))
    return pool


def _resize(a: dict, x, roi=None, scales=None, sizes=None):
    mode = _text(a.get("mode", "nearest"))
    transform = _text(a.get("coordinate_transformation_mode", "half_pixel"))
    spatial = x.dim() - 2
    size = _ints(sizes)[2:] if sizes is not None and sizes.numel() else None
    factor = [float(s) for s in scales.reshape(-1).tolist()][2:] if size is None else None
    if mode == "nearest":
        # torch's nearest is ONNX's asymmetric + floor; with a whole upscale factor, half_pixel
        # rounds every output pixel to the same source pixel whichever nearest_mode is set.
        whole = factor is not None and all(f == int(f) >= 1 for f in factor) or size is not None and all(
            s % n == 0 for s, n in zip(size, x.shape[2:]))
        floor = _text(a.get("nearest_mode", "round_prefer_floor")) == "floor"
        if (transform == "asymmetric" and floor) or (transform in ("half_pixel", "pytorch_half_pixel") and whole):
            return F.interpolate(x, size=size, scale_factor=factor, mode="nearest")
    if mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        kind = ("linear", "bilinear", "trilinear")[spatial - 1]
        return F.interpolate(x, size=size, scale_factor=factor, mode=kind, align_corners=transform == "align_corners")
    raise NotImplementedError(f"Resize mode {mode} with coordinate_transformation_mode {transform}")


def _reduce(fn: Callable) -> Op:
    def reduce(a: dict, x, axes=None):
        dims = _axes(a, axes)
        keep = bool(a.get("keepdims", 1))
        if not dims:
            if a.get("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.dim()))
        return fn(x, dim=tuple(d % x.dim() for d in dims), keepdim=keep)
    return reduce


def _split(a: dict, x, split=None):
    axis = a.get("axis", 0)
    sizes = _ints(split) if split is not None else list(a.get("split", []))
    if not sizes:
        count = a.get("num_outputs") or a["_outputs"]
        sizes = [-(-x.shape[axis] // count)] * count
        sizes[-1] = x.shape[axis] - sum(sizes[:-1])
    return tuple(torch.split(x, sizes, dim=axis))


def _pad(a: dict, x, pads=None, value=None, axes=None):
    pads = _ints(pads) if pads is not None else list(a["pads"])
    dims = _ints(axes) if axes is not None else list(range(x.dim()))
    half = len(pads) // 2
    per_axis = {d % x.dim(): (pads[i], pads[i + half]) for i, d in enumerate(dims)}
    flat = [p for d in reversed(range(x.dim())) for p in per_axis.get(d, (0, 0))]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[_text(a.get("mode", "constant"))]
    fill = value.item() if value is not None and value.numel() else a.get("value", 0.0)
    if mode == "constant":
        return F.pad(x, flat, value=fill)
    while flat[-2:] == [0, 0]:  # torch pads only the innermost axes in these modes
        flat = flat[:-2]
    return F.pad(x, flat, mode=mode)


def _clip(a: dict, x, low=None, high=None):
    low = low.item() if low is not None and low.numel() else a.get("min")
    high = high.item() if high is not None and high.numel() else a.get("max")
    return torch.clamp(x, low, high)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _tensor(proto: onnx.TensorProto) -> torch.Tensor:
    array = numpy_helper.to_array(proto)
    return torch.from_numpy(np.array(array, copy=True))


def _binary(fn: Callable) -> Op:
    return lambda a, x, y: fn(x, y)


def _unary(fn: Callable) -> Op:
    return lambda a, x: fn(x)


def _variadic(fn: Callable) -> Op:
    def apply(a: dict, first, *rest):
        for other in rest:
            first = fn(first, other)
        return first
    return apply


OPS: dict[str, Op] = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul),
    "Div": lambda a, x, y: torch.div(x, y, rounding_mode="trunc") if not x.is_floating_point() else x / y,
    "Pow": lambda a, x, y: torch.pow(x, y).to(x.dtype),
    "MatMul": _binary(torch.matmul), "Gemm": _gemm,
    "Equal": _binary(torch.eq), "Greater": _binary(torch.gt), "Less": _binary(torch.lt),
    "GreaterOrEqual": _binary(torch.ge), "LessOrEqual": _binary(torch.le),
    "And": _binary(torch.logical_and), "Or": _binary(torch.logical_or), "Xor": _binary(torch.logical_xor),
    "Not": _unary(torch.logical_not), "Where": lambda a, c, x, y: torch.where(c, x, y),
    "Max": _variadic(torch.maximum), "Min": _variadic(torch.minimum), "Sum": _variadic(torch.add),
    "Sqrt": _unary(torch.sqrt), "Erf": _unary(torch.erf), "Tanh": _unary(torch.tanh), "Exp": _unary(torch.exp),
    "Log": _unary(torch.log), "Neg": _unary(torch.neg), "Abs": _unary(torch.abs), "Relu": _unary(torch.relu),
    "Sigmoid": _unary(torch.sigmoid), "Reciprocal": _unary(torch.reciprocal), "Floor": _unary(torch.floor),
    "Ceil": _unary(torch.ceil), "Sin": _unary(torch.sin), "Cos": _unary(torch.cos),
    "Identity": _unary(lambda x: x), "Dropout": _unary(lambda x: x),
    "Gelu": lambda a, x: F.gelu(x, approximate=_text(a.get("approximate", "none"))),
    "LeakyRelu": lambda a, x: F.leaky_relu(x, a.get("alpha", 0.01)),
    "HardSigmoid": lambda a, x: torch.clamp(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
    "Clip": _clip,
    "Cast": lambda a, x: x.to(DTYPES[a["to"]]),
    "Shape": _shape, "Size": lambda a, x: torch.tensor(x.numel(), dtype=torch.int64),
    "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Flatten": lambda a, x: x.reshape(int(np.prod(x.shape[:a.get("axis", 1)])), -1),
    "Transpose": lambda a, x: x.permute(*(a.get("perm") or reversed(range(x.dim())))),
    "Concat": lambda a, *xs: torch.cat(xs, dim=a["axis"]),
    "Gather": _gather, "Slice": _slice, "Split": _split, "Pad": _pad,
    "Expand": lambda a, x, shape: x.expand(torch.broadcast_shapes(x.shape, tuple(_ints(shape)))),
    "Tile": lambda a, x, repeats: x.repeat(*_ints(repeats)),
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Softmax": _softmax, "LogSoftmax": lambda a, x: _softmax(a, x, log=True),
    "LayerNormalization": lambda a, x, w, b=None: F.layer_norm(
        x, x.shape[a.get("axis", -1) % x.dim():], w, b, a.get("epsilon", 1e-5)),
    "BatchNormalization": lambda a, x, w, b, mean, var: F.batch_norm(
        x, mean, var, w, b, False, 0.0, a.get("epsilon", 1e-5)),
    "Conv": _conv, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda a, x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True),
    "GlobalMaxPool": lambda a, x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True),
    "Resize": _resize,
    "ReduceMean": _reduce(torch.mean), "ReduceSum": _reduce(torch.sum),
    "ReduceMax": _reduce(torch.amax), "ReduceMin": _reduce(torch.amin),
    "ArgMax": lambda a, x: torch.argmax(x, a.get("axis", 0), bool(a.get("keepdims", 1))),
    "Einsum": lambda a, *xs: torch.einsum(_text(a["equation"]), *xs),
    # what torch.export's exporter (torch 2.11-2.13) emits beside the above
    "GatherElements": _gather_elements, "GatherND": _gather_nd, "Trilu": _trilu, "CumSum": _cumsum,
    "IsNaN": _unary(torch.isnan), "Sign": _unary(torch.sign),
    "IsInf": _isinf,
    "Mod": lambda a, x, y: torch.fmod(x, y) if a.get("fmod", 0) else torch.remainder(x, y),
}


def _attention(a: dict, q, k, v, mask=None):
    """softmax(q k^T * scale + mask) v in one fused kernel (``scaled_dot_product_attention``);
    ``k`` as the graph held it: transposed (``kt``) or before its transpose to [batch, length,
    heads, width] (``blhd``)."""
    k = k.permute(0, 2, 1, 3) if _text(a["layout"]) == "blhd" else k.transpose(-2, -1)
    if mask is not None and mask.dtype != q.dtype:  # an additive mask in the queries' type, within its range
        mask = mask.clamp(min=-HALF_MAX).to(q.dtype) if q.dtype == torch.float16 else mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=a["scale"])


# The patterns ``fuse`` finds, as single operators: what torch runs in one kernel where the
# exported graph spells it out in several (a GEMM with its bias in cuBLASLt's epilogue, the exact
# GELU, fused attention).
OPS.update({
    "_Linear": lambda a, x, w, b: F.linear(x, w.t(), b),
    "_Gelu": lambda a, x: F.gelu(x),
    "_Attention": _attention,
})


# Inputs that are sizes, axes or bounds, read on the host (``_ints``, ``.item()``): never moved to
# the device for a node whose data is there, so reading them costs no wait for the GPU.
HOST_ARGUMENTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}), "Expand": frozenset({1}), "Tile": frozenset({1}),
    "Unsqueeze": frozenset({1}), "Squeeze": frozenset({1}), "Split": frozenset({1}), "Pad": frozenset({1, 2, 3}),
    "ReduceMean": frozenset({1}), "ReduceSum": frozenset({1}), "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}), "Resize": frozenset({1, 2, 3}), "Clip": frozenset({1, 2}),
    "Trilu": frozenset({1}), "CumSum": frozenset({1}),
}


PRECISIONS = ("fp32", "tf32", "fp16")
HALF_MAX = 65504.0  # the largest finite float16
# Under ``fp16`` these compute in FP32 (their half inputs cast up, and what they give stays FP32
# until an FP16 operator): a square, a sum of many halves or an exponential leaves half's range
# (65504) where FP32 does not. LayerNormalization and Softmax stay half: torch accumulates their
# reductions in FP32 inside the kernel, as torch's own ``model.half()`` runs them.
FP32_OPS = frozenset({"Pow", "ReduceSum", "Exp", "Log"})
# ...and these compute in FP16 whatever their inputs are: the tensor cores' operators.
FP16_OPS = frozenset({"MatMul", "Gemm", "Conv", "Einsum", "_Linear"})
FUSED_NAME = "\x1f"  # joins the names of the nodes a fused operator stands for (``node_timer`` spreads its time)


def fuse(nodes: Sequence[onnx.NodeProto], initializers: Mapping[str, onnx.TensorProto],
         outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with the patterns an exporter spells out replaced by one operator each:

    - ``MatMul(x, W)`` then ``Add`` of a bias ``b`` (initializers, ``b`` one value per column of
      ``W``): ``_Linear(x, W, b)``;
    - ``x / sqrt(2)`` (or ``x * 1/sqrt(2)``), ``Erf``, ``+ 1``, ``* x``, ``* 0.5``: ``_Gelu(x)``;
    - ``MatMul(q, k^T)``, an optional scale (``Mul`` or ``Div`` by a constant), an optional ``Add``
      of a mask, ``Softmax`` over the last axis and ``MatMul(·, v)``: ``_Attention(q, k, v, mask)``
      (with ``k``'s ``Transpose`` to [batch, heads, width, length] folded in where it has no
      other reader).

    A pattern is fused only where its intermediate values have no other reader and are not
    outputs of the graph (a stage's boundary), so the fused graph computes the same outputs. Each
    fused node takes its last node's place, where all its inputs exist, and the names of every
    node it stands for."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(i)

    def reader(value: str) -> int | None:
        """The one node that reads ``value``, where it is not a graph output."""
        found = readers.get(value, [])
        return found[0] if len(found) == 1 and value not in outputs else None

    def made_by(value: str, kind: str) -> int | None:
        i = producer.get(value)
        return i if i is not None and nodes[i].op_type == kind and reader(value) is not None else None

    def scalar(name: str) -> float | None:
        proto = initializers.get(name)
        if proto is None or int(np.prod(proto.dims)) != 1:
            return None
        return float(numpy_helper.to_array(proto).reshape(-1)[0])

    def near(value: float | None, want: float) -> bool:
        return value is not None and abs(value - want) <= 1e-4 * abs(want)

    def scores_chain(value: str, read_by: int) -> tuple[list[int], float, str, str] | None:
        """Where ``value`` (read by ``read_by`` alone) is ``MatMul(q, k^T)``, scaled by a constant
        or not: (its nodes, the scale, q, k^T)."""
        if reader(value) != read_by or value not in producer:
            return None
        chain, scale, at = [], 1.0, producer[value]
        if nodes[at].op_type in ("Mul", "Div"):
            tensors = [n for n in nodes[at].input if scalar(n) is None]
            constants = [scalar(n) for n in nodes[at].input if scalar(n) is not None]
            if len(tensors) != 1 or len(constants) != 1 or not constants[0] or tensors[0] not in producer \
                    or reader(tensors[0]) != at:
                return None
            chain.append(at)
            scale = constants[0] if nodes[at].op_type == "Mul" else 1 / constants[0]
            at = producer[tensors[0]]
        if nodes[at].op_type != "MatMul" or nodes[at].input[1] in initializers:
            return None
        return [*chain, at], scale, nodes[at].input[0], nodes[at].input[1]

    gone: set[int] = set()
    fused: dict[int, onnx.NodeProto] = {}

    def replace(members: list[int], kind: str, inputs: list[str], **attrs) -> None:
        last = max(members)
        name = FUSED_NAME.join(nodes[i].name or nodes[i].op_type for i in sorted(members))
        fused[last] = onnx.helper.make_node(kind, inputs, list(nodes[last].output), name=name, **attrs)
        gone.update(m for m in members if m != last)

    for i, node in enumerate(nodes):  # linear layers
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        add = reader(node.output[0]) if weight is not None and len(weight.dims) == 2 else None
        if add is None or nodes[add].op_type != "Add":
            continue
        bias = next((n for n in nodes[add].input if n != node.output[0]), "")
        if list(getattr(initializers.get(bias), "dims", [])) == [weight.dims[1]]:
            replace([i, add], "_Linear", [node.input[0], node.input[1], bias])
    for i, node in enumerate(nodes):  # exact GELU
        if node.op_type != "Erf":
            continue
        scale = made_by(node.input[0], "Div") or made_by(node.input[0], "Mul")
        if scale is None:
            continue
        x, constant = nodes[scale].input
        if not near(scalar(constant), 2 ** 0.5 if nodes[scale].op_type == "Div" else 0.5 ** 0.5):
            continue
        plus = reader(node.output[0])
        if plus is None or nodes[plus].op_type != "Add" or not any(near(scalar(n), 1.0) for n in nodes[plus].input):
            continue
        first = reader(nodes[plus].output[0])
        if first is None or nodes[first].op_type != "Mul" or x not in nodes[first].input:
            continue
        second = reader(nodes[first].output[0])
        if second is None or nodes[second].op_type != "Mul" or not any(near(scalar(n), 0.5)
                                                                      for n in nodes[second].input):
            continue
        replace([scale, i, plus, first, second], "_Gelu", [x])
    for i, node in enumerate(nodes):  # attention
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        last = reader(node.output[0]) if node.op_type == "Softmax" and axis in (-1, 3) else None
        if last is None or nodes[last].op_type != "MatMul" or nodes[last].input[0] != node.output[0]:
            continue
        members, mask = [i, last], ""
        add = made_by(node.input[0], "Add")
        if add is not None:
            chains = [(n, scores_chain(n, add)) for n in nodes[add].input]
            chains = [(n, chain) for n, chain in chains if chain is not None]
            if len(chains) != 1:
                continue
            (scores, (chain, scale, q, key)), = chains
            members += [add, *chain]
            mask = next(n for n in nodes[add].input if n != scores)
        else:
            found = scores_chain(node.input[0], i)
            if found is None:
                continue
            chain, scale, q, key = found
            members += chain
        layout, turned = "kt", made_by(key, "Transpose")
        perm = [] if turned is None else next((list(a.ints) for a in nodes[turned].attribute if a.name == "perm"), [])
        if perm == [0, 2, 3, 1]:
            members.append(turned)
            key, layout = nodes[turned].input[0], "blhd"
        replace(members, "_Attention", [q, key, nodes[last].input[1], mask], scale=scale, layout=layout)
    return [fused.get(i, node) for i, node in enumerate(nodes) if i not in gone]


class TorchGraph:
    """An ONNX model (a file or its bytes) ready to run on ``device``. Initializers of more than
    ``HOST_ELEMENTS`` elements, or of a floating type, live on the device; the rest (shape
    constants), and any initializer a node reads as a size, axis or bound (``HOST_ARGUMENTS``),
    in host memory. A host value a device node needs is copied there once per input shape
    (``_to_device``): host values follow from the shapes alone, so a run repeated on the same
    shapes (a CUDA graph's capture, ``torch_graphs.py``) copies nothing between host and device.

    ``precision``: ``fp32`` (TF32 off, set by the caller), ``tf32`` (the same graph; the caller
    lets matmuls and convolutions use TF32) or ``fp16``: floating initializers stored in half
    (clamped to its range: a mask's ``finfo(float32).min`` becomes half's, as torch's own half
    models compute it), floating inputs cast to half, ``Cast`` to FLOAT casting to half,
    ``FP32_OPS`` computed in FP32 and ``FP16_OPS`` in FP16, and every floating output cast back
    to the type the graph declares, so a stage's interface is the FP32 model's."""

    HOST_ELEMENTS = 64
    CONSTANT_SHAPES = 256  # input shapes whose device copies of host values are kept (then afresh)

    def __init__(self, model: Path | bytes | onnx.ModelProto, device: torch.device | str = "cpu",
                 precision: str = "fp32"):
        if isinstance(model, bytes):
            model = onnx.load_from_string(model)
        elif not isinstance(model, onnx.ModelProto):
            model = onnx.load(str(model))
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self.device = torch.device(device)
        self.precision = precision
        self._half = precision == "fp16"
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        unknown = sorted({f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                          for n in model.graph.node if n.op_type not in OPS or n.domain not in ("", "ai.onnx")})
        if unknown:  # a standard operator it lacks has no fix but another engine; contrib ones do
            contrib = any(":" in name for name in unknown)
            raise NotImplementedError(f"the torch engine does not run ONNX operator(s) {', '.join(unknown)}" + (
                " (contrib operators: ONNX Runtime's extended optimisation writes them; give the unoptimised "
                "export, sliced with --optimize basic or none)" if contrib else ""))
        read_on_host = {name for node in model.graph.node
                        for k, name in enumerate(node.input) if k in HOST_ARGUMENTS.get(node.op_type, ())}
        self._values: dict[str, torch.Tensor] = {}
        for proto in model.graph.initializer:
            tensor = _tensor(proto)
            if proto.name in read_on_host or (tensor.numel() <= self.HOST_ELEMENTS and not tensor.is_floating_point()):
                self._values[proto.name] = tensor
                continue
            if self._half and tensor.dtype in (torch.float32, torch.float64):
                tensor = tensor.clamp(-HALF_MAX, HALF_MAX).half()
            self._values[proto.name] = tensor.to(self.device)
        self._on_device: dict[str, torch.Tensor] = {}  # host constants copied for device nodes
        self._constants: dict[tuple, dict[str, torch.Tensor]] = {}  # per input shapes: host values copied
        graph_outputs = {o.name for o in model.graph.output}
        nodes = fuse(model.graph.node, {p.name: p for p in model.graph.initializer}, graph_outputs)
        self._nodes = [(node.name or node.op_type, node.op_type, list(node.input), list(node.output),
                        self._attributes(node, opset), self._computes_in(node.op_type)) for node in nodes]
        used = {name for node in nodes for name in node.input} | graph_outputs
        self._values = {name: value for name, value in self._values.items() if name in used}
        self.inputs = [i.name for i in model.graph.input if i.name not in self._values]
        self.outputs = [o.name for o in model.graph.output]
        self._declared = {o.name: DTYPES.get(o.type.tensor_type.elem_type) for o in model.graph.output}

    def _attributes(self, node: onnx.NodeProto, opset: int) -> dict:
        attrs = {**{att.name: onnx.helper.get_attribute_value(att) for att in node.attribute},
                 "_opset": opset, "_outputs": len(node.output)}
        if self._half and node.op_type == "Cast" and attrs.get("to") == onnx.TensorProto.FLOAT:
            attrs["to"] = onnx.TensorProto.FLOAT16
        return attrs

    def _computes_in(self, kind: str) -> torch.dtype | None:
        if not self._half:
            return None
        return torch.float32 if kind in FP32_OPS else torch.float16 if kind in FP16_OPS else None

    @torch.inference_mode()
    def run(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None,
            timer: Callable[[str, Callable[[], Any]], Any] | None = None) -> dict[str, torch.Tensor]:
        """The graph's ``outputs`` (default: all) for ``inputs`` (torch tensors, or numpy arrays,
        moved to the device where they are elsewhere). ``timer(node_name, call)`` wraps each
        node's call where nodes are timed."""
        values = dict(self._values)
        for name, value in inputs.items():
            value = torch.as_tensor(value) if isinstance(value, np.ndarray) else value
            if value.device != self.device:
                value = value.to(self.device)
            values[name] = value.half() if self._half and value.dtype == torch.float32 else value
        on_device = self.device.type != "cpu"
        shapes = tuple((name, tuple(v.shape), v.dtype) for name, v in inputs.items()) if on_device else ()
        varies: set[str] = set()  # host values computed from device data: not constants of the shapes
        for name, kind, ins, outs, attrs, computes_in in self._nodes:
            args = [values[i] if i else None for i in ins]
            if on_device:
                if any(a is not None and a.device.type != "cpu" for a in args):
                    host = HOST_ARGUMENTS.get(kind, frozenset())
                    args = [a if k in host else self._to_device(i, a, shapes, i in varies)
                            for k, (i, a) in enumerate(zip(ins, args))]
                    if kind not in ("Shape", "Size"):
                        varies.update(outs)
                elif any(i in varies for i in ins):
                    varies.update(outs)
            if computes_in is not None:
                args = [a.to(computes_in) if a is not None and a.is_floating_point() else a for a in args]
            op = OPS[kind]
            try:
                result = op(attrs, *args) if timer is None else timer(name, lambda: op(attrs, *args))
            except NotImplementedError as exc:
                raise NotImplementedError(f"torch engine: node {name} ({kind}): {exc}") from None
            except (RuntimeError, TypeError, ValueError, IndexError) as exc:
                raise RuntimeError(f"torch engine: node {name} ({kind}) failed: {exc}") from exc
            for out, value in zip(outs, result if isinstance(result, tuple) else (result,)):
                if out:
                    values[out] = value
        return {name: self._output(name, values[name], shapes, name in varies) for name in (outputs or self.outputs)}

    def _output(self, name: str, value: torch.Tensor, shapes: tuple, varies: bool) -> torch.Tensor:
        """An output on the device, in the type the graph declares (FP16 computes others)."""
        if self.device.type != "cpu":
            value = self._to_device(name, value, shapes, varies)
        declared = self._declared.get(name)
        if self._half and declared is not None and value.is_floating_point() and value.dtype != declared:
            value = value.to(declared)
        return value

    def _to_device(self, name: str, value: torch.Tensor | None, shapes: tuple, varies: bool) -> torch.Tensor | None:
        """``value`` on the device: a host constant copied once; another host value once per
        input shapes (``shapes``), since it follows from them, unless it ``varies`` with device
        data (then on every run)."""
        if value is None or value.device.type != "cpu":
            return value
        if name in self._values:
            if name not in self._on_device:
                self._on_device[name] = self._copy(value)
            return self._on_device[name]
        if varies:
            return self._copy(value, non_blocking=True)
        copies = self._constants.get(shapes)
        if copies is None:
            if len(self._constants) >= self.CONSTANT_SHAPES:
                self._constants.clear()
            copies = self._constants[shapes] = {}
        if name not in copies:
            copies[name] = self._copy(value)
        return copies[name]

    def _copy(self, value: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if self._half and value.dtype in (torch.float32, torch.float64):  # as the initializers are
            value = value.clamp(-HALF_MAX, HALF_MAX).half()
        return value.to(self.device, non_blocking=non_blocking)


def node_timer(device: torch.device, record: Callable[[str, float], None]) -> Callable[[str, Callable[[], Any]], Any]:
    """A ``TorchGraph.run`` timer that hands ``record(node, ms)`` each node's time: wall time on
    the CPU; on CUDA, events around the node's kernels, read once the caller synchronises
    (``flush``, called by the returned function's ``flush`` attribute)."""
    def spread(name: str, ms: float) -> None:  # a fused operator's time, shared by the nodes it stands for
        parts = name.split(FUSED_NAME)
        for part in parts:
            record(part, ms / len(parts))

    if device.type == "cpu":
        def timed(name: str, call: Callable[[], Any]) -> Any:
            began = time.perf_counter()
            result = call()
            spread(name, (time.perf_counter() - began) * 1000)
            return result
        timed.flush = lambda: None  # type: ignore[attr-defined]
        return timed
    pending: list[tuple[str, Any, Any]] = []

    def timed_cuda(name: str, call: Callable[[], Any]) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = call()
        end.record()
        pending.append((name, start, end))
        return result

    def flush() -> None:
        torch.cuda.synchronize(device)
        for name, start, end in pending:
            spread(name, start.elapsed_time(end))
        pending.clear()
    timed_cuda.flush = flush  # type: ignore[attr-defined]
    return timed_cuda

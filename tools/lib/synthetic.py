"""Small ONNX models with the structures that make slicing hard, built with onnx.helper.

- ``resnet_like``: convolutions with residual connections (a skip tensor crosses cuts);
- ``unet_like``: an encoder-decoder whose long skips cross several cuts at once;
- ``bert_like``: a transformer encoder with a dynamic sequence axis; hidden states and the
  attention mask cross every cut, and shape subgraphs must stay inside one stage.
- ``unmasked_mean``: a mean over a dynamic sequence axis with no mask, which padding changes
  (not among ``BUILDERS``: it is no model to serve padded, only to be found so).

Weights come from a seeded generator and the opset and IR version are fixed, so the same call
always writes the same bytes (the example manifests record the source file's sha256).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8


class _Builder:
    """Collects nodes and seeded initializers; names are unique by counter."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array: np.ndarray, hint: str = "w") -> str:
        name = self.name(hint)
        self.inits.append(helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                                             array.flatten().tolist()))
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
        return self.op("Conv", x, self.weight(cout, cin, k, k), self.weight(cout, scale=0.1),
                       kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])

    def model(self, inputs, outputs, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="dvabatch-synthetic")
        onnx.checker.check_model(model)
        return model


def resnet_like(channels: int = 16, blocks: int = 3, classes: int = 10, size: int = 32,
                seed: int = 1) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.op("Relu", b.conv("image", 3, channels))
    for _ in range(blocks):
        y = b.conv(b.op("Relu", b.conv(x, channels, channels)), channels, channels)
        x = b.op("Relu", b.op("Add", y, x))
    pooled = b.op("Flatten", b.op("GlobalAveragePool", x))
    logits = b.op("Gemm", pooled, b.weight(classes, channels), b.weight(classes, scale=0.1), transB=1)
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    return b.model(
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        "resnet_like",
    )


def unet_like(base: int = 8, size: int = 32, classes: int = 2, seed: int = 2) -> onnx.ModelProto:
    b = _Builder(seed)
    scales = b.const(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    e1 = b.op("Relu", b.conv("image", 3, base))
    e2 = b.op("Relu", b.conv(b.op("MaxPool", e1, kernel_shape=[2, 2], strides=[2, 2]), base, base * 2))
    mid = b.op("Relu", b.conv(b.op("MaxPool", e2, kernel_shape=[2, 2], strides=[2, 2]), base * 2, base * 4))
    mid = b.op("Relu", b.conv(mid, base * 4, base * 4))
    up2 = b.op("Resize", mid, "", scales, mode="nearest")
    d2 = b.op("Relu", b.conv(b.op("Concat", up2, e2, axis=1), base * 6, base * 2))
    up1 = b.op("Resize", d2, "", scales, mode="nearest")
    d1 = b.op("Relu", b.conv(b.op("Concat", up1, e1, axis=1), base * 3, base))
    b.nodes.append(helper.make_node("Conv", [d1, b.weight(classes, base, 1, 1), b.weight(classes, scale=0.1)],
                                    ["mask"], kernel_shape=[1, 1]))
    return b.model(
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", classes, size, size])],
        "unet_like",
    )


def bert_like(hidden: int = 32, heads: int = 4, layers: int = 2, vocab: int = 100, max_len: int = 64,
              seed: int = 3) -> onnx.ModelProto:
    """input_ids and attention_mask [batch, sequence] -> last_hidden_state and pooler_output."""
    b = _Builder(seed)
    head_dim = hidden // heads
    i64 = lambda *v: b.const(np.array(v, dtype=np.int64), "shape")  # noqa: E731
    scalar = lambda v: b.const(np.array(v, dtype=np.int64), "index")  # noqa: E731
    f32 = lambda v: b.const(np.array(v, dtype=np.float32), "scalar")  # noqa: E731

    def layer_norm(x: str) -> str:
        return b.op("LayerNormalization", x, b.const(np.ones(hidden, np.float32)),
                    b.const(np.zeros(hidden, np.float32)), axis=-1, epsilon=1e-12)

    def dense(x: str, cin: int, cout: int) -> str:
        return b.op("Add", b.op("MatMul", x, b.weight(cin, cout)), b.weight(cout, scale=0.02))

    # Embeddings: word + position, where positions come from the dynamic sequence length.
    seq_len = b.op("Gather", b.op("Shape", "input_ids"), scalar(1), axis=0)
    positions = b.op("Range", scalar(0), seq_len, scalar(1))
    words = b.op("Gather", b.weight(vocab, hidden, scale=0.5), "input_ids", axis=0)
    pos = b.op("Gather", b.weight(max_len, hidden, scale=0.5), positions, axis=0)
    x = layer_norm(b.op("Add", words, pos))
    # Additive mask [batch, 1, 1, sequence]: 0 where attended, -10000 where padded.
    mask = b.op("Cast", b.op("Unsqueeze", "attention_mask", i64(1, 2)), to=TensorProto.FLOAT)
    bias = b.op("Mul", b.op("Sub", f32(1.0), mask), f32(-10000.0))

    def split_heads(t: str) -> str:
        return b.op("Transpose", b.op("Reshape", t, i64(0, 0, heads, head_dim)), perm=[0, 2, 1, 3])

    for _ in range(layers):
        q, k, v = (split_heads(dense(x, hidden, hidden)) for _ in range(3))
        scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), f32(1 / np.sqrt(head_dim)))
        probs = b.op("Softmax", b.op("Add", scores, bias), axis=-1)
        ctx = b.op("Reshape", b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3]), i64(0, 0, hidden))
        x = layer_norm(b.op("Add", dense(ctx, hidden, hidden), x))
        h = dense(x, hidden, hidden * 4)
        erf = b.op("Erf", b.op("Mul", h, f32(1 / np.sqrt(2))))
        gelu = b.op("Mul", b.op("Mul", h, f32(0.5)), b.op("Add", erf, f32(1.0)))
        x = layer_norm(b.op("Add", dense(gelu, hidden * 4, hidden), x))
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    first = b.op("Squeeze", b.op("Slice", x, i64(0), i64(1), i64(1)), i64(1))
    b.nodes.append(helper.make_node("Tanh", [dense(first, hidden, hidden)], ["pooler_output"]))
    return b.model(
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]),
         helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", hidden])],
        "bert_like",
    )


def unmasked_mean(width: int = 4, seed: int = 4) -> onnx.ModelProto:
    """x [batch, sequence, width] -> every step (``steps``) and their mean over the sequence
    (``pooled``), with no mask: padding a query along its sequence changes its mean, so the
    sequence is no length axis (``slicer.source.padding_changes``)."""
    b = _Builder(seed)
    hidden = b.op("Tanh", b.op("MatMul", "x", b.weight(width, width)))
    logits = b.op("Add", b.op("MatMul", hidden, b.weight(width, width)), b.weight(width))
    b.nodes += [helper.make_node("Sigmoid", [logits], ["steps"]),
                helper.make_node("ReduceMean", ["steps"], ["pooled"], axes=[1], keepdims=0)]
    return b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", width])],
                   [helper.make_tensor_value_info("steps", TensorProto.FLOAT, ["batch", "sequence", width]),
                    helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", width])], "unmasked_mean")


BUILDERS = {"resnet_like": resnet_like, "unet_like": unet_like, "bert_like": bert_like}


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def bert_like_tokenizer(path: Path, vocab: int = 100) -> Path:
    """A word-level tokenizer.json for ``bert_like``: its ids fit the model's vocabulary (the most
    common English words, the rest [UNK]) and it makes BERT's inputs, so real text drives the
    small model with realistic lengths (``tools.input_data --dataset glue:RTE``)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.normalizers import Lowercase
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    words = ("the of and to a in is that for it as was with be by on not he i this are or his from at which but have "
             "an had they you were their one all we can her has there been if more when will would who so no she other "
             "its may these about than into after first new two time only most also over years year people some state "
             "world could them him made then said out any what well up many do did such where our war").split()
    table = {token: i for i, token in enumerate([*specials, *words][:vocab])}
    tokenizer = Tokenizer(WordLevel(table, unk_token="[UNK]"))
    tokenizer.normalizer = Lowercase()
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                  special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path

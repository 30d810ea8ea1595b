"""Lowering: a quantized torch.fx graph -> qrt ops, one lowering per rules pattern.

The graph is either the reference graph of torch.ao's FX flow (quantize /
dequantize nodes around reference quantized modules) or an already-quantized
model (``convert_fx`` / ``quantize_dynamic``) traced with torch.fx. This module
never touches ``torch.ao``: a front end passes ``describe``, which turns one
quantized module into a neutral ``LinearLayer`` / ``RNNCellLayer`` /
``SequenceLayer`` (numpy integers, scales, biases), so another front end
(pt2e) can reuse it.

Recurrent modules return tuples (``y, (h, c) = lstm(x)``, ``h, c = cell(x, (h, c))``);
FX shows them as ``operator.getitem`` nodes, which the walk resolves on a tuple
value. A getitem on anything else (tensor indexing) is not supported.

Values flow through the walk lazily: a dequantize is emitted only when a
float op needs the float value, and a static reference Linear waits for the
quantize that follows it, whose scale becomes the qrt ``linear``'s output
scale (that is what ``convert_fx`` fuses into ``quantized::linear``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from qrt.builder import GraphBuilder
from qrt.ops import layer_prefix


class LoweringError(ValueError):
    """The graph holds something qrt cannot run; the message names every such node."""


# ------------------------------------------------------------ neutral layer descriptions


@dataclass(frozen=True)
class QWeight:
    """A weight as the runtime stores it: int8 + scale/zero point (per tensor or per row), or float16."""

    values: np.ndarray  # int8 or float16, [out, in]
    scale: np.ndarray | None = None  # float32, shape () or (out,)
    zero_point: np.ndarray | None = None  # int32, same shape as scale

    def ports(self, prefix: str = "") -> dict[str, np.ndarray]:
        out = {f"{prefix}weight": self.values}
        if self.scale is not None:
            out[f"{prefix}weight_scale"] = self.scale
            out[f"{prefix}weight_zero_point"] = self.zero_point
        return out


@dataclass(frozen=True)
class LinearLayer:
    """Linear (+ ReLU). mode: None for a reference module (the graph around it decides
    static or dynamic), "dynamic" or "static" for PyTorch's native quantized modules."""

    pattern: str
    weight: QWeight
    bias: np.ndarray | None
    relu: bool
    mode: str | None = None
    output_qparams: tuple[np.float32, int] | None = None  # native static modules only


@dataclass(frozen=True)
class RNNCellLayer:
    """One recurrent weight set: the input and hidden dynamic linears of a cell (or of one layer
    direction of a sequence). pattern: "rnn_cell", "lstm_cell" or "gru_cell" (for a sequence's
    weight sets, the cell kind it is made of); nonlinearity matters for rnn only."""

    pattern: str
    ih_weight: QWeight
    ih_bias: np.ndarray | None
    hh_weight: QWeight
    hh_bias: np.ndarray | None
    nonlinearity: str = "tanh"

    def ports(self, prefix: str = "") -> dict[str, np.ndarray | None]:
        return {
            **self.ih_weight.ports(f"{prefix}ih_"),
            f"{prefix}ih_bias": self.ih_bias,
            **self.hh_weight.ports(f"{prefix}hh_"),
            f"{prefix}hh_bias": self.hh_bias,
        }


@dataclass(frozen=True)
class SequenceLayer:
    """nn.RNN / nn.LSTM / nn.GRU (pattern "rnn", "lstm", "gru"), dynamic.

    ``directions`` holds one weight set per layer and direction, in torch's order
    (l0, l0_reverse, l1, ...).
    """

    pattern: str
    directions: tuple[RNNCellLayer, ...]
    num_layers: int
    bidirectional: bool
    batch_first: bool
    nonlinearity: str = "tanh"


Layer = LinearLayer | RNNCellLayer | SequenceLayer
Describe = Callable[[nn.Module], "Layer | None"]


# ------------------------------------------------------------ values during the walk


@dataclass(frozen=True)
class _Float:
    name: str


@dataclass(frozen=True)
class _Quant:
    """A quint8 per-tensor value in the qrt graph."""

    name: str
    scale: np.float32
    zero_point: int


@dataclass(frozen=True)
class _Deq:
    """dequantize(q): becomes a qrt dequantize only if a float op reads it."""

    q: _Quant


@dataclass(frozen=True)
class _DynQ:
    source: _Float


@dataclass(frozen=True)
class _DynDeq:
    """The float input of a dynamic op: the op quantizes it itself, per call."""

    source: _Float


@dataclass(frozen=True)
class _PendingLinear:
    """A static reference Linear whose output quantize has not been seen yet."""

    name: str
    layer: LinearLayer
    x: _Quant


@dataclass(frozen=True)
class _Const:
    value: Any


@dataclass(frozen=True)
class _Tuple:
    """The tuple a recurrent module returns; operator.getitem takes it apart."""

    items: tuple

    @property
    def name(self) -> str:  # the first tensor, for the module path -> qrt value record
        first = self.items[0]
        return first.name


# ------------------------------------------------------------ float ops qrt runs

_RELU_FUNCS = (F.relu, torch.relu)
_FLATTEN_FUNCS = (torch.flatten,)
_ADD_FUNCS = (operator.add, torch.add)
_QUANTIZE_FUNCS = (torch.quantize_per_tensor,)
_GETITEM_FUNCS = (operator.getitem,)
# Float modules returning a tuple, whose getitem nodes the lowering resolves.
_TUPLE_MODULES = (nn.RNNBase, nn.LSTMCell)
# Patterns whose lowering returns a tuple.
_TUPLE_PATTERNS = ("lstm_cell", "rnn", "lstm", "gru")
_DYNAMIC_QUANTIZE_FUNCS = (torch.quantize_per_tensor_dynamic,)
# Modules that are the identity in eval mode.
_IDENTITY_MODULES = (nn.Identity, nn.Dropout)
# nn.Linear: a float Linear (kept in float by the rules) runs as linear_float.
FLOAT_MODULES = (nn.ReLU, nn.Flatten, nn.Linear, *_IDENTITY_MODULES)
FLOAT_METHODS = ("relu", "flatten", "dequantize", "contiguous")

# convert_fx runs these ops on the quantized tensor itself when they sit between a dequantize and a
# quantize, keeping the input's scale and zero point and dropping that quantize (torch 2.13
# _lower_to_native_backend: is_copy_node, is_general_tensor_shape_node, is_default_node). Its observed
# qparams are ignored, so the lowering must ignore them too. Exact types, as torch matches them.
_NATIVE_COPY_MODULES = (nn.ReLU, nn.Dropout)
_NATIVE_COPY_FUNCS = (F.relu, torch.flatten)
_NATIVE_COPY_METHODS = ("relu", "contiguous")


def _float_linear_relu(m: nn.Module) -> bool:
    """A float Linear -> ReLU that prepare_fx fused (nni.LinearReLU, a Sequential) and left unquantized."""
    return (
        isinstance(m, nn.Sequential) and len(m) == 2 and type(m[0]) is nn.Linear and isinstance(m[1], nn.ReLU)
    )


def _fn_name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod.startswith("torch"):
        return f"torch.{name}" if not mod.startswith("torch.nn.functional") else f"F.{name}"
    return f"{mod}.{name}" if mod else name


def _class_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


# ------------------------------------------------------------ the lowering table


class _Lowerer:
    def __init__(self, gm: torch.fx.GraphModule, describe: Describe, input_shapes: Sequence[Sequence[int]]):
        self.gm = gm
        self.describe = describe
        self.input_shapes = list(input_shapes)
        self.b = GraphBuilder()
        self.env: dict[torch.fx.Node, Any] = {}
        self.dequantized: dict[str, str] = {}  # quantized value -> its dequantize node's output
        self.modules = dict(gm.named_modules())
        self.layers: dict[str, str] = {}  # module path -> the qrt value holding its output

    # -- helpers

    def name(self, base: str) -> str:
        """A node name not used yet (fx names are unique, but emitted helpers add more)."""
        taken = {n["name"] for n in self.b.nodes}
        name, i = base, 1
        while name in taken or name in self.b.tensors or any(s["name"] == name for s in self.b.inputs):
            name, i = f"{base}_{i}", i + 1
        return name

    def float_of(self, v: Any, where: torch.fx.Node) -> str:
        if isinstance(v, _Float):
            return v.name
        if isinstance(v, _Deq):
            q = v.q
            if q.name not in self.dequantized:
                self.dequantized[q.name] = self.b.node(
                    "dequantize",
                    {"x": q.name, "scale": np.float32(q.scale), "zero_point": np.int32(q.zero_point)},
                    name=self.name(f"{q.name}_dequantize"),
                )
            return self.dequantized[q.name]
        if isinstance(v, _DynDeq):
            # A dynamic quantize/dequantize pair outside a dynamic op is dropped, as convert_fx does.
            return v.source.name
        raise LoweringError(f"node {where.name!r}: needs a float tensor, got {type(v).__name__.strip('_')}")

    def const(self, v: Any, where: torch.fx.Node, what: str) -> Any:
        if isinstance(v, _Const):
            return v.value
        if isinstance(v, (int, float, torch.dtype, bool)) or v is None:
            return v
        raise LoweringError(f"node {where.name!r}: {what} must be a constant")

    def arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (tuple, list)):  # an LSTM's state (h, c) is passed as a tuple of nodes
            return _Tuple(tuple(self.arg(v) for v in a))
        return a

    # -- node kinds

    def placeholder(self, node: torch.fx.Node) -> Any:
        i = len(self.b.inputs)
        if i >= len(self.input_shapes):
            raise LoweringError(f"input {node.target!r} has no example shape")
        shape = [None, *self.input_shapes[i][1:]]  # batch is free
        return _Float(self.b.input(node.target, "float32", shape))

    def get_attr(self, node: torch.fx.Node) -> Any:
        obj = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return _Const(obj)

    def quantize(self, node: torch.fx.Node) -> Any:
        x, scale, zp, dtype = (self.arg(a) for a in node.args[:4])
        scale = self.const(scale, node, "scale")
        zp = self.const(zp, node, "zero_point")
        dtype = self.const(dtype, node, "dtype")
        if dtype != torch.quint8:
            raise LoweringError(f"node {node.name!r}: quantize to {dtype} is not supported (quint8 only)")
        s = float(scale)
        if float(np.float32(s)) != s:
            raise LoweringError(f"node {node.name!r}: scale {s!r} is not a float32 value")
        s32, z = np.float32(s), int(zp)
        if isinstance(x, _PendingLinear):
            return self.emit_static_linear(x, s32, z)
        kept = self.native_copy_input(node.args[0])
        if kept is not None:
            # relu / flatten / identity of a quint8 value at its own qparams is exact: max(q, zp) or q.
            s32, z = kept.scale, kept.zero_point
        out = self.b.node(
            "quantize_per_tensor",
            {"x": self.float_of(x, node), "scale": s32, "zero_point": np.int32(z)},
            {"dtype": "quint8"},
            name=self.name(node.name),
        )
        return _Quant(out, s32, z)

    def native_copy_input(self, src: Any) -> _Quant | None:
        """The quantized input of a dequantize -> copy op -> quantize chain, as convert_fx matches it."""
        if not isinstance(src, torch.fx.Node) or not src.args or not isinstance(src.args[0], torch.fx.Node):
            return None
        copy_op = (
            (src.op == "call_module" and type(self.modules[src.target]) in _NATIVE_COPY_MODULES)
            or (src.op == "call_function" and src.target in _NATIVE_COPY_FUNCS)
            or (src.op == "call_method" and src.target in _NATIVE_COPY_METHODS)
        )
        dq = src.args[0]
        if not copy_op or not (dq.op == "call_method" and dq.target == "dequantize"):
            return None
        v = self.env[dq]
        return v.q if isinstance(v, _Deq) else None

    def emit_static_linear(self, p: _PendingLinear, y_scale: np.float32, y_zp: int) -> _Quant:
        layer, x = p.layer, p.x
        if layer.weight.values.dtype != np.int8:
            raise LoweringError(f"node {p.name!r}: a static Linear needs qint8 weights")
        out = self.b.node(
            "linear",
            {
                "x": x.name,
                "x_scale": np.float32(x.scale),
                "x_zero_point": np.int32(x.zero_point),
                **layer.weight.ports(),
                "bias": layer.bias,
                "y_scale": np.float32(y_scale),
                "y_zero_point": np.int32(y_zp),
            },
            {"relu": layer.relu},
            name=self.name(p.name),
        )
        return _Quant(out, np.float32(y_scale), y_zp)

    def call_function(self, node: torch.fx.Node) -> Any:
        fn = node.target
        if fn in _QUANTIZE_FUNCS:
            return self.quantize(node)
        if fn in _DYNAMIC_QUANTIZE_FUNCS:
            x = self.arg(node.args[0])
            return _DynQ(_Float(self.float_of(x, node)))
        if fn in _RELU_FUNCS:
            return self.relu(node, self.arg(node.args[0]))
        if fn in _FLATTEN_FUNCS:
            return self.flatten(node, *node.args, **node.kwargs)
        if fn in _ADD_FUNCS:
            return self.add(node)
        if fn in _GETITEM_FUNCS:
            return self.getitem(node)
        raise AssertionError(f"unclassified function {fn}")  # find_unsupported lets none through

    def call_method(self, node: torch.fx.Node) -> Any:
        x = self.arg(node.args[0])
        if node.target == "dequantize":
            if isinstance(x, _Quant):
                return _Deq(x)
            if isinstance(x, _DynQ):
                return _DynDeq(x.source)
            if isinstance(x, _PendingLinear):
                raise LoweringError(f"node {node.name!r}: a static Linear's output is dequantized unquantized")
            return x  # dequantize of a float tensor is the identity
        if node.target == "relu":
            return self.relu(node, x)
        if node.target == "flatten":
            return self.flatten(node, *node.args, **node.kwargs)
        if node.target == "contiguous":
            return x
        raise AssertionError(f"unclassified method {node.target}")

    def call_module(self, node: torch.fx.Node) -> Any:
        module = self.modules[node.target]
        layer = self.describe(module)
        if layer is not None:
            args = [self.arg(a) for a in node.args]
            kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
            try:
                out = LOWERINGS[layer.pattern](self, node, layer, *args, **kwargs)
            except TypeError as e:  # arguments the lowering does not take (e.g. a keyword it does not know)
                raise LoweringError(f"module {node.target!r}: unsupported call arguments ({e})") from None
            # Recorded so that `qrt compare` can match qrt values to PyTorch modules layer by layer.
            self.layers[str(node.target)] = out.name
            return out
        if isinstance(module, _IDENTITY_MODULES):
            return self.arg(node.args[0])
        if _float_linear_relu(module) or isinstance(module, nn.Linear):
            out = self.linear_float(node, module, self.arg(node.args[0]))
            self.layers[str(node.target)] = out.name
            return out
        if isinstance(module, nn.ReLU):
            return self.relu(node, self.arg(node.args[0]))
        if isinstance(module, nn.Flatten):
            if module.end_dim != -1:
                raise LoweringError(f"module {node.target!r}: Flatten with end_dim {module.end_dim} is not supported")
            return self.flatten(node, node.args[0], module.start_dim)
        raise AssertionError(f"unclassified module {node.target}")

    def linear_float(self, node: torch.fx.Node, module: nn.Module, x: Any) -> _Float:
        """A Linear the rules keep in float (or a float Linear + ReLU fused by prepare_fx)."""
        linear = module if isinstance(module, nn.Linear) else module[0]
        ports = {
            "x": self.float_of(x, node),
            "weight": linear.weight.detach().float().numpy().copy(),
            "bias": None if linear.bias is None else linear.bias.detach().float().numpy().copy(),
        }
        y = self.b.node("linear_float", ports, name=self.name(node.name))
        if not isinstance(module, nn.Linear):
            y = self.b.node("relu", {"x": y}, name=self.name(f"{node.name}_relu"))
        return _Float(y)

    def relu(self, node: torch.fx.Node, x: Any) -> _Float | _Quant:
        if isinstance(x, _Quant):
            # A quantized tensor's relu (native models) keeps its qparams: max(q, zp), which
            # dequantize -> relu -> quantize at the same qparams computes exactly.
            y = self.b.node("relu", {"x": self.float_of(_Deq(x), node)}, name=self.name(node.name))
            q = self.b.node(
                "quantize_per_tensor",
                {"x": y, "scale": np.float32(x.scale), "zero_point": np.int32(x.zero_point)},
                {"dtype": "quint8"},
                name=self.name(f"{node.name}_quantize"),
            )
            return _Quant(q, x.scale, x.zero_point)
        return _Float(self.b.node("relu", {"x": self.float_of(x, node)}, name=self.name(node.name)))

    def flatten(self, node: torch.fx.Node, x: Any, start_dim: int = 0, end_dim: int = -1) -> _Float:
        if end_dim != -1 or not isinstance(start_dim, int) or start_dim < 0:
            raise LoweringError(
                f"node {node.name!r}: flatten(start_dim={start_dim}, end_dim={end_dim}) is not supported; "
                "qrt flattens from a non-negative start_dim to the end"
            )
        x = self.arg(x)
        if isinstance(x, _Quant):  # flattening a quantized tensor keeps its qparams
            y = self.b.node("flatten", {"x": x.name}, {"start_dim": start_dim}, name=self.name(node.name))
            return _Quant(y, x.scale, x.zero_point)
        x = self.float_of(x, node)
        return _Float(self.b.node("flatten", {"x": x}, {"start_dim": start_dim}, name=self.name(node.name)))

    def getitem(self, node: torch.fx.Node) -> Any:
        v, index = self.arg(node.args[0]), node.args[1]
        if not isinstance(v, _Tuple) or not isinstance(index, int) or not -len(v.items) <= index < len(v.items):
            raise LoweringError(f"node {node.name!r}: only taking apart a recurrent module's tuple is supported")
        return v.items[index]

    def add(self, node: torch.fx.Node) -> _Float:
        if len(node.args) != 2 or node.kwargs:
            raise LoweringError(f"node {node.name!r}: only a + b of two tensors is supported")
        a, b = (self.arg(v) for v in node.args)
        if not all(isinstance(v, (_Float, _Deq, _DynDeq)) for v in (a, b)):
            raise LoweringError(f"node {node.name!r}: only a + b of two tensors is supported")
        ins = {"a": self.float_of(a, node), "b": self.float_of(b, node)}
        return _Float(self.b.node("add", ins, name=self.name(node.name)))

    def output(self, node: torch.fx.Node) -> None:
        result = node.args[0]
        items = list(result) if isinstance(result, (tuple, list)) else [result]
        names = []
        for item in items:
            if not isinstance(item, torch.fx.Node):
                raise LoweringError(f"the model returns a constant ({item!r:.40}); qrt outputs must be tensors")
            names.append(self.float_of(self.env[item], item))
        self.b.output(*names, as_tuple=isinstance(result, (tuple, list)))

    def run(self) -> GraphBuilder:
        for node in self.gm.graph.nodes:
            if node.op == "output":
                self.output(node)
            else:
                self.env[node] = getattr(self, node.op)(node)
        return self.b


def _lower_linear(lw: _Lowerer, node: torch.fx.Node, layer: LinearLayer, x: Any) -> Any:
    """Linear (+ReLU): dynamic -> linear_dynamic [+ relu]; static -> linear(relu)."""
    name = lw.name(node.name)
    if layer.mode == "static" or (layer.mode is None and isinstance(x, _Deq)):
        q = x.q if isinstance(x, _Deq) else x
        if not isinstance(q, _Quant):
            raise LoweringError(f"node {node.name!r}: a static quantized Linear needs a quantized input")
        pending = _PendingLinear(name, layer, q)
        if layer.mode == "static":
            scale, zp = layer.output_qparams
            return lw.emit_static_linear(pending, scale, zp)
        return pending
    if layer.mode == "dynamic" or isinstance(x, _DynDeq):
        ports = {"x": lw.float_of(x, node), **layer.weight.ports(), "bias": layer.bias}
        # x86/fbgemm's dynamic Linear always reduces the activation range (NUMERICS.md).
        y = lw.b.node("linear_dynamic", ports, {"reduce_range": True}, name=name)
        if layer.relu:
            y = lw.b.node("relu", {"x": y}, name=lw.name(f"{node.name}_relu"))
        return _Float(y)
    raise LoweringError(
        f"module {node.target!r}: a quantized Linear whose input is neither statically nor dynamically "
        "quantized (weight-only quantization) is not supported"
    )


def _states(lw: _Lowerer, node: torch.fx.Node, hx: Any, names: tuple[str, ...]) -> dict[str, str]:
    """A recurrent module's state argument: one tensor, or a tuple (h, c) for an LSTM."""
    if len(names) == 1:
        return {names[0]: lw.float_of(hx, node)}
    if not isinstance(hx, _Tuple) or len(hx.items) != len(names):
        raise LoweringError(f"module {node.target!r}: the state must be a tuple ({', '.join(names)})")
    return {n: lw.float_of(v, node) for n, v in zip(names, hx.items)}


def _lower_cell(lw: _Lowerer, node: torch.fx.Node, layer: RNNCellLayer, x: Any, hx: Any = None) -> Any:
    """RNNCell / LSTMCell / GRUCell -> *_cell_dynamic: both linears quantize their own input per call."""
    kind = layer.pattern.removesuffix("_cell")
    states = ("h", "c") if kind == "lstm" else ("h",)
    if hx is None:
        # qrt cells take the state as an input; a streaming model carries it from step to step.
        raise LoweringError(f"module {node.target!r}: call the {kind.upper()} cell with an explicit state")
    ports = {"x": lw.float_of(x, node), **_states(lw, node, hx, states), **layer.ports()}
    attrs = {"reduce_range": True}
    if kind == "rnn":
        attrs["nonlinearity"] = layer.nonlinearity
    out = lw.b.node(f"{kind}_cell_dynamic", ports, attrs, name=lw.name(node.name))
    if kind == "lstm":
        return _Tuple(tuple(_Float(o) for o in out))
    return _Float(out)


def _lower_sequence(lw: _Lowerer, node: torch.fx.Node, layer: SequenceLayer, x: Any, hx: Any = None) -> Any:
    """nn.RNN / LSTM / GRU -> rnn/lstm/gru_dynamic; returns (y, h_n) or (y, (h_n, c_n)) as torch does."""
    kind = layer.pattern
    ports: dict[str, Any] = {"x": lw.float_of(x, node)}
    if hx is not None:
        states = ("h0", "c0") if kind == "lstm" else ("h0",)
        ports.update(_states(lw, node, hx, states))
    dirs = 2 if layer.bidirectional else 1
    for i, weights in enumerate(layer.directions):
        ports.update(weights.ports(layer_prefix(i // dirs, i % dirs == 1)))
    attrs = {
        "num_layers": layer.num_layers,
        "bidirectional": layer.bidirectional,
        "batch_first": layer.batch_first,
        "reduce_range": True,
    }
    if kind == "rnn":
        attrs["nonlinearity"] = layer.nonlinearity
    y, *final = (_Float(o) for o in lw.b.node(f"{kind}_dynamic", ports, attrs, name=lw.name(node.name)))
    return _Tuple((y, _Tuple(tuple(final)) if kind == "lstm" else final[0]))


# Rules pattern name -> its qrt lowering. A rules pattern missing here is refused at start-up.
LOWERINGS: dict[str, Callable[..., Any]] = {
    "linear": _lower_linear,
    "linear_relu": _lower_linear,
    "rnn_cell": _lower_cell,
    "lstm_cell": _lower_cell,
    "gru_cell": _lower_cell,
    "rnn": _lower_sequence,
    "lstm": _lower_sequence,
    "gru": _lower_sequence,
}


def check_patterns(pattern_names: Sequence[tuple[str, str]]) -> None:
    """Refuse rules naming a pattern without a lowering: (name, description) pairs."""
    missing = [desc for name, desc in pattern_names if name not in LOWERINGS]
    if missing:
        raise LoweringError(
            f"the rules list pattern(s) {', '.join(missing)} with no qrt lowering; "
            f"qrt lowers: {', '.join(sorted(LOWERINGS))}"
        )


def find_unsupported(
    gm: torch.fx.GraphModule, describe: Describe, quantizable: Callable[[str, nn.Module], bool] = lambda n, m: False
) -> list[str]:
    """Every node qrt cannot run, by name: modules not described and not float ops, other calls.

    ``quantizable(name, module)`` says the front end will quantize that float module
    (used to check a float model before it is quantized).
    """
    modules = dict(gm.named_modules())

    def recurrent_pattern(src: Any) -> str | None:
        """The tuple-returning pattern (lstm_cell, rnn, lstm, gru) whose call src is, if any."""
        if not isinstance(src, torch.fx.Node) or src.op != "call_module":
            return None
        m = modules[src.target]
        layer = describe(m)
        if layer is not None:
            return layer.pattern if layer.pattern in _TUPLE_PATTERNS else None
        if isinstance(m, _TUPLE_MODULES):  # if qrt cannot run the module, the module itself is named
            return "lstm" if isinstance(m, nn.LSTM) else "tuple"
        return None

    def returns_tuple(src: Any) -> bool:
        """src's value is a tuple: a recurrent module's result, or an LSTM's (h_n, c_n) in it."""
        if recurrent_pattern(src) is not None:
            return True
        return (
            isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target in _GETITEM_FUNCS
            and src.args[1] == 1 and recurrent_pattern(src.args[0]) == "lstm"
        )

    bad = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            m = modules[node.target]
            known = isinstance(m, FLOAT_MODULES) or _float_linear_relu(m)
            if describe(m) is None and not known and not quantizable(node.target, m):
                bad.append(f"module {node.target!r} ({_class_name(m)})")
        elif node.op == "call_function":
            fn = node.target
            known = _QUANTIZE_FUNCS + _DYNAMIC_QUANTIZE_FUNCS + _RELU_FUNCS + _FLATTEN_FUNCS + _ADD_FUNCS
            if fn in _GETITEM_FUNCS:
                if not (len(node.args) == 2 and isinstance(node.args[1], int) and returns_tuple(node.args[0])):
                    bad.append(f"function operator.getitem (node {node.name!r}): indexing a tensor")
            elif fn not in known:
                bad.append(f"function {_fn_name(fn)} (node {node.name!r})")
        elif node.op == "call_method" and node.target not in FLOAT_METHODS:
            bad.append(f"method .{node.target}() (node {node.name!r})")
    return bad


def lower(
    gm: torch.fx.GraphModule,
    describe: Describe,
    input_shapes: Sequence[Sequence[int]],
    layers: dict[str, str] | None = None,
) -> GraphBuilder:
    """Lower a quantized fx graph into a qrt GraphBuilder (not yet saved).

    ``layers``, if given, is filled with module path -> the qrt value holding that module's output.
    """
    bad = find_unsupported(gm, describe)
    if bad:
        raise LoweringError("qrt cannot run: " + "; ".join(bad))
    lowerer = _Lowerer(gm, describe, input_shapes)
    builder = lowerer.run()
    if layers is not None:
        layers.update(lowerer.layers)
    return builder

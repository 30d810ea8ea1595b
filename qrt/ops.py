"""The op registry: which ops exist, what they take, and what they produce.

Every part of qrt that knows about ops reads this table: the loader
validates nodes against it, each backend implements exactly the ops listed
here, and the converter emits nothing else. Adding an op means adding one
``OpSpec`` here and one implementation per backend.

An op's ``check`` sees the node's input value infos (dtype and shape, a
``None`` dimension being free until run time), the constant tensors it was
given, and its attributes with defaults filled in. It returns the output
infos or raises ``FormatError`` saying what is wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import FormatError

Shape = tuple  # of int, or None for a dimension known only at run time

QUANT_DTYPES = {"quint8": "uint8", "qint8": "int8", "qint32": "int32"}
INT_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "int32": (-(2**31), 2**31 - 1),
}


@dataclass(frozen=True)
class ValueInfo:
    """The static type of a value: storage dtype name and shape."""

    dtype: str
    shape: Shape

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True)
class Port:
    """One named input of an op."""

    name: str
    dtypes: tuple[str, ...]
    optional: bool = False
    const: bool = False  # must be a stored tensor (weights, quantization parameters)


@dataclass(frozen=True)
class Attr:
    """One attribute of an op, with its JSON type and allowed values."""

    name: str
    kind: type | tuple
    default: Any = None
    choices: tuple | None = None
    required: bool = False

    def validate(self, value: Any) -> Any:
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        # JSON true/false must not pass for an integer attribute.
        ok = isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
        if not ok:
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise FormatError(f"attribute {self.name!r} must be {names}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise FormatError(
                f"attribute {self.name!r} must be one of {list(self.choices)}, got {value!r}"
            )
        return value


Check = Callable[[Mapping[str, ValueInfo], Mapping[str, np.ndarray], Mapping[str, Any]], list]


@dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    inputs: tuple[Port, ...]
    outputs: tuple[str, ...]
    check: Check
    attrs: tuple[Attr, ...] = field(default=())

    def port(self, name: str) -> Port:
        for p in self.inputs:
            if p.name == name:
                return p
        raise KeyError(name)

    def resolve_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Validate given attributes and fill in defaults."""
        known = {a.name: a for a in self.attrs}
        for name in given:
            if name not in known:
                raise FormatError(f"unknown attribute {name!r}")
        out = {}
        for a in self.attrs:
            if a.name in given:
                out[a.name] = a.validate(given[a.name])
            elif a.required:
                raise FormatError(f"missing attribute {a.name!r}")
            else:
                out[a.name] = a.default
        return out


# ---------------------------------------------------------------- checks


def _fail(msg: str) -> None:
    raise FormatError(msg)


def _finite_reciprocal(t: np.ndarray) -> bool:
    """1/fl(t) is finite in float32: kernels multiply by the reciprocal, so a denormal scale is unusable."""
    with np.errstate(divide="ignore", over="ignore"):
        return bool(np.all(np.isfinite(np.float32(1) / t.astype(np.float32))))


def _scale_values(name: str, t: np.ndarray) -> None:
    """Scales are finite and > 0, and so is their float32 rounding fl(s) (quantize multiplies by 1/fl(s)).

    fl(s) matters only for float64 scales: one beyond float32's range would make the reciprocal 0.
    """
    with np.errstate(over="ignore"):
        usable = np.all(np.isfinite(t.astype(np.float32))) and _finite_reciprocal(t)
    if not np.all(np.isfinite(t)) or not np.all(t > 0) or not usable:
        _fail(f"{name} must be finite and > 0 with a finite float32 reciprocal, got {t.ravel()[:8].tolist()}")


def _zero_points(name: str, t: np.ndarray, dtype: str) -> None:
    lo, hi = INT_RANGES[dtype]
    if t.size and (int(t.min()) < lo or int(t.max()) > hi):
        _fail(f"{name} must lie in [{lo}, {hi}] for {dtype}, got {t.ravel()[:8].tolist()}")


def _qparams(ins, consts, prefix: str, dtype: str, channels: int | None) -> None:
    """Check a scale / zero_point pair: per-tensor (shape ()) or per-channel."""
    scale, zp = f"{prefix}scale", f"{prefix}zero_point"
    s_shape, z_shape = ins[scale].shape, ins[zp].shape
    if s_shape != z_shape:
        _fail(f"{scale} has shape {list(s_shape)} but {zp} has {list(z_shape)}")
    if channels is None and s_shape != ():
        _fail(f"{scale} must be a scalar (shape []), got {list(s_shape)}")
    if channels is not None and s_shape not in ((), (channels,)):
        _fail(f"{scale} must have shape [] or [{channels}], got {list(s_shape)}")
    _scale_values(scale, consts[scale])
    _zero_points(zp, consts[zp], dtype)


def _rank_at_least(name: str, info: ValueInfo, rank: int) -> None:
    if len(info.shape) < rank:
        _fail(f"{name} must have rank >= {rank}, got {info.describe()}")


def _dim_equals(what: str, got, want: int) -> None:
    if got is not None and got != want:
        _fail(f"{what} is {got}, expected {want}")


def _dynamic_weight(ins, consts, prefix: str = "") -> tuple[int, int]:
    """Check a dynamic linear's weight set; return (out_features, in_features).

    int8 weights carry a scale and zero point; float16 weights carry none.
    """
    w = ins[f"{prefix}weight"]
    if len(w.shape) != 2:
        _fail(f"{prefix}weight must be 2-D [out, in], got {w.describe()}")
    n, k = w.shape
    has_q = f"{prefix}weight_scale" in ins or f"{prefix}weight_zero_point" in ins
    if w.dtype == "int8":
        # both, not either: _qparams reads the two ports
        if f"{prefix}weight_scale" not in ins or f"{prefix}weight_zero_point" not in ins:
            _fail(f"int8 {prefix}weight needs {prefix}weight_scale and {prefix}weight_zero_point")
        _qparams(ins, consts, f"{prefix}weight_", "int8", n)
    elif has_q:
        _fail(f"float16 {prefix}weight takes no scale or zero point")
    b = ins.get(f"{prefix}bias")
    if b is not None and b.shape != (n,):
        _fail(f"{prefix}bias must have shape [{n}], got {b.describe()}")
    return n, k


def _check_quantize_per_tensor(ins, consts, attrs):
    dtype = QUANT_DTYPES[attrs["dtype"]]
    _qparams(ins, consts, "", dtype, None)
    return [ValueInfo(dtype, ins["x"].shape)]


def _check_axis(info: ValueInfo, axis: int) -> int:
    if not 0 <= axis < len(info.shape):
        _fail(f"axis {axis} is out of range for x of rank {len(info.shape)}")
    channels = info.shape[axis]
    if channels is None:
        _fail(f"axis {axis} of x must have a fixed size")
    return channels


def _check_quantize_per_channel(ins, consts, attrs):
    dtype = QUANT_DTYPES[attrs["dtype"]]
    channels = _check_axis(ins["x"], attrs["axis"])
    _qparams(ins, consts, "", dtype, channels)
    if ins["scale"].shape != (channels,):
        _fail(f"scale must have shape [{channels}], got {list(ins['scale'].shape)}")
    return [ValueInfo(dtype, ins["x"].shape)]


def _check_dequantize(ins, consts, attrs):
    x = ins["x"]
    if attrs["axis"] is None:
        # torch's per-tensor dequantize multiplies in float32: a float64 scale would claim a precision it lacks
        if ins["scale"].dtype != "float32":
            _fail(f"a per-tensor scale (axis null) must be float32, got {ins['scale'].dtype}")
        _qparams(ins, consts, "", x.dtype, None)
    else:
        channels = _check_axis(x, attrs["axis"])
        _qparams(ins, consts, "", x.dtype, channels)
        if ins["scale"].shape != (channels,):
            _fail(f"scale must have shape [{channels}], got {list(ins['scale'].shape)}")
    return [ValueInfo("float32", x.shape)]


def _linear_shapes(ins) -> int:
    """x [..., in], weight [out, in], optional bias [out]; returns out."""
    x, w = ins["x"], ins["weight"]
    _rank_at_least("x", x, 1)
    if len(w.shape) != 2:
        _fail(f"weight must be 2-D [out, in], got {w.describe()}")
    n, k = w.shape
    _dim_equals("x's last dimension", x.shape[-1], k)
    b = ins.get("bias")
    if b is not None and b.shape != (n,):
        _fail(f"bias must have shape [{n}], got {b.describe()}")
    return n


def _check_linear(ins, consts, attrs):
    x, n = ins["x"], _linear_shapes(ins)
    _qparams(ins, consts, "x_", "uint8", None)
    _qparams(ins, consts, "weight_", "int8", n)
    _qparams(ins, consts, "y_", "uint8", None)
    # The requantization runs on a_w = s_x * s_w and a_w / s_y in float32: both must stay usable.
    with np.errstate(over="ignore", under="ignore"):
        a_w = np.float32(consts["x_scale"]) * consts["weight_scale"].astype(np.float32)
        mult = a_w / np.float32(consts["y_scale"])
    if not (np.all(a_w > 0) and _finite_reciprocal(a_w) and np.all(np.isfinite(mult)) and np.all(mult > 0)):
        _fail("x_scale * weight_scale / y_scale over- or underflows float32")
    return [ValueInfo("uint8", x.shape[:-1] + (n,))]


def _check_linear_dynamic(ins, consts, attrs):
    x = ins["x"]
    _rank_at_least("x", x, 1)
    n, k = _dynamic_weight(ins, consts)
    _dim_equals("x's last dimension", x.shape[-1], k)
    return [ValueInfo("float32", x.shape[:-1] + (n,))]


def _check_linear_float(ins, consts, attrs):
    return [ValueInfo("float32", ins["x"].shape[:-1] + (_linear_shapes(ins),))]


def _recurrent_weights(ins, consts, prefix: str, gates: int, n_in) -> int:
    """Check one direction's ih/hh weight sets against its input width n_in; return the hidden size."""
    rows, hidden = _dynamic_weight(ins, consts, f"{prefix}hh_")
    if rows != gates * hidden:
        got = ins[f"{prefix}hh_weight"].describe()
        _fail(f"{prefix}hh_weight must have shape [{gates} * hidden, hidden], got {got}")
    rows_ih, k = _dynamic_weight(ins, consts, f"{prefix}ih_")
    if rows_ih != rows:
        _fail(f"{prefix}ih_weight has {rows_ih} rows, expected {rows} ({gates} x hidden {hidden})")
    _dim_equals(f"the input width of {prefix or 'the cell'} (x's last dimension)", n_in, k)
    return hidden


def _check_cell(gates: int, states: tuple[str, ...]) -> Check:
    """Check for a one-step cell: x [B, I] and states [B, H] -> new states [B, H]."""

    def check(ins, consts, attrs):
        x = ins["x"]
        if len(x.shape) != 2:
            _fail(f"x must be 2-D [batch, features], got {x.describe()}")
        hidden = _recurrent_weights(ins, consts, "", gates, x.shape[1])
        for name in states:
            s = ins[name]
            if len(s.shape) != 2:
                _fail(f"{name} must be 2-D [batch, hidden], got {s.describe()}")
            _dim_equals(f"{name}'s feature size", s.shape[1], hidden)
            if None not in (x.shape[0], s.shape[0]) and x.shape[0] != s.shape[0]:
                _fail(f"x has batch {x.shape[0]} but {name} has batch {s.shape[0]}")
        return [ValueInfo("float32", (x.shape[0], hidden)) for _ in states]

    return check


MAX_LAYERS = 8
_LAYER_PORT = re.compile(r"^(l\d+_(?:reverse_)?)")


def layer_prefix(layer: int, reverse: bool) -> str:
    """Port prefix of one layer direction of a sequence op: 'l0_', 'l0_reverse_', ..."""
    return f"l{layer}_{'reverse_' if reverse else ''}"


def _check_sequence(gates: int, states: tuple[str, ...]) -> Check:
    """Check for a whole-sequence op: x [T, B, I] (or [B, T, I]) -> y, final states."""

    def check(ins, consts, attrs):
        x = ins["x"]
        if len(x.shape) != 3:
            _fail(f"x must be 3-D [seq, batch, features] (or batch first), got {x.describe()}")
        layers, dirs = attrs["num_layers"], 2 if attrs["bidirectional"] else 1
        if not 1 <= layers <= MAX_LAYERS:
            _fail(f"num_layers must be in [1, {MAX_LAYERS}], got {layers}")
        expected = {layer_prefix(n, d == 1) for n in range(layers) for d in range(dirs)}
        for port in ins:
            match = _LAYER_PORT.match(port)
            if match and match.group(1) not in expected:
                _fail(f"input {port!r} is beyond num_layers={layers}, bidirectional={attrs['bidirectional']}")
        seq, batch = (x.shape[1], x.shape[0]) if attrs["batch_first"] else (x.shape[0], x.shape[1])
        n_in, hidden = x.shape[2], None
        for n in range(layers):
            for d in range(dirs):
                prefix = layer_prefix(n, d == 1)
                for side in ("ih_", "hh_"):
                    if f"{prefix}{side}weight" not in ins:
                        _fail(f"missing input {prefix}{side}weight")
                h = _recurrent_weights(ins, consts, prefix, gates, n_in)
                if hidden is not None and h != hidden:
                    _fail(f"{prefix}hh_weight has hidden size {h}, layer 0 has {hidden}")
                hidden = h
            n_in = dirs * hidden
        state_shape = (layers * dirs, batch, hidden)
        for name in states:
            s = ins.get(f"{name}0")
            if s is not None and (
                len(s.shape) != 3
                or any(a is not None and b is not None and a != b for a, b in zip(s.shape, state_shape))
            ):
                _fail(f"{name}0 must have shape [{layers * dirs}, batch, {hidden}], got {s.describe()}")
        y_shape = (batch, seq, dirs * hidden) if attrs["batch_first"] else (seq, batch, dirs * hidden)
        return [ValueInfo("float32", y_shape)] + [ValueInfo("float32", state_shape) for _ in states]

    return check


def _check_same_shape_float(ins, consts, attrs):
    infos = list(ins.values())
    for a in infos[1:]:
        if len(a.shape) != len(infos[0].shape) or any(
            p is not None and q is not None and p != q for p, q in zip(a.shape, infos[0].shape)
        ):
            _fail(f"operands must have the same shape, got {', '.join(i.describe() for i in infos)}")
    return [ValueInfo("float32", infos[0].shape)]


def _check_flatten(ins, consts, attrs):
    x = ins["x"]
    start = attrs["start_dim"]
    if not 0 <= start < max(len(x.shape), 1):
        _fail(f"start_dim {start} is out of range for x of rank {len(x.shape)}")
    tail = x.shape[start:]
    size = None if None in tail else math.prod(tail)
    return [ValueInfo(x.dtype, x.shape[:start] + (size,))]


# ---------------------------------------------------------------- the registry

_F32 = ("float32",)
# Per-channel scales may be float64, as torch holds them (format version 2); quantize uses fl(s), dequantize s.
_CHANNEL_SCALE = ("float32", "float64")
_QTYPES = ("uint8", "int8", "int32")


def _qparam_ports(prefix: str = "", scale_dtypes: tuple[str, ...] = _F32) -> tuple[Port, ...]:
    return (
        Port(f"{prefix}scale", scale_dtypes, const=True),
        Port(f"{prefix}zero_point", ("int32",), const=True),
    )


def _dynamic_weight_ports(prefix: str = "", optional: bool = False) -> tuple[Port, ...]:
    return (
        Port(f"{prefix}weight", ("int8", "float16"), optional=optional, const=True),
        Port(f"{prefix}weight_scale", _F32, optional=True, const=True),
        Port(f"{prefix}weight_zero_point", ("int32",), optional=True, const=True),
        Port(f"{prefix}bias", _F32, optional=True, const=True),
    )


_QDTYPE = Attr("dtype", str, choices=tuple(QUANT_DTYPES), required=True)
_REDUCE_RANGE = Attr("reduce_range", bool, default=True)

# kind, gates per hidden unit, state names, extra attributes, formula
_RECURRENT = (
    ("rnn", 1, ("h",), (Attr("nonlinearity", str, default="tanh", choices=("tanh", "relu")),),
     "h' = act(lin_ih(x) + lin_hh(h))"),
    ("lstm", 4, ("h", "c"), (), "gates i, f, g, o; c' = f*c + i*g; h' = o*tanh(c')"),
    ("gru", 3, ("h",), (), "gates r, z, n; n = tanh(i_n + r*h_n); h' = (h - n)*z + n"),
)
_SEQUENCE_ATTRS = (
    Attr("num_layers", int, default=1),
    Attr("bidirectional", bool, default=False),
    Attr("batch_first", bool, default=False),
)

OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        OpSpec(
            "quantize_per_tensor",
            "float32 -> quint8/qint8/qint32, as torch.quantize_per_tensor",
            (Port("x", _F32), *_qparam_ports()),
            ("y",),
            _check_quantize_per_tensor,
            (_QDTYPE,),
        ),
        OpSpec(
            "quantize_per_channel",
            "float32 -> quint8/qint8/qint32 with one scale per slice along axis",
            (Port("x", _F32), *_qparam_ports(scale_dtypes=_CHANNEL_SCALE)),
            ("y",),
            _check_quantize_per_channel,
            (_QDTYPE, Attr("axis", int, required=True)),
        ),
        OpSpec(
            "dequantize",
            "quantized -> float32; per-tensor when axis is null (then the scale must be float32)",
            (Port("x", _QTYPES), *_qparam_ports(scale_dtypes=_CHANNEL_SCALE)),
            ("y",),
            _check_dequantize,
            (Attr("axis", (int, type(None)), default=None),),
        ),
        OpSpec(
            "linear",
            "static quantized linear: quint8 x, qint8 weight, float bias -> quint8",
            (
                Port("x", ("uint8",)),
                *_qparam_ports("x_"),
                Port("weight", ("int8",), const=True),
                *_qparam_ports("weight_"),
                Port("bias", _F32, optional=True, const=True),
                *_qparam_ports("y_"),
            ),
            ("y",),
            _check_linear,
            (Attr("relu", bool, default=False),),
        ),
        OpSpec(
            "linear_dynamic",
            "float32 x quantized per call, int8 or float16 weight -> float32",
            (Port("x", _F32), *_dynamic_weight_ports()),
            ("y",),
            _check_linear_dynamic,
            (_REDUCE_RANGE,),
        ),
        OpSpec(
            "linear_float",
            "float32 linear y = x @ weight.T + bias: a layer the converter's rules keep in float",
            (Port("x", _F32), Port("weight", _F32, const=True), Port("bias", _F32, optional=True, const=True)),
            ("y",),
            _check_linear_float,
        ),
        *(
            OpSpec(
                f"{kind}_cell_dynamic",
                f"one {kind.upper()} step in torch's gate order, both linears dynamic: {doc}",
                (
                    Port("x", _F32),
                    *(Port(s, _F32) for s in states),
                    *_dynamic_weight_ports("ih_"),
                    *_dynamic_weight_ports("hh_"),
                ),
                tuple(f"{s}_next" for s in states),
                _check_cell(gates, states),
                attrs + (_REDUCE_RANGE,),
            )
            for kind, gates, states, attrs, doc in _RECURRENT
        ),
        *(
            OpSpec(
                f"{kind}_dynamic",
                f"a whole {kind.upper()} sequence: num_layers, optional bidirectional, time loop compiled",
                (
                    Port("x", _F32),
                    *(Port(f"{s}0", _F32, optional=True) for s in states),
                    *(
                        port
                        for n in range(MAX_LAYERS)
                        for reverse in (False, True)
                        for side in ("ih_", "hh_")
                        for port in _dynamic_weight_ports(layer_prefix(n, reverse) + side, optional=True)
                    ),
                ),
                ("y",) + tuple(f"{s}_n" for s in states),
                _check_sequence(gates, states),
                attrs + _SEQUENCE_ATTRS + (_REDUCE_RANGE,),
            )
            for kind, gates, states, attrs, doc in _RECURRENT
        ),
        OpSpec("relu", "float32 max(x, 0)", (Port("x", _F32),), ("y",), _check_same_shape_float),
        OpSpec(
            "add",
            "float32 elementwise a + b, same shapes",
            (Port("a", _F32), Port("b", _F32)),
            ("y",),
            _check_same_shape_float,
        ),
        OpSpec(
            "flatten",
            "merge dimensions start_dim.. into one, as torch.flatten(x, start_dim)",
            (Port("x", ("float32", "uint8", "int8", "int32")),),
            ("y",),
            _check_flatten,
            (Attr("start_dim", int, default=1),),
        ),
    )
}

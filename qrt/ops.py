"""The op registry: which ops exist, what they take, and what they produce.

Every part of qrt that knows about ops reads this table: the loader
validates nodes against it, the backends implement the ops listed
here, and the converter emits nothing else. Adding an op means adding one
``OpSpec`` here and its implementation in both backends (``qrt.cpu`` and
``qrt.gpu``; tests/test_gpu.py holds both to this table).

An op's ``check`` sees the node's input value infos (dtype and shape, a
``None`` dimension being free until run time), the constant tensors it was
given, and its attributes with defaults filled in. It returns the output
infos or raises ``FormatError`` saying what is wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import numpy as np

from .errors import FormatError

Shape = tuple  # of int, or None for a dimension known only at run time

QUANT_DTYPES = {"quint8": "uint8", "qint8": "int8", "qint32": "int32"}
INT_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "int32": (-(2**31), 2**31 - 1),
}


class ValueInfo(NamedTuple):
    """The static type of a value: storage dtype name and shape."""

    dtype: str
    shape: Shape

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


class Port(NamedTuple):
    """One named input of an op."""

    name: str
    dtypes: tuple[str, ...]
    optional: bool = False
    const: bool = False  # must be a stored tensor (weights, quantization parameters)
    packed: bool = False  # a weight matrix the kernels read packed: format 4 stores it so (qrt/layout.py)
    shape_only: bool = False  # only its shape is read, never its values


class Attr(NamedTuple):
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


class OpSpec(NamedTuple):
    name: str
    doc: str
    inputs: tuple[Port, ...]
    outputs: tuple[str, ...]
    check: Check
    attrs: tuple[Attr, ...] = ()

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


FLOAT32_TINY = np.finfo(np.float32).tiny  # 2**-126, the smallest normal float32


def _scale_values(name: str, t: np.ndarray) -> None:
    """Scales are finite and > 0, and their float32 rounding fl(s) is a normal float32 (quantize multiplies by
    1/fl(s), finite for every normal; a subnormal scale is refused, as a flush-to-zero unit would read it as 0).

    fl(s) matters only for float64 scales: one beyond float32's range, or below its normals, is refused too.
    """
    with np.errstate(over="ignore"):
        f = t.astype(np.float32)
    if not np.all(np.isfinite(t)) or not np.all(t > 0) or not np.all(np.isfinite(f) & (f >= FLOAT32_TINY)):
        _fail(f"{name} must be finite and > 0, a normal float32 (2**-126 to 3.4e38), got {t.ravel()[:8].tolist()}")


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
    # The requantization runs on a_w = s_x * s_w and a_w / s_y in float32: a_w a normal float32 (as a scale is),
    # the multiplier finite and > 0.
    with np.errstate(over="ignore", under="ignore"):
        a_w = np.float32(consts["x_scale"]) * consts["weight_scale"].astype(np.float32)
        mult = a_w / np.float32(consts["y_scale"])
    if not (np.all(a_w >= FLOAT32_TINY) and np.all(np.isfinite(mult)) and np.all(mult > 0)):
        _fail("x_scale * weight_scale / y_scale over- or underflows float32")
    return [ValueInfo("uint8", x.shape[:-1] + (n,))]


def _check_linear_dynamic(ins, consts, attrs):
    x = ins["x"]
    _rank_at_least("x", x, 1)
    n, k = _dynamic_weight(ins, consts)
    _dim_equals("x's last dimension", x.shape[-1], k)
    if attrs["activation"] == "per_row_symmetric":
        # torchao's Int8Tensor linear: symmetric int8 weights, its own activation rule (no reduce_range, no engine)
        if ins["weight"].dtype != "int8":
            _fail("activation 'per_row_symmetric' needs int8 weights")
        if np.any(consts["weight_zero_point"] != 0):
            _fail("activation 'per_row_symmetric' needs symmetric weights (weight_zero_point 0)")
        if attrs["reduce_range"] or attrs["engine"] != "x86":
            _fail("activation 'per_row_symmetric' takes reduce_range false and engine 'x86'")
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


def channel_view(shape: tuple, axis: int, stop: int | None = None) -> tuple[int, int, int]:
    """[outer, channels, inner]: a contiguous array of shape as the per-channel kernels read it, the channels
    dimension axis (or dimensions axis .. stop - 1 merged, as the reductions read them)."""
    stop = axis + 1 if stop is None else stop
    return math.prod(shape[:axis]), math.prod(shape[axis:stop]), math.prod(shape[stop:])


def flattened(shape: Shape, start: int, end: int | None) -> Shape:
    """The shape torch.flatten(x, start, end) gives x of this shape (None: free; end None: the last dim)."""
    stop = len(shape) if end is None else end + 1
    merged = shape[start:stop]
    return shape[:start] + (None if None in merged else math.prod(merged),) + shape[stop:]


def _check_flatten(ins, consts, attrs):
    x = ins["x"]
    start, end, rank = attrs["start_dim"], attrs["end_dim"], len(ins["x"].shape)
    if not 0 <= start < max(rank, 1):
        _fail(f"start_dim {start} is out of range for x of rank {rank}")
    if end is not None and not start <= end < max(rank, 1):
        _fail(f"end_dim {end} must lie in [start_dim, rank - 1] = [{start}, {max(rank, 1) - 1}]")
    return [ValueInfo(x.dtype, flattened(x.shape, start, end))]


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
        Port(f"{prefix}weight", ("int8", "float16"), optional=optional, const=True, packed=True),
        Port(f"{prefix}weight_scale", _F32, optional=True, const=True),
        Port(f"{prefix}weight_zero_point", ("int32",), optional=True, const=True),
        Port(f"{prefix}bias", _F32, optional=True, const=True),
    )


_QDTYPE = Attr("dtype", str, choices=tuple(QUANT_DTYPES), required=True)
_REDUCE_RANGE = Attr("reduce_range", bool, default=True)
# whose numerics the int8 linears follow: torch's x86 engine (fbgemm) or its qnnpack engine (ARM's default),
# docs/NUMERICS.md; qnnpack ignores reduce_range. Format version 5; on the quantize ops, version 6.
ENGINES = ("x86", "qnnpack")
_ENGINE = Attr("engine", str, default="x86", choices=ENGINES)
# how a dynamic linear quantizes its input: torch's one asymmetric uint8 scale over the whole input, or torchao's
# Int8Tensor linear (one symmetric int8 scale a row, its own float epilogue: docs/NUMERICS.md). Format version 7.
ACTIVATIONS = ("per_tensor", "per_row_symmetric")
_ACTIVATION = Attr("activation", str, default="per_tensor", choices=ACTIVATIONS)


def rounds_first(attrs: Mapping[str, Any]) -> bool:
    """Whether a node quantizes as torch on aarch64 does, the zero point added after rounding, rne(fl(x * inv)) +
    zp: the qnnpack engine's numerics, whose reference is ARM (docs/NUMERICS.md section 9)."""
    return attrs.get("engine") == "qnnpack"

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


def _float_weight_ports(prefix: str = "", optional: bool = False) -> tuple[Port, ...]:
    return (
        Port(f"{prefix}weight", _F32, optional=optional, const=True, packed=True),
        Port(f"{prefix}bias", _F32, optional=True, const=True),
    )


# The recurrent op families: name suffix, one linear's weight ports, the family's attributes, what its linears
# are. "float" (format version 8): a recurrent layer kept in float32, each linear linear_float's product.
_RECURRENT_FAMILIES = (
    ("dynamic", _dynamic_weight_ports, (_REDUCE_RANGE, _ENGINE), "both linears dynamic"),
    ("float", _float_weight_ports, (), "both linears float32 (linear_float's product)"),
)
RECURRENT_KINDS = tuple(kind for kind, *_ in _RECURRENT)
CELL_OPS = frozenset(f"{k}_cell_{f}" for f, *_ in _RECURRENT_FAMILIES for k in RECURRENT_KINDS)
SEQUENCE_OPS = frozenset(f"{k}_{f}" for f, *_ in _RECURRENT_FAMILIES for k in RECURRENT_KINDS)
FLOAT_RECURRENT_OPS = tuple(sorted(op for op in CELL_OPS | SEQUENCE_OPS if op.endswith("_float")))

OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        OpSpec(
            "quantize_per_tensor",
            "float32 -> quint8/qint8/qint32, as torch.quantize_per_tensor",
            (Port("x", _F32), *_qparam_ports()),
            ("y",),
            _check_quantize_per_tensor,
            (_QDTYPE, _ENGINE),
        ),
        OpSpec(
            "quantize_per_channel",
            "float32 -> quint8/qint8/qint32 with one scale per slice along axis",
            (Port("x", _F32), *_qparam_ports(scale_dtypes=_CHANNEL_SCALE)),
            ("y",),
            _check_quantize_per_channel,
            (_QDTYPE, Attr("axis", int, required=True), _ENGINE),
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
                Port("weight", ("int8",), const=True, packed=True),
                *_qparam_ports("weight_"),
                Port("bias", _F32, optional=True, const=True),
                *_qparam_ports("y_"),
            ),
            ("y",),
            _check_linear,
            (Attr("relu", bool, default=False), _ENGINE),
        ),
        OpSpec(
            "linear_dynamic",
            "float32 x quantized per call, int8 or float16 weight -> float32",
            (Port("x", _F32), *_dynamic_weight_ports()),
            ("y",),
            _check_linear_dynamic,
            (_REDUCE_RANGE, _ENGINE, _ACTIVATION),
        ),
        OpSpec(
            "linear_float",
            "float32 linear y = x @ weight.T + bias: a layer the converter's rules keep in float",
            (
                Port("x", _F32),
                Port("weight", _F32, const=True, packed=True),
                Port("bias", _F32, optional=True, const=True),
            ),
            ("y",),
            _check_linear_float,
        ),
        *(
            OpSpec(
                f"{kind}_cell_{family}",
                f"one {kind.upper()} step in torch's gate order, {linears}: {doc}",
                (
                    Port("x", _F32),
                    *(Port(s, _F32) for s in states),
                    *weight_ports("ih_"),
                    *weight_ports("hh_"),
                ),
                tuple(f"{s}_next" for s in states),
                _check_cell(gates, states),
                attrs + family_attrs,
            )
            for family, weight_ports, family_attrs, linears in _RECURRENT_FAMILIES
            for kind, gates, states, attrs, doc in _RECURRENT
        ),
        *(
            OpSpec(
                f"{kind}_{family}",
                f"a whole {kind.upper()} sequence: num_layers, optional bidirectional, time loop compiled"
                + ("" if family == "dynamic" else f"; {linears}"),
                (
                    Port("x", _F32),
                    *(Port(f"{s}0", _F32, optional=True) for s in states),
                    *(
                        port
                        for n in range(MAX_LAYERS)
                        for reverse in (False, True)
                        for side in ("ih_", "hh_")
                        for port in weight_ports(layer_prefix(n, reverse) + side, optional=True)
                    ),
                ),
                ("y",) + tuple(f"{s}_n" for s in states),
                _check_sequence(gates, states),
                attrs + _SEQUENCE_ATTRS + family_attrs,
            )
            for family, weight_ports, family_attrs, linears in _RECURRENT_FAMILIES
            for kind, gates, states, attrs, doc in _RECURRENT
        ),
        OpSpec(
            "flatten",
            "merge dimensions start_dim..end_dim into one, as torch.flatten(x, start_dim, end_dim)",
            (Port("x", ("float32", "uint8", "int8", "int32", "int64")),),
            ("y",),
            _check_flatten,
            (Attr("start_dim", int, default=1), Attr("end_dim", (int, type(None)), default=None)),
        ),
    )
}


# ---- tensor ops
# Shape and data-movement ops (helper A1): they move values and compute none, so any run-time dtype
# passes through unchanged.

MAX_RANK = 8  # of a model input (graph.py), and of every value the tensor ops make
MAX_DIM = 2**63 - 1  # the largest dimension of a model input: what an int64 (numpy, a C reader) holds
MAX_STACKED = 16  # cat and stack take x0 .. x15
_ANY = ("float32", "uint8", "int8", "int32", "int64", "bool")


def _ints(name: str, value: list) -> list[int]:
    """A list attribute's entries, each an integer (JSON true/false are not)."""
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool):
            _fail(f"attribute {name!r} must be a list of integers, got {v!r:.40} in it")
    return value


def _dim_of(name: str, dim: int, rank: int) -> None:
    if not 0 <= dim < rank:
        _fail(f"{name} {dim} is out of range for x of rank {rank}")


def _rank_fits(rank: int) -> None:
    if rank > MAX_RANK:
        _fail(f"the output would have rank {rank}, more than the maximum of {MAX_RANK}")


def slice_length(size: int, start: int, end: int | None, step: int) -> int:
    """How many elements x[start:end:step] keeps of a dimension of this size (Python's clamping)."""
    return len(range(*slice(start, end, step).indices(size)))


def _check_select(ins, consts, attrs):
    x, dim, index = ins["x"], attrs["dim"], attrs["index"]
    _dim_of("dim", dim, len(x.shape))
    size = x.shape[dim]
    if size is not None and not -size <= index < size:
        _fail(f"index {index} is out of range for dimension {dim} of x, of size {size}")
    return [ValueInfo(x.dtype, x.shape[:dim] + x.shape[dim + 1 :])]


def _check_slice(ins, consts, attrs):
    x, dim, step = ins["x"], attrs["dim"], attrs["step"]
    _dim_of("dim", dim, len(x.shape))
    if step < 1:
        _fail(f"step must be >= 1, got {step}")
    size = x.shape[dim]
    length = None if size is None else slice_length(size, attrs["start"], attrs["end"], step)
    return [ValueInfo(x.dtype, x.shape[:dim] + (length,) + x.shape[dim + 1 :])]


def _stacked_inputs(ins) -> list[ValueInfo]:
    """x0, x1, ... in order: no gaps, one dtype, one rank."""
    xs = [ins[f"x{i}"] for i in range(len(ins)) if f"x{i}" in ins]
    if len(xs) != len(ins):
        _fail(f"inputs must be x0, x1, ... without gaps, got {sorted(ins, key=lambda p: int(p[1:]))}")
    for i, x in enumerate(xs[1:], 1):
        if x.dtype != xs[0].dtype or len(x.shape) != len(xs[0].shape):
            _fail(f"x{i} is {x.describe()} but x0 is {xs[0].describe()}: dtypes and ranks must agree")
    return xs


def _agree(xs: list[ValueInfo], axis: int) -> int | None:
    """The size every input has at axis: the known one (None if all are free); known sizes must agree."""
    size = None
    for i, x in enumerate(xs):
        d = x.shape[axis]
        if d is not None and size is not None and d != size:
            _fail(f"x{i} has size {d} at dimension {axis} where an earlier input has {size}")
        size = d if d is not None else size
    return size


def _check_cat(ins, consts, attrs):
    xs, dim = _stacked_inputs(ins), attrs["dim"]
    rank = len(xs[0].shape)
    _dim_of("dim", dim, rank)
    along = [x.shape[dim] for x in xs]
    shape = [_agree(xs, a) if a != dim else (None if None in along else sum(along)) for a in range(rank)]
    return [ValueInfo(xs[0].dtype, tuple(shape))]


def _check_stack(ins, consts, attrs):
    xs, dim = _stacked_inputs(ins), attrs["dim"]
    rank = len(xs[0].shape)
    if not 0 <= dim <= rank:
        _fail(f"dim {dim} is out of range [0, {rank}] for inputs of rank {rank}")
    _rank_fits(rank + 1)
    shape = tuple(_agree(xs, a) for a in range(rank))
    return [ValueInfo(xs[0].dtype, shape[:dim] + (len(xs),) + shape[dim:])]


def reshaped(in_shape: Shape, shape: list[int], like: Mapping[int, int | None] | None = None) -> Shape | None:
    """reshape's output shape (None entries where it depends on a free dimension), or None if x cannot
    take that shape.

    0 copies x's size at the same position, -1 is inferred; like maps positions to the sizes another value
    gives them (None: free), in place of shape's entries there. Free dimensions of x that a 0 copies cancel
    on both sides, so [?, 6] -> [0, 4] is refused at load and [?, 6] -> [0, -1] gives [?, 6].
    """
    like = like or {}
    copied = {i for i, s in enumerate(shape) if i not in like and s == 0 and in_shape[i] is None}
    inferred = {i for i, s in enumerate(shape) if i not in like and s == -1}
    rest = [d for i, d in enumerate(in_shape) if i not in copied]
    out = [like[i] if i in like else in_shape[i] if s == 0 else s for i, s in enumerate(shape)]
    if None in rest or None in like.values():
        return tuple(None if i in inferred else d for i, d in enumerate(out))
    known = math.prod(d for i, d in enumerate(out) if i not in copied and i not in inferred)
    total = math.prod(rest)
    if not inferred:
        return tuple(out) if known == total else None
    if known == 0 or total % known:
        return None
    return tuple(total // known if i in inferred else d for i, d in enumerate(out))


def like_sizes(like_dims: list, like_shape: Shape) -> dict[int, int | None]:
    """Output position -> the size of like's dimension that like_dims names there (expand's and reshape's)."""
    return {i: like_shape[d] for i, d in enumerate(like_dims) if d is not None}


def reshape_target(shape: list[int], like: dict[int, int | None]) -> str:
    """A reshape's target for a message: shape with like's sizes in place (? where free, at load)."""
    return "[" + ", ".join("?" if like.get(i, s) is None else str(like.get(i, s)) for i, s in enumerate(shape)) + "]"


def _check_like_dims(shape: list[int], like_dims: list, like: ValueInfo | None) -> dict[int, int | None]:
    if (like is None) != (not like_dims):
        _fail("like_dims and the input like go together")
    if like_dims and len(like_dims) != len(shape):
        _fail(f"like_dims must have one entry per shape entry ({len(shape)}), got {len(like_dims)}")
    for d in like_dims:
        if d is not None:
            if not isinstance(d, int) or isinstance(d, bool):
                _fail(f"like_dims entries must be integers or null, got {d!r:.40}")
            _dim_of("like_dims entry", d, len(like.shape))
    return like_sizes(like_dims, like.shape) if like_dims else {}


def _check_reshape(ins, consts, attrs):
    x, shape = ins["x"], _ints("shape", attrs["shape"])
    _rank_fits(len(shape))
    like = _check_like_dims(shape, attrs["like_dims"], ins.get("like"))
    for i, s in enumerate(shape):
        if not -1 <= s <= MAX_DIM:
            _fail(f"shape entries must be sizes >= 1, 0 (x's size there) or -1 (inferred), got {s}")
        if s == 0 and i >= len(x.shape) and i not in like:
            _fail(f"shape[{i}] is 0 (x's size there) but x has rank {len(x.shape)}")
    if sum(s == -1 for i, s in enumerate(shape) if i not in like) > 1:
        _fail(f"shape may infer (-1) at most one dimension, got {shape}")
    out = reshaped(x.shape, shape, like)
    if out is None:
        _fail(f"x {x.describe()} cannot be reshaped to {reshape_target(shape, like)}")
    return [ValueInfo(x.dtype, out)]


def _check_permute(ins, consts, attrs):
    x, perm = ins["x"], _ints("perm", attrs["perm"])
    if sorted(perm) != list(range(len(x.shape))):
        _fail(f"perm must be a permutation of 0 .. {len(x.shape) - 1} (x has rank {len(x.shape)}), got {perm}")
    return [ValueInfo(x.dtype, tuple(x.shape[p] for p in perm))]


def _check_squeeze(ins, consts, attrs):
    x, dims = ins["x"], _ints("dims", attrs["dims"])
    for d in dims:
        _dim_of("dims entry", d, len(x.shape))
        if x.shape[d] not in (1, None):
            _fail(f"dimension {d} of x has size {x.shape[d]}; squeeze removes only size-1 dimensions")
    if len(set(dims)) != len(dims):
        _fail(f"dims names a dimension twice: {dims}")
    return [ValueInfo(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in dims))]


def _check_unsqueeze(ins, consts, attrs):
    x, dim = ins["x"], attrs["dim"]
    if not 0 <= dim <= len(x.shape):
        _fail(f"dim {dim} is out of range [0, {len(x.shape)}] for x of rank {len(x.shape)}")
    _rank_fits(len(x.shape) + 1)
    return [ValueInfo(x.dtype, x.shape[:dim] + (1,) + x.shape[dim:])]


_DIM = Attr("dim", int, required=True)
_STACKED_PORTS = (Port("x0", _ANY), *(Port(f"x{i}", _ANY, optional=True) for i in range(1, MAX_STACKED)))

OPS.update(
    (op.name, op)
    for op in (
        OpSpec(
            "select",
            "x indexed at index along dim, which disappears, as torch.select (a negative index counts from the end)",
            (Port("x", _ANY),),
            ("y",),
            _check_select,
            (_DIM, Attr("index", int, required=True)),
        ),
        OpSpec(
            "slice",
            "x[start:end:step] along dim, clamped as Python slices are (torch slicing, narrow)",
            (Port("x", _ANY),),
            ("y",),
            _check_slice,
            (
                _DIM,
                Attr("start", int, default=0),
                Attr("end", (int, type(None)), default=None),
                Attr("step", int, default=1),
            ),
        ),
        OpSpec("cat", "x0, x1, ... joined along dim, as torch.cat", _STACKED_PORTS, ("y",), _check_cat, (_DIM,)),
        OpSpec(
            "stack", "x0, x1, ... stacked along a new dim, as torch.stack", _STACKED_PORTS, ("y",), _check_stack,
            (_DIM,),
        ),
        OpSpec(
            "reshape",
            "x in a new shape, C order; 0 keeps x's size at that position, -1 is inferred (ONNX Reshape); where "
            "like_dims names a dimension of like, like's size",
            (Port("x", _ANY), Port("like", _ANY, optional=True, shape_only=True)),
            ("y",),
            _check_reshape,
            (Attr("shape", list, required=True), Attr("like_dims", list, default=[])),
        ),
        OpSpec(
            "permute",
            "x with its dimensions reordered, as torch.permute",
            (Port("x", _ANY),),
            ("y",),
            _check_permute,
            (Attr("perm", list, required=True),),
        ),
        OpSpec(
            "squeeze",
            "x without the listed size-1 dimensions, as torch.squeeze(x, dims)",
            (Port("x", _ANY),),
            ("y",),
            _check_squeeze,
            (Attr("dims", list, required=True),),
        ),
        OpSpec(
            "unsqueeze",
            "x with a new size-1 dimension at dim, as torch.unsqueeze",
            (Port("x", _ANY),),
            ("y",),
            _check_unsqueeze,
            (_DIM,),
        ),
    )
)


# ---- embedding
# Table lookups (helper A1): float32 rows, or rows quantized to 8 or 4 bits with a scale and bias per row,
# dequantized as fbgemm does (docs/FORMAT.md, docs/NUMERICS.md).

_INDEX = ("int32", "int64")
# bits -> (weight dtype, scale and bias dtype): torch's prepacked tables hold 4-bit rows' scale and bias in float16
_TABLE_DTYPES = {32: ("float32", None), 8: ("uint8", "float32"), 4: ("uint8", "float16")}
EMBEDDING_MODES = ("sum", "mean", "max")


def _check_table(ins, consts, attrs) -> tuple[int, int]:
    """Check weight, weight_scale, weight_bias against bits and dim; return (rows, embedding width)."""
    w, bits, dim = ins["weight"], attrs["bits"], attrs["dim"]
    if len(w.shape) != 2:
        _fail(f"weight must be 2-D [num_embeddings, columns], got {w.describe()}")
    num, cols = w.shape
    if num == 0:
        _fail("weight must have at least one row")  # no index could be valid
    w_dtype, q_dtype = _TABLE_DTYPES[bits]
    if w.dtype != w_dtype:
        _fail(f"bits {bits} needs a {w_dtype} weight, got {w.describe()}")
    for port in ("weight_scale", "weight_bias"):
        info = ins.get(port)
        if q_dtype is None and info is not None:
            _fail(f"a float32 table (bits 32) takes no {port}")
        if q_dtype is not None and info is None:
            _fail(f"bits {bits} needs {port}")
        if q_dtype is not None and (info.dtype != q_dtype or info.shape != (num,)):
            _fail(f"{port} must be {q_dtype}[{num}] for bits {bits}, got {info.describe()}")
    if bits == 4:
        if dim is None:
            _fail("bits 4 needs attribute 'dim' (two 4-bit values share a byte)")
        if dim < 0 or (dim + 1) // 2 != cols:
            _fail(f"dim {dim} needs ceil(dim / 2) = {max(dim + 1, 0) // 2} bytes per row, the weight has {cols}")
        return num, dim
    if dim is not None and dim != cols:
        _fail(f"dim {dim} disagrees with the weight's {cols} columns")
    return num, cols


def _index_values(consts, num: int) -> None:
    """Stored indices are checked now rather than at every run."""
    t = consts.get("indices")
    if t is not None and t.size and (int(t.min()) < 0 or int(t.max()) >= num):
        _fail(f"indices must lie in [0, {num}), got {t.ravel()[:8].tolist()}")


def _check_embedding(ins, consts, attrs):
    num, dim = _check_table(ins, consts, attrs)
    idx = ins["indices"]
    _rank_fits(len(idx.shape) + 1)
    _index_values(consts, num)
    return [ValueInfo("float32", idx.shape + (dim,))]


def _check_embedding_bag(ins, consts, attrs):
    num, dim = _check_table(ins, consts, attrs)
    idx, offsets = ins["indices"], ins.get("offsets")
    if offsets is None:
        if len(idx.shape) != 2:
            _fail(f"indices must be 2-D [bags, indices per bag] when there are no offsets, got {idx.describe()}")
        bags = idx.shape[0]
    else:
        if len(idx.shape) != 1 or len(offsets.shape) != 1:
            _fail(f"indices and offsets must be 1-D, got {idx.describe()} and {offsets.describe()}")
        bags = offsets.shape[0]
        o = consts.get("offsets")
        if o is not None and o.size:
            o = o.astype(np.int64)
            if o[0] != 0 or np.any(o[1:] < o[:-1]) or (idx.shape[0] is not None and o[-1] > idx.shape[0]):
                _fail(f"offsets must start at 0, never decrease and stay within the indices, got {o[:8].tolist()}")
    _index_values(consts, num)
    return [ValueInfo("float32", (bags, dim))]


_TABLE_PORTS = (
    Port("weight", ("float32", "uint8"), const=True),
    Port("weight_scale", ("float32", "float16"), optional=True, const=True),
    Port("weight_bias", ("float32", "float16"), optional=True, const=True),
)
_TABLE_ATTRS = (Attr("bits", int, default=32, choices=(32, 8, 4)), Attr("dim", (int, type(None)), default=None))

OPS.update(
    (op.name, op)
    for op in (
        OpSpec(
            "embedding",
            "rows of a float32, 8-bit or 4-bit table, as nn.Embedding and torch.ao.nn.quantized.Embedding",
            (Port("indices", _INDEX), *_TABLE_PORTS),
            ("y",),
            _check_embedding,
            _TABLE_ATTRS,
        ),
        OpSpec(
            "embedding_bag",
            "sums, means or maxima of bags of table rows, as nn.EmbeddingBag and its quantized form",
            (Port("indices", _INDEX), Port("offsets", _INDEX, optional=True), *_TABLE_PORTS),
            ("y",),
            _check_embedding_bag,
            _TABLE_ATTRS + (Attr("mode", str, default="mean", choices=EMBEDDING_MODES),),
        ),
    )
)


# ---- matrix product and attention
# Float32 batched products and torch's scaled_dot_product_attention as one fused op (qrt/kernels/attention_body.h):
# each output a fixed fma chain, so every CPU and build gives the same bits (docs/NUMERICS.md, "Matrix product and
# attention"). Batch dimensions broadcast as numpy's; a free dimension is checked when the model runs.


def _broadcast_batch(named: Mapping[str, tuple]) -> tuple:
    """numpy's broadcast of the named batch shapes (aligned at the right): a free dimension against 1 stays free;
    against n it becomes n, and against another free one stays free (the run checks the actual sizes)."""
    rank = max(len(b) for b in named.values())
    out = []
    for i in range(rank):
        size: Any = 1
        for batch in named.values():
            d = batch[i - rank + len(batch)] if i >= rank - len(batch) else 1
            if d == 1:
                continue
            if size == 1 or size is None:
                size = d if d is not None or size == 1 else size
            elif d is not None and d != size:
                described = ", ".join(f"{n} {list(b)}" for n, b in named.items())
                _fail(f"batch dimensions {described} do not broadcast: {size} against {d} at dimension {i}")
        out.append(size)
    return tuple(out)


def _finite_float32(v: float) -> bool:
    """v (a JSON number: a float or an int within 64 bits) rounds to a finite float32, as the kernels take it."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(float(v))))


def _matrices(ins, names: tuple[str, ...]) -> None:
    for name in names:
        _rank_at_least(name, ins[name], 2)


def _check_matmul(ins, consts, attrs):
    a, b = ins["a"], ins["b"]
    _matrices(ins, ("a", "b"))
    if None not in (a.shape[-1], b.shape[-2]) and a.shape[-1] != b.shape[-2]:
        _fail(f"a {a.describe()} and b {b.describe()} do not multiply: a has {a.shape[-1]} columns, b "
              f"{b.shape[-2]} rows")
    batch = _broadcast_batch({"a": a.shape[:-2], "b": b.shape[:-2]})
    return [ValueInfo("float32", batch + (a.shape[-2], b.shape[-1]))]


def _check_attention(ins, consts, attrs):
    q, k, v, mask = ins["q"], ins["k"], ins["v"], ins.get("mask")
    _matrices(ins, ("q", "k", "v"))
    if None not in (q.shape[-1], k.shape[-1]) and q.shape[-1] != k.shape[-1]:
        _fail(f"q {q.describe()} and k {k.describe()} must have the same last dimension (E)")
    if None not in (k.shape[-2], v.shape[-2]) and k.shape[-2] != v.shape[-2]:
        _fail(f"k {k.describe()} and v {v.describe()} must have the same number of keys (dimension -2)")
    batch = _broadcast_batch({"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]})
    scale = attrs["scale"]
    if scale is not None and not _finite_float32(scale):
        _fail(f"scale must be null or finite in float32, got {scale!r:.40}")
    if mask is not None:
        if attrs["is_causal"]:
            _fail("is_causal takes no mask (as torch: an explicit mask with is_causal is refused)")
        scores = batch + (q.shape[-2], k.shape[-2])
        if len(mask.shape) > len(scores):
            _fail(f"mask {mask.describe()} has a higher rank than the scores {ValueInfo('', scores).describe()}")
        for i, (d, want) in enumerate(zip(mask.shape, scores[len(scores) - len(mask.shape):])):
            if d not in (1, None) and want is not None and d != want:
                _fail(f"mask {mask.describe()} does not broadcast to the scores {ValueInfo('', scores).describe()}: "
                      f"{d} against {want} at its dimension {i}")
    return [ValueInfo("float32", batch + (q.shape[-2], v.shape[-1]))]


OPS.update(
    (op.name, op)
    for op in (
        OpSpec(
            "matmul",
            "float32 a @ b over the last two dimensions, batch dimensions broadcast, as torch.matmul of matrices",
            (Port("a", _F32), Port("b", _F32)),
            ("y",),
            _check_matmul,
        ),
        OpSpec(
            "attention",
            "float32 softmax(scale q k^T + mask) v in one op, as torch.nn.functional.scaled_dot_product_attention",
            (Port("q", _F32), Port("k", _F32), Port("v", _F32), Port("mask", ("bool", "float32"), optional=True)),
            ("y",),
            _check_attention,
            (Attr("scale", (float, int, type(None)), default=None), Attr("is_causal", bool, default=False)),
        ),
    )
)


# ---- float math
# Float32 relu, functions, reductions and arithmetic (helper A2). The kernels (qrt/kernels/float_ops_body.h)
# run one fixed sequence of IEEE operations, so every CPU and build gives the same bits
# (docs/NUMERICS.md, "Float math ops").

_UNARY_FLOAT = {
    "sigmoid": "1 / (1 + exp(-x)), the recurrent gates' function",
    "tanh": "tanh(x), the recurrent gates' function",
    "silu": "x * sigmoid(x), as torch.nn.functional.silu",
    "sqrt": "sqrt(x), correctly rounded (IEEE)",
    "rsqrt": "1 / sqrt(x), each step correctly rounded, as torch.rsqrt",
    "log": "the natural logarithm, msun's logf (within 1 ulp of torch.log; -inf at 0, NaN below)",
    "sin": "sin(x), correctly rounded but within about 2^-40 of halfway between floats (rotary embeddings)",
    "cos": "cos(x), correctly rounded but within about 2^-40 of halfway between floats (rotary embeddings)",
    "ceil": "the least integer not below x, exact (DeBERTa's position buckets); -0.0 for -1 < x < 0",
    "floor": "the greatest integer not above x, exact",
}
_BINARY_FLOAT = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}


def _check_float_map(ins, consts, attrs):
    return [ValueInfo("float32", ins["x"].shape)]


def _check_softmax(ins, consts, attrs):
    _dim_of("dim", attrs["dim"], len(ins["x"].shape))
    return [ValueInfo("float32", ins["x"].shape)]


def _check_layer_norm(ins, consts, attrs):
    x, k, eps = ins["x"], attrs["normalized_dims"], attrs["eps"]
    if not 1 <= k <= len(x.shape):
        _fail(f"normalized_dims must lie in [1, {len(x.shape)}] (the rank of x), got {k}")
    if not (_finite_float32(eps) and eps >= 0):  # the kernels add fl(eps) to the variance
        _fail(f"eps must be a finite float32 value >= 0, got {eps!r:.40}")
    tail = x.shape[len(x.shape) - k :]
    for port in ("weight", "bias"):
        t = ins.get(port)
        if t is not None and (
            len(t.shape) != k or any(d is not None and d != w for d, w in zip(tail, t.shape))
        ):
            _fail(f"{port} must have the shape of x's last {k} dimension(s), {ValueInfo('', tail).describe()}, "
                  f"got {t.describe()}")
    w, b = ins.get("weight"), ins.get("bias")
    if w is not None and b is not None and w.shape != b.shape:  # x's free dims would let them disagree
        _fail(f"weight and bias must have the same shape, got {w.describe()} and {b.describe()}")
    return [ValueInfo("float32", x.shape)]


def _check_batch_norm(ins, consts, attrs):
    x, eps = ins["x"], attrs["eps"]
    if len(x.shape) < 2:
        _fail(f"x must have a batch and a channel dimension (rank 2 or more), got {x.describe()}")
    if not (_finite_float32(eps) and eps >= 0):  # the kernels add fl(eps) to the variance
        _fail(f"eps must be a finite float32 value >= 0, got {eps!r:.40}")
    for port in ("mean", "var", "weight", "bias"):
        t = ins[port]
        if len(t.shape) != 1 or x.shape[1] not in (None, t.shape[0]):
            _fail(f"{port} must have one value per channel of x (dimension 1), float32[{x.shape[1]}], "
                  f"got {t.describe()}")
    if len({ins[p].shape for p in ("mean", "var", "weight", "bias")}) != 1:  # x's channels may be free
        _fail("mean, var, weight and bias must have the same shape, got "
              + ", ".join(ins[p].describe() for p in ("mean", "var", "weight", "bias")))
    return [ValueInfo("float32", x.shape)]


def _check_reduce(ins, consts, attrs):
    x, dims = ins["x"], _ints("dims", attrs["dims"])
    if not dims:
        _fail("dims must name at least one dimension")
    for d in dims:
        _dim_of("dims entry", d, len(x.shape))
    if len(set(dims)) != len(dims):
        _fail(f"dims must not repeat a dimension, got {dims}")
    if attrs["keepdim"]:
        return [ValueInfo("float32", tuple(1 if i in dims else s for i, s in enumerate(x.shape)))]
    return [ValueInfo("float32", tuple(s for i, s in enumerate(x.shape) if i not in dims))]


def broadcast_infos(a: ValueInfo, b: ValueInfo, names: tuple[str, str] = ("a", "b")) -> Shape:
    """numpy broadcasting, shapes aligned at the right. A free dimension against 1 stays free; against n it
    becomes n, and against another free one stays free: the run checks the actual sizes."""
    rank = max(len(a.shape), len(b.shape))
    out = []
    for i, (p, q) in enumerate(
        zip((1,) * (rank - len(a.shape)) + a.shape, (1,) * (rank - len(b.shape)) + b.shape)
    ):
        if p == 1 or p is None:
            out.append(q if q != 1 else p)
        elif q in (1, None, p):
            out.append(p)
        else:
            _fail(f"{names[0]} {a.describe()} and {names[1]} {b.describe()} do not broadcast: {p} against {q} "
                  f"at dimension {i}")
    return tuple(out)


def _check_broadcast(ins, consts, attrs):
    return [ValueInfo("float32", broadcast_infos(ins["a"], ins["b"]))]


_X_F32 = (Port("x", _F32),)

OPS.update(
    (op.name, op)
    for op in (
        OpSpec("relu", "float32 0 where x < 0, else x (NaN and -0.0 kept), as torch.relu", _X_F32, ("y",),
               _check_float_map),
        *(OpSpec(name, f"float32 {doc}", _X_F32, ("y",), _check_float_map) for name, doc in _UNARY_FLOAT.items()),
        OpSpec(
            "gelu",
            "float32 x * Phi(x) (approximate 'none'), or torch's tanh approximation (approximate 'tanh')",
            _X_F32,
            ("y",),
            _check_float_map,
            (Attr("approximate", str, default="none", choices=("none", "tanh")),),
        ),
        OpSpec("softmax", "float32 softmax along dim", _X_F32, ("y",), _check_softmax, (_DIM,)),
        OpSpec("log_softmax", "float32 log(softmax) along dim", _X_F32, ("y",), _check_softmax, (_DIM,)),
        OpSpec(
            "layer_norm",
            "float32 layer normalisation over the last normalized_dims dimensions, as torch's layer_norm",
            (*_X_F32, Port("weight", _F32, optional=True, const=True), Port("bias", _F32, optional=True, const=True)),
            ("y",),
            _check_layer_norm,
            (Attr("normalized_dims", int, default=1), Attr("eps", (float, int), default=1e-5)),
        ),
        OpSpec(
            "batch_norm",
            "float32 batch normalisation in inference, per channel (dimension 1) of x, as torch's CPU kernels: "
            "fma(x, alpha, beta), alpha = 1 / sqrt(var + eps) * weight, beta = fma(-mean, alpha, bias)",
            (*_X_F32, *(Port(name, _F32, const=True) for name in ("mean", "var", "weight", "bias"))),
            ("y",),
            _check_batch_norm,
            (Attr("eps", (float, int), default=1e-5),),
        ),
        *(
            OpSpec(
                name,
                f"float32 {name} over the listed dimensions, as torch.{name}(x, dims, keepdim)",
                _X_F32,
                ("y",),
                _check_reduce,
                (Attr("dims", list, required=True), Attr("keepdim", bool, default=False)),
            )
            for name in ("sum", "mean")
        ),
        OpSpec(
            "amax",
            "float32 maximum over the listed dimensions, as torch.amax(x, dims, keepdim): NaN where any is, else the "
            "first maximum in index order",
            _X_F32,
            ("y",),
            _check_reduce,
            (Attr("dims", list, required=True), Attr("keepdim", bool, default=False)),
        ),
        *(
            OpSpec(name, f"float32 {doc} with numpy broadcasting", (Port("a", _F32), Port("b", _F32)), ("y",),
                   _check_broadcast)
            for name, doc in _BINARY_FLOAT.items()
        ),
    )
)


# ---- comparisons, masks and casts
# What attention masks, positions and pooling are made of: comparisons and logic giving bool, where, cast,
# clamp, integer arithmetic and running sums, and shape-following ops (arange over a dimension, expand,
# index_select, gather). All exact: comparisons, min / max, selections and conversions round at most once, as
# IEEE and C define them; integer arithmetic wraps modulo 2**bits (docs/NUMERICS.md).

COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
CAST_DTYPES = ("float32", "int32", "int64", "bool")
# integer tensors' arithmetic (positions counted over a mask, as RoBERTa's): exact modulo 2**bits, an op of
# its own (add_int, ...) rather than add on integers, since the two round differently
INTEGER_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*"}
_INTS = ("int32", "int64")
_COMPARABLE = ("float32", "int32", "int64", "bool")
_BOOL = ("bool",)


def _dtype_class(dtype: str) -> str:
    return "integer" if dtype in _INTS else dtype


def _check_compare(ins, consts, attrs):
    a, b = ins["a"], ins["b"]
    if _dtype_class(a.dtype) != _dtype_class(b.dtype):
        _fail(f"a {a.describe()} and b {b.describe()} must both be float32, both integers or both bool")
    return [ValueInfo("bool", broadcast_infos(a, b))]


def _check_logical(ins, consts, attrs):
    return [ValueInfo("bool", broadcast_infos(ins["a"], ins["b"]))]


def _check_logical_not(ins, consts, attrs):
    return [ValueInfo("bool", ins["x"].shape)]


def _check_where(ins, consts, attrs):
    cond, a, b = ins["condition"], ins["a"], ins["b"]
    if a.dtype != b.dtype:
        _fail(f"a {a.describe()} and b {b.describe()} must have one dtype")
    shape = broadcast_infos(a, b)
    return [ValueInfo(a.dtype, broadcast_infos(cond, ValueInfo(a.dtype, shape), ("condition", "a and b")))]


def _check_cast(ins, consts, attrs):
    return [ValueInfo(attrs["dtype"], ins["x"].shape)]


def _check_clamp(ins, consts, attrs):
    lo, hi = attrs["min"], attrs["max"]
    if lo is None and hi is None:
        _fail("clamp needs min, max or both")
    for name in ("min", "max"):
        v = attrs[name]
        if v is not None and (not _finite_float32(v) or float(np.float32(v)) != v):
            _fail(f"{name} must be a finite float32 value, got {v!r:.40}")
    return [ValueInfo("float32", ins["x"].shape)]


def _check_arange(ins, consts, attrs):
    x = ins["x"]
    _dim_of("dim", attrs["dim"], len(x.shape))
    return [ValueInfo("int64", (x.shape[attrs["dim"]],))]


def _check_expand(ins, consts, attrs):
    x, shape = ins["x"], _ints("shape", attrs["shape"])
    _rank_fits(len(shape))
    if len(shape) < len(x.shape):
        _fail(f"shape {shape} has fewer dimensions than x {x.describe()}")
    like = _check_like_dims(shape, attrs["like_dims"], ins.get("like"))
    lead = len(shape) - len(x.shape)
    out = []
    for i, s in enumerate(shape):
        if not -1 <= s <= MAX_DIM:
            _fail(f"shape entries must be sizes >= 0 or -1 (x's size), got {s}")
        if i in like:
            size = like[i]
        elif s == -1:
            if i < lead:
                _fail(f"shape[{i}] is -1 (x's size) where x has no dimension")
            size = x.shape[i - lead]
        else:
            size = s
        have = x.shape[i - lead] if i >= lead else 1
        if have not in (1, None) and size is not None and have != size:
            _fail(f"x {x.describe()} cannot be expanded to size {size} at dimension {i}")
        out.append(size)
    return [ValueInfo(x.dtype, tuple(out))]


def _check_index_select(ins, consts, attrs):
    x, index, dim = ins["x"], ins["index"], attrs["dim"]
    _dim_of("dim", dim, len(x.shape))
    if len(index.shape) != 1:
        _fail(f"index must be 1-D, got {index.describe()}")
    _index_bounds(consts, x.shape[dim])
    return [ValueInfo(x.dtype, x.shape[:dim] + index.shape + x.shape[dim + 1 :])]


def _check_gather(ins, consts, attrs):
    x, index, dim = ins["x"], ins["index"], attrs["dim"]
    _dim_of("dim", dim, len(x.shape))
    if len(index.shape) != len(x.shape):
        _fail(f"index {index.describe()} must have the rank of x {x.describe()}")
    for d, (i, n) in enumerate(zip(index.shape, x.shape)):
        if d != dim and None not in (i, n) and i > n:
            _fail(f"index {index.describe()} is larger than x {x.describe()} at dimension {d}")
    _index_bounds(consts, x.shape[dim])
    return [ValueInfo(x.dtype, index.shape)]


def integer_arithmetic_dtype(a: str, b: str) -> str:
    """The dtype add_int, sub_int and mul_int compute and return: int64 if either operand is, else int32."""
    return "int64" if "int64" in (a, b) else "int32"


def _check_integer_arithmetic(ins, consts, attrs):
    a, b = ins["a"], ins["b"]
    return [ValueInfo(integer_arithmetic_dtype(a.dtype, b.dtype), broadcast_infos(a, b))]


def _check_cumsum(ins, consts, attrs):
    x = ins["x"]
    _dim_of("dim", attrs["dim"], len(x.shape))
    return [ValueInfo("int64", x.shape)]


def _index_bounds(consts, size) -> None:
    """A stored index is checked now: [0, size) (a free size: at run time)."""
    t = consts.get("index")
    if t is not None and t.size and (int(t.min()) < 0 or (size is not None and int(t.max()) >= size)):
        _fail(f"index must lie in [0, {size}), got {t.ravel()[:8].tolist()}")


OPS.update(
    (op.name, op)
    for op in (
        *(
            OpSpec(name, f"bool a {sym} b with numpy broadcasting; a and b both float32 (IEEE: NaN is unequal to "
                   "all), both integers (compared exactly) or both bool",
                   (Port("a", _COMPARABLE), Port("b", _COMPARABLE)), ("y",), _check_compare)
            for name, sym in COMPARISONS.items()
        ),
        *(
            OpSpec(f"logical_{name}", f"bool a {name} b with numpy broadcasting", (Port("a", _BOOL), Port("b", _BOOL)),
                   ("y",), _check_logical)
            for name in ("and", "or")
        ),
        OpSpec("logical_not", "bool not x", (Port("x", _BOOL),), ("y",), _check_logical_not),
        OpSpec(
            "where",
            "a where condition else b, the three broadcast together, as torch.where",
            (Port("condition", _BOOL), Port("a", _ANY), Port("b", _ANY)),
            ("y",),
            _check_where,
        ),
        OpSpec(
            "cast",
            "x converted to dtype as torch's .to(dtype): float to integer truncates, to bool is x != 0",
            (Port("x", _ANY),),
            ("y",),
            _check_cast,
            (Attr("dtype", str, choices=CAST_DTYPES, required=True),),
        ),
        OpSpec(
            "clamp",
            "float32 min(max(x, min), max) (either bound may be null), NaN kept, as torch.clamp",
            _X_F32,
            ("y",),
            _check_clamp,
            (Attr("min", (float, int, type(None)), default=None), Attr("max", (float, int, type(None)), default=None)),
        ),
        OpSpec(
            "arange",
            "int64 0, 1, ..., n - 1, n the size of x's dimension dim (a size fixed only at run time)",
            (Port("x", _ANY, shape_only=True),),
            ("y",),
            _check_arange,
            (_DIM,),
        ),
        OpSpec(
            "expand",
            "x broadcast to shape (-1 keeps x's size; where like_dims names a dimension of like, like's size)",
            (Port("x", _ANY), Port("like", _ANY, optional=True, shape_only=True)),
            ("y",),
            _check_expand,
            (Attr("shape", list, required=True), Attr("like_dims", list, default=[])),
        ),
        *(
            OpSpec(f"{name}_int", f"a {sym} b modulo 2**bits (two's complement, as torch's integer tensors) with "
                   "numpy broadcasting: int64 if a or b is (the other widened first), else int32",
                   (Port("a", _INTS), Port("b", _INTS)), ("y",), _check_integer_arithmetic)
            for name, sym in INTEGER_ARITHMETIC.items()
        ),
        OpSpec(
            "cumsum",
            "int64 running sums of x along dim, modulo 2**64, as torch.cumsum of an integer or bool tensor",
            (Port("x", (*_INTS, "bool")),),
            ("y",),
            _check_cumsum,
            (_DIM,),
        ),
        OpSpec(
            "index_select",
            "x's entries at index along dim, as torch.index_select (indices in [0, size))",
            (Port("x", _ANY), Port("index", _INTS)),
            ("y",),
            _check_index_select,
            (_DIM,),
        ),
        OpSpec(
            "gather",
            "y[..., i, ...] = x[..., index[..., i, ...], ...] along dim, as torch.gather (indices in [0, size))",
            (Port("x", _ANY), Port("index", _INTS)),
            ("y",),
            _check_gather,
            (_DIM,),
        ),
    )
)

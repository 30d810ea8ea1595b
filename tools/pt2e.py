"""pt2e's Q/DQ graphs (``prepare_pt2e`` / ``convert_pt2e``) as torch.ao's reference graph, for the lowering.

A pt2e program quantizes with ``quantized_decomposed`` ops around float ATen ops. The export front
end (tools/export_frontend.py) hands each of them here while it raises the ATen graph:

- static activations, ``quantize_per_tensor.default`` / ``dequantize_per_tensor.default``: uint8 0..255
  (x86) as they are, int8 -128..127 (XNNPACK, Arm) as uint8 with the zero point + 128, which gives
  the same integers minus the same zero point, so the same values;
- dynamic activations, ``choose_qparams.tensor`` + ``quantize_per_tensor.tensor`` +
  ``dequantize_per_tensor.tensor`` over 256 levels (uint8 or int8): qrt's ``linear_dynamic`` with
  ``reduce_range`` false (its own min/max qparams: docs/NUMERICS.md, section pt2e);
- int8 weights, ``dequantize_per_channel`` (axis 0) or ``dequantize_per_tensor`` of a constant: the
  integers, scales and zero points of a ``LinearLayer``;
- ``aten.linear`` on a dequantized input and a dequantized weight: a reference Linear (``QLinear``),
  with the ReLU after it fused when its output is quantized; a statically quantized input whose
  Linear's output stays float: a float Linear over the dequantized weight (``linear_float``), the
  float product the program computes.

Any other scheme (another range, per-channel activations, weights along another axis) is an error
naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from . import module_stack
from .layers import LinearLayer, QWeight
from .lower_ops import quantize_dynamic_8bit
from .lower_values import LoweringError
from .qrt_backend import quiet

if TYPE_CHECKING:
    from .export_frontend import _Raiser


def register_ops() -> None:
    """Registers the quantized_decomposed op library (a pt2e program loads only once it exists)."""
    with quiet():
        import torch.ao.quantization.fx._decomposed  # noqa: F401


def _ops() -> Any:
    register_ops()
    return torch.ops.quantized_decomposed


def handles(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.namespace == "quantized_decomposed"


@dataclass(frozen=True)
class Constant:
    """A parameter, buffer or constant of the program, not yet written into the raised graph."""

    name: str
    value: torch.Tensor


class Marker:
    """A value the raised graph does not hold: the front end keeps it aside for the op that reads it."""


@dataclass(frozen=True)
class WeightDQ(Marker):
    """A dequantized int8 weight: the integers as qrt stores them and the float values the program uses."""

    weight: QWeight
    dequantized: torch.Tensor

    def __str__(self) -> str:
        return "a dequantized int8 weight"


@dataclass(frozen=True)
class Choose(Marker):
    """choose_qparams of a dynamic activation (or one of its two results)."""

    x: torch.fx.Node
    item: int | None = None

    def __str__(self) -> str:
        return "choose_qparams' result"


class QLinear(nn.Module):
    """A pt2e Linear as torch.ao's reference Linear (tools/export_frontend.describe gives its layer).
    forward computes the program's float product, for the converter's shape runs."""

    def __init__(self, layer: LinearLayer, dequantized: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("weight", dequantized)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return torch.relu(y) if self.layer.relu else y


# The activation schemes qrt runs: (qmin, qmax, dtype) -> the zero point shift to quint8.
_ACTIVATIONS = {(0, 255, torch.uint8): 0, (-128, 127, torch.int8): 128}


def _activation_shift(qmin: int, qmax: int, dtype: torch.dtype, what: str) -> int:
    shift = _ACTIVATIONS.get((qmin, qmax, dtype))
    if shift is None:
        raise LoweringError(
            f"{what} quantizes activations to {dtype} [{qmin}, {qmax}]; qrt runs 8-bit activations "
            "(uint8 [0, 255] or int8 [-128, 127], per tensor)"
        )
    return shift


def _float32(values: np.ndarray, what: str) -> np.ndarray:
    out = np.asarray(values).astype(np.float32)
    if not np.array_equal(out.astype(np.float64), np.asarray(values, np.float64)):
        raise LoweringError(f"{what}: scales are not float32 values, which qrt stores")
    return out


class QDQ:
    """The quantized_decomposed ops of one program, raised (module docstring)."""

    def __init__(self, raiser: _Raiser) -> None:
        self.r = raiser
        self.fused: dict[torch.fx.Node, Any] = {}  # a ReLU fused into the Linear before it -> that Linear
        self.count = 0

    def call(self, node: torch.fx.Node) -> Any:
        ops = _ops()
        op, args = node.target, self.r.value(node.args)
        if op == ops.quantize_per_tensor.default:
            x, scale, zp, qmin, qmax, dtype = args
            shift = _activation_shift(qmin, qmax, dtype, "a static quantize_per_tensor")
            return self.r.function(torch.quantize_per_tensor, (x, scale, zp + shift, torch.quint8), {})
        if op in (ops.dequantize_per_tensor.default, ops.dequantize_per_tensor.tensor):
            if isinstance(args[0], Constant):
                return self._weight(node, args)
            return self.r.method("dequantize", (args[0],))
        if op == ops.dequantize_per_channel.default:
            return self._weight(node, args)
        if op == ops.choose_qparams.tensor:
            x, qmin, qmax, _eps, dtype = args
            _activation_shift(qmin, qmax, dtype, "a dynamic choose_qparams")
            return Choose(x)
        if op == ops.quantize_per_tensor.tensor:
            x, scale, _zp, qmin, qmax, dtype = args
            _activation_shift(qmin, qmax, dtype, "a dynamic quantize_per_tensor")
            if not isinstance(scale, Choose) or scale.x is not x:
                raise LoweringError("a quantize_per_tensor.tensor whose qparams are not choose_qparams' of its input")
            return self.r.function(quantize_dynamic_8bit, (x,), {})
        raise LoweringError(f"{op} is not a pt2e pattern qrt lowers")

    def getitem(self, marker: Any, index: int) -> Any:
        if isinstance(marker, Choose) and marker.item is None:
            return Choose(marker.x, index)
        raise LoweringError(f"indexes {marker}")

    def _weight(self, node: torch.fx.Node, args: tuple) -> WeightDQ:
        """A dequantize of a constant int8 tensor: a weight."""
        w = args[0]
        per_channel = node.target == _ops().dequantize_per_channel.default
        if w.value.dtype != torch.int8:
            raise LoweringError(f"weights of dtype {w.value.dtype} are not supported (int8)")
        if per_channel:
            _, scales, zps, axis, *_ = args
            if axis != 0:
                raise LoweringError(f"per-channel weights must be quantized along axis 0, not {axis}")
            scale = _float32(scales.value.numpy(), "a per-channel weight")
            zp = zps.value.numpy().astype(np.int32)
        else:
            _, s, z, *_ = args
            scale, zp = _float32(np.asarray(s), "a per-tensor weight"), np.asarray(z, np.int32)
        # The float weight as the program computes it: the op run once here.
        with torch.no_grad():
            values = [a.value if isinstance(a, Constant) else a for a in args]
            dequantized = node.target(*values)
        return WeightDQ(QWeight(w.value.numpy().copy(), scale, zp), dequantized)

    def linear(self, node: torch.fx.Node, args: tuple) -> Any:
        x, w, b = (list(args) + [None])[:3]
        if isinstance(b, Marker) or isinstance(x, (Marker, Constant)):
            raise LoweringError("a linear whose input or bias is not a tensor the program computes")
        bias = b.value if isinstance(b, Constant) else None
        if b is not None and not isinstance(b, Constant):
            raise LoweringError("a linear whose bias is computed at run time")
        path = _module_path(node)
        if path in self.r.root:  # two F.linear calls in one module: the second one by its node's name
            path = node.name
        if isinstance(w, Constant) and not _is_linear_module(node):
            # an F.linear (MultiheadAttention's in_proj) or a Linear subclass (its out_proj), which torch.ao's flows
            # and quantize_dynamic leave float: float here too, as the FX front end keeps them
            return self.r.function(F.linear, tuple(self.r.const_attr(a.name, a.value) if isinstance(a, Constant)
                                                   else a for a in args), {})
        if isinstance(w, Constant):  # an nn.Linear of a float program: the rules may quantize it
            linear = nn.Linear(w.value.shape[1], w.value.shape[0], bias=bias is not None)
            linear.weight = nn.Parameter(w.value.detach().clone(), requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
            return self.r.module(path, linear, (x,))
        if not isinstance(w, WeightDQ):
            raise LoweringError("a linear whose weight is computed at run time")
        static_in = _is_static_dequantize(x)
        relu = _relu_after(node)
        out_quantized = _only_quantized(relu or node)
        if static_in and not out_quantized:
            # The program's float product of the dequantized values: qrt's linear_float over the same weight.
            linear = nn.Linear(w.dequantized.shape[1], w.dequantized.shape[0], bias=bias is not None)
            linear.weight = nn.Parameter(w.dequantized.clone(), requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
            return self.r.module(path, linear, (x,))
        fuse = relu is not None and static_in
        b_np = None if bias is None else bias.detach().float().numpy().copy()
        layer = LinearLayer("linear_relu" if fuse else "linear", w.weight, b_np, fuse)
        y = self.r.module(path, QLinear(layer, w.dequantized, bias), (x,))
        if fuse:
            self.fused[relu] = y
        return y


def _module_path(node: torch.fx.Node) -> str:
    """The nn.Linear's module path in the model the program was exported from (nn_module_stack), else the
    node's name (an F.linear)."""
    path, kind = module_stack.innermost(node)
    linear = kind.endswith("Linear") and all(p.isidentifier() or p.isdigit() for p in path.split("."))
    return path if path and linear else node.name


def _is_linear_module(node: torch.fx.Node) -> bool:
    """Whether node is an nn.Linear module's own call (its innermost nn_module_stack entry), not a subclass's."""
    return module_stack.innermost(node)[1] == module_stack.LINEAR


def _is_static_dequantize(x: Any) -> bool:
    return (
        isinstance(x, torch.fx.Node) and x.op == "call_method" and x.target == "dequantize"
        and isinstance(x.args[0], torch.fx.Node) and x.args[0].target is torch.quantize_per_tensor
    )


def _relu_after(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target == torch.ops.aten.relu.default:
        return users[0]
    return None


def _only_quantized(node: torch.fx.Node) -> bool:
    target = _ops().quantize_per_tensor.default
    return bool(node.users) and all(u.target == target for u in node.users)

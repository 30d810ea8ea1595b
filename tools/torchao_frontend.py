"""Models quantized by torchao's ``quantize_``: their Linear layers described from the weights' tensors.

``quantize_(model, Int8DynamicActivationInt8WeightConfig())`` and ``Int8WeightOnlyConfig()`` leave every
``nn.Linear`` a ``nn.Linear`` whose weight is a torchao ``Int8Tensor`` (``qdata`` int8 [out, in], ``scale``
float32 [out, 1] or [1, 1], symmetric). Its ``act_quant_kwargs`` say how the layer quantizes its input (None:
weight-only). The layer is read from those fields, never from the graph torch.export makes of it, which
depends on the CPU it was exported on (a u8 x s8 branch on VNNI CPUs without AMX, another elsewhere).

- dynamic (per-row symmetric int8 activations): ``linear_dynamic`` with ``activation: per_row_symmetric``,
  which reproduces torchao's CPU forward bit for bit (docs/NUMERICS.md);
- weight-only: the int8 values as float16 weights (exact) in ``linear_dynamic`` without bias, times the
  per-row scale (``mul``), plus the bias (``add``): torchao's ``mm(x, float(qdata).T) * scale + bias``,
  the product's sum in qrt's fixed order.

torchao need not be importable here: a model holding its tensors has imported it already.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.export import ExportedProgram

from . import module_stack
from .layers import LinearLayer, QWeight
from .lower_values import LoweringError, Tensor, lowers
from .qrt_backend import loggers_at

if TYPE_CHECKING:
    from .lower import Lowerer

PATTERN = "linear_torchao"
DYNAMIC, WEIGHT_ONLY = "per_row_symmetric", "weight_only"


class TorchaoError(ValueError):
    """A torchao layer qrt does not run; the message names it and says why."""


def quiet_imports() -> contextlib.AbstractContextManager[None]:
    """torchao's import-time log lines (kernels built for other GPUs it cannot load, a torch.compile notice on
    its enums) held back, whoever imports it: the converter, or a pickled transformers model that imports
    transformers, which imports torchao. The converter's users cannot act on them."""
    return loggers_at(logging.ERROR, "torchao", "torch.utils._pytree")


def import_torchao() -> bool:
    """Import torchao (it declares its tensor classes to torch's weights-only loader), quietly. False if
    torchao is not installed."""
    with quiet_imports():
        try:
            import torchao  # noqa: F401
        except ImportError:
            return False
    return True


def is_torchao_tensor(t: Any) -> bool:
    """Whether t is one of torchao's tensor subclasses (by module: torchao is not imported for the check)."""
    return type(t).__module__.startswith("torchao")


def is_int8_tensor(t: Any) -> bool:
    """Whether t is torchao's Int8Tensor."""
    return is_torchao_tensor(t) and type(t).__name__ == "Int8Tensor"


def is_quantized(model: nn.Module) -> bool:
    """Whether some Linear of model holds a torchao weight."""
    return any(isinstance(m, nn.Linear) and is_torchao_tensor(m.weight) for m in model.modules())


def _scheme(w: Any, where: str) -> str:
    """The activation scheme of an Int8Tensor weight: DYNAMIC or WEIGHT_ONLY; anything else is refused."""
    unsupported = [n for n in ("act_pre_scale", "act_quant_scale", "act_quant_zero_point") if getattr(w, n, None)
                   is not None]
    if unsupported:
        raise TorchaoError(f"{where}: torchao Int8Tensor with {', '.join(unsupported)} (static or pre-scaled "
                           "activations) is not supported; qrt runs Int8DynamicActivationInt8WeightConfig and "
                           "Int8WeightOnlyConfig")
    if getattr(w, "reduce_range", False):
        raise TorchaoError(f"{where}: torchao's reduce_range=True is not supported")
    kw = w.act_quant_kwargs
    if kw is None:
        return WEIGHT_ONLY
    granularity, mapping = kw.granularity, getattr(kw.mapping_type, "name", kw.mapping_type)
    if type(granularity).__name__ != "PerRow" or getattr(granularity, "dim", -1) != -1 or mapping != "SYMMETRIC" \
            or kw.reduce_range:
        raise TorchaoError(f"{where}: torchao activation quantization {granularity}, {mapping}, "
                           f"reduce_range={kw.reduce_range} is not supported; qrt runs PerRow() SYMMETRIC (the "
                           "default of Int8DynamicActivationInt8WeightConfig)")
    return DYNAMIC


def describe_linear(module: nn.Module, where: str = "Linear") -> LinearLayer | None:
    """A Linear with a torchao Int8Tensor weight as a LinearLayer (mode DYNAMIC or WEIGHT_ONLY), else None."""
    if not isinstance(module, nn.Linear) or not is_torchao_tensor(module.weight):
        return None
    w = module.weight
    if not is_int8_tensor(w):
        raise TorchaoError(f"{where}: torchao {type(w).__name__} weights are not supported; qrt runs Int8Tensor "
                           "(Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig)")
    if w.dtype != torch.float32:
        raise TorchaoError(f"{where}: torchao Int8Tensor of a {w.dtype} layer; qrt runs float32 layers")
    q, scale = w.qdata, w.scale
    n, k = module.out_features, module.in_features
    if q.dtype != torch.int8 or tuple(q.shape) != (n, k):
        raise TorchaoError(f"{where}: Int8Tensor qdata must be int8 [{n}, {k}], got {q.dtype} {list(q.shape)}")
    block = list(getattr(w, "block_size", [1, k]))
    if block[-1] != k:
        raise TorchaoError(f"{where}: per-group Int8Tensor weights (block_size {block}) are not supported; qrt runs "
                           "PerRow() and PerTensor() weights")
    if scale.dtype != torch.float32 or tuple(scale.shape) not in ((n, 1), (1, 1)):
        raise TorchaoError(f"{where}: Int8Tensor scale must be float32 [{n}, 1] (per row) or [1, 1] (per tensor), "
                           f"got {scale.dtype} {list(scale.shape)}")
    if w.zero_point is not None and bool(torch.any(w.zero_point != 0)):
        raise TorchaoError(f"{where}: asymmetric Int8Tensor weights (nonzero zero_point) are not supported")
    mode = _scheme(w, where)
    values = q.detach().numpy().copy()
    s = np.ascontiguousarray(np.broadcast_to(scale.detach().numpy().reshape(-1), (n,)), np.float32)
    bias = None if module.bias is None else module.bias.detach().float().numpy().copy()
    return LinearLayer(PATTERN, QWeight(values, s, np.zeros(n, np.int32)), bias, False, mode)


def check(model: nn.Module) -> None:
    """Refuse, naming the module, the first torchao layer of model qrt does not run (TorchaoError)."""
    for name, m in model.named_modules():
        describe_linear(m, f"module {name!r}")


def describe(module: nn.Module) -> LinearLayer | None:
    """describe_linear for the lowering (check() has named any refused layer before)."""
    try:
        return describe_linear(module)
    except TorchaoError as e:
        raise LoweringError(str(e)) from None


@lowers(patterns=(PATTERN,))
def _linear_torchao(lw: Lowerer, node: torch.fx.Node, layer: LinearLayer, x: Any) -> Tensor:
    """The torchao Linear: per-row dynamic int8 -> linear_dynamic; weight-only -> fp16-exact product, * s, + b."""
    w = layer.weight
    if layer.mode == DYNAMIC:
        ports = {"x": lw.float_of(x), **w.ports(), "bias": layer.bias}
        y = lw.emit(node, "linear_dynamic", ports, {"reduce_range": False, "activation": DYNAMIC})
    else:
        # int8 values are float16 values exactly: the product is torchao's mm(x, float(qdata).T)
        y = lw.emit(node, "linear_dynamic", {"x": lw.float_of(x), "weight": w.values.astype(np.float16)})
        y = lw.emit(node, "mul", {"a": y, "b": w.scale}, suffix="_scale")
        if layer.bias is not None:
            y = lw.emit(node, "add", {"a": y, "b": layer.bias}, suffix="_bias")
    lw.layers[str(node.target)] = y
    return Tensor(y)


# ------------------------------------------------------------ .pt2 programs


def program_leaves(ep: ExportedProgram) -> dict[str, nn.Module]:
    """Module path -> a Linear holding the program's Int8Tensor weight, for each torchao Linear of a .pt2
    program: the raised graph calls it in place of the nodes the export made of it."""
    state = ep.state_dict
    out: dict[str, nn.Module] = {}
    for node in ep.graph.nodes:
        for path, cls in module_stack.entries(node):
            if path in out or cls != module_stack.LINEAR:
                continue
            w = state.get(f"{path}.weight")
            if not is_torchao_tensor(w):
                continue
            bias = state.get(f"{path}.bias")
            linear = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
            linear.weight = nn.Parameter(w, requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
            describe_linear(linear, f"module {path!r}")  # refused here by name, not later by the lowering
            out[path] = linear
    for name, value in {**state, **ep.constants}.items():  # anywhere else: its dequantization would run as float
        if is_torchao_tensor(value) and name.rpartition(".")[0] not in out:
            raise TorchaoError(f"{name!r}: torchao {type(value).__name__} outside a Linear's weight is not supported; "
                               "qrt runs Int8Tensor Linear weights (Int8DynamicActivationInt8WeightConfig, "
                               "Int8WeightOnlyConfig)")
    return out


def pickled_weights(path: str) -> list[str]:
    """Names of the weights and constants a .pt2 archive stores pickled (loading them runs pickled code:
    torchao's Int8Tensor weights are stored so)."""
    out = []
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith(("/data/weights/model_weights_config.json",
                                  "/data/constants/model_constants_config.json")):
                    config = json.load(io.BytesIO(z.read(name))).get("config", {})
                    out += [k for k, v in config.items() if isinstance(v, dict) and v.get("use_pickle")]
    except (OSError, zipfile.BadZipFile, ValueError):
        return []  # not an archive this check reads: torch.export.load reports it
    return out

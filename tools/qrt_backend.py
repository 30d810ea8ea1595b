"""qrt's capabilities for torch.ao's FX quantization flow: the one module of tools/ that uses torch.ao.

``torch.ao.quantization`` is deprecated upstream in favour of torchao's pt2e
flow; everything that touches it (BackendConfig declarations, qconfigs, the
prepare / calibrate / convert calls, reading torch.ao's quantized modules) is
here; the pt2e quantizer (tools/qrt_quantizer.py, the converter's default) sits beside it, under the
same rules (tools/rules.py) and lowering (tools/lower.py). Tested with the torch
version pinned in pyproject.toml's ``torch`` extra.

Declarations, one per rules pattern (``PATTERN_CONFIGS``):
- linear: ``nn.Linear`` (root nn.Linear, reference ``nnqr.Linear``), observed at
  input and output (OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT).
- linear_relu: ``nn.Linear`` followed by ``nn.ReLU`` or ``F.relu``,
  fused into ``nni.LinearReLU`` (fuser method ``_sequential_wrapper2``), whose root
  is nn.Linear and reference module ``nnqr.Linear``.
- rnn_cell, lstm_cell, gru_cell, lstm, gru: ``nn.RNNCell``, ``nn.LSTMCell``, ``nn.GRUCell``,
  ``nn.LSTM``, ``nn.GRU`` (root the module itself, reference ``nnqr.<same name>``), as torch's
  native BackendConfig declares them. torch 2.13's FX flow observes only modules whose output
  is one tensor, so it leaves LSTMCell, LSTM and GRU (tuple outputs) float; ``to_reference`` /
  ``to_native`` then swap them for the reference module / the ``nnqd`` dynamic module exactly
  as ``convert_weighted_module`` / ``quantize_dynamic`` would (``_swap_recurrent``).
- rnn: ``nn.RNN`` has no quantized or reference module in PyTorch (and torch.ao's convert
  cannot observe its weights), so there is no BackendPatternConfig: the swap replaces it with
  ``DynamicRNNLoop``, a loop of dynamic ``nnqd.RNNCell`` per layer and direction whose weights
  are quantized as ``quantize_dynamic`` quantizes an RNNCell's. That loop is qrt's reference
  for ``rnn_dynamic``.
Already-quantized models: ``describe`` reads torch.ao's quantized modules (``nnqd`` / ``nnq``
Linear, the dynamic cells and sequences, and ``nnq.Embedding`` / ``EmbeddingBag`` quantized
weight-only with float qparams, 8 or 4 bits) into the lowering's neutral layers (tools/layers.py).
DTypeConfigs: static = quint8 activations in and out, qint8 weights, float bias;
dynamic = float in and out, activations quantized per call to quint8 with
qint8 weights, or float16 weights with float16 "activations" (which the native
modules keep in float32).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Callable

import numpy as np
import torch
import torch.ao.nn.intrinsic as nni
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.intrinsic.quantized.dynamic as nniqd
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
import torch.ao.nn.quantized.reference as nnqr
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.reference.modules.rnn import get_quantized_weight
from torch.ao.quantization import QConfig, QConfigMapping
from torch.ao.quantization.backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    ObservationType,
)
from torch.ao.quantization.fuser_method_mappings import _sequential_wrapper2
from torch.ao.quantization.observer import (
    HistogramObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    default_per_channel_weight_observer,
    default_weight_observer,
)
from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx, prepare_fx
from torch.ao.quantization.utils import get_qparam_dict

from .layers import EmbeddingLayer, Layer, LinearLayer, QWeight, RNNCellLayer, SequenceLayer, StubLayer
from .rules import PatternRule, Rules

BACKEND_NAME = "qrt"

# ------------------------------------------------------------ dtype configs

STATIC_INT8 = DTypeConfig(
    input_dtype=torch.quint8, output_dtype=torch.quint8, weight_dtype=torch.qint8, bias_dtype=torch.float
)
DYNAMIC_INT8 = DTypeConfig(
    input_dtype=torch.quint8,
    output_dtype=torch.float,
    weight_dtype=torch.qint8,
    bias_dtype=torch.float,
    is_dynamic=True,
)
DYNAMIC_FLOAT16 = DTypeConfig(
    input_dtype=torch.float16,
    output_dtype=torch.float,
    weight_dtype=torch.float16,
    bias_dtype=torch.float,
    is_dynamic=True,
)
_DYNAMIC_BY_WEIGHT = {"qint8": DYNAMIC_INT8, "float16": DYNAMIC_FLOAT16}

_OBSERVED = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT


def _dtype_configs(rule: PatternRule) -> list[DTypeConfig]:
    configs = [STATIC_INT8] if rule.static else []
    return configs + [_DYNAMIC_BY_WEIGHT[d] for d in rule.dynamic]


# ------------------------------------------------------------ pattern declarations


def _linear(dtypes: list[DTypeConfig]) -> list[BackendPatternConfig]:
    return [
        BackendPatternConfig(nn.Linear)
        .set_observation_type(_OBSERVED)
        .set_dtype_configs(dtypes)
        .set_root_module(nn.Linear)
        .set_reference_quantized_module(nnqr.Linear)
    ]


def _linear_relu(dtypes: list[DTypeConfig]) -> list[BackendPatternConfig]:
    fusions = [
        BackendPatternConfig((nn.Linear, relu))
        .set_dtype_configs(dtypes)
        .set_fuser_method(_sequential_wrapper2(nni.LinearReLU))
        .set_fused_module(nni.LinearReLU)
        for relu in (nn.ReLU, F.relu)  # torch.relu has no fuser: it stays a float relu
    ]
    fused = (
        BackendPatternConfig(nni.LinearReLU)
        .set_observation_type(_OBSERVED)
        .set_dtype_configs(dtypes)
        .set_root_module(nn.Linear)
        .set_reference_quantized_module(nnqr.Linear)
    )
    return [*fusions, fused]


def _recurrent(float_cls: type, ref_cls: type) -> Callable[[list[DTypeConfig]], list[BackendPatternConfig]]:
    def configs(dtypes: list[DTypeConfig]) -> list[BackendPatternConfig]:
        return [
            BackendPatternConfig(float_cls)
            .set_observation_type(_OBSERVED)
            .set_dtype_configs(dtypes)
            .set_root_module(float_cls)
            .set_reference_quantized_module(ref_cls)
        ]

    return configs


def _no_torch_pattern(dtypes: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """nn.RNN: torch.ao cannot declare it (see the module docstring); _swap_recurrent quantizes it."""
    return []


# Rules pattern name -> its BackendPatternConfigs, and the float module classes it quantizes.
PATTERN_CONFIGS: dict[str, Callable[[list[DTypeConfig]], list[BackendPatternConfig]]] = {
    "linear": _linear,
    "linear_relu": _linear_relu,
    "rnn_cell": _recurrent(nn.RNNCell, nnqr.RNNCell),
    "lstm_cell": _recurrent(nn.LSTMCell, nnqr.LSTMCell),
    "gru_cell": _recurrent(nn.GRUCell, nnqr.GRUCell),
    "rnn": _no_torch_pattern,
    "lstm": _recurrent(nn.LSTM, nnqr.LSTM),
    "gru": _recurrent(nn.GRU, nnqr.GRU),
}
_ROOT_MODULES: dict[str, tuple[type, ...]] = {
    "linear": (nn.Linear,),
    "linear_relu": (nn.Linear, nni.LinearReLU),
    "rnn_cell": (nn.RNNCell,),
    "lstm_cell": (nn.LSTMCell,),
    "gru_cell": (nn.GRUCell,),
    "rnn": (nn.RNN,),
    "lstm": (nn.LSTM,),
    "gru": (nn.GRU,),
}
# Float recurrent module -> (rules pattern, reference module, native dynamic module); nn.RNN has neither.
_RECURRENT: dict[type, tuple[str, type | None, type | None]] = {
    nn.RNNCell: ("rnn_cell", nnqr.RNNCell, nnqd.RNNCell),
    nn.LSTMCell: ("lstm_cell", nnqr.LSTMCell, nnqd.LSTMCell),
    nn.GRUCell: ("gru_cell", nnqr.GRUCell, nnqd.GRUCell),
    nn.RNN: ("rnn", None, None),
    nn.LSTM: ("lstm", nnqr.LSTM, nnqd.LSTM),
    nn.GRU: ("gru", nnqr.GRU, nnqd.GRU),
}


class FrontEndError(ValueError):
    """The rules ask for a pattern this front end cannot declare, or torch.ao failed."""


def check_patterns(rules: Rules) -> None:
    missing = [p.describe() for p in rules.patterns if p.name not in PATTERN_CONFIGS]
    if missing:
        raise FrontEndError(
            f"the rules list pattern(s) {', '.join(missing)} that the torch.ao front end cannot declare; "
            f"it knows: {', '.join(sorted(PATTERN_CONFIGS))}"
        )


def backend_config(rules: Rules) -> BackendConfig:
    """The BackendConfig named for qrt holding each rules pattern's declarations."""
    config = BackendConfig(f"{BACKEND_NAME}:{rules.name}")
    for rule in rules.patterns:
        config.set_backend_pattern_configs(PATTERN_CONFIGS[rule.name](_dtype_configs(rule)))
    return config


# ------------------------------------------------------------ qconfigs


def qconfig(mode: str, weight_dtype: str, weights: str, engine: str = "x86") -> QConfig:
    """The observers for one scheme: as quantize_dynamic / the defaults of torch's engine choose them."""
    if mode == "dynamic":
        if weight_dtype == "float16":
            return QConfig(
                activation=PlaceholderObserver.with_args(dtype=torch.float16, is_dynamic=True),
                weight=PlaceholderObserver.with_args(dtype=torch.float16),
            )
        return QConfig(
            activation=PlaceholderObserver.with_args(
                dtype=torch.quint8, quant_min=0, quant_max=255, is_dynamic=True
            ),
            weight=default_per_channel_weight_observer if weights == "per-channel" else default_weight_observer,
        )
    if weight_dtype != "qint8":
        raise FrontEndError(f"static mode needs qint8 weights, not {weight_dtype}")
    # reduce_range: x86/fbgemm's u8 x s8 products are summed in pairs in int16; 7-bit activations cannot saturate.
    weight = (
        PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        if weights == "per-channel"
        else default_weight_observer
    )
    # qnnpack sums exactly, and its default qconfig uses the full range (get_default_qconfig("qnnpack"))
    return QConfig(activation=HistogramObserver.with_args(reduce_range=engine != "qnnpack"), weight=weight)


def qconfig_mapping(
    rules: Rules, model: nn.Module, mode: str, weight_dtype: str, weights: str, engine: str = "x86"
) -> QConfigMapping:
    weights = rules.weights or weights
    mapping = QConfigMapping().set_global(qconfig(mode, weight_dtype, weights, engine))
    names = dict(model.named_modules())
    for name, scheme in rules.module_schemes.items():
        if name not in names:
            raise FrontEndError(f"rules {rules.name!r} name module {name!r}, which the model does not have")
        if scheme == "float":
            mapping.set_module_name(name, None)
        elif scheme == "float16":
            mapping.set_module_name(name, qconfig(mode, "float16", "per-tensor", engine))
        else:
            mapping.set_module_name(name, qconfig(mode, "qint8", scheme, engine))
    return mapping


def quantizable(rules: Rules, mode: str) -> Callable[[str, nn.Module], bool]:
    """Which float modules the rules quantize in this mode (to check a model before quantizing it)."""
    classes: list[type] = []
    for rule in rules.patterns:
        if (mode == "static" and rule.static) or (mode == "dynamic" and rule.dynamic):
            classes += _ROOT_MODULES[rule.name]
    kept_float = {n for n, s in rules.module_schemes.items() if s == "float"}
    return lambda name, m: isinstance(m, tuple(classes)) and name not in kept_float


# ------------------------------------------------------------ the FX flow


@contextlib.contextmanager
def loggers_at(level: int, *names: str) -> Iterator[None]:
    """The named loggers set to level for the block, then as they were: log lines of torch or torchao that the
    converter's users cannot act on, held back."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, was in zip(loggers, levels):
            lg.setLevel(was)


@contextlib.contextmanager
def quiet() -> Iterable[None]:
    # torch 2.13 warns that torch.ao.quantization (and its dtypes) are deprecated on every call; the
    # converter's users cannot act on it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.ao")
        warnings.filterwarnings("ignore", message=r"(?s).*deprecated", category=UserWarning)
        # torch.export on an nn.LSTM: its _flat_weights list "assigned during export", nothing the user did
        warnings.filterwarnings("ignore", message=r"The tensor attributes .* were assigned during export")
        yield


def prepare(
    model: nn.Module,
    rules: Rules,
    mode: str,
    weight_dtype: str,
    weights: str,
    example_inputs: Sequence[torch.Tensor],
    engine: str = "x86",
) -> torch.fx.GraphModule:
    """prepare_fx with qrt's BackendConfig: fuses, then inserts observers."""
    mapping = qconfig_mapping(rules, model, mode, weight_dtype, weights, engine)
    with quiet():
        return prepare_fx(
            copy.deepcopy(model).eval(), mapping, tuple(example_inputs), backend_config=backend_config(rules)
        )


def calibrate(prepared: torch.fx.GraphModule, batches: Iterable[Sequence[torch.Tensor]]) -> None:
    with torch.no_grad(), quiet():
        for batch in batches:
            prepared(*batch)


def to_reference(prepared: torch.fx.GraphModule, rules: Rules) -> torch.fx.GraphModule:
    with quiet():
        gm = convert_to_reference_fx(copy.deepcopy(prepared), backend_config=backend_config(rules))
        return _swap_recurrent(gm, prepared, rules, native=False)


def to_native(prepared: torch.fx.GraphModule, rules: Rules, engine: str | None = None) -> torch.fx.GraphModule:
    """PyTorch's own quantized model from the same prepared model (what qrt must reproduce), its weights
    packed for `engine` ("x86" or "qnnpack"; None: torch's engine in force), whose kernels they then run."""
    before = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = engine or before
        with quiet():
            gm = convert_fx(copy.deepcopy(prepared), backend_config=backend_config(rules))
            return _swap_recurrent(gm, prepared, rules, native=True)
    finally:
        torch.backends.quantized.engine = before


# ------------------------------------------------------------ recurrent modules the FX flow leaves float

_WEIGHT_DTYPE_NAMES = {torch.qint8: "qint8", torch.float16: "float16"}


def _recurrent_weight_qparams(module: nn.Module, qconfig: QConfig) -> dict:
    """The weight_qparams_dict torch.ao's convert_weighted_module builds for an RNN cell or LSTM / GRU."""
    qparams: dict = {"is_decomposed": False}
    if isinstance(module, nn.RNNCellBase):
        names = ["weight_ih", "weight_hh"]
    else:
        names = [wn for wn in module._flat_weights_names if wn.startswith("weight")]
    for wn in names:
        observer = qconfig.weight()
        if observer.dtype == torch.qint8:  # float16 "observers" hold no parameters
            observer(getattr(module, wn))
        qparams[wn] = get_qparam_dict(observer)
    return qparams


def _set_module(gm: torch.fx.GraphModule, target: str, module: nn.Module) -> None:
    parent, _, name = target.rpartition(".")
    setattr(gm.get_submodule(parent) if parent else gm, name, module)


def _swap_recurrent(
    gm: torch.fx.GraphModule, prepared: torch.fx.GraphModule, rules: Rules, native: bool
) -> torch.fx.GraphModule:
    """Quantize the recurrent modules that the rules cover and the FX flow left float.

    Each gets the qconfig prepare_fx chose for its node; it is swapped only when that qconfig is
    dynamic with a weight dtype the rule allows (otherwise it stays float and the lowering names it).
    """
    qconfigs = prepared.meta["_observed_graph_module_attrs"].node_name_to_qconfig
    modules = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = modules[str(node.target)]
        entry = _RECURRENT.get(type(module))
        qconfig = qconfigs.get(node.name)
        if entry is None or qconfig is None:
            continue
        pattern, ref_cls, native_cls = entry
        rule = rules.pattern(pattern)
        weight_dtype = _WEIGHT_DTYPE_NAMES.get(qconfig.weight().dtype)
        if rule is None or weight_dtype not in rule.dynamic or not getattr(qconfig.activation(), "is_dynamic", False):
            continue
        if getattr(module, "proj_size", 0):
            raise FrontEndError(f"module {node.target!r}: an LSTM with proj_size has no quantized form")
        if ref_cls is None:
            swapped = DynamicRNNLoop(module, qconfig)
        elif native:
            module.qconfig = qconfig  # what quantize_dynamic attaches before from_float
            swapped = native_cls.from_float(module)
        else:
            swapped = ref_cls.from_float(module, _recurrent_weight_qparams(module, qconfig))
        _set_module(gm, str(node.target), swapped)
        modules[str(node.target)] = swapped
    gm.recompile()
    return gm


class DynamicRNNLoop(nn.Module):
    """nn.RNN quantized: one dynamic RNNCell per layer and direction, looped over time.

    PyTorch has no quantized nn.RNN. This is qrt's reference for ``rnn_dynamic``: each cell's
    weights are what ``quantize_dynamic`` makes of an RNNCell (symmetric qint8, per tensor or per
    channel, or float16), and each step quantizes its own input, as a dynamic RNNCell does.
    """

    def __init__(self, rnn: nn.RNN, qconfig: QConfig) -> None:
        super().__init__()
        self.num_layers, self.bidirectional, self.batch_first = rnn.num_layers, rnn.bidirectional, rnn.batch_first
        self.hidden_size, self.nonlinearity = rnn.hidden_size, rnn.nonlinearity
        cells = []
        for n in range(rnn.num_layers):
            for suffix in ("", "_reverse")[: 2 if rnn.bidirectional else 1]:
                w_ih = getattr(rnn, f"weight_ih_l{n}{suffix}")
                cell = nn.RNNCell(w_ih.shape[1], rnn.hidden_size, rnn.bias, rnn.nonlinearity)
                with torch.no_grad():
                    for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                        if rnn.bias or part.startswith("weight"):
                            getattr(cell, part).copy_(getattr(rnn, f"{part}_l{n}{suffix}"))
                cell.qconfig = qconfig
                cells.append(nnqd.RNNCell.from_float(cell))
        self.cells = nn.ModuleList(cells)

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch_first:
            x = x.transpose(0, 1)
        dirs = 2 if self.bidirectional else 1
        if hx is None:
            hx = x.new_zeros(self.num_layers * dirs, x.shape[1], self.hidden_size)
        finals = []
        for n in range(self.num_layers):
            outs = []
            for d in range(dirs):
                h, ys = hx[n * dirs + d], [None] * x.shape[0]
                for t in reversed(range(x.shape[0])) if d else range(x.shape[0]):
                    h = ys[t] = self.cells[n * dirs + d](x[t], h)
                outs.append(torch.stack(ys))
                finals.append(h)
            x = torch.cat(outs, dim=2)
        return (x.transpose(0, 1) if self.batch_first else x), torch.stack(finals)


# ------------------------------------------------------------ torch.ao modules -> neutral layers

QUANTIZED_PACKAGES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized")


def is_quantized(model: nn.Module) -> bool:
    """True for a model torch.ao already quantized (quantize_dynamic, convert_fx, reference)."""
    for m in model.modules():
        if type(m).__module__.startswith(QUANTIZED_PACKAGES):
            return True
    if isinstance(model, torch.fx.GraphModule):
        targets = (torch.quantize_per_tensor, torch.quantize_per_tensor_dynamic)
        return any(n.op == "call_function" and n.target in targets for n in model.graph.nodes)
    return False


def _float32_exact(values: np.ndarray, what: str) -> np.ndarray:
    out = values.astype(np.float32)
    if not np.array_equal(out.astype(np.float64), values.astype(np.float64)):
        raise FrontEndError(f"{what}: scales are not float32 values, which qrt stores")
    return out


def _qweight(w: torch.Tensor, what: str) -> QWeight:
    """A torch qint8 tensor (or float16 / float32-from-float16) -> QWeight, integers kept as they are."""
    if not w.is_quantized:
        return QWeight(w.detach().float().numpy().astype(np.float16))
    if w.dtype != torch.qint8:
        raise FrontEndError(f"{what}: weights of dtype {w.dtype} are not supported (qint8 or float16)")
    if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        if w.q_per_channel_axis() != 0:
            raise FrontEndError(f"{what}: per-channel weights must be quantized along axis 0")
        scale = _float32_exact(w.q_per_channel_scales().numpy(), what)
        zp = w.q_per_channel_zero_points().numpy().astype(np.int32)
    elif w.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scale = _float32_exact(np.asarray(w.q_scale()), what)
        zp = np.asarray(w.q_zero_point(), np.int32)
    else:
        raise FrontEndError(f"{what}: weight scheme {w.qscheme()} is not supported")
    return QWeight(w.int_repr().numpy().copy(), scale, zp)


def _ref_weight(module: nn.Module, quantized: torch.Tensor, weight_dtype: torch.dtype, float_weight, what: str):
    if weight_dtype == torch.float16:
        # fbgemm clamps to the float16 range before rounding (NUMERICS.md); .to(float16) would give inf.
        w = float_weight.detach().float().numpy()
        return QWeight(np.clip(w, -65504.0, 65504.0).astype(np.float16))
    return _qweight(quantized, what)


def _bias(b: torch.Tensor | None) -> np.ndarray | None:
    return None if b is None else b.detach().float().numpy().copy()


def describe(module: nn.Module) -> Layer | None:
    """The neutral description of a quantized module, or None if it is not one qrt lowers."""
    name = type(module).__name__
    # Order matters: nniqd.LinearReLU < nnqd.Linear < nnq.Linear.
    if isinstance(module, nnqd.Linear):
        relu = isinstance(module, nniqd.LinearReLU)
        return LinearLayer(
            "linear_relu" if relu else "linear", _qweight(module.weight(), name), _bias(module.bias()), relu, "dynamic"
        )
    if isinstance(module, nnq.Linear):
        relu = isinstance(module, nniq.LinearReLU)
        out = (np.float32(module.scale), int(module.zero_point))
        if float(out[0]) != float(module.scale):
            raise FrontEndError(f"{name}: output scale {module.scale!r} is not a float32 value")
        weight = _qweight(module.weight(), name)
        return LinearLayer("linear_relu" if relu else "linear", weight, _bias(module.bias()), relu, "static", out)
    if isinstance(module, nni.LinearReLU) and isinstance(module[0], nnqr.Linear):
        ref = module[0]
        weight = _ref_weight(ref, None if ref.weight_dtype == torch.float16 else ref.get_quantized_weight(),
                             ref.weight_dtype, ref.weight, name)
        return LinearLayer("linear_relu", weight, _bias(ref.bias), True)
    if isinstance(module, nnqr.Linear):
        q = None if module.weight_dtype == torch.float16 else module.get_quantized_weight()
        weight = _ref_weight(module, q, module.weight_dtype, module.weight, name)
        return LinearLayer("linear", weight, _bias(module.bias), False)
    for ref_cls, dyn_cls, pattern in _CELLS:
        if isinstance(module, ref_cls):
            ws = []
            for part in ("ih", "hh"):
                dtype = getattr(module, f"weight_{part}_dtype")
                q = None if dtype == torch.float16 else getattr(module, f"get_quantized_weight_{part}")()
                ws.append(_ref_weight(module, q, dtype, getattr(module, f"weight_{part}"), name))
            nonlinearity = getattr(module, "nonlinearity", "tanh")
            return RNNCellLayer(pattern, ws[0], _bias(module.bias_ih), ws[1], _bias(module.bias_hh), nonlinearity)
        if isinstance(module, dyn_cls):
            return _dynamic_cell(module, pattern, name)
    if isinstance(module, (nnqr.LSTM, nnqr.GRU)):
        cell = "lstm_cell" if isinstance(module, nnqr.LSTM) else "gru_cell"

        def weights(suffix: str) -> RNNCellLayer:
            ws = []
            for part in ("ih", "hh"):
                wn = f"weight_{part}{suffix}"
                dtype = getattr(module, f"{wn}_dtype")
                q = None if dtype == torch.float16 else get_quantized_weight(module, wn)
                ws.append(_ref_weight(module, q, dtype, getattr(module, wn), name))
            biases = [_bias(getattr(module, f"bias_{p}{suffix}", None)) for p in ("ih", "hh")]
            return RNNCellLayer(cell, ws[0], biases[0], ws[1], biases[1])

        return _sequence(module, cell.removesuffix("_cell"), weights)
    if isinstance(module, (nnqd.LSTM, nnqd.GRU)):
        wb = module._weight_bias()
        cell = "lstm_cell" if isinstance(module, nnqd.LSTM) else "gru_cell"

        def dyn_weights(suffix: str) -> RNNCellLayer:
            ih, hh = (_qweight(wb["weight"][f"weight_{p}{suffix}"], name) for p in ("ih", "hh"))
            biases = [_bias(wb["bias"].get(f"bias_{p}{suffix}")) for p in ("ih", "hh")]
            return RNNCellLayer(cell, ih, biases[0], hh, biases[1])

        return _sequence(module, cell.removesuffix("_cell"), dyn_weights)
    if isinstance(module, DynamicRNNLoop):
        cells = iter(module.cells)
        return _sequence(module, "rnn", lambda suffix: _dynamic_cell(next(cells), "rnn_cell", name))
    if isinstance(module, nnq.Embedding):  # nnq.EmbeddingBag too, a subclass
        return _embedding(module, name)
    if isinstance(module, nnq.Quantize):
        return StubLayer("quantize", float(module.scale), int(module.zero_point), module.dtype)
    if isinstance(module, nnq.DeQuantize):
        return StubLayer("dequantize")
    return None


_EMBEDDING_BITS = {torch.quint8: 8, torch.quint4x2: 4}


def _embedding(module: nn.Module, name: str) -> EmbeddingLayer:
    """A weight-only quantized embedding (float_qparams_weight_only_qconfig, 8 or 4 bits), as torch's
    prepacked rows hold it (PackedEmbeddingBagWeight::prepack): the integers, the row scale and
    bias = zero_point * scale * -1 in float32, both rounded to float16 for 4 bits."""
    w = module.weight()
    bits = _EMBEDDING_BITS.get(w.dtype)
    if bits is None or w.qscheme() != torch.per_channel_affine_float_qparams:
        raise FrontEndError(f"{name}: embedding weights {w.dtype} {w.qscheme()} are not supported "
                            "(quint8 or quint4x2 with float_qparams_weight_only_qconfig)")
    scale = w.q_per_channel_scales().to(torch.float32).numpy()
    bias = w.q_per_channel_zero_points().to(torch.float32).numpy() * scale * np.float32(-1)
    if bits == 4:
        scale, bias = scale.astype(np.float16), bias.astype(np.float16)
    rows = w.int_repr().numpy().reshape(module.num_embeddings, -1).copy()
    bag = isinstance(module, nnq.EmbeddingBag)
    return EmbeddingLayer(
        "embedding_bag" if bag else "embedding", bits, rows, int(module.embedding_dim), scale, bias,
        # torch's quantized EmbeddingBag always sums, whatever its mode says (its forward passes mode 0)
        mode="sum", include_last_offset=bool(getattr(module, "include_last_offset", False)),
    )


# Reference cell, dynamic cell, rules pattern. LSTMCell and GRUCell do not subclass RNNCell.
_CELLS = (
    (nnqr.RNNCell, nnqd.RNNCell, "rnn_cell"),
    (nnqr.LSTMCell, nnqd.LSTMCell, "lstm_cell"),
    (nnqr.GRUCell, nnqd.GRUCell, "gru_cell"),
)


def _dynamic_cell(module: nn.Module, pattern: str, name: str) -> RNNCellLayer:
    wb = module._weight_bias()
    ih, hh = (_qweight(wb["weight"][f"weight_{p}"], name) for p in ("ih", "hh"))
    return RNNCellLayer(
        pattern, ih, _bias(wb["bias"]["bias_ih"]), hh, _bias(wb["bias"]["bias_hh"]),
        getattr(module, "nonlinearity", "tanh"),
    )


def _sequence(module: nn.Module, pattern: str, weights: Callable[[str], RNNCellLayer]) -> SequenceLayer:
    """A SequenceLayer from weight sets by torch's suffix (_l0, _l0_reverse, ...), in torch's order."""
    dirs = ("", "_reverse")[: 2 if module.bidirectional else 1]
    directions = tuple(weights(f"_l{n}{d}") for n in range(module.num_layers) for d in dirs)
    return SequenceLayer(
        pattern, directions, module.num_layers, module.bidirectional, module.batch_first,
        getattr(module, "nonlinearity", "tanh"),
    )


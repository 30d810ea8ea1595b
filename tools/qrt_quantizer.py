"""qrt's rules as a pt2e ``Quantizer``: a float model quantized by torchao's pt2e flow, not torch.ao's FX flow.

``--quantizer pt2e`` (tools/convert.py): the float model is exported (torch.export), annotated by
``QrtQuantizer`` from qrt's rules (tools/rules.py), observed by ``prepare_pt2e``, calibrated on the same
batches as the FX flow, turned into a Q/DQ graph by ``convert_pt2e``, exported again and raised by the
export front end (tools/export_frontend.py, tools/pt2e.py) to the reference graph that torch.ao's
``convert_to_reference_fx`` gives, so the lowering writes the same file. The observers are torchao's
copies of those ``qrt_backend.qconfig`` names, with the same arguments, so they choose the same scales and
zero points from the same values:

- static activations: ``HistogramObserver`` (reduce_range on x86: qparams over [0, 127]) as uint8 [0, 255];
- dynamic activations: a ``PlaceholderObserver`` uint8 [0, 255], quantized per call (qrt's
  ``linear_dynamic``, reduce_range as the FX flow's graph gives it: NUMERICS.md);
- qint8 weights: ``MinMaxObserver`` per tensor or ``PerChannelMinMaxObserver`` along axis 0, symmetric.

Patterns as the FX flow's BackendConfig (tools/qrt_backend.py) declares them: every ``nn.Linear``
module the rules quantize in the mode, with the ``nn.ReLU`` module or ``F.relu`` that alone reads it
fused (``torch.relu`` has no fuser in torch.ao: it stays a float relu). What pt2e has no scheme for is
done after the raise, under the same rules:

- recurrent modules (``nn.RNNCell``/``LSTMCell``/``GRUCell``, ``nn.RNN``/``LSTM``/``GRU``): pt2e annotates
  none; they are kept whole through pt2e (one ``call_module`` each) and, where the rules quantize them
  (dynamic mode), their weights are quantized as ``quantize_dynamic`` quantizes them (same observers)
  and they lower to qrt's dynamic recurrent ops;
- float16 weights (dynamic): the Linear lowers to ``linear_dynamic`` over float16 weights, as
  ``nnqr.Linear`` with ``weight_dtype`` float16 does.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn
from torch.export.graph_signature import InputKind, TensorArgument

from . import export_frontend, module_stack, pt2e, torchao_frontend
from . import shapes as qshapes
from .layers import Layer, LinearLayer, QWeight, RNNCellLayer, SequenceLayer
from .lower_ops import quantize_dynamic_8bit
from .qrt_backend import FrontEndError, quiet
from .rules import Rules

QUANTIZERS = ("fx", "pt2e")

_RECURRENT: dict[type, str] = {
    nn.RNNCell: "rnn_cell", nn.LSTMCell: "lstm_cell", nn.GRUCell: "gru_cell",
    nn.RNN: "rnn", nn.LSTM: "lstm", nn.GRU: "gru",
}
# BatchNorms are kept whole as well: torchao's prepare_pt2e folds one that follows a Linear into its weights, which
# quantize_dynamic and the FX flow do not (the int8 weights would be the folded ones: other bits).
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_ANNOTATION = "quantization_annotation"


def _pt2e() -> Any:
    """torchao's pt2e API (imported when used: the FX path does not need torchao). Importing torchao logs
    the optional CUDA libraries it cannot load on this machine, and torch a deprecation; neither is the
    user's business."""
    with torchao_frontend.quiet_imports(), quiet():
        return _import_pt2e()


def _import_pt2e() -> Any:
    try:
        from torchao.quantization.pt2e import observer
        from torchao.quantization.pt2e import quantizer as q
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as e:
        raise FrontEndError(f"the pt2e quantizer needs torchao ({e}): pip install 'qrt[convert]', "
                            "or pass --quantizer fx") from None

    return observer, q, prepare_pt2e, convert_pt2e


# ------------------------------------------------------------ schemes


def scheme_of(rules: Rules, path: str, weights: str, weight_dtype: str) -> str:
    """The scheme of the module at path: "float", "float16", "per-tensor" or "per-channel". A rules
    module_schemes entry covers the module and everything inside it, the innermost entry winning (as
    QConfigMapping's set_module_name)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        scheme = rules.module_schemes.get(".".join(parts[:n]))
        if scheme is not None:
            return scheme
    return "float16" if weight_dtype == "float16" else (rules.weights or weights)


def _rule_allows(rules: Rules, pattern: str, mode: str, scheme: str) -> bool:
    rule = rules.pattern(pattern)
    if rule is None or scheme == "float":
        return False
    if mode == "static":
        return rule.static and scheme != "float16"
    return ("float16" if scheme == "float16" else "qint8") in rule.dynamic


def _specs(mode: str, scheme: str, engine: str) -> tuple[Any, Any]:
    """(activation spec, weight spec) for an int8 scheme: qrt_backend.qconfig's observers, torchao's copies."""
    observer, q, _, _ = _pt2e()
    if scheme == "per-channel":
        weight = q.QuantizationSpec(torch.int8, observer.PerChannelMinMaxObserver, -128, 127,
                                    torch.per_channel_symmetric, ch_axis=0)
    else:
        weight = q.QuantizationSpec(torch.int8, observer.MinMaxObserver, -128, 127, torch.per_tensor_symmetric)
    if mode == "dynamic":
        act = q.QuantizationSpec(torch.uint8, observer.PlaceholderObserver, 0, 255, torch.per_tensor_affine,
                                 is_dynamic=True)
    else:
        # reduce_range on x86 (7-bit qparams) as the FX flow's qconfig; qnnpack uses the full range.
        histogram = observer.HistogramObserver.with_args(reduce_range=engine != "qnnpack")
        act = q.QuantizationSpec(torch.uint8, histogram, 0, 255, torch.per_tensor_affine)
    return act, weight


# ------------------------------------------------------------ the Quantizer


def _module_at(model: nn.Module, node: torch.fx.Node) -> tuple[str, nn.Module | None]:
    """The innermost module a node runs in (its nn_module_stack), and its path."""
    path = module_stack.innermost(node)[0]
    if not path:
        return "", None
    try:
        return path, model.get_submodule(path)
    except AttributeError:
        return path, None


def _fused_relu(model: nn.Module, node: torch.fx.Node) -> torch.fx.Node | None:
    """The relu that alone reads a Linear's output and that torch.ao fuses: an nn.ReLU module or F.relu."""
    users = list(node.users)
    if len(users) != 1 or users[0].target not in (torch.ops.aten.relu.default, torch.ops.aten.relu_.default):
        return None
    relu = users[0]
    _, module = _module_at(model, relu)
    if isinstance(module, nn.ReLU):
        return relu
    # torch.export records the torch-level call: F.relu is a Python function, torch.relu a builtin.
    _, fn = relu.meta.get("torch_fn") or ("", "")
    return relu if fn == "function.relu" else None


def make_quantizer(model: nn.Module, rules: Rules, mode: str, weight_dtype: str, weights: str, engine: str) -> Any:
    """A pt2e Quantizer annotating model's exported graph under the rules (module docstring), a
    ``QrtQuantizer``. What it leaves to do after the raise, by module path: ``fused``, the Linears fused
    with the ReLU after them (``fused_relus``, those of the ReLUs that are nn.ReLU modules,
    ``fused_functional`` the Linears fused with an F.relu); of these,
    ``float_fused`` the ones left float; ``float16``, the Linears with float16 weights."""
    _, q, _, _ = _pt2e()

    class QrtQuantizer(q.Quantizer):
        def __init__(self) -> None:
            super().__init__()
            self.fused: set[str] = set()
            self.fused_relus: set[str] = set()
            self.fused_functional: set[str] = set()
            self.float_fused: set[str] = set()
            self.float16: set[str] = set()

        def annotate(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
            for node in gm.graph.nodes:
                if node.op == "call_function" and node.target == torch.ops.aten.linear.default:
                    self._linear(node)
            return gm

        def _linear(self, node: torch.fx.Node) -> None:
            path, module = _module_at(model, node)
            if not isinstance(module, nn.Linear):  # an F.linear: torch.ao declares Linear modules only
                return
            # prepare_fx fuses every Linear -> ReLU its BackendConfig declares, quantized or not.
            relu = _fused_relu(model, node) if rules.pattern("linear_relu") is not None else None
            if relu is not None:
                self.fused.add(path)
                relu_path, relu_module = _module_at(model, relu)
                if isinstance(relu_module, nn.ReLU):
                    self.fused_relus.add(relu_path)
                else:
                    self.fused_functional.add(path)
            scheme = scheme_of(rules, path, weights, weight_dtype)
            if not _rule_allows(rules, "linear" if relu is None else "linear_relu", mode, scheme):
                if relu is not None:
                    self.float_fused.add(path)
                return
            if scheme == "float16":  # no pt2e scheme: lowered after the raise (module docstring)
                self.float16.add(path)
                return
            act, weight = _specs(mode, scheme, engine)
            static = mode == "static"
            x, w = node.args[:2]
            node.meta[_ANNOTATION] = q.QuantizationAnnotation(
                {x: act, w: weight}, act if static and relu is None else None, _annotated=True
            )
            if static and relu is not None:
                relu.meta[_ANNOTATION] = q.QuantizationAnnotation({}, act, _annotated=True)

        def validate(self, gm: torch.fx.GraphModule) -> None:
            pass

    return QrtQuantizer()


# ------------------------------------------------------------ the flow


def _whole_paths(model: nn.Module) -> tuple[str, ...]:
    """The modules pt2e sees only as calls: the recurrent ones (it annotates none) and the BatchNorms."""
    return tuple(name for name, m in model.named_modules()
                 if name and (type(m) in _RECURRENT or isinstance(m, _BATCH_NORMS)))


def _keep_whole(gm: torch.fx.GraphModule, ep: Any, model: nn.Module, paths: tuple[str, ...]) -> None:
    """Each call of a recurrent module or a BatchNorm (_whole_paths) replaced by one call_module of the float
    module: its arguments and results as its kept call signature says, or as its ATen op says (a module called
    again with arguments of another structure keeps none; export_frontend.derived_call), or for a module returning
    one tensor, the tensors it reads from outside in their order (as the export front end calls it)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    signatures = {e.fqn: e.signature for e in ep.module_call_graph if e.signature}
    for fqn, (path, members) in export_frontend.module_calls(list(gm.graph.nodes), set(paths)).items():
        inside = set(members)
        module = model.get_submodule(path)
        sig = signatures.get(fqn)
        if sig is not None:
            outputs = [by_name[o.name] for o in sig.outputs]
            args, kwargs, _ = export_frontend.kept_call(sig, by_name)
            structure = pytree.tree_unflatten(list(range(len(outputs))), sig.out_spec)
        else:
            # (a size read is no argument; an earlier call's result, made here, has no "val")
            outer = list(dict.fromkeys(a for n in members for a in n.all_input_nodes if a not in inside
                                       and not isinstance(a.meta.get("val"), torch.SymInt) and a.op != "get_attr"))
            try:
                call = export_frontend.derived_call(path, module, members, outer)
            except export_frontend.ExportError as e:
                raise FrontEndError(f"{e} (use --quantizer fx)") from None
            kwargs = {}
            if call is None:  # a cell returning one tensor
                args, structure = outer, 0
                outputs = [n for n in members if any(u not in inside for u in n.users)]
                if len(outputs) != 1:
                    raise FrontEndError(f"module {path!r} ({type(module).__name__}): its call's result cannot be "
                                        "told apart (use --quantizer fx)")
            else:
                args, results = call
                outputs, spec = pytree.tree_flatten(results)
                structure = pytree.tree_unflatten(list(range(len(outputs))), spec)
        with gm.graph.inserting_before(members[0]):
            call_node = gm.graph.call_module(path, tuple(_tuples(args)), {k: _tuples(v) for k, v in kwargs.items()})
        _replace_outputs(gm, call_node, structure, outputs, by_name)
        for n in reversed(members):
            gm.graph.erase_node(n)
        _set_module(gm, path, _Whole(module))
    for n in list(gm.graph.nodes):  # the recurrent modules' parameters, read by the module now
        if n.op == "get_attr" and not n.users:
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()


class _Whole(nn.Module):
    """A recurrent module through pt2e: convert_pt2e would take the module itself for one it quantizes."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def _restore_signatures(program: Any, ep: Any, paths: tuple[str, ...]) -> None:
    """The kept call signatures of the recurrent modules, which the second export (of a graph module that
    calls them) does not keep: the first export's structure over the second's nodes. A module's call is
    one ATen op (aten.lstm, aten.gru_cell, ...): its inputs are the tensors it reads from outside (the
    user's arguments, in order), its outputs the items of the op's result, in order."""
    first = {e.fqn: e.signature for e in ep.module_call_graph if e.signature}
    params = {s.arg.name for s in program.graph_signature.input_specs if s.kind != InputKind.USER_INPUT}
    calls = export_frontend.module_calls(list(program.graph.nodes), set(paths))
    for entry in program.module_call_graph:
        sig = first.get(entry.fqn)
        if entry.fqn not in calls or entry.signature is not None or sig is None:
            continue
        members = calls[entry.fqn][1]
        inside = set(members)
        inputs = list(dict.fromkeys(a for n in members for a in n.all_input_nodes
                                    if a not in inside and a.name not in params
                                    and isinstance(a.meta.get("val"), torch.Tensor)))
        items = sorted((n for n in members if n.target is operator.getitem and n.args[0] in inside),
                       key=lambda n: n.args[1])
        outputs = ([export_frontend.last_of(n, inside) for n in items] if items
                   else [n for n in members if n.users.keys() - inside])
        tensors = [i for i, a in enumerate(sig.inputs) if isinstance(a, TensorArgument)]  # not a None state
        if len(inputs) != len(tensors) or len(outputs) != len(sig.outputs):
            raise FrontEndError(f"module {entry.fqn!r}: its call cannot be found again after pt2e "
                                "(use --quantizer fx)")
        kept = list(sig.inputs)
        for i, n in zip(tensors, inputs):
            kept[i] = TensorArgument(n.name)
        entry.signature = dataclasses.replace(sig, inputs=kept, outputs=[TensorArgument(n.name) for n in outputs])


def _tuples(v: Any) -> Any:
    return tuple(_tuples(i) for i in v) if isinstance(v, (list, tuple)) else v


def _replace_outputs(gm: torch.fx.GraphModule, value: torch.fx.Node, structure: Any, outputs: list,
                     by_name: dict[str, torch.fx.Node]) -> None:
    """Uses of outputs[i] read the leaf i of value (shaped as structure) instead; by_name (the names of the
    first export's nodes, which later signatures name) follows."""
    if isinstance(structure, int):
        if outputs[structure] is not None:  # None: an item nothing reads
            outputs[structure].replace_all_uses_with(value)
            by_name[outputs[structure].name] = value
        return
    for k, child in enumerate(structure):
        with gm.graph.inserting_after(value):
            item = gm.graph.call_function(operator.getitem, (value, k))
        _replace_outputs(gm, item, child, outputs, by_name)


def _set_module(gm: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    owner = gm
    for part in parent.split(".") if parent else []:
        if not hasattr(owner, part):
            owner.add_module(part, nn.Module())
        owner = getattr(owner, part)
    setattr(owner, name, module)


def _full_range(gm: torch.fx.GraphModule) -> None:
    """Static activations are quint8 [0, 255] (torch.quantize_per_tensor's range, which qrt's
    quantize_per_tensor clamps to); reduce_range only narrows the range the observer chose qparams over,
    which convert_pt2e writes into the Q/DQ ops."""
    ops = torch.ops.quantized_decomposed
    targets = (ops.quantize_per_tensor.default, ops.dequantize_per_tensor.default)
    for node in gm.graph.nodes:
        if node.target in targets and node.args[3:6] == (0, 127, torch.uint8):
            node.args = (*node.args[:3], 0, 255, torch.uint8, *node.args[6:])
    gm.recompile()


def quantize(
    model: nn.Module,
    specs: Sequence[qshapes.Spec],
    names: Sequence[str],
    rules: Rules,
    mode: str,
    weight_dtype: str,
    weights: str,
    engine: str,
    calibrate: Callable[[torch.fx.GraphModule], None] | None = None,
) -> torch.fx.GraphModule:
    """The float model quantized by pt2e under the rules, as the reference graph the lowering reads.

    ``specs``: the inputs, resolved (dtypes) and their free dimensions marked. ``calibrate``: static mode,
    called with the prepared model, runs it on the calibration batches."""
    _, _, prepare_pt2e, convert_pt2e = _pt2e()
    paths = _whole_paths(model)
    for name, scheme in rules.module_schemes.items():
        if name not in dict(model.named_modules()):
            raise FrontEndError(f"rules {rules.name!r} name module {name!r}, which the model does not have")
        if mode == "static" and scheme == "float16":
            raise FrontEndError("static mode needs qint8 weights, not float16")
    quantizer = make_quantizer(model, rules, mode, weight_dtype, weights, engine)
    try:
        with quiet():
            ep = export_frontend.export(model.eval(), specs)
            gm = ep.module()
            _keep_whole(gm, ep, model, paths)
            prepared = prepare_pt2e(gm, quantizer)
            if calibrate is not None:
                calibrate(prepared)
            else:  # the weights' observers see the weights (convert_fx observes them at convert)
                with torch.no_grad():
                    prepared(*qshapes.examples(specs))
            converted = convert_pt2e(prepared)
            _full_range(converted)
            for path in paths:  # the module itself again, called as the export front end keeps it
                _set_module(converted, path, model.get_submodule(path))
            program = export_frontend.export(converted, specs)
        _restore_signatures(program, ep, paths)
        # Linears are raised from their Q/DQ ops, fused ReLUs with them; other leaf modules are called.
        leaves = {path: m for path, m in export_frontend.leaf_modules(model).items()
                  if not isinstance(m, nn.Linear) and path not in quantizer.fused_relus}
        raised = export_frontend.raise_program(program, names, leaves=leaves)
    except export_frontend.ExportError as e:
        raise FrontEndError(str(e)) from None
    _as_fx_reference(raised, rules, mode, weight_dtype, weights, quantizer)
    return raised


# ------------------------------------------------------------ after the raise


def _as_fx_reference(gm: torch.fx.GraphModule, rules: Rules, mode: str, weight_dtype: str, weights: str,
                     quantizer: Any) -> None:
    """What pt2e has no scheme for, and the dynamic graph as torch.ao's FX flow writes it (module docstring)."""
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is quantize_dynamic_8bit:
            # torch.ao's dynamic quantize: reduce_range as the FX flow's linear_dynamic has it.
            with gm.graph.inserting_before(node):
                q = gm.graph.call_function(torch.quantize_per_tensor_dynamic, (node.args[0], torch.quint8, True))
            node.replace_all_uses_with(q)
            gm.graph.erase_node(node)
            continue
        if node.op != "call_module":
            continue
        path, module = str(node.target), modules[str(node.target)]
        if isinstance(module, pt2e.QLinear) and path in quantizer.fused and not module.layer.relu:
            _fuse_relu(gm, node, module)
        elif isinstance(module, nn.Linear) and path in quantizer.float_fused:
            # a Linear -> ReLU fused and left float, as prepare_fx leaves it (lowered as linear_float + relu)
            _set_module(gm, path, nn.Sequential(module, nn.ReLU()))
            _drop_relu(gm, node)
        elif isinstance(module, nn.Linear) and path in quantizer.float16:
            layer = LinearLayer("linear_relu" if path in quantizer.fused else "linear", _float16(module.weight),
                                _bias(module.bias), path in quantizer.fused, "dynamic")
            _set_module(gm, path, Quantized(module, layer))
            if layer.relu:
                _drop_relu(gm, node)
        elif type(module) in _RECURRENT and mode == "dynamic":
            scheme = scheme_of(rules, path, weights, weight_dtype)
            if _rule_allows(rules, _RECURRENT[type(module)], mode, scheme):
                _set_module(gm, path, Quantized(module, _recurrent_layer(module, scheme)))
    _renumber(gm, quantizer.fused_functional)


def _renumber(gm: torch.fx.GraphModule, functional: set[str]) -> None:
    """The graph's nodes named as torch.fx names them (after their target, numbered in order), as in the
    FX flow's graph, whose names qrt's nodes take: the nodes dropped here gone, but an F.relu fused into
    the Linear before it counted, as torch.fx traced it before fusing."""
    graph, env = torch.fx.Graph(), {}
    for node in gm.graph.nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        env[node] = graph.create_node(node.op, node.target, args, kwargs)
        env[node].meta = node.meta
        if node.op == "call_module" and node.target in functional:
            graph.erase_node(graph.call_function(F.relu, (env[node],)))  # its name stays taken
    gm.graph = graph
    gm.graph.lint()
    gm.recompile()


def _fuse_relu(gm: torch.fx.GraphModule, node: torch.fx.Node, module: pt2e.QLinear) -> None:
    """A dynamic Linear and the relu fused with it: one module, as torch.ao's LinearReLU."""
    layer = module.layer
    fused = LinearLayer("linear_relu", layer.weight, layer.bias, True, layer.mode, layer.output_qparams)
    module.layer = fused
    _drop_relu(gm, node)


def _drop_relu(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    (relu,) = node.users
    relu.replace_all_uses_with(node)
    gm.graph.erase_node(relu)


class Quantized(nn.Module):
    """A float module in the raised graph with the layer qrt runs for it; forward runs the float module
    (only the converter's shape runs call it)."""

    def __init__(self, module: nn.Module, layer: Layer) -> None:
        super().__init__()
        self.float_module = module
        self.layer = layer
        self.relu = isinstance(layer, LinearLayer) and layer.relu

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        y = self.float_module(*args, **kwargs)
        return torch.relu(y) if self.relu else y


def describe(module: nn.Module) -> Layer | None:
    """The export front end's descriptions, and the layers this path quantized after the raise."""
    if isinstance(module, Quantized):
        return module.layer
    return export_frontend.describe(module)


def _bias(b: torch.Tensor | None) -> np.ndarray | None:
    return None if b is None else b.detach().float().numpy().copy()


def _float16(w: torch.Tensor) -> QWeight:
    # fbgemm clamps to the float16 range before rounding (NUMERICS.md); .to(float16) would give inf.
    return QWeight(np.clip(w.detach().float().numpy(), -65504.0, 65504.0).astype(np.float16))


def _int8(w: torch.Tensor, scheme: str) -> QWeight:
    """A weight as quantize_dynamic quantizes it: the observer's symmetric qparams, torch's rounding."""
    observer, _, _, _ = _pt2e()
    w = w.detach().float()
    if scheme == "per-channel":
        obs = observer.PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    else:
        obs = observer.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    obs(w)
    scale, zp = obs.calculate_qparams()
    ops = torch.ops.quantized_decomposed
    if scheme == "per-channel":
        ints = ops.quantize_per_channel(w, scale, zp, 0, -128, 127, torch.int8)
        return QWeight(ints.numpy().copy(), scale.numpy().astype(np.float32), zp.numpy().astype(np.int32))
    ints = ops.quantize_per_tensor(w, float(scale), int(zp), -128, 127, torch.int8)
    return QWeight(ints.numpy().copy(), np.asarray(scale.item(), np.float32), np.asarray(int(zp), np.int32))


def _recurrent_layer(module: nn.Module, scheme: str) -> Layer:
    pattern = _RECURRENT[type(module)]

    def weight(w: torch.Tensor) -> QWeight:
        return _float16(w) if scheme == "float16" else _int8(w, scheme)

    def cell(cell_pattern: str, suffix: str) -> RNNCellLayer:
        get = lambda name: getattr(module, name + suffix, None)  # noqa: E731
        return RNNCellLayer(cell_pattern, weight(get("weight_ih")), _bias(get("bias_ih")), weight(get("weight_hh")),
                            _bias(get("bias_hh")), getattr(module, "nonlinearity", "tanh"))

    if isinstance(module, nn.RNNCellBase):
        return cell(pattern, "")
    if getattr(module, "proj_size", 0):
        raise FrontEndError("an LSTM with proj_size has no quantized form")
    dirs = ("", "_reverse")[: 2 if module.bidirectional else 1]
    directions = tuple(cell(f"{pattern}_cell", f"_l{n}{d}") for n in range(module.num_layers) for d in dirs)
    return SequenceLayer(pattern, directions, module.num_layers, module.bidirectional, module.batch_first,
                         getattr(module, "nonlinearity", "tanh"))

"""The torch.export front end: a model (or a ``.pt2`` program) as the torch-level fx graph the lowering reads.

torch.fx cannot trace many real models; torch.export can. This front end exports the model on the
example inputs, every dimension ``Dim.AUTO`` (torch.export keeps dynamic the ones the model lets
vary), and *raises* the ATen graph back to the graph torch.fx would have traced:

- each call of a leaf module (a ``torch.nn`` module, as ``torch.fx.Tracer`` treats it) becomes a
  ``call_module`` of that module again, found by the nodes' ``nn_module_stack``;
- every other ATen op becomes the torch function of the same name (``aten.relu`` -> ``torch.relu``,
  ``aten.view`` -> ``torch.reshape``, ``aten.sym_size`` -> ``.size()``, ...), params and buffers
  ``get_attr`` nodes;
- pt2e's Q/DQ ops (``quantized_decomposed``) become torch.ao's reference graph (tools/pt2e.py).

From there the FX front end's flow runs unchanged (quantization under qrt's rules, tools/lower.py),
so where both front ends work they write the same file. torch.ao's quantized modules cannot be
exported (packed parameters): float stand-ins take their place for the export and the raised graph
calls the quantized modules again.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import itertools
import logging
import operator
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import sympy
import torch
import torch.fx
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from . import (
    decomposed_attention,
    decomposed_linear,
    keywords,
    lower_masks,
    module_stack,
    pt2e,
    qrt_backend,
    recurrent_program,
    torchao_frontend,
)
from . import shapes as qshapes
from .layers import EmbeddingLayer, Layer, LinearLayer, RNNCellLayer, SequenceLayer, StubLayer
from .lower import TIED_DIMS
from .lower_values import FUNCTIONS, LoweringError

_TUPLE_MODULES = (nn.RNNBase, nn.LSTMCell)
_RETURNED = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)  # what the program returns, not what it writes back


class ExportError(ValueError):
    """The export front end cannot read the model; the message says why."""


class RaiseError(ExportError):
    """torch.export exported the model, but its graph holds what qrt does not lower."""


# ------------------------------------------------------------ exporting


def _dynamic_shapes(spec: qshapes.Spec) -> Any:
    if isinstance(spec, tuple):
        return tuple(_dynamic_shapes(s) for s in spec)
    return {d: Dim.AUTO for d in range(len(spec.dims))}


def _widened(spec: qshapes.Spec) -> qshapes.Spec:
    """The spec with sizes 0 and 1 at 2n+3: torch.export specializes those (0/1 specialization), which
    would write a batch of 1 into the graph as a constant."""
    if isinstance(spec, tuple):
        return tuple(_widened(s) for s in spec)
    return qshapes.Leaf(tuple(qshapes.Dim(2 * d.size + 3 if d.size < 2 else d.size) for d in spec.dims), spec.dtype)


@contextlib.contextmanager
def _torch_logs_held() -> Iterator[None]:
    """torch's log lines and prints held back while exporting: the tracebacks of attempts the converter makes
    and then retries otherwise (an input first tried as float32, an example size widened), notices of dimensions
    it specialized, which the converter's own search decides, and the whole graph torch.export prints when it
    fails. A failure is reported by the converter's message."""
    with qrt_backend.loggers_at(logging.CRITICAL, "torch"), contextlib.redirect_stderr(io.StringIO()):
        yield


def export(model: nn.Module, specs: Sequence[qshapes.Spec]) -> ExportedProgram:
    """torch.export of model on examples of specs, every dimension free to vary (Dim.AUTO).

    Recurrent modules return tuples: their calls' signatures are kept (ep.module_call_graph), which
    says which nodes are their inputs and outputs, in which structure. A module called again with
    arguments of another structure cannot keep one: then the export goes without, and the raise reads
    each call from its ATen op."""
    dynamic = tuple(_dynamic_shapes(s) for s in specs)
    tuples = tuple(name for name, m in model.named_modules() if isinstance(m, _TUPLE_MODULES))
    first_error = None
    keeps = (tuples, ()) if tuples else ((),)
    for tried, keep in itertools.product(([_widened(s) for s in specs], list(specs)), keeps):
        try:
            with torch.no_grad(), _torch_logs_held():
                return torch.export.export(model, tuple(qshapes.examples(tried)), dynamic_shapes=dynamic,
                                           preserve_module_call_signature=keep)
        except Exception as e:  # torch.export raises many kinds; the message is the user's clue
            first_error = first_error or e
    raise ExportError(f"torch.export cannot export the model ({type(first_error).__name__}: "
                      f"{str(first_error).strip().splitlines()[0] if str(first_error).strip() else ''})")


class _LoggedErrors(logging.Handler):
    """The exceptions torch.export.load logs (as warnings) before it raises one that only points at them."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


def _innermost(e: BaseException) -> BaseException:
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    return e


# A program returning a HuggingFace ModelOutput names its class, which transformers registers with pytree when its
# module is imported: an installed package the converter reads models of (docs/CONVERTER.md, way 4).
_UNREGISTERED = re.compile(r"Deserializing (transformers(?:\.\w+)+)\.\w+ in pytree is not registered")


def load(path: str) -> ExportedProgram:
    """A program written by torch.export.save. Its weights are read as plain tensors (no pickled code)."""
    pt2e.register_ops()  # a pt2e program names quantized_decomposed ops, which must exist to load it
    imported: set[str] = set()
    while True:
        caught, logger = _LoggedErrors(), logging.getLogger("torch.export")
        # in place of torch's handlers: its traceback in the log would come before the line that names it
        handlers, logger.handlers = logger.handlers, [caught]
        try:
            return torch.export.load(path)
        except Exception as e:
            cause = _innermost(caught.errors[-1]) if caught.errors else e
            module = _UNREGISTERED.search(str(cause))
            if module and module.group(1) not in imported and importlib.util.find_spec("transformers"):
                imported.add(module.group(1))
                importlib.import_module(module.group(1))
                continue
            raise ExportError(f"cannot read {path!r} as a torch.export program (.pt2): "
                              f"{type(cause).__name__}: {cause}") from None
        finally:
            logger.handlers = handlers


def is_pt2(path: str) -> bool:
    return os.fspath(path).endswith(".pt2")


def program_specs(ep: ExportedProgram) -> tuple[list[qshapes.Spec], list[str]]:
    """A saved program's inputs as specs (its dynamic dimensions marked free) and argument names.

    Each dynamic dimension gets an example size inside its range; dimensions of one size (_size_keys) share it,
    inside every range of theirs.
    """
    structure, names = program_arguments(ep)
    vals = _user_values(ep)
    keys = _size_keys(ep, by_example=True)
    ranges: dict[Any, tuple[int, Any]] = {}  # key -> (lowest, highest): the ranges of its symbols, intersected
    for leaf, v in enumerate(vals):
        for i, d in enumerate(v.shape):
            if _dynamic(d):
                r = ep.range_constraints.get(d.node.expr)
                finite = r is not None and isinstance(r.upper, sympy.Integer)  # not torch's int_oo
                lo, hi = (2, None) if r is None else (int(r.lower), int(r.upper) if finite else None)
                was_lo, was_hi = ranges.get(keys[leaf, i], (lo, hi))
                ranges[keys[leaf, i]] = max(lo, was_lo), min((h for h in (hi, was_hi) if h is not None), default=None)
    sizes: dict[Any, int] = {}

    def dim(leaf: int, i: int, d: Any) -> qshapes.Dim:
        if not _dynamic(d):
            return qshapes.Dim(int(d))
        key = keys[leaf, i]
        if key not in sizes:
            lo, hi = ranges[key]
            size = max(lo, 3 + 2 * len(sizes))  # distinct sizes: the search tells them apart
            sizes[key] = size if hi is None or size <= hi else hi
        return qshapes.Dim(sizes[key], free=True)

    leaves = iter(qshapes.Leaf(tuple(dim(leaf, i, d) for i, d in enumerate(v.shape)), _dtype(v.dtype))
                  for leaf, v in enumerate(vals))
    specs = [pytree.tree_map(lambda _: next(leaves), arg) for arg in structure]
    specs = [tuple(s) if isinstance(s, list) else s for s in specs]
    return specs, names


def program_arguments(ep: ExportedProgram) -> tuple[list, list[str]]:
    """The program's arguments, each as its flat input indices (nested as the argument is), and their names: the
    positional ones, then those it was exported with by keyword (a HuggingFace model's), in the program's
    input order."""
    in_spec = ep.call_spec.in_spec
    args, kwargs = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    return [*args, *kwargs.values()], [*_arg_names(ep, len(args)), *kwargs]


def _dynamic(size: Any) -> bool:
    """Whether a size of an exported input is a symbol (a SymInt can also be a constant)."""
    return isinstance(size, torch.SymInt) and not size.node.expr.is_number


def _dtype(dtype: torch.dtype) -> str:
    for name, d in qshapes.DTYPES.items():
        if d == dtype:
            return name
    raise ExportError(f"the program takes a {dtype} input; qrt inputs are {', '.join(qshapes.DTYPES)}")


def _arg_names(ep: ExportedProgram, n: int) -> list[str]:
    """forward()'s argument names, as torch.export records them."""
    root = next((e.signature for e in ep.module_call_graph if e.fqn == "" and e.signature), None)
    names = list(getattr(root, "forward_arg_names", None) or [])
    return names[:n] if len(names) >= n else [f"input{i}" for i in range(n)]


# ------------------------------------------------------------ stand-ins for torch.ao's quantized modules


class _LinearStandIn(nn.Module):
    """A float Linear (+ReLU) in a quantized module's place while exporting; only its shapes matter."""

    def __init__(self, layer: LinearLayer) -> None:
        super().__init__()
        out_features, in_features = layer.weight.values.shape
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)
        # a bias as nn.Linear has one: nn.TransformerEncoderLayer reads it (its fast path's check)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False)
        self.relu = layer.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return torch.relu(y) if self.relu else y


class _StubStandIn(nn.Module):
    """A float QuantStub / DeQuantStub: the tensor as it is, through one ATen op (a copy) that marks the call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


_FLOAT_CELLS = {"rnn_cell": nn.RNNCell, "lstm_cell": nn.LSTMCell, "gru_cell": nn.GRUCell}
_FLOAT_SEQUENCES = {"lstm": nn.LSTM, "gru": nn.GRU}  # torch.ao quantizes no nn.RNN


def _float_stand_in(module: nn.Module, layer: Layer | None) -> nn.Module | None:
    """A float module taking and returning tensors of the shapes the quantized module does (only its shapes
    matter, not its weights), or None where there is none. Recurrent ones are torch's own classes, so that
    their calls' signatures are kept (tuples) as a float model's are."""
    if isinstance(layer, LinearLayer):
        return _LinearStandIn(layer)
    if isinstance(layer, StubLayer):
        return _StubStandIn()
    if isinstance(layer, RNNCellLayer):
        extra = {"nonlinearity": layer.nonlinearity} if layer.pattern == "rnn_cell" else {}
        return _FLOAT_CELLS[layer.pattern](layer.ih_weight.values.shape[1], layer.hh_weight.values.shape[1], **extra)
    if isinstance(layer, SequenceLayer):
        first = layer.directions[0]
        return _FLOAT_SEQUENCES[layer.pattern](
            first.ih_weight.values.shape[1], first.hh_weight.values.shape[1], layer.num_layers,
            batch_first=layer.batch_first, bidirectional=layer.bidirectional)
    if isinstance(layer, EmbeddingLayer) and layer.pattern == "embedding":
        return nn.Embedding(layer.weight.shape[0], layer.dim)
    if isinstance(layer, EmbeddingLayer):
        # torch's 4-bit bag returns a padded width: the stand-in returns the width the module does
        width = module(torch.zeros(1, 1, dtype=torch.int64)).shape[-1]
        return nn.EmbeddingBag(layer.weight.shape[0], width, mode="sum")
    return None


def stand_in(model: nn.Module) -> tuple[nn.Module, dict[str, nn.Module]]:
    """A copy of model with float stand-ins for its quantized modules, and path -> the quantized module."""
    quantized: dict[str, nn.Module] = {}
    stand_ins: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if not name or not type(m).__module__.startswith(qrt_backend.QUANTIZED_PACKAGES):
            continue
        if any(name.startswith(p + ".") for p in quantized):
            continue
        float_module = _float_stand_in(m, qrt_backend.describe(m))
        if float_module is None:
            raise ExportError(
                f"module {name!r} ({type(m).__module__}.{type(m).__qualname__}): the export front end has no "
                "float stand-in for it; use --frontend fx"
            )
        quantized[name], stand_ins[name] = m, float_module.eval()
    if not quantized:
        return model, {}
    copy = _shallow_copy(model)
    for name, float_module in stand_ins.items():
        parent, _, attr = name.rpartition(".")
        setattr(copy.get_submodule(parent) if parent else copy, attr, float_module)
    return copy, quantized


def _shallow_copy(model: nn.Module) -> nn.Module:
    """model with every submodule copied (not its tensors), so that swapping one leaves model as it is."""
    import copy

    out = copy.copy(model)
    out._modules = {k: _shallow_copy(v) if v is not None else None for k, v in model._modules.items()}
    return out


# ------------------------------------------------------------ raising the ATen graph


def _leaf_key(node: torch.fx.Node, leaves: Any) -> tuple[str, str] | None:
    """(stack key, module path) of the outermost leaf module the node runs in, or None."""
    for key, (path, _) in (node.meta.get("nn_module_stack") or {}).items():
        if path in leaves:
            return key, path
    return None


# torch.nn modules whose forward torch.export writes as ops qrt lowers: read through, not called as one module
THROUGH = (nn.TransformerEncoder, nn.TransformerEncoderLayer, nn.MultiheadAttention)


class Tracer(torch.fx.Tracer):
    """torch.fx's tracer, but for THROUGH (whose forwards torch.fx cannot trace: the export front end reads them)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return not isinstance(m, THROUGH) and super().is_leaf_module(m, module_qualified_name)


def _leaf_paths(model: nn.Module | None, quantized: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Module path -> the module the raised graph calls: torch.fx's leaf modules, and the quantized ones."""
    if model is None:
        return {}
    tracer = Tracer()
    out = {name: m for name, m in model.named_modules() if name and tracer.is_leaf_module(m, name)}
    out.update(quantized)
    return out


# aten ops -> the torch function of the lowering table that computes the same from the same arguments
_RENAMED = {
    "_unsafe_view": torch.reshape,
    "reshape": torch.reshape,
    "gelu": F.gelu,
    "silu": F.silu,
    "log_softmax": torch.log_softmax,
    "softmax": torch.softmax,
    "linalg_vector_norm": torch.linalg.vector_norm,
}
# Written as operators by users: torch.fx traces x / y as operator.truediv (and names the node after it).
_OPERATORS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
_METHODS = ("expand", "expand_as", "new_ones", "new_zeros", "new_full", "masked_fill", "unflatten", "type_as",
            "view_as", "reshape_as", "repeat")
_LOGICAL = {"__and__": operator.and_, "__or__": operator.or_, "__invert__": operator.invert}
_INT64_MAX = (1 << 63) - 1
_INNER_TENSOR = torch.ops.export.access_subclass_inner_tensor.default
_SYM_SIZE = torch.ops.aten.sym_size.int
_FACTORIES = ("zeros", "ones", "full", "scalar_tensor")  # of constant sizes and values: constants
# in-place ops that are their out-of-place ones where nothing else reads the tensor they write
_IN_PLACE = ("add_", "sub_", "mul_", "div_", "masked_fill_")
_SKIPPED = ("_assert_scalar", "sym_constrain_range_for_size", "_assert_tensor_metadata", "sym_constrain_range")


def _torch_function(op: Any) -> Any:
    name = op.overloadpacket.__name__ if isinstance(op, torch._ops.OpOverload) else None
    if name is None:
        return op if op in FUNCTIONS else None
    if name in _RENAMED:
        return _RENAMED[name]
    for space in (torch, F):
        fn = getattr(space, name, None)
        if fn is not None and fn in FUNCTIONS:
            return fn
    return None


class _Raiser:
    def __init__(self, ep: ExportedProgram, leaves: dict[str, nn.Module], names: Sequence[str]) -> None:
        self.ep = ep
        self.leaves = leaves
        self.names = list(names)
        self.graph = torch.fx.Graph()
        self.root: dict[str, Any] = {}
        self.env: dict[torch.fx.Node, Any] = {}
        self.consts: dict[str, torch.Tensor] = {}
        self.errors: dict[str, list[str]] = {}  # why -> the nodes it stops
        self.q = pt2e.QDQ(self)
        self.targets: dict[str, str] = {}  # placeholder -> state-dict name
        # by result node: decomposed Linears and attentions
        self.linears: dict[torch.fx.Node, decomposed_linear.Linear] = {}
        self.attentions: dict[torch.fx.Node, decomposed_attention.Attention] = {}
        self.signatures = {e.fqn: e.signature for e in ep.module_call_graph
                           if e.fqn.partition("@")[0] in leaves and e.signature}

    def const_attr(self, name: str, value: torch.Tensor) -> torch.fx.Node:
        if name not in self.root:
            self.root[name] = value
        return self.graph.get_attr(name)

    # Nodes are named as torch.fx names them (after the module path, function or method), so that
    # both front ends name qrt's nodes alike.
    def module(self, path: str, module: nn.Module, args: Sequence[Any], kwargs: dict | None = None) -> torch.fx.Node:
        self.root[path] = module
        if len(args) == 2 and recurrent_program.has_zero_state(args[1]):  # lstm(x, (zeros.detach(), ...))
            args = recurrent_program.call_arguments(type(module).__name__.lower(), *args)
        return self.graph.create_node("call_module", path, tuple(args), dict(kwargs or {}))

    def function(self, fn: Any, args: Any, kwargs: Any) -> torch.fx.Node:
        return self.graph.create_node("call_function", fn, tuple(args), dict(kwargs))

    def method(self, method: str, args: Any) -> torch.fx.Node:
        return self.graph.create_node("call_method", method, tuple(args), {})

    def value(self, a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: self.env[n])

    def run(self) -> torch.fx.GraphModule:
        ep = self.ep
        kinds = {s.arg.name: s for s in ep.graph_signature.input_specs}
        self.targets = {name: s.target or "" for name, s in kinds.items()}
        tensors = {**ep.state_dict, **ep.constants}
        nodes = list(ep.graph.nodes)
        fields: set[torch.fx.Node] = set()
        for node in nodes:
            if node.op == "placeholder":
                spec = kinds[node.name]
                if spec.kind == InputKind.USER_INPUT:
                    continue
                self.consts[node.name] = tensors[spec.target]
            elif node.target is _INNER_TENSOR and node.args[0].name in self.consts:
                # a field of a tensor-subclass weight (torchao's qdata, scale): a constant like the weight
                self.consts[node.name] = getattr(self.consts[node.args[0].name], node.args[1])
                fields.add(node)
            elif node.op == "call_function" and node.users and node.all_input_nodes \
                    and all(a in fields for a in node.all_input_nodes):
                # computed from such fields alone (a transpose, a cast), once for every call of the layer: the
                # calls share it, so it is a constant too, not a part of the first call
                const = lambda a: self.consts[a.name]  # noqa: E731
                args, kwargs = pytree.tree_map_only(torch.fx.Node, const, (node.args, node.kwargs))
                self.consts[node.name] = node.target(*args, **kwargs)
                fields.add(node)
        self.linears = decomposed_linear.find(nodes, self.consts)
        self.attentions = decomposed_attention.find(nodes)
        self._inputs(nodes)
        groups = self._groups(nodes)
        inside = {n for _, members, _ in groups.values() for n in members}
        inside.update(n for part in (*self.linears.values(), *self.attentions.values()) for n in part.inside)
        recurrent = {module_stack.innermost(n)[0] for n in nodes if recurrent_program.is_recurrent(n)}
        for node in nodes:
            if node.name in self.consts:
                self.env[node] = pt2e.Constant(node.name, self.consts[node.name])
                continue
            if node.op == "placeholder":
                continue
            if node.op == "output":
                self._output(node)
                continue
            if node in groups:
                try:
                    self._call_leaf(node, *groups[node])
                except LoweringError as e:  # an LSTM given zeros for h alone, say: what reads its results cannot run
                    raise RaiseError(f"the export front end cannot raise: {e} (node {node.name!r})") from None
                continue
            if node in inside:  # the module call stands for it
                continue
            why = _unrolled(node, recurrent)
            if why is None:
                try:
                    self.env[node] = self._call(node)
                    continue
                except LoweringError as e:
                    why = str(e)
            self.errors.setdefault(why, []).append(node.name)
            self.env[node] = None
        if self.errors:  # each reason once, with the nodes it stops (not their reprs: whole argument lists)
            raise RaiseError("the export front end cannot raise: " + "; ".join(
                f"{why} (node{'s' if len(at) > 1 else ''} {', '.join(map(repr, at[:3]))}"
                f"{f', +{len(at) - 3} more' if len(at) > 3 else ''})" for why, at in self.errors.items()))
        gm = torch.fx.GraphModule(self.root, self.graph)
        gm.graph.lint()
        return gm

    def _inputs(self, nodes: list[torch.fx.Node]) -> None:
        """One placeholder per forward() argument; a tuple argument's tensors are taken out with getitem."""
        user = [n for n in nodes if n.op == "placeholder" and n.name not in self.consts]
        structure, _ = program_arguments(self.ep)
        for name, arg in zip(self.names, structure):
            self._unpack(pytree.tree_map(user.__getitem__, arg), self.graph.placeholder(name))

    def _unpack(self, structure: Any, value: torch.fx.Node) -> None:
        """value holds a tuple shaped as structure, whose leaves are nodes of the program (None where
        nothing reads that item): each one a getitem of it."""
        if isinstance(structure, torch.fx.Node):
            self.env[structure] = value
        elif structure is not None:
            for k, child in enumerate(structure):
                self._unpack(child, self.function(operator.getitem, (value, k), {}))

    def _groups(self, nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, tuple[str, list[torch.fx.Node], Any]]:
        """Each leaf-module call's first output node -> (module path, the call's nodes, its arguments and
        results as the module takes and returns them: (args, results) over program nodes, None for a module
        of one tensor in and out)."""
        out = {}
        for fqn, (path, members) in module_calls([n for n in nodes if n.name not in self.consts], self.leaves).items():
            inside = set(members)
            leaving = [n for n in members if any(u not in inside for u in n.users)]
            if not leaving:
                continue  # a call whose result nothing reads: its ATen ops are raised one by one, and dropped
            sig = self.signatures.get(fqn)
            call = self._kept(sig) if sig is not None else self._derived(path, members)
            if call is None and len(leaving) != 1:
                what = f"{type(self.leaves[path]).__module__}.{type(self.leaves[path]).__qualname__}"
                raise ExportError(
                    f"module {path!r} ({what}) returns a tuple; the export front end lowers modules "
                    "returning one tensor, and recurrent modules (use --frontend fx)"
                )
            out[leaving[0]] = (path, members, call)
        return out

    def _kept(self, sig: Any) -> tuple[Any, dict, Any]:
        """(arguments, keyword arguments, results) of a call from its signature, which torch.export kept."""
        return kept_call(sig, {n.name: n for n in self.ep.graph.nodes})

    def _derived(self, path: str, members: list[torch.fx.Node]) -> tuple[Any, dict, Any] | None:
        """(arguments, no keyword arguments, results) of a recurrent module's call whose signature torch.export
        could not keep (the module is called again with other arguments: (x), then (x, (h, c))), from its one
        ATen op (aten.lstm, aten.lstm_cell, ...): the tensors it reads from outside are the arguments, in order;
        the op's items, after what the module does to each alone (a batch_first transpose), the results. None for
        a module that is not recurrent (or returns one tensor)."""
        try:
            call = derived_call(path, self.leaves[path], members, self._outer_tensors(members))
        except ExportError as e:
            raise ExportError(f"{e} (use --frontend fx)") from None
        return None if call is None else (call[0], {}, call[1])

    def _outer_tensors(self, members: list[torch.fx.Node]) -> list[torch.fx.Node]:
        """The tensors a call's nodes read from outside it, in order, weights aside."""
        inside = set(members)
        args: list[torch.fx.Node] = []
        for n in members:
            if n.target is _SYM_SIZE:  # a size read of an outer tensor (a dynamic batch) does not make it an argument
                continue
            for a in n.all_input_nodes:
                # Sizes read inside the module (zeros for a missing state) are the module's own business.
                tensor = isinstance(a.meta.get("val"), torch.Tensor)
                if tensor and a not in inside and a.name not in self.consts and a not in args:
                    args.append(a)
        return args

    def _stored_argument(self, path: str, members: list[torch.fx.Node]) -> list[torch.fx.Node]:
        """The stored tensors a call reads that are not the module's own (DeBERTa's LayerNorm and Dropout of its
        relative embeddings' weight): its arguments, where it reads no computed one."""
        inside = set(members)
        own = f"{path}."
        return list(dict.fromkeys(a for n in members for a in n.all_input_nodes if a not in inside
                                  and a.name in self.consts and not self.targets.get(a.name, "").startswith(own)))

    def _call_leaf(self, out: torch.fx.Node, path: str, members: list[torch.fx.Node], call: Any) -> None:
        if call is None:
            args = self._outer_tensors(members) or self._stored_argument(path, members)
            self.env[out] = self.module(path, self.leaves[path], [self._attr(self.env[a]) for a in args])
            return
        args, kwargs, results = call
        value = self.module(path, self.leaves[path], [_tuples(self.value(a)) for a in args],
                            {k: _tuples(self.value(v)) for k, v in kwargs.items()})
        self._unpack(results, value)

    def _call(self, node: torch.fx.Node) -> Any:
        op = node.target
        if node.op != "call_function":
            raise LoweringError(f"{node.op} nodes are not supported")
        if pt2e.handles(op):
            return self.q.call(node)
        if node in self.q.fused:
            return self.q.fused[node]
        if node in self.linears:  # x W^T (+ b) as run_decompositions() writes it: a Linear
            linear = self.linears[node]
            return self.q.linear(node, tuple(self.value((linear.x, linear.weight, linear.bias))))
        if node in self.attentions:  # the math path of a scaled_dot_product_attention: the one op
            a = self.attentions[node]
            q, k, v, mask = (self._attr(x) for x in self.value((a.q, a.k, a.v, a.mask)))
            return self.function(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask, "scale": a.scale})
        name = op.overloadpacket.__name__ if isinstance(op, torch._ops.OpOverload) else None
        args, kwargs = self.value(node.args), self.value(node.kwargs)
        if name in _SKIPPED:
            return None
        if recurrent_program.is_zero_state(node):
            return recurrent_program.ZERO_STATE
        if name in _FACTORIES and not node.all_input_nodes:  # torch.zeros(8) in forward: torch.fx's trace runs it
            return pt2e.Constant(node.name, op(*args, **kwargs))
        if recurrent_program.is_recurrent(node):  # a saved program's: called as its module again
            path, module, call = recurrent_program.rebuild(node, args)
            return recurrent_program.results(self, self.module(path, module, call), name)
        if name == "linear":
            return self.q.linear(node, args)
        if op is operator.getitem and isinstance(args[0], pt2e.Marker):
            return self.q.getitem(args[0], args[1])
        args = tuple(self._attr(a) for a in args)
        kwargs = {k: self._attr(v) for k, v in kwargs.items()}
        if name in _IN_PLACE:  # y += 1, x.masked_fill_(...) on a value nothing else reads: the out-of-place op
            if len(node.args[0].users) > 1:
                raise LoweringError(f"{name} writes in place a tensor that is read elsewhere too (z = y; y += 1): "
                                    "qrt's ops do not write in place (write y = y + 1)")
            name = name[:-1]
            if name in _OPERATORS and not kwargs:  # y += b: the sum in y's dtype, as torch writes it back
                return self.method("type_as", (self.function(_OPERATORS[name], args, {}), args[0]))
        if name in ("sym_size", "view"):  # x.size(d), x.view(shape): as torch.fx traces them
            return self.method("size" if name == "sym_size" else "view", args)
        if name in _OPERATORS and not kwargs:
            return self.function(_OPERATORS[name], args, {})
        if name == "rsub" and not kwargs:
            return self.function(operator.sub, (args[1], args[0]), {})
        if name == "baddbmm" and kwargs.get("beta", 1) == 1 and kwargs.get("alpha", 1) == 1:
            # input + b1 @ b2 (MultiheadAttention's scores with a mask, need_weights=True)
            return self.function(operator.add, (args[0], self.function(torch.bmm, args[1:3], {})), {})
        if name == "reciprocal":  # c / x is torch's reciprocal(x) * c
            return self.function(operator.truediv, (1.0, args[0]), {})
        if name == "slice":
            x, dim, start, end, step = [*args, *(None, 0, None, None, 1)[len(args):]]
            if start in (None, 0) and end in (None, _INT64_MAX) and step == 1:
                return x  # x[:, :, 0] is a whole slice of dimension 0, then a select: torch.fx sees the select
            if any(isinstance(v, torch.fx.Node) for v in (start, end)):  # a bound read from a tensor's size
                return self.function(lower_masks.slice_dim, (x, dim, start, end, step), {})
            index = (slice(None),) * dim + (slice(start, end, step),)
            return self.function(operator.getitem, (x, index), {})
        if name == "select" and len(args) == 3 and isinstance(args[1], int):  # x[:, i], as users write it
            return self.function(operator.getitem, (args[0], (slice(None),) * args[1] + (args[2],)), {})
        if name == "arange" and len(args) in (2, 3) and all(type(a) is int for a in args[::2]) \
                and args[0] == 0 and args[2:] in ((), (1,)):
            args = args[1:2]  # arange.start_step(0, n): run_decompositions()'s arange(n)
        if name == "constant_pad_nd":  # F.pad as run_decompositions() writes it: (x, pad, value)
            return self.function(F.pad, args[:2], {"value": args[2] if len(args) > 2 else 0})
        if name == "numpy_T":  # x.T: its dimensions reversed
            return self.method("permute", (args[0], list(reversed(range(node.args[0].meta["val"].dim())))))
        if name == "embedding":  # aten: (weight, indices, padding_idx, ...); F.embedding: (input, weight, ...)
            return self.function(F.embedding, (args[1], args[0]), {})
        if name == "contiguous" or (name == "clone" and kwargs.get("memory_format") is torch.contiguous_format):
            # kept: a .view after it (MultiheadAttention's, a decomposed program's) needs it when torch runs the graph
            return self.method("contiguous", args[:1])
        if name in ("clone", "alias", "detach", "detach_", "lift_fresh_copy"):
            return args[0]  # lift_fresh_copy, detach_: a torch.tensor(...) made in forward, a constant
        if name in ("to", "_to_copy"):  # x.to(dtype): the device and layout are the CPU's
            dtype = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
            return args[0] if dtype is None else self.method("to", (args[0], dtype))
        if name in _METHODS:  # as users write them: x.expand(...), x.new_ones(size, dtype=...)
            kept = {k: v for k, v in kwargs.items() if k in ("dtype",)}
            return self.graph.create_node("call_method", name, tuple(args), kept)
        if name == "index":  # x[i, j] with index tensors
            return self.function(lower_masks.index_tensors, args, {})
        if name in _LOGICAL:
            return self.function(_LOGICAL[name], args, {})
        fn = _torch_function(op)
        if fn is None:
            raise LoweringError(f"ATen op {op} has no qrt lowering")
        return self.function(fn, args, kwargs)

    def _attr(self, a: Any) -> Any:
        """A constant (param, buffer) as a get_attr of the raised module."""
        if isinstance(a, pt2e.Constant):
            return self.const_attr(a.name, a.value)
        if isinstance(a, pt2e.Marker):
            raise LoweringError(f"{a} is used by an op that is not a quantized Linear")
        if isinstance(a, (list, tuple)):
            return type(a)(self._attr(v) for v in a)
        return a

    def _output(self, node: torch.fx.Node) -> None:
        specs = self.ep.graph_signature.output_specs
        written = [str(s.target or s.kind.name.lower()) for s in specs if s.kind not in _RETURNED]
        if written:  # a training-mode BatchNorm's running statistics, a kept counter or cache
            self.errors.setdefault(
                f"the program writes back {', '.join(written)}, state qrt does not keep between runs (a model "
                "exported in training mode updates its BatchNorm statistics: export it in eval mode)", []
            ).append(node.name)
        returned = [n for n, s in zip(node.args[0], specs) if s.kind in _RETURNED]
        flat = [self._attr(self.env[n]) if isinstance(n, torch.fx.Node) else n for n in returned]
        result = pytree.tree_unflatten(flat, self.ep.call_spec.out_spec)
        # a HuggingFace ModelOutput: its tensors as a tuple, as a model called with keywords returns them
        self.graph.output(_tuples(keywords.tensors_of(result)))


_RECURRENT_MODULES = tuple(f"torch.nn.modules.rnn.{c}" for c in ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell",
                                                                 "RNNCell"))


def _unrolled(node: torch.fx.Node, recurrent: set[str]) -> str | None:
    """Why node is refused where it is in a recurrent module that the program runs without its one ATen op
    (aten.lstm, ...; recurrent: the paths of the modules that have theirs), unrolled into per-step ops by
    run_decompositions(): its steps would run as float ops, the length fixed. None otherwise."""
    path, kind = module_stack.innermost(node)
    if kind not in _RECURRENT_MODULES or path in recurrent:
        return None
    return (f"module {path!r} ({kind}) is unrolled into per-step ops, as run_decompositions() writes a recurrent "
            "layer; qrt reads one as the single op torch.export.export writes (aten.lstm, aten.gru, ...): save the "
            "program without run_decompositions()")


def _tuples(v: Any) -> Any:
    return tuple(_tuples(i) for i in v) if isinstance(v, (list, tuple)) else v


# How a recurrent module's call is shaped: its arguments by how many tensors it is given (indices into
# them), and its result over the items of its ATen op (aten.lstm returns output, h_n, c_n).
_CALL_SHAPES = {
    "lstm": ({1: (0,), 3: (0, (1, 2))}, (0, (1, 2))),
    "sequence": ({1: (0,), 2: (0, 1)}, (0, 1)),
    "lstm_cell": ({1: (0,), 3: (0, (1, 2))}, (0, 1)),
}


def _call_kind(module: nn.Module) -> str | None:
    """A key of _CALL_SHAPES for a recurrent module returning a tuple (float, or torch.ao's), else None."""
    if isinstance(module, nn.RNNBase):
        return "lstm" if isinstance(module, nn.LSTM) else "sequence"
    if isinstance(module, nn.LSTMCell):
        return "lstm_cell"
    if not type(module).__module__.startswith(qrt_backend.QUANTIZED_PACKAGES):
        return None
    layer = qrt_backend.describe(module)
    if isinstance(layer, SequenceLayer):
        return "lstm" if layer.pattern == "lstm" else "sequence"
    return "lstm_cell" if isinstance(layer, RNNCellLayer) and layer.pattern == "lstm_cell" else None


def module_calls(nodes: Sequence[torch.fx.Node], paths: Any) -> dict[str, tuple[str, list[torch.fx.Node]]]:
    """Each call of the modules at paths (the outermost, where they nest) -> (its path, its call_function
    nodes), by the call's name in ep.module_call_graph: the path for the first call, path@1, path@2, ... for
    later ones, as torch.export also tells them apart in the nodes' nn_module_stack."""
    calls: dict[str, tuple[str, list[torch.fx.Node]]] = {}
    for node in nodes:
        found = _leaf_key(node, paths) if node.op == "call_function" else None
        if found is not None:
            key, path = found
            calls.setdefault(path + (key[key.rindex("@"):] if "@" in key else ""), (path, []))[1].append(node)
    return calls


def kept_call(sig: Any, by_name: dict[str, Any]) -> tuple[Any, dict, Any]:
    """(arguments, keyword arguments, results) of a module call from the signature torch.export kept, its tensors
    as by_name's nodes, its constants (a state given as None) as they are."""
    def leaf(a: Any) -> Any:
        return by_name[a.name] if isinstance(a, TensorArgument) else a.value

    args, kwargs = pytree.tree_unflatten([leaf(a) for a in sig.inputs], sig.in_spec)
    return args, kwargs, pytree.tree_unflatten([leaf(o) for o in sig.outputs], sig.out_spec)


def derived_call(path: str, module: nn.Module, members: list[torch.fx.Node],
                 inputs: list[torch.fx.Node]) -> tuple[Any, Any] | None:
    """(arguments, results) over graph nodes of one call of a recurrent module whose signature torch.export did
    not keep, from its nodes (members) and the tensors they read from outside (inputs, in order); None for a
    module that does not return a tuple. Raises ExportError where the inputs cannot be told apart."""
    kind = _call_kind(module)
    if kind is None:
        return None
    arg_shapes, result_shape = _CALL_SHAPES[kind]
    if len(inputs) not in arg_shapes:
        raise ExportError(f"module {path!r} is called with {len(inputs)} distinct tensors; a call of it is read "
                          f"with {' or '.join(map(str, arg_shapes))}, each argument its own tensor")
    inside = set(members)
    items = {n.args[1]: last_of(n, inside) for n in members if n.target is operator.getitem and n.args[0] in inside}
    return pytree.tree_map(inputs.__getitem__, arg_shapes[len(inputs)]), pytree.tree_map(items.get, result_shape)


def last_of(node: torch.fx.Node, inside: set) -> torch.fx.Node:
    """An item of a module's op as the module returns it: after the ops the module applies to it alone
    (a batch_first LSTM's transpose)."""
    while len(node.users) == 1 and next(iter(node.users)) in inside:
        node = next(iter(node.users))
    return node


def raise_program(
    ep: ExportedProgram,
    names: Sequence[str],
    model: nn.Module | None = None,
    quantized: dict[str, nn.Module] | None = None,
    leaves: dict[str, nn.Module] | None = None,
    saved: bool = False,
) -> torch.fx.GraphModule:
    """The ATen graph of ep as a torch-level fx graph (module docstring). ``model``: the exported module,
    whose leaf modules become call_module nodes again; ``quantized``: path -> the torch.ao module a
    stand-in took the place of; a saved program (no model) calls its torchao Linears again. ``leaves``, if
    given: path -> module, the calls to raise instead. ``saved``: ep is a user's saved program, exported on
    examples of their choosing (its sizes tie as _size_keys says), not one the converter exported."""
    if leaves is None:
        leaves = _leaf_paths(model, quantized or {}) if model is not None else torchao_frontend.program_leaves(ep)
    gm = _Raiser(ep, leaves, names).run()
    gm.meta[TIED_DIMS] = tied_dims(ep, by_example=saved)
    return gm


def leaf_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> module for torch.fx's leaf modules of model (what the raised graph calls)."""
    return _leaf_paths(model, {})


def tied_dims(ep: ExportedProgram, by_example: bool) -> list[frozenset]:
    """The (flat input, dim) pairs of one size (_size_keys) in several input dimensions: a batch that input_ids and
    attention_mask share changes in both at once."""
    groups: dict[Any, set] = {}
    for pair, key in _size_keys(ep, by_example).items():
        groups.setdefault(key, set()).add(pair)
    return [frozenset(g) for g in groups.values() if len(g) > 1]


def _user_values(ep: ExportedProgram) -> list:
    """The fake values of the program's user inputs, in its flat input order (tensors: qrt's inputs are)."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    vals = {n.name: n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"}
    for name in user:
        if not isinstance(vals[name], torch.Tensor):
            raise ExportError(f"the program takes {name!r} = {vals[name]!r}, not a tensor: qrt's inputs are tensors "
                              "(export it without passing that argument)")
    return [vals[name] for name in user]


def _size_keys(ep: ExportedProgram, by_example: bool) -> dict[tuple[int, int], Any]:
    """(flat input, dim) -> one key per size that varies: torch.export's symbol; by_example (a saved program,
    whose examples the converter did not choose), dimensions at the same position of inputs it was exported with
    at the same size are one too. Dim.AUTO may keep input_ids' and attention_mask's batches apart (the mask reaches
    them through indexing), and a program then run with two batches indexes out of bounds."""
    vals = _user_values(ep)
    examples = pytree.tree_leaves(ep.example_inputs) if by_example and ep.example_inputs is not None else []
    if len(examples) != len(vals) or not all(isinstance(e, torch.Tensor) for e in examples):
        examples = [None] * len(vals)  # a program saved without its examples: its symbols alone
    root: dict[Any, Any] = {}

    def find(k: Any) -> Any:
        while root.setdefault(k, k) != k:
            k = root[k]
        return k

    pairs = {}
    for leaf, (v, e) in enumerate(zip(vals, examples)):
        for d, size in enumerate(v.shape):
            if _dynamic(size):
                pairs[leaf, d] = str(size)
                if e is not None and e.dim() == len(v.shape):
                    root[find(str(size))] = find(("example", d, int(e.shape[d])))
    return {pair: find(symbol) for pair, symbol in pairs.items()}


def describe(module: nn.Module) -> Layer | None:
    """The FX front end's descriptions, the pt2e Linears this front end makes, and torchao's Linears."""
    if isinstance(module, pt2e.QLinear):
        return module.layer
    return torchao_frontend.describe(module) or qrt_backend.describe(module)


def is_pt2e(gm: nn.Module) -> bool:
    """Whether the raised graph holds pt2e's quantized Linears (then it is quantized already)."""
    return any(isinstance(m, pt2e.QLinear) for m in gm.modules())


def is_prequantized(model: nn.Module) -> bool:
    """Whether the model (or raised graph) is quantized already: by torch.ao, pt2e or torchao."""
    return qrt_backend.is_quantized(model) or is_pt2e(model) or torchao_frontend.is_quantized(model)


def mark_free(specs: Sequence[qshapes.Spec], names: Sequence[str], ep: ExportedProgram, free_dims: str) -> list:
    """The specs with the dimensions torch.export kept dynamic marked candidates ("auto": free where the
    runs find them free, as the FX front end's search would; torch.export keeps a dimension dynamic under
    guards, x.size(1) <= 10, that fix it for qrt), or the marked ones checked ("marked"): a dimension
    declared free that torch.export fixed is an error naming it."""
    shapes = iter(v.shape for v in _user_values(ep))
    out = []
    for spec, name in zip(specs, names):
        flat = {}
        for i, (leaf_name, leaf) in enumerate(qshapes.leaves(spec, name)):
            shape = next(shapes)
            dims = []
            for d, dim in enumerate(leaf.dims):
                dynamic = _dynamic(shape[d])
                if dim.free and not dynamic:
                    raise ExportError(
                        f"input {leaf_name!r} dimension {d} is declared free ({leaf}), but torch.export "
                        f"fixes it to {int(shape[d])}"
                    )
                dims.append(qshapes.Dim(dim.size, dim.free, free_dims == "auto" and dynamic and not dim.free))
            flat[i] = qshapes.Leaf(tuple(dims), leaf.dtype)
        out.append(rebuild(spec, iter(flat.values())))
    return out


def rebuild(spec: qshapes.Spec, leaves: Any) -> qshapes.Spec:
    """spec's structure (tuples) over the next leaves."""
    if isinstance(spec, tuple):
        return tuple(rebuild(s, leaves) for s in spec)
    return next(leaves)

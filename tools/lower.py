"""Lowering: a quantized torch.fx graph -> a qrt graph, node by node through the lowering table.

The graph is either the reference graph of torch.ao's FX flow (quantize /
dequantize nodes around reference quantized modules) or an already-quantized
model (``convert_fx`` / ``quantize_dynamic``) traced with torch.fx. This module
never touches ``torch.ao``: a front end passes ``describe``, which turns one
quantized module into a neutral layer (tools/layers.py), so another front end
(pt2e) can reuse it. What each module, function and method becomes is the table
of tools/lower_values.py, which tools/lower_ops.py and tools/lower_masks.py fill; this
module walks the graph through it.

Before the walk the model runs at the example sizes and at other sizes of each
dimension (tools/shapes.py): the dimensions it accepts are free in the .qrt
file, and the walk reads every node's shape in every run (a reshape's target is
written with 0 / -1 where its sizes follow a free dimension). A size of a free
dimension used as a value elsewhere (``x[:, : x.size(1) - 1]``) makes that
dimension fixed again; declared free (``50?``), it is an error.

Values flow through the walk lazily: a dequantize is emitted only when a
float op needs the float value, and a static reference Linear waits for the
quantize that follows it, whose scale becomes the qrt ``linear``'s output
scale (that is what ``convert_fx`` fuses into ``quantized::linear``).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
from torch import nn

from qrt.builder import GraphBuilder

from . import lower_float_recurrent, lower_masks  # noqa: F401  (their @lowers fill the table)
from . import shapes as qshapes
from .layers import (  # noqa: F401  (the neutral layers, re-exported for front ends and tests)
    Describe,
    EmbeddingLayer,
    Layer,
    LinearLayer,
    QWeight,
    RNNCellLayer,
    SequenceLayer,
)
from .lower_ops import module_lowering
from .lower_values import (
    FUNCTIONS,
    METHODS,
    PATTERNS,
    Const,
    Deq,
    DynDeq,
    DynQ,
    Lowering,
    LoweringError,
    PendingLinear,
    Quant,
    Tensor,
    has_size_of,
    is_tensor,
)

TIED_DIMS = "qrt_tied_dims"  # gm.meta key: (flat leaf, dim) sets a front end knows to be one size (tools/shapes.py)


class _Varies(Exception):
    """A size of a free dimension is used where the qrt graph needs a constant; runs: the runs that changed it."""

    def __init__(self, runs: set[int], why: str) -> None:
        super().__init__(why)
        self.runs, self.why = runs, why


_FAILED = object()  # the value of a node that could not be lowered: its users are skipped, not reported


def _fn_name(fn: Any) -> str:
    """A function as users write it: operator.getitem, torch.matmul, F.conv1d."""
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__name__", None) or repr(fn)
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod.startswith(("torch.nn.functional", "torch._C._nn")):
        return f"F.{name}"
    if mod in ("torch", "torch.functional") or mod.startswith("torch._C"):
        return f"torch.{name}"
    qualname = getattr(fn, "__qualname__", None) or name
    return f"{mod}.{qualname}" if mod and mod != "builtins" else qualname


def _class_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _entry(node: torch.fx.Node, modules: dict, describe: Describe) -> tuple[Lowering | None, Any]:
    """The table entry for a call node, and what a module lowering gets first (the layer or the module)."""
    if node.op == "call_module":
        m = modules[node.target]
        layer = describe(m)
        if layer is not None:
            return PATTERNS.get(layer.pattern), layer
        return module_lowering(m), m
    if node.op == "call_function":
        return FUNCTIONS.get(node.target), None
    if node.op == "call_method":
        return METHODS.get(node.target), None
    return None, None


def _where(node: torch.fx.Node, modules: dict) -> str:
    if node.op == "call_module":
        return f"module {node.target!r} ({_class_name(modules[node.target])})"
    if node.op == "call_function":
        return f"function {_fn_name(node.target)} (node {node.name!r})"
    if node.op == "call_method":
        return f"method .{node.target}() (node {node.name!r})"
    if node.op == "placeholder":
        return f"input {node.target!r}"
    return f"node {node.name!r}"


_IN_PLACE_FUNCTIONS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)


def _in_place(node: torch.fx.Node, lead: Any) -> bool:
    """Whether node writes its first argument: x += y, x.relu_(), F.relu(x, inplace=True), ReLU(inplace=True)."""
    if node.op == "call_function" and node.target in _IN_PLACE_FUNCTIONS:
        return True
    if node.op == "call_method" and str(node.target).endswith("_"):
        return True
    return bool(node.kwargs.get("inplace")) or bool(getattr(lead, "inplace", False))


def _first_name(v: Any) -> str:
    """The qrt value recorded for a module's output: the first tensor of a tuple."""
    while isinstance(v, (tuple, list)):
        v = v[0]
    return v.name


class Lowerer:
    """The walk: one fx graph, the example runs, and the qrt graph being built."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        describe: Describe,
        specs: Sequence[qshapes.Spec],
        runs: Sequence[qshapes.Run],
        engine: str = "x86",
        quantize_engine: str | None = None,
    ) -> None:
        self.gm = gm
        # the int8 linears' numerics: x86 is the ops' default, so only qnnpack is written (format version 5)
        self.engine_attrs: dict[str, str] = {} if engine == "x86" else {"engine": engine}
        quantize_engine = quantize_engine or engine  # the activations' quantize rule: the linears' unless told
        self.quantize_attrs: dict[str, str] = {} if quantize_engine == "x86" else {"engine": quantize_engine}
        self.describe = describe
        self.specs = list(specs)
        self.runs = list(runs)
        self.free = qshapes.free_dims_of(runs)
        self.b = GraphBuilder()
        self.env: dict[torch.fx.Node, Any] = {}
        self.dequantized: dict[str, str] = {}  # quantized value -> its dequantize node's output
        self.modules = dict(gm.named_modules())
        self.layers: dict[str, str] = {}  # module path -> the qrt value holding its output
        self.observed: dict[str, list[tuple]] = {}  # qrt value -> its shape in each run
        self.taken: set[str] = set()
        self.leaf_count = 0

    # -- for the lowerings (tools/lower_ops.py)

    def unique(self, base: str) -> str:
        """A node name not used yet (fx names are unique, but lowerings emit helper nodes too)."""
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def emit(
        self, node: torch.fx.Node, op: str, inputs: dict, attrs: dict | None = None, suffix: str = ""
    ) -> str | tuple[str, ...]:
        """Add a qrt node named after the fx node; returns its output value name(s)."""
        return self.b.node(op, inputs, attrs, name=self.unique(node.name + suffix))

    def float_of(self, v: Any) -> str:
        """The name of v's float32 value, emitting the dequantize of a quantized value once."""
        if isinstance(v, Tensor):
            if v.dtype != "float32":
                raise LoweringError(f"needs a float tensor, got a {v.dtype} tensor")
            return v.name
        if isinstance(v, Deq):
            q = v.q
            if q.name not in self.dequantized:
                name = self.b.node(
                    "dequantize",
                    {"x": q.name, "scale": np.float32(q.scale), "zero_point": np.int32(q.zero_point)},
                    name=self.unique(f"{q.name}_dequantize"),
                )
                self.dequantized[q.name] = name
                self.observed[name] = self.observed.get(q.name, [])
            return self.dequantized[q.name]
        if isinstance(v, DynDeq):
            # A dynamic quantize/dequantize pair outside a dynamic op is dropped, as convert_fx does.
            return v.source.name
        what = "a tuple" if isinstance(v, (tuple, list)) else type(v).__name__
        raise LoweringError(f"needs a float tensor, got {what}")

    def index_of(self, v: Any, what: str) -> str:
        """The name of an integer tensor (an embedding's indices or offsets)."""
        if isinstance(v, Tensor) and v.dtype in ("int64", "int32"):
            return v.name
        got = f"a {v.dtype} tensor" if isinstance(v, Tensor) else type(v).__name__
        raise LoweringError(
            f"{what} must be an int64 or int32 tensor, got {got} (a graph input's dtype can be given with "
            "--input-dtype NAME=int64)"
        )

    def shape(self, v: Any) -> tuple[int, ...]:
        """v's shape at the example sizes."""
        return self.shapes(v)[0]

    def shapes(self, v: Any) -> list[tuple[int, ...]]:
        """v's shape in each run (the example first)."""
        if isinstance(v, Const) and isinstance(v.value, torch.Tensor):
            return [tuple(v.value.shape)] * len(self.runs)
        if not is_tensor(v):
            raise LoweringError(f"needs a tensor, got {type(v).__name__}")
        return self.observed[v.name]

    def node_shapes(self, node: torch.fx.Node) -> list[tuple[int, ...]]:
        """The shape of node's (tensor) result in each run."""
        return [run.values[node][2] for run in self.runs]

    def require_static(self, node: torch.fx.Node, args: Sequence[torch.fx.Node] | None = None,
                       uses: str = "uses") -> None:
        """Refuse a Python value among node's arguments (or args) that changes with a free dimension (a size): the
        runs where it does are not free after all. ``uses`` says what the node does with it, in the message."""
        for arg in node.all_input_nodes if args is None else args:
            base = self.runs[0].values.get(arg)
            if base is None or qshapes.has_tensor(base):
                continue
            changed = {i for i, run in enumerate(self.runs) if run.values.get(arg) != base}
            if changed:
                raise _Varies(changed, f"{uses} {arg.name!r} = {base[1]!r}, which changes with a free dimension")

    def varies(self, runs: set[int], why: str) -> None:
        raise _Varies(runs, why)

    # -- the walk

    def arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (tuple, list)):
            return type(a)(self.arg(v) for v in a)
        if isinstance(a, slice):
            return slice(self.arg(a.start), self.arg(a.stop), self.arg(a.step))
        if isinstance(a, dict):
            return {k: self.arg(v) for k, v in a.items()}
        return a

    def _observe(self, value: Any, sigs: list) -> None:
        """Record the shapes of value's tensors in every run, from the runs' signatures of its node."""
        if is_tensor(value) and sigs[0][0] == "tensor":
            self.observed[value.name] = [s[2] for s in sigs]
        elif isinstance(value, (tuple, list)) and sigs[0][0] in ("tuple", "list"):
            for i, item in enumerate(value):
                if i < len(sigs[0][1]):
                    self._observe(item, [s[1][i] for s in sigs])

    def placeholder(self, node: torch.fx.Node) -> Any:
        i = sum(1 for v in self.env if v.op == "placeholder")
        if i >= len(self.specs):
            if node.args:  # an argument bound to its default when tracing
                return node.args[0]
            raise LoweringError("has no example shape")

        def build(spec: qshapes.Spec, name: str) -> Any:
            if isinstance(spec, tuple):
                return tuple(build(s, f"{name}.{k}") for k, s in enumerate(spec))
            index, self.leaf_count = self.leaf_count, self.leaf_count + 1
            shape = [None if (index, d) in self.free else dim.size for d, dim in enumerate(spec.dims)]
            self.taken.add(name)
            return Tensor(self.b.input(name, spec.dtype, shape), spec.dtype)

        return build(self.specs[i], str(node.target))

    def get_attr(self, node: torch.fx.Node) -> Any:
        obj = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return Const(obj)

    def call(self, node: torch.fx.Node) -> Any:
        entry, lead = _entry(node, self.modules, self.describe)
        if entry is None:  # find_unsupported lets none through
            raise AssertionError(f"no lowering for {node.format_node()}")
        args = self.arg(node.args)
        kwargs = self.arg(node.kwargs)
        if not entry.sizes:
            self.require_static(node)
        if self._foldable(args, kwargs) and not has_size_of((args, kwargs)):
            self.require_static(node)  # computed once here: a size it used must not be free
            out = self._fold(node, args, kwargs)
        elif node.op == "call_module":
            out = entry.call(self, node, lead, *args, **kwargs)
            if not isinstance(lead, nn.Module):
                # Recorded so that `qrt compare` can match qrt values to PyTorch modules layer by layer.
                self.layers[str(node.target)] = _first_name(out)
        else:
            out = entry.call(self, node, *args, **kwargs)
        if _in_place(node, lead) and node.args and isinstance(node.args[0], torch.fx.Node):
            self.env[node.args[0]] = out  # x += y, relu_(x): later readers of x see the new value, as in torch
        return out

    def _foldable(self, args: Any, kwargs: Any) -> bool:
        """No run-time tensor among the arguments, and a stored one: torch computes it once, here."""
        leaves: list = []
        torch.fx.node.map_aggregate((args, kwargs), leaves.append)
        return not any(is_tensor(v) for v in leaves) and any(
            isinstance(v, Const) and isinstance(v.value, torch.Tensor) for v in leaves
        )

    def _fold(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        unwrap = lambda v: v.value if isinstance(v, Const) else v  # noqa: E731
        args = torch.fx.node.map_aggregate(args, unwrap)
        kwargs = torch.fx.node.map_aggregate(kwargs, unwrap)
        with torch.no_grad():
            if node.op == "call_method":
                out = getattr(args[0], node.target)(*args[1:], **kwargs)
            elif node.op == "call_module":  # a module of stored tensors alone (DeBERTa's of its relative embeddings)
                out = self.modules[node.target](*args, **kwargs)
            else:
                out = node.target(*args, **kwargs)
        return Const(out) if isinstance(out, torch.Tensor) else out

    def output(self, node: torch.fx.Node) -> None:
        def leaf(v: Any) -> Any:
            if isinstance(v, Mapping):  # a dict or ModelOutput: its tensors as a tuple, as keywords.tensors_of
                return tuple(leaf(i) for i in v.values() if i is not None)
            if isinstance(v, (tuple, list)):
                return tuple(leaf(i) for i in v)
            if isinstance(v, Tensor):
                return v.name
            if isinstance(v, (Deq, DynDeq)):
                return self.float_of(v)
            if isinstance(v, (Quant, DynQ, PendingLinear)):
                raise LoweringError("the model returns a quantized tensor; qrt outputs are float32 or integer")
            raise LoweringError(f"the model returns a constant ({v!r:.40}); qrt outputs must be tensors")

        tree = leaf(self.arg(node.args[0]))
        if isinstance(tree, tuple):
            self.b.output_nested(tree)
        else:
            self.b.output(tree)

    def run(self) -> GraphBuilder:
        errors = []
        for node in self.gm.graph.nodes:
            if any(self.env.get(a) is _FAILED for a in node.all_input_nodes):
                self.env[node] = _FAILED  # its cause is reported already
                continue
            try:
                if node.op == "output":
                    self.output(node)
                elif node.op in ("placeholder", "get_attr"):
                    self.env[node] = getattr(self, node.op)(node)
                else:
                    self.env[node] = value = self.call(node)
                    self._observe(value, [run.values[node] for run in self.runs])
            except LoweringError as e:
                errors.append(f"{_where(node, self.modules)}: {e}")
                self.env[node] = _FAILED
            except _Varies as v:
                v.why = f"{_where(node, self.modules)} {v.why}"
                raise
            if node.op == "placeholder" and self.env[node] is not _FAILED:
                self._observe(self.env[node], [run.values[node] for run in self.runs])
        if errors:
            raise LoweringError("qrt cannot run: " + "; ".join(errors))
        if any(isinstance(s, tuple) for s in self.specs):
            names = [n for n in self.gm.graph.nodes if n.op == "placeholder"][: len(self.specs)]
            self.b.input_nested(tuple(_names(self.env[n]) for n in names))
        return self.b


def _names(v: Any) -> Any:
    return tuple(_names(i) for i in v) if isinstance(v, tuple) else v.name


# ------------------------------------------------------------ what qrt lowers


def check_patterns(pattern_names: Sequence[tuple[str, str]]) -> None:
    """Refuse rules naming a pattern without a lowering: (name, description) pairs."""
    missing = [desc for name, desc in pattern_names if name not in PATTERNS]
    if missing:
        raise LoweringError(
            f"the rules list pattern(s) {', '.join(missing)} with no qrt lowering; "
            f"qrt lowers: {', '.join(sorted(PATTERNS))}"
        )


def find_unsupported(
    gm: torch.fx.GraphModule, describe: Describe, quantizable: Callable[[str, nn.Module], bool] = lambda n, m: False
) -> list[str]:
    """Every call qrt has no lowering for, by name: modules neither described nor in the table, functions, methods.

    ``quantizable(name, module)`` says the front end will quantize that float module
    (used to check a float model before it is quantized).
    """
    modules = dict(gm.named_modules())
    bad = []
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        entry, _ = _entry(node, modules, describe)
        if entry is not None or (node.op == "call_module" and quantizable(node.target, modules[node.target])):
            continue
        bad.append(_where(node, modules) if node.op != "call_module" else
                   f"module {node.target!r} ({_class_name(modules[node.target])})")
    return bad


# ------------------------------------------------------------ integer inputs


def _index_sources(gm: torch.fx.GraphModule, describe: Describe) -> set[tuple[int, tuple[int, ...]]]:
    """(placeholder position, path into its tuple) of every input that reaches an embedding's indices or
    offsets, through ops that keep the dtype (indexing, reshapes, ...)."""
    modules = dict(gm.named_modules())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = set()
    for node in gm.graph.nodes:
        entry, _ = _entry(node, modules, describe)
        for pos, name in entry.index_args if entry is not None else ():
            a = node.args[pos] if pos < len(node.args) else node.kwargs.get(name)
            path: list[int] = []
            while isinstance(a, torch.fx.Node):
                if a.op == "placeholder":
                    found.add((placeholders.index(a), tuple(reversed(path))))
                    break
                if a.op == "call_function" and a.target is operator.getitem and isinstance(a.args[1], int):
                    path.append(a.args[1])
                    a = a.args[0]
                    continue
                through, _ = _entry(a, modules, describe)
                if through is None or not through.keeps_dtype or not a.args:
                    break
                a = a.args[0][0] if isinstance(a.args[0], (tuple, list)) and a.args[0] else a.args[0]
    return found


def _with_dtypes(specs: list[qshapes.Spec], sources: set) -> list[qshapes.Spec]:
    """Each leaf's dtype: as given, else int64 where it feeds an embedding, else float32."""
    ints = set()
    for arg, path in sources:
        spec, at = specs[arg], []
        for i in path:  # the tuple part of the path; the rest indexes the tensor
            if not isinstance(spec, tuple) or not 0 <= i < len(spec):
                break
            spec, at = spec[i], at + [i]
        ints.add((arg, tuple(at)))

    def walk(spec: qshapes.Spec, arg: int, at: tuple) -> qshapes.Spec:
        if isinstance(spec, tuple):
            return tuple(walk(s, arg, at + (i,)) for i, s in enumerate(spec))
        if spec.dtype is not None:
            return spec
        return qshapes.Leaf(spec.dims, "int64" if (arg, at) in ints else "float32")

    return [walk(s, i, ()) for i, s in enumerate(specs)]


def resolve_specs(
    gm: torch.fx.GraphModule, describe: Describe, inputs: Sequence[Any]
) -> tuple[list[qshapes.Spec], list[str]]:
    """The example input specs with dtypes filled in, and the argument names (fx placeholders)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        specs = [qshapes.as_spec(s) for s in inputs]
    except qshapes.SpecError as e:
        raise LoweringError(str(e)) from None
    required = [p for p in placeholders if not p.args]
    if not len(required) <= len(specs) <= len(placeholders):
        names = [str(p.target) for p in placeholders]
        raise LoweringError(
            f"got {len(specs)} example input shapes, but the graph takes {len(required)} inputs {names}"
        )
    return _with_dtypes(specs, _index_sources(gm, describe)), [str(p.target) for p in placeholders[: len(specs)]]


# ------------------------------------------------------------ lower


def _stand_ins(gm: torch.fx.GraphModule, describe: Describe) -> qshapes.StandIns:
    """torch 2.13's 4-bit quantized Embedding reads its rows with the 8-bit layout and fails (or returns
    the wrong width): for the runs, which need only shapes, a lookup of zeros of the right width."""
    out: qshapes.StandIns = {}
    for name, m in gm.named_modules():
        layer = describe(m)
        if isinstance(layer, EmbeddingLayer) and layer.pattern == "embedding" and layer.bits == 4:
            out[name] = lambda indices, dim=layer.dim: torch.zeros((*indices.shape, dim))
    return out


def lower(
    gm: torch.fx.GraphModule,
    describe: Describe,
    inputs: Sequence[Any],
    layers: dict[str, str] | None = None,
    free_dims: str = "auto",
    engine: str = "x86",
    quantize_engine: str | None = None,
) -> GraphBuilder:
    """Lower a quantized fx graph into a qrt GraphBuilder (not yet saved).

    ``inputs``: one example per forward() argument: a shape ((1, 37)), --input-shape text ("2,50?,6",
    "(2,1,200),(2,1,200)") or a tools.shapes Leaf / tuple. ``free_dims``: "auto" (dimensions marked
    free and those the runs find free) or "marked" (only those marked). ``layers``, if given, is
    filled with module path -> the qrt value holding that module's output. ``engine``: whose numerics the
    int8 linears follow, torch's "x86" (fbgemm) or "qnnpack" engine; ``quantize_engine``: whose rule the
    activations' quantize nodes follow (default: ``engine``'s).
    """
    if free_dims not in qshapes.FREE_DIMS:
        raise LoweringError(f"free_dims must be one of {list(qshapes.FREE_DIMS)}, got {free_dims!r}")
    bad = find_unsupported(gm, describe)
    if bad:
        raise LoweringError("qrt cannot run: " + "; ".join(bad))
    specs, names = resolve_specs(gm, describe, inputs)
    try:
        runs = qshapes.search(gm, specs, names, free_dims, _stand_ins(gm, describe), gm.meta.get(TIED_DIMS, ()))
    except qshapes.SpecError as e:
        raise LoweringError(str(e)) from None
    flat = [pair for spec, name in zip(specs, names) for pair in qshapes.leaves(spec, name)]
    while True:
        lowerer = Lowerer(gm, describe, specs, runs, engine, quantize_engine)
        try:
            builder = lowerer.run()
            break
        except _Varies as v:
            if not v.runs:  # nothing to fix by fixing dimensions: the graph itself cannot be written
                raise LoweringError(v.why) from None
            # Those runs' dimensions are not free after all; one declared free is the user's to fix.
            for leaf, d in sorted(c for r in v.runs for c in runs[r].changed):
                name, spec = flat[leaf]
                if spec.dims[d].free:
                    raise LoweringError(
                        f"input {name!r} dimension {d} is declared free ({spec}), but {v.why}; "
                        "qrt needs it as a constant there"
                    ) from None
            runs = [run for r, run in enumerate(runs) if r not in v.runs]
    if layers is not None:
        layers.update(lowerer.layers)
    return builder

"""Example inputs: the ``--input-shape`` syntax, example tensors, and the search for free dimensions.

One entry per forward() argument: a tensor (``Leaf``: example sizes, each maybe marked free, and
a dtype) or a tuple of entries (an LSTM's ``(h, c)``). In text::

    2,50,6              a tensor of example shape [2, 50, 6]
    2,50?,6             the same with dimension 1 declared free ("?": any size at run time)
    7                   a 1-D tensor (one token id per batch row, say)
    (2,1,200),(2,1,200) a tuple of two tensors; tuples nest: ((1,8),(1,8)),(1,4)

Which dimensions are free is found by running the model: at the example sizes, then with one
dimension at another size (2n + 3 for an example size n), and, for dimensions that fail alone, together
with the other dimensions of the same example size (a batch shared by x and h only changes together). A
dimension is free when the model runs and every node keeps its rank and dtype. The runs'
shapes are what the lowering later reads (a reshape's 0 / -1, sizes used as values).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

import torch
import torch.fx

FREE_DIMS = ("auto", "marked")
_MAX_TRIES = 64  # runs spent on dimensions that only change together, per example size
_MAX_CHOICES = 4096
DTYPES = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


class SpecError(ValueError):
    """An example input specification the converter cannot read; the message says why."""


@dataclass(frozen=True)
class Dim:
    size: int  # the example size
    free: bool = False  # declared free ("50?"); otherwise the search decides (or, with "marked", fixed)
    candidate: bool = False  # searched with "marked" too, fixed where refuted (one torch.export keeps dynamic)

    def __str__(self) -> str:
        return f"{self.size}{'?' if self.free else ''}"


@dataclass(frozen=True)
class Leaf:
    """One tensor argument (or one tensor in a tuple argument)."""

    dims: tuple[Dim, ...]
    dtype: str | None = None  # None: the lowering infers it (int64 for an embedding's indices, else float32)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    def __str__(self) -> str:
        return ",".join(str(d) for d in self.dims)


Spec = Union[Leaf, tuple]  # a Leaf, or a tuple of Specs


# ------------------------------------------------------------ reading specs


def parse(text: str) -> Spec:
    """'2,50?,6' -> Leaf; '(2,1,200),(2,1,200)' -> a tuple of Leafs (see the module docstring)."""
    tokens = re.findall(r"\d+\??|\?|[(),]|[^\s\d(),?]+", text)
    pos = 0

    def fail(why: str) -> None:
        raise SpecError(
            f"cannot read input shape {text!r}: {why} (write comma-separated sizes: 2,50,6; 50? for a free "
            "dimension; (2,1,200),(2,1,200) for a tuple argument)"
        )

    if not tokens:
        fail("it is empty")

    def items() -> list:
        """Comma-separated dims or parenthesised groups, up to ')' or the end; a trailing comma marks a tuple."""
        nonlocal pos
        out: list = []
        trailing = False
        while pos < len(tokens) and tokens[pos] != ")":
            tok = tokens[pos]
            pos += 1
            if tok == "(":
                inner, inner_tuple = items()
                if pos >= len(tokens) or tokens[pos] != ")":
                    fail("a '(' is not closed")
                pos += 1
                out.append(_group(inner, inner_tuple, fail))
            elif tok == "?":
                fail("'?' needs an example size before it: write 50? for a free dimension of example size 50")
            elif tok[0].isdigit():
                size = int(tok.rstrip("?"))
                if size <= 0:
                    fail(f"sizes must be positive, got {size}")
                out.append(Dim(size, tok.endswith("?")))
            else:
                fail(f"unexpected {tok!r}; sizes are positive integers, 50? marks a free one")
            trailing = False
            if pos < len(tokens) and tokens[pos] == ",":
                pos += 1
                trailing = True
            elif pos < len(tokens) and tokens[pos] != ")":
                fail(f"expected ',' before {tokens[pos]!r}")
        if not out:
            fail("an empty group")
        return out, trailing

    top, top_tuple = items()
    if pos != len(tokens):
        fail("a ')' has no matching '('")
    return _group(top, top_tuple, fail)


def _group(items: list, trailing: bool, fail: Callable[[str], None]) -> Spec:
    """Sizes make a shape ((5,) too, as Python writes a 1-tuple); shapes make a tuple; one
    parenthesised shape without a trailing comma is that shape."""
    dims = [i for i in items if isinstance(i, Dim)]
    if dims and len(dims) != len(items):
        fail("a group mixes sizes and parenthesised shapes; write a tuple as (2,3),(2,3)")
    if dims:
        return Leaf(tuple(dims))
    return items[0] if len(items) == 1 and not trailing else tuple(items)


def as_spec(obj: Any) -> Spec:
    """A spec from text, a Leaf, a shape (a sequence of ints), or a tuple of those (one tuple argument)."""
    if isinstance(obj, str):
        return parse(obj)
    if isinstance(obj, Leaf):
        return obj
    if isinstance(obj, (tuple, list, torch.Size)):
        if obj and all(isinstance(d, int) and not isinstance(d, bool) for d in obj):
            if any(d <= 0 for d in obj):
                raise SpecError(f"sizes must be positive, got {list(obj)}")
            return Leaf(tuple(Dim(d) for d in obj))
        if obj and all(isinstance(i, (str, Leaf, tuple, list)) for i in obj):
            return tuple(as_spec(i) for i in obj)
    raise SpecError(f"an input shape must be text, a sequence of positive ints or a tuple of those, got {obj!r:.80}")


def show(spec: Spec) -> str:
    """The spec for messages: [2, 50?, 6], ([2, 1, 200], [2, 1, 200])."""
    if isinstance(spec, Leaf):
        return "[" + ", ".join(str(d) for d in spec.dims) + "]"
    return "(" + ", ".join(show(s) for s in spec) + ")"


def leaves(spec: Spec, name: str) -> list[tuple[str, Leaf]]:
    """(flat name, leaf) pairs in order: argument `hidden` = (h, c) gives hidden.0 and hidden.1."""
    if isinstance(spec, Leaf):
        return [(name, spec)]
    return [pair for i, s in enumerate(spec) for pair in leaves(s, f"{name}.{i}")]


def with_dtypes(spec: Spec, dtype_of: Callable[[Leaf, int], str]) -> tuple[Spec, int]:
    """A copy with each leaf's dtype set by dtype_of(leaf, flat index); also returns the leaf count."""
    count = 0

    def walk(s: Spec) -> Spec:
        nonlocal count
        if isinstance(s, Leaf):
            count += 1
            return replace(s, dtype=dtype_of(s, count - 1))
        return tuple(walk(c) for c in s)

    return walk(spec), count


# ------------------------------------------------------------ example tensors


# The values of integer and bool examples. "plain": 0 (an index into any embedding, valid EmbeddingBag offsets)
# and True (a keep-mask keeping everything). Where the model fails on those because they mask a whole row (a
# padding mask, True pads; a pooling over ids != 0: a mean over nothing is NaN, which a dynamic quantization
# after it refuses), "mixed": 0 / False at the first position of the last dimension and 1 / True after it, so
# that a mask of either sense keeps part of every row. Only a fallback: a one-row table (RoBERTa's token types)
# cannot take the 1s, and a causal keep-mask's first row is empty without the first position.
FILLS = ("plain", "mixed")


def example(spec: Spec, shapes: dict[int, tuple[int, ...]] | None = None, seed: int = 0, fill: str = "plain") -> Any:
    """The argument as a tensor (nested tuples for a tuple): float inputs random, integer and bool ones as
    ``fill`` says (FILLS). ``shapes`` replaces leaf shapes by flat index."""
    gen = torch.Generator().manual_seed(seed)
    index = 0

    def walk(s: Spec) -> Any:
        nonlocal index
        if isinstance(s, tuple):
            return tuple(walk(c) for c in s)
        shape = (shapes or {}).get(index, s.shape)
        index += 1
        dtype = DTYPES[s.dtype or "float32"]
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=dtype)
        if fill == "plain":
            return torch.ones(shape, dtype=dtype) if dtype == torch.bool else torch.zeros(shape, dtype=dtype)
        values = torch.ones(shape, dtype=dtype)
        if shape:
            values[..., 0] = 0
        return values

    return walk(spec)


def examples(specs: Sequence[Spec], shapes: dict[int, tuple[int, ...]] | None = None, fill: str = "plain") -> list:
    """One example argument per spec; ``shapes`` is by flat leaf index over all specs."""
    out, offset = [], 0
    for i, spec in enumerate(specs):
        n = len(leaves(spec, ""))
        mine = {k - offset: v for k, v in (shapes or {}).items() if offset <= k < offset + n}
        out.append(example(spec, mine, seed=i, fill=fill))
        offset += n
    return out


# ------------------------------------------------------------ runs at several sizes


def signature(value: Any) -> Any:
    """What a run records of a node's value: dtype and shape of tensors, python values as they are."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype).removeprefix("torch."), tuple(value.shape))
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if isinstance(value, (tuple, list)):  # a named tuple too (torch.max(x, dim)'s values and indices)
        return ("list" if isinstance(value, list) else "tuple", tuple(signature(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str, slice, torch.dtype)) or value is Ellipsis:
        return ("value", value)
    return ("object", type(value).__name__)


def structure(sig: Any) -> Any:
    """A signature without sizes or python values: what must not change when a free dimension does."""
    kind, body = sig[0], sig[1:]
    if kind == "tensor":
        return ("tensor", body[0], len(body[1]))
    if kind == "size":
        return ("size", len(body[0]))
    if kind in ("tuple", "list"):
        return (kind, tuple(structure(s) for s in body[0]))
    if kind == "value":
        return ("value", type(body[0]).__name__)
    return sig


def has_tensor(sig: Any) -> bool:
    kind = sig[0]
    if kind == "tensor":
        return True
    if kind in ("tuple", "list"):
        return any(has_tensor(s) for s in sig[1])
    return False


@dataclass
class Run:
    """The model run once: which (flat leaf, dim) differ from the example, and every node's signature."""

    changed: frozenset
    values: dict


# module path -> a function computing what the module would (its shape is what matters), for modules
# torch cannot run
StandIns = dict[str, Callable[..., Any]]


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, stand_ins: StandIns) -> None:
        super().__init__(gm)
        self.seen: dict[torch.fx.Node, Any] = {}
        self.stand_ins = stand_ins

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        self.seen[n] = signature(result)
        return result

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in self.stand_ins:
            return self.stand_ins[target](*args, **kwargs)
        width = getattr(self.fetch_attr(target), "in_features", None)
        x = args[0] if args else None
        if isinstance(width, int) and isinstance(x, torch.Tensor) and x.ndim and x.shape[-1] != width:
            # a Linear takes its own width only; torch's qnnpack engine runs its quantized ones on any (unchecked)
            raise ValueError(f"module {target!r} takes {width} features, got {x.shape[-1]}")
        return super().call_module(target, args, kwargs)


def record(
    gm: torch.fx.GraphModule, args: Sequence[Any], changed: frozenset = frozenset(), stand_ins: StandIns | None = None
) -> Run:
    """Run gm on args, recording each node's signature; raises whatever the model raises."""
    recorder = _Recorder(gm, stand_ins or {})
    with torch.no_grad():
        recorder.run(*args)
    return Run(changed, recorder.seen)


def _inconsistency(base: Run, run: Run) -> str | None:
    for node, sig in base.values.items():
        other = run.values.get(node)
        if other is None or structure(other) != structure(sig):
            return f"node {node.name!r} changes from {_show(sig)} to {_show(other)}"
    return None


def _show(sig: Any) -> str:
    if sig is None:
        return "nothing"
    if sig[0] == "tensor":
        return f"{sig[1]}{list(sig[2])}"
    if sig[0] in ("tuple", "list"):
        return "(" + ", ".join(_show(s) for s in sig[1]) + ")"
    return repr(sig[1])


def search(
    gm: torch.fx.GraphModule,
    specs: Sequence[Spec],
    names: Sequence[str],
    free_dims: str = "auto",
    stand_ins: StandIns | None = None,
    tied: Sequence[frozenset] = (),
) -> list[Run]:
    """The example run, then one run per free dimension (or group of dimensions changed together).

    Raises SpecError if the model does not run on the examples, or a dimension declared free is not.
    """
    flat = [pair for spec, name in zip(specs, names) for pair in leaves(spec, name)]
    base_shapes = {i: leaf.shape for i, (_, leaf) in enumerate(flat)}

    def attempt(dims: frozenset) -> Run | str:
        shapes = dict(base_shapes)
        for leaf, d in dims:
            s = list(shapes[leaf])
            s[d] = 2 * s[d] + 3  # not n + 1: a size's n // 2 (or // 3) must change too, or it would be frozen
            shapes[leaf] = tuple(s)
        try:
            run = record(gm, examples(specs, shapes, fill), dims, stand_ins)
        except Exception as e:  # the user's model refusing the sizes: that dimension is not free
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        why = _inconsistency(base, run)
        return why if why is not None else run

    base, fill = _base_run(gm, specs, names, stand_ins)
    candidates = [
        (i, d)
        for i, (_, leaf) in enumerate(flat)
        for d, dim in enumerate(leaf.dims)
        if dim.free or dim.candidate or free_dims == "auto"
    ]
    # dimensions known to be one size (torch.export gave them one symbol) change together, never alone
    groups = {c: g for g in tied for c in g if g <= set(candidates)}
    runs, failed, tried = [base], {}, set()
    for c in candidates:
        members = groups.get(c, frozenset([c]))
        if members in tried:
            continue
        tried.add(members)
        result = attempt(members)
        if isinstance(result, Run):
            runs.append(result)
        else:
            failed.update((m, result) for m in members)
    # Dimensions that fail alone may work together: a batch that x and h must agree on changes in both at
    # once. Those of one example size are tried together, at most one per tensor (its largest choices
    # first: [2, B, H] beside a batch of 2 offers two), until one choice runs.
    by_size: dict[int, dict[int, list[int]]] = {}
    for leaf, d in failed:
        by_size.setdefault(flat[leaf][1].dims[d].size, {}).setdefault(leaf, []).append(d)
    for leaf, d in candidates:  # with those that ran alone: a mask whose batch may be larger than the ids'
        per_leaf = by_size.get(flat[leaf][1].dims[d].size)
        if per_leaf is not None and (leaf, d) not in failed:
            per_leaf.setdefault(leaf, []).append(d)
    for per_leaf in by_size.values():
        options = [[(leaf, d) for d in dims] + [None] for leaf, dims in per_leaf.items()]
        if math.prod(map(len, options)) > _MAX_CHOICES:  # too many to sort: each tensor's first dimension
            options = [o[:1] for o in options]
        tries = sorted((frozenset(c for c in combo if c) for combo in itertools.product(*options)), key=len,
                       reverse=True)
        for members in [t for t in tries if len(t) >= 2][:_MAX_TRIES]:
            result = attempt(members)
            if isinstance(result, Run):
                runs.append(result)
                for m in members:
                    failed.pop(m, None)
                break
    declared = [c for c in failed if flat[c[0]][1].dims[c[1]].free]
    if declared:
        leaf, d = declared[0]
        name, spec = flat[leaf]
        raise SpecError(
            f"input {name!r} dimension {d} is declared free ({spec}), but the model does not run when it "
            f"changes from {spec.dims[d].size} to {2 * spec.dims[d].size + 3}: {failed[declared[0]]}"
        )
    return runs


def _base_run(gm: torch.fx.GraphModule, specs: Sequence[Spec], names: Sequence[str],
              stand_ins: StandIns | None) -> tuple[Run, str]:
    """The run at the example sizes and the fill it took: "plain" unless the model fails on it and runs on
    "mixed" (FILLS), which only integer and bool inputs change."""
    discrete = any(leaf.dtype not in (None, "float32") for spec in specs for _, leaf in leaves(spec, ""))
    first = None
    for fill in FILLS if discrete else FILLS[:1]:
        try:
            return record(gm, examples(specs, fill=fill), stand_ins=stand_ins), fill
        except Exception as e:
            first = first or e
    shapes = ", ".join(f"{n}: {show(spec)}" for n, spec in zip(names, specs))
    raise SpecError(
        f"the model does not run on inputs of the given shapes ({shapes}): {type(first).__name__}: {first}"
    ) from None


def free_dims_of(runs: Sequence[Run]) -> set:
    """The (flat leaf, dim) pairs some run changed: the free dimensions."""
    return {c for run in runs for c in run.changed}

"""scaled_dot_product_attention as run_decompositions() writes it, found in an exported program's graph.

The decomposition is torch's math path (``_scaled_dot_product_attention_math``), with c = sqrt(scale)::

    scores = view(bmm(view(expand(mul(q, c))), view(expand(mul(permute(k, [0, 1, 3, 2]), c)))))
    p = _softmax(scores + mask, -1)                       # mask: 0 / -inf where it was bool
    p = where(not(any(not(scores + mask == -inf), -1)), 0, p)   # rows masked whole: 0
    y = view(bmm(view(expand(p)), view(expand(v))))

and, around y, a permute, clone, permute that keep it as it is. Its float sums differ from the fused kernel's
in their last bits, which dynamic quantization after the attention can move to another int8 step (all-MiniLM-L6-v2:
1.5e-2 at one length). Read back as the one scaled_dot_product_attention it was (``find``), qrt runs its attention
op, which gives the fused kernel's bits, as for the program before decomposition. Grouped heads are read over
k and v as the decomposition repeats them to q's heads. Forms that differ (a dropout, a mask that broadcasts the
scores beyond their shape, a value of the decomposition read elsewhere) are left as the ops they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
import torch.fx

from .decomposed_linear import traced_shape

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Attention:
    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    mask: torch.fx.Node | None  # additive float, as the decomposition adds it
    scale: float | None  # None: 1 / sqrt(head size), the default
    inside: frozenset[torch.fx.Node]  # the nodes the attention stands for, its result node aside


def find(nodes: Iterable[torch.fx.Node]) -> dict[torch.fx.Node, Attention]:
    """Each decomposed attention of the graph, by its result node."""
    out = {}
    for node in nodes:
        if node.target is aten._softmax.default and node.args[1:] in ((-1, False), (3, False)):
            found = _match(node)
            if found is not None:
                out[found[0]] = found[1]
    return out


def _is(node: object, target: object, *args: object) -> bool:
    """node is target(node.args[0], *args) (args, where given, compared as lists)."""
    return (isinstance(node, torch.fx.Node) and node.target is target and not _extra_kwargs(node)
            and all(_same(a, b) for a, b in zip(node.args[1:], args)) and len(node.args) >= len(args) + 1)


def _extra_kwargs(node: torch.fx.Node) -> bool:
    return any(k not in ("memory_format", "pin_memory", "layout", "device") for k in node.kwargs)


def _same(a: object, b: object) -> bool:
    return list(a) == list(b) if isinstance(a, (list, tuple)) else a == b


def _batched(node: object, seen: list[torch.fx.Node]) -> torch.fx.Node | None:
    """x where node is view(expand(x)) (a clone between them or not) reading the [B, H, n, m] x as [B * H, n, m],
    the expand keeping x's shape; the nodes passed through go to seen."""
    if not _is(node, aten.view.default):
        return None
    inner = node.args[0]
    chain = [node]
    if _is(inner, aten.clone.default):
        chain.append(inner)
        inner = inner.args[0]
    shape = traced_shape(inner)
    if not _is(inner, aten.expand.default) or shape is None or len(shape) != 4 or traced_shape(inner.args[0]) != shape:
        return None
    seen.extend([*chain, inner])
    return inner.args[0]


def _product(view: object, seen: list[torch.fx.Node]) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(a, b) where view is the [B, H, n, p] view of bmm over a and b read as batches."""
    if not (_is(view, aten.view.default) and _is(view.args[0], aten.bmm.default)
            and len(traced_shape(view) or []) == 4):
        return None
    bmm = view.args[0]
    a, b = _batched(bmm.args[0], seen), _batched(bmm.args[1], seen)
    if a is None or b is None:
        return None
    seen.extend([view, bmm])
    return a, b


def _scaled(node: object, seen: list[torch.fx.Node]) -> tuple[torch.fx.Node, float] | None:
    if not (_is(node, aten.mul.Scalar) and isinstance(node.args[1], float)):
        return None
    seen.append(node)
    return node.args[0], node.args[1]


def _safe(softmax: torch.fx.Node, scores: torch.fx.Node, seen: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The where() that zeroes rows of softmax whose every score is -inf (torch's _safe_softmax)."""
    wheres = [u for u in softmax.users if u.target is aten.where.self]
    if len(wheres) != 1 or wheres[0].args[2] is not softmax:
        return None
    where = wheres[0]
    cond, zeros = where.args[:2]
    if not (_is(zeros, aten.full_like.default, 0) and zeros.args[0] is softmax and _is(cond, aten.logical_not.default)):
        return None
    any_ = cond.args[0]
    if not (_is(any_, aten.any.dim, -1, True) or _is(any_, aten.any.dim, 3, True)):
        return None
    kept = any_.args[0]
    if not (_is(kept, aten.logical_not.default) and _is(kept.args[0], aten.eq.Scalar, -math.inf)
            and kept.args[0].args[0] is scores):
        return None
    seen.extend([where, zeros, cond, any_, kept, kept.args[0]])
    return where


def _context(probs: torch.fx.Node, seen: list[torch.fx.Node]) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(y, v) where y is the [B, H, n, e] product of probs and v (view(bmm(view(expand(probs)), ...)))."""
    node = probs
    while node.target is not aten.bmm.default:  # down probs' expand and view to the product
        if len(node.users) != 1:
            return None
        (node,) = node.users
        if node.target not in (aten.expand.default, aten.clone.default, aten.view.default, aten.bmm.default):
            return None
    if len(node.users) != 1:
        return None
    (y,) = node.users
    operands = _product(y, seen)
    return None if operands is None or operands[0] is not probs else (y, operands[1])


def _identity_permutes(y: torch.fx.Node) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The decomposition's permute(clone(permute(y, [2, 0, 1, 3])), [1, 2, 0, 3]) of y, which is y (its last
    node, and the nodes before it), or (y, []) where it is not there."""
    chain, node = [], y
    for target, arg in ((aten.permute.default, [2, 0, 1, 3]), (aten.clone.default, None),
                        (aten.permute.default, [1, 2, 0, 3])):
        if len(node.users) != 1:
            return y, []
        (node,) = node.users
        if not (_is(node, target, arg) if arg is not None else _is(node, target)):
            return y, []
        chain.append(node)
    return chain[-1], [y, *chain[:-1]]


def _match(softmax: torch.fx.Node) -> tuple[torch.fx.Node, Attention] | None:
    seen = [softmax]
    total = softmax.args[0]  # the scores, or the scores plus the mask
    scores, mask = total, None
    if _is(total, aten.add.Tensor) and isinstance(total.args[1], torch.fx.Node):
        seen.append(total)
        scores, mask = total.args[:2]
        if traced_shape(total) != traced_shape(scores):  # the mask broadcast to the scores, not beyond
            return None
    operands = _product(scores, seen)
    if operands is None:
        return None
    q_scaled, k_scaled = _scaled(operands[0], seen), _scaled(operands[1], seen)
    if q_scaled is None or k_scaled is None or q_scaled[1] != k_scaled[1] \
            or not _is(k_scaled[0], aten.permute.default, [0, 1, 3, 2]):
        return None
    (q, c), kt = q_scaled, k_scaled[0]
    seen.append(kt)
    k = kt.args[0]
    probs = _safe(softmax, total, seen)
    found = _context(probs, seen) if probs is not None else None
    if found is None:
        return None
    y, v = found
    shapes = [traced_shape(n) for n in (q, k, v, y)]
    if None in shapes or not (shapes[0][:2] == shapes[1][:2] == shapes[2][:2] and shapes[0][3] == shapes[1][3]):
        return None  # grouped heads (k and v fewer than q) and other forms: left as they are
    result, before = _identity_permutes(y)
    inside = frozenset(seen + before) - {result}
    if any(u not in inside and u is not result for n in inside for u in n.users):
        return None  # a value of the decomposition read elsewhere: left as it is
    head = shapes[0][3]
    default = math.sqrt(1.0 / math.sqrt(int(head))) if head.isdigit() else None
    return result, Attention(q, k, v, mask, None if c == default else c * c, inside)

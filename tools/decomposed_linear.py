"""Linears as run_decompositions() writes them, found in an exported program's graph.

A decomposed ``aten.linear(x, W, b)`` is one of:

- ``addmm(b, x, permute(W, [1, 0]))``, or ``mm(x, permute(W, [1, 0]))`` without a bias, for a 2-D x (a
  3-D x that torch can view as 2-D is viewed so around it);
- ``add(view(bmm(view(expand(x)), view(expand(permute(W, [1, 0]))))), b)`` for a 3-D x it cannot (one read
  through a permute: BERT's attention output); the expands and views leave x and the product as they are.

Each is read as the Linear it is (``find``): the export front end quantizes it as the model's Linear, bias
inside, where the rules say so. A transpose of W is a weight of these Linears alone, or a value in its own
right where something else reads it too. ``t(W)`` stands for ``permute(W, [1, 0])``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import torch.fx
from torch import nn

from . import module_stack

aten = torch.ops.aten
_MOVES = (aten.expand.default, aten.view.default)  # what the bmm form wraps its operands in


@dataclasses.dataclass(frozen=True)
class Linear:
    x: torch.fx.Node
    weight: torch.fx.Node  # the stored [out, in] weight's placeholder
    bias: torch.fx.Node | None  # a stored [out] bias's placeholder
    transpose: torch.fx.Node  # W's transpose, which the product reads
    inside: frozenset[torch.fx.Node]  # the nodes the Linear stands for, its result node aside


def find(nodes: list[torch.fx.Node], consts: Mapping[str, torch.Tensor]) -> dict[torch.fx.Node, Linear]:
    """Each decomposed Linear of the graph, by its result node."""
    out = {}
    for node in nodes:
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target in (aten.addmm.default, aten.mm.default) and len(node.args) in (2, 3):
            w = _weight(node.args[-1], consts)
            bias = node.args[0] if node.target is aten.addmm.default else None
            if w is not None and (bias is None or _is_bias(bias, w, consts)):
                out[node] = Linear(node.args[-2], w, bias, node.args[-1], frozenset())
        elif node.target is aten.bmm.default:
            linear = _batched(node, consts)
            if linear is not None:
                out[linear[0]] = linear[1]
    inside = {n for linear in out.values() for n in linear.inside}
    alone = {t for t in (linear.transpose for linear in out.values())
             if all(u in out or u in inside for u in t.users)}  # read by these Linears alone: no value of its own
    return {result: dataclasses.replace(linear, inside=linear.inside | ({linear.transpose} & alone))
            for result, linear in out.items()}


def _weight(node: object, consts: Mapping[str, torch.Tensor]) -> torch.fx.Node | None:
    """W where node is a transpose of a stored plain 2-D weight W (not a torchao tensor subclass)."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"):
        return None
    flip = node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0])
    w = node.args[0]
    if not (flip and isinstance(w, torch.fx.Node) and w.op == "placeholder"):
        return None
    value = consts.get(w.name)
    return w if type(value) in (torch.Tensor, nn.Parameter) and value.dim() == 2 else None


def _is_bias(node: object, w: torch.fx.Node, consts: Mapping[str, torch.Tensor]) -> bool:
    value = consts.get(node.name) if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None
    return type(value) in (torch.Tensor, nn.Parameter) and tuple(value.shape) == (consts[w.name].shape[0],)


def _unwrapped(node: torch.fx.Node) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """What node's chain of expands and views that keep its shape, each read only by the next, starts from; and
    the chain."""
    chain = []
    while node.op == "call_function" and node.target in _MOVES and len(node.users) == 1 \
            and traced_shape(node.args[0]) == traced_shape(node):
        chain.append(node)
        node = node.args[0]
    return node, chain


def _broadcast_weight(node: torch.fx.Node) -> tuple[torch.fx.Node, list[torch.fx.Node]]:
    """The [in, out] matrix the bmm's right operand node expands over its batch, and the moves doing it."""
    inner, chain = _unwrapped(node)
    shape = traced_shape(inner)
    if inner.target is aten.expand.default and len(inner.users) == 1 and shape is not None \
            and traced_shape(inner.args[0]) == shape[1:]:
        matrix, more = _unwrapped(inner.args[0])
        return matrix, [*chain, inner, *more]
    return inner, chain


def traced_shape(node: object) -> list[str] | None:
    """A node's tensor shape as torch.export traced it, each size as text (a free one is its symbol), or None."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return [str(d) for d in val.shape] if isinstance(val, torch.Tensor) else None


def _batched(bmm: torch.fx.Node, consts: Mapping[str, torch.Tensor]) -> tuple[torch.fx.Node, Linear] | None:
    """(result node, Linear) of the bmm form, or None."""
    x, left = _unwrapped(bmm.args[0])
    t, right = _broadcast_weight(bmm.args[1])
    w = _weight(t, consts)
    if w is None or traced_shape(x) is None or len(traced_shape(x)) != 3:
        return None
    inside, result = {bmm, *left, *right}, bmm
    if len(result.users) == 1:
        (user,) = result.users
        if user.target is aten.view.default and traced_shape(user) == traced_shape(result):
            inside.add(result)
            result = user
    if len(result.users) == 1:
        (user,) = result.users
        if user.target is aten.add.Tensor and user.args[0] is result and _is_bias(user.args[1], w, consts) \
                and not user.kwargs and _same_module(user, bmm):
            inside.add(result)
            return user, Linear(x, w, user.args[1], t, frozenset(inside))
    inside.discard(result)
    return result, Linear(x, w, None, t, frozenset(inside))


def _same_module(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    return module_stack.entries(a) == module_stack.entries(b)

"""Recurrent ATen ops of a saved program (a ``.pt2`` read without its model) raised to calls of torch's modules.

With the model at hand, the export front end calls each nn.RNN / LSTM / GRU (or cell) again by its kept
signature. A saved program has only ``aten.lstm.input`` (``gru.input``, ``rnn_tanh.input``, ``rnn_relu.input``,
``lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``, ``rnn_relu_cell``) over its weights: this rebuilds the module
from those weights and the op's arguments, and the raised graph calls it as torch.fx would have traced it. The
rest of the flow treats it as it treats the module: a float program's is quantized under the rules, a
prequantized (torchao) program's stays float (tools/lower_float_recurrent.py). A state the module made itself
(``torch.zeros`` of the batch's size, when forward() was given none) is left out of the call: the module starts
from zeros.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn

from . import module_stack, pt2e
from .lower_values import LoweringError

MODULES = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}
CELLS = {"lstm_cell": nn.LSTMCell, "gru_cell": nn.GRUCell, "rnn_tanh_cell": nn.RNNCell, "rnn_relu_cell": nn.RNNCell}
_RECURRENT = {getattr(torch.ops.aten, name).input for name in MODULES} | {
    getattr(torch.ops.aten, name).default for name in CELLS
}
# torch.zeros(...), x.new_zeros(...), torch.zeros_like(h): zeros, whatever their sizes
_ZEROS = (torch.ops.aten.zeros.default, torch.ops.aten.new_zeros.default, torch.ops.aten.zeros_like.default)
# ops that hand their input on unchanged: h0 = torch.zeros(...).detach() is still a zero state
_PASS_THROUGH = {torch.ops.aten.detach.default, torch.ops.aten.clone.default, torch.ops.aten.alias.default}


class ZeroState:
    """The value of a zeros node that only sets a recurrent op's initial state: not raised, left out."""


ZERO_STATE = ZeroState()


def is_recurrent(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _RECURRENT


def _read_as_state_only(node: torch.fx.Node) -> bool:
    """Whether recurrent ops read node as their state, through pass-through ops, and nothing else reads it."""
    return bool(node.users) and all((is_recurrent(u) and node is not u.args[0])
                                    or (u.target in _PASS_THROUGH and _read_as_state_only(u)) for u in node.users)


def is_zero_state(node: torch.fx.Node) -> bool:
    """Whether node is a zeros tensor, or a pass-through op of one, that recurrent ops read as their state and
    nothing else reads."""
    source = node
    while source.target in _PASS_THROUGH and isinstance(source.args[0], torch.fx.Node):
        source = source.args[0]
    return source.target in _ZEROS and _read_as_state_only(source)


def _path(node: torch.fx.Node, cls: type) -> str:
    """The module path the op ran in (the innermost of its class), or the node's name for a bare _VF call."""
    for path, name in reversed(module_stack.entries(node)):
        if path and name == module_stack.class_name(cls):
            return path
    return node.name


def rebuild(node: torch.fx.Node, args: tuple) -> tuple[str, nn.Module, list]:
    """(module path, the module, its call's arguments) for a recurrent ATen op whose arguments (raised values,
    constants) are args."""
    kind = node.target.overloadpacket.__name__
    if kind in CELLS:
        return _rebuild_cell(node, kind, args)
    x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
    dirs = 2 if bidirectional else 1
    if train and dropout and layers > 1:
        raise LoweringError(f"{kind} in training mode with dropout {dropout}: export the model in eval mode")
    if len(params) != layers * dirs * (4 if has_biases else 2):
        raise LoweringError(f"{kind} with {len(params)} weights for {layers} layers, bidirectional={bidirectional}, "
                            f"bias={has_biases} (an LSTM with proj_size is not supported)")
    if not all(isinstance(p, pt2e.Constant) for p in params):
        raise LoweringError(f"{kind} whose weights are computed in the program, not stored in it")
    cls = MODULES[kind]
    w_ih, w_hh = params[0].value, params[1].value
    extra = {"nonlinearity": kind[4:]} if cls is nn.RNN else {}
    module = cls(w_ih.shape[1], w_hh.shape[1], layers, bias=bool(has_biases), batch_first=bool(batch_first),
                 bidirectional=bool(bidirectional), **extra).eval()
    _assign(module, module._flat_weights_names, params)
    return _path(node, cls), module, call_arguments(kind, x, hx)


def _rebuild_cell(node: torch.fx.Node, kind: str, args: tuple) -> tuple[str, nn.Module, list]:
    x, hx, *params = args
    params = [p for p in params if p is not None]
    if len(params) not in (2, 4) or not all(isinstance(p, pt2e.Constant) for p in params):
        raise LoweringError(f"{kind} whose weights are computed in the program, not stored in it")
    cls = CELLS[kind]
    extra = {"nonlinearity": kind.split("_")[1]} if cls is nn.RNNCell else {}
    w_ih, w_hh = params[0].value, params[1].value
    module = cls(w_ih.shape[1], w_hh.shape[1], bias=len(params) == 4, **extra).eval()
    _assign(module, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"], params)
    return _path(node, cls), module, call_arguments(kind, x, hx)


def _assign(module: nn.Module, names: list[str], params: list) -> None:
    for name, p in zip(names, params):
        setattr(module, name, nn.Parameter(p.value.detach().clone(), requires_grad=False))


def has_zero_state(hx: Any) -> bool:
    return hx is ZERO_STATE or (isinstance(hx, (list, tuple)) and any(s is ZERO_STATE for s in hx))


def call_arguments(kind: str, x: Any, hx: Any) -> list:
    """The module's arguments: x, and the state unless the module made it (zeros)."""
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    given = [s for s in states if s is not ZERO_STATE]
    if given and len(given) != len(states):
        raise LoweringError(f"{kind} given some of its initial states and zeros for the others")
    if not given:
        return [x]
    return [x, tuple(given) if kind.startswith("lstm") else given[0]]


def results(raiser: Any, call: torch.fx.Node, kind: str) -> Any:
    """The op's results from the module's: a sequence's flat (y, h_n[, c_n]) from (y, h_n) or (y, (h_n, c_n));
    a cell's as they are."""
    if kind in CELLS:
        return call
    item = lambda v, i: raiser.function(operator.getitem, (v, i), {})  # noqa: E731
    if kind != "lstm":
        return item(call, 0), item(call, 1)
    state = item(call, 1)
    return item(call, 0), item(state, 0), item(state, 1)

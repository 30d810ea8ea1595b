"""The per-node path: every node's prepared step in order, from Python.

Both backends' plans run it: the CPU's for a new set of input shapes before compiling a native
program for them (qrt/plan.py), the GPU's to check a call and warm up before capturing its CUDA
graph, and again inside the capture (qrt/gpu/plan.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .graph import Graph
from .ops import OPS


class Interpreter:
    """A graph's nodes over their backend's prepared steps (steps[i] runs graph.nodes[i]).

    ``consts`` holds the stored tensors that feed run-time ports (a constant operand of add, say),
    as the backend's arrays.
    """

    def __init__(self, graph: Graph, steps: Sequence[Callable], consts: Mapping[str, Any]) -> None:
        self.graph = graph
        self.steps = list(steps)
        self.consts = consts
        self.input_names = [s.name for s in graph.inputs]
        # each node's run-time operands, in port order
        self.args: list[list[str]] = [
            [node.inputs[p.name] for p in OPS[node.op].inputs if not p.const and p.name in node.inputs]
            for node in graph.nodes
        ]

    def run(self, inputs: Sequence[Any]) -> dict[str, Any]:
        """Every value of one run by name (inputs in input order); a step's ValueError names its node."""
        values: dict[str, Any] = dict(zip(self.input_names, inputs))
        for node, step, args in zip(self.graph.nodes, self.steps, self.args):
            try:
                results = step(*[values[v] if v in values else self.consts[v] for v in args])
            except ValueError as e:
                raise ValueError(f"node {node.name!r} ({node.op}): {e}") from None
            values.update(zip(node.outputs, results))
        return values

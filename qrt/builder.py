"""GraphBuilder: assemble a .qrt graph and its tensors in a few calls.

    b = GraphBuilder()
    x = b.input("x", "float32", [None, 37])
    y = b.node("linear_dynamic", {"x": x, "weight": w_int8, "weight_scale": s, "weight_zero_point": z})
    b.output(y)
    b.save("model.qrt")

Nested arguments and results (an LSTM's state (h, c), say) are declared over
the flat inputs and values: ``input_nested(("x", ("h", "c")))`` for
``forward(x, state)``, ``output_nested((y, (h_n, c_n)))`` for ``return y, (h_n, c_n)``.

Arrays passed as node inputs are stored as tensors named ``<node>.<port>``,
in their own dtype: a float64 per-channel scale is stored as F64, never cast
(``np.asarray(0.1)`` is float64 too, so give per-tensor scales as float32).
Used by the converter and the tests; it writes the JSON form that
docs/FORMAT.md specifies, and ``save`` validates it like the loader does.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import format as qformat
from .ops import OPS


class GraphBuilder:
    def __init__(self) -> None:
        self.inputs: list[dict] = []
        self.nodes: list[dict] = []
        self.tensors: dict[str, np.ndarray] = {}
        self.outputs: list[str] = []
        self.output_structure: str | list = "single"
        self.input_structure: list | None = None  # None: every input is its own argument

    def input(self, name: str, dtype: str, shape: list) -> str:
        self.inputs.append({"name": name, "dtype": dtype, "shape": list(shape)})
        return name

    def tensor(self, name: str, array: np.ndarray) -> str:
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} is already defined")
        self.tensors[name] = np.asarray(array)
        return name

    def node(
        self,
        op: str,
        inputs: Mapping[str, str | np.ndarray],
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> str | tuple[str, ...]:
        """Add a node; returns its output value name (a tuple if it has several)."""
        spec = OPS[op]
        name = name or f"{op}_{len(self.nodes)}"
        wired = {}
        for port, value in inputs.items():
            if value is None:
                continue
            if not isinstance(value, str):
                value = self.tensor(f"{name}.{port}", value)
            wired[port] = value
        outputs = [name if len(spec.outputs) == 1 else f"{name}.{o}" for o in spec.outputs]
        self.nodes.append(
            {"name": name, "op": op, "inputs": wired, "outputs": outputs, "attrs": dict(attrs or {})}
        )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def output(self, *names: str, as_tuple: bool | None = None) -> None:
        """Declare the outputs; a tuple unless there is one and as_tuple is not True."""
        self.outputs = list(names)
        self.output_structure = "tuple" if (as_tuple or len(names) != 1) else "single"

    def input_nested(self, tree: Sequence) -> None:
        """Group the declared inputs into forward()'s arguments: one entry per argument, each an
        input name or a tuple (or list) of entries, every input exactly once; e.g. ("x", ("h", "c"))."""
        index = {spec["name"]: i for i, spec in enumerate(self.inputs)}

        def leaf(name: str) -> int:
            if name not in index:
                raise ValueError(f"input_nested: {name!r} is not a declared input; the inputs are {list(index)}")
            return index[name]

        if not isinstance(tree, (tuple, list)):
            raise ValueError(f"input_nested: give one entry per forward() argument (a tuple), got {tree!r:.80}")
        nested = _map_tree(tree, leaf)
        # every input its own argument, in order, is what a file without input_structure means
        self.input_structure = None if nested == list(range(len(self.inputs))) else nested

    def output_nested(self, tree: str | Sequence) -> None:
        """Declare the outputs as the model returns them: a value name (one array), or nested tuples
        (or lists) of value names, e.g. (y, (h_n, c_n)). The flat outputs are its leaves in order."""
        names: list[str] = []

        def leaf(name: str) -> int:
            names.append(name)
            return len(names) - 1

        nested = _map_tree(tree, leaf)
        self.outputs = names
        if isinstance(nested, int):
            self.output_structure = "single"
        elif nested == list(range(len(names))):
            self.output_structure = "tuple"
        else:
            self.output_structure = nested

    def drop_unused(self) -> set[str]:
        """Remove the nodes no output needs (an encoder's unused pooler, say) and the tensors only they
        read; returns the value names that went."""
        needed, kept = set(self.outputs), []
        for node in reversed(self.nodes):
            if needed.intersection(node["outputs"]):
                kept.append(node)
                needed.update(node["inputs"].values())
        live = {id(node) for node in kept}
        gone = {o for node in self.nodes if id(node) not in live for o in node["outputs"]}
        self.nodes = kept[::-1]
        gone |= {t for t in self.tensors if t not in needed}
        self.tensors = {k: v for k, v in self.tensors.items() if k in needed}
        return gone

    def merge_duplicates(self) -> dict[str, str]:
        """Compute each value once: a node of an earlier node's op and attributes that reads the same values
        (stored tensors of one dtype, shape and bytes are one value) goes, and what read its outputs reads the
        earlier node's. Every op is a function of its operands and attributes alone, so the outputs are the
        same bits (T5 masked its one position bias again in each layer). A node whose outputs the graph returns
        stays. Returns the renaming: value gone -> value kept (the tensors only the nodes gone read stay, for
        drop_unused)."""
        same: dict[tuple, str] = {}  # a stored tensor's contents -> the first tensor of them
        tensor = {name: same.setdefault((a.dtype.str, a.shape, _digest(a)), name) for name, a in self.tensors.items()}
        outputs, seen, kept, renamed = set(self.outputs), {}, [], {}
        for node in self.nodes:
            node["inputs"] = {p: renamed.get(v, v) for p, v in node["inputs"].items()}
            key = (node["op"], json.dumps(node["attrs"], sort_keys=True),
                   tuple(sorted((p, tensor.get(v, v)) for p, v in node["inputs"].items())))
            earlier = seen.setdefault(key, node)
            if earlier is not node and not outputs.intersection(node["outputs"]):
                renamed.update(zip(node["outputs"], earlier["outputs"]))
            else:
                kept.append(node)
        self.nodes = kept
        return renamed

    def graph(self) -> dict:
        g = {
            "inputs": self.inputs,
            "nodes": self.nodes,
            "outputs": self.outputs,
            "output_structure": self.output_structure,
        }
        if self.input_structure is not None:
            g["input_structure"] = self.input_structure
        return g

    def save(self, path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
        qformat.save(path, self.graph(), self.tensors, metadata)


def _digest(a: np.ndarray) -> bytes:
    """sha256 of an array's bytes in C order, read in place where it is C-contiguous (a model's weights are not
    copied to be hashed)."""
    return hashlib.sha256(np.ascontiguousarray(a).reshape(-1).view(np.uint8)).digest()


def _map_tree(tree: Any, leaf: Callable[[str], int]) -> Any:
    """Nested tuples/lists of names -> the same nesting as lists, each name replaced by leaf(name)."""
    if isinstance(tree, str):
        return leaf(tree)
    if isinstance(tree, (tuple, list)):
        return [_map_tree(t, leaf) for t in tree]
    raise ValueError(f"a tree's leaves must be names (str), got {type(tree).__name__}")

"""Loading a .qrt file into a runnable Model, and binding inputs to it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from . import format as qformat
from .graph import Graph, Tree, ValueSpec, check_input, nest, tree_names, tree_text
from .ops import OPS
from .plan import Stream

# One array; a sequence of arrays in input order, or nested as forward()'s arguments; a dict by input
# name, or by argument name with nested tuples as values (Model.run).
Inputs = Union[np.ndarray, Sequence[Any], Mapping[str, Any]]
Outputs = Union[np.ndarray, tuple]
_MISSING = object()


def _backend(device: str):
    if device == "cpu":
        from . import cpu

        return cpu
    if device == "cuda":
        from . import gpu

        gpu.require_cuda()  # says whether CuPy, the driver or a GPU is missing
        return gpu
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


class Model:
    """A loaded, validated model, prepared once and runnable many times.

    ``run`` keeps no state between calls, so one Model may be run from
    several threads at once.
    """

    def __init__(self, path: str | os.PathLike, device: str = "cpu", verify: bool = True) -> None:
        backend = self._backend = _backend(device)
        qfile = qformat.load_file(path, verify)
        self.path = os.fspath(path)
        self._absolute_path = os.path.abspath(self.path)  # where a worker with another working directory finds it
        self.device = device
        self.verified = verify
        self.metadata: Mapping[str, str] = qfile.metadata
        self.graph = qfile.graph
        g = self.graph
        if device == "cuda":
            backend.refuse_unsupported(g)
        self._names = [s.name for s in g.inputs]
        self._index = {name: i for i, name in enumerate(self._names)}
        # per argument of forward(): its name, where it has one; nested ones by name, for dict calls
        self._arg_names = _argument_names(g)
        self._arguments = {n: t for n, t in zip(self._arg_names, g.input_structure) if n and isinstance(t, tuple)}
        self._output_tuple = g.output_tuple
        # None when run returns one array or a flat tuple (the per-call fast path), else the tree
        flat = not g.output_tuple or g.output_structure == tuple(range(len(g.outputs)))
        self._out_nested = None if flat else g.output_structure

        # per input: what an array needs to pass check_input untouched (the per-call fast path)
        self._accepts = [
            (np.dtype(s.dtype), len(s.shape), tuple((i, d) for i, d in enumerate(s.shape) if d is not None))
            for s in self.graph.inputs
        ]
        self._steps = []  # (node, its prepared step)
        for node in self.graph.nodes:
            op = OPS[node.op]
            consts = {p: qfile.tensors[v] for p, v in node.inputs.items() if op.port(p).const}
            self._steps.append((node, backend.prepare(node, consts)))
        # the whole model per call: one native call on the CPU (qrt/plan.py), one CUDA graph on the GPU
        # (qrt/gpu/plan.py)
        self._plan = backend.build_plan(g, qfile.tensors, [step for _, step in self._steps])

    @property
    def inputs(self) -> tuple[ValueSpec, ...]:
        """Name, dtype and shape (None for a free dimension) of each input, in order."""
        return self.graph.inputs

    @property
    def outputs(self) -> tuple[ValueSpec, ...]:
        """Name, dtype and shape of each output, in the flat order of output_structure's leaves."""
        return self.graph.outputs

    @property
    def input_structure(self) -> tuple:
        """forward()'s arguments: one entry per argument, each an input name or a tuple of entries,
        e.g. ('x', ('hidden.0', 'hidden.1')) for forward(x, hidden) with hidden = (h, c)."""
        return tree_names(self.graph.input_structure, self.graph.inputs)

    @property
    def output_structure(self) -> str | tuple:
        """What run returns: an output name (one array) or a tuple of entries, e.g. ('y', ('h', 'c'))."""
        return tree_names(self.graph.output_structure, self.graph.outputs)

    def __repr__(self) -> str:
        return f"Model({self.path!r}, inputs={list(self.inputs)}, outputs={list(self.outputs)})"

    def __reduce__(self) -> tuple:
        """Pickled as its absolute path: the receiving process maps and validates the file again (for
        multiprocessing, concurrent.futures, Ray or Dask workers), verifying it as this one was, and
        refuses it if its header's checksum is no longer the one this Model was loaded with."""
        return _unpickle, (self._absolute_path, self.device, qformat.stored_checksum(self.metadata), self.verified)

    def _accept(self, i: int, a: Any) -> np.ndarray:
        """Input i checked: returned as it is when it already conforms, else by check_input."""
        dtype, ndim, fixed = self._accepts[i]
        if (
            type(a) is np.ndarray
            and a.dtype == dtype
            and a.ndim == ndim
            and a.flags.c_contiguous
            and a.flags.aligned
            and all(a.shape[j] == d for j, d in fixed)
        ):
            return a
        # a backend taking device arrays says which array library an input belongs to
        return check_input(self.graph.inputs[i], a, getattr(self._backend, "array_module", None))

    def _bind(self, inputs: Inputs) -> list[np.ndarray]:
        specs = self.graph.inputs
        if type(inputs) is np.ndarray and len(specs) == 1:  # the common call: one array
            return [self._accept(0, inputs)]
        if isinstance(inputs, Mapping):
            try:  # every flat name, and nothing else (equal sizes): the usual dict, without the general walk
                given = [inputs[n] for n in self._names] if len(inputs) == len(self._names) else None
            except KeyError:
                given = None
            if given is None:
                given = self._from_mapping(inputs)
        elif isinstance(inputs, (list, tuple)):
            if any(isinstance(a, (list, tuple)) for a in inputs):  # nested as forward()'s arguments
                given = self._from_arguments(inputs)
            elif len(inputs) != len(specs):
                raise ValueError(
                    f"got {len(inputs)} input(s), the model takes {len(specs)}: {self._names}" + self._hint()
                )
            else:
                given = list(inputs)
        else:
            if len(specs) != 1:
                raise ValueError(
                    f"got one array, the model takes {len(specs)} inputs {self._names}: pass a sequence or a dict"
                    + self._hint()
                )
            given = [inputs]
        return [self._accept(i, a) for i, a in enumerate(given)]

    def _hint(self) -> str:
        """How to call a model whose arguments are nested, for error messages ('' when none are)."""
        tree = self.graph.input_structure
        if tree == tuple(range(len(self._names))):
            return ""
        return f"; nested as its arguments: {self._signature()}"

    def _signature(self) -> str:
        """forward()'s arguments, e.g. (x, hidden=(hidden.0, hidden.1))."""
        parts = []
        for name, arg in zip(self._arg_names, self.graph.input_structure):
            text = tree_text(tree_names(arg, self.graph.inputs))
            parts.append(f"{name}={text}" if name and isinstance(arg, tuple) else text)
        return "(" + ", ".join(parts) + ")"

    def _from_arguments(self, args: Sequence[Any]) -> list[Any]:
        tree = self.graph.input_structure
        if len(args) != len(tree):
            raise ValueError(f"got {len(args)} argument(s), the model takes {len(tree)}: {self._signature()}")
        given = [_MISSING] * len(self._names)
        for k, (t, a) in enumerate(zip(tree, args)):
            self._unpack(t, a, f"argument {self._arg_names[k] or k!r}", given)
        return given

    def _from_mapping(self, inputs: Mapping[str, Any]) -> list[Any]:
        unknown = [k for k in inputs if k not in self._index and k not in self._arguments]
        if unknown:
            raise ValueError(f"unknown input name(s) {unknown}; the model's inputs are {self._names}" + self._hint())
        given = [_MISSING] * len(self._names)
        for key, value in inputs.items():
            if key in self._index:
                self._unpack(self._index[key], value, f"input {key!r}", given)
            else:
                self._unpack(self._arguments[key], value, f"argument {key!r}", given)
        missing = [n for n, a in zip(self._names, given) if a is _MISSING]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model's inputs are {self._names}" + self._hint())
        return given

    def _unpack(self, tree: Tree, value: Any, where: str, given: list[Any]) -> None:
        """Put value's arrays in given, at the input indices of tree (as deep as tree, no deeper)."""
        if isinstance(tree, int):
            if given[tree] is not _MISSING:
                raise ValueError(f"input {self._names[tree]!r} is given twice")
            given[tree] = value
            return
        if not isinstance(value, (list, tuple)) or len(value) != len(tree):
            got = f"{len(value)} element(s)" if isinstance(value, (list, tuple)) else type(value).__name__
            want = tree_text(tree_names(tree, self.graph.inputs))
            raise ValueError(f"{where}: expected a tuple {want}, got {got}")
        for k, (t, v) in enumerate(zip(tree, value)):
            self._unpack(t, v, f"{where}[{k}]", given)

    def run(self, inputs: Inputs) -> Outputs:
        """Run the model on one array, a sequence of arrays in input order, or a dict by input name.

        A model whose forward() took tuples (an LSTM's state (h, c), say) also takes its arguments
        nested as input_structure shows them, a sequence such as [x, (h, c)] (an element that is a
        tuple or list marks the call as nested), or a dict by argument name, {"x": x, "state": (h, c)}.

        Returns one array, or tuples nested as the source model returned them (output_structure).
        """
        # the common calls (one array, a flat list, arguments nested as forward()'s, a dict of every
        # input) at shapes already compiled: one native call, no binding, outputs nested as below;
        # None unless the arrays fit a compiled program exactly (and always None on the GPU)
        result = self._plan.call(inputs)
        if result is not None:
            return result
        out = self._plan.run(self._bind(inputs))
        if self._out_nested is not None:
            return nest(self._out_nested, out)
        return tuple(out) if self._output_tuple else out[0]

    def stream(self, state: Mapping[str, Any] | None = None) -> Stream:
        """A stateful stepper for a cell model (see qrt.plan.Stream): h (and c) stay inside between calls
        (on the GPU, in device memory)."""
        return self._plan.stream(state)


def _argument_names(graph: Graph) -> list[str | None]:
    """The name of each argument of forward(), or None.

    An argument that is one array has its input's name. The converter names the inputs of argument
    `hidden` = (h, c) `hidden.0` and `hidden.1` (deeper: `hidden.1.0`); a tuple argument whose inputs
    follow that convention takes its name from them. One that does not, or whose name is also an
    input's or another argument's, has none: it is passed by position or by its inputs' names.
    """
    names: list[str | None] = []
    for arg in graph.input_structure:
        if isinstance(arg, int):
            names.append(graph.inputs[arg].name)
            continue
        bases = set()
        stack: list[tuple[Tree, str]] = [(arg, "")]
        while stack:
            t, suffix = stack.pop()
            if isinstance(t, tuple):
                stack.extend((c, f"{suffix}.{k}") for k, c in enumerate(t))
                continue
            name = graph.inputs[t].name
            bases.add(name[: -len(suffix)] if name.endswith(suffix) else None)
        base = bases.pop() if len(bases) == 1 else None
        names.append(base or None)
    nested = [n for n, a in zip(names, graph.input_structure) if isinstance(a, tuple) and n]
    taken = {s.name for s in graph.inputs}
    clash = {n for n, count in Counter(nested).items() if count > 1 or n in taken}
    return [None if isinstance(a, tuple) and n in clash else n for n, a in zip(names, graph.input_structure)]


def _unpickle(path: str, device: str, checksum: str, verify: bool = True) -> Model:
    model = Model(path, device, verify)
    if qformat.stored_checksum(model.metadata) != checksum:
        raise qformat.FormatError(f"{path}: the file changed since this Model was pickled (its data checksum differs)")
    return model


def load(path: str | os.PathLike, device: str = "cpu", verify: bool = True) -> Model:
    """Load and validate a .qrt file. Raises qrt.FormatError if it is malformed.

    The kernels read the weights of a version 4 file where the file is mapped: loading copies
    nothing. verify=True (the default) also checks the data against the header's checksum, one
    pass over the file on every thread; verify=False skips that pass for a file checked before
    (every other check still runs, and a kernel never reads outside its tensor).
    """
    return Model(path, device, verify)


def run(model_file: str | os.PathLike, inputs: Inputs, device: str = "cpu") -> Outputs:
    """Load a model and run it once on inputs (see Model.run)."""
    return load(model_file, device).run(inputs)

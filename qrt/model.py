"""Loading a .qrt file into a runnable Model, and binding inputs to it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from . import format as qformat
from .graph import ValueSpec
from .ops import OPS

Inputs = Union[np.ndarray, Sequence[np.ndarray], Mapping[str, np.ndarray]]
Outputs = Union[np.ndarray, tuple]


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

    def __init__(self, path: str | os.PathLike, device: str = "cpu") -> None:
        backend = self._backend = _backend(device)
        qfile = qformat.load_file(path)
        self.path = os.fspath(path)
        self.device = device
        self.metadata: Mapping[str, str] = qfile.metadata
        self.graph = qfile.graph
        self._output_tuple = qfile.graph.output_tuple

        # Every run-time value gets a slot in a flat list; stored tensors that feed
        # run-time ports (rare: a constant operand of add) are pre-filled.
        slots: dict[str, int] = {}

        def slot(name: str) -> int:
            return slots.setdefault(name, len(slots))

        for spec in self.graph.inputs:
            slot(spec.name)
        self._steps = []
        for node in self.graph.nodes:
            op = OPS[node.op]
            consts = {p: qfile.tensors[v] for p, v in node.inputs.items() if op.port(p).const}
            args = [slot(node.inputs[p.name]) for p in op.inputs if not p.const and p.name in node.inputs]
            outs = [slot(o) for o in node.outputs]
            self._steps.append((node, backend.prepare(node, consts), args, outs))
        self._template = [None] * len(slots)
        for name, i in slots.items():
            if name in qfile.tensors:
                self._template[i] = np.array(qfile.tensors[name])
        self._out_slots = []
        for spec in self.graph.outputs:
            if spec.name in qfile.tensors:  # an output that is a stored tensor: hand out a copy
                self._out_slots.append(np.array(qfile.tensors[spec.name]))
            else:
                self._out_slots.append(slot(spec.name))
        self._in_slots = [slots[s.name] for s in self.graph.inputs]
        # per input: what an array needs to pass _check_input untouched (the per-call fast path)
        self._accepts = [
            (np.dtype(s.dtype), len(s.shape), tuple((i, d) for i, d in enumerate(s.shape) if d is not None))
            for s in self.graph.inputs
        ]

    @property
    def inputs(self) -> tuple[ValueSpec, ...]:
        """Name, dtype and shape (None for a free dimension) of each input, in order."""
        return self.graph.inputs

    @property
    def outputs(self) -> tuple[ValueSpec, ...]:
        return self.graph.outputs

    def __repr__(self) -> str:
        return f"Model({self.path!r}, inputs={list(self.inputs)}, outputs={list(self.outputs)})"

    def __reduce__(self) -> tuple:
        """Pickled as its path: the receiving process maps and validates the file again (for
        multiprocessing, concurrent.futures, Ray or Dask workers), and refuses it if its data is
        no longer the data this Model was loaded from."""
        return _unpickle, (self.path, self.device, self.metadata[qformat.META_CHECKSUM])

    def _accept(self, i: int, a: Any) -> np.ndarray:
        """Input i checked: returned as it is when it already conforms, else by _check_input."""
        dtype, ndim, fixed = self._accepts[i]
        if (
            type(a) is np.ndarray
            and a.dtype == dtype
            and a.ndim == ndim
            and a.flags.c_contiguous
            and all(a.shape[j] == d for j, d in fixed)
        ):
            return a
        # a backend taking device arrays says which array library an input belongs to
        return _check_input(self.graph.inputs[i], a, getattr(self._backend, "array_module", None))

    def _bind(self, inputs: Inputs) -> list[np.ndarray]:
        specs = self.graph.inputs
        if type(inputs) is np.ndarray and len(specs) == 1:  # the common call: one array
            return [self._accept(0, inputs)]
        names = [s.name for s in specs]
        if isinstance(inputs, Mapping):
            unknown = [k for k in inputs if k not in names]
            if unknown:
                raise ValueError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ValueError(f"missing input(s) {missing}; the model's inputs are {names}")
            given = [inputs[n] for n in names]
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) != len(specs):
                raise ValueError(f"got {len(inputs)} input(s), the model takes {len(specs)}: {names}")
            given = list(inputs)
        else:
            if len(specs) != 1:
                raise ValueError(
                    f"got one array, the model takes {len(specs)} inputs {names}: pass a sequence or a dict"
                )
            given = [inputs]
        return [self._accept(i, a) for i, a in enumerate(given)]

    def run(self, inputs: Inputs) -> Outputs:
        """Run the model: one array, a sequence in input order, or a dict by name.

        Returns one array, or a tuple when the source model returned a tuple.
        """
        env: list[Any] = list(self._template)
        given = self._bind(inputs)
        for i, a in zip(self._in_slots, given):
            env[i] = a
        for node, step, args, outs in self._steps:
            try:
                results = step(*[env[i] for i in args])
            except ValueError as e:
                raise ValueError(f"node {node.name!r} ({node.op}): {e}") from None
            for i, r in zip(outs, results):
                env[i] = r
        out = [env[s] if isinstance(s, int) else s.copy() for s in self._out_slots]
        if hasattr(self._backend, "outputs_like"):  # device outputs back in the inputs' array library
            out = self._backend.outputs_like(out, given)
        return tuple(out) if self._output_tuple else out[0]


def _check_input(spec: ValueSpec, a: Any, array_module: Any = None) -> np.ndarray:
    want = np.dtype(spec.dtype)
    xp = np if isinstance(a, np.ndarray) else (array_module(a) if array_module else None)
    if xp is None:
        raise ValueError(
            f"input {spec.name!r}: expected a numpy.ndarray of {spec.dtype}, got {type(a).__name__}"
        )
    if a.dtype != want:
        if a.dtype.kind == want.kind and a.dtype.itemsize == want.itemsize:
            a = a.astype(want)  # other byte order: lossless
        else:
            raise ValueError(f"input {spec.name!r}: dtype is {a.dtype}, expected {spec.dtype}")
    if a.ndim != len(spec.shape) or any(d is not None and d != g for d, g in zip(spec.shape, a.shape)):
        want_shape = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        raise ValueError(f"input {spec.name!r}: shape is {list(a.shape)}, expected {want_shape}")
    return xp.ascontiguousarray(a)


def _unpickle(path: str, device: str, checksum: str) -> Model:
    model = Model(path, device)
    if model.metadata[qformat.META_CHECKSUM] != checksum:
        raise qformat.FormatError(f"{path}: the file changed since this Model was pickled (its data checksum differs)")
    return model


def load(path: str | os.PathLike, device: str = "cpu") -> Model:
    """Load and validate a .qrt file. Raises qrt.FormatError if it is malformed."""
    return Model(path, device)


def run(model_file: str | os.PathLike, inputs: Inputs, device: str = "cpu") -> Outputs:
    """Load a model and run it once on inputs (see Model.run)."""
    return load(model_file, device).run(inputs)

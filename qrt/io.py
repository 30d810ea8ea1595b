"""Model inputs from .npy / .npz files, and random ones of a model's dtypes and shapes.

What the command-line tools share (``qrt run``, ``qrt bench``, ``qrt-compare``), for scripts too:

    model = qrt.load("step.qrt")
    inputs = qrt.io.load_inputs(model.inputs, ["x=x.npy", "h=h.npy"])  # .npy files by input name
    inputs = qrt.io.load_inputs(model.inputs, archive="in.npz")        # an .npz archive by input name
    inputs = qrt.io.random_inputs(model.graph, batch=8, seq=20)
    y = model.run(inputs)

Inputs are by flat input name (``Model.inputs``; a tuple argument ``hidden`` = (h, c) is the two inputs
``hidden.0`` and ``hidden.1``). A problem with a file, or arrays that do not fit the model's input
names, raises ValueError naming the file or the inputs; dtypes and shapes are checked by Model.run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from .graph import Graph, Node, ValueSpec
from .ops import SEQUENCE_OPS

MAX_RANDOM_BYTES = 1 << 30  # random_inputs refuses more per input: a file's fixed dimensions could ask for any size

# Ops whose output keeps the leading dimensions of the given input port, so a time axis stays where it
# is through them (token ids -> embedding -> lstm, features -> linear -> gru).
_KEEPS_LEADING_DIMS = {
    **{op: "x" for op in ("linear", "linear_dynamic", "linear_float", "quantize_per_tensor", "dequantize",
                          "relu", "sigmoid", "tanh", "gelu", "silu", "layer_norm", "batch_norm")},
    "embedding": "indices",
}
# Ops that read an integer input as row indices into their `weight` (random indices must be in range).
_INDEX_OPS = ("embedding", "embedding_bag")


def _check_file(path: str | os.PathLike, what: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a directory")
    return path


def read_array(path: str | os.PathLike) -> np.ndarray:
    """One array from a .npy file (never unpickling). Raises ValueError naming the file."""
    path = _check_file(path, "input file")
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:  # ValueError (pickled / not .npy), OSError
        raise ValueError(f"cannot read {path!r} as a .npy array: {e}") from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise ValueError(f"{path!r} is an .npz archive, not one .npy array")
    return a


def read_archive(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive by name (never unpickling). Raises ValueError naming the file."""
    path = _check_file(path, "archive")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # not a zip / npy, pickled arrays, I/O errors
        raise ValueError(f"cannot read {path!r} as an .npz archive: {e}") from None
    if isinstance(z, np.ndarray):
        raise ValueError(f"{path!r} is a single .npy array, not an .npz archive")
    try:
        with z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # a damaged member
        raise ValueError(f"cannot read {path!r} as an .npz archive: {e}") from None


def load_inputs(
    specs: Sequence[ValueSpec], arrays: Sequence[str] = (), archive: str | os.PathLike | None = None
) -> dict[str, np.ndarray]:
    """A model's inputs by name, read from files: `specs` is ``Model.inputs``.

    ``arrays``: .npy files, each ``"NAME=PATH"``, or just ``"PATH"`` for a model with one input.
    ``archive``: an .npz file of arrays by input name (for a one-input model, one array of any name).
    A file in ``arrays`` replaces the archive's array of the same name. Every input must be given,
    and nothing else: ValueError names what is missing or unknown.
    """
    names = [s.name for s in specs]
    given: dict[str, np.ndarray] = {}
    if archive is not None:
        found = read_archive(archive)
        if len(found) == 1 and len(names) == 1:
            found = {names[0]: next(iter(found.values()))}  # one array: its name does not matter
        given.update(found)
    for item in arrays:
        name, sep, path = item.partition("=")
        if not sep:
            if len(names) != 1:
                raise ValueError(f"the model takes {len(names)} inputs {names}: give each file as NAME=FILE.npy")
            name, path = names[0], item
        given[name] = read_array(path)
    unknown = [k for k in given if k not in names]
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise ValueError(
            f"inputs do not fit the model: it takes {names}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    return given


def time_axes(graph: Graph) -> dict[str, int]:
    """Input name -> its time axis, for inputs that reach a whole-sequence op's x through ops that
    keep their leading dimensions (token ids through an embedding, say)."""
    producer: dict[str, Node] = {o: n for n in graph.nodes for o in n.outputs}
    inputs = {s.name for s in graph.inputs}
    axes = {}
    for node in graph.nodes:
        if node.op not in SEQUENCE_OPS:  # x's time axis is 0, or 1 when batch_first
            continue
        value = node.inputs["x"]
        while value in producer and producer[value].op in _KEEPS_LEADING_DIMS:
            p = producer[value]
            value = p.inputs[_KEEPS_LEADING_DIMS[p.op]]
        if value in inputs:
            axes[value] = 1 if node.attrs["batch_first"] else 0
    return axes


def random_inputs(graph: Graph, batch: int = 1, seq: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's dtypes and shapes, by name: free time dimensions (time_axes) are
    `seq`, other free dimensions `batch`. Floats are standard normal; integers read as row indices
    (by an embedding) lie in the table's range, an embedding bag's offsets from 0 to its indices' count in
    order, other integers in [-128, 255] within the dtype's range."""
    rng = np.random.default_rng(seed)
    axes = time_axes(graph)
    rows = {
        n.inputs["indices"]: graph.values[n.inputs["weight"]].shape[0]
        for n in graph.nodes
        if n.op in _INDEX_OPS and "indices" in n.inputs
    }
    out = {}
    for spec in graph.inputs:
        shape = tuple(
            (seq if axes.get(spec.name) == i else batch) if d is None else d for i, d in enumerate(spec.shape)
        )
        dtype = np.dtype(spec.dtype)
        if math.prod(shape) * dtype.itemsize > MAX_RANDOM_BYTES:  # the file's fixed dimensions say how much
            raise ValueError(f"input {spec.name!r}: random values of shape {list(shape)} would take more than "
                             f"{MAX_RANDOM_BYTES >> 30} GiB; give the inputs from files")
        if dtype.kind == "f":
            a = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            a = rng.integers(0, 2, size=shape).astype(bool)
        elif spec.name in rows:
            a = rng.integers(0, max(rows[spec.name], 1), size=shape, dtype=dtype)
        else:
            info = np.iinfo(dtype)
            a = rng.integers(max(info.min, -128), min(info.max, 255) + 1, size=shape, dtype=dtype)
        out[spec.name] = a
    # a bag's offsets: from 0, never decreasing, within its indices (any integers would be refused)
    for n in graph.nodes:
        offsets, indices = n.inputs.get("offsets"), n.inputs.get("indices")
        if n.op == "embedding_bag" and offsets in out and indices in out:
            o = out[offsets]
            o[...] = np.sort(rng.integers(0, out[indices].size + 1, size=o.shape), axis=None).reshape(o.shape)
            o.reshape(-1)[:1] = 0
    return out

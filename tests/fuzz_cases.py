"""Generators of hostile .qrt files, shared by tests/test_fuzz_loader.py and tools/fuzz_loader.py.

Every case starts from a valid file (one small model per op in the registry,
plus a chain of several ops) and applies one to three mutations: raw byte
edits (flips, truncation in each region, insertions, deletions, a rewritten
header length) or structured edits of the header and graph JSON (shapes,
offsets, dtypes, metadata, cycles, dangling references, duplicate names,
unknown ops and ports, hostile attribute values, scales and zero points,
the packed-matrix map ``qrt.packed``), with the data checksum recomputed half
the time so the edit reaches the checks behind it. The seeds are version 4
files as the writer makes them (weights packed, ``qrt.data_checksum``), plus
version 3 files made by hand (plain weights, ``qrt.data_sha256``, ``v3_*``),
so both checksums and both weight layouts are mutated.

The property (``check_case``): loading the file and running the model on
valid random inputs either works or raises ``qrt.FormatError``; running may
also raise ``ValueError`` for a documented run-time reason (a NaN met by
quantization, a free dimension that disagrees with the weights). Anything
else is a failure.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

import qrt
from qrt.builder import GraphBuilder
from qrt.layout import PackedMatrix, unpack
from qrt.ops import OPS

# ------------------------------------------------------------------ valid models


def _qp(scale: float, zp: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array(scale, np.float32), np.array(zp, np.int32)


def _w8(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return rng.integers(-128, 128, (n, k)).astype(np.int8)


def _op_models() -> dict[str, GraphBuilder]:
    """Small valid models, at least one per op in qrt.ops.OPS (some ops in several variants)."""
    rng = np.random.default_rng(0)
    models: dict[str, GraphBuilder] = {}

    b = GraphBuilder()
    s, z = _qp(0.05, 7)
    b.output(b.node("quantize_per_tensor", {"x": b.input("x", "float32", [None, 5]), "scale": s,
                                            "zero_point": z}, {"dtype": "quint8"}))
    models["quantize_per_tensor"] = b

    b = GraphBuilder()
    b.output(b.node("quantize_per_channel", {
        "x": b.input("x", "float32", [None, 4]),
        "scale": np.array([0.1, 0.02, 0.3, 1.0], np.float32),
        "zero_point": np.array([0, -3, 5, 127], np.int32),
    }, {"dtype": "qint8", "axis": 1}))
    models["quantize_per_channel"] = b

    b = GraphBuilder()
    s, z = _qp(0.1, 128)
    b.output(b.node("dequantize", {"x": b.input("q", "uint8", [None, 3]), "scale": s, "zero_point": z}))
    models["dequantize"] = b

    b = GraphBuilder()
    b.output(b.node("dequantize", {
        "x": b.input("q", "int8", [2, None]),
        "scale": np.array([0.5, 0.25], np.float32),
        "zero_point": np.array([1, -1], np.int32),
    }, {"axis": 0}))
    models["dequantize_per_channel"] = b

    # float64 per-channel scales (format version 2), shared by a quantize and a dequantize
    b = GraphBuilder()
    q = b.node("quantize_per_channel", {
        "x": b.input("x", "float32", [None, 3]),
        "scale": np.array([0.03, 0.2, 1 / 3]),
        "zero_point": np.array([-5, 0, 2**20], np.int32),
    }, {"dtype": "qint32", "axis": 1}, name="q")
    b.output(b.node("dequantize", {"x": q, "scale": "q.scale", "zero_point": "q.zero_point"}, {"axis": 1}))
    models["per_channel_f64"] = b

    b = GraphBuilder()
    xs, xz = _qp(0.02, 120)
    ys, yz = _qp(0.1, 64)
    b.output(b.node("linear", {
        "x": b.input("x", "uint8", [None, 5]), "x_scale": xs, "x_zero_point": xz,
        "weight": _w8(rng, 3, 5), "weight_scale": np.array([0.01, 0.02, 0.03], np.float32),
        "weight_zero_point": np.zeros(3, np.int32), "bias": np.array([0.5, -1, 2], np.float32),
        "y_scale": ys, "y_zero_point": yz,
    }, {"relu": True}))
    models["linear"] = b

    b = GraphBuilder()
    ws, wz = _qp(0.03, 0)
    b.output(b.node("linear_dynamic", {
        "x": b.input("x", "float32", [None, 6]), "weight": _w8(rng, 4, 6),
        "weight_scale": ws, "weight_zero_point": wz, "bias": np.arange(4, dtype=np.float32),
    }, {"reduce_range": True}))
    models["linear_dynamic"] = b

    b = GraphBuilder()
    b.output(b.node("linear_dynamic", {
        "x": b.input("x", "float32", [None, 3]),
        "weight": rng.standard_normal((2, 3)).astype(np.float16),
    }))
    models["linear_dynamic_fp16"] = b

    b = GraphBuilder()
    b.output(b.node("rnn_cell_dynamic", {
        "x": b.input("x", "float32", [None, 4]), "h": b.input("h", "float32", [None, 3]),
        "ih_weight": _w8(rng, 3, 4), "ih_weight_scale": np.array([0.01, 0.02, 0.03], np.float32),
        "ih_weight_zero_point": np.zeros(3, np.int32), "ih_bias": np.ones(3, np.float32),
        "hh_weight": rng.standard_normal((3, 3)).astype(np.float16),
    }, {"nonlinearity": "relu", "reduce_range": False}))
    models["rnn_cell_dynamic"] = b

    b = GraphBuilder()
    b.output(b.node("relu", {"x": b.input("x", "float32", [None, 3])}))
    models["relu"] = b

    b = GraphBuilder()
    b.output(b.node("add", {"a": b.input("a", "float32", [None, 3]), "b": b.input("b", "float32", [None, 3])}))
    models["add"] = b

    b = GraphBuilder()
    b.output(b.node("flatten", {"x": b.input("x", "uint8", [None, 2, 3])}, {"start_dim": 1}))
    models["flatten"] = b

    if "linear_float" in OPS:
        b = GraphBuilder()
        b.output(b.node("linear_float", {
            "x": b.input("x", "float32", [None, 3]),
            "weight": rng.standard_normal((2, 3)).astype(np.float32), "bias": np.ones(2, np.float32),
        }))
        models["linear_float"] = b

    # Recurrent ops, where the registry has them: cells, and whole sequences.
    def dyn(prefix: str, rows: int, cols: int, int8: bool) -> dict:
        if not int8:
            return {f"{prefix}weight": rng.standard_normal((rows, cols)).astype(np.float16)}
        return {f"{prefix}weight": _w8(rng, rows, cols),
                f"{prefix}weight_scale": rng.uniform(0.005, 0.05, rows).astype(np.float32),
                f"{prefix}weight_zero_point": np.zeros(rows, np.int32),
                f"{prefix}bias": rng.standard_normal(rows).astype(np.float32)}

    def flt(prefix: str, rows: int, cols: int, with_bias: bool) -> dict:
        return {f"{prefix}weight": rng.standard_normal((rows, cols)).astype(np.float32)} | (
            {f"{prefix}bias": rng.standard_normal(rows).astype(np.float32)} if with_bias else {})

    recurrent = (("rnn", 1, ("h",)), ("lstm", 4, ("h", "c")), ("gru", 3, ("h",)))
    for family, kind, gates, states in ((f, *r) for f in ("dynamic", "float") for r in recurrent):
        hidden = 3
        # dynamic: int8 and float16 weight sets; float (version 8): float32, with and without bias
        weights = dyn if family == "dynamic" else flt
        family_attrs = {"reduce_range": False} if family == "dynamic" else {}
        if f"{kind}_cell_{family}" in OPS:
            b = GraphBuilder()
            ins = {"x": b.input("x", "float32", [None, 4])}
            ins.update({st: b.input(st, "float32", [None, hidden]) for st in states})
            ins.update(weights("ih_", gates * hidden, 4, True) | weights("hh_", gates * hidden, hidden, kind != "gru"))
            attrs = family_attrs | ({"nonlinearity": "relu"} if kind == "rnn" else {})
            out = b.node(f"{kind}_cell_{family}", ins, attrs)
            b.output(*(out if isinstance(out, tuple) else (out,)))
            models[f"{kind}_cell_{family}"] = b
        if f"{kind}_{family}" in OPS:
            # rnn: one layer; lstm: two layers, bidirectional; gru: batch first with an initial state
            layers, dirs, batch_first = {"rnn": (1, 1, False), "lstm": (2, 2, False), "gru": (1, 1, True)}[kind]
            b = GraphBuilder()
            ins = {"x": b.input("x", "float32", [None, 5, 4] if batch_first else [5, None, 4])}
            if kind == "gru":
                ins["h0"] = b.input("h0", "float32", [layers * dirs, None, hidden])
            n_in = 4
            for n in range(layers):
                for d in range(dirs):
                    prefix = f"l{n}_{'reverse_' if d else ''}"
                    ins.update(weights(prefix + "ih_", gates * hidden, n_in, True))
                    ins.update(weights(prefix + "hh_", gates * hidden, hidden, n % 2 == 0))
                n_in = dirs * hidden
            out = b.node(f"{kind}_{family}", ins, {"num_layers": layers, "bidirectional": dirs == 2,
                                                   "batch_first": batch_first})
            b.output(*out)
            models[f"{kind}_{family}"] = b

    # ---- tensor ops and embeddings (helper A1): int64 inputs, free dims checked at run time,
    # stored int32 indices and offsets (random run-time indices would mostly be out of range).
    b = GraphBuilder()
    x = b.input("x", "int64", [None, 3, 4])
    sel = b.node("select", {"x": x}, {"dim": 1, "index": -1})
    sl = b.node("slice", {"x": x}, {"dim": 2, "start": 1, "end": None, "step": 2})
    cat = b.node("cat", {"x0": sl, "x1": sl}, {"dim": 2})
    st = b.node("stack", {"x0": sel, "x1": sel}, {"dim": 1})
    r = b.node("reshape", {"x": cat}, {"shape": [0, -1]})
    p = b.node("permute", {"x": st}, {"perm": [2, 0, 1]})
    u = b.node("unsqueeze", {"x": p}, {"dim": 3})
    sq = b.node("squeeze", {"x": u}, {"dims": [3]})
    f = b.node("flatten", {"x": x}, {"start_dim": 0, "end_dim": 1})
    b.output(r, sq, f)
    models["tensor_ops"] = b

    b = GraphBuilder()
    idx = b.tensor("idx", np.array([[0, 4], [2, 2], [1, 3]], np.int32))
    b.input("unused", "float32", [1])
    e32 = b.node("embedding", {"indices": idx, "weight": rng.standard_normal((5, 3)).astype(np.float32)})
    e8 = b.node("embedding_bag", {
        "indices": idx, "weight": rng.integers(0, 256, (5, 3), dtype=np.uint8),
        "weight_scale": np.full(5, 0.1, np.float32), "weight_bias": np.full(5, -1.0, np.float32),
    }, {"bits": 8, "mode": "sum"})
    e4 = b.node("embedding_bag", {
        "indices": b.tensor("flat_idx", np.array([0, 4, 2, 2, 1], np.int32)),
        "offsets": b.tensor("offsets", np.array([0, 2, 2], np.int32)),
        "weight": rng.integers(0, 256, (5, 2), dtype=np.uint8),
        "weight_scale": np.full(5, 0.1, np.float16), "weight_bias": np.full(5, -1.0, np.float16),
    }, {"bits": 4, "dim": 3, "mode": "max"})
    b.output(e32, e8, e4)
    models["embedding"] = b

    # ---- float math (helper A2): every function and reduction, broadcasting arithmetic with stored operands.
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3, 4])
    g = b.node("gelu", {"x": b.node("silu", {"x": b.node("tanh", {"x": b.node("sigmoid", {"x": x})})})})
    sm = b.node("softmax", {"x": b.node("gelu", {"x": g}, {"approximate": "tanh"})}, {"dim": 2})
    ls = b.node("log_softmax", {"x": x}, {"dim": 0})
    ln = b.node("layer_norm", {"x": ls, "weight": rng.standard_normal((3, 4)).astype(np.float32),
                               "bias": np.zeros((3, 4), np.float32)}, {"normalized_dims": 2, "eps": 1e-5})
    su = b.node("sum", {"x": ln}, {"dims": [0, 2], "keepdim": True})
    me = b.node("mean", {"x": sm}, {"dims": [1], "keepdim": True})
    m = b.node("mul", {"a": b.node("add", {"a": x, "b": su}), "b": np.array(0.5, np.float32)})
    sb = b.node("sub", {"a": me, "b": rng.standard_normal(4).astype(np.float32)})
    b.output(b.node("div", {"a": m, "b": sb}), su)
    models["float_math"] = b

    # ---- comparisons, masks and casts: an int64 mask, sizes followed at run time, stored int32 indices.
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 5])
    mask = b.input("mask", "int64", [None, 5])
    on = b.node("cast", {"x": mask}, {"dtype": "bool"})
    pos = b.node("ge", {"a": b.node("arange", {"x": mask}, {"dim": 1}), "b": np.array(1, np.int32)})
    both = b.node("logical_and", {"a": on, "b": pos})
    keep = b.node("logical_or", {"a": both, "b": b.node("logical_not", {"x": on})})
    cmp = [b.node(op, {"a": x, "b": np.array(0.5, np.float32)}) for op in ("eq", "ne", "lt", "le", "gt")]
    w = b.node("where", {"condition": keep, "a": x, "b": np.array(0.0, np.float32)})
    r = b.node("rsqrt", {"x": b.node("sqrt", {"x": b.node("clamp", {"x": w}, {"min": 0.25, "max": 4.0})})})
    row = b.node("unsqueeze", {"x": b.node("arange", {"x": x}, {"dim": 1}, name="arange_x")}, {"dim": 0})
    e = b.node("expand", {"x": row, "like": x}, {"shape": [-1, -1], "like_dims": [0, None]})
    table = b.tensor("table", np.arange(12, dtype=np.int32).reshape(2, 6))
    sel = b.node("index_select", {"x": table, "index": b.tensor("sel", np.array([5, 0, 1], np.int32))}, {"dim": 1})
    g = b.node("gather", {"x": sel, "index": b.tensor("gat", np.array([[2, 0]], np.int32))}, {"dim": 1})
    b.output(r, e, g, *cmp)
    models["masks"] = b
    # positions counted over the non-padding tokens, as RoBERTa counts them: integer arithmetic (version 9)
    b = GraphBuilder()
    ids = b.input("ids", "int64", [None, None])
    real = b.node("cast", {"x": b.node("ne", {"a": ids, "b": np.array(1, np.int32)})}, {"dtype": "int32"})
    counts = b.node("cast", {"x": b.node("cumsum", {"x": real}, {"dim": 1})}, {"dtype": "int32"})
    positions = b.node("add_int", {"a": b.node("mul_int", {"a": counts, "b": real}), "b": np.array(1, np.int32)})
    b.output(b.node("sub_int", {"a": positions, "b": ids}))
    models["positions"] = b
    # [S, B, E] as rows [S * B, E], viewed back with both sizes read from the input (reshape's like, version 9)
    b = GraphBuilder()
    like = b.input("like", "float32", [None, None, 4])
    rows = b.node("reshape", {"x": like}, {"shape": [-1, 4]})
    b.output(b.node("reshape", {"x": rows, "like": like}, {"shape": [2, 3, 4], "like_dims": [0, 1, None]}))
    models["reshape_like"] = b
    # max pooling over time (amax, version 10)
    b = GraphBuilder()
    seq = b.input("seq", "float32", [None, None, 5])
    b.output(b.node("amax", {"x": seq}, {"dims": [1]}), b.node("amax", {"x": seq}, {"dims": [0, 2], "keepdim": True}))
    models["max_pooling"] = b
    # batch norm in inference over channels and over positions after them (batch_norm, version 11)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3, None])
    stats = {p: b.tensor(p, np.array([0.5, 2.0, 1e-3], np.float32)) for p in ("mean", "var", "weight", "bias")}
    b.output(b.node("batch_norm", {"x": x, **stats}, {"eps": 1e-5}))
    models["batch_norm"] = b
    # relative position buckets' log, rotary embeddings' sin and cos (version 12)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3])
    b.output(b.node("log", {"x": x}), b.node("sin", {"x": x}), b.node("cos", {"x": x}))
    models["log"] = b
    # DeBERTa's position buckets' ceil, and floor (version 13)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3])
    b.output(b.node("ceil", {"x": x}), b.node("floor", {"x": x}))
    models["rounding"] = b
    # matmul against a stored matrix, attention with a bool mask over its heads
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 2, 3, 4])
    keep = b.input("keep", "bool", [None, 1, 1, 3])
    h = b.node("matmul", {"a": x, "b": rng.standard_normal((4, 4)).astype(np.float32)})
    b.output(b.node("attention", {"q": x, "k": h, "v": h, "mask": keep}, {"scale": 0.5}))
    models["attention"] = b

    # A chain through several ops, a stored tensor on a run-time port, and a tuple output.
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 2, 2])
    f = b.node("flatten", {"x": x}, {"start_dim": 1})
    s, z = _qp(0.03, 100)
    q = b.node("quantize_per_tensor", {"x": f, "scale": s, "zero_point": z}, {"dtype": "quint8"})
    ys, yz = _qp(0.05, 10)
    lin = b.node("linear", {
        "x": q, "x_scale": "quantize_per_tensor_1.scale", "x_zero_point": "quantize_per_tensor_1.zero_point",
        "weight": _w8(rng, 3, 4), "weight_scale": np.array(0.02, np.float32),
        "weight_zero_point": np.array(0, np.int32), "y_scale": ys, "y_zero_point": yz,
    })
    d = b.node("dequantize", {"x": lin, "scale": "linear_2.y_scale", "zero_point": "linear_2.y_zero_point"})
    r = b.node("relu", {"x": d})
    bias = b.tensor("offset", np.array([[1, 2, 3]], np.float32))
    a = b.node("add", {"a": r, "b": bias})
    b.inputs[0]["shape"] = [1, 2, 2]  # a fixed batch, the stored operand's
    b.output(a, d)
    models["chain"] = b

    missing = set(OPS) - {n["op"] for m in models.values() for n in m.nodes}
    assert not missing, f"no fuzz seed model for {sorted(missing)}"
    return models


def _nested_models() -> dict[str, GraphBuilder]:
    """Nested arguments and results (format version 3): forward(x, state=(h, c)) -> (y, ((h', c'),))."""
    b = GraphBuilder()
    x, h, c = (b.input(n, "float32", [None, 3]) for n in ("x", "state.0", "state.1"))
    y = b.node("add", {"a": x, "b": h})
    b.input_nested((x, (h, c)))
    b.output_nested((y, ((b.node("relu", {"x": y}), b.node("add", {"a": h, "b": c})),)))
    return {"nested": b}


_SEEDS: dict[str, bytes] | None = None
# Seeds also written as version 3 files (plain weights, sha256): the older checksum and layout get fuzzed too.
V3_SEEDS = ("linear", "linear_dynamic_fp16", "lstm_cell_dynamic", "per_channel_f64")


def seed_files() -> dict[str, bytes]:
    """The valid starting files, encoded once: name -> bytes."""
    global _SEEDS
    if _SEEDS is None:
        models = {**_op_models(), **_nested_models()}
        _SEEDS = {name: qrt.format.encode(b.graph(), b.tensors) for name, b in models.items()}
        _SEEDS.update({f"v3_{name}": plain_file(_SEEDS[name], 3) for name in V3_SEEDS})
    return _SEEDS


# ------------------------------------------------------------------ file surgery


def split(data: bytes) -> tuple[dict, bytes]:
    """A well-formed file's header (parsed) and data section."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    # Whether json.loads hits RecursionError depends on the stack depth; refusing deep headers
    # here, as the loader does, keeps case generation deterministic.
    if not qrt.format._depth_at_most(header, qrt.format.MAX_JSON_DEPTH):
        raise ValueError("header nested too deeply to edit")
    return header, data[8 + n :]


def checksum_key(meta: dict) -> str:
    """The metadata key of the data checksum: qrt.data_sha256 in versions 1 to 3, qrt.data_checksum from 4
    (a version that is not a number, as hostile edits make it, counts as the newest)."""
    v = meta.get("qrt.version")
    old = isinstance(v, str) and re.fullmatch("[0-9]{1,9}", v) is not None and int(v) < qrt.format.PACKED_SINCE
    return qrt.format.META_SHA256 if old else qrt.format.META_CHECKSUM


def set_checksum(meta: dict, body: bytes) -> None:
    """Write the checksum of body that meta's version calls for: sha256 for versions 1 to 3, xxh64-1m from 4."""
    if checksum_key(meta) == qrt.format.META_SHA256:
        meta[qrt.format.META_SHA256] = hashlib.sha256(body).hexdigest()
    else:
        meta[qrt.format.META_CHECKSUM] = qrt.format.data_checksum(body)


def join(header: Any, body: bytes, fix_checksum: bool = False, raw: str | None = None) -> bytes:
    """Re-encode a header (or raw header text) and a data section; fix_checksum: rewrite the checksum the
    header's version calls for (set_checksum)."""
    if fix_checksum and isinstance(header, dict) and isinstance(header.get("__metadata__"), dict):
        set_checksum(header["__metadata__"], body)
    text = raw if raw is not None else json.dumps(header)
    hb = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(hb)) + hb + body


def stored_arrays(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """A well-formed file's metadata and its tensors as stored (a packed matrix in its packed shape, row sums
    as tensors of their own), in data section order: name -> array (a copy)."""
    header, body = split(data)
    meta = header.pop("__metadata__")
    arrays = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        dt = qrt.format.DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        arrays[name] = np.frombuffer(body[b:end], dt).reshape(e["shape"]).copy()
    return meta, arrays


def build_file(meta: dict, arrays: dict[str, np.ndarray], align: int = qrt.format.HEADER_ALIGN) -> bytes:
    """A file of these tensors, back to back in the given order, the header padded with spaces so that the
    data section starts at a multiple of align, and the checksum that meta's version calls for. No checks:
    this writes what a careless or foreign writer would."""
    entries, chunks, offset = {}, [], 0
    for name, a in arrays.items():
        a = np.asarray(a)
        raw = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False)).tobytes()
        entries[name] = {"dtype": qrt.format.CODES[a.dtype.name], "shape": list(a.shape),
                         "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    body = b"".join(chunks)
    meta = dict(meta)
    set_checksum(meta, body)
    hb = json.dumps({"__metadata__": meta, **entries}, separators=(",", ":")).encode()
    hb += b" " * (-(8 + len(hb)) % align)
    return struct.pack("<Q", len(hb)) + hb + body


def plain_file(data: bytes, version: int) -> bytes:
    """A file's model as a version 1, 2 or 3 writer wrote it: packed matrices unpacked to [n, k], their row
    sums dropped, no qrt.packed or qrt.data_checksum, tensors widest first (ties by name) with no gaps, the
    header padded to a multiple of 8, qrt.data_sha256. A later version: the same, with that version's checksum
    (from version 4 packing is optional)."""
    meta, arrays = stored_arrays(data)
    for name, spec in json.loads(meta.pop(qrt.format.META_PACKED, "{}")).items():
        arrays.pop(spec.get("row_sums"), None)
        arrays[name] = unpack(PackedMatrix(arrays[name], spec["shape"]))
    meta.pop(qrt.format.META_CHECKSUM, None)
    meta[qrt.format.META_VERSION] = str(version)
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    return build_file(meta, {n: arrays[n] for n in order}, align=8)


def get_graph(header: dict) -> dict:
    return json.loads(header["__metadata__"]["qrt.graph"])


def set_graph(header: dict, graph: Any) -> None:
    header["__metadata__"]["qrt.graph"] = json.dumps(graph)


def tensor_names(header: dict) -> list[str]:
    return [k for k in header if k != "__metadata__"]


# Hostile JSON values: wrong types, extremes, deep nesting, long strings.
def hostile_value(rnd: random.Random) -> Any:
    return rnd.choice([
        None, True, False, 0, -1, 1, 7, 2**31, -(2**31) - 1, 2**63, 2**64 + 1, -(2**70), 10**40, 1.5, -0.0,
        1e308, "", "x", "tanh", "quint8", "\u00b9", "a" * rnd.choice([257, 10_000]), [], [1], [None], {},
        {"a": 1}, _nested(rnd.choice([10, 63, 65, 200])),  # deeper: e_json_text, as raw text
    ])


def _nested(depth: int) -> Any:
    v: Any = 0
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


# ------------------------------------------------------------------ byte mutations


def _regions(data: bytes) -> list[tuple[int, int]]:
    (n,) = struct.unpack("<Q", data[:8]) if len(data) >= 8 else (0,)
    n = min(n, max(len(data) - 8, 0))
    return [(0, min(8, len(data))), (8, 8 + n), (8 + n, len(data))]


def _pos(rnd: random.Random, data: bytes) -> int:
    lo, hi = rnd.choice(_regions(data))
    return rnd.randint(lo, max(lo, hi))


def m_flip(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 8)):
        if b:
            i = min(_pos(rnd, data), len(b) - 1)
            b[i] ^= rnd.choice([1 << rnd.randrange(8), rnd.randrange(1, 256)])
    return bytes(b)


def m_truncate(rnd: random.Random, data: bytes) -> bytes:
    return data[: _pos(rnd, data)]


def m_insert(rnd: random.Random, data: bytes) -> bytes:
    i = _pos(rnd, data)
    junk = rnd.choice([b"\x00", b"\xff" * 3, b'"', b"{", b"]", b"\\u0000", rnd.randbytes(rnd.randint(1, 64))])
    return data[:i] + junk + data[i:]


def m_delete(rnd: random.Random, data: bytes) -> bytes:
    i = _pos(rnd, data)
    return data[:i] + data[i + rnd.randint(1, 32) :]


def m_header_len(rnd: random.Random, data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8]) if len(data) >= 8 else (0,)
    new = rnd.choice([0, 1, n - 1, n + 1, n + 8, len(data), 100_000_001, 2**32, 2**63, 2**64 - 1])
    return struct.pack("<Q", new % 2**64) + data[8:]


def m_nonutf8(rnd: random.Random, data: bytes) -> bytes:
    lo, hi = _regions(data)[1]
    if hi <= lo:
        return data
    i = rnd.randrange(lo, hi)
    return data[:i] + rnd.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + data[i + 1 :]


# ------------------------------------------------------------------ structured header edits
# Each takes (rnd, header, body) on a parsed copy and returns the new body (or None for unchanged).


def e_shape(rnd, header, body):
    t = header[rnd.choice(tensor_names(header))]
    t["shape"] = rnd.choice([
        [-1], [2**60], [2**63], [2**64], [0, 2**63], [0, 2**40, 2**40], [True], [1.0], [None], "3", {},
        [1] * 9, [1] * 1000, t["shape"] + [1], t["shape"][:-1], [0], [], [hostile_value(rnd)],
    ])


def e_dtype(rnd, header, body):
    t = header[rnd.choice(tensor_names(header))]
    t["dtype"] = rnd.choice(["I8", "U8", "I32", "F16", "F32", "F64", "BF16", "I64", "BOOL", "i8", "", 8, None])


def e_offsets(rnd, header, body):
    names = tensor_names(header)
    t = header[rnd.choice(names)]
    b, e = t["data_offsets"]
    other = header[rnd.choice(names)]["data_offsets"]
    size = len(body)
    t["data_offsets"] = rnd.choice([
        [b, e + 1], [b + 1, e], [b - 1, e - 1], [e, b], [size, size + (e - b)], [b, 2**64], [-1, e - b - 1],
        [0, e - b], list(other), [other[0] + 1, other[0] + 1 + (e - b)], [b], [b, e, e], [str(b), e],
        [b, float(e)], [True, e], None,
    ])


def e_entry(rnd, header, body):
    names = tensor_names(header)
    name = rnd.choice(names)
    choice = rnd.randrange(6)
    if choice == 0:
        del header[name]
    elif choice == 1:
        header[name] = hostile_value(rnd)
    elif choice == 2:
        header[name]["extra"] = 1
    elif choice == 3:
        del header[name][rnd.choice(["dtype", "shape", "data_offsets"])]
    elif choice == 4:
        header["x" * rnd.choice([0, 257, 100_000])] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
    else:
        header[rnd.choice(["stray", name + "_copy"])] = dict(header[name])


def e_metadata(rnd, header, body):
    meta = header["__metadata__"]
    choice = rnd.randrange(8)
    if choice == 0:
        del meta[rnd.choice(list(meta))]
    elif choice == 1:
        # "1": a version-1 reader's view (F64 tensors must then be refused); "2": trees must then be
        # refused; "4": newer than this qrt
        meta["qrt.version"] = rnd.choice(
            ["0", "1", "2", "3", "4", "999999999999", "1.0", " 1", "one", "\u00b9", "\u0661", "-1"]
        )
    elif choice == 2:
        # the checksum of the file's version (either name), or the other version's in its place
        key = rnd.choice([k for k in ("qrt.data_checksum", "qrt.data_sha256") if k in meta] or ["qrt.data_checksum"])
        old = str(meta.get(key, ""))
        meta[key] = rnd.choice([
            "", "0" * 64, "zz", old.upper(), old[:-1], old + "0", "xxh64-1m:" + "0" * 16, "xxh64:" + old[-16:],
            "XXH64-1M:" + old[-16:], "xxh64-1m:" + old[-15:], "xxh3-1m:" + old[-16:], hashlib.sha256(body).hexdigest(),
        ])
        if rnd.random() < 0.3:  # the other version's key instead
            other = "qrt.data_sha256" if key == "qrt.data_checksum" else "qrt.data_checksum"
            meta[other] = meta.pop(key)
    elif choice == 3:
        meta[rnd.choice(list(meta))] = hostile_value(rnd)
    elif choice == 4:
        header["__metadata__"] = hostile_value(rnd)
    elif choice == 5:
        del header["__metadata__"]
    elif choice == 6:
        meta["qrt.graph"] = rnd.choice(["", "{", "[]", "null", "NaN", '{"inputs": []}', meta["qrt.graph"][:-1]])
    else:
        meta["extra." + str(rnd.randrange(9))] = "a" * rnd.choice([0, 10, 100_000])


def _graph_edit(fn: Callable) -> Callable:
    def edit(rnd, header, body):
        g = get_graph(header)
        fn(rnd, g, header)
        set_graph(header, g)

    edit.__name__ = fn.__name__
    return edit


def _node(rnd, g):
    return rnd.choice(g["nodes"])


def _all_values(g, header):
    vals = [i["name"] for i in g["inputs"]] + tensor_names(header)
    for n in g["nodes"]:
        vals += n["outputs"]
    return vals


@_graph_edit
def g_cycle(rnd, g, header):
    n = _node(rnd, g)
    later = g["nodes"][g["nodes"].index(n):]
    port = rnd.choice(list(n["inputs"]))
    n["inputs"][port] = rnd.choice(rnd.choice(later)["outputs"])  # itself or a later node: a cycle if chained


@_graph_edit
def g_undefined(rnd, g, header):
    where = rnd.randrange(3)
    if where == 0:
        n = _node(rnd, g)
        n["inputs"][rnd.choice(list(n["inputs"]))] = rnd.choice(["nowhere", "", "x" * 300, None, 3])
    elif where == 1:
        g["outputs"] = rnd.choice([["nowhere"], [], "y", [None], g["outputs"] * 2])
    else:
        g["output_structure"] = hostile_value(rnd) if rnd.random() < 0.5 else rnd.choice(["single", "tuple"])


@_graph_edit
def g_duplicate(rnd, g, header):
    vals = _all_values(g, header)
    choice = rnd.randrange(4)
    if choice == 0:
        g["nodes"].append(dict(_node(rnd, g)))  # same node name and outputs twice
    elif choice == 1:
        n = _node(rnd, g)
        n["outputs"] = [rnd.choice(vals)]
    elif choice == 2 and g["inputs"]:
        g["inputs"].append(dict(rnd.choice(g["inputs"])))
    else:
        new = dict(_node(rnd, g))
        new["outputs"] = ["fresh"]
        g["nodes"].append(new)  # duplicate node name, distinct outputs


@_graph_edit
def g_op(rnd, g, header):
    n = _node(rnd, g)
    n["op"] = rnd.choice([*OPS, "conv2d", "", "Linear", 3, None, "linear "])


@_graph_edit
def g_ports(rnd, g, header):
    n = _node(rnd, g)
    choice = rnd.randrange(4)
    if choice == 0 and n["inputs"]:
        del n["inputs"][rnd.choice(list(n["inputs"]))]
    elif choice == 1:
        n["inputs"]["bogus"] = rnd.choice(_all_values(g, header))
    elif choice == 2:
        # rewire a port to another value: dtype and shape mismatches, const ports fed at run time
        n["inputs"][rnd.choice(list(n["inputs"]) or ["x"])] = rnd.choice(_all_values(g, header))
    else:
        n["inputs"] = hostile_value(rnd)


@_graph_edit
def g_attrs(rnd, g, header):
    n = _node(rnd, g)
    attrs = n.setdefault("attrs", {})
    spec = OPS.get(n["op"])
    names = [a.name for a in spec.attrs] if spec else []
    name = rnd.choice([*names, "bogus"]) if names else "bogus"
    attrs[name] = rnd.choice([hostile_value(rnd), -1, 2, 3, 8, -(2**63), "qint32", "quint8", "qint8", "relu", None])
    if rnd.random() < 0.1:
        n["attrs"] = hostile_value(rnd)


@_graph_edit
def g_structure(rnd, g, header):
    choice = rnd.randrange(6)
    if choice == 0:
        del g[rnd.choice(list(g))]
    elif choice == 1:
        g["extra"] = 1
    elif choice == 2:
        g[rnd.choice(list(g))] = hostile_value(rnd)
    elif choice == 3 and g["inputs"]:
        i = rnd.choice(g["inputs"])
        i[rnd.choice(["name", "dtype", "shape", "extra"])] = rnd.choice(
            [hostile_value(rnd), "float64", [None] * 9, [-1], [2**63], [2**40, None], [None, None], []])
    elif choice == 4:
        n = _node(rnd, g)
        n[rnd.choice(["name", "op", "inputs", "outputs", "attrs", "extra"])] = hostile_value(rnd)
    else:
        rnd.shuffle(g["nodes"])  # file order is not execution order: still valid


@_graph_edit
def g_trees(rnd, g, header):
    """input_structure / output_structure: a valid regrouping, or a malformed tree."""
    key = rnd.choice(["input_structure", "output_structure"])
    leaves = list(range(len(g["inputs"] if key == "input_structure" else g["outputs"])))
    rnd.shuffle(leaves)
    choice = rnd.randrange(6)
    if choice == 1 and leaves:
        leaves.append(rnd.choice(leaves))  # an index twice
    elif choice == 2 and leaves:
        leaves.pop()  # an index missing
    elif choice == 3:
        leaves.append(rnd.choice([len(leaves), -1, 2**64, 1.0, True, None, "x", {}, []]))
    tree: Any = leaves
    while len(tree) > 1 and rnd.random() < 0.6:  # group a random run into a tuple, and again
        i = rnd.randrange(len(tree))
        j = rnd.randint(i + 1, len(tree))
        tree = tree[:i] + [tree[i:j]] + tree[j:]
    if choice == 4:
        for _ in range(rnd.choice([15, 16, 17, 70])):
            tree = [tree]
    g[key] = hostile_value(rnd) if choice == 5 else tree


def e_packed(rnd, header, body):
    """qrt.packed: entries naming absent, plain, unpackable or other packed tensors; wrong keys, shapes and
    row sums; a packed matrix declared plain (its stored 4-D or 3-D shape then reaches the op) or a plain
    one declared packed; malformed JSON."""
    meta = header["__metadata__"]
    packed = json.loads(meta["qrt.packed"]) if isinstance(meta.get("qrt.packed"), str) else {}
    if not isinstance(packed, dict):
        packed = {}
    names = tensor_names(header)
    sums = [s.get("row_sums") for s in packed.values() if isinstance(s, dict)]
    choice = rnd.randrange(10)
    if choice == 0 or not packed:  # a tensor not packed (or absent) declared packed
        name = rnd.choice(names) if names and rnd.random() < 0.8 else rnd.choice(["nowhere", ""])
        entry = header.get(name)
        shape = entry.get("shape") if isinstance(entry, dict) else None
        spec: Any = {"shape": (shape if isinstance(shape, list) and len(shape) == 2 else [1, 1])}
        if rnd.random() < 0.5:
            spec["row_sums"] = rnd.choice([*names, *filter(None, sums), "nowhere"]) if names else "nowhere"
        packed[name] = spec
    elif choice == 1:
        del packed[rnd.choice(list(packed))]  # a packed matrix read as plain
    else:
        name = rnd.choice(list(packed))
        spec = packed[name]
        if not isinstance(spec, dict):
            spec = packed[name] = {}
        if choice == 2:
            shape = spec.get("shape")
            n, k = shape if isinstance(shape, list) and len(shape) == 2 else (1, 1)
            spec["shape"] = rnd.choice([
                [k, n], [n + 1, k], [n, k + 1], [n - 1, k], [n, k - 1], [n + 64, k], [n, k + 4], [0, k], [n, 0],
                [-1, k], [n], [n, k, 1], [True, k], [float(n), k], "4x6", None, [2**62, 2**62], [hostile_value(rnd), k],
            ])
        elif choice == 3:
            spec["row_sums"] = rnd.choice([*names, *filter(None, sums), name, "nowhere", None, 3, hostile_value(rnd)])
        elif choice == 4:
            spec.pop(rnd.choice(list(spec) or ["shape"]), None)
        elif choice == 5:
            spec[rnd.choice(["extra", "dtype", "layout"])] = hostile_value(rnd)
        elif choice == 6:
            packed[name] = hostile_value(rnd)
        elif choice == 7 and len(packed) > 1:  # two matrices share one row-sums tensor
            other = rnd.choice([n for n in packed if n != name])
            if isinstance(packed[other], dict):
                spec["row_sums"] = packed[other].get("row_sums")
        elif choice == 8:
            packed[rnd.choice(["nowhere", name + "_copy"])] = dict(spec)
        else:
            meta["qrt.packed"] = rnd.choice(
                ["", "{", "[]", "null", "NaN", "1", '{"a": 1, "a": 2}', json.dumps(hostile_value(rnd))]
            )
            return
    meta["qrt.packed"] = json.dumps(packed)


def _patch_tensor(header, body, name, values: np.ndarray) -> bytes:
    t = header[name]
    b, e = t["data_offsets"]
    if not 0 <= b <= e <= len(body):  # an earlier edit made the offsets hostile: nothing to patch
        return body
    with np.errstate(over="ignore"):  # a hostile float64 scale becomes inf in an F32 tensor, as intended
        raw = values.astype(np.dtype(qrt.format.DTYPES[t["dtype"]]), copy=False).tobytes()
    return body[:b] + raw[: e - b].ljust(e - b, b"\0") + body[e:]


def e_values(rnd, header, body):
    """Rewrite a stored tensor's values: hostile scales, zero points, weights."""
    names = tensor_names(header)
    scales = [n for n in names if header[n]["dtype"] in ("F32", "F64") and "scale" in n]
    zps = [n for n in names if header[n]["dtype"] == "I32" and "zero_point" in n]
    pick = rnd.random()
    if scales and pick < 0.45:
        name = rnd.choice(scales)
        # 1e-50 and 1e300 reach an F64 tensor as they are: float64 values whose float32 rounding is 0 or inf
        bad = rnd.choice([0.0, -0.0, -1.0, np.nan, np.inf, -np.inf, 1e-45, 1e-38, 3.4e38, 1e-30, 1e-50, 1e300])
        size = _size(header[name])
        vals = np.full(size, 0.1)
        if size:
            vals[rnd.randrange(size)] = bad
        return _patch_tensor(header, body, name, vals)
    if zps and pick < 0.9:
        name = rnd.choice(zps)
        bad = rnd.choice([-129, -128, -1, 0, 127, 128, 255, 256, -(2**31), 2**31 - 1])
        return _patch_tensor(header, body, name, np.full(_size(header[name]), bad, np.int64).astype(np.int32))
    name = rnd.choice(names)
    b, e = header[name]["data_offsets"]
    return body[:b] + rnd.randbytes(min(max(e - b, 0), len(body))) + body[e:]


def _size(entry: dict) -> int:
    """Elements to write, from the bytes the entry spans (its shape may already be hostile)."""
    b, e = entry["data_offsets"]
    return max(0, min(e - b, 1 << 20)) // qrt.format.DTYPES[entry["dtype"]].itemsize


def e_json_text(rnd, header, body):
    """Edits only expressible in raw JSON text: duplicate keys, NaN literals, deep nesting."""
    text = json.dumps(header)
    choice = rnd.randrange(5)
    if choice == 0:
        text = text.replace("{", '{"__metadata__": {}, ', 1)  # duplicate key at the top level
    elif choice == 1:
        text = text.replace('"shape": [', '"shape": [NaN, ', 1)
    elif choice == 2:
        d = rnd.choice([64, 65, 1000, 100_000])
        text = text[:-1] + ', "deep": ' + "[" * d + "]" * d + "}"
    elif choice == 3:
        meta = header["__metadata__"]
        g = meta["qrt.graph"]
        meta["qrt.graph"] = g[:-1] + ', "inputs": []}'  # duplicate key inside the graph
        text = json.dumps(header)
    else:
        text = text[:-1] + ', "' + "\\ud800" * 3 + '": 1}'  # lone surrogates in a key
    return text


BYTE_MUTATIONS = [m_flip, m_truncate, m_insert, m_delete, m_header_len, m_nonutf8]
HEADER_EDITS = [
    e_shape, e_dtype, e_offsets, e_entry, e_metadata, e_values, e_packed,
    g_cycle, g_undefined, g_duplicate, g_op, g_ports, g_attrs, g_structure, g_trees,
]


def make_case(rnd: random.Random) -> tuple[str, bytes]:
    """One hostile file: (description, bytes)."""
    seed_name = rnd.choice(sorted(seed_files()))
    data = seed_files()[seed_name]
    steps = [seed_name]
    for _ in range(rnd.choice([1, 1, 1, 2, 3])):
        if rnd.random() < 0.3:
            m = rnd.choice(BYTE_MUTATIONS)
            data = m(rnd, data)
            steps.append(m.__name__)
            continue
        try:
            header, body = split(data)
            if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
                raise ValueError
            get_graph(header)
        except (ValueError, KeyError, TypeError, RecursionError, struct.error, UnicodeDecodeError):
            data = m_flip(rnd, data)  # an earlier step broke the JSON: keep mutating bytes
            steps.append("m_flip")
            continue
        fix = rnd.random() < 0.6
        if rnd.random() < 0.07:
            raw = e_json_text(rnd, header, body)
            data = join(None, body, raw=raw)
            steps.append("e_json_text")
            continue
        edit = rnd.choice(HEADER_EDITS)
        try:
            new_body = edit(rnd, header, body)
        except Exception:  # noqa: BLE001 - an earlier edit broke what this one needs: the generator skips it
            steps.append(edit.__name__ + "(skipped)")
            continue
        body = new_body if new_body is not None else body
        data = join(header, body, fix_checksum=fix)
        steps.append(edit.__name__ + ("+sum" if fix else ""))
    return "/".join(steps), data


# ------------------------------------------------------------------ the property

# ValueError reasons a model that loaded may give at run time (docs/FORMAT.md, "Run time").
# "x has 3 features, expected 4": a recurrent cell's free input dimension disagreeing with its weights.
# "index must lie in [0, 3), got values in [0, 4]": a gather or index_select index outside x (section 6).
RUNTIME_REASONS = re.compile(
    r"NaN|shape|batch|reshape|mismatch|out of range|must lie in|offsets|features, expected|broadcast"
)
MAX_RUN_ELEMENTS = 1_000_000  # a valid file may declare big inputs; the harness does not feed those


def random_inputs(model: qrt.Model, rnd: random.Random) -> list[np.ndarray] | None:
    """Valid random inputs for a loaded model (None when they would be too big to make)."""
    free = rnd.choice([0, 1, 1, 2, 3])  # one size for every free dimension, so batches agree
    rng = np.random.default_rng(rnd.randrange(2**32))
    arrays = []
    for spec in model.inputs:
        shape = tuple(free if d is None else d for d in spec.shape)
        if int(np.prod(shape, dtype=object)) > MAX_RUN_ELEMENTS:
            return None
        dt = np.dtype(spec.dtype)
        if dt.kind == "f":
            a = np.asarray(rng.standard_normal(shape) * rnd.choice([1e-5, 1.0, 100.0]), dt)  # 0-d too
        elif dt.kind == "b":
            a = np.asarray(rng.integers(0, 2, shape).astype(bool))
        else:
            info = np.iinfo(dt)
            a = np.asarray(rng.integers(info.min, int(info.max) + 1, shape, dtype=dt))
        arrays.append(a)
    return arrays


def check_case(data: bytes, path: str, rnd: random.Random) -> str:
    """Load and run one file; return the outcome, or raise AssertionError on a property violation."""
    with open(path, "wb") as f:
        f.write(data)
    try:
        # numpy may warn while preparing extreme but valid scales (1e-45 * 1e-45 underflows); not a failure
        with np.errstate(all="ignore"):
            model = qrt.load(path)
    except qrt.FormatError as e:
        assert str(e), "FormatError without a message"
        return "rejected"
    except Exception as e:  # noqa: BLE001 - the property is about exactly this
        raise AssertionError(f"load raised {type(e).__name__}: {e}") from e
    inputs = random_inputs(model, rnd)
    if inputs is None:
        return "loaded (inputs too big to run)"
    try:
        with np.errstate(all="ignore"):
            out = model.run(inputs)
    except ValueError as e:
        if type(e) is ValueError and RUNTIME_REASONS.search(str(e)):
            return "loaded, run refused input"
        raise AssertionError(f"run raised {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"run raised {type(e).__name__}: {e}") from e
    outs = _leaves(out)
    assert len(outs) == len(model.outputs)
    return "loaded and ran"


def _leaves(out: Any) -> list:
    """The arrays of a (nested) result."""
    return [a for o in out for a in _leaves(o)] if isinstance(out, tuple) else [out]

"""Format version 4: weights stored packed (qrt.packed, row sums), the xxh64-1m checksum, the 64-byte data
section. One hand-made file per way these can be wrong, each refused with a FormatError naming the problem,
and what the writer must produce: the packed layout element by element, bit-identical outputs with a
version 3 file of the same model.

tests/test_format.py keeps the container's other checks (it runs them on version 4 files, and on version
1 to 3 files where those differ); the surgery helpers are in tests/fuzz_cases.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from fuzz_cases import (
    build_file,
    get_graph,
    join,
    plain_file,
    seed_files,
    set_graph,
    split,
    stored_arrays,
)

import qrt
from qrt import _kernels as K
from qrt import format as qformat
from qrt.builder import GraphBuilder
from qrt.layout import PackedMatrix, pack, packed_shape
from qrt.ops import OPS

BLOCK = 1 << 20  # the checksum's block size



def write(tmp_path: Path, data: bytes, name: str = "m.qrt") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def rejects(tmp_path: Path, data: bytes, match: str, mismatch: bool = False) -> None:
    """data is refused with a FormatError matching match, with verify=False too unless the problem is a
    checksum mismatch (the one check verify=False skips: such a file then loads)."""
    p = write(tmp_path, data)
    with pytest.raises(qrt.FormatError, match=match):
        qformat.load_file(p)
    with pytest.raises(qrt.FormatError, match=match):
        qrt.load(p)
    if mismatch:
        qformat.load_file(p, verify=False)
    else:
        with pytest.raises(qrt.FormatError, match=match):
            qformat.load_file(p, verify=False)


def edited(seed: str | bytes, fn, fix_checksum: bool = True) -> bytes:
    """Edit a file's parsed header in place (fn may return a new data section); the checksum rewritten."""
    header, body = split(seed_files()[seed] if isinstance(seed, str) else seed)
    new_body = fn(header)
    return join(header, new_body if isinstance(new_body, bytes) else body, fix_checksum=fix_checksum)


def packed_edited(seed: str, fn) -> bytes:
    """Edit a seed's qrt.packed map (parsed; {} where the seed has none) in place."""
    def edit(h):
        packed = json.loads(h["__metadata__"].get("qrt.packed", "{}"))
        fn(packed)
        h["__metadata__"]["qrt.packed"] = json.dumps(packed)

    return edited(seed, edit)


def packed_meta(seed: str) -> dict:
    return json.loads(split(seed_files()[seed])[0]["__metadata__"]["qrt.packed"])


def outputs(result) -> list[np.ndarray]:
    return [a for r in result for a in outputs(r)] if isinstance(result, tuple) else [result]


def assert_bit_identical(got, want) -> None:
    got, want = outputs(got), outputs(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


W8 = "linear_dynamic_0.weight"  # int8 [4, 6] in the seed "linear_dynamic", stored [4, 2, 16, 4], row sums [4]
SUMS = "linear_dynamic_0.weight.row_sums"


# ------------------------------------------------------------------ qrt.packed


@pytest.mark.parametrize("text,match", [
    ("{", "qrt.packed: malformed JSON"),
    ("", "qrt.packed: malformed JSON"),
    ('{"a": {}, "a": {}}', "qrt.packed: duplicate JSON key 'a'"),
    ('{"a": NaN}', "qrt.packed: non-standard JSON constant NaN"),
    ("[" * 65 + "]" * 65, "qrt.packed: JSON nested deeper than 64 levels"),
])
def test_packed_not_json(tmp_path, text, match):
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["__metadata__"].update({"qrt.packed": text})), match)


@pytest.mark.parametrize("text,got", [("[]", "list"), ("null", "NoneType"), ('"w"', "str"), ("3", "int")])
def test_packed_not_an_object(tmp_path, text, got):
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["__metadata__"].update({"qrt.packed": text})),
            f"qrt.packed: must be a JSON object, got {got}")


def test_packed_names_a_tensor_not_in_the_header(tmp_path):
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p.update({"nowhere": {"shape": [1, 1]}})),
            "qrt.packed: tensor 'nowhere' is not in the header")
    # a graph value that is not a stored tensor is not in the header either
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p.update({"x": {"shape": [1, 1]}})),
            "qrt.packed: tensor 'x' is not in the header")


@pytest.mark.parametrize("seed,name,dtype", [
    ("linear_dynamic", "linear_dynamic_0.weight_zero_point", "int32"),
    ("embedding", "embedding_bag_1.weight", "uint8"),
    ("per_channel_f64", "q.scale", "float64"),
])
def test_packed_dtype_that_cannot_be_packed(tmp_path, seed, name, dtype):
    shape = split(seed_files()[seed])[0][name]["shape"]
    spec = {"shape": (shape + [1, 1])[:2]}
    rejects(tmp_path, packed_edited(seed, lambda p: p.update({name: spec})),
            f"qrt.packed: tensor '{name}': only int8, float16 and float32 matrices are packed, this one is {dtype}")


@pytest.mark.parametrize("seed,name,spec,keys", [
    ("linear_dynamic", W8, {"shape": [4, 6]}, r"\['row_sums', 'shape'\]"),  # int8 without row sums
    ("linear_dynamic", W8, {"row_sums": SUMS}, r"\['row_sums', 'shape'\]"),
    ("linear_dynamic", W8, {"shape": [4, 6], "row_sums": SUMS, "dtype": "I8"}, r"\['row_sums', 'shape'\]"),
    ("linear_dynamic", W8, [4, 6], r"\['row_sums', 'shape'\]"),
    ("linear_dynamic", W8, None, r"\['row_sums', 'shape'\]"),
    ("linear_dynamic_fp16", W8, {"shape": [2, 3], "row_sums": SUMS}, r"\['shape'\]"),  # float with row sums
    ("linear_dynamic_fp16", W8, {"shape": [2, 3], "layout": "strips"}, r"\['shape'\]"),
    ("linear_dynamic_fp16", W8, {}, r"\['shape'\]"),
    ("linear_float", "linear_float_0.weight", {"shape": [2, 3], "row_sums": None}, r"\['shape'\]"),
])
def test_packed_entry_keys(tmp_path, seed, name, spec, keys):
    rejects(tmp_path, packed_edited(seed, lambda p: p.update({name: spec})),
            f"qrt.packed: tensor '{name}': entry must have exactly {keys}")


@pytest.mark.parametrize("shape", [[4], [4, 6, 1], [], [-4, 6], [4, -1], [4.0, 6], [True, 6], [4, None], "4x6",
                                   None, {"n": 4, "k": 6}, ["4", 6]])
def test_packed_shape_not_two_non_negative_integers(tmp_path, shape):
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p[W8].update({"shape": shape})),
            rf"qrt.packed: tensor '{W8}': shape must be two non-negative integers \[n, k\]")


@pytest.mark.parametrize("seed,name,shape,match", [
    ("linear_dynamic", W8, [4, 9], r"\[4, 9\] int8 matrix is stored as \[4, 3, 16, 4\], the header says "
                                   r"\[4, 2, 16, 4\]"),
    ("linear_dynamic", W8, [65, 6], r"\[65, 6\] int8 matrix is stored as \[8, 2, 16, 4\]"),
    ("linear_dynamic", W8, [6, 4], r"\[6, 4\] int8 matrix is stored as \[4, 1, 16, 4\]"),
    ("linear_dynamic", W8, [0, 0], r"\[0, 0\] int8 matrix is stored as \[0, 0, 16, 4\]"),
    ("linear_dynamic", W8, [2**62, 2**62], r"\[4611686018427387904, 4611686018427387904\] int8 matrix is stored as "
                                           r"\[288230376151711744, 1152921504606846976, 16, 4\]"),
    ("linear_dynamic_fp16", W8, [2, 4], r"\[2, 4\] float16 matrix is stored as \[2, 4, 16\], the header says "
                                        r"\[2, 3, 16\]"),
    ("linear_dynamic_fp16", W8, [33, 3], r"\[33, 3\] float16 matrix is stored as \[4, 3, 16\]"),
    ("linear_float", "linear_float_0.weight", [3, 2], r"\[3, 2\] float32 matrix is stored as \[2, 2, 16\]"),
])
def test_packed_shape_disagrees_with_the_stored_shape(tmp_path, seed, name, shape, match):
    rejects(tmp_path, packed_edited(seed, lambda p: p[name].update({"shape": shape})),
            f"qrt.packed: tensor '{name}': a packed " + match)


def test_packed_shape_within_the_padding_is_checked_by_the_graph(tmp_path):
    """[3, 5] and [4, 6] have the same stored shape, as [1, 3] and [2, 3] of float: the row sums' length and
    the op's shapes tell them apart."""
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p[W8].update({"shape": [3, 5]})),
            rf"row_sums '{SUMS}' must be int32 \[3\], got int32 \[4\]")
    rejects(tmp_path, packed_edited("linear_float", lambda p: p["linear_float_0.weight"].update({"shape": [1, 3]})),
            r"node 'linear_float_0' \(linear_float\): bias must have shape \[1\]")


@pytest.mark.parametrize("row_sums,match", [
    ("nowhere", "row_sums must name an unpacked tensor of the header, got 'nowhere'"),
    (W8, f"row_sums must name an unpacked tensor of the header, got '{W8}'"),  # a packed tensor: itself
    (3, "row_sums must name an unpacked tensor of the header, got 3"),
    (["a"], r"row_sums must name an unpacked tensor of the header, got \['a'\]"),
    ("linear_dynamic_0.bias", r"row_sums 'linear_dynamic_0.bias' must be int32 \[4\], got float32 \[4\]"),
    ("linear_dynamic_0.weight_zero_point",
     r"row_sums 'linear_dynamic_0.weight_zero_point' must be int32 \[4\], got int32 \[\]"),
])
def test_row_sums_wrong(tmp_path, row_sums, match):
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p[W8].update({"row_sums": row_sums})),
            f"qrt.packed: tensor '{W8}': " + match)


def test_row_sums_null(tmp_path):
    rejects(tmp_path, packed_edited("linear_dynamic", lambda p: p[W8].update({"row_sums": None})),
            f"qrt.packed: tensor '{W8}': row_sums must name an unpacked tensor of the header, got None")


def test_row_sums_naming_another_packed_matrix(tmp_path):
    ih, hh = "lstm_cell_dynamic_0.ih_weight", "lstm_cell_dynamic_0.hh_weight"
    rejects(tmp_path, packed_edited("lstm_cell_dynamic", lambda p: p[ih].update({"row_sums": hh})),
            f"qrt.packed: tensor '{ih}': row_sums must name an unpacked tensor of the header, got '{hh}'")


def test_row_sums_shared_by_two_matrices(tmp_path):
    ih, hh = "lstm_cell_dynamic_0.ih_weight", "lstm_cell_dynamic_0.hh_weight"  # both int8 [12, *]
    rejects(tmp_path, packed_edited("lstm_cell_dynamic", lambda p: p[ih].update({"row_sums": p[hh]["row_sums"]})),
            rf"row_sums '{hh}.row_sums' already holds the sums of '(lstm_cell_dynamic_0.(ih|hh)_weight)'")


def test_row_sums_are_not_graph_values(tmp_path):
    """The row sums belong to their matrix: a graph may not read that tensor."""
    def edit(h):
        packed = json.loads(h["__metadata__"]["qrt.packed"])
        packed["linear_0.weight"]["row_sums"] = "linear_0.weight_zero_point"  # int32 [3], read by the graph
        h["__metadata__"]["qrt.packed"] = json.dumps(packed)

    rejects(tmp_path, edited("linear", edit),
            "input 'weight_zero_point' refers to the row sums of packed tensor 'linear_0.weight', which only the "
            "kernels read")
    f = qformat.load_file(write(tmp_path, seed_files()["linear"]))
    assert "linear_0.weight.row_sums" not in f.tensors
    np.testing.assert_array_equal(f.tensors["linear_0.weight"].row_sums,
                                  np.asarray(f.tensors["linear_0.weight"]).sum(axis=1, dtype=np.int32))


def test_row_sums_names_are_not_the_graphs_to_take(tmp_path):
    """A graph output naming the row sums, or a graph input or node output taking their name, is refused."""
    sums = "linear_0.weight.row_sums"

    def output_named(h):
        g = get_graph(h)
        g["outputs"] = [sums]
        set_graph(h, g)

    def input_named(h):
        g = get_graph(h)
        g["inputs"][0]["name"] = sums  # refused as it is defined, before any node is looked at
        set_graph(h, g)

    def node_output_named(h):
        g = get_graph(h)
        g["nodes"][-1]["outputs"] = [sums]
        g["outputs"] = [sums]
        set_graph(h, g)

    rejects(tmp_path, edited("linear", output_named), f"outputs: '{sums}' is the row sums of packed tensor")
    rejects(tmp_path, edited("linear", input_named), f"value '{sums}' is already defined as the row sums")
    rejects(tmp_path, edited("linear", node_output_named), f"value '{sums}' is already defined as the row sums")


@pytest.mark.parametrize("version", ["1", "2", "3"])
def test_packed_in_a_version_1_to_3_file(tmp_path, version):
    # the version 4 seed relabelled (its checksum then a sha256), and a version 3 file given a qrt.packed
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["__metadata__"].update({"qrt.version": version})),
            f"header: qrt.packed needs format version 4, the file says {version}")
    rejects(tmp_path, edited(plain_file(seed_files()["linear_dynamic"], int(version)),
                             lambda h: h["__metadata__"].update({"qrt.packed": "{}"})),
            f"header: qrt.packed needs format version 4, the file says {version}")


def test_packed_weight_read_as_plain(tmp_path):
    """Dropping qrt.packed leaves the packed bytes as a plain tensor of the packed shape: the op refuses it."""
    rejects(tmp_path, edited("linear_dynamic_fp16", lambda h: h["__metadata__"].pop("qrt.packed")),
            r"weight must be 2-D \[out, in\], got float16\[2, 3, 16\]")


def _packed_at(seed: str, name: str) -> bytes:
    """The seed with tensor `name` (a plain float32 or int8 matrix) stored packed."""
    meta, arrays = stored_arrays(seed_files()[seed])
    p = pack(arrays[name])
    arrays[name] = p.data
    entry: dict = {"shape": list(p.shape)}
    if p.row_sums is not None:
        arrays[name + ".sums"] = p.row_sums
        entry["row_sums"] = name + ".sums"
    packed = json.loads(meta.get("qrt.packed", "{}"))
    packed[name] = entry
    meta["qrt.packed"] = json.dumps(packed)
    return build_file(meta, arrays)


def test_packed_tensor_at_a_port_that_reads_plain_tensors(tmp_path):
    rejects(tmp_path, _packed_at("embedding", "embedding_0.weight"),
            r"graph: node 'embedding_0' \(embedding\): input 'weight' \('embedding_0.weight'\) is stored packed, "
            "but this port reads a plain tensor")
    rejects(tmp_path, _packed_at("float_math", "layer_norm_7.weight"),
            r"node 'layer_norm_7' \(layer_norm\): input 'weight' \('layer_norm_7.weight'\) is stored packed")

    # a stored operand of add (a non-const port), and a weight read by a packed port and a plain one
    def edit(g):
        g["nodes"].append({"name": "a", "op": "add", "inputs": {"a": "linear_float_0", "b": "linear_float_0.weight"},
                           "outputs": ["sum"]})
        g["outputs"] = ["sum"]

    rejects(tmp_path, edited("linear_float", lambda h: set_graph(h, _graph(h, edit))),
            r"node 'a' \(add\): input 'b' \('linear_float_0.weight'\) is stored packed, but this port reads a plain")


def _graph(header: dict, fn) -> dict:
    g = get_graph(header)
    fn(g)
    return g


def test_packed_tensor_as_a_graph_output(tmp_path):
    def edit(g):
        g["outputs"].append("linear_float_0.weight")
        g["output_structure"] = "tuple"

    rejects(tmp_path, edited("linear_float", lambda h: set_graph(h, _graph(h, edit))),
            "graph: outputs: 'linear_float_0.weight' is a tensor stored packed: only weight ports read those")


# ------------------------------------------------------------------ the checksum


@pytest.mark.parametrize("bad", [
    lambda c: c.upper(),  # XXH64-1M: and upper-case digits
    lambda c: c[:9] + c[9:].upper().replace("0", "A") if c[9:].upper() != c[9:] else "xxh64-1m:" + "A" * 16,
    lambda c: "XXH64-1M:" + c[9:],
    lambda c: "xxh64:" + c[9:],
    lambda c: "xxh3-1m:" + c[9:],
    lambda c: "xxh64-1m-" + c[9:],
    lambda c: c[9:],  # no prefix
    lambda c: c[:-1],  # 15 digits
    lambda c: c + "0",  # 17 digits
    lambda c: c + " ",
    lambda c: "xxh64-1m:0x" + c[11:],
    lambda c: "xxh64-1m:" + "g" * 16,
    lambda c: "",
], ids=["upper", "upper-digits", "upper-prefix", "short-prefix", "xxh3", "dash", "no-prefix", "15-digits",
        "17-digits", "trailing-space", "0x", "not-hex", "empty"])
def test_checksum_malformed(tmp_path, bad):
    def edit(h):
        c = h["__metadata__"]["qrt.data_checksum"]
        h["__metadata__"]["qrt.data_checksum"] = bad(c)
        assert h["__metadata__"]["qrt.data_checksum"] != c

    rejects(tmp_path, edited("linear_dynamic", edit, fix_checksum=False),
            "header: qrt.data_checksum must be 'xxh64-1m:' and 16 lowercase hex digits")


def test_checksum_of_version_3_is_refused_in_version_4(tmp_path):
    body = split(seed_files()["linear"])[1]
    rejects(tmp_path, edited("linear", lambda h: h["__metadata__"].update(
        {"qrt.data_checksum": hashlib.sha256(body).hexdigest()}), fix_checksum=False),
        "qrt.data_checksum must be 'xxh64-1m:' and 16 lowercase hex digits")


def test_checksum_mismatch(tmp_path):
    header, body = split(seed_files()["linear_dynamic"])
    b, _ = header[W8]["data_offsets"]
    flipped = body[:b] + bytes([body[b] ^ 0x10]) + body[b + 1 :]  # one bit of the packed weight
    want = header["__metadata__"]["qrt.data_checksum"]
    rejects(tmp_path, join(header, flipped),
            f"data section checksum mismatch: header says {want}, data hashes to {qformat.data_checksum(flipped)}",
            mismatch=True)
    # well-formed but of other data
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["__metadata__"].update(
        {"qrt.data_checksum": "xxh64-1m:" + "0" * 16}), fix_checksum=False),
        "data section checksum mismatch: header says xxh64-1m:0000000000000000, data hashes to " + want,
        mismatch=True)


def _big_file(rows: int = 1100) -> bytes:
    """A model whose data section spans three 1 MiB blocks."""
    b = GraphBuilder()
    w = np.random.default_rng(7).standard_normal((rows, 512)).astype(np.float32)
    b.output(b.node("linear_float", {"x": b.input("x", "float32", [None, 512]), "weight": w}))
    return qformat.encode(b.graph(), b.tensors)


def test_checksum_is_the_block_tree(tmp_path):
    """The header's checksum is XXH64 over the 8-byte little-endian XXH64 digests of the 1 MiB blocks."""
    import xxhash  # a dev requirement (tests/test_checksum.py): without it this fails rather than skips

    data = _big_file()
    header, body = split(data)
    assert 2 * BLOCK < len(body) < 3 * BLOCK
    digests = b"".join(xxhash.xxh64_intdigest(body[i : i + BLOCK]).to_bytes(8, "little")
                       for i in range(0, len(body), BLOCK))
    assert header["__metadata__"]["qrt.data_checksum"] == f"xxh64-1m:{xxhash.xxh64_intdigest(digests):016x}"
    # not the XXH64 of the whole section
    assert header["__metadata__"]["qrt.data_checksum"] != f"xxh64-1m:{xxhash.xxh64_intdigest(body):016x}"
    assert qformat.data_checksum(b"") == "xxh64-1m:ef46db3751d8e999"  # no blocks: XXH64 of zero bytes
    qformat.load_file(write(tmp_path, data))


@pytest.mark.parametrize("where", [0, BLOCK - 1, BLOCK, 2 * BLOCK + 5, -1])
def test_checksum_mismatch_in_any_block(tmp_path, where):
    header, body = split(_big_file())
    i = where % len(body)
    body = body[:i] + bytes([body[i] ^ 1]) + body[i + 1 :]
    rejects(tmp_path, join(header, body), "data section checksum mismatch: header says xxh64-1m:[0-9a-f]{16}",
            mismatch=True)


def test_empty_data_section(tmp_path):
    b = GraphBuilder()
    b.output(b.node("relu", {"x": b.input("x", "float32", [2])}))
    data = qformat.encode(b.graph(), {})
    header, body = split(data)
    assert body == b"" and len(data) % 64 == 0
    assert header["__metadata__"]["qrt.data_checksum"] == "xxh64-1m:ef46db3751d8e999"
    assert qformat.load_file(write(tmp_path, data)).version == 4


def test_verify_false_loads_altered_data_and_runs(tmp_path):
    """verify=False skips only the checksum: altered weights (packed int8, packed float16, row sums, scales)
    load and run without crashing; the numbers are whatever the bytes say."""
    data = seed_files()["lstm_cell_dynamic"]
    header, body = split(data)
    rng = np.random.default_rng(0)
    raw = bytearray(body)
    for name, e in header.items():
        if name == "__metadata__" or "scale" in name or "zero_point" in name:
            continue  # those are checked at load time whatever verify says
        b, end = e["data_offsets"]
        raw[b:end] = rng.integers(0, 256, end - b, dtype=np.uint8).tobytes()
    altered = join(header, bytes(raw))  # the header's checksum is the original data's
    p = write(tmp_path, altered)
    with pytest.raises(qrt.FormatError, match="data section checksum mismatch"):
        qformat.load_file(p)
    with pytest.raises(qrt.FormatError, match="data section checksum mismatch"):
        qrt.load(p)
    f = qformat.load_file(p, verify=False)
    assert isinstance(f.tensors["lstm_cell_dynamic_0.ih_weight"], PackedMatrix)
    model = qrt.load(p, verify=False)
    assert not model.verified
    for batch in (1, 3):
        x = [np.ones((batch, 4), np.float32), np.zeros((batch, 3), np.float32), np.zeros((batch, 3), np.float32)]
        with np.errstate(all="ignore"):
            out = outputs(model.run(x))
        assert [o.shape for o in out] == [(batch, 3), (batch, 3)]
    # the same with a flat linear: int8 weights, row sums and a float16 matrix
    for seed in ("linear_dynamic", "linear_dynamic_fp16", "linear", "linear_float"):
        header, body = split(seed_files()[seed])
        packed = json.loads(header["__metadata__"]["qrt.packed"])
        raw = bytearray(body)
        for name, spec in packed.items():
            for t in (name, spec.get("row_sums")):
                if t:
                    b, end = header[t]["data_offsets"]
                    raw[b:end] = bytes(255 - v for v in raw[b:end])
        p = write(tmp_path, join(header, bytes(raw)), seed + ".qrt")
        model = qrt.load(p, verify=False)
        spec = model.inputs[0]
        x = np.full([2 if d is None else d for d in spec.shape], 7, spec.dtype)
        with np.errstate(all="ignore"):
            assert outputs(model.run(x))[0].shape[0] == 2


def test_verify_false_still_checks_the_checksum_field(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.data_checksum": "xxh64-1m:XYZ"}),
                             fix_checksum=False), "qrt.data_checksum must be")


# ------------------------------------------------------------------ what the writer writes


def _v3_file(b: GraphBuilder) -> bytes:
    """The model as a version 3 writer wrote it, by hand: plain tensors widest first with no gaps, the header
    padded to a multiple of 8, qrt.data_sha256, version "3"."""
    arrays = {name: np.asarray(a) for name, a in b.tensors.items()}
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    meta = {"qrt.version": "3", "qrt.producer": "by hand", "qrt.graph": json.dumps(b.graph())}
    data = build_file(meta, {n: arrays[n] for n in order}, align=8)
    assert set(split(data)[0]["__metadata__"]) == {"qrt.version", "qrt.producer", "qrt.graph", "qrt.data_sha256"}
    return data


def _mixed_model() -> GraphBuilder:
    """linear_dynamic int8 and float16, linear_float, static linear and an LSTM cell, at sizes that are not
    multiples of the strips (16), the panels (32, 64) or the int8 groups (4)."""
    rng = np.random.default_rng(11)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 37])
    h = b.input("h", "float32", [None, 5])
    c = b.input("c", "float32", [None, 5])
    y = b.node("linear_dynamic", {
        "x": x, "weight": rng.integers(-128, 128, (70, 37)).astype(np.int8),
        "weight_scale": rng.uniform(0.002, 0.02, 70).astype(np.float32),
        "weight_zero_point": np.zeros(70, np.int32), "bias": rng.standard_normal(70).astype(np.float32),
    }, {"reduce_range": True})
    y = b.node("linear_dynamic", {"x": y, "weight": rng.standard_normal((33, 70)).astype(np.float16),
                                  "bias": rng.standard_normal(33).astype(np.float32)}, {"reduce_range": False})
    y = b.node("linear_float", {"x": y, "weight": rng.standard_normal((20, 33)).astype(np.float32),
                                "bias": rng.standard_normal(20).astype(np.float32)})
    q = b.node("quantize_per_tensor", {"x": y, "scale": np.array(0.05, np.float32),
                                       "zero_point": np.array(128, np.int32)}, {"dtype": "quint8"})
    q = b.node("linear", {
        "x": q, "x_scale": "quantize_per_tensor_3.scale", "x_zero_point": "quantize_per_tensor_3.zero_point",
        "weight": rng.integers(-128, 128, (18, 20)).astype(np.int8), "weight_scale": np.array(0.01, np.float32),
        "weight_zero_point": np.array(0, np.int32), "bias": rng.standard_normal(18).astype(np.float32),
        "y_scale": np.array(0.1, np.float32), "y_zero_point": np.array(60, np.int32),
    }, {"relu": True})
    d = b.node("dequantize", {"x": q, "scale": "linear_4.y_scale", "zero_point": "linear_4.y_zero_point"})
    h1, c1 = b.node("lstm_cell_dynamic", {
        "x": d, "h": h, "c": c,
        "ih_weight": rng.integers(-128, 128, (20, 18)).astype(np.int8),
        "ih_weight_scale": np.array(0.01, np.float32), "ih_weight_zero_point": np.array(0, np.int32),
        "ih_bias": rng.standard_normal(20).astype(np.float32),
        "hh_weight": rng.standard_normal((20, 5)).astype(np.float16),
        "hh_bias": rng.standard_normal(20).astype(np.float32),
    }, {"reduce_range": True})
    b.output(y, d, h1, c1)
    return b


PACKED_WEIGHTS = {"linear_dynamic_0.weight", "linear_dynamic_1.weight", "linear_float_2.weight", "linear_4.weight",
                  "lstm_cell_dynamic_6.ih_weight", "lstm_cell_dynamic_6.hh_weight"}


def test_writer_packs_exactly_the_packed_ports_weights(tmp_path):
    b = _mixed_model()
    p = tmp_path / "m.qrt"
    b.save(p)
    header, _ = split(p.read_bytes())
    packed = json.loads(header["__metadata__"]["qrt.packed"])
    assert set(packed) == PACKED_WEIGHTS
    for name in PACKED_WEIGHTS:
        w = b.tensors[name]
        assert packed[name]["shape"] == list(w.shape)
        assert header[name]["shape"] == list(packed_shape(w.dtype, *w.shape)) == list(pack(w).data.shape)
        if w.dtype == np.int8:
            sums = packed[name]["row_sums"]
            assert sums not in b.tensors and header[sums] == {**header[sums], "dtype": "I32", "shape": [w.shape[0]]}
        else:
            assert "row_sums" not in packed[name]
    f = qformat.load_file(p)
    assert {n for n, t in f.tensors.items() if isinstance(t, PackedMatrix)} == PACKED_WEIGHTS
    assert set(f.tensors) == set(b.tensors)


def test_version_4_runs_bit_identical_to_version_3(tmp_path, variant):
    b = _mixed_model()
    p4, p3 = tmp_path / "v4.qrt", write(tmp_path, _v3_file(b), "v3.qrt")
    b.save(p4)
    assert qformat.load_file(p4).version == 4 and qformat.load_file(p3).version == 3
    assert not any(isinstance(t, PackedMatrix) for t in qformat.load_file(p3).tensors.values())
    m4, m3 = qrt.load(p4), qrt.load(p3)
    rng = np.random.default_rng(5)
    for batch in (1, 2, 7, 33):
        x = [rng.standard_normal((batch, 37)).astype(np.float32), rng.standard_normal((batch, 5)).astype(np.float32),
             rng.standard_normal((batch, 5)).astype(np.float32)]
        assert_bit_identical(m4.run(x), m3.run(x))


def test_every_packed_port_is_stored_packed_and_runs_as_version_3(tmp_path):
    """Each seed model with a packed port (every op that has one, sequences included) as written, against
    its version 3 file (a seed of a later op: its own version's file with every matrix plain, which version 4 and
    later allow)."""
    ops_with_packed_ports = {op for op, spec in OPS.items() if any(p.packed for p in spec.inputs)}
    seen = set()
    rng = np.random.default_rng(9)
    for seed, data in seed_files().items():
        header, _ = split(data)
        g = get_graph(header)
        ops = {n["op"] for n in g["nodes"]} & ops_with_packed_ports
        if not ops or seed.startswith("v3_"):
            continue
        seen |= ops
        packed = json.loads(header["__metadata__"]["qrt.packed"])
        for n in g["nodes"]:
            spec = OPS[n["op"]]
            for port in spec.inputs:
                if port.packed and port.name in n["inputs"]:
                    assert n["inputs"][port.name] in packed, (seed, n["name"], port.name)
        m4 = qrt.load(write(tmp_path, data, "v4.qrt"))
        version = int(header["__metadata__"]["qrt.version"])
        m3 = qrt.load(write(tmp_path, plain_file(data, 3 if version <= 4 else version), "v3.qrt"))
        x = [rng.standard_normal([2 if d is None else d for d in s.shape]).astype(s.dtype) for s in m4.inputs]
        assert_bit_identical(m4.run(x), m3.run(x))
    assert seen == ops_with_packed_ports


def test_packed_layout_element_by_element(tmp_path):
    """The stored bytes are the layout of docs/FORMAT.md, computed here from the formulas alone:
    int8 [s, g, c, b] = w[16 s + c, 4 g + b], float [s, t, c] = w[16 s + c, t], zero outside w."""
    b = _mixed_model()
    data = qformat.encode(b.graph(), b.tensors)
    meta, arrays = stored_arrays(data)
    packed = json.loads(meta["qrt.packed"])
    for name in PACKED_WEIGHTS:
        w = b.tensors[name]
        n, k = w.shape
        stored = arrays[name]
        if w.dtype == np.int8:
            n64, k4 = -(-n // 64) * 64, -(-k // 4) * 4
            assert stored.shape == (n64 // 16, k4 // 4, 16, 4)
            want = np.zeros(stored.shape, np.int8)
            for s, g, c, bb in np.ndindex(*stored.shape):
                if 16 * s + c < n and 4 * g + bb < k:
                    want[s, g, c, bb] = w[16 * s + c, 4 * g + bb]
            np.testing.assert_array_equal(arrays[packed[name]["row_sums"]], w.sum(axis=1, dtype=np.int32))
        else:
            n32 = -(-n // 32) * 32
            assert stored.shape == (n32 // 16, k, 16)
            want = np.zeros(stored.shape, w.dtype)
            for s, t, c in np.ndindex(*stored.shape):
                if 16 * s + c < n:
                    want[s, t, c] = w[16 * s + c, t]
        assert stored.dtype == w.dtype and stored.tobytes() == want.tobytes(), name


def test_padding_never_reaches_a_result(tmp_path, variant):
    """The writer pads with zeros (above); a reader's kernels must not let what the padding holds reach an
    output: junk there gives the same bits."""
    b = _mixed_model()
    data = qformat.encode(b.graph(), b.tensors)
    meta, arrays = stored_arrays(data)
    rng = np.random.default_rng(4)
    for name in PACKED_WEIGHTS:
        w = b.tensors[name]
        a = arrays[name]
        real = pack(np.ones(w.shape, w.dtype)).data != 0  # where w's elements lie in the packed array
        arrays[name] = np.where(real, a, rng.integers(-100, 100, a.shape).astype(a.dtype))
        assert (arrays[name] != a).any()
    m_junk = qrt.load(write(tmp_path, build_file(meta, arrays), "junk.qrt"))
    m = qrt.load(write(tmp_path, data))
    for batch in (1, 2, 7, 33):
        x = [rng.standard_normal((batch, 37)).astype(np.float32), rng.standard_normal((batch, 5)).astype(np.float32),
             rng.standard_normal((batch, 5)).astype(np.float32)]
        assert_bit_identical(m_junk.run(x), m.run(x))


def test_writer_alignment(tmp_path):
    """The data section starts at a multiple of 64, packed matrices come first, each on a 64-byte line, and the
    loaded packed data lies 64-aligned in memory."""
    b = _mixed_model()
    p = tmp_path / "m.qrt"
    b.save(p)
    data = p.read_bytes()
    header, _ = split(data)
    n = len(data) - len(split(data)[1]) - 8
    assert (8 + n) % 64 == 0
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in header.items()
                   if name != "__metadata__")
    firsts = [name for _, _, name in spans[: len(PACKED_WEIGHTS)]]
    assert set(firsts) == PACKED_WEIGHTS
    for begin, end, name in spans[: len(PACKED_WEIGHTS)]:
        assert begin % 64 == 0 and (end - begin) % 64 == 0, name
    assert spans[0][0] == 0 and all(a[1] == b_[0] for a, b_ in zip(spans, spans[1:]))
    f = qformat.load_file(p)
    for name in PACKED_WEIGHTS:
        assert f.tensors[name].data.ctypes.data % 64 == 0, name


def test_tensor_read_by_a_packed_and_a_plain_port_is_stored_plain(tmp_path):
    rng = np.random.default_rng(2)
    wf = rng.standard_normal((4, 4)).astype(np.float32)
    w8 = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    b = GraphBuilder()
    x = b.input("x", "float32", [4, 4])
    y = b.node("linear_float", {"x": x, "weight": "wf"})
    s = b.node("add", {"a": y, "b": "wf"})  # the same matrix at a plain port
    z = b.node("linear_dynamic", {"x": s, "weight": "w8", "weight_scale": np.array(0.1, np.float32),
                                  "weight_zero_point": np.array(0, np.int32)})
    d = b.node("dequantize", {"x": "w8", "scale": np.array(0.5, np.float32), "zero_point": np.array(1, np.int32)})
    u = b.node("linear_float", {"x": x, "weight": "wu"})  # read by a packed port only, but a graph output too
    w2 = b.node("linear_float", {"x": x, "weight": "wf2"})  # read by two packed ports: packed once
    w3 = b.node("linear_float", {"x": x, "weight": "wf2"})
    b.tensors.update({"wf": wf, "w8": w8, "wu": rng.standard_normal((2, 4)).astype(np.float32),
                      "wf2": rng.standard_normal((3, 4)).astype(np.float32)})
    b.output(z, d, u, "wu", w2, w3)
    p = tmp_path / "m.qrt"
    b.save(p)
    header, _ = split(p.read_bytes())
    assert json.loads(header["__metadata__"]["qrt.packed"]) == {"wf2": {"shape": [3, 4]}}
    for name in ("wf", "w8", "wu"):
        assert header[name]["shape"] == list(b.tensors[name].shape)
    assert not any(k.endswith("row_sums") for k in header)
    f = qformat.load_file(p)
    assert [n for n, t in f.tensors.items() if isinstance(t, PackedMatrix)] == ["wf2"]
    xin = rng.standard_normal((4, 4)).astype(np.float32)
    assert_bit_identical(qrt.load(p).run(xin), qrt.load(write(tmp_path, _v3_file(b), "v3.qrt")).run(xin))


def test_version_4_file_may_store_weights_plain(tmp_path):
    """Packing is the writer's choice: a version 4 file with plain weights (another writer's) loads and runs as
    the packed one does."""
    data = seed_files()["lstm_cell_dynamic"]
    meta, _ = stored_arrays(data)
    meta3, arrays = stored_arrays(plain_file(data, 3))
    meta3.pop("qrt.data_sha256")
    meta3["qrt.version"] = "4"
    plain = build_file(meta3, arrays)
    header, _ = split(plain)
    assert "qrt.packed" not in header["__metadata__"] and "qrt.data_checksum" in header["__metadata__"]
    f = qformat.load_file(write(tmp_path, plain, "plain.qrt"))
    assert f.version == 4 and not any(isinstance(t, PackedMatrix) for t in f.tensors.values())
    x = [np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), np.ones((2, 3), np.float32),
         np.zeros((2, 3), np.float32)]
    assert_bit_identical(qrt.load(tmp_path / "plain.qrt").run(x), qrt.load(write(tmp_path, data)).run(x))
    # an empty qrt.packed is the same
    f = qformat.load_file(write(tmp_path, edited(plain, lambda h: h["__metadata__"].update({"qrt.packed": "{}"}))))
    assert f.version == 4


def test_misaligned_packed_matrices_from_a_foreign_writer_load(tmp_path):
    """Alignment is the writer's promise, not a reader's rule: packed data at an odd offset is copied and runs."""
    data = seed_files()["linear_float"]
    meta, arrays = stored_arrays(data)
    odd = build_file(meta, {"pad": np.zeros(1, np.uint8), **arrays}, align=8)
    header, _ = split(odd)
    assert header["linear_float_0.weight"]["data_offsets"][0] == 1
    f = qformat.load_file(write(tmp_path, odd, "odd.qrt"))
    assert f.tensors["linear_float_0.weight"].data.flags.aligned
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_bit_identical(qrt.load(tmp_path / "odd.qrt").run(x), qrt.load(write(tmp_path, data)).run(x))


# ------------------------------------------------------------------ the specification


DOC = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"


def test_doc_lists_the_packed_ports_and_the_checksum():
    """docs/FORMAT.md's table of packed ports (written by hand) names exactly the ports qrt/ops.py marks packed,
    and the checksum's definition carries its test vectors."""
    text = DOC.read_text()
    section = text.split("### 2.4 Packed matrices", 1)[1].split("\n\n**Layouts.**", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            for op in re.findall(r"`([a-z_0-9]+)`", cells[0]):
                rows[op] = set(re.findall(r"`([a-z_<>\[\]]+)`", cells[1]))
    want = {}
    for op, spec in OPS.items():
        ports = {re.sub(r"^l\d+_(reverse_)?", lambda m: "l<n>_" + (m.group(1) or ""), p.name)
                 for p in spec.inputs if p.packed}
        if ports:
            want[op] = ports
    assert rows == want
    for vector in ("ef46db3751d8e999", "44bc2cf5ad770999", "xxh64-1m:ef46db3751d8e999", "1,048,576"):
        assert vector in text
    assert qformat.data_checksum(b"abc") in text and "HEADER_ALIGN" in text


@pytest.mark.parametrize("message", [
    "qrt.packed: must be a JSON object, got list",
    "is not in the header",
    "only int8, float16 and float32 matrices are packed, this one is int32",
    "entry must have exactly ['row_sums', 'shape']",
    "shape must be two non-negative integers [n, k]",
    "a packed [4, 9] int8 matrix is stored as [4, 3, 16, 4], the header says [4, 2, 16, 4]",
    "row_sums must name an unpacked tensor of the header",
    "already holds the sums of",
    "must be int32 [4], got float32 [4]",
    "qrt.packed needs format version 4, the file says 3",
    "is stored packed, but this port reads a plain tensor",
    "is a tensor stored packed: only weight ports read those",
    "qrt.data_checksum must be 'xxh64-1m:' and 16 lowercase hex digits",
    # the reader's own message for the next version: the document keeps up with each new one
    f"format version {max(qformat.SUPPORTED_VERSIONS) + 1} is newer than this qrt reads "
    f"({list(qformat.SUPPORTED_VERSIONS)})",
])
def test_doc_states_each_version_4_error(message):
    assert message in DOC.read_text()


def test_doc_worked_example_is_what_the_writer_writes():
    """Section 8's hex dump is the reference writer's file, byte for byte, and its checksum is as stated."""
    text = DOC.read_text().split("## 8. Worked example", 1)[1].split("## 9.", 1)[0]
    dump = text.split("```\n", 2)[1]
    data = b"".join(bytes.fromhex(line[10:50].replace(" ", "")) for line in dump.splitlines())
    graph = {"inputs": [{"name": "x", "dtype": "float32", "shape": [2]}],
             "nodes": [{"name": "n", "op": "add", "inputs": {"a": "x", "b": "b"}, "outputs": ["y"]}],
             "outputs": ["y"], "output_structure": "single"}
    want = qformat.encode(graph, {"b": np.array([1, 2], np.float32)}, {"producer": "doc"})
    assert data == want and f"{len(want)} bytes" in text
    assert split(want)[0]["__metadata__"]["qrt.data_checksum"] == "xxh64-1m:1438b30f09fca9ef"
    assert f"{K.xxh64(want[-8:]):016x}" in text

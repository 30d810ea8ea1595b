"""The .qrt container: round trip, safetensors compatibility, and one corrupt file per way to be wrong.

Each corrupt file is made by editing a valid one (tests/fuzz_cases.py has the
surgery helpers); every edit that is not about the checksum recomputes it (the
version 4 xxh64-1m checksum, or sha256 in a file of version 1 to 3), so the file
reaches the check under test. What version 4 adds (packed weights, qrt.packed,
the new checksum) has its own file: tests/test_format_v4.py.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from fuzz_cases import (
    build_file,
    get_graph,
    join,
    plain_file,
    seed_files,
    set_checksum,
    set_graph,
    split,
    stored_arrays,
)

import qrt
from qrt import format as qformat
from qrt.builder import GraphBuilder
from qrt.layout import PackedMatrix, pack
from qrt.ops import OPS

DOC = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"


def write(tmp_path: Path, data: bytes, name: str = "m.qrt") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def rejects(tmp_path: Path, data: bytes, match: str) -> None:
    p = write(tmp_path, data)
    with pytest.raises(qrt.FormatError, match=match):
        qformat.load_file(p)
    with pytest.raises(qrt.FormatError, match=match):
        qrt.load(p)


def edited(seed: str, fn, fix_checksum: bool = True) -> bytes:
    """Edit a seed file's parsed header in place (fn may return a new data section)."""
    header, body = split(seed_files()[seed])
    new_body = fn(header)
    return join(header, new_body if isinstance(new_body, bytes) else body, fix_checksum=fix_checksum)


def graph_edited(seed: str, fn) -> bytes:
    def edit(header):
        g = get_graph(header)
        fn(g)
        set_graph(header, g)

    return edited(seed, edit)


def raw_header(text: str | bytes, body: bytes = b"") -> bytes:
    hb = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(hb)) + hb + body


def valid_meta(body: bytes = b"", graph: str = "{}", version: int = qformat.FORMAT_VERSION) -> dict:
    """Metadata of a file of this version: the checksum of body it calls for (xxh64-1m from 4, else sha256)."""
    meta = {"qrt.version": str(version), "qrt.producer": "test", "qrt.graph": graph}
    set_checksum(meta, body)
    return meta


def v3(seed: str) -> bytes:
    """A seed model as a version 3 writer wrote it: plain weights, qrt.data_sha256 (fuzz_cases.plain_file)."""
    return plain_file(seed_files()[seed], 3)


def edited_v3(seed: str, fn, fix_checksum: bool = True) -> bytes:
    """edited(), on the seed's version 3 file."""
    header, body = split(v3(seed))
    new_body = fn(header)
    return join(header, new_body if isinstance(new_body, bytes) else body, fix_checksum=fix_checksum)


def set_tensor(header: dict, body: bytes, name: str, values) -> bytes:
    t = header[name]
    b, e = t["data_offsets"]
    raw = np.asarray(values, dtype=qformat.DTYPES[t["dtype"]]).tobytes()
    assert len(raw) == e - b
    return body[:b] + raw + body[e:]


# ------------------------------------------------------------------ round trip and compatibility


def _builder() -> GraphBuilder:
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 5])
    y = b.node("linear_dynamic", {
        "x": x, "weight": rng.integers(-128, 128, (3, 5)).astype(np.int8),
        "weight_scale": np.array([0.1, 0.2, 0.3], np.float32), "weight_zero_point": np.zeros(3, np.int32),
        "bias": np.array([1, 2, 3], np.float32),
    })
    z = b.node("linear_dynamic", {"x": y, "weight": rng.standard_normal((2, 3)).astype(np.float16)})
    b.tensor("extra.u8", np.arange(7, dtype=np.uint8))  # odd size, stored but unused
    b.output(y, z)
    return b


def test_round_trip(tmp_path):
    b = _builder()
    p = tmp_path / "m.qrt"
    b.save(p, metadata={"producer": "unit test", "note": "hello"})
    f = qformat.load_file(p)
    assert set(f.tensors) == set(b.tensors)  # the row sums stored beside int8 weights are not graph tensors
    for name, a in b.tensors.items():
        got = f.tensors[name]
        # the linear weights are stored packed and read back as PackedMatrix; everything else as plain arrays
        assert isinstance(got, PackedMatrix) == name.endswith(".weight"), name
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(np.asarray(got), a)
    assert json.loads(f.metadata["qrt.graph"]) == json.loads(json.dumps(b.graph()))
    assert f.metadata["qrt.producer"] == "unit test" and f.metadata["note"] == "hello"
    assert f.version == 4 == qformat.FORMAT_VERSION and f.metadata["qrt.version"] == "4"
    assert [n.op for n in f.graph.nodes] == ["linear_dynamic", "linear_dynamic"]
    assert [s.name for s in f.graph.outputs] == ["linear_dynamic_0", "linear_dynamic_1"]
    assert f.graph.output_tuple
    # and it runs
    out = qrt.load(p).run(np.ones((2, 5), np.float32))
    assert isinstance(out, tuple) and out[0].shape == (2, 3) and out[1].shape == (2, 2)


def test_writer_layout(tmp_path):
    """Header padded with spaces to a multiple of 64; packed matrices first, each on a 64-byte line; then
    widest items first; no gaps; the xxh64-1m checksum."""
    data = qformat.encode(_builder().graph(), _builder().tensors)
    (n,) = struct.unpack("<Q", data[:8])
    assert qformat.HEADER_ALIGN == 64
    assert (8 + n) % 64 == 0 and data[8 + n - 1 : 8 + n] in (b" ", b"}")
    header = json.loads(data[8 : 8 + n])
    packed = json.loads(header["__metadata__"]["qrt.packed"])
    assert sorted(packed) == ["linear_dynamic_0.weight", "linear_dynamic_1.weight"]
    spans = sorted((v["data_offsets"], k in packed, qformat.DTYPES[v["dtype"]].itemsize)
                   for k, v in header.items() if k != "__metadata__")
    assert spans[0][0][0] == 0 and spans[-1][0][1] == len(data) - 8 - n
    assert [p for _, p, _ in spans] == [True] * len(packed) + [False] * (len(spans) - len(packed))
    for (a, pa, sa), (b, pb, sb) in zip(spans, spans[1:]):
        assert a[1] == b[0]
        assert sa >= sb or pa  # widest first, after the packed matrices
        assert b[0] % (64 if pb else sb) == 0
    assert header["__metadata__"]["qrt.data_checksum"] == qformat.data_checksum(data[8 + n :])
    assert "qrt.data_sha256" not in header["__metadata__"]


def test_safetensors_reads_qrt(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open

    b = _builder()
    p = tmp_path / "m.qrt"
    b.save(p)
    loaded = safetensors_numpy.load_file(str(p))
    packed = {"linear_dynamic_0.weight", "linear_dynamic_1.weight"}
    # the int8 matrix's row sums are a tensor of their own, named in qrt.packed
    sums = "linear_dynamic_0.weight.row_sums"
    assert set(loaded) == set(b.tensors) | {sums}
    for name, a in b.tensors.items():
        assert loaded[name].dtype == a.dtype
        if name in packed:  # safetensors sees the stored packed array
            p_ = pack(a)
            assert loaded[name].shape == p_.data.shape != a.shape
            np.testing.assert_array_equal(loaded[name], p_.data)
        else:
            np.testing.assert_array_equal(loaded[name], a)
    np.testing.assert_array_equal(loaded[sums], b.tensors["linear_dynamic_0.weight"].sum(axis=1, dtype=np.int32))
    assert loaded[sums].dtype == np.int32
    with safe_open(str(p), framework="numpy") as f:
        meta = f.metadata()
        assert meta["qrt.version"] == "4"
        assert json.loads(meta["qrt.packed"]) == {
            "linear_dynamic_0.weight": {"shape": [3, 5], "row_sums": sums},
            "linear_dynamic_1.weight": {"shape": [2, 3]},
        }
        assert json.loads(meta["qrt.graph"])["output_structure"] == "tuple"
        np.testing.assert_array_equal(f.get_tensor("extra.u8"), np.arange(7, dtype=np.uint8))


def test_qrt_reads_safetensors_written_tensors(tmp_path):
    """A file written by the safetensors package, with qrt metadata, loads: the layouts agree, packed
    matrices (written by safetensors as plain arrays of their packed shape) included."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(3)
    w8 = rng.integers(-128, 128, (3, 5)).astype(np.int8)
    wf = rng.standard_normal((2, 3)).astype(np.float32)
    b = GraphBuilder()
    y = b.node("linear_dynamic", {"x": b.input("x", "float32", [None, 5]), "weight": "w8",
                                  "weight_scale": "s", "weight_zero_point": "z"})
    b.output(b.node("relu", {"x": b.node("linear_float", {"x": y, "weight": "wf"})}))
    p8, pf = pack(w8), pack(wf)
    tensors = {"pad": np.arange(3, dtype=np.int8), "w": np.ones((2, 2), np.float32), "w8": p8.data,
               "w8.sums": p8.row_sums, "wf": pf.data, "s": np.array(0.1, np.float32), "z": np.array(0, np.int32)}
    p = tmp_path / "st.qrt"
    packed = {"w8": {"shape": [3, 5], "row_sums": "w8.sums"}, "wf": {"shape": [2, 3]}}
    safetensors_numpy.save_file(tensors, str(p), metadata={})
    header, body = split(p.read_bytes())
    header["__metadata__"] = valid_meta(body, json.dumps(b.graph())) | {"qrt.packed": json.dumps(packed)}
    p.write_bytes(join(header, body))
    f = qformat.load_file(p)
    np.testing.assert_array_equal(f.tensors["w"], tensors["w"])
    assert "w8.sums" not in f.tensors
    np.testing.assert_array_equal(np.asarray(f.tensors["w8"]), w8)
    np.testing.assert_array_equal(np.asarray(f.tensors["wf"]), wf)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    b.tensors.update({"w8": w8, "wf": wf, "s": tensors["s"], "z": tensors["z"]})
    b.save(tmp_path / "qrt.qrt")
    np.testing.assert_array_equal(qrt.load(p).run(x), qrt.load(tmp_path / "qrt.qrt").run(x))


def test_file_is_memory_mapped(tmp_path):
    p = tmp_path / "m.qrt"
    _builder().save(p)
    f = qformat.load_file(p)
    arrays = []
    for t in f.tensors.values():
        if isinstance(t, PackedMatrix):  # the packed bytes and the row sums are both views of the map
            arrays += [a for a in (t.data, t.row_sums) if a is not None]
        else:
            arrays.append(t)
    assert sum(isinstance(t, PackedMatrix) for t in f.tensors.values()) == 2 and len(arrays) == len(f.tensors) + 1
    for t in arrays:
        base = t
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if isinstance(base, memoryview):  # np.frombuffer keeps a memoryview of the buffer it was given
            base = base.obj
        assert isinstance(base, mmap.mmap), f"tensor is backed by {type(base).__name__}, not the mapping"
        assert not t.flags.writeable


def test_misaligned_tensors_from_a_foreign_writer_load(tmp_path):
    """A writer that puts a float32 tensor at an odd offset: readers must accept it."""
    b = GraphBuilder()
    b.output(b.node("add", {"a": b.input("x", "float32", [2]), "b": "w"}))
    w = np.array([1.5, -2.25], np.float32)
    body = b"\x07" + w.tobytes() + b"\x00\x00\x00"
    header = {
        "__metadata__": valid_meta(body, json.dumps(b.graph())),
        "odd": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
        "tail": {"dtype": "U8", "shape": [3], "data_offsets": [9, 12]},
    }
    text = json.dumps(header)
    text += " " * (-(8 + len(text)) % 8)  # data section 8-aligned, so "w" at offset 1 is misaligned
    p = write(tmp_path, join(None, body, raw=text))
    assert (8 + len(text) + 1) % 4 != 0
    f = qformat.load_file(p)
    np.testing.assert_array_equal(f.tensors["w"], w)
    assert f.tensors["w"].flags.aligned
    np.testing.assert_array_equal(qrt.load(p).run(np.zeros(2, np.float32)), w)


def test_big_endian_and_noncontiguous_tensors_are_written_little_endian(tmp_path):
    b = GraphBuilder()
    b.output(b.node("add", {"a": b.input("x", "float32", [2, 2]), "b": "w"}))
    w = np.arange(4, dtype=">f4").reshape(2, 2).T
    b.tensor("w", w)
    p = tmp_path / "m.qrt"
    b.save(p)
    f = qformat.load_file(p)
    assert f.tensors["w"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(f.tensors["w"], w)


def _doc_section(text: str, op: str) -> str:
    """The text under the '### ...' heading that names op in backquotes."""
    for part in text.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        if f"`{op}`" in heading:
            return body.split("\n## ", 1)[0]
    raise AssertionError(f"docs/FORMAT.md has no '### ' heading naming `{op}`")


def test_doc_covers_every_op_port_and_attribute():
    text = DOC.read_text()
    for op in OPS.values():
        body = _doc_section(text, op.name)
        for p in op.inputs:
            # sequence ops have one port per layer and direction: documented as l<n>_[reverse_]...
            name = re.sub(r"^l\d+_(reverse_)?", "l<n>_[reverse_]", p.name)
            assert f"`{name}`" in body, f"FORMAT.md, {op.name}: port {name} missing"
        for a in op.attrs:
            assert f"`{a.name}`" in body, f"FORMAT.md, {op.name}: attribute {a.name} missing"
        for o in op.outputs:
            assert f"`{o}`" in body, f"FORMAT.md, {op.name}: output {o} missing"
    for code in qformat.DTYPES:
        assert f"`{code}`" in text
    assert f"{qformat.MAX_HEADER_BYTES:,}" in text and str(qformat.MAX_JSON_DEPTH) in text


# ------------------------------------------------------------------ the container


def test_empty_file(tmp_path):
    rejects(tmp_path, b"", "0 bytes, too short")


def test_short_file(tmp_path):
    rejects(tmp_path, b"\x10\x00\x00", "3 bytes, too short")


def test_header_length_huge(tmp_path):
    rejects(tmp_path, struct.pack("<Q", 2**63) + b"{}", "exceeds the limit of 100000000")


def test_header_length_past_eof(tmp_path):
    rejects(tmp_path, struct.pack("<Q", 1000) + b"{}", "runs past the end of the 10-byte file")


def test_not_utf8(tmp_path):
    rejects(tmp_path, raw_header(b'{"\xff": 1}'), "not valid UTF-8")


def test_malformed_json(tmp_path):
    rejects(tmp_path, raw_header('{"__metadata__": '), "header: malformed JSON")


def test_deeply_nested_json(tmp_path):
    rejects(tmp_path, raw_header("[" * 100_000 + "]" * 100_000), "nested deeper than 64")
    meta = json.dumps(valid_meta())
    rejects(tmp_path, raw_header('{"__metadata__": ' + meta + ', "x": ' + "[" * 65 + "]" * 65 + "}"), "deeper than 64")


def test_duplicate_json_keys(tmp_path):
    meta = json.dumps(valid_meta())
    rejects(tmp_path, raw_header('{"__metadata__": ' + meta + ', "__metadata__": ' + meta + "}"),
            "duplicate JSON key '__metadata__'")


def test_nonstandard_json_constant(tmp_path):
    header, body = split(seed_files()["linear_dynamic"])
    text = json.dumps(header).replace('"shape": [', '"shape": [NaN, ', 1)
    rejects(tmp_path, join(None, body, raw=text), "non-standard JSON constant NaN")


def test_header_not_an_object(tmp_path):
    rejects(tmp_path, raw_header("[1, 2]"), "must be a JSON object, got list")


def test_missing_metadata(tmp_path):
    rejects(tmp_path, raw_header("{}"), "no __metadata__")


def test_metadata_not_strings(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.producer": 3})),
            "__metadata__ must be an object whose values are strings")
    rejects(tmp_path, edited("relu", lambda h: h.update({"__metadata__": []})), "__metadata__ must be an object")


def test_missing_version(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].pop("qrt.version")), "no 'qrt.version'")


def test_newer_version(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.version": "14"})),
            r"format version 14 is newer than this qrt reads "
            r"\(\[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13\]\): upgrade qrt")


def test_version_1_2_and_3_files_still_load(tmp_path):
    """Files of versions 1 to 3 (plain weights, sha256; no F64 tensor in version 1) load as such and run as
    the version-4 file (packed weights, xxh64-1m) does."""
    for seed in ("quantize_per_channel", "dequantize_per_channel", "linear", "linear_dynamic_fp16",
                 "lstm_cell_dynamic", "linear_float"):
        v4 = write(tmp_path, seed_files()[seed], "v4.qrt")
        m4 = qrt.load(v4)
        assert qformat.load_file(v4).version == 4
        for v in (1, 2, 3):
            old = write(tmp_path, plain_file(seed_files()[seed], v), "old.qrt")
            header, _ = split(old.read_bytes())
            assert "qrt.packed" not in header["__metadata__"] and "qrt.data_checksum" not in header["__metadata__"]
            f = qformat.load_file(old)
            assert f.version == v and f.metadata["qrt.data_sha256"] == header["__metadata__"]["qrt.data_sha256"]
            assert not any(isinstance(t, PackedMatrix) for t in f.tensors.values())
            shapes = {s.name: [d or 2 for d in s.shape] for s in f.graph.inputs}
            x = {s.name: np.arange(np.prod(shapes[s.name])).reshape(shapes[s.name]).astype(s.dtype)
                 for s in f.graph.inputs}
            got, want = qrt.load(old).run(x), m4.run(x)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                np.testing.assert_array_equal(g, w)


def test_version_1_file_with_f64_is_refused(tmp_path):
    """F64 did not exist in version 1: such a file is malformed, not silently read."""
    rejects(tmp_path, edited_v3("per_channel_f64", lambda h: h["__metadata__"].update({"qrt.version": "1"})),
            r"tensor 'q.scale': dtype F64 needs format version 2, the file says 1")


def test_f64_round_trip(tmp_path):
    """float64 tensors are stored as F64 and read back bit for bit (safetensors reads them too)."""
    scales = np.array([0.03, 0.2, 1 / 3, 2.0**-20 + 2.0**-60])  # no float32 holds these exactly
    b = GraphBuilder()
    b.output(b.node("dequantize", {"x": b.input("q", "int8", [None, 4]), "scale": scales,
                                   "zero_point": np.zeros(4, np.int32)}, {"axis": 1}, name="dq"))
    b.tensor("extra.f64", np.arange(5, dtype=">f8").reshape(5, 1)[::2])  # big-endian, strided, unused
    p = tmp_path / "m.qrt"
    b.save(p)
    header, _ = split(p.read_bytes())
    assert header["dq.scale"]["dtype"] == "F64" and header["extra.f64"]["dtype"] == "F64"
    f = qformat.load_file(p)
    assert f.tensors["dq.scale"].dtype == np.dtype("<f8") and f.tensors["dq.scale"].tobytes() == scales.tobytes()
    np.testing.assert_array_equal(f.tensors["extra.f64"], [[0.0], [2.0], [4.0]])
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    assert safetensors_numpy.load_file(str(p))["dq.scale"].tobytes() == scales.tobytes()


@pytest.mark.parametrize("v", ["0", "1.0", " 1", "\u00b9", "\u0661", "1" * 5000, ""])
def test_bad_version(tmp_path, v):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.version": v})),
            "is not a version number|version 0 is not supported")


@pytest.mark.parametrize("key", ["qrt.producer", "qrt.data_checksum", "qrt.graph"])
def test_missing_metadata_key(tmp_path, key):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].pop(key), fix_checksum=False), f"lacks '{key}'")


@pytest.mark.parametrize("key", ["qrt.producer", "qrt.data_sha256", "qrt.graph"])
def test_missing_metadata_key_version_3(tmp_path, key):
    rejects(tmp_path, edited_v3("relu", lambda h: h["__metadata__"].pop(key), fix_checksum=False), f"lacks '{key}'")


def test_each_version_needs_its_own_checksum_key(tmp_path):
    """A version 4 file with only a sha256, or a version 3 file with only an xxh64-1m checksum, lacks its key."""
    def swap(old: str, new: str, value):
        def edit(h):
            h["__metadata__"].pop(old)
            h["__metadata__"][new] = value
        return edit

    body = split(seed_files()["relu"])[1]
    rejects(tmp_path, edited("relu", swap("qrt.data_checksum", "qrt.data_sha256", hashlib.sha256(body).hexdigest()),
                             fix_checksum=False), "lacks 'qrt.data_checksum'")
    rejects(tmp_path, edited_v3("relu", swap("qrt.data_sha256", "qrt.data_checksum", qformat.data_checksum(
        split(v3("relu"))[1])), fix_checksum=False), "lacks 'qrt.data_sha256'")


@pytest.mark.parametrize("code", ["F8", "I64", "BF16", "f64", "i8", "", 8, None])
def test_bad_dtype(tmp_path, code):
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update({"dtype": code})),
            "linear_dynamic_0.weight'.*unsupported dtype")


@pytest.mark.parametrize("shape,match", [
    ([-4, 6], "non-negative integers, got -4"),
    ([True, 6], "non-negative integers, got True"),
    ([4.0, 6], "non-negative integers, got 4.0"),
    ([1] * 9, "at most 8 dimensions"),
    ([2**62, 2**62], "holds 512 bytes but shape"),
    ([2**30, 2**30], "holds 512 bytes but shape"),  # the int8 [4, 6] weight, packed: [4, 2, 16, 4]
    ([0, 2**63], "integer 9223372036854775808 does not fit in 64 bits"),
    ([0, 2**40, 2**40], r"shape \[0, 1099511627776, 1099511627776\] of I8 would take more than the data section's "
                        r"1048576 bytes were its zero dimensions 1"),
    ([2**40, 0], "would take more than the data section's"),  # its packing allocated 4 TiB of row sums
    ([2**20 + 1, 0], "would take more than the data section's 1048576 bytes"),
    ("4x6", "must be a list"),
])
def test_bad_shape(tmp_path, shape, match):
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update({"shape": shape})),
            match)


def _offsets(name: str, fn):
    def edit(h):
        h[name]["data_offsets"] = fn(h[name]["data_offsets"], h)

    return edit


def test_offsets_past_end(tmp_path):
    rejects(tmp_path, edited("linear_dynamic", _offsets("linear_dynamic_0.weight", lambda o, h: [o[0], 10**6])),
            r"data_offsets \[\d+, 1000000\] lie outside the data section")


def test_offsets_reversed(tmp_path):
    rejects(tmp_path, edited("linear_dynamic", _offsets("linear_dynamic_0.weight", lambda o, h: [o[1], o[0]])),
            "lie outside the data section")


def test_offsets_negative_or_not_integers(tmp_path):
    rejects(tmp_path, edited("linear_dynamic", _offsets("linear_dynamic_0.weight", lambda o, h: [-1, o[1] - 1])),
            "lie outside")
    rejects(tmp_path, edited("linear_dynamic", _offsets("linear_dynamic_0.weight", lambda o, h: [o[0], float(o[1])])),
            "data_offsets must be two integers")


def test_offsets_overlapping(tmp_path):
    # give the weight the same bytes as the bias: same size (24 bytes) so only the overlap is wrong
    def edit(h):
        w, bias = h["linear_dynamic_0.weight"], h["linear_dynamic_0.bias"]
        w["dtype"], w["shape"] = "F32", [4]
        w["data_offsets"] = list(bias["data_offsets"])

    rejects(tmp_path, edited("linear_dynamic", edit), "and 'linear_dynamic_0.*overlap")


def test_byte_length_disagrees_with_shape(tmp_path):
    # the packed weight: [4, 2, 16, 4], 512 bytes
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update(
        {"shape": [4, 2, 16, 3]})), r"holds 512 bytes but shape \[4, 2, 16, 3\] of I8 needs 384")
    # a plain one (version 3)
    rejects(tmp_path, edited_v3("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update({"shape": [4, 5]})),
            r"holds 24 bytes but shape \[4, 5\] of I8 needs 20")


def test_tensor_entry_malformed(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h.update({"t": {"dtype": "U8", "shape": [0]}})),
            "tensor 't': entry must have exactly dtype, shape and data_offsets")
    rejects(tmp_path, edited("relu", lambda h: h.update({"t": [1]})), "entry must have exactly")


def test_tensor_name_too_long(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h.update({"n" * 257: {"dtype": "U8", "shape": [0],
                                                                      "data_offsets": [0, 0]}})),
            "a tensor name must have 1 to 256 characters, has 257")


def test_checksum_mismatch(tmp_path):
    header, body = split(seed_files()["linear_dynamic"])
    body = body[:-1] + bytes([body[-1] ^ 1])
    rejects(tmp_path, join(header, body),
            "data section checksum mismatch: header says xxh64-1m:[0-9a-f]{16}, data hashes to xxh64-1m:[0-9a-f]{16}")
    header, body = split(v3("linear_dynamic"))
    body = body[:-1] + bytes([body[-1] ^ 1])
    rejects(tmp_path, join(header, body),
            "data section checksum mismatch: header says [0-9a-f]{64}, data hashes to [0-9a-f]{64}")


def test_checksum_malformed(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update(
        {"qrt.data_checksum": h["__metadata__"]["qrt.data_checksum"].upper()}), fix_checksum=False),
        "qrt.data_checksum must be 'xxh64-1m:' and 16 lowercase hex digits")
    rejects(tmp_path, edited_v3("relu", lambda h: h["__metadata__"].update(
        {"qrt.data_sha256": h["__metadata__"]["qrt.data_sha256"].upper()}), fix_checksum=False),
        "qrt.data_sha256 must be 64 lowercase hex digits")


def test_data_after_tensors_is_covered_by_the_checksum(tmp_path):
    for data in (seed_files()["relu"], seed_files()["linear"], v3("linear")):
        rejects(tmp_path, data + b"trailing", "checksum mismatch")


def test_directory_and_fifo_are_refused(tmp_path):
    with pytest.raises(qrt.FormatError, match="not a regular file"):
        qformat.load_file(tmp_path)
    fifo = tmp_path / "pipe.qrt"
    os.mkfifo(fifo)
    with pytest.raises(qrt.FormatError, match="not a regular file"):  # and no hang waiting for a writer
        qformat.load_file(fifo)


def test_missing_file_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        qformat.load_file(tmp_path / "absent.qrt")


# ------------------------------------------------------------------ the graph


def test_graph_malformed_json(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.graph": "{"})), "graph: malformed JSON")


def test_graph_duplicate_key(tmp_path):
    def edit(h):
        h["__metadata__"]["qrt.graph"] = h["__metadata__"]["qrt.graph"][:-1] + ', "outputs": []}'

    rejects(tmp_path, edited("relu", edit), "graph: duplicate JSON key 'outputs'")


def test_graph_not_an_object(tmp_path):
    rejects(tmp_path, edited("relu", lambda h: h["__metadata__"].update({"qrt.graph": "[]"})),
            "graph: graph: must be a JSON object, got list")


def test_graph_unknown_key(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g.update({"version": 2})), r"unknown key\(s\) \['version'\]")


def test_graph_missing_key(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g.pop("output_structure")),
            r"missing key\(s\) \['output_structure'\]")


def test_node_unknown_key(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0].update({"device": "gpu"})),
            r"nodes\[0\]: unknown key\(s\) \['device'\]")


def test_unknown_op(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0].update({"op": "conv2d"})),
            "node 'relu_0': unknown op 'conv2d'")


def test_unknown_port(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0]["inputs"].update({"y": "x"})),
            r"node 'relu_0' \(relu\): unknown input 'y'; relu takes \['x'\]")


def test_missing_port(tmp_path):
    rejects(tmp_path, graph_edited("add", lambda g: g["nodes"][0]["inputs"].pop("b")),
            r"node 'add_0' \(add\): missing input 'b'")


def test_wrong_output_count(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0].update({"outputs": ["a", "b"]})),
            r"relu has 1 output\(s\), got 2")


def test_undefined_value(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0]["inputs"].update({"x": "nowhere"})),
            "input 'x' refers to undefined value 'nowhere'")
    rejects(tmp_path, graph_edited("relu", lambda g: g.update({"outputs": ["nowhere"]})),
            "outputs: refers to undefined value 'nowhere'")


def test_bad_value_name(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0]["inputs"].update({"x": "v" * 257})),
            "a name must be a string of 1 to 256 characters")
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0]["inputs"].update({"x": 3})),
            "a name must be a string")


def test_duplicate_value_names(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0].update({"outputs": ["x"]})),
            "value 'x' is already defined as input 'x'")
    rejects(tmp_path, graph_edited("linear_dynamic", lambda g: g["nodes"][0].update(
        {"outputs": ["linear_dynamic_0.bias"]})), "already defined as tensor 'linear_dynamic_0.bias'")
    rejects(tmp_path, graph_edited("relu", lambda g: g["inputs"].append(dict(g["inputs"][0]))),
            "value 'x' is already defined as input 'x'")


def test_duplicate_node_names(tmp_path):
    def edit(g):
        n = dict(g["nodes"][0])
        n["outputs"] = ["other"]
        g["nodes"].append(n)

    rejects(tmp_path, graph_edited("relu", edit), "node 'relu_0': duplicate node name")


def test_cycle(tmp_path):
    def edit(g):
        first = dict(g["nodes"][0], name="r1", outputs=["y1"])
        first["inputs"] = {"x": "y2"}
        second = dict(g["nodes"][0], name="r2", outputs=["y2"])
        second["inputs"] = {"x": "y1"}
        g["nodes"] = [first, second]
        g["outputs"] = ["y2"]

    rejects(tmp_path, graph_edited("relu", edit), r"the graph has a cycle through \['r1', 'r2'\]")
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0]["inputs"].update({"x": "relu_0"})),
            r"cycle through \['relu_0'\]")


def test_bad_attrs_wrong_type(tmp_path):
    rejects(tmp_path, graph_edited("flatten", lambda g: g["nodes"][0]["attrs"].update({"start_dim": True})),
            "attribute 'start_dim' must be int, got True")
    rejects(tmp_path, graph_edited("linear", lambda g: g["nodes"][0]["attrs"].update({"relu": 1})),
            "attribute 'relu' must be bool, got 1")


def _node_attr(name: str, attr: str, json_text: str):
    """A graph edit setting a node's attribute to a JSON number as written (json.dumps writes no 10**400)."""
    def edit(h):
        g = get_graph(h)
        next(n for n in g["nodes"] if n["name"] == name)["attrs"][attr] = "NUMBER"
        h["__metadata__"]["qrt.graph"] = json.dumps(g).replace('"NUMBER"', json_text)

    return edit


@pytest.mark.parametrize("seed, name, attr, text, match", [
    # integers a C reader cannot hold are refused wherever they stand; torch's widest is 2**63 - 1
    ("tensor_ops", "slice_1", "end", str(10**20), "graph: integer 100000000000000000000 does not fit in 64 bits"),
    ("tensor_ops", "select_0", "index", str(-(2**63) - 1), "integer -9223372036854775809 does not fit in 64 bits"),
    # clamp's bounds are finite float32 values: 10**400 raised OverflowError, -1e400 (-inf) was taken
    ("masks", "clamp_12", "min", str(10**400), "integer 1000000000000.* does not fit in 64 bits"),
    ("masks", "clamp_12", "min", "-1e400", r"min must be a finite float32 value, got -inf"),
    ("masks", "clamp_12", "max", "1e39", r"max must be a finite float32 value, got 1e\+39"),
    # expand's entries are checked where like_dims names a dimension too
    ("masks", "expand_17", "shape", "[-5, -1]", r"shape entries must be sizes >= 0 or -1 \(x's size\), got -5"),
])
def test_bad_attr_numbers(tmp_path, seed, name, attr, text, match):
    rejects(tmp_path, edited(seed, _node_attr(name, attr, text)), match)


def test_computed_dimension_past_int64_refused(tmp_path):
    """flatten of [2**62, 4, 3] gave a dimension of 3 * 2**64: a C reader's int64 cannot hold it."""
    def edit(g):
        g["inputs"][0]["shape"] = [2, 2**62, 12]

    rejects(tmp_path, graph_edited("flatten", edit), r"node 'flatten_0' \(flatten\): output 'flatten_0' would have "
                                                     r"shape \[2, 55340232221128654848\], a dimension over 2\*\*63 - 1")


@pytest.mark.parametrize("name", ["b\\u0000c", "\\ud800", "x\\udc00y"])
def test_names_a_c_reader_cannot_hold_refused(tmp_path, name):
    """U+0000 ends a C string ('b\\u0000c' would read as 'b'); a lone surrogate has no UTF-8 form. Refused in
    the graph's names and in the header's."""
    def in_graph(h):
        h["__metadata__"]["qrt.graph"] = h["__metadata__"]["qrt.graph"].replace('"relu_0"', f'"{name}"')

    rejects(tmp_path, edited("relu", in_graph), r"graph: string .* holds U\+0000 or an unpaired surrogate")
    raw = json.loads(f'"{name}"')

    def in_header(h):
        h[raw] = h.pop(next(k for k in h if k != "__metadata__"))

    rejects(tmp_path, edited("linear", in_header), r"header: string .* holds U\+0000 or an unpaired surrogate")


def test_bad_attrs_axis_out_of_range(tmp_path):
    rejects(tmp_path, graph_edited("quantize_per_channel", lambda g: g["nodes"][0]["attrs"].update({"axis": 2})),
            "axis 2 is out of range for x of rank 2")
    rejects(tmp_path, graph_edited("dequantize_per_channel", lambda g: g["nodes"][0]["attrs"].update({"axis": -1})),
            "axis -1 is out of range")
    rejects(tmp_path, graph_edited("flatten", lambda g: g["nodes"][0]["attrs"].update({"start_dim": 3})),
            "start_dim 3 is out of range for x of rank 3")


def test_bad_attrs_choice(tmp_path):
    rejects(tmp_path, graph_edited("quantize_per_tensor", lambda g: g["nodes"][0]["attrs"].update(
        {"dtype": "quint16"})), r"attribute 'dtype' must be one of \['quint8', 'qint8', 'qint32'\], got 'quint16'")
    rejects(tmp_path, graph_edited("rnn_cell_dynamic", lambda g: g["nodes"][0]["attrs"].update(
        {"nonlinearity": "sigmoid"})), "attribute 'nonlinearity' must be one of")


def test_bad_attrs_unknown_and_missing(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["nodes"][0].update({"attrs": {"inplace": True}})),
            "unknown attribute 'inplace'")
    rejects(tmp_path, graph_edited("quantize_per_channel", lambda g: g["nodes"][0]["attrs"].pop("axis")),
            "missing attribute 'axis'")


@pytest.mark.parametrize("bad", [0.0, -0.0, -0.5, float("nan"), float("inf"), float("-inf"), 1e-45, 5e-39])
@pytest.mark.parametrize("seed,name", [
    ("quantize_per_tensor", "quantize_per_tensor_0.scale"),
    ("quantize_per_channel", "quantize_per_channel_0.scale"),
    ("linear", "linear_0.weight_scale"),
    ("linear", "linear_0.y_scale"),
    ("rnn_cell_dynamic", "rnn_cell_dynamic_0.ih_weight_scale"),
])
def test_bad_scale(tmp_path, bad, seed, name):
    def edit(h):
        body = split(seed_files()[seed])[1]
        size = int(np.prod(h[name]["shape"]))
        vals = np.full(size, 0.1, np.float32)
        vals[-1] = bad
        return set_tensor(h, body, name, vals)

    port = name.split(".", 1)[1]
    rejects(tmp_path, edited(seed, edit), f"{port} must be finite and > 0")


@pytest.mark.parametrize("x_scale,y_scale", [(1e-30, 1e30), (1e30, 1e-30)])
def test_linear_requantization_multiplier_must_fit_float32(tmp_path, x_scale, y_scale):
    def edit(h):
        body = split(seed_files()["linear"])[1]
        body = set_tensor(h, body, "linear_0.x_scale", np.full(1, x_scale, np.float32).reshape(()))
        return set_tensor(h, body, "linear_0.y_scale", np.full(1, y_scale, np.float32).reshape(()))

    rejects(tmp_path, edited("linear", edit), "over- or underflows float32")


@pytest.mark.parametrize("seed,name,bad,rng", [
    ("quantize_per_tensor", "quantize_per_tensor_0.zero_point", 256, r"\[0, 255\] for uint8"),
    ("quantize_per_tensor", "quantize_per_tensor_0.zero_point", -1, r"\[0, 255\] for uint8"),
    ("quantize_per_channel", "quantize_per_channel_0.zero_point", 128, r"\[-128, 127\] for int8"),
    ("linear", "linear_0.weight_zero_point", -129, r"\[-128, 127\] for int8"),
    ("dequantize", "dequantize_0.zero_point", 300, r"\[0, 255\] for uint8"),
])
def test_zero_point_out_of_range(tmp_path, seed, name, bad, rng):
    def edit(h):
        body = split(seed_files()[seed])[1]
        return set_tensor(h, body, name, np.full(int(np.prod(h[name]["shape"])), bad, np.int32))

    rejects(tmp_path, edited(seed, edit), f"zero_point must lie in {rng}")


def test_wrong_weight_shape(tmp_path):
    # a consistent [6, 4] weight where [4, 6] is needed: x has 6 features
    rejects(tmp_path, edited_v3("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update({"shape": [6, 4]})),
            "x's last dimension is 6, expected 4|weight_scale|bias must have shape")
    rejects(tmp_path, edited_v3("linear_dynamic", lambda h: h["linear_dynamic_0.weight"].update({"shape": [24]})),
            r"weight must be 2-D \[out, in\], got int8\[24\]")
    # packed: a [6, 4] matrix stored packed (and its 6 row sums), where [4, 6] is needed
    meta, arrays = stored_arrays(seed_files()["linear_dynamic"])
    p = pack(np.ones((6, 4), np.int8))
    arrays["linear_dynamic_0.weight"] = p.data
    arrays["linear_dynamic_0.weight.row_sums"] = p.row_sums
    packed = json.loads(meta["qrt.packed"])
    packed["linear_dynamic_0.weight"]["shape"] = [6, 4]
    meta["qrt.packed"] = json.dumps(packed)
    rejects(tmp_path, build_file(meta, arrays), "x's last dimension is 6, expected 4|weight_scale|bias must have shape")
    # a packed matrix read as plain (no qrt.packed entry): the op sees its stored 4-D shape
    rejects(tmp_path, edited("linear_dynamic", lambda h: h["__metadata__"].pop("qrt.packed")),
            r"weight must be 2-D \[out, in\], got int8\[4, 2, 16, 4\]")


def test_qparam_shape_mismatch(tmp_path):
    rejects(tmp_path, edited("quantize_per_channel", lambda h: h["quantize_per_channel_0.scale"].update(
        {"shape": [2, 2]})), r"scale has shape \[2, 2\] but zero_point has \[4\]")


def test_int8_weight_without_quantization_parameters(tmp_path):
    rejects(tmp_path, graph_edited("linear_dynamic", lambda g: g["nodes"][0]["inputs"].pop("weight_scale")),
            "int8 weight needs weight_scale and weight_zero_point")


def test_wrong_dtype_on_a_port(tmp_path):
    rejects(tmp_path, graph_edited("linear", lambda g: g["nodes"][0]["inputs"].update(
        {"weight": "linear_0.bias"})), r"input 'weight' \('linear_0.bias'\) has dtype float32, expected int8")


def test_const_port_fed_by_a_non_tensor(tmp_path):
    def edit(g):
        g["inputs"].append({"name": "s", "dtype": "float32", "shape": []})
        g["nodes"][0]["inputs"]["scale"] = "s"

    rejects(tmp_path, graph_edited("quantize_per_tensor", edit), r"input 'scale' \('s'\) must be a stored tensor")


def test_bad_input_spec(tmp_path):
    rejects(tmp_path, graph_edited("relu", lambda g: g["inputs"][0].update({"dtype": "float64"})),
            r"inputs\[0\]: dtype must be one of")
    rejects(tmp_path, graph_edited("relu", lambda g: g["inputs"][0].update({"shape": [-1, 3]})),
            r"inputs\[0\].shape: dimensions must be integers in \[0, 2\*\*63 - 1\] or null, got -1")
    rejects(tmp_path, graph_edited("relu", lambda g: g["inputs"][0].update({"shape": [None] * 9})),
            "rank 9 exceeds the maximum of 8")


@pytest.mark.parametrize("structure,outputs,match", [
    ("list", None, "must be 'single', 'tuple' or an array of output indices, got 'list'"),
    (None, None, "must be 'single', 'tuple' or an array of output indices, got None"),
    ("single", ["relu_0", "x"], "'single' needs exactly one output, got 2"),
    ("tuple", [], "a model needs at least one output"),
])
def test_bad_output_structure(tmp_path, structure, outputs, match):
    def edit(g):
        g["output_structure"] = structure
        if outputs is not None:
            g["outputs"] = outputs

    rejects(tmp_path, graph_edited("relu", edit), match)


def test_error_messages_stay_short_for_huge_values(tmp_path):
    data = graph_edited("relu", lambda g: g["nodes"][0].update({"op": "z" * 1_000_000}))
    p = write(tmp_path, data)
    with pytest.raises(qrt.FormatError) as e:
        qformat.load_file(p)
    assert len(str(e.value)) < 1000 and re.search("unknown op 'zzz", str(e.value))


def test_every_seed_model_is_valid(tmp_path):
    for name, data in seed_files().items():
        f = qformat.load_file(write(tmp_path, data, name + ".qrt"))
        assert f.graph.nodes, name


def test_version_7_ops_and_bool_inputs(tmp_path):
    """A graph with a version 7 op or a bool input is written as version 7 and refused, naming what needs it,
    when its header says 6; a graph without them stays version 4 (docs/FORMAT.md section 3)."""
    from qrt.builder import GraphBuilder

    def save(kind: str) -> bytes:
        g = GraphBuilder()
        x = g.input("x", "float32", [None, 4])
        if kind == "bool":
            m = g.input("m", "bool", [None, 4])
            g.output(g.node("logical_not", {"x": m}, name="n"))
        elif kind == "op":
            g.output(g.node("sqrt", {"x": x}, name="s"))
        else:
            g.output(g.node("relu", {"x": x}, name="r"))
        g.save(tmp_path / f"{kind}.qrt")
        return (tmp_path / f"{kind}.qrt").read_bytes()

    save("plain")
    assert qrt.load(tmp_path / "plain.qrt").metadata["qrt.version"] == "4"
    for kind, message in (("op", r"node 's' \(sqrt\): op 'sqrt' needs format version 7, the file says 6"),
                          ("bool", r"inputs\[1\]: dtype bool needs format version 7, the file says 6")):
        data = save(kind)
        assert qrt.load(tmp_path / f"{kind}.qrt").metadata["qrt.version"] == "7"
        (tmp_path / "v6.qrt").write_bytes(data.replace(b'"qrt.version":"7"', b'"qrt.version":"6"', 1))
        with pytest.raises(qrt.FormatError, match=message):
            qrt.load(tmp_path / "v6.qrt")


@pytest.mark.parametrize("op", ["add_int", "sub_int", "mul_int", "cumsum"])
def test_version_9_integer_ops(tmp_path, op):
    """A graph with integer arithmetic is written as version 9 and refused, naming the op, when its header
    says 8; integer comparisons and casts alone stay version 7."""
    from qrt.builder import GraphBuilder

    g = GraphBuilder()
    x = g.input("x", "int32", [None, 4])
    ports = {"x": x} if op == "cumsum" else {"a": x, "b": x}
    g.output(g.node(op, ports, {"dim": 1} if op == "cumsum" else {}, name="n"))
    g.save(tmp_path / "v9.qrt")
    data = (tmp_path / "v9.qrt").read_bytes()
    assert qrt.load(tmp_path / "v9.qrt").metadata["qrt.version"] == "9"
    (tmp_path / "v8.qrt").write_bytes(data.replace(b'"qrt.version":"9"', b'"qrt.version":"8"', 1))
    with pytest.raises(qrt.FormatError, match=rf"node 'n' \({op}\): op '{op}' needs format version 9, the file "
                                              "says 8"):
        qrt.load(tmp_path / "v8.qrt")


@pytest.mark.parametrize("op, version", [("amax", 10), ("batch_norm", 11), ("log", 12), ("sin", 12), ("cos", 12),
                                        ("ceil", 13), ("floor", 13)])
def test_an_op_needs_the_version_that_added_it(tmp_path, op, version):
    """A graph with op is written as the version that added it and refused, naming the op, when its header says the
    one before ("09" for 9: the same length, so the header stays valid)."""
    from qrt.builder import GraphBuilder

    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, 4])}
    if op == "batch_norm":
        ports.update({p: g.tensor(p, np.ones(4, np.float32)) for p in ("mean", "var", "weight", "bias")})
    g.output(g.node(op, ports, {"dims": [1]} if op == "amax" else {}, name="n"))
    g.save(tmp_path / "new.qrt")
    data = (tmp_path / "new.qrt").read_bytes()
    assert qrt.load(tmp_path / "new.qrt").metadata["qrt.version"] == str(version)
    older = f'"qrt.version":"{version - 1:02d}"'.encode()
    (tmp_path / "old.qrt").write_bytes(data.replace(f'"qrt.version":"{version}"'.encode(), older, 1))
    with pytest.raises(qrt.FormatError, match=rf"node 'n' \({op}\): op '{op}' needs format version {version}, "
                                              rf"the file says {version - 1}"):
        qrt.load(tmp_path / "old.qrt")


def test_version_9_reshape_like(tmp_path):
    """reshape with like_dims is written as version 9 and refused, naming the attribute, when its header says 8;
    like_dims without like, or with an entry per shape entry missing, is refused at load; a count that cannot
    match is refused naming the target with like's sizes."""
    from qrt.builder import GraphBuilder

    def save(attrs: dict, like: bool = True) -> str:
        g = GraphBuilder()
        x, q = g.input("x", "float32", [None, 4]), g.input("q", "float32", [None, None, 4])
        g.output(g.node("reshape", {"x": x, **({"like": q} if like else {})}, attrs, name="r"))
        g.save(tmp_path / "r.qrt")
        return tmp_path / "r.qrt"

    path = save({"shape": [1, 1, 4], "like_dims": [0, 1, None]})
    assert qrt.load(path).metadata["qrt.version"] == "9"
    (tmp_path / "v8.qrt").write_bytes(path.read_bytes().replace(b'"qrt.version":"9"', b'"qrt.version":"8"', 1))
    with pytest.raises(qrt.FormatError, match=r"node 'r' \(reshape\): attribute 'like_dims' needs format version 9, "
                                              "the file says 8"):
        qrt.load(tmp_path / "v8.qrt")
    g = GraphBuilder()
    x, q = g.input("x", "float32", [7, 4]), g.input("q", "float32", [2, 3, 4])
    g.output(g.node("reshape", {"x": x, "like": q}, {"shape": [1, 1, 4], "like_dims": [0, 1, None]}, name="r"))
    with pytest.raises(qrt.FormatError, match=r"x float32\[7, 4\] cannot be reshaped to \[2, 3, 4\]"):  # like's sizes
        g.save(tmp_path / "bad.qrt")
    for attrs, like, message in (({"shape": [1, 1, 4], "like_dims": [0, 1, None]}, False, "go together"),
                                 ({"shape": [1, 1, 4], "like_dims": [0, 1]}, True, "one entry per shape entry"),
                                 ({"shape": [1, 1, 4], "like_dims": [0, 3, None]}, True, "out of range"),
                                 ({"shape": [-1, -1, 4], "like_dims": [0, None, None]}, True, None)):
        if message is None:  # a -1 at a like position infers nothing: one -1 left
            assert qrt.load(save(attrs, like)).outputs[0].shape == (None, None, 4)
            continue
        with pytest.raises(qrt.FormatError, match=message):
            qrt.load(save(attrs, like))


def test_writer_refuses_what_the_reader_refuses_and_writes_what_it_reads(tmp_path):
    """The writer runs the reader's JSON and entry rules on what it writes (it had written 64-bit-wide attributes,
    NUL names and metadata the reader then refused). A file whose only stored tensor is empty reads back: the
    zero-size bound leaves 1 MiB to a data section of 0 bytes."""

    def relu(**extra):
        b = GraphBuilder()
        b.output(b.node("relu", {"x": b.input("x", "float32", [None, 3])}))
        for name, value in extra.items():
            b.tensor(name, value)
        return b

    relu(empty=np.zeros((0, 3), np.float32), rows=np.zeros((2**18, 0), np.float32)).save(tmp_path / "ok.qrt")
    assert qrt.load(tmp_path / "ok.qrt").run(np.ones((1, 3), np.float32)).tolist() == [[1, 1, 1]]
    with pytest.raises(ValueError, match=r"would take more than the data section's 1048576 bytes"):
        relu(rows=np.zeros((2**18 + 1, 0), np.float32)).save(tmp_path / "big.qrt")
    with pytest.raises(ValueError, match=r"header: string 'b\\x00c' holds U\+0000"):
        relu(**{"b\x00c": np.ones(2, np.float32)}).save(tmp_path / "nul.qrt")
    with pytest.raises(ValueError, match=r"header: string .* holds U\+0000"):
        relu().save(tmp_path / "meta.qrt", metadata={"note": "a\x00b"})
    b = GraphBuilder()
    b.output(b.node("slice", {"x": b.input("x", "int32", [None, 3])}, {"dim": 1, "start": 0, "end": 10**20}))
    with pytest.raises(ValueError, match="graph: integer 100000000000000000000 does not fit in 64 bits"):
        b.save(tmp_path / "wide.qrt")
    assert not any(p.name != "ok.qrt" for p in tmp_path.iterdir())  # nothing left of a refused write

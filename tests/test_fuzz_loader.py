"""Bounded fuzzing of the loader: hostile files load and run, or raise qrt.FormatError; nothing else.

The generators live in tests/fuzz_cases.py and are shared with the long run
(tools/fuzz_loader.py, 100,000+ cases). Here: a few thousand derandomized
hypothesis cases, every truncation of one file, and checks that a number in a
header never drives an allocation.
"""

from __future__ import annotations

import json
import random
import struct
import time
import tracemalloc

import pytest
from fuzz_cases import (
    BYTE_MUTATIONS,
    HEADER_EDITS,
    check_case,
    e_metadata,
    e_packed,
    get_graph,
    join,
    make_case,
    seed_files,
    set_graph,
    split,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qrt
from qrt import format as qformat
from qrt.ops import OPS


@pytest.fixture(scope="module")
def case_path(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("fuzz") / "case.qrt")


def test_seed_models_cover_every_op_and_run(case_path):
    ops = set()
    for name, data in seed_files().items():
        assert check_case(data, case_path, random.Random(0)) == "loaded and ran", name
        ops |= {n["op"] for n in get_graph(split(data)[0])["nodes"]}
    assert ops == set(OPS)


@settings(
    max_examples=3000,
    deadline=None,
    derandomize=True,  # the same cases on every run: CI stays stable
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**64 - 1))
def test_hostile_files_load_and_run_or_raise_format_error(seed, case_path):
    # A seeded random.Random, not st.randoms(): the generators make many draws whose count depends
    # on the file, and a plain seed replays exactly (tools/fuzz_loader.py uses the same generators).
    rnd = random.Random(seed)
    desc, data = make_case(rnd)
    try:
        check_case(data, case_path, rnd)
    except AssertionError as e:
        raise AssertionError(f"case seed {seed} ({desc}): {e}") from e


def test_seeds_hold_packed_version_4_files_and_version_3_files(case_path):
    """The fuzzer starts from files of version 4 (and 7, 8 or 9 where a seed uses their ops) with int8 and float packed
    matrices, and from version 3 files (plain weights, sha256); join(fix_checksum=True) writes the checksum each
    version calls for."""
    packed_kinds, versions = set(), set()
    for name, data in seed_files().items():
        header, body = split(data)
        meta = header["__metadata__"]
        versions.add(meta["qrt.version"])
        if int(meta["qrt.version"]) >= 4:
            assert "qrt.data_sha256" not in meta and meta["qrt.data_checksum"] == qformat.data_checksum(body), name
            for spec in json.loads(meta.get("qrt.packed", "{}")).values():
                packed_kinds.add("int8" if "row_sums" in spec else "float")
        else:
            assert "qrt.packed" not in meta and "qrt.data_checksum" not in meta, name
        meta.pop("qrt.data_checksum", None)
        meta.pop("qrt.data_sha256", None)
        assert check_case(join(header, body, fix_checksum=True), case_path, random.Random(0)) == "loaded and ran"
    assert packed_kinds == {"int8", "float"}
    assert {"3", "4"} <= versions <= {"3", "4", "7", "8", "9", "10", "11", "12", "13"}


def test_packed_and_checksum_edits_reach_their_checks(case_path):
    """e_packed's edits reach the qrt.packed checks behind the checksum (rather than all failing earlier), and
    e_metadata's checksum edits reach the checksum checks of both versions."""
    rnd = random.Random(3)
    messages = set()
    for seed in ("lstm_dynamic", "linear", "linear_float", "relu", "v3_linear"):
        for _ in range(150):
            for edit in (e_packed, e_metadata):
                header, body = split(seed_files()[seed])
                try:
                    edit(rnd, header, body)
                except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                    continue
                data = join(header, body, fix_checksum=edit is e_packed)
                with open(case_path, "wb") as f:
                    f.write(data)
                try:
                    qformat.load_file(case_path)
                except qrt.FormatError as e:
                    messages.add(str(e).split(",")[0][:60])
    reached = {m for m in messages if m.startswith("qrt.packed")}
    assert len(reached) >= 8, sorted(messages)
    assert any("qrt.packed needs format version 4" in m for m in messages)
    assert any("qrt.data_checksum must be" in m for m in messages)
    assert any("qrt.data_sha256 must be" in m for m in messages)
    assert any("checksum mismatch" in m for m in messages)


def test_every_mutation_kind_is_exercised():
    """The generators stay honest: each mutation runs without crashing the harness itself."""
    rnd = random.Random(5)
    header, body = split(seed_files()["chain"])
    for edit in HEADER_EDITS:
        for _ in range(20):
            h = json.loads(json.dumps(header))
            try:
                edit(rnd, h, body)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                pass
    for m in BYTE_MUTATIONS:
        assert isinstance(m(rnd, seed_files()["chain"]), bytes)


def test_every_truncation_is_a_format_error(case_path):
    data = seed_files()["linear"]
    for n in range(len(data)):
        with open(case_path, "wb") as f:
            f.write(data[:n])
        with pytest.raises(qrt.FormatError):
            qformat.load_file(case_path)


@pytest.mark.parametrize("seed", sorted(seed_files()))
def test_region_boundary_truncations(seed, case_path):
    data = seed_files()[seed]
    (n,) = struct.unpack("<Q", data[:8])
    cuts = {0, 1, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, len(data) - 1}
    for cut in sorted(c for c in cuts if c < len(data)):  # ops without tensors end with the header
        with open(case_path, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(qrt.FormatError):
            qformat.load_file(case_path)


def _peak_bytes_loading(path: str) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    err = None
    try:
        qformat.load_file(path)
    except qrt.FormatError as e:
        err = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, err


def _with_tensor(entry: dict) -> bytes:
    header, body = split(seed_files()["relu"])
    header["big"] = entry
    return join(header, body, fix_checksum=True)


@pytest.mark.parametrize("what,data,loads", [
    ("a 2**60-element tensor", _with_tensor({"dtype": "F32", "shape": [2**30, 2**30], "data_offsets": [0, 2**62]}),
     False),
    ("2**60 elements with a consistent byte length",
     _with_tensor({"dtype": "U8", "shape": [2**30, 2**30], "data_offsets": [0, 2**60]}), False),
    # refused: a kernel given it would allocate in proportion to 2**60 (a packed weight's row sums)
    ("an empty tensor with huge dimensions", _with_tensor({"dtype": "U8", "shape": [0, 2**60],
                                                           "data_offsets": [0, 0]}), False),
    ("a header length of 99,999,999", struct.pack("<Q", 99_999_999) + b"{}", False),
    ("a header length of 2**64 - 1", struct.pack("<Q", 2**64 - 1) + b"{}", False),
])
def test_header_numbers_do_not_drive_allocation(what, data, loads, case_path):
    with open(case_path, "wb") as f:
        f.write(data)
    t0 = time.perf_counter()
    peak, err = _peak_bytes_loading(case_path)
    assert time.perf_counter() - t0 < 2, f"{what}: slow to load or fail"
    assert (err is None) == loads, f"{what}: {err}"
    assert peak < 2_000_000, f"{what}: loader allocated {peak} bytes"


def test_graph_input_with_huge_fixed_dimensions_loads_without_allocating(case_path):
    header, body = split(seed_files()["relu"])
    g = get_graph(header)
    g["inputs"][0]["shape"] = [2**40, 2**22]
    set_graph(header, g)
    with open(case_path, "wb") as f:
        f.write(join(header, body))
    tracemalloc.start()
    try:
        model = qrt.load(case_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert model.inputs[0].shape == (2**40, 2**22)
    assert peak < 2_000_000

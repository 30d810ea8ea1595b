"""The .qrt container: a safetensors file whose metadata carries the graph.

Layout (docs/FORMAT.md is the specification):

    u64 little-endian N | N bytes of JSON header | data section

The header maps tensor names to {dtype, shape, data_offsets} and holds
``__metadata__``, a string-to-string map with ``qrt.version``,
``qrt.producer``, ``qrt.data_checksum`` (``qrt.data_sha256`` before version 4),
``qrt.graph`` (the graph as JSON) and, from version 4, ``qrt.packed``: the weight
matrices stored in the kernels' packed layout (qrt/layout.py) and their row sums.

``load_file`` maps the file read-only and validates everything in one pass
before returning: the returned tensors are views of the mapping (copied only
when misaligned; a packed matrix is a PackedMatrix over its view), and the graph
is fully checked (``qrt.graph``). The kernels read packed weights where they lie.
``save`` writes through a temporary file and a rename, so a reader never
sees a partial file.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import stat
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .errors import FormatError
from .graph import INPUT_DTYPE_SINCE, Graph, node_needs, parse_graph
from .layout import PACKED_DTYPES, PackedMatrix, pack, packed_shape
from .ops import OPS, ValueInfo

FORMAT_VERSION = 4  # what writers write, unless the graph needs a later version (written_version)
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
PACKED_SINCE = 4  # weights stored packed, the xxh64 checksum
MAX_HEADER_BYTES = 100_000_000  # as safetensors: a header claiming more is refused unread
HEADER_ALIGN = 64  # the data section starts on a cache line; packed weights come first in it
MAX_JSON_DEPTH = 64  # deeper JSON is refused: no legitimate header needs it, and repr/recursion stay bounded
MAX_RANK = 8
MAX_NAME = 256
EMPTY_TENSOR_BOUND = 2**20  # bytes a zero-size tensor may describe in a data section smaller than this
_VERSION_RE = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() accepts '¹', which int() refuses
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHECKSUM_RE = re.compile(r"xxh64-1m:[0-9a-f]{16}")

# safetensors dtype code <-> numpy dtype (always little-endian on disk)
DTYPES = {
    "I8": np.dtype("int8"),
    "U8": np.dtype("uint8"),
    "I32": np.dtype("<i4"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),  # version 2: per-channel scales as torch holds them (docs/FORMAT.md)
}
# dtype codes added after version 1 -> the version that added them (an older file may not use them)
DTYPE_SINCE = {"F64": 2}
CODES = {dt.name: code for code, dt in DTYPES.items()}

META_VERSION = "qrt.version"
META_PRODUCER = "qrt.producer"
META_CHECKSUM = "qrt.data_checksum"  # version 4: "xxh64-1m:" and 16 hex digits (data_checksum)
META_SHA256 = "qrt.data_sha256"  # versions 1 to 3: sha256 of the data section
META_GRAPH = "qrt.graph"
META_PACKED = "qrt.packed"
RESERVED_META = (META_VERSION, META_PRODUCER, META_CHECKSUM, META_SHA256, META_GRAPH, META_PACKED)


def data_checksum(data: bytes | memoryview | mmap.mmap) -> str:
    """The version 4 checksum of a data section: XXH64 of each 1 MiB block, then XXH64 of those
    digests (docs/FORMAT.md), computed in C on the module's threads with the GIL released."""
    from . import _kernels

    return f"xxh64-1m:{_kernels.data_checksum(data):016x}"


def stored_checksum(metadata: Mapping[str, str]) -> str:
    """The data checksum a file's header states, of whichever version."""
    return metadata[META_CHECKSUM] if META_CHECKSUM in metadata else metadata[META_SHA256]


def _sha256(data: bytes | memoryview) -> str:
    import hashlib  # versions 1 to 3 only: not imported unless such a file is read

    return hashlib.sha256(data).hexdigest()


class QrtFile(NamedTuple):
    """A validated .qrt file: its graph, its tensors (views of the mapping), its metadata."""

    graph: Graph
    tensors: Mapping[str, np.ndarray]
    metadata: Mapping[str, str]
    version: int


def _no_duplicate_keys(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate JSON key {k!r:.80}")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (RFC 8259) and C readers do not.
    raise FormatError(f"non-standard JSON constant {name}")


def _int64(text: str) -> int:
    # A C reader holds JSON integers in 64 bits: a wider one is refused wherever it stands (by its length first:
    # int() refuses a literal of over 4300 digits with an error of its own).
    v = int(text) if len(text.lstrip("-")) <= 19 else 2**63
    if not -(2**63) <= v < 2**63:
        raise FormatError(f"integer {text:.40} does not fit in 64 bits")
    return v


_UNREADABLE_IN_C = re.compile("[\x00\ud800-\udfff]")  # NUL ends a C string; a lone surrogate has no UTF-8


def _unreadable_string(obj: Any) -> str | None:
    """The first string (key or value) in obj holding U+0000 or a lone surrogate, if any (iterative)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if _UNREADABLE_IN_C.search(o):
                return o
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return None


def _depth_at_most(obj: Any, limit: int) -> bool:
    """Whether obj nests no more than limit arrays/objects deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = o.values()
        elif not isinstance(o, list):
            continue
        if d > limit:
            return False
        stack.extend((c, d + 1) for c in o if isinstance(c, (dict, list)))
    return True


# Only text with 19 digits in a row can hold an integer past 64 bits, and only text with these escapes a string a C
# reader cannot hold: the slower checks (an integer parsed in Python each, every string walked: 1.4 ms for a
# MiniLM's header and graph) run where those occur, found in 0.05 ms.
_DIGITS_AS_HASHES = str.maketrans("0123456789", "#" * 10)
_ESCAPED_NUL_OR_SURROGATE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def _parse_json(text: str, what: str) -> Any:
    wide = {"parse_int": _int64} if "#" * 19 in text.translate(_DIGITS_AS_HASHES) else {}
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants, **wide)
    except FormatError as e:
        raise FormatError(f"{what}: {e}") from None
    except RecursionError:
        raise FormatError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, and integers longer than Python's digit limit
        raise FormatError(f"{what}: malformed JSON ({e})") from None
    if not _depth_at_most(obj, MAX_JSON_DEPTH):
        raise FormatError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    bad = _unreadable_string(obj) if "\\u" in text and _ESCAPED_NUL_OR_SURROGATE.search(text) else None
    if bad is not None:
        raise FormatError(f"{what}: string {bad!r:.80} holds U+0000 or an unpaired surrogate")
    return obj


def _tensor_entry(name: str, entry: Any, data_len: int, version: int) -> tuple[np.dtype, tuple, int, int]:
    where = f"tensor {name!r:.80}"
    if not 0 < len(name) <= MAX_NAME:
        raise FormatError(f"{where}: a tensor name must have 1 to {MAX_NAME} characters, has {len(name)}")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise FormatError(f"{where}: entry must have exactly dtype, shape and data_offsets")
    code = entry["dtype"]
    if not isinstance(code, str) or code not in DTYPES:
        raise FormatError(f"{where}: unsupported dtype {code!r:.40}; supported: {sorted(DTYPES)}")
    if DTYPE_SINCE.get(code, 1) > version:
        raise FormatError(f"{where}: dtype {code} needs format version {DTYPE_SINCE[code]}, the file says {version}")
    shape = entry["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise FormatError(f"{where}: shape must be a list of at most {MAX_RANK} dimensions")
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise FormatError(f"{where}: shape dimensions must be non-negative integers, got {d!r:.40}")
    code_size = DTYPES[code].itemsize
    # A zero-size tensor passes the byte-length check whatever its other dimensions are, and kernels allocate
    # in proportion to them (a packed weight's row sums): they are bounded by the data section (or 1 MiB).
    if 0 in shape and math.prod(d for d in shape if d) * code_size > max(data_len, EMPTY_TENSOR_BOUND):
        raise FormatError(f"{where}: shape {shape} of {code} would take more than the data section's "
                          f"{max(data_len, EMPTY_TENSOR_BOUND)} bytes were its zero dimensions 1")
    offsets = entry["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise FormatError(f"{where}: data_offsets must be two integers [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise FormatError(
            f"{where}: data_offsets [{begin}, {end}] lie outside the data section of {data_len} bytes"
        )
    dtype = DTYPES[code]
    # Python integers: a hostile shape cannot overflow this product.
    nbytes = math.prod(shape) * code_size
    if end - begin != nbytes:
        raise FormatError(
            f"{where}: holds {end - begin} bytes but shape {shape} of {code} needs {nbytes}"
        )
    return dtype, tuple(shape), begin, end


def _view(buf: mmap.mmap, data_start: int, dtype: np.dtype, shape: tuple, begin: int) -> np.ndarray:
    count = math.prod(shape)
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=data_start + begin).reshape(shape)
    # Kernels read whole elements; a misaligned tensor from a foreign writer is copied once.
    return arr if arr.flags.aligned else arr.copy()


def load_file(path: str | os.PathLike, verify: bool = True) -> QrtFile:
    """Map and validate a .qrt file. Raises FormatError naming any problem.

    verify: check the data section against the header's checksum (one pass over the file, in C on
    every thread). verify=False skips only that, for a file checked before (on install, say): every
    other check still runs, and no kernel reads a byte outside its tensor whatever the data holds.
    I/O failures (a missing file, no permission) raise OSError as usual.
    """
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{os.fspath(path)!r} is not a regular file")
        size = st.st_size
        if size < 8:
            raise FormatError(f"file is {size} bytes, too short for the 8-byte header length")
        populate = getattr(mmap, "MAP_POPULATE", 0) if verify else 0  # the checksum reads every page: map them
        if populate:  # all at once (Linux), not one fault at a time; 12-14 ms for 100 MB where faults took 10-25
            buf = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
        else:
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)  # the mapping keeps the file alive
    try:
        return _validate(buf, size, verify)
    except BaseException:
        try:
            buf.close()  # release the mapping now rather than at garbage collection
        except BufferError:
            pass  # views were made before the failure; they free it when the traceback goes
        raise


def _validate(buf: mmap.mmap, size: int, verify: bool) -> QrtFile:
    (header_len,) = struct.unpack("<Q", buf[:8])
    if header_len > MAX_HEADER_BYTES:
        raise FormatError(f"header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + header_len > size:
        raise FormatError(f"header length {header_len} runs past the end of the {size}-byte file")
    try:
        text = buf[8 : 8 + header_len].decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"header: not valid UTF-8 ({e})") from None
    header = _parse_json(text, "header")
    if not isinstance(header, dict):
        raise FormatError(f"header: must be a JSON object, got {type(header).__name__}")

    meta = header.pop("__metadata__", None)
    if meta is None:
        raise FormatError("header: no __metadata__ object: not a .qrt file")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError("header: __metadata__ must be an object whose values are strings")
    version_text = meta.get(META_VERSION)
    if version_text is None:
        raise FormatError(f"header: __metadata__ has no {META_VERSION!r}: not a .qrt file")
    if not _VERSION_RE.fullmatch(version_text):
        raise FormatError(f"header: {META_VERSION} {version_text!r:.40} is not a version number")
    version = int(version_text)
    if version > max(SUPPORTED_VERSIONS):
        raise FormatError(
            f"format version {version} is newer than this qrt reads ({list(SUPPORTED_VERSIONS)}):"
            " upgrade qrt to load this file"
        )
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(f"format version {version} is not supported (this qrt reads {list(SUPPORTED_VERSIONS)})")
    checksum_key, checksum_re, checksum = (
        (META_CHECKSUM, _CHECKSUM_RE, data_checksum) if version >= PACKED_SINCE else (META_SHA256, _SHA256_RE, _sha256)
    )
    for key in (META_PRODUCER, checksum_key, META_GRAPH):
        if key not in meta:
            raise FormatError(f"header: __metadata__ lacks {key!r}")
    if not checksum_re.fullmatch(meta[checksum_key]):
        what = "'xxh64-1m:' and 16 lowercase hex digits" if version >= PACKED_SINCE else "64 lowercase hex digits"
        raise FormatError(f"header: {checksum_key} must be {what}, got {meta[checksum_key]!r:.80}")
    if META_PACKED in meta and version < PACKED_SINCE:
        raise FormatError(f"header: {META_PACKED} needs format version {PACKED_SINCE}, the file says {version}")

    data_start = 8 + header_len
    data_len = size - data_start
    entries = {name: _tensor_entry(name, entry, data_len, version) for name, entry in header.items()}
    spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items())
    # Sorted by start, any overlap shows between neighbours.
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"tensors {n0!r} [{b0}, {e0}] and {n1!r} [{b1}, {e1}] overlap")

    packed = _packed_entries(meta[META_PACKED], entries) if META_PACKED in meta else {}

    if verify:
        digest = checksum(memoryview(buf)[data_start:])
        if digest != meta[checksum_key]:
            raise FormatError(
                f"data section checksum mismatch: header says {meta[checksum_key]}, data hashes to {digest}"
            )

    tensors = {
        name: _view(buf, data_start, dtype, shape, begin) for name, (dtype, shape, begin, _) in entries.items()
    }
    row_sums_of = {}  # the row sums are the kernels' alone: the graph may neither read nor redefine them
    for name, (shape, row_sums) in packed.items():
        tensors[name] = PackedMatrix(tensors[name], shape, None if row_sums is None else tensors.pop(row_sums))
        if row_sums is not None:
            row_sums_of[row_sums] = name
    infos = {name: ValueInfo(t.dtype.name, t.shape) for name, t in tensors.items()}
    graph = parse_graph(_parse_json(meta[META_GRAPH], "graph"), infos, tensors, version, row_sums_of)
    return QrtFile(graph, tensors, dict(meta), version)


def _packed_entries(text: str, entries: Mapping[str, tuple]) -> dict[str, tuple[tuple[int, int], str | None]]:
    """Check the qrt.packed map: name -> {"shape": [n, k]} and, for int8, "row_sums": an int32 [n]
    tensor of its own. Returns name -> ((n, k), row sums' name or None)."""
    obj = _parse_json(text, META_PACKED)
    if not isinstance(obj, dict):
        raise FormatError(f"{META_PACKED}: must be a JSON object, got {type(obj).__name__}")
    out: dict[str, tuple[tuple[int, int], str | None]] = {}
    sums_of: dict[str, str] = {}
    for name, spec in obj.items():
        where = f"{META_PACKED}: tensor {name!r:.80}"
        if name not in entries:
            raise FormatError(f"{where} is not in the header")
        dtype, stored = entries[name][0], entries[name][1]
        if dtype not in PACKED_DTYPES:
            raise FormatError(f"{where}: only int8, float16 and float32 matrices are packed, this one is {dtype}")
        keys = {"shape", "row_sums"} if dtype == np.int8 else {"shape"}
        if not isinstance(spec, dict) or set(spec) != keys:
            raise FormatError(f"{where}: entry must have exactly {sorted(keys)}")
        shape = spec["shape"]
        if not (
            isinstance(shape, list)
            and len(shape) == 2
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise FormatError(f"{where}: shape must be two non-negative integers [n, k], got {shape!r:.80}")
        n, k = shape
        if stored != packed_shape(dtype, n, k):
            raise FormatError(
                f"{where}: a packed [{n}, {k}] {dtype} matrix is stored as {list(packed_shape(dtype, n, k))},"
                f" the header says {list(stored)}"
            )
        row_sums = spec.get("row_sums")
        if dtype == np.int8:
            if not isinstance(row_sums, str) or row_sums not in entries or row_sums in obj:
                raise FormatError(f"{where}: row_sums must name an unpacked tensor of the header, got {row_sums!r:.80}")
            if row_sums in sums_of:
                raise FormatError(f"{where}: row_sums {row_sums!r} already holds the sums of {sums_of[row_sums]!r}")
            if entries[row_sums][0] != np.int32 or entries[row_sums][1] != (n,):
                got = f"{entries[row_sums][0]} {list(entries[row_sums][1])}"
                raise FormatError(f"{where}: row_sums {row_sums!r} must be int32 [{n}], got {got}")
            sums_of[row_sums] = name
        out[name] = ((n, k), row_sums)
    return out


def _producer() -> str:
    from . import __version__

    return f"qrt {__version__}"


def _packed_uses(graph: Mapping[str, Any], tensors: Mapping[str, Any]) -> set[str]:
    """The tensors to store packed: 2-D int8/float16/float32 ones that only packed ports read."""
    packed, plain = set(), set(graph.get("outputs", ()))
    for node in graph.get("nodes", ()):
        spec = OPS.get(node.get("op"))
        packed_ports = {p.name for p in spec.inputs if p.packed} if spec else set()
        for port, value in node.get("inputs", {}).items():
            (packed if port in packed_ports else plain).add(value)
    return {
        name
        for name in packed - plain
        if name in tensors and np.ndim(tensors[name]) == 2 and getattr(tensors[name], "dtype", None) in PACKED_DTYPES
    }


def _row_sums_name(name: str, taken: Mapping[str, Any]) -> str:
    candidate, i = f"{name}.row_sums", 0
    while candidate in taken or len(candidate) > MAX_NAME:
        candidate, i = f"row_sums.{i}", i + 1
    return candidate


def _storable(name: Any, t: Any) -> np.ndarray:
    """t as the little-endian C-contiguous array it is stored as; refuses what load_file would refuse."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name == "__metadata__":
        raise ValueError(f"tensor name {name!r:.80} must be a string of 1 to {MAX_NAME} characters")
    a = np.asarray(t)
    if a.ndim > MAX_RANK:
        raise ValueError(f"tensor {name!r}: rank {a.ndim} exceeds the maximum of {MAX_RANK}")
    if a.dtype.name not in CODES:
        raise ValueError(f"tensor {name!r}: dtype {a.dtype} is not storable; use one of {sorted(CODES)}")
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return a if a.flags.c_contiguous else a.copy()  # ascontiguousarray would make 0-d 1-d


def encode(
    graph: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray | PackedMatrix],
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    """Serialize a graph (its JSON form) and tensors into .qrt bytes, validating both.

    The weight matrices that only the linear and recurrent ops' weight ports read are stored in
    the kernels' packed layout (qrt/layout.py), with their row sums; everything else as it is.
    """
    to_pack = _packed_uses(graph, tensors)
    packs = {name: t if isinstance(t, PackedMatrix) else pack(t) for name, t in tensors.items() if name in to_pack}
    arrays = {name: _storable(name, p.data) for name, p in packs.items()}
    arrays.update({name: _storable(name, t) for name, t in tensors.items() if name not in packs})
    # refuse to write what cannot be read
    checked = {**arrays, **packs}
    infos = {name: ValueInfo(t.dtype.name, t.shape) for name, t in checked.items()}
    version = written_version(graph)
    parse_graph(_parse_json(json.dumps(graph), "graph"), infos, checked, version)

    packed_meta = {}
    for name, p in sorted(packs.items()):
        packed_meta[name] = {"shape": list(p.shape)}
        if p.row_sums is not None:
            sums = _row_sums_name(name, arrays)
            arrays[sums] = _storable(sums, np.asarray(p.row_sums, np.int32))
            packed_meta[name]["row_sums"] = sums
    # Packed matrices first: each is a whole number of 64-byte lines, so each starts on one. Then the
    # widest items first, so every tensor is naturally aligned with no gaps (safetensors allows none).
    order = sorted(arrays, key=lambda n: (n not in packs, -arrays[n].dtype.itemsize, n))
    entries, offset = {}, 0
    for name in order:
        a = arrays[name]
        entries[name] = {
            "dtype": CODES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    data = b"".join(arrays[name].tobytes() for name in order)

    meta = {k: str(v) for k, v in (metadata or {}).items()}
    clash = [k for k in meta if k in RESERVED_META]
    if clash:
        raise ValueError(f"metadata keys {clash} are reserved for qrt")
    meta.update(
        {
            META_VERSION: str(version),
            META_PRODUCER: meta.pop("producer", None) or _producer(),
            META_CHECKSUM: data_checksum(data),
            META_GRAPH: json.dumps(graph, separators=(",", ":")),
        }
    )
    if packed_meta:
        meta[META_PACKED] = json.dumps(packed_meta, separators=(",", ":"))
    text = json.dumps({"__metadata__": meta, **entries}, separators=(",", ":"))
    for name, entry in _parse_json(text, "header").items():  # the reader's JSON and entry rules, once more
        if name != "__metadata__":
            _tensor_entry(name, entry, len(data), version)
    header = text.encode()
    header += b" " * (-(8 + len(header)) % HEADER_ALIGN)
    return struct.pack("<Q", len(header)) + header + data


def _mode_for(path: str) -> int:
    """Permission bits for a new file at path: the existing file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        pass
    try:  # Linux: read the umask without changing it (os.umask is process-wide and racy)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def written_version(graph: Mapping[str, Any]) -> int:
    """The version a writer writes: 4, or the latest version a node or an input of the graph needs (docs/FORMAT.md
    section 3), so a file stays readable by the oldest readers that can read it."""
    def items(key: str) -> list:
        found = graph.get(key, []) if isinstance(graph, Mapping) else []
        return [i for i in found if isinstance(i, Mapping)] if isinstance(found, list) else []

    needs = [node_needs(n.get("op"), n.get("attrs") or {})[0] for n in items("nodes")]
    needs += [INPUT_DTYPE_SINCE.get(i.get("dtype"), 1) for i in items("inputs")]
    return max([FORMAT_VERSION, *needs])


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the whole new one."""
    path = os.fspath(path)
    import tempfile  # writing only: not imported by a program that only loads models

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".qrt-", suffix=".tmp", dir=folder)
    try:
        # mkstemp makes the file 0600; give it what open() would have (or the replaced file's mode)
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save(
    path: str | os.PathLike,
    graph: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Validate and write a .qrt file atomically (temporary file, then rename).

    ``graph`` is the JSON form described in docs/FORMAT.md; ``tensors`` maps
    names to arrays of int8, uint8, int32, float16, float32 or float64; ``metadata``
    adds free-form string entries (``producer`` overrides the default).
    """
    write_atomic(path, encode(graph, tensors, metadata))

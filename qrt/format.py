"""The .qrt container: a safetensors file whose metadata carries the graph.

Layout (docs/FORMAT.md is the specification):

    u64 little-endian N | N bytes of JSON header | data section

The header maps tensor names to {dtype, shape, data_offsets} and holds
``__metadata__``, a string-to-string map with ``qrt.version``,
``qrt.producer``, ``qrt.data_sha256`` and ``qrt.graph`` (the graph as JSON).

``load_file`` maps the file read-only and validates everything in one pass
before returning: the returned tensors are views of the mapping (copied only
when misaligned), and the graph is fully checked (``qrt.graph``).
``save`` writes through a temporary file and a rename, so a reader never
sees a partial file.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import stat
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import FormatError
from .graph import Graph, parse_graph
from .ops import ValueInfo

FORMAT_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
MAX_HEADER_BYTES = 100_000_000  # as safetensors: a header claiming more is refused unread
HEADER_ALIGN = 8
MAX_JSON_DEPTH = 64  # deeper JSON is refused: no legitimate header needs it, and repr/recursion stay bounded
MAX_RANK = 8
MAX_NAME = 256
MAX_BYTES = 2**63  # numpy (and a C reader's int64) cannot describe a larger array, even an empty one
_VERSION_RE = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() accepts '¹', which int() refuses
_SHA256_RE = re.compile(r"[0-9a-f]{64}")

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
META_CHECKSUM = "qrt.data_sha256"
META_GRAPH = "qrt.graph"
RESERVED_META = (META_VERSION, META_PRODUCER, META_CHECKSUM, META_GRAPH)


@dataclass(frozen=True)
class QrtFile:
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


def _parse_json(text: str, what: str) -> Any:
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except FormatError as e:
        raise FormatError(f"{what}: {e}") from None
    except RecursionError:
        raise FormatError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, and integers longer than Python's digit limit
        raise FormatError(f"{what}: malformed JSON ({e})") from None
    if not _depth_at_most(obj, MAX_JSON_DEPTH):
        raise FormatError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
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
    # Zero-size tensors pass the byte-length check whatever their other dimensions are.
    if math.prod(d for d in shape if d) * code_size >= MAX_BYTES:
        raise FormatError(f"{where}: shape {shape} of {code} describes 2**63 bytes or more")
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


def load_file(path: str | os.PathLike) -> QrtFile:
    """Map and validate a .qrt file. Raises FormatError naming any problem.

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
        buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)  # the mapping keeps the file alive
    try:
        return _validate(buf, size)
    except BaseException:
        try:
            buf.close()  # release the mapping now rather than at garbage collection
        except BufferError:
            pass  # views were made before the failure; they free it when the traceback goes
        raise


def _validate(buf: mmap.mmap, size: int) -> QrtFile:
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
    for key in (META_PRODUCER, META_CHECKSUM, META_GRAPH):
        if key not in meta:
            raise FormatError(f"header: __metadata__ lacks {key!r}")
    if not _SHA256_RE.fullmatch(meta[META_CHECKSUM]):
        raise FormatError(
            f"header: {META_CHECKSUM} must be 64 lowercase hex digits, got {meta[META_CHECKSUM]!r:.80}"
        )

    data_start = 8 + header_len
    data_len = size - data_start
    entries = {name: _tensor_entry(name, entry, data_len, version) for name, entry in header.items()}
    spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items())
    # Sorted by start, any overlap shows between neighbours.
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"tensors {n0!r} [{b0}, {e0}] and {n1!r} [{b1}, {e1}] overlap")

    digest = hashlib.sha256(memoryview(buf)[data_start:]).hexdigest()
    if digest != meta[META_CHECKSUM]:
        raise FormatError(
            f"data section checksum mismatch: header says {meta[META_CHECKSUM]}, data hashes to {digest}"
        )

    tensors = {
        name: _view(buf, data_start, dtype, shape, begin) for name, (dtype, shape, begin, _) in entries.items()
    }
    infos = {name: ValueInfo(t.dtype.name, t.shape) for name, t in tensors.items()}
    graph = parse_graph(_parse_json(meta[META_GRAPH], "graph"), infos, tensors, version)
    return QrtFile(graph, tensors, dict(meta), version)


def _producer() -> str:
    from . import __version__

    return f"qrt {__version__}"


def encode(
    graph: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    """Serialize a graph (its JSON form) and tensors into .qrt bytes, validating both."""
    arrays = {}
    for name, t in tensors.items():
        a = np.asarray(t)
        # refuse to write what load_file would refuse
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name == "__metadata__":
            raise ValueError(f"tensor name {name!r:.80} must be a string of 1 to {MAX_NAME} characters")
        if a.ndim > MAX_RANK:
            raise ValueError(f"tensor {name!r}: rank {a.ndim} exceeds the maximum of {MAX_RANK}")
        if a.dtype.name not in CODES:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} is not storable; use one of {sorted(CODES)}")
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        arrays[name] = a if a.flags.c_contiguous else a.copy()  # ascontiguousarray would make 0-d 1-d
    infos = {name: ValueInfo(a.dtype.name, a.shape) for name, a in arrays.items()}
    # refuse to write what cannot be read
    parse_graph(json.loads(json.dumps(graph)), infos, arrays, FORMAT_VERSION)

    # Widest items first, so every tensor is naturally aligned with no gaps (safetensors allows none).
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
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
            META_VERSION: str(FORMAT_VERSION),
            META_PRODUCER: meta.pop("producer", None) or _producer(),
            META_CHECKSUM: hashlib.sha256(data).hexdigest(),
            META_GRAPH: json.dumps(graph, separators=(",", ":")),
        }
    )
    header = json.dumps({"__metadata__": meta, **entries}, separators=(",", ":")).encode()
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


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the whole new one."""
    path = os.fspath(path)
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

"""What every CUDA launcher shares: CuPy (imported lazily), the compiled modules, sizes and uploads.

CuPy is imported only when a CUDA model is loaded; ``import qrt`` never does.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np

SOURCE_DIR = Path(__file__).resolve().parent.parent / "cuda"
# --fmad=false: no contraction, every product and sum rounds as written (the CPU builds with
# -ffp-contract=off); --ftz=false, --prec-div=true, --prec-sqrt=true: subnormals kept, division and
# square root correctly rounded, as on the CPU (NVRTC's defaults, named so that a change is seen)
NVRTC_OPTIONS = ("--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "-std=c++17")


class CUDAUnavailableError(RuntimeError):
    """device='cuda' was asked for but CuPy, the NVIDIA driver or a GPU is missing."""


def cupy() -> Any:
    import cupy

    return cupy


def require_cuda() -> None:
    """Raise CUDAUnavailableError saying what is missing, or return if a GPU is usable."""
    try:
        import cupy
    except ImportError as e:
        raise CUDAUnavailableError(
            "device='cuda' needs CuPy, which is not installed (pip install cupy-cuda12x); "
            f"import failed with: {e}"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, driver too old, no device
        text = str(e)
        if "NoDevice" in text or "no CUDA-capable device" in text:
            raise CUDAUnavailableError(f"device='cuda': no NVIDIA GPU found ({text})") from None
        raise CUDAUnavailableError(f"device='cuda': no usable NVIDIA driver ({text})") from None
    if count == 0:
        raise CUDAUnavailableError("device='cuda': no NVIDIA GPU found (CuPy sees 0 devices)")


def array_module(a: Any) -> Any:
    """The array library owning ``a`` if this backend accepts it (numpy or cupy), else None."""
    if isinstance(a, np.ndarray):
        return np
    cp = cupy()
    return cp if isinstance(a, cp.ndarray) else None


def dev(a: Any, dtype: Any = None) -> Any:
    """``a`` as a C-contiguous device array (uploaded if it is a NumPy array)."""
    cp = cupy()
    return cp.ascontiguousarray(cp.asarray(a, dtype=dtype))


# ---------------------------------------------------------------- kernel sources

_lock = threading.Lock()
_modules: dict[str, Any] = {}


def kernel_source(name: str) -> str:
    """A .cu file with its local #include "..." files inlined (each once).

    Inlined here rather than passed with -I so that CuPy's compile cache,
    keyed on the source text, sees header changes too.
    """
    seen: set[Path] = set()

    def expand(path: Path) -> str:
        path = path.resolve()
        if path in seen:
            return ""
        seen.add(path)
        text = re.sub(r"^#pragma once\s*$", "", path.read_text(), flags=re.M)  # inlined once here
        return re.sub(r'^#include "([^"]+)"\s*$', lambda m: expand(path.parent / m.group(1)), text, flags=re.M)

    return expand(SOURCE_DIR / name)


def kernel(source: str, name: str) -> Any:
    """Entry point ``name`` of qrt/cuda/``source``, compiled once per process.

    Compiled by NVRTC with NVRTC_OPTIONS alone: CuPy's RawModule appends -ftz=true to the options it
    is given (seen with CuPy 14.2: every subnormal result became zero), which would break the CPU's
    bits."""
    with _lock:
        mod = _modules.get(source)
        if mod is None:
            cp = cupy()
            compiled = cp.cuda.compiler.compile_using_nvrtc(kernel_source(source), NVRTC_OPTIONS)
            mod = _modules[source] = cp.cuda.function.Module()
            mod.load(compiled[0] if isinstance(compiled, tuple) else compiled)
    return mod.get_function(name)


# CUfunction_attribute values (cuda.h): kernels from Module.load are plain functions, read and set
# through the driver
_MAX_THREADS_PER_BLOCK, _SHARED_SIZE_BYTES, _MAX_DYNAMIC_SHARED_SIZE_BYTES = 0, 1, 8
_opted_in: dict[int, int] = {}


@functools.cache
def _device_limits(device: int) -> tuple[int, int]:
    attrs = cupy().cuda.Device(device).attributes
    return attrs["MultiProcessorCount"], attrs["MaxSharedMemoryPerBlockOptin"]


def device_limits() -> tuple[int, int]:
    """(SMs, shared memory a block may opt in to) of the current device."""
    return _device_limits(cupy().cuda.Device().id)


def max_threads_per_block(fn: Any) -> int:
    """What a kernel's registers allow a block."""
    return cupy().cuda.driver.funcGetAttribute(_MAX_THREADS_PER_BLOCK, fn.ptr)


def opt_in_shared(fn: Any) -> int:
    """Let fn have all the dynamic shared memory a block may (beyond the default 48 KB): set once per
    kernel, a function attribute and not a stream operation, so launches stay capturable. Returns it."""
    with _lock:
        limit = _opted_in.get(fn.ptr)
        if limit is None:
            driver = cupy().cuda.driver
            limit = device_limits()[1] - driver.funcGetAttribute(_SHARED_SIZE_BYTES, fn.ptr)
            driver.funcSetAttribute(fn.ptr, _MAX_DYNAMIC_SHARED_SIZE_BYTES, limit)
            _opted_in[fn.ptr] = limit
    return limit


def has_mma() -> bool:
    """Integer mma.sync needs compute capability 8.0 or newer."""
    return int(cupy().cuda.Device().compute_capability) >= 80


def blocks(n: int, per_block: int = 256, cap: int = 4096) -> int:
    return max(1, min(cap, -(-n // per_block)))


def round_up(v: int, a: int) -> int:
    return -(-max(v, 1) // a) * a


def check_size(what: str, n: int) -> None:
    if n >= 2**31:
        raise ValueError(f"{what} has {n} elements; the CUDA kernels index with 32 bits")


def qparams_array(scale: float, zero_point: int) -> np.ndarray:
    """A QParams struct (float scale, float inv, int zp, int nan) as 4 int32 words."""
    s = np.float32(scale)
    words = np.array([s, np.float32(1) / s], np.float32).view(np.int32)
    return np.array([words[0], words[1], zero_point, 0], np.int32)


# ---------------------------------------------------------------- checks of input values on the device

_active = threading.local()


def add_check(flag: Any, describe: Callable[[np.ndarray], str | None]) -> None:
    """A check of run-time input values made by a kernel (an index in range, say).

    The kernel writes its findings into the device array ``flag`` (zeroed by the step, in stream
    order, before the kernel). The host cannot read them without waiting for the GPU, so they are
    read once the whole run is done (or its CUDA graph replayed): ``describe(flag's values)``
    returns the message of the ValueError to raise, or None if the values were fine. A step called
    on its own, outside a model's run, is checked at once.
    """
    pending = getattr(_active, "checks", None)
    if pending is None:
        raise_failed([(flag, describe)])
    else:
        pending.append((flag, describe))


@contextmanager
def collecting_checks() -> Iterator[list]:
    """The checks that steps add inside the block (a model's run, or the capture of its graph)."""
    before = getattr(_active, "checks", None)
    _active.checks = checks = []
    try:
        yield checks
    finally:
        _active.checks = before


def raise_failed(checks: list) -> None:
    """Raise the first failed check's ValueError (waits for the GPU work that wrote the flags)."""
    for flag, describe in checks:
        message = describe(cupy().asnumpy(flag))
        if message is not None:
            raise ValueError(message)

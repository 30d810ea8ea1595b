"""How many threads qrt's kernels use by default, and where that number came from.

The default is the number of CPUs this process may really use: the smaller of its affinity mask and
its CPU quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; the
tightest along the cgroup's path), rounded up. A container limited to 2 CPUs on a 64-CPU host thus
gets 2 threads, not 64. ``QRT_NUM_THREADS``, then ``OMP_NUM_THREADS``, override it.
``qrt.thread_info()`` says which applied.

How an int8 product splits between the threads depends on a core's L2, read from Linux's sysfs (``l2_bytes``):
weights that fit half of it are read again from there by each chunk of rows; larger ones, unless the chunks
have many rows, are split by columns, each thread reading its own part once.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from . import _kernels

PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
CPU_ROOT = "/sys/devices/system/cpu"
ENV_VARS = ("QRT_NUM_THREADS", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class ThreadInfo:
    """threads: the kernels' thread count now; source: where it came from ("QRT_NUM_THREADS",
    "OMP_NUM_THREADS", "cgroup quota", "affinity" or "set_num_threads"); cpus: the CPUs the process may
    use (affinity mask and quota together); affinity: CPUs in the affinity mask; quota: the CPU quota
    in CPUs (None: no quota) and quota_file, the file that set it."""

    threads: int
    source: str
    cpus: int
    affinity: int
    quota: float | None = None
    quota_file: str | None = None

    def describe(self) -> str:
        """One line for people: "2 threads (cgroup quota: 2.0 CPUs in /sys/fs/cgroup/cpu.max; 16 in the
        affinity mask)"."""
        if self.source == "cgroup quota":
            where = f"cgroup quota: {self.quota:g} CPUs in {self.quota_file}"
        else:
            where = "CPUs in the affinity mask" if self.source == "affinity" else self.source
        extra = [f"{self.affinity} CPUs in the affinity mask"] if self.source != "affinity" else []
        if self.quota is not None and self.source != "cgroup quota":
            extra.append(f"cgroup quota {self.quota:g} CPUs")
        count = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        return f"{count} ({where}" + "".join(f"; {e}" for e in extra) + ")"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _ancestors(root: str, path: str) -> list[str]:
    """root/path and each of its parents up to root, innermost first."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [os.path.join(root, *parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(root: str, path: str) -> tuple[float, str] | None:
    best = None
    for d in _ancestors(root, path):
        text = _read(os.path.join(d, "cpu.max"))
        fields = text.split() if text else []
        if len(fields) == 2 and fields[0] != "max":
            try:
                quota, period = int(fields[0]), int(fields[1])
            except ValueError:
                continue
            if quota > 0 and period > 0 and (best is None or quota / period < best[0]):
                best = (quota / period, os.path.join(d, "cpu.max"))
    return best


def _v1_quota(root: str, path: str, controllers: str) -> tuple[float, str] | None:
    # the cpu controller's hierarchy is mounted as cpu,cpuacct (or cpu) under the root; in a container
    # /proc/self/cgroup names the host's path, and the container's own cgroup is the mount itself
    best = None
    for mount in dict.fromkeys((controllers, "cpu,cpuacct", "cpuacct,cpu", "cpu")):
        base = os.path.join(root, mount)
        if not os.path.isdir(base):
            continue
        for d in dict.fromkeys(_ancestors(base, path) + [base]):
            quota_text, period_text = (_read(os.path.join(d, f)) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
            try:
                quota, period = int(quota_text or ""), int(period_text or "")
            except ValueError:
                continue
            if quota > 0 and period > 0 and (best is None or quota / period < best[0]):
                best = (quota / period, os.path.join(d, "cpu.cfs_quota_us"))
        break
    return best


def cgroup_quota(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> tuple[float, str] | None:
    """The process's CPU quota in CPUs (2.5 for "250000 100000") and the file that sets it, the tightest
    along its cgroup's path; None without a quota or without cgroups."""
    text = _read(proc_cgroup)
    if not text:
        return None
    found = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # "0::/path": the unified (v2) hierarchy
            found.append(_v2_quota(root, path))
        elif "cpu" in controllers.split(","):
            found.append(_v1_quota(root, path, controllers))
    quotas = [q for q in found if q is not None]
    return min(quotas) if quotas else None


def affinity_count() -> int:
    """CPUs in this process's affinity mask (os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(environ: Mapping[str, str] | None = None, proc_cgroup: str = PROC_CGROUP,
                    root: str = CGROUP_ROOT, affinity: int | None = None) -> ThreadInfo:
    """The default thread count and where it came from: QRT_NUM_THREADS, else OMP_NUM_THREADS (its first
    level), else min(affinity mask, ceil(cgroup quota)). The paths and the affinity count are parameters
    for tests (a fake cgroup tree)."""
    environ = os.environ if environ is None else environ
    affinity = affinity_count() if affinity is None else affinity
    quota = cgroup_quota(proc_cgroup, root)
    cpus = max(1, min(affinity, math.ceil(quota[0]))) if quota else max(affinity, 1)
    base = {"cpus": cpus, "affinity": affinity, "quota": quota[0] if quota else None,
            "quota_file": quota[1] if quota else None}
    for var in ENV_VARS:
        text = environ.get(var, "").strip()
        if not text:
            continue
        first = text.split(",")[0].strip()  # OpenMP allows one count per nesting level: "4,2"
        if first.isascii() and first.isdigit() and 1 <= int(first) <= _kernels.MAX_THREADS:
            return ThreadInfo(threads=int(first), source=var, **base)
        warnings.warn(f"qrt: ignoring {var}={text!r}: not a number of threads from 1 to {_kernels.MAX_THREADS}",
                      stacklevel=2)
    source = "cgroup quota" if quota and cpus < affinity else "affinity"
    return ThreadInfo(threads=cpus, source=source, **base)


def _cache_size(text: str | None) -> int | None:
    """sysfs's cache size ("1024K", "2M", or bytes) in bytes; None if it is not one."""
    text = (text or "").strip()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    return int(digits) * scale if digits.isascii() and digits.isdigit() and int(digits) > 0 else None


def l2_bytes(root: str = CPU_ROOT, cpu: int | None = None) -> int | None:
    """A core's L2 (data or unified) in bytes, as sysfs gives it for `cpu` (by default the first CPU this
    process may run on); None where sysfs does not say (not Linux, or a VM that hides its caches)."""
    if cpu is None:
        try:
            cpu = min(os.sched_getaffinity(0))
        except (AttributeError, ValueError):
            cpu = 0
    base = os.path.join(root, f"cpu{cpu}", "cache")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None
    for entry in entries:
        level, kind = (_read(os.path.join(base, entry, f)) for f in ("level", "type"))
        if (level or "").strip() == "2" and (kind or "").strip() != "Instruction":
            return _cache_size(_read(os.path.join(base, entry, "size")))
    return None


_default = default_threads()
_kernels._set_available_cpus(_default.cpus)
_kernels.set_num_threads(_default.threads)
_l2 = l2_bytes()
if _l2:
    _kernels._set_rows_first_bytes(_l2 // 2)


def thread_info() -> ThreadInfo:
    """The kernels' thread count now and where it came from ("set_num_threads" once a call changed it
    from the default)."""
    threads = _kernels.get_num_threads()
    if threads == _default.threads:
        return _default
    return ThreadInfo(threads=threads, source="set_num_threads", cpus=_default.cpus, affinity=_default.affinity,
                      quota=_default.quota, quota_file=_default.quota_file)

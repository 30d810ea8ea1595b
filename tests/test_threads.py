"""The default thread count (affinity mask, cgroup CPU quota, environment) on fake cgroup trees, and the
thread pool: the same bits at every thread count, oversubscribed ones included, and no idle spinning."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import qrt
from qrt import _kernels as K
from qrt.threads import ThreadInfo, cgroup_quota, default_threads, l2_bytes


def tree(tmp_path, proc_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake /proc/self/cgroup and cgroup root under tmp_path: (proc_cgroup path, root)."""
    root = tmp_path / "sys" / "fs" / "cgroup"
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "cgroup"
    proc.write_text(proc_cgroup)
    return str(proc), str(root)


@pytest.mark.parametrize(
    "proc_cgroup, files, quota, quota_file",
    [
        # v2: the process's own cgroup, and a parent whose limit is tighter
        ("0::/app/job\n", {"app/job/cpu.max": "250000 100000\n", "app/cpu.max": "max 100000\n"}, 2.5,
         "app/job/cpu.max"),
        ("0::/app/job\n", {"app/job/cpu.max": "400000 100000\n", "app/cpu.max": "150000 100000\n"}, 1.5, "app/cpu.max"),
        # v2 in a container with its own cgroup namespace: the cgroup is the root itself
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0, "cpu.max"),
        ("0::/app\n", {"app/cpu.max": "max 100000\n"}, None, None),
        # v1: the cpu controller's hierarchy, the process's path under it
        ("12:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n",
         {"cpu,cpuacct/docker/c1/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/docker/c1/cpu.cfs_period_us": "100000\n",
          "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
         1.5, "cpu,cpuacct/docker/c1/cpu.cfs_quota_us"),
        # v1 in a container: /proc/self/cgroup names the host's path, the mount is the container's cgroup
        ("4:cpu,cpuacct:/kubepods/pod7/c2\n",
         {"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
         0.5, "cpu,cpuacct/cpu.cfs_quota_us"),
        ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
         None, None),
        # no cgroup files at all (not Linux, or /sys/fs/cgroup not mounted)
        ("0::/\n", {}, None, None),
        ("garbage\n", {"cpu.max": "200000 100000\n"}, None, None),
    ],
)
def test_cgroup_quota_from_a_fake_tree(tmp_path, proc_cgroup, files, quota, quota_file):
    proc, root = tree(tmp_path, proc_cgroup, files)
    got = cgroup_quota(proc, root)
    if quota is None:
        assert got is None
    else:
        assert got == (quota, os.path.join(root, quota_file))


@pytest.mark.parametrize(
    "cpu_max, affinity, env, want",
    [
        ("250000 100000", 16, {}, (3, "cgroup quota")),  # 2.5 CPUs rounded up
        ("50000 100000", 16, {}, (1, "cgroup quota")),
        ("800000 100000", 4, {}, (4, "affinity")),  # the affinity mask is the smaller
        ("max 100000", 8, {}, (8, "affinity")),
        ("200000 100000", 16, {"OMP_NUM_THREADS": "16"}, (16, "OMP_NUM_THREADS")),
        ("200000 100000", 16, {"QRT_NUM_THREADS": "5", "OMP_NUM_THREADS": "16"}, (5, "QRT_NUM_THREADS")),
        ("200000 100000", 16, {"OMP_NUM_THREADS": "3,2"}, (3, "OMP_NUM_THREADS")),
    ],
)
def test_default_threads_from_quota_affinity_and_environment(tmp_path, cpu_max, affinity, env, want):
    proc, root = tree(tmp_path, "0::/job\n", {"job/cpu.max": cpu_max})
    info = default_threads(env, proc, root, affinity)
    assert (info.threads, info.source) == want
    quota = None if cpu_max.startswith("max") else int(cpu_max.split()[0]) / 100000
    assert info.cpus == min(affinity, -(-quota // 1) if quota else affinity)  # the pool's CPUs: env aside
    assert info.affinity == affinity and info.quota == quota
    assert str(info.threads) in info.describe() and (quota is None or "cgroup quota" in info.describe())


def cache(level: str, kind: str, size: str) -> dict[str, str]:
    return {"level": level, "type": kind, "size": size}


@pytest.mark.parametrize(
    "indexes, want",
    [
        # Zen 5 as its sysfs says: L1d, L1i, L2, L3 (sysfs prints sizes in K)
        ([cache("1", "Data", "48K\n"), cache("1", "Instruction", "32K\n"), cache("2", "Unified", "1024K\n"),
          cache("3", "Unified", "32768K\n")], 1 << 20),
        ([cache("1", "Data", "48K"), cache("2", "Unified", "2M")], 2 << 20),  # a size in M
        ([cache("2", "Instruction", "64K"), cache("2", "Data", "512K")], 512 << 10),  # split L2: the data side
        ([cache("1", "Data", "32K"), cache("3", "Unified", "8192K")], None),  # no L2 listed
        ([cache("2", "Unified", "0K")], None),
        ([cache("2", "Unified", "lots")], None),
        ([], None),  # a VM that lists no caches
    ],
)
def test_l2_from_a_fake_sysfs_tree(tmp_path, indexes, want):
    for i, files in enumerate(indexes):
        d = tmp_path / "cpu3" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    assert l2_bytes(str(tmp_path), cpu=3) == want
    assert l2_bytes(str(tmp_path / "absent"), cpu=3) is None


@pytest.mark.parametrize("value", ["0", "abc", "2147483648", "99999999999999999999"])
def test_a_bad_environment_value_is_named_and_ignored(tmp_path, value):
    """Past MAX_THREADS too: 2^31 had failed `import qrt` with an OverflowError."""
    proc, root = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000"})
    with pytest.warns(UserWarning, match=f"ignoring QRT_NUM_THREADS='{value}': not a number of threads from 1 to"):
        info = default_threads({"QRT_NUM_THREADS": value, "OMP_NUM_THREADS": "7"}, proc, root, 4)
    assert (info.threads, info.source) == (7, "OMP_NUM_THREADS")


def test_thread_info_follows_set_num_threads():
    before = qrt.get_num_threads()
    try:
        default = qrt.thread_info()
        assert isinstance(default, ThreadInfo) and default.threads == before
        qrt.set_num_threads(before + 3)
        info = qrt.thread_info()
        assert (info.threads, info.source, info.cpus) == (before + 3, "set_num_threads", default.cpus)
    finally:
        qrt.set_num_threads(before)
    assert qrt.thread_info() == default


# ------------------------------------------------------------------ the pool


def outputs_at(threads: int, calls, rows_first_bytes: int) -> list[np.ndarray]:
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    split = K._set_rows_first_bytes(rows_first_bytes)
    try:
        qrt.set_num_threads(threads)
        return [call() for call in calls]
    finally:
        K._set_rows_first_bytes(split)
        K._set_min_work(*floors)
        qrt.set_num_threads(before)


@pytest.mark.parametrize("rows_first_bytes", [1 << 20, 0], ids=["int8-rows-first", "int8-panels-first"])
def test_same_bits_at_every_thread_count_oversubscribed_included(rows_first_bytes):
    """Every parallel loop split as finely as it goes (work floors of 1), at 1 thread up to many more
    threads than this machine has CPUs, int8 products split rows first (their weights fit the bound) or panels
    first (a bound of 0): the same bits, and the pool's team is the asked-for size."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, 300)).astype(np.float32)
    w8 = rng.integers(-128, 128, (70, 300), dtype=np.int8)
    lin8 = K.DynamicLinear(w8, np.float32(0.01), np.int32(0), rng.standard_normal(70).astype(np.float32))
    lin16 = K.DynamicLinear(rng.standard_normal((70, 300)).astype(np.float16))
    big = rng.standard_normal((70000,)).astype(np.float32)  # above the floor that splits quantization
    lin_big = K.DynamicLinear(rng.integers(-128, 128, (8, 7000), dtype=np.int8), np.float32(0.02), np.int32(0))
    ops = K.FloatOps()
    data = rng.integers(0, 256, 5 * (1 << 20) + 17, dtype=np.uint8)

    def linear(layer, inputs, n):
        y = np.empty((inputs.shape[0], n), np.float32)
        layer(inputs, y)
        return y

    def unary():
        y = np.empty_like(big)
        ops.unary("tanh", big, y)
        return y

    calls = [lambda: linear(lin8, x, 70), lambda: linear(lin16, x, 70),
             lambda: linear(lin_big, big.reshape(10, 7000), 8), unary, lambda: np.asarray(K.data_checksum(data))]
    lin8_static = K.StaticLinear(w8, np.float32(0.01), np.int32(0), None, 0.05, 3, 0.2, 60, relu=False)
    xq = rng.integers(0, 256, (37, 300), dtype=np.uint8)

    def static():
        y = np.empty((37, 70), np.uint8)
        lin8_static(xq, y)
        return y

    calls.append(static)
    want = outputs_at(1, calls, rows_first_bytes)
    cpus = os.cpu_count() or 1
    for threads in sorted({2, 3, cpus, cpus + 1, 4 * cpus, 64}):
        got = outputs_at(threads, calls, rows_first_bytes)
        for a, b in zip(want, got):
            assert a.tobytes() == b.tobytes(), threads
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    try:
        qrt.set_num_threads(5)
        linear(lin8, x, 70)
        assert K._pool_workers() == min(5, qrt.thread_info().cpus) - 1  # the caller is the last
        qrt.set_num_threads(8 * qrt.thread_info().cpus)
        linear(lin8, x, 70)
        assert K._pool_workers() == qrt.thread_info().cpus - 1  # no more threads than CPUs
    finally:
        K._set_min_work(*floors)
        qrt.set_num_threads(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are set on Linux only")
def test_workers_are_named():
    """The pool's workers call themselves qrt-worker (what top -H, perf and /proc show), the caller keeps its name."""
    if qrt.thread_info().cpus < 2:
        pytest.skip("one CPU: the pool starts no worker")
    before = qrt.get_num_threads()
    try:
        qrt.set_num_threads(2)
        data = np.arange(1 << 22, dtype=np.uint32).view(np.uint8)
        K.data_checksum(data, threads=2)
        assert K._pool_workers() == 1

        def names() -> list[str]:
            out = []
            for comm in pathlib.Path("/proc/self/task").glob("*/comm"):
                try:
                    out.append(comm.read_text().strip())
                except FileNotFoundError:  # a thread (not the pool's) that ended meanwhile
                    pass
            return out

        deadline = time.monotonic() + 10  # the name is set as the worker starts, perhaps after the loop it joined
        while names().count("qrt-worker") != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert names().count("qrt-worker") == 1
        assert pathlib.Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "qrt-worker"
    finally:
        qrt.set_num_threads(before)


def test_idle_pool_sleeps_when_oversubscribed():
    """With 8 times more threads asked for than CPUs, after a loop the workers go to sleep: the process
    uses next to no CPU time while it idles (workers that never slept would use a CPU each)."""
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    data = np.zeros(8 << 20, np.uint8)
    try:
        qrt.set_num_threads(8 * (os.cpu_count() or 1))
        K.data_checksum(data)
        cpu = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - cpu < 0.1
    finally:
        K._set_min_work(*floors)
        qrt.set_num_threads(before)


def test_loops_from_several_python_threads_at_once():
    """Callers that release the GIL run loops at the same time: one holds the pool, the others run theirs
    on their own thread; every result is right."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    want = K.data_checksum(data, threads=1)
    before = qrt.get_num_threads()
    try:
        qrt.set_num_threads(4)
        with ThreadPoolExecutor(6) as ex:
            assert set(ex.map(lambda _: K.data_checksum(data, threads=4), range(48))) == {want}
    finally:
        qrt.set_num_threads(before)


@pytest.mark.skipif("QEMU_CPU" in os.environ, reason="qemu-user aborts in a forked child of a threaded process")
def test_a_forked_child_gets_a_pool_of_its_own():
    """After fork() the parent's workers are gone: the child starts its own instead of waiting for them."""
    code = ("import os, numpy as np, qrt\nfrom qrt import _kernels as K\nqrt.set_num_threads(3)\n"
            "d = np.arange(4 << 20, dtype=np.uint32).view(np.uint8)\nwant = K.data_checksum(d)\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0 if K.data_checksum(d) == want else 1)\n"
            "print(os.waitpid(pid, 0)[1])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


def _build_pool_program(tmp_path, program: str, *flags: str, link_pool: bool = True) -> subprocess.CompletedProcess:
    """tests/<program>.c linked with the pool (threadpool.c), or including it (link_pool False), built as
    tmp_path/<program>."""
    root = pathlib.Path(__file__).resolve().parent.parent
    pool = [str(root / "qrt" / "kernels" / "threadpool.c")] if link_pool else []
    return subprocess.run(["cc", "-std=c11", "-O2", "-pthread", *flags, "-I", str(root / "qrt" / "kernels"),
                           str(root / "tests" / f"{program}.c"), *pool, "-o", str(tmp_path / program)],
                          capture_output=True, text=True)


def _run_pool_program(tmp_path, program: str, link_pool: bool = True) -> None:
    """Builds and runs tests/<program>.c: it prints "ok", or "skip" and why (the test skips), or fails."""
    _build_pool_program(tmp_path, program, link_pool=link_pool).check_returncode()
    r = subprocess.run([str(tmp_path / program)], capture_output=True, text=True, timeout=60)
    if r.stdout.startswith("skip"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("wait", ["futex", "condvar"])
def test_pool_under_stress(tmp_path, wait):
    """tests/threadpool_stress.c: thousands of loops of 1 to 300 tasks from several caller threads, nested
    loops, changing teams; every task runs exactly once. Built with the futex and with the condition
    variable that other systems get (QRT_POOL_CONDVAR)."""
    _build_pool_program(tmp_path, "threadpool_stress",
                        *(["-DQRT_POOL_CONDVAR"] if wait == "condvar" else [])).check_returncode()
    r = subprocess.run([str(tmp_path / "threadpool_stress")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.skipif("QEMU_CPU" in os.environ, reason="builds and runs a program for the host, not the emulated CPU")
def test_a_worker_on_its_callers_cpu_moves_off_it(tmp_path):
    """tests/threadpool_placement.c: a caller pinned to one CPU wakes the sleeping worker 20 times, then moves onto
    the CPU of the worker 20 times; the worker never runs a task on the caller's CPU and keeps its whole affinity
    mask (Linux often wakes a thread on its waker's CPU, and on a VM left the two together loop after loop:
    docs/PERFORMANCE.md, "Where Linux puts the worker")."""
    _run_pool_program(tmp_path, "threadpool_placement")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_worker_moves_to_a_cpu_no_team_thread_holds(tmp_path):
    """tests/threadpool_move_target.c: a worker moved off its caller's CPU goes to a CPU that no other awake
    worker holds, where there is one (Linux would take the next allowed CPU in turn, mostly another worker's
    in a team as large as the CPUs); else to any but the caller's. On masks of 16 CPUs, which a real move on
    this machine's CPUs may not have."""
    _run_pool_program(tmp_path, "threadpool_move_target", link_pool=False)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_pool_under_stress_has_no_data_race(tmp_path):
    """The stress program under ThreadSanitizer: the pool's shares are taken lock-free (threadpool.c), and a
    read of the loop's fields by a thread a loop behind is a race no count of tasks would show."""
    built = _build_pool_program(tmp_path, "threadpool_stress", "-g", "-fsanitize=thread")
    if built.returncode:
        pytest.skip(f"this compiler cannot build with ThreadSanitizer: {built.stderr.strip()[-200:]}")
    r = subprocess.run([str(tmp_path / "threadpool_stress")], capture_output=True, text=True, timeout=300)
    if "FATAL: ThreadSanitizer" in r.stderr and "WARNING: ThreadSanitizer" not in r.stderr:
        # its runtime refused this kernel's memory layout (newer kernels' wider mmap randomisation), before
        # the program ran: nothing was checked
        pytest.skip(f"ThreadSanitizer's runtime cannot start here: {r.stderr.strip().splitlines()[0][:200]}")
    assert r.returncode == 0 and r.stdout.startswith("ok") and "ThreadSanitizer" not in r.stderr, r.stderr[-3000:]

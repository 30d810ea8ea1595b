"""Timing helpers shared by the benchmarks: medians of repeated timed runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable


def time_call(fn: Callable[[], object], min_time: float = 0.02, repeats: int = 15) -> float:
    """Median seconds per call of fn: each of `repeats` samples runs fn enough times to last min_time."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    inner = max(1, int(min_time / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def time_calls(fns: list[Callable[[], object]], min_time: float = 0.02, repeats: int = 15,
               setups: list[Callable[[], object]] | None = None,
               statistic: Callable[[list[float]], float] = statistics.median) -> list[float]:
    """Median (or `statistic`) seconds per call of each fn, their samples interleaved (a, b, c, a, b, c, ...).

    On a shared machine the load changes from second to second; interleaving
    gives every contender the same conditions, so their ratios stay
    meaningful even when the absolute times drift. setups[i], if given, runs
    untimed before each sample of fns[i] (a thread count to set).
    """
    setups = setups or [lambda: None] * len(fns)
    inners = []
    for fn, setup in zip(fns, setups):
        setup()
        for _ in range(3):
            fn()
        start = time.perf_counter()
        fn()
        inners.append(max(1, int(min_time / max(time.perf_counter() - start, 1e-7))))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, setup, inner, out in zip(fns, setups, inners, samples):
            setup()
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - start) / inner)
    return [statistic(s) for s in samples]



def time_by_threads(entries: list[tuple[str, int, Callable[[], object], Callable[[], object]]],
                    min_time: float, repeats: int) -> dict[str, dict[str, float]]:
    """time_calls over (case, threads, fn, setup) entries, interleaved: {case: {str(threads): seconds}}
    (what an A/B round of harness.ab_builds returns)."""
    times = time_calls([fn for *_, fn, _ in entries], min_time=min_time, repeats=repeats,
                       setups=[setup for *_, setup in entries])
    out: dict[str, dict[str, float]] = {}
    for (case, threads, *_), t in zip(entries, times):
        out.setdefault(case, {})[str(threads)] = t
    return out

def time_cases(cases: list[str], fns: list[Callable[[], object]], threads: list[int], repeats: int,
               min_time: float = 0.01) -> dict[str, dict[str, float]]:
    """time_by_threads of each case's fn at every thread count, qrt.set_num_threads(t) before each of its samples
    (an A/B round of one build: the qrt it imports is the build's)."""
    import qrt

    return time_by_threads([(name, t, fn, lambda t=t: qrt.set_num_threads(t)) for t in threads
                            for name, fn in zip(cases, fns)], min_time=min_time, repeats=repeats)


def machine_line(info: dict, onnxruntime: str | None, note: str) -> str:
    """The line a benchmark prints first: the CPU, the kernels torch and qrt chose, ONNX Runtime's version."""
    import torch

    return (f"machine: {info.get('cpu', '?')} | {info['cores']} CPUs, {info.get('physical_cores', '?')} cores | "
            f"{info['threads_note']} | torch {torch.__version__} capability "
            f"{torch.backends.cpu.get_cpu_capability()} | qrt kernels {info['qrt_kernels']} | onnxruntime "
            f"{onnxruntime or 'not installed'} | {note}")


def machine() -> dict:
    """CPU model, flags relevant to integer kernels, CPUs and physical cores, qrt's default thread count
    and where it came from, and the qrt kernel variant in use."""
    from qrt._kernels import kernel_variant

    import qrt

    info = {"platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count(),
            "qrt_kernels": kernel_variant()}
    if hasattr(qrt, "thread_info"):
        info["threads"] = dataclasses.asdict(qrt.thread_info())
        info["threads_note"] = "qrt " + qrt.thread_info().describe()
    else:  # a build from before issue 35 (bench/threads_ab.py compares with one)
        info["threads_note"] = f"qrt {qrt.get_num_threads()} threads"
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        cores, physical = set(), ""
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and "flags" not in info:
                flags = set(line.split(":", 1)[1].split())
                wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"]
                info["flags"] = [f for f in wanted if f in flags]
            if line.startswith("physical id"):
                physical = line.split(":", 1)[1].strip()
            if line.startswith("core id"):
                cores.add((physical, line.split(":", 1)[1].strip()))
        if cores:
            info["physical_cores"] = len(cores)
    except OSError:
        info["cpu"] = platform.processor()
    return info


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    return f"{seconds * 1e3:8.2f} ms"


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def round_median(rounds: list[dict], *keys: str) -> float:
    """The median over A/B rounds (ab_builds' runs of a build, or several builds' together) of the figure each
    round holds at rounds[i][keys[0]][keys[1]]..."""
    values = []
    for r in rounds:
        for key in keys:
            r = r[key]
        values.append(r)
    return statistics.median(values)


def ab_medians(args: argparse.Namespace, runs: dict[str, list[dict]], cases: list[str], label: str,
               width: int = 26, column: int = 14) -> None:
    """ab_builds' results as a table of microseconds a call, a row per case and a column per thread count and
    build (each the median over the rounds), the load average after, and the same medians to --json."""
    builds, ts = args.build, [str(t) for t in args.threads]
    print(f"{label:{width}s}" + "".join(f"{f'{n} {t}thr':>{column}s}" for t in ts for n in builds))
    summary: dict = {}
    for case in cases:
        med = {(n, t): round_median(runs[n], case, t) for t in ts for n in builds}
        summary[case] = {n: {t: med[n, t] for t in ts} for n in builds}
        print(f"{case:{width}s}" + "".join(f"{med[n, t] * 1e6:{column}.1f}" for t in ts for n in builds))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        write_json(args.json, {"threads": args.threads, "rounds": args.rounds, "builds": builds, "us": summary})


def ab_table(script: str, doc: str, one_round: Callable[[list[int]], dict], cases: list[str], label: str,
             *widths: int) -> None:
    """A script's main: ab_builds at 1 and 2 threads by default, then ab_medians' table (in the child, nothing)."""
    parsed = ab_builds(script, doc, [1, 2], one_round)
    if parsed is not None:
        ab_medians(*parsed, cases, label, *widths)


def ab_builds(script: str, doc: str, default_threads: list[int],
              one_round: Callable[[list[int]], dict]) -> tuple[argparse.Namespace, dict[str, list[dict]]] | None:
    """The A/B runner of two or more in-place builds of qrt (--build NAME=PATH): each build runs `script
    --one-round` in its own process (one_round(threads) -> JSON), the builds alternating round by round so that
    all see the same machine load. Returns the arguments and name -> each round's results, or None in the child."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="append", required=True, help="NAME=PATH of a checkout built in place")
    parser.add_argument("--threads", type=int, nargs="+", default=default_threads)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the medians here")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    args.build = dict(b.split("=", 1) for b in args.build)  # name -> path
    if args.one_round:
        print(json.dumps(one_round(args.threads)))
        return None
    runs: dict[str, list[dict]] = {name: [] for name in args.build}
    for r in range(args.rounds):
        for name, path in args.build.items():
            env = {**os.environ, "PYTHONPATH": os.path.abspath(path)}
            cmd = [sys.executable, script, "--one-round", "--build", "x=x", "--threads", *map(str, args.threads)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    return args, runs

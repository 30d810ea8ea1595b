"""Markdown tables of bench_cpu.py JSON files (for docs/PERFORMANCE.md).

    python bench/table.py bench/results_cpu.json                  # one run, by thread count
    python bench/table.py bench/results_cpu_avx2.json bench/results_cpu_avx512.json
                                                                  # runs side by side, one column set each
"""

from __future__ import annotations

import json
import sys


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    threads = sorted({r["threads"] for r in rows})
    for t in threads:
        print(f"\n### {t} thread{'s' if t > 1 else ''}\n")
        print("| case | qrt | PyTorch | ONNX Runtime | PyTorch / qrt | ORT / qrt |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            if r["threads"] != t:
                continue
            ort_ratio = f"{r['ort_ratio']:.2f}" if r["ort_ratio"] else "-"
            print(
                f"| {r['case']} | {_t(r['qrt_s'])} | {_t(r['torch_s'])} | {_t(r['ort_s'])} "
                f"| {r['torch_ratio']:.2f} | {ort_ratio} |"
            )
        s = data["summary"][str(t)]
        print("\n" + ", ".join(f"{k}: **{v:.2f}**" for k, v in s.items()))
    if len(threads) > 1:
        print("\n### Thread scaling\n")
        print("Median time per call at each thread count: qrt / PyTorch / ONNX Runtime (x: qrt's speed-up over its"
              f" {threads[0]}-thread time).\n")
        print("| case | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads) + " |")
        print("|---|" + "---:|" * len(threads))
        by_case: dict[str, dict[int, dict]] = {}
        for r in rows:
            by_case.setdefault(r["case"], {})[r["threads"]] = r
        for case, mine in by_case.items():
            base = mine[threads[0]]["qrt_s"]
            cells = [f"{_t(r['qrt_s'])} / {_t(r['torch_s'])} / {_t(r['ort_s'])} ({base / r['qrt_s']:.2f}x)"
                     if (r := mine.get(t)) else "-" for t in threads]
            print(f"| {case} | " + " | ".join(cells) + " |")


def side_by_side(paths: list[str]) -> None:
    """One row per case of 1-thread figures, a qrt / PyTorch / ratio column set per run (kernel variant)."""
    runs = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        one_thread = {r["case"]: r for r in data["rows"] if r["threads"] == 1}
        runs.append((data["machine"].get("qrt_kernels", path), one_thread))
    print("| case | " + " | ".join(f"qrt {v} | PyTorch | PyTorch / qrt" for v, _ in runs) + " |")
    print("|---|" + "---:|---:|---:|" * len(runs))
    for case in runs[0][1]:
        cells = []
        for _, rows in runs:
            r = rows.get(case)
            cells.append(f"{_t(r['qrt_s'])} | {_t(r['torch_s'])} | {r['torch_ratio']:.2f}" if r else "- | - | -")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        side_by_side(sys.argv[1:])
    else:
        main(sys.argv[1])

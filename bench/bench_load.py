"""Cost of loading a large model, in fresh processes: qrt against PyTorch, in one run.

    python bench/bench_load.py [--quick] [--json out.json]    (default out: bench/results_load.json)

The model: 6 dynamic int8 Linear layers 4096x4096 (per-tensor weight scale, float32 bias), about 100 MB,
quantized by torch.ao's quantize_dynamic and converted to .qrt by tools/convert.py's convert(); PyTorch's
copy is saved with torch.save, both its state_dict and the whole module.

Each case runs in its own fresh process (`python -c`), N times (7; --quick 3), cases interleaved; figures
are medians over processes. One thread everywhere (QRT_NUM_THREADS=OMP_NUM_THREADS=1, set_num_threads(1)).
The page cache is warm: every file is read once before each process starts. In each process:
- import: `import numpy` alone, then `import qrt` / `import torch` after it (the delta each adds);
- load, timed exactly:
    qrt.load               qrt.load(path)  (and qrt.load(path, verify=False) where load takes `verify`)
    torch state_dict       net.load_state_dict(torch.load(path)), net a Sequential of 6 fresh
                           torch.ao.nn.quantized.dynamic.Linear built after "RSS after import" but before
                           the timer (its time is the "build skeleton" row; its memory counts in the RSS rows)
    torch.load(module)     torch.load(path, weights_only=False) of the whole quantized module;
- memory from /proc/self/status: RSS (VmRSS) after import, after load, after one batch-1 run, and the peak
  (VmHWM) after that run; "growth / file" is (peak after run - RSS after import) / file size;
- run: batch-1 latency (x = zeros(1, 4096) float32), median of 50 runs after 5 warm-up runs.
Ratios are torch state_dict / qrt.load (above 1: qrt is faster or smaller).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from harness import fmt_time, machine, machine_line, write_json  # noqa: E402

import qrt  # noqa: E402
from tools import convert as qconvert  # noqa: E402

warnings.simplefilter("ignore")

SIZE, LAYERS, RUNS, WARMUP = 4096, 6, 50, 5
MIB = 1024 * 1024
TARGETS = {"import": "<= 15 ms", "load": "<= 10 ms", "growth": "<= 1.1x"}

CHILD = """
import time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import {module}
t2 = time.perf_counter()
import json, statistics

def mem():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {{k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}}

{setup}
after_import = mem()
t = time.perf_counter()
{prepare}
prepare_s = time.perf_counter() - t
t = time.perf_counter()
{load}
load_s = time.perf_counter() - t
after_load = mem()
run()
after_run = mem()
for _ in range({warmup}):
    run()
times = []
for _ in range({runs}):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
print(json.dumps({{"numpy_import_s": t1 - t0, "import_s": t2 - t1, "load_s": load_s, "prepare_s": prepare_s,
                  "rss_import": after_import["VmRSS"], "rss_load": after_load["VmRSS"], "rss_run": after_run["VmRSS"],
                  "peak_run": after_run["VmHWM"], "run_s": statistics.median(times)}}))
"""

QRT_SETUP = "qrt.set_num_threads(1)\nx = np.zeros((1, {size}), np.float32)\nrun = lambda: model.run(x)"
TORCH_SETUP = ("torch.set_num_threads(1)\ntorch.set_grad_enabled(False)\nx = torch.zeros(1, {size})\n"
               "run = lambda: model(x)")
SKELETON = "net = torch.nn.Sequential(*[torch.ao.nn.quantized.dynamic.Linear({size}, {size}) for _ in range({layers})])"


def build(tmp: str) -> dict[str, str]:
    """The quantized torch model saved as state_dict and whole module, and its .qrt through the converter."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(SIZE, SIZE) for _ in range(LAYERS)])
    qmodel = torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
    paths = {k: os.path.join(tmp, f"model.{k}") for k in ("state", "module", "qrt")}
    torch.save(qmodel.state_dict(), paths["state"])
    torch.save(qmodel, paths["module"])
    qconvert.convert(paths["module"], paths["qrt"], trust_checkpoint=True, input_shapes=[f"1,{SIZE}"])
    x = np.random.default_rng(0).standard_normal((1, SIZE)).astype(np.float32)
    with torch.no_grad():
        diff = np.abs(qrt.load(paths["qrt"]).run(x) - qmodel(torch.from_numpy(x)).numpy()).max()
    print(f"model: {LAYERS} dynamic int8 Linear {SIZE}x{SIZE}; .qrt {os.path.getsize(paths['qrt']) / MIB:.1f} MiB, "
          f"state_dict {os.path.getsize(paths['state']) / MIB:.1f} MiB; max |qrt - torch| on one input: {diff:.3g}")
    return paths


def cases(paths: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """Case name -> (file, module imported, setup after import, untimed preparation, timed load statement)."""
    fmt = {"size": SIZE, "layers": LAYERS}
    q, t = QRT_SETUP.format(**fmt), TORCH_SETUP.format(**fmt)
    out = {"qrt.load": (paths["qrt"], "qrt", q, "", f"model = qrt.load({paths['qrt']!r})")}
    if "verify" in inspect.signature(qrt.load).parameters:
        out["qrt.load verify=False"] = (paths["qrt"], "qrt", q, "",
                                           f"model = qrt.load({paths['qrt']!r}, verify=False)")
    out["torch state_dict"] = (paths["state"], "torch", t, SKELETON.format(**fmt),
                               f"net.load_state_dict(torch.load({paths['state']!r}))\nmodel = net")
    out["torch.load(module)"] = (paths["module"], "torch", t, "",
                                 f"model = torch.load({paths['module']!r}, weights_only=False)")
    return out


def warm(path: str) -> None:
    """Read the file once so that it is in the page cache."""
    with open(path, "rb") as f:
        while f.read(16 * MIB):
            pass


def child(module: str, setup: str, prepare: str, load: str) -> dict:
    """Run one case in a fresh interpreter, one thread; its figures come back as JSON on stdout."""
    env = dict(os.environ, QRT_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    code = CHILD.format(module=module, setup=setup, prepare=prepare, load=load, warmup=WARMUP, runs=RUNS)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(paths: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    """Medians per case over `repeats` fresh processes, the cases interleaved."""
    todo = cases(paths)
    samples: dict[str, list[dict]] = {name: [] for name in todo}
    for _ in range(repeats):
        for name, (path, *code) in todo.items():
            warm(path)
            samples[name].append(child(*code))
    return {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}


def report(res: dict[str, dict[str, float]], file_size: int) -> None:
    names = list(res)
    for r in res.values():
        r["growth"] = (r["peak_run"] - r["rss_import"]) / file_size
    mib = lambda v: f"{v / MIB:9.1f} MiB"  # noqa: E731
    rows = [("import after numpy", "import_s", fmt_time, TARGETS["import"]),
            ("build skeleton", "prepare_s", fmt_time, "untimed"),
            ("load", "load_s", fmt_time, TARGETS["load"]),
            ("RSS after import", "rss_import", mib, ""),
            ("RSS after load", "rss_load", mib, ""),
            ("RSS after run", "rss_run", mib, ""),
            ("peak RSS after run", "peak_run", mib, ""),
            ("growth / file size", "growth", lambda v: f"{v:8.2f}x", TARGETS["growth"]),
            ("batch-1 run", "run_s", fmt_time, "")]
    print(f"numpy import alone: {fmt_time(statistics.median(r['numpy_import_s'] for r in res.values())).strip()}; "
          f"file {file_size / MIB:.1f} MiB; page cache warm; growth = (peak after run - RSS after import) / file")
    print(f"{'':20s}" + "".join(f"{n:>24s}" for n in names) + f"{'target':>10s}{'torch/qrt':>11s}")
    qrt_row, torch_row = res["qrt.load"], res["torch state_dict"]
    for label, key, show, target in rows:
        ratio = f"{torch_row[key] / qrt_row[key]:10.2f}x" if qrt_row[key] > 1e-5 else f"{'-':>11s}"
        print(f"{label:20s}" + "".join(f"{show(res[n][key]) if res[n][key] > 1e-5 else '-':>24s}" for n in names)
              + f"{target:>10s}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 processes per case instead of 7")
    parser.add_argument("--json", default=os.path.join(HERE, "results_load.json"), help="write the raw figures here")
    args = parser.parse_args()
    info = machine()
    ort = importlib.util.find_spec("onnxruntime") and importlib.metadata.version("onnxruntime")
    print(machine_line(info, ort or None, "1 thread each, a fresh process per sample, page cache warm"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = build(tmp)
        res = measure(paths, 3 if args.quick else 7)
        file_size = os.path.getsize(paths["qrt"])
        report(res, file_size)
    write_json(args.json, {"machine": info, "file_bytes": file_size, "targets": TARGETS, "cases": res})


if __name__ == "__main__":
    main()

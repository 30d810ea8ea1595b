"""The qrt command line: inspect, run and bench .qrt models.

    qrt inspect model.qrt [--json]
    qrt run model.qrt --input x.npy [--output y.npz] [--device cuda]
    qrt bench model.qrt --batch 8 --seconds 5 [--threads 4] [--device cuda]

Every error is one line on stderr, ``qrt COMMAND: error: ...``, with exit
status 2. The runtime never imports torch nor the converter's tools: the
layer-by-layer comparison with PyTorch is the converter's own command,
``qrt-compare`` (tools/compare.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import __version__
from . import format as qformat
from . import io as qio
from ._kernels import kernel_variant_info
from .errors import FormatError
from .graph import Node, Tree, ValueSpec, tree_names, tree_text
from .layout import PackedMatrix
from .model import Model
from .ops import OPS, ValueInfo
from .threads import thread_info

EXIT_ERROR = 2


class CLIError(Exception):
    """A user-facing failure: the message is printed as it is, and qrt exits with status 2."""


# ------------------------------------------------------------ shared helpers


def _check_path(path: str, what: str = "model file") -> None:
    if not os.path.exists(path):
        raise CLIError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise CLIError(f"{what} {path!r} is a directory")


def _load_file(path: str) -> qformat.QrtFile:
    _check_path(path)
    try:
        return qformat.load_file(path)
    except FormatError as e:
        raise CLIError(f"{path} is not a valid .qrt model: {e}") from None
    except OSError as e:
        raise CLIError(f"cannot read {path!r}: {e.strerror or e}") from None


def _load_model(path: str, device: str = "cpu") -> Model:
    _check_path(path)
    try:
        return Model(path, device)
    except FormatError as e:
        raise CLIError(f"{path} is not a valid .qrt model: {e}") from None
    except OSError as e:
        raise CLIError(f"cannot read {path!r}: {e.strerror or e}") from None
    except RuntimeError as e:  # qrt.gpu.CUDAUnavailableError: CuPy, the driver or a GPU is missing
        raise CLIError(str(e)) from None


def _describe(shape: Sequence) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as left-aligned text columns under a ruled header (qrt's commands and qrt-compare)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _gather_inputs(specs: Sequence[ValueSpec], single: Sequence[str] | None, npz: str | None) -> dict:
    """Inputs by name from --input [NAME=]FILE.npy (repeatable) or --inputs FILE.npz."""
    try:
        return qio.load_inputs(specs, single or (), npz)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _run(model: Model, inputs: Mapping[str, Any]) -> Any:
    try:
        return model.run(dict(inputs))
    except ValueError as e:  # wrong dtype / shape, named by the runtime
        raise CLIError(f"inputs do not fit the model: {e}") from None


def _flat_outputs(tree: Tree, out: Any, flat: list) -> list:
    """The arrays of a nested result, at their indices in the model's flat outputs."""
    if isinstance(tree, int):
        flat[tree] = out
    else:
        for t, o in zip(tree, out):
            _flat_outputs(t, o, flat)
    return flat


# ------------------------------------------------------------ inspect


def _qparam_summary(scale: np.ndarray, zp: np.ndarray) -> str:
    if scale.ndim == 0:
        return f"s={float(scale):.6g} z={int(zp)}"
    return f"per-channel[{scale.size}] s={float(scale.min()):.3g}..{float(scale.max()):.3g}"


def quantization_summary(node: Node, tensors: Mapping[str, np.ndarray]) -> list[str]:
    """One short phrase per quantized operand of a node: weights, activations, output."""
    parts = []
    ins = node.inputs
    weights = {port: tensors[v] for port, v in ins.items() if port.endswith("weight") and v in tensors}
    for port, value in ins.items():
        if port in weights:
            prefix = port[: -len("weight")]
            w = weights[port]
            if w.dtype == np.float16:
                parts.append(f"{prefix}weight f16")
            elif f"{port}_zero_point" in ins:
                s, z = tensors[ins[f"{port}_scale"]], tensors[ins[f"{port}_zero_point"]]
                parts.append(f"{prefix}weight i8 {_qparam_summary(s, z)}")
            elif f"{port}_scale" in ins:  # an embedding table: a scale and a bias per row
                parts.append(f"{prefix}weight {node.attrs['bits']}-bit rows, scale and bias per row")
            else:
                parts.append(f"{prefix}weight f32")
        elif port.endswith("scale") and not port.endswith("weight_scale") and value in tensors:
            prefix = port[: -len("scale")]
            zp = tensors[ins[f"{prefix}zero_point"]]
            parts.append(f"{prefix.rstrip('_') or node.op.split('_')[0]} {_qparam_summary(tensors[value], zp)}")
    if "dtype" in node.attrs:
        parts.insert(0, node.attrs["dtype"])
    qnnpack = node.attrs.get("engine") == "qnnpack"
    if node.op.endswith("_dynamic") and all(w.dtype == np.float16 for w in weights.values()):
        parts.append("x float32")  # float16 weights: the product is float, nothing is quantized per call
    elif node.op.endswith("_dynamic") and node.attrs.get("activation") == "per_row_symmetric":
        parts.append("x quantized per row, symmetric")
    elif node.op.endswith("_dynamic"):
        rr = node.attrs.get("reduce_range") and not qnnpack  # qnnpack ignores it
        parts.append("x quantized per call" + (" (reduce_range)" if rr else ""))
    if qnnpack:
        parts.insert(0, "qnnpack")
    if len(parts) > 4:  # whole-sequence ops carry one weight set per layer and direction
        parts = parts[:3] + [f"+{len(parts) - 3} more"]
    return parts


def _value_json(name: str, info: ValueInfo) -> dict:
    return {"name": name, "dtype": info.dtype, "shape": list(info.shape)}


def inspect_report(path: str) -> dict:
    """Everything `qrt inspect` shows, as plain JSON-able data."""
    qfile = _load_file(path)
    g, tensors = qfile.graph, qfile.tensors
    meta = dict(qfile.metadata)
    nodes = []
    for n in g.nodes:
        op = OPS[n.op]
        runtime = {p: v for p, v in n.inputs.items() if not op.port(p).const}
        nodes.append(
            {
                "name": n.name,
                "op": n.op,
                "inputs": {p: _value_json(v, g.values[v]) for p, v in runtime.items()},
                "outputs": [_value_json(o, g.values[o]) for o in n.outputs],
                "attrs": dict(n.attrs),
                "quantization": quantization_summary(n, tensors),
            }
        )
    by_dtype: dict[str, int] = {}
    for t in tensors.values():
        parts = [t.data, t.row_sums] if isinstance(t, PackedMatrix) else [t]  # a packed matrix's row sums are int32
        for a in parts:
            if a is not None:
                by_dtype[a.dtype.name] = by_dtype.get(a.dtype.name, 0) + a.nbytes
    return {
        "file": path,
        "file_bytes": os.path.getsize(path),
        "format_version": qfile.version,
        "producer": meta.get(qformat.META_PRODUCER),
        "kernels": kernel_variant_info(),  # what this machine would run it with
        "threads": dataclasses.asdict(thread_info()),  # and on how many threads, and why that many
        # load_file refuses a file whose data does not hash to the header's checksum.
        "checksum": _checksum_json(meta, qfile.version),
        "metadata": {k: v for k, v in meta.items() if k not in qformat.RESERVED_META},
        "inputs": [_value_json(s.name, ValueInfo(s.dtype, s.shape)) for s in g.inputs],
        "outputs": [_value_json(s.name, ValueInfo(s.dtype, s.shape)) for s in g.outputs],
        # forward()'s arguments, each an input name or nested lists of names
        "input_structure": tree_names(g.input_structure, g.inputs),
        # "single", "tuple", or what the model returns as nested lists of output names
        "output_structure": _structure_json(g.output_structure, g.outputs),
        "nodes": nodes,
        "tensors": [
            {
                "name": k,
                "dtype": t.dtype.name,
                "shape": list(t.shape),
                "bytes": int(t.nbytes),
                "packed": isinstance(t, PackedMatrix),  # in the kernels' layout; bytes include its row sums
            }
            for k, t in tensors.items()
        ],
        "bytes_by_dtype": dict(sorted(by_dtype.items())),
        "tensor_bytes": sum(by_dtype.values()),
    }


def _checksum_json(meta: dict, version: int) -> dict:
    if version >= qformat.PACKED_SINCE:
        algorithm, value = meta[qformat.META_CHECKSUM].split(":")
        return {"algorithm": algorithm, "status": "ok", "value": value}
    return {"algorithm": "sha256", "status": "ok", "value": meta[qformat.META_SHA256]}


def _structure_json(tree: Tree, specs: Sequence[ValueSpec]) -> Any:
    if isinstance(tree, int):
        return "single"
    if tree == tuple(range(len(specs))):
        return "tuple"
    return tree_names(tree, specs)


def _io(values: Sequence[dict]) -> str:
    return ", ".join(f"{v['name']}: {v['dtype']}{_describe(v['shape'])}" for v in values)


def cmd_inspect(args: argparse.Namespace) -> int:
    r = inspect_report(args.model)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['file']}: {_human_bytes(r['file_bytes'])}, qrt format v{r['format_version']}, producer {r['producer']}")
    print(f"checksum: {r['checksum']['status']} ({r['checksum']['algorithm']} {r['checksum']['value'][:16]}...)")
    k = r["kernels"]
    print(f"kernels here: {k['variant']} (int8 {k['int8']}, float {k['float']}), {thread_info().describe()}")
    for k, v in r["metadata"].items():
        print(f"  {k}: {v if len(v) <= 100 else v[:97] + '...'}")
    print(f"inputs:  {_io(r['inputs'])}")
    if list(r["input_structure"]) != [v["name"] for v in r["inputs"]]:  # some arguments are tuples
        print(f"called as: {tree_text(r['input_structure'])}")
    structure = r["output_structure"]
    shown = f"({structure})" if isinstance(structure, str) else f"returned as {tree_text(structure)}"
    print(f"outputs: {_io(r['outputs'])} {shown}")
    print(f"\nnodes ({len(r['nodes'])}, in execution order):")
    rows = []
    for n in r["nodes"]:
        ins = ", ".join(f"{p}={v['dtype']}{_describe(v['shape'])}" for p, v in n["inputs"].items())
        outs = ", ".join(f"{v['dtype']}{_describe(v['shape'])}" for v in n["outputs"])
        rows.append([n["name"], n["op"], ins, outs, "; ".join(n["quantization"])])
    print(format_table(["name", "op", "inputs", "outputs", "quantization"], rows))
    print(f"\ntensors ({len(r['tensors'])}):")
    rows = [[t["name"], t["dtype"], _describe(t["shape"]), t["bytes"], "packed" if t["packed"] else "plain"]
            for t in r["tensors"]]
    print(format_table(["name", "dtype", "shape", "bytes", "layout"], rows))
    print("\nbytes by dtype:")
    total = r["tensor_bytes"]
    rows = [[k, v, f"{100 * v / total:.1f}%" if total else "-"] for k, v in r["bytes_by_dtype"].items()]
    rows.append(["total", total, _human_bytes(total)])
    print(format_table(["dtype", "bytes", "share"], rows))
    return 0


# ------------------------------------------------------------ run


def _format_output(name: str, a: Any) -> str:
    a = np.asarray(a)
    body = np.array2string(a, threshold=40, edgeitems=3, precision=6)
    return f"{name}: {a.dtype}{list(a.shape)}\n{body}"


def cmd_run(args: argparse.Namespace) -> int:
    if not args.input and args.inputs is None:
        raise CLIError("give the inputs: --input FILE.npy (or NAME=FILE.npy, repeated) or --inputs FILE.npz")
    if args.output is not None:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise CLIError(f"cannot write {args.output!r}: directory {folder!r} does not exist")
    model = _load_model(args.model, args.device)
    inputs = _gather_inputs(model.inputs, args.input, args.inputs)
    outs = _flat_outputs(model.graph.output_structure, _run(model, inputs), [None] * len(model.outputs))
    named = {s.name: np.asarray(o) for s, o in zip(model.outputs, outs)}
    if args.output is None:
        for name, a in named.items():
            print(_format_output(name, a))
        return 0
    if args.output.endswith(".npy") and len(named) != 1:
        raise CLIError(f"the model has {len(named)} outputs {list(named)}: write them to an .npz file")
    data = io.BytesIO()  # written whole or not at all: a failed write keeps the file that was there
    if args.output.endswith(".npy"):
        np.save(data, next(iter(named.values())))
    else:
        np.savez(data, **named)  # to a path, np.savez would append .npz to another suffix
    try:
        qformat.write_atomic(args.output, data.getvalue())
    except OSError as e:
        raise CLIError(f"cannot write {args.output!r}: {e.strerror or e}") from None
    shapes = ", ".join(f"{k}: {a.dtype}{list(a.shape)}" for k, a in named.items())
    print(f"wrote {args.output} ({shapes})")
    return 0


# ------------------------------------------------------------ bench


class Progress:
    """A one-line progress bar on stderr (no dependency), redrawn at most 10 times a second."""

    def __init__(self, label: str, total: float, enabled: bool = True, width: int = 30) -> None:
        self.label, self.total, self.enabled, self.width = label, total, enabled, width
        self.last = 0.0
        # Redrawing with \r only makes sense on a terminal; a log gets the final line alone.
        self.live = enabled and sys.stderr.isatty()

    def update(self, done: float, note: str = "", force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and (not self.live or now - self.last < 0.1)):
            return
        self.last = now
        frac = min(max(done / self.total, 0.0), 1.0) if self.total > 0 else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r{self.label:<9} [{bar}] {100 * frac:5.1f}% {note}")
        sys.stderr.flush()

    def close(self, note: str = "") -> None:
        if self.enabled:
            self.update(self.total, note, force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()


def _timed_loop(
    run_once: Callable[[], None], seconds: float, min_runs: int, label: str, progress: bool
) -> list[float]:
    """Run until `seconds` have passed and at least `min_runs` runs are done; per-run latencies in seconds."""
    bar = Progress(label, seconds, progress)
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        run_once()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        elapsed = t1 - start
        bar.update(elapsed, f"{elapsed:.1f}/{seconds:g} s, {len(times)} runs")
        if elapsed >= seconds and len(times) >= min_runs:
            break
    bar.close(f"{time.perf_counter() - start:.1f} s, {len(times)} runs")
    return times


def _set_threads(threads: int | None) -> int | None:
    if threads is None:
        return None
    if threads < 1:
        raise CLIError(f"--threads must be at least 1, got {threads}")
    import qrt

    setter = getattr(qrt, "set_num_threads", None)
    if setter is None:
        raise CLIError("--threads needs qrt.set_num_threads, which this build of qrt does not have yet")
    try:
        setter(threads)
    except ValueError as e:  # past qrt's limit
        raise CLIError(f"--threads: {e}") from None
    return threads


def _device_runner(model: Model, inputs: dict, device: str) -> Callable[[], None]:
    """One timed call. On the GPU the inputs live on the device and each run waits for the GPU to finish."""
    if device != "cuda":
        return lambda: model.run(inputs)
    import cupy

    dev_inputs = {k: cupy.asarray(v) for k, v in inputs.items()}
    stream = cupy.cuda.get_current_stream()

    def run_once() -> None:
        model.run(dev_inputs)
        stream.synchronize()

    return run_once


def cmd_bench(args: argparse.Namespace) -> int:
    if args.batch < 1 or args.seq < 1 or args.min_runs < 1:
        raise CLIError("--batch, --seq and --min-runs must be at least 1")
    if not (0 < args.seconds < math.inf and 0 <= args.warmup < math.inf):  # NaN too: it never ends a loop
        raise CLIError("--seconds must be positive and --warmup non-negative, both finite")
    threads = _set_threads(args.threads)
    model = _load_model(args.model, args.device)
    if args.inputs is not None or args.input:
        inputs = _gather_inputs(model.inputs, args.input, args.inputs)
        source = "given"
    else:
        try:
            inputs = qio.random_inputs(model.graph, args.batch, args.seq, args.seed)
        except ValueError as e:  # too large to make
            raise CLIError(str(e)) from None
        source = "random"
    _run(model, inputs)  # checks the inputs fit, with a clear message, before timing anything
    run_once = _device_runner(model, inputs, args.device)
    progress = not args.quiet
    if args.warmup > 0:
        _timed_loop(run_once, args.warmup, 3, "warm-up", progress)
    times = np.array(_timed_loop(run_once, args.seconds, args.min_runs, "measuring", progress))
    time_axes = qio.time_axes(model.graph)
    # Samples per run: the size of the first input's batch dimension (its first free, non-time dimension).
    first = model.inputs[0]
    batch_axis = next(
        (i for i, d in enumerate(first.shape) if d is None and time_axes.get(first.name) != i), None
    )
    samples = int(np.shape(inputs[first.name])[batch_axis]) if batch_axis is not None else 1
    ms = times * 1e3
    result = {
        "model": args.model,
        "device": args.device,
        "threads": threads,
        "inputs": {k: {"dtype": str(np.asarray(v).dtype), "shape": list(np.shape(v))} for k, v in inputs.items()},
        "input_source": source,
        "runs": int(times.size),
        "samples_per_run": samples,
        "latency_ms": {
            "mean": float(ms.mean()),
            "min": float(ms.min()),
            "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
        },
        "runs_per_s": float(times.size / times.sum()),
        "samples_per_s": float(samples * times.size / times.sum()),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    shapes = ", ".join(f"{k}: {v['dtype']}{v['shape']}" for k, v in result["inputs"].items())
    print(f"{args.model} on {args.device}, threads {threads or 'default'}, {source} inputs {shapes}")
    lat = result["latency_ms"]
    print(f"runs: {result['runs']} in {times.sum():.2f} s")
    print(
        f"latency ms: p50 {lat['p50']:.4f}  p90 {lat['p90']:.4f}  p99 {lat['p99']:.4f}  "
        f"(mean {lat['mean']:.4f}, min {lat['min']:.4f}, max {lat['max']:.4f})"
    )
    print(
        f"throughput: {result['runs_per_s']:.1f} runs/s, {result['samples_per_s']:.1f} samples/s "
        f"(batch {samples})"
    )
    return 0


# ------------------------------------------------------------ argument parsing

EXAMPLES = {
    "inspect": """examples:
  qrt inspect model.qrt                 # header, nodes, tensors, bytes by dtype
  qrt inspect model.qrt --json | jq .nodes""",
    "run": """examples:
  qrt run model.qrt --input x.npy                      # print the outputs
  qrt run model.qrt --inputs in.npz --output out.npz   # arrays by input name -> outputs by name
  qrt run step.qrt --input x=x.npy --input h=h.npy --device cuda""",
    "bench": """examples:
  qrt bench model.qrt                              # batch 1, random inputs, 3 s
  qrt bench model.qrt --batch 64 --seconds 10 --threads 4
  qrt bench lstm.qrt --batch 8 --seq 100 --device cuda
  qrt bench model.qrt --inputs in.npz --json""",
}


def _add_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", metavar="[NAME=]FILE.npy", help="one input array; NAME= when several")
    p.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name (a single array for one input)")


def _add_shape_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=1, help="size of free batch dimensions of random inputs (1)")
    p.add_argument("--seq", type=int, default=16, help="size of free time dimensions of sequence inputs (16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="qrt",
        description="qrt: inspect, run and time quantized models (.qrt files).",
        epilog="run 'qrt COMMAND --help' for a command's options and examples; docs/USER_GUIDE.md has the rest. "
        "qrt-compare (with the converter) compares a model with PyTorch layer by layer.",
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"qrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "inspect", help="what a model file holds", epilog=EXAMPLES["inspect"], formatter_class=fmt,
        description="Format version, producer, checksum, nodes, tensors, inputs and outputs of a .qrt file.",
    )
    p.add_argument("model", metavar="MODEL.qrt")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect, parser=p)

    p = sub.add_parser(
        "run", help="run a model on arrays from files", epilog=EXAMPLES["run"], formatter_class=fmt,
        description="Run a model on .npy / .npz inputs; print the outputs or write them to .npz (or .npy).",
    )
    p.add_argument("model", metavar="MODEL.qrt")
    _add_inputs(p)
    p.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs here, by output name")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.set_defaults(func=cmd_run, parser=p)

    p = sub.add_parser(
        "bench", help="latency percentiles and throughput", epilog=EXAMPLES["bench"], formatter_class=fmt,
        description="Warm up, then run the model repeatedly: latency p50 / p90 / p99 and throughput. "
        "Random inputs of the model's shapes and dtypes unless given.",
    )
    p.add_argument("model", metavar="MODEL.qrt")
    _add_inputs(p)
    _add_shape_flags(p)
    p.add_argument("--threads", type=int, help="kernel threads (qrt.set_num_threads)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time (3)")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up time in seconds (0.5)")
    p.add_argument("--min-runs", type=int, default=10, help="measure at least this many runs (10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench, parser=p)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `qrt` console script and `python -m qrt`; returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    if unknown:  # said by the command's parser: "qrt run: error: ..." with its usage
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except CLIError as e:
        print(f"qrt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `qrt inspect --json | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"qrt {args.command}: interrupted", file=sys.stderr)
        return 130

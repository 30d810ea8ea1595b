"""`qrt compare`: a converted model against PyTorch's quantization of the same checkpoint, layer by layer.

It lives with the converter because it needs PyTorch and the converter's
rules; `qrt compare` (qrt/cli.py) imports it only when that command runs, so
the runtime itself never imports torch. For each layer it reports the
largest absolute error, the signal-to-quantization-noise ratio and the share
of identical integers against PyTorch's quantized model, and the same
against the float model (the quantization error itself); --plot draws them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from qrt import format as qformat
from qrt.cli import (
    CLIError,
    _check_path,
    _gather_inputs,
    _load_file,
    _load_model,
    _run,
    _table,
    random_inputs,
)
from qrt.graph import Graph, Node
from qrt.model import Model

from . import convert, qrt_backend


def sqnr_db(reference: np.ndarray, x: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio of x against reference, in dB (inf when identical)."""
    ref = reference.astype(np.float64)
    noise = float(np.sum((x.astype(np.float64) - ref) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _layer_map(model: Model) -> dict[str, str]:
    """Module path -> qrt value holding its output, as the converter recorded it."""
    text = model.metadata.get("converter.layers")
    if text is not None:
        try:
            layers = json.loads(text)
        except ValueError:
            raise CLIError(f"{model.path}: metadata converter.layers is not valid JSON") from None
        return {k: v for k, v in layers.items() if v in model.graph.values}
    # Files from older converters: nodes are named after their fx node, the module path with '.' -> '_'.
    return {n.name: n.outputs[0] for n in model.graph.nodes if n.op in ("linear", "linear_dynamic")}


def _producer_of(graph: Graph, value: str) -> Node | None:
    for n in graph.nodes:
        if value in n.outputs:
            return n
    return None


def _dequantize_qrt(graph: Graph, tensors: Mapping[str, np.ndarray], value: str, a: np.ndarray) -> np.ndarray:
    """A qrt value as float: integers dequantized with the qparams of the node that produced them."""
    if a.dtype.kind == "f":
        return a.astype(np.float32)
    node = _producer_of(graph, value)
    while node is not None and node.op == "flatten":  # flatten keeps its input's qparams
        node = _producer_of(graph, node.inputs["x"])
    port = {"linear": "y_", "quantize_per_tensor": ""}.get(node.op if node else "")
    if port is None:
        raise CLIError(f"cannot tell the scale of quantized value {value!r}")
    scale = tensors[node.inputs[f"{port}scale"]]
    zp = tensors[node.inputs[f"{port}zero_point"]]
    return ((a.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale).astype(np.float32)


def _with_outputs(qfile: qformat.QrtFile, extra: Sequence[str], folder: str) -> Model:
    """The same model with `extra` values added to its outputs (through the public file format)."""
    graph = json.loads(qfile.metadata[qformat.META_GRAPH])
    graph["outputs"] = list(graph["outputs"]) + [v for v in extra]
    graph["output_structure"] = "tuple"
    meta = {k: v for k, v in qfile.metadata.items() if k not in qformat.RESERVED_META}
    path = os.path.join(folder, "layers.qrt")
    qformat.save(path, graph, qfile.tensors, meta)
    return Model(path)


def _torch_value(t: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(float values, integer representation or None) of a torch output."""
    if isinstance(t, (tuple, list)):
        t = t[0]
    if t.is_quantized:
        return t.dequantize().numpy(), t.int_repr().numpy()
    return t.detach().float().numpy(), None


def _agreement(ref: np.ndarray | None, ref_int: np.ndarray | None, x: np.ndarray, x_int: np.ndarray | None) -> dict:
    if ref is None:
        return {}
    if ref.shape != x.shape:
        return {"note": f"shapes differ: qrt {list(x.shape)}, torch {list(ref.shape)}"}
    out = {"max_abs_error": float(np.max(np.abs(x - ref))) if x.size else 0.0, "sqnr_db": sqnr_db(ref, x)}
    if ref_int is not None and x_int is not None:
        out["identical"] = float(np.mean(ref_int.astype(np.int64) == x_int.astype(np.int64))) if x.size else 1.0
        out["identical_of"] = "integers"
    else:
        out["identical"] = float(np.mean(ref == x)) if x.size else 1.0
        out["identical_of"] = "floats"
    return out


def _capture(torch: Any, module: Any, paths: Sequence[str], inputs: Sequence[Any]) -> tuple[Any, dict]:
    """Run module on inputs, recording the outputs of the submodules at paths."""
    modules = dict(module.named_modules())
    seen: dict[str, Any] = {}
    hooks = []
    for p in paths:
        if p in modules:
            hooks.append(modules[p].register_forward_hook(lambda m, i, o, p=p: seen.__setitem__(p, o)))
    try:
        with torch.no_grad():
            out = module(*inputs)
    except Exception as e:
        raise CLIError(f"the PyTorch model does not run on these inputs: {type(e).__name__}: {e}") from None
    finally:
        for h in hooks:
            h.remove()
    return out, seen


def _warn(msg: str) -> None:
    print(f"qrt compare: warning: {msg}", file=sys.stderr)


def _torch_models(args: argparse.Namespace, model: Model, torch: Any, convert: Any, backend: Any, names: list):
    """(PyTorch's quantized model, the float model with fused modules or None, the float model or None)."""
    meta = model.metadata
    mode = meta["converter.mode"]
    try:
        rules = convert.startup_rules(args.rules)
        net = convert.load_model(args.checkpoint, args.model, args.trust_checkpoint)
    except convert.ConvertError as e:
        raise CLIError(str(e)) from None
    if meta.get("converter.rules") not in (None, rules.name):
        raise CLIError(
            f"{args.model_file} was converted with rules {meta['converter.rules']!r}, not {rules.name!r}: "
            "pass the same --rules FILE"
        )
    if meta.get("converter.checkpoint_sha256") not in (None, convert._sha256(args.checkpoint)):
        _warn(f"{args.checkpoint} is not the checkpoint {args.model_file} was converted from")
    if mode == "prequantized":
        return net, None, None
    wanted = meta.get("converter.weights", "per-tensor")
    weight_dtype, weights = ("float16", "per-tensor") if wanted == "float16" else ("qint8", wanted)
    example = [torch.zeros((1, *s.shape[1:]), dtype=torch.float32) for s in model.inputs]
    try:
        prepared = backend.prepare(net, rules, mode, weight_dtype, weights, example)
    except Exception as e:
        raise CLIError(f"cannot quantize the PyTorch model ({type(e).__name__}: {e})") from None
    if mode == "static":
        try:
            data = convert.load_calibration(args.calib, names)
        except convert.ConvertError as e:
            raise CLIError(str(e)) from None
        if meta.get("converter.calib_sha256") not in (None, convert._sha256(args.calib)):
            _warn(f"{args.calib} is not the calibration data {args.model_file} was converted with")
        batch = int(meta.get("converter.calib_batch_size", 32))
        n = next(iter(data.values())).shape[0]
        batches = ([torch.from_numpy(data[k][i : i + batch]) for k in names] for i in range(0, n, batch))
        backend.calibrate(prepared, batches)
    return backend.to_native(prepared, rules), prepared, net


def compare_report(args: argparse.Namespace) -> dict:
    # Everything that needs no PyTorch is checked first: importing it takes seconds.
    model = _load_model(args.model_file)
    qfile = _load_file(args.model_file)
    mode = model.metadata.get("converter.mode")
    if mode is None:
        raise CLIError(
            f"{args.model_file} has no converter.mode metadata: compare needs a model written by tools/convert.py"
        )
    if mode == "static" and args.calib is None:
        raise CLIError(
            f"{args.model_file} is statically quantized: pass --calib with the calibration data it was converted with"
        )
    names = [s.name for s in model.inputs]
    if args.inputs is not None:
        inputs = _gather_inputs(model.inputs, None, args.inputs)
    else:
        inputs = random_inputs(model.graph, args.batch, args.seq, args.seed)
    _run(model, inputs)  # fit check with the runtime's own message
    native, fused_float, float_net = _torch_models(args, model, torch, convert, qrt_backend, names)

    layers = _layer_map(model)
    order = {v: i for i, n in enumerate(model.graph.nodes) for v in n.outputs}
    layers = dict(sorted(layers.items(), key=lambda kv: order.get(kv[1], -1)))
    with tempfile.TemporaryDirectory(prefix="qrt-compare-") as folder:
        traced = _with_outputs(qfile, list(layers.values()), folder)
        qrt_all = list(traced.run(dict(inputs)))
    n_out = len(model.outputs)
    qrt_outputs, qrt_layers = qrt_all[:n_out], dict(zip(layers, qrt_all[n_out:]))

    t_inputs = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names]
    t_out, t_layers = _capture(torch, native, list(layers), t_inputs)
    f_layers: dict = {}
    f_out = None
    if fused_float is not None:
        _, f_layers = _capture(torch, fused_float, list(layers), t_inputs)
        f_out, _ = _capture(torch, float_net, [], t_inputs)

    rows = []
    for path, value in layers.items():
        node = _producer_of(model.graph, value)
        x_raw = np.asarray(qrt_layers[path])
        x = _dequantize_qrt(model.graph, qfile.tensors, value, x_raw)
        x_int = x_raw if x_raw.dtype.kind in "iu" else None
        row = {"layer": path, "qrt_value": value, "op": node.op if node else "?", "dtype": str(x_raw.dtype)}
        if path in t_layers:
            row["vs_torch_quantized"] = _agreement(*_torch_value(t_layers[path]), x, x_int)
        else:
            row["vs_torch_quantized"] = {"note": f"no module {path!r} in PyTorch's quantized model"}
        if path in f_layers:
            row["vs_float"] = _agreement(_torch_value(f_layers[path])[0], None, x, None)
        rows.append(row)

    def as_list(o: Any) -> list:
        return list(o) if isinstance(o, (tuple, list)) else [o]

    outputs = []
    for i, spec in enumerate(model.outputs):
        x = np.asarray(qrt_outputs[i]).astype(np.float32)
        row = {"output": spec.name, "vs_torch_quantized": _agreement(*_torch_value(as_list(t_out)[i]), x, None)}
        if f_out is not None:
            row["vs_float"] = _agreement(_torch_value(as_list(f_out)[i])[0], None, x, None)
        outputs.append(row)
    return {
        "model": args.model_file,
        "mode": model.metadata.get("converter.mode"),
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in inputs.items()},
        "layers": rows,
        "outputs": outputs,
    }


def _fmt(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "db":
        return "exact" if v == math.inf else f"{v:.1f}"
    if kind == "pct":
        return f"{100 * v:.2f}%"
    return f"{v:.3g}"


def _print_compare(r: dict) -> None:
    shapes = ", ".join(f"{k}: {v['dtype']}{v['shape']}" for k, v in r["inputs"].items())
    print(f"{r['model']} ({r['mode']}), inputs {shapes}")
    print("qrt against PyTorch's quantized model (same rules) and against the float model, layer by layer:\n")
    headers = ["layer", "qrt value", "op", "dtype", "max|err| q", "SQNR q dB", "identical", "max|err| f", "SQNR f dB"]
    rows, notes = [], []
    for row in r["layers"] + r["outputs"]:
        q, f = row.get("vs_torch_quantized", {}), row.get("vs_float", {})
        for part in (q, f):
            if "note" in part:
                notes.append(f"{row.get('layer', row.get('output'))}: {part['note']}")
        name = row["layer"] if "layer" in row else f"output {row['output']}"
        rows.append(
            [
                name,
                row.get("qrt_value", ""),
                row.get("op", ""),
                row.get("dtype", "float32"),
                _fmt(q.get("max_abs_error"), "g"),
                _fmt(q.get("sqnr_db"), "db"),
                _fmt(q.get("identical"), "pct") + (" int" if q.get("identical_of") == "integers" else ""),
                _fmt(f.get("max_abs_error"), "g"),
                _fmt(f.get("sqnr_db"), "db"),
            ]
        )
    print(_table(headers, rows))
    print(
        "\nq: against PyTorch's quantized model; f: against the float model (the quantization error itself).\n"
        "identical: share of equal elements (integers for quantized layers, 'int'; exact floats otherwise)."
    )
    for n in notes:
        print(f"note: {n}")


def plot_compare(r: dict, path: str) -> None:
    """Per-layer figures: SQNR against both references, identical share, max abs error."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install matplotlib") from None
    rows = r["layers"]
    labels = [row["layer"] for row in rows]
    xs = np.arange(len(rows))

    def series(ref: str, key: str) -> np.ndarray:
        return np.array([row.get(ref, {}).get(key, np.nan) for row in rows], dtype=float)

    sq_q, sq_f = series("vs_torch_quantized", "sqnr_db"), series("vs_float", "sqnr_db")
    finite = np.concatenate([sq_q[np.isfinite(sq_q)], sq_f[np.isfinite(sq_f)]])
    cap = (float(finite.max()) if finite.size else 0.0) + 20.0  # where "exact" (inf) is drawn
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, 0.9 * len(rows) + 3), 9), sharex=True)
    w = 0.38
    axes[0].bar(xs - w / 2, np.where(np.isinf(sq_q), cap, sq_q), w, label="vs PyTorch quantized")
    axes[0].bar(xs + w / 2, np.where(np.isinf(sq_f), cap, sq_f), w, label="vs float")
    for i in np.flatnonzero(np.isinf(sq_q)):
        axes[0].text(xs[i] - w / 2, cap, "exact", ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("SQNR (dB)")
    axes[0].set_ylim(min(0.0, float(finite.min()) if finite.size else 0.0), cap * 1.25 + 1)  # room for labels
    axes[0].legend(fontsize=8, loc="upper right", ncol=2)
    axes[0].set_title(f"qrt layer by layer: {os.path.basename(r['model'])} ({r['mode']})")
    axes[1].bar(xs, 100 * series("vs_torch_quantized", "identical"), 0.6, color="tab:green")
    axes[1].set_ylabel("identical to PyTorch (%)")
    axes[1].set_ylim(0, 105)
    err_q, err_f = series("vs_torch_quantized", "max_abs_error"), series("vs_float", "max_abs_error")
    axes[2].bar(xs - w / 2, err_q, w, label="vs PyTorch quantized")
    axes[2].bar(xs + w / 2, err_f, w, label="vs float")
    if np.nanmax(np.concatenate([err_q, err_f, [0.0]])) > 0:
        axes[2].set_yscale("symlog", linthresh=1e-6)
    axes[2].set_ylabel("max |error|")
    axes[2].legend(fontsize=8)
    axes[2].set_xticks(xs, labels, rotation=30, ha="right")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as e:
        raise CLIError(f"cannot write {path!r}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def cmd_compare(args: argparse.Namespace) -> int:
    _check_path(args.checkpoint, "checkpoint")
    if args.plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise CLIError(f"cannot write {args.plot!r}: its directory does not exist")
    r = compare_report(args)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        _print_compare(r)
    if args.plot is not None:
        plot_compare(r, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0



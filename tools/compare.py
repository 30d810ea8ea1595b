"""qrt-compare: a converted model against PyTorch's quantization of the same checkpoint, layer by layer.

    qrt-compare model.qrt --checkpoint model.pt --model mypkg.models:make_mlp [--plot layers.png]
    qrt-compare static.qrt --checkpoint model.pt --model mypkg.models:make_mlp --calib calib.npz
    python tools/compare.py model.qrt --checkpoint model.pt --model mypkg.models:make_mlp   (a checkout)

It stands beside the converter because it needs PyTorch and the converter's rules; it uses qrt only
through its public API (the runtime never imports torch nor this package). For each layer it
reports the largest absolute error, the signal-to-quantization-noise ratio and the share of
identical integers against PyTorch's quantized model, and the same against the float model (the
quantization error itself); a recurrent layer gets one row per tensor it returns (an LSTM's
y, h_n and c_n). Models taking and returning nested tuples (an LSTM's state (h, c)) are called as
their forward() takes them. --plot draws the figures. Errors exit with status 2.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run as a script from a checkout: run it as the package module tools.compare, through compare_main,
    # which says how to get PyTorch when it is missing (the repository root holds tools/ and qrt/).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools import compare_main

    sys.exit(compare_main())

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import qrt  # noqa: E402
from qrt import format as qformat  # noqa: E402
from qrt import io as qio  # noqa: E402
from qrt.cli import format_table  # noqa: E402
from qrt.graph import Graph, Node, Tree, tree_names, tree_text  # noqa: E402

from . import convert, qrt_backend  # noqa: E402


class CompareError(Exception):
    """The comparison cannot be made; the message says why, for the user."""


def _check_path(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise CompareError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise CompareError(f"{what} {path!r} is a directory")


def _load(path: str) -> tuple[qrt.Model, qformat.QrtFile]:
    """The model, and its file (for the tensors: a quantized layer's scale)."""
    _check_path(path, "model file")
    try:
        return qrt.load(path), qformat.load_file(path)
    except qrt.FormatError as e:
        raise CompareError(f"{path} is not a valid .qrt model: {e}") from None
    except OSError as e:
        raise CompareError(f"cannot read {path!r}: {e.strerror or e}") from None


def _leaves(tree: Tree, value: Any, what: str) -> list:
    """The tensors of a nested (torch) value shaped like tree, at their flat indices."""
    flat: list = []

    def walk(t: Tree, v: Any) -> None:
        if isinstance(t, int):
            flat.append((t, v))
        elif isinstance(v, (tuple, list)) and len(v) == len(t):
            for ti, vi in zip(t, v):
                walk(ti, vi)
        else:
            got = f"a {type(v).__name__}" + (f" of {len(v)}" if isinstance(v, (tuple, list)) else "")
            raise CompareError(f"{what}: expected a tuple of {len(t)}, got {got}")

    walk(tree, value)
    return [v for _, v in sorted(flat, key=lambda iv: iv[0])]


def _nested(tree: Tree, flat: Sequence[Any]) -> Any:
    return flat[tree] if isinstance(tree, int) else tuple(_nested(t, flat) for t in tree)


def _torch_args(module: Any, graph: Graph, flat: Sequence[Any]) -> list:
    """The arguments of module's forward: nested as the model's input_structure, unless module is a
    GraphModule whose placeholders are the flat inputs."""
    placeholders = None
    if isinstance(module, torch.fx.GraphModule):
        placeholders = sum(1 for n in module.graph.nodes if n.op == "placeholder")
    if placeholders == len(flat) != len(graph.input_structure):
        return list(flat)
    return [_nested(t, flat) for t in graph.input_structure]


def _finite(v: Any) -> Any:
    """v with each infinite or NaN float as the string "inf", "-inf" or "nan", which JSON has no number for
    (an identical layer's SQNR is inf)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(i) for k, i in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(i) for i in v]
    return v


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


def _layer_map(model: qrt.Model) -> dict[str, str]:
    """Module path -> qrt value holding its output, as the converter recorded it."""
    text = model.metadata.get("converter.layers")
    if text is not None:
        try:
            layers = json.loads(text)
        except ValueError:
            raise CompareError(f"{model.path}: metadata converter.layers is not valid JSON") from None
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
        raise CompareError(f"cannot tell the scale of quantized value {value!r}")
    scale = tensors[node.inputs[f"{port}scale"]]
    zp = tensors[node.inputs[f"{port}zero_point"]]
    return ((a.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale).astype(np.float32)


def _with_outputs(qfile: qformat.QrtFile, extra: Sequence[str], folder: str) -> qrt.Model:
    """The same model returning a flat tuple: its outputs, then the `extra` values (through the public
    file format)."""
    graph = json.loads(qfile.metadata[qformat.META_GRAPH])
    graph["outputs"] = list(graph["outputs"]) + list(extra)
    graph["output_structure"] = "tuple"
    meta = {k: v for k, v in qfile.metadata.items() if k not in qformat.RESERVED_META}
    path = os.path.join(folder, "layers.qrt")
    try:
        qformat.save(path, graph, qfile.tensors, meta)
    except OSError as e:  # a full disk, a file size limit
        raise CompareError(f"cannot write the model's copy with every layer as an output in {folder!r}: "
                           f"{e.strerror or e}") from None
    return qrt.load(path)


def _torch_value(t: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(float values, integer representation or None) of a torch tensor."""
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


def _capture(module: Any, paths: Sequence[str], args: Sequence[Any]) -> tuple[Any, dict]:
    """Run module on its forward() arguments, recording the outputs of the submodules at paths."""
    modules = dict(module.named_modules())
    seen: dict[str, Any] = {}
    hooks = []
    for p in paths:
        if p in modules:
            hooks.append(modules[p].register_forward_hook(lambda m, i, o, p=p: seen.__setitem__(p, o)))
    try:
        with torch.no_grad():
            out = module(*args)
    except Exception as e:
        raise CompareError(f"the PyTorch model does not run on these inputs: {type(e).__name__}: {e}") from None
    finally:
        for h in hooks:
            h.remove()
    return out, seen


def _warn(msg: str) -> None:
    print(f"qrt-compare: warning: {msg}", file=sys.stderr)


def _torch_models(args: argparse.Namespace, model: qrt.Model, example: Sequence[torch.Tensor]) -> tuple:
    """(PyTorch's quantized model, the float model with fused modules or None, the float model or None).

    example: the flat inputs as tensors (prepare_fx traces with them)."""
    meta = model.metadata
    mode = meta["converter.mode"]
    names = [s.name for s in model.inputs]
    try:
        rules = convert.startup_rules(args.rules)
        net = convert.load_model(args.checkpoint, args.model, args.trust_checkpoint)
    except convert.ConvertError as e:
        raise CompareError(str(e)) from None
    if meta.get("converter.rules") not in (None, rules.name):
        raise CompareError(
            f"{args.model_file} was converted with rules {meta['converter.rules']!r}, not {rules.name!r}: "
            "pass the same --rules FILE"
        )
    if meta.get("converter.checkpoint_sha256") not in (None, convert._sha256(args.checkpoint)):
        _warn(f"{args.checkpoint} is not the checkpoint {args.model_file} was converted from")
    if mode == "prequantized":
        return net, None, None
    wanted = meta.get("converter.weights", "per-tensor")
    weight_dtype, weights = ("float16", "per-tensor") if wanted == "float16" else ("qint8", wanted)
    engine = meta.get("converter.engine", "x86")
    try:
        prepared = qrt_backend.prepare(
            net, rules, mode, weight_dtype, weights, [_nested(t, example) for t in model.graph.input_structure], engine
        )
    except Exception as e:
        raise CompareError(f"cannot quantize the PyTorch model ({type(e).__name__}: {e})") from None
    if mode == "static":
        try:
            data = convert.load_calibration(args.calib, names)
        except convert.ConvertError as e:
            raise CompareError(str(e)) from None
        if meta.get("converter.calib_sha256") not in (None, convert._sha256(args.calib)):
            _warn(f"{args.calib} is not the calibration data {args.model_file} was converted with")
        batch = int(meta.get("converter.calib_batch_size", 32))
        n = next(iter(data.values())).shape[0]
        batches = (
            _torch_args(prepared, model.graph, [torch.from_numpy(data[k][i : i + batch]) for k in names])
            for i in range(0, n, batch)
        )
        qrt_backend.calibrate(prepared, batches)
    return qrt_backend.to_native(prepared, rules, engine), prepared, net


def _layer_rows(path: str, node: Node | None, qrt_values: dict, t_out: Any, f_out: Any, deq: Any) -> list[dict]:
    """One row per tensor a layer returns: a recurrent layer's tuple (y, (h_n, c_n)) gives three,
    labelled as torch indexes it (lstm[1][0] is h_n), matched in order to the outputs of qrt's node."""
    values = list(node.outputs) if node is not None else []
    t_leaves = _flatten_torch(t_out) if t_out is not None else None
    f_leaves = _flatten_torch(f_out) if f_out is not None else None
    tuple_out = t_out is not None and not isinstance(t_out, torch.Tensor)
    if tuple_out and len(t_leaves) == len(values):
        labels = [f"{path}{index}" for index in _indices(t_out)]
    else:
        values, labels = values[:1], [path]
    rows = []
    for k, (label, value) in enumerate(zip(labels, values)):
        x_raw = np.asarray(qrt_values[value])
        x = deq(value, x_raw)
        x_int = x_raw if x_raw.dtype.kind in "iu" else None
        row = {"layer": label, "qrt_value": value, "op": node.op if node else "?", "dtype": str(x_raw.dtype)}
        if t_leaves is None:
            row["vs_torch_quantized"] = {"note": f"no module {path!r} in PyTorch's quantized model"}
        else:
            row["vs_torch_quantized"] = _agreement(*_torch_value(t_leaves[k]), x, x_int)
        if f_leaves is not None and k < len(f_leaves):
            row["vs_float"] = _agreement(_torch_value(f_leaves[k])[0], None, x, None)
        rows.append(row)
    return rows


def _flatten_torch(v: Any) -> list:
    """The tensors of a nested tuple, depth first (an LSTM's (y, (h, c)) -> [y, h, c])."""
    if isinstance(v, (tuple, list)):
        return [t for item in v for t in _flatten_torch(item)]
    return [v]


def _indices(v: Any, prefix: str = "") -> list[str]:
    """How torch indexes each tensor of a nested tuple: (y, (h, c)) -> ['[0]', '[1][0]', '[1][1]']."""
    if isinstance(v, (tuple, list)):
        return [i for k, item in enumerate(v) for i in _indices(item, f"{prefix}[{k}]")]
    return [prefix]


def compare_report(args: argparse.Namespace) -> dict:
    """Everything qrt-compare shows, as plain JSON-able data."""
    # Everything that needs no PyTorch model is checked first: quantizing one takes seconds.
    model, qfile = _load(args.model_file)
    mode = model.metadata.get("converter.mode")
    if mode is None:
        raise CompareError(
            f"{args.model_file} has no converter.mode metadata: compare needs a model written by tools/convert.py"
        )
    if mode == "static" and args.calib is None:
        raise CompareError(
            f"{args.model_file} is statically quantized: pass --calib with the calibration data it was converted with"
        )
    graph = model.graph
    names = [s.name for s in model.inputs]
    try:
        if args.inputs is not None or args.input:
            inputs = qio.load_inputs(model.inputs, args.input or (), args.inputs)
        else:
            inputs = qio.random_inputs(graph, args.batch, args.seq, args.seed)
        model.run(inputs)  # fit check with the runtime's own message
    except ValueError as e:
        raise CompareError(f"inputs do not fit the model: {e}") from None
    flat = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names]
    native, fused_float, float_net = _torch_models(args, model, flat)

    layers = _layer_map(model)
    order = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    layers = dict(sorted(layers.items(), key=lambda kv: order.get(kv[1], -1)))
    producers = {p: _producer_of(graph, v) for p, v in layers.items()}
    # every tensor of each layer: all outputs of the node that computes it
    extra = list(dict.fromkeys(o for p, v in layers.items() for o in (producers[p].outputs if producers[p] else [v])))
    with tempfile.TemporaryDirectory(prefix="qrt-compare-") as folder:
        qrt_all = list(_with_outputs(qfile, extra, folder).run(inputs))
    n_out = len(model.outputs)
    qrt_outputs, qrt_values = qrt_all[:n_out], dict(zip(extra, qrt_all[n_out:]))

    t_out, t_layers = _capture(native, list(layers), _torch_args(native, graph, flat))
    f_layers: dict = {}
    f_out = None
    if fused_float is not None:
        _, f_layers = _capture(fused_float, list(layers), _torch_args(fused_float, graph, flat))
        f_out, _ = _capture(float_net, [], _torch_args(float_net, graph, flat))

    def deq(value: str, a: np.ndarray) -> np.ndarray:
        return _dequantize_qrt(graph, qfile.tensors, value, a)

    rows = []
    for path in layers:
        rows += _layer_rows(path, producers[path], qrt_values, t_layers.get(path), f_layers.get(path), deq)

    structure = tree_text(tree_names(graph.output_structure, graph.outputs))
    t_flat = _leaves(graph.output_structure, t_out, f"PyTorch's quantized model's result (qrt's is {structure})")
    f_flat = None if f_out is None else _leaves(graph.output_structure, f_out, "the float model's result")
    outputs = []
    for i, spec in enumerate(model.outputs):
        x = np.asarray(qrt_outputs[i]).astype(np.float32)
        row = {"output": spec.name, "vs_torch_quantized": _agreement(*_torch_value(t_flat[i]), x, None)}
        if f_flat is not None:
            row["vs_float"] = _agreement(_torch_value(f_flat[i])[0], None, x, None)
        outputs.append(row)
    return {
        "model": args.model_file,
        "mode": mode,
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
    print(format_table(headers, rows))
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
        raise CompareError("--plot needs matplotlib: pip install 'qrt[plot]'") from None
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
        raise CompareError(f"cannot write {path!r}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


EXAMPLES = """examples:
  {prog} model.qrt --checkpoint model.pt --model mypkg.models:make_mlp
  {prog} static.qrt --checkpoint model.pt --model mypkg.models:make_mlp --calib calib.npz --plot layers.png
  {prog} lstm.qrt --checkpoint lm.pt --trust-checkpoint --inputs in.npz --json

Inputs are random unless given: free dimensions of a sequence's time axis are --seq, other free
dimensions --batch. A model whose forward() takes a tuple (hidden = (h, c)) has the flat inputs
hidden.0 and hidden.1 (qrt inspect lists them); --plot needs matplotlib (pip install 'qrt[plot]')."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a converted model in qrt and in PyTorch (quantized by the same rules, and in float), "
        "and print each layer's max abs error, SQNR and share of identical integers.",
        epilog=EXAMPLES.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_file", metavar="MODEL.qrt")
    p.add_argument("--checkpoint", required=True, metavar="CKPT", help="the checkpoint the model was converted from")
    p.add_argument("--model", metavar="package.module:factory", help="builds the float nn.Module (state_dict)")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="one input array (repeatable)")
    p.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name (random when absent)")
    p.add_argument("--batch", type=int, default=1, help="size of free batch dimensions of random inputs (1)")
    p.add_argument("--seq", type=int, default=16, help="size of free time dimensions of sequence inputs (16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")
    p.add_argument("--calib", metavar="CALIB.npz", help="the calibration data of a static model")
    p.add_argument("--rules", metavar="RULES.py", help="the rules file the model was converted with")
    p.add_argument("--trust-checkpoint", action="store_true", help="allow a pickled whole-module checkpoint")
    p.add_argument("--plot", metavar="OUT.png", help="draw the per-layer figures (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run_compare(args: argparse.Namespace) -> None:
    """The command, on parsed arguments; raises CompareError."""
    _check_path(args.checkpoint, "checkpoint")
    if args.batch < 1 or args.seq < 1:
        raise CompareError("--batch and --seq must be at least 1")
    if args.plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise CompareError(f"cannot write {args.plot!r}: its directory does not exist")
    r = compare_report(args)
    if args.json:
        print(json.dumps(_finite(r), indent=2, default=str, allow_nan=False))
    else:
        _print_compare(r)
    if args.plot is not None:
        plot_compare(r, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")


def main(argv: Sequence[str] | None = None) -> int:
    """The qrt-compare command; returns the exit status (2 on any error, with one line on stderr)."""
    prog = "qrt-compare" if __package__ == "qrt_tools" else "compare.py"  # installed, or from a checkout
    args = build_parser(prog).parse_args(argv)
    try:
        run_compare(args)
    except CompareError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0

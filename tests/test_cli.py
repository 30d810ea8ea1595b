"""The qrt command line, driven as a user drives it: `python -m qrt ...` in a subprocess.

Models come from the converter (tools/convert.py) on the small models of tests/models.py, and one
whole-sequence LSTM is written by hand (GraphBuilder) for bench's --seq. qrt-compare, the converter's
own command, is tested in tests/test_compare.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import models
import numpy as np
import pytest
import torch

import qrt
from qrt.builder import GraphBuilder
from qrt.ops import OPS
from tools.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def qrt_cli(*args: str, pythonpath: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m qrt ARGS` from the tests folder (where the model factories live)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, ROOT, TESTS])}
    return subprocess.run(
        [sys.executable, "-m", "qrt", *args], cwd=TESTS, env=env, capture_output=True, text=True, timeout=timeout
    )


def fails(result: subprocess.CompletedProcess, *phrases: str) -> None:
    """A clean failure: status 2, one error line naming the problem, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "error:" in result.stderr and "Traceback" not in result.stderr, result.stderr
    for p in phrases:
        assert p in result.stderr, result.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cli")
    f = {k: str(d / k) for k in ("mlp.pt", "rnn.pt", "calib.npz", "dyn.qrt", "static.qrt", "rnn.qrt", "lstm.qrt",
                                 "nested.qrt")}
    torch.save(models.make_mlp().state_dict(), f["mlp.pt"])
    torch.save(models.make_step_rnn_tanh().state_dict(), f["rnn.pt"])
    rng = np.random.default_rng(0)
    np.savez(f["calib.npz"], x=rng.standard_normal((64, 37)).astype(np.float32))
    convert(f["mlp.pt"], f["dyn.qrt"], model="models:make_mlp", input_shapes=["1,37"])
    convert(f["mlp.pt"], f["static.qrt"], model="models:make_mlp", mode="static", calib=f["calib.npz"])
    convert(f["rnn.pt"], f["rnn.qrt"], model="models:make_step_rnn_tanh", input_shapes=["1,12", "1,32"])

    # A whole-sequence LSTM with free time and batch dimensions: [T, B, 6] -> [T, B, 8].
    b = GraphBuilder()
    x = b.input("x", "float32", [None, None, 6])
    w = {"l0_ih_weight": rng.standard_normal((32, 6)), "l0_hh_weight": rng.standard_normal((32, 8))}
    y, _, _ = b.node("lstm_dynamic", {"x": x, **{k: v.astype(np.float16) for k, v in w.items()}}, name="lstm")
    b.output(y)
    b.save(f["lstm.qrt"])

    # forward(x, state=(h, c)) -> (x + h, (relu(x + h), h + c)): nested arguments and results.
    b = GraphBuilder()
    x, h, c = (b.input(n, "float32", [None, 3]) for n in ("x", "state.0", "state.1"))
    b.input_nested((x, (h, c)))
    s = b.node("add", {"a": x, "b": h}, name="s")
    b.output_nested((s, (b.node("relu", {"x": s}, name="r"), b.node("add", {"a": h, "b": c}, name="t"))))
    b.save(f["nested.qrt"])

    np.save(d / "x.npy", rng.standard_normal((3, 37)).astype(np.float32))
    np.save(d / "x_int.npy", np.zeros((3, 37), np.int32))
    np.save(d / "x_wide.npy", np.zeros((3, 40), np.float32))
    np.savez(d / "in.npz", x=np.load(d / "x.npy"))
    np.savez(d / "rnn_in.npz", x=rng.standard_normal((4, 12)).astype(np.float32), h=np.zeros((4, 32), np.float32))
    with open(f["dyn.qrt"], "rb") as src:
        data = bytearray(src.read())
    (d / "truncated.qrt").write_bytes(bytes(data[:100]))
    data[-1] ^= 0xFF  # a flipped bit in the weights: the checksum no longer matches
    (d / "corrupt.qrt").write_bytes(bytes(data))
    (d / "text.npy").write_text("not an array")
    np.savez(d / "nested_in.npz", **{k: rng.standard_normal((2, 3)).astype(np.float32) for k in ("x", "state.0",
                                                                                                   "state.1")})
    f.update({k: str(d / k) for k in ("x.npy", "x_int.npy", "x_wide.npy", "in.npz", "rnn_in.npz", "nested_in.npz")})
    f.update({k: str(d / k) for k in ("truncated.qrt", "corrupt.qrt", "text.npy")})
    f["dir"] = str(d)
    return f


# ------------------------------------------------------------ help


def test_help_lists_commands_and_each_command_has_examples():
    top = qrt_cli("--help")
    assert top.returncode == 0
    for command in ("inspect", "run", "bench"):
        assert command in top.stdout
        r = qrt_cli(command, "--help")
        assert r.returncode == 0, r.stderr
        assert "examples:" in r.stdout and f"qrt {command} " in r.stdout
    bare = qrt_cli()
    assert bare.returncode == 2 and "usage: qrt" in bare.stderr
    assert qrt_cli("frobnicate").returncode == 2
    assert "qrt-compare" in top.stdout  # the comparison with PyTorch is the converter's own command


def test_runtime_commands_do_not_import_torch(files):
    code = (
        "import sys\nfrom qrt.cli import main\n"
        f"assert main(['inspect', {files['static.qrt']!r}]) == 0\n"
        f"assert main(['run', {files['static.qrt']!r}, '--input', {files['x.npy']!r}]) == 0\n"
        f"assert main(['bench', {files['static.qrt']!r}, '--seconds', '0.05', '--warmup', '0', '-q']) == 0\n"
        "assert 'torch' not in sys.modules, 'the runtime imported torch'\n"
        "assert not any(m == 'tools' or m.startswith(('tools.', 'qrt_tools')) for m in sys.modules), 'imported tools'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------ inspect


def test_inspect_shows_header_nodes_tensors_and_bytes(files):
    r = qrt_cli("inspect", files["static.qrt"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "qrt format v4" in out and "producer qrt tools/convert.py" in out
    assert "checksum: ok" in out
    assert "inputs:  x: float32[?, 37]" in out
    for name, op in (("quantize_per_tensor", "quantize_per_tensor"), ("fc1", "linear"), ("relu", "relu")):
        assert any(line.split()[:2] == [name, op] for line in out.splitlines()), out
    assert "weight i8 s=" in out  # quantization summary of the static linears
    assert "fc1.weight" in out and "[48, 37]" in out
    assert "bytes by dtype" in out and "int8" in out
    assert f"{qrt.thread_info().threads} threads (" in out  # the thread count and where it came from


@pytest.mark.parametrize("weight_dtype, says", [
    ("qint8", "x quantized per call (reduce_range)"),
    ("float16", "x float32"),  # it said "x quantized per call (reduce_range)": float16 layers quantize nothing
])
def test_inspect_says_how_a_dynamic_layer_takes_its_input(files, tmp_path, weight_dtype, says):
    from qrt.cli import quantization_summary

    convert(files["mlp.pt"], tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,37"],
            weight_dtype=weight_dtype, engine="x86")  # x86's reduce_range, whatever this CPU's torch engine
    f = qrt.format.load_file(tmp_path / "m.qrt")
    linears = [n for n in f.graph.nodes if n.op == "linear_dynamic"]
    assert linears and all(quantization_summary(n, f.tensors)[-1] == says for n in linears)


def test_inspect_json_is_complete_and_consistent(files):
    r = qrt_cli("inspect", files["dyn.qrt"], "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    model = qrt.load(files["dyn.qrt"])
    assert report["format_version"] == 4 and report["checksum"]["status"] == "ok"
    assert report["checksum"]["algorithm"] == "xxh64-1m" and len(report["checksum"]["value"]) == 16
    packed = {t["name"] for t in report["tensors"] if t["packed"]}  # the weights the kernels read where they lie
    weights = {v for n in model.graph.nodes for p, v in n.inputs.items() if OPS[n.op].port(p).packed}
    assert packed == weights and len(weights) == 3
    assert report["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 37]}]
    assert [n["op"] for n in report["nodes"]] == [n.op for n in model.graph.nodes]
    fc2 = next(n for n in report["nodes"] if n["name"] == "fc2")
    assert fc2["inputs"]["x"]["shape"] == [None, 48] and fc2["outputs"][0]["shape"] == [None, 48]
    assert any("weight i8" in q for q in fc2["quantization"])
    assert report["metadata"]["converter.mode"] == "dynamic"
    assert report["threads"]["cpus"] == qrt.thread_info().cpus and report["threads"]["source"]
    total = report["tensor_bytes"]
    assert sum(t["bytes"] for t in report["tensors"]) == total == sum(report["bytes_by_dtype"].values())
    # packed int8 weights: n padded to 64, k to 4 (docs/FORMAT.md); their row sums count as int32
    assert report["bytes_by_dtype"]["int8"] == 64 * 40 + 64 * 48 + 64 * 48


# ------------------------------------------------------------ run


def test_run_prints_outputs_and_writes_them(files, tmp_path):
    expected = qrt.run(files["static.qrt"], np.load(files["x.npy"]))
    printed = qrt_cli("run", files["static.qrt"], "--input", files["x.npy"])
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("fc3_dequantize: float32[3, 10]")

    out = str(tmp_path / "out.npz")
    r = qrt_cli("run", files["static.qrt"], "--inputs", files["in.npz"], "--output", out)
    assert r.returncode == 0, r.stderr
    with np.load(out) as z:
        np.testing.assert_array_equal(z["fc3_dequantize"], expected)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="a file size limit (RLIMIT_FSIZE)")
@pytest.mark.parametrize("suffix", [".npz", ".npy"])
def test_run_output_written_whole_or_not_at_all(files, tmp_path, suffix):
    """A write that fails (here a file size limit; a full disk alike) leaves the file that was there, and no
    partial one (it was opened and truncated first, then written in place)."""
    import resource

    x = np.random.default_rng(0).standard_normal((20000, 37)).astype(np.float32)  # outputs of 800 KB
    np.save(tmp_path / "big.npy", x)
    out = tmp_path / f"out{suffix}"
    out.write_bytes(b"previous content")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS])}
    r = subprocess.run([sys.executable, "-m", "qrt", "run", files["static.qrt"], "--input", str(tmp_path / "big.npy"),
                        "-o", str(out)], cwd=TESTS, env=env, capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)))
    fails(r, f"cannot write {str(out)!r}")
    assert out.read_bytes() == b"previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy", f"out{suffix}"]


def test_run_multi_input_model_by_name(files, tmp_path):
    inputs = dict(np.load(files["rnn_in.npz"]))
    y, h = qrt.run(files["rnn.qrt"], inputs)
    np.save(tmp_path / "x.npy", inputs["x"])
    np.save(tmp_path / "h.npy", inputs["h"])
    out = str(tmp_path / "out.npz")
    by_name = ["--input", f"x={tmp_path / 'x.npy'}", "--input", f"h={tmp_path / 'h.npy'}"]
    for how in (["--inputs", files["rnn_in.npz"]], by_name):
        r = qrt_cli("run", files["rnn.qrt"], *how, "-o", out)
        assert r.returncode == 0, r.stderr
        with np.load(out) as z:
            np.testing.assert_array_equal(z["head"], y)
            np.testing.assert_array_equal(z["cell"], h)


def test_nested_model_runs_from_flat_files_and_inspect_shows_its_structure(files, tmp_path):
    inputs = dict(np.load(files["nested_in.npz"]))
    s, (r, t) = qrt.run(files["nested.qrt"], [inputs["x"], (inputs["state.0"], inputs["state.1"])])
    out = str(tmp_path / "out.npz")
    run = qrt_cli("run", files["nested.qrt"], "--inputs", files["nested_in.npz"], "-o", out)
    assert run.returncode == 0, run.stderr
    with np.load(out) as z:
        assert z.files == ["s", "r", "t"]
        for name, want in (("s", s), ("r", r), ("t", t)):
            np.testing.assert_array_equal(z[name], want)
    text = qrt_cli("inspect", files["nested.qrt"])
    assert text.returncode == 0, text.stderr
    assert "called as: (x, (state.0, state.1))" in text.stdout
    assert "returned as (s, (r, t))" in text.stdout
    report = json.loads(qrt_cli("inspect", files["nested.qrt"], "--json").stdout)
    assert report["input_structure"] == ["x", ["state.0", "state.1"]]
    assert report["output_structure"] == ["s", ["r", "t"]]
    flat = json.loads(qrt_cli("inspect", files["rnn.qrt"], "--json").stdout)
    assert flat["input_structure"] == ["x", "h"] and flat["output_structure"] == "tuple"


@pytest.mark.parametrize(
    "args, phrases",
    [
        (["run", "{dir}/missing.qrt", "--input", "{x.npy}"], ["does not exist"]),
        (["run", "{dir}", "--input", "{x.npy}"], ["is a directory"]),
        (["inspect", "{truncated.qrt}"], ["not a valid .qrt model", "runs past the end"]),
        (["inspect", "{corrupt.qrt}"], ["not a valid .qrt model", "checksum mismatch"]),
        (["bench", "{corrupt.qrt}"], ["checksum mismatch"]),
        (["run", "{static.qrt}"], ["give the inputs"]),
        (["run", "{static.qrt}", "--input", "{x_int.npy}"], ["inputs do not fit", "dtype is int32, expected float32"]),
        (["run", "{static.qrt}", "--input", "{x_wide.npy}"], ["shape is [3, 40], expected [?, 37]"]),
        (["run", "{static.qrt}", "--input", "{dir}/missing.npy"], ["input file", "does not exist"]),
        (["run", "{static.qrt}", "--input", "{text.npy}"], ["cannot read", ".npy array"]),
        (["run", "{static.qrt}", "--input", "{in.npz}"], ["is an .npz archive, not one .npy array"]),
        (["run", "{static.qrt}", "--inputs", "{x.npy}"], ["is a single .npy array, not an .npz archive"]),
        (["run", "{static.qrt}", "--inputs", "{rnn_in.npz}"], ["inputs do not fit", "unknown ['h']"]),
        (["run", "{rnn.qrt}", "--input", "{x.npy}"], ["takes 2 inputs", "NAME=FILE.npy"]),
        (["run", "{rnn.qrt}", "--input", "x={x.npy}"], ["missing ['h']"]),
        (["run", "{static.qrt}", "--input", "{x.npy}", "-o", "{dir}/nowhere/out.npz"], ["does not exist"]),
        (["bench", "{rnn.qrt}", "--inputs", "{in.npz}"], ["missing ['h']"]),
        (["bench", "{static.qrt}", "--batch", "0"], ["at least 1"]),
    ],
)
def test_errors_are_one_clear_line_and_status_2(files, args, phrases):
    # {name} -> a path from the fixture (str.format would read the dots in "x.npy" as attributes)
    fails(qrt_cli(*[re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], a) for a in args]), *phrases)


# ------------------------------------------------------------ bench


def test_bench_reports_percentiles_and_throughput(files):
    r = qrt_cli("bench", files["static.qrt"], "--batch", "4", "--seconds", "0.3", "--warmup", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["inputs"] == {"x": {"dtype": "float32", "shape": [4, 37]}} and b["input_source"] == "random"
    assert b["runs"] >= 10 and b["samples_per_run"] == 4
    lat = b["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert b["samples_per_s"] == pytest.approx(4 * b["runs_per_s"])
    assert "measuring" in r.stderr and "100.0%" in r.stderr  # the progress bar's last state

    text = qrt_cli("bench", files["rnn.qrt"], "--seconds", "0.2", "--warmup", "0", "-q")
    assert text.returncode == 0, text.stderr
    assert "random inputs x: float32[1, 12], h: float32[1, 32]" in text.stdout
    assert "p50" in text.stdout and "p99" in text.stdout and "samples/s" in text.stdout
    assert text.stderr == ""  # --quiet: no progress bar


def test_bench_sequence_model_uses_seq_for_free_time_dims(files):
    r = qrt_cli("bench", files["lstm.qrt"], "--batch", "3", "--seq", "5", "--seconds", "0.1", "--warmup", "0", "-q",
                "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["inputs"]["x"]["shape"] == [5, 3, 6] and b["samples_per_run"] == 3


@pytest.mark.parametrize("args, message", [
    (["--seconds", "nan"], "--seconds must be positive and --warmup non-negative, both finite"),  # it never ended
    (["--seconds", "inf"], "both finite"),
    (["--warmup", "nan"], "both finite"),
    (["--threads", "100000000000"], "--threads: number of threads must be between 1 and"),
    (["--batch", "100000000000"], "would take more than 1 GiB; give the inputs from files"),
    (["--min-runs", "-5"], "--min-runs must be at least 1"),
])
def test_bench_refuses_what_it_cannot_run(files, args, message):
    """Each a usage error (exit 2, its message), not a hang or a traceback."""
    fails(qrt_cli("bench", files["static.qrt"], *args), message)


@pytest.mark.parametrize("command", ["inspect", "run", "bench"])
def test_an_unknown_option_is_named_by_its_command(files, command):
    """As every other usage error: `qrt COMMAND: error: ...` and the command's usage (the top-level parser said
    `qrt: error:` with its own)."""
    r = qrt_cli(command, files["static.qrt"], "--bogus")
    fails(r, f"qrt {command}: error: unrecognized arguments: --bogus", f"usage: qrt {command}")


def test_bench_threads_and_cuda(files):
    r = qrt_cli("bench", files["static.qrt"], "--threads", "2", "--seconds", "0.1", "--warmup", "0", "-q")
    if hasattr(qrt, "set_num_threads"):
        assert r.returncode == 0 and "threads 2" in r.stdout, r.stderr
    else:
        fails(r, "--threads needs qrt.set_num_threads")
    fails(qrt_cli("bench", files["static.qrt"], "--threads", "0"), "at least 1")

    r = qrt_cli("bench", files["dyn.qrt"], "--device", "cuda", "--seconds", "0.2", "--warmup", "0", "-q")
    gpu = False
    if importlib.util.find_spec("cupy") is not None:
        import cupy

        try:
            gpu = cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:
            gpu = False
    if gpu:
        assert r.returncode == 0 and "on cuda" in r.stdout, r.stderr
    else:
        fails(r, "device='cuda'")

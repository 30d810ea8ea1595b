"""qrt-compare (tools/compare.py), driven as a user drives it: `python tools/compare.py ...` in a subprocess.

Models come from the converter on the small models of tests/models.py; the ones whose forward() takes
and returns nested tuples (tests/nested_models.py) are converted through their flat twins and then
grouped into the nested structure (format version 3), as the converter names their inputs.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import models
import nested_models
import numpy as np
import pytest
import torch

import qrt
from qrt import format as qformat
from qrt.builder import GraphBuilder
from tools.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# torch's recurrent gates use libm's tanh / exp, which are not correctly rounded; qrt's are exact
# to the last bit or so (docs/NUMERICS.md): a recurrent layer agrees to within a few float32 ulps.
RECURRENT_BOUND = 3e-7


def compare_cli(*args: str, pythonpath: tuple[str, ...] = (), timeout: float = 180) -> subprocess.CompletedProcess:
    """`python tools/compare.py ARGS` from the tests folder (where the model factories live)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, ROOT, TESTS])}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "compare.py"), *args],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=timeout,
    )


def _not_json(constant: str) -> None:
    raise AssertionError(f"--json printed {constant}, which is not JSON")


def _floats(v):
    """The report with the strings "inf", "-inf" and "nan" (JSON has no such numbers) as floats."""
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    if isinstance(v, dict):
        return {k: _floats(i) for k, i in v.items()}
    return [_floats(i) for i in v] if isinstance(v, list) else v


def compare_json(*args: str) -> dict:
    """The --json report, parsed as strict JSON (Infinity and NaN refused, as JSON.parse refuses them)."""
    r = compare_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return _floats(json.loads(r.stdout, parse_constant=_not_json))


def fails(result: subprocess.CompletedProcess, *phrases: str) -> None:
    """A clean failure: status 2, one error line naming the problem, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "error:" in result.stderr and "Traceback" not in result.stderr, result.stderr
    for p in phrases:
        assert p in result.stderr, result.stderr


def nest(src: str, dst: str, renames: dict[str, str], arguments: list, returns: list) -> None:
    """A converted flat model with its inputs renamed and grouped into forward()'s arguments, and its
    outputs into what forward() returns (trees of flat indices), as the converter writes a nested model."""
    f = qformat.load_file(src)
    graph = json.loads(f.metadata[qformat.META_GRAPH])
    for spec in graph["inputs"]:
        spec["name"] = renames.get(spec["name"], spec["name"])
    for node in graph["nodes"]:
        node["inputs"] = {p: renames.get(v, v) for p, v in node["inputs"].items()}
    graph["input_structure"] = arguments
    graph["output_structure"] = returns
    meta = {k: v for k, v in f.metadata.items() if k not in qformat.RESERVED_META}
    qformat.save(dst, graph, f.tensors, meta)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("compare")
    names = ("mlp.pt", "rnn.pt", "cell.pt", "lm.pt", "calib.npz", "dyn.qrt", "static.qrt", "rnn.qrt",
             "flat_cell.qrt", "cell.qrt", "flat_lm.qrt", "lm.qrt", "plain.qrt", "in.npz", "rnn_in.npz")
    f = {k: str(d / k) for k in names}
    torch.save(models.make_mlp().state_dict(), f["mlp.pt"])
    torch.save(models.make_step_rnn_tanh().state_dict(), f["rnn.pt"])
    torch.save(nested_models.make_state_lstm_cell().state_dict(), f["cell.pt"])
    torch.save(nested_models.make_language_model().state_dict(), f["lm.pt"])
    rng = np.random.default_rng(0)
    np.savez(f["calib.npz"], x=rng.standard_normal((64, 37)).astype(np.float32))
    np.savez(f["in.npz"], x=rng.standard_normal((3, 37)).astype(np.float32))
    np.savez(f["rnn_in.npz"], x=rng.standard_normal((4, 12)).astype(np.float32), h=np.zeros((4, 32), np.float32))
    convert(f["mlp.pt"], f["dyn.qrt"], model="models:make_mlp", input_shapes=["1,37"])
    convert(f["mlp.pt"], f["static.qrt"], model="models:make_mlp", mode="static", calib=f["calib.npz"])
    convert(f["rnn.pt"], f["rnn.qrt"], model="models:make_step_rnn_tanh", input_shapes=["1,12", "1,32"])
    # forward(x, state) -> (y, (h, c)): inputs x, state.0, state.1; outputs head, cell.h_next, cell.c_next
    convert(f["cell.pt"], f["flat_cell.qrt"], model="models:make_step_lstm", input_shapes=["1,10", "1,20", "1,20"])
    nest(f["flat_cell.qrt"], f["cell.qrt"], {"h": "state.0", "c": "state.1"}, [0, [1, 2]], [0, [1, 2]])
    # forward(x, hidden) -> (logits, (h_n, c_n)) over an nn.LSTM
    convert(f["lm.pt"], f["flat_lm.qrt"], model="nested_models:make_flat_language_model",
            input_shapes=["1,5,8", "1,1,16", "1,1,16"])
    nest(f["flat_lm.qrt"], f["lm.qrt"], {"h0": "hidden.0", "c0": "hidden.1"}, [0, [1, 2]], [0, [1, 2]])

    # Not from the converter: no converter metadata.
    b = GraphBuilder()
    b.output(b.node("relu", {"x": b.input("x", "float32", [None, 6])}))
    b.save(f["plain.qrt"])
    f["dir"] = str(d)
    return f


def test_help_and_the_installed_command():
    r = compare_cli("--help")
    assert r.returncode == 0, r.stderr
    assert "usage: compare.py" in r.stdout and "examples:" in r.stdout and "--checkpoint" in r.stdout
    from tools import compare_main  # what the qrt-compare console script runs

    assert callable(compare_main)


def test_dynamic_layer_by_layer_with_plot(files, tmp_path):
    png = str(tmp_path / "layers.png")
    r = compare_cli(files["dyn.qrt"], "--checkpoint", files["mlp.pt"], "--model", "models:make_mlp",
                    "--batch", "32", "--plot", png)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line[:3] in ("fc1", "fc2", "fc3")}
    assert set(rows) == {"fc1", "fc2", "fc3"}
    assert rows["fc1"][1] == "fc1_relu"  # the fused Linear+ReLU's output is the relu's
    for cells in rows.values():
        assert cells[4:7] == ["0", "exact", "100.00%"], cells  # bit-exact against PyTorch's quantized model
    assert f"wrote {png}" in r.stdout

    with open(png, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="a file size limit (RLIMIT_FSIZE)")
def test_a_copy_it_cannot_write_is_one_error_line(files):
    """The model's copy with every layer as an output, written to a temporary folder: a full disk or a file size
    limit is a usage error, not a traceback."""
    import resource

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS])}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "compare.py"), files["dyn.qrt"], "--checkpoint",
                        files["mlp.pt"], "--model", "models:make_mlp"], cwd=TESTS, env=env, capture_output=True,
                       text=True, timeout=180,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    fails(r, "cannot write the model's copy with every layer as an output")


def test_static_with_its_calibration_matches_integers(files):
    base = [files["static.qrt"], "--checkpoint", files["mlp.pt"], "--model", "models:make_mlp"]
    r = compare_json(*base, "--calib", files["calib.npz"], "--inputs", files["in.npz"])
    assert r["mode"] == "static" and [row["layer"] for row in r["layers"]] == ["fc1", "fc2", "fc3"]
    for row in r["layers"]:
        q, f = row["vs_torch_quantized"], row["vs_float"]
        assert row["dtype"] == "uint8" and q["identical_of"] == "integers"
        assert q["identical"] == 1.0 and q["max_abs_error"] == 0.0 and q["sqnr_db"] == math.inf
        assert 15 < f["sqnr_db"] < 80 and f["max_abs_error"] > 0  # the quantization error itself
    (out,) = r["outputs"]
    assert out["vs_torch_quantized"]["max_abs_error"] == 0.0 and math.isfinite(out["vs_float"]["sqnr_db"])


def test_recurrent_cell_within_last_bits(files):
    r = compare_json(files["rnn.qrt"], "--checkpoint", files["rnn.pt"], "--model", "models:make_step_rnn_tanh",
                     "--batch", "8")
    cell = next(row for row in r["layers"] if row["layer"] == "cell")
    assert cell["op"] == "rnn_cell_dynamic"
    assert cell["vs_torch_quantized"]["max_abs_error"] <= RECURRENT_BOUND
    assert cell["vs_float"]["sqnr_db"] < cell["vs_torch_quantized"]["sqnr_db"]


def _check_recurrent(r: dict, layer: str, op: str, values: list[str], outputs: list[str]) -> None:
    """Every tensor of the recurrent layer and every output agree with PyTorch's quantized model to the
    last bits, and with the float model as quantization allows."""
    rows = [row for row in r["layers"] if row["layer"].startswith(layer)]
    labels = [f"{layer}[0]", f"{layer}[1][0]", f"{layer}[1][1]"] if op == "lstm_dynamic" else [f"{layer}[0]",
                                                                                                 f"{layer}[1]"]
    assert [row["layer"] for row in rows] == labels and [row["qrt_value"] for row in rows] == values
    for row in rows:
        assert row["op"] == op
        assert row["vs_torch_quantized"]["max_abs_error"] <= RECURRENT_BOUND, row
        assert 20 < row["vs_float"]["sqnr_db"] < row["vs_torch_quantized"]["sqnr_db"], row
    head = next(row for row in r["layers"] if row["layer"] == "head")
    assert head["vs_torch_quantized"]["sqnr_db"] > 100, head  # its input already differs in the last bits
    assert [o["output"] for o in r["outputs"]] == outputs
    for o in r["outputs"]:
        assert o["vs_torch_quantized"]["max_abs_error"] <= 1e-5 and 20 < o["vs_float"]["sqnr_db"], o


def test_lstm_cell_with_flat_states(files):
    r = compare_json(files["flat_cell.qrt"], "--checkpoint", files["cell.pt"], "--model", "models:make_step_lstm",
                     "--batch", "6")
    assert r["inputs"] == {k: {"dtype": "float32", "shape": [6, n]} for k, n in (("x", 10), ("h", 20), ("c", 20))}
    _check_recurrent(r, "cell", "lstm_cell_dynamic", ["cell.h_next", "cell.c_next"],
                     ["head", "cell.h_next", "cell.c_next"])


def test_lstm_cell_with_a_tuple_state_in_and_out(files):
    """forward(x, state=(h, c)) -> (y, (h, c)): PyTorch is called with the tuple, its nested result
    is matched to qrt's flat outputs."""
    model = qrt.load(files["cell.qrt"])
    assert model.input_structure == ("x", ("state.0", "state.1"))
    assert model.output_structure == ("head", ("cell.h_next", "cell.c_next"))
    r = compare_json(files["cell.qrt"], "--checkpoint", files["cell.pt"],
                     "--model", "nested_models:make_state_lstm_cell", "--batch", "5")
    assert list(r["inputs"]) == ["x", "state.0", "state.1"]
    _check_recurrent(r, "cell", "lstm_cell_dynamic", ["cell.h_next", "cell.c_next"],
                     ["head", "cell.h_next", "cell.c_next"])


def test_lstm_language_model_with_hidden_tuple(files, tmp_path):
    """nn.LSTM called with hidden = (h0, c0), returning (logits, (h_n, c_n)); inputs from files."""
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((1, 5, 8)).astype(np.float32),
              "hidden.0": rng.standard_normal((1, 1, 16)).astype(np.float32),
              "hidden.1": rng.standard_normal((1, 1, 16)).astype(np.float32)}
    np.savez(tmp_path / "lm_in.npz", **inputs)
    np.save(tmp_path / "x.npy", inputs["x"])
    r = compare_json(files["lm.qrt"], "--checkpoint", files["lm.pt"], "--model", "nested_models:make_language_model",
                     "--inputs", str(tmp_path / "lm_in.npz"), "--input", f"x={tmp_path / 'x.npy'}")
    assert r["inputs"]["hidden.1"] == {"dtype": "float32", "shape": [1, 1, 16]}
    _check_recurrent(r, "lstm", "lstm_dynamic", ["lstm.y", "lstm.h_n", "lstm.c_n"],
                     ["head", "lstm.h_n", "lstm.c_n"])
    # the same model, flat, gives the same numbers
    flat = {"x": inputs["x"], "h0": inputs["hidden.0"], "c0": inputs["hidden.1"]}
    np.savez(tmp_path / "flat_in.npz", **flat)
    f = compare_json(files["flat_lm.qrt"], "--checkpoint", files["lm.pt"],
                     "--model", "nested_models:make_flat_language_model", "--inputs", str(tmp_path / "flat_in.npz"))
    assert f["layers"] == r["layers"]
    assert [o["vs_torch_quantized"] for o in f["outputs"]] == [o["vs_torch_quantized"] for o in r["outputs"]]


@pytest.mark.parametrize(
    "args, phrases",
    [
        (["{dyn.qrt}", "--checkpoint", "{dir}/missing.pt", "--model", "models:make_mlp"], ["checkpoint", "not exist"]),
        (["{dir}/missing.qrt", "--checkpoint", "{mlp.pt}", "--model", "models:make_mlp"], ["model file", "not exist"]),
        (["{static.qrt}", "--checkpoint", "{mlp.pt}", "--model", "m:f"], ["statically", "--calib"]),
        (["{plain.qrt}", "--checkpoint", "{mlp.pt}", "--model", "m:f"], ["written by tools/convert.py"]),
        (["{dyn.qrt}", "--checkpoint", "{mlp.pt}", "--inputs", "{rnn_in.npz}"], ["unknown ['h']"]),
        (["{rnn.qrt}", "--checkpoint", "{rnn.pt}", "--inputs", "{in.npz}"], ["missing ['h']"]),
        (["{dyn.qrt}", "--checkpoint", "{mlp.pt}", "--model", "models:make_mlp", "--batch", "0"], ["at least 1"]),
        (["{dyn.qrt}", "--checkpoint", "{rnn.pt}", "--model", "models:make_mlp"], ["does not fit the model"]),
    ],
)
def test_errors_are_one_clear_line_and_status_2(files, args, phrases):
    fails(compare_cli(*[re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], a) for a in args]), *phrases)


def test_without_torch_it_says_how_to_get_it(files, tmp_path):
    # A stand-in torch package that cannot be imported.
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    fails(compare_cli(files["dyn.qrt"], "--checkpoint", files["mlp.pt"], "--model", "models:make_mlp",
                      pythonpath=(str(fake.parent),)), "pip install 'qrt[convert]'")

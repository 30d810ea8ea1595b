"""The converter end to end: a saved PyTorch checkpoint -> tools/convert.py -> qrt.run, against
PyTorch's own quantized model (quantize_dynamic / convert_fx) built under the same rules.

Bit-exact for models built from linear layers (float16 weights: where torch runs its AVX-512
kernel; elsewhere bit-exact with qrt's scalar oracle and within the reordering bound of torch,
tests/reference.py); RNNCell tanh within 3e-7 per step from the same
state (torch's tanh is not correctly rounded), relu exact (see docs/NUMERICS.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import models
import numpy as np
import pytest
import torch
from reference import TORCH_FP16_ORDER_IS_QRTS, reorder_bound
from torch import nn
from torch.ao.quantization import (
    default_dynamic_qconfig,
    float16_dynamic_qconfig,
    per_channel_dynamic_qconfig,
    quantize_dynamic,
)

import qrt
from qrt import _kernels as K
from tools import qrt_backend
from tools.convert import ConvertError, convert
from tools.lower import lower
from tools.rules import DEFAULT_RULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
warnings.filterwarnings("ignore", module=r"torch\.ao")


def cli(*args: str, cwd: str = TESTS) -> subprocess.CompletedProcess:
    """tools/convert.py as a user runs it, from the folder holding their model code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS])}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "convert.py"), *args, "--quiet"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def inputs(rng: np.random.Generator, *shape: int, spread: float = 3.0) -> np.ndarray:
    return (rng.standard_normal(shape) * spread).astype(np.float32)


@pytest.fixture(scope="module")
def mlp_ckpt(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("ckpt") / "mlp.pt")
    torch.save(models.make_mlp().state_dict(), path)
    return path


@pytest.fixture(scope="module")
def calib_npz(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("calib") / "calib.npz")
    np.savez(path, x=inputs(np.random.default_rng(7), 150, 37, spread=2.0))
    return path


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


# ------------------------------------------------------------ dynamic mode


@pytest.mark.parametrize(
    "weight_dtype, weights, qconfig, dtype",
    [
        ("qint8", "per-tensor", default_dynamic_qconfig, torch.qint8),
        ("qint8", "per-channel", per_channel_dynamic_qconfig, torch.qint8),
        ("float16", "per-tensor", float16_dynamic_qconfig, torch.float16),
    ],
)
def test_dynamic_mlp_matches_quantize_dynamic(tmp_path, mlp_ckpt, weight_dtype, weights, qconfig, dtype):
    out = tmp_path / "mlp.qrt"
    convert(mlp_ckpt, out, model="models:make_mlp", weight_dtype=weight_dtype, weights=weights, input_shapes=["1,37"])
    model = qrt.load(out)
    assert [n.op for n in model.graph.nodes].count("linear_dynamic") == 3
    want = quantize_dynamic(models.make_mlp().eval(), {nn.Linear: qconfig}, dtype=dtype)
    torch_order = dtype != torch.float16 or TORCH_FP16_ORDER_IS_QRTS
    rng = np.random.default_rng(0)
    for batch in (1, 5, 64):
        x = inputs(rng, batch, 37)
        with torch.no_grad():
            expected = want(torch.from_numpy(x)).numpy()
        got = model.run(x)
        if torch_order:
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_array_equal(got, _float16_mlp_by_oracle(want, x))


def _float16_mlp_by_oracle(mlp: nn.Module, x: np.ndarray) -> np.ndarray:
    """The float16 MLP through qrt's scalar oracle, for CPUs where torch sums in another order.

    qrt is held to this bit for bit (the converter wrote torch's float16 weights); torch is held
    layer by layer, from its own layer input, to within the most two summation orders can differ.
    """
    seen = {}
    hooks = [getattr(mlp, name).register_forward_hook(lambda m, i, o, name=name: seen.update({name: (i[0], o)}))
             for name in ("fc1", "fc2", "fc3")]
    with torch.no_grad():
        mlp(torch.from_numpy(x))
    for hook in hooks:
        hook.remove()
    h = x
    for name in ("fc1", "fc2", "fc3"):
        layer = getattr(mlp, name)
        w, b = layer.weight().detach().numpy(), layer.bias().detach().numpy()
        torch_in, torch_out = (t.numpy() for t in seen[name])
        for v, out in ((h, None), (torch_in, torch_out)):
            y = np.empty((v.shape[0], w.shape[0]), np.float32)
            K.gemm_f32_chain_reference(v, w, b, y)
            if out is None:
                h_next = y if name == "fc3" else np.maximum(y, np.float32(0))
            else:
                assert np.all(np.abs(y - out) <= reorder_bound(v, w, b)), name
        h = h_next
    return h


def test_dynamic_mlp_cli_and_metadata(tmp_path, mlp_ckpt):
    out = tmp_path / "mlp.qrt"
    r = cli(mlp_ckpt, "-o", str(out), "--model", "models:make_mlp", "--input-shape", "1,37")
    assert r.returncode == 0, r.stderr
    model = qrt.load(out)
    assert [s.name for s in model.inputs] == ["x"] and model.inputs[0].shape == (None, 37)
    meta = model.metadata
    assert meta["qrt.producer"].startswith("qrt tools/convert.py")
    assert meta["converter.torch_version"] == torch.__version__
    assert meta["converter.mode"] == "dynamic" and meta["converter.rules"] == DEFAULT_RULES.name
    import hashlib

    assert meta["converter.checkpoint_sha256"] == hashlib.sha256(open(mlp_ckpt, "rb").read()).hexdigest()
    x = inputs(np.random.default_rng(1), 3, 37)
    want = quantize_dynamic(models.make_mlp().eval(), {nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        np.testing.assert_array_equal(model.run(x), want(torch.from_numpy(x)).numpy())


# ------------------------------------------------------------ static mode


def _native_static(calib: str, weights: str, batch: int, rules=DEFAULT_RULES) -> nn.Module:
    """convert_fx of the float model prepared and calibrated on the same batches under the same rules."""
    data = np.load(calib)["x"]
    prepared = qrt_backend.prepare(models.make_mlp(), rules, "static", "qint8", weights, [torch.zeros(1, 37)])
    qrt_backend.calibrate(prepared, ([torch.from_numpy(data[i : i + batch])] for i in range(0, len(data), batch)))
    return qrt_backend.to_native(prepared, rules)


@pytest.mark.parametrize("weights", ["per-tensor", "per-channel"])
def test_static_linear_relu_stack_matches_convert_fx(tmp_path, mlp_ckpt, calib_npz, weights):
    out = tmp_path / "static.qrt"
    args = [mlp_ckpt, "-o", str(out), "--model", "models:make_mlp", "--mode", "static", "--calib", calib_npz]
    r = cli(*args, "--weights", weights, "--calib-batch-size", "40")
    assert r.returncode == 0, r.stderr
    model = qrt.load(out)
    ops = [n.op for n in model.graph.nodes]
    assert ops.count("linear") == 3 and ops[0] == "quantize_per_tensor" and ops[-1] == "dequantize"
    assert model.metadata["converter.mode"] == "static"
    want = _native_static(calib_npz, weights, 40)
    rng = np.random.default_rng(2)
    for batch in (1, 7, 50):
        x = inputs(rng, batch, 37)
        with torch.no_grad():
            expected = want(torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(model.run(x), expected)


def test_static_rules_without_fusion(tmp_path, mlp_ckpt, calib_npz):
    """A rules file dropping the Linear+ReLU pattern: ReLU runs in float between dequantize and quantize."""
    rules = tmp_path / "nofuse.py"
    rules.write_text(
        "import dataclasses\nfrom tools.rules import DEFAULT_RULES\n"
        "RULES = dataclasses.replace(DEFAULT_RULES, name='no-fusion',\n"
        "    patterns=tuple(p for p in DEFAULT_RULES.patterns if p.name != 'linear_relu'))\n"
    )
    out = tmp_path / "nofuse.qrt"
    convert(mlp_ckpt, out, model="models:make_mlp", mode="static", calib=calib_npz, rules=str(rules))
    model = qrt.load(out)
    assert model.metadata["converter.rules"] == "no-fusion"
    assert not any(n.attrs.get("relu") for n in model.graph.nodes if n.op == "linear")
    from tools.rules import load_rules

    want = _native_static(calib_npz, "per-tensor", 32, load_rules(rules))
    x = inputs(np.random.default_rng(3), 20, 37)
    with torch.no_grad():
        np.testing.assert_array_equal(model.run(x), want(torch.from_numpy(x)).numpy())


def test_rules_per_channel_choice(tmp_path, mlp_ckpt):
    rules = tmp_path / "pc.py"
    rules.write_text(
        "import dataclasses\nfrom tools.rules import DEFAULT_RULES\n"
        "RULES = dataclasses.replace(DEFAULT_RULES, name='pc', weights='per-channel')\n"
    )
    out = tmp_path / "pc.qrt"
    convert(mlp_ckpt, out, model="models:make_mlp", input_shapes=["1,37"], rules=str(rules))
    model = qrt.load(out)
    assert all(model.graph.values[n.inputs["weight_scale"]].shape == (n_out,) for n, n_out in
               zip(model.graph.nodes[::2], (48, 48, 10)))
    want = quantize_dynamic(models.make_mlp().eval(), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    x = inputs(np.random.default_rng(4), 9, 37)
    with torch.no_grad():
        np.testing.assert_array_equal(model.run(x), want(torch.from_numpy(x)).numpy())


# ------------------------------------------------------------ streaming RNNCell step model


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_cell_step_model_streamed(tmp_path, nonlinearity):
    factory = f"make_step_rnn_{nonlinearity}"
    ckpt, out = tmp_path / "rnn.pt", tmp_path / "rnn.qrt"
    torch.save(getattr(models, factory)().state_dict(), ckpt)
    convert(ckpt, out, model=f"models:{factory}", input_shapes=["1,12", "1,32"])
    model = qrt.load(out)
    assert [s.name for s in model.inputs] == ["x", "h"]
    assert [n.op for n in model.graph.nodes] == ["rnn_cell_dynamic", "linear_dynamic"]
    want = quantize_dynamic(getattr(models, factory)().eval(), {nn.Linear, nn.RNNCell}, dtype=torch.qint8)

    exact = nonlinearity == "relu"
    rng = np.random.default_rng(5)
    xs = inputs(rng, 50, 2, 12, spread=1.5)
    h_torch = torch.zeros(2, 32)
    h_qrt = np.zeros((2, 32), np.float32)
    for t in range(50):
        with torch.no_grad():
            y_t, h_next_t = want(torch.from_numpy(xs[t]), h_torch)
        # One step from torch's own state: the step is what qrt must reproduce.
        y_step, h_step = model.run([xs[t], h_torch.numpy()])
        # Free running: qrt carries its own state, as on a device.
        y_free, h_qrt = model.run({"x": xs[t], "h": h_qrt})
        if exact:
            np.testing.assert_array_equal(h_step, h_next_t.numpy())
            np.testing.assert_array_equal(y_step, y_t.numpy())
            np.testing.assert_array_equal(h_qrt, h_next_t.numpy())
            np.testing.assert_array_equal(y_free, y_t.numpy())
        else:
            np.testing.assert_allclose(h_step, h_next_t.numpy(), rtol=0, atol=3e-7)
            if np.array_equal(h_step, h_next_t.numpy()):
                np.testing.assert_array_equal(y_step, y_t.numpy())
            # A 1-ulp difference in h can flip one requantization later: loose bound only.
            np.testing.assert_allclose(h_qrt, h_next_t.numpy(), rtol=0, atol=1e-4)
            np.testing.assert_allclose(y_free, y_t.numpy(), rtol=0, atol=1e-3)
        h_torch = h_next_t


# ------------------------------------------------------------ already-quantized models


def test_prequantized_whole_model_needs_trust(tmp_path):
    net = models.make_step_rnn_relu().eval()
    quantized = quantize_dynamic(net, {nn.Linear, nn.RNNCell}, dtype=torch.qint8)
    ckpt, out = tmp_path / "whole.pt", tmp_path / "whole.qrt"
    torch.save(quantized, ckpt)
    shapes = ["--input-shape", "1,12", "--input-shape", "1,32"]

    refused = cli(str(ckpt), "-o", str(out), *shapes)
    assert refused.returncode != 0
    assert "--trust-checkpoint" in refused.stderr and "arbitrary code" in refused.stderr
    assert _files(tmp_path) == ["whole.pt"]

    r = cli(str(ckpt), "-o", str(out), *shapes, "--trust-checkpoint")
    assert r.returncode == 0, r.stderr
    model = qrt.load(out)
    assert model.metadata["converter.mode"] == "prequantized"
    # PyTorch's integers and scales are kept exactly.
    cell = next(n for n in model.graph.nodes if n.op == "rnn_cell_dynamic")
    w_ih = quantized.cell._weight_bias()["weight"]["weight_ih"]
    stored = qrt.format.load_file(out).tensors
    np.testing.assert_array_equal(stored[cell.inputs["ih_weight"]], w_ih.int_repr().numpy())
    assert float(stored[cell.inputs["ih_weight_scale"]]) == w_ih.q_scale()
    rng = np.random.default_rng(6)
    h = np.zeros((3, 32), np.float32)
    for _ in range(10):
        x = inputs(rng, 3, 12)
        with torch.no_grad():
            y_t, h_t = quantized(torch.from_numpy(x), torch.from_numpy(h))
        y, h = model.run([x, h])
        np.testing.assert_array_equal(y, y_t.numpy())
        np.testing.assert_array_equal(h, h_t.numpy())


def test_prequantized_float16_and_per_channel(tmp_path):
    rng = np.random.default_rng(8)
    for i, (qconfig, dtype) in enumerate([(float16_dynamic_qconfig, torch.float16),
                                          (per_channel_dynamic_qconfig, torch.qint8)]):
        quantized = quantize_dynamic(models.make_mlp().eval(), {nn.Linear: qconfig}, dtype=dtype)
        ckpt, out = tmp_path / f"q{i}.pt", tmp_path / f"q{i}.qrt"
        torch.save(quantized, ckpt)
        convert(ckpt, out, input_shapes=["1,37"], trust_checkpoint=True)
        x = inputs(rng, 11, 37)
        with torch.no_grad():
            np.testing.assert_array_equal(qrt.run(out, x), quantized(torch.from_numpy(x)).numpy())


def test_convert_fx_native_static_model_lowers_exactly(tmp_path, calib_npz):
    """A convert_fx model as is (torch 2.13 cannot torch.save a GraphModule whole, so lower it in memory)."""
    native = _native_static(calib_npz, "per-channel", 32)
    builder = lower(native, qrt_backend.describe, [(1, 37)])
    out = tmp_path / "native.qrt"
    builder.save(out)
    x = inputs(np.random.default_rng(9), 13, 37)
    with torch.no_grad():
        np.testing.assert_array_equal(qrt.run(out, x), native(torch.from_numpy(x)).numpy())


# ------------------------------------------------------------ errors


def test_unsupported_conv1d_is_named(tmp_path):
    ckpt, out = tmp_path / "conv.pt", tmp_path / "conv.qrt"
    torch.save(models.make_convnet().state_dict(), ckpt)
    r = cli(str(ckpt), "-o", str(out), "--model", "models:make_convnet", "--input-shape", "1,1,16")
    assert r.returncode != 0
    assert "'conv'" in r.stderr and "Conv1d" in r.stderr
    assert "'fc'" not in r.stderr  # the Linear is supported and not listed
    assert not out.exists()


def test_rules_pattern_without_lowering_fails_at_startup(tmp_path):
    rules = tmp_path / "conv_rules.py"
    rules.write_text(
        "import dataclasses\nfrom tools.rules import DEFAULT_RULES, PatternRule\n"
        "RULES = dataclasses.replace(DEFAULT_RULES, name='with-conv',\n"
        "    patterns=DEFAULT_RULES.patterns + (PatternRule('conv1d', ('Conv1d',), True, ()),))\n"
    )
    # The checkpoint does not even exist: the rules are refused before anything is loaded.
    with pytest.raises(ConvertError, match=r"'conv1d' \(Conv1d\).*no qrt lowering"):
        convert(tmp_path / "absent.pt", tmp_path / "x.qrt", rules=str(rules))


@pytest.mark.parametrize(
    "factory, message",
    [
        ("no_such_module:make", "cannot import model module 'no_such_module'"),
        ("models:no_such_factory", "has no attribute 'no_such_factory'"),
        ("models", "package.module:factory"),
        ("models:make_broken", "factory 'models:make_broken' failed: RuntimeError"),
        ("models:make_step_rnn_tanh", r"does not fit the model.*missing keys \['cell.weight_ih'"),
        ("models:make_mlp_wide", r"shape mismatch fc1.weight: checkpoint \[48, 37\], model \[48, 40\]"),
    ],
)
def test_bad_factory_or_checkpoint(tmp_path, mlp_ckpt, factory, message):
    out = tmp_path / "m.qrt"
    with pytest.raises(ConvertError, match=message):
        convert(mlp_ckpt, out, model=factory, input_shapes=["1,37"])
    assert _files(tmp_path) == []


class DictOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(37, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.fc(x), "x": x}


@pytest.mark.parametrize("frontend, quantizer", [("fx", "fx"), ("fx", "pt2e"), ("export", "pt2e")])
def test_dict_output_is_a_tuple_of_its_tensors(tmp_path, frontend, quantizer):
    """A dict result (a ModelOutput too) is returned as its tensors in a tuple, in the dict's order, through every
    way in, as a model called with keywords returns its ModelOutput (it was refused as "a constant")."""
    net = DictOutput().eval()
    torch.save(net.state_dict(), tmp_path / "m.pt")
    convert(tmp_path / "m.pt", tmp_path / "m.qrt", model="test_convert:DictOutput", input_shapes=["1,37"],
            frontend=frontend, quantizer=quantizer)
    x = np.random.default_rng(6).standard_normal((3, 37)).astype(np.float32)
    logits, same = qrt.load(tmp_path / "m.qrt").run(x)
    want = quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)(torch.from_numpy(x))
    np.testing.assert_array_equal(logits, want["logits"].numpy())
    np.testing.assert_array_equal(same, x)


def test_missing_factory_cli(tmp_path, mlp_ckpt):
    r = cli(mlp_ckpt, "-o", str(tmp_path / "m.qrt"), "--model", "models:nope", "--input-shape", "1,37")
    assert r.returncode == 2 and "models:nope" in r.stderr and "Traceback" not in r.stderr
    assert _files(tmp_path) == []


def test_state_dict_needs_factory(tmp_path, mlp_ckpt):
    with pytest.raises(ConvertError, match="--model"):
        convert(mlp_ckpt, tmp_path / "m.qrt", input_shapes=["1,37"])


def _npz(path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"y": np.zeros((8, 37), np.float32), "z": np.zeros((8, 37), np.float32)}, r"arrays \['y', 'z'\].*\['x'\]"),
        ({"x": np.zeros((8, 37), np.float64)}, "dtype float64, expected float32"),
        ({"x": np.zeros((8, 36), np.float32)}, r"does not (fit|run).*\[1, 36\]"),
        ({"x": np.zeros((37,), np.float32)}, r"\[samples, features...\]"),
        ({"x": np.full((8, 37), np.nan, np.float32)}, "NaN"),
    ],
)
def test_bad_calibration_data(tmp_path, mlp_ckpt, arrays, message):
    calib = _npz(tmp_path / "calib.npz", **arrays)
    out = tmp_path / "m.qrt"
    with pytest.raises(ConvertError, match=message):
        convert(mlp_ckpt, out, model="models:make_mlp", mode="static", calib=calib)
    assert not out.exists()


def test_static_needs_calibration(tmp_path, mlp_ckpt):
    with pytest.raises(ConvertError, match="--calib"):
        convert(mlp_ckpt, tmp_path / "m.qrt", model="models:make_mlp", mode="static", input_shapes=["1,37"])


def test_unwritable_output(tmp_path, mlp_ckpt):
    missing_dir = tmp_path / "no" / "such" / "m.qrt"
    r = cli(mlp_ckpt, "-o", str(missing_dir), "--model", "models:make_mlp", "--input-shape", "1,37")
    assert r.returncode == 2 and "does not exist" in r.stderr
    with pytest.raises(ConvertError, match="is a directory"):
        convert(mlp_ckpt, tmp_path, model="models:make_mlp", input_shapes=["1,37"])
    assert _files(tmp_path) == []


def test_failed_write_leaves_nothing(tmp_path, mlp_ckpt, monkeypatch):
    """A failure while writing (disk full, say) leaves neither the file nor a temporary."""
    import qrt.format

    monkeypatch.setattr(qrt.format.os, "fdopen", lambda fd, mode: _Failing(fd))
    with pytest.raises(ConvertError, match="No space left"):
        convert(mlp_ckpt, tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,37"])
    assert _files(tmp_path) == []


class _Failing:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False

    def write(self, data):
        raise OSError(28, "No space left on device")


def test_input_shape_count_and_format(tmp_path, mlp_ckpt):
    with pytest.raises(ConvertError, match="got 2 --input-shape"):
        convert(mlp_ckpt, tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,37", "1,4"])
    with pytest.raises(ConvertError, match="comma-separated"):
        convert(mlp_ckpt, tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1x37"])
    with pytest.raises(ConvertError, match=r"does not run on inputs.*\[1, 36\]"):
        convert(mlp_ckpt, tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,36"])
    assert _files(tmp_path) == []


def _rules_file(path, name: str, schemes: dict) -> str:
    path.write_text(
        "import dataclasses\nfrom tools.rules import DEFAULT_RULES\n"
        f"RULES = dataclasses.replace(DEFAULT_RULES, name={name!r}, module_schemes={schemes!r})\n"
    )
    return str(path)


def test_rules_per_module_scheme(tmp_path, mlp_ckpt):
    """One layer with float16 weights, one per-channel, the rest per-tensor, against quantize_dynamic."""
    rules = _rules_file(tmp_path / "mixed.py", "mixed", {"fc3": "float16", "fc2": "per-channel"})
    out = tmp_path / "mixed.qrt"
    convert(mlp_ckpt, out, model="models:make_mlp", input_shapes=["1,37"], rules=rules)
    spec = {"fc1": default_dynamic_qconfig, "fc2": per_channel_dynamic_qconfig, "fc3": float16_dynamic_qconfig}
    want = quantize_dynamic(models.make_mlp().eval(), spec)
    assert want.fc3.weight().dtype == torch.float32 and want.fc2.weight().qscheme() == torch.per_channel_affine
    x = inputs(np.random.default_rng(10), 6, 37)
    with torch.no_grad():
        np.testing.assert_array_equal(qrt.run(out, x), want(torch.from_numpy(x)).numpy())


def test_rules_keep_float_layer(tmp_path, mlp_ckpt):
    """fc3 kept in float runs as linear_float; fc1, fc2 stay bit-exact with quantize_dynamic.

    linear_float cannot be bit-exact: numpy's BLAS and torch's GEMM sum the K products in different
    orders (and blockings). Each result is within gamma_K * sum_k |h_k w_k| of the exact dot product
    (gamma_K = K u / (1 - K u), u = 2**-24, any order, with or without fma), plus one rounding for
    the bias, so the two differ by at most twice that; fc3's input h is the same in both (bit-exact).
    """
    rules = _rules_file(tmp_path / "float.py", "float-head", {"fc3": "float"})
    out = tmp_path / "m.qrt"
    convert(mlp_ckpt, out, model="models:make_mlp", input_shapes=["1,37"], rules=rules)
    model = qrt.load(out)
    assert [n.op for n in model.graph.nodes] == ["linear_dynamic", "relu", "linear_dynamic", "relu", "linear_float"]
    want = quantize_dynamic(models.make_mlp().eval(), {"fc1": default_dynamic_qconfig, "fc2": default_dynamic_qconfig})
    assert type(want.fc3) is nn.Linear
    seen = {}
    want.fc3.register_forward_hook(lambda m, i, o: seen.update(h=i[0].numpy()))  # returns None: output kept
    x = inputs(np.random.default_rng(11), 16, 37)
    with torch.no_grad():
        expected = want(torch.from_numpy(x)).numpy()
    got = qrt.run(out, x)
    k, u = 48, 2.0**-24
    w, b = want.fc3.weight.detach().numpy(), want.fc3.bias.detach().numpy()
    magnitude = np.abs(seen["h"]) @ np.abs(w).T + np.abs(b)
    bound = 2 * ((k + 1) * u / (1 - (k + 1) * u)) * magnitude
    assert np.all(np.abs(got - expected) <= bound)
    print(f"linear_float vs torch: max |diff| {np.abs(got - expected).max():.3g}")


def test_rules_keep_recurrent_layer_in_float(tmp_path):
    """An LSTM kept in float runs as lstm_float: h_n within twice the bound of tests/recurrent_bound.py of torch's
    float LSTM; the dynamic head, fed qrt's h_n, gives quantize_dynamic's bits (fed torch's, a last-bit difference
    in h_n may move its input quantization by a step)."""
    from recurrent_bound import layer_bound

    ckpt = tmp_path / "lstm.pt"
    torch.save(models.make_lstm_classifier().state_dict(), ckpt)
    rules = _rules_file(tmp_path / "float.py", "float-rnn", {"rnn": "float"})
    convert(ckpt, tmp_path / "m.qrt", model="models:make_lstm_classifier", input_shapes=["1,5,12"], rules=rules)
    assert [n.op for n in qrt.load(tmp_path / "m.qrt").graph.nodes] == ["lstm_float", "linear_dynamic"]
    want = quantize_dynamic(models.make_lstm_classifier().eval(), {"head": default_dynamic_qconfig})
    assert type(want.rnn) is nn.LSTM
    x = inputs(np.random.default_rng(12), 3, 5, 12)
    logits, h_n = qrt.run(tmp_path / "m.qrt", x)
    _, (_, e_h, _) = layer_bound("lstm", want.rnn, x)
    with torch.no_grad():
        _, (want_h, _) = want.rnn(torch.from_numpy(x))
        head = want.head(torch.from_numpy(h_n)).numpy()
    assert np.all(np.abs(h_n.astype(np.float64) - want_h.numpy()) <= 2 * e_h)
    np.testing.assert_array_equal(logits, head)

    missing = _rules_file(tmp_path / "missing.py", "missing", {"decoder": "per-channel"})
    with pytest.raises(ConvertError, match="module 'decoder', which the model does not have"):
        convert(ckpt, tmp_path / "m.qrt", model="models:make_lstm_classifier", input_shapes=["1,5,12"], rules=missing)


@pytest.mark.parametrize("options, named", [
    ({"mode": "static"}, "--mode static"),
    ({"weight_dtype": "float16", "weights": "per-channel"}, "--weight-dtype float16, --weights per-channel"),
    ({"quantizer": "fx"}, "--quantizer fx"),
])
def test_quantization_options_refused_for_a_quantized_checkpoint(tmp_path, options, named):
    """They choose how a float model is quantized; given for a quantized one they were ignored, exit 0."""
    torch.save(quantize_dynamic(models.make_mlp().eval(), {nn.Linear}, dtype=torch.qint8), tmp_path / "q.pt")
    with pytest.raises(ConvertError, match=f"^the model is quantized already, its scheme in the checkpoint: {named} "
                                           "applies to a float model$"):
        convert(tmp_path / "q.pt", tmp_path / "q.qrt", input_shapes=["1,37"], trust_checkpoint=True, **options)
    assert not (tmp_path / "q.qrt").exists()

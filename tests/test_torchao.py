"""torchao quantize_ models (issue 37 item 4): qrt against torchao's own CPU forward.

Int8DynamicActivationInt8WeightConfig: torchao quantizes each row of the input symmetrically to int8,
multiplies exactly in int32 (torch._int_mm, or its u8 x s8 form with a column-sum correction on VNNI CPUs:
the same integers) and scales the product by the row's scale, then the column's, then adds the bias, each a
float32 rounding. qrt computes the same operations in the same order: tolerance 0, on every kernel variant.

Int8WeightOnlyConfig: torchao's float mm(x, float(qdata).T) sums in BLAS's order, qrt in its own fixed
order; the products are the same float32 values (int8 values are exact in float32), so each output may
differ by the reordering bound (weight_only_bound) and no more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from tools.convert import ConvertError, convert
from tools.torchao_frontend import DYNAMIC, TorchaoError, describe_linear

U = 2.0**-24  # float32's unit roundoff


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def quantized_linear(k: int, n: int, bias: bool, config, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    m = nn.Linear(k, n, bias=bias).eval()
    quantize_(m, config)
    return m


def one_node_file(path, m: nn.Linear) -> None:
    """The one linear_dynamic node the converter writes for a torchao dynamic Linear."""
    layer = describe_linear(m)
    assert layer.mode == DYNAMIC
    g = GraphBuilder()
    x = g.input("x", "float32", [None, m.in_features])
    ports = {"x": x, **layer.weight.ports(), "bias": layer.bias}
    g.output(g.node("linear_dynamic", ports, {"reduce_range": False, "activation": DYNAMIC}))
    g.save(path)


def awkward_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Random rows, with a zero row (scale at torchao's floor, 2^-23), a tiny one, and one whose largest
    magnitude lands on -127.5 steps (rounds to -128) and +127.5 (clamped to 127)."""
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    if m >= 4:
        x[1] = 0
        x[2] *= np.float32(1e-30)
        x[3, 0], x[3, -1] = -5.0, 5.0
    return x


@pytest.mark.parametrize("k, n, bias", [(37, 29, True), (2, 3, True), (300, 70, False), (64, 128, True)])
def test_dynamic_linear_matches_torchao_bit_for_bit(tmp_path, variant, k, n, bias):
    m = quantized_linear(k, n, bias, Int8DynamicActivationInt8WeightConfig())
    path = tmp_path / "lin.qrt"
    one_node_file(path, m)
    model = qrt.load(path)
    rng = np.random.default_rng(k * n)
    for rows in (1, 5, 64):
        x = awkward_rows(rng, rows, k)
        with torch.no_grad():
            expected = m(torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(model.run({"x": x}), expected, err_msg=f"{variant} rows={rows}")


def test_dynamic_linear_split_across_threads(tmp_path):
    """Rows quantized and multiplied on 3 threads, every loop split as finely as it goes: torchao's bits still,
    and a NaN in a later thread's rows is found."""
    m = quantized_linear(300, 70, True, Int8DynamicActivationInt8WeightConfig())
    one_node_file(tmp_path / "t.qrt", m)
    x = awkward_rows(np.random.default_rng(7), 37, 300)
    with torch.no_grad():
        expected = m(torch.from_numpy(x)).numpy()
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    try:
        qrt.set_num_threads(3)
        model = qrt.load(tmp_path / "t.qrt")
        np.testing.assert_array_equal(model.run({"x": x}), expected)
        x[30, 4] = np.nan
        with pytest.raises(ValueError, match="NaN or infinity"):
            model.run({"x": x})
    finally:
        K._set_min_work(*floors)
        qrt.set_num_threads(before)


def test_dynamic_linear_rank3_input(tmp_path):
    m = quantized_linear(23, 11, True, Int8DynamicActivationInt8WeightConfig())
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, 23])
    layer = describe_linear(m)
    g.output(g.node("linear_dynamic", {"x": x, **layer.weight.ports(), "bias": layer.bias},
                    {"reduce_range": False, "activation": DYNAMIC}))
    g.save(tmp_path / "r3.qrt")
    x = awkward_rows(np.random.default_rng(3), 12, 23).reshape(3, 4, 23)
    with torch.no_grad():
        expected = m(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(qrt.run(tmp_path / "r3.qrt", {"x": x}), expected)


def test_dynamic_linear_rejects_nan_and_bad_attrs(tmp_path):
    m = quantized_linear(8, 4, True, Int8DynamicActivationInt8WeightConfig())
    one_node_file(tmp_path / "a.qrt", m)
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        qrt.run(tmp_path / "a.qrt", {"x": x})
    layer = describe_linear(m)
    # the writer runs the loader's checks (qrt/ops.py): a file with these nodes cannot be made, nor loaded
    for attrs, match in (({"reduce_range": True, "activation": DYNAMIC}, "reduce_range false"),
                         ({"reduce_range": False, "activation": "per_col"}, "must be one of")):
        g = GraphBuilder()
        xin = g.input("x", "float32", [None, 8])
        g.output(g.node("linear_dynamic", {"x": xin, **layer.weight.ports()}, attrs))
        with pytest.raises(qrt.FormatError, match=match):
            g.save(tmp_path / "bad.qrt")
    g = GraphBuilder()
    xin = g.input("x", "float32", [None, 8])
    g.output(g.node("linear_dynamic", {"x": xin, "weight": np.ones((4, 8), np.float16)},
                    {"reduce_range": False, "activation": DYNAMIC}))
    with pytest.raises(qrt.FormatError, match="needs int8 weights"):
        g.save(tmp_path / "f16.qrt")


# ------------------------------------------------------------ weight-only: the reordering bound


def weight_only_bound(m: nn.Linear, x: np.ndarray, x_err: np.ndarray | float = 0.0) -> np.ndarray:
    """How far qrt's output may be from torchao's for torchao's input x, qrt's input being within x_err of it:
    either side's sum of K products within gamma_K of the exact sum, its scaling and bias roundings (together
    gamma_{K+2}), and the input's error through the weights."""
    q = np.abs(m.weight.qdata.numpy().astype(np.float64))
    s = m.weight.scale.numpy().astype(np.float64).reshape(-1)
    b = np.zeros(q.shape[0]) if m.bias is None else np.abs(m.bias.detach().numpy().astype(np.float64))
    err = np.broadcast_to(np.asarray(x_err, np.float64), x.shape)
    ax = np.abs(x.astype(np.float64)) + err
    return 2 * gamma(q.shape[1] + 2) * ((ax @ q.T) * s + b) + (err @ q.T) * s


def weight_only_file(path, m: nn.Linear) -> None:
    """What the converter writes for a torchao weight-only Linear: float16 (exact) int8 values, * s, + b."""
    layer = describe_linear(m)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, m.in_features])
    y = g.node("linear_dynamic", {"x": x, "weight": layer.weight.values.astype(np.float16)})
    y = g.node("mul", {"a": y, "b": layer.weight.scale})
    g.output(g.node("add", {"a": y, "b": layer.bias}))
    g.save(path)


@pytest.mark.parametrize("k, n", [(37, 29), (2, 3), (300, 70)])
def test_weight_only_linear_within_reordering_bound(tmp_path, k, n):
    m = quantized_linear(k, n, True, Int8WeightOnlyConfig())
    weight_only_file(tmp_path / "w.qrt", m)
    x = np.random.default_rng(k).standard_normal((9, k)).astype(np.float32)
    with torch.no_grad():
        expected = m(torch.from_numpy(x)).numpy()
    got = qrt.run(tmp_path / "w.qrt", {"x": x})
    assert np.all(np.abs(got.astype(np.float64) - expected) <= weight_only_bound(m, x))


# ------------------------------------------------------------ models, through the converter


class MLP(nn.Module):
    """The issue's MLP: Linear, ReLU, Linear, ReLU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(37, 64), nn.Linear(64, 45), nn.Linear(45, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class RecurrentTagger(nn.Module):
    """A ReLU Elman RNN over 5 steps written with Linears (what torchao quantizes: an nn.RNN/GRU/LSTM it leaves
    float, tests/test_torchao_recurrent.py), then a Linear head on the last state. ReLU, not tanh: qrt's tanh and
    torch's differ in the last bit on some inputs, and this test is about the Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh, self.head = nn.Linear(13, 24), nn.Linear(24, 24), nn.Linear(24, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.ih(x[:, 0]))
        for t in range(1, 5):
            h = torch.relu(self.ih(x[:, t]) + self.hh(h))
        return self.head(h)


def quantized(cls: type, config) -> nn.Module:
    torch.manual_seed(1)
    net = cls().eval()
    quantize_(net, config)
    return net


def saved_program(tmp_path, net: nn.Module, example: torch.Tensor) -> str:
    """net exported with a free batch and saved: the .pt2 a user would make."""
    path = str(tmp_path / "model.pt2")
    torch.export.save(torch.export.export(net, (example,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)), path)
    return path


def run_both(net: nn.Module, path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    return qrt.run(path, {"x": x}), expected


def test_dynamic_mlp_from_state_dict_and_pt2(tmp_path):
    net = quantized(MLP, Int8DynamicActivationInt8WeightConfig())
    torch.save(net.state_dict(), tmp_path / "mlp.pt")
    result = convert(tmp_path / "mlp.pt", tmp_path / "a.qrt", model=f"{__name__}:MLP", input_shapes=["2,37"])
    assert result.mode == "prequantized"
    program = saved_program(tmp_path, net, torch.randn(3, 37))
    with pytest.raises(ConvertError, match=r"stores weights pickled \(fc1.weight, .*--trust-checkpoint"):
        convert(program, tmp_path / "b.qrt")
    assert not (tmp_path / "b.qrt").exists()
    convert(program, tmp_path / "b.qrt", trust_checkpoint=True)
    for path in ("a.qrt", "b.qrt"):
        for rows in (1, 6):
            x = awkward_rows(np.random.default_rng(rows), rows, 37)
            got, expected = run_both(net, tmp_path / path, x)
            np.testing.assert_array_equal(got, expected, err_msg=f"{path} rows={rows}")


def test_dynamic_recurrent_model_from_state_dict_and_pt2(tmp_path):
    net = quantized(RecurrentTagger, Int8DynamicActivationInt8WeightConfig())
    torch.save(net.state_dict(), tmp_path / "rnn.pt")
    result = convert(tmp_path / "rnn.pt", tmp_path / "a.qrt", model=f"{__name__}:RecurrentTagger",
                     input_shapes=["2,5,13"], frontend="export")
    assert result.frontend == "export"
    convert(saved_program(tmp_path, net, torch.randn(3, 5, 13)), tmp_path / "b.qrt", trust_checkpoint=True)
    for path, rows in (("a.qrt", 1), ("a.qrt", 8), ("b.qrt", 1), ("b.qrt", 6)):
        x = np.random.default_rng(rows).standard_normal((rows, 5, 13)).astype(np.float32)
        got, expected = run_both(net, tmp_path / path, x)
        np.testing.assert_array_equal(got, expected, err_msg=f"{path} rows={rows}")


def test_weight_only_mlp_from_pt2_within_propagated_bound(tmp_path):
    """Layer by layer, each Linear's reordering bound for torchao's input plus the error qrt's input carries
    through it (ReLU does not grow an error)."""
    net = quantized(MLP, Int8WeightOnlyConfig())
    convert(saved_program(tmp_path, net, torch.randn(3, 37)), tmp_path / "w.qrt", trust_checkpoint=True)
    x = np.random.default_rng(5).standard_normal((3, 37)).astype(np.float32)
    inputs = {}
    hooks = [lin.register_forward_hook(lambda mod, a, out: inputs.__setitem__(mod, a[0].numpy()))
             for lin in (net.fc1, net.fc2, net.fc3)]
    got, expected = run_both(net, tmp_path / "w.qrt", x)
    for h in hooks:
        h.remove()
    err: np.ndarray | float = 0.0
    for lin in (net.fc1, net.fc2, net.fc3):
        err = weight_only_bound(lin, inputs[lin], err)
    assert np.all(np.abs(got.astype(np.float64) - expected) <= err)


def test_unsupported_torchao_schemes_are_refused_by_name():
    from torchao.quantization import MappingType, PerGroup, PerTensor

    for config, match in (
        (Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC), "ASYMMETRIC.*not supported"),
        (Int8DynamicActivationInt8WeightConfig(granularity=PerTensor()), r"PerTensor\(\), SYMMETRIC.*not supported"),
        (Int8WeightOnlyConfig(granularity=PerGroup(8)), r"per-group Int8Tensor weights \(block_size \[1, 8\]\)"),
    ):
        with pytest.raises(TorchaoError, match=match):
            describe_linear(quantized_linear(16, 4, True, config))


def test_refused_scheme_names_the_module(tmp_path):
    from torchao.quantization import MappingType

    net = quantized(MLP, Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC))
    torch.save(net.state_dict(), tmp_path / "asym.pt")
    with pytest.raises(ConvertError, match=r"module 'fc1': torchao activation quantization .*ASYMMETRIC"):
        convert(tmp_path / "asym.pt", tmp_path / "a.qrt", model=f"{__name__}:MLP", input_shapes=["2,37"])
    program = saved_program(tmp_path, net, torch.randn(3, 37))
    with pytest.raises(ConvertError, match=r"module 'fc1': torchao activation quantization .*ASYMMETRIC"):
        convert(program, tmp_path / "a.qrt", trust_checkpoint=True)
    assert not (tmp_path / "a.qrt").exists()


@pytest.mark.parametrize("config", ["IntxWeightOnlyConfig", "Float8WeightOnlyConfig"])
def test_other_tensor_subclass_in_a_program_is_refused_by_name(tmp_path, config):
    """A .pt2 of another torchao scheme: refused, naming the module, as from a state_dict (its weights'
    dequantization had run as a float program, whose Linears the rules then quantized: 5.8e-3 off torchao)."""
    import torchao.quantization

    net = quantized(MLP, getattr(torchao.quantization, config)())
    program = saved_program(tmp_path, net, torch.randn(3, 37))
    with pytest.raises(ConvertError, match=r"module 'fc1': torchao \w+ weights are not supported"):
        convert(program, tmp_path / "o.qrt", trust_checkpoint=True)
    assert not (tmp_path / "o.qrt").exists()


def test_per_tensor_weights(tmp_path):
    """PerTensor weights (one scale, [1, 1]) with per-row activations: torchao's bits."""
    from torchao.quantization import PerRow, PerTensor

    m = quantized_linear(37, 9, True, Int8DynamicActivationInt8WeightConfig(granularity=[PerRow(), PerTensor()]))
    assert tuple(m.weight.scale.shape) == (1, 1)
    one_node_file(tmp_path / "pt.qrt", m)
    x = awkward_rows(np.random.default_rng(9), 6, 37)
    with torch.no_grad():
        expected = m(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(qrt.run(tmp_path / "pt.qrt", {"x": x}), expected)

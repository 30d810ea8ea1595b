"""BatchNorm in inference through the converter (tools/lower_ops.py: nn.BatchNorm1d / 2d / 3d in eval mode,
F.batch_norm and torch.batch_norm with training=False, and what torch.export writes for them: aten.batch_norm, or
aten._native_batch_norm_legit_no_training after run_decompositions) to qrt's op batch_norm: tabular models as users
write them, quantized with quantize_dynamic and saved whole or converted from the float model, and BatchNorm over
[N, C, L] and [N, C, H, W] inputs, through both front ends and a saved .pt2 program.

The bar, and why:
- Where torch's CPU capability is AVX2 or AVX512 (the default torch here runs AVX512; the CI reruns the suite
  under ATEN_CPU_CAPABILITY=avx2), qrt's batch_norm computes torch's bits (docs/NUMERICS.md, section 8), and a
  dynamic Linear's integer arithmetic is exact, so every model here is held bit for bit (np.array_equal) against
  torch's own: the quantize_dynamic model, or the float model where no Linear follows.
- torch's `default` capability rounds x * alpha and + beta (and beta's terms) separately where qrt's fma rounds
  once: a float BatchNorm output is then held to NUMERICS.md's bound, 2 ulp(|x alpha| + t) + ulp(t) with
  t = |mean alpha| + |bias| (the tightest that holds for every input: two roundings of each side's terms).
  Such a difference before a dynamic Linear can move an activation by one quantization step, which no ulp bound
  covers: the quantized models' end-to-end bits are skipped there (the BatchNorm op itself is still held above).
- What qrt cannot run in inference (batch statistics: training, track_running_stats=False, statistics computed
  at run time; a program that writes its running statistics back) is refused by a ConvertError naming the node.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import quantize_dynamic
from torch.export import Dim

import qrt
from tools.convert import ConvertError, convert

warnings.filterwarnings("ignore", module=r"torch\.ao")

CAPABILITY = torch.backends.cpu.get_cpu_capability()
TORCH_FMA = CAPABILITY in ("AVX2", "AVX512")  # torch's batch_norm kernel contracts to fma in these builds
BATCHES = (1, 5, 67)


# ------------------------------------------------------------ models


def _randomized(bn: nn.modules.batchnorm._BatchNorm, seed: int) -> nn.modules.batchnorm._BatchNorm:
    """bn with running statistics and affine terms far from the defaults (0, 1, 1, 0), some variances 0."""
    g = torch.Generator().manual_seed(seed)
    c = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=g) * 2)
        bn.running_var.copy_(torch.rand(c, generator=g) * 3)
        bn.running_var[::7] = 0.0  # 1 / sqrt(eps) alone
        if bn.affine:
            bn.weight.copy_(torch.randn(c, generator=g))
            bn.bias.copy_(torch.randn(c, generator=g))
    return bn


def make_mlp() -> nn.Module:
    """A tabular MLP: Linear, ReLU, BatchNorm1d, Dropout ... (BatchNorm after the ReLU, as usual)."""
    torch.manual_seed(11)
    return nn.Sequential(
        nn.Linear(20, 31), nn.ReLU(), _randomized(nn.BatchNorm1d(31), 1), nn.Dropout(0.3),
        nn.Linear(31, 17), nn.ReLU(), _randomized(nn.BatchNorm1d(17, eps=1e-3), 2),
        nn.Linear(17, 3),
    ).eval()


def make_linear_bn() -> nn.Module:
    """A BatchNorm1d straight after a Linear, which torchao's prepare_pt2e would fold into it."""
    torch.manual_seed(12)
    return nn.Sequential(nn.Linear(20, 31), _randomized(nn.BatchNorm1d(31), 3), nn.ReLU(), nn.Linear(31, 3)).eval()


class TabularNet(nn.Module):
    """Categorical columns through embeddings, continuous ones through a BatchNorm1d of their own (fastai's
    tabular model), concatenated, then an MLP with BatchNorm1d."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(13)
        self.embeds = nn.ModuleList([nn.Embedding(n, d) for n, d in ((7, 4), (12, 5), (3, 2))])
        self.bn_cont = _randomized(nn.BatchNorm1d(9), 4)
        self.layers = nn.Sequential(
            nn.Linear(4 + 5 + 2 + 9, 33), nn.ReLU(), _randomized(nn.BatchNorm1d(33), 5), nn.Dropout(0.1),
            nn.Linear(33, 2),
        )

    def forward(self, cats: torch.Tensor, cont: torch.Tensor) -> torch.Tensor:
        x = torch.cat([e(cats[:, i]) for i, e in enumerate(self.embeds)] + [self.bn_cont(cont)], 1)
        return self.layers(x)


def make_tabular() -> nn.Module:
    return TabularNet().eval()


class ChannelNorms(nn.Module):
    """BatchNorm1d over [N, C, L] (features at dimension 1, as for Conv1d outputs) and a non-affine BatchNorm2d
    over [N, C, L, 1]: their outputs are the model's, so torch's float bits are the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = _randomized(nn.BatchNorm1d(6, eps=1e-4), 6)
        self.bn2 = _randomized(nn.BatchNorm2d(6, affine=False), 7)

    def forward(self, x: torch.Tensor) -> tuple:
        y = self.bn(x)
        return y, self.bn2(y.unsqueeze(-1) - 0.5).squeeze(-1)


def make_channel_norms() -> nn.Module:
    return ChannelNorms().eval()


# ------------------------------------------------------------ helpers


def _ops(path: str) -> list[str]:
    return [n.op for n in qrt.load(path).graph.nodes]


def _save_state(tmp_path, model: nn.Module) -> str:
    ckpt = str(tmp_path / "float.pt")
    torch.save(model.state_dict(), ckpt)
    return ckpt


def _ulp(v: np.ndarray) -> np.ndarray:
    """float32's ulp at |v| (subnormals: the smallest normal's)."""
    _, e = np.frexp(np.maximum(np.abs(v), np.finfo(np.float32).tiny))
    return np.ldexp(1.0, e - 24)


def _batch_norm_bound(x: np.ndarray, bn: nn.modules.batchnorm._BatchNorm) -> np.ndarray:
    """NUMERICS.md's bound between qrt's fma(x, alpha, beta) and torch's default capability's x * alpha + beta."""
    view = (1, -1) + (1,) * (x.ndim - 2)
    weight = bn.weight.detach().numpy() if bn.affine else np.float32(1)
    bias = bn.bias.detach().numpy() if bn.affine else np.float32(0)
    var, mean = bn.running_var.numpy(), bn.running_mean.numpy()
    alpha = (np.float32(1) / np.sqrt(var + np.float32(bn.eps)) * weight).astype(np.float64)
    terms = np.abs(mean * alpha) + np.abs(bias)
    return (2 * _ulp(np.abs(x * alpha.reshape(view)) + terms.reshape(view)) + _ulp(terms).reshape(view))


def _assert_batch_norm_output(got: np.ndarray, want: np.ndarray, x: np.ndarray,
                              bn: nn.modules.batchnorm._BatchNorm) -> None:
    """torch's bits where its kernel contracts (AVX2, AVX512), else within _batch_norm_bound."""
    if TORCH_FMA:
        assert np.array_equal(got, want, equal_nan=True)
        return
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True)  # infinities and NaN where torch's are
    assert np.all(np.abs(got[finite].astype(np.float64) - want[finite]) <= _batch_norm_bound(x, bn)[finite])


def _assert_quantized_model_output(got: np.ndarray, want: np.ndarray) -> None:
    if not TORCH_FMA:
        pytest.skip(f"torch's {CAPABILITY} capability rounds batch norm twice: a dynamic Linear after it may "
                    "quantize an activation one step apart (the op is held to its bound by test_channel_norms_*)")
    assert np.array_equal(got, want)


def _rows(seed: int, batch: int, features: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, features)).astype(np.float32) * 2


# ------------------------------------------------------------ tabular models


def test_mlp_quantized_and_saved_whole(tmp_path):
    """quantize_dynamic's model saved whole: its BatchNorm1d layers lower to batch_norm, the file gives torch's
    bits at batch 1 and more."""
    q = quantize_dynamic(make_mlp(), {nn.Linear}, dtype=torch.qint8)
    ckpt, out = str(tmp_path / "q.pt"), str(tmp_path / "q.qrt")
    torch.save(q, ckpt)
    result = convert(ckpt, out, input_shapes=["2,20"], trust_checkpoint=True)
    assert result.shapes == {"input": "float32[?, 20]"}
    assert _ops(out).count("batch_norm") == 2
    m = qrt.load(out)
    for batch in BATCHES:
        x = _rows(batch, batch, 20)
        _assert_quantized_model_output(m.run(x), q(torch.from_numpy(x)).detach().numpy())


@pytest.mark.parametrize(("quantizer", "frontend"), [("pt2e", "fx"), ("fx", "export")])
def test_mlp_from_the_float_model(tmp_path, quantizer, frontend):
    """Mode dynamic from the float model: qrt's rules fuse no Linear with a BatchNorm: each stays a float
    batch_norm, and the file is quantize_dynamic's model,
    bit for bit."""
    out = str(tmp_path / "f.qrt")
    convert(_save_state(tmp_path, make_mlp()), out, model="test_convert_batch_norm:make_mlp", input_shapes=["2,20"],
            mode="dynamic", quantizer=quantizer, frontend=frontend)
    assert _ops(out) == ["linear_dynamic", "relu", "batch_norm"] * 2 + ["linear_dynamic"]
    q, m = quantize_dynamic(make_mlp(), {nn.Linear}, dtype=torch.qint8), qrt.load(out)
    for batch in BATCHES:
        x = _rows(20 + batch, batch, 20)
        _assert_quantized_model_output(m.run(x), q(torch.from_numpy(x)).detach().numpy())


def test_linear_then_batch_norm_under_each_quantizer(tmp_path):
    """A BatchNorm1d straight after a Linear stays a batch_norm after the dynamic Linear under both quantizers, as
    quantize_dynamic's model runs it: qrt's BackendConfig declares no Linear-BatchNorm fusion, and the pt2e flow
    keeps BatchNorms whole (torchao's prepare_pt2e folds one after a Linear into its weights: other int8 weights, it
    had written other bits). Both files are the same bytes."""
    ckpt = _save_state(tmp_path, make_linear_bn())
    for quantizer in ("fx", "pt2e"):
        convert(ckpt, tmp_path / f"{quantizer}.qrt", model="test_convert_batch_norm:make_linear_bn",
                input_shapes=["2,20"], quantizer=quantizer)
    out = str(tmp_path / "pt2e.qrt")
    assert (tmp_path / "fx.qrt").read_bytes() == (tmp_path / "pt2e.qrt").read_bytes()
    assert _ops(out) == ["linear_dynamic", "batch_norm", "relu", "linear_dynamic"]
    q, m = quantize_dynamic(make_linear_bn(), {nn.Linear}, dtype=torch.qint8), qrt.load(out)
    for batch in BATCHES:
        x = _rows(40 + batch, batch, 20)
        _assert_quantized_model_output(m.run(x), q(torch.from_numpy(x)).detach().numpy())


def _tabular_inputs(seed: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cats = np.stack([rng.integers(0, n, batch) for n in (7, 12, 3)], 1)
    cont = (rng.standard_normal((batch, 9)) * 3 + 1).astype(np.float32)
    return cats, cont


@pytest.mark.parametrize("saved", ["whole", "float"])
def test_tabular_model_with_embeddings(tmp_path, saved):
    """BatchNorm1d on the raw continuous features, concatenated with embeddings: saved whole after quantize_dynamic
    (trust_checkpoint), or converted from the float model (mode dynamic); torch's bits either way."""
    q = quantize_dynamic(make_tabular(), {nn.Linear}, dtype=torch.qint8)
    out = str(tmp_path / "t.qrt")
    options = {"input_shapes": ["2,3", "2,9"], "input_dtypes": {"cats": "int64"}}
    if saved == "whole":
        torch.save(q, tmp_path / "q.pt")
        result = convert(tmp_path / "q.pt", out, trust_checkpoint=True, **options)
    else:
        result = convert(_save_state(tmp_path, make_tabular()), out, model="test_convert_batch_norm:make_tabular",
                         **options)
    # cats stays free in width: the model reads its first 3 columns, as torch does of a wider one
    assert result.shapes == {"cats": "int64[?, ?]", "cont": "float32[?, 9]"}
    assert _ops(out).count("batch_norm") == 2
    m = qrt.load(out)
    for batch in BATCHES:
        cats, cont = _tabular_inputs(batch, batch)
        want = q(torch.from_numpy(cats), torch.from_numpy(cont)).detach().numpy()
        _assert_quantized_model_output(m.run({"cats": cats, "cont": cont}), want)


# ------------------------------------------------------------ channels at dimension 1, more dimensions after


def _check_channel_norms(path: str) -> None:
    model, m = make_channel_norms(), qrt.load(path)
    for batch, length in ((1, 1), (1, 9), (5, 13)):
        x = _rows(60 + batch + length, batch * 6, length).reshape(batch, 6, length)
        x[0, :, 0] = [np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38]
        y, y2 = m.run(x)
        want_y, want_y2 = (t.detach().numpy() for t in model(torch.from_numpy(x)))
        _assert_batch_norm_output(y, want_y, x, model.bn)
        _assert_batch_norm_output(y2, want_y2, want_y - np.float32(0.5), model.bn2)


def test_channel_norms_over_more_dimensions(tmp_path):
    """BatchNorm1d over [N, C, L] and BatchNorm2d over [N, C, L, 1] (non-affine: weight 1, bias 0 stored), batch and
    length free."""
    out = str(tmp_path / "c.qrt")
    ckpt = _save_state(tmp_path, make_channel_norms())
    result = convert(ckpt, out, model="test_convert_batch_norm:make_channel_norms", input_shapes=["2,6,9"],
                     frontend="export")
    assert result.shapes == {"x": "float32[?, 6, ?]"}
    assert _ops(out).count("batch_norm") == 2
    _check_channel_norms(out)


@pytest.mark.parametrize("decomposed", [False, True], ids=["as_exported", "decomposed"])
def test_channel_norms_from_a_pt2_program(tmp_path, decomposed):
    """A float program saved with torch.export.save: its BatchNorms are aten.batch_norm (training=False) as
    exported, aten._native_batch_norm_legit_no_training (item 0 read) after run_decompositions()."""
    ep = torch.export.export(make_channel_norms(), (torch.randn(3, 6, 9),),
                             dynamic_shapes=({0: Dim("batch"), 2: Dim("length")},))
    aten = torch.ops.aten
    op = aten._native_batch_norm_legit_no_training.default if decomposed else aten.batch_norm.default
    if decomposed:
        ep = ep.run_decompositions()
    assert sum(n.target is op for n in ep.graph.nodes) == 2
    path, out = str(tmp_path / "c.pt2"), str(tmp_path / "c.qrt")
    torch.export.save(ep, path)
    result = convert(path, out)
    assert result.shapes == {"x": "float32[?, 6, ?]"}
    assert _ops(out).count("batch_norm") == 2
    _check_channel_norms(out)


@pytest.mark.parametrize("decomposed", [False, True], ids=["as_exported", "decomposed"])
def test_mlp_from_a_pt2_program(tmp_path, decomposed):
    """A float MLP saved as .pt2 (quantized by the FX flow, docs/CONVERTER.md): quantize_dynamic's bits. After
    run_decompositions() its Linears are addmm(b, x, permute(W, [1, 0])) (mm without a bias), read as the Linears
    they are (they had been refused: "aten.addmm.default has no qrt lowering")."""
    path, out = str(tmp_path / "mlp.pt2"), str(tmp_path / "mlp.qrt")
    model = make_mlp()
    model[-1].bias = None  # the last Linear without a bias: aten.mm once decomposed
    ep = torch.export.export(model, (torch.randn(3, 20),), dynamic_shapes=({0: Dim("batch")},))
    if decomposed:
        ep = ep.run_decompositions()
        assert {torch.ops.aten.addmm.default, torch.ops.aten.mm.default} <= {n.target for n in ep.graph.nodes}
    torch.export.save(ep, path)
    convert(path, out)
    assert _ops(out).count("batch_norm") == 2 and _ops(out).count("linear_dynamic") == 3
    q, m = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8), qrt.load(out)
    for batch in BATCHES:
        x = _rows(80 + batch, batch, 20)
        _assert_quantized_model_output(m.run(x), q(torch.from_numpy(x)).detach().numpy())


class StoredProduct(nn.Module):
    """torch.mm of the input and a stored matrix: an mm whose right operand is not a Linear's transposed weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(20, 7, generator=torch.Generator().manual_seed(13)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)


def test_product_with_a_stored_matrix_is_not_a_linear(tmp_path):
    """Only mm / addmm of a transposed weight are read as Linears: torch.mm(x, W) stays the float product it is (it
    had raised IndexError, the reading taking W for a transpose)."""
    path, out = str(tmp_path / "mm.pt2"), str(tmp_path / "mm.qrt")
    torch.export.save(torch.export.export(StoredProduct(), (torch.randn(3, 20),),
                                          dynamic_shapes=({0: Dim("batch")},)), path)
    convert(path, out)
    assert "linear_dynamic" not in _ops(out)
    x, w = _rows(90, 4, 20), StoredProduct().w.detach().numpy()
    want = StoredProduct()(torch.from_numpy(x)).detach().numpy()
    # each side sums the 20 products in its own order: within gamma(20) sum |x w| of the exact sum, twice that apart
    bound = 2 * 20 * 2.0**-24 / (1 - 20 * 2.0**-24) * (np.abs(x).astype(np.float64) @ np.abs(w))
    assert np.all(np.abs(qrt.load(out).run(x) - want) <= bound)


# ------------------------------------------------------------ refusals


class BatchStatistics(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(6, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


class TrainingCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(6))
        self.register_buffer("var", torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.mean, self.var, training=True)


class ComputedStatistics(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, x.mean(0), (x * x).mean(0), training=False)


_REFUSED = [  # each on one front end: what refuses them is the lowering, which both share
    ("BatchStatistics", "fx", r"module 'bn' \(torch\.nn\.modules\.batchnorm\.BatchNorm1d\): batch_norm without "
                               r"running statistics \(track_running_stats=False\) normalises each batch by its own"),
    ("TrainingCall", "export", r"function torch\.batch_norm \(node 'batch_norm'\): batch_norm with training=True "
                            r"normalises each batch by its own mean and variance.*model\.eval\(\)"),
    ("ComputedStatistics", "fx", r"function torch\.batch_norm \(node 'batch_norm'\): batch_norm's running_mean is "
                                  r"computed when the model runs"),
]


@pytest.mark.parametrize(("name", "frontend", "message"), _REFUSED, ids=[r[0] for r in _REFUSED])
def test_batch_statistics_are_refused(tmp_path, name, frontend, message):
    """Batch statistics (what training and track_running_stats=False normalise by, or statistics the model computes
    from its input) are not what qrt's batch_norm runs: refused, naming the module or node."""
    ckpt = _save_state(tmp_path, globals()[name]())
    with pytest.raises(ConvertError, match=message):
        convert(ckpt, tmp_path / "r.qrt", model=f"test_convert_batch_norm:{name}", input_shapes=["4,6"],
                frontend=frontend)


@pytest.mark.parametrize("decomposed", [False, True], ids=["as_exported", "decomposed"])
def test_program_exported_in_training_mode_is_refused(tmp_path, decomposed):
    """A .pt2 exported without model.eval(): aten.batch_norm with training=True is refused by node; after
    run_decompositions() its BatchNorm is a functional training op that also returns the running statistics the
    program writes back (buffer mutations, which the export front end had failed on with a raw ValueError)."""
    model = nn.Sequential(_randomized(nn.BatchNorm1d(6), 8), nn.ReLU()).train()
    ep = torch.export.export(model, (torch.randn(3, 6),), dynamic_shapes=({0: Dim("batch")},))
    if decomposed:
        ep = ep.run_decompositions()
    path = str(tmp_path / "train.pt2")
    torch.export.save(ep, path)
    message = (r"aten\._native_batch_norm_legit_functional\.default has no qrt lowering .*the program writes back "
               r"0\.running_mean, 0\.running_var, 0\.num_batches_tracked, state qrt does not keep between runs .*"
               r"export it in eval mode"
               if decomposed else
               r"function torch\.batch_norm \(node 'batch_norm'\): batch_norm with training=True")
    with pytest.raises(ConvertError, match=message):
        convert(path, tmp_path / "train.qrt")

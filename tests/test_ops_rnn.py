"""rnn_cell_dynamic against torch.ao.nn.quantized.dynamic.RNNCell.

Tolerances:
- relu cell: exact. Its linear parts are bit-exact and relu rounds nothing.
- tanh cell, one step from the same state: 3e-7 absolute. The linear parts are
  bit-exact; torch's vectorised tanh is not correctly rounded (1 ulp off on
  ~0.1% of inputs), and one ulp of a value in (-1, 1) is at most 6e-8, so
  3e-7 is a few ulps and the tightest bound that holds across libms.
- float16 weights where torch runs a 256-bit fbgemm kernel (tests/reference.py): torch sums
  the products in another order, so its pre-activation may differ from qrt's by up to
  reference.reorder_bound for each linear, plus one rounding of their sum on each side; relu
  and tanh are 1-Lipschitz, so that bound (plus tanh's 3e-7) holds for the output. qrt itself
  is then held bit for bit to relu over its scalar oracle.
- tanh cell, 50 free-running steps: a last-bit difference in h can move the
  next step's dynamic quantization parameters and flip one rounding, so the
  states may drift apart by about one quantization step of h (hidden values
  are in (-1, 1) and scale <= 2/127). The bound is 2e-2, asserted along with
  the fraction of exactly equal values, and the measured drift is printed.
"""

import numpy as np
import pytest
import torch
from qrt_testing import dynamic_weight, quantized_copy
from reference import TORCH_FP16_ORDER_IS_QRTS, U, reorder_bound

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder

SIZES = [(1, 1), (5, 7), (37, 13), (64, 128), (129, 65)]


def _cell_model(path, qcell, input_size, hidden_size, nonlinearity):
    wb = qcell._weight_bias()
    w, b = wb["weight"], wb["bias"]
    g = GraphBuilder()
    x = g.input("x", "float32", [None, input_size])
    h = g.input("h", "float32", [None, hidden_size])
    ports = {
        "x": x,
        "h": h,
        **dynamic_weight(w["weight_ih"], b["bias_ih"], "ih_"),
        **dynamic_weight(w["weight_hh"], b["bias_hh"], "hh_"),
    }
    g.output(g.node("rnn_cell_dynamic", ports, {"nonlinearity": nonlinearity, "reduce_range": True}))
    g.save(path)
    return qrt.load(path)


def _pair(tmp_path, input_size, hidden_size, nonlinearity, dtype, per_channel, seed):
    torch.manual_seed(seed)
    cell = torch.nn.RNNCell(input_size, hidden_size, nonlinearity=nonlinearity)
    qcell = quantized_copy(cell, dtype, per_channel)
    return qcell, _cell_model(tmp_path / "cell.qrt", qcell, input_size, hidden_size, nonlinearity)


def _step(qcell, x, h):
    return qcell(torch.from_numpy(x), torch.from_numpy(h)).detach().numpy()


@pytest.mark.parametrize("weights", ["qint8", "qint8_per_channel", "float16"])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("input_size,hidden_size", SIZES)
def test_one_step_from_the_same_state(tmp_path, input_size, hidden_size, nonlinearity, weights):
    dtype = torch.float16 if weights == "float16" else torch.qint8
    qcell, model = _pair(
        tmp_path, input_size, hidden_size, nonlinearity, dtype, weights.endswith("per_channel"), input_size
    )
    rng = np.random.default_rng(hidden_size)
    for batch in (1, 3, 16):
        h = np.zeros((batch, hidden_size), np.float32)
        for _ in range(5):
            x = rng.standard_normal((batch, input_size)).astype(np.float32)
            want = _step(qcell, x, h)
            got = model.run({"x": x, "h": h})
            atol = 0.0 if nonlinearity == "relu" else 3e-7
            if weights == "float16" and not TORCH_FP16_ORDER_IS_QRTS:
                pre, bound = _float16_pre_activation(qcell, x, h)
                if nonlinearity == "relu":
                    np.testing.assert_array_equal(got, np.maximum(pre, np.float32(0)))
                assert np.all(np.abs(got - want) <= bound + atol)
            elif nonlinearity == "relu":
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=0, atol=atol)
            h = want  # continue from torch's state


def _float16_pre_activation(qcell, x, h):
    """lin_ih(x) + lin_hh(h) by qrt's scalar oracle, and how far any other summation order can be from it."""
    wb = qcell._weight_bias()
    pre, bound = np.zeros((x.shape[0], qcell.hidden_size), np.float32), 0.0
    for side, v in (("hh", h), ("ih", x)):
        w, b = (wb[kind][f"{kind}_{side}"].detach().numpy() for kind in ("weight", "bias"))
        y = np.empty_like(pre)
        K.gemm_f32_chain_reference(v, w, b, y)
        pre, bound = pre + y, bound + reorder_bound(v, w, b)
    return pre, bound + 2 * U * (np.abs(pre) + bound)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_fifty_free_running_steps(tmp_path, nonlinearity):
    qcell, model = _pair(tmp_path, 37, 65, nonlinearity, torch.qint8, False, 7)
    rng = np.random.default_rng(3)
    h_ref = h_qrt = np.zeros((2, 65), np.float32)
    drift = 0.0
    for _ in range(50):
        x = rng.standard_normal((2, 37)).astype(np.float32)
        h_ref, h_qrt = _step(qcell, x, h_ref), model.run((x, h_qrt))
        drift = max(drift, float(np.abs(h_ref - h_qrt).max()))
    print(f"{nonlinearity}: max drift over 50 free-running steps {drift:.3g}")
    if nonlinearity == "relu":
        np.testing.assert_array_equal(h_qrt, h_ref)
    else:
        assert drift <= 2e-2
        assert np.mean(h_qrt == h_ref) > 0.5


def test_batch_mismatch_is_a_clear_error(tmp_path):
    _, model = _pair(tmp_path, 5, 7, "tanh", torch.qint8, False, 0)
    with pytest.raises(ValueError, match="batch"):
        model.run({"x": np.zeros((2, 5), np.float32), "h": np.zeros((3, 7), np.float32)})

"""Which kernels torch runs here, checked against torch itself.

The op tests trust ``reference.TORCH_INT8_SATURATES`` and ``reference.TORCH_FP16_ORDER_IS_QRTS``
to decide whether torch's result on this machine is the exact one. These tests prove the guess
right on whatever CPU runs them (and under ``FBGEMM_ENABLE_INSTRUCTIONS``): each feeds torch a
case whose two possible answers differ, and demands the predicted one, bit for bit.
"""

import numpy as np
import torch
import torch.ao.nn.quantized as nnq
from qrt_testing import quantized_copy
from reference import FBGEMM_ISA, TORCH_FP16_ORDER_IS_QRTS, TORCH_INT8_SATURATES, static_linear, u8s8_accumulate

from qrt import _kernels as K


def test_int8_saturation_is_predicted():
    rng = np.random.default_rng(1)
    m, k, n = 6, 41, 9
    xq = rng.integers(200, 256, (m, k), dtype=np.uint8)  # large activations: many pairs pass 2**15
    wq = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w_scale, x_scale, y_scale, y_zp = np.float32(0.004), np.float32(0.01), np.float32(2.0), 128
    module = nnq.Linear(k, n)
    module.set_weight_bias(torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq), float(w_scale), 0), None)
    module.scale, module.zero_point = float(y_scale), y_zp
    x = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), float(x_scale), 0)
    got = module(x).int_repr().numpy()
    exact, saturated = (static_linear(u8s8_accumulate(xq, 0, wq, 0, sat), x_scale, w_scale, None, y_scale, y_zp,
                                      False) for sat in (False, True))
    assert not np.array_equal(exact, saturated), "the probe must tell the two kernels apart"
    want = saturated if TORCH_INT8_SATURATES else exact
    np.testing.assert_array_equal(got, want, err_msg=f"fbgemm ISA guessed {FBGEMM_ISA}")


def test_float16_order_is_predicted():
    torch.manual_seed(3)
    m, k, n = 2, 300, 65  # the 256-bit kernels take another order at one or two rows
    ref = quantized_copy(torch.nn.Linear(k, n), torch.float16, False)
    x = (np.random.default_rng(2).standard_normal((m, k)) * 10).astype(np.float32)
    got = ref(torch.from_numpy(x)).detach().numpy()
    w, b = ref.weight().detach().numpy(), ref.bias().detach().numpy()
    oracle = np.empty((m, n), np.float32)
    K.gemm_f32_chain_reference(x, w, b, oracle)
    same = np.array_equal(got.view(np.int32), oracle.view(np.int32))
    assert same == TORCH_FP16_ORDER_IS_QRTS, f"fbgemm ISA guessed {FBGEMM_ISA}; torch == qrt's order: {same}"

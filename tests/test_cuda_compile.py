"""Every CUDA source compiles with nvcc, as CuPy will see it, for the GPUs qrt targets.

Runs without a GPU (nvcc only; skipped when nvcc is absent). Each source is
compiled after qrt.gpu inlines its headers, with the same --fmad=false, to a
cubin (so ptxas checks the inline PTX: dp4a, mma.sync, cp.async), and every
entry point qrt.gpu looks up must be in it.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qrt import gpu

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")

_Q = [f"{op}_{t}" for op in ("quantize_per_tensor", "quantize_per_channel", "dequantize_per_tensor",
                             "dequantize_per_channel") for t in ("uint8", "int8", "int32")]
ENTRY_POINTS = {
    "quantize.cu": _Q,
    "dynamic_quant.cu": ["dq_small", "dq_partial", "dq_finish", "row_sums_u8"],
    "gemm_s8.cu": [f"gemv_{e}_{mb}" for e in ("float", "requant") for mb in (1, 2, 4, 8)]
    + ["gemm_float", "gemm_requant"],
    "gemv_dynamic.cu": [f"gemv_dq_{mb}" for mb in (1, 2, 4, 8)]
    + [f"gemv_q_{e}_{mb}" for e in ("float", "requant") for mb in (1, 2, 4, 8)],
    "linear_chain.cu": ["linear_fp16", "linear_f32"],
    "linear_rows.cu": ["dq_rows_symmetric", "linear_rows_symmetric"],
    "rnn_cell.cu": [f"gate_update_{kind}" for kind in ("rnn_tanh", "rnn_relu", "lstm", "gru")]
    + [f"rnn_step_{a}_{mb}" for a in ("tanh", "relu") for mb in (1, 2, 4, 8)],
    "rnn_persistent.cu": [f"rnn_persistent_{k}_{mb}" for k in ("rnn_tanh", "rnn_relu", "lstm", "gru")
                          for mb in (1, 2, 4)]
    + [f"rnn_input_proj_{mb}" for mb in (1, 2, 4)],
    "float_ops.cu": [f"unary_{op}" for op in ("relu", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh", "sqrt",
                                              "rsqrt", "log", "sin", "cos", "ceil", "floor")]
    + ["sum_f32", "mean_f32", "softmax_f32", "log_softmax_f32", "layer_norm_f32"],
    "attention.cu": ["matmul_f32", "attention_f32"],
    "embedding.cu": ["embedding_check", "embedding_check_values"]
    + [f"embedding_{kind}_{bits}" for kind in ("rows", "bags") for bits in (32, 8, 4)],
}


def _archs() -> list[str]:
    listed = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
    return ["sm_80", "sm_90"] + (["sm_87"] if "compute_87" in listed else [])  # sm_87: Jetson Orin


def test_every_source_is_listed():
    sources = sorted(p.name for p in gpu.SOURCE_DIR.glob("*.cu"))
    assert sources == sorted(ENTRY_POINTS)


def test_sources_compile(tmp_path: Path):
    jobs = []
    for name in ENTRY_POINTS:
        src = tmp_path / name
        src.write_text(gpu.kernel_source(name))  # exactly the text handed to NVRTC
        for arch in _archs():
            jobs.append((name, arch, src, tmp_path / f"{name}.{arch}.cubin"))

    def compile_one(job):
        name, arch, src, out = job
        cmd = [NVCC, f"-arch={arch}", *gpu.NVRTC_OPTIONS, "-cubin", "-o", str(out), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        return job, r

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, jobs))
    failures = [f"{j[0]} for {j[1]}:\n{r.stderr}" for j, r in results if r.returncode != 0]
    assert not failures, "\n".join(failures)
    for (name, arch, _, out), r in results:
        assert "warning" not in r.stderr.lower(), f"{name} for {arch}: {r.stderr}"
        blob = out.read_bytes()
        missing = [e for e in ENTRY_POINTS[name] if e.encode() + b"\0" not in blob]
        assert not missing, f"{name} for {arch} lacks entry points {missing}"

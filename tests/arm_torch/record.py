"""Record torch's quantization on aarch64 (engine qnnpack) at rounding ties: tests/test_qnnpack.py holds qrt's
qnnpack numerics to this file (docs/NUMERICS.md section 9). Needs torch on an aarch64 CPU; run where one is:

    python tests/arm_torch/record.py tests/arm_torch/qnnpack_ties.npz

Recorded under qemu-aarch64 7.2 (-cpu max) with torch 2.9.1+cpu, the CPU build PyPI has for aarch64, its
Python from Debian's arm64 packages (../shared/ARM.md): the same file came from -cpu cortex-a72.
"""

import platform
import sys

import numpy as np
import torch
from torch import nn

QUANTIZE = ((0.02, 128), (0.0137, 3), (0.3, 77))  # (scale, zero point of quint8 and qint32; qint8's is - 128)
LINEAR_RANGES = ((-1.0, 1.55), (-0.3, 2.25), (-2.0, 0.55))  # each input's range: its quantization parameters


def near_ties(scale: float, count: int) -> np.ndarray:
    """Values on the half-integer ties of x / scale, and the floats either side of each."""
    ties = ((np.arange(-count // 2, count // 2) + 0.5) * scale).astype(np.float32)
    return np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])


def main(path: str) -> None:
    if platform.machine() not in ("aarch64", "arm64"):
        raise SystemExit(f"this records torch on aarch64; this machine is {platform.machine()}")
    torch.backends.quantized.engine = "qnnpack"
    out = {"torch": np.array(f"{torch.__version__} {platform.machine()}")}
    for i, (scale, zp) in enumerate(QUANTIZE):
        x = near_ties(scale, 200)
        out[f"quantize{i}_x"], out[f"quantize{i}_scale"], out[f"quantize{i}_zero_point"] = x, np.float32(scale), zp
        for name, dtype, z in (("quint8", torch.quint8, zp), ("qint8", torch.qint8, zp - 128),
                               ("qint32", torch.qint32, zp)):
            q = torch.quantize_per_tensor(torch.from_numpy(x), scale, z, dtype)
            out[f"quantize{i}_{name}"] = q.int_repr().numpy()
        scales, zps = torch.tensor([scale, scale * 1.7], dtype=torch.float64), torch.tensor([zp, zp // 2])
        per_channel = torch.quantize_per_channel(torch.from_numpy(np.stack([x, x])), scales, zps, 0, torch.quint8)
        out[f"quantize{i}_per_channel"] = per_channel.int_repr().numpy()
        out[f"quantize{i}_per_channel_scale"], out[f"quantize{i}_per_channel_zero_point"] = scales.numpy(), zps.numpy()
    for i, (lo, hi) in enumerate(LINEAR_RANGES):
        x = np.clip(near_ties((hi - lo) / 255, 120), lo, hi)
        x = np.concatenate([[lo, hi], x]).astype(np.float32)[None, :]
        torch.manual_seed(40 + i)
        qlinear = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(x.shape[1], 16)), {nn.Linear},
                                                         dtype=torch.qint8)[0]
        w = qlinear.weight()
        out[f"linear{i}_x"] = x
        out[f"linear{i}_weight"] = w.int_repr().numpy()
        out[f"linear{i}_weight_scale"] = np.float32(w.q_scale())
        out[f"linear{i}_weight_zero_point"] = np.int32(w.q_zero_point())
        out[f"linear{i}_bias"] = qlinear.bias().detach().numpy()
        out[f"linear{i}_y"] = qlinear(torch.from_numpy(x)).detach().numpy()
    np.savez_compressed(path, **out)
    print(f"{path}: {len(out)} arrays, torch {torch.__version__} on {platform.machine()}")


if __name__ == "__main__":
    main(sys.argv[1])

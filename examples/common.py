"""What every example does the same way: save a float model, convert it, time and compare the result.

The examples run from a checkout (`PYTHONPATH=. .venv/bin/python examples/<name>.py`) and from the
tests (tests/test_examples.py), which import them and check the figures they return. They run their
qrt models on the GPU with `QRT_DEVICE=cuda` (load() below), with the CPU's bits
(tests/test_examples_gpu.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):  # the converter from tools/, and the examples as `--model` factories
    if path not in sys.path:
        sys.path.insert(0, path)


# where the examples run their qrt models: "cpu", or "cuda" (CuPy and an NVIDIA GPU)
DEVICE = os.environ.get("QRT_DEVICE", "cpu")


def load(path: str):
    """qrt.load on the examples' device (DEVICE)."""
    import qrt

    return qrt.load(path, device=DEVICE)


def convert(model: nn.Module, factory: str, out_dir: str, *args: str) -> str:
    """Save model's state_dict as a training script would and run the converter's command line on it.

    factory: `module:function` rebuilding the float model (the module is one of the examples).
    Returns the path of the .qrt file.
    """
    from tools import convert as qconvert

    name = factory.split(":")[1]
    ckpt, out = os.path.join(out_dir, f"{name}.pt"), os.path.join(out_dir, f"{name}.qrt")
    torch.save(model.state_dict(), ckpt)
    status = qconvert.main([ckpt, "-o", out, "--model", factory, "--quiet", *args])
    if status != 0:
        raise SystemExit(f"converting {factory} failed (status {status})")
    return out


def quantize_dynamic(model: nn.Module) -> nn.Module:
    """PyTorch's own dynamic quantization of the same float model: the reference qrt is compared with."""
    modules = {nn.Linear, nn.LSTM, nn.GRU, nn.RNN, nn.LSTMCell, nn.GRUCell, nn.RNNCell}
    return torch.ao.quantization.quantize_dynamic(model, modules, dtype=torch.qint8)


def median_us(fn: Callable[[], object], repeat: int = 200) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def latency(what: str, run_qrt: Callable[[], object], run_torch: Callable[[], object]) -> str:
    """A line comparing the median time of one call of each (torch without autograd)."""
    t_qrt = median_us(run_qrt)
    with torch.no_grad():
        t_torch = median_us(run_torch)
    return f"{what} (median): qrt {t_qrt:.1f} us, PyTorch {t_torch:.1f} us, {t_torch / t_qrt:.1f}x"


def largest_row_sum(linear: nn.Linear) -> float:
    """max_i sum_j |W_ij|: how far a change of the Linear's input (a drifted recurrent state) can move an output."""
    return float(linear.weight.detach().abs().sum(1).max())


def max_abs_diff(got: Sequence[np.ndarray] | np.ndarray, want: Sequence[np.ndarray] | np.ndarray) -> float:
    """The largest |got - want| over matching arrays (nested tuples compared leaf by leaf)."""
    if isinstance(got, np.ndarray):
        return float(np.abs(got - np.asarray(want)).max())
    return max(max_abs_diff(g, w) for g, w in zip(got, want, strict=True))


def to_numpy(value):
    """torch tensors (nested in tuples) to numpy arrays, as qrt returns them."""
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return tuple(to_numpy(v) for v in value)


def main(run_example: Callable[[str], object]) -> None:
    """Run an example as a script: one thread on both sides (the figures compare kernels, not cores),
    files in a temporary folder."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run_example(tmp)


def report(title: str, lines: Sequence[str]) -> None:
    print(title)
    for line in lines:
        print(f"  {line}")

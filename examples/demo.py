"""qrt demo, the user's way: train in PyTorch, save a checkpoint, convert it, run it with qrt.

    make demo        (or: PYTHONPATH=. .venv/bin/python examples/demo.py)

1. builds a small classifier and trains it briefly on synthetic data (no downloads);
2. saves its state_dict, as a training script would;
3. converts it with tools/convert.py, dynamic and static (calibrated) quantization;
4. runs the .qrt files with qrt.run / qrt.load and compares them with PyTorch's own
   quantized models (quantize_dynamic; convert_fx under qrt's rules), printing agreement
   and the median latency of batch-1 calls for both;
5. does the same for two recurrent models: a keyword-spotting GRU (examples/keyword_spotting.py)
   and PyTorch's word-level LSTM language model, which qrt then uses to generate text
   (examples/word_language_model.py). examples/ holds more (README.md lists them).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N_IN, N_OUT = 64, 10


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_IN, 256)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(256, 256)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(256, N_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def make_model() -> Classifier:
    """The factory the converter calls: `--model demo:make_model`."""
    return Classifier()


def synthetic_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten Gaussian clusters in 64 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(N_OUT, N_IN, generator=torch.Generator().manual_seed(0)) * 0.3
    labels = torch.randint(0, N_OUT, (n,), generator=g)
    return centers[labels] + torch.randn(n, N_IN, generator=g), labels


def train(model: nn.Module) -> float:
    x, y = synthetic_data(4096, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(3):
        for i in range(0, len(x), 128):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i : i + 128]), y[i : i + 128]).backward()
            opt.step()
    xt, yt = synthetic_data(1000, seed=2)
    with torch.no_grad():
        return (model(xt).argmax(1) == yt).float().mean().item()


def convert(*args: str) -> None:
    """tools/convert.py, as a user runs it from the folder holding their model code."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", "convert.py"), *args, "--quiet"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
    r = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"conversion failed:\n{r.stderr}")
    print("  " + r.stdout.strip())


def median_us(fn, x, repeat: int = 300) -> float:
    for _ in range(20):
        fn(x)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def compare(name: str, path: str, torch_model: nn.Module, x: np.ndarray, labels: np.ndarray) -> None:
    import qrt

    y_qrt = qrt.run(path, x)
    with torch.no_grad():
        y_torch = torch_model(torch.from_numpy(x)).numpy()
    same_rows = int(np.all(y_qrt == y_torch, axis=1).sum())
    acc = float((y_qrt.argmax(1) == labels).mean())
    model = qrt.load(path)
    one = x[:1]
    t_qrt = median_us(model.run, one)
    with torch.no_grad():
        t_torch = median_us(lambda a: torch_model(torch.from_numpy(a)), one)
    print(f"{name}: {os.path.getsize(path) / 1024:.0f} KiB, accuracy {acc:.3f}")
    print(f"  bit-identical to PyTorch's quantized model: {same_rows}/{len(x)} rows, "
          f"max |diff| {np.abs(y_qrt - y_torch).max():.3g}")
    print(f"  batch-1 latency (median of 300): qrt {t_qrt:.1f} us, PyTorch {t_torch:.1f} us")


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = make_model()
    print(f"float model trained, accuracy {train(model):.3f}")
    model.eval()

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "classifier.pt")
        torch.save(model.state_dict(), ckpt)
        calib = os.path.join(tmp, "calib.npz")
        np.savez(calib, x=synthetic_data(256, seed=3)[0].numpy())
        dyn, sta = os.path.join(tmp, "dynamic.qrt"), os.path.join(tmp, "static.qrt")
        convert(ckpt, "-o", dyn, "--model", "demo:make_model", "--input-shape", f"1,{N_IN}")
        convert(ckpt, "-o", sta, "--model", "demo:make_model", "--mode", "static", "--calib", calib)

        # PyTorch's own quantization of the same float model, under the same rules.
        sys.path.insert(0, ROOT)
        from tools import qrt_backend
        from tools.rules import DEFAULT_RULES

        torch_dynamic = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        prepared = qrt_backend.prepare(model, DEFAULT_RULES, "static", "qint8", "per-tensor", [torch.zeros(1, N_IN)])
        data = np.load(calib)["x"]
        qrt_backend.calibrate(prepared, ([torch.from_numpy(data[i : i + 32])] for i in range(0, len(data), 32)))
        torch_static = qrt_backend.to_native(prepared, DEFAULT_RULES)

        xt, yt = synthetic_data(1000, seed=2)
        x, labels = xt.numpy(), yt.numpy()
        compare("dynamic int8", dyn, torch_dynamic, x, labels)
        compare("static int8", sta, torch_static, x, labels)

        import keyword_spotting
        import word_language_model

        print()
        keyword_spotting.run_example(tmp)
        print()
        word_language_model.run_example(tmp)


if __name__ == "__main__":
    main()

"""Anomaly detection with an LSTM sequence autoencoder over (batch, time, 6) sensor readings.

    PYTHONPATH=. .venv/bin/python examples/sequence_autoencoder.py

Trained briefly on clean multi-channel sine waves at 50 steps, converted once, then run by qrt on
windows of any length: the reconstruction error separates clean windows from corrupted ones.
"""

from __future__ import annotations

import common
import torch
from common import convert, largest_row_sum, max_abs_diff, quantize_dynamic, report
from torch import nn

N_FEATURES, LATENT, HIDDEN, STEPS = 6, 16, 32, 50


class SequenceAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(N_FEATURES, LATENT, batch_first=True)
        self.decoder = nn.LSTM(LATENT, HIDDEN, batch_first=True)
        self.output = nn.Linear(HIDDEN, N_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, time, N_FEATURES]
        z, _ = self.encoder(x)
        y, _ = self.decoder(z)
        return self.output(y)


def make_model() -> SequenceAutoencoder:
    """The converter's factory: `--model sequence_autoencoder:make_model`."""
    return SequenceAutoencoder()


def windows(n: int, steps: int, seed: int, anomalous: bool = False) -> torch.Tensor:
    """Six phase-shifted sines per window; anomalous windows get a burst of noise on one channel."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(steps)[None, :, None] * 0.3 + torch.rand(n, 1, 1, generator=g) * 6.3
    x = torch.sin(t + torch.arange(N_FEATURES)[None, None, :] * 0.7)
    if anomalous:
        start, width = steps // 3, min(8, steps - steps // 3)
        x[:, start : start + width, 2] += 1.5 * torch.randn(n, width, generator=g)
    return x + 0.02 * torch.randn(n, steps, N_FEATURES, generator=g)


def train(model: nn.Module, steps: int = 25) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for step in range(steps):
        x = windows(32, STEPS, seed=step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x).backward()
        opt.step()
    model.eval()


def run_example(out_dir: str, quiet: bool = False) -> dict:

    torch.manual_seed(0)
    model = make_model()
    train(model)
    path = convert(model, "sequence_autoencoder:make_model", out_dir, "--input-shape", f"1,{STEPS},{N_FEATURES}")
    qmodel, reference = common.load(path), quantize_dynamic(model)
    figures = {"head_row_sum": largest_row_sum(model.output)}
    for steps in (STEPS, 7, 120):  # the window length is free in the file
        clean, bad = windows(16, steps, seed=100 + steps), windows(16, steps, seed=200 + steps, anomalous=True)
        errors = {}
        for name, x in (("clean", clean), ("anomalous", bad)):
            got = qmodel.run(x.numpy())
            with torch.no_grad():
                want = reference(x).numpy()
            errors[name] = ((got - x.numpy()) ** 2).mean(axis=(1, 2))
            figures[(steps, name)] = max_abs_diff(got, want)
        figures[(steps, "separated")] = float((errors["anomalous"] > errors["clean"].max()).mean())
    if not quiet:
        lines = [f"{qmodel}"]
        for steps in (STEPS, 7, 120):
            diff = max(figures[(steps, "clean")], figures[(steps, "anomalous")])
            lines.append(
                f"{steps} steps: reconstruction within {diff:.2g} of PyTorch's; "
                f"{figures[(steps, 'separated')]:.0%} of anomalous windows above every clean one"
            )
        report("LSTM sequence autoencoder (dynamic int8)", lines)
    return figures


if __name__ == "__main__":
    common.main(run_example)

"""Keyword spotting: a 2-layer GRU over MFCC frames, the last frame's output, log_softmax over keywords.

    PYTHONPATH=. .venv/bin/python examples/keyword_spotting.py

The model is written as keyword-spotting code usually is (`out[:, -1]`, `F.log_softmax`), trained
briefly on synthetic "keywords" (each a pattern of feature frequencies over time), converted from
its state_dict with dynamic int8 quantization, and run by qrt at any batch size and clip length.
"""

from __future__ import annotations

import common
import torch
import torch.nn.functional as F
from common import convert, largest_row_sum, latency, max_abs_diff, quantize_dynamic, report
from torch import nn

N_MFCC, HIDDEN, N_KEYWORDS, FRAMES = 40, 64, 12, 49


class KeywordSpotter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(N_MFCC, HIDDEN, num_layers=2, batch_first=True)
        self.classifier = nn.Linear(HIDDEN, N_KEYWORDS)

    def forward(self, mfcc: torch.Tensor) -> torch.Tensor:  # [batch, frames, N_MFCC]
        out, _ = self.gru(mfcc)
        return F.log_softmax(self.classifier(out[:, -1]), dim=-1)


def make_model() -> KeywordSpotter:
    """The converter's factory: `--model keyword_spotting:make_model`."""
    return KeywordSpotter()


def clips(n: int, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic MFCC clips: keyword k sweeps a bump across the features at its own speed and start."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, N_KEYWORDS, (n,), generator=g)
    t = torch.linspace(0, 1, frames)[None, :, None]
    f = torch.arange(N_MFCC)[None, None, :]
    k = labels[:, None, None].float()
    centre = (4 + 2.5 * k + (10 + k) * t) % N_MFCC
    x = torch.exp(-0.5 * ((f - centre) / 2.0) ** 2)
    return x + 0.3 * torch.randn(n, frames, N_MFCC, generator=g), labels


def train(model: nn.Module, steps: int = 25) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = clips(64, FRAMES, seed=step)
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    model.eval()


def run_example(out_dir: str, quiet: bool = False) -> dict:

    torch.manual_seed(0)
    model = make_model()
    train(model)
    path = convert(model, "keyword_spotting:make_model", out_dir, "--input-shape", f"1,{FRAMES},{N_MFCC}")
    qmodel, reference = common.load(path), quantize_dynamic(model)
    # the largest absolute row sum of the Linear head: how far a change in the GRU's state can move a logit
    figures = {"head_row_sum": largest_row_sum(model.classifier)}
    # Any batch size and clip length: the batch and the number of frames are free in the file.
    for batch, frames in ((1, FRAMES), (32, FRAMES), (8, 31)):
        x, labels = clips(batch, frames, seed=1000 + batch)
        got = qmodel.run(x.numpy())
        with torch.no_grad():
            want = reference(x).numpy()
        figures[(batch, frames)] = {
            "max_abs_diff": max_abs_diff(got, want),
            "same_keyword": float((got.argmax(1) == want.argmax(1)).mean()),
            "accuracy": float((got.argmax(1) == labels.numpy()).mean()),
        }
    if not quiet:
        lines = [f"{qmodel}"]
        for (batch, frames), f in list(figures.items())[1:]:
            lines.append(
                f"batch {batch}, {frames} frames: same keyword as PyTorch for {f['same_keyword']:.0%} of clips, "
                f"accuracy {f['accuracy']:.0%}, max |log-prob diff| {f['max_abs_diff']:.2g}"
            )
        one = clips(1, FRAMES, seed=7)[0]
        lines.append(latency(f"one clip of {FRAMES} frames", lambda: qmodel.run(one.numpy()), lambda: reference(one)))
        report("keyword spotting GRU (dynamic int8)", lines)
    return figures


if __name__ == "__main__":
    common.main(run_example)

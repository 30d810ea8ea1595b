"""Streaming inference: an LSTMCell stepped once per audio frame, its (h, c) state carried by the caller.

    PYTHONPATH=. .venv/bin/python examples/streaming_lstm.py

forward(frame, (h, c)) returns (scores, (h, c)), nested as PyTorch returns it: the converter maps the
tuple state to the flat inputs `state.0`, `state.1` and qrt's Model.run takes and returns the same
nesting. The loop below runs 200 frames through qrt and through PyTorch's quantize_dynamic model,
then once more through `Model.stream()`, which keeps (h, c) inside qrt between steps (no state
passes through Python) and gives the same bits as carrying it by hand.
"""

from __future__ import annotations

import common
import numpy as np
import torch
from common import convert, largest_row_sum, latency, max_abs_diff, quantize_dynamic, report, to_numpy
from torch import nn

N_IN, HIDDEN, N_OUT = 40, 96, 8


class StreamingLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(N_IN, HIDDEN)
        self.head = nn.Linear(HIDDEN, N_OUT)

    def forward(
        self, frame: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = self.cell(frame, state)
        return self.head(h), (h, c)


def make_model() -> StreamingLSTM:
    """The converter's factory: `--model streaming_lstm:make_model`."""
    return StreamingLSTM()


def run_example(out_dir: str, quiet: bool = False, frames: int = 200, batch: int = 3) -> dict:

    torch.manual_seed(0)
    model = make_model().eval()
    path = convert(
        model, "streaming_lstm:make_model", out_dir, "--input-shape", f"1,{N_IN}",
        "--input-shape", f"(1,{HIDDEN}),(1,{HIDDEN})",
    )
    qmodel, reference = common.load(path), quantize_dynamic(model)
    x = torch.randn(frames, batch, N_IN, generator=torch.Generator().manual_seed(1))
    zeros = torch.zeros(batch, HIDDEN)
    state_qrt = (zeros.numpy(), zeros.numpy())
    state_torch = (zeros, zeros)
    step_diff, drift, scores_qrt = 0.0, 0.0, []
    for t in range(frames):
        # one step from torch's own state: the step error alone
        got = qmodel.run((x[t].numpy(), to_numpy(state_torch)))
        with torch.no_grad():
            want = reference(x[t], state_torch)
        step_diff = max(step_diff, max_abs_diff(got, to_numpy(want)))
        # free running: each side carries its own state
        scores, state_qrt = qmodel.run((x[t].numpy(), state_qrt))
        scores_qrt.append(scores)
        state_torch = want[1]
        drift = max(drift, max_abs_diff(scores, want[0].numpy()))
    # the same frames through a stream, the state kept inside from zeros: the same bits
    stream = qmodel.stream()
    stream_same = all(np.array_equal(stream.step(x[t].numpy())[0], scores_qrt[t]) for t in range(frames))
    if not quiet:
        one = (x[0, :1].numpy(), (zeros[:1].numpy(), zeros[:1].numpy()))
        stream.reset()
        frame = x[0, :1].numpy()
        report("streaming LSTMCell (dynamic int8)", [
            f"{qmodel}",
            f"{frames} frames x batch {batch}: one step from PyTorch's state within {step_diff:.2g}; "
            f"free-running scores within {drift:.2g} of PyTorch's",
            f"Model.stream(), the state kept inside: the same scores bit for bit: {stream_same}",
            latency("one step, batch 1", lambda: qmodel.run(one), lambda: reference(x[0, :1], (zeros[:1], zeros[:1]))),
            latency("one stream step, batch 1", lambda: stream.step(frame),
                    lambda: reference(x[0, :1], (zeros[:1], zeros[:1]))),
        ])
    head_row_sum = largest_row_sum(model.head)
    return {"step_max_abs_diff": step_diff, "drift_max_abs_diff": drift, "head_row_sum": head_row_sum,
            "stream_same_bits": stream_same}


if __name__ == "__main__":
    common.main(run_example)

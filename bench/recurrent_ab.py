"""qrt's dynamic LSTM and GRU sequences and the sigmoid op in two builds of qrt (say, before and after a change to the
gates' functions) at 1 thread: each build runs in its own process, the builds alternating round by round so that both
see the same machine load; within a process the samples of every case interleave.

    python bench/recurrent_ab.py --build before=/tmp/qrt-before --build after=. --rounds 3

A sequence case is one `lstm_dynamic` or `gru_dynamic` node of 100 steps, input 128, hidden 256, int8 weights
(torch's quantize_dynamic of a seeded layer), batch 1 and 32, through Model.run; the sigmoid cases run the op on 4096
and 1M floats. A build is a checkout with its extension built in place (make build). Figures: medians over the
rounds of each round's median time per call, in microseconds.
"""

from __future__ import annotations

import os
import sys
import tempfile

from harness import ab_table

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, INPUT, HIDDEN = 100, 128, 256
SEQUENCES = [(kind, batch) for kind in ("lstm", "gru") for batch in (1, 32)]
SIGMOID = [4096, 1 << 20]


def cases() -> list[str]:
    return [f"{kind} batch {batch}" for kind, batch in SEQUENCES] + [f"sigmoid of {n} floats" for n in SIGMOID]


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import numpy as np
    import torch
    from harness import time_cases
    from qrt_testing import dynamic_weight

    import qrt
    from qrt.builder import GraphBuilder
    from qrt.ops import layer_prefix

    tmp, rng, fns = tempfile.mkdtemp(), np.random.default_rng(0), []
    for kind, batch in SEQUENCES:
        torch.manual_seed(0)
        layer = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(getattr(torch.nn, kind.upper())(
            INPUT, HIDDEN)), {torch.nn.LSTM, torch.nn.GRU}, dtype=torch.qint8)[0]
        wb, g = layer._weight_bias(), GraphBuilder()
        ports = {"x": g.input("x", "float32", [STEPS, None, INPUT])}
        for side in ("ih", "hh"):
            prefix = layer_prefix(0, False) + f"{side}_"
            ports.update(dynamic_weight(wb["weight"][f"weight_{side}_l0"], wb["bias"][f"bias_{side}_l0"], prefix))
        g.output(*g.node(f"{kind}_dynamic", ports, name="seq"))
        g.save(os.path.join(tmp, f"{kind}{batch}.qrt"))
        model = qrt.load(os.path.join(tmp, f"{kind}{batch}.qrt"))
        x = rng.standard_normal((STEPS, batch, INPUT)).astype(np.float32)
        fns.append(lambda model=model, x=x: model.run(x))
    g = GraphBuilder()
    g.output(g.node("sigmoid", {"x": g.input("x", "float32", [None])}))
    g.save(os.path.join(tmp, "sigmoid.qrt"))
    sigmoid = qrt.load(os.path.join(tmp, "sigmoid.qrt"))
    for n in SIGMOID:
        x = (rng.standard_normal(n) * 10).astype(np.float32)
        fns.append(lambda x=x: sigmoid.run(x))
    return time_cases(cases(), fns, threads, repeats=7)


def main() -> None:
    ab_table(__file__, __doc__, one_round, cases(), "case (us per call)")


if __name__ == "__main__":
    main()

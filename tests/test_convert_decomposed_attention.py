"""scaled_dot_product_attention in a .pt2 program decomposed with run_decompositions()
(tools/decomposed_attention.py): read back as the one attention op it was, so the decomposed file runs with the
bits of the program as exported. The forms: no mask, a bool mask (the decomposition adds where(mask, 0, -inf)),
a float mask with an explicit scale, is_causal (a mask the decomposition builds), rows whose every key is masked
(0, as torch gives), batch and length free; and heads grouped (enable_gqa, which qrt's attention op does not
take, so the program as exported is refused), whose decomposition repeats k and v to q's heads first: read back
over those. Against torch's own module: within 1e-6 (a few ulps of outputs of order 1; qrt's attention gives
torch's AVX-512 kernel's bits, torch's AVX2 kernel sums in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qrt
from tools.convert import convert


class Attend(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.kind == "plain":
            return F.scaled_dot_product_attention(q, k, v)
        if self.kind == "bool":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        if self.kind == "float":
            bias = torch.where(keep, 0.0, float("-inf"))[:, None, None, :] + 0.25
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True)  # "grouped"


def _inputs(rng: np.random.Generator, batch: int, length: int) -> list[np.ndarray]:
    q, k, v = (rng.standard_normal((batch, 4, length, 8)).astype(np.float32) for _ in range(3))
    keep = np.ones((batch, length), bool)
    keep[0, length // 2:] = False
    if batch > 1:
        keep[1] = False  # every key of the second sequence masked: its rows are 0
    return [q, k, v, keep]


@pytest.mark.parametrize("kind", ["plain", "bool", "float", "causal", "grouped"])
def test_decomposed_attention(tmp_path, kind):
    rng = np.random.default_rng(47)
    example = [torch.from_numpy(a) for a in _inputs(rng, 2, 6)]
    free = {0: torch.export.Dim("batch"), 2: torch.export.Dim("length")}
    ep = torch.export.export(Attend(kind), tuple(example),
                             dynamic_shapes=(free, free, free, {0: free[0], 1: free[2]}))
    grouped = kind == "grouped"  # qrt's attention op takes no grouped heads: the program as exported is refused
    if not grouped:
        torch.export.save(ep, tmp_path / "a.pt2")
        convert(tmp_path / "a.pt2", tmp_path / "a.qrt")
        exported = qrt.load(tmp_path / "a.qrt")
    torch.export.save(ep.run_decompositions(), tmp_path / "d.pt2")
    convert(tmp_path / "d.pt2", tmp_path / "d.qrt")
    decomposed = qrt.load(tmp_path / "d.qrt")
    ops = [n.op for n in decomposed.graph.nodes]
    assert ops.count("attention") == 1 and "matmul" not in ops and "softmax" not in ops
    for batch, length in ((1, 5), (3, 9)):
        feeds = _inputs(rng, batch, length)
        got = decomposed.run(feeds)
        if not grouped:
            np.testing.assert_array_equal(got, exported.run(feeds))
        with torch.no_grad():
            want = Attend(kind)(*map(torch.from_numpy, feeds)).numpy()
        assert np.abs(got - want).max() <= 1e-6, (batch, length)

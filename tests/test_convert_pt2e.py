"""pt2e programs (torchao's X86 and Arm Inductor quantizers, static and dynamic) saved as .pt2,
converted, and run by qrt against the exported program's own output (docs/NUMERICS.md, "pt2e").

The program is the reference: it computes in float32 on dequantized values. qrt computes the same
quantized values' products in integers (exactly) or, for a static Linear whose output stays float, in
float32 over the same dequantized values. So a Linear's outputs differ only by the order and the
roundings of float sums: ``2 * reorder_bound`` (tests/reference.py: two float32 evaluations of the
same sum of products differ by at most 2 gamma_{K+1} sum |x_k w_k|; doubled for the roundings of
the dequantized factors on the program's side and of the accumulator and scale on qrt's). That is
the tolerance of every check here, applied to the last Linear's inputs as the program computes
them. It holds only if everything before agrees exactly: the static requantizations (qrt's fused
integer requantization and the program's float product + quantize can differ only when a product
lies within float32 rounding of a half step) and the dynamic activation qparams (qrt's
ChooseQuantizationParams and pt2e's choose_qparams); the tests check that they do on these inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from reference import reorder_bound
from torch import nn
from torch.export import Dim
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.arm_inductor_quantizer import (
    ArmInductorQuantizer,
    get_default_arm_inductor_quantization_config,
)
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

import qrt
from tools.convert import ConvertError, convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", module=r"torch\.ao")

QUANTIZERS = {
    "x86": (X86InductorQuantizer, get_default_x86_inductor_quantization_config),
    "arm": (ArmInductorQuantizer, get_default_arm_inductor_quantization_config),
}


class MLP(nn.Module):
    """Odd sizes; fc1's ReLU a module, fc2's a function (both fused in static programs: their outputs are
    quantized), fc3 without one (its output stays float)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(37, 51), nn.Linear(51, 23), nn.Linear(23, 7)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(self.relu(self.fc1(x)))))


def _program(tmp_path, quantizer: str, dynamic: bool, net: nn.Module | None = None, **config) -> tuple:
    """net quantized with pt2e, exported with a free batch and saved: (program, .pt2 path)."""
    torch.manual_seed(0)
    net = (net or MLP()).eval()
    example = (torch.randn(4, 37) * 2,)
    batch = ({0: Dim.AUTO},)
    graph = torch.export.export(net, example, dynamic_shapes=batch).module()
    cls, make_config = QUANTIZERS[quantizer]
    q = cls()
    q.set_global(make_config(is_dynamic=dynamic, **config))
    prepared = prepare_pt2e(graph, q)
    for _ in range(4):
        prepared(torch.randn(16, 37) * 2)
    program = torch.export.export(convert_pt2e(prepared), example, dynamic_shapes=batch)
    path = tmp_path / f"{quantizer}.pt2"
    torch.export.save(program, path)
    return program, path


def _last_linear_inputs(program, x: torch.Tensor) -> tuple[np.ndarray, ...]:
    """The program's dequantized input, weight and bias of its last aten.linear, as it computes them."""
    gm = program.module()
    last = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default][-1]
    seen = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n is last:
                seen["args"] = [self.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args]
            return out

    with torch.no_grad():
        Recorder(gm).run(x)
    return tuple(a.detach().numpy() for a in seen["args"])


@pytest.mark.parametrize("quantizer", ["x86", "arm"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_pt2e_mlp_matches_the_program(tmp_path, quantizer, dynamic):
    program, path = _program(tmp_path, quantizer, dynamic)
    result = convert(path, tmp_path / "m.qrt")
    assert result.frontend == "export" and result.mode == "prequantized"
    assert result.shapes == {"x": "float32[?, 37]"}  # the program's dynamic batch stays free
    model = qrt.load(tmp_path / "m.qrt")
    ops = [(n.op, n.attrs.get("relu", n.attrs.get("reduce_range"))) for n in model.graph.nodes]
    if dynamic:  # all 8 bits: pt2e's activations are not x86's 7-bit ones
        assert ops == [("linear_dynamic", False), ("relu", None)] * 2 + [("linear_dynamic", False)]
    else:  # the ReLUs fused into static Linears; fc3's output stays float as in the program
        assert [op for op, _ in ops] == ["quantize_per_tensor", "linear", "linear", "dequantize", "linear_float"]
        assert [relu for op, relu in ops if op == "linear"] == [True, True]
    rng = np.random.default_rng(5)
    for batch in (1, 6):
        x = (rng.standard_normal((batch, 37)) * 2).astype(np.float32)
        with torch.no_grad():
            want = program.module()(torch.from_numpy(x)).numpy()
        got = model.run(x)
        h, w, b = _last_linear_inputs(program, torch.from_numpy(x))
        bound = 2 * reorder_bound(h, w, b)
        assert np.all(np.abs(got - want) <= bound), (np.abs(got - want).max(), bound.min())
        print(f"{quantizer} {'dynamic' if dynamic else 'static'} batch {batch}: max |qrt - program| "
              f"{np.abs(got - want).max():.3g} (bound {bound.max():.3g})")


def test_pt2e_loads_in_a_fresh_process(tmp_path):
    """A pt2e program names quantized_decomposed ops: the converter registers them before loading it."""
    _, path = _program(tmp_path, "x86", False)
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "convert.py"), str(path), "-o", str(tmp_path / "m.qrt")],
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "default"},
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "front end: torch.export (a torch.export program)" in run.stderr
    assert "deprecat" not in run.stderr.lower(), run.stderr
    assert "(prequantized, engine x86; inputs x float32[?, 37]" in run.stdout


def test_pt2e_7bit_activations_are_refused_by_name(tmp_path):
    """reduce_range gives activations [0, 127]: a scheme qrt's quantize (0..255) does not reproduce."""
    _, path = _program(tmp_path, "x86", False, reduce_range=True)
    with pytest.raises(ConvertError, match=r"quantizes activations to torch.uint8 \[0, 127\]"):
        convert(path, tmp_path / "m.qrt")
    assert not (tmp_path / "m.qrt").exists()

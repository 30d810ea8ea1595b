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
from qrt import format as qformat
from qrt.builder import GraphBuilder
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


def _program(tmp_path, quantizer: str, dynamic: bool, net: nn.Module | None = None, shift: float = 0.0,
             **config) -> tuple:
    """net quantized with pt2e (calibrated on inputs + shift), exported with a free batch and saved: (program,
    .pt2 path)."""
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
        prepared(torch.randn(16, 37) * 2 + shift)
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


def _program_quantized_input(program, x: torch.Tensor) -> np.ndarray:
    """The program's quantize_per_tensor of its input (int8 as uint8 with + 128: qrt's form)."""
    gm = program.module()
    first = next(n for n in gm.graph.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                 and n.args[0].op == "placeholder")
    seen = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n is first:
                seen["q"] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(x)
    q = seen["q"]
    return (q.numpy().astype(np.int32) + (128 if q.dtype == torch.int8 else 0)).astype(np.uint8)


@pytest.mark.parametrize("quantizer", ["x86", "arm"])
def test_pt2e_static_input_quantize_is_the_programs_at_ties(tmp_path, quantizer):
    """The program's quantize is clamp(round(x * (1 / s)) + zp): it rounds, then adds the zero point, as qrt's
    qnnpack rule does (x86 torch's fma rule rounds x / s + zp at once: at a tie with an odd zero point, one step
    apart). Inputs exactly on ties, x * fl(1 / s) = k + 1/2: every quantized input is the program's."""
    program, path = _program(tmp_path, quantizer, False, shift=0.05)  # calibrated to an odd zero point
    convert(path, tmp_path / "m.qrt")
    qfile = qformat.load_file(tmp_path / "m.qrt")
    node = qfile.graph.nodes[0]
    assert node.op == "quantize_per_tensor" and node.attrs["engine"] == "qnnpack"
    assert qfile.tensors[node.inputs["zero_point"]] % 2 == 1  # else both rules agree at every tie
    s = np.float32(qfile.tensors[node.inputs["scale"]])
    k = np.arange(-300, 300)
    x = ((k + 0.5) * np.float64(s)).astype(np.float32)
    x = x[x * (np.float32(1) / s) == (k + 0.5).astype(np.float32)]  # exactly on a tie in float32
    assert x.size > 100
    b = GraphBuilder()
    ports = {p: qfile.tensors[v] if v in qfile.tensors else b.input("x", "float32", [None, 37])
             for p, v in node.inputs.items()}
    b.output(b.node("quantize_per_tensor", ports, node.attrs))
    b.save(tmp_path / "q.qrt")
    x = np.resize(x, (7, 37))
    want = _program_quantized_input(program, torch.from_numpy(x))
    np.testing.assert_array_equal(qrt.load(tmp_path / "q.qrt").run(x), want)
    b.nodes[-1]["attrs"].pop("engine")  # x86 torch's rule, fma(x, 1 / s, zp) rounded: one step off at most ties
    b.save(tmp_path / "x86.qrt")
    off = np.count_nonzero(qrt.load(tmp_path / "x86.qrt").run(x) != want)
    assert off > x.size // 4, off


@pytest.mark.parametrize("engine, match", [
    ("qnnpack", r"--engine qnnpack is for models torch.ao quantized under qnnpack: a pt2e program"),
    (None, None),  # the process's engine does not apply to a program either
])
def test_pt2e_program_takes_no_engine(tmp_path, engine, match):
    _, path = _program(tmp_path, "arm", False)
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        if match:
            with pytest.raises(ConvertError, match=match):
                convert(path, tmp_path / "m.qrt", engine=engine)
            return
        result = convert(path, tmp_path / "m.qrt", engine=engine)
    finally:
        torch.backends.quantized.engine = old
    assert result.metadata["converter.engine"] == "x86"
    assert [n.attrs.get("engine", "x86") for n in qrt.load(tmp_path / "m.qrt").graph.nodes if n.op == "linear"] == \
        ["x86", "x86"]


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

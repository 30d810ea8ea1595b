"""qrt's rules as a pt2e Quantizer (tools/qrt_quantizer.py): a float model quantized by torchao's
prepare_pt2e / convert_pt2e (the converter's default) writes the same file, byte for byte, as torch.ao's
prepare_fx / convert_fx (--quantizer fx) under the same rules and calibration (same integers, scales,
zero points, nodes and names).

The other converter tests run the pt2e path (the default) against torch's own quantized modules; these
cases are a representative subset of their float models run through both, one per pattern and scheme:
dynamic per-tensor / per-channel / float16 weights, static x86 and qnnpack calibration, ReLU fused or
not (nn.ReLU module, F.relu, torch.relu), rules without fusion and with per-module schemes (a layer kept
in float, fused with its ReLU), Sequential paths, recurrent cells returning one tensor and a tuple, an
LSTM sequence. The rest of test_convert_export.py's SAME_FILE (TokenEncoder, Tables, the RNN cells, the
GRU classifier) writes the same files too (checked when this was written), left out to keep the suite
within CI's time.
"""

from __future__ import annotations

import os

import models
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from qrt_testing import convert_both_ways
from torch import nn

from tools import qrt_backend
from tools.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def calib_npz(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("calib") / "calib.npz")
    np.savez(path, x=np.random.default_rng(7).standard_normal((150, 37)).astype(np.float32) * 2)
    return path


def _rules(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("import dataclasses\nfrom tools.rules import DEFAULT_RULES\n"
                    f"RULES = dataclasses.replace(DEFAULT_RULES, name={name!r}, {body})\n")
    return str(path)


def _both(tmp_path, factory: str, shapes: list[str], **kwargs) -> tuple[bytes, bytes]:
    """The files the FX and the pt2e flows write for one checkpoint."""
    return convert_both_ways(tmp_path, factory, shapes, "quantizer", ('fx', 'pt2e'), **kwargs)


class FunctionalReLU(nn.Module):
    """F.relu after a Linear (fused, as torch.ao fuses it), and one reading two Linears' sum (not fused)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(9, 16), nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        return F.relu(self.fc2(h) + self.fc3(h))


DYNAMIC = [
    ("models:make_mlp", ["1,37"], {}),
    ("models:make_mlp", ["1,37"], {"weights": "per-channel"}),
    ("models:make_mlp", ["1,37"], {"weight_dtype": "float16"}),
    ("test_convert_models:TabularMLP", ["3,20"], {}),
    ("test_convert_quantizer:FunctionalReLU", ["3,9"], {}),
    ("models:make_step_gru", ["2,10", "2,20"], {}),
    ("models:make_step_lstm", ["2,10", "2,20", "2,20"], {}),
    ("models:make_lstm_classifier", ["2,7,12"], {}),
]


@pytest.mark.parametrize("factory, shapes, kwargs", DYNAMIC, ids=lambda v: v if isinstance(v, str) else None)
def test_dynamic_same_file(tmp_path, factory, shapes, kwargs):
    fx, pt2e = _both(tmp_path, factory, shapes, **kwargs)
    assert fx == pt2e


@pytest.mark.parametrize("weights, engine", [("per-tensor", "x86"), ("per-channel", "x86"), ("per-tensor", "qnnpack")])
def test_static_same_file(tmp_path, calib_npz, weights, engine):
    """Calibrated on the same batches (40 a batch, the last one shorter): the histogram observers
    choose the same scales and zero points, over 7 bits for x86, 8 for qnnpack."""
    fx, pt2e = _both(tmp_path, "models:make_mlp", ["1,37"], mode="static", calib=calib_npz, weights=weights,
                     calib_batch_size=40, engine=engine)
    assert fx == pt2e


def test_static_functional_relu_same_file(tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(1).standard_normal((50, 9)).astype(np.float32))
    fx, pt2e = _both(tmp_path, "test_convert_quantizer:FunctionalReLU", ["1,9"], mode="static", calib=calib)
    assert fx == pt2e


def test_rules_same_file(tmp_path, calib_npz):
    """Rules without the Linear+ReLU pattern (static: ReLU in float between dequantize and quantize), and
    per-module schemes (float16, per-channel, a layer kept in float)."""
    no_fusion = _rules(tmp_path, "no-fusion",
                       "patterns=tuple(p for p in DEFAULT_RULES.patterns if p.name != 'linear_relu')")
    fx, pt2e = _both(tmp_path, "models:make_mlp", ["1,37"], mode="static", calib=calib_npz, rules=no_fusion)
    assert fx == pt2e
    mixed = _rules(tmp_path, "mixed", "module_schemes={'fc1': 'float', 'fc2': 'per-channel', 'fc3': 'float16'}")
    fx, pt2e = _both(tmp_path, "models:make_mlp", ["1,37"], rules=mixed)
    assert fx == pt2e


def test_pt2e_does_not_use_the_fx_flow(tmp_path, monkeypatch):
    """The pt2e path quantizes without torch.ao's FX flow (prepare_fx / convert_fx)."""

    def refused(*args, **kwargs):
        raise AssertionError("torch.ao's FX flow was called")

    for name in ("prepare", "calibrate", "to_reference"):
        monkeypatch.setattr(qrt_backend, name, refused)
    torch.save(models.make_mlp().state_dict(), tmp_path / "m.pt")
    result = convert(tmp_path / "m.pt", tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,37"],
                     quantizer="pt2e")
    assert result.quantizer == "pt2e" and result.mode == "dynamic"


def test_pt2e_without_torchao_names_the_way_out(tmp_path, monkeypatch):
    import sys

    from tools.convert import ConvertError

    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    torch.save(models.make_mlp().state_dict(), tmp_path / "m.pt")
    with pytest.raises(ConvertError, match=r"needs torchao .*--quantizer fx"):
        convert(tmp_path / "m.pt", tmp_path / "m.qrt", model="models:make_mlp", input_shapes=["1,37"])
    assert not (tmp_path / "m.qrt").exists()

"""Write qrt's golden reference outputs: tests/golden/<case>.qrt and <case>.npz.

Run through `make golden` (QRT_KERNELS=portable, after `make build`). The outputs come from the
"portable" kernel variant (plain C, qrt/kernels/variant_portable.c), which every build holds: the
script switches to it in-process before loading any model (K._use_variant) and checks it is
active. Every kernel variant on every CPU must then reproduce the stored outputs bit for bit
(tests/test_golden.py runs all the variants the CPU can run). Read tests/golden/README.md before
regenerating anything.

Torch-free on purpose: the models are built by hand with GraphBuilder from seeded numpy
random numbers, so the set can be regenerated (and checked) where torch does not run.

Each case is one .qrt model and one .npz holding one or more runs: `r<i>.in.<input>` and
`r<i>.out.<output>` raw arrays, plus `meta`, a JSON string naming what produced them.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import sys
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from qrt.ops import OPS

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32


@dataclass
class Case:
    """A model under construction and the input sets it will be run on."""

    g: GraphBuilder = field(default_factory=GraphBuilder)
    runs: list[dict[str, np.ndarray]] = field(default_factory=list)
    # checks that the inputs exercise what the case claims (saturation, clamping): fn(outputs) -> bool
    claims: list[tuple[str, Callable[[list[dict[str, np.ndarray]]], bool]]] = field(default_factory=list)


# ---------------------------------------------------------------- value generators


def wide(rng: np.random.Generator, shape: tuple, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    """Signed values whose magnitudes spread over 10**lo .. 10**hi within one tensor."""
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(lo, hi, shape)).astype(F32)


def normal(rng: np.random.Generator, shape: tuple, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std + mean).astype(F32)


def float_specials() -> np.ndarray:
    """Values every float -> quantized conversion must place right: zeros, denormals, extremes, infinities."""
    tiny = np.finfo(F32).tiny
    big = np.finfo(F32).max
    return np.array(
        [0.0, -0.0, 1e-45, -1e-45, tiny, -tiny, 1e-20, -1e-20, 1e10, -1e10, big, -big, np.inf, -np.inf], F32
    )


def near_ties(scale: float, zp: int, ks: np.ndarray) -> np.ndarray:
    """x whose x / scale + zp lies on or next to a .5 tie (rounding to even vs away matters)."""
    mid = ((ks + 0.5 - zp) * np.float64(scale)).astype(F32)
    return np.concatenate([mid, np.nextafter(mid, F32(np.inf)), np.nextafter(mid, F32(-np.inf))])


def int8_weight(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """int8 [n, k] over the whole range, with a row of -128 and a row of 127 (int16 pair-sum overflow)."""
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w[0] = -128
    w[-1] = 127
    return w


def dynamic_set(
    rng: np.random.Generator,
    n: int,
    k: int,
    kind: str,
    scale: float = 0.01,
    bias: bool = True,
    zp: bool = False,
    prefix: str = "",
) -> dict[str, np.ndarray]:
    """A dynamic weight set: kind 'tensor' / 'channel' (int8 per tensor / per channel) or 'f16'."""
    out: dict[str, np.ndarray] = {}
    if kind == "f16":
        out["weight"] = (rng.standard_normal((n, k)) * scale * 60).astype(np.float16)
    else:
        out["weight"] = int8_weight(rng, n, k)
        if kind == "tensor":
            out["weight_scale"] = np.asarray(scale, F32)
            out["weight_zero_point"] = np.asarray(rng.integers(-9, 10) if zp else 0, np.int32)
        else:
            out["weight_scale"] = (scale * 10.0 ** rng.uniform(-1, 1, n)).astype(F32)
            out["weight_zero_point"] = (rng.integers(-9, 10, n) if zp else np.zeros(n)).astype(np.int32)
    if bias:
        out["bias"] = wide(rng, (n,), -2, 0.5)
    return {prefix + p: v for p, v in out.items()}


def recurrent_sets(
    rng: np.random.Generator, gates: int, n_in: int, hidden: int, kind: str, prefix: str = "", scale: float = 0.02
) -> dict[str, np.ndarray]:
    """ih and hh weight sets of one layer direction."""
    return {
        **dynamic_set(rng, gates * hidden, n_in, kind, scale, prefix=prefix + "ih_", zp=kind == "channel"),
        **dynamic_set(rng, gates * hidden, hidden, kind, scale, prefix=prefix + "hh_"),
    }


def state_runs(rng: np.random.Generator, batches: tuple[int, ...], shapes: dict[str, tuple]) -> list[dict]:
    """Input sets for recurrent ops, one per batch size: gates near 0 (small values) to saturated (large).

    shapes maps input name -> shape with 'B' for the batch; each run scales everything by its own
    magnitude so one run keeps the gates near 0 and another drives them into saturation.
    """
    runs = []
    for b, mag in zip(batches, (0.05, 3.0, 40.0, 1.0)):
        runs.append(
            {
                name: (wide(rng, tuple(b if d == "B" else d for d in shape), -1, 0.7) * mag).astype(F32)
                for name, shape in shapes.items()
            }
        )
    return runs


# ---------------------------------------------------------------- cases


def case_quantize_per_tensor(rng: np.random.Generator) -> Case:
    c = Case()
    x = c.g.input("x", "float32", [None, 37])
    params = {"quint8": (0.0371, 113), "qint8": (0.0093, -7), "qint32": (1e-3, 12345)}
    outs = []
    for dtype, (s, z) in params.items():
        outs.append(
            c.g.node(
                "quantize_per_tensor",
                {"x": x, "scale": np.asarray(s, F32), "zero_point": np.asarray(z, np.int32)},
                {"dtype": dtype},
                name=f"q_{dtype}",
            )
        )
    c.g.output(*outs)
    ties = np.concatenate([near_ties(s, z, np.arange(-140, 140, 7)) for s, z in params.values()])
    pool = np.concatenate([float_specials(), ties, wide(rng, (300,), -4, 8)])  # 1e8 saturates qint32 too
    pool = np.concatenate([pool, np.zeros(-len(pool) % 37, F32)])
    c.runs.append({"x": pool.reshape(-1, 37)})
    c.runs.append({"x": wide(rng, (1, 37), -2, 1)})
    c.claims.append(("u8 clamps both ends", lambda o: {0, 255} <= set(o[0]["q_quint8"].ravel().tolist())))
    c.claims.append(("i8 clamps both ends", lambda o: {-128, 127} <= set(o[0]["q_qint8"].ravel().tolist())))
    c.claims.append(
        ("i32 clamps both ends", lambda o: {-(2**31), 2**31 - 1} <= set(o[0]["q_qint32"].ravel().tolist()))
    )
    return c


def case_quantize_per_channel(rng: np.random.Generator) -> Case:
    c = Case()
    x = c.g.input("x", "float32", [None, 13, 7])
    specs = [("quint8", 1, 13, (0, 255)), ("qint8", 2, 7, (-128, 127)), ("qint32", 1, 13, (-50000, 50000))]
    outs = []
    for dtype, axis, ch, (zlo, zhi) in specs:
        scale = (10.0 ** rng.uniform(-3.5, -0.5, ch)).astype(F32)
        if dtype == "qint32":
            scale = (10.0 ** rng.uniform(-6, -4, ch)).astype(F32)
        zp = rng.integers(zlo, zhi + 1, ch).astype(np.int32)
        zp[0], zp[-1] = zlo, zhi  # zero points at the range's ends
        outs.append(
            c.g.node(
                "quantize_per_channel",
                {"x": x, "scale": scale, "zero_point": zp},
                {"dtype": dtype, "axis": axis},
                name=f"qc_{dtype}_axis{axis}",
            )
        )
    c.g.output(*outs)
    base = wide(rng, (5, 13, 7), -4, 5.5)
    base[0].flat[: len(float_specials())] = float_specials()
    c.runs.append({"x": base})
    c.runs.append({"x": normal(rng, (1, 13, 7), 0.5)})
    return c


def case_dequantize(rng: np.random.Generator) -> Case:
    c = Case()
    i32 = np.iinfo(np.int32)
    per_tensor = [("q_u8", "uint8", 0.0371, 113), ("q_i8", "int8", 0.0093, -7), ("q_i32", "int32", 3.1e-5, -123457)]
    outs = []
    for name, dtype, s, z in per_tensor:
        x = c.g.input(name, dtype, [None, 11])
        node = {"x": x, "scale": np.asarray(s, F32), "zero_point": np.asarray(z, np.int32)}
        outs.append(c.g.node("dequantize", node, name=f"dq_{name}"))
    # per channel: scales over five decades; int32 zero points at the ends of the range (q - zp exact)
    per_channel = [
        ("qc_u8", "uint8", [None, 6, 5], 1, rng.integers(0, 256, 6)),
        ("qc_i8", "int8", [None, 6, 5], 2, rng.integers(-128, 128, 5)),
        ("qc_i32", "int32", [3, 6, 5], 0, np.array([i32.min + 5, 0, i32.max - 100])),
    ]
    for name, dtype, shape, axis, zp in per_channel:
        x = c.g.input(name, dtype, shape)
        scale = (10.0 ** rng.uniform(-4, 1, len(zp))).astype(F32)
        node = {"x": x, "scale": scale, "zero_point": zp.astype(np.int32)}
        outs.append(c.g.node("dequantize", node, {"axis": axis}, name=f"dqc_{name}"))
    c.g.output(*outs)
    for b in (4, 1):
        run = {
            "q_u8": rng.integers(0, 256, (b, 11), dtype=np.uint8),
            "q_i8": rng.integers(-128, 128, (b, 11), dtype=np.int8),
            "q_i32": rng.integers(i32.min, i32.max, (b, 11), dtype=np.int64).astype(np.int32),
            "qc_u8": rng.integers(0, 256, (b, 6, 5), dtype=np.uint8),
            "qc_i8": rng.integers(-128, 128, (b, 6, 5), dtype=np.int8),
            "qc_i32": rng.integers(i32.min, i32.max, (3, 6, 5), dtype=np.int64).astype(np.int32),
        }
        # the ends of each range; per tensor, int32 q - zp wraps as torch's does
        run["q_u8"].flat[:2], run["q_i8"].flat[:2] = [0, 255], [-128, 127]
        run["q_i32"].flat[:4] = [i32.min, i32.max, 0, -123457]
        run["qc_i32"].flat[:3] = [i32.min, i32.max, 0]
        c.runs.append(run)
    return c


def static_node(
    c: Case,
    rng: np.random.Generator,
    x: str,
    n: int,
    k: int,
    name: str,
    per_channel: bool,
    x_qp: tuple[float, int],
    y_qp: tuple[float, int],
    relu: bool,
    bias: bool = True,
    w_zp: bool = False,
    w_scale: float = 0.005,
    engine: str | None = None,
) -> str:
    """One static linear node: quint8 x, int8 weights over the whole range; engine set if given."""
    if per_channel:
        ws = (w_scale * 10.0 ** rng.uniform(-0.7, 0.7, n)).astype(F32)
        wz = (rng.integers(-20, 21, n) if w_zp else np.zeros(n)).astype(np.int32)
    else:
        ws, wz = np.asarray(w_scale, F32), np.asarray(rng.integers(-20, 21) if w_zp else 0, np.int32)
    ports = {
        "x": x,
        "x_scale": np.asarray(x_qp[0], F32),
        "x_zero_point": np.asarray(x_qp[1], np.int32),
        "weight": int8_weight(rng, n, k),
        "weight_scale": ws,
        "weight_zero_point": wz,
        "bias": wide(rng, (n,), -1, 1.5) if bias else None,
        "y_scale": np.asarray(y_qp[0], F32),
        "y_zero_point": np.asarray(y_qp[1], np.int32),
    }
    return c.g.node("linear", ports, {"relu": relu, **({"engine": engine} if engine else {})}, name=name)


def full_range_u8(rng: np.random.Generator, shape: tuple) -> list[np.ndarray]:
    """quint8 inputs over 0..255: random, all 255 (int16 pair sums overflow), alternating 0 / 255."""
    alt = np.zeros(shape, np.uint8)
    alt[..., ::2] = 255
    return [rng.integers(0, 256, shape, dtype=np.uint8), np.full(shape, 255, np.uint8), alt]


def case_linear_static(rng: np.random.Generator) -> Case:
    c = Case()
    x = c.g.input("x", "uint8", [None, 67])
    outs = [
        static_node(c, rng, x, 29, 67, "pt", False, (0.02, 0), (0.5, 120), relu=False),
        static_node(c, rng, x, 29, 67, "pc_relu", True, (0.02, 128), (0.1, 40), relu=True, w_zp=True),
        # tiny output scale: the requantized value saturates int16 before the zero point is added
        static_node(c, rng, x, 19, 67, "pt_sat16", False, (0.05, 255), (0.002, 7), relu=False, bias=False),
        static_node(c, rng, x, 21, 67, "pc_relu_zp0", True, (0.01, 17), (0.05, 0), relu=True, bias=False),
        static_node(c, rng, x, 5, 67, "pt_relu_wzp", False, (0.03, 64), (0.4, 250), relu=True, w_zp=True),
    ]
    c.g.output(*outs)
    for b in (5, 1, 3):
        c.runs += [{"x": v} for v in full_range_u8(rng, (b, 67))]

    def clamps(o: list[dict[str, np.ndarray]]) -> bool:
        pt = np.concatenate([r["pt"].ravel() for r in o])
        relu = np.concatenate([r["pc_relu"].ravel() for r in o])
        return pt.min() == 0 and pt.max() == 255 and relu.min() == 40 and relu.max() == 255

    c.claims.append(("outputs clamp at 0, 255 and the ReLU zero point", clamps))
    return c


def case_mlp_static(rng: np.random.Generator) -> Case:
    """quantize -> Linear+ReLU -> Linear -> dequantize: a whole static model as the converter writes it."""
    c = Case()
    x = c.g.input("x", "float32", [None, 37])
    q = c.g.node("quantize_per_tensor", {"x": x, "scale": np.asarray(0.05, F32),
                                         "zero_point": np.asarray(128, np.int32)}, {"dtype": "quint8"}, name="q")
    h = static_node(c, rng, q, 41, 37, "fc1", True, (0.05, 128), (0.1, 0), relu=True)
    y = static_node(c, rng, h, 11, 41, "fc2", False, (0.1, 0), (0.2, 120), relu=False)
    out = c.g.node("dequantize", {"x": y, "scale": np.asarray(0.2, F32), "zero_point": np.asarray(120, np.int32)},
                   name="dq")
    c.g.output(out)
    c.runs = [{"x": normal(rng, (6, 37), 3.0)}, {"x": wide(rng, (1, 37), -2, 1.5)}]
    return c


def case_linear_dynamic_int8(rng: np.random.Generator) -> Case:
    c = Case()
    x = c.g.input("x", "float32", [None, 45])
    nodes = [  # name, out features, weights, reduce_range, bias, weight zero points
        ("pt_rr", 23, "tensor", True, True, False),
        ("pc_full", 31, "channel", False, False, False),
        ("pt_zp_full", 7, "tensor", False, True, True),
        ("pc_zp_rr", 33, "channel", True, True, True),
    ]
    outs = []
    for name, n, kind, rr, bias, zp in nodes:
        ports = {"x": x, **dynamic_set(rng, n, 45, kind, 0.004, bias=bias, zp=zp)}
        outs.append(c.g.node("linear_dynamic", ports, {"reduce_range": rr}, name=name))
    c.g.output(*outs)
    c.runs = [
        {"x": normal(rng, (5, 45))},
        {"x": wide(rng, (1, 45))},
        {"x": np.zeros((3, 45), F32)},  # zero range: the 0.1 fallback scale
        {"x": rng.uniform(1e-4, 5e-3, (2, 45)).astype(F32)},  # below the 6.1e-5 scale floor, min 0
        {"x": -rng.uniform(1e-4, 5e-3, (2, 45)).astype(F32)},  # ... max 0
        {"x": rng.uniform(-2e-3, 5e-3, (4, 45)).astype(F32)},  # ... both stretched
        {"x": wide(rng, (3, 45), -3, 30)},  # magnitudes to 1e30
        {"x": np.full((2, 45), 7.25, F32)},  # constant
        {"x": normal(rng, (3, 45), 1.0, 5.0)},  # all positive: zero point 0
        {"x": normal(rng, (3, 45), 1.0, -5.0)},  # all negative: zero point qmax
    ]
    return c


def case_linear_dynamic_per_row(rng: np.random.Generator) -> Case:
    """activation per_row_symmetric (torchao's Int8Tensor linear, a format version 7 file): one symmetric int8
    scale per row, floored at 2^-23; rows whose largest magnitude quantizes to +-127.5 (127 clamped, -128);
    the plan's fused ReLU over the three-rounding epilogue."""
    c = Case()
    x = c.g.input("x", "float32", [None, 45])
    attrs = {"reduce_range": False, "activation": "per_row_symmetric"}
    outs = []
    for name, n, kind, bias in (("pr_channel", 29, "channel", True), ("pr_tensor", 7, "tensor", False)):
        outs.append(c.g.node("linear_dynamic", {"x": x, **dynamic_set(rng, n, 45, kind, 0.004, bias=bias)},
                             attrs, name=name))
    outs[0] = c.g.node("relu", {"x": outs[0]}, name="pr_relu")
    c.g.output(*outs)
    ties = normal(rng, (2, 45))
    ties[0, 3], ties[1, 7] = 9.0, -9.0  # the row's largest magnitude: x * (1 / s) is +-127.5 or next to it
    c.runs = [
        {"x": normal(rng, (5, 45))},
        {"x": wide(rng, (1, 45))},
        {"x": np.zeros((3, 45), F32)},  # the 2^-23 floor
        {"x": wide(rng, (2, 45), -30, -20)},  # tiny rows: the floor again, every value quantizes to 0
        {"x": wide(rng, (3, 45), -3, 30)},  # magnitudes to 1e30
        {"x": ties},
    ]
    return c


def case_linear_dynamic_fp16(rng: np.random.Generator) -> Case:
    """float16 weights; K > 512 with N % 32 != 0 takes the restarted-chain tail (NUMERICS.md)."""
    c = Case()
    shapes = [("xa", 531, 37, True), ("xb", 700, 5, False), ("xc", 19, 70, True)]  # input, K, N, bias
    outs = []
    for name, k, n, bias in shapes:
        x = c.g.input(name, "float32", [None, k])
        ports = {"x": x, **dynamic_set(rng, n, k, "f16", 0.01, bias=bias)}
        w = ports["weight"]
        w[0, 0], w[1, 1], w[2, 2], w[3, 3] = 65504, -65504, 6e-8, -0.0  # extremes and a subnormal
        outs.append(c.g.node("linear_dynamic", ports, {"reduce_range": name != "xb"}, name=f"f16_{name}"))
    c.g.output(*outs)
    for b, lo, hi in ((2, -3, 3), (1, -3, 4)):
        c.runs.append({name: wide(rng, (b, k), lo, hi) for name, k, _, _ in shapes})
    return c


def case_linear_float(rng: np.random.Generator) -> Case:
    c = Case()
    xa = c.g.input("xa", "float32", [None, 129])
    xb = c.g.input("xb", "float32", [None, 520])
    a = c.g.node("linear_float", {"x": xa, "weight": normal(rng, (13, 129), 0.1), "bias": wide(rng, (13,), -2, 0)},
                 name="fa")
    b = c.g.node("linear_float", {"x": xb, "weight": normal(rng, (5, 520), 0.05)}, name="fb")
    c.g.output(a, b)
    c.runs = [{"xa": wide(rng, (b, 129), -2, 2), "xb": wide(rng, (b, 520), -2, 2)} for b in (4, 1)]
    return c


def case_linear_rank3(rng: np.random.Generator) -> Case:
    """Linear layers on [batch, steps, features]: rows from every leading dimension."""
    c = Case()
    xf = c.g.input("xf", "float32", [None, 3, 23])
    xq = c.g.input("xq", "uint8", [None, 2, 23])
    d = c.g.node("linear_dynamic", {"x": xf, **dynamic_set(rng, 17, 23, "channel", 0.01)}, name="dyn")
    s = static_node(c, rng, xq, 9, 23, "static", True, (0.03, 90), (0.2, 60), relu=False)
    c.g.output(d, s)
    c.runs = [{"xf": wide(rng, (b, 3, 23), -2, 1), "xq": rng.integers(0, 256, (b, 2, 23), dtype=np.uint8)}
              for b in (2, 1)]
    return c


CELL_WEIGHTS = [("tensor", True), ("channel", False), ("f16", True)]  # weights, reduce_range


def cell_case(rng: np.random.Generator, kind: str, hidden: int) -> Case:
    c = Case()
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[kind]
    ports = {"x": c.g.input("x", "float32", [None, 15]), "h": c.g.input("h", "float32", [None, hidden])}
    if kind == "lstm":
        ports["c"] = c.g.input("c", "float32", [None, hidden])
    outs: list[str] = []
    variants = [(w, rr, {}) for w, rr in CELL_WEIGHTS]
    if kind == "rnn":
        variants = [("tensor", True, {"nonlinearity": "tanh"}), ("channel", False, {"nonlinearity": "relu"}),
                    ("f16", True, {"nonlinearity": "tanh"}), ("tensor", True, {"nonlinearity": "relu"})]
    for i, (w, rr, extra) in enumerate(variants):
        node = {**ports, **recurrent_sets(rng, gates, 15, hidden, w)}
        name = f"{kind}_{w}_{'rr' if rr else 'full'}_{extra.get('nonlinearity', '')}{i}"
        out = c.g.node(f"{kind}_cell_dynamic", node, {"reduce_range": rr, **extra}, name=name)
        outs += list(out) if isinstance(out, tuple) else [out]
    c.g.output(*outs)
    shapes = {name: ("B", 15 if name == "x" else hidden) for name in ports}
    c.runs = state_runs(rng, (1, 4, 3), shapes)
    return c


def sequence_case(rng: np.random.Generator, kind: str, batch_first: bool) -> Case:
    """2 layers bidirectional with initial states, plus one-layer variants (other weights, other layout)."""
    c = Case()
    gates, hidden, n_in, seq = {"rnn": 1, "lstm": 4, "gru": 3}[kind], 11, 9, 7
    x = c.g.input("x", "float32", [None, None, n_in])
    states = ["h"] + (["c"] if kind == "lstm" else [])
    for s in states:
        c.g.input(f"{s}0", "float32", [4, None, hidden])
    variants = [  # layers, bidirectional, weights, reduce_range, batch_first, with states, extra attributes
        (2, True, "tensor" if kind != "lstm" else "channel", kind != "gru", batch_first, True, {}),
        (1, False, "channel" if kind != "lstm" else "tensor", kind == "gru", not batch_first, False, {}),
        (1, True, "f16", True, batch_first, False, {}),
    ]
    if kind == "rnn":
        variants[1] = variants[1][:-1] + ({"nonlinearity": "relu"},)
        variants.append((2, False, "tensor", False, batch_first, False, {"nonlinearity": "relu"}))
    outs: list[str] = []
    for i, (layers, bidir, w, rr, bf, with_states, extra) in enumerate(variants):
        ports: dict[str, str | np.ndarray] = {"x": x}
        if with_states:
            ports.update({f"{s}0": f"{s}0" for s in states})
        dirs = 2 if bidir else 1
        for n in range(layers):
            for d in range(dirs):
                prefix = f"l{n}_{'reverse_' if d else ''}"
                ports.update(recurrent_sets(rng, gates, n_in if n == 0 else dirs * hidden, hidden, w, prefix))
        attrs = {"num_layers": layers, "bidirectional": bidir, "batch_first": bf, "reduce_range": rr, **extra}
        outs += c.g.node(f"{kind}_dynamic", ports, attrs, name=f"{kind}{i}_L{layers}{'_bi' if bidir else ''}")
    c.g.output(*outs)
    for b, mag in ((1, 0.05), (2, 3.0), (2, 40.0)):
        shape = (b, seq, n_in) if batch_first else (seq, b, n_in)
        run = {"x": (wide(rng, shape, -1, 0.7) * mag).astype(F32)}
        run.update({f"{s}0": wide(rng, (4, b, hidden), -1, 0.7) * F32(min(mag, 3.0)) for s in states})
        c.runs.append(run)
    return c


def float_sets(rng: np.random.Generator, gates: int, n_in: int, hidden: int, prefix: str = "", bias: bool = True
               ) -> dict[str, np.ndarray]:
    """ih and hh float32 weight sets of one cell or layer direction (the float recurrent ops, version 8)."""
    out = {f"{prefix}ih_weight": normal(rng, (gates * hidden, n_in), 0.3),
           f"{prefix}hh_weight": normal(rng, (gates * hidden, hidden), 0.3)}
    if bias:
        out.update({f"{prefix}{side}_bias": wide(rng, (gates * hidden,), -2, 0) for side in ("ih", "hh")})
    return out


def case_recurrent_float(rng: np.random.Generator) -> Case:
    """The float recurrent ops (format version 8): every cell, and sequences: LSTM 2 layers bidirectional with states,
    GRU batch first, RNN tanh and relu (one without biases). Their products are linear_float's (its case covers
    the restarted-chain tail past K = 512)."""
    c = Case()
    hidden, n_in, seq = 13, 15, 6
    x = c.g.input("x", "float32", [None, n_in])
    h = c.g.input("h", "float32", [None, hidden])
    cs = c.g.input("c", "float32", [None, hidden])
    xs = c.g.input("xs", "float32", [None, None, n_in])
    h0 = c.g.input("h0", "float32", [4, None, hidden])
    c0 = c.g.input("c0", "float32", [4, None, hidden])
    outs: list[str] = [
        c.g.node("rnn_cell_float", {"x": x, "h": h, **float_sets(rng, 1, n_in, hidden)}, name="rnn_cell_tanh"),
        c.g.node("rnn_cell_float", {"x": x, "h": h, **float_sets(rng, 1, n_in, hidden, bias=False)},
                 {"nonlinearity": "relu"}, name="rnn_cell_relu"),
        *c.g.node("lstm_cell_float", {"x": x, "h": h, "c": cs, **float_sets(rng, 4, n_in, hidden)}, name="lstm_cell"),
        c.g.node("gru_cell_float", {"x": x, "h": h, **float_sets(rng, 3, n_in, hidden)}, name="gru_cell"),
    ]
    lstm = {"x": xs, "h0": h0, "c0": c0}
    for n in range(2):
        for d in range(2):
            lstm.update(float_sets(rng, 4, n_in if n == 0 else 2 * hidden, hidden, f"l{n}_{'reverse_' if d else ''}"))
    outs += c.g.node("lstm_float", lstm, {"num_layers": 2, "bidirectional": True}, name="lstm_L2_bi")
    outs += c.g.node("gru_float", {"x": xs, **float_sets(rng, 3, n_in, hidden, "l0_")}, {"batch_first": True},
                     name="gru_batch_first")
    for act, bias in (("tanh", True), ("relu", False)):
        outs += c.g.node("rnn_float", {"x": xs, **float_sets(rng, 1, n_in, hidden, "l0_", bias)},
                         {"nonlinearity": act}, name=f"rnn_{act}")
    c.g.output(*outs)
    for b, mag in ((1, 0.05), (3, 3.0), (2, 40.0)):
        run = {name: (wide(rng, shape, -1, 0.7) * mag).astype(F32)
               for name, shape in (("x", (b, n_in)), ("xs", (seq, b, n_in)))}
        run.update({name: (wide(rng, shape, -1, 0.7) * F32(min(mag, 3.0))).astype(F32)
                    for name, shape in (("h", (b, hidden)), ("c", (b, hidden)), ("h0", (4, b, hidden)),
                                        ("c0", (4, b, hidden)))})
        c.runs.append(run)
    return c


def case_glue(rng: np.random.Generator) -> Case:
    """relu, add, flatten (float and quantized), with -0.0, overflow to infinity and denormals."""
    c = Case()
    a = c.g.input("a", "float32", [None, 3, 5])
    b = c.g.input("b", "float32", [None, 3, 5])
    s = c.g.node("add", {"a": a, "b": b}, name="sum")
    r = c.g.node("relu", {"x": s}, name="relu_sum")
    ra = c.g.node("relu", {"x": a}, name="relu_a")
    f1 = c.g.node("flatten", {"x": r}, {"start_dim": 1}, name="flat1")
    f0 = c.g.node("flatten", {"x": a}, {"start_dim": 0}, name="flat0")
    q8 = c.g.node("quantize_per_tensor", {"x": a, "scale": np.asarray(0.1, F32), "zero_point": np.asarray(3, np.int32)},
                  {"dtype": "qint8"}, name="q8")
    q32 = c.g.node("quantize_per_tensor", {"x": b, "scale": np.asarray(0.01, F32),
                                           "zero_point": np.asarray(-4, np.int32)}, {"dtype": "qint32"}, name="q32")
    fq8 = c.g.node("flatten", {"x": q8}, {"start_dim": 2}, name="flat_q8")
    fq32 = c.g.node("flatten", {"x": q32}, {"start_dim": 1}, name="flat_q32")
    c.g.output(s, ra, f1, f0, fq8, fq32)
    big = np.finfo(F32).max
    for n in (4, 1):
        av, bv = wide(rng, (n, 3, 5), -3, 3), wide(rng, (n, 3, 5), -3, 3)
        av.flat[:6] = [-0.0, 0.0, -1e-45, 1e-45, big, -big]
        bv.flat[:6] = [-0.0, -0.0, 1e-45, -1e-45, big, -big]  # -0 + -0 = -0; max + max overflows to inf
        c.runs.append({"a": av, "b": bv})
    return c


def case_tensor_ops(rng: np.random.Generator) -> Case:
    """select, slice, cat, stack, reshape, permute, squeeze, unsqueeze, flatten(end_dim) over free dims."""
    c = Case()
    x = c.g.input("x", "float32", [None, None, 6])  # batch and sequence free
    q = c.g.input("q", "int8", [None, 1, 5])
    last = c.g.node("select", {"x": x}, {"dim": 1, "index": -1}, name="last")
    part = c.g.node("slice", {"x": x}, {"dim": 2, "start": 1, "end": -1, "step": 2}, name="part")
    tail = c.g.node("slice", {"x": x}, {"dim": 1, "start": -2}, name="tail")
    joined = c.g.node("cat", {"x0": tail, "x1": x}, {"dim": 1}, name="joined")
    stacked = c.g.node("stack", {"x0": last, "x1": last}, {"dim": 2}, name="stacked")
    rows = c.g.node("reshape", {"x": x}, {"shape": [-1, 3]}, name="rows")
    kept = c.g.node("reshape", {"x": x}, {"shape": [0, 0, 2, 3]}, name="kept")
    swapped = c.g.node("permute", {"x": kept}, {"perm": [2, 0, 3, 1]}, name="swapped")
    sq = c.g.node("squeeze", {"x": q}, {"dims": [1]}, name="sq")
    unsq = c.g.node("unsqueeze", {"x": sq}, {"dim": 0}, name="unsq")
    mid = c.g.node("flatten", {"x": kept}, {"start_dim": 1, "end_dim": 2}, name="mid")
    c.g.output(last, part, joined, stacked, rows, swapped, unsq, mid)
    for b, t in ((3, 4), (1, 1)):
        c.runs.append({"x": wide(rng, (b, t, 6)), "q": rng.integers(-128, 128, (b, 1, 5), dtype=np.int8)})
    return c


def case_embedding(rng: np.random.Generator) -> Case:
    """Float, 8-bit and 4-bit tables (value = fmaf(scale, q, bias) rounded once) and bags in all modes."""
    c = Case()
    num, dim = 23, 7
    ids = c.g.input("ids", "int64", [None, None])
    flat = c.g.input("flat", "int32", [None])
    offsets = c.g.input("offsets", "int64", [None])
    scale = (rng.uniform(0.001, 0.1, num)).astype(F32)
    bias = (-rng.integers(0, 256, num) * scale).astype(F32)
    table = {
        32: {"weight": wide(rng, (num, dim), -2, 1)},
        8: {"weight": rng.integers(0, 256, (num, dim), dtype=np.uint8), "weight_scale": scale, "weight_bias": bias},
        4: {"weight": rng.integers(0, 256, (num, (dim + 1) // 2), dtype=np.uint8),
            "weight_scale": scale.astype(np.float16), "weight_bias": bias.astype(np.float16)},
    }
    outs = []
    for bits, ports in table.items():
        attrs = {"bits": bits, "dim": dim} if bits != 32 else {}
        outs.append(c.g.node("embedding", {"indices": ids, **ports}, attrs, name=f"lookup{bits}"))
        for mode in ("sum", "mean", "max"):
            bag = {"indices": flat, "offsets": offsets, **ports}
            outs.append(c.g.node("embedding_bag", bag, {**attrs, "mode": mode}, name=f"bag{bits}_{mode}"))
    c.g.output(*outs)
    for b, t, n in ((4, 5, 11), (1, 1, 3)):
        c.runs.append({
            "ids": rng.integers(0, num, (b, t), dtype=np.int64),
            "flat": rng.integers(0, num, n, dtype=np.int32),
            "offsets": np.array([0, 0, 1, n // 2][: max(1, min(4, n))], np.int64),  # an empty bag among them
        })
    return c


def case_float_math(rng: np.random.Generator) -> Case:
    """sigmoid, tanh, silu, gelu (both), softmax, log_softmax, layer_norm, mean, sum and broadcasting
    add/sub/mul/div, over values from denormal to 1e30, with -0.0 and exp's range ends (no infinity:
    several of these ops turn one into NaN, whose bits are outside the contract)."""
    c = Case()
    x = c.g.input("x", "float32", [None, 5, 37])
    y = c.g.input("y", "float32", [1, 37])
    outs = [c.g.node(op, {"x": x}, name=op) for op in ("sigmoid", "tanh", "silu")]
    outs += [c.g.node("gelu", {"x": x}, {"approximate": a}, name=f"gelu_{a}") for a in ("none", "tanh")]
    outs += [c.g.node(op, {"x": x}, {"dim": d}, name=f"{op}{d}") for op in ("softmax", "log_softmax") for d in (1, 2)]
    ln = {"x": x, "weight": normal(rng, (5, 37)), "bias": normal(rng, (5, 37))}
    outs.append(c.g.node("layer_norm", ln, {"normalized_dims": 2, "eps": 1e-5}, name="layer_norm2"))
    outs.append(c.g.node("layer_norm", {"x": x}, {"normalized_dims": 1, "eps": 1e-3}, name="layer_norm1"))
    outs += [c.g.node(op, {"x": x}, {"dims": [2], "keepdim": k}, name=f"{op}_{k}") for op in ("mean", "sum")
             for k in (False, True)]
    outs.append(c.g.node("mean", {"x": x}, {"dims": [1, 2]}, name="mean_all"))
    outs += [c.g.node(op, {"a": x, "b": y}, name=op) for op in ("add", "sub", "mul", "div")]
    outs.append(c.g.node("mul", {"a": x, "b": np.asarray(0.5, F32)}, name="half"))
    c.g.output(*outs)
    for b in (3, 1):
        xv = wide(rng, (b, 5, 37), -3, 1.5)
        xv[0, 0, :10] = [-0.0, 0.0, 1e-45, -1e-45, 88.7, -103.9, 9.1, -9.1, 1e-4, -20.0]
        xv[0, 2, :] = 1e30  # a softmax row of equal huge values; a layer norm of zero variance
        c.runs.append({"x": xv, "y": wide(rng, (1, 37), -3, 1)})
    return c


def case_masks(rng: np.random.Generator) -> Case:
    """Comparisons (float, integer, bool), logic, where, cast both ways, clamp, sqrt and rsqrt, and the
    ops that follow free sizes (arange, expand with like, index_select, gather), as an encoder's attention
    mask and pooling use them: an int64 mask with padding, values with -0.0, subnormals, ties at the bounds
    and integers past 2^24 (no NaN: its bits are outside the contract)."""
    c = Case()
    x = c.g.input("x", "float32", [None, 13])
    mask = c.g.input("mask", "int64", [None, 13])
    on = c.g.node("cast", {"x": mask}, {"dtype": "bool"}, name="mask_bool")
    pos = c.g.node("arange", {"x": mask}, {"dim": 1}, name="positions")
    late = c.g.node("ge", {"a": pos, "b": np.asarray(np.int32(4))}, name="late")
    keep = c.g.node("logical_and", {"a": on, "b": c.g.node("logical_not", {"x": late}, name="early")}, name="keep")
    either = c.g.node("logical_or", {"a": on, "b": late}, name="either")
    outs = [keep, either]
    outs += [c.g.node(op, {"a": x, "b": np.asarray(F32(0.5))}, name=f"{op}_half") for op in
             ("eq", "ne", "lt", "le", "gt", "ge")]
    outs.append(c.g.node("eq", {"a": mask, "b": c.g.node("cast", {"x": x}, {"dtype": "int64"}, name="x_int")},
                         name="mask_eq_x"))
    w = c.g.node("where", {"condition": keep, "a": x, "b": np.asarray(F32(-1.5))}, name="kept")
    cl = c.g.node("clamp", {"x": w}, {"min": float(F32(1e-9)), "max": 2.5}, name="clamped")
    outs += [w, cl, c.g.node("sqrt", {"x": cl}, name="root"), c.g.node("rsqrt", {"x": cl}, name="inverse_root")]
    outs += [c.g.node("cast", {"x": mask}, {"dtype": dt}, name=f"mask_{dt}") for dt in ("float32", "int32")]
    outs.append(c.g.node("cast", {"x": x}, {"dtype": "int32"}, name="x_int32"))
    row = c.g.node("unsqueeze", {"x": pos}, {"dim": 0}, name="row")
    outs.append(c.g.node("expand", {"x": row, "like": x}, {"shape": [-1, -1], "like_dims": [0, None]},
                         name="positions_per_row"))
    table = c.g.tensor("table", rng.integers(-1000, 1000, (3, 40)).astype(np.int32))
    picked = c.g.node("index_select", {"x": table, "index": pos}, {"dim": 1}, name="picked")
    index = c.g.node("expand", {"x": row}, {"shape": [3, -1]}, name="index")
    outs += [picked, c.g.node("gather", {"x": picked, "index": index}, {"dim": 1}, name="gathered")]
    c.g.output(*outs)
    for b in (3, 1):
        xv = wide(rng, (b, 13), -3, 3)
        xv[0, :8] = [-0.0, 0.5, 1e-45, 2.5, -2.5, 1e-9, 16777217.0, 0.49999997]
        mv = np.ones((b, 13), np.int64)
        mv[0, 9:] = 0
        mv[-1, 0] = 2**40 + 3
        c.runs.append({"x": xv, "mask": mv})
    return c


def case_integers(rng: np.random.Generator) -> Case:
    """Integer arithmetic and running sums (format version 9): RoBERTa's positions over an int64 token row with
    padding (cumsum of the non-padding tokens, times the mask, plus the padding index), and add_int, sub_int,
    mul_int on int32 values that wrap past 2**31 and an int32 against an int64 (widened)."""
    c = Case()
    ids = c.g.input("ids", "int64", [None, 11])
    v = c.g.input("v", "int32", [None, 11])
    real = c.g.node("cast", {"x": c.g.node("ne", {"a": ids, "b": np.asarray(np.int32(1))}, name="real")},
                    {"dtype": "int32"}, name="real_int")
    counts = c.g.node("cast", {"x": c.g.node("cumsum", {"x": real}, {"dim": 1}, name="counts")}, {"dtype": "int32"},
                      name="counts_int")
    positions = c.g.node("add_int", {"a": c.g.node("mul_int", {"a": counts, "b": real}, name="masked"),
                                     "b": np.asarray(np.int32(1))}, name="positions")
    outs = [positions, c.g.node("cumsum", {"x": c.g.node("cast", {"x": v}, {"dtype": "bool"}, name="nonzero")},
                                {"dim": 0}, name="nonzero_counts")]
    first = c.g.node("unsqueeze", {"x": c.g.node("select", {"x": v}, {"dim": 0, "index": 0}, name="first")},
                     {"dim": 0}, name="first_row")  # the extremes of row 0 against every row, itself included
    outs += [c.g.node(op, {"a": v, "b": first}, name=f"{op}_wraps") for op in ("add_int", "sub_int", "mul_int")]
    outs.append(c.g.node("mul_int", {"a": v, "b": ids}, name="widened"))
    outs.append(c.g.node("cumsum", {"x": v}, {"dim": 1}, name="running"))
    c.g.output(*outs)
    for b in (3, 1):
        iv = rng.integers(3, 50_000, (b, 11)).astype(np.int64)
        iv[0, 7:] = 1  # padding
        iv[-1, 0] = 2**40 + 3
        vv = rng.integers(-(2**31), 2**31, (b, 11)).astype(np.int32)
        vv[0, :6] = [2**31 - 1, -(2**31), 46341, -1, 0, 0]
        c.runs.append({"ids": iv, "v": vv})
    return c


def case_reshape_like(rng: np.random.Generator) -> Case:
    """reshape taking sizes from another value (format version 9): MultiheadAttention's [S * B, E] viewed as
    [S, B, E] with both sizes free, one size taken and one inferred, and int64 values moved the same way."""
    c = Case()
    rows = c.g.input("rows", "float32", [None, 5])
    q = c.g.input("q", "float32", [None, None, 5])
    ids = c.g.input("ids", "int64", [None])
    both = c.g.node("reshape", {"x": rows, "like": q}, {"shape": [1, 1, 5], "like_dims": [0, 1, None]}, name="both")
    inferred = c.g.node("reshape", {"x": rows, "like": q}, {"shape": [1, -1], "like_dims": [1, None]},
                        name="inferred")
    moved = c.g.node("reshape", {"x": ids, "like": q}, {"shape": [1, 1], "like_dims": [0, 1]}, name="moved")
    c.g.output(both, inferred, moved)
    for s, b in ((3, 4), (1, 1), (7, 2)):
        c.runs.append({"rows": wide(rng, (s * b, 5)), "q": wide(rng, (s, b, 5)),
                       "ids": rng.integers(-(2**62), 2**62, s * b)})
    return c


def case_max_pooling(rng: np.random.Generator) -> Case:
    """amax (format version 10): max pooling over time and over two dimensions kept, with infinities and a line of
    +-0.0 ties (the sign of the first zero)."""
    c = Case()
    seq = c.g.input("seq", "float32", [None, None, 6])
    over_time = c.g.node("amax", {"x": seq}, {"dims": [1]}, name="over_time")
    kept = c.g.node("amax", {"x": seq}, {"dims": [0, 2], "keepdim": True}, name="kept")
    c.g.output(over_time, kept)
    for b, t in ((2, 7), (1, 1), (3, 19)):
        x = wide(rng, (b, t, 6))
        x[0, :, 0] = rng.choice(np.array([0.0, -0.0], F32), t)  # a line of zeros of both signs
        x[-1, 0, 1] = np.inf
        x[-1, -1, 2] = -np.inf
        c.runs.append({"seq": x})
    return c


def case_batch_norm(rng: np.random.Generator) -> Case:
    """batch_norm (format version 11): over [batch, channels] (a tabular model's) and over [batch, channels, length],
    statistics of wide range, a zero variance (sqrt(eps) alone) and subnormal means, inputs with subnormals, signed
    zeros and infinities (no weight is 0, so no inf * 0 NaN)."""
    c = Case()

    def stats(channels: int) -> dict:
        mean, var, weight, bias = (wide(rng, (channels,)) for _ in range(4))
        var = np.abs(var)
        var[0] = 0.0
        mean[1::5] = 1e-40
        return {p: c.g.tensor(f"{p}{channels}", t) for p, t in zip(("mean", "var", "weight", "bias"),
                                                                    (mean, var, weight, bias))}

    rows = c.g.input("rows", "float32", [None, 37])
    seq = c.g.input("seq", "float32", [None, 5, None])
    c.g.output(c.g.node("batch_norm", {"x": rows, **stats(37)}, {"eps": 1e-5}, name="tabular"),
               c.g.node("batch_norm", {"x": seq, **stats(5)}, {"eps": 1e-3}, name="over_time"))
    specials = np.array([1e-40, -0.0, 0.0, np.inf, -np.inf, -3e-39], F32)
    for b, t in ((1, 1), (6, 9), (3, 70)):
        x, z = wide(rng, (b, 37)), wide(rng, (b, 5, t))
        x.reshape(-1)[::7] = np.resize(specials, x.reshape(-1)[::7].size)
        z.reshape(-1)[::11] = 1e-40
        c.runs.append({"rows": x, "seq": z})
    return c


def case_log(rng: np.random.Generator) -> Case:
    """log (format version 12): relative position buckets' arguments (n / 8 for n up to 300, the powers of 2 at
    the buckets' edges among them), values over the whole float range, subnormals, zeros of both signs, 1,
    infinity (no negatives: NaN outputs are not part of the contract)."""
    c = Case()
    c.g.output(c.g.node("log", {"x": c.g.input("x", "float32", [None, None])}, name="log"))
    special = np.array([0.0, -0.0, 1.0, np.inf, 1e-45, 1e-40, 1.1754944e-38, 3.4e38], F32)
    positions = np.arange(1, 301, dtype=F32) / F32(8)
    spread = np.exp(rng.uniform(-100, 88, 157)).astype(F32)
    c.runs.append({"x": np.concatenate([special, positions, spread, rng.uniform(0.5, 2, 35).astype(F32)])
                   .reshape(10, 50)})
    c.runs.append({"x": np.abs(wide(rng, (3, 7)))})
    return c


def case_rotary(rng: np.random.Generator) -> Case:
    """sin and cos (format version 12): rotary embeddings' angles (positions times inverse frequencies
    10000^(-2i / 32), in float32), values over the whole float range of either sign, subnormals, signed zeros."""
    c = Case()
    x = c.g.input("x", "float32", [None, None])
    c.g.output(c.g.node("sin", {"x": x}, name="sin"), c.g.node("cos", {"x": x}, name="cos"))
    angles = np.arange(300, dtype=F32)[:, None] * (F32(10000) ** (-np.arange(0, 32, 2, dtype=F32) / F32(32)))
    special = np.array([0.0, -0.0, 1e-45, -1e-40, np.pi / 4, 16367173 * 2.0**72, -3.4e38, 1e30], F32)
    spread = (np.exp(rng.uniform(-100, 88, 192)) * rng.choice([-1, 1], 192)).astype(F32)
    c.runs.append({"x": angles.astype(F32)})
    c.runs.append({"x": np.concatenate([special, spread]).reshape(8, 25)})
    return c


def case_rounding(rng: np.random.Generator) -> Case:
    """ceil and floor (format version 13): DeBERTa's log bucket arguments (log(n / 128) / log(511 / 128) * 127 for
    relative positions n up to 600, in float32), halves and values just off integers of either sign, (-1, 0)
    (ceil gives -0.0), past 2^23 (every float an integer), subnormals, signed zeros, infinities."""
    c = Case()
    x = c.g.input("x", "float32", [None, None])
    c.g.output(c.g.node("ceil", {"x": x}, name="ceil"), c.g.node("floor", {"x": x}, name="floor"))
    n = np.arange(1, 601, dtype=F32)
    buckets = np.log(n / F32(128)) / np.log(F32(511) / F32(128)) * F32(127)
    special = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 1 - 2**-24, -(1 - 2**-24), 2**23 - 0.5, -(2**23 + 1),
                        2**24 + 2, 1e-45, -1e-40, np.inf, -np.inf, 3.4e38, -3.4e38, 1e30, 7.0, -7.0], F32)
    c.runs.append({"x": buckets.astype(F32).reshape(20, 30)})
    c.runs.append({"x": np.concatenate([special, wide(rng, (180,), -3.0, 8.0)]).reshape(8, 25)})
    return c


def case_attention(rng: np.random.Generator) -> Case:
    """matmul (batch broadcast, K past a tile) and attention (scale null and given, a bool mask over heads with a
    row masked out entirely, a float additive mask with -inf, is_causal, k/v broadcast over q's batch), at odd
    sizes with free batch and sequence dimensions, 40 keys (past the 32-column tiles)."""
    c = Case()
    x = c.g.input("x", "float32", [None, 3, None, 7])
    kv = c.g.input("kv", "float32", [1, 3, None, 7])
    keep = c.g.input("keep", "bool", [None, 1, None, None])
    bias = c.g.input("bias", "float32", [None, None])
    w = normal(rng, (3, 7, 13), 0.4)
    h = c.g.node("matmul", {"a": x, "b": w}, name="project")
    outs = [h]
    outs.append(c.g.node("attention", {"q": x, "k": kv, "v": kv, "mask": keep}, name="masked"))
    outs.append(c.g.node("attention", {"q": x, "k": x, "v": h, "mask": bias}, {"scale": 0.61}, name="additive"))
    outs.append(c.g.node("attention", {"q": x, "k": x, "v": h}, {"is_causal": True}, name="causal"))
    c.g.output(*outs)
    for b, seq in ((3, 11), (1, 40)):
        mask = rng.random((b, 1, seq, seq)) > 0.4
        mask[0, 0, 1] = False
        add = np.where(rng.random((seq, seq)) > 0.2, normal(rng, (seq, seq), 2.0), F32(-np.inf))
        add[:, 0] = 0.5  # every row keeps a key: a row of -inf only is the bool mask's case
        c.runs.append({"x": wide(rng, (b, 3, seq, 7), -1, 0.5), "kv": wide(rng, (1, 3, seq, 7), -1, 0.5),
                       "keep": mask, "bias": add.astype(F32)})
    return c


def case_qnnpack(rng: np.random.Generator) -> Case:
    """engine="qnnpack" (NUMERICS.md section 9): dynamic Linear (0..255 activations, multiply then add), static
    Linear (int32 bias, ARM's saturation past 2^31), cells and an LSTM sequence."""
    c = Case()
    q = {"engine": "qnnpack"}
    xf = c.g.input("x", "float32", [None, 45])
    xq = c.g.input("xq", "uint8", [None, 67])
    h = c.g.input("h", "float32", [None, 13])
    cs = c.g.input("c", "float32", [None, 13])
    outs = [
        c.g.node("linear_dynamic", {"x": xf, **dynamic_set(rng, 23, 45, "tensor", 0.004)}, q, name="dyn_pt"),
        c.g.node("linear_dynamic", {"x": xf, **dynamic_set(rng, 31, 45, "channel", 0.004, bias=False, zp=True)},
                 {"reduce_range": False, **q}, name="dyn_pc_zp"),
    ]
    for name, n, pc, x_qp, y_qp, relu, w_scale in (
        ("st_pt", 29, False, (0.02, 0), (0.5, 120), False, 0.005),
        ("st_pc_relu", 21, True, (0.02, 128), (0.1, 40), True, 0.005),
        ("st_past_2_31", 19, False, (0.05, 255), (1e-7, 7), False, 0.5),  # fl(acc) * mult beyond int32
    ):
        outs.append(static_node(c, rng, xq, n, 67, name, pc, x_qp, y_qp, relu, w_zp=pc, w_scale=w_scale,
                                engine="qnnpack"))
    for kind, gates in (("rnn", 1), ("lstm", 4), ("gru", 3)):
        ports = {"x": xf, "h": h, **({"c": cs} if kind == "lstm" else {})}
        ports.update(recurrent_sets(rng, gates, 45, 13, "channel"))
        extra = {"nonlinearity": "relu"} if kind == "rnn" else {}
        out = c.g.node(f"{kind}_cell_dynamic", ports, {**q, **extra}, name=f"{kind}_cell")
        outs += list(out) if isinstance(out, tuple) else [out]
    seq = c.g.input("seq", "float32", [None, None, 9])
    ports = {"x": seq}
    for d in range(2):
        ports.update(recurrent_sets(rng, 4, 9, 11, "tensor", f"l0_{'reverse_' if d else ''}"))
    outs += c.g.node("lstm_dynamic", ports, {"bidirectional": True, **q}, name="lstm_seq")
    c.g.output(*outs)
    for b, mag in ((1, 0.05), (4, 3.0), (3, 40.0)):
        c.runs.append({"x": (wide(rng, (b, 45), -1, 0.7) * mag).astype(F32),
                       "xq": rng.integers(0, 256, (b, 67), dtype=np.uint8),
                       "h": (wide(rng, (b, 13), -1, 0.7) * min(mag, 3.0)).astype(F32),
                       "c": (wide(rng, (b, 13), -1, 0.7) * min(mag, 3.0)).astype(F32),
                       "seq": (wide(rng, (5, b, 9), -1, 0.7) * mag).astype(F32)})

    def saturates(o: list[dict[str, np.ndarray]]) -> bool:
        sat = np.concatenate([r["st_past_2_31"].ravel() for r in o])
        return sat.min() == 0 and sat.max() == 255

    c.claims.append(("the static outputs past 2^31 saturate at both ends", saturates))
    return c


def case_qnnpack_ties(rng: np.random.Generator) -> Case:
    """engine="qnnpack" on rounding ties (NUMERICS.md section 9): the quantize ops and a dynamic Linear's
    activations round as torch on aarch64, rne(fl(x * inv)) + zp, which differs from x86's rule there."""
    c = Case()
    q = {"engine": "qnnpack"}
    scale, zp = 0.0137, 3
    x = c.g.input("x", "float32", [None])
    outs = [c.g.node("quantize_per_tensor", {"x": x, "scale": np.asarray(scale, F32),
                                             "zero_point": np.asarray(z, np.int32)}, {"dtype": dt, **q}, name=dt)
            for dt, z in (("quint8", zp), ("qint8", zp - 128), ("qint32", zp))]
    x2 = c.g.input("x2", "float32", [2, None])
    outs.append(c.g.node("quantize_per_channel", {"x": x2, "scale": np.asarray([scale, 0.3], np.float64),
                                                  "zero_point": np.asarray([zp, 77], np.int32)},
                         {"dtype": "quint8", "axis": 0, **q}, name="per_channel"))
    lo, hi = -1.0, 1.55  # the activations' range, so their own scale (hi - lo) / 255 and zero point 100
    xl = c.g.input("xl", "float32", [None, 362])
    outs.append(c.g.node("linear_dynamic", {"x": xl, **dynamic_set(rng, 17, 362, "tensor", 0.004)}, q,
                         name="dyn"))
    c.g.output(*outs)
    ties = near_ties(scale, 0, np.arange(-150, 150))
    lin = np.clip(near_ties((hi - lo) / 255, 0, np.arange(-60, 60)), lo, hi)
    c.runs.append({"x": ties, "x2": np.stack([ties, near_ties(0.3, 0, np.arange(-150, 150))]),
                   "xl": np.concatenate([[lo, hi], lin]).astype(F32)[None, :]})

    def x86_rule_differs(o: list[dict[str, np.ndarray]]) -> bool:
        inv = F32(1) / F32(scale)  # x86's fma(x, inv, zp), exact in double, rounded once to float32
        x86 = np.clip(np.rint((ties.astype(np.float64) * np.float64(inv) + zp).astype(F32)), 0, 255)
        return int((x86 != o[0]["quint8"]).sum()) > 100

    c.claims.append(("x86's rounding differs from these outputs on many ties", x86_rule_differs))
    return c


CASES: dict[str, Callable[[np.random.Generator], Case]] = {
    "quantize_per_tensor": case_quantize_per_tensor,
    "quantize_per_channel": case_quantize_per_channel,
    "dequantize": case_dequantize,
    "linear_static": case_linear_static,
    "mlp_static": case_mlp_static,
    "linear_dynamic_int8": case_linear_dynamic_int8,
    "linear_dynamic_fp16": case_linear_dynamic_fp16,
    "linear_dynamic_per_row": case_linear_dynamic_per_row,
    "linear_float": case_linear_float,
    "linear_rank3": case_linear_rank3,
    "rnn_cell": lambda rng: cell_case(rng, "rnn", 13),
    "lstm_cell": lambda rng: cell_case(rng, "lstm", 13),
    "gru_cell": lambda rng: cell_case(rng, "gru", 11),
    "rnn_sequence": lambda rng: sequence_case(rng, "rnn", batch_first=False),
    "lstm_sequence": lambda rng: sequence_case(rng, "lstm", batch_first=True),
    "gru_sequence": lambda rng: sequence_case(rng, "gru", batch_first=False),
    "recurrent_float": case_recurrent_float,
    "glue": case_glue,
    "tensor_ops": case_tensor_ops,
    "embedding": case_embedding,
    "float_math": case_float_math,
    "qnnpack": case_qnnpack,
    "qnnpack_ties": case_qnnpack_ties,
    "masks": case_masks,
    "attention": case_attention,
    "integers": case_integers,
    "reshape_like": case_reshape_like,
    "max_pooling": case_max_pooling,
    "batch_norm": case_batch_norm,
    "log": case_log,
    "rotary": case_rotary,
    "rounding": case_rounding,
}


# ---------------------------------------------------------------- writing


GOLDEN_VARIANT = "portable"  # the kernel variant the committed golden files come from


def producer_info() -> dict[str, object]:
    """What wrote the outputs. numpy matters only for the seeded inputs: no op runs on numpy's BLAS."""
    return {
        "generator": "tests/golden/make_golden.py",
        "qrt": qrt.__version__,
        "kernels": K.kernel_variant_info(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "threads": 1,
    }


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """An uncompressed .npz with fixed timestamps: regenerating unchanged outputs gives the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            item = io.BytesIO()
            # not ascontiguousarray: it turns a 0-d array (meta) into a 1-d one
            np.lib.format.write_array(item, a if a.flags.c_contiguous else a.copy(), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), item.getvalue())
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def run_case(name: str, case: Case, out_dir: str, info: dict[str, object]) -> int:
    """Write <name>.qrt, run every input set, write <name>.npz; returns the bytes written."""
    model_path = os.path.join(out_dir, f"{name}.qrt")
    case.g.save(model_path)
    model = qrt.load(model_path)
    arrays: dict[str, np.ndarray] = {}
    results = []
    for i, inputs in enumerate(case.runs):
        with np.errstate(over="ignore"):  # glue's add overflows to infinity on purpose
            got = model.run(inputs)
        got = got if isinstance(got, tuple) else (got,)
        outs = {spec.name: np.asarray(v) for spec, v in zip(model.outputs, got)}
        for k, v in outs.items():
            # NaN bits are not portable (sign differs between vector and scalar code): keep them out
            if v.dtype.kind == "f" and np.isnan(v).any():
                raise SystemExit(f"case {name!r} run {i}: output {k!r} contains NaN; change the inputs")
        arrays.update({f"r{i}.in.{k}": v for k, v in inputs.items()})
        arrays.update({f"r{i}.out.{k}": v for k, v in outs.items()})
        results.append(outs)
    for what, holds in case.claims:
        if not holds(results):
            raise SystemExit(f"case {name!r}: the inputs no longer exercise what they should: {what}")
    arrays["meta"] = np.array(json.dumps({**info, "case": name, "seed": zlib.crc32(name.encode())}, sort_keys=True))
    npz_path = os.path.join(out_dir, f"{name}.npz")
    write_npz(npz_path, arrays)
    return os.path.getsize(model_path) + os.path.getsize(npz_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=HERE, help="folder to write into (default: this script's)")
    ap.add_argument("--variant", default=GOLDEN_VARIANT,
                    help=f"kernel variant to run (default {GOLDEN_VARIANT!r}; any other is for experiments only "
                    "and may not write into this folder)")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="write only this case (repeatable): a new case, leaving the others' files as they are")
    args = ap.parse_args()
    forced = os.environ.get("QRT_KERNELS", "")
    if forced and forced != args.variant:
        raise SystemExit(f"QRT_KERNELS={forced} but --variant {args.variant}: make them agree")
    if args.variant != GOLDEN_VARIANT and os.path.realpath(args.out) == os.path.realpath(HERE):
        raise SystemExit(f"the golden files come from the {GOLDEN_VARIANT!r} variant: write --variant "
                         f"{args.variant} outputs elsewhere (--out)")
    try:
        K._use_variant(args.variant)  # before any qrt.load: a model keeps the variant it was loaded with
    except ValueError as e:
        raise SystemExit(f"qrt at {qrt.__file__}: {e}") from None
    if K.kernel_variant() != args.variant:
        raise SystemExit(f"kernel variant {K.kernel_variant()!r} is active, not {args.variant!r}")
    info = producer_info()
    qrt.set_num_threads(1)

    cases = {name: make(np.random.default_rng(zlib.crc32(name.encode()))) for name, make in CASES.items()}
    used = {node["op"] for case in cases.values() for node in case.g.nodes}
    missing = sorted(set(OPS) - used)
    if missing:  # a new op needs a golden case before the set can be written
        raise SystemExit(f"no golden case covers op(s) {missing}: add one to CASES in {__file__}")

    os.makedirs(args.out, exist_ok=True)
    stale = set() if args.case else {p for ext in ("qrt", "npz") for p in glob.glob(os.path.join(args.out, f"*.{ext}"))}
    total, written = 0, 0
    for name, case in cases.items():
        if args.case and name not in args.case:
            continue
        written += 1
        size = run_case(name, case, args.out, info)
        stale -= {os.path.join(args.out, f"{name}.{ext}") for ext in ("qrt", "npz")}
        ops = sorted({node["op"] for node in case.g.nodes})
        print(f"{name:22s} {len(case.runs):2d} runs {size / 1024:7.1f} KiB  {', '.join(ops)}")
        total += size
    for path in sorted(stale):  # a renamed or removed case leaves nothing behind
        os.remove(path)
        print(f"removed stale {path}")
    print(f"{written} cases, {total / 1024:.1f} KiB, kernels {info['kernels']}, {sys.executable}")


if __name__ == "__main__":
    main()

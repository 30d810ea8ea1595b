"""matmul and attention against a scalar oracle of their fixed order (bit for bit), float64 and torch.

Notation: u = 2^-24, gamma(k) = k u / (1 - k u).

- Bits: the oracle below runs the documented order (docs/NUMERICS.md, "Matrix product and attention": torch
  2.13's CPU flash attention step by step) in numpy float32 arithmetic, which is IEEE (one rounding per
  operation), with fma32 (tests/reference.py) for every fused multiply-add, ports of ATen's exp_u20 and glibc's
  expf (qrt/kernels/torch_exp.h) and Python's exp in double for the rest: every kernel build this CPU runs
  (plain C, AVX2 + FMA, AVX-512), at 1 and 3 threads with every row its own task, gives its bits exactly.
- Bits against torch: where torch's own AVX2 and AVX-512 kernels agree (S < 8: all its scalar tail; S = 16),
  every build gives torch's bits, with HuggingFace's padding masks and float masks of any values.
- matmul against torch: the same products summed in another order, so within 2 gamma(K) sum_k |a_k b_k| of each
  other (each within gamma(K) of the exact sum, any order).
- attention against the exact function (float64) of its float32 inputs. For query row i, with S_j = scale
  sum_e |q_e k_je| and T = max_j |t_j|: each score t_j is within Delta / 2 = scale gamma(E) max_j S_j / scale
  + gamma(2) T (the chain, the scaling and the mask's add) of the exact one, so t_j - m is within Delta; the exp
  is within EXP_ERR relative (below), so each p_j within Delta + EXP_ERR relative (first order, |Delta| << 1
  here), and the sum Z within that plus gamma(depth(S)) (a bound on any lane order); the context chain adds
  gamma(S) and the final product u. With W = sum_j p_j |v_j| / Z:
  |y - y_exact| <= W (2 (Delta + EXP_ERR) + gamma(S) + gamma(depth(S)) + u).
- attention against torch 2.13's CPU kernel under any ATen capability (flash attention for 4-D inputs, else its
  math path): torch's own error is of the same form, with any summation order (gamma(S) for its sum) and two
  more roundings per score (the math path scales q and k by sqrt(scale)), so the two are within the sum of both.
- Rows masked out entirely give 0, as torch's do; the converter lowers modules that use matmul / @ / bmm and
  F.scaled_dot_product_attention (positional and keyword), through the torch.export front end, with free batch
  and sequence dimensions; the FX front end writes the same file.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from reference import fma32
from torch import nn

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from qrt.errors import FormatError
from tools.convert import convert

F = torch.nn.functional
f32 = np.float32
U = 2.0**-24
RNG = np.random.default_rng(38)


def gamma(k) -> float:
    return k * U / (1 - k * U)


# ------------------------------------------------------------ the oracle: the documented order, in float32


def chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[m, k] x [k, n]: each output the fma chain over k in order, from +0."""
    acc = np.zeros((a.shape[0], b.shape[1]), f32)
    for t in range(a.shape[1]):
        acc = fma32(a[:, t : t + 1], b[t : t + 1, :], acc)
    return acc


def exp_u20(x: np.ndarray) -> np.ndarray:
    """ATen's Vectorized<float>::exp_u20 (qrt/kernels/torch_exp.h), operation for operation."""
    lo, hi = np.uint32(0xC2AEAC50).view(f32), np.uint32(0x42B17218).view(f32)
    src = np.where(x < hi, x, hi)
    src = np.where(src > lo, src, lo).astype(f32)
    fx = np.floor(fma32(src, np.uint32(0x3FB8AA3B).view(f32), f32(0.5)))
    r = fma32(-fx, np.uint32(0x3F317218).view(f32), src)
    p = fma32(r, f32(0.00828929059), f32(0.0418978221))
    for c in (0.166676521, 0.499991506, 0.999999701, 1.0):
        p = fma32(r, p, f32(c))
    two = np.where(x < lo, f32(0), pow2(fx - f32(1)))
    return (p * two * f32(2)).astype(f32)


def softmax_weights(d: np.ndarray) -> tuple[np.ndarray, f32]:
    """exp of one row's t_j - m and their sum, in torch's AVX-512 order: exp_u20 on whole vectors of 16, summed
    in 16 lanes from +0 folded in halves; the rest exp in double rounded to float, added one by one."""
    whole = d.shape[0] // 16 * 16
    p = np.empty_like(d)
    p[:whole] = exp_u20(d[:whole])
    acc = np.zeros(16, f32)
    for j in range(0, whole, 16):
        acc = acc + p[j : j + 16]
    for half in (8, 4, 2, 1):
        acc[:half] = acc[:half] + acc[half : 2 * half]
    z = acc[0]
    for j in range(whole, d.shape[0]):
        p[j] = f32(math.exp(float(d[j]))) if d[j] > -746 else f32(0)
        z = f32(z + p[j])
    return p, z


def pow2(n: np.ndarray) -> np.ndarray:
    return ((n.astype(np.int64) + 127) << 23).astype(np.uint32).view(f32)


def fma64(a: float, b: float, c: float) -> float:
    """float64 fma, correctly rounded (exact rationals, then one rounding)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


EXPF_TAB = [  # glibc's __exp2f_data.tab: bits of 2^(i/32), correctly rounded, less i << 47
    int(np.float64(2.0 ** (i / 32)).view(np.int64)) - (i << 47) for i in range(32)
]


def expf_glibc(x: float) -> f32:
    """glibc's expf as its x86-64 FMA build computes it (qrt/kernels/torch_exp.h), step for step."""
    h = float.fromhex
    if x > h("0x1.62e42ep6"):
        return f32(np.inf)
    if x < -h("0x1.9fe368p6"):
        return f32(0)
    shift, invln2n = h("0x1.8p52"), h("0x1.71547652b82fep0") * 32
    c0, c1, c2 = h("0x1.c6af84b912394p-5") / 32**3, h("0x1.ebfce50fac4f3p-3") / 32**2, h("0x1.62e42ff0c52d6p-1") / 32
    kd = fma64(invln2n, x, shift)
    ki = int(np.float64(kd).view(np.uint64))
    kd -= shift
    r = fma64(invln2n, x, -kd)
    s = float(np.uint64((EXPF_TAB[ki % 32] + (ki << 47)) % 2**64).view(np.float64))
    return f32(s * fma64(fma64(c0, r, c1), r * r, fma64(c2, r, 1.0)))


def context(p: np.ndarray, v: np.ndarray, y: np.ndarray | None) -> np.ndarray:
    """y + p v as torch's sgemm sums it (y None: 0): a chain over the keys added to y, or up to 384 keys, else a
    chain over the first ceil(S / 2) added to y, then one over the rest added to that."""
    half = (p.shape[1] + 1) // 2 if p.shape[1] > 384 else p.shape[1]
    for part in (slice(0, half), slice(half, p.shape[1])) if half < p.shape[1] else (slice(0, half),):
        c = chain(p[:, part], v[part])
        y = c if y is None else y + c
    return y


def block_max(block: np.ndarray) -> f32:
    """torch's _mul_reduce_max_fusion_kernel: the whole vectors' max propagating NaN, std::max over the rest
    (skipping NaN), the larger unless the first is NaN."""
    whole = len(block) // 16 * 16
    vectors, tail = (block[:whole].max() if whole else f32(-np.inf)), f32(-np.inf)
    for x in block[whole:]:
        tail = x if tail < x else tail
    return tail if vectors < tail else vectors


def attention_oracle(q, k, v, mask, scale: f32, causal: bool) -> np.ndarray:
    """One head: q [l, e], k [s, e], v [s, ev], mask None or [l, s] (bool or float32)."""
    t = chain(q, np.ascontiguousarray(k.T))
    if mask is not None and mask.dtype == np.bool_:  # the float mask torch makes of it
        mask = np.where(mask, f32(0), f32(-np.inf))
    if mask is not None:  # fma32 is for finite addends; t * scale + inf is inf
        with np.errstate(invalid="ignore"):
            t = np.where(np.isfinite(mask), fma32(t, scale, np.where(np.isfinite(mask), mask, 0)), t * scale + mask)
    else:
        t = t * scale
    if causal:
        t = np.where(np.arange(k.shape[0])[None, :] > np.arange(q.shape[0])[:, None], f32(-np.inf), t)
    out = np.zeros((q.shape[0], v.shape[1]), f32)
    for i in range(t.shape[0]):  # torch's online softmax over blocks of 512 keys
        m, z = f32(-np.inf), f32(0)
        for n in range(0, t.shape[1], 512):
            block = t[i, n : n + 512]
            b = block_max(block)
            m_new = m if m > b else b
            p = np.zeros_like(block)
            if m_new != -np.inf:
                p, z_block = softmax_weights(block - m_new)
                c = expf_glibc(float(m - m_new))
                z, m = fma32(c, z, z_block), m_new
                out[i] = out[i] * c if n else out[i]
            out[i] = context(p[None], v[n : n + 512], out[i : i + 1] if n else None)[0]
        out[i] = out[i] * (f32(1) / (z if z != 0 else f32(1)))
    return out


# ------------------------------------------------------------ helpers


def _model(tmp_path, op: str, inputs: dict, attrs: dict | None = None) -> qrt.Model:
    """One node; inputs maps port -> (dtype, shape list) of a run-time input."""
    b = GraphBuilder()
    b.output(b.node(op, {p: b.input(p, dt, shape) for p, (dt, shape) in inputs.items()}, attrs or {}))
    path = tmp_path / f"{op}.qrt"
    b.save(path)
    return qrt.load(path)


def _free(a: np.ndarray) -> tuple[str, list]:
    return (a.dtype.name, [None] * a.ndim)


def _builds() -> dict[str, str]:
    """One kernel variant for each build of the float ops this CPU runs (the variant picks it at prepare time)."""
    builds = {}
    for name, ok in K.kernel_variants().items():
        if ok:
            before = K._use_variant(name)
            builds.setdefault(K.AttentionOps().name, name)
            K._use_variant(before)
    return builds


BUILDS = _builds()


def _every_build(tmp_path, op, inputs: dict, attrs: dict | None = None) -> dict[str, np.ndarray]:
    """The op's output under every build (a model loaded under each variant)."""
    out = {}
    for build, variant in BUILDS.items():
        before = K._use_variant(variant)
        try:
            model = _model(tmp_path, op, {p: _free(a) for p, a in inputs.items()}, attrs)
            out[build] = model.run(inputs)
        finally:
            K._use_variant(before)
    return out


def _bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))


def _normal(*shape, sd: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * sd).astype(f32)


# ------------------------------------------------------------ matmul

# (a shape, b shape): odd sizes around the tile widths (16 and 32 columns, 4 rows), K = 1 and 0, batch
# dimensions broadcast both ways, a matrix against a batch; last columns past a multiple of 16 (run from a padded
# copy of b's) after whole tiles and a half tile, and behind column blocks of one tile (K = 2100)
MATMUL_SHAPES = [
    ((1, 1), (1, 1)),
    ((2, 9, 32), (2, 32, 57)),
    ((3, 2100), (2100, 50)),
    ((5, 3), (3, 33)),
    ((2, 7, 17), (2, 17, 16)),
    ((3, 1, 9, 40), (4, 40, 31)),
    ((6, 0), (0, 5)),
    ((2, 0, 4), (2, 4, 3)),  # no rows, no columns: the batch's matrices are empty
    ((2, 3, 4), (4, 0)),
    ((1, 13, 70), (70, 65)),
    ((4, 2, 3), (1, 3, 1)),
]


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES, ids=str)
def test_matmul_oracle_bits(tmp_path, threads, sa, sb):
    a, b = _normal(*sa), _normal(*sb)
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    a_b, b_b = np.broadcast_to(a, batch + sa[-2:]), np.broadcast_to(b, batch + sb[-2:])
    count = math.prod(batch)
    want = np.stack([chain(x, y) for x, y in zip(a_b.reshape(count, *sa[-2:]), b_b.reshape(count, *sb[-2:]))])
    for got in _every_build(tmp_path, "matmul", {"a": a, "b": b}).values():
        _bits(got, want.reshape(batch + (sa[-2], sb[-1])))


def test_matmul_against_torch(tmp_path):
    a, b = _normal(3, 2, 11, 300), _normal(2, 300, 45)
    got = _model(tmp_path, "matmul", {"a": _free(a), "b": _free(b)}).run({"a": a, "b": b})
    want = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
    bound = 2 * gamma(300) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)


def test_matmul_checks(tmp_path):
    model = _model(tmp_path, "matmul", {"a": ("float32", [None, None]), "b": ("float32", [None, None])})
    with pytest.raises(ValueError, match=r"a \[2, 3\] and b \[4, 5\] do not multiply"):
        model.run({"a": _normal(2, 3), "b": _normal(4, 5)})
    model = _model(tmp_path, "matmul", {"a": ("float32", [None, 2, 3]), "b": ("float32", [None, 3, 5])})
    with pytest.raises(ValueError, match=r"batch dimensions a \[2\], b \[3\] do not broadcast"):
        model.run({"a": _normal(2, 2, 3), "b": _normal(3, 3, 5)})
    with pytest.raises(FormatError, match="a has 3 columns, b 4 rows"):
        _model(tmp_path, "matmul", {"a": ("float32", [2, 3]), "b": ("float32", [4, 5])})
    with pytest.raises(FormatError, match="b must have rank >= 2"):
        _model(tmp_path, "matmul", {"a": ("float32", [2, 3]), "b": ("float32", [3])})
    with pytest.raises(FormatError, match="do not broadcast: 2 against 3"):
        _model(tmp_path, "matmul", {"a": ("float32", [2, 2, 3]), "b": ("float32", [3, 3, 5])})


# ------------------------------------------------------------ attention


def _case(batch_q, batch_kv, lq, s, e, ev, mask_shape=None, mask_kind="bool", sd=1.5):
    q, k, v = _normal(*batch_q, lq, e, sd=sd), _normal(*batch_kv, s, e, sd=sd), _normal(*batch_kv, s, ev)
    inputs = {"q": q, "k": k, "v": v}
    if mask_shape is not None:
        keep = RNG.random(mask_shape) > 0.3
        inputs["mask"] = keep if mask_kind == "bool" else np.where(keep, _normal(*mask_shape), f32(-np.inf))
    return inputs


# (q batch, k/v batch, L, S, E, Ev, mask shape or None, mask kind): odd sizes, L != S, S past one 256 block,
# batch broadcast between q and k/v, masks broadcast over heads, rows and batches; S past one block of 512
# keys (causal too) with E and S not multiples of the 8 x 8 blocks k is transposed in
ATTENTION_CASES = [
    ((1,), (1,), 1, 1, 1, 1, None, None),
    ((2, 3), (2, 3), 7, 9, 5, 6, (2, 1, 7, 9), "bool"),
    ((3,), (1,), 5, 17, 8, 3, (17,), "float"),
    ((2, 2), (2, 2), 6, 33, 32, 32, (2, 1, 1, 33), "float"),
    ((1,), (1,), 3, 300, 4, 5, (3, 300), "bool"),
    ((1,), (1,), 2, 1100, 3, 4, (2, 1100), "float"),
    ((2,), (2,), 9, 4, 3, 17, None, None),
    ((1,), (1,), 10, 700, 13, 9, None, None),
    ((2,), (1,), 4, 530, 16, 8, (2, 4, 530), "bool"),
]


def _reference(inputs, scale, causal, fn):
    """fn(q, k, v, mask) per head, over the broadcast batch."""
    q, k, v, mask = (inputs.get(p) for p in ("q", "k", "v", "mask"))
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    lq, s = q.shape[-2], k.shape[-2]
    heads = [np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, *a.shape[-2:]) for a in (q, k, v)]
    masks = None if mask is None else np.broadcast_to(mask, batch + (lq, s)).reshape(-1, lq, s)
    out = [fn(*h, None if masks is None else masks[i], scale, causal) for i, h in enumerate(zip(*heads))]
    return np.stack(out).reshape(batch + out[0].shape)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_attention_oracle_bits(tmp_path, threads, case, causal):
    *sizes, mask_shape, kind = case
    if causal and mask_shape is not None:
        return
    inputs = _case(*sizes, mask_shape=mask_shape, mask_kind=kind)
    scale = f32(1 / math.sqrt(inputs["q"].shape[-1]))
    want = _reference(inputs, scale, causal, attention_oracle)
    for got in _every_build(tmp_path, "attention", inputs, {"is_causal": causal}).values():
        _bits(got, want)


def test_padding_mask_of_finfo_min_bits(tmp_path):
    """HuggingFace's padding mask adds finfo(float32).min: exp(t - m) below -104 is +0 (taken so, not computed),
    a row of only such keys is an ordinary softmax of their scores, and scores 87 to 104 below the max give
    subnormal weights."""
    q, k, v = _normal(2, 3, 6, 8, sd=2.0), _normal(2, 3, 37, 8, sd=2.0), _normal(2, 3, 37, 5)
    mask = np.where(RNG.random((2, 1, 6, 37)) > 0.4, f32(0), np.finfo(f32).min)
    mask[0, 0, 2] = np.finfo(f32).min
    mask[1, 0, 3, 0] = 0
    mask[1, 0, 3, 1:8] = -np.linspace(80, 110, 7, dtype=f32)  # 80 .. 110 below key 0's score, about
    mask[1, 0, 3, 8:] = np.finfo(f32).min
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    want = _reference(inputs, f32(0.25), False, attention_oracle)
    for got in _every_build(tmp_path, "attention", inputs, {"scale": 0.25}).values():
        _bits(got, want)


def _heads_model(tmp_path, heads: int, e: int, ev: int, read_in_place: str, mask: np.ndarray | None,
                 causal: bool) -> qrt.Model:
    """A transformer's attention block: the ports in read_in_place (of q, k, v) come as [B, L, heads * e] and
    are reshaped to [B, L, heads, e] and permuted (0, 2, 1, 3) to heads, the others come as heads; the context
    is permuted back and reshaped to [B, L, heads * ev], as converted BERT layers do."""
    b = GraphBuilder()
    wired = {}
    for p, width in zip("qkv", (e, e, ev)):
        if p in read_in_place:
            x = b.input(p, "float32", [None, None, heads * width])
            wired[p] = b.node("permute", {"x": b.node("reshape", {"x": x}, {"shape": [0, 0, heads, width]})},
                              {"perm": [0, 2, 1, 3]})
        else:
            wired[p] = b.input(p, "float32", [None, heads, None, width])
    if mask is not None:
        wired["mask"] = b.input("mask", mask.dtype.name, [None] * mask.ndim)
    y = b.node("attention", wired, {"is_causal": causal})
    b.output(b.node("reshape", {"x": b.node("permute", {"x": y}, {"perm": [0, 2, 1, 3]})},
                    {"shape": [0, 0, heads * ev]}))
    b.save(tmp_path / "heads.qrt")
    return qrt.load(tmp_path / "heads.qrt")


# (batch, heads, L, S, E, Ev, the ports read in place, mask shape or None, mask kind): BERT's block at odd
# sizes (a head's rows strided by heads * E), q alone or k and v alone in the heads' layout, masks broadcast
HEADS_CASES = [
    (1, 3, 5, 5, 4, 4, "qkv", None, None),
    (2, 5, 7, 7, 6, 3, "qkv", (2, 1, 7, 7), "bool"),
    (3, 2, 9, 9, 8, 8, "qkv", (3, 1, 1, 9), "float"),
    (2, 4, 3, 11, 5, 7, "kv", (2, 4, 3, 11), "bool"),
    (1, 12, 17, 17, 32, 32, "q", (17,), "float"),
]


@pytest.mark.parametrize("case", HEADS_CASES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_plan_reads_heads_in_place_bits(tmp_path, threads, case, causal):
    """The execution plan's attention reads q, k, v through their permutes and writes its context through the
    one after it, in place: the oracle's bits from every build, and no permute left to run."""
    n, h, lq, s, e, ev, in_place, mask_shape, kind = case
    if causal and mask_shape is not None:
        return
    heads = _case((n, h), (n, h), lq, s, e, ev, mask_shape=mask_shape, mask_kind=kind)
    want = _reference(heads, f32(1 / math.sqrt(e)), causal, attention_oracle).transpose(0, 2, 1, 3)
    feeds = {p: np.ascontiguousarray(heads[p].transpose(0, 2, 1, 3).reshape(n, -1, h * heads[p].shape[-1]))
             if p in in_place else heads[p] for p in "qkv"}
    if mask_shape is not None:
        feeds["mask"] = heads["mask"]
    for variant in BUILDS.values():
        before = K._use_variant(variant)
        try:
            model = _heads_model(tmp_path, h, e, ev, in_place, feeds.get("mask"), causal)
            for _ in range(2):  # the first call runs the nodes one by one, the second the compiled program
                _bits(model.run(feeds), np.ascontiguousarray(want).reshape(n, lq, h * ev))
            key = tuple(feeds[i.name].shape for i in model._plan.graph.inputs)
            assert model._plan._executor.fallback_steps(key) == []  # no permute, no attention in Python
        finally:
            K._use_variant(before)


def _exact(q, k, v, mask, scale, causal):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    t = (q @ k.T) * float(scale)
    if mask is not None:
        t = t + mask if mask.dtype == np.float32 else np.where(mask, t, -np.inf)
    if causal:
        t = np.where(np.arange(k.shape[0])[None, :] > np.arange(q.shape[0])[:, None], -np.inf, t)
    m = t.max(axis=1, keepdims=True)
    p = np.where(np.isneginf(m), 0.0, np.exp(t - np.where(np.isneginf(m), 0, m)))
    z = np.where(np.isneginf(m[:, 0]), 1.0, p.sum(axis=1))
    return p @ v / z[:, None]


def _weight(q, k, v, mask, scale, causal):
    """W = sum_j p_j |v_j| / Z per output, and Delta / 2's parts per row: max_j S_j and max_j |t_j|."""
    exact = _exact(q, k, np.abs(v), mask, scale, causal)
    sums = float(scale) * (np.abs(q).astype(np.float64) @ np.abs(k).astype(np.float64).T)
    t = (q.astype(np.float64) @ k.astype(np.float64).T) * float(scale)
    if mask is not None and mask.dtype == np.float32:
        t = t + np.where(np.isfinite(mask), mask, 0)
    return np.concatenate([exact, sums.max(1, keepdims=True), np.abs(t).max(1, keepdims=True)], axis=1)


# exp_u20's relative error: at most 6.43 u on [-86, 0] (measured over every float there); below -86 its values and
# exp's are under 4.4e-38, nothing against Z >= 1. The tail's exp (correctly rounded) is within u.
EXP_ERR = 7 * U


def _bound(inputs, scale, causal, e, s, depth, extra_roundings):
    parts = _reference(inputs, scale, causal, _weight)
    w, s_max, t_max = parts[..., :-2], parts[..., -2:-1], parts[..., -1:]
    delta = 2 * (gamma(e) * s_max + gamma(2 + extra_roundings) * t_max)
    return w * (2 * (delta + EXP_ERR) + gamma(s) + gamma(depth) + U)


def _depth(n: int) -> int:
    return math.ceil(min(n, 256) / 16) + 3 + math.ceil(n / 256) - 1


@pytest.mark.parametrize("case", ATTENTION_CASES[1:], ids=str)
def test_attention_against_float64_and_torch(tmp_path, case):
    *sizes, mask_shape, kind = case
    inputs = _case(*sizes, mask_shape=mask_shape, mask_kind=kind, sd=1.0)
    q, k = inputs["q"], inputs["k"]
    e, s, scale = q.shape[-1], k.shape[-2], f32(0.3)
    got = _model(tmp_path, "attention", {p: _free(a) for p, a in inputs.items()}, {"scale": 0.3}).run(inputs)
    exact = _reference(inputs, scale, False, _exact)
    mine = _bound(inputs, scale, False, e, s, _depth(s), 0)
    assert np.all(np.abs(got - exact) <= mine)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(inputs[p]) for p in ("q", "k", "v")),
                                          attn_mask=None if mask_shape is None else torch.from_numpy(inputs["mask"]),
                                          scale=0.3).numpy()
    assert np.all(np.abs(got - want) <= mine + _bound(inputs, scale, False, e + 2, s, s, 2))


def _torch_sums_as_chains(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether torch's float products (MKL's sgemm, which picks its kernels by CPU) sum q k^T and a weights-by-v
    product of these heads' shapes as one fma chain each, as on the AVX-512 Xeon docs/NUMERICS.md measured. On
    a Zen 5 they do not at 2 to 11 and 33 to 35 keys (up to 8 ulps off in the scores at 5 keys), so torch's
    attention there is not this order's."""
    p = RNG.random((q.shape[-2], k.shape[-2])).astype(f32)
    pairs = [(q[0, 0], np.ascontiguousarray(k[0, 0].T)), (p, v[0, 0])]
    return all(np.array_equal((torch.from_numpy(a) @ torch.from_numpy(b)).numpy().view(np.int32),
                              chain(a, b).view(np.int32)) for a, b in pairs)


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="torch's vector kernels are x86's here"
)
@pytest.mark.parametrize("s", [5, 16])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "finfo_min"])
def test_bits_are_torchs_where_its_capabilities_agree(tmp_path, s, mask_kind):
    """torch's flash attention gives the same bits on its AVX2 and AVX-512 kernels below 8 keys (all its scalar
    tail) and at 16 (two vectors of 8 lanes or one of 16, folded alike): qrt, every build, gives those bits, at
    BERT's head size with HuggingFace's padding masks (bool, and float 0 / finfo.min) and a float mask of any
    values (torch fuses its scaling and add into an fma)."""
    q, k, v = _normal(2, 3, s, 32, sd=1.5), _normal(2, 3, s, 32, sd=1.5), _normal(2, 3, s, 32)
    if not _torch_sums_as_chains(q, k, v):
        pytest.skip(f"torch's sgemm (MKL) on this CPU does not sum {s}-key products as one fma chain")
    keep = np.arange(s)[None, None, None, :] < np.array([s, s - 2])[:, None, None, None]
    keep = np.broadcast_to(keep, (2, 1, s, s)).copy()
    masks = {"bool": keep, "finfo_min": np.where(keep, f32(0), np.finfo(f32).min), "float": _normal(2, 1, s, s)}
    inputs = {"q": q, "k": k, "v": v} | ({} if mask_kind is None else {"mask": masks[mask_kind]})
    m = None if mask_kind is None else torch.from_numpy(inputs["mask"])
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=m).numpy()
    for got in _every_build(tmp_path, "attention", inputs).values():
        _bits(got, want)


def test_fully_masked_rows_give_zero_as_torch(tmp_path):
    q, k, v = _normal(2, 3, 4), _normal(2, 5, 4), _normal(2, 5, 6)
    keep = RNG.random((2, 3, 5)) > 0.3
    keep[0, 1] = False
    keep[1, 2] = False
    add = np.where(keep, f32(0), f32(-np.inf))
    for mask in (keep, add):
        inputs = {"q": q, "k": k, "v": v, "mask": mask}
        got = _model(tmp_path, "attention", {p: _free(a) for p, a in inputs.items()}).run(inputs)
        want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v, mask))).numpy()
        assert np.all(got[0, 1] == 0) and np.all(got[1, 2] == 0)
        np.testing.assert_array_equal(want[0, 1], got[0, 1])
        assert np.all(np.isfinite(got))


@pytest.mark.parametrize("lq, s", [(3, 0), (0, 5)], ids=["no keys", "no queries"])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_no_keys_or_queries_as_torch(tmp_path, lq, s, mask_kind):
    """S = 0: every row an empty softmax, the context zero as torch's (the op's own step read an empty mask's
    first value through a null pointer and crashed); L = 0: an empty context (it failed reshaping it); every
    call, the plan's step too."""
    inputs = _case((2,), (2,), lq, s, 4, 6, None if mask_kind is None else (2, lq, s), mask_kind or "bool")
    want = F.scaled_dot_product_attention(*(torch.from_numpy(inputs[p]) for p in ("q", "k", "v")),
                                          attn_mask=None if mask_kind is None else torch.from_numpy(inputs["mask"]))
    model = _model(tmp_path, "attention", {p: _free(a) for p, a in inputs.items()})
    for _ in range(3):
        np.testing.assert_array_equal(model.run(inputs), want.numpy())


@pytest.mark.parametrize("s", [5, 16, 37, 128])
def test_nonfinite_scores_same_bits_on_every_build(tmp_path, s):
    """NaN and infinities in q, k, v and a float mask reach the softmax's max and exp (NaN scores, scores of
    +-inf, a max of +inf): every build gives the plain C build's NaNs where it has them and its bits elsewhere
    (a NaN's sign and payload are outside the contract, docs/NUMERICS.md section 4); its scalar exp_u20 is the
    oracle of the AVX2 and AVX-512 builds' intrinsics (torch_exp_rows.h). 9 query rows: a full tile and a part
    of one, as the exp runs them."""
    q, k, v, mask = _normal(2, 9, 8, sd=1.5), _normal(2, s, 8, sd=1.5), _normal(2, s, 3), _normal(2, 9, s)
    q[0, 1, 3], q[0, 2, 0], q[0, 7, 5] = np.nan, np.inf, -np.inf  # a NaN row, rows of +-inf scores
    mask[0, 3, s // 2], mask[0, 4, :2], mask[0, 8, 0] = np.inf, -np.inf, np.nan
    k[1, s - 1, 2], v[1, 0, 1] = -np.inf, np.inf  # batch 1: a key of +-inf scores, a value of inf
    outs = _every_build(tmp_path, "attention", {"q": q, "k": k, "v": v, "mask": mask})
    want = outs["portable"]
    assert np.isnan(want).any() and not np.isnan(want).all()
    for got in outs.values():
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        _bits(np.where(np.isnan(want), f32(0), got), np.where(np.isnan(want), f32(0), want))


@pytest.mark.parametrize("masked", [False, True], ids=["", "masked"])
@pytest.mark.parametrize("s", [1, 5, 15, 16, 17, 40])
def test_rows_of_nan_scores_as_torch(tmp_path, s, masked):
    """A query row whose every score is NaN, in torch's flash attention (4-D, ev = e): without a mask its max skips
    NaN past the whole vectors of 16 keys, so with fewer than 16 keys the row looks masked out and its context is
    0; from 16 on, and with a mask at any length, it is NaN. A row whose only NaN score lies past the whole
    vectors, which a mask leaves alone (or none), is NaN both ways. Every build, against torch's AVX-512 kernel (under
    its AVX2 one, 8 to 15 keys without a mask give NaN: the rule takes torch's vector width)."""
    q, k, v = _normal(1, 1, 3, 4, sd=1.5), _normal(1, 1, s, 4, sd=1.5), _normal(1, 1, s, 4)
    q[..., 0, 1] = np.nan  # row 0: every score NaN
    k[..., s - 1, 2] = np.nan  # every row's last score NaN
    inputs = {"q": q, "k": k, "v": v}
    if masked:
        inputs["mask"] = np.ones((1, 1, 3, s), bool)
        inputs["mask"][..., 1, : s // 16 * 16] = False  # row 1: the tail's keys only
    want = F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), attn_mask=torch.from_numpy(
        inputs["mask"]) if masked else None).numpy()
    if torch.backends.cpu.get_cpu_capability() != "AVX512" and not masked and 8 <= s < 16:
        # torch's AVX2 kernel (ATEN_CPU_CAPABILITY=avx2) has vectors of 8 keys, so the NaN row lies in a whole one
        # and stays NaN; qrt follows its AVX-512 kernel, as everywhere (module docstring)
        assert np.isnan(want[..., 0, :]).all()
        want[..., 0, :] = 0
    zero = s < 16 and not masked
    assert np.isnan(want[..., 0, :]).all() != zero and (want[..., 0, :] == 0).all() == zero
    for got in _every_build(tmp_path, "attention", inputs).values():
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.where(np.isnan(got), 0, got), np.where(np.isnan(want), 0, want))


def test_default_scale_is_torchs(tmp_path):
    """scale null: fl(1 / sqrt(E)) in double, rounded to float32, as torch's CPU kernel takes it; E = 5 is not a
    power of 4, so the rounding shows."""
    inputs = _case((2,), (2,), 3, 4, 5, 2)
    got = _model(tmp_path, "attention", {p: _free(a) for p, a in inputs.items()}).run(inputs)
    explicit = _model(tmp_path, "attention", {p: _free(a) for p, a in inputs.items()},
                      {"scale": float(f32(1 / math.sqrt(5)))}).run(inputs)
    _bits(got, explicit)


def test_attention_checks(tmp_path):
    def spec(q, k, v, mask=None, attrs=None):
        ins = {"q": ("float32", q), "k": ("float32", k), "v": ("float32", v)}
        if mask is not None:
            ins["mask"] = mask
        return _model(tmp_path, "attention", ins, attrs)

    with pytest.raises(FormatError, match="the same last dimension"):
        spec([2, 3, 4], [2, 5, 3], [2, 5, 6])
    with pytest.raises(FormatError, match="the same number of keys"):
        spec([2, 3, 4], [2, 5, 4], [2, 6, 6])
    with pytest.raises(FormatError, match="is_causal takes no mask"):
        spec([3, 4], [5, 4], [5, 6], ("bool", [3, 5]), {"is_causal": True})
    with pytest.raises(FormatError, match=r"does not broadcast to the scores .*: 4 against 5"):
        spec([3, 4], [5, 4], [5, 6], ("bool", [3, 4]))
    with pytest.raises(FormatError, match="expected bool or float32"):
        spec([3, 4], [5, 4], [5, 6], ("int32", [3, 5]))
    with pytest.raises(FormatError, match="'scale' must be float or int or null"):
        spec([3, 4], [5, 4], [5, 6], attrs={"scale": "x"})
    for scale in (1e39, -1e39):  # finite doubles beyond float32 (wider integers are refused as read)
        with pytest.raises(FormatError, match="scale must be null or finite in float32"):
            spec([3, 4], [5, 4], [5, 6], attrs={"scale": scale})
    model = spec([None, None, 4], [None, None, 4], [None, None, 6], ("bool", [None, None, None]))
    q, k, v = _normal(2, 3, 4), _normal(2, 5, 4), _normal(2, 5, 6)
    with pytest.raises(ValueError, match=r"mask \[2, 3, 4\] does not broadcast to the scores \[2, 3, 5\]"):
        model.run({"q": q, "k": k, "v": v, "mask": np.ones((2, 3, 4), bool)})
    with pytest.raises(ValueError, match="the same number of keys"):
        model.run({"q": q, "k": k, "v": _normal(2, 4, 6), "mask": np.ones((2, 3, 5), bool)})
    with pytest.raises(ValueError, match=r"batch dimensions q \[2\], k \[3\], v \[3\] do not broadcast"):
        model.run({"q": q, "k": _normal(3, 5, 4), "v": _normal(3, 5, 6), "mask": np.ones((3, 3, 5), bool)})


# ------------------------------------------------------------ conversion (torch.export front end)


class HeadsAttention(nn.Module):
    """Multi-head self-attention over matmuls of parameters, with a bool padding mask [B, 1, 1, L]."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.w = nn.Parameter(torch.randn(3, 12, 12, generator=g) / 3)
        self.wo = nn.Parameter(torch.randn(12, 7, generator=g) / 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, seq = x.shape[0], x.shape[1]
        q, k, v = (torch.matmul(x, self.w[i]).view(b, seq, 3, 4).transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, mask)
        return y.transpose(1, 2).reshape(b, seq, 12) @ self.wo


class CausalBmm(nn.Module):
    """bmm of the input with itself, then causal attention with keyword arguments, and attention with a float
    additive mask in HuggingFace's form (the mask positional, scale a keyword)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = torch.bmm(x, x.transpose(1, 2)) / 4  # [B, L, L]
        y = F.scaled_dot_product_attention(x, x, g, is_causal=True, scale=0.25)
        return F.scaled_dot_product_attention(y, g, g, g.tanh() * 3, scale=0.5)


class BufferMask(nn.Module):
    """A bool mask stored in the model (a buffer): the converter stores it as the float32 mask 0 / -inf."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keep", torch.ones(6, 6, dtype=torch.bool).tril())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x, attn_mask=self.keep)


def _convert(tmp_path, name, shapes, dtypes=None) -> qrt.Model:
    net = globals()[name]().eval()
    ckpt = str(tmp_path / f"{name}.pt")
    torch.save(net.state_dict(), ckpt)
    out = tmp_path / f"{name}.qrt"
    convert(ckpt, out, model=f"test_ops_attention:{name}", input_shapes=shapes, input_dtypes=dtypes,
            frontend="export")
    return net, qrt.load(out)


def _close_to_torch(got, want, scale_of):
    """Several products and attentions in a row, each within its reordering bound of torch's (above), the bounds
    compounding through the chain: measured at most 5.9 u of the outputs' largest magnitude over 20 draws of
    both models' inputs (ATen's default capability and avx2), so 16 u."""
    assert np.all(np.abs(got - want) <= 16 * U * scale_of)


def test_convert_heads_attention(tmp_path):
    net, model = _convert(tmp_path, "HeadsAttention", ["2,5?,12", "2,1,1,5?"], {"mask": "bool"})
    assert [n.op for n in model.graph.nodes].count("attention") == 1
    for b, seq in ((1, 3), (3, 13)):
        x, mask = torch.randn(b, seq, 12), torch.rand(b, 1, 1, seq) > 0.3
        mask[..., 0] = True
        got = model.run({"x": x.numpy(), "mask": mask.numpy()})
        with torch.no_grad():
            want = net(x, mask).numpy()
        _close_to_torch(got, want, np.abs(want).max())


def test_convert_causal_bmm(tmp_path):
    net, model = _convert(tmp_path, "CausalBmm", ["2,7?,5"])
    ops = [(n.op, n.attrs) for n in model.graph.nodes if n.op in ("matmul", "attention")]
    assert ops == [("matmul", {}), ("attention", {"scale": 0.25, "is_causal": True}),
                   ("attention", {"scale": 0.5, "is_causal": False})]
    for b, seq in ((1, 5), (2, 9)):
        x = torch.randn(b, seq, 5)
        got = model.run(x.numpy())
        with torch.no_grad():
            want = net(x).numpy()
        _close_to_torch(got, want, np.abs(want).max())


def test_convert_stored_bool_mask(tmp_path):
    net, model = _convert(tmp_path, "BufferMask", ["2,6,8"])
    (node,) = model.graph.nodes
    assert node.op == "attention" and model.graph.values[node.inputs["mask"]].dtype == "float32"
    for b in (1, 3):
        x = torch.randn(b, 6, 8)
        got = model.run(x.numpy())
        with torch.no_grad():
            want = net(x).numpy()
        _close_to_torch(got, want, np.abs(want).max())


def test_fx_and_export_front_ends_write_the_same_file(tmp_path):
    net = HeadsAttention()
    torch.save(net.state_dict(), tmp_path / "h.pt")
    files = []
    for frontend in ("fx", "export"):
        convert(tmp_path / "h.pt", tmp_path / f"{frontend}.qrt", model="test_ops_attention:HeadsAttention",
                input_shapes=["2,5?,12", "2,1,1,5?"], input_dtypes={"mask": "bool"}, frontend=frontend)
        files.append((tmp_path / f"{frontend}.qrt").read_bytes())
    assert files[0] == files[1]

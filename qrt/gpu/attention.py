"""matmul and attention on the device (in qrt.gpu.IMPLEMENTATIONS).

Bit-identical to the CPU backend (qrt/cpu/attention.py): qrt/cuda/attention.cu runs the CPU's chains, scaling,
masking and softmax order (qrt/kernels/attention_body.h); the checks and sizes are the CPU's (its ``product``
and ``heads``). The batch dimensions go to the kernels as sizes and per-operand strides, kernel arguments only,
so a step launches kernels and copies nothing (a CUDA graph captures it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..cpu.attention import default_scale, heads, product
from ..cpu.types import Prepare, Step
from ..graph import Node
from .runtime import blocks, check_size, cupy, kernel
from .tensor_ops import contiguous

BATCH_RANK = 6  # attention.cu's QRT_BATCH_RANK: values have rank <= 8
THREADS = 128  # an attention block: one query row
MAX_KEYS = 12288  # an attention row's scores in 48 KiB of shared memory
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2


def batch_args(batch: tuple, operands: list[tuple[tuple, int]]) -> list:
    """The batch sizes (innermost first, padded with 1s), then for each operand (its batch shape, elements per
    matrix) its stride in elements along each (0 where it is broadcast): attention.cu's QRT_SIZES, QRT_STRIDES."""
    pad = BATCH_RANK - len(batch)
    args = [np.uint32(d) for d in batch[::-1]] + [np.uint32(1)] * pad
    for shape, block in operands:
        index = np.broadcast_to(np.arange(math.prod(shape), dtype=np.int64).reshape(shape), batch)
        args += [np.int64(st // 8 * block) for st in index.strides[::-1]] + [np.int64(0)] * pad
    return args


def _matmul(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    def step(a, b):
        p = product(a.shape, b.shape)
        y = cupy().empty(p.batch + (p.m, p.n), np.float32)
        check_size("y", y.size)
        if y.size:
            kernel("attention.cu", "matmul_f32")(
                (blocks(y.size),), (256,),
                (contiguous(a, np.float32), contiguous(b, np.float32), y, np.uint64(y.size), np.uint32(p.m),
                 np.uint32(p.k), np.uint32(p.n),
                 *batch_args(p.batch, [(a.shape[:-2], p.m * p.k), (b.shape[:-2], p.k * p.n)])),
            )
        return (y,)

    return step


def _attention(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    scale, causal = node.attrs["scale"], node.attrs["is_causal"]

    def step(q, k, v, mask=None):
        cp = cupy()
        h = heads(q.shape, k.shape, v.shape, None if mask is None else mask.shape)
        if h.s > MAX_KEYS:
            raise ValueError(f"k has {h.s} keys; qrt's CUDA attention takes at most {MAX_KEYS}")
        y = cp.empty(h.batch + (h.lq, h.ev), np.float32)
        for name, a in (("q", q), ("k", k), ("v", v), ("y", y)):
            check_size(name, a.size)
        rows = math.prod(h.batch) * h.lq
        if rows * h.ev == 0:
            return (y,)
        kind, mask_shape = MASK_NONE, (1,)
        if mask is not None:
            kind = MASK_BOOL if mask.dtype == np.bool_ else MASK_FLOAT
            mask = contiguous(mask)
            mask = mask.reshape(mask.shape or (1,))
            if h.repeat:
                mask = cp.ascontiguousarray(cp.broadcast_to(mask, h.repeat))
            mask_shape = mask.shape
            check_size("mask", mask.size)
        rows_per_batch = mask_shape[-2] if len(mask_shape) >= 2 else 1
        operands = [(q.shape[:-2], h.lq * h.e), (k.shape[:-2], h.s * h.e), (v.shape[:-2], h.s * h.ev),
                    (mask_shape[:-2] if mask is not None else (), rows_per_batch * h.s)]
        kernel("attention.cu", "attention_f32")(
            (rows,), (THREADS,),
            (contiguous(q, np.float32), contiguous(k, np.float32), contiguous(v, np.float32),
             mask if mask is not None else np.uintp(0), np.int32(kind), np.uint32(h.stride),
             default_scale(h.e) if scale is None else np.float32(scale), np.int32(causal), y, np.uint32(h.lq),
             np.uint32(h.s), np.uint32(h.e), np.uint32(h.ev), *batch_args(h.batch, operands)),
            shared_mem=4 * h.s,
        )
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {"matmul": _matmul, "attention": _attention}

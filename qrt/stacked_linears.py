"""Dynamic linears that read one input, run by an execution plan as one product (qrt/plan.py).

A transformer's query, key and value projections read the same input with the same quantization settings. The
input's quantization parameters come from the whole input, so they are the same for each; the integer product
and its epilogue are per output column. So one DynamicLinear over the weights stacked [sum N, K], with each
column's own scale, zero point and bias, quantizes the input once and gives every column the bits its own linear
gives. A linear without bias among linears with one gets bias -0.0: fma(a, s, -0.0) and fl(a * s) + -0.0 are
fl(a * s), zeros' signs included (the kernels' own rule for no bias). The outputs are column slices of one
[M, sum N] matrix, rows sum N apart, so only consumers that take a row stride read them (the plan's attention
steps). Where every reader takes them by heads, the columns go head by head (q, k and v of head 0, then of head
1, ...): a head's q, k and v lie side by side, and a product whose threads split its columns (one batch, whose
heads the attention splits across the same threads) writes on each thread the heads that thread's attention
task reads next (all-MiniLM-L6-v2, 128 tokens, 2 threads: 2.452 -> 2.369 ms a call, the attention 142 -> 133
us a layer, docs/PERFORMANCE.md).

all-MiniLM-L6-v2, 128 tokens, one thread, amx-int8: three 128x384->384 products 3 x 23.9 us, one
128x384->1152 60.6 us; at two threads 3 x 26.3 us against 43.0 us (a small product splits poorly).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from .graph import Node


def shared_input_groups(nodes: Sequence[Node], kernels: Sequence[Any], consts: Mapping[str, Any],
                        root: Callable[[str], str], skip: Collection[int]) -> list[tuple[int, ...]]:
    """The int8 linear_dynamic nodes (not in skip: a ReLU runs in their epilogue) that read one input value
    (root: through views) with the same reduce_range, engine and activation rule, in groups of two or more, in
    node order."""
    groups: dict[tuple, list[int]] = {}
    for i, node in enumerate(nodes):
        kernel = kernels[i]
        if (node.op != "linear_dynamic" or i in skip or kernel is None or not kernel.is_int8
                or any(v not in consts for p, v in node.inputs.items() if p != "x")):
            continue
        a = node.attrs
        key = (root(node.inputs["x"]), kernel.in_features, a["reduce_range"], a["engine"], a["activation"])
        groups.setdefault(key, []).append(i)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def stacked_linear(members: Sequence[Node], consts: Mapping[str, Any], heads: int = 1) -> Any:
    """One K.DynamicLinear computing the members' outputs side by side, in `heads` blocks of columns: block h holds
    each member's h-th 1/heads of its columns in member order (heads 1: the members' columns one after the other).
    Their weights are unpacked from the file's packed layout into a new stacked matrix (the mapped file is only
    read), packed again by the kernel: sum N x K bytes more (BERT base's 3 x 768 x 768 a layer: 1.7 MiB;
    all-MiniLM-L6-v2: 6 x 432 KiB)."""
    from .cpu.linear import dynamic_linear  # here: qrt.cpu imports qrt.plan, which imports this module

    weights, scales, zero_points, biases = [], [], [], []
    for node in members:
        c = {p: consts[v] for p, v in node.inputs.items() if v in consts}
        w = np.asarray(c["weight"])  # a PackedMatrix gives the plain matrix, a copy
        n = w.shape[0]
        weights.append(w)
        scales.append(np.broadcast_to(np.asarray(c["weight_scale"], np.float32), (n,)))
        zero_points.append(np.broadcast_to(np.asarray(c["weight_zero_point"], np.int32), (n,)))
        biases.append(np.asarray(c["bias"], np.float32) if "bias" in c else np.full(n, -0.0, np.float32))

    def by_heads(parts: list[np.ndarray]) -> np.ndarray:  # each part's rows in `heads` blocks, block by block
        blocks = np.concatenate([p.reshape(heads, -1, *p.shape[1:]) for p in parts], axis=1)
        return blocks.reshape(-1, *parts[0].shape[1:])

    stacked = {"weight": by_heads(weights), "weight_scale": by_heads(scales),
               "weight_zero_point": by_heads(zero_points)}
    if any("bias" in node.inputs for node in members):
        stacked["bias"] = by_heads(biases)
    a = members[0].attrs
    return dynamic_linear(stacked, a["reduce_range"], engine=a["engine"], activation=a["activation"])

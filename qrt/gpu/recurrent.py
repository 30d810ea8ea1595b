"""The recurrent ops on the device: cell steps and whole sequences, as qrt._kernels.Recurrent.

The gates run the CPU's own sigmoid and tanh (qrt/kernels/gate_math.h compiled as device code,
qrt/cuda/gates.cuh), so both backends give the same bits. Layers and directions are arranged once
for both backends (qrt/recurrent.py). A sequence with int8 W_hh runs as one persistent kernel
(qrt/cuda/rnn_persistent.cu) where its slice of W_hh fits each block's shared memory, else as a
loop of launches. The float ops (``*_float``) run the same gates and loops over float32 linears in
the CPU's fixed fma order (linear_chain.cu's linear_f32, as linear_float).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Node
from ..recurrent import check_state_batches, layer_runs, recurrent_kind, run_sequence
from .linear import ChainLinear, DynamicLinearInt8, dynamic_linear
from .quantize import quantize_dynamic_pair
from .runtime import (
    add_check,
    blocks,
    check_size,
    cupy,
    dev,
    device_limits,
    kernel,
    max_threads_per_block,
    opt_in_shared,
    round_up,
)


class RNNCell:
    """One dynamic Elman RNN step; int8 weights run as two launches (quantize x and h, fused step)."""

    def __init__(self, ih: Any, hh: Any, relu: bool) -> None:
        self.ih, self.hh = ih, hh
        self.act = "relu" if relu else "tanh"
        self.fused = isinstance(ih, DynamicLinearInt8) and isinstance(hh, DynamicLinearInt8)

    def __call__(self, x: Any, h: Any) -> Any:
        cp = cupy()
        b, hidden = h.shape
        out = cp.empty((b, hidden), cp.float32)
        if b == 0 or hidden == 0:
            return out
        if not self.fused:
            gate_update(f"rnn_{self.act}", self.ih(x), self.hh(h), h, h, out, out)
            return out
        wi, wh = self.ih.w, self.hh.w
        qx, px, qh, ph = quantize_dynamic_pair(x, wi.kp, h, wh.kp, self.ih.qmax)
        mb = 1 if b == 1 else 2 if b == 2 else 4 if b <= 4 else 8
        args = ()
        for q, p, w in ((qx, px, wi), (qh, ph, wh)):
            args += (q, np.int32(w.kp), w.w, np.int32(w.k), w.wsum, w.wzp, w.xsum(q), np.int32(w.has_wzp), p, w.s_w,
                     w.bias, np.int32(w.has_bias))
        args += (np.int32(b), np.int32(hidden), out)
        grid = (-(-hidden // 8), min(-(-b // mb), 65535))
        kernel("rnn_cell.cu", f"rnn_step_{self.act}_{mb}")(grid, (256,), args)
        return out


def gate_update(kind: str, gi: Any, gh: Any, h: Any, c: Any, h_out: Any, c_out: Any, y: Any = None) -> None:
    """The elementwise step (rnn_cell.cu gate_update) from gates gi, gh [B, G*H].

    h_out/c_out may be h/c (updated in place). y: a [B, H] view with unit
    inner stride (a sequence's output at one step) that also receives h'.
    c and c_out are read and written by LSTM only.
    """
    b, hidden = h.shape
    n = b * hidden
    if n == 0:
        return
    check_size("the state", n)
    i32 = np.int32
    y_stride = y.strides[0] // y.itemsize if y is not None else 0
    kernel("rnn_cell.cu", f"gate_update_{kind}")(
        (blocks(n),), (256,),
        (gi, gh, h, c, h_out, c_out, h_out if y is None else y, i32(y_stride), i32(b), i32(hidden)),
    )


GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}

# The persistent sequence kernel: None takes it wherever it applies, True demands it (ValueError
# where it does not apply: tests), False runs the loop of launches.
PERSISTENT: bool | None = None
PERSISTENT_BLOCKS: int | None = None  # its grid, if set (the benchmark sweeps it); else sized by BLOCK_WORK
BLOCK_WORK = 16384  # dp4a per block and step the grid is sized for: fewer blocks make a cheaper barrier
PERSIST_THREADS, PROJ_ROWS = 512, 64  # rnn_persistent.cu
TILES = {1: (2, 1), 2: (2, 2), 4: (4, 4)}  # rnn_persistent.cu's entry points by batch: (RB, BB)


def _persistent_kernel(name: str) -> tuple[Any, int]:
    """rnn_persistent.cu's entry point, opted in to all the shared memory a block may have, and that amount."""
    fn = kernel("rnn_persistent.cu", name)
    return fn, opt_in_shared(fn)


def _mb(b: int) -> int:
    return 1 if b == 1 else 2 if b == 2 else 4


def _persistent_smem(gates: int, units: int, b: int, hidden: int, kp: int) -> int:
    """rnn_persistent.cu's PersistLayout: W_hh slice, q_h, h, gh, gi, c."""
    rb, bb = TILES[_mb(b)]
    rows = gates * units
    return (round_up(rows, rb) * kp + round_up(b, bb) * kp + round_up(4 * b * hidden, 16)
            + 2 * round_up(4 * rows * b, 16) + round_up(4 * b * units, 16))


def _persistent_failure(flags: Any) -> str | None:
    if flags[1] == 1:
        return ("the persistent recurrent kernel's grid barrier timed out: its blocks were not all resident at "
                "once (another process or stream holding SMs?); set qrt.gpu.recurrent.PERSISTENT = False")
    if flags[1] == 2:
        return "the persistent recurrent kernel got less shared memory than its layout needs (a bug in qrt)"
    return None


class Recurrent:
    """One direction of a dynamic recurrent layer on the device, as qrt._kernels.Recurrent.

    ``step`` is one cell step; ``sequence`` the whole time loop, launches only
    (no host synchronisation), its buffers allocated once per call: one
    persistent kernel (rnn_persistent.cu) where ``persistent_plan`` finds one
    that fits, else a loop of launches per step. For LSTM and GRU the input
    projection of all steps is one dynamic linear over T*B rows (torch
    quantizes it over the whole sequence); for RNN it is per step.
    """

    def __init__(self, kind: str, ih: Any, hh: Any) -> None:
        self.kind, self.gates = kind, GATES[kind]
        self.ih, self.hh = ih, hh
        self.hidden, self.input_size = hh.in_features, ih.in_features
        if hh.out_features != self.gates * self.hidden or ih.out_features != hh.out_features:
            raise ValueError("Recurrent: weight shapes do not match the gate count")

    def step(self, x: Any, h: Any, c: Any) -> tuple[Any, Any]:
        """(h', c') from x [B, I], h and c [B, H] (pass h as c except for LSTM; c' is then h')."""
        cp = cupy()
        h_out = cp.empty(h.shape, cp.float32)
        c_out = cp.empty(h.shape, cp.float32) if self.kind == "lstm" else h_out
        if h.size:
            gate_update(self.kind, self.ih(x), self.hh(h), h, c, h_out, c_out)
        return h_out, c_out

    def sequence(self, x: Any, y: Any, y_offset: int, reverse: bool, h: Any, c: Any) -> None:
        """Run over x [T, B, I]; write h_t into y[t, :, y_offset:y_offset+H].

        h and c (C-contiguous [B, H]) hold the initial state on entry and the
        final state on return (pass h as c except for LSTM).
        """
        steps, b = x.shape[:2]
        if steps == 0 or b == 0 or self.hidden == 0:
            return
        plan = self.persistent_plan(steps, b, y)
        if isinstance(plan, str):
            if PERSISTENT:
                raise ValueError(f"Recurrent: the persistent kernel does not apply: {plan}")
            self._loop(x, y, y_offset, reverse, h, c)
        else:
            self._persistent(x, y, y_offset, reverse, h, c, *plan)

    def persistent_plan(self, steps: int, b: int, y: Any) -> tuple[int, int, int] | str:
        """(blocks, units per block, shared memory bytes) of rnn_persistent.cu, or why it does not apply."""
        hh, hidden = self.hh, self.hidden
        if PERSISTENT is False:
            return "PERSISTENT is False"
        if not isinstance(hh, DynamicLinearInt8) or hh.w.has_wzp:
            return "W_hh is not int8 without zero points"
        if self.gates == 1 and (not isinstance(self.ih, DynamicLinearInt8) or self.ih.w.has_wzp or not self.input_size):
            return "an RNN's W_ih is not int8 without zero points"
        if self.gates == 1 and steps > 65535:
            return "more steps than rnn_input_proj's grid has rows"
        if steps < 2:
            return "one step"  # the kernel reads h at step 0 and writes it at the last step
        if y.strides[0] != b * y.strides[1]:
            return "y is not C-contiguous"
        check_size("the state", b * hidden)
        sms = device_limits()[0]
        fn, limit = _persistent_kernel(f"rnn_persistent_{self.kind}_{_mb(b)}")
        if max_threads_per_block(fn) < PERSIST_THREADS:
            return "the kernel's registers do not allow its block size"
        if self.gates == 1 and round_up(b, TILES[_mb(b)][1]) * self.ih.w.kp > limit:
            return "the quantized input of a step does not fit shared memory"
        dots = self.gates * hidden * round_up(b, TILES[_mb(b)][1]) * hh.w.kp // 4
        grid = PERSISTENT_BLOCKS or -(-dots // BLOCK_WORK)
        for units in range(-(-hidden // min(grid, sms, hidden)), 0, -1):  # fewer units per block until it fits
            blocks_ = -(-hidden // units)
            if blocks_ > sms or steps * blocks_ >= 2**32:  # one block per SM: all resident
                break
            smem = _persistent_smem(self.gates, units, b, hidden, hh.w.kp)
            if smem <= limit:
                return blocks_, units, smem
        return "the state or W_hh does not fit the blocks' shared memory"

    def _persistent(self, x: Any, y: Any, y_offset: int, reverse: bool, h: Any, c: Any, grid: int, units: int,
                    smem: int) -> None:
        cp = cupy()
        steps, b = x.shape[:2]
        hidden, hh, i32 = self.hidden, self.hh.w, np.int32
        if self.gates == 1:  # each step's input quantized on its own, all steps in one launch
            ih, x = self.ih.w, cp.ascontiguousarray(x)
            gi_all = cp.empty((steps * b, hidden), cp.float32)
            fn, _ = _persistent_kernel(f"rnn_input_proj_{_mb(b)}")
            fn((-(-hidden // PROJ_ROWS), steps), (PERSIST_THREADS,),
               (x, i32(b), i32(ih.k), i32(ih.kp), ih.w, i32(hidden), ih.wsum, ih.s_w, ih.bias, i32(ih.has_bias),
                i32(self.ih.qmax), gi_all),
               shared_mem=round_up(b, TILES[_mb(b)][1]) * ih.kp)
        else:  # one matrix product, quantized over all steps at once
            gi_all = self.ih(x.reshape(steps * b, self.input_size))
        sync = cp.zeros(2, cp.uint32)  # barrier counter and abort flag, zeroed per call (a memset node)
        fn, _ = _persistent_kernel(f"rnn_persistent_{self.kind}_{_mb(b)}")
        fn((grid,), (PERSIST_THREADS,),
           (gi_all, hh.w, i32(hh.kp), i32(hidden), hh.wsum, hh.s_w, hh.bias, i32(hh.has_bias), i32(self.hh.qmax), h,
            c, y[0, :, y_offset:], i32(y.strides[1] // y.itemsize), i32(steps), i32(b), i32(units), i32(reverse),
            sync),
           shared_mem=smem)
        add_check(sync, _persistent_failure)

    def _loop(self, x: Any, y: Any, y_offset: int, reverse: bool, h: Any, c: Any) -> None:
        """The time loop as launches: per step the dynamic linear of h and the gates."""
        cp = cupy()
        steps, b = x.shape[:2]
        hidden, rows = self.hidden, self.gates * self.hidden
        whole = self.kind in ("lstm", "gru")
        if whole:  # one matrix product, quantized over all steps at once
            gi_all = self.ih(x.reshape(steps * b, self.input_size))
        else:
            gi, ih_ws = cp.empty((b, rows), cp.float32), self.ih.workspace(b)
        gh, hh_ws = cp.empty((b, rows), cp.float32), self.hh.workspace(b)
        for s in range(steps):
            t = steps - 1 - s if reverse else s
            if whole:
                gi = gi_all[t * b : (t + 1) * b]  # contiguous rows of step t
            else:
                self.ih(x[t], gi, ih_ws)
            self.hh(h, gh, hh_ws)
            gate_update(self.kind, gi, gh, h, c, h, c, y[t, :, y_offset : y_offset + hidden])


# (consts, attrs) -> linear(consts, prefix) for the weight set at prefix ('ih_', 'l0_reverse_hh_', ...): the
# op family's linears, dynamic quantized or float32 (linear_float's chains, as the CPU's K.DynamicLinear)
Linears = Callable[[Mapping[str, Any]], Callable[[Mapping[str, np.ndarray], str], Any]]


def _dynamic(attrs: Mapping[str, Any]) -> Callable[[Mapping[str, np.ndarray], str], Any]:
    return lambda c, prefix: dynamic_linear(c, attrs["reduce_range"], prefix)


def _float(attrs: Mapping[str, Any]) -> Callable[[Mapping[str, np.ndarray], str], Any]:
    return lambda c, prefix: ChainLinear(c[f"{prefix}weight"], c.get(f"{prefix}bias"), half=False)


def _rnn_cell(linears: Linears) -> Prepare:
    """rnn_cell_*: one Elman step (int8 weights fused, rnn_cell.cu)."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        linear = linears(node.attrs)
        cell = RNNCell(linear(c, "ih_"), linear(c, "hh_"), node.attrs["nonlinearity"] == "relu")

        def step(x, h):
            check_state_batches(x, {"h": h})
            return (cell(dev(x, np.float32), dev(h, np.float32)),)

        return step

    return prepare


def _cell(op_kind: str, linears: Linears) -> Prepare:
    """lstm/gru_cell_*: one step, states in and new states out."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        linear = linears(node.attrs)
        cell = Recurrent(recurrent_kind(op_kind, node.attrs), linear(c, "ih_"), linear(c, "hh_"))

        def step(x, h, c_state=None):
            check_state_batches(x, {"h": h} if c_state is None else {"h": h, "c": c_state})
            c_in = h if c_state is None else c_state
            if h.shape != c_in.shape:
                raise ValueError(f"h has shape {list(h.shape)} but c has shape {list(c_in.shape)}")
            h = dev(h, np.float32)
            h_out, c_out = cell.step(dev(x, np.float32), h, h if c_state is None else dev(c_state, np.float32))
            return (h_out,) if c_state is None else (h_out, c_out)

        return step

    return prepare


def _sequence(op_kind: str, linears: Linears) -> Prepare:
    """rnn/lstm/gru_*: every layer and direction, each time loop launched without synchronisation."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        runs = layer_runs(op_kind, node.attrs, c, Recurrent, linears(node.attrs))
        ports = [p for p in ("h0", "c0") if p in node.inputs]  # by port: c0 alone starts h at zeros

        def step(x, *states):
            given = dict(zip(ports, states))
            initial = [None if given.get(p) is None else dev(given[p], np.float32) for p in ("h0", "c0")]
            return run_sequence(runs, node.attrs, op_kind == "lstm", dev(x, np.float32), initial, cupy(),
                                check_size)

        return step

    return prepare


IMPLEMENTATIONS: dict[str, Prepare] = {
    op: make
    for family, linears in (("dynamic", _dynamic), ("float", _float))
    for op, make in (
        (f"rnn_cell_{family}", _rnn_cell(linears)),
        *((f"{kind}_cell_{family}", _cell(kind, linears)) for kind in ("lstm", "gru")),
        *((f"{kind}_{family}", _sequence(kind, linears)) for kind in ("rnn", "lstm", "gru")),
    )
}

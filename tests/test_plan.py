"""Execution plans (qrt/plan.py, qrt/_plan.pxi): the same bits as the per-node path, op by op and fused."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import qrt
from qrt import _kernels as K
from qrt import format as qformat
from qrt.builder import GraphBuilder
from qrt.plan import Plan, build_plan

RNG = np.random.default_rng(20)


def _plan(model: qrt.Model, steps=None) -> Plan:
    """The plan of a loaded model, over the model's own prepared steps (or the given ones)."""
    tensors = qformat.load_file(model.path).tensors
    return build_plan(model.graph, tensors, steps or [s[1] for s in model._steps])


def _load(tmp_path, g: GraphBuilder, name: str = "m") -> qrt.Model:
    path = tmp_path / f"{name}.qrt"
    g.save(path)
    return qrt.load(path)


def _same(a, b) -> None:
    """Same dtype, shape and bytes (NaN payloads included: the plan runs the same code)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _check(model: qrt.Model, plan: Plan, inputs: list[np.ndarray], calls: int = 3) -> None:
    """The plan's outputs equal Model.run's (the per-node path) on the first call (which compiles the
    program) and the later ones (which run it)."""
    want = model.run(inputs if len(inputs) > 1 else inputs[0])
    want = list(want) if isinstance(want, tuple) else [want]
    for _ in range(calls):
        got = plan.run(inputs)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
    assert plan._executor.has_program(tuple(a.shape for a in inputs))


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _dyn_weight(n: int, k: int, prefix: str = "", kind: str = "tensor") -> dict:
    if kind == "float16":
        ports = {f"{prefix}weight": (RNG.standard_normal((n, k)) * 0.1).astype(np.float16)}
    else:
        ports = {f"{prefix}weight": RNG.integers(-128, 128, (n, k)).astype(np.int8)}
        if kind == "channel":
            ports[f"{prefix}weight_scale"] = (RNG.random(n) * 0.01 + 0.001).astype(np.float32)
            ports[f"{prefix}weight_zero_point"] = np.zeros(n, np.int32)
        else:
            ports[f"{prefix}weight_scale"] = np.float32(0.004)
            ports[f"{prefix}weight_zero_point"] = np.int32(0)
    ports[f"{prefix}bias"] = _x(n)
    return ports


BATCHES = [1, 3, 8]


# ---------------------------------------------------------------- every op, alone and in chains


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_quantize_dequantize_per_tensor(tmp_path, dtype):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 37])
    zp = {"quint8": 3, "qint8": -5, "qint32": 11}[dtype]
    q = g.node("quantize_per_tensor", {"x": x, "scale": np.float32(0.03), "zero_point": np.int32(zp)},
               {"dtype": dtype})
    y = g.node("dequantize", {"x": q, "scale": np.float32(0.05), "zero_point": np.int32(zp)})
    g.output(q, y)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for b in BATCHES:
        _check(model, plan, [_x(b, 37) * 4])


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_quantize_dequantize_per_channel(tmp_path, dtype):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 5, 9])
    scale = (RNG.random(5) * 0.05 + 0.01).astype(np.float32)
    zps = RNG.integers(0 if dtype == "quint8" else -20, 20, 5).astype(np.int32)
    q = g.node("quantize_per_channel", {"x": x, "scale": scale, "zero_point": zps}, {"dtype": dtype, "axis": 1})
    y = g.node("dequantize", {"x": q, "scale": scale.astype(np.float64) * 1.5, "zero_point": zps}, {"axis": 1})
    g.output(q, y)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for b in BATCHES:
        _check(model, plan, [_x(b, 5, 9) * 2])


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_static_linear(tmp_path, relu, per_channel):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 45])
    q = g.node("quantize_per_tensor", {"x": x, "scale": np.float32(0.02), "zero_point": np.int32(64)},
               {"dtype": "quint8"})
    n = 19
    w_scale = (RNG.random(n) * 0.01 + 0.002).astype(np.float32) if per_channel else np.float32(0.005)
    w_zp = np.zeros(n, np.int32) if per_channel else np.int32(0)
    y = g.node("linear", {"x": q, "x_scale": np.float32(0.02), "x_zero_point": np.int32(64),
                          "weight": RNG.integers(-128, 128, (n, 45)).astype(np.int8), "weight_scale": w_scale,
                          "weight_zero_point": w_zp, "bias": _x(n), "y_scale": np.float32(0.1),
                          "y_zero_point": np.int32(60)}, {"relu": relu})
    g.output(g.node("dequantize", {"x": y, "scale": np.float32(0.1), "zero_point": np.int32(60)}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for b in BATCHES:
        _check(model, plan, [_x(b, 45)])


@pytest.mark.parametrize("kind", ["tensor", "channel", "float16", "float32"])
def test_linear_chain_with_relu(tmp_path, kind):
    """Linear-ReLU-Linear-ReLU-Linear (dynamic or float): the first ReLU fused, the second not (its
    linear's output is also an output of the model)."""
    g = GraphBuilder()
    v = g.input("x", "float32", [None, 33])
    sizes = [33, 65, 31, 7]
    outs = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        if kind == "float32":
            ports = {"weight": _x(n, k) * 0.2, "bias": _x(n)}
            v = g.node("linear_float", {"x": v, **ports})
        else:
            v = g.node("linear_dynamic", {"x": v, **_dyn_weight(n, k, kind=kind)})
        if i == 1:
            outs.append(v)
        if i < 2:
            v = g.node("relu", {"x": v})
    g.output(v, *outs)
    model = _load(tmp_path, g)
    plan = _plan(model)
    assert len(plan._relu_of) == 1
    for b in BATCHES:
        _check(model, plan, [_x(b, 33)])
    # rank 3 rows
    g2 = GraphBuilder()
    x = g2.input("x", "float32", [None, 4, 33])
    y = g2.node("linear_dynamic" if kind != "float32" else "linear_float",
                {"x": x, **(_dyn_weight(5, 33, kind=kind) if kind != "float32" else {"weight": _x(5, 33)})})
    g2.output(g2.node("relu", {"x": y}))
    model2 = _load(tmp_path, g2, "rank3")
    _check(model2, _plan(model2), [_x(3, 4, 33)])


def test_relu_keeps_nan_and_signed_zero(tmp_path):
    """relu (alone, and fused after a float linear whose outputs carry NaN and infinities) gives the same bits in
    the plan and node by node, and torch.relu's: -0.0 kept (qrt had made it +0.0, as numpy's maximum(x, 0)
    does), NaN kept."""
    import torch

    g = GraphBuilder()
    x = g.input("x", "float32", [None, 8])
    y = g.node("linear_float", {"x": x, "weight": np.eye(8, dtype=np.float32)})
    g.output(g.node("relu", {"x": y}), g.node("relu", {"x": x}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    assert plan._relu_of
    special = np.array([[-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, -1e-40, 3.5]] * 3, np.float32)
    _check(model, plan, [special])
    got, want = model.run(special)[1], torch.relu(torch.from_numpy(special)).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)].view(np.uint32), want[~np.isnan(want)].view(np.uint32))


@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm", "gru"])
def test_cells(tmp_path, kind):
    op = kind.split("_")[0]
    gates = {"rnn": 1, "lstm": 4, "gru": 3}[op]
    hidden, inp = 23, 17
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, inp]), "h": g.input("h", "float32", [None, hidden])}
    if op == "lstm":
        ports["c"] = g.input("c", "float32", [None, hidden])
    ports.update(_dyn_weight(gates * hidden, inp, "ih_"))
    ports.update(_dyn_weight(gates * hidden, hidden, "hh_", kind="channel"))
    attrs = {"nonlinearity": kind.split("_")[1]} if op == "rnn" else {}
    out = g.node(f"{op}_cell_dynamic", ports, attrs, name="cell")
    g.output(*(out if isinstance(out, tuple) else (out,)), as_tuple=True)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for b in BATCHES:
        states = [_x(b, hidden) * 0.5 for _ in range(2 if op == "lstm" else 1)]
        _check(model, plan, [_x(b, inp), *states])


def test_add_and_flatten(tmp_path):
    g = GraphBuilder()
    a = g.input("a", "float32", [None, 3, 5])
    b = g.input("b", "float32", [None, 3, 5])
    s = g.node("add", {"a": a, "b": b})
    f = g.node("flatten", {"x": s})
    g.output(g.node("linear_dynamic", {"x": f, **_dyn_weight(4, 15)}), f, g.node("flatten", {"x": a}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for n in BATCHES:
        _check(model, plan, [_x(n, 3, 5), _x(n, 3, 5)])


def test_outputs_are_new_arrays(tmp_path):
    """An output never shares memory with the plan's buffers or another call's output."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 6])
    y = g.node("relu", {"x": x})
    g.output(g.node("flatten", {"x": y}), x)
    model = _load(tmp_path, g)
    plan = _plan(model)
    x = _x(2, 6)
    first = plan.run([x])
    second = plan.run([x])
    third = plan.run([x])
    assert not np.shares_memory(second[0], third[0]) and not np.shares_memory(second[1], x)
    _same(first[0], third[0])


def test_large_outputs_start_on_a_cache_line(tmp_path):
    """A compiled program's outputs of 64 KiB or more start on a 64-byte boundary (numpy's allocator gives 16 bytes;
    a product writing past one takes up to 1.2x its time), are the caller's own arrays and hold the per-node path's
    bits. The call that compiles a shape's program answers through the per-node path, with numpy's arrays; so do
    compiled calls below the size (set past every size here), which own their memory."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 40])
    g.output(g.node("linear_dynamic", {"x": x, **_dyn_weight(256, 40)}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    assert K._set_line_aligned_bytes(65536) == 65536
    for rows in (64, 65, 100, 127, 300):
        x = _x(rows, 40)
        plan.run([x])
        outs = [plan.run([x])[0] for _ in range(3)]
        for y in outs:
            assert y.ctypes.data % 64 == 0 and y.flags.c_contiguous and y.flags.writeable and not y.flags.owndata
            _same(y, model.run(x))
        assert not np.shares_memory(outs[0], outs[1]) and not np.shares_memory(outs[1], outs[2])
    old = K._set_line_aligned_bytes(1 << 62)
    try:
        for rows in (64, 65, 100, 127, 300):
            x = _x(rows, 40)
            y = plan.run([x])[0]
            assert y.flags.owndata
            _same(y, model.run(x))
    finally:
        K._set_line_aligned_bytes(old)


# ---------------------------------------------------------------- fusion


def _dq_q_model(tmp_path, q_scale, dq_scale, dtype="quint8", zp=7, name="fold"):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 11])
    q = g.node("quantize_per_tensor", {"x": x, "scale": np.float32(0.05), "zero_point": np.int32(zp)},
               {"dtype": dtype})
    d = g.node("dequantize", {"x": q, "scale": np.float32(dq_scale), "zero_point": np.int32(zp)})
    q2 = g.node("quantize_per_tensor", {"x": d, "scale": np.float32(q_scale), "zero_point": np.int32(zp)},
                {"dtype": dtype})
    g.output(g.node("dequantize", {"x": q2, "scale": np.float32(0.5), "zero_point": np.int32(zp)}), q2)
    return _load(tmp_path, g, name)


@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
def test_dequantize_quantize_folded(tmp_path, dtype):
    model = _dq_q_model(tmp_path, 0.07, 0.07, dtype)
    plan = _plan(model)
    assert any(n.op == "quantize_per_tensor" and plan._folded(n) for n in model.graph.nodes)
    for b in BATCHES:
        _check(model, plan, [_x(b, 11) * 10])


def test_dequantize_quantize_not_folded(tmp_path):
    """Other parameters, or a scale whose round trip overflows, keep both steps."""
    for q_scale, dq_scale, name in ((0.07, 0.08, "differ"), (1e37, 1e37, "huge")):
        model = _dq_q_model(tmp_path, q_scale, dq_scale, name=name)
        plan = _plan(model)
        assert not any(plan._folded(n) for n in model.graph.nodes)
        _check(model, plan, [_x(4, 11) * 10])


def test_dequantize_quantize_per_channel_folded(tmp_path):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 3, 4])
    scale = np.array([0.1, 0.02, 0.3], np.float32)
    zp = np.array([0, 5, -3], np.int32)
    q = g.node("quantize_per_channel", {"x": x, "scale": scale, "zero_point": zp}, {"dtype": "qint8", "axis": 1})
    d = g.node("dequantize", {"x": q, "scale": scale, "zero_point": zp}, {"axis": 1})
    q2 = g.node("quantize_per_channel", {"x": d, "scale": scale, "zero_point": zp}, {"dtype": "qint8", "axis": 1})
    g.output(q2, d)
    model = _load(tmp_path, g)
    plan = _plan(model)
    assert any(plan._folded(n) for n in model.graph.nodes)
    _check(model, plan, [_x(5, 3, 4) * 3])


# ---------------------------------------------------------------- fallback


def test_glue_ops_run_through_the_fallback(tmp_path):
    """Ops with no native step (a sequence layer, numpy glue) run inside the plan, between native ones."""
    g = GraphBuilder()
    x = g.input("x", "float32", [6, None, 9])
    p = g.node("linear_dynamic", {"x": x, **_dyn_weight(12, 9)})
    ports = {"x": p, **_dyn_weight(3 * 8, 12, "l0_ih_"), **_dyn_weight(3 * 8, 8, "l0_hh_")}
    seq, h_n = g.node("gru_dynamic", ports, name="gru")
    t = g.node("permute", {"x": seq}, {"perm": [1, 0, 2]})  # a view that is not contiguous
    y = g.node("linear_dynamic", {"x": t, **_dyn_weight(5, 8)})
    last = g.node("select", {"x": y}, {"dim": 1, "index": -1})
    g.output(g.node("relu", {"x": last}), h_n)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for b in BATCHES:
        _check(model, plan, [_x(6, b, 9)])


def test_fallback_step_that_returns_views_and_changes_shape(tmp_path):
    """A fallback step may return a view of its input (its input then outlives it) or, data-dependent,
    another shape than at compile time (that call is answered by the per-node path)."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 8])
    a = g.node("relu", {"x": x})
    b = g.node("linear_dynamic", {"x": a, **_dyn_weight(8, 8)})  # its step replaced below by one with no kernel
    c = g.node("linear_dynamic", {"x": b, **_dyn_weight(3, 8)})
    g.output(c, b)
    model = _load(tmp_path, g)
    steps = [s[1] for s in model._steps]
    mode = {"shrink": False}

    def view_step(v):
        return (v[: v.shape[0] - 1] if mode["shrink"] else v.reshape(v.shape),)

    plan = _plan(model, steps=[steps[0], view_step, steps[2]])
    xs = _x(3, 8)
    want = [np.maximum(xs, 0)]
    for _ in range(3):
        out = plan.run([xs])
        _same(out[1], want[0])
        assert not np.shares_memory(out[1], xs)
    mode["shrink"] = True
    out = plan.run([xs])
    assert out[1].shape == (2, 8) and out[0].shape == (2, 3)


def test_errors_name_the_node(tmp_path):
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 8])
    y = g.node("linear_dynamic", {"x": x, **_dyn_weight(3, 8)}, name="fc")
    g.output(g.node("quantize_per_tensor", {"x": y, "scale": np.float32(0.1), "zero_point": np.int32(0)},
                    {"dtype": "quint8"}, name="q"))
    model = _load(tmp_path, g)
    plan = _plan(model)
    good = _x(2, 8)
    plan.run([good])
    bad = good.copy()
    bad[1, 3] = np.nan
    for runner in (model.run, lambda a: plan.run([a])):
        with pytest.raises(ValueError, match=r"node 'fc' \(linear_dynamic\): input contains NaN"):
            runner(bad)

    def failing(v):
        raise ValueError("no such thing")

    steps = [s[1] for s in model._steps]
    plan2 = _plan(model, steps=[failing, steps[1]])
    with pytest.raises(ValueError, match=r"node 'fc' \(linear_dynamic\): no such thing"):
        plan2.run([good])
    with pytest.raises(ValueError, match=r"node 'fc' \(linear_dynamic\): no such thing"):
        plan2.run([good])  # the program's fallback step (the first call ran the per-node path)


# ---------------------------------------------------------------- shapes, buffers, threads


def _mlp(tmp_path, sizes=(64, 96, 48, 10)) -> qrt.Model:
    g = GraphBuilder()
    v = g.input("x", "float32", [None, sizes[0]])
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        v = g.node("linear_dynamic", {"x": v, **_dyn_weight(n, k)})
        if i < len(sizes) - 2:
            v = g.node("relu", {"x": v})
    g.output(v)
    return _load(tmp_path, g, "mlp")


def test_shapes_change_between_calls(tmp_path):
    model = _mlp(tmp_path)
    plan = _plan(model)
    xs = {b: _x(b, 64) for b in (1, 5, 2)}
    for _ in range(3):
        for x in xs.values():
            _same(plan.run([x])[0], model.run(x))
    assert plan._executor.program_count() == 3
    # the executor's fast path (Model.run's and Stream.step's common call): only arrays a compiled
    # program reads as they are
    try_run = plan._executor.try_run
    _same(try_run([xs[5]])[0], model.run(xs[5]))
    assert try_run([_x(7, 64)]) is None  # no program for this batch yet
    assert try_run([xs[5].astype(">f4")]) is None
    assert try_run([_x(5, 128)[:, ::2]]) is None  # not contiguous
    assert try_run([xs[5], xs[5]]) is None
    with pytest.raises(ValueError, match="got 2 input"):
        plan.run([xs[1], xs[1]])


def test_empty_batch_uses_the_per_node_path(tmp_path):
    model = _mlp(tmp_path)
    plan = _plan(model)
    for _ in range(2):
        assert plan.run([np.zeros((0, 64), np.float32)])[0].shape == (0, 10)


def test_threads_share_one_model(tmp_path):
    model = _mlp(tmp_path)
    plan = _plan(model)
    inputs = [_x(1 + i % 3, 64) for i in range(8)]
    want = [model.run(x) for x in inputs]
    errors = []

    def worker(k):
        try:
            for r in range(150):
                i = (k + r) % len(inputs)
                got = plan.run([inputs[i]])[0]
                if got.tobytes() != want[i].tobytes():
                    errors.append((k, r))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---------------------------------------------------------------- streams


def _lstm_cell(tmp_path, hidden=16, inp=12):
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, inp]), "h": g.input("h", "float32", [None, hidden]),
             "c": g.input("c", "float32", [None, hidden])}
    ports.update(_dyn_weight(4 * hidden, inp, "ih_"))
    ports.update(_dyn_weight(4 * hidden, hidden, "hh_"))
    g.output(*g.node("lstm_cell_dynamic", ports, name="cell"), as_tuple=True)
    return _load(tmp_path, g, "lstm_cell")


def test_stream_steps_like_feeding_the_state_back(tmp_path):
    model = _lstm_cell(tmp_path)
    plan = _plan(model)
    frames = [_x(2, 12) for _ in range(7)]
    h = c = np.zeros((2, 16), np.float32)
    want = []
    for x in frames:
        h, c = model.run([x, h, c])
        want.append((h, c))
    stream = plan.stream()
    for _ in range(2):  # the second time after a reset
        for x, (wh, wc) in zip(frames, want):
            h, c = stream.step(x)
            _same(h, wh)
            _same(c, wc)
            assert stream.state["h"] is h and stream.state["c"] is c  # the state is the output, not a copy
            assert not h.flags.writeable
        stream.reset()
    stream.reset(state={"h": want[2][0], "c": want[2][1]})
    for x, (wh, wc) in zip(frames[3:], want[3:]):
        h, c = stream.step(x)
        _same(h, wh)
        _same(c, wc)
    with pytest.raises(ValueError, match="step takes 1 input"):
        stream.step([frames[0], frames[0]])


def test_stream_state_in_any_order_and_inputs_it_must_convert(tmp_path):
    """The stream's one-call step (arrays a program takes as they are) and its checked step (others) agree,
    with the state mapped in either order; inputs are checked as Model.run checks them (no silent cast)."""
    model = _lstm_cell(tmp_path)
    h_out, c_out = (s.name for s in model.graph.outputs)
    frames = [_x(2, 12) for _ in range(6)]
    h = c = np.zeros((2, 16), np.float32)
    want = []
    for x in frames:
        h, c = model.run([x, h, c])
        want.append((h, c))
    stream = _plan(model).stream({"c": c_out, "h": h_out})
    for i, (x, (wh, wc)) in enumerate(zip(frames, want)):
        given = [x, np.asfortranarray(np.repeat(x, 2, axis=1)[:, ::2])][i % 2]
        with pytest.raises(ValueError, match=r"input 'x': dtype is float64, expected float32"):
            stream.step(x.astype(np.float64))
        h, c = stream.step(given)
        _same(h, wh)
        _same(c, wc)
        assert stream.state["h"] is h and stream.state["c"] is c
        assert not h.flags.writeable and not c.flags.writeable


def test_stream_of_a_gru_cell(tmp_path):
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, 10]), "h": g.input("h", "float32", [None, 9])}
    ports.update(_dyn_weight(27, 10, "ih_"))
    ports.update(_dyn_weight(27, 9, "hh_"))
    g.output(g.node("gru_cell_dynamic", ports, name="cell"))
    model = _load(tmp_path, g)
    stream = _plan(model).stream()
    h = np.zeros((1, 9), np.float32)
    for _ in range(5):
        x = _x(1, 10)
        h = model.run([x, h])
        _same(stream.step(x), h)


# ---------------------------------------------------------------- what the caller gives and gets


def test_stream_checks_a_given_state_as_run_checks_inputs(tmp_path):
    """A state given to reset reaches nogil kernels: its shape and dtype are checked first, by name."""
    model = _lstm_cell(tmp_path)
    stream = model.stream()
    with pytest.raises(ValueError, match=r"input 'h': shape is \[2, 15\], expected \[\?, 16\]"):
        stream.reset({"h": np.zeros((2, 15), np.float32), "c": np.zeros((2, 16), np.float32)})
    with pytest.raises(ValueError, match=r"input 'c': dtype is float64, expected float32"):
        stream.reset({"h": np.zeros((2, 16), np.float32), "c": np.zeros((2, 16))})
    # the state's batches agree (h's was read as c's); the state given by name (a list was compared as arrays)
    with pytest.raises(ValueError, match=r"reset: 'h' has batch 2 but 'c' has batch 3"):
        stream.reset({"h": np.zeros((2, 16), np.float32), "c": np.zeros((3, 16), np.float32)})
    with pytest.raises(ValueError, match=r"reset: give the state by input name, a dict of \['h', 'c'\], not a list"):
        stream.reset([np.zeros((2, 16), np.float32)] * 2)
    # a fresh stream's first step checks its input before reading its batch from it (an AttributeError was raised)
    for bad in (None, {"x": _x(2, 12)}):
        with pytest.raises(ValueError, match=r"input 'x': expected a numpy.ndarray of float32, got"):
            model.stream().step(bad)
    # run names the state whose batch differs
    x, h = _x(2, 12), np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match=r"x has batch 2 but c has batch 3"):
        model.run([x, h, np.zeros((3, 16), np.float32)])


def test_stored_tensor_at_a_run_time_port(tmp_path):
    """A stored tensor may feed a run-time port (the constant operand of an op): the plan runs it."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 5])
    k = g.tensor("k", _x(3, 5))
    g.output(g.node("add", {"a": x, "b": g.node("relu", {"x": k})}))
    model = _load(tmp_path, g)
    a, k = _x(3, 5), qformat.load_file(model.path).tensors["k"]
    for _ in range(3):  # the first call compiles, the later ones run the program
        _same(model.run(a), a + np.maximum(k, 0))


def test_unaligned_input_is_accepted_on_every_call(tmp_path):
    g = GraphBuilder()
    g.output(g.node("linear_dynamic", {"x": g.input("x", "float32", [None, 9]), **_dyn_weight(4, 9)}))
    model = _load(tmp_path, g)
    a = _x(2, 9)
    unaligned = np.frombuffer(b"\0" + a.tobytes(), np.float32, count=a.size, offset=1).reshape(2, 9)
    assert not unaligned.flags.aligned
    for _ in range(3):
        _same(model.run(unaligned), model.run(a))


def test_int64_under_another_type_number_is_accepted_on_every_call(tmp_path):
    """np.longlong is int64 under a type number of its own (on Linux, where int64 is C long): the compiled program
    refused it from the second call on (its type number was compared, not its type)."""
    g = GraphBuilder()
    ids = g.input("ids", "int64", [None])
    g.output(g.node("embedding", {"indices": ids, "weight": _x(11, 4)}, {"bits": 32, "dim": 4}))
    model = _load(tmp_path, g)
    a = RNG.integers(0, 11, 5).astype(np.int64)
    other = a.astype(np.longlong)
    assert other.dtype == a.dtype
    for _ in range(3):
        _same(model.run(other), model.run(a))


def test_outputs_never_alias_inputs_or_each_other(tmp_path):
    """A view op's output is the caller's: writing it changes neither the input nor another output."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 2, 3])
    flat = g.node("flatten", {"x": x}, {"start_dim": 1}, name="flat")
    rows = g.node("reshape", {"x": x}, {"shape": [0, 6]}, name="rows")
    g.output(flat, rows, flat)
    model = _load(tmp_path, g)
    a = _x(4, 2, 3)
    for _ in range(3):
        outs = model.run(a)
        for i, o in enumerate(outs):
            assert not np.shares_memory(o, a)
            assert not any(np.shares_memory(o, p) for p in outs[:i])


# ---------------------------------------------------------------- whole sequences and the glue around them


def _sequence_graph(kind: str, layers: int, bidirectional: bool, batch_first: bool, states: tuple,
                    inp: int = 13, hidden: int = 11, weights: str = "tensor") -> GraphBuilder:
    """One rnn/lstm/gru_dynamic node over x (T and B free) and the given initial states, every output an output."""
    op = kind.split("_")[0]
    gates, dirs = {"rnn": 1, "lstm": 4, "gru": 3}[op], 2 if bidirectional else 1
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, None, inp])}
    for s in states:
        ports[s] = g.input(s, "float32", [layers * dirs, None, hidden])
    n_in = inp
    for n in range(layers):
        for d in range(dirs):
            prefix = f"l{n}_{'reverse_' if d else ''}"
            ports.update(_dyn_weight(gates * hidden, n_in, prefix + "ih_", kind=weights))
            hh = "channel" if weights == "tensor" else weights  # per-channel scales for one of the two
            ports.update(_dyn_weight(gates * hidden, hidden, prefix + "hh_", kind=hh))
        n_in = dirs * hidden
    attrs = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first}
    if op == "rnn":
        attrs["nonlinearity"] = kind.split("_")[1]
    g.output(*g.node(f"{op}_dynamic", ports, attrs, name="seq"))
    return g


def _sequence_inputs(model: qrt.Model, steps: int, batch: int) -> list[np.ndarray]:
    attrs = model.graph.nodes[0].attrs
    x = model.graph.inputs[0]
    shape = (batch, steps) if attrs["batch_first"] else (steps, batch)
    inputs = [_x(*shape, x.shape[2])]
    for spec in model.graph.inputs[1:]:
        inputs.append(_x(spec.shape[0], batch, spec.shape[2]) * 0.5)
    return inputs


def _no_fallback(plan: Plan, inputs: list[np.ndarray]) -> None:
    """The program for these inputs has no Python step, and no call so far was handed back to the
    per-node path (which would have given the expected bits without running the program's steps)."""
    assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []
    assert plan._executor.handed_back == 0


_KINDS_STATES = [(k, s) for k in ("rnn_tanh", "rnn_relu", "gru") for s in ((), ("h0",))] + [
    ("lstm", s) for s in ((), ("h0",), ("h0", "c0"))
]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(("kind", "states"), _KINDS_STATES)
def test_sequences(tmp_path, kind, states, layers, bidirectional, batch_first):
    """Every layer and direction in one native step, bit for bit as the per-node path (run_sequence)."""
    model = _load(tmp_path, _sequence_graph(kind, layers, bidirectional, batch_first, states))
    plan = _plan(model)
    for steps, batch in ((7, 1), (1, 1), (5, 3)):
        inputs = _sequence_inputs(model, steps, batch)
        _check(model, plan, inputs)
        _no_fallback(plan, inputs)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sequence_three_layers_float16_weights(tmp_path, kind):
    """Three layers (both layer buffers of the step's scratch in turn), weights float16."""
    for weights in ("tensor", "float16"):
        g = _sequence_graph(kind, 3, True, True, ("h0",), inp=9, hidden=17, weights=weights)
        model = _load(tmp_path, g, f"three_{weights}")
        plan = _plan(model)
        for batch in (1, 4):
            inputs = _sequence_inputs(model, 6, batch)
            _check(model, plan, inputs)
            _no_fallback(plan, inputs)


def test_lstm_given_c0_alone(tmp_path):
    """c0 without h0 is the initial c, h starting at zeros (states by port, not by position)."""
    from qrt.recurrent import run_sequence

    model = _load(tmp_path, _sequence_graph("lstm", 2, False, False, ("c0",)))
    plan = _plan(model)
    x, c0 = _sequence_inputs(model, 4, 2)
    _check(model, plan, [x, c0])
    node, step = model._steps[0][:2]
    want = run_sequence(step.runs, node.attrs, True, x, (np.zeros_like(c0), c0), np)
    for a, b in zip(plan.run([x, c0]), want):
        _same(a, b)


def test_sequence_projection_blocks(tmp_path):
    """The plan fixes its block of projected steps when it compiles: any block gives the same bits."""
    from qrt import _kernels as K

    model = _load(tmp_path, _sequence_graph("lstm", 2, True, False, ("h0", "c0")))
    inputs = _sequence_inputs(model, 9, 2)
    want = model.run(inputs)
    for block_bytes in (1, 2 * 4 * 11 * 4 * 3, 1 << 20):
        before = K._set_projection_bytes(block_bytes)
        try:
            plan = _plan(model)
            plan.run(inputs)  # compiles at this block
        finally:
            K._set_projection_bytes(before)
        for _ in range(2):
            for a, b in zip(plan.run(inputs), want):
                _same(a, b)


def test_sequence_errors_name_the_node(tmp_path):
    model = _load(tmp_path, _sequence_graph("gru", 2, False, False, ("h0",)))
    plan = _plan(model)
    inputs = _sequence_inputs(model, 5, 2)
    plan.run(inputs)
    bad = inputs[0].copy()
    bad[3, 1, 2] = np.inf
    for runner in (model.run, plan.run):
        for _ in range(2):
            with pytest.raises(ValueError, match=r"node 'seq' \(gru_dynamic\): input contains NaN or infinity"):
                runner([bad, inputs[1]])
    assert plan._executor.handed_back == 2


@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
@pytest.mark.parametrize("bits", [32, 8, 4])
def test_embedding(tmp_path, bits, index_dtype):
    """Embedding rows of int64 indices, and of int32 ones (positions a model computed in int32, widened a block
    of 256 at a time) natively; an index out of range named by the per-node step."""
    num, dim = 23, 7
    g = GraphBuilder()
    ids = g.input("ids", index_dtype, [None, None])
    if bits == 32:
        ports = {"weight": _x(num, dim)}
    else:
        width, dtype = (dim, np.float32) if bits == 8 else ((dim + 1) // 2, np.float16)
        ports = {"weight": RNG.integers(0, 256, (num, width), dtype=np.uint8),
                 "weight_scale": (RNG.random(num) * 0.1).astype(dtype), "weight_bias": _x(num).astype(dtype)}
    e = g.node("embedding", {"indices": ids, **ports}, {"bits": bits, "dim": dim}, name="emb")
    g.output(g.node("linear_dynamic", {"x": e, **_dyn_weight(5, dim)}), e)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for shape in ((1, 1), (4, 3), (3, 100)):
        inputs = [RNG.integers(0, num, shape).astype(index_dtype)]
        _check(model, plan, inputs)
        _no_fallback(plan, inputs)
    bad = np.array([[1, num, 2]], index_dtype)
    plan.run([bad * 0])
    for runner in (model.run, lambda a: plan.run([a])):
        with pytest.raises(ValueError, match=rf"node 'emb' \(embedding\): indices: {num} \(at flat position 1\)"):
            runner(bad)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_select_and_slice(tmp_path, dtype):
    g = GraphBuilder()
    x = g.input("x", dtype, [None, 5, 6])
    outs = [g.node("select", {"x": x}, {"dim": d, "index": i}) for d, i in ((0, -1), (1, 2), (1, -5), (2, 5))]
    for d, (start, end, step) in ((0, (0, None, 1)), (1, (1, 4, 1)), (1, (-4, 100, 2)), (2, (0, 6, 3)),
                                  (2, (-100, -1, 1)), (2, (5, 9, 4))):
        outs.append(g.node("slice", {"x": x}, {"dim": d, "start": start, "end": end, "step": step}))
    g.output(*outs)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for batch in (1, 3):
        a = _x(batch, 5, 6) * 50
        inputs = [a.astype(dtype)]
        _check(model, plan, inputs)
        _no_fallback(plan, inputs)


def test_softmax_and_views(tmp_path):
    """softmax and log_softmax along every dimension; reshape, squeeze, unsqueeze as aliases, also as
    outputs (each the caller's own array)."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 4, 5])
    outs = []
    for d in range(3):
        outs.append(g.node("softmax", {"x": x}, {"dim": d}))
        outs.append(g.node("log_softmax", {"x": x}, {"dim": d}))
    r = g.node("relu", {"x": x})
    u = g.node("unsqueeze", {"x": r}, {"dim": 1})
    v = g.node("reshape", {"x": u}, {"shape": [-1, 20]})
    s = g.node("squeeze", {"x": g.node("unsqueeze", {"x": v}, {"dim": 2})}, {"dims": [2]})
    outs += [r, u, v, s, g.node("linear_dynamic", {"x": v, **_dyn_weight(3, 20)})]
    g.output(*outs)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for batch in (1, 2):
        inputs = [_x(batch, 4, 5) * 10]
        _check(model, plan, inputs)
        _no_fallback(plan, inputs)
        got = plan.run(inputs)
        for i, o in enumerate(got):
            assert not any(np.shares_memory(o, p) for p in got[:i])


def _word_lm(tmp_path, ntoken=29, embed=12, hidden=10):
    """The shape of examples/word_language_model.py: embedding, 2-layer LSTM with (h, c), decoder,
    view(-1, ntoken), log_softmax."""
    g = GraphBuilder()
    ids = g.input("input", "int64", [None, None])
    h0 = g.input("hidden.0", "float32", [2, None, hidden])
    c0 = g.input("hidden.1", "float32", [2, None, hidden])
    g.input_nested(["input", ("hidden.0", "hidden.1")])
    e = g.node("embedding", {"indices": ids, "weight": RNG.integers(0, 256, (ntoken, embed), dtype=np.uint8),
                             "weight_scale": (RNG.random(ntoken) * 0.01).astype(np.float32),
                             "weight_bias": _x(ntoken) * 0.1}, {"bits": 8, "dim": embed})
    ports = {"x": e, "h0": h0, "c0": c0}
    for n, k in ((0, embed), (1, hidden)):
        ports.update(_dyn_weight(4 * hidden, k, f"l{n}_ih_"))
        ports.update(_dyn_weight(4 * hidden, hidden, f"l{n}_hh_"))
    y, h_n, c_n = g.node("lstm_dynamic", ports, {"num_layers": 2}, name="rnn")
    d = g.node("linear_dynamic", {"x": y, **_dyn_weight(ntoken, hidden)})
    logp = g.node("log_softmax", {"x": g.node("reshape", {"x": d}, {"shape": [-1, ntoken]})}, {"dim": 1})
    g.output_nested((logp, (h_n, c_n)))
    return _load(tmp_path, g, "word_lm")


def _keyword_spotter(tmp_path, n_mfcc=11, hidden=13, keywords=5):
    """The shape of examples/keyword_spotting.py: batch-first 2-layer GRU, out[:, -1], Linear, log_softmax."""
    g = GraphBuilder()
    x = g.input("mfcc", "float32", [None, None, n_mfcc])
    ports = {"x": x}
    for n, k in ((0, n_mfcc), (1, hidden)):
        ports.update(_dyn_weight(3 * hidden, k, f"l{n}_ih_"))
        ports.update(_dyn_weight(3 * hidden, hidden, f"l{n}_hh_"))
    y, _ = g.node("gru_dynamic", ports, {"num_layers": 2, "batch_first": True}, name="gru")
    last = g.node("select", {"x": y}, {"dim": 1, "index": -1})
    g.output(g.node("log_softmax", {"x": g.node("linear_dynamic", {"x": last, **_dyn_weight(keywords, hidden)})},
                    {"dim": 1}))
    return _load(tmp_path, g, "kws")


def test_recurrent_models_run_with_no_fallback(tmp_path):
    """The two models of issue 20's targets run every node natively (or as an alias), bit for bit."""
    lm = _word_lm(tmp_path)
    plan = _plan(lm)
    for steps, batch in ((1, 1), (35, 1), (6, 3)):
        state = (_x(2, batch, 10) * 0.3, _x(2, batch, 10) * 0.3)
        inputs = [RNG.integers(0, 29, (steps, batch)).astype(np.int64), *state]
        want = plan._per_node(inputs)
        for _ in range(3):
            for a, b in zip(plan.run(inputs), want, strict=True):
                _same(a, b)
            logp, (h, c) = lm.run((inputs[0], state))  # nested, as forward() takes it (the model's own plan)
            for a, b in zip((logp, h, c), want):
                _same(a, b)
        _no_fallback(plan, inputs)
    kws = _keyword_spotter(tmp_path)
    plan = _plan(kws)
    for batch, frames in ((1, 49), (3, 8)):
        inputs = [_x(batch, frames, 11)]
        _check(kws, plan, inputs)
        _no_fallback(plan, inputs)


def test_call_takes_what_model_run_takes(tmp_path):
    """Plan.call (Model.run's one native call): flat, nested as forward()'s arguments, or a dict of every
    input, at compiled shapes; the outputs nested as Model.run returns them; None for anything else."""
    lm = _word_lm(tmp_path)
    plan = lm._plan
    x = RNG.integers(0, 29, (4, 2)).astype(np.int64)
    h, c = _x(2, 2, 10), _x(2, 2, 10)
    assert plan.call((x, (h, c))) is None  # no program yet
    want = lm.run((x, (h, c)))  # compiles
    names = [s.name for s in lm.inputs]
    for given in ((x, (h, c)), [x, [h, c]], [x, h, c], dict(zip(names, (x, h, c)))):
        logp, (h_n, c_n) = plan.call(given)
        for a, b in zip((logp, h_n, c_n), (want[0], *want[1])):
            _same(a, b)
    for wrong in ((x, (h,)), (x, h), (x, (h, c), c), {"input": x, "hidden": (h, c)}, x, (x, (h, c.astype(np.float64)))):
        assert plan.call(wrong) is None
    kws = _keyword_spotter(tmp_path)
    clip = _x(1, 7, 11)
    want = kws.run(clip)
    _same(kws._plan.call(clip), want)
    _same(kws._plan.call([clip]), want)


def test_threads_share_a_sequence_model(tmp_path):
    """Each running call has its own arena: the sequence step's scratch and layer buffers included."""
    kws = _keyword_spotter(tmp_path)
    inputs = [_x(1 + i % 2, 5 + i % 3, 11) for i in range(6)]
    want = [kws.run(x) for x in inputs]
    errors = []

    def worker(k):
        try:
            for r in range(60):
                i = (k + r) % len(inputs)
                if kws.run(inputs[i]).tobytes() != want[i].tobytes():
                    errors.append((k, r))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert kws._plan._executor.handed_back == 0


def test_values_fixed_by_the_shapes_are_kept(tmp_path):
    """Nodes that read stored tensors, values fixed by the shapes, or only an input's shape (arange's x,
    expand's like) run once, at the call that compiles a program for these shapes; each set of shapes
    keeps its own values; nodes reading an input's values still run on every call."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None])
    positions = g.node("cast", {"x": g.node("arange", {"x": x}, {"dim": 1})}, {"dtype": "float32"}, name="pos")
    offset = g.node("expand", {"x": np.float32([[0.5]]), "like": x}, {"shape": [-1, -1], "like_dims": [0, 1]},
                    name="offset")
    shifted = g.node("add", {"a": g.node("add", {"a": x, "b": positions}), "b": offset})
    g.output(shifted, g.node("cast", {"x": x}, {"dtype": "int32"}, name="read"))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for shape in ((2, 5), (3, 7), (2, 5)):
        inputs = [_x(*shape)]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps((shape,)) == ["node 'read' (cast)"]  # x's values: every call
    # an output fixed by the shapes is the caller's: writing into the compiling call's changes no later call's
    g2 = GraphBuilder()
    ids = g2.input("ids", "int64", [None, None])
    g2.output(g2.node("expand", {"x": np.zeros((1, 1), np.int32), "like": ids},
                      {"shape": [-1, -1], "like_dims": [0, 1]}))
    types = _load(tmp_path, g2, "types")
    plan2 = _plan(types)
    first = plan2.run([np.ones((2, 3), np.int64)])[0]
    first += 7
    assert not plan2.run([np.ones((2, 3), np.int64)])[0].any()


def test_fixed_linear_with_its_relu_feeding_another(tmp_path):
    """A dynamic linear of a value fixed by the shapes (MarkupLM's xpath embeddings of a stored pad id
    expanded to the input's sizes) with its relu fused, read by a linear that is then fixed too: the relu's
    output is kept with its linear's (it was lost: a KeyError at the program's compile)."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, 6])
    pad = g.node("expand", {"x": _x(1, 1, 6), "like": x}, {"shape": [-1, -1, 6], "like_dims": [0, 1, None]})
    inner = g.node("relu", {"x": g.node("linear_dynamic", {"x": pad, **_dyn_weight(9, 6)})})
    g.output(g.node("add", {"a": x, "b": g.node("linear_dynamic", {"x": inner, **_dyn_weight(6, 9)})}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    assert len(plan._relu_of) == 1
    for shape in ((1, 4, 6), (3, 7, 6), (1, 4, 6)):
        _check(model, plan, [_x(*shape)])
        assert plan._executor.fallback_steps((shape,)) == []


def test_float_functions_and_layer_norm_run_natively(tmp_path):
    """gelu (both forms), the other float functions and layer_norm (with and without weight and bias, over one
    and two dimensions) are native steps: the per-node path's bits, nothing run in Python."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, 6, 5])
    y = g.node("layer_norm", {"x": x, "weight": _x(6, 5), "bias": _x(6, 5)}, {"normalized_dims": 2, "eps": 1e-5})
    y = g.node("gelu", {"x": y}, {"approximate": "none"})
    y = g.node("gelu", {"x": y}, {"approximate": "tanh"})
    y = g.node("layer_norm", {"x": g.node("sigmoid", {"x": y}), "weight": _x(5)}, {"normalized_dims": 1})
    y = g.node("layer_norm", {"x": g.node("silu", {"x": y})}, {"normalized_dims": 1, "eps": 0.5})
    g.output(g.node("tanh", {"x": y}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for shape in ((1, 3, 6, 5), (4, 7, 6, 5)):
        _check(model, plan, [_x(*shape) * 3])
        assert plan._executor.fallback_steps((shape,)) == []


def test_batch_norm_runs_natively(tmp_path):
    """batch_norm over [batch, channels] (a tabular model's, after a ReLU) and with positions after the channels is
    a native step: the per-node path's bits, nothing run in Python; a call with other channels is refused by the
    per-node step, naming them."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 6, None])
    stats = {p: g.tensor(p, np.abs(_x(6)) if p == "var" else _x(6)) for p in ("mean", "var", "weight", "bias")}
    y = g.node("batch_norm", {"x": x, **stats}, {"eps": 1e-3})
    rows = g.input("rows", "float32", [None, None])
    terms = {p: g.tensor(f"{p}9", np.abs(_x(9)) if p == "var" else _x(9)) for p in ("mean", "var", "weight", "bias")}
    g.output(y, g.node("batch_norm", {"x": g.node("relu", {"x": rows}), **terms}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for batch, length in ((1, 1), (5, 13)):
        inputs = [_x(batch, 6, length) * 3, _x(batch, 9)]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []
    with pytest.raises(ValueError, match=r"x has 8 channels \(dimension 1 of \[2, 8\]\), expected 9"):
        plan.run([_x(2, 6, 3), _x(2, 8)])


def test_residual_add_runs_in_the_layer_norm(tmp_path):
    """A layer_norm of an add of two operands of its input's shape, whose sum nothing else reads, is one step (the
    add's node runs no more): weight and bias or not, rows of an odd length, over two dimensions, an add of a value
    to itself, rows split across threads or not; the per-node path's bits. An add read elsewhere too, or one that
    broadcasts, runs as its own step."""
    g = GraphBuilder()
    x, r = g.input("x", "float32", [None, None, 37]), g.input("r", "float32", [None, None, 37])
    y = g.node("layer_norm", {"x": g.node("add", {"a": x, "b": r}, name="res1"), "weight": _x(37), "bias": _x(37)},
               {"normalized_dims": 1, "eps": 1e-5})
    y = g.node("layer_norm", {"x": g.node("add", {"a": g.node("gelu", {"x": y}, {"approximate": "none"}), "b": y},
                                          name="res2")}, {"normalized_dims": 2})
    kept = g.node("add", {"a": y, "b": x}, name="kept")  # also an output: its own step
    y = g.node("layer_norm", {"x": kept, "bias": _x(37)}, {"normalized_dims": 1})
    y = g.node("layer_norm", {"x": g.node("add", {"a": y, "b": g.input("c", "float32", [37])}, name="spread"),
                              "weight": _x(37)}, {"normalized_dims": 1})
    y = g.node("layer_norm", {"x": g.node("add", {"a": y, "b": y}, name="twice")}, {"normalized_dims": 1})
    g.output(y, kept)
    plan = _plan(_load(tmp_path, g))
    old_work, old_threads = K._set_min_float_work(1), K.get_num_threads()
    try:
        for threads, shape in ((1, (1, 7, 37)), (3, (5, 11, 37)), (3, (1, 2, 37))):  # (1, 2, 37): 2 rows, 1 over 2 dims
            K.set_num_threads(threads)
            inputs = [_x(*shape) * 3, _x(*shape), _x(37)]
            want = plan._per_node(inputs)
            for _ in range(2):  # compiles, then runs the program
                for a, b in zip(plan.run(inputs), want, strict=True):
                    _same(a, b)
            steps = {name for name, _, _ in plan.profile(inputs, 1)}
            assert {"kept", "spread"} <= steps and not {"res1", "res2", "twice"} & steps
    finally:
        K._set_min_float_work(old_work)
        K.set_num_threads(old_threads)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_arithmetic_and_sums_run_natively(tmp_path, op):
    """Float arithmetic with numpy broadcasting (either side, rank 1 to 4) and sum / mean over adjacent
    dimensions are native steps: the per-node path's bits, nothing run in Python."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 5, 1, 3])
    y = g.node(op, {"a": x, "b": g.input("b", "float32", [4, 1])})  # [n, 5, 4, 3]
    y = g.node(op, {"a": g.input("c", "float32", [3]), "b": y})
    s = g.node("sum", {"x": y}, {"dims": [1, 2], "keepdim": False})
    m = g.node("mean", {"x": y}, {"dims": [3], "keepdim": True})
    g.output(g.node(op, {"a": s, "b": s}), m)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for n in (1, 6):
        inputs = [_x(n, 5, 1, 3), _x(4, 1), _x(3)]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []


def test_stored_operands_run_natively(tmp_path):
    """Arithmetic with a stored operand (an RMS norm's weight, a stored scalar divisor, either side) and a where
    filling with a stored scalar are native steps: the per-node path's bits, nothing run in Python (they were all
    run there, T5's and MobileBERT's norms among them)."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, 6])
    keep = g.input("keep", "bool", [None, 1, None])
    y = g.node("mul", {"a": x, "b": g.tensor("weight", _x(6))})
    y = g.node("add", {"a": g.tensor("bias", _x(6)), "b": y})
    y = g.node("div", {"a": y, "b": g.tensor("scale", np.array(2.5, np.float32))})
    y = g.node("sub", {"a": g.tensor("shift", _x(1, 6)), "b": y})
    g.output(y, g.node("where", {"condition": keep, "a": x, "b": g.tensor("fill", np.array(-np.inf, np.float32))}))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for n, s in ((1, 6), (3, 5)):
        inputs = [_x(n, s, 6), RNG.integers(0, 2, (n, 1, 6)).astype(bool)]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []


def test_permute_where_matmul_and_cat_run_natively(tmp_path):
    """permute (float32, int64 and bool; the last dimension kept, as attention's heads move, or moved, as a
    transpose), where (condition and operands broadcast every way; float32 and int64; NaN and -0 kept as bits),
    matmul (batch dimensions broadcast, one side of rank 2, widths off the kernel's tiles) and cat / stack of two
    to four operands (along the first, a middle and a new last dimension) are native steps, on one thread and
    split across three: the per-node path's bits. A cat of five operands runs in Python."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, 4, 3])
    ids = g.input("ids", "int64", [None, None])
    keep = g.input("keep", "bool", [None, 1, None])
    heads = g.node("permute", {"x": x}, {"perm": [0, 2, 1, 3]})  # [n, 4, s, 3]
    turned = g.node("permute", {"x": x}, {"perm": [3, 1, 0, 2]})  # [3, s, n, 4]
    flipped = g.node("permute", {"x": ids}, {"perm": [1, 0]})
    mask_t = g.node("permute", {"x": keep}, {"perm": [2, 0, 1]})
    picked = g.node("where", {"condition": g.node("unsqueeze", {"x": keep}, {"dim": 1}),
                              "a": g.node("permute", {"x": x}, {"perm": [0, 2, 3, 1]}),
                              "b": g.input("other", "float32", [3, 1])})  # [n, 4, 3, s]
    whole = g.node("where", {"condition": keep, "a": ids, "b": g.node("unsqueeze", {"x": ids}, {"dim": 1})})
    scores = g.node("matmul", {"a": heads, "b": g.node("permute", {"x": heads}, {"perm": [0, 1, 3, 2]})})
    context = g.node("matmul", {"a": scores, "b": heads})  # [n, 4, s, 3]
    columns = g.node("permute", {"x": x}, {"perm": [1, 2, 3, 0]})  # [s, 4, 3, n]
    spread = g.node("matmul", {"a": g.input("w", "float32", [5, 3]), "b": columns})  # rank 2 @ rank 4: [s, 4, 5, n]
    joined = [g.node("cat", {"x0": heads, "x1": context}, {"dim": 2}),
              g.node("cat", {"x0": x, "x1": x, "x2": x, "x3": x}, {"dim": 0}),
              g.node("stack", {"x0": ids, "x1": ids, "x2": ids}, {"dim": 2}),
              g.node("cat", {f"x{i}": keep for i in range(5)}, {"dim": 1}, name="five")]
    g.output(heads, turned, flipped, mask_t, picked, whole, context, spread, *joined)
    model = _load(tmp_path, g)
    plan = _plan(model)
    old_work, old_threads = K._set_min_float_work(1), K.get_num_threads()
    try:
        for threads, (n, s) in ((1, (1, 3)), (3, (2, 37)), (3, (1, 1))):
            K.set_num_threads(threads)
            xs = _x(n, s, 4, 3)
            xs[0, 0, 0, :2] = [np.nan, -0.0]
            inputs = [xs, RNG.integers(-9, 9, (n, s)), RNG.integers(0, 2, (n, 1, s)).astype(bool), _x(3, 1), _x(5, 3)]
            _check(model, plan, inputs)
            assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == ["node 'five' (cat)"]
    finally:
        K._set_min_float_work(old_work)
        K.set_num_threads(old_threads)


def test_relative_position_gathers_read_one_block_of_index(tmp_path, monkeypatch):
    """A gather whose index is fixed by the shapes and repeats over leading dimensions (as DeBERTa's relative
    positions: an [L, L] block expanded over the heads) stores and checks one block (_index_period) and reads it
    for every head, with the per-node path's bits (float32, bool and int64); an index fixed by the shapes that
    differs head by head, and one given at run time, are read whole."""
    from qrt.plan import _index_period

    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, None])  # [H, L, 2L + H]
    flags = g.input("flags", "bool", [None, None, None])
    ids = g.input("ids", "int64", [None, None, None])
    given = g.input("given", "int64", [None, None, None])
    at = g.node("arange", {"x": x}, {"dim": 1})
    block = g.node("add_int", {"a": g.node("unsqueeze", {"x": at}, {"dim": 1}),
                               "b": g.node("unsqueeze", {"x": at}, {"dim": 0})})  # [L, L]: i + j
    heads = g.node("expand", {"x": g.node("unsqueeze", {"x": block}, {"dim": 0}), "like": x},
                   {"shape": [-1, -1, -1], "like_dims": [0, None, None]})  # [H, L, L]
    head = g.node("unsqueeze", {"x": g.node("unsqueeze", {"x": g.node("arange", {"x": x}, {"dim": 0})}, {"dim": 1})},
                  {"dim": 2})
    by_head = g.node("add_int", {"a": heads, "b": head})  # i + j + h
    outs = [g.node("gather", {"x": v, "index": heads}, {"dim": 2}) for v in (x, flags, ids)]
    outs += [g.node("gather", {"x": x, "index": index}, {"dim": 2}) for index in (by_head, given)]
    g.output(*outs)
    model = _load(tmp_path, g)
    plan = _plan(model)
    programs = []
    monkeypatch.setattr(K, "PlanProgram", lambda spec, made=K.PlanProgram: programs.append(spec) or made(spec))
    for h, n in ((1, 1), (3, 5), (12, 17)):
        xs = _x(h, n, 2 * n + h)
        inputs = [xs, xs > 0, RNG.integers(-(1 << 40), 1 << 40, xs.shape), RNG.integers(0, xs.shape[2], (h, n, n))]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []
        # stored: one [n, n] block of the index the three gathers share, and by_head's [h, n, n] whole
        stored = [info.size for kind, info, *_ in programs[-1]["slots"] if kind == K.Slot.SLOT_CONST]
        assert sorted(stored) == sorted([n * n, h * n * n])
    assert plan._executor.handed_back == 0  # no native step refused its operands
    index = np.broadcast_to(RNG.integers(0, 9, (1, 4, 5, 6)), (3, 2, 4, 5, 6))
    assert [_index_period(index, d) for d in range(5)] == [1, 1, 1, 4, 20]
    assert _index_period(index.reshape(6, 4, 5, 6), 3) == 20
    assert _index_period(index + np.arange(3).reshape(3, 1, 1, 1, 1), 4) == 120  # differs along the first


def test_products_compute_only_the_columns_a_gather_reads(tmp_path, monkeypatch):
    """A matmul of a stored b (rank 3, or rank 2 broadcast) whose output only a gather along its last dimension
    reads, at an index fixed by the shapes (DeBERTa's relative attention: scores against 2P relative positions,
    of which the gather takes 2L - 1), computes only the columns from the index's least to its largest: the
    per-node path's bits (each column's chain of sums is the same wherever it lies), and b stored as those
    columns only (an int32 index too, shifted as int64). A product also read elsewhere, or of a run-time b, is made
    whole."""
    heads, k, span = 3, 5, 20
    g = GraphBuilder()
    q = g.input("q", "float32", [heads, None, k])
    free = g.input("free", "float32", [heads, k, 2 * span])
    at = g.node("arange", {"x": q}, {"dim": 1})
    rel = g.node("sub_int", {"a": g.node("unsqueeze", {"x": at}, {"dim": 1}),
                             "b": g.node("unsqueeze", {"x": at}, {"dim": 0})})  # [L, L]: i - j
    index = g.node("expand", {"x": g.node("unsqueeze", {"x": g.node("add_int", {
        "a": rel, "b": g.tensor("span", np.array(span, np.int32))})}, {"dim": 0}), "like": q},
                   {"shape": [-1, -1, -1], "like_dims": [0, None, None]})  # [H, L, L]: i - j + P
    stored = g.tensor("pos", _x(heads, k, 2 * span))
    banded = g.node("gather", {"x": g.node("matmul", {"a": q, "b": stored}), "index": index}, {"dim": 2})
    shared = g.node("matmul", {"a": q, "b": g.tensor("pos2", _x(k, 2 * span))})  # rank 2, read twice
    twice = g.node("gather", {"x": shared, "index": index}, {"dim": 2})
    given = g.node("gather", {"x": g.node("matmul", {"a": q, "b": free}), "index": index}, {"dim": 2})
    narrow = g.node("cast", {"x": index}, {"dtype": "int32"})  # read as int64 shifted
    once = g.node("gather", {"x": g.node("matmul", {"a": q, "b": g.tensor("pos3", _x(k, 2 * span))}), "index": narrow},
                  {"dim": 2})
    g.output(banded, twice, shared, given, once)
    model = _load(tmp_path, g)
    plan = _plan(model)
    programs = []
    monkeypatch.setattr(K, "PlanProgram", lambda spec, made=K.PlanProgram: programs.append(spec) or made(spec))
    for n in (1, 6, 17):
        inputs = [_x(heads, n, k), _x(heads, k, 2 * span)]
        _check(model, plan, inputs)
        assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []
        floats = sorted(info.size for kind, info, _, dtype, _ in programs[-1]["slots"]
                        if kind == K.Slot.SLOT_CONST and dtype == np.float32)
        assert floats == sorted([heads * k * (2 * n - 1), k * 2 * span, k * (2 * n - 1)])
    assert plan._executor.handed_back == 0  # no native step refused its operands


def _random_operand(rng, shape: tuple, dtype: str) -> np.ndarray:
    """Values of dtype: floats with a NaN, integers across (most of) their range, bools."""
    if dtype == "float32":
        a = rng.standard_normal(shape).astype(np.float32)
        a.flat[rng.integers(0, a.size)] = np.nan
        return a
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(1 << 40)), min(info.max, 1 << 40), shape, endpoint=True).astype(dtype)


def _random_native_node(g: GraphBuilder, rng, shape: tuple) -> tuple[str, list[np.ndarray], bool]:
    """One node of the plan's strided native steps at shape (ranks 1 to 4), operands broadcast at random: its
    output, its inputs' values, and whether the plan runs it natively (not: a gather whose index is narrower than
    x, a cat or stack of five, a cast of float32 to an integer)."""
    rank, values = len(shape), []

    def given(name: str, s: tuple, dtype: str) -> str:
        values.append(_random_operand(rng, s, dtype))
        return g.input(name, dtype, list(s))

    def spread() -> tuple:  # a shape broadcasting to shape
        return tuple(1 if rng.random() < 0.4 else d for d in shape[rank - int(rng.integers(0, rank + 1)):])

    kind = str(rng.choice(["permute", "where", "compare", "arith", "cumsum", "gather", "cat", "stack", "cast"]))
    dtype = str(rng.choice(["float32", "int32", "int64", "bool", "uint8", "int8"]))
    if kind == "permute":
        perm = [int(p) for p in rng.permutation(rank)]
        return g.node("permute", {"x": given("x", shape, dtype)}, {"perm": perm}), values, True
    if kind == "where":
        ports = {"condition": given("c", spread(), "bool"), "a": given("a", spread(), dtype),
                 "b": given("b", shape, dtype)}
        return g.node("where", ports), values, True
    if kind in ("compare", "arith"):
        pairs = [("int32", "int64"), ("int64", "int32"), ("int64", "int64"), ("int32", "int32")]
        pairs += [("float32", "float32"), ("bool", "bool")] if kind == "compare" else []
        a, b = pairs[int(rng.integers(0, len(pairs)))]
        ops = ["eq", "ne", "lt", "le", "gt", "ge"] if kind == "compare" else ["add_int", "sub_int", "mul_int"]
        op = str(rng.choice(ops))
        sa, sb = (spread(), shape) if rng.random() < 0.5 else (shape, spread())
        stored = b in ("int32", "float32") and rng.random() < 0.3  # a stored operand, as a pad id
        right = g.tensor("k", _random_operand(rng, sb, b)) if stored else given("b", sb, b)
        return g.node(op, {"a": given("a", sa, a), "b": right}), values, True
    if kind == "cast":
        src, dst = (str(t) for t in rng.choice(["int32", "int64", "bool", "float32"], 2))
        native = not (src == "float32" and dst in ("int32", "int64"))
        return g.node("cast", {"x": given("x", shape, src)}, {"dtype": dst}), values, native
    if kind == "cumsum":
        x = given("x", shape, str(rng.choice(["int32", "int64", "bool"])))
        return g.node("cumsum", {"x": x}, {"dim": int(rng.integers(0, rank))}), values, True
    if kind == "gather":
        d = int(rng.integers(0, rank))
        index = tuple(int(rng.integers(1, 7)) if k == d else int(rng.integers(1, n + 1)) if rng.random() < 0.2 else n
                      for k, n in enumerate(shape))
        x = given("x", shape, dtype)
        values.append(rng.integers(0, shape[d], index))
        native = all(i == n for k, (i, n) in enumerate(zip(index, shape)) if k != d)
        return g.node("gather", {"x": x, "index": g.input("i", "int64", list(index))}, {"dim": d}), values, native
    d = int(rng.integers(0, rank + (kind == "stack")))
    sizes = [tuple(int(rng.integers(1, 5)) if kind == "cat" and j == d else n for j, n in enumerate(shape))
             for _ in range(int(rng.integers(1, 6)))]
    ports = {f"x{k}": given(f"x{k}", s, dtype) for k, s in enumerate(sizes)}
    return g.node(kind, ports, {"dim": d}), values, len(ports) <= 4


@pytest.mark.parametrize("seed", range(4))
def test_native_steps_on_random_nodes(tmp_path, seed):
    """Random nodes of the strided native steps (permute, where, comparisons, integer arithmetic, casts, cumsum,
    gather, cat and stack: every dtype, rank 1 to 4, operands broadcast at random, a stored operand now and then):
    the compiled program's bits are the per-node path's, which is numpy's, and the program runs them natively but
    where it says it does not (56 more seeds, 1,400 nodes, found none differing)."""
    rng = np.random.default_rng(20261129 + seed)
    for k in range(25):
        g = GraphBuilder()
        shape = tuple(int(n) for n in rng.integers(1, 6, int(rng.integers(1, 5))))
        y, values, native = _random_native_node(g, rng, shape)
        g.output(y)
        model = _load(tmp_path, g, f"n{k}")
        plan = _plan(model)
        _check(model, plan, values)
        assert len(plan._executor.fallback_steps(tuple(a.shape for a in values))) == (0 if native else 1)


def test_mask_ops_run_natively(tmp_path):
    """cast (integers and bools to bool, float32 and int64, float32 to bool, int64 to int32 wrapping as numpy
    does), logical_and / logical_or with broadcasting either way, expand (to a larger rank, along middle
    dimensions) and clamp (NaN kept) are native steps with the per-node path's bits; a clamp at a bound of 0
    (numpy's maximum may give either zero) runs in Python."""
    g = GraphBuilder()
    ids = g.input("ids", "int64", [None, None])
    x = g.input("x", "float32", [None, None])
    small = g.input("small", "int32", [None, 1])
    keep = g.node("cast", {"x": ids}, {"dtype": "bool"})
    wide = g.node("logical_and", {"a": g.node("unsqueeze", {"x": keep}, {"dim": 1}),
                                  "b": g.node("cast", {"x": x}, {"dtype": "bool"})})  # [n, n, s]
    either = g.node("logical_or", {"a": g.node("cast", {"x": small}, {"dtype": "bool"}), "b": keep})
    spread = g.node("expand", {"x": g.node("unsqueeze", {"x": x}, {"dim": 1}), "like": x},
                    {"shape": [-1, 3, -1], "like_dims": [None, None, 1]})
    g.output(wide, g.node("cast", {"x": either}, {"dtype": "float32"}),
             g.node("cast", {"x": ids}, {"dtype": "float32"}), g.node("cast", {"x": small}, {"dtype": "int64"}), spread,
             g.node("clamp", {"x": x}, {"min": -0.5, "max": 0.75}), g.node("clamp", {"x": x}, {"min": 0.125}),
             g.node("clamp", {"x": x}, {"min": 0.0}, name="at_zero"), g.node("cast", {"x": ids}, {"dtype": "int32"},
                                                                          name="to_int"))
    model = _load(tmp_path, g)
    plan = _plan(model)
    for n, s in ((1, 5), (3, 17)):
        x = _x(n, s)
        x[0, :3] = [np.nan, 0.0, -0.0]
        # beyond float32's 24 bits, the cast to it rounds; beyond int32's, the cast to it wraps
        ids = RNG.integers(-2, 3, (n, s)) * (1 << 40) + RNG.integers(-(1 << 35), 1 << 35, (n, s))
        inputs = [ids, x, RNG.integers(0, 2, (n, 1)).astype(np.int32)]
        _check(model, plan, inputs)
        ran = plan._executor.fallback_steps(tuple(a.shape for a in inputs))
        assert ran == ["node 'at_zero' (clamp)"]


def test_positions_comparisons_and_gathers_run_natively(tmp_path):
    """What position ids and relative positions are made of runs natively with the per-node path's bits:
    comparisons (int64 against a stored int32 pad id, float32 against a stored float32, NaN among them),
    logical_not, integer arithmetic wrapping modulo 2**bits (int32 products past 2**31, int64 with int32), cumsum
    (of bools and of int32, along either dimension) and gather (float32 and int64, along any dimension). A gather
    whose index is narrower than x outside dim runs in Python; an index out of range is named by its step."""
    g = GraphBuilder()
    ids = g.input("ids", "int64", [None, None])
    x = g.input("x", "float32", [None, None])
    big = g.input("big", "int32", [None, None])
    index = g.input("index", "int64", [None, None])
    real = g.node("ne", {"a": ids, "b": g.tensor("pad", np.array(1, np.int32))})
    live = g.node("cast", {"x": real}, {"dtype": "int32"})
    counted = g.node("cumsum", {"x": live}, {"dim": 1})  # int64
    positions = g.node("add_int", {"a": g.node("mul_int", {"a": counted, "b": live}),
                                   "b": g.tensor("one", np.array(1, np.int32))})
    down = g.node("cumsum", {"x": g.node("logical_not", {"x": real})}, {"dim": 0})
    products = g.node("mul_int", {"a": big, "b": big})  # int32, wrapping
    spread = g.node("sub_int", {"a": big, "b": ids})  # int64
    compared = [g.node(op, {"a": x, "b": g.tensor(f"at_{op}", np.array(0.5, np.float32))}) for op in ("eq", "lt", "ge")]
    compared.append(g.node("le", {"a": big, "b": ids}))
    picked = g.node("gather", {"x": x, "index": index}, {"dim": 1}, name="picked")
    rows = g.node("gather", {"x": ids, "index": g.node("sub_int", {"a": index, "b": index})}, {"dim": 0})
    narrow = g.node("slice", {"x": index}, {"dim": 1, "start": 0, "end": 1, "step": 1})
    part = g.node("gather", {"x": x, "index": narrow}, {"dim": 0}, name="part")
    g.output(positions, down, products, spread, *compared, picked, rows, part)
    model = _load(tmp_path, g)
    plan = _plan(model)
    for n, s in ((1, 6), (3, 11)):
        xs = _x(n, s)
        xs[0, :2] = [np.nan, 0.5]
        ids = RNG.integers(0, 4, (n, s))
        ids[0, 1] = 3
        index = RNG.integers(0, min(n, s), (n, s))
        inputs = [ids, xs, RNG.integers(-(1 << 31), 1 << 31, (n, s)).astype(np.int32), index]
        _check(model, plan, inputs)
        ran = plan._executor.fallback_steps(tuple(a.shape for a in inputs))
        assert ran == ["node 'part' (gather)"]
    inputs[3] = inputs[3] + s
    for runner in (model.run, plan.run):
        with pytest.raises(ValueError, match=r"node 'picked' \(gather\): index must lie in \[0, 11\)"):
            runner(inputs)

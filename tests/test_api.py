"""qrt.run / qrt.load / Model: input conventions, clear errors, threads, no torch import."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import qrt
from qrt.builder import GraphBuilder


@pytest.fixture(scope="module")
def two_input_model(tmp_path_factory):
    """(x[?, 9], h[?, 4]) -> (y = linear_dynamic(x), z = y + h)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 9])
    h = g.input("h", "float32", [None, 4])
    y = g.node(
        "linear_dynamic",
        {
            "x": x,
            "weight": rng.integers(-128, 128, (4, 9), dtype=np.int8),
            "weight_scale": np.asarray(0.01, np.float32),
            "weight_zero_point": np.asarray(0, np.int32),
            "bias": rng.standard_normal(4).astype(np.float32),
        },
        name="fc",
    )
    z = g.node("add", {"a": y, "b": h}, name="sum")
    g.output(y, z)
    path = tmp_path_factory.mktemp("api") / "two.qrt"
    g.save(path)
    return path


def _inputs(batch=3, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 9)).astype(np.float32), rng.standard_normal((batch, 4)).astype(np.float32)


def test_every_input_convention_gives_the_same_result(two_input_model):
    x, h = _inputs()
    model = qrt.load(two_input_model)
    y, z = model.run((x, h))
    for got in (model.run([x, h]), model.run({"h": h, "x": x}), qrt.run(two_input_model, (x, h))):
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_array_equal(got[0], y)
        np.testing.assert_array_equal(got[1], z)
    np.testing.assert_array_equal(z, y + h)


def test_single_input_model_takes_a_bare_array_and_returns_one(tmp_path):
    g = GraphBuilder()
    g.output(g.node("relu", {"x": g.input("x", "float32", [None, 3])}))
    g.save(tmp_path / "relu.qrt")
    out = qrt.run(tmp_path / "relu.qrt", np.array([[-1, 0, 2]], np.float32))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, [[0, 0, 2]])


def test_describes_inputs_and_outputs(two_input_model):
    model = qrt.load(two_input_model)
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [
        ("x", "float32", (None, 9)),
        ("h", "float32", (None, 4)),
    ]
    assert [(s.name, s.dtype, s.shape) for s in model.outputs] == [
        ("fc", "float32", (None, 4)),
        ("sum", "float32", (None, 4)),
    ]
    assert "x" in repr(model)


@pytest.mark.parametrize(
    "make_inputs,message",
    [
        (lambda x, h: x, "takes 2 inputs"),
        (lambda x, h: [x], "got 1 input"),
        (lambda x, h: (x, h, h), "got 3 input"),
        (lambda x, h: {"x": x}, r"missing input\(s\) \['h'\]"),
        (lambda x, h: {"x": x, "h": h, "c": h}, r"unknown input name\(s\) \['c'\]"),
        (lambda x, h: (x.astype(np.float64), h), "input 'x': dtype is float64, expected float32"),
        (lambda x, h: (x.astype(np.int32), h), "input 'x': dtype is int32"),
        (lambda x, h: (x[:, :8], h), r"input 'x': shape is \[3, 8\], expected \[\?, 9\]"),
        (lambda x, h: (x[None], h), r"input 'x': shape is \[1, 3, 9\]"),
        (lambda x, h: (x.tolist(), h), "input 'x': expected a numpy.ndarray of float32, got list"),
        (lambda x, h: (x, h[:2]), r"node 'sum' \(add\): a has shape \[3, 4\] and b has shape \[2, 4\], which do not"),
    ],
)
def test_wrong_inputs_raise_a_clear_value_error(two_input_model, make_inputs, message):
    model = qrt.load(two_input_model)
    with pytest.raises(ValueError, match=message):
        model.run(make_inputs(*_inputs()))


def test_lossless_conversions_are_accepted(two_input_model):
    x, h = _inputs()
    model = qrt.load(two_input_model)
    want = model.run((x, h))
    swapped = x.astype(x.dtype.newbyteorder(">"))
    strided = np.asfortranarray(x)
    for variant in (swapped, strided):
        got = model.run((variant, h))
        np.testing.assert_array_equal(got[1], want[1])


def test_empty_batch(two_input_model):
    y, z = qrt.load(two_input_model).run(_inputs(batch=0))
    assert y.shape == (0, 4) and z.shape == (0, 4)


def test_nan_in_a_dynamically_quantized_input_is_refused(two_input_model):
    x, h = _inputs()
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match="node 'fc' .*NaN"):
        qrt.load(two_input_model).run((x, h))


def test_unknown_device(two_input_model):
    with pytest.raises(ValueError, match="device"):
        qrt.load(two_input_model, device="tpu")


def test_threads_share_one_model_and_get_the_serial_results(two_input_model):
    model = qrt.load(two_input_model)
    cases = [_inputs(batch=1 + i % 5, seed=i) for i in range(16)]
    serial = [model.run(c) for c in cases]
    failures = []

    def worker(offset):
        for i in range(300):
            k = (i + offset) % len(cases)
            y, z = model.run(cases[k])
            if not (np.array_equal(y, serial[k][0]) and np.array_equal(z, serial[k][1])):
                failures.append(k)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_import_qrt_does_not_import_torch():
    code = "import sys, qrt; assert 'torch' not in sys.modules and 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _pickled_run(args):
    model, inputs = args
    return model.run(inputs)


def test_model_pickles_by_path_into_worker_processes(two_input_model):
    """A Model goes to multiprocessing workers (spawned: nothing inherited) and gives the same bits."""
    import multiprocessing
    import pickle

    model = qrt.load(two_input_model)
    cases = [_inputs(batch=1 + i, seed=i) for i in range(4)]
    want = [model.run(c) for c in cases]
    assert len(pickle.dumps(model)) < 1000  # the path and checksum, not the weights
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        got = pool.map(_pickled_run, [(model, c) for c in cases])
    for (gy, gz), (wy, wz) in zip(got, want):
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gz, wz)


def test_a_model_loaded_by_a_relative_path_unpickles_in_another_directory(tmp_path, two_input_model, monkeypatch):
    """A worker's working directory is not the loader's (a Dask or Ray worker's): the pickle holds the file's
    absolute path, taken when the Model was loaded."""
    import pickle

    monkeypatch.chdir(two_input_model.parent)
    model = qrt.load(two_input_model.name)
    blob = pickle.dumps(model)
    monkeypatch.chdir(tmp_path)
    again = pickle.loads(blob)
    inputs = _inputs(batch=2, seed=3)
    for got, want in zip(again.run(inputs), model.run(inputs)):
        np.testing.assert_array_equal(got, want)


def test_unpickling_refuses_a_changed_file(tmp_path, two_input_model):
    import pickle

    path = tmp_path / "m.qrt"
    path.write_bytes(two_input_model.read_bytes())
    blob = pickle.dumps(qrt.load(path))
    g = GraphBuilder()
    g.output(g.node("relu", {"x": g.input("x", "float32", [None, 4])}))
    g.save(path)
    with pytest.raises(qrt.FormatError, match="changed since this Model was pickled"):
        pickle.loads(blob)


@pytest.mark.parametrize(
    "env, want",
    [
        ({"OMP_NUM_THREADS": "1"}, 1),
        ({"OMP_NUM_THREADS": "3,2"}, 3),
        ({"QRT_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, 2),
        ({"OMP_NUM_THREADS": "lots"}, None),
    ],
)
def test_thread_count_from_the_environment(env, want):
    """QRT_NUM_THREADS wins over OMP_NUM_THREADS; a bad value is named in a warning and ignored."""
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("QRT_NUM_THREADS", "OMP_NUM_THREADS")}
    code = "import qrt; print(qrt.get_num_threads(), qrt.thread_info().cpus)"  # cpus: affinity mask and quota
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**base, **env}, capture_output=True,
                       text=True, check=True)
    got, cpus = map(int, r.stdout.split())
    if want is None:
        assert got == cpus and "ignoring OMP_NUM_THREADS='lots'" in r.stderr
    else:
        assert got == want


@pytest.mark.parametrize("op, weight", [("linear_dynamic", np.ones((2, 3), np.float16)),
                                        ("linear_float", np.ones((2, 3), np.float32))])
def test_wrong_feature_count_is_refused_before_the_output_is_allocated(tmp_path, op, weight):
    """x's other dimensions size the output: an empty x of 2**40 rows and the wrong width is refused first
    (it asked for terabytes before; found by tools/fuzz_loader.py)."""
    b = GraphBuilder()
    b.output(b.node(op, {"x": b.input("x", "float32", [2**40, None]), "weight": weight}))
    b.save(tmp_path / "m.qrt")
    with pytest.raises(ValueError, match="x has 0 features, expected 3"):
        qrt.load(tmp_path / "m.qrt").run(np.empty((2**40, 0), np.float32))

"""qrt.format.save never leaves a partial file: killed mid-write, the old file is intact.

A child process saves a model over an existing one and is SIGKILLed while
the bytes are going out; afterwards the target is byte-for-byte the old
file (or absent if there was none) and still loads. Failures that raise
leave no temporary file behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import qrt
from qrt import format as qformat
from qrt.builder import GraphBuilder

ROOT = Path(__file__).resolve().parent.parent


def _model(n: int, value: int = 1) -> GraphBuilder:
    """linear_dynamic with an n x 64 int8 weight (n * 64 bytes)."""
    b = GraphBuilder()
    b.output(b.node("linear_dynamic", {
        "x": b.input("x", "float32", [None, 64]),
        "weight": np.full((n, 64), value, np.int8),
        "weight_scale": np.array(0.1, np.float32), "weight_zero_point": np.array(0, np.int32),
    }))
    return b


# The child writes a model over `target`. With PAUSE it writes half the bytes into the temporary
# file, says so on stdout and sleeps, so the parent kills it at a known point mid-write.
CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
    import numpy as np
    from qrt import format as qformat
    from test_atomic_write import _model

    target, rows, pause = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "pause"
    if pause:
        real_fdopen = os.fdopen

        class HalfThenHang:
            def __init__(self, f):
                self.f = f
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return self.f.__exit__(*exc)
            def write(self, data):
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                print("HALF", flush=True)
                time.sleep(60)
            def __getattr__(self, name):
                return getattr(self.f, name)

        qformat.os.fdopen = lambda fd, mode: HalfThenHang(real_fdopen(fd, mode))
    print("START", flush=True)
    b = _model(rows, value=2)
    qformat.save(target, b.graph(), b.tensors)
    print("DONE", flush=True)
""")


def _child(tmp_path: Path, target: Path, rows: int, pause: bool) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, str(script), str(ROOT), str(target), str(rows), "pause" if pause else "run"],
        stdout=subprocess.PIPE, text=True,
    )


def _temps(folder: Path) -> list[Path]:
    return sorted(folder.glob(".qrt-*.tmp"))


@pytest.mark.parametrize("existing", [True, False])
def test_killed_mid_write_leaves_old_file_intact(tmp_path, existing):
    target = tmp_path / "model.qrt"
    old = None
    if existing:
        _model(8).save(target)
        old = target.read_bytes()
    child = _child(tmp_path, target, rows=4096, pause=True)
    try:
        assert child.stdout.readline().strip() == "START"
        assert child.stdout.readline().strip() == "HALF"
        temps = _temps(tmp_path)
        assert len(temps) == 1 and 0 < temps[0].stat().st_size, "the child should be writing its temporary file"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    if existing:
        assert target.read_bytes() == old, "the old file was modified or truncated"
        assert qrt.load(target).outputs[0].shape == (None, 8)
    else:
        assert not target.exists(), "a partial file appeared under the target name"
    # SIGKILL leaves the temporary (hidden, never under the target's name); nothing else changed.
    assert {p.name for p in tmp_path.iterdir()} <= {"model.qrt", "child.py", *(p.name for p in _temps(tmp_path))}


def test_killed_at_a_random_moment_of_a_real_write(tmp_path):
    """No monkeypatching: a 64 MiB model, killed once its temporary file has started to grow."""
    target = tmp_path / "model.qrt"
    _model(8).save(target)
    old = target.read_bytes()
    child = _child(tmp_path, target, rows=1 << 20, pause=False)
    try:
        assert child.stdout.readline().strip() == "START"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            temps = _temps(tmp_path)
            if temps and temps[0].exists() and temps[0].stat().st_size > 0:
                break
            time.sleep(0.001)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    data = target.read_bytes()
    if data != old:  # the rename won the race: then the whole new file must be there
        assert qrt.load(target).outputs[0].shape == (None, 1 << 20)
    else:
        assert qrt.load(target).outputs[0].shape == (None, 8)


def test_invalid_graph_raises_before_writing(tmp_path):
    target = tmp_path / "model.qrt"
    _model(8).save(target)
    old = target.read_bytes()
    b = _model(8)
    b.nodes[0]["op"] = "conv2d"
    with pytest.raises(qrt.FormatError, match="unknown op 'conv2d'"):
        b.save(target)
    b = _model(8)
    b.tensors["linear_dynamic_0.weight_scale"] = np.array(0.0, np.float32)
    with pytest.raises(qrt.FormatError, match="weight_scale must be finite and > 0"):
        b.save(target)
    with pytest.raises(ValueError, match="not storable"):
        qformat.save(target, _model(8).graph(), {**_model(8).tensors, "bad": np.zeros(2, np.int64)})
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.qrt"], "a stray file was left"


def test_failed_write_removes_its_temporary(tmp_path, monkeypatch):
    target = tmp_path / "model.qrt"
    _model(8).save(target)
    old = target.read_bytes()

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(qformat.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        _model(16).save(target)
    monkeypatch.undo()
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.qrt"], "the temporary file was left behind"


def test_save_replaces_a_file_being_read(tmp_path):
    """A reader holding the old mapping keeps seeing the old tensors after a save (rename, not rewrite)."""
    target = tmp_path / "model.qrt"
    _model(8, value=1).save(target)
    f = qformat.load_file(target)
    _model(8, value=3).save(target)
    assert int(np.asarray(f.tensors["linear_dynamic_0.weight"])[0, 0]) == 1
    assert int(np.asarray(qformat.load_file(target).tensors["linear_dynamic_0.weight"])[0, 0]) == 3
    assert os.stat(target).st_size > 0


def test_saved_file_has_normal_permissions(tmp_path):
    """The temporary file is made 0600; the saved model must not stay private by accident."""
    target = tmp_path / "model.qrt"
    mask = os.umask(0o022)
    try:
        _model(8).save(target)
        assert target.stat().st_mode & 0o777 == 0o644
        os.chmod(target, 0o640)
        _model(8, value=2).save(target)  # replacing keeps the old file's mode
        assert target.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(mask)

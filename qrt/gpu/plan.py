"""The GPU execution plan: per set of input shapes, every kernel of the model as one CUDA graph.

``build_plan(graph, tensors, steps)`` takes the GPU backend's prepared steps. The first call with a
new set of input shapes (and dtypes) makes a *program* for them:

1. input buffers are allocated from a memory pool of the program's own, and the call's inputs
   copied in;
2. the interpreter runs every step once, eagerly (shape errors raise here, kernels compile, the pool
   learns the sizes), and the kernels' checks of input values are read (an index out of range);
3. the same steps run again under stream capture: nothing executes, every launch (the recurrent
   time loops' too) becomes a node of one CUDA graph, and every buffer it uses comes from the pool,
   which nothing else allocates from, so the graph's memory stays its own while the program lives.

Each later call with those shapes copies its inputs into the input buffers, replays the graph (one
launch) and copies the outputs out: to new CuPy arrays if any input was a CuPy array, else to NumPy
arrays (one copy each way, then one wait for the GPU). A program serves one call at a time: a call
finding every program of its shapes busy (another thread's) makes one more, so one loaded model can
be run from several threads, as on the CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..graph import Graph
from ..interpreter import Interpreter
from ..plan import Stream
from .runtime import array_module, collecting_checks, cupy, dev, raise_failed

MAX_PROGRAMS = 32  # input shape sets whose programs are kept (a free sequence length makes many)
_RELAXED = 2  # cudaStreamCaptureModeRelaxed: the pool may ask the driver for memory during capture


def build_plan(graph: Graph, tensors: Mapping[str, np.ndarray], steps: Sequence[Callable]) -> GraphPlan:
    """The plan of a graph loaded for the GPU: steps[i] is the GPU backend's prepared step of graph.nodes[i]."""
    return GraphPlan(graph, tensors, steps)


class Program:
    """One CUDA graph of a model at one set of input shapes, with its buffers and its stream."""

    def __init__(self, interpreter: Interpreter, inputs: Sequence[Any]) -> None:
        cp = cupy()
        self.pool = cp.cuda.MemoryPool()  # the graph's memory: freed only with the program
        self.stream = cp.cuda.Stream(non_blocking=True)  # capture needs a stream of its own
        names = [s.name for s in interpreter.graph.outputs]
        self.stream.wait_event(cp.cuda.get_current_stream().record())  # CuPy inputs may be being written
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self.inputs = [cp.empty(a.shape, a.dtype) for a in inputs]
            _copy_in(self.inputs, inputs, self.stream)
            with collecting_checks() as checks:
                values = interpreter.run(self.inputs)
            raise_failed(checks)  # waits for the run: its results are this call's
            self.first = [_output(values, name, interpreter.consts) for name in names]
            del values
            self.stream.begin_capture(_RELAXED)
            try:
                with collecting_checks() as self.checks:
                    values = interpreter.run(self.inputs)
                    self.outputs = [_output(values, name, interpreter.consts) for name in names]
            finally:
                self.graph = self.stream.end_capture()
            del values
            self.graph.upload(self.stream)

    def replay(self, inputs: Sequence[Any], device: Sequence[bool]) -> list[Any]:
        """The outputs of the model on inputs; output j as a new CuPy array where device[j], else NumPy.

        The copies and the graph go into the caller's current stream, after the work already there
        (a CuPy input may still be being written) and before the work queued after the call."""
        stream = cupy().cuda.get_current_stream()
        _copy_in(self.inputs, inputs, stream)
        self.graph.launch(stream)
        if self.checks:
            raise_failed(self.checks)
        return _copy_out(self.outputs, device, stream)

    def take_first(self, device: Sequence[bool]) -> list[Any]:
        """The outputs of the eager run that made the program (the first call's results), ordered
        before the work the caller queues after the call."""
        out = _copy_out(self.first, device, self.stream)
        cupy().cuda.get_current_stream().wait_event(self.stream.record())
        self.first = []
        return out


class GraphPlan:
    """A graph's CUDA programs, one or more per set of input shapes (see the module docstring).

    ``run(inputs)`` takes the inputs as a list of C-contiguous NumPy or CuPy arrays in input order,
    of the inputs' dtypes (what ``Model`` binds), and returns the flat outputs as new arrays.
    """

    array_module = staticmethod(array_module)  # for Stream: the library of a step's arrays

    def __init__(self, graph: Graph, tensors: Mapping[str, np.ndarray], steps: Sequence[Callable]) -> None:
        self.graph = graph
        self._interpreter = Interpreter(graph, steps, {})
        # stored tensors at run-time ports (the steps uploaded their weights), and outputs that are stored
        # tensors, uploaded once
        wanted = {v for args in self._interpreter.args for v in args} | {s.name for s in graph.outputs}
        self._interpreter.consts = {name: dev(t) for name, t in tensors.items() if name in wanted}
        self._lock = threading.Lock()
        self._free: dict[tuple, list[Program]] = {}  # programs not running now, by input shapes
        self._count = 0

    def call(self, inputs: Any) -> None:
        """Model.run's native fast path: none on the GPU (Model binds the inputs, then calls run)."""
        return None

    def run(self, inputs: Sequence[Any], device: Sequence[bool] | None = None) -> list[Any]:
        """The flat outputs; device[j] (default: whether any input is a CuPy array) puts output j on the GPU."""
        if device is None:
            on_gpu = any(not isinstance(a, np.ndarray) for a in inputs)
            device = [on_gpu] * len(self.graph.outputs)
        key = tuple((a.shape, a.dtype.str) for a in inputs)
        with self._lock:
            free = self._free.get(key)
            program = free.pop() if free else None
        new = program is None
        if new:
            program = Program(self._interpreter, inputs)  # raises ValueError on bad inputs: nothing kept
        try:
            return program.take_first(device) if new else program.replay(inputs, device)
        finally:  # a replay that raised (an index out of range) leaves its program as good as before
            with self._lock:
                if new and key not in self._free and self._count >= MAX_PROGRAMS:
                    self._free.clear()
                    self._count = 0
                self._free.setdefault(key, []).append(program)
                self._count += new

    def program_count(self) -> int:
        with self._lock:
            return self._count

    def stream(self, state: Mapping[str, str] | None = None) -> Stream:
        """A stateful stepper (qrt.plan.Stream) whose state stays in device memory between steps."""
        return Stream(self, state)


def _output(values: dict[str, Any], name: str, consts: Mapping[str, Any]) -> Any:
    return values[name] if name in values else consts[name]


def _copy_in(buffers: Sequence[Any], inputs: Sequence[Any], stream: Any) -> None:
    """Inputs into the program's buffers, in stream."""
    runtime = cupy().cuda.runtime
    for buf, a in zip(buffers, inputs):
        if not a.nbytes:
            continue
        if isinstance(a, np.ndarray):  # pageable host memory: the copy is done when this returns
            runtime.memcpyAsync(buf.data.ptr, a.ctypes.data, a.nbytes, runtime.memcpyHostToDevice, stream.ptr)
        else:
            runtime.memcpyAsync(buf.data.ptr, a.data.ptr, a.nbytes, runtime.memcpyDeviceToDevice, stream.ptr)


def _copy_out(outputs: Sequence[Any], device: Sequence[bool], stream: Any) -> list[Any]:
    """New arrays holding the outputs, copied in stream; waits for the GPU if any is a NumPy array."""
    cp = cupy()
    runtime = cp.cuda.runtime
    out: list[Any] = []
    for a, on_gpu in zip(outputs, device):
        if on_gpu:
            out.append(cp.empty(a.shape, a.dtype))  # the caller's memory pool, not the program's
            if a.nbytes:
                runtime.memcpyAsync(out[-1].data.ptr, a.data.ptr, a.nbytes, runtime.memcpyDeviceToDevice, stream.ptr)
        else:
            out.append(np.empty(a.shape, a.dtype))
            if a.nbytes:
                runtime.memcpyAsync(out[-1].ctypes.data, a.data.ptr, a.nbytes, runtime.memcpyDeviceToHost, stream.ptr)
    if not all(device):
        stream.synchronize()
    return out

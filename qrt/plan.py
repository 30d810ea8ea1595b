"""Execution plans: a whole model run by one native call.

``build_plan(graph, tensors, steps)`` turns a loaded graph and the CPU backend's prepared steps into
a Plan. ``Plan.run(inputs)`` runs the model from one call into compiled code that releases the GIL
for the whole model:

- **Programs per input shape.** The first call with a new set of input shapes runs the per-node
  steps (exactly what ``Model.run`` does without a plan), records every value's shape, and compiles
  a program for those shapes: a flat list of kernel calls over buffers assigned once (values whose
  lifetimes do not overlap share memory). Later calls with these shapes run the program. Outputs
  are fresh arrays each call; intermediate buffers are reused.
- **Threads.** A program's buffers come in sets taken from a pool for the length of one call, so
  several threads may run one model at once; each holds its own set.
- **Values fixed by the shapes.** A node whose run-time operands are stored tensors, values fixed by
  the shapes, or operands it reads only the shape of (arange's x, expand's like) gives the same
  result on every call with these shapes (a transformer's position ids, token types, the causal part
  of its mask): its output from the first call is kept in the program as a stored tensor, and the
  node runs no more. A gather at such an index that repeats over leading dimensions keeps one block of
  it; a matmul whose output only such a gather along its last dimension reads, of a b that is fixed too,
  computes only the columns the index spans (DeBERTa's relative attention).
- **Fusion that keeps the bits.** A ReLU whose input is a linear's (dynamic or float) only use runs
  in that linear's call, on its output while it is in cache; a quantize that undoes a dequantize
  with the same parameters is dropped when every representable value survives the round trip
  unchanged (checked exhaustively at build); flatten, reshape, squeeze and unsqueeze are a new shape
  over the same bytes; an attention reads q, k and v through the permute (0, 2, 1, 3) that makes
  heads of a [B, L, H, E] array, in place, and writes its context through the one that undoes it
  (a transformer's copies between the linears' layout and the heads' are not made). Int8 dynamic linears
  reading one input with the same settings (a transformer's query, key and value) whose outputs only such
  attention reads run as one product over their stacked weights, read as its columns, head by head; at batch 1
  its threads split it by columns, each writing the heads its attention task reads (qrt/stacked_linears.py);
  a layer_norm of an add whose output nothing else reads (a residual add) forms the sums row by row in its
  own step, in cache.
- **Native steps** for quantize and dequantize, the linears, the cells, whole sequences (every layer
  and direction of an rnn/lstm/gru sequence op, dynamic or float, in one step, K.SequenceStep, on the
  arena), and the glue of the recurrent models: embedding, select and slice (a copy of strided
  blocks), softmax and log_softmax, relu, the float arithmetic (add, sub, mul, div, broadcasting) and
  functions (gelu, sigmoid, ...), sum and mean over adjacent dimensions, layer_norm, batch_norm, attention, and the
  mask ops cast, logical_and / logical_or, expand and clamp.
- **Fallback.** Any other op runs its Python step inside the program, which takes the GIL back for
  that step only; so every model keeps working.

``Stream`` steps a cell model (keyword spotting, streaming ASR) one frame at a time, keeping the
state inside between calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

from . import _kernels as K
from .graph import Graph, check_input, nest
from .interpreter import Interpreter
from .ops import CELL_OPS, COMPARISONS, INTEGER_ARITHMETIC, OPS, QUANT_DTYPES, SEQUENCE_OPS, channel_view, rounds_first
from .stacked_linears import shared_input_groups, stacked_linear

MAX_PROGRAMS = 32  # input shape sets whose programs are kept (a free sequence length makes many)

# how the executor stores a value, and its steps: qrt/_plan.pxi's numbers
Slot, PlanStep = K.Slot, K.PlanStep
_QCODE = {"uint8": 0, "int8": 1, "int32": 2}
# ops whose output is their input's bytes under another shape (the plan's values are C-contiguous)
_VIEWS = {"flatten", "reshape", "squeeze", "unsqueeze"}
# K.MaskStep's ops
_MASK_STEPS = {"cast", "logical_and", "logical_or", "logical_not", "expand", "permute", "where", "clamp",
               *COMPARISONS, *(f"{op}_int" for op in INTEGER_ARITHMETIC)}
_ALIGN = 64
# the permute between a linear's [B, L, H * E] output viewed as [B, L, H, E] and attention's [B, H, L, E]
_HEADS_PERM = [0, 2, 1, 3]


def build_plan(graph: Graph, tensors: Mapping[str, np.ndarray], steps: Sequence[Callable]) -> Plan:
    """The plan of a graph loaded for the CPU: steps[i] is the backend's prepared step of graph.nodes[i]."""
    return Plan(graph, tensors, steps)


class Plan:
    """A loaded graph as native programs, one per set of input shapes (see the module docstring).

    ``run(inputs)`` takes the inputs as a list of C-contiguous arrays in input order, of the
    inputs' dtypes (what ``Model`` binds), and returns the flat outputs as a list of new arrays.
    """

    def __init__(self, graph: Graph, tensors: Mapping[str, np.ndarray], steps: Sequence[Callable]) -> None:
        self.graph = graph
        self._steps = list(steps)
        self._consts = dict(tensors)  # the file's mapped arrays: read, never written, never copied whole
        self._interpreter = Interpreter(graph, self._steps, self._consts)
        # run-time operands of each node (port order, as Model wires them) and their consumers
        self._args = self._interpreter.args
        self._uses: dict[str, list[int]] = {}
        for i, args in enumerate(self._args):
            for v in args:
                self._uses.setdefault(v, []).append(i)
        self._input_names = [s.name for s in graph.inputs]
        self._output_names = [s.name for s in graph.outputs]
        self._producer = {v: i for i, node in enumerate(graph.nodes) for v in node.outputs}
        # fusions (independent of shapes): relu node -> linear node it runs in; aliases value -> value
        self._relu_of: dict[int, int] = {}
        self._fused: set[int] = set()
        self._alias: dict[str, str] = {}
        self._plan_fusions(tensors)
        # linears reading one input: one product where only attention steps read their outputs (_stack_linears)
        self._linear_groups = shared_input_groups(graph.nodes, [self._kernel(i) for i in range(len(graph.nodes))],
                                                  self._consts, self._root, self._relu_of)
        self._stacked: dict[tuple[int, ...], Any] = {}  # members -> their K.DynamicLinear, made once
        self._executor = K.PlanExecutor(len(graph.inputs), self._miss, self._per_node)
        self.run: Callable[[list[np.ndarray]], list[np.ndarray]] = self._executor.run
        # Model.run's common call, nested inputs and outputs included, in one native call (None: not that call)
        n = len(graph.inputs)
        flat_out = not graph.output_tuple or graph.output_structure == tuple(range(len(graph.outputs)))
        self._executor.set_structure(
            list(self._input_names),
            None if graph.input_structure == tuple(range(n)) else graph.input_structure,
            None if flat_out else graph.output_structure,
            graph.output_tuple,
        )
        self.call: Callable[[Any], Any] = self._executor.call

    def __repr__(self) -> str:
        fused = sum(1 for _ in self._relu_of) + sum(1 for n in self.graph.nodes if self._folded(n))
        return f"Plan({len(self.graph.nodes)} nodes, {fused} fused, {self._executor.program_count()} programs)"

    def profile(self, inputs: list[np.ndarray], repeats: int = 20) -> list[tuple[str, str, float]]:
        """Where a call's time goes: (node name, op, seconds) of each step of the compiled program for these
        inputs (flat, as run() takes them; compiled first if new), the median of `repeats` calls. A step that
        runs several nodes (a fused ReLU) is named by its first. Empty where these shapes have no program."""
        if not self._executor.has_program(tuple(a.shape for a in inputs)):
            self.run(inputs)
        steps = self._executor.profile(list(inputs), repeats) or []
        return [(self.graph.nodes[i].name, self.graph.nodes[i].op, t) for i, t in steps]

    def stream(self, state: Mapping[str, str] | None = None) -> Stream:
        """A stateful stepper of this model (see Stream)."""
        return Stream(self, state)

    # ------------------------------------------------------------------ fusions

    def _kernel(self, i: int) -> Any:
        return getattr(self._steps[i], "kernel", None)

    def _plan_fusions(self, tensors: Mapping[str, np.ndarray]) -> None:
        outputs = set(self._output_names)
        for i, node in enumerate(self.graph.nodes):
            if node.op == "relu":
                v = node.inputs["x"]
                j = self._producer.get(v)
                if (
                    j is not None
                    and self.graph.nodes[j].op in ("linear_dynamic", "linear_float")
                    and self._kernel(j) is not None
                    and len(self._uses.get(v, [])) == 1
                    and v not in outputs
                ):
                    self._relu_of[j] = i
                    self._fused.add(i)
            elif node.op in _VIEWS:
                self._alias[node.outputs[0]] = node.inputs["x"]
            elif node.op in ("quantize_per_tensor", "quantize_per_channel") and self._undoes_dequantize(i, tensors):
                self._alias[node.outputs[0]] = self.graph.nodes[self._producer[node.inputs["x"]]].inputs["x"]
                self._fused.add(i)

    def _folded(self, node) -> bool:
        return node.op.startswith("quantize") and node.outputs[0] in self._alias

    def _undoes_dequantize(self, i: int, tensors: Mapping[str, np.ndarray]) -> bool:
        """Quantize node i gives back exactly the input of the dequantize feeding it, for every value."""
        q = self.graph.nodes[i]
        j = self._producer.get(q.inputs["x"])
        if j is None or self.graph.nodes[j].op != "dequantize":
            return False
        d = self.graph.nodes[j]
        dtype = QUANT_DTYPES[q.attrs["dtype"]]
        info = self.graph.values.get(d.inputs["x"])
        if info is None or info.dtype != dtype or dtype == "int32":
            return False
        per_channel = q.op == "quantize_per_channel"
        if (d.attrs["axis"] is not None) != per_channel or (per_channel and d.attrs["axis"] != q.attrs["axis"]):
            return False
        for port in ("scale", "zero_point"):
            a, b = tensors.get(q.inputs.get(port, "")), tensors.get(d.inputs.get(port, ""))
            if a is None or b is None or a.shape != b.shape or not np.array_equal(a, b):
                return False
        # every representable value through the two steps, in every channel
        shape = [1] * len(info.shape)
        if per_channel:
            shape[q.attrs["axis"]] = int(np.size(tensors[q.inputs["scale"]]))
        lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
        for v in range(lo, hi + 1):
            x = np.full(shape, v, dtype)
            (y,) = self._steps[j](x)
            (back,) = self._steps[i](y)
            if back.dtype != x.dtype or not np.array_equal(back, x):
                return False
        return True

    # ------------------------------------------------------------------ the per-node path

    def _per_node(self, inputs: list[np.ndarray], env: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Every node's step in order, by the interpreter (env, if given, gets every value)."""
        values = self._interpreter.run(inputs)
        if env is not None:
            env.update(values)
        out: list[np.ndarray] = []
        for name in self._output_names:
            a = self._value(values, name, copy=True)
            # a view (of an input, a stored tensor) or an array already handed out is copied, as the
            # compiled program does: outputs are the caller's and never alias each other
            owned = a.base is None and not any(a is o for o in out) and not any(a is x for x in inputs)
            out.append(a if owned else a.copy())
        return out

    def _value(self, values: dict[str, Any], name: str, copy: bool = False) -> Any:
        if name in values:
            return values[name]
        return np.array(self._consts[name]) if copy else self._consts[name]

    def _miss(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """A new set of input shapes: run the nodes, then compile a program for these shapes."""
        env: dict[str, np.ndarray] = {}
        out = self._per_node(inputs, env)
        key = tuple(a.shape for a in inputs)
        if self._executor.program_count() >= MAX_PROGRAMS:
            self._executor.clear()
        self._executor.add(key, self._compile(env))
        return out

    # ------------------------------------------------------------------ compiling a program

    def _root(self, v: str) -> str:
        while v in self._alias:
            v = self._alias[v]
        return v

    def _compile(self, env: dict[str, np.ndarray]) -> K.PlanProgram | None:
        """The program for the shapes of env (every value of one run); None where the per-node path
        should run (an empty value)."""
        if any(isinstance(a, np.ndarray) and a.size == 0 for a in env.values()):
            return None
        nodes = self.graph.nodes
        static = self._fixed_by_shapes(env)
        fused = self._fused | {self._producer[v] for v in static}
        # steps that also run nodes before them (attention through its heads' permutes, layer_norm with its add)
        # or in their stead (a product of the columns a gather reads)
        merged = {**self._attention_steps(env), **self._add_norm_steps(env, static),
                  **self._gathered_columns(env, static, fused)}
        fused |= {j for step in merged.values() for j in step.pop("fused")}
        stacked = self._stack_linears(env, merged, fused)
        native = [merged.get(i) or stacked.get(i) or self._native(i, env, fused, static) for i in range(len(nodes))]
        writes = {**{j: nodes[r].outputs[0] for j, r in self._relu_of.items()},
                  **{i: step["y"] for i, step in {**merged, **stacked}.items()}}
        step_reads = {i: [step[p] for p in ("a", "b", "c", "d") if p in step] for i, step in merged.items()}
        # the storage of each root value
        inputs, outputs = set(self._input_names), set(self._output_names)
        kind: dict[str, int] = {}
        producer: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if i in fused:
                continue
            outs = [writes[i]] if i in writes else node.outputs
            for v in outs:
                if v in self._alias:
                    continue
                producer[v] = i
                if not native[i]:
                    kind[v] = Slot.SLOT_OBJECT
                elif any(self._root(o) == v for o in outputs):
                    kind[v] = Slot.SLOT_FRESH
                else:
                    kind[v] = Slot.SLOT_ARENA
        for v in inputs:
            kind[v] = Slot.SLOT_INPUT
        slots: dict[str, int] = {}

        def slot(v: str) -> int:
            r = self._root(v)
            if r not in kind:
                kind[r] = Slot.SLOT_CONST
            return slots.setdefault(r, len(slots))

        # lifetimes: end[r] = the last step reading root r; a fallback may return a view of its inputs,
        # so its inputs live as long as its outputs
        last = len(nodes)
        end: dict[str, int] = {self._root(v): last for v in outputs}
        for i in reversed(range(len(nodes))):
            if i in fused:
                continue
            reads = [self._root(v) for v in step_reads.get(i, self._args[i])]
            for r in reads:
                end[r] = max(end.get(r, i), i)
            if not native[i]:
                out_end = max([end.get(self._root(o), i) for o in nodes[i].outputs] + [i])
                for r in reads:
                    end[r] = max(end[r], out_end)
        steps: list[dict] = []
        fallbacks: list[tuple] = []
        arena: list[tuple[str, int, int, int]] = []  # (root or scratch name, start, end, nbytes)
        native_reads: set[str] = set()
        for i, node in enumerate(nodes):
            if i in fused:
                continue
            if native[i]:
                step = native[i]
                if step["op"] == 0:  # an alias: nothing to run
                    continue
                step["node"] = i
                for port in ("a", "b", "c", "d"):
                    if port in step:
                        native_reads.add(self._root(step[port]))
                        step[port] = slot(step[port])
                for port in ("y", "y2", "y3"):
                    if port in step:
                        step[port] = slot(step[port])
                for s in ("s0", "s1"):
                    if s in step:
                        name, nbytes = f"#scratch{i}.{s}", step[s]
                        arena.append((name, i, i, nbytes))
                        kind[name] = Slot.SLOT_ARENA
                        step[s] = slot(name)
                steps.append(step)
            else:
                args = [(slot(v), tuple(np.shape(self._value(env, v)))) for v in self._args[i]]
                outs = []
                for v in node.outputs:
                    a = env[v]
                    outs.append((slot(v), a.shape, a.dtype.num))
                fallbacks.append((self._steps[i], args, outs, f"node {node.name!r} ({node.op})"))
                steps.append({"op": PlanStep.PS_FALLBACK, "node": i, "m": len(fallbacks) - 1})
        for r, k in kind.items():
            if k == Slot.SLOT_ARENA and not r.startswith("#scratch") and r in slots:
                arena.append((r, producer[r], end.get(r, producer[r]), env[r].nbytes))
        offsets, arena_size = _assign(arena)
        out_specs = []
        for name in self._output_names:
            if name in self._consts and name not in env:
                out_specs.append((-1, np.array(self._consts[name])))
            else:
                out_specs.append((slot(name), tuple(env[name].shape)))
        slot_specs = []
        for r in sorted(slots, key=slots.__getitem__):
            k = kind[r]
            if k == Slot.SLOT_INPUT:
                info: Any = self._input_names.index(r)
            elif k == Slot.SLOT_CONST:
                info = np.ascontiguousarray(static[r] if r in static else self._consts[r])
            elif k == Slot.SLOT_ARENA:
                info = offsets[r]
            else:
                info = None
            if r.startswith("#scratch"):
                shape, dtype = (0,), np.uint8
            else:
                a = self._value(env, r)
                shape, dtype = np.shape(a), np.asarray(a).dtype
            slot_specs.append((k, info, tuple(shape), np.dtype(dtype), r in native_reads))
        return K.PlanProgram(
            {
                "inputs": [slots.get(v, -1) for v in self._input_names],
                "input_types": [np.dtype(s.dtype).num for s in self.graph.inputs],
                "slots": slot_specs,
                "arena_size": arena_size,
                "steps": steps,
                "fallbacks": fallbacks,
                "outputs": out_specs,
            }
        )

    def _fixed_by_shapes(self, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The values fixed by the input shapes (see the module docstring), as env holds them, by name: the
        outputs of nodes run in Python (not views, not already fused) whose every run-time operand is a stored
        tensor, such a value, or read for its shape only; with a linear, the output of the relu it runs."""
        fixed: dict[str, np.ndarray] = {}
        for i, node in enumerate(self.graph.nodes):
            if i in self._fused or node.op in _VIEWS or any(v not in env for v in node.outputs):
                continue
            shape_only = {p.name for p in OPS[node.op].inputs if p.shape_only}
            if all(self._root(v) in self._consts or self._root(v) in fixed or p in shape_only
                   for p, v in node.inputs.items()):
                relu = [self.graph.nodes[self._relu_of[i]]] if i in self._relu_of else []
                for v in [v for n in [node, *relu] for v in n.outputs]:  # a fused relu's output is the linear's
                    fixed[v] = env[v].copy()  # a copy: env's arrays are the compiling call's outputs, the caller's
        return fixed

    def _attention_steps(self, env: dict[str, np.ndarray]) -> dict[int, dict]:
        """The attention nodes that run natively at the shapes of env, by node: each one's executor step, with
        "fused": the permutes it makes unnecessary. An attention reads q, k or v in place where it is a
        permute (0, 2, 1, 3) of a rank-4 array, and writes its context where a permute (0, 2, 1, 3) would read it
        (its only use), into that permute's output; such a permute runs no more when every use is folded."""
        nodes, outputs = self.graph.nodes, set(self._output_names)

        def heads_permute(v: str) -> int | None:
            j = self._producer.get(v)
            if j is None or nodes[j].op != "permute" or list(nodes[j].attrs["perm"]) != _HEADS_PERM:
                return None
            if self.graph.nodes[self._producer.get(self._root(nodes[j].inputs["x"]), j)].op == "attention":
                return None  # maybe the context permute of an attention writing through it: never made
            x = env.get(nodes[j].inputs["x"])
            return j if isinstance(x, np.ndarray) and x.ndim == 4 and x.dtype == np.float32 else None

        found: dict[int, dict] = {}
        read_in_place: dict[int, list[int]] = {}  # permute -> attention nodes reading through it
        for i, node in enumerate(nodes):
            native = getattr(self._steps[i], "native", None)  # qrt.cpu.attention's native_attention
            mask = node.inputs.get("mask")
            if node.op != "attention" or native is None or any(v in self._consts for v in self._args[i]):
                continue
            if any(env[node.inputs[p]].dtype != np.float32 for p in "qkv"):
                continue
            sources = [heads_permute(node.inputs[p]) for p in "qkv"]
            out = node.outputs[0]
            uses = self._uses.get(out, [])
            after = uses[0] if len(uses) == 1 and out not in outputs else None
            if after is not None and (nodes[after].op != "permute" or list(nodes[after].attrs["perm"]) != _HEADS_PERM
                                      or env[out].ndim != 4):
                after = None
            shapes = [env[node.inputs[p]].shape for p in "qkv"]
            kernel_step = native(*shapes, None if mask is None else env[mask],
                                 tuple(j is not None for j in sources) + (after is not None,))
            if kernel_step is None:
                continue
            step = {"op": PlanStep.PS_ATTENTION, "kernel": kernel_step, "fused": [] if after is None else [after],
                    "y": out if after is None else nodes[after].outputs[0]}
            for port, p, j in zip("abc", "qkv", sources):
                step[port] = node.inputs[p] if j is None else nodes[j].inputs["x"]
                if j is not None:
                    read_in_place.setdefault(j, []).append(i)
            if mask is not None:
                step["d"] = mask
            found[i] = step
        for j, readers in read_in_place.items():
            v = nodes[j].outputs[0]
            if v not in outputs and all(u in found and nodes[u].inputs.get("mask") != v for u in self._uses.get(v, [])):
                found[readers[0]]["fused"].append(j)
        return found

    def _stack_linears(self, env: dict[str, np.ndarray], merged: dict[int, dict], fused: set[int]) -> dict[int, dict]:
        """The members of each group of linears reading one input (self._linear_groups) whose outputs only attention
        steps read, reading each as q, k or v (they take a row stride), at the shapes of env, run as one product
        (qrt/stacked_linears.py): its step by node, the group's first, writing a new value "#stacked<node>" (put in
        env), the members' outputs side by side (head by head where every reader takes them by heads); the
        attention steps among merged (the steps that also run nodes before them) are changed to read them there,
        the other members join fused. Where another step reads an output, its linear runs alone (no copy is
        made)."""
        nodes, outputs = self.graph.nodes, {self._root(v) for v in self._output_names}
        reads: dict[str, list[tuple[int, str | None]]] = {}  # root -> (node, its attention step's port or None)
        for i, node in enumerate(nodes):
            if i in fused or node.op in _VIEWS:
                continue
            step = merged.get(i)
            if step is None:
                ports = [(None, v) for v in self._args[i]]
            else:  # an attention's q, k, v (and mask) by port; a layer_norm's add operands are plain reads
                attention = step["op"] == PlanStep.PS_ATTENTION
                ports = [(p if attention else None, step[p]) for p in "abcd" if p in step]
            for port, v in ports:
                reads.setdefault(self._root(v), []).append((i, port))
        operand = dict(zip("abc", "qkv"))

        def strided(t: int) -> bool:  # only attention steps read t's output, each row of it as one row of theirs
            out = nodes[t].outputs[0]
            for i, port in reads.get(out, []):
                if port not in operand:
                    return False
                seen = env[merged[i][port]].shape  # [B, L, H, E] under the heads permute, else the operand's
                through_heads = merged[i][port] != nodes[i].inputs[operand[port]]
                if math.prod(seen[-2:] if through_heads else seen[-1:]) != env[out].shape[-1]:
                    return False
            return out not in outputs

        def heads_seen(t: int) -> tuple[int, int] | None:  # (B, H) where every reader takes t's output by heads
            seen = set()
            for i, port in reads.get(nodes[t].outputs[0], []):
                if merged[i][port] == nodes[i].inputs[operand[port]]:
                    return None
                b, _, h, _ = env[merged[i][port]].shape  # [B, L, H, E], the heads permute's input
                seen.add((b, h))
            return seen.pop() if len(seen) == 1 else None

        stacked: dict[int, dict] = {}
        # attention node -> port -> (value, column offset, row width[, head stride])
        columns: dict[int, dict[str, tuple]] = {}
        for group in self._linear_groups:
            members = [t for t in group if t not in fused and strided(t)]
            if len(members) < 2:
                continue
            # read by heads alike: the members' columns head by head (q, k, v of head 0, then of head 1, ...), so that
            # a product split by panels writes whole heads, the ones the attention's task of those heads reads
            seen = {heads_seen(t) for t in members}
            batch, heads = seen.pop() if len(seen) == 1 and None not in seen else (0, 1)
            kernel = self._stacked.get((tuple(members), heads))
            if kernel is None:
                kernel = stacked_linear([nodes[t] for t in members], self._consts, heads)
                self._stacked[(tuple(members), heads)] = kernel
            name, outs = f"#stacked{members[0]}", [env[nodes[t].outputs[0]] for t in members]
            m = outs[0].size // outs[0].shape[-1]
            env[name] = np.concatenate([y.reshape(m, heads, -1) for y in outs], axis=2).reshape(m, -1)
            offset = 0
            for t, y in zip(members, outs):
                for i, port in reads.get(nodes[t].outputs[0], []):
                    columns.setdefault(i, {})[port] = (name, offset, kernel.out_features) + (
                        (kernel.out_features // heads,) if heads > 1 else ())
                offset += y.shape[-1] // heads
            fused.update(members[1:])
            # one batch's heads are split across the threads by the attention: the product splits its panels so
            stacked[members[0]] = {"op": PlanStep.PS_LINEAR_DYNAMIC, "a": nodes[members[0]].inputs["x"], "y": name,
                                   "m": m, "kernel": kernel, "relu": 0, "dtype": int(batch == 1 and heads > 1)}
        for i, placed in columns.items():  # each attention step made again, reading its operands where they lie
            node, step = nodes[i], merged[i]
            between = tuple(step[port] != node.inputs[p] for port, p in operand.items()) + (
                step["y"] != node.outputs[0],)
            mask = node.inputs.get("mask")
            step["kernel"] = self._steps[i].native(*(env[node.inputs[p]].shape for p in "qkv"),
                                                   None if mask is None else env[mask], between,
                                                   tuple(placed[p][1:] if p in placed else None for p in "abc"))
            step.update({port: name for port, (name, *_) in placed.items()})
        return stacked

    def _add_norm_steps(self, env: dict[str, np.ndarray], static: Mapping[str, np.ndarray]) -> dict[int, dict]:
        """The layer_norm nodes that run with the add before them at the shapes of env, by node: each one's
        layer_norm step reading the add's operands (the kernel forms fl(a + b) row by row, the add's bits), with
        "fused": that add. Only an add of two float32 operands of x's shape (no broadcasting) whose output nothing
        else reads: a transformer's residual add, one pass over memory fewer (BERT: LayerNorm(dense(h) + h))."""
        nodes, outputs = self.graph.nodes, set(self._output_names)
        found: dict[int, dict] = {}
        for i, node in enumerate(nodes):
            v = node.inputs.get("x", "")
            j = self._producer.get(v)
            if node.op != "layer_norm" or j is None or nodes[j].op != "add" or v in outputs or v in static:
                continue
            if self._uses.get(v) != [i] or j in self._fused or any(u in self._consts for u in self._args[j]):
                continue
            a, b = (env[nodes[j].inputs[p]] for p in ("a", "b"))
            if not (a.dtype == b.dtype == np.float32 and a.shape == b.shape == env[v].shape):
                continue
            step = self._native(i, env, set(), static)
            if step is not None:
                found[i] = {**step, "a": nodes[j].inputs["a"], "b": nodes[j].inputs["b"], "fused": [j]}
        return found

    def _native(self, i: int, env: dict[str, np.ndarray], fused: set[int],
                static: dict[str, np.ndarray]) -> dict | None:
        """The executor step of node i at the shapes of env, or None for the fallback (fused: the nodes
        another step runs; static: the values fixed by the shapes, which a step may add a stored tensor to)."""
        node = self.graph.nodes[i]
        op, c = node.op, {p: self._consts[v] for p, v in node.inputs.items() if v in self._consts}
        if op in _VIEWS or i in fused:
            return {"op": 0}  # nothing to run: an alias
        step, kernel = self._steps[i], self._kernel(i)
        binary = getattr(step, "binary", None) is not None and kernel is not None
        # a stored tensor at a run-time port (a norm's weight, a scale, where's fill, a pad id, a matrix): only the
        # elementwise steps and matmul, which read every operand through its shape, take one; the others read
        # env's values
        if not (binary or op in _MASK_STEPS or op == "matmul") and any(v in self._consts for v in self._args[i]):
            return None
        x = env.get(node.inputs.get("x", ""))
        if op == "quantize_per_tensor":
            dtype = QUANT_DTYPES[node.attrs["dtype"]]
            return {"op": PlanStep.PS_QUANT_T, "a": node.inputs["x"], "y": node.outputs[0], "n": x.size,
                    "dtype": _QCODE[dtype], "scale": float(np.float32(c["scale"])), "zp": int(c["zero_point"]),
                    "round_first": rounds_first(node.attrs)}
        if op == "quantize_per_channel":
            dtype = QUANT_DTYPES[node.attrs["dtype"]]
            view = channel_view(x.shape, node.attrs["axis"])
            return {"op": PlanStep.PS_QUANT_C, "a": node.inputs["x"], "y": node.outputs[0], "view": view,
                    "dtype": _QCODE[dtype], "fvec": np.ascontiguousarray(c["scale"], np.float32),
                    "ivec": np.ascontiguousarray(c["zero_point"], np.int32), "round_first": rounds_first(node.attrs)}
        if op == "dequantize":
            dtype = _QCODE[x.dtype.name]
            if node.attrs["axis"] is None:
                return {"op": PlanStep.PS_DEQUANT_T, "a": node.inputs["x"], "y": node.outputs[0], "n": x.size,
                        "dtype": dtype, "scale": float(np.float32(c["scale"])), "zp": int(c["zero_point"])}
            return {"op": PlanStep.PS_DEQUANT_C, "a": node.inputs["x"], "y": node.outputs[0], "dtype": dtype,
                    "view": channel_view(x.shape, node.attrs["axis"]),
                    "dvec": np.ascontiguousarray(c["scale"], np.float64),
                    "ivec": np.ascontiguousarray(c["zero_point"], np.int32)}
        out = node.outputs[0]
        if op in ("linear", "linear_dynamic", "linear_float") and kernel is not None:
            relu = i in self._relu_of
            if relu:
                out = self.graph.nodes[self._relu_of[i]].outputs[0]
            k = kernel.k if op == "linear_float" else kernel.in_features
            step = {"a": node.inputs["x"], "y": out, "m": x.size // k, "kernel": kernel, "relu": int(relu)}
            if op == "linear":
                step["op"] = PlanStep.PS_LINEAR
            elif op == "linear_dynamic":
                step["op"] = PlanStep.PS_LINEAR_DYNAMIC
            else:
                step["op"] = PlanStep.PS_LINEAR_FLOAT
                bias = getattr(self._steps[i], "bias", None)
                if bias is not None:
                    step["fvec"] = bias
            return step
        if op in CELL_OPS and kernel is not None:
            has_c = "c" in node.inputs
            h = node.inputs["h"]
            rows = x.shape[0] * kernel.hidden * (4 if op.startswith("lstm") else 3 if op.startswith("gru") else 1)
            return {"op": PlanStep.PS_CELL, "a": node.inputs["x"], "b": h, "c": node.inputs["c"] if has_c else h,
                    "y": node.outputs[0], "y2": node.outputs[1] if has_c else node.outputs[0], "m": x.shape[0],
                    "kernel": kernel, "s0": rows * 4, "s1": rows * 4}
        if op == "relu" and x.dtype == np.float32:
            return {"op": PlanStep.PS_RELU, "a": node.inputs["x"], "y": out, "n": x.size}
        if op == "add":
            a, b = (self._value(env, node.inputs[p]) for p in ("a", "b"))
            if a.shape == b.shape and a.dtype == b.dtype == np.float32:
                return {"op": PlanStep.PS_ADD, "a": node.inputs["a"], "b": node.inputs["b"], "y": out, "n": a.size}
        if op in SEQUENCE_OPS:
            return self._sequence(i, env)
        if op == "embedding" and kernel is not None:
            indices = env[node.inputs["indices"]]
            if indices.dtype in (np.int64, np.int32):
                return {"op": PlanStep.PS_EMBEDDING, "a": node.inputs["indices"], "y": out, "n": indices.size,
                        "dtype": int(indices.dtype == np.int32), "kernel": kernel}
        if op in ("softmax", "log_softmax") and kernel is not None and x.dtype == np.float32:
            log = int(op == "log_softmax")  # in the step's dtype field
            return {"op": PlanStep.PS_SOFTMAX, "a": node.inputs["x"], "y": out, "dtype": log,
                    "view": channel_view(x.shape, node.attrs["dim"]), "kernel": kernel}
        if op in ("select", "slice"):
            return _copy_step(node, x)
        if op == "gather" and env[node.inputs["index"]].dtype == np.int64:
            return self._gather(i, node.inputs["x"], node.inputs["index"], env, static)
        if op == "cumsum":  # x is bool or an integer (the loader checked): the step runs every such x
            running = K.CumsumStep(channel_view(x.shape, node.attrs["dim"]), x.dtype.name)
            return {"op": PlanStep.PS_CUMSUM, "a": node.inputs["x"], "y": out, "kernel": running}
        if op in ("cat", "stack"):
            return _cat_step(node, env, out)
        if op == "matmul" and getattr(step, "native", None) is not None:
            a, b = (self._value(env, node.inputs[p]) for p in ("a", "b"))
            mm = step.native(a.shape, b.shape)
            return None if mm is None else {"op": PlanStep.PS_MATMUL, "a": node.inputs["a"], "b": node.inputs["b"],
                                            "y": out, "kernel": mm}
        if op in _MASK_STEPS:
            ports = _MASK_PORTS.get(op, ("a", "b"))
            return _mask_step(node, [self._value(env, node.inputs[p]) for p in ports], env[out], ports)
        if binary:
            a, b = (self._value(env, node.inputs[p]) for p in ("a", "b"))
            y = env[out]
            if a.dtype == b.dtype == np.float32 and y.ndim:
                return {"op": PlanStep.PS_BINARY, "a": node.inputs["a"], "b": node.inputs["b"], "y": out,
                        "kernel": K.BinaryStep(kernel, step.binary, a.shape, b.shape, y.shape)}
        if getattr(step, "sum_dims", None) is not None and kernel is not None and x.dtype == np.float32:
            dims = step.sum_dims
            if dims == list(range(dims[0], dims[-1] + 1)) and env[out].size:
                return {"op": PlanStep.PS_SUM, "a": node.inputs["x"], "y": out, "dtype": int(op == "mean"),
                        "kernel": kernel, "view": channel_view(x.shape, dims[0], dims[-1] + 1)}
        if getattr(step, "unary", None) is not None and kernel is not None and x.dtype == np.float32:
            return {"op": PlanStep.PS_UNARY, "a": node.inputs["x"], "y": out, "n": x.size,
                    "dtype": K.UNARY_OPS[step.unary], "kernel": kernel}
        if op == "batch_norm" and kernel is not None and x.dtype == np.float32 and x.size:
            alpha, beta = self._steps[i].terms
            if x.shape[1] != alpha.shape[0]:
                return None  # the step says what is wrong
            return {"op": PlanStep.PS_BATCH_NORM, "a": node.inputs["x"], "y": out, "view": channel_view(x.shape, 1),
                    "fvec": alpha, "fvec2": beta, "kernel": kernel}
        if op == "layer_norm" and kernel is not None and x.dtype == np.float32:
            k = node.attrs["normalized_dims"]
            stored = next((c[p].shape for p in ("weight", "bias") if p in c), None)
            if stored is not None and x.shape[x.ndim - k :] != stored:
                return None  # the step says what is wrong
            n = math.prod(x.shape[x.ndim - k :])
            ln = {"op": PlanStep.PS_LAYER_NORM, "a": node.inputs["x"], "y": out, "m": x.size // n, "n": n,
                  "scale": float(node.attrs["eps"]), "kernel": kernel}
            for port, field in (("weight", "fvec"), ("bias", "fvec2")):
                if port in c:
                    ln[field] = c[port].reshape(-1)
            return ln
        return None

    def _gathered_columns(self, env: dict[str, np.ndarray], static: dict[str, np.ndarray],
                          fused: set[int]) -> dict[int, dict]:
        """Products whose columns only a gather reads, at the shapes of env: each matmul whose b is stored or fixed
        by the shapes and whose output only a gather along its last dimension reads (among the nodes that run:
        fused, not those fixed by the shapes, which read only its shape), with an index fixed by the
        shapes, computes only the columns from the index's least to its largest, and the gather reads them with
        the index shifted by the least (both added to static). Each column is the same chain of sums wherever it
        lies in b, so the bits are the whole product's. DeBERTa's relative attention takes 2L - 1 of its 512
        relative positions, and its two products against them were four fifths of its products' work. By node:
        the matmul's step and the gather's ("fused": none)."""
        nodes, outputs, found = self.graph.nodes, set(self._output_names), {}
        for i, node in enumerate(nodes):
            v, name = node.inputs.get("x", ""), node.inputs.get("index", "")
            j = self._producer.get(v)
            if node.op != "gather" or self._root(name) not in static or j is None or nodes[j].op != "matmul":
                continue
            b_name = nodes[j].inputs["b"]
            if v in outputs or v in static or [u for u in self._uses.get(v, []) if u not in fused] != [i] or not (
                    self._root(b_name) in static or self._root(b_name) in self._consts):
                continue
            x, index, b = env[v], env[name], self._value(env, b_name)
            lo, hi = (int(index.min()), int(index.max())) if index.size else (0, -1)
            if node.attrs["dim"] != x.ndim - 1 or b.ndim < 2 or lo < 0 or hi >= x.shape[-1] \
                    or hi - lo + 1 == x.shape[-1]:
                continue  # every column, or an index out of range (the per-node step names it)
            native = getattr(self._steps[j], "native", None)
            if native is None:
                continue
            columns = f"{b_name}#columns{lo}:{hi}"
            static[columns] = env[columns] = np.ascontiguousarray(b[..., lo : hi + 1])
            mm = native(env[nodes[j].inputs["a"]].shape, env[columns].shape)
            shifted = f"{name}-{lo}"
            static[shifted] = env[shifted] = (index - lo).astype(np.int64)  # int32 or int64: the step reads int64
            band = f"{v}#columns{lo}:{hi}"
            env[band] = np.empty(x.shape[:-1] + (hi - lo + 1,), x.dtype)
            gather = self._gather(i, band, shifted, env, static)
            if mm is None or gather is None:
                continue
            found[j] = {"op": PlanStep.PS_MATMUL, "a": nodes[j].inputs["a"], "b": columns, "y": band, "kernel": mm,
                        "fused": []}
            found[i] = {**gather, "fused": []}
        return found

    def _gather(self, i: int, x_name: str, name: str, env: dict[str, np.ndarray],
                static: dict[str, np.ndarray]) -> dict | None:
        """A gather of x (x_name) at an int64 index (name) spanning x outside dim (K.GatherStep), or None for the
        fallback. An index fixed by the shapes that repeats its leading blocks (expanded over the dimensions before
        dim: DeBERTa's relative positions, one [L, L] block for every head) is stored as its first period of
        blocks, added to static, and the step reads that again and again: one block of index in cache, not a copy
        per head."""
        node = self.graph.nodes[i]
        x, index, dim = env[x_name], env[name], node.attrs["dim"]
        period = _index_period(index, dim) if self._root(name) in static else None
        try:
            g = K.GatherStep(x.shape, index.shape, dim, x.itemsize, period)
        except ValueError:
            return None
        if period is not None and period < math.prod(index.shape[:dim]):
            block = index.reshape(-1)[: period * math.prod(index.shape[dim:])]
            name = f"{name}#period{period}"  # one for every gather of this index at this period
            static[name] = env[name] = np.ascontiguousarray(block)
        return {"op": PlanStep.PS_GATHER, "a": x_name, "b": name, "y": node.outputs[0], "kernel": g}

    def _sequence(self, i: int, env: dict[str, np.ndarray]) -> dict | None:
        """A whole-sequence op: every layer and direction in one native step (K.SequenceStep)."""
        node = self.graph.nodes[i]
        runs = getattr(self._steps[i], "runs", None)
        values = [env[v] for v in self._args[i]]
        if runs is None or any(v.dtype != np.float32 for v in values):
            return None
        x = values[0]
        steps, batch = (x.shape[1], x.shape[0]) if node.attrs["batch_first"] else x.shape[:2]
        has_cell = node.op.startswith("lstm")
        kernel = K.SequenceStep(runs, has_cell, node.attrs["batch_first"], steps, batch)
        step = {"op": PlanStep.PS_SEQUENCE, "a": node.inputs["x"], "y": node.outputs[0], "y2": node.outputs[1],
                "kernel": kernel, "s0": kernel.scratch_bytes}
        for state, port in (("h0", "b"), ("c0", "c")):  # a state not given starts at zeros
            if state in node.inputs:
                step[port] = node.inputs[state]
        if has_cell:
            step["y3"] = node.outputs[2]
        return step


def _index_period(index: np.ndarray, dim: int) -> int:
    """The fewest leading blocks of a gather's index (its dimensions from dim on) that it repeats over the
    dimensions before dim: the size of dimensions d to dim for the largest d at which the index is its first
    blocks tiled (all of them, at d = 0)."""
    outer = math.prod(index.shape[:dim])
    blocks = index.reshape(outer, -1)
    for d in range(dim, 0, -1):
        period = math.prod(index.shape[d:dim])
        if (blocks.reshape(outer // period, period, -1) == blocks[:period]).all():
            return period
    return outer


# the ports a mask step reads, when not a and b
_MASK_PORTS = {"where": ("condition", "a", "b"), **dict.fromkeys(("cast", "logical_not", "expand", "permute", "clamp"),
                                                                 ("x",))}


def _mask_step(node, operands: list[np.ndarray], y: np.ndarray, ports: tuple[str, ...]) -> dict | None:
    """A mask op (_MASK_STEPS) at these operands' shapes (K.MaskStep), or None for the fallback: a cast or a clamp
    it does not run, shapes the op rejects (the step says why)."""
    x = operands[0]
    try:
        if node.op in ("expand", "permute"):
            perm = tuple(node.attrs["perm"]) if node.op == "permute" else None
            kernel = K.MaskStep(node.op, y.shape, [x.shape], x.itemsize, perm=perm)
        elif node.op == "cast":
            kernel = K.MaskStep("cast", y.shape, [x.shape], x.itemsize, x.dtype.name, y.dtype.name)
        elif node.op == "clamp":
            if x.dtype != np.float32 or y.dtype != np.float32:
                return None
            lo, hi = (None if node.attrs[k] is None else float(np.float32(node.attrs[k])) for k in ("min", "max"))
            kernel = K.MaskStep("clamp", y.shape, [x.shape], 4, lo=lo, hi=hi)
        elif node.op == "where":  # a bool condition, a and b of y's dtype (the loader checked)
            kernel = K.MaskStep("where", y.shape, [a.shape for a in operands], y.itemsize)
        else:  # logic on bools; comparisons and integer arithmetic of the types the loader allows
            kernel = K.MaskStep(node.op, y.shape, [a.shape for a in operands], 1, x.dtype.name, y.dtype.name,
                                src2=operands[-1].dtype.name)
    except (ValueError, KeyError):
        return None
    step = {"op": PlanStep.PS_MASK, "kernel": kernel, "y": node.outputs[0]}
    for slot, port in zip("abc", ports):
        step[slot] = node.inputs[port]
    return step


def _cat_step(node, env: dict[str, np.ndarray], out: str) -> dict | None:
    """cat, stack of up to four operands (K.CatStep), or None for the fallback: in each of the blocks before dim,
    each operand's own block in turn."""
    ports = sorted(node.inputs, key=lambda p: int(p[1:]))  # x0, x1, ...
    xs, y = [env[node.inputs[p]] for p in ports], env[out]
    if len(xs) > 4:
        return None
    dim = node.attrs["dim"]  # stack: a dimension of y, not of the operands
    blocks = tuple(math.prod(x.shape[dim:]) * x.itemsize for x in xs)
    step = {"op": PlanStep.PS_CAT, "y": out, "kernel": K.CatStep(math.prod(y.shape[:dim]), blocks, y.itemsize)}
    for slot, port in zip("abcd", ports):
        step[slot] = node.inputs[port]
    return step


def _copy_step(node, x: np.ndarray) -> dict:
    """select, slice: the blocks of x they keep, one after the other (PlanStep.PS_COPY, in bytes)."""
    dim = node.attrs["dim"]
    size = x.shape[dim]
    row = math.prod(x.shape[dim + 1 :]) * x.itemsize  # the bytes of one index along dim
    if node.op == "select":
        index = node.attrs["index"]
        first, count, step = index + size if index < 0 else index, 1, 1
    else:  # clamped as the step clamps it
        first, stop, step = slice(node.attrs["start"], node.attrs["end"], node.attrs["step"]).indices(size)
        count = len(range(first, stop, step))
    block = row
    if step == 1:  # consecutive indices: one block per outer row
        block, count = row * count, 1
    return {"op": PlanStep.PS_COPY, "a": node.inputs["x"], "y": node.outputs[0], "offset": first * row,
            "stride": step * row, "outer_stride": size * row, "view": (math.prod(x.shape[:dim]), count, block)}


def _assign(values: list[tuple[str, int, int, int]]) -> tuple[dict[str, int], int]:
    """Offsets in one arena for values live over [start, end] steps: first fit among the blocks live at
    the same time, so values whose lifetimes do not overlap share memory."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[str, int] = {}
    top = 0
    for name, start, end, nbytes in sorted(values, key=lambda v: (v[1], -v[3])):
        size = max(-(-nbytes // _ALIGN) * _ALIGN, _ALIGN)
        live = sorted((o, s) for o, s, a, b in placed if not (b < start or end < a))
        offset = 0
        for o, s in live:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        placed.append((offset, size, start, end))
        offsets[name] = offset
        top = max(top, offset + size)
    return offsets, top


class Stream:
    """Steps a model with recurrent state, keeping the state inside between calls.

    ``state`` maps each state input to the output that is its next value (for example
    ``{"h": "cell.h", "c": "cell.c"}``); by default the h (and c) inputs and outputs of the model's
    cell nodes. ``step(inputs)`` takes the other inputs (one array, or a list in input order) and
    returns the model's outputs as ``Model.run`` does. No state is copied: each step writes the new
    state into new arrays, which the next step reads in place, so the returned state arrays are
    read-only. ``reset()`` starts again from zeros (the state at creation) of the next step's batch
    size; ``reset(state)`` from given arrays by input name (copied once).
    A Stream is one sequence: use one per thread. On the GPU (a model loaded with device="cuda"),
    the state stays in device memory between steps; the outputs are CuPy arrays if a step's inputs
    are, else NumPy arrays.
    """

    def __init__(self, plan: Any, state: Mapping[str, str] | None = None) -> None:
        g = plan.graph
        self._plan = plan
        names = [s.name for s in g.inputs]
        outs = [s.name for s in g.outputs]
        if state is None:
            state = _cell_states(g)
        if not state:
            raise ValueError("the model has no state to keep: give state={input: output}")
        for i, o in state.items():
            if i not in names or o not in outs:
                raise ValueError(f"state {i!r} -> {o!r}: expected an input of {names} and an output of {outs}")
        self._state_in = [names.index(i) for i in state]
        self._state_out = [outs.index(o) for o in state.values()]
        self._free = [k for k in range(len(names)) if k not in self._state_in]
        self._specs = g.inputs
        self._specs_out = g.outputs
        # the GPU's plan takes CuPy arrays too, and says which library an array belongs to
        self._array_module = getattr(plan, "array_module", None)
        self._tree = g.output_structure
        self._flat = g.output_structure == tuple(range(len(g.outputs)))
        self._tuple = g.output_tuple
        self._state: list[np.ndarray] | None = None
        self._names = names

    def reset(self, state: Mapping[str, np.ndarray] | None = None) -> None:
        """Start a new sequence: from zeros (of the next step's batch), or from the given state by input name."""
        if state is None:
            self._state = None
            return
        if not isinstance(state, Mapping):
            names = [self._names[k] for k in self._state_in]
            raise ValueError(f"reset: give the state by input name, a dict of {names}, not a {type(state).__name__}")
        arrays, batch = [], None
        for k in self._state_in:
            spec = self._specs[k]
            if spec.name not in state:
                raise ValueError(f"reset: missing state {spec.name!r}")
            a = check_input(spec, state[spec.name], self._array_module).copy()  # checked as Model.run does
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
            if spec.shape and spec.shape[0] is None:  # a batch: one for all the state
                if batch is not None and a.shape[0] != batch[1]:
                    raise ValueError(f"reset: {batch[0]!r} has batch {batch[1]} but {spec.name!r} has batch "
                                     f"{a.shape[0]}")
                batch = batch or (spec.name, a.shape[0])
            arrays.append(a)
        self._state = arrays

    def step(self, inputs: np.ndarray | Sequence[np.ndarray]) -> Any:
        executor = getattr(self._plan, "_executor", None)  # the CPU plan's native programs
        if self._state is not None and executor is not None:  # the common step, in one native call
            result = executor.stream_step(inputs, self._free, self._state, self._state_in, self._state_out)
            if result is not None:
                return result
        given = [inputs] if not isinstance(inputs, (list, tuple)) else list(inputs)
        if len(given) != len(self._free):
            raise ValueError(f"step takes {len(self._free)} input(s): {[self._names[k] for k in self._free]}")
        flat: list[Any] = [None] * len(self._names)
        for k, a in zip(self._free, given):
            flat[k] = check_input(self._specs[k], a, self._array_module)
        if self._state is None:
            first = flat[self._free[0]] if self._free else None
            batch = first.shape[0] if first is not None and first.ndim else 1
            self._state = [self._zeros(k, batch) for k in self._state_in]
        for k, a in zip(self._state_in, self._state):
            flat[k] = a
        if self._array_module is None:
            out = self._plan.run(flat)
            state = [out[j] for j in self._state_out]
            for a in state:
                a.flags.writeable = False
        else:  # the GPU's plan: the state stays in device memory, the rest goes where the inputs came from
            on_gpu = any(not isinstance(a, np.ndarray) for a in given)
            out = self._plan.run(flat, [on_gpu or j in self._state_out for j in range(len(self._specs_out))])
            state = [out[j] for j in self._state_out]
            if not on_gpu:
                out = [a if isinstance(a, np.ndarray) else a.get() for a in out]
        self._state = state
        return self._result(out)

    def _result(self, out: list[np.ndarray]) -> Any:
        if self._flat:
            return tuple(out) if self._tuple else out[0]
        return nest(self._tree, out)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The current state by input name (read-only arrays; empty before the first step)."""
        if self._state is None:
            return {}
        return {self._names[k]: a for k, a in zip(self._state_in, self._state)}

    def _zeros(self, k: int, batch: int) -> np.ndarray:
        spec = self._specs[k]
        shape = [batch if i == 0 and d is None else d for i, d in enumerate(spec.shape)]
        if any(d is None for d in shape):
            raise ValueError(f"state {spec.name!r} has free dimensions beyond the batch: give it with reset(state=...)")
        a = np.zeros(shape, spec.dtype)
        a.flags.writeable = False
        return a


def _cell_states(g: Graph) -> dict[str, str]:
    """h (and c) of the cell nodes whose states are graph inputs and whose new states are outputs."""
    inputs = {s.name for s in g.inputs}
    outputs = {s.name for s in g.outputs}
    state: dict[str, str] = {}
    for node in g.nodes:
        if node.op in CELL_OPS:
            for port, out in zip(("h", "c"), node.outputs):
                v = node.inputs.get(port)
                if v in inputs and out in outputs:
                    state[v] = out
    return state

"""The graph of a .qrt file: parsing and validation of its JSON form.

``parse_graph`` is the one pass that turns untrusted JSON into a ``Graph``
whose every reference is defined, whose nodes are in an executable order,
and whose every value has a known dtype and shape. Nothing downstream
re-checks what is checked here; run-time checks cover only what depends on
the actual inputs (free dimensions).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Union

import numpy as np

from .errors import FormatError
from .layout import PackedMatrix
from .ops import FLOAT_RECURRENT_OPS, MAX_DIM, MAX_RANK, OPS, ValueInfo

# float64 exists only as stored per-channel scales (format version 2): no op takes a float64 run-time value,
# so a model input may not be float64. int64 is a run-time dtype only (embedding indices, tensor ops), and so is
# bool (attention masks, comparisons: numpy bool_ arrays).
INPUT_DTYPES = ("float32", "float16", "uint8", "int8", "int32", "int64", "bool")
VALUE_DTYPES = INPUT_DTYPES + ("float64",)
MAX_NAME = 256
# input_structure / output_structure (format version 3): trees of tuples over input / output indices.
TREES_SINCE = 3
# the attribute `engine` of the linear and recurrent ops (format version 5): x86 (fbgemm) or qnnpack numerics
ENGINE_SINCE = 5
# ... and of the quantize ops (format version 6): qnnpack's quantization rounds as torch on aarch64
QUANTIZE_ENGINE_SINCE = 6
QUANTIZE_OPS = ("quantize_per_tensor", "quantize_per_channel")
ACTIVATION_SINCE = 7  # linear_dynamic's attribute 'activation'
# the ops of transformer encoders and their masks, and bool values (format version 7)
OP_SINCE = dict.fromkeys(
    ("matmul", "attention", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "where",
     "cast", "clamp", "sqrt", "rsqrt", "arange", "expand", "index_select", "gather"),
    7,
)
OP_SINCE.update(dict.fromkeys(FLOAT_RECURRENT_OPS, 8))  # recurrent layers kept in float32
OP_SINCE.update(dict.fromkeys(("add_int", "sub_int", "mul_int", "cumsum"), 9))  # integer arithmetic (positions)
OP_SINCE["amax"] = 10  # max pooling over time
OP_SINCE["batch_norm"] = 11  # BatchNorm in inference (tabular models)
OP_SINCE.update(dict.fromkeys(("log", "sin", "cos"), 12))  # relative position buckets (MPNet), rotary embeddings
OP_SINCE.update(dict.fromkeys(("ceil", "floor"), 13))  # rounding to integers (DeBERTa's position buckets)
RESHAPE_LIKE_SINCE = 9  # reshape's attribute 'like_dims' (and input like): sizes of another value
INPUT_DTYPE_SINCE = {"bool": 7}


def node_needs(op: str, attrs: Mapping[str, Any]) -> tuple[int, str]:
    """The format version a node of op with these (given, not defaulted) attributes needs, and what needs it."""
    needs = [(OP_SINCE.get(op, 1), f"op {op!r}")]
    if "engine" in attrs:
        needs.append((QUANTIZE_ENGINE_SINCE if op in QUANTIZE_OPS else ENGINE_SINCE, "attribute 'engine'"))
    if "activation" in attrs:
        needs.append((ACTIVATION_SINCE, "attribute 'activation'"))
    if op == "reshape" and "like_dims" in attrs:
        needs.append((RESHAPE_LIKE_SINCE, "attribute 'like_dims'"))
    return max(needs)
MAX_TREE_DEPTH = 16  # tuples nested deeper are refused: no model needs them, and walking them stays shallow


class ValueSpec(NamedTuple):
    """A named model input or output: dtype and shape (None = free dimension)."""

    name: str
    dtype: str
    shape: tuple

    def __repr__(self) -> str:
        return f"ValueSpec({self.name!r}, {ValueInfo(self.dtype, self.shape).describe()})"


class Node(NamedTuple):
    name: str
    op: str
    inputs: Mapping[str, str]  # port -> value name
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]  # validated, defaults filled in


# A tree over the indices of a graph's inputs or outputs: an int is one array, a tuple a Python tuple.
Tree = Union[int, tuple]


class Graph(NamedTuple):
    inputs: tuple[ValueSpec, ...]
    outputs: tuple[ValueSpec, ...]
    nodes: tuple[Node, ...]  # in execution order
    values: Mapping[str, ValueInfo]
    # One entry per forward() argument: an index into inputs, or a tuple of entries. (0, 1, ..., n-1)
    # when every input is its own argument (as in files without input_structure).
    input_structure: tuple
    # What run returns: an index into outputs (one array), or a tuple of entries.
    output_structure: Tree

    @property
    def output_tuple(self) -> bool:
        """Whether the model returns a tuple (of arrays or of tuples)."""
        return isinstance(self.output_structure, tuple)


def nest(tree: Tree, flat: Sequence[Any]) -> Any:
    """The tree with each index replaced by that element of flat (outputs nested as the model returns them)."""
    return flat[tree] if isinstance(tree, int) else tuple(nest(t, flat) for t in tree)


def tree_names(tree: Tree, specs: tuple[ValueSpec, ...]) -> Any:
    """The tree with each index replaced by the name of that input or output."""
    return nest(tree, [s.name for s in specs])


def tree_text(names: Any) -> str:
    """A tree of names as text: ('x', ('h', 'c')) -> '(x, (h, c))' (a 1-tuple keeps its comma)."""
    if isinstance(names, str):
        return names
    inner = ", ".join(tree_text(n) for n in names)
    return f"({inner},)" if len(names) == 1 else f"({inner})"


def check_input(spec: ValueSpec, a: Any, array_module: Any = None) -> np.ndarray:
    """a as the kernels take it for input spec (C-contiguous, aligned, native byte order), or a
    ValueError naming the input and what was expected."""
    want = np.dtype(spec.dtype)
    xp = np if isinstance(a, np.ndarray) else (array_module(a) if array_module else None)
    if xp is None:
        raise ValueError(
            f"input {spec.name!r}: expected a numpy.ndarray of {spec.dtype}, got {type(a).__name__}"
        )
    if a.dtype != want:
        if a.dtype.kind == want.kind and a.dtype.itemsize == want.itemsize:
            a = a.astype(want)  # other byte order: lossless
        else:
            raise ValueError(f"input {spec.name!r}: dtype is {a.dtype}, expected {spec.dtype}")
    if a.ndim != len(spec.shape) or any(d is not None and d != g for d, g in zip(spec.shape, a.shape)):
        want_shape = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        raise ValueError(f"input {spec.name!r}: shape is {list(a.shape)}, expected {want_shape}")
    a = xp.ascontiguousarray(a)
    return a if xp is not np or a.flags.aligned else a.copy()


def _fail(where: str, msg: str) -> None:
    raise FormatError(f"graph: {where}: {msg}")


def _expect_keys(where: str, obj: Any, required: set, optional: set = frozenset()) -> None:
    if not isinstance(obj, dict):
        _fail(where, f"must be a JSON object, got {type(obj).__name__}")
    missing = required - obj.keys()
    if missing:
        _fail(where, f"missing key(s) {sorted(missing)}")
    extra = obj.keys() - required - optional
    if extra:
        _fail(where, f"unknown key(s) {sorted(extra)}")


def _name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        _fail(where, f"a name must be a string of 1 to {MAX_NAME} characters, got {value!r:.80}")
    return value


def _list(where: str, value: Any) -> list:
    if not isinstance(value, list):
        _fail(where, f"must be a JSON array, got {type(value).__name__}")
    return value


def _shape(where: str, value: Any) -> tuple:
    dims = _list(where, value)
    if len(dims) > MAX_RANK:
        _fail(where, f"rank {len(dims)} exceeds the maximum of {MAX_RANK}")
    for d in dims:
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_DIM):
            _fail(where, f"dimensions must be integers in [0, 2**63 - 1] or null, got {d!r:.40}")
    return tuple(dims)


def _parse_inputs(obj: list, version: int) -> list[ValueSpec]:
    specs = []
    for i, item in enumerate(_list("inputs", obj)):
        where = f"inputs[{i}]"
        _expect_keys(where, item, {"name", "dtype", "shape"})
        name = _name(where, item["name"])
        if item["dtype"] not in INPUT_DTYPES:
            _fail(where, f"dtype must be one of {list(INPUT_DTYPES)}, got {item['dtype']!r:.40}")
        since = INPUT_DTYPE_SINCE.get(item["dtype"], 1)
        if version < since:
            _fail(where, f"dtype {item['dtype']} needs format version {since}, the file says {version}")
        specs.append(ValueSpec(name, item["dtype"], _shape(f"{where}.shape", item["shape"])))
    return specs


def _parse_node(i: int, item: Any, version: int) -> Node:
    where = f"nodes[{i}]"
    _expect_keys(where, item, {"name", "op", "inputs", "outputs"}, {"attrs"})
    name = _name(where, item["name"])
    where = f"node {name!r}"
    op = item["op"]
    if not isinstance(op, str) or op not in OPS:
        _fail(where, f"unknown op {op!r:.60}; known ops: {sorted(OPS)}")
    spec = OPS[op]
    where = f"node {name!r} ({op})"
    inputs = item["inputs"]
    if not isinstance(inputs, dict):
        _fail(where, "inputs must be a JSON object mapping port to value name")
    ports = {p.name: p for p in spec.inputs}
    for port, value in inputs.items():
        if port not in ports:
            _fail(where, f"unknown input {port!r:.60}; {op} takes {list(ports)}")
        _name(f"{where} input {port!r}", value)
    for p in spec.inputs:
        if not p.optional and p.name not in inputs:
            _fail(where, f"missing input {p.name!r}")
    outputs = _list(f"{where} outputs", item["outputs"])
    if len(outputs) != len(spec.outputs):
        _fail(where, f"{op} has {len(spec.outputs)} output(s), got {len(outputs)}")
    outputs = tuple(_name(f"{where} outputs", o) for o in outputs)
    attrs = item.get("attrs", {})
    if not isinstance(attrs, dict):
        _fail(where, "attrs must be a JSON object")
    since, what = node_needs(op, attrs)
    if version < since:
        _fail(where, f"{what} needs format version {since}, the file says {version}")
    try:
        attrs = spec.resolve_attrs(attrs)
    except FormatError as e:
        _fail(where, str(e))
    return Node(name, op, dict(inputs), outputs, attrs)


def _parse_tree(where: str, obj: Any, count: int, what: str, names: list[str]) -> tuple:
    """A JSON array whose leaves are the indices 0 .. count-1, each exactly once -> nested tuples of ints.

    Inner arrays must be non-empty and nest at most MAX_TREE_DEPTH deep, so a tree has exactly
    `count` leaves and at most MAX_TREE_DEPTH * count + 1 arrays, whatever the file claims.
    """
    seen: set[int] = set()

    def walk(node: Any, path: str, depth: int) -> Tree:
        if isinstance(node, list):
            if depth > MAX_TREE_DEPTH:
                _fail(where + path, f"tuples nested deeper than {MAX_TREE_DEPTH} levels")
            if not node and depth > 1:
                _fail(where + path, "an empty array (a tuple needs at least one element)")
            return tuple(walk(c, f"{path}[{i}]", depth + 1) for i, c in enumerate(node))
        if not isinstance(node, int) or isinstance(node, bool):
            _fail(where + path, f"leaves must be {what} indices (integers), got {node!r:.40}")
        if not 0 <= node < count:
            _fail(where + path, f"{node} is not an index into the {count} {what}(s)")
        if node in seen:
            _fail(where + path, f"{what} {node} ({names[node]!r}) appears twice")
        seen.add(node)
        return node

    if not isinstance(obj, list):
        _fail(where, f"must be a JSON array, got {type(obj).__name__}")
    tree = walk(obj, "", 1)
    if len(seen) != count:
        missing = [names[i] for i in range(count) if i not in seen]
        _fail(where, f"{what}(s) {missing[:10]} appear nowhere in it; every {what} must appear exactly once")
    return tree


def _parse_output_structure(obj: Any, version: int, names: list[str]) -> Tree:
    if obj == "single":
        if len(names) != 1:
            _fail("output_structure", f"'single' needs exactly one output, got {len(names)}")
        return 0
    if obj == "tuple":
        return tuple(range(len(names)))
    if not isinstance(obj, list):
        _fail("output_structure", f"must be 'single', 'tuple' or an array of output indices, got {obj!r:.40}")
    if version < TREES_SINCE:
        _fail("output_structure", f"a tree (an array) needs format version {TREES_SINCE}, the file says {version}")
    return _parse_tree("output_structure", obj, len(names), "output", names)


def _execution_order(nodes: list[Node], producer: dict[str, int]) -> list[Node]:
    """Kahn's algorithm, keeping file order among ready nodes; reports cycles."""
    deps = [{producer[v] for v in n.inputs.values() if v in producer} for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = sorted(nodes[i].name for i, w in enumerate(waiting) if w > 0)
        _fail("nodes", f"the graph has a cycle through {stuck[:10]}")
    return order


def parse_graph(
    obj: Any,
    tensor_infos: Mapping[str, ValueInfo],
    tensors: Mapping[str, np.ndarray],
    version: int,
    row_sums_of: Mapping[str, str] | None = None,
) -> Graph:
    """Validate the JSON graph of a file of format `version` against its tensors and build a Graph.

    row_sums_of: the stored row-sums tensors -> the packed matrix each belongs to; names the graph may
    not use."""
    row_sums_of = row_sums_of or {}
    _expect_keys("graph", obj, {"inputs", "nodes", "outputs", "output_structure"}, {"input_structure"})
    inputs = _parse_inputs(obj["inputs"], version)
    in_names = [s.name for s in inputs]
    if "input_structure" in obj:
        if version < TREES_SINCE:
            _fail("input_structure", f"needs format version {TREES_SINCE}, the file says {version}")
        input_structure = _parse_tree("input_structure", obj["input_structure"], len(inputs), "input", in_names)
    else:
        input_structure = tuple(range(len(inputs)))
    nodes = [_parse_node(i, item, version) for i, item in enumerate(_list("nodes", obj["nodes"]))]

    # Every value name is defined exactly once: a graph input, a tensor or a node output.
    defined: dict[str, str] = {}

    def define(name: str, what: str) -> None:
        if name in defined:
            _fail(what, f"value {name!r} is already defined as {defined[name]}")
        defined[name] = what

    for t in tensor_infos:
        define(t, f"tensor {t!r}")
    for t, owner in row_sums_of.items():
        define(t, f"the row sums of packed tensor {owner!r}")
    for spec in inputs:
        define(spec.name, f"input {spec.name!r}")
    node_names = set()
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name in node_names:
            _fail(f"node {n.name!r}", "duplicate node name")
        node_names.add(n.name)
        for o in n.outputs:
            define(o, f"output of node {n.name!r}")
            producer[o] = i
    for n in nodes:
        where = f"node {n.name!r} ({n.op})"
        for port, v in n.inputs.items():
            if v not in defined:
                _fail(where, f"input {port!r} refers to undefined value {v!r}")
            if v in row_sums_of:
                _fail(where, f"input {port!r} refers to {defined[v]}, which only the kernels read")

    out_names = [_name("outputs", o) for o in _list("outputs", obj["outputs"])]
    if not out_names:
        _fail("outputs", "a model needs at least one output")
    for o in out_names:
        if o not in defined or o in row_sums_of:
            _fail("outputs", f"refers to undefined value {o!r}" if o not in defined else f"{o!r} is {defined[o]}")
        if isinstance(tensors.get(o), PackedMatrix):
            _fail("outputs", f"{o!r} is a tensor stored packed: only weight ports read those")
    output_structure = _parse_output_structure(obj["output_structure"], version, out_names)

    order = _execution_order(nodes, producer)
    values: dict[str, ValueInfo] = dict(tensor_infos)
    values.update({s.name: ValueInfo(s.dtype, s.shape) for s in inputs})
    for n in order:
        spec = OPS[n.op]
        where = f"node {n.name!r} ({n.op})"
        infos = {}
        for port, v in n.inputs.items():
            p = spec.port(port)
            info = values[v]
            if info.dtype not in p.dtypes:
                _fail(where, f"input {port!r} ({v!r}) has dtype {info.dtype}, expected {' or '.join(p.dtypes)}")
            if p.const and v not in tensor_infos:
                _fail(where, f"input {port!r} ({v!r}) must be a stored tensor")
            if not p.packed and isinstance(tensors.get(v), PackedMatrix):
                _fail(where, f"input {port!r} ({v!r}) is stored packed, but this port reads a plain tensor")
            infos[port] = info
        consts = {port: tensors[v] for port, v in n.inputs.items() if v in tensors}
        try:
            out_infos = spec.check(infos, consts, n.attrs)
        except FormatError as e:
            _fail(where, str(e))
        for out, info in zip(n.outputs, out_infos):
            if any(d is not None and d > MAX_DIM for d in info.shape):  # a flatten or cat of huge sizes
                _fail(where, f"output {out!r} would have shape {list(info.shape)}, a dimension over 2**63 - 1")
        values.update(zip(n.outputs, out_infos))

    outputs = tuple(ValueSpec(o, values[o].dtype, values[o].shape) for o in out_names)
    return Graph(tuple(inputs), outputs, tuple(order), values, input_structure, output_structure)

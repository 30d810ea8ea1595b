"""Convert a PyTorch checkpoint into a .qrt file.

    python tools/convert.py model.pt -o model.qrt --model mypkg.models:make_mlp --input-shape 1,37
    python tools/convert.py model.pt -o model.qrt --model mypkg.models:make_mlp --mode static --calib calib.npz
    python tools/convert.py whole_quantized_model.pt -o model.qrt --trust-checkpoint --input-shape 1,37
    python tools/convert.py lm.pt -o lm.qrt --trust-checkpoint --input-shape 35,3 --input-shape "(2,3,200),(2,3,200)"
    python tools/convert.py program.pt2 -o model.qrt    # torch.export.save'd: float, or pt2e-quantized

The model is read by torch.fx, or where torch.fx cannot trace it (or with --frontend export, or from
a .pt2) by torch.export, whose ATen graph is raised to the same graph (tools/export_frontend.py). The
float model is quantized under qrt's backend pattern rules (tools/rules.py) by torchao's pt2e flow
(tools/qrt_quantizer.py; --quantizer pt2e, the default) or torch.ao's FX flow (tools/qrt_backend.py;
--quantizer fx), which give the same reference graph; it is lowered to qrt ops (tools/lower.py). A model
already quantized by torch.ao is lowered as it is. docs/CONVERTER.md has the
lowering table. Errors exit with status 2 and leave no output file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import os
import pickle
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The converter is a package: `tools` in a checkout, `qrt_tools` once installed (pip install 'qrt[convert]',
# which gives the qrt-convert command), so its modules import each other relatively. Run as a script
# (python tools/convert.py) it becomes the checkout's `tools.convert` (PEP 366): the repository root,
# which holds tools/ and qrt/, goes on sys.path.
if __name__ == "__main__" and not __package__:
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)
    __package__ = "tools"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.fx  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import PackedSequence  # noqa: E402

import qrt  # noqa: E402
from qrt.ops import ENGINES  # noqa: E402

from . import export_frontend, keywords, qrt_backend, qrt_quantizer, torchao_frontend  # noqa: E402
from . import lower as qlower  # noqa: E402
from . import shapes as qshapes  # noqa: E402
from .rules import DEFAULT_RULES, MODES, WEIGHT_DTYPES, WEIGHT_SCHEMES, Rules, RulesError, load_rules  # noqa: E402

PRODUCER = f"qrt tools/convert.py {qrt.__version__}"


class ConvertError(Exception):
    """Conversion failed; the message says why, for the user."""


@dataclass
class Result:
    path: str
    mode: str
    inputs: list[str]  # the .qrt file's inputs: forward()'s arguments, a tuple's items as name.0, name.1, ...
    metadata: dict[str, str]
    shapes: dict[str, str] = field(default_factory=dict)  # input -> dtype[dims], "?" where free
    frontend: str = "fx"  # "fx" or "export"
    frontend_note: str = ""  # why the front end ran when auto chose export
    quantizer: str = ""  # which flow quantized a float model: "pt2e" or "fx" ("" for a quantized one)
    engine_note: str = ""  # where the engine came from, where the user did not choose it


# ------------------------------------------------------------ start-up


def startup_rules(rules: Rules | str | os.PathLike | None) -> Rules:
    """Load and check the rules: every pattern must have a front-end declaration and a qrt lowering."""
    try:
        if rules is None:
            r = DEFAULT_RULES.validate()
        elif isinstance(rules, Rules):
            r = rules.validate()
        else:
            r = load_rules(rules)
        qlower.check_patterns([(p.name, p.describe()) for p in r.patterns])
        qrt_backend.check_patterns(r)
    except (RulesError, qlower.LoweringError, qrt_backend.FrontEndError) as e:
        raise ConvertError(str(e)) from None
    return r


# ------------------------------------------------------------ loading


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_factory(spec: str) -> Any:
    """'package.module:factory' -> the callable. The current directory is importable, as with python -m."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConvertError(f"--model must look like package.module:factory, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ConvertError(f"cannot import model module {module_name!r}: {type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConvertError(f"model factory {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConvertError(f"model factory {spec!r} is not callable")
    return obj


def _pickled_globals(message: str) -> str:
    """The classes the weights-only loader refused, from its message, for the user."""
    found = sorted(set(re.findall(r"Unsupported global: GLOBAL ([\w.]+)", message)))
    return f" (it refers to {', '.join(found)})" if found else ""


def _load_weights_only(checkpoint: str) -> Any:
    """torch.load(weights_only=True); a state_dict of torchao weights (Int8Tensor) loads so once torchao is
    imported, which declares its tensor classes safe to the weights-only loader."""
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL torchao." not in str(e) or "torchao" in sys.modules or not torchao_frontend.import_torchao():
            raise
        return torch.load(checkpoint, map_location="cpu", weights_only=True)


def load_model(checkpoint: str, model: str | None, trust_checkpoint: bool) -> nn.Module:
    """The model to convert: factory + state_dict, or (trusted) a whole pickled module."""
    if not os.path.isfile(checkpoint):
        raise ConvertError(f"checkpoint {checkpoint!r} does not exist")
    try:
        obj = _load_weights_only(checkpoint)
        whole = False
    except pickle.UnpicklingError as e:
        if not trust_checkpoint:
            raise ConvertError(
                f"checkpoint {checkpoint!r} is a pickled object, not a plain state_dict; loading it would run "
                "arbitrary code from the file. Pass --trust-checkpoint only if you trust where it came from"
                + _pickled_globals(str(e))
            ) from None
        whole = True
    except Exception as e:
        raise ConvertError(f"cannot read checkpoint {checkpoint!r}: {type(e).__name__}: {e}") from None
    if whole:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            with torchao_frontend.quiet_imports():  # a pickled HuggingFace model imports transformers, and torchao
                obj = torch.load(checkpoint, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ConvertError(f"cannot load pickled checkpoint {checkpoint!r}: {type(e).__name__}: {e}") from None
        if not isinstance(obj, nn.Module):
            raise ConvertError(f"checkpoint {checkpoint!r} holds a {type(obj).__name__}, not an nn.Module")
        if model is not None:
            print(f"note: {checkpoint} is a whole module; --model {model} is not used", file=sys.stderr)
        return obj.eval()

    if isinstance(obj, nn.Module):  # weights_only can still rebuild some modules
        return obj.eval()
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConvertError(f"checkpoint {checkpoint!r} is not a state_dict (a dict of tensors)")
    if model is None:
        raise ConvertError(
            f"checkpoint {checkpoint!r} is a state_dict: pass --model package.module:factory to build the model"
        )
    factory = load_factory(model)
    try:
        net = factory()
    except Exception as e:
        raise ConvertError(f"model factory {model!r} failed: {type(e).__name__}: {e}") from None
    if not isinstance(net, nn.Module):
        raise ConvertError(f"model factory {model!r} returned a {type(net).__name__}, not an nn.Module")
    _load_state_dict(net, obj, checkpoint, model)
    return net.eval()


def _load_state_dict(net: nn.Module, state: dict, checkpoint: str, model: str) -> None:
    expected = net.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: checkpoint {list(state[k].shape)}, model {list(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if shapes:
        problems.append("shape mismatch " + "; ".join(shapes))
    if problems:
        raise ConvertError(f"checkpoint {checkpoint!r} does not fit the model from {model!r}: " + ", ".join(problems))
    # torchao's quantize_ leaves tensor subclasses (Int8Tensor) as weights: they take the float ones' places
    net.load_state_dict(state, strict=True, assign=any(torchao_frontend.is_torchao_tensor(v) for v in state.values()))


def input_names(model: nn.Module) -> list[str]:
    """forward()'s arguments that need an example: its positional parameters without a default."""
    params = list(inspect.signature(model.forward).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
    if not names:
        with_defaults = [p.name for p in params if p.kind in kinds]
        if with_defaults:  # a HuggingFace model: every argument is optional, the user picks the inputs
            raise ConvertError(f"every argument of the model's forward has a default ({', '.join(with_defaults[:4])}"
                               f"{', ...' if len(with_defaults) > 4 else ''}): name the inputs, --input-shape "
                               f"{with_defaults[0]}=SHAPE")
        raise ConvertError("the model's forward takes no arguments")
    return names


def _check_keywords(net: nn.Module, names: Sequence[str]) -> None:
    """Each name a parameter forward() names (one that **kwargs would swallow unread is refused)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [n for n, p in inspect.signature(net.forward).parameters.items() if p.kind in kinds]
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ConvertError(f"forward() takes no argument {', '.join(map(repr, unknown))}; it takes {params}")


def parse_shape(text: str) -> qshapes.Spec:
    """One --input-shape: '1,37', '2,50?,6', '7', '(2,1,200),(2,1,200)' (tools/shapes.py)."""
    try:
        return qshapes.parse(text)
    except qshapes.SpecError as e:
        raise ConvertError(f"--input-shape: {e}") from None


def _as_spec(obj: Any) -> qshapes.Spec:
    try:
        return qshapes.as_spec(obj)
    except qshapes.SpecError as e:
        raise ConvertError(f"input shape: {e}") from None


def parse_dtype(text: str) -> tuple[str, str]:
    """One --input-dtype NAME=DTYPE."""
    name, sep, dtype = text.partition("=")
    if not sep or not name or dtype not in qshapes.DTYPES:
        raise ConvertError(f"--input-dtype must look like NAME=DTYPE with DTYPE one of {list(qshapes.DTYPES)}, "
                           f"got {text!r}")
    return name, dtype


def _set_dtypes(specs: list[qshapes.Spec], names: Sequence[str], dtypes: Mapping[str, str]) -> list[qshapes.Spec]:
    """Give dtypes by argument name (every tensor of it) or flat input name (hidden.0)."""
    known = {n for spec, arg in zip(specs, names) for n, _ in qshapes.leaves(spec, arg)} | set(names)
    unknown = sorted(set(dtypes) - known)
    if unknown:
        raise ConvertError(f"--input-dtype names {unknown}, but the inputs are {sorted(known)}")
    for dtype in dtypes.values():
        if dtype not in qshapes.DTYPES:
            raise ConvertError(f"input dtype must be one of {list(qshapes.DTYPES)}, got {dtype!r}")
    out = []
    for spec, arg in zip(specs, names):
        given = [dtypes.get(name, dtypes.get(arg, leaf.dtype)) for name, leaf in qshapes.leaves(spec, arg)]
        out.append(qshapes.with_dtypes(spec, lambda leaf, i, given=given: given[i])[0])
    return out


def load_calibration(path: str, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Arrays by input name (or one array for a single-input model), float32 (int64 / int32 token ids),
    samples first."""
    if not os.path.isfile(path):
        raise ConvertError(f"calibration data {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:
        raise ConvertError(f"cannot read calibration data {path!r} (an .npz file): {type(e).__name__}: {e}") from None
    if len(names) == 1 and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    unknown = sorted(set(arrays) - set(names))
    missing = [n for n in names if n not in arrays]
    if unknown or missing:
        raise ConvertError(
            f"calibration data {path!r} has arrays {sorted(arrays)}, but the model's inputs are {list(names)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unknown {unknown})" if unknown else "")
        )
    counts = set()
    for n in names:
        a = arrays[n]
        if a.dtype not in (np.float32, np.int64, np.int32):
            raise ConvertError(f"calibration array {n!r} has dtype {a.dtype}, expected float32 (or int64 token ids)")
        if a.ndim < 2 or a.shape[0] == 0:
            raise ConvertError(f"calibration array {n!r} must be [samples, features...], got shape {list(a.shape)}")
        if a.dtype == np.float32 and not np.all(np.isfinite(a)):
            raise ConvertError(f"calibration array {n!r} contains NaN or infinity")
        counts.add(a.shape[0])
    if len(counts) != 1:
        counts_by_name = {n: arrays[n].shape[0] for n in names}
        raise ConvertError(f"calibration arrays have different sample counts: {counts_by_name}")
    return {n: arrays[n] for n in names}


def _check_output_path(output: str) -> None:
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if os.path.isdir(output):
        raise ConvertError(f"output path {output!r} is a directory")
    if not os.path.isdir(folder):
        raise ConvertError(f"cannot write {output!r}: directory {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConvertError(f"cannot write {output!r}: directory {folder!r} is not writable")


PACKED = ("the model packs its sequences (torch.nn.utils.rnn.pack_padded_sequence or pack_sequence), which qrt "
          "does not run: a PackedSequence's batch sizes are data, which neither torch.fx nor torch.export follows. "
          "Convert a forward that runs the recurrent layers on the padded batch (their outputs past each sequence's "
          "length, and the final states of the shorter ones, then differ from the packed run's)")


def _trace(model: nn.Module, names: Sequence[str]) -> torch.fx.GraphModule:
    """torch.fx's graph of the model; forward()'s arguments with a default keep it (concrete)."""
    if isinstance(model, torch.fx.GraphModule):
        return model
    params = inspect.signature(model.forward).parameters
    concrete = {n: p.default for n, p in params.items() if n not in names and p.default is not inspect.Parameter.empty}
    try:
        tracer = export_frontend.Tracer()
        return torch.fx.GraphModule(model, tracer.trace(model, concrete_args=concrete or None), type(model).__name__)
    except Exception as e:
        if any(f.f_code.co_filename == torch.nn.utils.rnn.__file__ and f.f_code.co_name in _PACKING
               for f, _ in traceback.walk_tb(e.__traceback__)):
            raise ConvertError(PACKED) from None  # pack_padded_sequence given a proxy for its lengths
        raise ConvertError(f"torch.fx cannot trace the model ({type(e).__name__}: {e})") from None


def _run_float(model: nn.Module, example: Sequence[Any], specs: Sequence[qshapes.Spec], names: Sequence[str]) -> None:
    try:
        with torch.no_grad():
            model(*example)
    except Exception as e:
        shapes = ", ".join(f"{n}: {qshapes.show(s)}" for n, s in zip(names, specs))
        raise ConvertError(
            f"the model does not run on inputs of the given shapes ({shapes}): {type(e).__name__}: {e}"
        ) from None


def _resolve(gm: torch.fx.GraphModule, specs: Sequence[qshapes.Spec]) -> list[qshapes.Spec]:
    """The specs with every dtype filled in (int64 for an embedding's indices, else float32)."""
    try:
        return qlower.resolve_specs(gm, export_frontend.describe, specs)[0]
    except qlower.LoweringError as e:
        raise ConvertError(str(e)) from None


# ------------------------------------------------------------ front ends

FRONTENDS = ("auto", "fx", "export")


def _load_program(path: str, frontend: str, input_shapes: Sequence[Any] | None, trust_checkpoint: bool) -> tuple:
    """A .pt2 program raised to a torch-level graph, its input specs (dynamic dimensions free) and names."""
    if frontend == "fx":
        raise ConvertError(f"{path!r} is a torch.export program (.pt2): it is read by --frontend export (or auto)")
    if input_shapes:
        raise ConvertError(f"{path!r} is a torch.export program (.pt2), which fixes its inputs: drop --input-shape")
    pickled = torchao_frontend.pickled_weights(path)
    if pickled and not trust_checkpoint:
        raise ConvertError(
            f"{path!r} stores weights pickled ({', '.join(pickled)}: tensor subclasses such as torchao's "
            "Int8Tensor); loading them would run arbitrary code from the file. Pass --trust-checkpoint only if "
            "you trust where it came from"
        )
    if pickled:
        torchao_frontend.import_torchao()  # quietly, before unpickling does it
    try:
        ep = export_frontend.load(path)
        specs, names = export_frontend.program_specs(ep)
        return export_frontend.raise_program(ep, names, saved=True), specs, names
    except (export_frontend.ExportError, torchao_frontend.TorchaoError) as e:
        raise ConvertError(str(e)) from None


_PACKING = ("pack_padded_sequence", "pack_sequence")  # torch.nn.utils.rnn's functions that build a PackedSequence


@contextlib.contextmanager
def _noting_packed_sequences() -> Iterator[list]:
    """A list that gets an entry each time a PackedSequence is built (the model packing its input while traced or
    exported): the front ends' own errors for it name a size that is a tensor, not the packing."""
    built: list = []
    new = PackedSequence.__dict__["__new__"]

    def noted(cls: type, *args: Any, **kwargs: Any) -> PackedSequence:
        built.append(cls)
        return new.__func__(cls, *args, **kwargs)

    PackedSequence.__new__ = noted
    try:
        yield built
    finally:
        PackedSequence.__new__ = new


def _front_end(net: nn.Module, specs: list[qshapes.Spec], names: Sequence[str], frontend: str, free_dims: str):
    """(model, specs, free dims, front end, why): the model for the FX flow as it is, or exported and raised."""
    with _noting_packed_sequences() as packed:
        try:
            return _chosen_front_end(net, specs, names, frontend, free_dims)
        except ConvertError:
            if packed:
                raise ConvertError(PACKED) from None
            raise


def _chosen_front_end(net: nn.Module, specs: list[qshapes.Spec], names: Sequence[str], frontend: str,
                      free_dims: str) -> tuple:
    note = ""
    if isinstance(net, keywords.KeywordCall):  # torch.fx would see one *args argument, not the keywords
        if frontend == "fx":
            raise ConvertError("a model called with keyword arguments (NAME=SHAPE) is read by --frontend export")
        frontend, note = "export", "called with keyword arguments"
    if frontend == "fx":
        return net, specs, free_dims, "fx", note
    fx_failed = ""
    if frontend == "auto":
        try:
            _trace(net, names)
            return net, specs, free_dims, "fx", note
        except ConvertError as e:
            note = fx_failed = str(e)
    try:
        gm, specs = _export(net, specs, names, free_dims)
    except export_frontend.ExportError as e:  # both front ends' reasons, where both were tried
        raise ConvertError(f"{fx_failed}; {e}" if fx_failed else str(e)) from None
    # torch.export decided which dimensions are dynamic: the runs vary those (and only those).
    return gm, specs, "marked", "export", note


def _export(net: nn.Module, specs: list[qshapes.Spec], names: Sequence[str], free_dims: str):
    model, quantized = export_frontend.stand_in(net)

    def exported(tried: list[qshapes.Spec]) -> tuple:
        ep = export_frontend.export(model, tried)
        return ep, export_frontend.raise_program(ep, names, model, quantized)

    # Which inputs are token ids shows only in the raised graph (they reach an embedding): export with
    # float32 where no dtype is given (int64 if that fails), then again if the graph says otherwise.
    tried = [_default_dtype(s, "float32") for s in specs]
    try:
        ep, gm = exported(tried)
    except export_frontend.ExportError as as_float:
        if all(_default_dtype(s, "int64") == s for s in specs):
            raise
        tried = [_default_dtype(s, "int64") for s in specs]
        try:
            ep, gm = exported(tried)
        except export_frontend.ExportError as as_ids:
            # where only the int64 attempt exported, those inputs are token ids and its reason is the one; else
            # both said why, and which one applies is the user's to tell
            raised = export_frontend.RaiseError
            alone = isinstance(as_ids, raised) and not isinstance(as_float, raised)
            raise export_frontend.ExportError(f"{'' if alone else f'{as_float}; '}with int64 inputs (token ids): "
                                              f"{as_ids}") from None
    resolved = _resolve(gm, specs)
    if resolved != tried:
        ep, gm = exported(resolved)
    marked = export_frontend.mark_free(resolved, names, ep, free_dims)
    if free_dims == "auto":
        marked = _free_inside_modules(gm, marked, names, lambda s: exported(s)[1])
    return gm, marked


def _free_inside_modules(gm: torch.fx.GraphModule, specs: list[qshapes.Spec], names: Sequence[str], raised) -> list:
    """torch.export fixes a dimension that a module's own code specializes (an nn.LSTM's sequence length),
    though the raised graph only calls the module. Such a dimension is free after all where the graph
    runs with it at another size and exporting at that size raises the same graph (no size of it written
    into the graph)."""
    try:
        runs = qshapes.search(gm, specs, names, "auto")
    except qshapes.SpecError:
        return specs  # the marked search reports it
    flat = [leaf for spec, name in zip(specs, names) for _, leaf in qshapes.leaves(spec, name)]
    for leaf, d in sorted(qshapes.free_dims_of(runs)):
        if flat[leaf].dims[d].free or flat[leaf].dims[d].candidate:
            continue
        resized = {leaf: tuple(2 * n + 3 if i == d else n for i, n in enumerate(flat[leaf].shape))}
        other = [qshapes.Leaf(tuple(qshapes.Dim(n) for n in resized.get(i, f.shape)), f.dtype)
                 for i, f in enumerate(flat)]
        try:
            same = raised(_regroup(specs, other)).code == gm.code
        except export_frontend.ExportError:
            same = False
        if same:
            dims = list(flat[leaf].dims)
            dims[d] = qshapes.Dim(dims[d].size, candidate=True)
            flat[leaf] = qshapes.Leaf(tuple(dims), flat[leaf].dtype)
    return _regroup(specs, flat)


def _regroup(specs: list[qshapes.Spec], flat: list[qshapes.Leaf]) -> list[qshapes.Spec]:
    """specs' structure over the leaves of flat."""
    leaves = iter(flat)
    return [export_frontend.rebuild(s, leaves) for s in specs]


def _default_dtype(spec: qshapes.Spec, dtype: str) -> qshapes.Spec:
    return qshapes.with_dtypes(spec, lambda leaf, i: leaf.dtype or dtype)[0]


# ------------------------------------------------------------ conversion


def _quietly(fn: Callable[..., Result]) -> Callable[..., Result]:
    """torch's deprecation warnings (torch.ao, quantized dtypes) are not shown during a conversion."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Result:
        with qrt_backend.quiet():
            return fn(*args, **kwargs)

    return wrapper


@_quietly
def convert(
    checkpoint: str | os.PathLike,
    output: str | os.PathLike,
    *,
    model: str | None = None,
    mode: str = "dynamic",
    weight_dtype: str = "qint8",
    weights: str = "per-tensor",
    calib: str | os.PathLike | None = None,
    calib_batch_size: int = 32,
    input_shapes: Sequence[Any] | Mapping[str, Any] | None = None,
    input_dtypes: Mapping[str, str] | None = None,
    free_dims: str = "auto",
    rules: Rules | str | os.PathLike | None = None,
    trust_checkpoint: bool = False,
    progress: bool = False,
    engine: str | None = None,
    frontend: str = "auto",
    quantizer: str = "pt2e",
) -> Result:
    """Convert a checkpoint to a .qrt file (see the module docstring). Raises ConvertError.

    ``input_shapes``: one per forward() argument, as --input-shape text ("2,50?,6", "(2,1,200),(2,1,200)"),
    a shape ((1, 37)) or a tuple of shapes for a tuple argument; or by name, for a model called with
    keyword arguments (tools/keywords.py): {"input_ids": "2,9", ...} or ["input_ids=2,9", ...].
    ``input_dtypes``: by argument or input name ("hidden.0"). ``free_dims``: "auto" or "marked" (see
    --free-dims). ``engine``: whose numerics the int8 layers of a torch.ao model follow, "x86" (or "fbgemm") or
    "qnnpack"; None: the quantized engine torch has in force (onednn refused). A pt2e program or a torchao model
    takes none (_engine). ``mode``, ``weight_dtype``, ``weights`` and ``quantizer`` quantize a float model: other
    than their defaults for a quantized one, they are refused. ``frontend``: "fx", "export" or "auto" (torch.fx,
    else torch.export where torch.fx cannot trace; a .pt2 program is always exported). ``quantizer``: which
    flow quantizes a float model, "pt2e" (torchao's prepare_pt2e / convert_pt2e under tools/qrt_quantizer.py)
    or "fx" (torch.ao's prepare_fx / convert_fx); a float .pt2 program is quantized by the FX flow.
    """
    the_rules = startup_rules(rules)
    engine = ENGINE_ALIASES.get(engine, engine)
    if engine not in (None, *ENGINES):
        raise ConvertError(f"engine must be one of {[*ENGINES, *ENGINE_ALIASES]}, got {engine!r}")
    checkpoint, output = os.fspath(checkpoint), os.fspath(output)
    if mode not in MODES:
        raise ConvertError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if weight_dtype not in WEIGHT_DTYPES:
        raise ConvertError(f"weight dtype must be one of {list(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    if weights not in WEIGHT_SCHEMES:
        raise ConvertError(f"weights must be one of {list(WEIGHT_SCHEMES)}, got {weights!r}")
    if mode == "static" and weight_dtype != "qint8":
        raise ConvertError("static mode quantizes weights to qint8; --weight-dtype float16 is dynamic only")
    if calib_batch_size <= 0:
        raise ConvertError(f"calibration batch size must be positive, got {calib_batch_size}")
    _check_output_path(output)

    if free_dims not in qshapes.FREE_DIMS:
        raise ConvertError(f"free dims must be one of {list(qshapes.FREE_DIMS)}, got {free_dims!r}")
    if frontend not in FRONTENDS:
        raise ConvertError(f"front end must be one of {list(FRONTENDS)}, got {frontend!r}")
    if quantizer not in qrt_quantizer.QUANTIZERS:
        raise ConvertError(f"quantizer must be one of {list(qrt_quantizer.QUANTIZERS)}, got {quantizer!r}")
    pt2 = export_frontend.is_pt2(checkpoint)
    named = None  # (names, shapes) of a model called with keyword arguments
    if pt2:
        net, specs, names = _load_program(checkpoint, frontend, input_shapes, trust_checkpoint)
        free_dims, used_frontend, note = "marked", "export", "a torch.export program"
    else:
        net = load_model(checkpoint, model, trust_checkpoint)
        try:
            torchao_frontend.check(net)
        except torchao_frontend.TorchaoError as e:
            raise ConvertError(str(e)) from None
        try:
            named = keywords.split_named(input_shapes or [])
        except ValueError as e:
            raise ConvertError(f"input shapes: {e}") from None
        if named is not None:  # a model called with keyword arguments (a HuggingFace model)
            names, input_shapes = named
            _check_keywords(net, names)
            net = keywords.keyword_call(net, names)
        else:
            names = input_names(net)
        specs = [parse_shape(s) if isinstance(s, str) else _as_spec(s) for s in (input_shapes or [])]
        if specs and len(specs) != len(names):
            raise ConvertError(f"got {len(specs)} --input-shape, but forward takes {len(names)} inputs {names}")

    data = load_calibration(os.fspath(calib), names) if calib is not None else None
    if data is not None and not pt2:
        for n, spec in zip(names, specs):
            if not isinstance(spec, qshapes.Leaf) or tuple(data[n].shape[1:]) != spec.shape[1:]:
                raise ConvertError(
                    f"calibration array {n!r} has samples of shape {list(data[n].shape[1:])}, "
                    f"but --input-shape says {qshapes.show(spec)}"
                )
        given = dict(zip(names, specs))
        specs = [
            qshapes.Leaf(
                given[n].dims if n in given else tuple(qshapes.Dim(d) for d in (1, *data[n].shape[1:])),
                None if data[n].dtype == np.float32 else str(data[n].dtype),
            )
            for n in names
        ]
    if not specs:
        raise ConvertError(f"example input shapes are needed: pass --input-shape once per input {names} or --calib")
    specs = _set_dtypes(specs, names, input_dtypes or {})
    float_model = net
    if not pt2:
        net, specs, free_dims, used_frontend, note = _front_end(net, specs, names, frontend, free_dims)

    prequantized = export_frontend.is_prequantized(net)
    pt2e_program = prequantized and export_frontend.is_pt2e(net)
    engine, engine_note = _engine(engine, pt2e_program or (prequantized and torchao_frontend.is_quantized(net)),
                                  prequantized)
    if prequantized:
        given = [f"--{flag} {value}" for flag, value, default in (("mode", mode, "dynamic"),
                 ("weight-dtype", weight_dtype, "qint8"), ("weights", weights, "per-tensor"),
                 ("quantizer", quantizer, "pt2e")) if value != default]
        if given:  # they choose how a float model is quantized: this one's scheme is in the checkpoint
            raise ConvertError(f"the model is quantized already, its scheme in the checkpoint: {', '.join(given)} "
                               "applies to a float model")
        gm = _trace(net, names)
        specs = _resolve(gm, specs)
        used_mode, used_quantizer = "prequantized", ""
    else:
        if mode == "static" and data is None:
            raise ConvertError("static mode needs calibration data: pass --calib DATA.npz")
        traced = _trace(net, names)
        specs = _resolve(traced, specs)
        example = qshapes.examples(specs)
        _run_float(net, example, specs, names)
        # Refuse unsupported layers before spending time calibrating.
        bad = qlower.find_unsupported(traced, export_frontend.describe, qrt_backend.quantizable(the_rules, mode))
        if bad:
            raise ConvertError(f"qrt cannot run (mode {mode}, rules {the_rules.name!r}): " + "; ".join(bad))
        used_quantizer = "fx" if pt2 else quantizer
        calibrate = functools.partial(_calibrate, data=data, names=names, batch=calib_batch_size, progress=progress)
        try:
            if used_quantizer == "pt2e":
                gm = qrt_quantizer.quantize(float_model, specs, names, the_rules, mode, weight_dtype, weights, engine,
                                            calibrate if mode == "static" else None)
            else:
                prepared = qrt_backend.prepare(net, the_rules, mode, weight_dtype, weights, example, engine)
                if mode == "static":
                    calibrate(prepared)
                gm = qrt_backend.to_reference(prepared, the_rules)
        except qrt_backend.FrontEndError as e:
            raise ConvertError(str(e)) from None
        used_mode = mode

    layers: dict[str, str] = {}
    try:
        # a pt2e program's decomposed quantize rounds, then adds the zero point: qnnpack's rule (NUMERICS.md 10)
        builder = qlower.lower(gm, qrt_quantizer.describe, specs, layers, free_dims, engine,
                               "qnnpack" if pt2e_program else engine)
        renamed = builder.merge_duplicates()  # a value computed again (T5's masked position bias in each layer)
        gone = builder.drop_unused()  # dead code: what the outputs do not need (an unused pooler)
        layers = {path: renamed.get(value, value) for path, value in layers.items()}
        layers = {path: value for path, value in layers.items() if value not in gone}
        if named is not None:
            layers = keywords.unprefixed(layers)
    except (qlower.LoweringError, qrt_backend.FrontEndError) as e:
        raise ConvertError(str(e)) from None

    metadata = {
        "producer": PRODUCER,
        "converter.torch_version": str(torch.__version__),
        "converter.checkpoint_sha256": _sha256(checkpoint),
        "converter.mode": used_mode,
        "converter.rules": the_rules.name,
        "converter.engine": engine,
        # module path -> qrt value, and the calibration used: `qrt compare` rebuilds PyTorch's model from them.
        "converter.layers": json.dumps(layers, separators=(",", ":")),
    }
    if used_mode == "static":
        metadata["converter.calib_sha256"] = _sha256(os.fspath(calib))
        metadata["converter.calib_batch_size"] = str(calib_batch_size)
    if not prequantized:
        metadata["converter.weights"] = "float16" if weight_dtype == "float16" else (the_rules.weights or weights)
    try:
        builder.save(output, metadata=metadata)
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot write {output!r}: {e}") from None
    shapes = {
        spec["name"]: f"{spec['dtype']}[{', '.join('?' if d is None else str(d) for d in spec['shape'])}]"
        for spec in builder.inputs
    }
    return Result(output, used_mode, list(shapes), metadata, shapes, used_frontend, note, used_quantizer, engine_note)


ENGINE_ALIASES = {"fbgemm": "x86"}  # torch's older name of its x86 engine


def _engine(asked: str | None, program: bool, prequantized: bool) -> tuple[str, str]:
    """(the engine whose numerics the int8 linears follow, a note where the user did not choose it).

    A pt2e program or a torchao model computes as it is written (NUMERICS.md sections 10 and 11): no engine of
    torch.ao's applies, and its linears take x86's form. Otherwise the one asked for, else torch's in force here:
    the model may have been quantized elsewhere (on ARM, under qnnpack), which the checkpoint does not record."""
    if program:
        if asked == "qnnpack":
            raise ConvertError("--engine qnnpack is for models torch.ao quantized under qnnpack: a pt2e program or a "
                               "torchao model computes as it is written (docs/NUMERICS.md sections 10 and 11)")
        return "x86", ""
    if asked is not None:
        return asked, ""
    here = ENGINE_ALIASES.get(torch.backends.quantized.engine, torch.backends.quantized.engine)
    if here not in ENGINES:
        raise ConvertError(f"torch's quantized engine here is {here!r}, whose numerics qrt does not follow: pass "
                           "--engine x86 or --engine qnnpack, the engine the model is quantized for")
    if not prequantized:
        return here, ""
    other = "qnnpack" if here == "x86" else "x86"
    return here, f"{here}, torch's engine in this process (a model quantized under {other} needs --engine {other})"


def _calibrate(prepared, data: dict[str, np.ndarray], names: Sequence[str], batch: int, progress: bool) -> None:
    from tqdm import tqdm

    n = next(iter(data.values())).shape[0]
    starts = range(0, n, batch)
    batches = (
        [torch.from_numpy(data[k][i : i + batch]) for k in names]
        for i in tqdm(starts, desc="calibrating", unit="batch", disable=not progress, file=sys.stderr)
    )
    try:
        qrt_backend.calibrate(prepared, batches)
    except Exception as e:
        shapes = ", ".join(f"{k}: {list(data[k].shape)}" for k in names)
        raise ConvertError(f"calibration data does not fit the model ({shapes}): {type(e).__name__}: {e}") from None


# ------------------------------------------------------------ command line


_SHAPES_HELP = """\
input shapes:
  Give one --input-shape per forward() argument, in order: the example's sizes, comma-separated.
    --input-shape 2,50,6                 a tensor [2, 50, 6] (e.g. batch 2, 50 steps, 6 features)
    --input-shape 3                      a 1-D tensor (one token id per batch row)
    --input-shape "(2,2,200),(2,2,200)"  a tuple argument, e.g. an LSTM's hidden = (h, c): its tensors
                                         become the inputs hidden.0 and hidden.1 of the .qrt file
  Free dimensions (any size at run time): the converter runs the model at the example sizes and
  again with each dimension at 2n+3 (dimensions of the same example size together when they only
  work together, like a batch shared by x and h); every dimension the model accepts, keeping the
  rank of everything it computes, is free. Batch and sequence length usually are; give them example
  sizes unlike the other dimensions (a batch of 3 beside 2 layers) so that they are told apart.
  A size followed by ? is declared free (2,50?,6): an error if it is not. --free-dims marked frees
  only the dimensions marked ?. The result line lists each input with ? at its free dimensions.
  Inputs feeding an embedding are int64 token ids; --input-dtype NAME=int32 (or float32) overrides,
  NAME an argument (every tensor in it) or an input (hidden.0).
"""


def main(argv: Sequence[str] | None = None) -> int:
    prog = "qrt-convert" if __package__ == "qrt_tools" else "convert.py"  # installed, or from a checkout
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], epilog=_SHAPES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="torch.save'd state_dict, or a whole module with --trust-checkpoint")
    p.add_argument("-o", "--output", required=True, help="the .qrt file to write")
    p.add_argument("--model", help="package.module:factory building the float nn.Module")
    p.add_argument("--mode", choices=MODES, default="dynamic")
    p.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="qint8")
    p.add_argument("--weights", choices=WEIGHT_SCHEMES, default="per-tensor", help="weight quantization scheme")
    p.add_argument("--calib", help="calibration data (.npz, arrays by input name) for static mode")
    p.add_argument("--calib-batch-size", type=int, default=32)
    p.add_argument(
        "--input-shape", action="append", default=[], metavar="SHAPE",
        help="example shape of one forward() argument, once per argument in order: 2,50,6; 50? marks a free "
        "dimension; (2,1,200),(2,1,200) for a tuple argument (see below); NAME=SHAPE for each argument the "
        "model is called with by keyword (a HuggingFace model: input_ids=2,9 attention_mask=2,9)",
    )
    p.add_argument(
        "--input-dtype", action="append", default=[], metavar="NAME=DTYPE",
        help=f"an input's dtype ({', '.join(qshapes.DTYPES)}); default int64 for an embedding's indices, else float32",
    )
    p.add_argument(
        "--free-dims", choices=qshapes.FREE_DIMS, default="auto",
        help="auto: dimensions marked ? and those the model runs with at another size (default); marked: only ?",
    )
    p.add_argument("--rules", help="a Python file defining RULES (see docs/CONVERTER.md)")
    p.add_argument(
        "--engine", choices=[*ENGINES, *ENGINE_ALIASES],
        help="torch's quantized engine whose numerics to follow (default: the one in force; fbgemm is x86)"
    )
    p.add_argument("--trust-checkpoint", action="store_true", help="allow a pickled whole-module checkpoint")
    p.add_argument(
        "--frontend", choices=FRONTENDS, default="auto",
        help="fx: torch.fx; export: torch.export; auto (default): torch.fx, else torch.export where torch.fx "
        "cannot trace the model. A .pt2 program is always read by the export front end",
    )
    p.add_argument(
        "--quantizer", choices=qrt_quantizer.QUANTIZERS, default="pt2e",
        help="which flow quantizes a float model under the rules: pt2e (default: torch.export + torchao's "
        "prepare_pt2e / convert_pt2e) or fx (torch.ao's prepare_fx / convert_fx); both write the same file",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no front-end line")
    args = p.parse_args(argv)
    try:
        dtypes = dict(parse_dtype(t) for t in args.input_dtype)
        result = convert(
            args.checkpoint,
            args.output,
            model=args.model,
            mode=args.mode,
            weight_dtype=args.weight_dtype,
            weights=args.weights,
            calib=args.calib,
            calib_batch_size=args.calib_batch_size,
            input_shapes=args.input_shape,
            input_dtypes=dtypes,
            free_dims=args.free_dims,
            rules=args.rules,
            trust_checkpoint=args.trust_checkpoint,
            progress=not args.quiet,
            engine=args.engine,
            frontend=args.frontend,
            quantizer=args.quantizer,
        )
    except ConvertError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        why = f" ({result.frontend_note})" if result.frontend_note else ""
        print(f"front end: {'torch.export' if result.frontend == 'export' else 'torch.fx'}{why}", file=sys.stderr)
        if result.quantizer:
            flow = "pt2e (torchao)" if result.quantizer == "pt2e" else "fx (torch.ao)"
            print(f"quantizer: {flow}", file=sys.stderr)
        if result.engine_note:
            print(f"engine: {result.engine_note}", file=sys.stderr)
    inputs = ", ".join(f"{name} {shape}" for name, shape in result.shapes.items())
    meta = result.metadata
    print(f"wrote {result.path} ({result.mode}, engine {meta['converter.engine']}; inputs {inputs}; "
          f"rules {meta['converter.rules']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

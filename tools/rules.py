"""The converter's quantization rules, as plain data (no torch needed to read them).

A ``Rules`` object says which patterns of the source model qrt quantizes and
with which schemes. The front end (``tools/qrt_backend.py``) turns each
``PatternRule`` into ``torch.ao`` BackendPatternConfigs; the lowering
(``tools/lower.py``) has one qrt lowering per pattern name. Both check at
start-up that they know every pattern listed here, so a rule that cannot be
lowered is refused before any model is loaded.

A ``--rules FILE.py`` file defines ``RULES`` (a ``Rules``), usually derived
from ``DEFAULT_RULES`` (the module is ``tools.rules`` in a checkout,
``qrt_tools.rules`` where the converter is installed)::

    import dataclasses
    from tools.rules import DEFAULT_RULES

    RULES = dataclasses.replace(
        DEFAULT_RULES,
        name="head-in-float",
        module_schemes={"head": "float", "body.0": "per-channel"},
    )
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

MODES = ("dynamic", "static")
WEIGHT_DTYPES = ("qint8", "float16")
WEIGHT_SCHEMES = ("per-tensor", "per-channel")
# What a rule file may ask for one module by its qualified name.
MODULE_SCHEMES = ("float", "per-tensor", "per-channel", "float16")


class RulesError(ValueError):
    """A rules file or a Rules object is malformed or asks for what qrt cannot do."""


@dataclass(frozen=True)
class PatternRule:
    """One pattern of the source model that qrt runs quantized.

    ``name`` keys the front-end declaration and the lowering; ``pattern`` is the
    sequence of PyTorch modules it matches, for messages and docs. ``static``:
    quint8 activations, qint8 weights, float bias. ``dynamic``: the weight dtypes
    allowed with float input and output (activations quantized per call to quint8).
    """

    name: str
    pattern: tuple[str, ...]
    static: bool
    dynamic: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.name!r} ({' -> '.join(self.pattern)})"


@dataclass(frozen=True)
class Rules:
    """The patterns to quantize, plus optional per-module choices.

    ``weights``: the default weight scheme, overriding the command line's when set.
    ``module_schemes``: qualified module name -> one of MODULE_SCHEMES; "float"
    keeps that module unquantized (it must then be a float op qrt runs).
    """

    name: str
    patterns: tuple[PatternRule, ...]
    weights: str | None = None
    module_schemes: Mapping[str, str] = field(default_factory=dict)

    def pattern(self, name: str) -> PatternRule | None:
        for p in self.patterns:
            if p.name == name:
                return p
        return None

    def validate(self) -> Rules:
        if not isinstance(self.name, str) or not self.name:
            raise RulesError(f"rules name must be a non-empty string, got {self.name!r}")
        seen = set()
        for p in self.patterns:
            if not isinstance(p, PatternRule):
                raise RulesError(f"rules {self.name!r}: patterns must be PatternRule objects, got {p!r}")
            if p.name in seen:
                raise RulesError(f"rules {self.name!r}: pattern {p.name!r} is listed twice")
            seen.add(p.name)
            bad = [d for d in p.dynamic if d not in WEIGHT_DTYPES]
            if bad:
                raise RulesError(
                    f"rules {self.name!r}: pattern {p.describe()} has dynamic weight dtypes {bad}; "
                    f"known: {list(WEIGHT_DTYPES)}"
                )
        if self.weights is not None and self.weights not in WEIGHT_SCHEMES:
            raise RulesError(f"rules {self.name!r}: weights must be one of {list(WEIGHT_SCHEMES)}")
        for module, scheme in self.module_schemes.items():
            if scheme not in MODULE_SCHEMES:
                raise RulesError(
                    f"rules {self.name!r}: module {module!r} has scheme {scheme!r}; "
                    f"choose one of {list(MODULE_SCHEMES)}"
                )
        return self


DEFAULT_RULES = Rules(
    name="qrt-default",
    patterns=(
        PatternRule("linear", ("Linear",), static=True, dynamic=("qint8", "float16")),
        PatternRule("linear_relu", ("Linear", "ReLU"), static=True, dynamic=("qint8", "float16")),
        PatternRule("rnn_cell", ("RNNCell",), static=False, dynamic=("qint8",)),
        PatternRule("lstm_cell", ("LSTMCell",), static=False, dynamic=("qint8", "float16")),
        PatternRule("gru_cell", ("GRUCell",), static=False, dynamic=("qint8", "float16")),
        # PyTorch quantizes no nn.RNN: its weights are quantized as quantize_dynamic does an RNNCell's.
        PatternRule("rnn", ("RNN",), static=False, dynamic=("qint8", "float16")),
        PatternRule("lstm", ("LSTM",), static=False, dynamic=("qint8", "float16")),
        PatternRule("gru", ("GRU",), static=False, dynamic=("qint8", "float16")),
    ),
)


def load_rules(path: str | os.PathLike) -> Rules:
    """Execute a rules file and return its ``RULES``, validated."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RulesError(f"rules file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location("qrt_user_rules", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: report whatever it raised
        raise RulesError(f"rules file {path!r} failed to load: {type(e).__name__}: {e}") from e
    rules = getattr(module, "RULES", None)
    if not isinstance(rules, Rules):
        raise RulesError(f"rules file {path!r} must define RULES = tools.rules.Rules(...), got {rules!r:.80}")
    return dataclasses.replace(rules, module_schemes=dict(rules.module_schemes)).validate()

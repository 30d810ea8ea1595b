"""Models called with keyword arguments: ``model(input_ids=..., attention_mask=...)``, as HuggingFace models are.

Every parameter of such a forward() has a default, so which ones are inputs is the user's choice: the
converter takes example shapes by name (``--input-shape input_ids=2,9``) and converts ``KeywordCall``,
a module taking those arguments positionally, in the order given, and passing them on by keyword. What
the model returns may be a ``ModelOutput`` or a dict: the converted model returns its tensors as a tuple,
in the ModelOutput's order (for BertModel: last_hidden_state, pooler_output).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

PREFIX = "model."  # the wrapped model's module paths within KeywordCall
_NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


class KeywordCall(nn.Module):
    """model called as model(**dict(zip(names, args))), its result's tensors as a flat tuple. Made by
    keyword_call, whose forward() names the arguments."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *args: torch.Tensor) -> Any:
        return tensors_of(self.model(**dict(zip(self.names, args))))


def keyword_call(model: nn.Module, names: Sequence[str]) -> KeywordCall:
    """A KeywordCall whose forward()'s signature names its arguments, as torch.export and the converter read
    them (a class of its own: copies of the module keep it)."""

    def forward(self: KeywordCall, *args: torch.Tensor) -> Any:
        return KeywordCall.forward(self, *args)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in ("self", *names)])
    return type("KeywordCall", (KeywordCall,), {"forward": forward})(model, names)


def tensors_of(result: Any) -> Any:
    """A ModelOutput or dict as the tuple of its (non-None) values, in order; anything else as it is."""
    if isinstance(result, Mapping):  # transformers' ModelOutput is an OrderedDict of the fields set
        return tuple(v for v in result.values() if v is not None)
    return result


def split_named(shapes: Sequence[Any] | Mapping[str, Any]) -> tuple[list[str], list[Any]] | None:
    """(names, shapes) where the example shapes are given by name (a mapping, or 'NAME=SHAPE' texts);
    None where they are given in order."""
    if isinstance(shapes, Mapping):
        return list(shapes), list(shapes.values())
    matches = [_NAMED.match(s) if isinstance(s, str) else None for s in shapes]
    if not shapes or not any(matches):
        return None
    if not all(matches):
        raise ValueError("give every --input-shape by name (NAME=SHAPE) or none")
    names = [m.group(1) for m in matches]
    if len(set(names)) != len(names):
        raise ValueError(f"an input named twice among {names}")
    return names, [m.group(2) for m in matches]


def unprefixed(layers: Mapping[str, str]) -> dict[str, str]:
    """module path -> value as the user's model names its modules (without KeywordCall's 'model.')."""
    return {path.removeprefix(PREFIX): value for path, value in layers.items()}

"""Which modules an exported program's node ran in, as its ``nn_module_stack`` meta says.

torch.export writes each entry as (module path, class), the class as a type or, in a program loaded from a
.pt2 file, as its qualified name: both are read here as the qualified name ("torch.nn.modules.linear.Linear").
"""

from __future__ import annotations

import torch.fx

LINEAR = "torch.nn.modules.linear.Linear"


def class_name(kind: object) -> str:
    return kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"


def entries(node: torch.fx.Node) -> list[tuple[str, str]]:
    """(path, class name) of each module node ran in, outermost first."""
    return [(path, class_name(kind)) for path, kind in (node.meta.get("nn_module_stack") or {}).values()]


def innermost(node: torch.fx.Node) -> tuple[str, str]:
    """(path, class name) of the innermost module node ran in, or ("", "")."""
    stack = entries(node)
    return stack[-1] if stack else ("", "")

"""The documents name every op of the registry: a new op is documented where users and C readers look."""

from __future__ import annotations

import os
import re

import pytest

from qrt.ops import OPS

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def _read(name: str) -> str:
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("op", sorted(OPS))
def test_format_md_specifies_every_op(op):
    headings = re.findall(r"^###[^\n]*", _read("FORMAT.md"), re.M)
    assert any(f"`{op}`" in h for h in headings), f"docs/FORMAT.md has no section for op {op!r}"


@pytest.mark.parametrize("op", sorted(OPS))
def test_user_guide_lists_every_op(op):
    """Each op has its row, whose last column lists the registry's attributes and defaults."""
    rows = [r for r in _read("USER_GUIDE.md").splitlines() if r.startswith(f"| `{op}` |")]
    assert rows, f"docs/USER_GUIDE.md's op table lacks {op!r}"
    attrs = ", ".join(f"`{a.name}` (required)" if a.required else f"`{a.name}`={a.default!r}"
                      for a in OPS[op].attrs) or "-"
    assert rows[0].endswith(f" | {attrs} |"), rows[0]

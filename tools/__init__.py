"""The offline converter from PyTorch checkpoints to .qrt files (needs torch; see docs/CONVERTER.md).

In a checkout this is the package `tools` (python tools/convert.py, python tools/compare.py); installed,
it is `qrt_tools` (pip install 'qrt[convert]'), with the commands qrt-convert and qrt-compare. Importing
the package itself needs no torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence


def _main(module: str, command: str, argv: Sequence[str] | None) -> int:
    """module's main, with a one-line error where PyTorch is missing."""
    try:
        tool = importlib.import_module(f".{module}", __name__)
    except ImportError as e:
        print(
            f"{command}: error: {command} needs PyTorch: pip install 'qrt[convert]' ({type(e).__name__}: {e})",
            file=sys.stderr,
        )
        return 2
    return tool.main(argv)


def convert_main(argv: Sequence[str] | None = None) -> int:
    """The qrt-convert command (convert.py's main)."""
    return _main("convert", "qrt-convert", argv)


def compare_main(argv: Sequence[str] | None = None) -> int:
    """The qrt-compare command (compare.py's main): a converted model against PyTorch, layer by layer."""
    return _main("compare", "qrt-compare", argv)

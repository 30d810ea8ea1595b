"""The offline converter from PyTorch checkpoints to .qrt files (needs torch; see docs/CONVERTER.md).

In a checkout this is the package `tools` (python tools/convert.py); installed, it is `qrt_tools`
(pip install 'qrt[convert]'), with the command qrt-convert. Importing the package itself needs no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def convert_main(argv: Sequence[str] | None = None) -> int:
    """The qrt-convert command (convert.py's main), with a one-line error where PyTorch is missing."""
    try:
        from . import convert
    except ImportError as e:
        print(
            f"qrt-convert: error: the converter needs PyTorch: pip install 'qrt[convert]' ({type(e).__name__}: {e})",
            file=sys.stderr,
        )
        return 2
    return convert.main(argv)

"""`python -m qrt`: the qrt command line (qrt/cli.py)."""

import sys

from .cli import main

sys.exit(main())

"""qrt: a small, fast runtime for quantized neural networks.

    import qrt
    y = qrt.run("model.qrt", x)            # load and run once
    model = qrt.load("model.qrt")          # or load once, run many times
    y = model.run({"x": x})

Only numpy is required; torch is never imported.
"""

__version__ = "0.1.0"

from .errors import FormatError  # noqa: E402
from .graph import ValueSpec  # noqa: E402
from .model import Model, load, run  # noqa: E402

__all__ = ["FormatError", "Model", "ValueSpec", "load", "run", "__version__"]

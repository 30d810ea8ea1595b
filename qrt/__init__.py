"""qrt: a small, fast runtime for quantized neural networks.

    import qrt
    y = qrt.run("model.qrt", x)            # load and run once
    model = qrt.load("model.qrt")          # or load once, run many times
    y = model.run({"x": x})
    y, (h, c) = model.run([x, (h, c)])      # a model whose forward() took a tuple state
    inputs = qrt.io.load_inputs(model.inputs, archive="in.npz")   # inputs from .npy / .npz files

Only numpy is required; torch is never imported.

The kernels use all the CPUs this process may run on by default (its affinity
mask and its cgroup CPU quota; ``QRT_NUM_THREADS`` or ``OMP_NUM_THREADS`` set
another count); ``qrt.set_num_threads(n)`` changes that for every later call
(results do not depend on it), ``qrt.get_num_threads()`` reads it and
``qrt.thread_info()`` says where it came from.

One build holds a kernel variant per instruction set of its architecture and
uses the best this CPU runs: ``qrt.kernel_variant()`` names it (for example
"amx-int8", "avx512-vnni", "avx-vnni", "avx2", "neon-dotprod", "neon", "portable"); the environment
variable ``QRT_KERNELS=<name>`` forces another when qrt is imported. Every
variant gives the same bits.
"""

__version__ = "0.1.0"

from . import io as io  # noqa: E402  qrt.io: model inputs from files, random inputs
from ._kernels import get_num_threads, kernel_variant, set_num_threads  # noqa: E402
from .errors import FormatError  # noqa: E402
from .graph import ValueSpec  # noqa: E402
from .model import Model, load, run  # noqa: E402
from .threads import ThreadInfo, thread_info  # noqa: E402

__all__ = [
    "FormatError",
    "Model",
    "ValueSpec",
    "get_num_threads",
    "kernel_variant",
    "load",
    "run",
    "set_num_threads",
    "ThreadInfo",
    "thread_info",
    "__version__",
]

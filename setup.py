"""Build qrt and its Cython kernels.

The kernels are compiled with -O3 for the host CPU (-march=native), which
lets the compiler use its vector and dot-product instructions. Set
QRT_PORTABLE=1 to drop machine-specific flags (for wheels, or to build on
one machine and run on another). Floating-point contraction and fast-math
stay off in every build: results must be bit-identical everywhere.
"""

import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup


def compile_args() -> list[str]:
    args = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fwrapv", "-std=c11"]
    if os.environ.get("QRT_PORTABLE", "") in ("", "0"):
        args.append("-march=native")
    args += os.environ.get("QRT_EXTRA_CFLAGS", "").split()
    return args


extensions = [
    Extension(
        "qrt._kernels",
        ["qrt/_kernels.pyx"],
        include_dirs=[np.get_include()],
        extra_compile_args=compile_args(),
        extra_link_args=os.environ.get("QRT_EXTRA_LDFLAGS", "").split(),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))

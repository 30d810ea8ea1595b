"""Build qrt and its Cython kernels.

The kernels are compiled with -O3 for the host CPU (-march=native), which
lets the compiler use its vector and dot-product instructions. Set
QRT_PORTABLE=1 to drop machine-specific flags (for wheels, or to build on
one machine and run on another). Floating-point contraction and fast-math
stay off in every build: results must be bit-identical everywhere.

Threads use OpenMP when the compiler supports -fopenmp (checked by compiling
a test program); otherwise the parallel loops run serially. Set
QRT_OPENMP=0 to build without it.
"""

import os
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup


def compile_args() -> list[str]:
    args = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fwrapv", "-std=c11"]
    if os.environ.get("QRT_PORTABLE", "") in ("", "0"):
        args.append("-march=native")
    args += os.environ.get("QRT_EXTRA_CFLAGS", "").split()
    return args


def openmp_flags() -> list[str]:
    """["-fopenmp"] if the C compiler builds and links an OpenMP program, else []."""
    if os.environ.get("QRT_OPENMP", "1") == "0":
        return []
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.errors import CompileError, LinkError
    from setuptools._distutils.sysconfig import customize_compiler

    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            objs = cc.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
            cc.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=["-fopenmp"])
        except (CompileError, LinkError):
            print("qrt: the compiler lacks OpenMP; kernels will run on one thread")
            return []
    return ["-fopenmp"]


OPENMP = openmp_flags()

extensions = [
    Extension(
        "qrt._kernels",
        ["qrt/_kernels.pyx"],
        include_dirs=[np.get_include()],
        depends=["qrt/qrt_gemm.h", "qrt/qrt_gates.h"],
        extra_compile_args=compile_args() + OPENMP,
        extra_link_args=OPENMP + os.environ.get("QRT_EXTRA_LDFLAGS", "").split(),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))

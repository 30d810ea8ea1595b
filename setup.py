"""Build qrt and its Cython kernels.

One build holds every kernel variant of its architecture (qrt/kernels/variant_*.c: portable C,
AVX2, AVX-512 VNNI on x86-64; portable C, NEON, NEON dotprod on aarch64), each compiled for its
own instruction set by a target pragma; qrt picks the best the CPU runs when it is imported
(qrt.kernel_variant(); QRT_KERNELS=<name> forces another). So no -march=native is needed, and a
build (a wheel) runs at full speed on any CPU of its architecture. Floating-point contraction
and fast-math stay off in every file: results must be bit-identical everywhere.

Threads are qrt's own pool (qrt/kernels/threadpool.c: pthreads and C11 atomics), not OpenMP: one
persistent team whose idle workers never spin where threads outnumber CPUs, which libgomp's do.
"""

import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def compile_args() -> list[str]:
    # -fno-trapping-math lets GCC if-convert the gates' selects into vector blends on AVX2 (without
    # it only AVX-512's masked instructions vectorise them); it changes no value, only whether an
    # FP exception flag may be raised by a lane whose result is discarded, which qrt never reads.
    args = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fwrapv", "-std=c11"]
    return args + os.environ.get("QRT_EXTRA_CFLAGS", "").split()


extensions = [
    Extension(
        "qrt._kernels",
        ["qrt/_kernels.pyx", *sorted(glob.glob("qrt/kernels/*.c"))],
        include_dirs=[np.get_include(), "qrt/kernels"],
        depends=sorted(glob.glob("qrt/kernels/*.h") + glob.glob("qrt/kernels/isa/*.h")),
        extra_compile_args=compile_args() + ["-pthread"],
        extra_link_args=["-pthread", *os.environ.get("QRT_EXTRA_LDFLAGS", "").split()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]


class BuildPy(build_py):
    """Leaves out of the installed converter (qrt_tools, from tools/) the modules that work only in a
    checkout: the fuzzing harness imports tests/fuzz_cases.py and atheris."""

    CHECKOUT_ONLY = {("qrt_tools", "fuzz_loader")}

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) not in self.CHECKOUT_ONLY]


setup(
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    cmdclass={"build_py": BuildPy},
)

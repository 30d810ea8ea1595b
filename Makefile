# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in .venv and build the kernels in place.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)

.PHONY: demo test test-torch-avx2 lint build bench asan golden clean arm wheel wheel-check wheel-arm

$(VENV)/.installed: requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

build/.kernels: $(VENV)/.installed setup.py $(wildcard qrt/*.pyx qrt/*.pxi qrt/kernels/*.[ch] qrt/kernels/isa/*.h)
	$(PY) setup.py -q build_ext --inplace
	mkdir -p build && touch $@

build: build/.kernels

demo: build
	$(PY) examples/demo.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check qrt tools tests bench examples setup.py

test: build lint
	@$(PY) -c "import platform, torch, qrt; print(f'machine: {platform.machine()}, torch {torch.__version__} \
	capability {torch.backends.cpu.get_cpu_capability()}, qrt kernels {qrt.kernel_variant()}')"
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-torch-avx2

# torch picks its kernels by CPU, and two of its results depend on the pick (docs/NUMERICS.md). The
# tests that compare with torch run again with torch forced to its AVX2 kernels, so a test that
# holds only on some CPUs fails on every machine, not only on AVX2 ones.
TORCH_TESTS = $(shell grep -l -E '^(import|from) torch' tests/test_*.py)
test-torch-avx2: build
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
		echo "again with torch on its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2):"; \
		ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 $(PY) -m pytest -q $(TORCH_TESTS); \
	else \
		echo "test-torch-avx2: this CPU has no AVX-512, so torch already ran its AVX2 kernels above"; \
	fi

bench: build
	$(PY) bench/bench_cpu.py

# The kernels under AddressSanitizer, built in a copy so the normal build stays as it is. torch's own
# kernels abort under ASan, so this runs the tests that do not import torch (GEMM kernels against
# their scalar oracles, the fuzzed loader running every op, the API and robustness tests).
# RSS grows under ASan's quarantine, so the flat-memory test is left to the normal run.
ASAN_TESTS := tests/test_gemm_kernels.py tests/test_api.py tests/test_robustness.py tests/test_format.py \
	tests/test_fuzz_loader.py tests/test_atomic_write.py tests/test_golden.py
asan: $(VENV)/.installed
	rm -rf build/asan && mkdir -p build/asan && cp -r qrt tests docs bench setup.py pyproject.toml build/asan/
	rm -f build/asan/qrt/*.so build/asan/qrt/_kernels.c
	cd build/asan && QRT_EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" \
		QRT_EXTRA_LDFLAGS="-fsanitize=address" $(CURDIR)/$(PY) setup.py -q build_ext --inplace
	cd build/asan && PYTHONPATH=$(CURDIR)/build/asan LD_PRELOAD=$$(gcc -print-file-name=libasan.so) \
		ASAN_OPTIONS=detect_leaks=0 $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider $(ASAN_TESTS) \
		-k "not memory_stays_flat"

# The golden reference outputs (tests/golden, see its README.md): written by the "portable" kernel
# variant (plain C) of the normal build. Every variant on every CPU must then reproduce them bit for
# bit (tests/test_golden.py). Never rerun this to make a failing build pass.
golden: build
	QRT_KERNELS=portable $(PY) tests/golden/make_golden.py --out tests/golden

clean:
	rm -rf build qrt/_kernels.c qrt/_kernels*.so

# The wheel users install (pip install dist/wheelhouse/qrt-*.whl, with [convert] for the converter): the
# sdist first, then the wheel built from it (a file the sdist lacks fails here), then auditwheel tags it
# manylinux (no runtime to copy in: threads are pthreads). It runs at full speed on every CPU of its
# architecture (run-time kernel dispatch). dist/ holds the sdist and the untagged wheel, dist/wheelhouse the wheel.
wheel: $(VENV)/.installed
	rm -rf dist
	$(PY) -m build --no-isolation --quiet --outdir dist .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH auditwheel repair --strip --wheel-dir dist/wheelhouse dist/qrt-*.whl
	@ls -l dist/*.tar.gz dist/wheelhouse/*.whl

# The wheel installed into a fresh virtual environment with no compiler and no checkout, used as a user
# would: qrt-convert, qrt run, qrt-compare, and the golden outputs bit for bit (.ci/wheel).
wheel-check: $(VENV)/.installed
	.ci/wheel

# The same wheel for aarch64, cross-compiled, run under qemu on the golden outputs (.ci/wheel aarch64;
# needs the arm64 sysroot that make arm assembles).
wheel-arm: $(VENV)/.installed
	.ci/wheel aarch64

# The ARM leg of CI: the kernels cross-compiled for aarch64 (in build/arm, the in-place build stays
# as it is) and tested under qemu-user on an ARMv8.0 and a dotprod CPU model (.ci/arm).
arm: build
	.ci/arm

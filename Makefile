# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in .venv and build the kernels in place.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)

.PHONY: demo test lint build bench clean

$(VENV)/.installed: requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

build/.kernels: $(VENV)/.installed setup.py $(wildcard qrt/*.pyx qrt/*.pxd qrt/*.h)
	$(PY) setup.py -q build_ext --inplace
	mkdir -p build && touch $@

build: build/.kernels

demo: build
	$(PY) examples/demo.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check qrt tools tests bench examples setup.py

test: build lint
	$(PY) -m pytest -q

bench: build
	$(PY) bench/bench_cpu.py

clean:
	rm -rf build qrt/_kernels.c qrt/_kernels*.so

#!/usr/bin/env bash
# One complete check on a GPU machine (shared/GPU.md's method: few runs, each complete):
# the build, the GPU tests (ops, plan, golden outputs, examples), the whole-model and kernel
# benchmarks. Logs and JSON go to $OUT (default gpu-logs/); a short table is printed last.
#
#     bash bench/gpu_check.sh            (from the checkout's root, with CuPy, torch and nvcc there)
set -uo pipefail
OUT=${OUT:-gpu-logs}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -m1 "Model name"
    echo "cpus: $(nproc)"
    $PY -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
} > "$OUT/machine.txt" 2>&1
$PY -c "import qrt._kernels" 2>/dev/null || $PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1
status=0
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_cuda_compile.py tests/test_gpu.py tests/test_gpu_plan.py \
    tests/test_golden_gpu.py tests/test_examples_gpu.py > "$OUT/tests.log" 2>&1 || status=1
timeout 240 $PY bench/bench_gpu_models.py --json "$OUT/models.json" > "$OUT/models.log" 2>&1 || status=1
timeout 120 $PY bench/bench_gpu.py --quick --markdown "$OUT/kernels.md" > "$OUT/kernels.log" 2>&1 || status=1
cat "$OUT/machine.txt"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -40
tail -8 "$OUT/models.log"
tail -30 "$OUT/kernels.log"
exit $status

#!/usr/bin/env bash
# One complete check on a GPU machine (shared/GPU.md's method: few runs, each complete): the build if
# none, then the stages named in $STAGES (default: all but threads), each under a time limit. Logs and JSON go to
# $OUT (default gpu-logs/); a short summary is printed last.
#
#     bash bench/gpu_check.sh                      (from the checkout's root: CuPy, torch and nvcc there)
#     STAGES="tests models" bash bench/gpu_check.sh
#     STAGES=threads bash bench/gpu_check.sh       (a second call: the 16-core host's thread scaling)
#
# tests:   every GPU test (ops, kernels, persistent RNNs, plan, golden outputs, examples) against the CPU
# models:  whole models at batch 1 against torch float16, eager and as a CUDA graph (bench_gpu_models.py)
# kernels: dynamic linear kernels timed inside CUDA graphs (bench_gpu.py --graph-only)
# rnn:     100-step RNN/LSTM/GRU sequences against cuDNN (bench_gpu_rnn.py)
# threads: the CPU's thread scaling on this host, qrt against torch and ONNX Runtime (bench_cpu.py): issue 35's
#          many-core targets (M >= 8 at 4, 8 and 16 threads against both, M=512 K=N=1024's 16-thread speed-up,
#          batch 1 never slower than 1 thread). Not in the default STAGES: with a fresh machine's build (75-90 s)
#          all five stages' limits pass the device's 10 minutes a call, so it runs as a call of its own.
# Each stage's time limit can be set: TESTS_LIMIT, MODELS_LIMIT, KERNELS_LIMIT, RNN_LIMIT, THREADS_LIMIT.
set -uo pipefail
OUT=${OUT:-gpu-logs}
PY=${PY:-python3}
STAGES=${STAGES:-tests models kernels rnn}
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
stage() {  # name, time limit in seconds, command...
    local name=$1 limit=$2
    shift 2
    case " $STAGES " in *" $name "*) ;; *) return ;; esac
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { status=1; echo "stage $name failed (exit $?)" >> "$OUT/summary.txt"; }
    echo "stage $name: $((SECONDS - t0)) s" >> "$OUT/summary.txt"
}
stage tests "${TESTS_LIMIT:-200}" $PY -m pytest -v -rf -p no:cacheprovider tests/test_cuda_compile.py tests/test_gpu.py \
    tests/test_gpu_kernels.py tests/test_gpu_persistent.py tests/test_gpu_plan.py tests/test_golden_gpu.py \
    tests/test_examples_gpu.py
stage models "${MODELS_LIMIT:-90}" $PY bench/bench_gpu_models.py --json "$OUT/models.json"
stage kernels "${KERNELS_LIMIT:-60}" $PY bench/bench_gpu.py --quick --graph-only --markdown "$OUT/kernels.md"
stage rnn "${RNN_LIMIT:-60}" $PY bench/bench_gpu_rnn.py --quick --markdown "$OUT/rnn.md"
stage threads "${THREADS_LIMIT:-150}" $PY bench/bench_cpu.py --quick --rows 8 64 512 --threads 1 2 4 8 16 \
    --json "$OUT/threads.json"
cat "$OUT/machine.txt" "$OUT/summary.txt"
for name in $STAGES; do
    [ -f "$OUT/$name.log" ] || continue
    echo "== $name"
    case $name in
        tests) grep -E "(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | grep -v PASSED | cut -c1-160 | tail -40 ;;
        *) tail -25 "$OUT/$name.log" ;;
    esac
done
exit $status

#!/bin/bash
# bench/gpu_check.sh: the whole device check, for a machine with an NVIDIA GPU (one run, about
# 5 minutes on 16 cores): build with -Dcuda=enabled, run the backend-equivalence test (every
# CUDA operation against the CPU backend in BF16 and fp32 GEMM modes, the engine on every tiny
# model, the golden fixtures on the device), then time the engine on mkmodel's Llama-8B-shaped and
# DeepSeek-V2-Lite-shaped random models (4 layers each, BF16): decode tokens/s against the HBM
# roofline and prefill TFLOP/s against the cuBLAS ceiling, both measured in the same run.
#
#   bench/gpu_check.sh            (results also in $OUT/gpu_check.txt when $OUT is set)
#
# Exits non-zero when anything fails, including the equivalence test skipping (no device seen).
# A failing equivalence test is followed by the operations under compute-sanitizer (when
# installed) and the benchmarks anyway, so one run on a scarce device says as much as it can.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$src/build-gpu}
layers=${LAYERS:-4}
report=${OUT:-$build}/gpu_check.txt
mkdir -p "$(dirname "$report")"
exec > >(tee "$report") 2>&1

say() { printf '== %s\n' "$*"; }
say "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet 2>/dev/null || echo ' (with local changes)')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || say "no nvidia-smi"
for tool in meson ninja /usr/local/cuda/bin/nvcc; do
    command -v "$tool" >/dev/null || { say "missing $tool (scripts/install-deps; CUDA 13 in /usr/local/cuda)"; exit 1; }
done
/usr/local/cuda/bin/nvcc --version | tail -2
uptime

say "build ($build)"
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dcuda=enabled -Dbuildtype=release >"$build.setup.log" 2>&1 || { cat "$build.setup.log"; exit 1; }
fi
ninja -C "$build" tests/unit/test_backend_cuda bench/bench_gpu tools/tandem

# the golden fixtures: $TD_GOLDEN_DIR, ../shared/golden beside the tree, or shared/golden inside it
# (copy ../shared/golden there when the tree travels to a device machine without its neighbours)
golden=${TD_GOLDEN_DIR:-}
for g in "$src/../shared/golden" "$src/shared/golden"; do
    [ -z "$golden" ] && [ -f "$g/llama_tiny/golden.json" ] && golden=$g
done
[ -n "$golden" ] || { say "no golden fixtures (set TD_GOLDEN_DIR or copy ../shared/golden to shared/golden)"; exit 1; }

say "backend equivalence and golden fixtures ($golden) on the device"
set +e
TD_SOURCE_ROOT=$src TD_BUILD_ROOT=$build TD_GOLDEN_DIR=$golden TD_REQUIRE_GOLDEN=1 \
    CK_DEFAULT_TIMEOUT=600 "$build/tests/unit/test_backend_cuda"
rc=$?
set -e
status=0
case $rc in
0) say "equivalence: PASSED" ;;
77) say "equivalence: SKIPPED (no CUDA device seen): the check did not run"; exit 1 ;;
*)
    say "equivalence: FAILED (exit $rc); the benchmarks still run, for what they show"
    status=1
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$sanitizer" ]; then
        say "the operations under compute-sanitizer (memcheck)"
        TD_SOURCE_ROOT=$src CK_RUN_CASE=ops CK_FORK=no CK_DEFAULT_TIMEOUT=600 \
            "$sanitizer" --tool memcheck --print-limit 20 "$build/tests/unit/test_backend_cuda" || true
    fi
    ;;
esac

say "benchmark models ($layers layers, BF16)"
models=$build/gpu-models
mkdir -p "$models"
gen() {
    [ -f "$models/$2/.done" ] && return 0
    "$build/tools/tandem" mkmodel --arch "$1" --preset "$2" --layers "$layers" --dtype bf16 --out "$models/$2" >/dev/null &&
        touch "$models/$2/.done"
}
gen llama llama8b & gen_llama=$!
gen deepseek_v2 dsv2lite & gen_ds=$!
wait $gen_llama && wait $gen_ds
for m in llama8b dsv2lite; do
    say "benchmark $m ($layers layers, BF16 weights)"
    "$build/bench/bench_gpu" "$models/$m" --prefill 2048 --decode 64
done
uptime
say "done: $([ $status = 0 ] && echo 'equivalence passed' || echo 'EQUIVALENCE FAILED')"
exit $status

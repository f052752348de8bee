#!/usr/bin/env bash
# engine.sh: CPU engine throughput, tandem beside llama.cpp on the same weights, in one run.
#
# usage: bench/engine.sh [BUILD_DIR] [THREADS...]     (defaults: build, threads 1 and 2)
#   e.g. bench/engine.sh build-bench 1 2
#
# 1. writes two models with `tandem mkmodel` into BUILD_DIR/bench-engine-models/: the tiny
#    DeepSeek-V3 (--preset tiny) and the ~100M-parameter llama (--preset bench) with an F32 GGUF
#    copy of the same weights, so both engines read the same F32 bytes;
# 2. per thread count, runs bench_engine on both models: prefill tokens/s (a 128-token prompt in one
#    step) and decode tokens/s at batch 1 and 16, each as a fraction of the memory-bandwidth
#    roofline (the bytes a step must read over the read bandwidth bench_engine measures in the
#    same run);
# 3. runs llama.cpp (npm node-llama-cpp@3.21.1, prebuilt CPU build) on the GGUF copy with the same
#    thread count: prefill tokens/s (same 128-token prompt) and greedy decode tokens/s at batch 1;
# 4. prints the ratio tandem / llama.cpp for decode at batch 1 on the ~100M model per thread count.
#
# node-llama-cpp (about 700 MB) is installed on first use into bench/node/node_modules (pinned in
# bench/node/package.json; it is not part of scripts/install-deps). TD_NLC_MODULES=DIR uses an
# existing node_modules folder instead. Build with -Dbuildtype=release for meaningful figures.
# Environment: DECODE (decode steps on the ~100M model, default 64), TINY_DECODE (default 512).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
decode=${DECODE:-64}
tiny_decode=${TINY_DECODE:-512}
prompt=128
tandem=$build/tools/tandem
bench=$build/bench/bench_engine
for b in "$tandem" "$bench"; do
  [ -x "$b" ] || { echo "engine.sh: $b not built (ninja -C $build)" >&2; exit 1; }
done

modules=${TD_NLC_MODULES:-bench/node/node_modules}
if [ ! -f "$modules/node-llama-cpp/package.json" ]; then
  echo "engine.sh: installing node-llama-cpp into bench/node (about 700 MB, once)" >&2
  (cd bench/node && npm install --no-audit --no-fund >&2)
  modules=bench/node/node_modules
fi

models=$build/bench-engine-models
rm -rf "$models"
mkdir -p "$models"
"$tandem" mkmodel --arch llama --preset bench --gguf f32 --out "$models/llama-100m" >&2
"$tandem" mkmodel --arch deepseek_v3 --preset tiny --out "$models/deepseek-tiny" >&2
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$models/llama-100m/config.json")

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# llama.cpp: node-llama-cpp $(sed -n 's/^  "version": "\(.*\)",/\1/p' "$modules/node-llama-cpp/package.json"), prebuilt CPU build"
summary=()
for t in "${threads[@]}"; do
  echo
  echo "## threads $t (load $(cut -d' ' -f1-3 /proc/loadavg))"
  out=$("$bench" "$models/llama-100m" --threads "$t" --prompt $prompt --decode "$decode" --batch 1,16)
  echo "$out" | sed 's/^/tandem    /'
  ref=$(node bench/node/llamacpp_bench.mjs "$modules" "$models/llama-100m/model.gguf" "$vocab" "$t" \
             $prompt "$decode")
  echo "$ref"
  "$bench" "$models/deepseek-tiny" --threads "$t" --prompt $prompt --decode "$tiny_decode" \
      --batch 1,16 | sed 's/^/tandem    /'
  td=$(echo "$out" | sed -n 's/^decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p')
  lc=$(echo "$ref" | sed -n 's/^llama.cpp decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p')
  summary+=("$(awk -v t="$t" -v a="$td" -v b="$lc" 'BEGIN { printf "threads %s: tandem %.1f tokens/s, llama.cpp %.1f tokens/s, tandem/llama.cpp %.2f", t, a, b, a / b }')")
done
echo
echo "## decode at batch 1, ~100M llama (F32): tandem / llama.cpp"
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# engine.sh: CPU engine throughput, tandem beside llama.cpp on the same weights, in one run.
#
# usage: bench/engine.sh [BUILD_DIR] [THREADS...]     (defaults: build, threads 1 and 2)
#   e.g. bench/engine.sh build-bench 1 2;  FORMATS="f32 f16 q8_0" bench/engine.sh build-bench 1 2
#
# 1. writes models with `tandem mkmodel` into BUILD_DIR/bench-engine-models/: the tiny
#    DeepSeek-V3 (--preset tiny) and, per format in FORMATS (default f32; any --gguf type), the
#    ~100M-parameter llama (--preset bench) with a GGUF copy in that format, which both engines
#    read (the same bytes);
# 2. per thread count, runs bench_engine on both models: prefill tokens/s (a 128-token prompt in one
#    step) and decode tokens/s at batch 1 and 16, each as a fraction of the memory-bandwidth
#    roofline (the bytes a step must read over the read bandwidth bench_engine measures in the
#    same run);
# 3. runs llama.cpp (npm node-llama-cpp@3.21.1, prebuilt CPU build) on the GGUF copy with the same
#    thread count: prefill tokens/s (same 128-token prompt) and greedy decode tokens/s at batch 1;
# 4. prints the ratios tandem / llama.cpp for decode at batch 1 and prefill on the ~100M model per
#    format and thread count.
#
# node-llama-cpp comes from tests/node/node_modules (scripts/install-deps installs it there);
# without it, it is installed on first use into bench/node/node_modules (the same pin).
# TD_NLC_MODULES=DIR uses another node_modules folder. Build with -Dbuildtype=release for meaningful figures.
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

formats=(${FORMATS:-f32})
modules=${TD_NLC_MODULES:-tests/node/node_modules}
[ -f "$modules/node-llama-cpp/package.json" ] || modules=${TD_NLC_MODULES:-bench/node/node_modules}
if [ ! -f "$modules/node-llama-cpp/package.json" ]; then
  echo "engine.sh: installing node-llama-cpp into bench/node (about 700 MB, once)" >&2
  (cd bench/node && npm install --no-audit --no-fund >&2)
  modules=bench/node/node_modules
fi

models=$build/bench-engine-models
rm -rf "$models"
mkdir -p "$models"
for f in "${formats[@]}"; do
  "$tandem" mkmodel --arch llama --preset bench --gguf "$f" --out "$models/llama-100m-$f" >&2
done
"$tandem" mkmodel --arch deepseek_v3 --preset tiny --out "$models/deepseek-tiny" >&2
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$models/llama-100m-${formats[0]}/config.json")

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# llama.cpp: node-llama-cpp $(sed -n 's/^  "version": "\(.*\)",/\1/p' "$modules/node-llama-cpp/package.json"), prebuilt CPU build"
summary=()
for t in "${threads[@]}"; do
  for f in "${formats[@]}"; do
    gguf=$models/llama-100m-$f/model.gguf
    echo
    echo "## threads $t, ~100M llama $f GGUF (load $(cut -d' ' -f1-3 /proc/loadavg))"
    out=$("$bench" "$gguf" --threads "$t" --prompt $prompt --decode "$decode" --batch 1,16)
    echo "$out" | sed 's/^/tandem    /'
    ref=$(node bench/node/llamacpp_bench.mjs "$modules" "$gguf" "$vocab" "$t" $prompt "$decode")
    echo "$ref"
    td=$(echo "$out" | sed -n 's/^decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p')
    lc=$(echo "$ref" | sed -n 's/^llama.cpp decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p')
    tp=$(echo "$out" | sed -n 's/^prefill:.*: \([0-9.]*\) tokens\/s.*/\1/p')
    lp=$(echo "$ref" | sed -n 's/^llama.cpp prefill:.*: \([0-9.]*\) tokens\/s.*/\1/p')
    summary+=("$(awk -v t="$t" -v f="$f" -v a="$td" -v b="$lc" -v c="$tp" -v d="$lp" 'BEGIN {
      printf "threads %s %-6s decode: tandem %.1f, llama.cpp %.1f tokens/s, %.2fx; prefill: tandem %.1f, llama.cpp %.1f tokens/s, %.2fx", t, f, a, b, a / b, c, d, c / d }')")
  done
  "$bench" "$models/deepseek-tiny" --threads "$t" --prompt $prompt --decode "$tiny_decode" \
      --batch 1,16 | sed 's/^/tandem    /'
done
echo
echo "## ~100M llama, tandem / llama.cpp (target 1.1x)"
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# contention.sh: does the engine's thread pool hold up when another process wants the cores?
#
# usage: bench/contention.sh [BUILD_DIR] [THREADS]     (defaults: build, 2 threads)
#
# Writes the ~100M llama (`tandem mkmodel --preset bench --gguf f32`), then measures decode
# tokens/s at batch 1 (bench_engine) and the same with one busy-loop process per core beyond the
# first THREADS - 1 (so with 2 threads on 2 cores: one busy loop, which the kernel gives a fair
# share: the engine can expect about 2/3 of the two cores). Prints contended / alone for tandem
# and, on the same GGUF file with the same threads, for llama.cpp (node-llama-cpp under
# tests/node, or TD_NLC_MODULES=DIR; skipped if not installed), against the limit: falling no
# more than in proportion to the CPU the competitor takes, i.e. contended / alone >= 0.5 with one
# competitor on two cores (the share of a core each runnable thread gets if the competitor
# kept a whole core).
# Environment: DECODE (decode steps, default 48), ROUNDS (alternating alone/contended pairs,
# default 2; the best of each is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
decode=${DECODE:-48}
rounds=${ROUNDS:-2}
tandem=$build/tools/tandem
bench=$build/bench/bench_engine
for b in "$tandem" "$bench"; do
  [ -x "$b" ] || { echo "contention.sh: $b not built (ninja -C $build)" >&2; exit 1; }
done
modules=${TD_NLC_MODULES:-tests/node/node_modules}
[ -f "$modules/node-llama-cpp/package.json" ] || modules=""
models=$build/bench-contention-models
rm -rf "$models"
mkdir -p "$models"
"$tandem" mkmodel --arch llama --preset bench --gguf f32 --out "$models/llama-100m" >&2
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$models/llama-100m/config.json")

busy=()
start_busy() {
  for _ in $(seq 1 "$1"); do
    (while :; do :; done) &
    busy+=($!)
  done
}
stop_busy() {
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${busy[@]}"; do wait "$p" 2>/dev/null || true; done
  busy=()
}
trap stop_busy EXIT

tandem_tps() {
  "$bench" "$models/llama-100m" --threads "$threads" --prompt 24 --decode "$decode" --batch 1 |
    sed -n 's/^decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p'
}
llamacpp_tps() {
  node bench/node/llamacpp_bench.mjs "$modules" "$models/llama-100m/model.gguf" "$vocab" \
      "$threads" 16 "$decode" | sed -n 's/^llama.cpp decode batch  1:.*: \([0-9.]*\) tokens\/s.*/\1/p'
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }

competitors=$(( $(nproc) - threads + 1 ))
[ "$competitors" -ge 1 ] || competitors=1
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $threads engine threads; contended: $competitors busy-loop process(es); decode batch 1, $decode steps, best of $rounds"
ta=(); tc=(); la=(); lc=()
for r in $(seq 1 "$rounds"); do
  ta+=("$(tandem_tps)")
  start_busy "$competitors"; tc+=("$(tandem_tps)"); stop_busy
  if [ -n "$modules" ]; then
    la+=("$(llamacpp_tps)")
    start_busy "$competitors"; lc+=("$(llamacpp_tps)"); stop_busy
  fi
done
limit=0.5
report() {
  awk -v n="$1" -v a="$2" -v c="$3" -v l="$limit" 'BEGIN {
    r = c / a
    printf "%-9s alone %7.1f tokens/s, contended %7.1f tokens/s, contended/alone %.2f (limit >= %.2f: %s)\n",
           n, a, c, r, l, (r >= l ? "ok" : "BELOW") }'
}
report tandem "$(best "${ta[@]}")" "$(best "${tc[@]}")"
if [ -n "$modules" ]; then
  report llama.cpp "$(best "${la[@]}")" "$(best "${lc[@]}")"
else
  echo "llama.cpp: not measured (node-llama-cpp not installed under tests/node)"
fi
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

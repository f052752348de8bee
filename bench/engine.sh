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
# 2. per thread count and format, ROUNDS rounds (default 3), each one run of bench_engine on the
#    ~100M llama's GGUF (prefill tokens/s of a PROMPT-token prompt, default 128, in one step, after a 16-token
#    warm-up step on each side: the median of PREFILLS runs in the process on each side; decode tokens/s at batch 1 and 16, each as a fraction of the
#    memory-bandwidth roofline: the bytes a step must read over the read bandwidth bench_engine
#    measures at its start) and one run of llama.cpp
#    (npm node-llama-cpp@3.21.1, prebuilt CPU build) on the same file with the same thread count
#    (prefill of the same prompt, greedy decode at batch 1); the two alternate which goes
#    first from round to round, so that a drift of the machine's speed falls on both;
# 3. per thread count, bench_engine on the tiny DeepSeek-V3 (once);
# 4. prints, per format and thread count, the median over the rounds of each round's ratio tandem /
#    llama.cpp (decode at batch 1, prefill) with their lowest and highest, the median tokens/s of
#    each side, and the read bandwidth of the rounds with the rate tandem's decode read weights at
#    (MB per step x tokens/s) and llama.cpp's (the same bytes x its tokens/s), each also as a
#    fraction of its round's bandwidth: where both are near 100% the step is bound by the memory,
#    not by either engine; on a shared machine one run's ratio moves by more than the gap;
#    and decode tokens per CPU second of each side (bench_engine's and llama.cpp's process CPU
#    time over the decode steps), which leaves out the time spent waiting for a core: the steadier
#    comparison under load at one thread (at two, llama.cpp's spin-waiting threads count as busy).
#
# node-llama-cpp comes from tests/node/node_modules (scripts/install-deps installs it there);
# without it, it is installed on first use into bench/node/node_modules (the same pin).
# TD_NLC_MODULES=DIR uses another node_modules folder. Build with -Dbuildtype=release for meaningful figures.
# Environment: PROMPT (prompt tokens, default 128; attention's share grows with it: users' prompts
# run to thousands), DECODE (decode steps on the ~100M model, default 64), TINY_DECODE (default 512),
# ROUNDS (rounds per thread count and format, default 3; 1 gives the old single run),
# PREFILLS (prefills per run on each side, default 5, the median counts: one prefill's time moves
# by a third from run to run on a shared machine; 1 gives the old single prefill),
# ANON_WEIGHTS=1 (bench_engine --anon-weights 1 on the llama: its weights on anonymous huge pages,
# as a worker with engine.hugepage_weights has them).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
decode=${DECODE:-64}
tiny_decode=${TINY_DECODE:-512}
rounds=${ROUNDS:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "engine.sh: ROUNDS=$rounds: want a positive integer" >&2; exit 2; }
prompt=${PROMPT:-128}
[[ $prompt =~ ^[0-9]+$ ]] && ((prompt >= 24)) || { echo "engine.sh: PROMPT=$prompt: want an integer >= 24" >&2; exit 2; }
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
load() { cut -d' ' -f1-3 /proc/loadavg; }
# tps PREFIX TEXT: the tokens/s figure on TEXT's line that starts with PREFIX
tps() { echo "$2" | sed -n "s/^$1.*: \([0-9.]*\) tokens\/s.*/\1/p"; }
# cpus PREFIX TEXT: the CPU seconds "(CPU C s)" on that line, or nothing
cpus() { echo "$2" | sed -n "s/^$1.*(CPU \([0-9.]*\) s).*/\1/p"; }
# stats: reads "name value" lines; prints "name median min max" per name, in first-seen order
stats() {
  awk '{ if (!($1 in n)) order[k++] = $1; v[$1, n[$1]++] = $2 }
    END { for (i = 0; i < k; i++) { s = order[i]; m = n[s]
            for (a = 0; a < m; a++) x[a] = v[s, a]
            for (a = 1; a < m; a++) for (b = a; b > 0 && x[b - 1] > x[b]; b--) {
              y = x[b]; x[b] = x[b - 1]; x[b - 1] = y }
            med = m % 2 ? x[(m - 1) / 2] : (x[m / 2 - 1] + x[m / 2]) / 2
            print s, med, x[0], x[m - 1] } }'
}
# one round's two runs, into $out and $ref
anon=()
[ "${ANON_WEIGHTS:-0}" = 1 ] && anon=(--anon-weights 1)
prefills=${PREFILLS:-5}
[[ $prefills =~ ^[1-9][0-9]*$ ]] || { echo "engine.sh: PREFILLS=$prefills: want a positive integer" >&2; exit 2; }
run_td() { out=$("$bench" "$gguf" --threads "$t" --prompt $prompt --decode "$decode" --batch 1,16 --prefills "$prefills" "${anon[@]}"); }
run_lc() { ref=$(node bench/node/llamacpp_bench.mjs "$modules" "$gguf" "$vocab" "$t" $prompt "$decode" "$prefills"); }
summary=()
for t in "${threads[@]}"; do
  for f in "${formats[@]}"; do
    gguf=$models/llama-100m-$f/model.gguf
    echo
    echo "## threads $t, ~100M llama $f GGUF, $rounds round(s) (load $(load))"
    vals=""
    for ((r = 1; r <= rounds; r++)); do
      echo "### round $r (load $(load))"
      if ((r % 2)); then run_td; run_lc; else run_lc; run_td; fi
      echo "$out" | sed 's/^/tandem    /'
      echo "$ref"
      td=$(tps 'decode batch  1:' "$out"); lc=$(tps 'llama.cpp decode batch  1:' "$ref")
      tp=$(tps 'prefill:' "$out"); lp=$(tps 'llama.cpp prefill:' "$ref")
      bw=$(echo "$out" | sed -n 's/.*read bandwidth \([0-9.]*\) GB\/s.*/\1/p')
      mb=$(echo "$out" | sed -n 's/^decode batch  1:.* \([0-9.]*\) MB read per step.*/\1/p')
      tc=$(cpus 'decode batch  1:' "$out"); lcc=$(cpus 'llama.cpp decode batch  1:' "$ref")
      vals+=$(awk -v a="$td" -v b="$lc" -v c="$tp" -v d="$lp" -v w="$bw" -v m="$mb" -v x="$tc" \
          -v y="$lcc" -v s="$decode" 'BEGIN {
        printf "dr %.4f\npr %.4f\ntd %s\nlc %s\ntp %s\nlp %s\nbw %s\nwr %.2f\nlr %.2f\n", a / b, c / d, a, b, c, d, w, m * a / 1000, m * b / 1000
        if (w > 0) printf "wf %.4f\nlf %.4f\n", m * a / 1000 / w, m * b / 1000 / w
        if (x > 0 && y > 0) printf "tc %.2f\nlcc %.2f\ncr %.4f\n", s / x, s / y, y / x }')$'\n'
    done
    st=$(printf '%s' "$vals" | stats)
    summary+=("$(echo "$st" | awk -v t="$t" -v f="$f" -v n="$rounds" '{ md[$1] = $2; lo[$1] = $3; hi[$1] = $4 }
      END { printf "threads %s %-6s decode: tandem %.1f, llama.cpp %.1f tokens/s, %.2fx; prefill: tandem %.1f, llama.cpp %.1f tokens/s, %.2fx\n", t, f, md["td"], md["lc"], md["dr"], md["tp"], md["lp"], md["pr"]
        printf "  %d round(s): decode %.2f-%.2fx, prefill %.2f-%.2fx; read bandwidth %.1f GB/s (%.1f-%.1f)",
          n, lo["dr"], hi["dr"], lo["pr"], hi["pr"], md["bw"], lo["bw"], hi["bw"]
        printf "\n  decode reads the weights at: tandem %.1f GB/s, llama.cpp %.1f GB/s", md["wr"], md["lr"]
        if ("wf" in md) printf " (of the round'"'"'s read bandwidth: tandem %.0f%%, llama.cpp %.0f%%, medians)", 100 * md["wf"], 100 * md["lf"]
        if ("cr" in md) printf "\n  decode per CPU second: tandem %.1f, llama.cpp %.1f tokens/s, %.2fx (%.2f-%.2f)", md["tc"], md["lcc"], md["cr"], lo["cr"], hi["cr"] }')")
  done
  "$bench" "$models/deepseek-tiny" --threads "$t" --prompt $prompt --decode "$tiny_decode" \
      --batch 1,16 | sed 's/^/tandem    /'
done
echo
echo "## ~100M llama, tandem / llama.cpp (target 1.1x; load $(load))"
echo "# tokens/s and ratios: medians over the rounds (a ratio per round); then the lowest-highest"
printf '%s\n' "${summary[@]}"

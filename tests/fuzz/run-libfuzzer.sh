#!/usr/bin/env bash
# run-libfuzzer.sh: run every libFuzzer target of a -Dfuzz=true build for a fixed time each.
#   tests/fuzz/run-libfuzzer.sh BUILD SECONDS [TARGET...]
# BUILD is a build folder set up with CC=clang -Dfuzz=true -Db_sanitize=address,undefined. Each
# target fuzz_<name>_libfuzzer runs SECONDS over BUILD/tests/fuzz/libfuzzer/<name>/corpus (kept
# between runs; new inputs land there), seeded from tests/fuzz/corpus/<name> and the target's own
# seed (fuzz_<name> --write-seed). A crash, leak, UBSan report or timeout leaves its input in
# BUILD/tests/fuzz/libfuzzer/<name>/ (crash-*, leak-*, timeout-*, oom-*) and fails the run.
# Prints one line per target: seconds (wall clock), CPU seconds (user + system), executions,
# crashes, corpus size. Exit 77 when the build has
# no libFuzzer targets.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run-libfuzzer.sh BUILD SECONDS [TARGET...]}
secs=${2:?usage: run-libfuzzer.sh BUILD SECONDS [TARGET...]}
shift 2
build=$(cd "$build" && pwd)
dir=$build/tests/fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$dir"/fuzz_*_libfuzzer; do
    [ -x "$f" ] || continue
    n=${f##*/fuzz_}; targets+=("${n%_libfuzzer}")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "run-libfuzzer: no fuzz_*_libfuzzer in $dir (set up the build with CC=clang -Dfuzz=true)" >&2
  exit 77
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$src/tests/lsan.supp:print_suppressions=0}
export TD_SOURCE_ROOT=$src
fail=0
printf '%-18s %7s %8s %12s %8s %8s\n' target seconds cpu_s executions crashes corpus
for name in "${targets[@]}"; do
  exe=$dir/fuzz_${name}_libfuzzer
  work=$dir/libfuzzer/$name
  mkdir -p "$work/corpus" "$work/seed"
  [ -d "$src/tests/fuzz/corpus/$name" ] && cp -f "$src/tests/fuzz/corpus/$name"/* "$work/seed/" 2>/dev/null
  for d in "$dir/fuzz_$name" "$dir/fuzz_${name}_mutate"; do
    [ -x "$d" ] && "$d" --write-seed "$work/seed/target-seed" 2>/dev/null && break
  done
  log=$work/last.log
  rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
  TIMEFORMAT='%U %S'
  { time "$exe" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2560 -print_final_stats=1 \
      -artifact_prefix="$work/" "$work/corpus" "$work/seed" >"$log" 2>&1; } 2>"$work/cpu"
  rc=$?
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$work/cpu" 2>/dev/null)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(find "$work" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
    -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-18s %7s %8s %12s %8s %8s\n' "$name" "$secs" "${cpu:-?}" "${execs:-?}" "$crashes" \
    "${corpus:-?}"
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    fail=1
    echo "run-libfuzzer: $name failed (exit $rc); its log: $log" >&2
    grep -m1 -A25 'ERROR: \|runtime error\|deadly signal' "$log" >&2
  fi
done
exit $fail

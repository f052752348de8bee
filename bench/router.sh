#!/usr/bin/env bash
# router.sh: the router's own added latency per request (bench_router.c): one decode worker
# registered with both the real tandem-router and bench_router's minimal router; the same
# one-token request alternately straight to the worker and through the router's RPC.
#   bench/router.sh BUILD_DIR [N] [PROMPT_LEN]
set -euo pipefail
build=$(cd "${1:?usage: router.sh BUILD_DIR [N] [PROMPT_LEN]}" && pwd)
n=${2:-500}
plen=${3:-8}
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
model=$build/tests/integration/model-deepseek_v3
[ -f "$model/config.json" ] || ninja -C "$build" tests/integration/model-deepseek_v3.stamp >/dev/null
"$build/router/tandem-router" --model "$model" --http.listen 127.0.0.1:0 --rpc.listen 127.0.0.1:0 \
  --cluster.listen 127.0.0.1:0 --cluster.secret_file "$dir/secret" >"$dir/router.out" 2>"$dir/router.log" &
for _ in $(seq 100); do grep -q cluster= "$dir/router.out" && break; sleep 0.1; done
rpc=$(sed -n 's/.* rpc=\([^ ]*\).*/\1/p' "$dir/router.out")
cluster=$(sed -n 's/.* cluster=\([^ ]*\).*/\1/p' "$dir/router.out")
"$build/bench/bench_router" --listen 127.0.0.1:0 --router "$rpc" --secret-file "$dir/secret" \
  --n "$n" --prompt-len "$plen" >"$dir/bench.out" 2>&1 &
bench=$!
for _ in $(seq 100); do grep -q port= "$dir/bench.out" && break; sleep 0.1; done
bport=$(sed -n 's/.*port=\([0-9]*\).*/\1/p' "$dir/bench.out")
UCX_TLS=tcp "$build/decode/tandem-decode" --model "$model" --id d0 --routers "$cluster,127.0.0.1:$bport" \
  --cluster.secret_file "$dir/secret" --engine.threads 1 --kv.memory 32M >/dev/null 2>"$dir/decode.log" &
wait $bench
echo "# machine: $(nproc) cores, $(lscpu | sed -n 's/Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
grep -v port= "$dir/bench.out"

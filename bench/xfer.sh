#!/usr/bin/env bash
# xfer.sh: KV data-plane benchmark over TCP and shared memory, with ucx_perftest's figures for the
# same transports and sizes. Usage: bench/xfer.sh [BUILD_DIR] [POOL_MiB] [SECONDS]
# Prints bench_kvx's tables (GB/s and ratios to memcpy / a plain TCP socket measured in the same
# run) and, per transport, ucx_perftest ucp_put_bw / ucp_am_bw at 1 MiB and 16 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
pool=${2:-256}
secs=${3:-2}
bin=${BENCH_KVX:-$build/bench/bench_kvx}
[ -x "$bin" ] || { echo "xfer.sh: $bin not built (ninja -C $build bench/bench_kvx)" >&2; exit 1; }

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(ucx_info -v | head -1 | sed 's/^# //')"
for tls in tcp sm,self; do
  UCX_TLS=$tls "$bin" --pool "$pool" --seconds "$secs" 2>&1 | grep -v '^ts='
  if command -v ucx_perftest >/dev/null; then
    for test in ucp_put_bw ucp_am_bw; do
      for size in 1048576 16777216; do
        port=$((20000 + RANDOM % 20000))
        UCX_TLS=$tls ucx_perftest -p $port -t $test -s $size -n $((size > 4194304 ? 50 : 500)) >/dev/null 2>&1 &
        srv=$!
        sleep 0.5
        line=$(UCX_TLS=$tls timeout 60 ucx_perftest 127.0.0.1 -p $port -t $test -s $size -n $((size > 4194304 ? 50 : 500)) 2>/dev/null | grep '^Final' || true)
        wait $srv 2>/dev/null || true
        # Final: iters typical avg overall bw_avg(MB/s) bw_overall(MB/s) ...
        mbs=$(echo "$line" | awk '{print $6}')
        echo "perftest $tls $test size=$size ${mbs:-?} MB/s"
      done
    done
  fi
done

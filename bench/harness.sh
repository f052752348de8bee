#!/usr/bin/env bash
# harness.sh: shows that `tandem bench` is not the bottleneck. Drives the scripted SSE server
# (tests/integration/sse_server: first token TTFT_MS after the request is read, then one every
# ITL_MS) open-loop at RATE req/s and prints, against the limits the project set (>= 2,000
# concurrent streams, >= 5,000 requests/s, harness-added TTFT < 1 ms):
#   - the send rate achieved and the lag behind the arrival schedule,
#   - the peak number of streams in flight,
#   - added TTFT = client TTFT - the server's own request-to-first-chunk delay (the server puts it
#     in its first chunk), split into two legs with the server's CLOCK_MONOTONIC timestamps:
#     harness send -> server read the request (mostly the server's loop) and server wrote the
#     first chunk -> harness read it (the harness's receive path plus loopback),
#   - the CPU the harness and the server used.
# Three runs: (1) as `tandem bench` measures by default, chunk times from the kernel's receive
# timestamps (so the harness's own loop delays do not enter its figures); (2) the same load with
# --app-timestamps, chunk times taken when the loop reads them, as vLLM's Python client does (this
# shows what the harness's loop itself adds); (3) that again at a tenth of the rate: the machine's
# own noise floor (other processes share these two cores), to tell tails that come from load apart
# from tails that come from the box.
#
#   bench/harness.sh [BUILD_DIR]          (default build; needs tools/tandem and sse_server)
#   RATE=5500 N=33000 TTFT_MS=100 ITL_MS=100 TOKENS=4 bench/harness.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
RATE=${RATE:-5500}
N=${N:-33000}
TTFT_MS=${TTFT_MS:-100}
ITL_MS=${ITL_MS:-100}
TOKENS=${TOKENS:-4}
TANDEM=$B/tools/tandem
SERVER=$B/tests/integration/sse_server
[ -x "$TANDEM" ] && [ -x "$SERVER" ] || { echo "harness.sh: build $TANDEM and $SERVER first" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)"

tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$SERVER" --ttft-ms "$TTFT_MS" --itl-ms "$ITL_MS" --tokens "$TOKENS" >"$tmp/port" 2>"$tmp/server.err" &
spid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(awk '{print $2}' "$tmp/port")
tck=$(getconf CLK_TCK)

cat >"$tmp/report.py" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
u, s, wall = map(float, open(sys.argv[2]).read().split()[-3:])
server_cpu = int(sys.argv[3]) / int(sys.argv[4])
limits = sys.argv[5] == "1"
def row(name, value, unit, limit=None, higher=True):
    if limit is None or not limits:
        print(f"{name:52s} {value:10.3f} {unit}")
    else:
        ratio = value / limit if higher else (limit / value if value > 0 else float("inf"))
        ok = "ok" if ratio >= 1 else "BELOW"
        print(f"{name:52s} {value:10.3f} {unit:8s} limit {limit:g}: ratio {ratio:5.2f} {ok}")
print(f"completed {r['completed']}, failed {r['failed']} {r['failed_by_kind']}, chunk times: {r['timestamps']}")
row("achieved send rate", r["achieved_send_rate"], "req/s", 5000)
row("completed requests / duration (incl. the tail)", r["request_throughput"], "req/s")
row("peak streams in flight", r["peak_inflight"], "streams", 2000)
row("send lag behind the schedule, mean", r["mean_send_lag_ms"], "ms")
row("send lag behind the schedule, p99", r["p99_send_lag_ms"], "ms")
row("client TTFT, mean", r["mean_ttft_ms"], "ms")
row("added TTFT (client TTFT - server delay), mean", r["mean_harness_added_ttft_ms"], "ms", 1.0, False)
row("added TTFT, median", r["median_harness_added_ttft_ms"], "ms", 1.0, False)
row("added TTFT, p99", r["p99_harness_added_ttft_ms"], "ms", 1.0, False)
row("  request leg (harness send -> server read), mean", r["mean_request_leg_ms"], "ms")
row("  request leg, p99", r["p99_request_leg_ms"], "ms")
row("  response leg (server write -> harness read), mean", r["mean_response_leg_ms"], "ms", 1.0, False)
row("  response leg, p99", r["p99_response_leg_ms"], "ms", 1.0, False)
row("client ITL, mean", r["mean_itl_ms"], "ms")
row("harness CPU (user+sys) / wall", (u + s) / wall, "cores")
row("server CPU / run duration", server_cpu / r["duration"], "cores")
PY

run() { # run RATE N CHECK_LIMITS(1|0) [extra tandem bench flags]
  local rate=$1 n=$2 limits=$3 su0 ss0 su1 ss1
  shift 3
  read -r su0 ss0 < <(awk '{print $14, $15}' "/proc/$spid/stat")
  /usr/bin/time -f "%U %S %e" -o "$tmp/time" "$TANDEM" bench --base-url "http://127.0.0.1:$port" \
    --num-prompts "$n" --request-rate "$rate" --random-input-len 16 --random-output-len "$TOKENS" \
    --metric-percentiles 50,90,99 --result-file "$tmp/r.json" --no-progress "$@" >"$tmp/out.txt" 2>&1 ||
    { cat "$tmp/out.txt"; exit 1; }
  read -r su1 ss1 < <(awk '{print $14, $15}' "/proc/$spid/stat")
  echo "## $n requests at $rate req/s (Poisson) $*, load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/python3 "$tmp/report.py" "$tmp/r.json" "$tmp/time" "$((su1 + ss1 - su0 - ss0))" "$tck" "$limits"
}

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# server: ttft ${TTFT_MS} ms, itl ${ITL_MS} ms, ${TOKENS} tokens per stream"
run "$RATE" "$N" 1
run "$RATE" "$N" 1 --app-timestamps
run "$(/usr/bin/python3 -c "print($RATE / 10)")" "$((N / 10))" 0 --app-timestamps

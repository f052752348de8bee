#!/usr/bin/python3
"""scale.py: the router and placement at cluster scale, with SIMULATED workers.

Usage: bench/scale.py BUILD_DIR [--prefill 4] [--decode 64] [--rates 4,8,16,32]
                      [--num-prompts 300] [--policy least_loaded] [--out DIR] [SIM FLAGS...]

Starts one tandem-router and --prefill + --decode workers started with `--engine.kind sim` (the
SIMULATED engine: no model math, each step takes the time of the sim.* latency model; batching,
KV block reservation, the UCX transfer of every prompt's KV, routing and streaming are the real
code), in the topology DeepSeek's deployment notes benchmark (4 prefill, 64 decode), all on this
machine. `tandem bench` sweeps the request rates with a random workload (input 512 +-50%, output
64, ignore_eos) and writes its result JSON and HTML report to --out. Then every worker's /metrics
gives the spread of work: prompt tokens per prefill worker, generated tokens per decode worker
(min, max, coefficient of variation), and the KV bytes moved.

Extra arguments are passed to every worker (e.g. the sim.* flags bench/calibrate_sim.py prints).

With --redis the cluster KV index is on (a private redis-server, --kv.redis on every daemon) and,
with --dataset prefix, `tandem bench` sends the shared-system-prompt workload (--prefix-groups
groups of --prefix-per-group prompts, a --prefix-system-len system prompt each) instead of
random prompts. The run then also reports the index at this scale: its size (the router's
tandem_kv_index_blocks and tandem_kv_index_bytes, and Redis's used_memory per block), the
router's CPU per request placed (utime + stime from /proc over the bench, divided by the
requests: all of the router's work, placement included), and the Redis commands per second
(total_commands_processed over the bench's duration).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402


def spread(values):
    mean = statistics.mean(values)
    return {"min": min(values), "max": max(values), "mean": mean,
            "cv": statistics.pstdev(values) / mean if mean else 0.0,
            "max_over_mean": max(values) / mean if mean else 0.0}


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def router_cpu(cl):
    """The router's user + system CPU seconds so far."""
    f = open("/proc/%d/stat" % cl.router.proc.pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def redis_field(cl, section, key):
    if not cl.redis:
        return 0
    for line in cl.redis.cmd("INFO", section).decode().splitlines():
        if line.startswith(key + ":"):
            return int(line.split(":")[1])
    return 0


def redis_ops(cl):
    return redis_field(cl, "stats", "total_commands_processed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--prefill", type=int, default=4)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rates", default="4,8,16,32")
    ap.add_argument("--num-prompts", type=int, default=300)
    ap.add_argument("--policy", default="least_loaded")
    ap.add_argument("--out", default="bench-scale-out")
    ap.add_argument("--tls", default="sm,self")
    ap.add_argument("--redis", action="store_true")
    ap.add_argument("--dataset", choices=("random", "prefix"), default="random")
    ap.add_argument("--prefix-groups", type=int, default=16)
    ap.add_argument("--prefix-per-group", type=int, default=32)
    ap.add_argument("--prefix-system-len", type=int, default=1024)
    a, sim = ap.parse_known_args()
    build = os.path.abspath(a.build)
    os.makedirs(a.out, exist_ok=True)
    model = os.path.join(build, "bench-scale-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch",
                        "deepseek_v3", "--preset", "tiny", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-deepseek_v3", "models"), "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
    t0 = time.monotonic()
    cl = C.Cluster(build, model, n_prefill=0, n_decode=0, ucx_tls=a.tls,
                   router_args=["--placement.policy", a.policy,
                                "--placement.local_prefill_tokens", "0",
                                "--admission.max_waiting", "100000",
                                "--cluster.heartbeat_timeout_s", "5"],
                   worker_args=["--engine.kind", "sim", "--kv.memory", "24M",
                                "--engine.max_running", "512", "--log.level", "warn"] + sim,
                   redis=a.redis)
    try:
        # start every worker at once, then wait for all of them
        pending = []
        for role, n, pfx in (("prefill", a.prefill, "p"), ("decode", a.decode, "d")):
            for i in range(n):
                wid = "%s%02d" % (pfx, i)
                d = C.Daemon(wid, [
                    os.path.join(build, role, "tandem-" + role), "--model", model, "--id", wid,
                    "--routers", cl.cluster_addr, "--cluster.secret_file", cl.secret_file,
                    "--http.listen", "127.0.0.1:0", "--engine.threads", "1",
                    "--heartbeat_s", "0.5"] + cl.worker_args,
                    cl.env, r"tandem-%s: id=" % role, cl.dir)
                cl.workers[wid] = d
                pending.append(d)
        for d in pending:
            d.wait_ready(120)
        cl.wait_workers(a.prefill + a.decode, timeout=120)
        print("cluster up: router + %d prefill + %d decode SIMULATED workers in %.1f s" %
              (a.prefill, a.decode, time.monotonic() - t0), flush=True)
        base = cl.http
        res = os.path.join(os.path.abspath(a.out), "scale.json")
        if a.dataset == "prefix":
            wl = ["--dataset-name", "prefix", "--prefix-groups", str(a.prefix_groups),
                  "--prefix-prompts-per-group", str(a.prefix_per_group), "--prefix-system-len",
                  str(a.prefix_system_len), "--prefix-question-len", "64"]
        else:
            wl = ["--dataset-name", "random", "--random-input-len", "512",
                  "--random-range-ratio", "0.5"]
        cpu0, ops0, tb0 = router_cpu(cl), redis_ops(cl), time.monotonic()
        argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", base,
                "--model", os.path.basename(model), "--tokenizer", model] + wl + [
                "--random-output-len", "64", "--ignore-eos",
                "--request-rate", a.rates, "--num-prompts", str(a.num_prompts),
                "--num-warmups", "8", "--seed", "1", "--goodput", "ttft:2000", "tpot:100",
                "--result-file", res, "--html", os.path.join(os.path.abspath(a.out),
                                                               "scale.html"),
                "--scrape-metrics", "--label", "scale-%dP%dD-sim" % (a.prefill, a.decode),
                "--no-progress"]
        r = subprocess.run(argv, text=True, capture_output=True)
        print(r.stdout)
        if r.returncode != 0:
            print(r.stderr)
            sys.exit("tandem bench failed")
        pre = [cl.worker_metric(w, "tandem_prompt_tokens_total")
               for w in cl.workers if w.startswith("p")]
        dec = [cl.worker_metric(w, "tandem_generation_tokens_total")
               for w in cl.workers if w.startswith("d")]
        moved = sum(cl.worker_metric(w, "tandem_kv_transfer_bytes_total")
                    for w in cl.workers if w.startswith("p"))
        out = {"prefill_prompt_tokens": spread(pre), "decode_generated_tokens": spread(dec),
               "kv_bytes_pushed": moved, "policy": a.policy}
        print("spread of work across workers (every rate together):")
        for k in ("prefill_prompt_tokens", "decode_generated_tokens"):
            s = out[k]
            print("  %-24s min %10.0f  max %10.0f  mean %10.1f  cv %.3f  max/mean %.3f" %
                  (k, s["min"], s["max"], s["mean"], s["cv"], s["max_over_mean"]))
        print("  KV pushed by the prefill workers: %.1f MiB" % (moved / 2**20))
        if a.redis:
            secs = time.monotonic() - tb0
            placed = sum(w["assigned"] for w in cl.status().values() if w["role"] == "decode")
            text = cl.metrics_text()
            ix = {k: metric(text, "tandem_kv_index_" + k) for k in ("blocks", "bytes")}
            used = redis_field(cl, "memory", "used_memory")
            out["index"] = {
                "blocks": ix["blocks"], "router_bytes": ix["bytes"],
                "router_bytes_per_block": ix["bytes"] / ix["blocks"] if ix["blocks"] else 0,
                "redis_used_memory": used,
                "redis_bytes_per_block": used / ix["blocks"] if ix["blocks"] else 0,
                "requests_placed": placed,
                "router_cpu_ms_per_request": (router_cpu(cl) - cpu0) * 1e3 / max(placed, 1),
                "redis_ops_per_s": (redis_ops(cl) - ops0) / secs, "seconds": secs,
                "load_after": " ".join(open("/proc/loadavg").read().split()[:3])}
            x = out["index"]
            print("cluster KV index (Redis) at this scale:")
            print("  %d blocks mirrored; router %.1f bytes/block (%.1f MiB); Redis used_memory "
                  "%.1f bytes/block (all of it: index plus Redis's own)" %
                  (x["blocks"], x["router_bytes_per_block"], x["router_bytes"] / 2**20,
                   x["redis_bytes_per_block"]))
            print("  router CPU %.2f ms per request placed (%d requests; all of its work)" %
                  (x["router_cpu_ms_per_request"], placed))
            print("  Redis %.0f commands/s over %.0f s of bench" % (x["redis_ops_per_s"], secs))
        with open(os.path.join(a.out, "spread.json"), "w") as f:
            json.dump(out, f, indent=1)
        cl.stop()
    finally:
        C._kill_all()


if __name__ == "__main__":
    main()

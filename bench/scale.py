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
                                "--engine.max_running", "512", "--log.level", "warn"] + sim)
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
        argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", base,
                "--model", os.path.basename(model), "--tokenizer", model,
                "--dataset-name", "random", "--random-input-len", "512",
                "--random-range-ratio", "0.5", "--random-output-len", "64", "--ignore-eos",
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
        with open(os.path.join(a.out, "spread.json"), "w") as f:
            json.dump(out, f, indent=1)
        cl.stop()
    finally:
        C._kill_all()


if __name__ == "__main__":
    main()

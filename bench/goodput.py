#!/usr/bin/python3
"""goodput.py: disaggregated versus colocated serving, goodput across a rate sweep.

Usage: bench/goodput.py BUILD_DIR --workload mixed|prefix [--rates 2,4,8,16] [--num-prompts 200]
                        [--slo "ttft:500 tpot:50"] [--out DIR]

On the real tiny model (mkmodel's DeepSeek-V3 with the real tokenizer, 4096-token context, CPU
engine, one thread per worker), two clusters of two workers each, measured one after the other
with the same `tandem bench` sweep:
  disaggregated  1 prefill + 1 decode worker (every prompt prefilled on the prefill worker)
  colocated      2 decode workers, each prefilling its own prompts
Workloads: mixed = random prompts 512 +-90% tokens, outputs 64 +-90%; prefix = 8 groups of 16
prompts sharing a 1024-token system prompt plus a 64-token question, outputs 32.
Prints, per rate, request throughput, goodput under the SLO and TTFT/TPOT percentiles for both,
and the ratio disaggregated/colocated; writes both result files and HTML reports to --out.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--workload", default="mixed", choices=["mixed", "prefix"])
    ap.add_argument("--rates", default="2,4,8,16")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--slo", default="ttft:500 tpot:50")
    ap.add_argument("--out", default="bench-goodput-out")
    ap.add_argument("--tls", default="sm,self")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    model = os.path.join(build, "bench-goodput-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch",
                        "deepseek_v3", "--preset", "tiny", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-deepseek_v3", "models"), "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
    if a.workload == "mixed":
        wl = ["--dataset-name", "random", "--random-input-len", "512", "--random-range-ratio",
              "0.9", "--random-output-len", "64", "--num-prompts", str(a.num_prompts)]
    else:
        wl = ["--dataset-name", "prefix", "--prefix-groups", "8", "--prefix-prompts-per-group",
              str(max(1, a.num_prompts // 8)), "--prefix-system-len", "1024",
              "--prefix-question-len", "64", "--random-output-len", "32"]
    results = {}
    for mode in ("disaggregated", "colocated"):
        kw = dict(ucx_tls=a.tls, engine_threads=1,
                  worker_args=["--kv.memory", "512M", "--engine.max_batch_tokens", "1024",
                               "--engine.prefill_chunk", "512"])
        if mode == "disaggregated":
            cl = C.Cluster(build, model, n_prefill=1, n_decode=1,
                           router_args=["--placement.local_prefill_tokens", "0"], **kw)
        else:
            cl = C.Cluster(build, model, n_prefill=0, n_decode=2, **kw)
        try:
            res = os.path.join(out, "%s-%s.json" % (a.workload, mode))
            argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", cl.http,
                    "--model", os.path.basename(model), "--tokenizer", model, "--ignore-eos",
                    "--request-rate", a.rates, "--seed", "3", "--num-warmups", "4",
                    "--goodput"] + a.slo.split() + ["--result-file", res, "--html",
                                                     os.path.join(out, "%s-%s.html" %
                                                                  (a.workload, mode)),
                                                     "--scrape-metrics", "--label",
                                                     "%s-%s" % (a.workload, mode),
                                                     "--no-progress"] + wl
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit("tandem bench failed:\n" + r.stderr)
            print("== %s\n%s" % (mode, r.stdout), flush=True)
            cl.stop()
        finally:
            C._kill_all()
        results[mode] = {}
        for rate in a.rates.split(","):
            path = res.replace(".json", "-qps%s.json" % rate) if "," in a.rates else res
            if not os.path.exists(path):
                cands = [f for f in os.listdir(out) if f.startswith("%s-%s-qps" %
                                                                   (a.workload, mode))]
                path = next((os.path.join(out, f) for f in cands
                             if f.split("qps")[1].startswith(rate)), path)
            with open(path) as f:
                results[mode][rate] = json.load(f)
    print("workload %s, SLO %s, two workers per cluster, one CPU thread each" %
          (a.workload, a.slo))
    print("%6s | %-42s | %-42s | %s" % ("rate", "disaggregated: req/s goodput ttft_p99 tpot_p99",
                                        "colocated: req/s goodput ttft_p99 tpot_p99",
                                        "goodput dis/col"))
    for rate in a.rates.split(","):
        row = []
        for mode in ("disaggregated", "colocated"):
            j = results[mode][rate]
            row.append("%6.2f %7.2f %8.0f ms %7.1f ms" % (
                j["request_throughput"], j.get("request_goodput") or 0.0,
                j.get("p99_ttft_ms", 0), j.get("p99_tpot_ms", 0)))
        gd = results["disaggregated"][rate].get("request_goodput") or 0.0
        gc = results["colocated"][rate].get("request_goodput") or 0.0
        print("%6s | %-42s | %-42s | %s" % (rate, row[0], row[1],
                                            "%.2f" % (gd / gc) if gc else "n/a"))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""handoff.py: what disaggregation costs in time to first token, and how much of it is KV moving.

Usage: bench/handoff.py BUILD_DIR [--lengths 128,512,1024,2048,4096,8192] [--reps 3]
                        [--threads 2] [--tls sm,self]

In one run, on the same machine and model, two clusters side by side, the modes alternating
request by request (mkmodel's ~100M-parameter llama with the Llama 3
tokenizer and a 9000-token context):
  disaggregated  router + tandem-prefill + tandem-decode, every prompt prefilled on the prefill
                 worker and its KV pushed into the decode worker's pool over UCX
  colocated      router + tandem-decode only: the decode worker prefills the prompt itself
For each prompt length, TTFT is measured at the client (HTTP streaming, time to the first SSE
chunk) as the median of --reps requests; the KV share is the prefill worker's
tandem_kv_handoff_tail_seconds for the same requests (from the end of the prompt's compute to the
acknowledgement of its last push: the part of the transfer that does not overlap compute).
Printed figures are ratios against the colocated baseline measured in the same run.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402


def ttft(cl, prompt):
    """Seconds to the first streamed chunk of a one-token completion."""
    host, port = cl.http.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0,
                       "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    first = None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and first is None:
            first = time.perf_counter() - t0
        if line.strip() == b"data: [DONE]":
            break
    conn.close()
    return first


def tail_stats(cl, wid):
    return (cl.worker_metric(wid, "tandem_kv_handoff_tail_seconds_sum"),
            cl.worker_metric(wid, "tandem_kv_handoff_tail_seconds_count"),
            cl.worker_metric(wid, "tandem_kv_transfer_bytes_total"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--lengths", default="128,512,1024,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tls", default="sm,self")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    lengths = [int(x) for x in a.lengths.split(",")]
    model = os.path.join(build, "bench-handoff-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch", "llama",
                        "--preset", "bench", "--context", "9000", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-llama3", "models"), "--out", model], check=True)
    prompts = {n: [1000 + (i * 7919) % 20000 for i in range(n)] for n in lengths}
    common = dict(ucx_tls=a.tls, engine_threads=a.threads,
                  worker_args=["--kv.memory", "1G", "--engine.prefill_chunk", "512",
                               "--engine.max_batch_tokens", "512"])
    results = {}
    # Both clusters run side by side (an idle worker costs no CPU) and the two modes alternate
    # request by request, so drift in the machine's speed hits both alike.
    clusters = {}
    try:
        clusters["colocated"] = C.Cluster(build, model, n_prefill=0, n_decode=1, **common)
        clusters["disaggregated"] = C.Cluster(build, model, n_prefill=1, n_decode=1,
                                              router_args=["--placement.local_prefill_tokens",
                                                           "0"], **common)
        for cl in clusters.values():
            ttft(cl, prompts[lengths[0]])  # warm-up: page in the weights
        dis = clusters["disaggregated"]
        for n in lengths:
            times = {"colocated": [], "disaggregated": []}
            tails, nbytes = [], 0
            for _ in range(a.reps):
                times["colocated"].append(ttft(clusters["colocated"], prompts[n]))
                before = tail_stats(dis, "p0")
                times["disaggregated"].append(ttft(dis, prompts[n]))
                end = time.monotonic() + 10  # PrefillDone follows the last acknowledgement
                after = tail_stats(dis, "p0")
                while after[1] == before[1] and time.monotonic() < end:
                    time.sleep(0.02)
                    after = tail_stats(dis, "p0")
                if after[1] > before[1]:
                    tails.append((after[0] - before[0]) / (after[1] - before[1]))
                nbytes = after[2] - before[2]
            for mode in times:
                results[(mode, n)] = (statistics.median(times[mode]),
                                      statistics.median(tails) if tails else None, nbytes)
            print("%5d tokens: TTFT colocated %.3f s, disaggregated %.3f s" %
                  (n, results[("colocated", n)][0], results[("disaggregated", n)][0]),
                  flush=True)
        for cl in clusters.values():
            cl.stop()
    finally:
        C._kill_all()
    print()
    print("UCX_TLS=%s, %d engine threads, median of %d, prompt lengths in tokens" %
          (a.tls, a.threads, a.reps))
    print("%7s %12s %12s %9s %12s %10s %14s %15s" % ("tokens", "colocated_s", "disagg_s",
                                                      "ratio", "kv_tail_ms", "kv_MiB",
                                                      "kv_share_diff", "kv_tail/ttft"))
    for n in lengths:
        base, _, _ = results[("colocated", n)]
        dis, tail, nbytes = results[("disaggregated", n)]
        diff = dis - base
        share = "%.0f%%" % (100 * tail / diff) if tail is not None and diff > 0 else "n/a"
        print("%7d %12.4f %12.4f %9.3f %12.3f %10.2f %14s %14.2f%%" %
              (n, base, dis, dis / base, (tail or 0) * 1e3, nbytes / 2**20, share,
               100 * (tail or 0) / dis))
    print("goal: ratio < 1.05 from 1024 tokens up")


if __name__ == "__main__":
    main()

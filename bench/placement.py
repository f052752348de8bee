#!/usr/bin/python3
"""placement.py: KV-aware placement against p2c and round_robin, and against an oracle, on
2 prefill + 3 decode workers with the cluster KV index in Redis.

Usage: bench/placement.py BUILD_DIR [--engine cpu|sim] [--workloads multiturn,prefix,mooncake]
                          [--policies kv_aware,p2c,round_robin] [--rate 4] [--memory 128]
                          [--sessions 8 --turns 4 --mt-question-len 64 --mt-output-len 32]
                          [--groups 4 --per-group 8 --system-len 512 --question-len 64
                           --output-len 16] [--slo-ttft-ms 2000] [--slo-tpot-ms 200]
                          [--trace FILE --trace-start 0 --trace-limit 600 --trace-block-tokens 16
                           --trace-time-scale 0.2 --trace-max-input-len 3072
                           --trace-max-output-len 32]
                          [--router-arg FLAG]... [--no-oracle]
                          [--html docs/bench/placement.html] [--out DIR]

For each workload of `tandem bench` (multiturn: sessions whose turns extend the conversation;
prefix: groups of prompts sharing a system prompt, interleaved), one run per policy, each on a
fresh cluster (router + 2 prefill + 3 decode + a private redis-server, every worker --kv.memory
MiB, the same seed, so the same trace): `tandem bench` at --rate req/s (Poisson), then from every
worker's /metrics the prompt tokens (each request counted once, on its decode worker) and the
prefix-cache hits (both tiers, every worker). Hit rate = hits / prompt tokens. Saved = 1 - the
prompt tokens computed on every worker / prompt tokens: it also counts the blocks a worker
fetched from another worker's cache (printed), which are no hit of its own cache.

mooncake: the real Mooncake conversation trace (--trace, default ../shared/traces/; `tandem bench
--dataset-name mooncake`): --trace-limit requests from --trace-start, --trace-block-tokens tokens
synthesized per 512-token hash id (the sharing pattern kept), arrivals at the trace's timestamps x
--trace-time-scale (not Poisson, --rate unused), prompts cut by whole blocks to
--trace-max-input-len and outputs capped to --trace-max-output-len (tandem bench says how many).
Its ideal reuse (share of the replayed prompt tokens in a block whose id an earlier replayed
request had, from the hash ids) is printed as the upper bound of any cache's hit rate.

The oracle: the same trace on a cluster whose one prefill worker has the two prefill workers'
memory and whose one decode worker has the three decode workers' (1 prefill + 1 decode): every
block any worker of the 2+3 cluster could hold is in the one cache that could serve it, so its
hit rate is what a router that knew every cached block, with caches pooled, could reach. Reported:
each policy's hit rate as a share of the oracle's (the issue asks kv_aware >= 0.95), p50/p90
TTFT, goodput (requests meeting --slo-ttft-ms and --slo-tpot-ms, per second) and throughput, all
from one run of this script. --engine sim runs the SIMULATED engine (latency model of
calibrate_sim.py; the placement, caching, index and transfers are real), labelled so.

Writes DIR/placement.json, each run's tandem bench result JSON, and a self-contained HTML report
(--html). Exits 1 when kv_aware's hit rate is under 0.95 of the oracle's on any workload.
"""
import argparse
import html
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402

SIM = ["--engine.kind", "sim", "--sim.step_us", "0", "--sim.prefill_us_per_token", "88.6",
       "--sim.decode_us_per_seq", "1387.6", "--sim.decode_us_per_ctx_token", "0"]


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def make_model(build):
    model = os.path.join(build, "bench-scale-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch",
                        "deepseek_v3", "--preset", "tiny", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-deepseek_v3", "models"), "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
    return model


def counters(cl):
    """(prompt tokens seen by decode workers, cache hits on every worker, both tiers, prompt
    tokens computed on every worker, KV blocks fetched from other workers)."""
    prompt = hits = computed = fetched = 0.0
    for wid in cl.workers:
        if wid.startswith("d"):
            prompt += cl.worker_metric(wid, "tandem_prompt_tokens_total")
        hits += cl.worker_metric(wid, "tandem_prefix_cache_hits_total")
        computed += cl.worker_metric(wid, "tandem_prompt_tokens_computed_total")
        fetched += cl.worker_metric(wid, "tandem_kv_fetch_blocks_total")
    return prompt, hits, computed, fetched


def trace_args(a):
    """tandem bench's flags for the Mooncake trace replay (shared with kvcache.py)."""
    return ["--dataset-name", "mooncake", "--dataset-path", a.trace, "--trace-start",
            str(a.trace_start), "--trace-limit", str(a.trace_limit), "--trace-block-tokens",
            str(a.trace_block_tokens), "--trace-time-scale", str(a.trace_time_scale),
            "--trace-max-input-len", str(a.trace_max_input_len), "--trace-max-output-len",
            str(a.trace_max_output_len)]


def add_trace_flags(ap, limit, scale, max_in, max_out):
    ap.add_argument("--trace", default=os.path.join(HERE, "..", "..", "shared", "traces",
                                                    "mooncake_conversation_trace.jsonl"),
                    help="Mooncake trace (JSON lines) for the mooncake workload")
    ap.add_argument("--trace-start", type=int, default=0)
    ap.add_argument("--trace-limit", type=int, default=limit)
    ap.add_argument("--trace-block-tokens", type=int, default=16)
    ap.add_argument("--trace-time-scale", type=float, default=scale)
    ap.add_argument("--trace-max-input-len", type=int, default=max_in)
    ap.add_argument("--trace-max-output-len", type=int, default=max_out)


TRACE_RE = re.compile(r"mooncake: (\d+) requests \(file lines (\d+)-(\d+)\) over ([\d.]+) s, "
                      r"(\d+) tokens per block; (\d+) prompts cut to (\d+) tokens \((\d+) blocks "
                      r"dropped\), (\d+) outputs capped to (\d+); ideal reuse ([\d.]+) \((\d+) "
                      r"of (\d+)")


def trace_info(stderr):
    """What tandem bench said of the trace it replayed, or None."""
    m = TRACE_RE.search(stderr)
    if not m:
        return None
    g = m.groups()
    return {"requests": int(g[0]), "lines": "%s-%s" % (g[1], g[2]), "span_s": float(g[3]),
            "block_tokens": int(g[4]), "prompts_cut": int(g[5]), "cut_to": int(g[6]),
            "blocks_dropped": int(g[7]), "outputs_capped": int(g[8]), "capped_to": int(g[9]),
            "ideal_reuse": int(g[11]) / int(g[12]) if int(g[12]) else 0.0,
            "reusable_tokens": int(g[11]),
            "prompt_tokens": int(g[12])}


def trace_line(t):
    return ("trace: %d requests (file lines %s) over %.1f s, %d tokens per hash id; %d prompts "
            "cut to %d tokens (%d blocks dropped), %d outputs capped to %d; ideal reuse %.3f "
            "(%d of %d prompt tokens in a block seen before)" %
            (t["requests"], t["lines"], t["span_s"], t["block_tokens"], t["prompts_cut"],
             t["cut_to"], t["blocks_dropped"], t["outputs_capped"], t["capped_to"],
             t["ideal_reuse"], t["reusable_tokens"], t["prompt_tokens"]))


def bench_argv(build, model, cl, workload, a, path, label):
    argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", cl.http,
            "--tokenizer", model, "--model", os.path.basename(model), "--request-rate",
            "inf" if workload == "mooncake" else str(a.rate), "--ignore-eos", "--no-progress", "--seed", "7", "--result-file", path,
            "--metric-percentiles", "50,90,99", "--goodput", "ttft:%g" % a.slo_ttft_ms,
            "tpot:%g" % a.slo_tpot_ms, "--label", label]
    if workload == "mooncake":
        return argv + ["--backend", "openai"] + trace_args(a)
    if workload == "prefix":
        return argv + ["--backend", "openai", "--dataset-name", "prefix",
                       "--num-prompts", str(a.groups * a.per_group), "--prefix-groups",
                       str(a.groups), "--prefix-prompts-per-group", str(a.per_group),
                       "--prefix-system-len", str(a.system_len), "--prefix-question-len",
                       str(a.question_len), "--random-output-len", str(a.output_len)]
    return argv + ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
                   "--dataset-name", "multiturn", "--num-prompts", str(a.sessions * a.turns),
                   "--sessions", str(a.sessions), "--turns", str(a.turns),
                   "--prefix-question-len", str(a.mt_question_len), "--random-output-len",
                   str(a.mt_output_len)]


def one_run(build, model, a, workload, policy, oracle):
    mem = "%dM" % a.memory
    engine = SIM if a.engine == "sim" else []
    worker_args = ["--log.level", "warn"] + engine
    if oracle:
        cl = C.Cluster(build, model, n_prefill=1, n_decode=1, redis=True,
                       router_args=["--placement.policy", policy] + a.router_arg,
                       worker_args=worker_args,
                       prefill_args=["--kv.memory", "%dM" % (2 * a.memory)],
                       decode_args=["--kv.memory", "%dM" % (3 * a.memory)])
    else:
        cl = C.Cluster(build, model, n_prefill=2, n_decode=3, redis=True,
                       router_args=["--placement.policy", policy] + a.router_arg,
                       worker_args=worker_args,
                       prefill_args=["--kv.memory", mem], decode_args=["--kv.memory", mem])
    name = "oracle" if oracle else policy
    try:
        path = os.path.join(a.out, "%s-%s.json" % (workload, name))
        label = "%s %s%s" % (workload, name, " SIMULATED engine" if a.engine == "sim" else "")
        p0, h0, c0, f0 = counters(cl)
        t0 = time.monotonic()
        r = subprocess.run(bench_argv(build, model, cl, workload, a, path, label),
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError("tandem bench failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
        p1, h1, c1, f1 = counters(cl)
        with open(path) as f:
            res = json.load(f)
        placed = {wid: w["assigned"] for wid, w in cl.status().items()}
        cl.stop()
    finally:
        C._kill_all()
    row = {"workload": workload, "policy": name, "prompt_tokens": p1 - p0, "hits": h1 - h0,
           "hit_rate": (h1 - h0) / (p1 - p0) if p1 > p0 else 0.0,
           "computed": c1 - c0, "fetched_blocks": f1 - f0,
           "saved": 1.0 - (c1 - c0) / (p1 - p0) if p1 > p0 else 0.0,
           "p99_ttft_ms": res["p99_ttft_ms"],
           "completed": res["completed"], "failed": res["failed"],
           "p50_ttft_ms": res["median_ttft_ms"], "p90_ttft_ms": res["p90_ttft_ms"],
           "mean_ttft_ms": res["mean_ttft_ms"], "goodput": res["request_goodput"],
           "throughput": res["request_throughput"], "placed": placed,
           "seconds": time.monotonic() - t0, "load_after": loadavg(),
           "trace": trace_info(r.stderr)}
    print("%-9s %-11s hit rate %.3f (%d of %d tokens) saved %.3f (%d blocks fetched) p50 TTFT "
          "%7.1f ms p90 %7.1f ms p99 %7.1f ms goodput %.2f req/s throughput %.2f req/s failed %d "
          "load %s" %
          (workload, name, row["hit_rate"], row["hits"], row["prompt_tokens"], row["saved"],
           row["fetched_blocks"], row["p50_ttft_ms"], row["p90_ttft_ms"], row["p99_ttft_ms"],
           row["goodput"], row["throughput"], row["failed"], row["load_after"]), flush=True)
    return row


def bars(rows, key, unit, width=420):
    """An inline SVG bar chart of rows' `key`."""
    top = max([r[key] for r in rows] + [1e-9])
    h = 22 * len(rows) + 10
    out = ['<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">' % (width + 260, h)]
    for i, r in enumerate(rows):
        w = int(width * r[key] / top)
        y = 5 + 22 * i
        color = "#888" if r["policy"] == "oracle" else ("#2a7" if r["policy"] == "kv_aware"
                                                        else "#57b")
        out.append('<text x="0" y="%d" font-size="12">%s</text>' % (y + 13,
                                                                      html.escape(r["policy"])))
        out.append('<rect x="100" y="%d" width="%d" height="16" fill="%s"/>' % (y, w, color))
        out.append('<text x="%d" y="%d" font-size="12">%.3g %s</text>' %
                   (105 + w, y + 13, r[key], unit))
    out.append("</svg>")
    return "".join(out)


def write_html(path, rows, a, header):
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>tandem placement</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>",
             "<h1>KV-aware placement: 2 prefill + 3 decode workers, Redis index</h1>",
             "<p>%s</p>" % html.escape(header)]
    for wl in sorted({r["workload"] for r in rows}):
        rs = [r for r in rows if r["workload"] == wl]
        orc = [r for r in rs if r["policy"] == "oracle"]
        if rs[0].get("trace"):
            parts.append("<p>%s</p>" % html.escape(trace_line(rs[0]["trace"])))
        parts.append("<h2>%s</h2><table><tr><th>policy</th><th>hit rate</th><th>of oracle</th>"
                     "<th>p50 TTFT ms</th><th>p90 TTFT ms</th><th>goodput req/s</th>"
                     "<th>throughput req/s</th><th>failed</th><th>requests placed per decode "
                     "worker</th></tr>" % html.escape(wl))
        for r in rs:
            share = r["hit_rate"] / orc[0]["hit_rate"] if orc and orc[0]["hit_rate"] else 0
            dec = {k: v for k, v in sorted(r["placed"].items()) if k.startswith("d")}
            parts.append("<tr><td style='text-align:left'>%s</td><td>%.3f</td><td>%.3f</td>"
                         "<td>%.1f</td><td>%.1f</td><td>%.2f</td><td>%.2f</td><td>%d</td>"
                         "<td style='text-align:left'>%s</td></tr>" %
                         (html.escape(r["policy"]), r["hit_rate"], share, r["p50_ttft_ms"],
                          r["p90_ttft_ms"], r["goodput"], r["throughput"], r["failed"],
                          html.escape(json.dumps(dec))))
        parts.append("</table><h3>hit rate</h3>" + bars(rs, "hit_rate", ""))
        parts.append("<h3>p50 TTFT</h3>" + bars(rs, "p50_ttft_ms", "ms"))
        parts.append("<h3>p90 TTFT</h3>" + bars(rs, "p90_ttft_ms", "ms"))
        parts.append("<h3>goodput</h3>" + bars(rs, "goodput", "req/s"))
    parts.append("<p>Written by bench/placement.py; raw rows:</p><pre>%s</pre></body></html>" %
                 html.escape(json.dumps(rows, indent=1)))
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--engine", choices=("cpu", "sim"), default="cpu")
    ap.add_argument("--workloads", default="multiturn,prefix")
    ap.add_argument("--policies", default="kv_aware,p2c,round_robin")
    ap.add_argument("--rate", type=float, default=4)
    ap.add_argument("--memory", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--mt-question-len", type=int, default=64)
    ap.add_argument("--mt-output-len", type=int, default=32)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--slo-ttft-ms", type=float, default=2000)
    ap.add_argument("--slo-tpot-ms", type=float, default=200)
    ap.add_argument("--router-arg", action="append", default=[],
                    help="one more router flag for every cluster (repeat it)")
    add_trace_flags(ap, 600, 0.2, 3072, 32)
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle runs")
    ap.add_argument("--html", default=None)
    ap.add_argument("--out", default="bench-placement-out")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    model = make_model(build)
    header = ("machine: %d cores, load %s at start; engine %s; model mkmodel tiny DeepSeek-V3 "
              "(real tokenizer); %s; rate %g req/s (Poisson; mooncake: the trace's arrivals x "
              "%g); --kv.memory %d MiB per worker" %
              (os.cpu_count(), loadavg(), "SIMULATED (sim)" if a.engine == "sim" else "cpu",
               time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), a.rate, a.trace_time_scale,
               a.memory))
    print("# " + header, flush=True)
    rows = []
    for wl in a.workloads.split(","):
        if not a.no_oracle:
            rows.append(one_run(build, model, a, wl, "kv_aware", oracle=True))
        for pol in a.policies.split(","):
            rows.append(one_run(build, model, a, wl, pol, oracle=False))
    ok = True
    for wl in a.workloads.split(","):
        orcs = [r for r in rows if r["workload"] == wl and r["policy"] == "oracle"]
        if not orcs:
            continue
        orc = orcs[0]
        if orc.get("trace"):
            print("## %-9s %s" % (wl, trace_line(orc["trace"])))
            print("## %-9s oracle hit rate %.3f = %.3f of the trace's ideal reuse %.3f" %
                  (wl, orc["hit_rate"], orc["hit_rate"] / orc["trace"]["ideal_reuse"]
                   if orc["trace"]["ideal_reuse"] else 0.0, orc["trace"]["ideal_reuse"]))
        for r in rows:
            if r["workload"] != wl or r["policy"] == "oracle":
                continue
            share = r["hit_rate"] / orc["hit_rate"] if orc["hit_rate"] else 0.0
            ideal = (" (%.3f of the ideal %.3f)" % (r["hit_rate"] / r["trace"]["ideal_reuse"],
                                                     r["trace"]["ideal_reuse"])
                     if r.get("trace") and r["trace"]["ideal_reuse"] else "")
            print("## %-9s %-11s hit rate %.3f = %.3f of the oracle's %.3f%s; p50/p90 TTFT "
                  "%.1f/%.1f ms; goodput %.2f req/s" %
                  (wl, r["policy"], r["hit_rate"], share, orc["hit_rate"], ideal,
                   r["p50_ttft_ms"], r["p90_ttft_ms"], r["goodput"]))
            if r["policy"] == "kv_aware" and share < 0.95:
                ok = False
    print("# load at the end %s" % loadavg())
    with open(os.path.join(a.out, "placement.json"), "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    if a.html:
        write_html(a.html, rows, a, header)
        print("# HTML report: %s" % a.html)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

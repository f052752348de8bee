#!/usr/bin/python3
"""kvcache.py: what the workers' KV cache saves (prefix cache in the pool, disk tier).

Usage: bench/kvcache.py BUILD_DIR [--threads 2] [--groups 4 --per-group 4 --system-len 512
                        --question-len 32 --output-len 8] [--sessions 4 --turns 3
                        --mt-question-len 32 --mt-output-len 8] [--concurrency 1]
                        [--rounds 2] [--disk-prompt 2048] [--disk-reps 15]
                        [--recompute-reps 3] [--workloads prefix,multiturn,mooncake]
                        [--trace FILE --trace-start 0 --trace-limit 40 --trace-block-tokens 16
                         --trace-time-scale 1 --trace-max-input-len 1024
                         --trace-max-output-len 8]
                        [--disk-parent DIR] [--keep-results DIR]

One run, on one machine and model (mkmodel's llama preset `bench` with the Llama 3 tokenizer and a
4096-token context), every figure a ratio against a peer measured in the same run:

1. Cache on versus off. Two clusters, router + 1 prefill + 1 decode on loopback (UCX_TLS=tcp),
   started one after the other with identical settings except `--kv.prefix_cache true|false`.
   Every prompt is prefilled on the prefill worker (`--placement.local_prefill_tokens 0`, as
   handoff.py does). On each, `tandem bench` runs the shared-prefix workload (groups of prompts
   sharing a system prompt) and the multi-turn one (sessions whose turns extend the
   conversation), --concurrency requests in flight (default 1: TTFT is then the service time,
   not queueing). mooncake (with --workloads): the real Mooncake conversation trace replayed by
   `tandem bench --dataset-name mooncake` (--trace-limit requests, --trace-block-tokens tokens per
   512-token hash id, prompts cut by whole blocks to --trace-max-input-len, outputs capped to
   --trace-max-output-len, arrivals at the trace's timestamps x --trace-time-scale within
   --concurrency), once per cluster (a second round of the same requests would hit the first
   one's blocks), with the trace's own ideal reuse (the share of its prompt tokens in a block an
   earlier request had) as the bound on the tokens saved. Both clusters stay up and each
   workload runs --rounds times on each, the
   rounds alternating which cluster goes first (on/off, off/on), round r with the same prompts
   on both and new prompts in every round, so that drift in the machine's load hits both
   alike. Per workload: mean and p50 TTFT on/off (pooled over the rounds) and their ratio, and
   the prefill tokens computed = prompt tokens received by the decode worker (each request once) minus the cached
   hits on every worker (tandem_prefix_cache_hits_total, both tiers), from /metrics deltas.
2. Disk tier. A decode worker alone (router + 1 decode, local prefill) with --kv.disk_dir on a
   fresh directory under --disk-parent and --kv.disk_load always. A --disk-prompt-token prompt
   is sent once (computed, and its blocks written to disk), then per repetition: the worker is
   stopped (SIGTERM), the disk's sequential read is measured on a file of the same total size
   as the blocks to load (written, fsync, POSIX_FADV_DONTNEED, read in 1 MiB preads), the worker
   restarted on the same directory, a short unrelated prompt sent (the new process faults its
   weights in), the block files fsync'd and dropped from the page cache with the same
   POSIX_FADV_DONTNEED (before the restart and again after it, because the worker's scan at open reads every file's
   header and readahead brings part of each file back), their residency checked with fincore,
   then the prompt sent again (TTFT from disk: its blocks read from disk, the last block
   computed) and once more (TTFT from the pool: every block but the last already in the pool).
   Load time = TTFT from disk - TTFT from the pool of the same repetition (both compute the same
   last block; nothing is added to the C code); disk load GB/s = block files' bytes x blocks
   loaded / median load time, against the median sequential read. Then a worker with the
   cache off recomputes the same prompt (TTFT recomputed). Medians over the repetitions; the
   disk load GB/s is printed only when the lower quartile of the load times is above 0.
The machine's load average is printed at the start and the end.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import cluster as C  # noqa: E402
from handoff import ttft  # noqa: E402
from placement import add_trace_flags, trace_args, trace_info, trace_line  # noqa: E402

BLOCK = 16  # kv.block_size's default, which both clusters use


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return "%d cores, %s, %.0f GiB" % (os.cpu_count(), cpu, mem)


def make_model(build):
    model = os.path.join(build, "bench-kvcache-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch", "llama",
                        "--preset", "bench", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-llama3", "models"), "--out", model], check=True,
                       stdout=subprocess.DEVNULL)
    return model


def counters(cl):
    """{worker: (prompt tokens, pool hits, disk hits)} from every worker's /metrics."""
    out = {}
    for wid in cl.workers:
        out[wid] = (cl.worker_metric(wid, "tandem_prompt_tokens_total"),
                    cl.worker_metric(wid, "tandem_prefix_cache_hits_total", 'tier="pool"'),
                    cl.worker_metric(wid, "tandem_prefix_cache_hits_total", 'tier="disk"'))
    return out


def run_bench(build, model, cl, workload, a, out_dir, rnd):
    """One `tandem bench` run; returns (result JSON, prompt tokens, tokens computed)."""
    path = os.path.join(out_dir, "%s-%s-%d.json" % (workload, cl.label, rnd))
    argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", cl.http,
            "--tokenizer", model, "--model", os.path.basename(model), "--request-rate", "inf",
            "--max-concurrency", str(a.concurrency), "--ignore-eos", "--no-progress",
            "--save-detailed", "--result-file", path,
            "--label", "%s cache %s round %d" % (workload, cl.label, rnd)]
    # round r of either cluster gets the same prompts; each round's prompts are new to both
    if workload == "mooncake":
        argv += ["--backend", "openai"] + trace_args(a)  # arrivals: the trace's (rate inf)
    elif workload == "prefix":
        argv += ["--backend", "openai", "--dataset-name", "prefix", "--seed", str(100 + rnd),
                 "--num-prompts", str(a.groups * a.per_group), "--prefix-groups", str(a.groups),
                 "--prefix-prompts-per-group", str(a.per_group), "--prefix-system-len",
                 str(a.system_len), "--prefix-question-len", str(a.question_len),
                 "--random-output-len", str(a.output_len)]
    else:
        argv += ["--backend", "openai-chat", "--dataset-name", "multiturn", "--seed",
                 str(200 + rnd), "--num-prompts", str(a.sessions * a.turns), "--sessions",
                 str(a.sessions), "--turns", str(a.turns), "--prefix-question-len",
                 str(a.mt_question_len), "--random-output-len", str(a.mt_output_len)]
    before = counters(cl)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError("tandem bench %s failed (%d): %s" % (workload, r.returncode,
                                                                r.stderr[-2000:]))
    after = counters(cl)
    with open(path) as f:
        res = json.load(f)
    if res.get("completed", 0) == 0:
        raise RuntimeError("tandem bench %s: no request completed: %s" %
                           (workload, r.stdout[-2000:]))
    d = {w: [x - y for x, y in zip(after[w], before[w])] for w in after}
    prompt = d["d0"][0]  # every request passes through the decode worker once
    hits = sum(v[1] + v[2] for v in d.values())
    res["_prefill_prompt"] = d["p0"][0]
    res["_trace"] = trace_info(r.stderr)
    return res, prompt, prompt - hits


def cache_on_off(build, model, a, out_dir):
    """{(workload, on|off): [run_bench result per round]}. Both clusters stay up (an idle worker
    costs no CPU); rounds alternate which goes first (on/off, off/on, ...) so that a drift in
    the machine's load hits both alike."""
    results = {}
    clusters = {}
    try:
        for label in ("on", "off"):
            cl = C.Cluster(build, model, n_prefill=1, n_decode=1, ucx_tls="tcp",
                           engine_threads=a.threads,
                           router_args=["--placement.local_prefill_tokens", "0"],
                           worker_args=["--kv.memory", a.kv_memory, "--kv.prefix_cache",
                                        "true" if label == "on" else "false"])
            cl.label = label
            clusters[label] = cl
            ttft(cl, [3000 + i for i in range(64)])  # warm-up: both workers page in the weights
        for wl in a.workloads.split(","):
            for rnd in range(1 if wl == "mooncake" else a.rounds):
                for label in (("on", "off") if rnd % 2 == 0 else ("off", "on")):
                    res = run_bench(build, model, clusters[label], wl, a, out_dir, rnd)
                    results.setdefault((wl, label), []).append(res)
                    print("# %-9s round %d cache %-3s: %d completed, %d failed, mean ttft %.1f "
                          "ms, load %s" % (wl, rnd, label, res[0]["completed"],
                                           res[0].get("failed", 0), res[0]["mean_ttft_ms"],
                                           loadavg()), flush=True)
        for cl in clusters.values():
            cl.stop()
    finally:
        C._kill_all()
    return results


def block_files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.join(dirpath, n) for n in names
                if len(n) == 32 and not n.endswith(".tmp")]
    return out


def drop_cache(paths):
    """fsync and POSIX_FADV_DONTNEED every file; returns False where the call is missing."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def resident(paths):
    """(bytes resident in the page cache, bytes in all) per fincore, or None without it."""
    exe = shutil.which("fincore")
    if not exe or not paths:
        return None
    res = size = 0
    for i in range(0, len(paths), 200):
        r = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE"] +
                           paths[i:i + 200], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        for line in r.stdout.split("\n"):
            f = line.split()
            if len(f) == 2:
                res += int(f[0])
                size += int(f[1])
    return res, size


def seq_read(parent, nbytes):
    """(GB/s of one cold-ish sequential read of an nbytes file, share resident before it)."""
    fd, path = tempfile.mkstemp(prefix="seqread-", dir=parent)
    try:
        chunk = os.urandom(1 << 20)
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[:min(left, len(chunk))])
        os.fsync(fd)
        if not hasattr(os, "posix_fadvise"):
            return None, None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        rs = resident([path])
        os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        t0 = time.perf_counter()
        off = 0
        while True:
            b = os.pread(fd, 1 << 20, off)
            if not b:
                break
            off += len(b)
        dt = time.perf_counter() - t0
        return off / dt / 1e9, (rs[0] / rs[1] if rs else None)
    finally:
        os.close(fd)
        os.unlink(path)


def disk_tier(build, model, a):
    parent = a.disk_parent or build
    disk = tempfile.mkdtemp(prefix="kvcache-disk-", dir=parent)
    args = ["--kv.disk_dir", disk, "--kv.disk_load", "always"]
    common = dict(n_prefill=0, n_decode=1, ucx_tls="tcp", engine_threads=a.threads,
                  worker_args=["--kv.memory", a.kv_memory])
    prompt = [1000 + (i * 7919) % 20000 for i in range(a.disk_prompt)]
    n_blocks = a.disk_prompt // BLOCK  # the prompt's blocks, the unit of the per-block figures
    want = (a.disk_prompt - 1) // BLOCK  # loaded: all but the last token's block is cached
    out = {"cold": [], "disk": [], "pool": [], "load": [], "seq": [], "gbps": [], "res_scan": [],
           "res_load": [], "res_seq": [], "loaded": []}
    cl = C.Cluster(build, model, decode_args=args, **common)
    try:
        ttft(cl, [3000 + i for i in range(64)])
        out["cold"].append(ttft(cl, prompt))  # computed, cache on and empty; written to disk
        end = time.monotonic() + 60
        while (cl.worker_metric("d0", "tandem_kv_cached_blocks", 'tier="disk"') < n_blocks + 4 and
               time.monotonic() < end):
            time.sleep(0.05)
        out["file_bytes"] = int(cl.worker_metric("d0", "tandem_kv_disk_bytes") /
                                max(1, cl.worker_metric("d0", "tandem_kv_cached_blocks",
                                                        'tier="disk"')))
        out["block_bytes"] = int(cl.workers["d0"].fields["block_bytes"])
        for rep in range(a.disk_reps):
            cl.workers["d0"].stop()
            gbps, res = seq_read(parent, want * out["file_bytes"])
            out["seq"].append(gbps)
            out["res_seq"].append(res)
            files = block_files(disk)
            drop_cache(files)
            cl.add_worker("decode", "d0", args)
            cl.wait_workers(1)
            ttft(cl, [4000 + 97 * rep + i for i in range(64)])  # unrelated: not on disk
            files = block_files(disk)
            out["res_scan"].append(resident(files))
            drop_cache(files)
            out["res_load"].append(resident(files))
            h0 = cl.worker_metric("d0", "tandem_prefix_cache_hits_total", 'tier="disk"')
            out["disk"].append(ttft(cl, prompt))
            out["loaded"].append((cl.worker_metric("d0", "tandem_prefix_cache_hits_total",
                                                   'tier="disk"') - h0) / BLOCK)
            out["pool"].append(ttft(cl, prompt))
            load = out["disk"][-1] - out["pool"][-1]
            out["load"].append(load)
            out["gbps"].append(out["loaded"][-1] * out["file_bytes"] / load / 1e9
                               if load > 0 else None)
            print("# disk rep %d: ttft disk %.3f s, pool %.3f s, %d blocks loaded, seq read "
                  "%s GB/s, load %s" % (rep, out["disk"][-1], out["pool"][-1],
                                        out["loaded"][-1],
                                        "%.2f" % gbps if gbps else "n/a", loadavg()), flush=True)
        cl.stop()
    finally:
        C._kill_all()
        shutil.rmtree(disk, ignore_errors=True)
    cl = C.Cluster(build, model, decode_args=["--kv.prefix_cache", "false"], **common)
    try:
        ttft(cl, [3000 + i for i in range(64)])
        out["recompute"] = [ttft(cl, prompt) for _ in range(a.recompute_reps)]
        cl.stop()
    finally:
        C._kill_all()
    out["n_blocks"], out["want"] = n_blocks, want
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pooled(runs):
    """(mean ms, p50 ms, completed, failed, prompt tokens, computed) over a cluster's rounds."""
    t = [x for res, _, _ in runs
         for x, e in zip(res["ttfts"], res.get("errors", [""] * len(res["ttfts"]))) if not e]
    return (1e3 * statistics.mean(t), 1e3 * statistics.median(t),
            sum(r[0]["completed"] for r in runs), sum(r[0].get("failed", 0) for r in runs),
            sum(r[1] for r in runs), sum(r[2] for r in runs))


def report_cache(results, a):
    print()
    print("## cache on versus off: router + 1 prefill + 1 decode, UCX_TLS=tcp, %d engine "
          "thread(s) per worker, %d request(s) in flight, %d round(s) alternating which "
          "cluster goes first, TTFT pooled over the rounds" % (a.threads, a.concurrency,
                                                              a.rounds))
    wls = a.workloads.split(",")
    if "prefix" in wls:
        print("prefix:    %d groups x %d prompts, %d-token system prompt + %d-token question, "
              "%d output tokens" % (a.groups, a.per_group, a.system_len, a.question_len,
                                    a.output_len))
    if "multiturn" in wls:
        print("multiturn: %d sessions x %d turns, %d-token questions, %d output tokens "
              "(chat endpoint)" % (a.sessions, a.turns, a.mt_question_len, a.mt_output_len))
    if "mooncake" in wls:
        t = results[("mooncake", "on")][0][0].get("_trace")
        print("mooncake:  one round; %s" % (trace_line(t) if t else "(tandem bench did not "
                                              "describe the trace)"))
    print("%-9s %5s %12s %12s %6s %6s %14s %14s" % (
        "workload", "cache", "mean_ttft_ms", "p50_ttft_ms", "reqs", "failed", "prompt_tokens",
        "computed_toks"))
    agg = {}
    for wl in wls:
        for label in ("on", "off"):
            agg[(wl, label)] = p = pooled(results[(wl, label)])
            print("%-9s %5s %12.1f %12.1f %6d %6d %14d %14d" % ((wl, label) + p))
    print("%-9s %16s %16s %22s   %s" % ("workload", "mean ttft on/off", "p50 ttft on/off",
                                        "prefill tokens saved", "mean on/off per round"))
    for wl in wls:
        on, off = agg[(wl, "on")], agg[(wl, "off")]
        saved = 1 - on[5] / off[5] if off[5] else None
        per = ["%.3f" % (x[0]["mean_ttft_ms"] / y[0]["mean_ttft_ms"])
               for x, y in zip(results[(wl, "on")], results[(wl, "off")])]
        print("%-9s %16.3f %16.3f %21s   %s" % (
            wl, on[0] / off[0], on[1] / off[1],
            "%.1f%%" % (100 * saved) if saved is not None else "n/a", " ".join(per)))
        t = results[(wl, "on")][0][0].get("_trace")
        if t:
            print("  %s: the trace's ideal reuse is %.1f%% of its prompt tokens (the bound on "
                  "the tokens saved); saved / ideal = %.3f" %
                  (wl, 100 * t["ideal_reuse"],
                   saved / t["ideal_reuse"] if saved is not None and t["ideal_reuse"] else 0))
        if on[4] != off[4]:
            print("  note: %s prompt tokens differ on/off (%d vs %d): the multi-turn history "
                  "holds the generated answers" % (wl, on[4], off[4]))
        for label in ("on", "off"):
            for r in results[(wl, label)]:
                if r[0]["_prefill_prompt"] != r[1]:
                    print("  note: %s cache %s: the prefill worker received %d prompt tokens, "
                          "the decode worker %d" % (wl, label, r[0]["_prefill_prompt"], r[1]))


def fmt_res(r):
    return "not measured (no fincore)" if r is None else "%.1f%%" % (100 * r[0] / r[1])


def report_disk(d, a):
    print()
    nb = d["n_blocks"]
    print("## disk tier: router + 1 decode (local prefill), %d engine thread(s), %d-token "
          "prompt = %d blocks of %d tokens, %d loaded from disk (want %d), block %d bytes, "
          "file %d bytes" % (a.threads, a.disk_prompt, nb, BLOCK, med(d["loaded"]), d["want"],
                             d["block_bytes"], d["file_bytes"]))
    print("medians of %d restart(s) (disk, pool) and %d recompute(s) on a cache-off worker" %
          (a.disk_reps, a.recompute_reps))
    disk, pool, rec = med(d["disk"]), med(d["pool"]), med(d["recompute"])
    print("%-44s %10s %14s" % ("", "ttft_s", "per_block_ms"))
    for name, v in (("recomputed (cache off)", rec),
                    ("computed, cache on and empty (first send)", med(d["cold"])),
                    ("from disk after restart (last block computed)", disk),
                    ("from the pool (last block computed)", pool)):
        print("%-44s %10.3f %14.2f" % (name, v, 1e3 * v / nb))
    print("from disk / recomputed: %.3f" % (disk / rec))
    loads = sorted(d["load"])
    load = med(loads)
    q1, _, q3 = statistics.quantiles(loads, n=4) if len(loads) >= 2 else (load, load, load)
    print("load time = ttft disk - ttft pool of the same restart: median %.1f ms, quartiles "
          "%.1f-%.1f ms; each: %s ms" % (1e3 * load, 1e3 * q1, 1e3 * q3,
                                         " ".join("%.0f" % (1e3 * x) for x in d["load"])))
    print("page cache of the block files: %s resident after the restart's scan, %s after "
          "DONTNEED, right before the load; seq-read file: %s resident before its read" % (
              fmt_res(d["res_scan"][-1]), fmt_res(d["res_load"][-1]),
              "n/a" if d["res_seq"][-1] is None else "%.1f%%" % (100 * d["res_seq"][-1])))
    seq = med(d["seq"])
    nbytes = med(d["loaded"]) * d["file_bytes"]
    print("disk sequential read (%.1f MiB file, 1 MiB preads, one thread): median %s GB/s "
          "over the restarts" % (nbytes / 2**20, "%.2f" % seq if seq else "not measured"))
    if load is None or q1 <= 0:
        print("disk load GB/s: not measurable in this run: the lower quartile of the load time "
              "(%.1f ms) is not above 0, so the load is within the noise of the two TTFTs" %
              (1e3 * q1))
    else:
        gb = nbytes / load / 1e9
        print("disk load: %.2f GB/s (%.2f-%.2f over the quartiles; %d blocks x %d bytes / load "
              "time); / sequential read: %s" % (gb, nbytes / q3 / 1e9, nbytes / q1 / 1e9,
                                                med(d["loaded"]), d["file_bytes"],
                                                "%.3f" % (gb / seq) if seq else "n/a"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-memory", default="256M")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--mt-question-len", type=int, default=32)
    ap.add_argument("--mt-output-len", type=int, default=8)
    ap.add_argument("--disk-prompt", type=int, default=2048)
    ap.add_argument("--disk-reps", type=int, default=15)
    ap.add_argument("--recompute-reps", type=int, default=3)
    ap.add_argument("--disk-parent", help="where the disk tier's directory is made (default: "
                    "BUILD_DIR; not a tmpfs, whose pages cannot be dropped)")
    ap.add_argument("--keep-results", help="keep tandem bench's result JSON here")
    ap.add_argument("--rounds", type=int, default=2,
                    help="workload runs per cluster, alternating which cluster goes first")
    ap.add_argument("--skip", default="", help="comma-separated: cache, disk")
    ap.add_argument("--workloads", default="prefix,multiturn",
                    help="cache on/off workloads: prefix, multiturn, mooncake (the trace)")
    add_trace_flags(ap, 40, 1.0, 1024, 8)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    t0 = time.monotonic()
    print("# machine: %s, load %s, %s" % (machine(), loadavg(),
                                           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
          flush=True)
    print("# command: bench/kvcache.py %s" % " ".join(sys.argv[1:]), flush=True)
    model = make_model(build)
    out_dir = a.keep_results or tempfile.mkdtemp(prefix="kvcache-results-")
    os.makedirs(out_dir, exist_ok=True)
    skip = a.skip.split(",")
    results = cache_on_off(build, model, a, out_dir) if "cache" not in skip else None
    d = disk_tier(build, model, a) if "disk" not in skip else None
    if results:
        report_cache(results, a)
    if d:
        report_disk(d, a)
    if not a.keep_results:
        shutil.rmtree(out_dir, ignore_errors=True)
    print()
    print("# load at the end %s, %.0f s in all" % (loadavg(), time.monotonic() - t0))


if __name__ == "__main__":
    main()

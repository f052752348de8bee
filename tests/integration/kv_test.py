#!/usr/bin/python3
"""kv_test.py: the KV cache in a real tandem cluster on loopback: preemption, the
workers' prefix cache, the disk tier, the cluster index in Redis with kv_aware placement, the
hot-prefix guard and cross-worker fetch.

Usage: kv_test.py BUILD_DIR SCENARIO ARCH [MODEL_DIR]

  preempt           a decode worker short of KV blocks preempts and recomputes; tokens unchanged
  cache             the prefix cache: a repeated prompt and a conversation's next turn hit the
                    cached blocks (usage says so), tokens unchanged; tenants never share blocks
  disk              the disk tier across SIGKILL and restart, corrupted and truncated files, a
                    tiny cap and a failing disk
  index             the cluster KV index in Redis and kv_aware placement: a repeated prompt goes
                    to its holder; Redis killed and restarted; a dead worker's lease; a restarted
                    router
  hotprefix         many requests sharing one hot prefix: no worker gets more than 1.5x the
                    mean of the requests placed (kv_aware's imbalance guard); without the guard
                    the holder does
  fetch             cross-worker fetch of cached KV blocks between prefill workers: tokens
                    unchanged, fetched blocks counted; a holder stopped then killed mid-fetch

ARCH is deepseek_v3 or llama: MODEL_DIR (written by make_model.py), else mkmodel's tiny preset
with the real tokenizer of that family written under BUILD_DIR (harness.py).
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402
import promcheck  # noqa: E402
from harness import (check, ctl_json, kv_files, make_model, run, wait_for)  # noqa: E402


def scenario_preempt(build):
    """A decode worker whose KV pool cannot hold every running sequence preempts (drops a
    sequence's blocks, recomputes them later) instead of failing requests; the tokens are still
    exactly tandem generate's."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(21)
    ctx = cfg["max_position_embeddings"]
    reqs = []
    for i in range(8):
        r = {"prompt_ids": [rng.randrange(cfg["vocab_size"]) for _ in range(20)],
             "max_tokens": min(200, ctx - 21), "ignore_eos": True}
        if i % 2:
            r.update(temperature=0.9, seed=rng.randrange(1 << 30))
        else:
            r["temperature"] = 0
        reqs.append(r)
    want = [C.offline_generate(build, model, r) for r in reqs]
    cl = C.Cluster(build, model, n_prefill=0, n_decode=1,
                   decode_args=["--kv.blocks", "48"])  # 768 tokens for 8 x 220
    try:
        got = cl.batch(reqs)
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g["error"] or g["ids"] != w]
        check(not bad, "requests %s differ or failed: %s" % (bad, [got[i]["error"] for i in bad]))
        n = cl.worker_metric("d0", "tandem_num_preemptions_total")
        print("8 requests of 220 tokens in a 768-token KV pool: %d preemptions, every token "
              "equal to tandem generate" % n)
        check(n > 0, "no preemption happened: the test did not exercise it")
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: preemption by recompute")


def check_ctl_cache(cl):
    """`tandem ctl workers` and `tandem ctl cache` (text and --json) report each worker's cached
    blocks, queried and hit tokens per tier as its own /metrics does (the heartbeat may lag the
    metrics by one period, so wait for them to agree), with hits > 0 somewhere."""
    def metric_tiers(wid):
        return {t: {"cached_blocks": cl.worker_metric(wid, "tandem_kv_cached_blocks",
                                                      'tier="%s"' % t),
                    "queries": cl.worker_metric(wid, "tandem_prefix_cache_queries_total",
                                                'tier="%s"' % t),
                    "hits": cl.worker_metric(wid, "tandem_prefix_cache_hits_total",
                                             'tier="%s"' % t)} for t in ("pool",)}

    def agree():
        cache = ctl_json(cl, "cache")
        for w in cache["workers"]:
            want = metric_tiers(w["id"])
            got = {t: {k: w["tiers"][t][k] for k in ("cached_blocks", "queries", "hits")}
                   for t in want if t in w["tiers"]}
            if got != want:
                print("ctl cache %s: %s, /metrics %s" % (w["id"], got, want))
                return None
        return cache
    cache = wait_for(agree, 5, "tandem ctl cache to agree with the workers' /metrics")
    tot = cache["total"]["pool"]
    check(tot["cached_blocks"] > 0 and tot["hits"] > 0 and 0 < tot["hit_rate"] <= 1,
          "cluster cache totals: %s" % tot)
    check(tot["hits"] == sum(w["tiers"]["pool"]["hits"] for w in cache["workers"]),
          "cluster hits are the sum of the workers'")
    # the text forms carry the same figures
    rows = {}
    for line in cl.ctl("cache").stdout.splitlines()[1:]:
        f = line.split()
        rows[(f[0], f[2])] = [int(x) for x in f[3:6]]
    for w in cache["workers"]:
        p = w["tiers"]["pool"]
        check(rows.get((w["id"], "pool")) == [p["cached_blocks"], p["queries"], p["hits"]],
              "ctl cache text for %s: %s vs %s" % (w["id"], rows.get((w["id"], "pool")), p))
    check(rows[("(cluster)", "pool")][2] == tot["hits"], "ctl cache text: cluster row")
    def workers_agree():  # the heartbeat behind `ctl workers` may lag /metrics by one period
        ws = ctl_json(cl, "workers")["workers"]
        for w in ws:
            pool = cl.worker_metric(w["id"], "tandem_kv_cached_blocks", 'tier="pool"')
            usage = cl.worker_metric(w["id"], "tandem_kv_cache_usage_perc")
            if w["cache"]["pool"]["cached_blocks"] != pool or abs(w["kv_usage"] - usage) > 1e-6:
                print("ctl workers %s: %s, /metrics cached %s usage %s" % (w["id"], w, pool, usage))
                return None
        return ws
    workers = wait_for(workers_agree, 5, "tandem ctl workers to agree with the workers' /metrics")
    text = cl.ctl("workers").stdout.splitlines()
    for w in workers:
        pool = w["cache"]["pool"]["cached_blocks"]
        check(w["alive"] and not w["draining"], "ctl workers %s: %s" % (w["id"], w))
        line = [l for l in text if l.split()[0] == w["id"]]
        check(line and ("pool=%d" % pool) in line[0] and w["role"] in line[0],
              "ctl workers text for %s: %s" % (w["id"], line))
    print("tandem ctl cache: %d cached blocks, %d of %d queried tokens hit (%.0f%%)" %
          (tot["cached_blocks"], tot["hits"], tot["queries"], 100 * tot["hit_rate"]))


def scenario_cache(build):
    """The prefix cache in the workers' pools: the same long prompt twice (through a prefill
    worker) reports every full block but the last as cached, with tokens equal to the first run's
    and to tandem generate's; a multi-turn conversation on one decode worker (local prefill) hits
    the blocks of the previous turn, prompt and answer; two tenants never share blocks."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(5)
    V, B = cfg["vocab_size"], 16
    long_prompt = [rng.randrange(V) for _ in range(150)]
    reqs = [{"prompt_ids": long_prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True},
            {"prompt_ids": long_prompt, "max_tokens": 16, "temperature": 0.8, "seed": 11,
             "ignore_eos": True}]
    want = [C.offline_generate(build, model, r) for r in reqs]
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1)
    try:
        for r, w in zip(reqs, want):
            first, second = cl.batch([r])[0], cl.batch([r])[0]
            check(not first["error"] and not second["error"], "errors: %s" % [first, second])
            check(first["ids"] == w and second["ids"] == w,
                  "tokens differ from tandem generate: %s %s %s" % (first["ids"], second["ids"], w))
            full = (len(long_prompt) - 1) // B * B
            check(second["cached_tokens"] == full,
                  "second run: %d cached tokens, want %d" % (second["cached_tokens"], full))
        check(cl.worker_metric("p0", "tandem_prefix_cache_hits_total") >= 2 * full - 1,
              "prefill worker's hit counter")
        check_ctl_cache(cl)
        # a tenant never sees another tenant's blocks, even for the same prompt
        a = cl.batch([dict(reqs[0], tenant="alpha")])[0]
        b = cl.batch([dict(reqs[0], tenant="beta")])[0]
        a2 = cl.batch([dict(reqs[0], tenant="alpha")])[0]
        check(a["cached_tokens"] == 0 and b["cached_tokens"] == 0,
              "a new tenant hit another tenant's blocks: %s %s" % (a, b))
        check(a2["cached_tokens"] == full and a2["ids"] == want[0], "tenant alpha's own hit")
        # the OpenAI usage field
        st, js, _ = cl.http_json("/v1/completions", {"model": os.path.basename(model),
                                                    "prompt": long_prompt, "max_tokens": 4,
                                                    "temperature": 0})
        check(st == 200, "completion: %s" % (js,))
        check(js["usage"]["prompt_tokens_details"]["cached_tokens"] == full,
              "usage.prompt_tokens_details: %s" % js["usage"])
        # every daemon's /metrics is valid exposition format, without an instance label, and
        # every series the Grafana dashboard queries is there
        texts = ""
        for who in (None, "p0", "d0"):
            text = cl.metrics_text(who)
            texts += text
            check(promcheck.problems(text) == [], "%s /metrics: %s" %
                  (who or "router", promcheck.problems(text)))
            check("instance=" not in text and "vllm:" not in text, "%s: labels" % who)
        dash = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                 "deploy", "grafana-tandem.json")).read()
        names = set(re.findall(r"tandem_[a-z_]+", dash))
        check(len(names) >= 9, "dashboard metric names: %s" % names)
        for name in names:
            check(re.search("^" + name + "[{ ]", texts, re.M), "dashboard's %s is exported" % name)
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    # multi-turn on one decode worker: turn 2's prompt is turn 1's prompt, its answer and more;
    # its worker exports vLLM's names (metrics.vllm_names)
    cl = C.Cluster(build, model, n_prefill=0, n_decode=1,
                   decode_args=["--metrics.vllm_names=true", "--metrics.model_name", "m1"])
    try:
        turn1 = {"prompt_ids": [rng.randrange(V) for _ in range(40)], "max_tokens": 24,
                 "temperature": 0, "ignore_eos": True}
        g1 = cl.batch([turn1])[0]
        check(not g1["error"] and g1["cached_tokens"] == 0, "turn 1: %s" % g1)
        turn2 = dict(turn1, prompt_ids=turn1["prompt_ids"] + g1["ids"] +
                     [rng.randrange(V) for _ in range(10)])
        g2 = cl.batch([turn2])[0]
        # turn 1 stored the KV of prompt + answer but its last token: 63 tokens, 3 full blocks
        stored = 40 + 24 - 1
        check(g2["cached_tokens"] == stored // B * B,
              "turn 2: %d cached tokens, want %d" % (g2["cached_tokens"], stored // B * B))
        check(g2["ids"] == C.offline_generate(build, model, turn2), "turn 2 tokens differ")
        text = cl.metrics_text("d0")
        check(promcheck.problems(text) == [], "vLLM names: %s" % promcheck.problems(text))
        lab = '{role="decode",model_name="m1"} '
        check(cl.worker_metric("d0", "vllm:prefix_cache_hits_total") == g2["cached_tokens"] and
              lab in text, "vllm:prefix_cache_hits_total: %s" % text)
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                     "vllm:prefix_cache_queries_total", 'tandem_prefix_cache_hits_total{'
                     'role="decode",tier="disk"}', "tandem_num_requests_running{"):
            check(name in text, "%s in the vLLM-named /metrics" % name)
        for name in ("tandem_kv_cache_usage_perc", 'tandem_prefix_cache_hits_total{role="decode",'
                     'tier="pool"}', "vllm:num_requests_running"):
            check(name not in text, "%s not in the vLLM-named /metrics" % name)
        print("prefix cache: %d of %d prompt tokens cached on the second run; turn 2 of a "
              "conversation hit %d tokens of turn 1; tenants kept apart" %
              (full, len(long_prompt), g2["cached_tokens"]))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: prefix cache")


def scenario_disk(build):
    """The disk tier: a worker killed with SIGKILL and restarted on the same directory serves the
    prompt's blocks from disk at once, tokens equal to a cold run's; a flipped byte and a truncated
    block file are detected, dropped and recomputed, tokens still equal; a tiny kv.disk_max evicts
    and keeps serving; a disk that fails turns the tier off and serving goes on."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(9)
    V, B = cfg["vocab_size"], 16
    prompt = [rng.randrange(V) for _ in range(150)]
    req = {"prompt_ids": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    want = C.offline_generate(build, model, req)
    disk = tempfile.mkdtemp(prefix="tandem-kvdisk-")
    args = ["--kv.disk_dir", disk, "--kv.disk_load", "always"]
    full = (len(prompt) - 1) // B * B
    cl = C.Cluster(build, model, n_prefill=0, n_decode=1, decode_args=args)
    try:
        g = cl.batch([req])[0]
        check(not g["error"] and g["ids"] == want and g["cached_tokens"] == 0, "cold: %s" % g)
        # prompt and answer (less the last token) were written: 165 tokens, 10 blocks
        wait_for(lambda: cl.worker_metric("d0", "tandem_kv_cached_blocks", 'tier="disk"') >= 10,
                 30, "10 blocks on disk")
        files = kv_files(build, model, disk, prompt)
        check(all(os.path.exists(f) for f in files), "block files missing: %s" % files)
        cl.workers["d0"].kill()
        cl.add_worker("decode", "d0", args)
        cl.wait_workers(1)
        g = cl.batch([req])[0]
        check(not g["error"] and g["ids"] == want, "after restart: %s" % g)
        check(g["cached_tokens"] == full, "after restart: %d cached tokens, want %d from disk" %
              (g["cached_tokens"], full))
        check(cl.worker_metric("d0", "tandem_prefix_cache_hits_total", 'tier="disk"') == full,
              "disk hits")
        # corrupt block 5 (a flipped payload byte) and truncate block 7, then restart again
        cl.workers["d0"].kill()
        with open(files[5], "r+b") as f:
            f.seek(200)
            b = f.read(1)
            f.seek(200)
            f.write(bytes([b[0] ^ 0x40]))
        with open(files[7], "r+b") as f:
            f.truncate(os.path.getsize(files[7]) // 2)
        cl.add_worker("decode", "d0", args)
        cl.wait_workers(1)
        g = cl.batch([req])[0]
        check(not g["error"] and g["ids"] == want, "after corruption: %s" % g)
        check(g["cached_tokens"] == 5 * B, "after corruption: %d cached tokens, want the %d "
              "before the flipped block" % (g["cached_tokens"], 5 * B))
        check(cl.worker_metric("d0", "tandem_kv_disk_corrupt_total") >= 2, "corrupt files counted")
        # both bad files were dropped; the recomputed blocks are written again, whole
        size = os.path.getsize(files[0])
        wait_for(lambda: all(os.path.exists(f) and os.path.getsize(f) == size
                             for f in (files[5], files[7])), 30, "blocks 5 and 7 rewritten")
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    # a cap of 4 blocks: eviction, every request served
    block_file = 72 + os.path.getsize(files[0]) - 72
    tiny = tempfile.mkdtemp(prefix="tandem-kvdisk-")
    cl = C.Cluster(build, model, n_prefill=0, n_decode=1,
                   decode_args=["--kv.disk_dir", tiny, "--kv.disk_max", str(4 * block_file)])
    try:
        reqs = [{"prompt_ids": [rng.randrange(V) for _ in range(60)], "max_tokens": 4,
                 "temperature": 0} for _ in range(6)]
        out = cl.batch(reqs)
        check(all(not g["error"] for g in out), "tiny cap: %s" % [g["error"] for g in out])
        wait_for(lambda: cl.worker_metric("d0", "tandem_kv_cache_evictions_total",
                                          'tier="disk"') > 0, 30, "disk evictions")
        check(cl.worker_metric("d0", "tandem_kv_disk_bytes") <= 4 * block_file, "cap exceeded")
        # a disk that fails: every prefix folder becomes a plain file, so writes fail
        fpdir = os.path.dirname(os.path.dirname(kv_files(build, model, tiny, prompt)[0]))
        for i in range(256):
            p = os.path.join(fpdir, "%02x" % i)
            shutil.rmtree(p, ignore_errors=True)
            open(p, "w").close()
        out = cl.batch([{"prompt_ids": [rng.randrange(V) for _ in range(60)], "max_tokens": 4,
                         "temperature": 0} for _ in range(3)])
        check(all(not g["error"] for g in out), "failing disk: %s" % [g["error"] for g in out])
        wait_for(lambda: cl.worker_metric("d0", "tandem_kv_disk_enabled") == 0, 30,
                 "the tier to turn off")
        g = cl.batch([req])[0]
        check(not g["error"] and g["ids"] == want, "serving after the disk failed: %s" % g)
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(tiny, ignore_errors=True)
    # a disk that fills up: a 256 KiB tmpfs under a 10 GiB cap (needs mount: root)
    small = tempfile.mkdtemp(prefix="tandem-kvdisk-")
    full_disk = "skipped (cannot mount a tmpfs here)"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", small],
                      capture_output=True).returncode == 0:
        cl = C.Cluster(build, model, n_prefill=0, n_decode=1,
                       decode_args=["--kv.disk_dir", small, "--kv.disk_max", "10G"])
        try:
            out = cl.batch([{"prompt_ids": [rng.randrange(V) for _ in range(120)],
                             "max_tokens": 4, "temperature": 0} for _ in range(8)])
            check(all(not g["error"] for g in out), "full disk: %s" % [g["error"] for g in out])
            wait_for(lambda: cl.worker_metric("d0", "tandem_kv_disk_enabled") == 0, 30,
                     "the tier to turn off on a full disk")
            g = cl.batch([req])[0]
            check(not g["error"] and g["ids"] == want, "serving on a full disk: %s" % g)
            codes = cl.stop()
            check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
            full_disk = "turns the tier off, serving goes on"
        finally:
            C._kill_all()
            subprocess.run(["umount", "-l", small])
    shutil.rmtree(small, ignore_errors=True)
    print("disk tier: %d tokens from disk after SIGKILL and restart; a flipped byte and a "
          "truncated file dropped and recomputed; a 4-block cap evicts; a failing disk turns the "
          "tier off; a full disk %s; every token equal to tandem generate" % (full, full_disk))
    print("OK: disk tier")


def scenario_index(build):
    """The cluster KV index (Redis) and kv_aware placement, with 2 decode workers and no prefill
    worker: the same long prompt sent 6 times one after another goes to the worker that holds it
    every time after the first (round robin would alternate); Redis killed mid-run fails nothing
    (the router places by load alone while it is down)
    and, started again empty, is refilled by the workers' inventories; a SIGKILLed worker's
    entries leave Redis within its lease; a restarted router has the index back before the next
    request."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(9)
    V, B, lease = cfg["vocab_size"], 16, 2.0
    n = min(300, cfg["max_position_embeddings"] - 40)
    full = (n - 1) // B * B  # what a worker's cache attaches: every full block of n - 1 tokens

    def prompt():
        return {"prompt_ids": [rng.randrange(V) for _ in range(n)], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True}

    def holders(wid):
        """1 when worker wid's set in Redis holds blocks, else 0."""
        return int(bool(cl.redis.kv_set(wid)))

    cl = C.Cluster(build, model, n_prefill=0, n_decode=2, redis=True,
                   worker_args=["--kv.redis_lease_s", str(lease)])
    try:
        p1 = prompt()
        got = [cl.batch([p1])[0] for _ in range(6)]
        check(all(not g["error"] for g in got), "errors: %s" % got)
        cached = [g["cached_tokens"] for g in got]
        check(cached == [0] + [full] * 5, "cached tokens of 6 runs: %s, want 0 then %d" %
              (cached, full))
        st = cl.status()
        check(sorted(w["assigned"] for w in st.values()) == [0, 6],
              "every run on the holder: %s" % st)
        holder = [wid for wid, w in st.items() if w["assigned"] == 6][0]
        other = [wid for wid in st if wid != holder][0]
        check(holders(holder) == 1 and holders(other) == 0, "Redis holds the holder's set only")
        # Redis dies mid-run: nothing fails, placement goes on from the router's mirror
        reqs = [prompt() for _ in range(4)] + [p1] * 2
        result = {}
        th = threading.Thread(target=lambda: result.update(out=cl.batch(reqs, timeout=120)))
        th.start()
        time.sleep(0.05)
        cl.redis.stop()
        th.join(150)
        out = result.get("out", [])
        check(len(out) == len(reqs) and all(not g["error"] for g in out),
              "requests failed while Redis died: %s" % out)
        # without Redis the router places by load alone (its mirror emptied): still served,
        # tokens unchanged, wherever it lands
        want1 = C.offline_generate(build, model, p1)
        for _ in range(2):
            g = cl.batch([p1])[0]
            check(not g["error"] and g["ids"] == want1, "served without Redis: %s" % g)
        check(cl.worker_metric(None, "tandem_kv_index_blocks") == 0,
              "the router's mirror is empty while Redis is down")
        # Redis back, empty: the workers republish their inventories, hits come back
        cl.redis.start()
        wait_for(lambda: holders(holder) == 1, 20, "the holder's inventory in Redis again")
        blocks = lambda: cl.worker_metric(None, "tandem_kv_index_blocks")
        wait_for(lambda: blocks() > 0, 20, "the router's mirror read from Redis again")
        p2 = prompt()
        b0 = blocks()
        first = cl.batch([p2])[0]
        # the holder's announcement of p2's blocks reaches the router through Redis's channel
        wait_for(lambda: blocks() > b0, 20, "p2's blocks in the router's mirror")
        again = [cl.batch([p2])[0] for _ in range(3)]
        check(first["cached_tokens"] == 0 and all(a["cached_tokens"] == full for a in again),
              "hits after Redis came back: %s %s" % (first["cached_tokens"],
                                                     [a["cached_tokens"] for a in again]))
        # SIGKILL a worker: its entries leave Redis within the lease
        victim = other if holders(other) == 1 else holder
        check(holders(victim) == 1, "the victim has entries")
        cl.workers[victim].kill()
        t0 = time.monotonic()
        wait_for(lambda: cl.redis.kv_set(victim) is None, lease + 3,
                 "the dead worker's entries to expire")
        gone_s = time.monotonic() - t0
        check(gone_s <= lease + 1.0, "entries outlived the lease: %.1f s" % gone_s)
        survivor = holder if victim == other else other
        cl.add_worker("decode", victim)  # back, empty
        cl.wait_workers(2)
        # the prompts the survivor holds, then a router restart: the first request hits
        p3 = prompt()
        for _ in range(2):
            cl.batch([p3])
        check(holders(survivor) == 1, "the survivor's set")
        cl.restart_router()
        cl.wait_workers(2)
        for p in (p1, p3):
            g = cl.batch([p])[0]
            check(not g["error"] and g["cached_tokens"] == full,
                  "first request after the router restart: %s" % g)
        # stale information: the index says `survivor` holds p4 (entries a worker would have
        # announced before evicting the blocks, injected here); the request goes there, finds
        # nothing, recomputes and succeeds with the same tokens
        p4 = prompt()
        want4 = C.offline_generate(build, model, p4)
        hashes = [os.path.basename(f) for f in kv_files(build, model, "/", p4["prompt_ids"])]
        hashes = hashes[:(n - 1) // B]
        header = cl.redis.cmd("GETRANGE", "tandem:kv:set:" + survivor, 0, 15)
        check(header[:8] == b"TDKVSET1", "the survivor's set header: %r" % header)
        recs = b"".join(b"\x01\x00" + bytes.fromhex(h) for h in hashes)
        cl.redis.cmd("PUBLISH", "tandem:kv:events", survivor.encode() + b"\0" + header[8:] + recs)
        before = cl.status()[survivor]["assigned"]
        g = cl.batch([p4])[0]
        check(not g["error"] and g["ids"] == want4 and g["cached_tokens"] == 0,
              "placed on stale entries: %s" % g)
        check(cl.status()[survivor]["assigned"] == before + 1,
              "the stale entries drew the request to %s: %s" % (survivor, cl.status()))
        # a holder that hangs (SIGSTOP: connected, silent): the request placed on it by the index
        # is retried elsewhere once the router gives up on the holder, and succeeds
        other = [wid for wid in cl.workers if wid != survivor][0]
        cl.workers[survivor].proc.send_signal(signal.SIGSTOP)
        g = cl.batch([p3])[0]
        check(not g["error"] and g["ids"] == C.offline_generate(build, model, p3),
              "request placed on a hung holder: %s" % g)
        cl.workers[survivor].kill()
        cl.add_worker("decode", survivor)
        cl.wait_workers(2)
        # a worker stopped in order (SIGTERM) takes its entries with it: its set is gone from
        # Redis when it has exited, not a lease later, and the router's mirror forgets them
        check(holders(other) == 1 and blocks() > 0, "%s holds p3's blocks" % other)
        t0 = time.monotonic()
        cl.workers[other].stop()
        check(cl.redis.kv_set(other) is None,
              "%s's set still in Redis %.2f s after SIGTERM, once it exited" %
              (other, time.monotonic() - t0))
        wait_for(lambda: blocks() == 0, 1.0, "the router's mirror to forget %s's blocks" % other)
        left_s = time.monotonic() - t0
        cl.add_worker("decode", other)
        cl.wait_workers(2)
        print("KV index: 6 runs of one prompt, 5 hits on its holder; Redis killed mid-run: 0 of "
              "%d failed; a SIGKILLed worker's entries gone from Redis in %.1f s (lease %.0f s), "
              "a SIGTERMed one's in %.2f s; index back after a router restart; a request placed "
              "on stale entries recomputed, one placed on a hung holder retried on %s" %
              (len(reqs), gone_s, lease, left_s, other))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    # the disk tier in the index: each worker with its own disk directory; the holder of a
    # prompt restarts with an empty pool, announces the prompt's blocks as tier 2 (disk), and
    # kv_aware still sends the prompt there, where it loads instead of computing
    disks = {wid: tempfile.mkdtemp(prefix="tandem-kvdisk-") for wid in ("d0", "d1")}
    dargs = {wid: ["--kv.disk_dir", disks[wid], "--kv.disk_load", "always"] for wid in disks}
    cl = C.Cluster(build, model, n_prefill=0, n_decode=0, redis=True,
                   worker_args=["--kv.redis_lease_s", str(lease)])
    try:
        for wid in ("d0", "d1"):
            cl.add_worker("decode", wid, dargs[wid])
        cl.wait_workers(2)
        p5 = prompt()
        want5 = C.offline_generate(build, model, p5)
        g = cl.batch([p5])[0]
        check(not g["error"] and g["ids"] == want5, "disk phase, cold: %s" % g)
        holder = [wid for wid, w in cl.status().items() if w["assigned"] == 1][0]
        blocks = [os.path.basename(f) for f in kv_files(build, model, "/", p5["prompt_ids"])]
        blocks = blocks[:(n - 1) // B]
        wait_for(lambda: cl.worker_metric(holder, "tandem_kv_cached_blocks", 'tier="disk"') >=
                 len(blocks), 30, "the prompt's blocks on disk")
        cl.workers[holder].kill()
        cl.add_worker("decode", holder, dargs[holder])
        cl.wait_workers(2)

        def tiers():
            st = cl.redis.kv_set(holder) or {}
            return [st.get(h) for h in blocks]
        wait_for(lambda: tiers() == [2] * len(blocks), 20, "the holder's disk blocks as tier 2")
        g = cl.batch([p5])[0]
        check(not g["error"] and g["ids"] == want5 and g["cached_tokens"] == full,
              "disk-held prompt: %s" % g)
        check(cl.worker_metric(holder, "tandem_prefix_cache_hits_total", 'tier="disk"') == full,
              "the hit came from the holder's disk")
        # loaded into the pool: announced as tier 0 again
        wait_for(lambda: tiers() == [0] * len(blocks), 20, "the loaded blocks as tier 0")
        print("KV index: a restarted worker announced %d disk blocks as tier 2; kv_aware sent "
              "the prompt there and %d tokens came from disk" % (len(blocks), full))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
        for d in disks.values():
            shutil.rmtree(d, ignore_errors=True)
    # the same runs under round_robin alternate between the workers: the second misses (with
    # cross-worker fetch off: else the second worker fetches the prefix from the first, which
    # cluster_fetch tests)
    cl = C.Cluster(build, model, n_prefill=0, n_decode=2, redis=True,
                   router_args=["--placement.policy", "round_robin", "--kv.fetch_min_blocks", "0"])
    try:
        p1 = prompt()
        cached = [cl.batch([p1])[0]["cached_tokens"] for _ in range(3)]
        check(cached == [0, 0, full], "round_robin: %s, want [0, 0, %d]" % (cached, full))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: cluster KV index")


def scenario_hotprefix(build):
    """A hot prefix: 3 decode workers (local prefill), one warm-up request, then 24 requests at
    once that share a 192-token prefix (their own 16-token suffix each). kv_aware's guard keeps
    any worker from getting more than 1.5x the mean of the requests placed (the router's per-worker
    `assigned`, the load placement controls), while the holder still serves hits; with the guard
    off (placement.imbalance 1000) the holder takes more than that, so the bound is the guard's.
    Those two runs have cross-worker fetch off; a third, guard off and fetch on, spreads too: the
    other workers' predictions count the prefix they would fetch from the holder, and their
    requests are served with it fetched."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(21)
    V = cfg["vocab_size"]
    prefix = [rng.randrange(V) for _ in range(192)]

    def req():
        return {"prompt_ids": prefix + [rng.randrange(V) for _ in range(16)], "max_tokens": 4,
                "temperature": 0, "ignore_eos": True}

    results = {}
    nofetch = ["--kv.fetch_min_blocks", "0"]
    runs = (("guard", nofetch), ("no guard", ["--placement.imbalance", "1000"] + nofetch),
            ("fetch", ["--placement.imbalance", "1000"]))
    for label, extra in runs:
        cl = C.Cluster(build, model, n_prefill=0, n_decode=3, redis=True,
                       router_args=["--placement.local_prefill_tokens", "0"] + extra)
        try:
            g = cl.batch([req()])[0]
            check(not g["error"], "warm-up: %s" % g)
            holder = [wid for wid, w in cl.status().items() if w["assigned"] == 1][0]
            wait_for(lambda: cl.redis.kv_set(holder), 10, "the holder's blocks in Redis")
            time.sleep(0.5)  # the mirror has them (events), heartbeats are fresh
            out = cl.batch([req() for _ in range(24)])
            check(all(not o["error"] for o in out), "errors: %s" % [o["error"] for o in out])
            st = cl.status()
            placed = {wid: w["assigned"] for wid, w in st.items()}
            placed[holder] -= 1  # the warm-up
            mean = sum(placed.values()) / len(placed)
            hits = sum(1 for o in out if o["cached_tokens"] > 0)
            results[label] = (max(placed.values()) / mean, placed, hits)
            codes = cl.stop()
            check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
        finally:
            C._kill_all()
    ratio, placed, hits = results["guard"]
    check(ratio <= 1.5, "hot prefix with the guard: max/mean %.2f > 1.5: %s" % (ratio, placed))
    check(hits > 0, "the guard left no hits: %s" % (results,))
    nratio, nplaced, _ = results["no guard"]
    check(nratio > 1.5, "without the guard the holder should take more: %.2f %s" %
          (nratio, nplaced))
    fratio, fplaced, fhits = results["fetch"]
    check(fratio <= 1.5 and fhits > len(fplaced),
          "fetch on, guard off: max/mean %.2f, %d requests with cached tokens: %s" %
          (fratio, fhits, fplaced))
    print("hot prefix: 24 requests sharing 192 tokens over 3 workers: max/mean placed %.2f with "
          "the guard %s (%d hits), %.2f without it %s; fetch on, guard off: %.2f %s (%d with the "
          "prefix cached or fetched)" % (ratio, placed, hits, nratio, nplaced, fratio, fplaced,
                                         fhits))
    print("OK: hot prefix guard")


def scenario_fetch(build):
    """Cross-worker fetch of cached KV blocks, 2 prefill workers, 1 decode worker and Redis: a
    prompt prefilled on one prefill worker (A), then A drained so the same prompt goes to the
    other (B): B fetches the blocks A holds over the data plane (its fetched-blocks counter, and
    only the uncached tail computed), with tokens identical to tandem generate's. Then a holder
    stopped (SIGSTOP) and killed while a fetch from it waits: the request still succeeds with
    identical tokens, computed in full, and the failure is counted by reason. Then two decode
    workers and no prefill worker: a decode worker prefilling locally fetches the same way."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(12)
    V, B = cfg["vocab_size"], 16
    n = min(300, cfg["max_position_embeddings"] - 40)
    full = (n - 1) // B * B  # every full block of n - 1 tokens

    def prompt():
        return {"prompt_ids": [rng.randrange(V) for _ in range(n)], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True}

    def holds(wid):
        return bool(cl.redis.kv_set(wid))

    def metric(wid, name, labels=""):
        return cl.worker_metric(wid, name, labels)

    def prefill_on(before):
        st = cl.status()
        got = [w for w in ("p0", "p1") if st[w]["assigned"] > before.get(w, 0)]
        check(len(got) == 1, "one prefill worker took the request: %s" % st)
        return got[0], {w: st[w]["assigned"] for w in ("p0", "p1")}

    cl = C.Cluster(build, model, n_prefill=2, n_decode=1, redis=True,
                   router_args=["--placement.local_prefill_tokens", "0",
                                "--placement.local_cached_share", "1"],
                   prefill_args=["--kv.fetch_timeout_s", "30"])
    try:
        p1 = prompt()
        want1 = C.offline_generate(build, model, p1)
        g = cl.batch([p1])[0]
        check(not g["error"] and g["ids"] == want1 and g["cached_tokens"] == 0,
              "first run: %s (want %s)" % (g, want1))
        a, seen = prefill_on({})
        b = "p1" if a == "p0" else "p0"
        wait_for(lambda: holds(a), 10, "the holder's blocks in Redis")
        time.sleep(1.0)  # the router's mirror follows Redis (its events channel)
        cl.ctl("drain", a)
        before = {k: metric(b, k) for k in ("tandem_kv_fetch_blocks_total",
                                             "tandem_kv_fetch_bytes_total",
                                             "tandem_prompt_tokens_computed_total")}
        g2 = cl.batch([p1])[0]
        check(not g2["error"], "second run: %s" % g2)
        check(prefill_on(seen)[0] == b, "the second run went to the other prefill worker")
        check(g2["ids"] == want1, "tokens after a fetch differ from tandem generate: %s %s" %
              (g2["ids"], want1))
        blocks = full // B
        fetched = metric(b, "tandem_kv_fetch_blocks_total") - \
            before["tandem_kv_fetch_blocks_total"]
        fbytes = metric(b, "tandem_kv_fetch_bytes_total") - before["tandem_kv_fetch_bytes_total"]
        computed = metric(b, "tandem_prompt_tokens_computed_total") - \
            before["tandem_prompt_tokens_computed_total"]
        bb = int(cl.workers[b].fields["block_bytes"])
        check(fetched == blocks and fbytes == blocks * bb,
              "%s fetched %d blocks (%d bytes), want %d (%d)" % (b, fetched, fbytes, blocks,
                                                                  blocks * bb))
        check(computed == n - full and computed < n,
              "%s computed %d prompt tokens, want %d" % (b, computed, n - full))
        check(g2["cached_tokens"] == full, "cached tokens after the fetch: %s" % g2)
        check(metric(a, "tandem_kv_fetch_served_blocks_total") == blocks, "the holder served")
        check(metric(b, "tandem_kv_fetch_failures_total") == 0, "no fetch failed")
        check(promcheck.problems(cl.metrics_text(b)) == [], "%s /metrics: %s" %
              (b, promcheck.problems(cl.metrics_text(b))))
        bw = metric(b, "tandem_kv_fetch_bandwidth_bytes_per_second")
        check(bw > 0, "measured fetch bandwidth")

        # the holder stops before it answers, then dies: the request is computed in full
        p2 = prompt()
        want2 = C.offline_generate(build, model, p2)
        g = cl.batch([p2])[0]  # computed on b (a is drained)
        check(not g["error"] and g["ids"] == want2, "p2 first run: %s" % g)
        check(prefill_on(seen)[0] == b, "p2 went to %s" % b)
        time.sleep(1.5)  # b's new blocks reach Redis and the router's mirror
        cl.ctl("undrain", a)
        cl.ctl("drain", b)
        fail0 = metric(a, "tandem_kv_fetch_failures_total", 'reason="peer"')
        comp0 = metric(a, "tandem_prompt_tokens_computed_total")
        holder = cl.workers[b]
        os.kill(holder.proc.pid, signal.SIGSTOP)
        result = {}
        th = threading.Thread(target=lambda: result.update(out=cl.batch([p2], timeout=120)))
        th.start()
        time.sleep(0.5)
        os.kill(holder.proc.pid, signal.SIGKILL)
        holder.proc.wait()
        del cl.workers[b]
        th.join(150)
        out = result.get("out", [])
        check(len(out) == 1 and not out[0]["error"], "the request after the holder died: %s" %
              out)
        check(out[0]["ids"] == want2, "tokens after a failed fetch differ: %s %s" %
              (out[0]["ids"], want2))
        check(out[0]["cached_tokens"] == 0, "nothing cached after the failed fetch: %s" % out)
        failed = metric(a, "tandem_kv_fetch_failures_total", 'reason="peer"') - fail0
        comp = metric(a, "tandem_prompt_tokens_computed_total") - comp0
        check(failed == 1, "%s counted %d failed fetches (reason peer), want 1" % (a, failed))
        check(comp == n, "%s computed %d prompt tokens, want all %d" % (a, comp, n))
        print("fetch: %d blocks (%d bytes) fetched from the holder, %d of %d prompt tokens "
              "computed, %.0f MB/s; the holder killed before it answered: recomputed, tokens "
              "identical" % (blocks, blocks * bb, n - full, n, bw / 1e6))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    # a decode worker that prefills locally fetches as well (DecodeTask.fetch): two decode workers
    # and no prefill worker; the holder drained, the other one fetches the prompt's blocks
    cl = C.Cluster(build, model, n_prefill=0, n_decode=2, redis=True,
                   worker_args=["--kv.fetch_timeout_s", "30"])
    try:
        p3 = prompt()
        want3 = C.offline_generate(build, model, p3)
        g = cl.batch([p3])[0]
        check(not g["error"] and g["ids"] == want3 and g["cached_tokens"] == 0,
              "decode-only first run: %s" % g)
        st = cl.status()
        holder = [wid for wid, w in st.items() if w["assigned"] == 1][0]
        other = [wid for wid in st if wid != holder][0]
        wait_for(lambda: holds(holder), 10, "the holder's blocks in Redis")
        time.sleep(1.0)  # the router's mirror follows Redis
        cl.ctl("drain", holder)
        f0 = metric(other, "tandem_kv_fetch_blocks_total")
        c0 = metric(other, "tandem_prompt_tokens_computed_total")
        g = cl.batch([p3])[0]
        check(not g["error"] and g["ids"] == want3, "decode-only second run: %s (want %s)" %
              (g, want3))
        check(cl.status()[other]["assigned"] == 1, "the second run went to %s" % other)
        fetched = metric(other, "tandem_kv_fetch_blocks_total") - f0
        computed = metric(other, "tandem_prompt_tokens_computed_total") - c0
        check(fetched == full // B and computed == n - full and g["cached_tokens"] == full,
              "%s fetched %d blocks and computed %d tokens (cached %d), want %d, %d, %d" %
              (other, fetched, computed, g["cached_tokens"], full // B, n - full, full))
        check(metric(holder, "tandem_kv_fetch_served_blocks_total") == full // B,
              "the drained decode worker served the fetch")
        print("fetch into a decode worker's local prefill: %d blocks from %s, %d of %d tokens "
              "computed, tokens identical" % (fetched, holder, computed, n))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: cross-worker fetch")


SCENARIOS = {
    "preempt": scenario_preempt,
    "cache": scenario_cache,
    "disk": scenario_disk,
    "index": scenario_index,
    "hotprefix": scenario_hotprefix,
    "fetch": scenario_fetch,
}


if __name__ == "__main__":
    run(SCENARIOS)

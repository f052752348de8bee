"""soak.py: a real cluster under steady load with a fault at a fixed interval.

    /usr/bin/python3 tests/soak/soak.py BUILD MODEL [--duration S] [--fault-every S]
        [--warmup S] [--deadline S] [--load 0.8] [--out FILE.json]

Starts tandem-router, 2 prefill and 3 decode workers of MODEL and a private redis-server (the
cluster KV index) on loopback (tests/integration/cluster.py). Measures capacity first: 12 clients
in a closed loop for a few seconds give requests per second; then Poisson arrivals at --load times
that rate (half streaming, half not; prompts of 8-90 words so both prefill paths are used) for
--duration seconds. Every --fault-every seconds one fault, in turn:
  kill   SIGKILL a random worker, start it again with the same id
  stop   SIGSTOP a random decode worker for 3 s, then SIGCONT
  redis  SIGKILL redis-server, start it again on the same port
(a network partition is the namespace test's, not this one's.)

Asserts: every request ends before its deadline (none hangs) with its answer or a clear error
(an HTTP status with an OpenAI-style error body, or an error event in the stream); at least 90%
complete; the RSS of every daemon (from /proc) grows under 5% between the end of warm-up and the
end: the highest sample in the first third after warm-up against the highest in the last third
(daemons restarted by a fault are measured from their own warm-up). Judged only where a daemon
was measured for --rss-min-span (600) seconds after its warm-up: a worker's resident set grows
with the largest batch it has run (logits and sampler buffers per sequence), and a few minutes
with faults keep setting new peaks, so a short run reports RSS without judging it. Prints per fault kind: faults, requests affected (in flight at the fault), migrated
(the router's tandem_request_migrations_total over the fault's interval), failed, recovery time
(the fault until every worker is registered again and a request started after the fault has
completed). Exit 0 on success, 1 on a failed assertion."""
import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cluster  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
         "boxing matches near old stone bridges under grey autumn skies").split()


class Req:
    __slots__ = ("t0", "t1", "ok", "err", "stream", "unclear")

    def __init__(self, stream):
        self.t0 = time.monotonic()
        self.t1 = None
        self.ok = False
        self.err = None
        self.unclear = False
        self.stream = stream


def one_request(port, rng, stream, deadline):
    """One completion; returns a finished Req. A clear error is a status with an error body or an
    error event; anything else that is not an answer (reset, EOF, bad JSON, timeout) is unclear."""
    r = Req(stream)
    n = rng.choice((8, 12, 20, 40, 90))
    prompt = " ".join(rng.choice(WORDS) for _ in range(n))
    body = {"prompt": prompt, "max_tokens": rng.choice((8, 16, 32)), "temperature": 0,
            "stream": stream}
    end = r.t0 + deadline
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            raw = resp.read()
            try:
                msg = json.loads(raw)["error"]["message"]
                r.err = "%d: %s" % (resp.status, msg)
                r.unclear = not msg
            except (ValueError, KeyError, TypeError):
                r.err, r.unclear = "%d without an error body: %r" % (resp.status, raw[:80]), True
        elif not stream:
            out = json.loads(resp.read())
            r.ok = bool(out["choices"]) and out["usage"]["completion_tokens"] > 0
            if not r.ok:
                r.err, r.unclear = "200 without tokens", True
        else:
            done = False
            while time.monotonic() < end:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    r.err = "stream error: %s" % ev["error"].get("message", "")
                    r.unclear = not ev["error"].get("message")
                    break
            if done and r.err is None:
                r.ok = True
            elif r.err is None:
                r.err, r.unclear = "stream ended without [DONE] or an error event", True
        c.close()
    except Exception as e:  # noqa: BLE001 (every other outcome is an unclear failure)
        r.err, r.unclear = "%s: %s" % (type(e).__name__, e), True
    r.t1 = time.monotonic()
    if r.t1 > end + 1:
        r.err, r.unclear, r.ok = "past its %.0f s deadline" % deadline, True, False
    return r


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def migrations(cl):
    try:
        for line in cl.metrics_text().splitlines():
            if line.startswith("tandem_request_migrations_total"):
                return float(line.rsplit(" ", 1)[1])
    except OSError:
        return None
    return 0.0


def measure_capacity(port, secs, clients, deadline):
    stop = time.monotonic() + secs
    done = []
    lock = threading.Lock()

    def loop(i):
        rng = random.Random(1000 + i)
        while time.monotonic() < stop:
            r = one_request(port, rng, i % 2 == 0, deadline)
            with lock:
                done.append(r)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = sum(1 for r in done if r.ok)
    return ok / (time.monotonic() - t0), ok, len(done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--fault-every", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--deadline", type=float, default=60)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--capacity-secs", type=float, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-limit", type=float, default=5, help="percent")
    ap.add_argument("--rss-min-span", type=float, default=600,
                    help="judge RSS only over at least this many seconds after warm-up")
    ap.add_argument("--out")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print("soak: no model at %s" % a.model)
        return 77
    # the router's own per-request deadline comes first, so a request it cannot serve in time ends
    # with its error rather than the client's timeout
    cl = cluster.Cluster(a.build, a.model, n_prefill=2, n_decode=3, redis=True, router_args=[
        "--admission.request_timeout_s", "%g" % (0.75 * a.deadline)])
    port = cl.router.port("http")
    n_workers = len(cl.workers)
    cap, cap_ok, cap_n = measure_capacity(port, a.capacity_secs, 12, a.deadline)
    rate = a.load * cap
    print("soak: capacity %.1f req/s (%d of %d requests ok in %.0f s, 12 clients); load %.1f req/s"
          % (cap, cap_ok, cap_n, a.capacity_secs, rate), flush=True)
    if cap_ok == 0:
        print("soak: FAIL: no request completed while measuring capacity")
        return 1

    reqs = []
    lock = threading.Lock()
    t_start = time.monotonic()
    t_end = t_start + a.duration
    pending = []

    def run_one(seed, stream):
        r = one_request(port, random.Random(seed), stream, a.deadline)
        with lock:
            reqs.append(r)

    def arrivals():
        k = 0
        t = time.monotonic()
        while True:
            t += rng.expovariate(rate)
            if t >= t_end:
                break
            time.sleep(max(0.0, t - time.monotonic()))
            th = threading.Thread(target=run_one, args=(a.seed * 1000003 + k, k % 2 == 0),
                                  daemon=True)
            th.start()
            pending.append(th)
            k += 1

    # RSS: per incarnation (name, pid): samples (t, kB)
    rss = {}
    rss_stop = threading.Event()

    def procs():
        out = [("router", cl.router.proc.pid)]
        out += [(w, d.proc.pid) for w, d in cl.workers.items() if d.proc.poll() is None]
        return out

    started = {("router", cl.router.proc.pid): time.monotonic()}
    for w, d in cl.workers.items():
        started[(w, d.proc.pid)] = time.monotonic()

    def sampler():
        while not rss_stop.wait(1.0):
            now = time.monotonic()
            for key in procs():
                v = rss_kb(key[1])
                if v is not None:
                    rss.setdefault(key, []).append((now, v))

    faults = []  # dicts: kind, t, target, mig0, recovered
    threading.Thread(target=sampler, daemon=True).start()
    gen = threading.Thread(target=arrivals)
    gen.start()
    kinds = ["kill", "stop", "redis"]
    nf = 0
    next_fault = t_start + a.fault_every
    while next_fault < t_end - 5:
        time.sleep(max(0.0, next_fault - time.monotonic()))
        kind = kinds[nf % len(kinds)]
        nf += 1
        f = {"kind": kind, "t": time.monotonic(), "mig0": migrations(cl)}
        if kind == "kill":
            wid = rng.choice(sorted(cl.workers))
            d = cl.workers[wid]
            role = "prefill" if wid.startswith("p") else "decode"
            d.kill()
            time.sleep(0.5)
            nd = cl.add_worker(role, wid)
            started[(wid, nd.proc.pid)] = time.monotonic()
            f["target"] = wid
        elif kind == "stop":
            wid = rng.choice(sorted(w for w in cl.workers if w.startswith("d")))
            pid = cl.workers[wid].proc.pid
            os.kill(pid, signal.SIGSTOP)
            time.sleep(3)
            os.kill(pid, signal.SIGCONT)
            f["target"] = wid
        else:
            cl.redis.stop()
            time.sleep(0.5)
            cl.redis.start()
            f["target"] = "redis"
        # recovered: every worker registered again and a request started after the fault done
        while time.monotonic() < t_end:
            try:
                alive = sum(1 for w in cl.status().values() if w["alive"])
            except Exception:  # noqa: BLE001
                alive = 0
            with lock:
                later = any(r.ok and r.t0 >= f["t"] for r in reqs)
            if alive >= n_workers and later:
                f["recovered"] = time.monotonic() - f["t"]
                break
            time.sleep(0.1)
        faults.append(f)
        next_fault = f["t"] + a.fault_every
    gen.join()
    for th in pending:
        th.join(a.deadline + 5)
    hung = sum(1 for th in pending if th.is_alive())
    rss_stop.set()
    mig_end = migrations(cl)
    codes = cl.stop()

    # per fault kind
    fails = []
    report = {"capacity_rps": cap, "load_rps": rate, "duration_s": a.duration,
              "requests": len(reqs), "hung": hung, "faults": {}}
    for i, f in enumerate(faults):
        t_next = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        f["affected"] = sum(1 for r in reqs if r.t0 < f["t"] < r.t1)
        f["failed"] = sum(1 for r in reqs if not r.ok and f["t"] <= r.t1 < t_next)
        m1 = faults[i + 1]["mig0"] if i + 1 < len(faults) else mig_end
        f.pop("t_abs", None)
        f["migrated"] = (m1 - f["mig0"]) if m1 is not None and f["mig0"] is not None else None
    for kind in kinds:
        fk = [f for f in faults if f["kind"] == kind]
        if not fk:
            continue
        rec = [f.get("recovered") for f in fk]
        report["faults"][kind] = {
            "n": len(fk), "targets": [f["target"] for f in fk],
            "affected": sum(f["affected"] for f in fk),
            "migrated": sum(f["migrated"] or 0 for f in fk),
            "failed": sum(f["failed"] for f in fk),
            "recovery_s": [round(x, 2) if x is not None else None for x in rec]}
        if any(x is None for x in rec):
            fails.append("%s: not recovered before the end" % kind)
    n_ok = sum(1 for r in reqs if r.ok)
    unclear = [r for r in reqs if r.unclear]
    errs = {}
    for r in reqs:
        if r.err:
            errs[r.err[:100]] = errs.get(r.err[:100], 0) + 1
    report.update(ok=n_ok, failed=len(reqs) - n_ok, unclear=len(unclear),
                  errors=sorted(errs.items(), key=lambda x: -x[1])[:8],
                  max_latency_s=round(max((r.t1 - r.t0 for r in reqs), default=0), 2))
    if hung:
        fails.append("%d requests still running %.0f s after the load ended" % (hung, a.deadline))
    if unclear:
        fails.append("%d requests ended without an answer or a clear error, e.g. %s" %
                     (len(unclear), unclear[0].err))
    if not reqs or n_ok < 0.9 * len(reqs):
        fails.append("only %d of %d requests completed" % (n_ok, len(reqs)))
    # RSS: a daemon's resident set moves with its batch (activations, freed and reused), so single
    # samples say little; the high-water mark does not fall back, and a leak raises it. Compared:
    # the highest RSS in the first third after the end of warm-up (of the run, or of a restarted
    # daemon's own) and the highest in the last third.
    report["rss"] = {}
    for key, samples in sorted(rss.items()):
        t_warm = max(t_start + a.warmup, started.get(key, t_start) + a.warmup)
        after = [(t, v) for t, v in samples if t >= t_warm]
        if len(after) < 6 or after[-1][0] - after[0][0] < 30:
            continue  # lived too briefly after its warm-up to say
        k = len(after) // 3
        first, last = max(v for _, v in after[:k]), max(v for _, v in after[-k:])
        g = (last - first) / first
        report["rss"]["%s(pid %d)" % key] = {
            "kb_first_third_max": first, "kb_last_third_max": last,
            "growth_pct": round(100 * g, 2), "span_s": round(after[-1][0] - after[0][0]),
            "kb_quartiles": [after[int(q * (len(after) - 1))][1] for q in (0, .25, .5, .75, 1)]}
        judged = after[-1][0] - after[0][0] >= a.rss_min_span
        report["rss"]["%s(pid %d)" % key]["judged"] = judged
        if judged and g >= a.rss_limit / 100:
            fails.append("%s (pid %d): RSS high-water mark grew %.1f%% after warm-up (%d -> %d kB)"
                         % (key[0], key[1], 100 * g, first, last))
    if "router" not in " ".join(report["rss"]):
        fails.append("the router's RSS was not measured after warm-up (run longer)")
    bad = {k: c for k, c in codes.items() if c != 0}
    if bad:
        fails.append("daemons did not exit cleanly on SIGTERM: %s" % bad)
    report["fail"] = fails
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    for x in fails:
        print("soak: FAIL: " + x)
    if not fails:
        print("soak: ok: %d requests, %d completed, %d faults, none hung" %
              (len(reqs), n_ok, len(faults)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

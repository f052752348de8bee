#!/usr/bin/python3
"""faults_test.py: a real tandem cluster on loopback under faults and operations: a rolling
restart under load, and migration when a decode worker dies or stops.

Usage: faults_test.py BUILD_DIR SCENARIO ARCH [MODEL_DIR]

  rolling           every worker in turn drained, stopped and restarted under a steady bench
                    load (tandem ctl drain / workers / undrain): no request fails
  migrate           a decode worker SIGKILLed under 16 streams and under 16 non-streaming
                    requests, one SIGSTOPped: every request completes with tandem generate's
                    tokens (greedy and seeded), the stopped one's within the heartbeat window
                    plus 1 s; no decode worker: 503 with Retry-After within the configured wait

ARCH is deepseek_v3 or llama: MODEL_DIR (written by make_model.py), else mkmodel's tiny preset
with the real tokenizer of that family written under BUILD_DIR (harness.py).
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402
from harness import (check, ctl_json, make_model, offline_json, router_counter, run, wait_for)  # noqa: E402


def scenario_rolling(build):
    """A rolling restart under load: router + 2 prefill + 2 decode workers serve `tandem bench`
    at a steady low rate while every worker in turn is drained (`tandem ctl drain`), waited for
    until `tandem ctl workers` shows it idle (no running or waiting sequences on it, none of the
    router's in flight), stopped with SIGTERM, started again with the same id and undrained once
    registered. The bench then reports every request completed and none failed."""
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=2, n_decode=2,
                   router_args=["--placement.local_prefill_tokens", "0"])
    try:
        d = tempfile.mkdtemp(prefix="tandem-rolling-")
        out = os.path.join(d, "rolling.json")
        rate, duration = 6, 40
        argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", cl.http,
                "--backend", "openai", "--model", os.path.basename(model), "--tokenizer", model,
                "--random-input-len", "40", "--random-output-len", "48",
                "--random-range-ratio", "0.5", "--ignore-eos", "--request-rate", str(rate),
                "--burstiness", "inf", "--duration", str(duration), "--seed", "3",
                "--save-detailed", "--result-file", out, "--no-progress"]
        bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen_requests = []
        busy_decode = []  # the router's sequences on each decode worker just before its drain

        def workers():
            return {w["id"]: w for w in ctl_json(cl, "workers")["workers"]}

        def idle(wid):
            rq = ctl_json(cl, "requests")["requests"]
            if rq:
                seen_requests.append(rq)
            w = workers().get(wid)
            return w and w["draining"] and w["running"] == 0 and w["waiting"] == 0 and \
                w["in_flight"] == 0 and not any(wid in (r["decode_worker"], r["prefill_worker"])
                                                for r in rq)

        time.sleep(2)  # requests in flight before the first drain
        for wid in ("p0", "d0", "p1", "d1"):
            role = "prefill" if wid.startswith("p") else "decode"
            t_start = time.monotonic()
            # drain it while it holds the router's sequences (a decode worker always gets there
            # under this load; a prefill worker's prompts are short, so it may be caught idle)
            seen = []  # the in-flight count when it was seen busy (a second read may find 0)

            def holds():
                n = workers()[wid]["in_flight"]
                if n > 0 or (role == "prefill" and time.monotonic() - t_start > 5):
                    seen.append(n)
                    return True
                return False
            wait_for(holds, 20, "%s to hold sequences" % wid)
            busy = seen[-1]
            if role == "decode":
                busy_decode.append(busy)
            t0 = time.monotonic()
            cl.ctl("drain", wid)
            wait_for(lambda: idle(wid), 30, "%s to finish its sequences after drain" % wid)
            t_idle = time.monotonic()
            rc = cl.workers[wid].stop()
            check(rc == 0, "%s exited %s after SIGTERM" % (wid, rc))
            cl.add_worker(role, wid)
            wait_for(lambda: workers().get(wid, {}).get("alive"), 10, "%s to register" % wid)
            cl.ctl("undrain", wid)
            check(not workers()[wid]["draining"], "%s still draining after undrain" % wid)
            print("%s: drained with %d sequences in flight, idle in %.2f s, restarted and back in "
                  "%.2f s" % (wid, busy, t_idle - t0, time.monotonic() - t_idle))
            check(bench.poll() is None, "the bench ended before %s was restarted" % wid)
        so, se = bench.communicate(timeout=duration + 120)
        check(bench.returncode == 0, "tandem bench failed (%d):\n%s" % (bench.returncode, se))
        with open(out) as f:
            res = json.load(f)
        want = rate * duration
        errors = [e for e in res.get("errors", []) if e]
        print("rolling restart under load: %d of %d completed, %d failed %s" %
              (res["completed"], want, res.get("failed", 0), errors[:3]))
        check(res.get("failed", 0) == 0 and res["completed"] == want,
              "%s completed, %s failed: %s" % (res["completed"], res.get("failed"), errors[:5]))
        check(all(busy_decode), "a decode worker was drained idle: %s" % busy_decode)
        # the router listed its requests with their state and workers while they ran
        flat = [r for rq in seen_requests for r in rq]
        check(flat and all(r["id"].startswith("r-") and r["state"] in
                           ("new", "waiting", "accepting", "running") for r in flat),
              "tandem ctl requests: %s" % flat[:3])
        check(any(r["state"] == "running" and r["decode_worker"] for r in flat),
              "no running request with its decode worker: %s" % flat[:3])
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: rolling restart of every worker under load, no request failed")


def scenario_migrate(build):
    """Migration (docs/reliability.md): a decode worker SIGKILLed under 16 concurrent streams and
    under 16 non-streaming requests, and one SIGSTOPped under 16 streams: every request completes
    with exactly the tokens `tandem generate` gives (greedy and seeded), the stopped worker's
    sequences move within the heartbeat window plus one second; a restarted router gets its
    workers back at once and only its own in-flight requests fail; with no decode worker left, 503
    with Retry-After within admission.no_worker_wait_s."""
    model, cfg = make_model(build, "deepseek_v3")
    hb = 1.5  # cluster.py's --cluster.heartbeat_timeout_s
    wait_s = 1.0
    # prompts of 8..40 tokens: the short ones are prefilled on the decode worker, the longer ones
    # (and most resumed prompt + generated ones) on the prefill worker, so both resume paths run
    cl = C.Cluster(build, model, n_prefill=1, n_decode=4, ucx_tls=os.environ.get("UCX_TLS", "tcp"),
                   router_args=["--placement.local_prefill_tokens", "24",
                                "--placement.policy", "least_loaded",
                                "--admission.no_worker_wait_s", str(wait_s)])
    try:
        rng = random.Random(13)
        reqs = []
        for i in range(16):
            r = {"prompt_ids": [rng.randrange(cfg["vocab_size"]) for _ in range(rng.randint(8, 40))],
                 "max_tokens": 200, "ignore_eos": True}
            if i % 2:
                r["temperature"] = 1.0
                r["seed"] = rng.randrange(1 << 40)
                if i % 4 == 1:
                    r["top_p"] = 0.9
            else:
                r["temperature"] = 0
            reqs.append(r)
        t0 = time.monotonic()
        want, lock = [None] * len(reqs), threading.Lock()

        def offline(i):
            w = offline_json(build, model, reqs[i])
            with lock:
                want[i] = w
        ths = [threading.Thread(target=offline, args=(i,)) for i in range(len(reqs))]
        for k in range(0, len(ths), 4):
            for th in ths[k:k + 4]:
                th.start()
            for th in ths[k:k + 4]:
                th.join()
        check(all(want), "tandem generate gave no answer for some request")
        print("offline: %d requests in %.1f s" % (len(reqs), time.monotonic() - t0))

        def streams_with(fault, victim):
            """Run the 16 streams (RPC), apply `fault` to `victim` once it runs sequences and the
            router has received tokens; returns (results, seconds from the fault to the first
            migration)."""
            m0 = router_counter(cl, "tandem_request_migrations_total")
            g0 = cl.worker_metric(victim, "tandem_generation_tokens_total")
            res = {}
            th = threading.Thread(target=lambda: res.update(out=cl.batch(reqs, timeout=300)))
            th.start()
            # well into the streams: tens of tokens per sequence on the victim
            wait_for(lambda: cl.worker_metric(victim, "tandem_num_requests_running") > 0 and
                     cl.worker_metric(victim, "tandem_generation_tokens_total") > g0 + 120, 120,
                     victim + " to stream tokens")
            fault()
            t_fault = time.monotonic()
            wait_for(lambda: router_counter(cl, "tandem_request_migrations_total") > m0, 60,
                     "a migration after the fault on " + victim)
            dt = time.monotonic() - t_fault
            th.join(300)
            check(not th.is_alive(), "the streams hung after the fault on " + victim)
            return res["out"], dt

        def check_same(out, what):
            check(len(out) == len(reqs), "%s: %d results for %d requests" %
                  (what, len(out), len(reqs)))
            bad = [(i, g["error"]) for i, g in enumerate(out)
                   if g["error"] or g["ids"] != want[i]["ids"]]
            for i, err in bad[:4]:
                print("%s: request %d differs: error %r\n  got  %s\n  want %s" %
                      (what, i, err, out[i]["ids"][:40], want[i]["ids"][:40]))
            check(not bad, "%s: %d of %d requests failed or differ from tandem generate" %
                  (what, len(bad), len(reqs)))

        # 1. SIGKILL under 16 streams
        out, dt = streams_with(lambda: cl.workers["d0"].kill(), "d0")
        check_same(out, "SIGKILL d0 under 16 streams")
        log = cl.router.tail(400)
        resumed = re.findall(r"migrating sequence \d+ with (\d+) generated tokens", log)
        check(resumed and max(map(int, resumed)) > 0,
              "no sequence was resumed from generated tokens: %s" % resumed)
        print("SIGKILL d0: 16 streams identical to tandem generate; %d sequences migrated "
              "(generated tokens carried over: %s), first %.2f s after the kill" %
              (len(resumed), ",".join(resumed), dt))

        # 2. SIGKILL under 16 non-streaming requests
        m0 = router_counter(cl, "tandem_request_migrations_total")
        got = [None] * len(reqs)

        def post(i):
            r = reqs[i]
            body = {"prompt": r["prompt_ids"], "max_tokens": r["max_tokens"],
                    "ignore_eos": True, "temperature": r["temperature"]}
            for k in ("seed", "top_p"):
                if k in r:
                    body[k] = r[k]
            got[i] = cl.http_json("/v1/completions", body, timeout=300)
        g0 = cl.worker_metric("d1", "tandem_generation_tokens_total")
        ths = [threading.Thread(target=post, args=(i,)) for i in range(len(reqs))]
        for th in ths:
            th.start()
        wait_for(lambda: cl.worker_metric("d1", "tandem_num_requests_running") > 0 and
                 cl.worker_metric("d1", "tandem_generation_tokens_total") > g0 + 120, 120,
                 "d1 to run sequences")
        cl.workers["d1"].kill()
        for th in ths:
            th.join(300)
        check(router_counter(cl, "tandem_request_migrations_total") > m0,
              "no non-streaming request was migrated")
        bad = 0
        for i, (st, js, _) in enumerate(got):
            ok = (st == 200 and js["choices"][0]["text"] == want[i]["text"] and
                  js["usage"]["completion_tokens"] == 200 and
                  js["usage"]["prompt_tokens"] == len(reqs[i]["prompt_ids"]))
            if not ok:
                bad += 1
                print("non-streaming request %d: %d %s" % (i, st, str(js)[:300]))
        check(bad == 0, "%d of 16 non-streaming requests failed or differ after SIGKILL of d1" %
              bad)
        print("SIGKILL d1: 16 non-streaming requests identical to tandem generate, usage exact")

        # 3. SIGSTOP under 16 streams: within the heartbeat window plus one second
        stopped = cl.workers["d2"]
        out, dt = streams_with(lambda: stopped.proc.send_signal(signal.SIGSTOP), "d2")
        check_same(out, "SIGSTOP d2 under 16 streams")
        print("SIGSTOP d2: its sequences moved %.2f s after the stop (heartbeat window %.1f s); "
              "16 streams identical to tandem generate" % (dt, hb))
        check(dt <= hb + 1.0, "the stopped worker's sequences moved after %.2f s (> %.1f s)" %
              (dt, hb + 1.0))
        stopped.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: cl.status().get("d2", {"alive": False})["alive"], 15,
                 "d2 to rejoin after SIGCONT")

        # 4. router restart under 16 streams: its in-flight requests end with an error (none
        #    hangs), the workers cancel them and are back within about a second, and the new
        #    router serves with the same tokens
        path = os.path.join(cl.dir, "restart.jsonl")
        with open(path, "w") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        res = {}

        def batch_raw():
            res["r"] = cl.ctl("--timeout", "120", "batch", path, timeout=150, check=False)
        th = threading.Thread(target=batch_raw)
        g0 = cl.worker_metric("d3", "tandem_generation_tokens_total")
        th.start()
        wait_for(lambda: cl.worker_metric("d3", "tandem_generation_tokens_total") > g0 + 60, 120,
                 "d3 to stream tokens before the router restart")
        cl.restart_router()
        t_up = time.monotonic()
        cl.wait_workers(3, timeout=10)
        back = time.monotonic() - t_up
        th.join(150)
        check(not th.is_alive(), "the batch hung after its router was restarted")
        lines = [json.loads(l) for l in res["r"].stdout.splitlines() if l.strip()]
        errs = [g["error"] for g in lines if g.get("error")]
        print("router restart: workers back %.2f s after it listened; its %d in-flight requests: "
              "%d ended with an error (e.g. %r), exit %d" %
              (back, len(reqs), len(errs), errs[:1], res["r"].returncode))
        check(back < 3.0, "workers took %.2f s to register with the restarted router" % back)
        check(len(lines) + len(errs) > 0 and all(g.get("error") or g["ids"] == want[i]["ids"]
                                                for i, g in enumerate(lines)),
              "a request of the old router finished with wrong tokens")
        wait_for(lambda: all(cl.worker_metric(w, "tandem_num_requests_running") == 0
                             for w in ("d2", "d3")), 10,
                 "the workers to cancel the old router's sequences")
        check_same(cl.batch(reqs, timeout=300), "after the router restart")

        # 5. no decode worker: 503 with Retry-After within admission.no_worker_wait_s
        for wid in ("d2", "d3"):
            cl.workers[wid].kill()
        wait_for(lambda: not any(w["alive"] for k, w in cl.status().items()
                                 if w["role"] == "decode"), 10, "every decode worker gone")
        t0 = time.monotonic()
        st, js, hdrs = cl.http_json("/v1/completions", {"prompt": [1, 2, 3],
                                                        "max_tokens": 4}, timeout=60)
        el = time.monotonic() - t0
        print("no decode worker: %d after %.2f s (Retry-After %s): %s" %
              (st, el, hdrs.get("Retry-After"), js))
        check(st == 503 and hdrs.get("Retry-After"), "503 with Retry-After, got %d %r" % (st, js))
        check(isinstance(js, dict) and "no decode worker" in js["error"]["message"] and
              js["error"]["type"], "OpenAI-style error body: %r" % (js,))
        check(wait_s - 0.1 <= el <= wait_s + 2.0, "answered after %.2f s (wait %.1f s)" %
              (el, wait_s))
        codes = cl.stop()
        check(all(c == 0 for n, c in codes.items() if n not in ("d0", "d1", "d2", "d3")),
              "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: migration under SIGKILL and SIGSTOP, streaming and not; 503 without workers")


SCENARIOS = {
    "rolling": scenario_rolling,
    "migrate": scenario_migrate,
}


if __name__ == "__main__":
    run(SCENARIOS)

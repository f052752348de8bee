#!/usr/bin/python3
"""cluster_test.py: end-to-end tests of a real tandem cluster on loopback: tokens, replicas,
malformed input, the official clients, bench, several routers, shutdown, sampling options and
structured outputs.

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
  penalties         presence, frequency and repetition penalties, logit_bias and min_tokens
                    give exactly the tokens tandem generate gives with the same options
  structured        response_format json_object and json_schema (chat and completions):
                    every answer parses and validates; bad schemas are 400s

ARCH is deepseek_v3 or llama: MODEL_DIR (written by make_model.py), else mkmodel's tiny preset
with the real tokenizer of that family written under BUILD_DIR (harness.py).
"""
import json
import os
import random
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
from harness import (ROOT, check, make_model, mixed_requests, router_counter, run, wait_for)  # noqa: E402


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
        # bad ctl arguments are refused before anything connects or reads a secret: the
        # message names the option, not the closed port or the missing secret
        env = {k: v for k, v in os.environ.items() if k != "TANDEM_CLUSTER_SECRET"}
        for args, want in ((["generate", "--prompt", "hi", "--temperature", "x"], "--temperature"),
                           (["generate", "--bogus"], "--bogus"), (["frob"], "frob")):
            r = subprocess.run([os.path.join(build, "tools", "tandem"), "ctl", "--router",
                                "127.0.0.1:1"] + args, capture_output=True, text=True,
                               timeout=30, env=env)
            check(r.returncode in (1, 2) and want in r.stderr and "no cluster secret" not in r.stderr,
                  "ctl %s: rc %d, %r" % (args, r.returncode, r.stderr))
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


SCENARIOS = {
    "equal": scenario_equal,
    "replicas": scenario_replicas,
    "malformed": scenario_malformed,
    "clients": scenario_clients,
    "bench": scenario_bench,
    "shutdown": scenario_shutdown,
    "routers": scenario_routers,
    "penalties": scenario_penalties,
    "structured": scenario_structured,
}


if __name__ == "__main__":
    run(SCENARIOS)

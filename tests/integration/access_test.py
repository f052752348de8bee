#!/usr/bin/python3
"""access_test.py: the router's access control with the real tandem-router binary and SCRIPTED
workers (fake_worker.c, through router_test.py's harness): API keys from a file (both headers,
401 in each API's shape, the key's tenant over the tenant header), per-key request limits (429
with the x-ratelimit-* headers and Retry-After, then served after the reset), per-tenant
concurrency caps, SIGHUP reload adding and removing keys while a stream on an existing
connection keeps going (and a bad file keeping the old keys), two cluster secrets during a
rotation, /metrics on the admin listener only, and h2o's 413 as a JSON body. And two API edges:
logprob `bytes` of tokens that end inside a UTF-8 character, and a max_tokens of 2^64.

usage: access_test.py TANDEM_ROUTER FAKE_WORKER MODEL_DIR [scenario ...]
"""
import hashlib
import http.client
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import router_test as R  # noqa: E402 - its harness (Router, Proc, check), same argv
from router_test import check, wait_until, Fail  # noqa: E402

KEY_A, KEY_B, KEY_C, KEY_D = "tdk-alpha-0001", "tdk-bravo-0002", "tdk-charlie-03", "tdk-delta-04"


def line(key, rest):
    return "sha256:%s %s\n" % (hashlib.sha256(key.encode()).hexdigest(), rest)


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def bearer(k):
    return {"Authorization": "Bearer " + k}


def completion(rt, headers, **kw):
    body = {"prompt": "hi", "max_tokens": 4}
    body.update(kw)
    return rt.post("/v1/completions", body, headers=headers)


def sc_keys():
    keys = os.path.join(R.TMP, "keys")
    write(keys, "# test keys\n" + line(KEY_A, "tenant=team-a name=alice") +
          line(KEY_B, "tenant=team-b rpm=2") + line(KEY_C, "tenant=team-c") +
          "tenant team-c max_concurrent=1\n")
    rt = R.Router("keys", "--http.api_keys_file", keys, "--http.limit_window_s", "3",
                  "--http.tenant_header", "x-tenant", "--http.admin_listen", "127.0.0.1:0",
                  "--http.max_body", "4096")
    d = rt.worker("d1", "decode", "--tokens", "5,6,7,8", "--interval-ms", "5")
    # no key, a wrong key: 401 in OpenAI's shape, and Anthropic's on /v1/messages
    st, js, _, _ = completion(rt, {})
    check(st == 401 and js["error"]["code"] == "invalid_api_key" and
          js["error"]["type"] == "authentication_error", "no key: %d %r" % (st, js))
    st, js, _, _ = completion(rt, bearer("tdk-wrong"))
    check(st == 401 and "Incorrect API key" in js["error"]["message"], "wrong key: %r" % js)
    st, js, _, _ = rt.post("/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}]}, headers={"x-api-key": "tdk-wrong"})
    check(st == 401 and js["type"] == "error" and
          js["error"]["type"] == "authentication_error", "anthropic 401: %r" % js)
    # the key's hash (what the file holds) is not a key
    st, _, _, _ = completion(rt, bearer(line(KEY_A, "").split()[0]))
    check(st == 401, "the stored hash is refused as a key")
    # a valid key by either header; its tenant wins over the tenant header
    st, js, _, _ = completion(rt, dict(bearer(KEY_A), **{"x-tenant": "someone-else"}))
    check(st == 200 and js["choices"][0]["text"], "bearer key: %d %r" % (st, js))
    check(d.wait_line(r"decode_task .* tenant=team-a$"), "the key's tenant reached the worker")
    check(not d.has(r"tenant=someone-else"), "the header's tenant was not used")
    st, js, _, _ = completion(rt, {"x-api-key": KEY_A})
    check(st == 200, "x-api-key: %d" % st)
    st, js, _, _ = rt.post("/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}]}, headers={"x-api-key": KEY_A})
    check(st == 200 and js["type"] == "message", "x-api-key on /v1/messages: %d" % st)
    st, _, _, _ = rt.request("GET", "/v1/models", headers=bearer(KEY_A))
    check(st == 200, "models with a key")
    st, _, _, _ = rt.request("GET", "/v1/models")
    check(st == 401, "models without a key")
    # KEY_B: 2 requests per 3 s window
    seen = []
    for i in range(2):
        st, js, _, h = completion(rt, bearer(KEY_B))
        check(st == 200, "request %d within the limit: %d" % (i, st))
        seen.append(h)
    check(seen[0]["x-ratelimit-limit-requests"] == "2" and
          seen[0]["x-ratelimit-remaining-requests"] == "1" and
          seen[1]["x-ratelimit-remaining-requests"] == "0", "remaining counts down: %r" % seen)
    check(seen[1]["x-ratelimit-reset-requests"].endswith("s"), "reset is a duration")
    st, js, _, h = completion(rt, bearer(KEY_B))
    check(st == 429 and js["error"]["code"] == "rate_limit_exceeded" and
          js["error"]["type"] == "rate_limit_error", "over the limit: %d %r" % (st, js))
    check(h["x-ratelimit-remaining-requests"] == "0" and h["x-ratelimit-limit-requests"] == "2",
          "429 headers: %r" % h)
    ra = int(h["retry-after"])
    check(1 <= ra <= 2 and 0 < int(h["retry-after-ms"]) <= 1500, "Retry-After %r" % h)
    st, js, _, _ = rt.post("/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}]}, headers={"x-api-key": KEY_B})
    check(st == 429 and js["type"] == "error" and js["error"]["type"] == "rate_limit_error",
          "anthropic 429: %r" % js)
    time.sleep(int(h["retry-after-ms"]) / 1000.0 + 0.05)
    st, _, _, h = completion(rt, bearer(KEY_B))
    check(st == 200, "served again after Retry-After: %d" % st)
    # KEY_A has no limits: no x-ratelimit headers
    st, _, _, h = completion(rt, bearer(KEY_A))
    check(st == 200 and "x-ratelimit-limit-requests" not in h, "no limits, no headers")
    # team-c: one request in flight at a time
    res = {}

    def stream():
        res["r"] = rt.sse("/v1/completions", {"prompt": "hi", "max_tokens": 200, "stream": True},
                          headers=bearer(KEY_C))

    d2 = rt.worker("d2", "decode", "--tokens", ",".join(["9"] * 200), "--interval-ms", "10")
    th = threading.Thread(target=stream)
    th.start()
    time.sleep(0.4)
    st, js, _, h = completion(rt, bearer(KEY_C))
    check(st == 429 and js["error"]["code"] == "concurrency_limit_exceeded" and
          "retry-after" in h, "second concurrent request of team-c: %d %r" % (st, js))
    st, _, _, _ = completion(rt, bearer(KEY_A))
    check(st == 200, "another tenant is not capped: %d" % st)
    th.join(30)
    check(res["r"][0] == 200 and "[DONE]" in res["r"][1], "the first stream completed")
    st, _, _, _ = completion(rt, bearer(KEY_C))
    check(st == 200, "team-c served once its stream ended: %d" % st)
    d2.stop()
    # /metrics only on the admin listener; /health on both
    check(rt.admin_port, "the start line names the admin listener")
    st, _, _, _ = rt.request("GET", "/metrics")
    check(st == 404, "public /metrics: %d" % st)
    c = http.client.HTTPConnection("127.0.0.1", rt.admin_port, timeout=10)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read().decode()
    check(r.status == 200 and "tandem_time_to_first_token_seconds" in body, "admin /metrics")
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    check(r.status == 200, "admin /health")
    c.request("POST", "/v1/completions", body="{}")
    r = c.getresponse()
    r.read()
    check(r.status == 404, "the admin listener serves no API")
    c.close()
    # a body over http.max_body: h2o's 413, as an OpenAI-style JSON body
    st, js, raw, h = completion(rt, bearer(KEY_A), prompt="x" * 5000)
    check(st == 413 and h["content-type"] == "application/json" and
          js["error"]["code"] == "request_too_large" and "4096" in js["error"]["message"],
          "413 body: %r" % raw[:300])
    rt.stop()
    check(rt.p.returncode == 0, "router exit status %r" % rt.p.returncode)


def sc_reload():
    keys = os.path.join(R.TMP, "keys-reload")
    write(keys, line(KEY_A, "tenant=team-a"))
    rt = R.Router("reload", "--http.api_keys_file", keys)
    rt.worker("d1", "decode", "--tokens", ",".join(str(5 + i % 7) for i in range(200)),
              "--interval-ms", "10")
    # a stream of KEY_A on one connection, kept going across the reload
    c = rt.conn(30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "hi", "max_tokens": 200, "stream": True}),
        headers=dict(bearer(KEY_A), **{"Content-Type": "application/json"}))
    r = c.getresponse()
    check(r.status == 200, "stream started")
    first = r.readline()
    check(first.startswith(b"data: "), "first event %r" % first)
    write(keys, line(KEY_D, "tenant=team-d"))
    rt.p.send_signal(signal.SIGHUP)
    wait_until(lambda: "key file %s reloaded: 1 keys" % keys in rt.stderr(), 10, "reload log")
    st, _, _, _ = completion(rt, bearer(KEY_D))
    check(st == 200, "the added key works: %d" % st)
    st, _, _, _ = completion(rt, bearer(KEY_A))
    check(st == 401, "the removed key is refused: %d" % st)
    rest = first + r.read()
    c.close()
    events = R.parse_sse(rest.decode())
    check(events[-1][1] == "[DONE]", "the stream ended with [DONE]")
    n = sum(1 for _, e in events if e != "[DONE]" and e.get("choices") and
            e["choices"][0].get("text"))
    check(n == 200, "every token of the stream arrived across the reload: %d" % n)
    # a bad file: the old keys stay, the error names the file and line
    write(keys, line(KEY_D, "tenant=team-d") + "not a key line\n")
    rt.p.send_signal(signal.SIGHUP)
    wait_until(lambda: "%s:2: " % keys in rt.stderr(), 10, "reload error naming file:line")
    check("previous keys stay" in rt.stderr(), "the error says the old keys stay")
    st, _, _, _ = completion(rt, bearer(KEY_D))
    check(st == 200, "the old keys still work after a bad reload: %d" % st)
    os.unlink(keys)
    rt.p.send_signal(signal.SIGHUP)
    wait_until(lambda: rt.stderr().count("previous keys stay") == 2, 10, "missing file logged")
    st, _, _, _ = completion(rt, bearer(KEY_D))
    check(st == 200, "the old keys still work after the file vanished")
    rt.stop()
    check(rt.p.returncode == 0, "router exit status %r" % rt.p.returncode)


def sc_rotation():
    new = "rotated-secret-abcdefghijklmnop"
    prev = os.path.join(R.TMP, "secret-previous")
    write(prev, R.SECRET + "\n")
    rt = R.Router("rotation", "--cluster.secret", new, "--cluster.secret_previous_file", prev)
    ids = ",".join(["5", "6", "7"])
    # a worker and a client with the old secret, a worker and a client with the new one
    rt.worker("d-old", "decode", "--tokens", ids)
    check("d-old uses the previous cluster secret" in rt.stderr() or
          "from d-old uses the previous" in rt.stderr(), "the old secret is logged as such")
    w = R.Proc([R.FAKE, "--role", "decode", "--addr", rt.cluster, "--secret", new, "--id",
                "d-new", "--hb-ms", "150", "--tokens", ids], "d-new")
    w.wait_line("^ready$")
    wait_until(lambda: "worker d-new registered" in rt.stderr(), 10, "d-new registers")
    rc, out = rt.client("--generate", "hi", secret=R.SECRET)
    check(rc == 0, "client with the old secret: %d %s" % (rc, out))
    rc, out = rt.client("--generate", "hi", secret=new)
    check(rc == 0, "client with the new secret: %d %s" % (rc, out))
    # end of the rotation: the previous secret emptied, SIGHUP; old-secret newcomers are refused,
    # connections already made stay
    write(prev, "")
    rt.p.send_signal(signal.SIGHUP)
    wait_until(lambda: "cluster secret reloaded" in rt.stderr(), 10, "secret reload log")
    rc, out = rt.client("--generate", "hi", secret=R.SECRET)
    check(rc != 0, "client with the old secret after the rotation: refused")
    rc, out = rt.client("--generate", "hi", secret=new)
    check(rc == 0, "client with the new secret after the rotation: %d" % rc)
    late = R.Proc([R.FAKE, "--role", "decode", "--addr", rt.cluster, "--secret", R.SECRET,
                   "--id", "d-late", "--hb-ms", "150", "--tokens", ids], "d-late")
    wait_until(lambda: "authentication failed for id d-late" in rt.stderr(), 10,
               "a worker with the old secret refused after the rotation")
    late.stop()
    st, js, _, _ = rt.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})
    check(st == 200, "requests still served by the connected workers: %d" % st)
    st, js, _, _ = rt.request("GET", "/health")
    check(js["decode_workers"] == 2, "both workers still registered: %r" % js)
    rt.stop()


def sc_edges():
    """Logprob bytes of tokens that end inside a UTF-8 character; max_tokens of 2^64."""
    rt = R.Router("edges")
    text = "\U0001d518\U0001d52b\U0001d526 \u6570\u636e \U0001f642 \ua66e"
    ids = R.tokenize(rt, text)
    rt.worker("d1", "decode", "--tokens", R.ids_arg(ids))
    st, js, _, _ = rt.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": len(ids),
        "logprobs": True, "top_logprobs": 1})
    check(st == 200, "chat with logprobs: %d %r" % (st, js))
    content = js["choices"][0]["logprobs"]["content"]
    check(len(content) == len(ids), "one record per token")
    raw = b"".join(bytes(c["bytes"]) for c in content)
    check(raw == text.encode("utf-8"), "the tokens' bytes are the text's: %r" % raw)
    partial = [c["bytes"] for c in content if not valid_utf8(bytes(c["bytes"]))]
    check(partial, "some token ends inside a character (the case under test): %r" %
          [c["bytes"] for c in content])
    check(all(bytes(c["top_logprobs"][0]["bytes"]) == bytes(c["bytes"]) for c in content),
          "top_logprobs carry raw bytes too")
    # streamed: the same bytes
    st, raw_sse, events = rt.sse("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": len(ids),
        "logprobs": True, "stream": True})
    got = b""
    for _, e in events:
        if e != "[DONE]" and e.get("choices") and e["choices"][0].get("logprobs"):
            got += b"".join(bytes(c["bytes"]) for c in e["choices"][0]["logprobs"]["content"])
    check(got == text.encode("utf-8"), "streamed bytes: %r" % got)
    # max_tokens of 2^64: a 400 naming the field, the value echoed as sent
    for path, body in [("/v1/completions", '{"prompt":"hi","max_tokens":18446744073709551616}'),
                       ("/v1/messages", '{"messages":[{"role":"user","content":"x"}],'
                                        '"max_tokens":18446744073709551616}')]:
        st, js, raw, _ = rt.post(path, body)
        check(st == 400 and "18446744073709551616" in raw.decode(), "%s: %r" % (path, raw))
    st, js, _, _ = rt.post("/v1/completions", '{"prompt":"hi","max_tokens":18446744073709551616}')
    check(js["error"]["param"] == "max_tokens", "param names the field: %r" % js)
    rt.stop()


def valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


SCENARIOS = [("keys", sc_keys), ("reload", sc_reload), ("rotation", sc_rotation),
             ("edges", sc_edges)]


def main():
    only = set(sys.argv[4:])
    failed = []
    for name, fn in SCENARIOS:
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            fn()
            print("ok   %-12s %.1fs" % (name, time.time() - t0), flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure with context
            failed.append(name)
            print("FAIL %-12s %s: %s" % (name, type(e).__name__, e), flush=True)
            for p in [p for p in R.PROCS if isinstance(p, R.Router)][-1:]:
                print("---- %s stderr (tail)\n%s" % (p.name, p.stderr()[-3000:]))
        finally:
            for p in R.PROCS:
                p.stop()
            R.PROCS.clear()
    if failed:
        print("failed:", " ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()

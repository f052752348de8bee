#!/usr/bin/python3
"""cluster_access.py: access control on a real tandem cluster (router, prefill and decode
workers on loopback; cluster.py).

Usage: cluster_access.py BUILD_DIR MODEL_DIR

- the official openai and @anthropic-ai/sdk clients (tests/node/access_clients.js): a valid key
  by both headers, a wrong key 401, a key over its request limit 429 with the x-ratelimit-*
  headers, and the client's built-in retry served once the (short) window allows;
- SIGHUP reload adds one key and removes another while a stream on an existing connection
  keeps going to its last token;
- a cluster secret rotation with real workers: the router holds the new and the previous secret,
  a worker with each serves requests; the previous secret emptied and SIGHUP: newcomers with the
  old secret are refused, connected workers keep serving;
- /metrics on the admin listener only.
"""
import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD, LIMITED, ADDED = "tdk-good-key-0001", "tdk-limited-key-02", "tdk-added-key-0003"
RPM, WINDOW = 2, 3


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def wait_until(fn, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.05)
    fail("timed out waiting for " + what)


def key_line(key, rest):
    return "sha256:%s %s\n" % (hashlib.sha256(key.encode()).hexdigest(), rest)


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def router_log(cl):
    with open(cl.router.log_path) as f:
        return f.read()


def main():
    build, model = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    node = shutil.which("node")
    if not node or not os.path.isdir(os.path.join(ROOT, "tests", "node", "node_modules",
                                                  "openai")):
        print("SKIP: node or tests/node/node_modules missing (scripts/install-deps)")
        sys.exit(77)
    tmp = os.path.join(build, "tests", "cluster-access.%d" % os.getpid())
    os.makedirs(tmp, exist_ok=True)
    keys = os.path.join(tmp, "keys")
    write(keys, key_line(GOOD, "tenant=good") + key_line(LIMITED, "tenant=lim rpm=%d" % RPM))
    new_secret = os.path.join(tmp, "secret-new")
    write(new_secret, os.urandom(24).hex() + "\n")
    prev = os.path.join(tmp, "secret-previous")
    # the workers get cluster.py's secret file: the old secret of this rotation, which the
    # router holds as the previous one
    old = os.urandom(24).hex()
    write(prev, old + "\n")
    cl = None
    try:
        cl = C.Cluster(build, model, n_prefill=1, n_decode=1, secret=old, router_args=[
            "--http.api_keys_file", keys, "--http.limit_window_s", str(WINDOW),
            "--http.admin_listen", "127.0.0.1:0", "--cluster.secret_file", new_secret,
            "--cluster.secret_previous_file", prev])
        base = cl.http
        st, js, _ = cl.http_json("/v1/models", headers={"Authorization": "Bearer " + GOOD},
                                 method="GET")
        check(st == 200, "models with a key: %d %r" % (st, js))
        name = js["data"][0]["id"]
        r = subprocess.run([node, os.path.join(ROOT, "tests", "node", "access_clients.js"), base,
                            name, GOOD, LIMITED, str(RPM), str(WINDOW)], capture_output=True,
                           text=True, timeout=300)
        print(r.stdout, end="")
        check(r.returncode == 0, "official clients failed:\n%s" % r.stderr)
        reload_under_stream(cl, keys)
        admin(cl)
        rotation(cl, new_secret, prev)
        codes = cl.stop()
        check(all(c == 0 for c in codes.values()), "exit codes: %s" % codes)
    finally:
        C._kill_all()
    shutil.rmtree(tmp, ignore_errors=True)
    print("OK: keys, limits, reload, rotation and the admin listener on a real cluster")


def reload_under_stream(cl, keys):
    host, port = cl.http[len("http://"):].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "tandem", "max_tokens": 120, "stream": True, "temperature": 0,
         "ignore_eos": True}),
        headers={"Authorization": "Bearer " + GOOD, "Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, "stream: %d" % r.status)
    first = r.readline()
    check(first.startswith(b"data: "), "first event %r" % first)
    write(keys, key_line(ADDED, "tenant=added") + key_line(LIMITED, "tenant=lim rpm=%d" % RPM))
    cl.router.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "key file %s reloaded: 2 keys" % keys in router_log(cl), 10, "reload")
    st, _, _ = cl.http_json("/v1/completions", {"prompt": "hi", "max_tokens": 2},
                            headers={"Authorization": "Bearer " + ADDED})
    check(st == 200, "the added key: %d" % st)
    st, js, _ = cl.http_json("/v1/completions", {"prompt": "hi", "max_tokens": 2},
                             headers={"Authorization": "Bearer " + GOOD})
    check(st == 401, "the removed key: %d %r" % (st, js))
    raw = (first + r.read()).decode()
    c.close()
    events = [l[6:] for l in raw.split("\n") if l.startswith("data: ")]
    check(events[-1] == "[DONE]", "the stream ended with [DONE]: %r" % raw[-200:])
    chunks = [json.loads(e) for e in events[:-1]]
    check(not any("error" in ch for ch in chunks), "no error in the stream")
    fin = [ch["choices"][0]["finish_reason"] for ch in chunks if ch.get("choices")]
    check(fin[-1] in ("stop", "length"), "the stream finished: %r" % fin[-1:])
    print("ok - reload added and removed keys while a stream of %d events kept going" %
          len(chunks))


def admin(cl):
    port = cl.router.port("admin")
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    check("tandem_request_success_total" in text, "admin /metrics")
    st, _, _ = cl.http_json("/metrics", method="GET")
    check(st == 404, "public /metrics: %d" % st)
    print("ok - /metrics on the admin listener only")


def rotation(cl, new_secret, prev):
    # the workers started with the old secret (through the previous one)
    check("uses the previous cluster secret" in router_log(cl), "old-secret workers logged")
    w = cl.add_worker("decode", "d-new", ["--cluster.secret_file", new_secret])
    check(w.proc.poll() is None, "a worker with the new secret runs")
    cl.wait_workers(3)
    ok = 0
    for i in range(6):
        st, js, _ = cl.http_json("/v1/completions", {"prompt": "rotation %d" % i,
                                                     "max_tokens": 3},
                                 headers={"Authorization": "Bearer " + ADDED})
        ok += st == 200
    check(ok == 6, "requests during the rotation: %d of 6" % ok)
    # the rotation ends: nothing but the new secret
    write(prev, "")
    cl.router.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "cluster secret reloaded" in router_log(cl), 10, "secret reload")
    r = cl.ctl("status", check=False)
    check(r.returncode != 0, "tandem ctl with the old secret refused after the rotation")
    cl.secret_file = new_secret
    r = cl.ctl("status")
    check("d-new" in r.stdout and "d0" in r.stdout, "the connected workers stay: %s" % r.stdout)
    st, _, _ = cl.http_json("/v1/completions", {"prompt": "after", "max_tokens": 3},
                            headers={"Authorization": "Bearer " + ADDED})
    check(st == 200, "served after the rotation: %d" % st)
    print("ok - two cluster secrets during a rotation, one after it")


if __name__ == "__main__":
    main()

"""cluster.py: start a real tandem cluster (tandem-router, tandem-prefill, tandem-decode) on
loopback with random ports, for the end-to-end tests and benchmarks.

Every process is a real daemon started from the build directory; the data plane is whatever
UCX_TLS says (tcp, or sm for shared memory). Children die with the test (killed at exit).
"""
import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

ALL = []


def _kill_all():
    for p in ALL:
        if p.proc.poll() is None:
            p.proc.kill()


atexit.register(_kill_all)


class Daemon:
    """One daemon; its stdout is scanned for the `key=value` line it prints when ready."""

    def __init__(self, name, argv, env, ready_re, log_dir):
        self.name = name
        self.log_path = os.path.join(log_dir, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     text=True, bufsize=1)
        ALL.append(self)
        self.lines = []
        self.ready = threading.Event()
        self.fields = {}
        self.ready_re = re.compile(ready_re)
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self.log.write("[stdout] " + line)
            self.log.flush()
            if not self.ready.is_set() and self.ready_re.search(line):
                self.fields = dict(re.findall(r"(\w+)=(\S+)", line))
                self.ready.set()

    def wait_ready(self, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ready.wait(0.05):
                return self.fields
            if self.proc.poll() is not None:
                break
        raise RuntimeError("%s did not start (exit %s); log:\n%s" %
                           (self.name, self.proc.poll(), self.tail()))

    def tail(self, n=40):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def port(self, key):
        return int(self.fields[key].rsplit(":", 1)[1])

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise RuntimeError("%s did not exit within %d s of SIGTERM:\n%s" %
                               (self.name, timeout, self.tail()))

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Redis:
    """A private redis-server on loopback (the cluster KV index): no persistence, its own data
    directory, killed with the test. stop() and start() keep the port, so daemons reconnect."""

    def __init__(self, log_dir):
        self.dir = os.path.join(log_dir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.proc = None
        self.start()

    def start(self, timeout=10):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ALL.append(self)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.cmd("PING") == "PONG":
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start on port %d" % self.port)

    def stop(self):
        """SIGKILL: Redis gone at once, its data with it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cmd(self, *args):
        """One command over RESP; an integer, a string, or a list of strings."""
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as c:
            c.sendall(out)
            f = c.makefile("rb")
            return self._reply(f)

    def kv_set(self, wid, ns="tandem:kv"):
        """Worker `wid`'s set in the cluster KV index replayed (td_kvredis.h: a 16-byte header,
        then 18-byte records op, tier, hash): {hash hex: tier}, or None when it has no set."""
        raw = self.cmd("GET", "%s:set:%s" % (ns, wid))
        if raw is None:
            return None
        if raw[:8] != b"TDKVSET1" or (len(raw) - 16) % 18:
            raise RuntimeError("redis: %s's set is malformed (%d bytes)" % (wid, len(raw)))
        out = {}
        for i in range(16, len(raw), 18):
            op, tier, h = raw[i], raw[i + 1], raw[i + 2:i + 18].hex()
            if op == 1:
                out[h] = tier
            elif op == 2:
                out.pop(h, None)
        return out

    def _reply(self, f):
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)[:n]
            return data
        if kind == b"*":
            return [self._reply(f) for _ in range(int(rest))]
        raise RuntimeError("redis: bad reply %r" % line)


class Cluster:
    """A router plus prefill and decode workers of one model; with redis=True also a private
    redis-server, and every daemon gets --kv.redis (the cluster KV index)."""

    def __init__(self, build, model, n_prefill=1, n_decode=1, ucx_tls="tcp", router_args=(),
                 worker_args=(), prefill_args=(), decode_args=(), engine_threads=1, n_routers=1,
                 redis=False, secret=None):
        self.build = build
        self.model = model
        self.dir = tempfile.mkdtemp(prefix="tandem-cluster-")
        self.redis = Redis(self.dir) if redis else None
        if self.redis:
            router_args = list(router_args) + ["--kv.redis", self.redis.addr]
            worker_args = list(worker_args) + ["--kv.redis", self.redis.addr]
        self.router_args = list(router_args)
        self.secret_file = os.path.join(self.dir, "secret")
        with open(self.secret_file, "w") as f:
            f.write((secret or os.urandom(24).hex()) + "\n")
        self.env = dict(os.environ)
        self.env["UCX_TLS"] = ucx_tls
        self.env.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        self.env["TANDEM_CLUSTER_SECRET"] = ""
        self.router = Daemon("router", [
            os.path.join(build, "router", "tandem-router"), "--model", model,
            "--http.listen", "127.0.0.1:0", "--rpc.listen", "127.0.0.1:0",
            "--cluster.listen", "127.0.0.1:0", "--cluster.secret_file", self.secret_file,
            "--cluster.heartbeat_timeout_s", "1.5"] + list(router_args),
            self.env, r"cluster=", self.dir)
        self.router.wait_ready()
        self.http = "http://127.0.0.1:%d" % self.router.port("http")
        self.rpc = "127.0.0.1:%d" % self.router.port("rpc")
        self.cluster_addr = "127.0.0.1:%d" % self.router.port("cluster")
        self.routers = [self.router]
        for i in range(1, n_routers):  # more routers side by side; they share nothing
            r = Daemon("router%d" % i, [
                os.path.join(build, "router", "tandem-router"), "--model", model,
                "--http.listen", "127.0.0.1:0", "--rpc.listen", "127.0.0.1:0",
                "--cluster.listen", "127.0.0.1:0", "--cluster.secret_file", self.secret_file,
                "--router_id", "router%d" % i, "--cluster.heartbeat_timeout_s", "1.5"] +
                list(router_args), self.env, r"cluster=", self.dir)
            r.wait_ready()
            self.routers.append(r)
            self.cluster_addr += ",127.0.0.1:%d" % r.port("cluster")
        self.workers = {}
        self.worker_args = list(worker_args)
        self.engine_threads = engine_threads
        for i in range(n_prefill):
            self.add_worker("prefill", "p%d" % i, list(prefill_args))
        for i in range(n_decode):
            self.add_worker("decode", "d%d" % i, list(decode_args))
        self.wait_workers(n_prefill + n_decode)

    def restart_router(self):
        """SIGKILL the (first) router and start a new one on the same three ports: the workers
        reconnect to it as after a crash."""
        old = self.router
        old.kill()
        self.router = Daemon("router-restarted", [
            os.path.join(self.build, "router", "tandem-router"), "--model", self.model,
            "--http.listen", "127.0.0.1:%d" % old.port("http"),
            "--rpc.listen", "127.0.0.1:%d" % old.port("rpc"),
            "--cluster.listen", "127.0.0.1:%d" % old.port("cluster"),
            "--cluster.secret_file", self.secret_file,
            "--cluster.heartbeat_timeout_s", "1.5"] + self.router_args,
            self.env, r"cluster=", self.dir)
        self.router.wait_ready()
        self.routers[0] = self.router
        return self.router

    def add_worker(self, role, wid, extra=()):
        d = Daemon(wid, [
            os.path.join(self.build, role, "tandem-" + role), "--model", self.model, "--id", wid,
            "--routers", self.cluster_addr, "--cluster.secret_file", self.secret_file,
            "--http.listen", "127.0.0.1:0", "--engine.threads", str(self.engine_threads),
            "--heartbeat_s", "0.2", "--kv.memory", "64M"] + self.worker_args + list(extra),
            self.env, r"tandem-%s: id=" % role, self.dir)
        d.wait_ready()
        self.workers[wid] = d
        return d

    def ctl(self, *args, timeout=300, check=True):
        env = dict(self.env)
        r = subprocess.run([os.path.join(self.build, "tools", "tandem"), "ctl", "--router",
                            self.rpc, "--secret-file", self.secret_file] + list(args),
                           capture_output=True, text=True, timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise RuntimeError("tandem ctl %s failed (%d): %s" % (args, r.returncode, r.stderr))
        return r

    def status(self):
        """{worker_id: (alive, assigned, draining)} from `tandem ctl status`."""
        out = {}
        for line in self.ctl("status").stdout.splitlines()[2:]:
            f = line.split()
            if len(f) >= 9:
                out[f[0]] = {"role": f[1], "alive": f[2] == "yes", "draining": f[3] == "yes",
                             "assigned": int(f[7])}
        return out

    def wait_workers(self, n, timeout=30):
        end = time.monotonic() + timeout
        st = {}
        while time.monotonic() < end:
            st = self.status()
            if sum(1 for w in st.values() if w["alive"]) >= n:
                return st
            time.sleep(0.1)
        raise RuntimeError("only %s registered:\n%s" % (st, self.router.tail()))

    def batch(self, requests, timeout=600):
        """Run requests (dicts, `tandem ctl batch` lines) at once; returns one result each."""
        path = os.path.join(self.dir, "batch-%d.jsonl" % time.monotonic_ns())
        with open(path, "w") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
        r = self.ctl("--timeout", str(timeout), "batch", path, timeout=timeout + 30)
        return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]

    def http_json(self, path, body=None, headers=None, method=None, timeout=120):
        """(status, parsed JSON or text) of one HTTP request to the router."""
        data = None if body is None else (body if isinstance(body, bytes) else
                                          json.dumps(body).encode())
        req = urllib.request.Request(self.http + path, data=data, method=method,
                                     headers=dict({"Content-Type": "application/json"},
                                                  **(headers or {})))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw, status, hdrs = r.read(), r.status, r.headers
        except urllib.error.HTTPError as e:
            raw, status, hdrs = e.read(), e.code, e.headers
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw.decode("utf-8", "replace"), hdrs

    def metrics_text(self, wid=None):
        """The /metrics text of worker `wid`, or of the (first) router when None."""
        port = (self.workers[wid] if wid else self.router).port("http")
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def worker_metric(self, wid, name, labels=""):
        """Sum of a metric's samples on one worker's /metrics (those whose labels include
        `labels`, e.g. 'tier="disk"', when given)."""
        text = self.metrics_text(wid)
        total = 0.0
        for line in text.splitlines():
            if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                    labels in line.rsplit(" ", 1)[0]:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        """SIGTERM every daemon (workers first); returns {name: exit status}."""
        codes = {}
        for wid, d in self.workers.items():
            codes[wid] = d.stop() if d.proc.poll() is None else d.proc.returncode
        for r in self.routers:
            codes[r.name] = r.stop()
        if self.redis:
            self.redis.stop()
        if all(c == 0 for c in codes.values()):
            shutil.rmtree(self.dir, ignore_errors=True)  # logs are kept when something failed
        return codes


def offline_generate(build, model, req):
    """Token ids that `tandem generate` (one process, no cluster) produces for a batch line."""
    argv = [os.path.join(build, "tools", "tandem"), "generate", model, "--threads", "1", "--json"]
    if "prompt_ids" in req:
        argv += ["--prompt-ids", ",".join(map(str, req["prompt_ids"]))]
    elif "messages" in req:
        argv += ["--messages", json.dumps(req["messages"])]
    else:
        argv += ["--prompt", req["prompt"]]
    argv += ["--max-tokens", str(req.get("max_tokens", 16))]
    for k, flag in (("temperature", "--temperature"), ("top_k", "--top-k"), ("top_p", "--top-p"),
                    ("min_p", "--min-p"), ("seed", "--seed"),
                    ("presence_penalty", "--presence-penalty"),
                    ("frequency_penalty", "--frequency-penalty"),
                    ("repetition_penalty", "--repetition-penalty"), ("min_tokens", "--min-tokens")):
        if k in req:
            argv += [flag, str(req[k])]
    if req.get("logit_bias"):
        argv += ["--logit-bias", ",".join("%s:%s" % kv for kv in req["logit_bias"].items())]
    if req.get("ignore_eos"):
        argv.append("--ignore-eos")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("tandem generate failed: %s" % r.stderr)
    return json.loads(r.stdout)["ids"]

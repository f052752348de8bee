#!/usr/bin/python3
"""netns_test.py: the cluster on separate hosts, a decode worker's link cut mid-stream and healed.

Usage: netns_test.py BUILD_DIR [MODEL_DIR]

The router, a prefill worker and two decode workers each run in their own network namespace
(made by this test, names carrying its pid), each with one address in 10.213.0.0/24 on a veth
whose other end is a port of a bridge in a fifth namespace (the switch). Nothing is added to the
root namespace: the test itself moves into the router's namespace and is the client there.
The data plane is UCX over TCP only (UCX_TLS=tcp, UCX_NET_DEVICES=the veth), as between
machines: no shared memory, no loopback.

  1. 10 greedy streams of 128 tokens; once d0 streams, its switch port goes down (the cable
     pulled: no FIN, no RST, silence both ways). Every stream completes with exactly the tokens
     `tandem generate` gives; the first migration comes within the heartbeat window plus a margin.
  2. The link stays down at least CUT_S seconds (long past the streams' end) and comes back up
     just after p0's kernel retransmitted, into the cut, what UCX had sent d0 on the endpoint
     that saw it (read from `ss` in p0's namespace): that endpoint would now be silent for a whole
     backoff period (~26 s). d0 registers again (`tandem ctl workers --json`) and, with d1
     drained, serves a new request prefilled on p0, identical to `tandem generate`, within
     FIRST_MAX_S: its KV handoff goes on a fresh endpoint (d0 started a new data-plane epoch when
     it registered again), not on the stale one (docs/reliability.md).
  3. SIGTERM: every daemon exits 0 (nothing hangs on the endpoint that saw the cut).

Exit 77 (with the reason) where namespaces cannot be made: not root, no `ip`, no netns or veth or
bridge support. Everything the test made is removed on exit, on failure too.
"""
import ctypes
import json
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402
import harness as T  # noqa: E402

NET = "10.213.0."
DEV = "tdnet0"         # the veth end inside each host namespace (names are per namespace)
HB = 1.5               # --cluster.heartbeat_timeout_s
MARGIN = 4.0           # a loaded 2-core machine: sweep period, scheduling, UCX teardown
# The cut lasts at least this long, then until p0's TCP connection to d0 retransmits once more:
# TCP resends what UCX sent into the cut (its keepalives, every 0.5 s) after ~0.2 s doubling,
# the 7th time 26-28 s after the cut, the 8th ~26 s after that; healed just after one, an
# endpoint that saw the cut is silent for a whole backoff period.
CUT_S = 20.0
CUT_MAX_S = 40.0       # heal by then whatever the kernel did
# The first request after the heal (prefill on p0, KV handoff to d0, 64 tokens) within this; on
# the endpoint that saw the cut (main before the data-plane epoch) it took ~26 s.
FIRST_MAX_S = 5.0
PFX = "td%d" % os.getpid()
HOSTS = {"r": 1, "p0": 2, "d0": 3, "d1": 4}   # host -> last octet
SW = PFX + "-sw"
MADE = []              # namespaces made, deleted in reverse at exit


def ns(host):
    return "%s-%s" % (PFX, host)


def ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r


def skip(why):
    print("SKIP:", why)
    sys.exit(77)


def probe():
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if not shutil.which("ip") or not shutil.which("ss"):
        return "no `ip` or `ss` (iproute2)"
    a, b = PFX + "-pa", PFX + "-pb"
    try:
        for step in (["netns", "add", a], ["netns", "add", b],
                     ["-n", a, "link", "add", "br0", "type", "bridge"],
                     ["-n", a, "link", "add", "pa", "type", "veth", "peer", "name", DEV,
                      "netns", b]):
            r = ip(*step, check=False)
            if r.returncode != 0:
                return "`ip %s` failed: %s" % (" ".join(step), r.stderr.strip())
        return None
    finally:
        ip("netns", "del", a, check=False)
        ip("netns", "del", b, check=False)


def cleanup():
    C._kill_all()
    for p in C.ALL:
        try:
            p.proc.wait(5)
        except Exception:
            pass
    while MADE:
        ip("netns", "del", MADE.pop(), check=False)


def make_net():
    """The switch (a bridge) and one namespace per host, each with its veth to the switch."""
    ip("netns", "add", SW)
    MADE.append(SW)
    ip("-n", SW, "link", "add", "br0", "type", "bridge")
    ip("-n", SW, "link", "set", "br0", "up")
    for host, octet in HOSTS.items():
        name = ns(host)
        ip("netns", "add", name)
        MADE.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", SW, "link", "add", "p-" + host, "type", "veth", "peer", "name", DEV,
           "netns", name)
        ip("-n", SW, "link", "set", "p-" + host, "master", "br0", "up")
        ip("-n", name, "addr", "add", NET + "%d/24" % octet, "dev", DEV)
        ip("-n", name, "link", "set", DEV, "up")


def enter(name):
    """Move this process (its main thread, before any other thread exists) into namespace
    `name`: threads and children started afterwards are there too."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/run/netns/" + name, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns " + name)
    finally:
        os.close(fd)


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


class NetCluster(C.Cluster):
    """cluster.py's Cluster with every daemon in its host's namespace, on its host's address.
    Only the constructor differs: ctl, status, batch, metrics use the addresses set here."""

    def __init__(self, build, model, router_args=(), decode_args=()):
        self.build, self.model = build, model
        self.dir = tempfile.mkdtemp(prefix="tandem-netns-")
        self.redis = None
        self.secret_file = os.path.join(self.dir, "secret")
        with open(self.secret_file, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        self.env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=DEV,
                        UCX_WARN_UNUSED_ENV_VARS="n", TANDEM_CLUSTER_SECRET="")
        self.router_args = list(router_args)
        ra = NET + "1"
        self.router = C.Daemon("router", [
            "ip", "netns", "exec", ns("r"),
            os.path.join(build, "router", "tandem-router"), "--model", model,
            "--http.listen", ra + ":0", "--rpc.listen", ra + ":0",
            "--cluster.listen", ra + ":0", "--cluster.secret_file", self.secret_file,
            "--cluster.heartbeat_timeout_s", str(HB)] + self.router_args,
            self.env, r"cluster=", self.dir)
        self.router.wait_ready()
        self.routers = [self.router]
        self.http = "http://%s:%d" % (ra, self.router.port("http"))
        self.rpc = "%s:%d" % (ra, self.router.port("rpc"))
        self.cluster_addr = "%s:%d" % (ra, self.router.port("cluster"))
        self.workers = {}
        self.worker_args = []
        self.engine_threads = 1
        for host in ("p0", "d0", "d1"):
            role = "prefill" if host.startswith("p") else "decode"
            self.workers[host] = C.Daemon(host, [
                "ip", "netns", "exec", ns(host),
                os.path.join(build, role, "tandem-" + role), "--model", model, "--id", host,
                "--routers", self.cluster_addr, "--cluster.secret_file", self.secret_file,
                "--http.listen", NET + "%d:0" % HOSTS[host], "--engine.threads", "1",
                "--heartbeat_s", "0.2", "--kv.memory", "64M"] +
                (list(decode_args) if role == "decode" else []),
                self.env, r"tandem-%s: id=" % role, self.dir)
        for d in self.workers.values():
            d.wait_ready()
        self.wait_workers(3)

    def metrics_text(self, wid=None):
        d = self.workers[wid] if wid else self.router
        host = NET + str(HOSTS[wid] if wid else 1)
        with urllib.request.urlopen("http://%s:%d/metrics" % (host, d.port("http")),
                                    timeout=10) as r:
            return r.read().decode()


def retransmits(host, dst):
    """The retransmission count of `host`'s TCP connection to `dst` whose retransmission timer
    runs (ss's `timer:(on,<left>,<count>)`), or None when none has one."""
    r = subprocess.run(["ip", "netns", "exec", ns(host), "ss", "-tino", "dst", dst],
                       capture_output=True, text=True, timeout=10)
    m = re.search(r"timer:\(on,[^,]*,(\d+)\)", r.stdout)
    return int(m.group(1)) if m else None


def heal_after_retransmit(t_cut):
    """Wait until CUT_S after the cut, then until p0 retransmits toward d0 (or CUT_MAX_S).
    Returns what was seen, for the log."""
    time.sleep(max(0.0, CUT_S - (time.monotonic() - t_cut)))
    first = retransmits("p0", NET + str(HOSTS["d0"]))
    if first is None:
        return "no retransmission pending on p0 toward d0"
    while time.monotonic() - t_cut < CUT_MAX_S:
        n = retransmits("p0", NET + str(HOSTS["d0"]))
        if n is not None and n != first:
            return "healed just after p0's retransmission #%d toward d0" % n
        time.sleep(0.05)
    return "p0 did not retransmit toward d0 within %.0f s" % CUT_MAX_S


def workers_json(cl):
    return {w["id"]: w for w in json.loads(cl.ctl("workers", "--json").stdout)["workers"]}


def run(build, model, cfg):
    rng = random.Random(213)
    reqs = [{"prompt_ids": [rng.randrange(cfg["vocab_size"]) for _ in range(rng.randint(8, 40))],
             "max_tokens": 128, "ignore_eos": True, "temperature": 0} for _ in range(10)]
    extra = {"prompt_ids": [rng.randrange(cfg["vocab_size"]) for _ in range(32)],
             "max_tokens": 64, "ignore_eos": True, "temperature": 0}
    t0 = time.monotonic()
    want = [None] * (len(reqs) + 1)

    def offline(i):
        want[i] = T.offline_json(build, model, (reqs + [extra])[i])["ids"]
    ths = [threading.Thread(target=offline, args=(i,)) for i in range(len(want))]
    for k in range(0, len(ths), 2):
        for th in ths[k:k + 2]:
            th.start()
        for th in ths[k:k + 2]:
            th.join()
    T.check(all(want), "tandem generate gave no answer for some request")
    print("offline: %d requests in %.1f s" % (len(want), time.monotonic() - t0))

    make_net()
    enter(ns("r"))
    # prompts over 24 tokens are prefilled on p0 and their KV crosses the switch over UCX/TCP
    cl = NetCluster(build, model, router_args=["--placement.local_prefill_tokens", "24",
                                               "--placement.policy", "least_loaded"])
    print("cluster up: router %s, workers %s (UCX_TLS=tcp on %s)" %
          (cl.rpc, ", ".join(cl.workers), DEV))

    # 1. d0's cable pulled mid-stream
    m0 = T.router_counter(cl, "tandem_request_migrations_total")
    g0 = cl.worker_metric("d0", "tandem_generation_tokens_total")
    res = {}
    th = threading.Thread(target=lambda: res.update(out=cl.batch(reqs, timeout=300)))
    th.start()
    T.wait_for(lambda: cl.worker_metric("d0", "tandem_num_requests_running") > 0 and
               cl.worker_metric("d0", "tandem_generation_tokens_total") > g0 + 60, 120,
               "d0 to stream tokens")
    ip("-n", SW, "link", "set", "p-d0", "down")
    t_cut = time.monotonic()
    T.wait_for(lambda: T.router_counter(cl, "tandem_request_migrations_total") > m0, 60,
               "a migration after d0's link was cut")
    dt = time.monotonic() - t_cut
    th.join(300)
    T.check(not th.is_alive(), "the streams hung after d0's link was cut")
    t_done = time.monotonic() - t_cut
    out = res["out"]
    T.check(len(out) == len(reqs), "%d results for %d requests" % (len(out), len(reqs)))
    bad = [i for i, g in enumerate(out) if g["error"] or g["ids"] != want[i]]
    for i in bad[:4]:
        print("request %d differs: error %r\n  got  %s\n  want %s" %
              (i, out[i]["error"], out[i]["ids"][:40], want[i][:40]))
    T.check(not bad, "%d of %d streams failed or differ from tandem generate after the cut" %
            (len(bad), len(reqs)))
    migrated = T.router_counter(cl, "tandem_request_migrations_total") - m0
    T.check(dt <= HB + MARGIN, "first migration %.2f s after the cut (heartbeat window %.1f s "
            "+ %.1f s)" % (dt, HB, MARGIN))
    T.check(cl.worker_metric("p0", "tandem_prompt_tokens_total") > 0,
            "p0 prefilled nothing: no KV crossed between namespaces")
    st = workers_json(cl)
    T.check(not st.get("d0", {}).get("alive"), "d0 still alive on the router while cut off: %s" %
            st.get("d0"))
    print("link cut: %d streams identical to tandem generate, %d sequences migrated, first "
          "%.2f s after the cut, all done %.2f s after it" % (len(reqs), migrated, dt, t_done))

    # 2. healed after CUT_S and p0's next retransmission: d0 registers again and serves, its
    # first KV handoff fast
    seen = heal_after_retransmit(t_cut)
    ip("-n", SW, "link", "set", "p-d0", "up")
    cut_s = time.monotonic() - t_cut
    t_heal = time.monotonic()
    T.wait_for(lambda: workers_json(cl).get("d0", {}).get("alive"), HB + 30,
               "d0 to register again after its link came back")
    dt_rejoin = time.monotonic() - t_heal
    cl.ctl("drain", "d1")
    g0 = cl.worker_metric("d0", "tandem_generation_tokens_total")
    p_before = cl.worker_metric("p0", "tandem_prompt_tokens_total")
    t_req = time.monotonic()
    got = cl.batch([extra], timeout=120)
    t_req = time.monotonic() - t_req
    T.check(len(got) == 1 and not got[0]["error"] and got[0]["ids"] == want[-1],
            "after the heal: %r, want %s" % (got, want[-1][:20]))
    g1 = cl.worker_metric("d0", "tandem_generation_tokens_total")
    T.check(g1 >= g0 + len(want[-1]) - 1, "d0 generated %d tokens of the new request" % (g1 - g0))
    p_after = cl.worker_metric("p0", "tandem_prompt_tokens_total")
    T.check(p_after >= p_before + len(extra["prompt_ids"]) - 1,
            "the request after the heal was not prefilled on p0 (no KV handoff to d0)")
    # the next handoff too, once the retired endpoints are closed (a 1 s grace)
    time.sleep(2)
    k = max(range(len(reqs)), key=lambda i: len(reqs[i]["prompt_ids"]))
    t_next = time.monotonic()
    got = cl.batch([dict(reqs[k], max_tokens=16)], timeout=120)
    t_next = time.monotonic() - t_next
    T.check(len(got) == 1 and not got[0]["error"] and got[0]["ids"] == want[k][:16],
            "the next request after the heal: %r, want %s" % (got, want[k][:16]))
    cl.ctl("undrain", "d1")
    retired = {h: open(cl.workers[h].log_path).read().count("endpoint retired")
               for h in ("p0", "d0")}
    print("healed after a %.1f s cut (%s): d0 registered again %.2f s after the link came up "
          "and served a new request prefilled on p0 in %.2f s (%d tokens, identical to tandem "
          "generate), the next in %.2f s; endpoints retired: %s" %
          (cut_s, seen, dt_rejoin, t_req, g1 - g0, t_next, retired))
    T.check(t_req <= FIRST_MAX_S, "the first request after the heal took %.2f s (at most %.1f "
            "s: its KV handoff waited on the endpoint that saw the cut?)" % (t_req, FIRST_MAX_S))
    T.check(t_next <= FIRST_MAX_S, "the next request after the heal took %.2f s (at most %.1f "
            "s)" % (t_next, FIRST_MAX_S))

    # 3. clean exit
    codes = cl.stop()
    T.check(all(c == 0 for c in codes.values()), "exit codes after SIGTERM: %s" % codes)
    print("OK: separate hosts, link cut and healed; exit codes %s" % codes)


def main():
    build = os.path.abspath(sys.argv[1])
    if len(sys.argv) > 2:
        T.MODEL = os.path.abspath(sys.argv[2])
    why = probe()
    if why:
        skip(why)
    model, cfg = T.make_model(build, "deepseek_v3")
    # meson's timeout sends SIGTERM: unwind through finally so the namespaces go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(1))
    try:
        run(build, model, cfg)
    finally:
        cleanup()


if __name__ == "__main__":
    main()

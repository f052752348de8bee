#!/usr/bin/python3
"""index_rebuild.py: how fast a restarted tandem-router has the cluster KV index back.

Usage: bench/index_rebuild.py BUILD_DIR [--blocks 1000000] [--workers 8] [--reps 5]
                              [--limit-ms 1000]

Starts a private redis-server, writes --blocks blocks spread over --workers workers' sets into
it exactly as workers write them (td_kvredis.h: one string per worker, a 16-byte header with the
epoch, then 18-byte add records; the worker ids in <ns>:workers), then starts a real
tandem-router with --kv.redis pointing there, --reps times, and reads from its /metrics when the
mirror holds every block: `tandem_kv_index_rebuild_seconds` (the router's own time from sending
the first read to the last block in its table) and the wall time from exec to that point (the
process start and model metadata included). Prints each against --limit-ms (the issue's "well
under a second for 1M blocks") and Redis's memory per block. Exits 1 when the median rebuild
passes the limit.
"""
import argparse
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402


def bench_model(build):
    model = os.path.join(build, "bench-scale-model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch",
                        "deepseek_v3", "--preset", "tiny", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     "tokenizer-deepseek_v3", "models"), "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
    return model


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def redis_info(r, key):
    info = r.cmd("INFO", "memory").decode()
    for line in info.splitlines():
        if line.startswith(key + ":"):
            return int(line.split(":")[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--blocks", type=int, default=1000000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit-ms", type=float, default=1000.0)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    model = bench_model(build)
    tmp = tempfile.mkdtemp(prefix="tandem-index-bench-")
    r = C.Redis(tmp)
    try:
        mem0 = redis_info(r, "used_memory")
        rng = random.Random(1)
        per = a.blocks // a.workers
        t0 = time.monotonic()
        for w in range(a.workers):
            n = per if w < a.workers - 1 else a.blocks - per * (a.workers - 1)
            recs = bytearray(b"TDKVSET1" + struct.pack("<Q", rng.getrandbits(64) | 1))
            body = rng.randbytes(16 * n)
            for i in range(n):
                recs += b"\x01\x00" + body[16 * i:16 * i + 16]
            r.cmd("SET", "tandem:kv:set:w%02d" % w, bytes(recs))
            r.cmd("SADD", "tandem:kv:workers", "w%02d" % w)
        mem = redis_info(r, "used_memory") - mem0
        print("# machine: %d cores, load %s" % (os.cpu_count(),
                                                 " ".join(open("/proc/loadavg").read().split()[:3])))
        print("# redis-server %s; %d blocks over %d workers' sets written in %.1f s; Redis memory "
              "%.1f bytes/block" % (r.cmd("INFO", "server").decode().split("redis_version:")[1]
                                    .split()[0], a.blocks, a.workers, time.monotonic() - t0,
                                    mem / a.blocks))
        secret = os.path.join(tmp, "secret")
        with open(secret, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        env = dict(os.environ, TANDEM_CLUSTER_SECRET="")
        rebuilds, walls = [], []
        for rep in range(a.reps):
            t_exec = time.monotonic()
            d = C.Daemon("router%d" % rep, [
                os.path.join(build, "router", "tandem-router"), "--model", model,
                "--http.listen", "127.0.0.1:0", "--rpc.listen", "127.0.0.1:0",
                "--cluster.listen", "127.0.0.1:0", "--cluster.secret_file", secret,
                "--kv.redis", r.addr], env, r"cluster=", tmp)
            d.wait_ready()
            url = "http://127.0.0.1:%d/metrics" % d.port("http")
            rebuild = None
            while time.monotonic() - t_exec < 60:
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                if metric(text, "tandem_kv_index_blocks") == a.blocks and \
                        metric(text, "tandem_kv_index_rebuild_seconds"):
                    rebuild = metric(text, "tandem_kv_index_rebuild_seconds")
                    break
                time.sleep(0.005)
            wall = time.monotonic() - t_exec
            ix_bytes = metric(text, "tandem_kv_index_bytes") or 0
            d.stop()
            if rebuild is None:
                sys.exit("router %d did not mirror %d blocks within 60 s" % (rep, a.blocks))
            rebuilds.append(rebuild * 1e3)
            walls.append(wall * 1e3)
            print("rep %d: rebuild %.0f ms (%.2f of the %.0f ms limit); exec to index complete "
                  "%.0f ms; router index %.1f bytes/block" %
                  (rep, rebuild * 1e3, rebuild * 1e3 / a.limit_ms, a.limit_ms, wall * 1e3,
                   ix_bytes / a.blocks))
        med = statistics.median(rebuilds)
        print("## %d blocks: median rebuild %.0f ms = %.2f x the %.0f ms limit (min %.0f, max "
              "%.0f); median exec-to-complete %.0f ms; load after %s" %
              (a.blocks, med, med / a.limit_ms, a.limit_ms, min(rebuilds), max(rebuilds),
               statistics.median(walls), " ".join(open("/proc/loadavg").read().split()[:3])))
        return 0 if med < a.limit_ms else 1
    finally:
        r.stop()
        C._kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

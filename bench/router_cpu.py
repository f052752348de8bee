#!/usr/bin/python3
"""router_cpu.py: the router's CPU cost per routed request, with SIMULATED workers.

Usage: bench/router_cpu.py BUILD_DIR [--num-prompts 3000] [--input-len 64] [--output-len 4]
                           [--backend openai,rpc] [--decode 2] [--prefill 1] [--rate inf]

One tandem-router and --prefill + --decode workers started with `--engine.kind sim` (the
SIMULATED engine: no model math; each step costs the sim.* latency model, here a few microseconds,
so the workers are never what limits the rate; KV reservation, the UCX transfer of each prompt's
KV, routing and streaming are the real code). `tandem bench` sends --num-prompts requests of
--input-len random tokens and --output-len generated tokens (ignore_eos) through each --backend
(openai: HTTP /v1/completions with SSE; rpc: the router's protobuf RPC), with --max-concurrency
64 at --rate. The router's user+system CPU seconds are read from /proc/PID/stat before and after
each run.

Printed per backend: router CPU microseconds per request and its ratio to the 50 us limit, the
rate one router core could sustain at that cost (1e6 / us-per-request) and its ratio to the
5,000 requests/s target, the rate the run actually reached (bounded on a small machine by the
load generator and the workers sharing the cores with the router), the cost split into user and
system (kernel) microseconds, and the router's read-like and write-like system calls per request
(/proc/PID/io: an SSE stream costs a write per loop iteration in which it had tokens, on its own
connection; RPC streams share one connection and one write per iteration); then the SIMULATED
workers' CPU microseconds per request, prefill and decode workers each summed (their own code:
admission, KV reservation and transfer, the sampler, frames; no model math), which bound the rate
the closed loop reaches.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402

LIMIT_US = 50.0
TARGET_RPS = 5000.0


def cpu_s(pid):
    """(user, system) CPU seconds of pid."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # utime, stime


def io_calls(pid):
    """(read-like, write-like) system calls of pid so far (/proc/PID/io syscr, syscw: read,
    recv*, readv / write, writev, send*)."""
    v = {}
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            k, _, n = line.partition(":")
            v[k] = int(n)
    return v["syscr"], v["syscw"]


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--num-prompts", type=int, default=3000)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--backend", default="openai,rpc")
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--rate", default="inf")
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    model = os.path.join(build, "tests", "integration", "model-deepseek_v3")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run(["ninja", "-C", build, "tests/integration/model-deepseek_v3.stamp"],
                       check=True, stdout=subprocess.DEVNULL)
    sim = ["--engine.kind", "sim", "--sim.step_us", "5", "--sim.prefill_us_per_token", "0",
           "--sim.decode_us_per_seq", "0", "--sim.decode_us_per_ctx_token", "0"]
    print("# machine: %d cores, load %s, %s" % (os.cpu_count(), load(),
                                              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    print("# command: bench/router_cpu.py %s" % " ".join(sys.argv[2:]) if sys.argv[2:] else
          "# command: bench/router_cpu.py BUILD")
    print("# SIMULATED workers: %d prefill + %d decode, %d-token prompts, %d output tokens, "
          "concurrency %d, rate %s" % (a.prefill, a.decode, a.input_len, a.output_len,
                                        a.concurrency, a.rate))
    cl = C.Cluster(build, model, n_prefill=a.prefill, n_decode=a.decode, ucx_tls="sm,self",
                   router_args=["--admission.max_waiting", "100000", "--log.level", "warn"],
                   worker_args=sim + ["--kv.memory", "64M", "--engine.max_running", "256",
                                      "--log.level", "warn"])
    rows = []
    try:
        pid = cl.router.proc.pid
        wpids = {role: [d.proc.pid for wid, d in cl.workers.items() if wid.startswith(role[0])]
                 for role in ("prefill", "decode")}
        for backend in a.backend.split(","):
            base = cl.http if backend.startswith("openai") else "tcp://" + cl.rpc
            res = tempfile.mktemp(suffix=".json")
            argv = [os.path.join(build, "tools", "tandem"), "bench", "--backend", backend,
                    "--base-url", base, "--secret-file", cl.secret_file,
                    "--model", os.path.basename(model), "--tokenizer", model,
                    "--dataset-name", "random", "--random-input-len", str(a.input_len),
                    "--random-output-len", str(a.output_len), "--ignore-eos",
                    "--request-rate", a.rate, "--max-concurrency", str(a.concurrency),
                    "--num-prompts", str(a.num_prompts), "--num-warmups", "64", "--seed", "1",
                    "--result-file", res, "--no-progress"]
            w0 = {k: sum(sum(cpu_s(p)) for p in v) for k, v in wpids.items()}
            c0, io0, t0 = cpu_s(pid), io_calls(pid), time.monotonic()
            r = subprocess.run(argv, text=True, capture_output=True)
            c1, io1, t1 = cpu_s(pid), io_calls(pid), time.monotonic()
            w1 = {k: sum(sum(cpu_s(p)) for p in v) for k, v in wpids.items()}
            if r.returncode != 0:
                print(r.stdout + r.stderr)
                sys.exit("tandem bench failed")
            with open(res) as f:
                out = json.load(f)
            os.unlink(res)
            n = out["completed"] + 64  # the warm-ups went through the router too
            failed = out.get("failed", 0)
            user = (c1[0] - c0[0]) / n * 1e6
            sys_ = (c1[1] - c0[1]) / n * 1e6
            rd = (io1[0] - io0[0]) / n
            wr = (io1[1] - io0[1]) / n
            wk = [(w1[k] - w0[k]) / n * 1e6 for k in ("prefill", "decode")]
            rows.append((backend, n, failed, user + sys_, out["request_throughput"], load(),
                         user, sys_, rd, wr, wk))
        print("backend  requests failed  router_us/req  ratio_to_50us  one_core_rps  "
              "ratio_to_5000  achieved_rps  user_us  sys_us  reads/req  writes/req  "
              "prefill_us/req  decode_us/req  load")
        for backend, n, failed, us, rps, ld, user, sys_, rd, wr, wk in rows:
            print("%-8s %8d %6d %14.1f %14.2f %13.0f %14.2f %13.0f %8.1f %7.1f %10.2f %11.2f "
                  "%15.1f %14.1f  %s" %
                  (backend, n, failed, us, us / LIMIT_US, 1e6 / us, 1e6 / us / TARGET_RPS, rps,
                   user, sys_, rd, wr, wk[0], wk[1], ld))
        cl.stop()
    finally:
        C._kill_all()


if __name__ == "__main__":
    main()

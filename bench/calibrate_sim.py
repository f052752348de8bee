#!/usr/bin/python3
"""calibrate_sim.py: fit the simulated engine's latency model to a real worker's steps.

Usage: bench/calibrate_sim.py BUILD_DIR MODEL_DIR [--threads 2] [--requests 60]

Starts a real cluster (router + one decode worker running the CPU engine, every prompt prefilled
locally so one worker sees both kinds of step), drives it with a mixed batch of prompts and output
lengths through `tandem ctl batch`, reads the worker's per-step debug lines
(`step prefill_tokens=P decodes=D ctx_tokens=C seconds=T`) and fits, by non-negative least
squares,

    T = step + prefill_us_per_token * P + decode_us_per_seq * D + decode_us_per_ctx_token * C

Prints the fit, its error on the measured steps, and the worker flags that make a simulated
worker (`--engine.kind sim`) take the same time.
"""
import argparse
import os
import random
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import cluster as C  # noqa: E402

STEP = re.compile(r"step prefill_tokens=(\d+) decodes=(\d+) ctx_tokens=(\d+) seconds=([\d.]+)")


def nnls(A, b, iters=2000):
    """Non-negative least squares by projected coordinate descent (numpy only)."""
    x = np.maximum(np.linalg.lstsq(A, b, rcond=None)[0], 0)
    AtA, Atb = A.T @ A, A.T @ b
    for _ in range(iters):
        for j in range(len(x)):
            if AtA[j, j] > 0:
                x[j] = max(0.0, x[j] + (Atb[j] - AtA[j] @ x) / AtA[j, j])
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=60)
    a = ap.parse_args()
    build, model = os.path.abspath(a.build), os.path.abspath(a.model)
    import json
    ctx = json.load(open(os.path.join(model, "config.json")))["max_position_embeddings"]
    rng = random.Random(1)
    reqs = []
    for _ in range(a.requests):
        n = rng.choice([8, 32, 64, 128, 256, 512])
        n = min(n, ctx // 2)
        reqs.append({"prompt_ids": [rng.randrange(1000, 20000) for _ in range(n)],
                     "max_tokens": min(rng.choice([8, 32, 64, 128]), ctx - n - 1),
                     "ignore_eos": True, "temperature": 0})
    cl = C.Cluster(build, model, n_prefill=0, n_decode=1, engine_threads=a.threads,
                   worker_args=["--log.level", "debug", "--kv.memory", "512M"])
    try:
        cl.batch(reqs[: a.requests // 3])        # in small waves and all at once, so
        cl.batch(reqs[a.requests // 3:])         # batch sizes and contexts vary
        log = open(cl.workers["d0"].log_path).read()
        cl.stop()
    finally:
        C._kill_all()
    rows = [tuple(map(float, m.groups())) for m in STEP.finditer(log)]
    if len(rows) < 10:
        sys.exit("only %d step lines in the worker's log" % len(rows))
    X = np.array([[1.0, p, d, c] for p, d, c, _ in rows])
    y = np.array([t for *_, t in rows]) * 1e6
    coef = nnls(X, y)
    pred = X @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1)
    print("steps measured: %d (prefill steps %d, decode-only %d)" %
          (len(rows), sum(1 for r in rows if r[0] > 0), sum(1 for r in rows if r[0] == 0)))
    print("fit: step %.1f us + %.2f us/prompt token + %.1f us/decoding seq + %.4f us/ctx token" %
          tuple(coef))
    print("median relative error %.1f%%, p90 %.1f%%; total time predicted/measured %.3f" %
          (100 * np.median(rel), 100 * np.percentile(rel, 90), pred.sum() / y.sum()))
    print("flags: --engine.kind sim --sim.step_us %.1f --sim.prefill_us_per_token %.3f "
          "--sim.decode_us_per_seq %.2f --sim.decode_us_per_ctx_token %.5f" % tuple(coef))


if __name__ == "__main__":
    main()

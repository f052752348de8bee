#!/usr/bin/python3
"""random_prompts.py: prompts made as `tandem bench --dataset-name random` makes them for the
router benchmarks (bench/router_cpu.py): each line is INPUT_LEN consecutive ordinary (non-special)
ids of the tokenizer's vocabulary from a random offset, decoded from byte-level BPE to UTF-8
(invalid sequences replaced; a newline inside a prompt becomes a space, so that a line is one
prompt). Feed the file to bench_tokenizer with CHUNK 1 (one encode call per
prompt) to time the tokenizer on the router's workload alone.

Usage: bench/random_prompts.py TOKENIZER_JSON N OUT [--input-len 64] [--seed 1]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "tokenizer"))
from gen_corpus import byte_decoder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_json")
    ap.add_argument("n", type=int)
    ap.add_argument("out")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(a.tokenizer_json, encoding="utf-8") as f:
        tj = json.load(f)
    dec = byte_decoder()
    special = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
    byid = {i: t for t, i in tj["model"]["vocab"].items()}
    allowed = sorted(i for i in byid if i not in special)
    rng = random.Random(a.seed)
    with open(a.out, "wb") as f:
        for _ in range(a.n):
            off = rng.randrange(1 << 62)
            b = b"".join(bytes(dec[c] for c in byid[allowed[(off + i) % len(allowed)]])
                         for i in range(a.input_len))
            f.write(b.decode("utf-8", "replace").replace("\n", " ").encode() + b"\n")


if __name__ == "__main__":
    main()

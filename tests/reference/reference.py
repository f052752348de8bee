#!/usr/bin/python3
"""Reference implementation CLI: greedy continuation of a token-id prompt with float64 numpy.

usage: reference.py MODEL_PATH --prompt-ids 1,2,3 --steps N --out out.json
                    [--logits full|topk|none] [--top-k 5] [--yarn-round]

MODEL_PATH is a Hugging Face directory (config.json + safetensors, sharded or not, F32/F16/BF16/
FP8) or a GGUF v3 file (llama, deepseek2). The JSON written holds prompt_token_ids,
greedy_token_ids, and per step either `logits_per_step` (full vocabulary, float64 values),
`top_logprobs_per_step` ([[id, logprob], ...], natural-log softmax), or both.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import formats  # noqa: E402
import model as refmodel  # noqa: E402


def run(path, prompt_ids, steps, logits_mode="topk", top_k=5, yarn_truncate=True):
    cfg, w, dtypes = formats.load_model(path)
    m = refmodel.Model(cfg, w, yarn_truncate=yarn_truncate)
    ids, logits = refmodel.generate(m, prompt_ids, steps)
    out = {"prompt_token_ids": list(prompt_ids), "greedy_token_ids": ids,
           "produced_by": "tests/reference (float64 numpy)", "model_type": cfg.get("model_type")}
    if logits_mode in ("topk", "both"):
        tops = []
        for lg in logits:
            lp = refmodel.log_softmax(lg)
            idx = refmodel.topk_indices(lp, top_k)
            tops.append([[int(i), float(lp[i])] for i in idx])
        out["top_logprobs_per_step"] = tops
    if logits_mode in ("full", "both"):
        out["logits_per_step"] = [[float(v) for v in lg] for lg in logits]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default="-")
    ap.add_argument("--logits", choices=["full", "topk", "both", "none"], default="topk")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--yarn-round", action="store_true",
                    help="round YaRN's correction range instead of floor/ceil")
    a = ap.parse_args(argv)
    try:
        prompt = [int(s) for s in a.prompt_ids.split(",") if s.strip()]
    except ValueError:
        ap.error("--prompt-ids: expected comma-separated integers")
    if not prompt:
        ap.error("--prompt-ids: empty prompt")
    try:
        out = run(a.model, prompt, a.steps, a.logits, a.top_k, not a.yarn_round)
    except (formats.FormatError, refmodel.ModelError, OSError, KeyError) as e:
        print("reference.py: %s" % e, file=sys.stderr)
        return 1
    text = json.dumps(out)
    if a.out == "-":
        print(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

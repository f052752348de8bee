#!/usr/bin/python3
"""Compare the engine's fp32 output with the float64 reference.

Two ways to use it:

  compare_engine.py MODEL_PATH ENGINE.json [--tol 1e-4]
      ENGINE.json holds prompt_token_ids, greedy_token_ids and logits_per_step (full vocabulary)
      as tests/reference/engine_dump writes them; the reference is run on the same prompt for the
      same number of steps. Passes when the greedy ids are identical and, at every step,
      max|engine - reference| / max|reference| <= tol.

  compare_engine.py --all --tandem TANDEM --engine-dump ENGINE_DUMP [--steps 64]
      For every architecture mkmodel writes (llama, qwen3, deepseek_v2, deepseek_v3), plus the GGUF
      copies, the FP8 and BF16 DeepSeek checkpoints and the fused/sharded layout: write the tiny
      model, run the engine (through engine_dump) and the reference, and compare as above.

Exit status 0 when everything matches, 1 otherwise (77: nothing to compare with).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, HERE)

import formats  # noqa: E402
import model as refmodel  # noqa: E402

PROMPT = [5, 17, 99, 250, 7, 7, 400, 31, 2, 480, 1, 64, 300]


# Products with 8-bit activations (Q8_0 / Q4_0 weights: model.quantize_act_q8_0; Q4_K / Q6_K:
# model.quantize_act_q8_k) round each
# activation to a step of its block; the engine's fp32 activation and the reference's float64 one
# differ in the last bits, so now and then one lands on the other side of a rounding boundary and
# moves that step's logits by one step's share (measured: 1e-3 to 5e-3 of the largest logit,
# about one step in ten on mkmodel's small models; elsewhere the two agree within 2e-7). On such
# files a dense model's step may exceed `tol` by a rounding flip: at most FLIP_SHARE of the steps,
# none beyond FLIP_TOL, greedy ids identical. In a DeepSeek MoE such a flip can also flip a close
# expert choice (measured: 0.015-0.034 at every later step), so there the logits must stay within
# MOE_FLIP_TOL and the first MOE_IDS greedy ids identical. A product modelled wrongly is off by
# 0.7 or more.
FLIP_TOL = 2e-2
FLIP_SHARE = 0.25
MOE_FLIP_TOL = 5e-2
MOE_IDS = 4


def compare(model_path, engine, tol, act8=True):
    """engine: dict in engine_dump's schema. act8: the engine ran with its default 8-bit
    activations for Q8_0 / Q4_0 / Q4_K / Q6_K weights (else with fp32 ones: engine_dump's f32act), so the
    reference models them. Returns (ok, message, max relative error)."""
    cfg, w, _ = formats.load_model(model_path)
    if not act8:
        cfg["q8_activation_inputs"] = cfg["q8k_activation_inputs"] = []
    flips = bool(cfg.get("q8_activation_inputs"))
    moe = int(cfg.get("n_routed_experts") or 0) > 0
    prompt = engine["prompt_token_ids"]
    e_ids = engine["greedy_token_ids"]
    e_logits = [np.asarray(x, dtype=np.float64) for x in engine["logits_per_step"]]
    m = refmodel.Model(cfg, w)
    # Teacher-force the engine's own tokens, so that one early divergence does not hide how
    # close the later steps are; greedy equality is checked separately.
    logits = m.step(prompt)[-1]
    worst, worst_step, first_diff, over = 0.0, -1, None, 0
    for s, (tok, el) in enumerate(zip(e_ids, e_logits)):
        if el.shape != logits.shape:
            return False, "step %d: engine has %d logits, reference %d" % (s, el.size, logits.size), 0
        rel = float(np.max(np.abs(el - logits)) / np.max(np.abs(logits)))
        over += rel > tol
        if rel > worst:
            worst, worst_step = rel, s
        if first_diff is None and int(np.argmax(logits)) != tok:
            first_diff = s
        if s + 1 < len(e_ids):
            logits = m.step([tok])[-1]
    msgs = []
    if first_diff is not None and not (flips and moe and first_diff >= MOE_IDS):
        msgs.append("greedy ids differ from step %d" % first_diff)
    if flips and moe:
        if worst > MOE_FLIP_TOL:
            msgs.append("logits relative error %.3g at step %d exceeds %g (8-bit activations in "
                        "an MoE)" % (worst, worst_step, MOE_FLIP_TOL))
    elif flips:
        if worst > FLIP_TOL or over > FLIP_SHARE * len(e_ids):
            msgs.append("logits relative error %.3g at step %d, over %g at %d of %d steps: more "
                        "than 8-bit activations' rounding flips (%g, %.0f%% of the steps)" %
                        (worst, worst_step, tol, over, len(e_ids), FLIP_TOL, 100 * FLIP_SHARE))
    elif worst > tol:
        msgs.append("logits relative error %.3g at step %d exceeds %g" % (worst, worst_step, tol))
    return not msgs, "; ".join(msgs) or "ok", worst


VARIANTS = [
    ("llama", []), ("llama", ["gguf"]), ("qwen3", []),
    ("deepseek_v2", []), ("deepseek_v2", ["gguf"]), ("deepseek_v2", ["fused", "shards"]),
    ("deepseek_v3", []), ("deepseek_v3", ["gguf"]), ("deepseek_v3", ["fp8"]),
    ("deepseek_v3", ["bf16"]), ("llama", ["swa"]),
]


def variant_name(arch, opts):
    return arch + ("_" + "_".join(opts) if opts else "")


def run_all(tandem, dump, steps, tol, threads, block, only=None):
    variants = [(a, o) for a, o in VARIANTS if not only or variant_name(a, o) in only]
    tmp = tempfile.mkdtemp(prefix="td-compare-")
    failed = 0
    try:
        for arch, opts in variants:
            name = variant_name(arch, opts)
            d = os.path.join(tmp, name)
            args = [tandem, "mkmodel", "--arch", arch, "--seed", "11", "--out", d]
            if "gguf" in opts:
                args += ["--gguf", "f32"]
            if "fused" in opts:
                args += ["--fused-experts"]
            if "shards" in opts:
                args += ["--shards", "2"]
            if "fp8" in opts:
                args += ["--fp8"]
            if "bf16" in opts:
                args += ["--dtype", "bf16"]
            subprocess.run(args, check=True, capture_output=True, timeout=300)
            if "swa" in opts:  # Mistral: the same weights with an 8-token sliding window
                cfg_path = os.path.join(d, "config.json")
                with open(cfg_path) as f:
                    cfg = json.load(f)
                cfg["model_type"] = "mistral"
                cfg["architectures"] = ["MistralForCausalLM"]
                cfg["sliding_window"] = 8
                with open(cfg_path, "w") as f:
                    json.dump(cfg, f, indent=1)
            path = os.path.join(d, "model.gguf") if "gguf" in opts else d
            out = os.path.join(tmp, name + ".json")
            r = subprocess.run([dump, path, ",".join(map(str, PROMPT)), str(steps), out,
                                str(block), str(threads)], capture_output=True, text=True,
                               timeout=600)
            if r.returncode != 0:
                print("%-28s ENGINE FAILED: %s" % (name, r.stderr.strip()))
                failed += 1
                continue
            with open(out) as f:
                eng = json.load(f)
            ok, msg, rel = compare(path, eng, tol)
            print("%-28s %s: %d greedy ids %s, max logits relative error %.3g" %
                  (name, "PASS" if ok else "FAIL", len(eng["greedy_token_ids"]),
                   "identical" if "greedy" not in msg else "DIFFER", rel))
            if not ok:
                print("    " + msg)
                failed += 1
            else:
                # negative control: the comparison must notice a logit off by 3x the tolerance
                # and a changed greedy choice
                bad = json.loads(json.dumps(eng))
                row = bad["logits_per_step"][steps // 2]
                row[0] += 3 * tol * max(abs(v) for v in row)
                bad["greedy_token_ids"][-1] = (bad["greedy_token_ids"][-1] + 1) % len(row)
                bok, bmsg, _ = compare(path, bad, tol)
                if bok or "greedy" not in bmsg or "relative error" not in bmsg:
                    print("    negative control not detected: %s" % bmsg)
                    failed += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("engine_json", nargs="?")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--tandem", default=os.environ.get("TD_TANDEM"))
    ap.add_argument("--engine-dump", default=os.environ.get("TD_ENGINE_DUMP"))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--variants", help="comma-separated subset of: " +
                    ", ".join(variant_name(a, o) for a, o in VARIANTS))
    a = ap.parse_args()
    only = None
    if a.variants:
        only = set(a.variants.split(","))
        unknown = only - {variant_name(x, o) for x, o in VARIANTS}
        if unknown:
            ap.error("unknown variants: %s" % ", ".join(sorted(unknown)))
    if a.all:
        for p, what in ((a.tandem, "--tandem"), (a.engine_dump, "--engine-dump")):
            if not p or not os.access(p, os.X_OK):
                print("SKIP: %s not given or not executable" % what)
                return 77
        return run_all(a.tandem, a.engine_dump, a.steps, a.tol, a.threads, a.block_size, only)
    if not a.model or not a.engine_json:
        ap.error("MODEL_PATH and ENGINE.json are required (or --all)")
    with open(a.engine_json) as f:
        eng = json.load(f)
    ok, msg, rel = compare(a.model, eng, a.tol)
    print("%s: %s (max logits relative error %.3g)" % ("PASS" if ok else "FAIL", msg, rel))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

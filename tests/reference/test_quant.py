#!/usr/bin/python3
"""llama.cpp's block formats Q8_0, Q4_0, Q4_K and Q6_K (and the Q4_K_M mix of the last two):
`tandem mkmodel --gguf` writes them with ggml's reference quantizers, the engine computes with
them, and both are checked against two independent readings of the same file:

- the reference's numpy dequantization of the raw blocks (formats.py, written from ggml's block
  layouts) run through the float64 forward: the engine with fp32 activations (engine_dump's
  f32act) agrees within 1e-4 of the largest logit at every step with identical greedy ids; the
  engine with its default 8-bit activations for Q8_0 / Q4_0 and Q4_K / Q6_K products agrees
  with the forward that rounds those products' inputs the same way (model.quantize_act_q8_0,
  model.quantize_act_q8_k), under
  compare_engine's rules for rounding flips;
- llama.cpp (node-llama-cpp's prebuilt CPU build) on the same file: its next-token
  probabilities at every position of the engine's greedy sequence agree with the reference's.
  llama.cpp rounds the activations to 8 bits for its integer dot products (Q8_0 for Q8_0 / Q4_0
  weights, Q8_K for the K-quants; the reference models both) and keeps an F16 KV cache, so they agree within a tolerance, not bit for bit; that part is skipped, and
  said so, where node-llama-cpp is not installed.

The models are mkmodel's `small` preset (hidden 256) so that most rows hold whole 256-value
K-quant blocks; the rows that do not (MLA's 32-wide latent rows) take Q4_0 / Q8_0 as
llama-quantize's fallbacks do.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, HERE)

import compare_engine  # noqa: E402
import formats  # noqa: E402
import llamacpp_env  # noqa: E402
import model as refmodel  # noqa: E402

BUILD = os.environ.get("TD_BUILD_ROOT", "")
TANDEM = os.environ.get("TD_TANDEM") or os.path.join(BUILD, "tools", "tandem")
ENGINE_DUMP = os.environ.get("TD_ENGINE_DUMP") or os.path.join(BUILD, "tests", "reference",
                                                                "engine_dump")
MODULES = os.environ.get("TD_NODE_MODULES") or os.path.join(HERE, "..", "node", "node_modules")
PROMPT = [5, 17, 99, 250, 7, 7, 400, 31, 2, 480]
STEPS = 12
# what each --gguf type must put in the file (besides F32 vectors and fallbacks)
WANT_TYPES = {"q8_0": {"Q8_0"}, "q4_0": {"Q4_0"}, "q4_k": {"Q4_K"}, "q6_k": {"Q6_K"},
              "q4_k_m": {"Q4_K", "Q6_K"}}
# llama.cpp vs the reference, per position: the largest difference of any token's probability.
# Measured here: 0.002-0.06 (llama.cpp's 8-bit activations and F16 KV cache), except where a
# DeepSeek MoE routing choice between close experts flips (0.3-0.5 at a few positions). A wrong
# block layout gives differences near 1 everywhere.
PROB_TOL = 0.1
MOE_FLIPS = 0.25  # DeepSeek: the share of positions allowed over PROB_TOL


def have_llamacpp():
    return llamacpp_env.missing() is None


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class QuantTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="td-quant-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_one(self, arch, gtype):
        d = os.path.join(self.tmp, "%s_%s" % (arch, gtype))
        subprocess.run([TANDEM, "mkmodel", "--arch", arch, "--preset", "small", "--seed", "5",
                        "--out", d, "--gguf", gtype], check=True, capture_output=True, timeout=120)
        gguf = os.path.join(d, "model.gguf")
        _, tensors = formats.read_gguf(gguf)
        types = {t for t, _ in tensors.values()}
        self.assertTrue(WANT_TYPES[gtype] <= types, "%s %s: file holds %s" % (arch, gtype, types))
        # the engine against the numpy dequantization: with fp32 activations against the plain
        # float64 forward, and with its default 8-bit activations (Q8_0 / Q4_0 / Q4_K / Q6_K) against
        # the forward that rounds them the same way (compare_engine's rules for rounding flips)
        for act8 in (False, True):
            out = os.path.join(d, "engine%d.json" % act8)
            subprocess.run([ENGINE_DUMP, gguf, ",".join(map(str, PROMPT)), str(STEPS), out, "16",
                            "2"] + ([] if act8 else ["f32act"]),
                           check=True, capture_output=True, timeout=300)
            with open(out) as f:
                engine = json.load(f)
            ok, msg, worst = compare_engine.compare(gguf, engine, 1e-4, act8)
            print("%-12s %-6s engine (%s activations) vs numpy dequantization: %s (largest error "
                  "%.3g of the largest logit)" % (arch, gtype, "8-bit" if act8 else "fp32", msg,
                                                  worst))
            self.assertTrue(ok, "%s %s: %s" % (arch, gtype, msg))
        if not have_llamacpp():
            print("%-12s %-6s llama.cpp: SKIP (%s)" % (arch, gtype, llamacpp_env.missing()))
            return
        # llama.cpp's probabilities along the engine's greedy sequence
        seq = PROMPT + engine["greedy_token_ids"][:-1]
        r = subprocess.run(["node", os.path.join(HERE, "llamacpp_probs.mjs"), MODULES, gguf,
                            ",".join(map(str, seq))], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, "%s %s: %s" % (arch, gtype, r.stderr[-2000:]))
        got = np.asarray(json.loads(r.stdout.strip().splitlines()[-1]), dtype=np.float64)
        cfg, w, _ = formats.load_model(gguf)
        want = softmax(refmodel.Model(cfg, w).step(seq))
        self.assertEqual(got.shape, want.shape)
        dp = np.max(np.abs(got - want), axis=1)
        over = float(np.mean(dp > PROB_TOL))
        top = float(np.mean(np.argmax(got, axis=1) == np.argmax(want, axis=1)))
        print("%-12s %-6s llama.cpp vs reference: |dp| median %.4f max %.4f, over %.2f at %d of "
              "%d positions, top-1 agrees at %.0f%%" %
              (arch, gtype, np.median(dp), dp.max(), PROB_TOL, int(np.sum(dp > PROB_TOL)),
               len(seq), 100 * top))
        self.assertLess(float(np.median(dp)), PROB_TOL / 2, "%s %s" % (arch, gtype))
        self.assertLessEqual(over, MOE_FLIPS if arch.startswith("deepseek") else 0.0,
                             "%s %s: %s" % (arch, gtype, np.round(dp, 3)))
        # the prompt's own next token (no earlier choice to inherit) must agree
        self.assertEqual(int(np.argmax(got[len(PROMPT) - 1])), engine["greedy_token_ids"][0])

    def test_llama(self):
        for g in WANT_TYPES:
            self.run_one("llama", g)

    def test_deepseek_v3(self):
        for g in WANT_TYPES:
            self.run_one("deepseek_v3", g)


if __name__ == "__main__":
    for exe in (TANDEM, ENGINE_DUMP):
        if not os.access(exe, os.X_OK):
            print("SKIP: %s not found" % exe)
            sys.exit(77)
    unittest.main(verbosity=2)

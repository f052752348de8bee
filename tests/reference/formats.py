"""Checkpoint readers for the reference implementation: safetensors (single file or sharded) and
GGUF v3. Written from the format definitions, independently of the C engine.

load_model(path) returns (config, weights): `config` a dict with Hugging Face config.json field
names, `weights` a dict of Hugging Face parameter names -> float64 numpy arrays in PyTorch layout
([out_features, in_features] for linear weights). FP8 weights come back dequantised with their
weight_scale_inv blocks; fused expert tensors (`experts.gate_up_proj`, `experts.down_proj`) are
split into the per-expert names; GGUF files are mapped back to the Hugging Face names.

Errors are raised as FormatError with a message naming the file and the tensor.
"""

import json
import math
import os
import struct

import numpy as np


class FormatError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Scalar decoders
# ---------------------------------------------------------------------------------------------


def bf16_to_f64(raw_u16):
    """BF16 is the top 16 bits of an IEEE binary32."""
    u32 = raw_u16.astype(np.uint32) << 16
    return u32.view(np.float32).astype(np.float64)


def _f8_e4m3_table():
    # OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
    # S.1111.111 is NaN; exponent 0 is subnormal: m/8 * 2^-6.
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = math.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


F8_E4M3_TABLE = _f8_e4m3_table()

FP8_BLOCK = 128  # DeepSeek's weight_scale_inv block edge (128 x 128 weights per scale)


def fp8_dequant(w_f8_values, scale_inv):
    """w: [out, in] decoded E4M3 values; scale_inv: [ceil(out/128), ceil(in/128)] float.
    Returns w * scale_inv broadcast over 128x128 blocks (DeepSeek's weight_dequant)."""
    out_f, in_f = w_f8_values.shape
    so, si = (out_f + FP8_BLOCK - 1) // FP8_BLOCK, (in_f + FP8_BLOCK - 1) // FP8_BLOCK
    if scale_inv.shape != (so, si):
        raise FormatError("weight_scale_inv shape %s does not match weight %s (expected %s)" %
                          (list(scale_inv.shape), [out_f, in_f], [so, si]))
    s = np.repeat(np.repeat(scale_inv, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:out_f, :in_f]
    return w_f8_values * s


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

ST_DTYPES = {
    "F64": (8, "<f8"),
    "F32": (4, "<f4"),
    "F16": (2, "<f2"),
    "BF16": (2, "bf16"),
    "F8_E4M3": (1, "f8e4m3"),
    "I64": (8, "<i8"),
    "I32": (4, "<i4"),
    "I8": (1, "i1"),
    "U8": (1, "u1"),
}


def read_safetensors(path, names=None):
    """Returns {name: (dtype_string, float64 array)} for every tensor in one safetensors file
    (only those in `names` when given; the header is still checked whole)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError("%s: file too short for a safetensors header" % path)
    (hlen,) = struct.unpack_from("<Q", data, 0)
    if hlen > len(data) - 8:
        raise FormatError("%s: header length %d runs past the end of the file" % (path, hlen))
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: header is not JSON: %s" % (path, e))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise FormatError("%s: tensor %s: unsupported dtype %r" % (path, name, dt))
        size, kind = ST_DTYPES[dt]
        shape = [int(d) for d in info["shape"]]
        b, e = info["data_offsets"]
        n = int(np.prod(shape)) if shape else 1
        if e - b != n * size or base + e > len(data) or b < 0:
            raise FormatError("%s: tensor %s: data_offsets [%d, %d] do not fit shape %s %s" %
                              (path, name, b, e, shape, dt))
        if names is not None and name not in names:
            continue
        raw = data[base + b:base + e]
        if kind == "bf16":
            arr = bf16_to_f64(np.frombuffer(raw, dtype="<u2"))
        elif kind == "f8e4m3":
            arr = F8_E4M3_TABLE[np.frombuffer(raw, dtype=np.uint8)]
        else:
            arr = np.frombuffer(raw, dtype=kind).astype(np.float64)
        out[name] = (dt, arr.reshape(shape))
    return out


def read_safetensors_dir(model_dir):
    """Reads model.safetensors, or every shard named in model.safetensors.index.json.
    Returns ({name: float64 array}, {name: dtype string}); FP8 weights are dequantised with their
    `<name>_scale_inv` tensors, which are then dropped."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    raw = {}
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        files = sorted(set(wm.values()))
        for fn in files:
            part = read_safetensors(os.path.join(model_dir, fn))
            for name in part:
                if wm.get(name) != fn:
                    raise FormatError("%s: tensor %s is not listed for this shard in %s" %
                                      (fn, name, index))
            raw.update(part)
        missing = [n for n in wm if n not in raw]
        if missing:
            raise FormatError("%s: tensors listed but not found in shards: %s" % (index, missing[:5]))
    else:
        single = os.path.join(model_dir, "model.safetensors")
        if not os.path.exists(single):
            raise FormatError("%s: no model.safetensors or model.safetensors.index.json" % model_dir)
        raw = read_safetensors(single)
    weights, dtypes = {}, {}
    for name, (dt, arr) in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if dt == "F8_E4M3":
            sname = name + "_scale_inv"
            if sname not in raw:
                raise FormatError("%s: FP8 tensor %s has no %s" % (model_dir, name, sname))
            try:
                arr = fp8_dequant(arr, raw[sname][1])
            except FormatError as e:
                raise FormatError("%s: tensor %s: %s" % (model_dir, name, e))
        weights[name] = arr
        dtypes[name] = dt
    return weights, dtypes


def split_fused_experts(weights):
    """Turns `...mlp.experts.gate_up_proj` [E, 2*I, H] (gate rows first, then up) and
    `...mlp.experts.down_proj` [E, H, I] into per-expert `experts.<e>.{gate,up,down}_proj.weight`."""
    for name in [n for n in weights if n.endswith("mlp.experts.gate_up_proj")]:
        prefix = name[:-len("gate_up_proj")]
        gu = weights.pop(name)
        dn = weights.pop(prefix + "down_proj")
        n_exp, two_i, _ = gu.shape
        inter = two_i // 2
        for e in range(n_exp):
            weights["%s%d.gate_proj.weight" % (prefix, e)] = gu[e, :inter]
            weights["%s%d.up_proj.weight" % (prefix, e)] = gu[e, inter:]
            weights["%s%d.down_proj.weight" % (prefix, e)] = dn[e]
    return weights


# ---------------------------------------------------------------------------------------------
# GGUF v3
# ---------------------------------------------------------------------------------------------

GGUF_F32, GGUF_F16, GGUF_Q4_0, GGUF_Q8_0, GGUF_Q4_K, GGUF_Q6_K, GGUF_BF16 = 0, 1, 2, 8, 12, 14, 30
GGUF_TYPE_NAMES = {GGUF_F32: "F32", GGUF_F16: "F16", GGUF_Q8_0: "Q8_0", GGUF_BF16: "BF16",
                   GGUF_Q4_0: "Q4_0", GGUF_Q4_K: "Q4_K", GGUF_Q6_K: "Q6_K"}
Q8_0_BLOCK = 32  # values per Q8_0 block: one f16 scale then 32 int8
# ggml's block formats: type -> (values per block, bytes per block)
GGUF_BLOCKS = {GGUF_Q8_0: (32, 34), GGUF_Q4_0: (32, 18), GGUF_Q4_K: (256, 144),
               GGUF_Q6_K: (256, 210)}


def dequant_q4_0(raw):
    """ggml block_q4_0: f16 d, then 16 bytes; value j is low nibble of byte j, 16 + j the high
    nibble; x = (q - 8) * d."""
    b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", (16,))]))
    d = b["d"].astype(np.float64)[:, None]
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.float64) - 8.0
    return (q * d).ravel()


def _k4_scales(sc):
    """The 8 six-bit scales and mins packed in a Q4_K block's 12 bytes (get_scale_min_k4)."""
    sc = sc.astype(np.int64)
    scale = np.empty((sc.shape[0], 8), np.int64)
    mins = np.empty((sc.shape[0], 8), np.int64)
    scale[:, :4] = sc[:, 0:4] & 63
    mins[:, :4] = sc[:, 4:8] & 63
    scale[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    mins[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return scale, mins


def dequant_q4_k(raw):
    """ggml block_q4_K (256 values): f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of
    nibbles. Sub-block s (32 values): x = d * scale[s] * q - dmin * min[s]; bytes 32i..32i+31
    hold sub-block 2i in their low nibbles and 2i + 1 in their high nibbles."""
    b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("dmin", "<f2"), ("sc", "u1", (12,)),
                                           ("qs", "u1", (128,))]))
    scale, mins = _k4_scales(b["sc"])
    qs = b["qs"].reshape(-1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)
    d = b["d"].astype(np.float64)[:, None, None]
    dmin = b["dmin"].astype(np.float64)[:, None, None]
    return (d * scale[:, :, None] * q - dmin * mins[:, :, None]).ravel()


def dequant_q6_k(raw):
    """ggml block_q6_K (256 values): ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16]
    (one per 16 values), f16 d; x = d * scale * (q - 32). Each half of 128 values takes 64 bytes
    of ql and 32 of qh: value 32k + l (k = 0..3) is nibble k // 2 of ql[l + 32 (k % 2)] with
    bits 2k..2k+1 of qh[l]."""
    b = np.frombuffer(raw, dtype=np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)),
                                           ("sc", "i1", (16,)), ("d", "<f2")]))
    nb = b.shape[0]
    ql = b["ql"].reshape(nb, 2, 64).astype(np.int64)
    qh = b["qh"].reshape(nb, 2, 32).astype(np.int64)
    q = np.empty((nb, 2, 4, 32), np.int64)
    for k in range(4):
        lo = ql[:, :, 32 * (k % 2):32 * (k % 2) + 32]
        lo = lo & 0xF if k < 2 else lo >> 4
        q[:, :, k, :] = (lo | (((qh >> (2 * k)) & 3) << 4)) - 32
    q = q.reshape(nb, 16, 16).astype(np.float64)
    d = b["d"].astype(np.float64)[:, None, None]
    return (d * b["sc"].astype(np.float64)[:, :, None] * q).ravel()


def dequant_gguf(ty, raw):
    """Float64 values of GGUF tensor data of a block format `ty`."""
    if ty == GGUF_Q8_0:
        blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "i1", (32,))]))
        return (blocks["d"].astype(np.float64)[:, None] * blocks["q"].astype(np.float64)).ravel()
    return {GGUF_Q4_0: dequant_q4_0, GGUF_Q4_K: dequant_q4_k, GGUF_Q6_K: dequant_q6_k}[ty](raw)


class _Reader:
    def __init__(self, data, path):
        self.data, self.off, self.path = data, 0, path

    def take(self, fmt):
        size = struct.calcsize("<" + fmt)
        if self.off + size > len(self.data):
            raise FormatError("%s: truncated GGUF header at byte %d" % (self.path, self.off))
        v = struct.unpack_from("<" + fmt, self.data, self.off)[0]
        self.off += size
        return v

    def string(self):
        n = self.take("Q")
        if self.off + n > len(self.data):
            raise FormatError("%s: string of %d bytes runs past the end" % (self.path, n))
        s = self.data[self.off:self.off + n].decode("utf-8", errors="replace")
        self.off += n
        return s


_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                12: "d"}


def _gguf_value(r, t):
    if t == 8:
        return r.string()
    if t == 9:
        at = r.take("I")
        n = r.take("Q")
        if n > len(r.data):
            raise FormatError("%s: array length %d is impossible" % (r.path, n))
        return [_gguf_value(r, at) for _ in range(n)]
    if t not in _GGUF_SCALAR:
        raise FormatError("%s: unknown metadata value type %d" % (r.path, t))
    return r.take(_GGUF_SCALAR[t])


def read_gguf(path):
    """Returns (metadata dict, {name: (type_name, float64 array in numpy order)}). GGUF dims are
    listed fastest-first (ne[0] is the row length), so numpy shape is the reverse."""
    with open(path, "rb") as f:
        data = f.read()
    r = _Reader(data, path)
    if data[:4] != b"GGUF":
        raise FormatError("%s: not a GGUF file (magic %r)" % (path, data[:4]))
    r.off = 4
    ver = r.take("I")
    if ver != 3:
        raise FormatError("%s: GGUF version %d, only 3 is supported" % (path, ver))
    n_tensors = r.take("Q")
    n_kv = r.take("Q")
    meta = {}
    for _ in range(n_kv):
        k = r.string()
        meta[k] = _gguf_value(r, r.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        if nd > 4:
            raise FormatError("%s: tensor %s has %d dimensions" % (path, name, nd))
        dims = [r.take("Q") for _ in range(nd)]
        ty = r.take("I")
        off = r.take("Q")
        infos.append((name, dims, ty, off))
    align = int(meta.get("general.alignment", 32))
    base = (r.off + align - 1) // align * align
    tensors = {}
    for name, dims, ty, off in infos:
        n = int(np.prod(dims)) if dims else 1
        if ty == GGUF_F32:
            nbytes = 4 * n
        elif ty in (GGUF_F16, GGUF_BF16):
            nbytes = 2 * n
        elif ty in GGUF_BLOCKS:
            per, size = GGUF_BLOCKS[ty]
            if dims[0] % per:
                raise FormatError("%s: tensor %s: %s row length %d not a multiple of %d" %
                                  (path, name, GGUF_TYPE_NAMES[ty], dims[0], per))
            nbytes = n // per * size
        else:
            raise FormatError("%s: tensor %s: unsupported GGUF type %d" % (path, name, ty))
        start = base + off
        if start + nbytes > len(data):
            raise FormatError("%s: tensor %s: data [%d, %d) runs past the end of the file (%d)" %
                              (path, name, start, start + nbytes, len(data)))
        raw = data[start:start + nbytes]
        if ty == GGUF_F32:
            arr = np.frombuffer(raw, "<f4").astype(np.float64)
        elif ty == GGUF_F16:
            arr = np.frombuffer(raw, "<f2").astype(np.float64)
        elif ty == GGUF_BF16:
            arr = bf16_to_f64(np.frombuffer(raw, "<u2"))
        else:
            arr = dequant_gguf(ty, raw)
        tensors[name] = (GGUF_TYPE_NAMES[ty], arr.reshape(list(reversed(dims))))
    return meta, tensors


def _gguf_llama(meta, t, path):
    a = "llama"
    g = lambda k, d=None: meta.get("%s.%s" % (a, k), d)
    n_head = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    head_dim = int(g("attention.key_length", hidden // n_head))
    cfg = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(g("block_count")),
        "intermediate_size": int(g("feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(g("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "vocab_size": t["token_embd.weight"][1].shape[0],
        "tie_word_embeddings": "output.weight" not in t,
        # GGUF's llama stores Q and K rows permuted so that RoPE rotates adjacent pairs
        # (llama.cpp's LLAMA_ROPE_TYPE_NORM); the reference applies RoPE the same way.
        "rope_layout": "adjacent",
    }
    if g("rope.scaling.type") == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    w = {"model.embed_tokens.weight": t["token_embd.weight"][1],
         "model.norm.weight": t["output_norm.weight"][1]}
    if "output.weight" in t:
        w["lm_head.weight"] = t["output.weight"][1]
    if "rope_freqs.weight" in t:
        cfg["rope_freq_factors"] = t["rope_freqs.weight"][1].tolist()
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(cfg["num_hidden_layers"]):
        for g_name, hf in names.items():
            for suffix in ("weight", "bias"):
                k = "blk.%d.%s.%s" % (i, g_name, suffix)
                if k in t:
                    w["model.layers.%d.%s.%s" % (i, hf, suffix)] = t[k][1]
                elif suffix == "weight":
                    raise FormatError("%s: missing tensor %s" % (path, k))
    return cfg, w


def _gguf_deepseek2(meta, t, path):
    a = "deepseek2"
    g = lambda k, d=None: meta.get("%s.%s" % (a, k), d)
    n_head = int(g("attention.head_count"))
    kv_lora = int(g("attention.kv_lora_rank"))
    rope_dim = int(g("rope.dimension_count"))
    if g("attention.key_length_mla") is not None:
        qk_head = int(g("attention.key_length_mla"))
        v_head = int(g("attention.value_length_mla"))
    else:
        qk_head = int(g("attention.key_length"))
        v_head = int(g("attention.value_length"))
    q_lora = int(g("attention.q_lora_rank", 0) or 0)
    gating = int(g("expert_gating_func", 1))
    cfg = {
        "model_type": "deepseek_v3" if gating == 2 else "deepseek_v2",
        "hidden_size": int(g("embedding_length")),
        "num_hidden_layers": int(g("block_count")),
        "intermediate_size": int(g("feed_forward_length")),
        "moe_intermediate_size": int(g("expert_feed_forward_length", 0)),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head,
        "q_lora_rank": q_lora or None,
        "kv_lora_rank": kv_lora,
        "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": qk_head - rope_dim,
        "v_head_dim": v_head,
        "n_routed_experts": int(g("expert_count", 0)),
        "n_shared_experts": int(g("expert_shared_count", 0)),
        "num_experts_per_tok": int(g("expert_used_count", 0)),
        "first_k_dense_replace": int(g("leading_dense_block_count", 0)),
        "routed_scaling_factor": float(g("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(g("expert_weights_norm", False)),
        "scoring_func": "sigmoid" if gating == 2 else "softmax",
        "n_group": int(g("expert_group_count", 1)),
        "topk_group": int(g("expert_group_used_count", 1)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 4096)),
        "vocab_size": t["token_embd.weight"][1].shape[0],
        "tie_word_embeddings": "output.weight" not in t,
        "rope_layout": "adjacent",
    }
    cfg["topk_method"] = "noaux_tc" if gating == 2 else (
        "group_limited_greedy" if cfg["n_group"] > 1 else "greedy")
    if g("rope.scaling.type") == "yarn":
        mul = float(g("rope.scaling.yarn_log_multiplier", 0.0))
        cfg["rope_scaling"] = {
            "type": "yarn", "rope_type": "yarn",
            "factor": float(g("rope.scaling.factor")),
            "original_max_position_embeddings": int(g("rope.scaling.original_context_length")),
            "beta_fast": 32, "beta_slow": 1,
            "mscale": mul / 0.1, "mscale_all_dim": mul / 0.1,
        }
    w = {"model.embed_tokens.weight": t["token_embd.weight"][1],
         "model.norm.weight": t["output_norm.weight"][1]}
    if "output.weight" in t:
        w["lm_head.weight"] = t["output.weight"][1]
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_q_a": "self_attn.q_a_proj",
             "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
             "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
             "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_kv_b": "self_attn.kv_b_proj",
             "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
             "ffn_up_shexp": "mlp.shared_experts.up_proj",
             "ffn_down_shexp": "mlp.shared_experts.down_proj"}
    nope = qk_head - rope_dim
    for i in range(cfg["num_hidden_layers"]):
        p = "blk.%d." % i
        for g_name, hf in names.items():
            k = p + g_name + ".weight"
            if k in t:
                w["model.layers.%d.%s.weight" % (i, hf)] = t[k][1]
        if p + "exp_probs_b.bias" in t:
            w["model.layers.%d.mlp.gate.e_score_correction_bias" % i] = t[p + "exp_probs_b.bias"][1]
        if p + "attn_kv_b.weight" not in t:
            if p + "attn_k_b.weight" not in t:
                raise FormatError("%s: missing tensor %sattn_kv_b.weight or %sattn_k_b.weight" %
                                  (path, p, p))
            k_b = t[p + "attn_k_b.weight"][1]  # [n_head, kv_lora, nope]
            v_b = t[p + "attn_v_b.weight"][1]  # [n_head, v_head, kv_lora]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # [n_head, nope+v, kv_lora]
            if k_b.shape[2] != nope:
                raise FormatError("%s: %sattn_k_b.weight has %d columns, expected %d" %
                                  (path, p, k_b.shape[2], nope))
            w["model.layers.%d.self_attn.kv_b_proj.weight" % i] = kv_b.reshape(-1, kv_lora)
        for proj in ("gate", "up", "down"):
            k = p + "ffn_%s_exps.weight" % proj
            if k in t:
                stacked = t[k][1]  # [n_expert, out, in]
                for e in range(stacked.shape[0]):
                    w["model.layers.%d.mlp.experts.%d.%s_proj.weight" % (i, e, proj)] = stacked[e]
        if "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight" % i not in w:
            raise FormatError("%s: missing tensor %sattn_kv_a_mqa.weight" % (path, p))
    return cfg, w


# ---------------------------------------------------------------------------------------------
# llama.cpp's 8-bit activations
# ---------------------------------------------------------------------------------------------

# Weight types whose products llama.cpp's CPU code (and tandem's CPU backend) computes against
# activations quantised to 8 bits (its vec_dot_type for these types): Q8_0 per block of 32
# (model.quantize_act_q8_0) and Q8_K per super-block of 256 (model.quantize_act_q8_k).
Q8_ACT_TYPES = {"Q8_0", "Q4_0", "Q4_K", "Q6_K"}
Q8K_ACT_TYPES = {"Q4_K", "Q6_K"}


def q8_activation_inputs(t, types=Q8_ACT_TYPES):
    """The names of the reference's products (HF weight names; for MLA's absorbed attention
    model.layers.N.self_attn.k_b and .v_b) whose activations the engine and llama.cpp quantise
    to 8 bits, from a GGUF file's tensors {name: (type, array)}. MLA's split attn_k_b and
    attn_v_b are products of their own in both (against q_nope per head, and the attention's
    latent output); a joined attn_kv_b's key half the engine applies to fp32 activations
    (matmul_t), its value half as a product."""
    names = set()
    for name, (ty, _) in t.items():
        if ty not in types:
            continue
        parts = name.split(".")
        if parts[0] == "blk":
            layer = "model.layers.%s" % parts[1]
            kind = parts[2]
            if kind in ("attn_k_b", "attn_v_b", "attn_kv_b"):
                names.add(layer + ".self_attn." + ("k_b" if kind == "attn_k_b" else "v_b"))
                continue
            names.add("gguf:" + name)
        else:
            names.add("gguf:" + name)
    return names


def read_gguf_model(path):
    meta, t = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch == "llama":
        cfg, w = _gguf_llama(meta, t, path)
    elif arch == "deepseek2":
        cfg, w = _gguf_deepseek2(meta, t, path)
    else:
        raise FormatError("%s: unsupported GGUF architecture %r" % (path, arch))
    # HF names of the weights stored in a type that takes 8-bit activations (an expert's slice
    # of a stacked tensor is a view of it)
    def owner(a):
        return id(a if a.base is None else a.base)

    src = {owner(a): "gguf:" + n for n, (_, a) in t.items()}
    for key, types in (("q8_activation_inputs", Q8_ACT_TYPES),
                       ("q8k_activation_inputs", Q8K_ACT_TYPES)):
        q8 = q8_activation_inputs(t, types)
        for hf, arr in w.items():
            if src.get(owner(arr)) in q8:
                q8.add(hf)
        cfg[key] = sorted(n for n in q8 if not n.startswith("gguf:"))
    return cfg, w, {k: v[0] for k, v in t.items()}


def load_model(path):
    """path: a Hugging Face model directory, a .gguf file, or a directory holding one .gguf file.
    Returns (config dict, {HF name: float64 array}, {stored tensor name: dtype string})."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            path = os.path.join(path, ggufs[0])
    if os.path.isfile(path):
        return read_gguf_model(path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    w, dtypes = read_safetensors_dir(path)
    split_fused_experts(w)
    return cfg, w, dtypes

"""The reference forward pass, float64 numpy, written from the model definitions:
Hugging Face's modeling_llama / qwen2 / qwen3 / deepseek_v2 / deepseek_v3 and DeepSeek's own
inference/model.py. It shares no code with the C engine and favours plainness over speed: the
KV cache holds the expanded per-head keys and values (the "naive" MLA form).

Model(cfg, weights).step(token_ids) feeds tokens at the next positions and returns their logits
[len(token_ids), vocab] as float64.
"""

import math

import numpy as np

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3")


class ModelError(Exception):
    pass


def round_f16(v):
    return np.asarray(v, dtype=np.float64).astype(np.float16).astype(np.float64)


def quantize_act_q8_0(x):
    """x [..., n] (n a multiple of 32) as llama.cpp quantises a matmul's activations for Q8_0 /
    Q4_0 weights, returned dequantised: per block of 32 values of a row, amax = max |x|, the
    step d = amax / 127 stored as fp16, q = x * (127 / amax) rounded to nearest (ties to even, as
    its AVX2 code rounds), so the value is d * q. The product d_w d_x sum(q_w q_x) is then this
    value's product with the dequantised weights. Written from the documented block format, not
    from ggml's code."""
    x = np.asarray(x, dtype=np.float64)
    b = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    # the engine works in fp32: its steps and products are fp32 values
    amax32 = amax.astype(np.float32)
    d = round_f16(amax32 / np.float32(127))
    with np.errstate(divide="ignore"):
        inv = np.where(amax32 > 0, np.float32(127) / amax32, np.float32(0)).astype(np.float32)
    q = np.rint((b.astype(np.float32) * inv).astype(np.float64))
    return (q * d).reshape(x.shape)


def quantize_act_q8_k(x):
    """x [..., n] (n a multiple of 256) as llama.cpp quantises a matmul's activations for Q4_K /
    Q6_K weights (its Q8_K) and tandem's CPU backend does (common/backend/cpu/cpu_qk.c), returned
    dequantised: per super-block of 256 values, the step d = amax / 127 in fp32 and q = x * (127 /
    amax) rounded to nearest (ties to even), so the value is d * q."""
    x = np.asarray(x, dtype=np.float64)
    b = x.reshape(x.shape[:-1] + (x.shape[-1] // 256, 256))
    amax32 = np.max(np.abs(b), axis=-1, keepdims=True).astype(np.float32)
    d = (amax32 / np.float32(127)).astype(np.float64)
    with np.errstate(divide="ignore"):
        inv = np.where(amax32 > 0, np.float32(127) / amax32, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((b.astype(np.float32) * inv).astype(np.float64)), -127, 127)
    return (q * d).reshape(x.shape)


def rms_norm(x, w, eps):
    """x [..., d], w [d]: x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x):
    m = np.max(x)
    return x - m - math.log(np.sum(np.exp(x - m)))


def topk_indices(v, k):
    """Indices of the k largest values of v, largest first, lower index first among ties."""
    return np.argsort(-v, kind="stable")[:k]


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------


def yarn_get_mscale(scale, mscale=1.0):
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim, base, rs, truncate=True):
    """YaRN frequencies (Peng et al.; HF _compute_yarn_parameters, DeepSeek's
    precompute_freqs_cis). `truncate` floors/ceils the correction range (HF, llama.cpp and
    DeepSeek's published code); False rounds it."""
    factor = float(rs["factor"])
    orig = float(rs.get("original_max_position_embeddings"))
    beta_fast = float(rs.get("beta_fast", 32))
    beta_slow = float(rs.get("beta_slow", 1))
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    else:
        lo, hi = round(lo), round(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    extrap_factor = 1.0 - ramp
    return interpolation * (1.0 - extrap_factor) + extrapolation * extrap_factor


def llama3_inv_freq(inv_freq, rs):
    factor = float(rs["factor"])
    lff = float(rs.get("low_freq_factor", 1.0))
    hff = float(rs.get("high_freq_factor", 4.0))
    old = float(rs["original_max_position_embeddings"])
    low_wl, high_wl = old / lff, old / hff
    wavelen = 2 * math.pi / inv_freq
    out = np.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lff) / (hff - lff)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return np.where(medium, smoothed, out)


class Rope:
    """inv_freq [dim/2]; `layout` "half" rotates (x[i], x[i + dim/2]) (HF rotate_half),
    "adjacent" rotates (x[2i], x[2i+1]) (DeepSeek's complex form, GGUF's permuted llama);
    `attn_factor` multiplies cos and sin (YaRN)."""

    def __init__(self, dim, inv_freq, layout, attn_factor=1.0):
        self.dim, self.inv_freq, self.layout, self.attn_factor = dim, inv_freq, layout, attn_factor

    def apply(self, x, positions):
        """x [T, n_heads, dim], positions [T]."""
        ang = np.outer(np.asarray(positions, dtype=np.float64), self.inv_freq)  # [T, dim/2]
        cos = (np.cos(ang) * self.attn_factor)[:, None, :]
        sin = (np.sin(ang) * self.attn_factor)[:, None, :]
        h = self.dim // 2
        if self.layout == "half":
            x1, x2 = x[..., :h], x[..., h:]
            return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out


def make_rope(cfg, dim, default_layout, yarn_truncate=True):
    base = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    attn_factor = 1.0
    if kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, rs)
    elif kind == "yarn":
        inv_freq = yarn_inv_freq(dim, base, rs, truncate=yarn_truncate)
        factor = float(rs["factor"])
        if cfg.get("model_type") in DEEPSEEK_FAMILY:  # HF DeepseekV2YarnRotaryEmbedding
            attn_factor = yarn_get_mscale(factor, float(rs.get("mscale", 1.0))) / yarn_get_mscale(
                factor, float(rs.get("mscale_all_dim") or 0.0))
        elif rs.get("attention_factor") is not None:
            attn_factor = float(rs["attention_factor"])
        elif rs.get("mscale") and rs.get("mscale_all_dim"):
            attn_factor = yarn_get_mscale(factor, rs["mscale"]) / yarn_get_mscale(
                factor, rs["mscale_all_dim"])
        else:
            attn_factor = yarn_get_mscale(factor)
    elif kind not in ("default", None):
        raise ModelError("rope_scaling type %r is not supported" % kind)
    if cfg.get("rope_freq_factors") is not None:  # GGUF rope_freqs tensor: divide each frequency
        inv_freq = inv_freq / np.asarray(cfg["rope_freq_factors"], dtype=np.float64)
    layout = cfg.get("rope_layout", default_layout)
    return Rope(dim, inv_freq, layout, attn_factor)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Model:
    def __init__(self, cfg, weights, yarn_truncate=True):
        self.cfg = cfg
        self.w = weights
        self.arch = cfg.get("model_type")
        if self.arch not in LLAMA_FAMILY + DEEPSEEK_FAMILY:
            raise ModelError("model_type %r is not supported" % self.arch)
        self.n_layers = int(cfg["num_hidden_layers"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.n_heads = int(cfg["num_attention_heads"])
        self.embed = self._get("model.embed_tokens.weight")  # [vocab, hidden]
        self.vocab = self.embed.shape[0]
        if "lm_head.weight" in weights:
            self.lm_head = weights["lm_head.weight"]  # [vocab, hidden]
        elif cfg.get("tie_word_embeddings", False) or self.arch in LLAMA_FAMILY:
            self.lm_head = self.embed
        else:
            raise ModelError("missing tensor lm_head.weight")
        if self.arch in LLAMA_FAMILY:
            self.n_kv = int(cfg.get("num_key_value_heads") or self.n_heads)
            self.head_dim = int(cfg.get("head_dim") or self.hidden // self.n_heads)
            self.rope = make_rope(cfg, self.head_dim, "half")
            self.scale = self.head_dim ** -0.5
            self.window = cfg.get("sliding_window") if self.arch == "mistral" else None
        else:
            self.q_lora = int(cfg.get("q_lora_rank") or 0)
            self.kv_lora = int(cfg["kv_lora_rank"])
            self.nope = int(cfg["qk_nope_head_dim"])
            self.rope_dim = int(cfg["qk_rope_head_dim"])
            self.v_dim = int(cfg["v_head_dim"])
            layout = "half" if cfg.get("rope_interleave", True) is False else "adjacent"
            self.rope = make_rope(cfg, self.rope_dim, layout, yarn_truncate)
            self.scale = (self.nope + self.rope_dim) ** -0.5
            rs = cfg.get("rope_scaling") or {}
            if rs.get("rope_type", rs.get("type")) == "yarn" and rs.get("mscale_all_dim"):
                m = yarn_get_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
                self.scale *= m * m  # YaRN's mscale enters the softmax scale squared
            self.window = None
        # products whose activations are quantised to 8 bits first, as llama.cpp and the engine
        # do for Q8_0 / Q4_0 weights (formats.read_gguf_model lists them)
        self.q8 = set(cfg.get("q8_activation_inputs") or ())
        self.q8k = set(cfg.get("q8k_activation_inputs") or ()) & self.q8
        self.lm_head_name = ("lm_head.weight" if "lm_head.weight" in weights
                             else "model.embed_tokens.weight")
        self.k_cache = [[] for _ in range(self.n_layers)]  # per layer: list of [n_heads, d] per pos
        self.v_cache = [[] for _ in range(self.n_layers)]
        self.pos = 0

    def _get(self, name):
        if name not in self.w:
            raise ModelError("missing tensor %s" % name)
        return self.w[name]

    def _opt(self, name):
        return self.w.get(name)

    def _act(self, x, name):
        """x as the product with weight `name` sees it: rounded to 8 bits where it is Q8_0 or
        Q4_0 (quantize_act_q8_0) or Q4_K or Q6_K (quantize_act_q8_k), else unchanged."""
        if name in self.q8k:
            return quantize_act_q8_k(x)
        return quantize_act_q8_0(x) if name in self.q8 else x

    def _linear(self, x, prefix):
        """x [T, in] @ W^T (+ b); W = prefix.weight [out, in]."""
        y = self._act(x, prefix + ".weight") @ self._get(prefix + ".weight").T
        b = self._opt(prefix + ".bias")
        return y if b is None else y + b

    def _mlp(self, x, prefix):
        return self._linear(silu(self._linear(x, prefix + ".gate_proj")) *
                            self._linear(x, prefix + ".up_proj"), prefix + ".down_proj")

    def _attend(self, layer, q, k, v, positions):
        """q [T, H, dk], k [T, Hkv, dk], v [T, Hkv, dv] for new positions; appends k, v to the cache
        and returns [T, H * dv]."""
        self.k_cache[layer].extend(list(k))
        self.v_cache[layer].extend(list(v))
        K = np.stack(self.k_cache[layer])  # [S, Hkv, dk]
        V = np.stack(self.v_cache[layer])  # [S, Hkv, dv]
        S, Hkv = K.shape[0], K.shape[1]
        rep = q.shape[1] // Hkv
        K = np.repeat(K, rep, axis=1)
        V = np.repeat(V, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, K) * self.scale  # [H, T, S]
        kpos = np.arange(S)
        mask = kpos[None, :] > np.asarray(positions)[:, None]  # [T, S] causal
        if self.window:
            mask |= kpos[None, :] <= np.asarray(positions)[:, None] - int(self.window)
        scores = np.where(mask[None], -np.inf, scores)
        p = softmax(scores, axis=-1)
        out = np.einsum("hts,shd->thd", p, V)
        return out.reshape(out.shape[0], -1)

    def _llama_attn(self, layer, x, positions):
        p = "model.layers.%d.self_attn" % layer
        T = x.shape[0]
        q = self._linear(x, p + ".q_proj").reshape(T, self.n_heads, self.head_dim)
        k = self._linear(x, p + ".k_proj").reshape(T, self.n_kv, self.head_dim)
        v = self._linear(x, p + ".v_proj").reshape(T, self.n_kv, self.head_dim)
        if self.arch == "qwen3":
            q = rms_norm(q, self._get(p + ".q_norm.weight"), self.eps)
            k = rms_norm(k, self._get(p + ".k_norm.weight"), self.eps)
        q = self.rope.apply(q, positions)
        k = self.rope.apply(k, positions)
        return self._linear(self._attend(layer, q, k, v, positions), p + ".o_proj")

    def _mla(self, layer, x, positions):
        p = "model.layers.%d.self_attn" % layer
        T, H = x.shape[0], self.n_heads
        if self.q_lora:
            q = self._linear(rms_norm(self._linear(x, p + ".q_a_proj"),
                                      self._get(p + ".q_a_layernorm.weight"), self.eps),
                             p + ".q_b_proj")
        else:
            q = self._linear(x, p + ".q_proj")
        q = q.reshape(T, H, self.nope + self.rope_dim)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        q_pe = self.rope.apply(q_pe, positions)
        kv = self._linear(x, p + ".kv_a_proj_with_mqa")  # [T, kv_lora + rope_dim]
        c_kv, k_pe = kv[:, :self.kv_lora], kv[:, self.kv_lora:]
        k_pe = self.rope.apply(k_pe[:, None, :], positions)  # [T, 1, rope_dim]
        c_kv = rms_norm(c_kv, self._get(p + ".kv_a_layernorm.weight"), self.eps)
        if p + ".k_b" in self.q8 or p + ".v_b" in self.q8:
            return self._mla_absorbed(layer, p, q_nope, q_pe, c_kv, k_pe, positions)
        kvb = self._linear(c_kv, p + ".kv_b_proj").reshape(T, H, self.nope + self.v_dim)
        k_nope, v = kvb[..., :self.nope], kvb[..., self.nope:]
        qf = np.concatenate([q_nope, q_pe], axis=-1)
        kf = np.concatenate([k_nope, np.repeat(k_pe, H, axis=1)], axis=-1)
        return self._linear(self._attend(layer, qf, kf, v, positions), p + ".o_proj")

    def _mla_absorbed(self, layer, p, q_nope, q_pe, c_kv, k_pe, positions):
        """MLA as the engine and llama.cpp compute it with split k_b / v_b: per head the query's
        latent q_nope Wk_h (Wk_h [nope, R], the key rows of kv_b_proj) against the cached latents,
        the attention's latent output times Wv_h^T; each product's input rounded to 8 bits where
        its weights take that (equal to _mla's form in exact arithmetic)."""
        T, H, R = q_nope.shape[0], self.n_heads, self.kv_lora
        kvb = self._get(p + ".kv_b_proj.weight").reshape(H, self.nope + self.v_dim, R)
        wk, wv = kvb[:, :self.nope, :], kvb[:, self.nope:, :]  # [H, nope, R], [H, v, R]
        q_lat = np.einsum("thn,hnr->thr", self._act(q_nope, p + ".k_b"), wk)
        qf = np.concatenate([q_lat, q_pe], axis=-1)  # [T, H, R + rope]
        kf = np.concatenate([c_kv[:, None, :], k_pe], axis=-1)  # [T, 1, R + rope]
        o_lat = self._attend(layer, qf, kf, c_kv[:, None, :], positions).reshape(T, H, R)
        o = np.einsum("thr,hvr->thv", self._act(o_lat, p + ".v_b"), wv).reshape(T, -1)
        return self._linear(o, p + ".o_proj")

    def _moe(self, layer, x):
        p = "model.layers.%d.mlp" % layer
        cfg = self.cfg
        n_exp = int(cfg["n_routed_experts"])
        top_k = int(cfg["num_experts_per_tok"])
        n_group = int(cfg.get("n_group") or 1)
        topk_group = int(cfg.get("topk_group") or 1)
        method = cfg.get("topk_method", "greedy")
        logits = self._act(x, p + ".gate.weight") @ self._get(p + ".gate.weight").T  # [T, n_exp]
        if cfg.get("scoring_func", "softmax") == "sigmoid":
            scores = sigmoid(logits)
        else:
            scores = softmax(logits, axis=-1)
        bias = self._opt(p + ".gate.e_score_correction_bias")
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            sel = scores[t] + bias if bias is not None else scores[t].copy()
            if n_group > 1 and method in ("group_limited_greedy", "noaux_tc"):
                g = sel.reshape(n_group, n_exp // n_group)
                if bias is not None:
                    gscore = np.sort(g, axis=-1)[:, -2:].sum(axis=-1)
                else:
                    gscore = g.max(axis=-1)
                keep = topk_indices(gscore, topk_group)
                gmask = np.ones(n_group, dtype=bool)
                gmask[keep] = False
                g = np.where(gmask[:, None], -np.inf, g)
                sel = g.reshape(-1)
            idx = topk_indices(sel, top_k)
            wts = scores[t][idx]
            if self.arch == "deepseek_v3":
                if cfg.get("norm_topk_prob", False):
                    wts = wts / (wts.sum() + 1e-20)
                wts = wts * float(cfg.get("routed_scaling_factor", 1.0))
            else:
                if top_k > 1 and cfg.get("norm_topk_prob", False):
                    wts = wts / (wts.sum() + 1e-20)
                else:
                    wts = wts * float(cfg.get("routed_scaling_factor", 1.0))
            for e, wt in zip(idx, wts):
                y[t] += wt * self._mlp(x[t:t + 1], "%s.experts.%d" % (p, e))[0]
        if int(cfg.get("n_shared_experts") or 0) > 0:
            y = y + self._mlp(x, p + ".shared_experts")
        return y

    def _is_moe(self, layer):
        cfg = self.cfg
        return (self.arch in DEEPSEEK_FAMILY and int(cfg.get("n_routed_experts") or 0) > 0 and
                layer >= int(cfg.get("first_k_dense_replace", 0)) and
                layer % int(cfg.get("moe_layer_freq", 1)) == 0)

    def step(self, token_ids):
        """Feeds token_ids at positions pos..pos+T-1; returns logits [T, vocab] float64."""
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.size == 0 or ids.min() < 0 or ids.max() >= self.vocab:
            raise ModelError("token id out of range [0, %d)" % self.vocab)
        positions = np.arange(self.pos, self.pos + len(ids))
        x = self.embed[ids]  # [T, hidden]
        for i in range(self.n_layers):
            p = "model.layers.%d" % i
            h = rms_norm(x, self._get(p + ".input_layernorm.weight"), self.eps)
            if self.arch in LLAMA_FAMILY:
                x = x + self._llama_attn(i, h, positions)
            else:
                x = x + self._mla(i, h, positions)
            h = rms_norm(x, self._get(p + ".post_attention_layernorm.weight"), self.eps)
            x = x + (self._moe(i, h) if self._is_moe(i) else self._mlp(h, p + ".mlp"))
        x = rms_norm(x, self._get("model.norm.weight"), self.eps)
        self.pos += len(ids)
        return self._act(x, self.lm_head_name) @ self.lm_head.T


def generate(model, prompt_ids, steps):
    """Greedy: prefill the prompt, then one token per step. Returns (greedy ids, list of logits
    [vocab] for each step: the logits that chose that step's token)."""
    logits = model.step(prompt_ids)[-1]
    out_ids, out_logits = [], []
    for _ in range(steps):
        tok = int(np.argmax(logits))
        out_ids.append(tok)
        out_logits.append(logits)
        if len(out_ids) < steps:
            logits = model.step([tok])[-1]
    return out_ids, out_logits

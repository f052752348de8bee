/* test_model_load.c: the model loader: dtype decoding against hand-computed values, and every kind
 * of malformed input (truncated files, headers that lie, unknown dtypes, missing tensors, wrong
 * shapes, bad configuration) for safetensors directories and GGUF files. Each must give an error
 * whose message names the file and the tensor or field; none may crash or read out of bounds
 * (run under ASan). */
#include "model_fixture.h"
#include "td_error.h"
#include "td_model.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/td_model_XXXXXX";

/* ---- dtypes ---- */

START_TEST(test_dtype_decode)
{
    float out[256];
    /* BF16: the top half of an fp32 */
    uint16_t bf[4] = {0x3F80, 0xC000, 0x3EAB, 0x0000};
    td_mat_t m = {TD_DTYPE_BF16, 1, 4, bf, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 1.0f && out[1] == -2.0f && out[3] == 0.0f);
    ck_assert(out[2] == 0.333984375f); /* 0x3EAB0000 */
    /* F16: normal, subnormal, negative, infinity */
    uint16_t h[4] = {0x3C00, 0x0001, 0xC500, 0x7C00};
    m = (td_mat_t){TD_DTYPE_F16, 1, 4, h, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 1.0f && out[1] == ldexpf(1, -24) && out[2] == -5.0f && isinf(out[3]));
    /* F8 E4M3 (bias 7): 0x38 = 1.0, 0x7E = 448 (largest), 0x01 = 2^-9 (subnormal),
     * 0xC4 = -(1 + 4/8) * 2^(8-7) = -3 */
    uint8_t f8[4] = {0x38, 0x7E, 0x01, 0xC4};
    float scale1[1] = {0.5f};
    m = (td_mat_t){TD_DTYPE_F8_E4M3, 1, 4, f8, scale1, 1, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 0.5f && out[1] == 224.0f && out[2] == ldexpf(1, -10) && out[3] == -1.5f);
    /* F8 block scales: a 130 x 130 matrix has 2 x 2 blocks of 128 */
    static uint8_t big[130 * 130];
    memset(big, 0x38, sizeof(big)); /* all 1.0 */
    float sc[4] = {1, 2, 3, 4};
    m = (td_mat_t){TD_DTYPE_F8_E4M3, 130, 130, big, sc, 2, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 1 && out[127] == 1 && out[128] == 2 && out[129] == 2);
    td_mat_row_f32(&m, 129, out);
    ck_assert(out[0] == 3 && out[129] == 4);
    /* a view starting at row 128 of the same grid uses the second scale row */
    m.scale_row0 = 128;
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 3 && out[128] == 4);
    /* Q8_0: fp16 scale 0.5 (0x3800) then 32 int8 */
    uint8_t q[34] = {0x00, 0x38};
    for (int i = 0; i < 32; i++)
        q[2 + i] = (uint8_t)(int8_t)(i - 16);
    m = (td_mat_t){TD_DTYPE_Q8_0, 1, 32, q, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == -8.0f && out[16] == 0.0f && out[31] == 7.5f);
    ck_assert_uint_eq(td_dtype_row_bytes(TD_DTYPE_Q8_0, 64), 68);
    /* Q4_0: d = 0.5, then value j in the low nibble of byte j and 16 + j in the high one,
     * offset by 8 */
    uint8_t q4[18] = {0x00, 0x38, 0x9A, 0x0F};
    m = (td_mat_t){TD_DTYPE_Q4_0, 1, 32, q4, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 1.0f && out[16] == 0.5f && out[1] == 3.5f && out[17] == -4.0f);
    ck_assert(out[2] == -4.0f);
    /* Q4_K: d = 1, dmin = 0.5; 6-bit scales and mins of sub-blocks 0-3 in bytes 0-7, those of
     * 4-7 from the low/high nibbles of bytes 8-11 and the top 2 bits of bytes 0-7 */
    static uint8_t qk[144];
    memset(qk, 0, sizeof(qk));
    qk[1] = 0x3C;              /* d = 1.0 */
    qk[3] = 0x38;              /* dmin = 0.5 */
    qk[4 + 0] = 3 | (1 << 6);  /* scale 0 = 3, top bits of scale 4 = 1 */
    qk[4 + 4] = 4 | (1 << 6);  /* min 0 = 4, top bits of min 4 = 1 */
    qk[4 + 5] = 2;             /* min 1 = 2 */
    qk[4 + 8] = 5 | (3 << 4);  /* scale 4 low = 5, min 4 low = 3 */
    qk[16 + 0] = 0x07;         /* value 0 = 7 (sub-block 0), value 32 = 0 (sub-block 1) */
    qk[16 + 64] = 0x02;        /* value 128 = 2 (sub-block 4) */
    m = (td_mat_t){TD_DTYPE_Q4_K, 1, 256, qk, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 19.0f);                  /* 1 * 3 * 7 - 0.5 * 4 */
    ck_assert(out[1] == -2.0f && out[32] == -1.0f);
    ck_assert(out[128] == 21.0f * 2 - 0.5f * 19); /* scale 5 + 16, min 3 + 16 */
    ck_assert_uint_eq(td_dtype_row_bytes(TD_DTYPE_Q4_K, 512), 288);
    /* Q6_K: d = 1 at byte 208, scales at 192; value 0: low 4 bits ql[0], high 2 bits qh[0] bits
     * 0-1, minus 32; value 64: ql[0] high nibble, qh[0] bits 4-5 (scale 4) */
    static uint8_t q6[210];
    memset(q6, 0, sizeof(q6));
    q6[0] = 0x35;           /* value 0 low = 5, value 64 low = 3 */
    q6[128] = 0x02 | 0x30;  /* value 0 high = 2, value 64 high = 3 */
    q6[192] = 2;            /* scale of values 0..15 */
    q6[192 + 4] = (uint8_t)-1; /* scale of values 64..79 */
    q6[209] = 0x3C;
    m = (td_mat_t){TD_DTYPE_Q6_K, 1, 256, q6, NULL, 0, 0};
    td_mat_row_f32(&m, 0, out);
    ck_assert(out[0] == 10.0f);        /* 2 * (5 + 32 - 32) */
    ck_assert(out[64] == -(51 - 32));  /* -1 * (3 + 48 - 32) */
    ck_assert(out[1] == 2 * -32.0f);
    ck_assert_uint_eq(td_dtype_row_bytes(TD_DTYPE_Q6_K, 256), 210);
    ck_assert_int_eq(td_dtype_block(TD_DTYPE_Q6_K), 256);
}
END_TEST

/* ---- helpers ---- */

static void write_llama_dir(const char *dir)
{
    fx_set_t s = {0};
    mkdir(dir, 0755);
    fx_generate(&s, &fx_llama_cfg, 7);
    fx_write_config(dir, &fx_llama_cfg);
    fx_st_opts_t o = {FX_F32, 1, false};
    fx_write_safetensors(dir, &s, &fx_llama_cfg, &o);
    fx_free(&s);
}

static void read_file(const char *path, uint8_t **data, size_t *len)
{
    char *d;
    ck_assert_int_eq(td_file_read_all(path, &d, len), 0);
    *data = (uint8_t *)d;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* Rewrite a safetensors file's JSON header, replacing the first `old` with `repl`. */
static void st_patch(const char *path, const char *old, const char *repl)
{
    uint8_t *d;
    size_t len;
    read_file(path, &d, &len);
    uint64_t hl;
    memcpy(&hl, d, 8);
    char *hdr = strndup((char *)d + 8, hl);
    char *at = strstr(hdr, old);
    ck_assert_msg(at != NULL, "pattern %s not in header", old);
    size_t nl = hl - strlen(old) + strlen(repl);
    char *nh = malloc(nl + 1);
    size_t pre = (size_t)(at - hdr);
    memcpy(nh, hdr, pre);
    strcpy(nh + pre, repl);
    strcat(nh, at + strlen(old));
    FILE *f = fopen(path, "wb");
    uint64_t nl64 = nl;
    fwrite(&nl64, 8, 1, f);
    fwrite(nh, 1, nl, f);
    fwrite(d + 8 + hl, 1, len - 8 - hl, f);
    fclose(f);
    free(hdr);
    free(nh);
    free(d);
}

/* Load must fail with `code` and a message containing both needles (NULL: not checked). */
static void expect_fail(const char *path, int code, const char *n1, const char *n2)
{
    td_model_t *m = (td_model_t *)0x1;
    int rc = td_model_load(path, &m);
    ck_assert_msg(rc == code, "%s: got %s (%s), want %s", path, td_err_name(rc), td_err_msg(),
                  td_err_name(code));
    ck_assert_ptr_null(m);
    if (n1)
        ck_assert_msg(strstr(td_err_msg(), n1), "message \"%s\" lacks \"%s\"", td_err_msg(), n1);
    if (n2)
        ck_assert_msg(strstr(td_err_msg(), n2), "message \"%s\" lacks \"%s\"", td_err_msg(), n2);
}

static void fresh_dir(char *dir, size_t n, const char *name)
{
    snprintf(dir, n, "%s/%s", tmpdir, name);
    write_llama_dir(dir);
}

/* ---- safetensors ---- */

START_TEST(test_st_ok)
{
    char dir[512];
    fresh_dir(dir, sizeof(dir), "ok");
    td_model_t *m;
    ck_assert_int_eq(td_model_load(dir, &m), 0);
    ck_assert_int_eq(m->cfg.arch, TD_ARCH_LLAMA);
    ck_assert_int_eq(m->cfg.n_kv_heads, 2);
    ck_assert_int_eq(m->layers[1].wk.rows, 32);
    ck_assert(!m->cfg.rope_interleaved);
    td_model_free(m);
}
END_TEST

START_TEST(test_st_truncated)
{
    char dir[512], path[600];
    fresh_dir(dir, sizeof(dir), "trunc");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    uint8_t *d;
    size_t len;
    read_file(path, &d, &len);
    /* cut in the data: the last tensor's offsets now lie beyond the file */
    write_bytes(path, d, len - 100);
    expect_fail(dir, TD_EPARSE, "model.safetensors", "outside");
    /* cut in the header */
    write_bytes(path, d, 40);
    expect_fail(dir, TD_EPARSE, "model.safetensors", "header length");
    write_bytes(path, d, 5);
    expect_fail(dir, TD_EPARSE, "model.safetensors", "truncated");
    write_bytes(path, d, 0);
    expect_fail(dir, TD_EPARSE, "model.safetensors", NULL);
    /* every prefix of the header must fail cleanly */
    uint64_t hl;
    memcpy(&hl, d, 8);
    for (size_t cut = 0; cut < 8 + hl; cut += 7) {
        write_bytes(path, d, cut);
        td_model_t *m;
        ck_assert_int_ne(td_model_load(dir, &m), 0);
    }
    free(d);
}
END_TEST

START_TEST(test_st_lying_header)
{
    char dir[512], path[600];
    fresh_dir(dir, sizeof(dir), "lie");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    /* a shape that needs more bytes than the offsets give */
    st_patch(path, "\"shape\": [64]", "\"shape\": [65]");
    expect_fail(dir, TD_EPARSE, "model.safetensors", "data bytes");
    fresh_dir(dir, sizeof(dir), "lie2");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "\"data_offsets\": [0, ", "\"data_offsets\": [99999999, ");
    expect_fail(dir, TD_EPARSE, "model.safetensors", "data_offsets");
    fresh_dir(dir, sizeof(dir), "lie3");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "\"data_offsets\": [0, ", "\"data_offsets\": [-8, ");
    expect_fail(dir, TD_EPARSE, "model.safetensors", "data_offsets");
    fresh_dir(dir, sizeof(dir), "lie4");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "{\"__metadata__\"", "[{\"__metadata__\"");
    expect_fail(dir, TD_EPARSE, "model.safetensors", "JSON");
    fresh_dir(dir, sizeof(dir), "lie5");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "\"shape\": [96, 64]", "\"shape\": [96, -64]");
    expect_fail(dir, TD_EPARSE, "model.safetensors", "shape");
    /* a header length that points past the end */
    fresh_dir(dir, sizeof(dir), "lie6");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    uint8_t *d;
    size_t len;
    read_file(path, &d, &len);
    uint64_t hl = len;
    memcpy(d, &hl, 8);
    write_bytes(path, d, len);
    free(d);
    expect_fail(dir, TD_EPARSE, "model.safetensors", "header length");
}
END_TEST

START_TEST(test_st_dtypes_and_tensors)
{
    char dir[512], path[600];
    fresh_dir(dir, sizeof(dir), "dt1");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "\"model.norm.weight\": {\"dtype\": \"F32\"",
             "\"model.norm.weight\": {\"dtype\": \"Q9\"");
    expect_fail(dir, TD_ENOTSUP, "model.safetensors", "model.norm.weight");
    /* a dtype safetensors knows but the engine cannot compute with, on a required tensor */
    fresh_dir(dir, sizeof(dir), "dt2");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "\"model.norm.weight\": {\"dtype\": \"F32\"",
             "\"model.norm.weight\": {\"dtype\": \"I32\"");
    expect_fail(dir, TD_ENOTSUP, "model.safetensors", "model.norm.weight");
    /* missing tensor: rename it */
    fresh_dir(dir, sizeof(dir), "dt3");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "model.layers.1.self_attn.v_proj.weight",
             "model.layers.1.self_attn.x_proj.weight");
    expect_fail(dir, TD_ENOENT, dir, "model.layers.1.self_attn.v_proj.weight");
    /* wrong shape (same byte count) */
    fresh_dir(dir, sizeof(dir), "dt4");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(
        path,
        "\"model.layers.0.self_attn.k_proj.weight\": {\"dtype\": \"F32\", \"shape\": [32, 64]",
        "\"model.layers.0.self_attn.k_proj.weight\": {\"dtype\": \"F32\", \"shape\": [64, 32]");
    expect_fail(dir, TD_EMISMATCH, "model.safetensors", "model.layers.0.self_attn.k_proj.weight");
    /* an F8 weight without its weight_scale_inv */
    fx_set_t fs = {0};
    snprintf(dir, sizeof(dir), "%s/dt5", tmpdir);
    mkdir(dir, 0755);
    fx_generate(&fs, &fx_deepseek_cfg, 3);
    fx_write_config(dir, &fx_deepseek_cfg);
    fx_write_safetensors(dir, &fs, &fx_deepseek_cfg, &(fx_st_opts_t){FX_F8, 1, false});
    fx_free(&fs);
    td_model_t *m;
    ck_assert_msg(td_model_load(dir, &m) == 0, "%s", td_err_msg());
    td_model_free(m);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_patch(path, "model.layers.0.self_attn.q_a_proj.weight_scale_inv",
             "model.layers.0.self_attn.q_a_proj.weight_scale_xxx");
    expect_fail(dir, TD_ENOENT, "q_a_proj.weight\"", "scale_inv");
}
END_TEST

START_TEST(test_config_errors)
{
    char dir[512], path[600];
    fresh_dir(dir, sizeof(dir), "cfg");
    snprintf(path, sizeof(path), "%s/config.json", dir);
    const char *bad[][3] = {
        {"{\"model_type\": \"gpt2\"}", "gpt2", NULL},
        {"{\"hidden_size\": 64}", "model_type", NULL},
        {"{\"model_type\": \"llama\", \"vocab_size\": 96}", "hidden_size", NULL},
        {"not json", "config.json", NULL},
        {"{\"model_type\": \"llama\", \"vocab_size\": 96, \"hidden_size\": 64, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
         "\"intermediate_size\": 96}",
         "head", NULL},
        {"{\"model_type\": \"llama\", \"vocab_size\": \"many\", \"hidden_size\": 64}", "vocab_size",
         NULL},
        {"{\"model_type\": \"llama\", \"vocab_size\": 96, \"hidden_size\": 64, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 96, "
         "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}}",
         "dynamic", NULL},
        {"{\"model_type\": \"qwen2\", \"vocab_size\": 96, \"hidden_size\": 64, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 96, "
         "\"use_sliding_window\": true, \"sliding_window\": 32}",
         "use_sliding_window", NULL},
        {"{\"model_type\": \"mistral\", \"vocab_size\": 96, \"hidden_size\": 64, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 96, "
         "\"sliding_window\": -4}",
         "sliding_window", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_bytes(path, bad[i][0], strlen(bad[i][0]));
        td_model_t *m;
        int rc = td_model_load(dir, &m);
        ck_assert_msg(rc != 0, "config %zu accepted", i);
        ck_assert_msg(strstr(td_err_msg(), "config.json") && strstr(td_err_msg(), bad[i][1]),
                      "config %zu: message \"%s\"", i, td_err_msg());
    }
    /* a config that disagrees with the weights: named tensor and both shapes */
    const char *wrong = "{\"model_type\": \"llama\", \"vocab_size\": 96, \"hidden_size\": 64, "
                        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                        "\"num_key_value_heads\": 2, \"intermediate_size\": 100}";
    write_bytes(path, wrong, strlen(wrong));
    expect_fail(dir, TD_EMISMATCH, "model.layers.0.mlp.gate_proj.weight", "[96, 64]");
    unlink(path);
    expect_fail(dir, TD_ENOENT, "config.json", NULL);
    expect_fail("/nonexistent/model", TD_ENOENT, "/nonexistent/model", NULL);
}
END_TEST

START_TEST(test_sharded_errors)
{
    char dir[512], path[600];
    fresh_dir(dir, sizeof(dir), "shard");
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"weight_map\": {\"model.norm.weight\": \"model-00002.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    expect_fail(dir, TD_ENOENT, "model-00002.safetensors", NULL);
    idx = "{\"weight_map\": {\"model.norm.weight\": \"../etc/passwd\"}}";
    write_bytes(path, idx, strlen(idx));
    expect_fail(dir, TD_EPARSE, "model.norm.weight", "shard");
    idx = "{\"weight_map\": {\"lm_head.weight\": \"model.safetensors\", "
          "\"model.bogus.weight\": \"model.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    expect_fail(dir, TD_ENOENT, "model.bogus.weight", NULL);
    idx = "{\"weights\": {}}";
    write_bytes(path, idx, strlen(idx));
    expect_fail(dir, TD_EPARSE, "weight_map", NULL);
}
END_TEST

/* ---- GGUF ---- */

static void write_gguf(const char *path)
{
    fx_set_t s = {0};
    fx_generate(&s, &fx_llama_cfg, 9);
    fx_write_gguf(path, &s, &fx_llama_cfg, false, false);
    fx_free(&s);
}

/* Offset just past the tensor-info name `name` (its u32 ndim follows). */
static size_t info_at(const uint8_t *d, size_t len, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 8; i + nl + 4 < len; i++) {
        uint64_t l;
        memcpy(&l, d + i - 8, 8);
        if (l == nl && memcmp(d + i, name, nl) == 0)
            return i + nl;
    }
    ck_abort_msg("tensor info %s not found", name);
    return 0;
}

START_TEST(test_gguf_ok)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ok.gguf", tmpdir);
    write_gguf(path);
    td_model_t *m;
    ck_assert_msg(td_model_load(path, &m) == 0, "%s", td_err_msg());
    ck_assert_int_eq(m->cfg.arch, TD_ARCH_LLAMA);
    ck_assert(m->cfg.rope_interleaved);
    ck_assert_int_eq(m->cfg.vocab_size, 96);
    ck_assert_int_eq(m->cfg.eos_id, 2);
    td_model_free(m);
}
END_TEST

START_TEST(test_gguf_truncated)
{
    char path[512], bad[512];
    snprintf(path, sizeof(path), "%s/t.gguf", tmpdir);
    snprintf(bad, sizeof(bad), "%s/t_bad.gguf", tmpdir);
    write_gguf(path);
    uint8_t *d;
    size_t len;
    read_file(path, &d, &len);
    size_t data_start = info_at(d, len, "blk.1.ffn_down.weight") + 4 + 16 + 4 + 8;
    /* every cut inside the header region, and a few in the data */
    for (size_t cut = 0; cut < data_start + 64; cut++) {
        write_bytes(bad, d, cut);
        td_model_t *m;
        int rc = td_model_load(bad, &m);
        ck_assert_msg(rc != 0, "cut at %zu accepted", cut);
        ck_assert_msg(strstr(td_err_msg(), "t_bad.gguf"), "cut %zu: \"%s\"", cut, td_err_msg());
    }
    write_bytes(bad, d, len - 1);
    expect_fail(bad, TD_EPARSE, "t_bad.gguf", "blk.1.ffn_down.weight"); /* the last tensor */
    free(d);
}
END_TEST

/* general.alignment stored as a float32 NaN (found by libFuzzer): refused by name, with no
 * conversion of the NaN to an integer on the way (UBSan caught that). */
START_TEST(test_gguf_alignment_nan)
{
    static const uint8_t file[] = {
        0x47, 0x47, 0x55, 0x46, 0x03, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x67, 0x65, 0x6e, 0x65, 0x72, 0x61, 0x6c, 0x2e, 0x61, 0x72, 0x63, 0x68, 0x69, 0x74, 0x65, 0x63,
        0x74, 0x75, 0x72, 0x65, 0x08, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x6c, 0x6c, 0x61, 0x6d, 0x61, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x67, 0x65, 0x6e,
        0x65, 0x72, 0x61, 0x6c, 0x2e, 0x61, 0x6c, 0x69, 0x67, 0x6e, 0x6d, 0x65, 0x6e, 0x74, 0x06, 0x00,
        0x00, 0x00, 0xe0, 0xff, 0xff, 0xff, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x65, 0x6c,
        0x61, 0x6d, 0x61, 0x2e, 0x72, 0x6f, 0x70, 0x65, 0x2e, 0x66, 0x72, 0x00, 0x00, 0xc6, 0x00, 0x00,
        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x71, 0x02, 0x00, 0x00,
        0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0xfc, 0xff, 0xff, 0xa1, 0xe0,
        0xe7,
    };
    char path[600];
    snprintf(path, sizeof(path), "%s/nan.gguf", tmpdir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(file, 1, sizeof(file), f), sizeof(file));
    fclose(f);
    expect_fail(path, TD_EPARSE, "nan.gguf", "general.alignment");
}
END_TEST

START_TEST(test_gguf_lying_header)
{
    char path[512], bad[512];
    snprintf(path, sizeof(path), "%s/l.gguf", tmpdir);
    snprintf(bad, sizeof(bad), "%s/l_bad.gguf", tmpdir);
    write_gguf(path);
    uint8_t *d;
    size_t len;
    read_file(path, &d, &len);
    uint8_t *c = malloc(len);

    memcpy(c, d, len);
    memcpy(c, "GGUX", 4);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", "magic");

    memcpy(c, d, len);
    c[4] = 2;
    write_bytes(bad, c, len);
    expect_fail(bad, TD_ENOTSUP, "l_bad.gguf", "version");

    memcpy(c, d, len); /* tensor count */
    uint64_t huge = 1ull << 50;
    memcpy(c + 8, &huge, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", "tensors");

    memcpy(c, d, len); /* metadata count larger than the entries present */
    uint64_t nkv;
    memcpy(&nkv, d + 16, 8);
    nkv += 3;
    memcpy(c + 16, &nkv, 8);
    write_bytes(bad, c, len);
    td_model_t *m;
    ck_assert_int_ne(td_model_load(bad, &m), 0);

    const char *t = "blk.0.attn_q.weight";
    size_t at = info_at(d, len, t);
    memcpy(c, d, len); /* 5 dimensions */
    c[at] = 5;
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", t);

    memcpy(c, d, len); /* offset beyond the data */
    uint64_t off = (uint64_t)len;
    memcpy(c + at + 4 + 16 + 4, &off, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", t);

    memcpy(c, d, len); /* misaligned offset */
    memcpy(&off, d + at + 4 + 16 + 4, 8);
    off += 4;
    memcpy(c + at + 4 + 16 + 4, &off, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", t);

    memcpy(c, d, len); /* a dimension that overflows */
    uint64_t dim = ~0ull;
    memcpy(c + at + 4, &dim, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", t);

    memcpy(c, d, len); /* unsupported ggml type (Q5_K = 13) */
    uint32_t ty = 13;
    memcpy(c + at + 4 + 16, &ty, 4);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_ENOTSUP, "l_bad.gguf", t);

    memcpy(c, d, len); /* Q4_K (blocks of 256) on rows of 64 */
    ty = 12;
    memcpy(c + at + 4 + 16, &ty, 4);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", "not a multiple of 256");

    memcpy(c, d, len); /* an unknown ggml type number */
    ty = 999;
    memcpy(c + at + 4 + 16, &ty, 4);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_ENOTSUP, "l_bad.gguf", t);

    memcpy(c, d, len); /* wrong shape: swap the two dims of attn_k (same size) */
    size_t ak = info_at(d, len, "blk.0.attn_k.weight");
    memcpy(c + ak + 4, d + ak + 12, 8);
    memcpy(c + ak + 12, d + ak + 4, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EMISMATCH, "l_bad.gguf", "blk.0.attn_k.weight");

    memcpy(c, d, len); /* a missing tensor: rename it */
    size_t an = info_at(d, len, "blk.1.ffn_up.weight") - 2;
    c[an] = 'X';
    write_bytes(bad, c, len);
    expect_fail(bad, TD_ENOENT, "l_bad.gguf", "blk.1.ffn_up.weight");

    memcpy(c, d, len); /* a key string whose length runs past the end */
    uint64_t sl = 1ull << 40;
    memcpy(c + 24, &sl, 8);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", "truncated");

    /* missing metadata: rename the key */
    memcpy(c, d, len);
    uint8_t *k = memmem(c, len, "llama.embedding_length", 22);
    ck_assert_ptr_nonnull(k);
    k[0] = 'X';
    write_bytes(bad, c, len);
    expect_fail(bad, TD_EPARSE, "l_bad.gguf", "llama.embedding_length");

    /* architecture not supported */
    memcpy(c, d, len);
    k = memmem(c, len, "llama", 5); /* the general.architecture value comes first */
    memcpy(k, "gemma", 5);
    write_bytes(bad, c, len);
    expect_fail(bad, TD_ENOTSUP, "l_bad.gguf", "gemma");

    /* random corruption of the header: any outcome but a crash */
    size_t hdr = info_at(d, len, "blk.1.ffn_down.weight") + 32;
    uint64_t rng = 12345;
    for (int it = 0; it < 400; it++) {
        memcpy(c, d, len);
        for (int f = 0; f < 3; f++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            c[(rng >> 33) % hdr] ^= (uint8_t)(1u << ((rng >> 20) & 7));
        }
        write_bytes(bad, c, len);
        if (td_model_load(bad, &m) == 0)
            td_model_free(m);
    }
    free(c);
    free(d);
}
END_TEST

int main(void)
{
    if (!mkdtemp(tmpdir))
        return 1;
    Suite *s = suite_create("model_load");
    TCase *tc = tcase_create("load");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_dtype_decode);
    tcase_add_test(tc, test_st_ok);
    tcase_add_test(tc, test_st_truncated);
    tcase_add_test(tc, test_st_lying_header);
    tcase_add_test(tc, test_st_dtypes_and_tensors);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_sharded_errors);
    tcase_add_test(tc, test_gguf_ok);
    tcase_add_test(tc, test_gguf_truncated);
    tcase_add_test(tc, test_gguf_lying_header);
    tcase_add_test(tc, test_gguf_alignment_nan);
    suite_add_tcase(s, tc);
    int failed = td_check_run(s);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        return 1;
    return failed ? 1 : 0;
}

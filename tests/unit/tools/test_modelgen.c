/* test_modelgen.c: the mkmodel writer (td_modelgen.h): option parsing, refused combinations and
 * unusable inputs with clear errors, parameter counts from the architecture's own formula,
 * well-formed safetensors/GGUF headers, determinism. The values themselves are checked against
 * the independent Python readers in tests/reference/test_mkmodel.py. */
#include "td_error.h"
#include "modelgen_impl.h"
#include "td_model.h"
#include "td_modelgen.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <math.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/td_modelgen_XXXXXX";

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmpdir, "/tmp/td_modelgen_XXXXXX");
}

static td_modelgen_opts_t opts(td_modelgen_arch_t arch, const char *out)
{
    td_modelgen_opts_t o;
    memset(&o, 0, sizeof(o));
    o.arch = arch;
    o.seed = 1;
    o.shards = 1;
    o.out_dir = out;
    return o;
}

START_TEST(test_parse)
{
    td_modelgen_arch_t a;
    td_modelgen_preset_t p;
    td_modelgen_dtype_t d;
    ck_assert_int_eq(td_modelgen_parse_arch("deepseek_v2", &a), 0);
    ck_assert_int_eq(a, TD_MODELGEN_DEEPSEEK_V2);
    ck_assert_int_eq(td_modelgen_parse_arch("qwen3", &a), 0);
    ck_assert_int_eq(a, TD_MODELGEN_QWEN3);
    ck_assert_int_eq(td_modelgen_parse_arch("Llama", &a), TD_EINVAL);
    ck_assert(strstr(td_err_msg(), "Llama") != NULL);
    ck_assert_int_eq(td_modelgen_parse_arch(NULL, &a), TD_EINVAL);
    ck_assert_int_eq(td_modelgen_parse_preset("bench", &p), 0);
    ck_assert_int_eq(p, TD_MODELGEN_BENCH);
    ck_assert_int_eq(td_modelgen_parse_preset("huge", &p), TD_EINVAL);
    ck_assert_int_eq(td_modelgen_parse_preset("dsv2lite", &p), 0);
    ck_assert_int_eq(p, TD_MODELGEN_DSV2LITE);
    /* the shape presets belong to one architecture each */
    td_modelgen_opts_t bad = {
        .arch = TD_MODELGEN_QWEN3, .preset = TD_MODELGEN_LLAMA8B, .out_dir = "/nonexistent/x"};
    ck_assert_int_eq(td_modelgen_write(&bad, NULL), TD_EINVAL);
    ck_assert(strstr(td_err_msg(), "llama8b") != NULL);
    bad.arch = TD_MODELGEN_LLAMA;
    bad.preset = TD_MODELGEN_DSV2LITE;
    ck_assert_int_eq(td_modelgen_write(&bad, NULL), TD_EINVAL);
    ck_assert_int_eq(td_modelgen_parse_dtype("bf16", &d), 0);
    ck_assert_int_eq(d, TD_MODELGEN_BF16);
    ck_assert_int_eq(td_modelgen_parse_dtype("q8_0", &d), 0);
    ck_assert_int_eq(d, TD_MODELGEN_Q8_0);
    ck_assert_int_eq(td_modelgen_parse_dtype("q4_k_m", &d), 0);
    ck_assert_int_eq(d, TD_MODELGEN_Q4_K_M);
    ck_assert_int_eq(td_modelgen_parse_dtype("q6_k", &d), 0);
    ck_assert_int_eq(d, TD_MODELGEN_Q6_K);
    ck_assert_int_eq(td_modelgen_parse_dtype("q4_K", &d), TD_EINVAL);
    ck_assert_int_eq(td_modelgen_parse_preset("small", &p), 0);
    ck_assert_int_eq(p, TD_MODELGEN_SMALL);
    ck_assert_int_eq(td_modelgen_parse_dtype("f8", &d), TD_EINVAL);
}
END_TEST

/* ggml's reference quantizers, read back by the engine's dequantisation: values already on a
 * format's grid come back exactly, others within the format's step. */
START_TEST(test_quantizers)
{
    enum { N = 512 };
    static float v[N], back[N];
    static uint8_t q[N * 2];
    /* on Q4_0's grid: d = max / -8 with max = -8 -> d = 1, levels -8..7 */
    for (int i = 0; i < 32; i++)
        v[i] = (float)((i % 16) - 8);
    td__mg_quantize(MG_GGML_Q4_0, v, 32, q);
    td_mat_t m = {TD_DTYPE_Q4_0, 1, 32, q, NULL, 0, 0};
    td_mat_row_f32(&m, 0, back);
    for (int i = 0; i < 32; i++)
        ck_assert_msg(back[i] == v[i], "Q4_0 value %d: %g, want %g", i, back[i], v[i]);
    /* a smooth signal with a different range per 32 values */
    float amax = 0;
    for (int i = 0; i < N; i++) {
        v[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i / 32));
        amax = fmaxf(amax, fabsf(v[i]));
    }
    const struct {
        int ggml;
        td_dtype_t dt;
        double tol; /* of the block's largest magnitude */
    } fmts[] = {{MG_GGML_Q8_0, TD_DTYPE_Q8_0, 1.0 / 200},
                {MG_GGML_Q4_0, TD_DTYPE_Q4_0, 1.0 / 8},
                {MG_GGML_Q4_K, TD_DTYPE_Q4_K, 1.0 / 8},
                {MG_GGML_Q6_K, TD_DTYPE_Q6_K, 1.0 / 30}};
    for (size_t f = 0; f < TD_ARRAY_LEN(fmts); f++) {
        int blk = fmts[f].dt == TD_DTYPE_Q4_K || fmts[f].dt == TD_DTYPE_Q6_K ? 256 : 32;
        memset(q, 0, sizeof(q));
        td__mg_quantize(fmts[f].ggml, v, N, q);
        m = (td_mat_t){fmts[f].dt, 1, N, q, NULL, 0, 0};
        td_mat_row_f32(&m, 0, back);
        double worst = 0;
        for (int b = 0; b < N / blk; b++) {
            float bmax = 0;
            for (int i = 0; i < blk; i++)
                bmax = fmaxf(bmax, fabsf(v[b * blk + i]));
            for (int i = 0; i < blk; i++)
                worst = fmax(worst, fabs(back[b * blk + i] - v[b * blk + i]) / bmax);
        }
        ck_assert_msg(worst < fmts[f].tol, "%s: error %g of the block's range",
                      td_dtype_name(fmts[f].dt), worst);
        ck_assert_msg(worst > 0, "%s: lossless on a signal off its grid?",
                      td_dtype_name(fmts[f].dt));
    }
    /* an all-zero block stays zero */
    memset(v, 0, sizeof(v));
    td__mg_quantize(MG_GGML_Q6_K, v, 256, q);
    m = (td_mat_t){TD_DTYPE_Q6_K, 1, 256, q, NULL, 0, 0};
    td_mat_row_f32(&m, 0, back);
    for (int i = 0; i < 256; i++)
        ck_assert(back[i] == 0.0f);
}
END_TEST

START_TEST(test_refused_combinations)
{
    char out[256];
    snprintf(out, sizeof(out), "%s/m", tmpdir);
    struct {
        td_modelgen_opts_t o;
        const char *msg;
    } cases[7];
    cases[0].o = opts(TD_MODELGEN_LLAMA, out);
    cases[0].o.fp8 = true;
    cases[0].msg = "--fp8";
    cases[1].o = opts(TD_MODELGEN_DEEPSEEK_V3, out);
    cases[1].o.fp8 = true;
    cases[1].o.fused_experts = true;
    cases[1].msg = "--fused-experts";
    cases[2].o = opts(TD_MODELGEN_QWEN3, out);
    cases[2].o.gguf = true;
    cases[2].msg = "--gguf";
    cases[3].o = opts(TD_MODELGEN_LLAMA, out);
    cases[3].o.dtype = TD_MODELGEN_Q8_0;
    cases[3].msg = "q8_0";
    cases[4].o = opts(TD_MODELGEN_LLAMA, "");
    cases[4].msg = "output directory";
    cases[5].o = opts(TD_MODELGEN_LLAMA, out);
    cases[5].o.shards = 100;
    cases[5].msg = "--shards";
    cases[6].o = opts(TD_MODELGEN_LLAMA, out);
    cases[6].o.dtype = TD_MODELGEN_Q4_K;
    cases[6].msg = "GGUF only";
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        ck_assert_int_eq(td_modelgen_write(&cases[i].o, NULL), TD_EINVAL);
        ck_assert_msg(strstr(td_err_msg(), cases[i].msg) != NULL, "case %zu: \"%s\"", i,
                      td_err_msg());
    }
    /* nothing was written */
    ck_assert_int_ne(access(out, F_OK), 0);
}
END_TEST

START_TEST(test_bad_inputs)
{
    char out[256], tok[256], path[300];
    snprintf(out, sizeof(out), "%s/no/such/parent", tmpdir);
    td_modelgen_opts_t o = opts(TD_MODELGEN_LLAMA, out);
    ck_assert_int_eq(td_modelgen_write(&o, NULL), TD_ENOENT);
    ck_assert(strstr(td_err_msg(), out) != NULL);

    snprintf(out, sizeof(out), "%s/m", tmpdir);
    snprintf(tok, sizeof(tok), "%s/tok", tmpdir);
    o = opts(TD_MODELGEN_LLAMA, out);
    o.tokenizer_dir = tok;
    ck_assert_int_eq(td_modelgen_write(&o, NULL), TD_ENOENT);
    ck_assert(strstr(td_err_msg(), "tokenizer.json") != NULL);

    ck_assert_int_eq(mkdir(tok, 0755), 0);
    snprintf(path, sizeof(path), "%s/tokenizer.json", tok);
    ck_assert_int_eq(td_file_write_atomic(path, "{\"model\": {\"vocab\": [1]}}", 25), 0);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", tok);
    ck_assert_int_eq(td_file_write_atomic(path, "{}", 2), 0);
    ck_assert_int_eq(td_modelgen_write(&o, NULL), TD_EPARSE);
    ck_assert(strstr(td_err_msg(), "model.vocab") != NULL);

    snprintf(path, sizeof(path), "%s/tokenizer.json", tok);
    ck_assert_int_eq(td_file_write_atomic(path, "{\"model\": ", 10), 0);
    ck_assert_int_eq(td_modelgen_write(&o, NULL), TD_EPARSE);
    ck_assert(strstr(td_err_msg(), "tokenizer.json") != NULL);
}
END_TEST

/* Parameter counts from the architectures' definitions, computed here from the config. */
static int64_t expected_params(const char *dir)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_object *c = json_object_from_file(path);
    ck_assert_ptr_nonnull(c);
#define I(k) ((int64_t)json_object_get_int(json_object_object_get(c, k)))
    int64_t V = I("vocab_size"), H = I("hidden_size"), L = I("num_hidden_layers");
    int64_t nh = I("num_attention_heads"), F = I("intermediate_size");
    const char *type = json_object_get_string(json_object_object_get(c, "model_type"));
    bool tied = json_object_get_boolean(json_object_object_get(c, "tie_word_embeddings"));
    int64_t n = V * H * (tied ? 1 : 2) + H;
    if (strncmp(type, "deepseek", 8) != 0) {
        int64_t hd = I("head_dim"), kv = I("num_key_value_heads");
        int64_t layer = 2 * H + 2 * nh * hd * H + 2 * kv * hd * H + 3 * F * H;
        if (strcmp(type, "qwen3") == 0)
            layer += 2 * hd;
        n += L * layer;
    } else {
        int64_t ql = I("q_lora_rank"), kvl = I("kv_lora_rank"), nope = I("qk_nope_head_dim");
        int64_t rope = I("qk_rope_head_dim"), v = I("v_head_dim"), E = I("n_routed_experts");
        int64_t mi = I("moe_intermediate_size"), S = I("n_shared_experts");
        int64_t dense = I("first_k_dense_replace");
        int64_t attn = 2 * H +
                       (ql ? H * ql + ql + ql * nh * (nope + rope) : H * nh * (nope + rope)) +
                       H * (kvl + rope) + kvl + kvl * nh * (nope + v) + nh * v * H;
        int64_t moe =
            E * H + (strcmp(type, "deepseek_v3") == 0 ? E : 0) + E * 3 * mi * H + 3 * S * mi * H;
        n += L * attn + dense * 3 * F * H + (L - dense) * moe;
    }
#undef I
    json_object_put(c);
    return n;
}

START_TEST(test_param_counts_and_headers)
{
    for (int a = TD_MODELGEN_LLAMA; a <= TD_MODELGEN_DEEPSEEK_V3; a++) {
        char out[256], path[300];
        snprintf(out, sizeof(out), "%s/arch%d", tmpdir, a);
        td_modelgen_opts_t o = opts((td_modelgen_arch_t)a, out);
        o.gguf = a != TD_MODELGEN_QWEN3;
        td_modelgen_info_t info;
        ck_assert_msg(td_modelgen_write(&o, &info) == 0, "%s", td_err_msg());
        ck_assert_int_eq(info.n_params, expected_params(out));
        ck_assert_int_eq(info.vocab_size, 512);
        /* safetensors: u64 header length, JSON header, data exactly as long as the offsets say */
        snprintf(path, sizeof(path), "%s/model.safetensors", out);
        char *data;
        size_t len;
        ck_assert_int_eq(td_file_read_all(path, &data, &len), 0);
        uint64_t hl;
        memcpy(&hl, data, 8);
        ck_assert(hl % 8 == 0 && 8 + hl <= len);
        char *hdr = td_strndup(data + 8, hl);
        json_object *h = json_tokener_parse(hdr);
        ck_assert_ptr_nonnull(h);
        size_t end = 0, n_tensors = 0;
        json_object_object_foreach(h, name, t)
        {
            if (strcmp(name, "__metadata__") == 0)
                continue;
            json_object *offs = json_object_object_get(t, "data_offsets");
            end = TD_MAX(end, (size_t)json_object_get_int64(json_object_array_get_idx(offs, 1)));
            n_tensors++;
        }
        ck_assert_uint_eq(8 + hl + end, len);
        ck_assert_uint_gt(n_tensors, 10);
        json_object_put(h);
        free(hdr);
        free(data);
        if (o.gguf) {
            snprintf(path, sizeof(path), "%s/model.gguf", out);
            ck_assert_int_eq(td_file_read_all(path, &data, &len), 0);
            uint32_t ver;
            uint64_t nt;
            memcpy(&ver, data + 4, 4);
            memcpy(&nt, data + 8, 8);
            ck_assert(memcmp(data, "GGUF", 4) == 0);
            ck_assert_uint_eq(ver, 3);
            ck_assert_uint_gt(nt, 10);
            free(data);
        }
    }
}
END_TEST

START_TEST(test_deterministic)
{
    const char *files[] = {"config.json", "model.safetensors", "model.gguf"};
    char a[256], b[256], c[256];
    snprintf(a, sizeof(a), "%s/a", tmpdir);
    snprintf(b, sizeof(b), "%s/b", tmpdir);
    snprintf(c, sizeof(c), "%s/c", tmpdir);
    td_modelgen_opts_t o = opts(TD_MODELGEN_DEEPSEEK_V3, a);
    o.fp8 = true;
    o.gguf = true;
    o.gguf_dtype = TD_MODELGEN_Q8_0;
    ck_assert_int_eq(td_modelgen_write(&o, NULL), 0);
    o.out_dir = b;
    ck_assert_int_eq(td_modelgen_write(&o, NULL), 0);
    o.out_dir = c;
    o.seed = 2;
    ck_assert_int_eq(td_modelgen_write(&o, NULL), 0);
    for (size_t i = 0; i < TD_ARRAY_LEN(files); i++) {
        char pa[300], pb[300], pc[300], *da, *db, *dc;
        size_t la, lb, lc;
        snprintf(pa, sizeof(pa), "%s/%s", a, files[i]);
        snprintf(pb, sizeof(pb), "%s/%s", b, files[i]);
        snprintf(pc, sizeof(pc), "%s/%s", c, files[i]);
        ck_assert_int_eq(td_file_read_all(pa, &da, &la), 0);
        ck_assert_int_eq(td_file_read_all(pb, &db, &lb), 0);
        ck_assert_int_eq(td_file_read_all(pc, &dc, &lc), 0);
        ck_assert_uint_eq(la, lb);
        ck_assert_msg(memcmp(da, db, la) == 0, "%s differs between two runs", files[i]);
        ck_assert_msg(la != lc || memcmp(da, dc, la) != 0, "%s same for seeds 1 and 2", files[i]);
        free(da);
        free(db);
        free(dc);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("modelgen");
    TCase *tc = tcase_create("modelgen");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_quantizers);
    tcase_add_test(tc, test_refused_combinations);
    tcase_add_test(tc, test_bad_inputs);
    tcase_add_test(tc, test_param_counts_and_headers);
    tcase_add_test(tc, test_deterministic);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

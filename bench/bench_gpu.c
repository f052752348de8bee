/* bench_gpu.c: the engine on the CUDA backend against limits measured in the same run: decode
 * tokens/s at batch 1 against the HBM roofline (the bytes one token must read: every weight it
 * uses, in BF16, and its context's KV, over the device-to-device copy bandwidth), and prefill
 * GEMM TFLOP/s against a large BF16 cuBLAS GEMM. Built with the cuda feature; bench/gpu_check.sh
 * runs it on mkmodel's Llama-8B-shaped and DeepSeek-V2-Lite-shaped models.
 *
 *   bench_gpu MODEL [--prefill N] [--decode N]
 */
#include "td_cuda.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double mat_params(const td_mat_t *m)
{
    return m->data ? (double)m->rows * (double)m->cols : 0;
}

/* Weights one token multiplies by (MoE: its top-k experts and the shared ones; the router). */
static double active_params(const td_model_t *m)
{
    const td_model_cfg_t *c = &m->cfg;
    double p = mat_params(&m->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_w_t *w = &m->layers[l];
        const td_mat_t *ms[] = {&w->wq,     &w->wk,     &w->wv,     &w->wo,       &w->wq_a,
                                &w->wq_b,   &w->wkv_a,  &w->wkv_b,  &w->wk_b_t,   &w->wv_b,
                                &w->w_gate, &w->w_up,   &w->w_down, &w->w_router, &w->sh_gate,
                                &w->sh_up,  &w->sh_down};
        for (size_t i = 0; i < TD_ARRAY_LEN(ms); i++)
            p += mat_params(ms[i]);
        if (w->is_moe && w->exp_gate)
            p += c->n_experts_per_tok * (mat_params(&w->exp_gate[0]) + mat_params(&w->exp_up[0]) +
                                         mat_params(&w->exp_down[0]));
    }
    return p;
}

int main(int argc, char **argv)
{
    int prefill = 2048, decode = 64;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--prefill") == 0 && i + 1 < argc)
            prefill = atoi(argv[++i]);
        else if (strcmp(argv[i], "--decode") == 0 && i + 1 < argc)
            decode = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_gpu MODEL [--prefill N] [--decode N]\n");
            return 2;
        }
    }
    if (!path || prefill < 1 || decode < 1) {
        fprintf(stderr, "usage: bench_gpu MODEL [--prefill N] [--decode N]\n");
        return 2;
    }
    td_backend_t *b;
    if (td_cuda_backend_create(NULL, &b) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 77;
    }
    int cc;
    const char *dev = td_cuda_device_name(b, &cc);
    double hbm, gemm;
    if (td_cuda_measure_peaks(b, &hbm, &gemm) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 1;
    }
    printf("device %s (sm_%d): copy bandwidth %.0f GB/s, BF16 cuBLAS GEMM %.1f TFLOP/s\n", dev, cc,
           hbm, gemm);
    td_model_t *m;
    if (td_model_load(path, &m) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 1;
    }
    const td_model_cfg_t *c = &m->cfg;
    td_engine_t *e;
    td_engine_opts_t o = {.backend = b};
    td_kv_layout_t lay;
    td_kv_pool_t pool;
    const int B = 16, n_blocks = (prefill + decode + 64) / B + 8;
    if (td_engine_create(m, &o, &e) != 0 || td_kv_layout_init(&lay, m, B) != 0 ||
        td_backend_kv_pool_init(b, &pool, &lay, n_blocks) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 1;
    }
    int V = c->vocab_size;
    int32_t *prompt = malloc((size_t)prefill * sizeof(int32_t));
    float *logits = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < prefill; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % V);

    /* warm-up: uploads every weight (excluded from the timings) */
    double t0 = td_now_s();
    td_kv_seq_t warm;
    td_kv_seq_init(&warm);
    td_batch_seq_t w = {&warm, prompt, TD_MIN(prefill, 32), logits};
    if (td_engine_step(e, &pool, &w, 1) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 1;
    }
    td_kv_seq_release(&pool, &warm);
    double up = td_now_s() - t0;
    double act = active_params(m);
    printf("model %s: %s, %d layers, %.2fB parameters active per token, %.1f GB on the device, "
           "upload %.1f s\n",
           path, td_arch_name(c->arch), c->n_layers, act / 1e9, td_cuda_weight_bytes(b) / 1e9, up);

    td_kv_seq_t s;
    td_kv_seq_init(&s);
    td_batch_seq_t p = {&s, prompt, prefill, logits};
    t0 = td_now_s();
    if (td_engine_step(e, &pool, &p, 1) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
        return 1;
    }
    double tp = td_now_s() - t0, flops = 2.0 * act * prefill;
    printf("prefill %d tokens: %.3f s, %.0f tokens/s, GEMM %.1f TFLOP/s = %.2f of the cuBLAS "
           "ceiling\n",
           prefill, tp, prefill / tp, flops / tp / 1e12, flops / tp / 1e12 / gemm);

    double kv_tok = (double)lay.token_floats * sizeof(float) * c->n_layers;
    t0 = td_now_s();
    for (int i = 0; i < decode; i++) {
        int32_t tok = (int32_t)((i * 31 + 7) % V);
        td_batch_seq_t d = {&s, &tok, 1, logits};
        if (td_engine_step(e, &pool, &d, 1) != 0) {
            fprintf(stderr, "bench_gpu: %s\n", td_err_msg());
            return 1;
        }
    }
    double td = td_now_s() - t0, tps = decode / td;
    double bytes = act * 2 + kv_tok * (prefill + decode / 2.0); /* BF16 weights + mean context */
    double roof = hbm * 1e9 / bytes;
    printf("decode %d tokens at context %d: %.1f tokens/s, HBM roofline %.1f tokens/s "
           "(%.2f GB per token) = %.2f of the roofline\n",
           decode, prefill, tps, roof, bytes / 1e9, tps / roof);
    td_kv_seq_release(&pool, &s);
    td_backend_kv_pool_free(b, &pool);
    td_engine_free(e);
    td_model_free(m);
    b->destroy(b);
    free(prompt);
    free(logits);
    return 0;
}

/* bench_engine.c: CPU engine throughput: prefill tokens/s (after one 16-token warm-up step, as
 * bench/node/llamacpp_bench.mjs warms llama.cpp up), and decode tokens/s at given batch
 * sizes, each also as a fraction of the memory-bandwidth roofline: the bytes a step must read
 * (weights it touches plus the KV cache it attends over) divided by the read bandwidth measured in
 * the same run, over the measured step time.
 *
 * usage: bench_engine MODEL [--threads N] [--prompt N] [--decode N] [--batch B,B,...]
 *                     [--anon-weights 0|1] [--prefills N] [--stored-rows 0|1]
 *
 * --prefills N runs the prefill N times (each a fresh sequence; default 1), prints each run and
 * then the median's line, for A/B comparisons that want many rounds without reloading the model.
 * --stored-rows 1 multiplies F16 weights where they are stored instead of from the CPU
 * backend's grouped copy (td_cpu_opts_t.stored_rows), for A/B comparisons of the two.
 * --anon-weights 1 moves the weights to anonymous memory on huge pages first
 * (td_model_weights_to_anon) and says how much of them the kernel put on huge pages. Each decode
 * and prefill line also gives the process's CPU time over the steps, which does not count the time the
 * threads waited for a core on a loaded machine.
 *
 * Not run by `meson test`; figures go to BENCHMARKS.md. The llama.cpp side of the comparison is
 * not part of this program. */
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_util.h"

#include <pthread.h>
#pragma GCC diagnostic ignored "-Wpsabi"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This process's anonymous memory on transparent huge pages, in MiB (/proc/self/smaps_rollup). */
static long anon_huge_mib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1024;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb / 1024;
}

static size_t mat_bytes(const td_mat_t *m)
{
    return m->data ? td_dtype_row_bytes(m->dtype, m->cols) * (size_t)m->rows : 0;
}

/* Bytes one decode step over `batch` sequences must read, without the KV cache. Routed experts:
 * min(n_routed, batch * top_k) of them per MoE layer (the expected count if routing spread). */
static double weight_bytes(const td_model_t *m, int batch)
{
    const td_model_cfg_t *c = &m->cfg;
    double b = (double)mat_bytes(&m->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_w_t *w = &m->layers[l];
        const td_mat_t *mats[] = {&w->wq,     &w->wk,     &w->wv,     &w->wo,       &w->wq_a,
                                  &w->wq_b,   &w->wkv_a,  &w->wkv_b,  &w->wk_b_t,   &w->wv_b,
                                  &w->w_gate, &w->w_up,   &w->w_down, &w->w_router, &w->sh_gate,
                                  &w->sh_up,  &w->sh_down};
        for (size_t i = 0; i < TD_ARRAY_LEN(mats); i++)
            b += (double)mat_bytes(mats[i]);
        if (w->is_moe && c->n_routed_experts > 0) {
            double per = (double)(mat_bytes(&w->exp_gate[0]) + mat_bytes(&w->exp_up[0]) +
                                  mat_bytes(&w->exp_down[0]));
            int used = TD_MIN(c->n_routed_experts, batch * c->n_experts_per_tok);
            b += per * used;
        }
    }
    return b;
}

typedef struct bw_arg {
    const float *p;
    size_t n;
    double sum;
} bw_arg_t;

typedef float v8f __attribute__((vector_size(32)));

/* Sum the buffer with four independent vector accumulators: bound by memory, not by adds. */
static void *bw_read(void *arg)
{
    bw_arg_t *a = arg;
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, v;
    for (size_t i = 0; i + 32 <= a->n; i += 32) {
        memcpy(&v, a->p + i, 32);
        s0 += v;
        memcpy(&v, a->p + i + 8, 32);
        s1 += v;
        memcpy(&v, a->p + i + 16, 32);
        s2 += v;
        memcpy(&v, a->p + i + 24, 32);
        s3 += v;
    }
    s0 += s1 + s2 + s3;
    for (int k = 0; k < 8; k++)
        a->sum += s0[k];
    return NULL;
}

/* Read bandwidth with `threads` threads over a buffer larger than the caches, best of 3. */
static double read_bandwidth(int threads)
{
    size_t n = (size_t)256 << 20; /* 1 GiB of floats */
    float *buf = malloc(n * sizeof(float));
    if (!buf)
        return 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        bw_arg_t args[64];
        double t0 = td_now_s();
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg_t){buf + n / threads * t, n / threads, 0};
            pthread_create(&th[t], NULL, bw_read, &args[t]);
        }
        for (int t = 0; t < threads; t++)
            pthread_join(th[t], NULL);
        double gbs = (double)n * sizeof(float) / (td_now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_engine MODEL [--threads N] [--prompt N] [--decode N] "
                        "[--batch B,B,...] [--anon-weights 0|1] [--prefills N] "
                        "[--stored-rows 0|1]\n");
        return 2;
    }
    int threads = 1, prompt = 128, decode = 32, batches[8] = {1, 16}, nb = 2, anon = 0,
        prefills = 1, stored = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--prompt") == 0)
            prompt = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--decode") == 0)
            decode = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--prefills") == 0)
            prefills = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--anon-weights") == 0)
            anon = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--stored-rows") == 0)
            stored = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0) {
            nb = 0;
            for (char *s = argv[i + 1]; *s && nb < 8; s++) {
                batches[nb++] = atoi(s);
                while (s[1] && s[1] != ',')
                    s++;
                if (s[1] == ',')
                    s++;
            }
        }
    }
    if (threads < 1 || threads > 64 || prompt < 24 || decode < 1 || prefills < 1 ||
        prefills > 1000) {
        fprintf(stderr, "bench_engine: bad arguments\n");
        return 2;
    }
    td_model_t *m;
    td_engine_t *e;
    if (td_model_load(argv[1], &m) != 0) {
        fprintf(stderr, "bench_engine: %s\n", td_err_msg());
        return 1;
    }
    if (anon) {
        long before = anon_huge_mib();
        double t0 = td_now_s();
        if (td_model_weights_to_anon(m)) {
            fprintf(stderr, "bench_engine: %s\n", td_err_msg());
            return 1;
        }
        size_t total = 0;
        for (int i = 0; i < m->n_maps; i++)
            total += m->maps[i].len;
        printf("weights: %.0f MiB copied to anonymous memory in %.3f s, %ld MiB of it on huge "
               "pages\n",
               (double)total / (1 << 20), td_now_s() - t0, anon_huge_mib() - before);
    }
    td_engine_opts_t o = {.n_threads = threads, .stored_rows = stored != 0};
    td_kv_layout_t lay;
    td_kv_pool_t pool;
    int maxb = 1;
    for (int i = 0; i < nb; i++)
        maxb = TD_MAX(maxb, batches[i]);
    int per_seq = (prompt + decode + 15) / 16 + 1;
    if (td_engine_create(m, &o, &e) || td_kv_layout_init(&lay, m, 16) ||
        td_kv_pool_init(&pool, &lay, per_seq * (maxb + 1))) {
        fprintf(stderr, "bench_engine: %s\n", td_err_msg());
        return 1;
    }
    const td_model_cfg_t *c = &m->cfg;
    double bw = read_bandwidth(threads);
    printf("model %s (%s), threads %d, read bandwidth %.1f GB/s\n", argv[1], td_arch_name(c->arch),
           threads, bw);
    int32_t *toks = malloc((size_t)(prompt + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)maxb * c->vocab_size * sizeof(float));
    for (int i = 0; i <= prompt; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);

    /* warm-up, as llamacpp_bench.mjs does before its prefill: one 16-token step pages the weights
     * in and touches the engine's scratch and the KV blocks once, so that the prefill below is a
     * worker's steady state rather than its first step after loading */
    td_kv_seq_t s;
    td_kv_seq_init(&s);
    td_batch_seq_t wb = {&s, toks, 16, logits};
    double tw = td_now_s();
    if (td_engine_step(e, &pool, &wb, 1)) {
        fprintf(stderr, "bench_engine: %s\n", td_err_msg());
        return 1;
    }
    printf("warm-up: 16 tokens in %.3f s (the first step after loading)\n", td_now_s() - tw);
    td_kv_seq_release(&pool, &s);

    /* prefill: one sequence, the whole prompt in one step; with --prefills, the median run */
    double *tps = malloc((size_t)prefills * 2 * sizeof(double)), *tcs = tps + prefills;
    for (int r = 0; r < prefills; r++) {
        td_kv_seq_init(&s);
        td_batch_seq_t b = {&s, toks, prompt, logits};
        double t0 = td_now_s(), c0 = cpu_s();
        if (td_engine_step(e, &pool, &b, 1)) {
            fprintf(stderr, "bench_engine: %s\n", td_err_msg());
            return 1;
        }
        tps[r] = td_now_s() - t0;
        tcs[r] = cpu_s() - c0;
        td_kv_seq_release(&pool, &s);
        if (prefills > 1)
            printf("prefill run %d: %d tokens in %.3f s (CPU %.3f s): %.1f tokens/s\n", r + 1,
                   prompt, tps[r], tcs[r], prompt / tps[r]);
    }
    qsort(tps, (size_t)prefills, sizeof(double), cmp_double);
    qsort(tcs, (size_t)prefills, sizeof(double), cmp_double);
    double tp = tps[prefills / 2], tpc = tcs[prefills / 2];
    if (prefills > 1)
        printf("prefill: median of %d runs (spread %.3f-%.3f s; median CPU %.3f s, %.3f-%.3f): "
               "%.1f tokens/s\n",
               prefills, tps[0], tps[prefills - 1], tpc, tcs[0], tcs[prefills - 1], prompt / tp);
    else
        printf("prefill: %d tokens in %.3f s (CPU %.3f s): %.1f tokens/s\n", prompt, tp, tpc,
               prompt / tp);
    free(tps);

    double kv_tok = (double)lay.token_floats * sizeof(float) * c->n_layers;
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi], ctx0 = 16;
        td_kv_seq_t *seqs = calloc((size_t)B, sizeof(*seqs));
        td_batch_seq_t *items = calloc((size_t)B, sizeof(*items));
        int32_t *next = calloc((size_t)B, sizeof(int32_t));
        for (int q = 0; q < B; q++) { /* a short prompt each, then decode all together */
            td_kv_seq_init(&seqs[q]);
            items[q] = (td_batch_seq_t){&seqs[q], toks + q % 8, ctx0, NULL};
        }
        if (td_engine_step(e, &pool, items, B)) {
            fprintf(stderr, "bench_engine: %s\n", td_err_msg());
            return 1;
        }
        double bytes = 0, c0 = cpu_s(), t0 = td_now_s();
        for (int k = 0; k < decode; k++) {
            for (int q = 0; q < B; q++) {
                next[q] = toks[(k + q) % prompt];
                items[q] =
                    (td_batch_seq_t){&seqs[q], &next[q], 1, logits + (size_t)q * c->vocab_size};
            }
            bytes += weight_bytes(m, B) + kv_tok * B * (ctx0 + k + 1);
            if (td_engine_step(e, &pool, items, B)) {
                fprintf(stderr, "bench_engine: %s\n", td_err_msg());
                return 1;
            }
        }
        double td = td_now_s() - t0, tc = cpu_s() - c0;
        double roof = bytes / (bw * 1e9);
        printf("decode batch %2d: %d steps in %.3f s (CPU %.3f s): %.1f tokens/s, %.1f MB read per "
               "step, %.0f%% of the bandwidth roofline\n",
               B, decode, td, tc, (double)B * decode / td, bytes / decode / 1e6, 100.0 * roof / td);
        for (int q = 0; q < B; q++)
            td_kv_seq_release(&pool, &seqs[q]);
        free(seqs);
        free(items);
        free(next);
    }
    free(toks);
    free(logits);
    td_kv_pool_free(&pool);
    td_engine_free(e);
    td_model_free(m);
    return 0;
}

/* bench_grouped.c: the CPU backend's matmuls over a model's weights from its grouped copies of
 * F16 matrices (common/backend/cpu/cpu_group.c) against the same matmuls from the stored rows
 * (td_cpu_opts_t.stored_rows), in one process, alternating pass by pass (which goes first swaps
 * each pass), so that the machine's drift in memory bandwidth falls on both alike.
 *
 * usage: bench_grouped MODEL [--tokens T] [--passes N] [--threads N] [--anon-weights 0|1]
 *
 * A pass is every matrix a llama layer multiplies (wq, wk, wv, wo, gate, up, down) and the output
 * layer, against T tokens (default 1: decode). Prints the median pass of each side, the ratio of
 * the medians (stored / grouped: above 1 the copy is faster), the rate the weights were read at,
 * and in how many passes the copy was faster. --anon-weights 1 moves the weights to anonymous
 * memory on huge pages first (engine.hugepage_weights), where the copy already is. Not run by
 * `meson test`; figures go to BENCHMARKS.md. */
#include "td_backend.h"
#include "td_error.h"
#include "td_model.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The matrices of a pass, in order: each layer's, then the output layer's. *n of them. */
static const td_mat_t **pass_mats(const td_model_t *m, size_t *n)
{
    const td_mat_t **v = calloc((size_t)m->cfg.n_layers * 7 + 1, sizeof(*v));
    *n = 0;
    for (int l = 0; v && l < m->cfg.n_layers; l++) {
        const td_layer_w_t *L = &m->layers[l];
        const td_mat_t *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < TD_ARRAY_LEN(ms); i++)
            if (ms[i]->data)
                v[(*n)++] = ms[i];
    }
    if (v)
        v[(*n)++] = &m->lm_head;
    return v;
}

static double pass(td_backend_t *b, const td_mat_t *const *ms, size_t n, const float *x,
                   float *out, int T)
{
    double t0 = td_now_s();
    for (size_t i = 0; i < n; i++)
        b->matmul(b, out, (int)ms[i]->rows, x, (int)ms[i]->cols, T, ms[i]);
    return td_now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc % 2) {
        fprintf(stderr, "usage: bench_grouped MODEL [--tokens T] [--passes N] [--threads N] "
                        "[--anon-weights 0|1]\n");
        return 2;
    }
    int T = 1, passes = 200, threads = 1, anon = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--tokens") == 0)
            T = v;
        else if (strcmp(argv[i], "--passes") == 0)
            passes = v;
        else if (strcmp(argv[i], "--threads") == 0)
            threads = v;
        else if (strcmp(argv[i], "--anon-weights") == 0)
            anon = v;
        else {
            fprintf(stderr, "bench_grouped: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (T < 1 || T > 512 || passes < 2 || threads < 1 || threads > 64) {
        fprintf(stderr, "bench_grouped: bad arguments\n");
        return 2;
    }
    td_model_t *m;
    if (td_model_load(argv[1], &m) != 0) {
        fprintf(stderr, "bench_grouped: %s\n", td_err_msg());
        return 1;
    }
    if (anon && td_model_weights_to_anon(m) != 0) {
        fprintf(stderr, "bench_grouped: %s\n", td_err_msg());
        return 1;
    }
    size_t nm;
    const td_mat_t **mats = pass_mats(m, &nm);
    int64_t widest = 0; /* the x and out buffers serve every matrix */
    size_t bytes = 0;
    for (size_t i = 0; mats && i < nm; i++) {
        widest = TD_MAX(widest, TD_MAX(mats[i]->rows, mats[i]->cols));
        bytes += td_dtype_row_bytes(mats[i]->dtype, mats[i]->cols) * (size_t)mats[i]->rows;
    }
    td_cpu_opts_t os = {.n_threads = threads, .stored_rows = true}, og = {.n_threads = threads};
    td_backend_t *bs = td_cpu_backend_create_opts(&os), *bg = td_cpu_backend_create_opts(&og);
    float *x = calloc((size_t)T * (size_t)widest, sizeof(float)),
          *out = calloc((size_t)T * (size_t)widest, sizeof(float));
    double *ts = calloc((size_t)passes, sizeof(double)), *tg = calloc((size_t)passes, sizeof(double));
    if (!mats || !bs || !bg || !x || !out || !ts || !tg) {
        fprintf(stderr, "bench_grouped: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)T * (size_t)widest; i++)
        x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    /* the first pass of each makes the copies and faults the pages in */
    pass(bs, mats, nm, x, out, T);
    pass(bg, mats, nm, x, out, T);
    int faster = 0;
    for (int p = 0; p < passes; p++) {
        if (p % 2) {
            ts[p] = pass(bs, mats, nm, x, out, T);
            tg[p] = pass(bg, mats, nm, x, out, T);
        } else {
            tg[p] = pass(bg, mats, nm, x, out, T);
            ts[p] = pass(bs, mats, nm, x, out, T);
        }
        faster += tg[p] < ts[p];
    }
    qsort(ts, (size_t)passes, sizeof(double), cmp_double);
    qsort(tg, (size_t)passes, sizeof(double), cmp_double);
    const double ms = ts[passes / 2], mg = tg[passes / 2], gb = (double)bytes / 1e9;
    printf("%s: %d token(s), %d thread(s), %d passes of %.1f MB%s\n", argv[1], T, threads, passes,
           gb * 1e3, anon ? ", weights on anonymous huge pages" : "");
    printf("median pass: stored rows %.3f ms (%.1f GB/s), grouped %.3f ms (%.1f GB/s): "
           "stored/grouped %.3fx; grouped faster in %d of %d passes\n",
           ms * 1e3, gb / ms, mg * 1e3, gb / mg, ms / mg, faster, passes);
    free(x), free(out), free(ts), free(tg), free(mats);
    bs->destroy(bs);
    bg->destroy(bg);
    td_model_free(m);
    return 0;
}

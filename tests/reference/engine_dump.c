/* engine_dump.c: run the engine greedily on a token-id prompt and write what it computed as JSON,
 * in the schema tests/reference/reference.py writes, for compare_engine.py:
 *
 *   {"prompt_token_ids": [...], "greedy_token_ids": [...], "logits_per_step": [[V floats], ...]}
 *
 * usage: engine_dump MODEL_PATH PROMPT_IDS STEPS OUT.json [BLOCK_SIZE] [THREADS] [f32act]
 *
 * f32act: Q8_0 / Q4_0 weights against fp32 activations (td_engine_opts_t.f32_activations)
 * instead of the default 8-bit ones.
 *
 * The prompt is prefilled in one step, then one token per step; step i's logits are the ones
 * that chose greedy token i. Logits are printed with 9 significant digits (exact for fp32).
 */
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_ids(const char *s, int32_t **out, int *n_out)
{
    int cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof(*v));
    char *copy = td_strdup(s), *save = NULL;
    if (!v || !copy) {
        free(v);
        free(copy);
        return TD_ENOMEM;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t x;
        if (td_parse_i64(tok, &x) != 0 || x < 0 || x > INT32_MAX) {
            free(v);
            free(copy);
            return td_err_set(TD_EINVAL, "prompt id \"%s\" is not a token id", tok);
        }
        if (n == cap) {
            int32_t *nv = td_reallocarray(v, (size_t)cap * 2, sizeof(*v));
            if (!nv) {
                free(v);
                free(copy);
                return TD_ENOMEM;
            }
            v = nv;
            cap *= 2;
        }
        v[n++] = (int32_t)x;
    }
    free(copy);
    if (n == 0) {
        free(v);
        return td_err_set(TD_EINVAL, "empty prompt");
    }
    *out = v;
    *n_out = n;
    return 0;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr,
                "usage: engine_dump MODEL PROMPT_IDS STEPS OUT.json [BLOCK_SIZE] [THREADS] "
                "[f32act]\n");
        return 2;
    }
    int64_t steps, block = 16, threads = 1;
    int32_t *prompt = NULL;
    int n_prompt = 0, rc = 1;
    if (td_parse_i64(argv[3], &steps) != 0 || steps < 1 || steps > 100000 ||
        (argc > 5 && (td_parse_i64(argv[5], &block) != 0 || block < 1 || block > 4096)) ||
        (argc > 6 && (td_parse_i64(argv[6], &threads) != 0 || threads < 1 || threads > 256)) ||
        (argc > 7 && strcmp(argv[7], "f32act") != 0)) {
        fprintf(stderr, "engine_dump: bad STEPS, BLOCK_SIZE or THREADS\n");
        return 2;
    }
    if (parse_ids(argv[2], &prompt, &n_prompt) != 0) {
        fprintf(stderr, "engine_dump: %s\n", td_err_msg());
        return 2;
    }
    td_model_t *m = NULL;
    td_engine_t *e = NULL;
    td_kv_layout_t lay;
    td_kv_pool_t pool;
    td_kv_seq_t seq;
    float *logits = NULL;
    FILE *out = NULL;
    bool have_pool = false;
    td_kv_seq_init(&seq);
    if (td_model_load(argv[1], &m) != 0) {
        fprintf(stderr, "engine_dump: %s\n", td_err_msg());
        goto out;
    }
    td_engine_opts_t o = {.n_threads = (int)threads, .f32_activations = argc > 7};
    int total = n_prompt + (int)steps;
    if (td_engine_create(m, &o, &e) != 0 || td_kv_layout_init(&lay, m, (int)block) != 0 ||
        td_kv_pool_init(&pool, &lay, (total + (int)block - 1) / (int)block + 1) != 0) {
        fprintf(stderr, "engine_dump: %s\n", td_err_msg());
        goto out;
    }
    have_pool = true;
    int V = m->cfg.vocab_size;
    logits = calloc((size_t)V, sizeof(float));
    out = fopen(argv[4], "w");
    if (!logits || !out) {
        fprintf(stderr, "engine_dump: cannot write %s\n", argv[4]);
        goto out;
    }
    fprintf(out, "{\"produced_by\": \"tandem engine (CPU, fp32)\", \"prompt_token_ids\": [");
    for (int i = 0; i < n_prompt; i++)
        fprintf(out, "%s%d", i ? ", " : "", prompt[i]);
    fprintf(out, "],\n\"logits_per_step\": [");
    td_batch_seq_t b = {&seq, prompt, n_prompt, logits};
    int32_t *ids = calloc((size_t)steps, sizeof(int32_t));
    if (!ids)
        goto out;
    for (int s = 0; s < steps; s++) {
        if (td_engine_step(e, &pool, &b, 1) != 0) {
            fprintf(stderr, "engine_dump: step %d: %s\n", s, td_err_msg());
            free(ids);
            goto out;
        }
        fprintf(out, "%s\n[", s ? "," : "");
        for (int i = 0; i < V; i++)
            fprintf(out, "%s%.9g", i ? "," : "", (double)logits[i]);
        fprintf(out, "]");
        ids[s] = argmax(logits, V);
        b.tokens = &ids[s];
        b.n_tokens = 1;
    }
    fprintf(out, "],\n\"greedy_token_ids\": [");
    for (int s = 0; s < steps; s++)
        fprintf(out, "%s%d", s ? ", " : "", ids[s]);
    fprintf(out, "]}\n");
    free(ids);
    rc = 0;
out:
    if (out && fclose(out) != 0)
        rc = 1;
    if (have_pool) {
        td_kv_seq_release(&pool, &seq);
        td_kv_pool_free(&pool);
    }
    td_engine_free(e);
    td_model_free(m);
    free(logits);
    free(prompt);
    return rc;
}

/* bench_jsonmask.c: the cost of structured outputs per sampled token: the same sampler over the
 * same logits, unconstrained and constrained by a JSON schema's token mask (td_jsonfsm.h) over a
 * real tokenizer's vocabulary, in one run; prints both per-token times and their ratio, and the
 * mask's cold cost (a state not in the cache: the trie walk).
 *
 *   bench_jsonmask TOKENIZER_DIR [TOKENS]
 */
#include "td_error.h"
#include "td_jsonfsm.h"
#include "td_rng.h"
#include "td_sampler.h"
#include "td_tokenizer.h"
#include "td_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *SCHEMA =
    "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":24},\"age\":{\"type\":\"integer\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"tags\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\"},\"maxItems\":4},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"color\",\"tags\",\"ok\"]}";

#define NLOG 8

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_jsonmask TOKENIZER_DIR [TOKENS]\n");
        return 2;
    }
    int n_tok = argc > 2 ? atoi(argv[2]) : 2000;
    td_tokenizer_t *tok;
    if (td_tokenizer_load(argv[1], &tok)) {
        fprintf(stderr, "bench_jsonmask: %s\n", td_err_msg());
        return 1;
    }
    int V = (int)td_tokenizer_vocab_size(tok);
    int32_t eos = td_tokenizer_special_id(tok, "eos_token");
    if (eos < 0)
        eos = V - 1;
    uint8_t **bytes = td_calloc((size_t)V, sizeof(uint8_t *));
    uint32_t *lens = td_calloc((size_t)V, sizeof(uint32_t));
    td_buf_t b;
    td_buf_init(&b);
    for (int id = 0; id < V; id++) {
        b.len = 0;
        if (td_tokenizer_is_special(tok, id) || td_tokenizer_token_bytes(tok, id, &b) || !b.len)
            continue;
        bytes[id] = malloc(b.len);
        memcpy(bytes[id], b.data, b.len);
        lens[id] = (uint32_t)b.len;
    }
    double t0 = td_now_s();
    td_vocab_trie_t *trie;
    if (td_vocab_trie_build((const uint8_t *const *)bytes, lens, V, &trie))
        return 1;
    double t_trie = td_now_s() - t0;
    td_jsonfsm_t *f;
    if (td_jsonfsm_compile(SCHEMA, strlen(SCHEMA), &f)) {
        fprintf(stderr, "bench_jsonmask: %s\n", td_err_msg());
        return 1;
    }
    /* logits: a few fixed random vectors, cycled */
    float *lg = malloc((size_t)NLOG * (size_t)V * sizeof(float));
    td_rng_t rng;
    td_rng_seed(&rng, 1);
    for (size_t i = 0; i < (size_t)NLOG * (size_t)V; i++)
        lg[i] = (float)(td_rng_uniform(&rng) * 8.0); /* flat-ish: long outputs, many states */
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.seed = 7;
    p.eos_id = eos;
    double t_plain = 0, t_mask = 0, t_cold = 0;
    int n_cold = 0, outputs = 0;
    for (int pass = 0; pass < 2; pass++) {
        td_sampler_t s;
        td_jsonmask_t *m = NULL;
        for (int i = 0; i < n_tok; i++) {
            if (i == 0 || (pass && !m)) {
                td_sampler_init(&s, &p, V);
                if (pass) {
                    td_jsonmask_new(f, trie, eos, false, &m);
                    td_sampler_set_mask(&s, m);
                }
            }
            td_sample_t o;
            double a = td_now_s();
            td_sampler_sample(&s, lg + (size_t)(i % NLOG) * (size_t)V, &o);
            double dt = td_now_s() - a;
            if (pass)
                t_mask += dt;
            else
                t_plain += dt;
            if (pass && o.finish == TD_FINISH_STOP) {
                outputs++;
                td_sampler_free(&s); /* frees m */
                m = NULL;
            }
        }
        if (!pass || m)
            td_sampler_free(&s);
    }
    /* cold: masks of fresh states (a new mask each time: its cache is empty) */
    {
        td_jsonmask_t *m;
        td_jsonmask_new(f, trie, eos, false, &m);
        const char *walk = "{\"name\":\"ab\",\"age\":12,\"color\":\"red\",\"tags\":[\"x\"],\"ok\":true}";
        td_jsonfsm_state_t st;
        (void)st;
        for (size_t k = 0; k <= strlen(walk); k++) {
            td_jsonmask_t *c;
            td_jsonmask_new(f, trie, eos, false, &c);
            bool ok = true;
            for (size_t j = 0; j < k && ok; j++) { /* advance byte by byte: single-byte tokens */
                char one[2] = {walk[j], 0};
                int32_t id = td_tokenizer_token_to_id(tok, one, 1);
                ok = id >= 0 && td_jsonmask_advance(c, id);
            }
            if (ok) {
                double a = td_now_s();
                (void)td_jsonmask_allowed(c);
                t_cold += td_now_s() - a;
                n_cold++;
            }
            td_jsonmask_free(c);
        }
        td_jsonmask_free(m);
    }
    double per_plain = t_plain / n_tok * 1e6, per_mask = t_mask / n_tok * 1e6;
    printf("vocabulary %d tokens, trie %d nodes built in %.3f s\n", V, td_vocab_trie_size(trie),
           t_trie);
    printf("sampling (temperature 1: softmax and one draw over the vocabulary), %d tokens each:\n",
           n_tok);
    printf("  unconstrained      %8.1f us/token\n", per_plain);
    printf("  json_schema mask   %8.1f us/token  (%d complete outputs)\n", per_mask, outputs);
    printf("  ratio              %8.2f x\n", per_mask / per_plain);
    printf("  mask of a new state (trie walk, cache miss): %.1f us mean over %d states\n",
           n_cold ? t_cold / n_cold * 1e6 : 0, n_cold);
    return 0;
}

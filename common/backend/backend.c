/* backend.c: what every backend shares above its hooks: a KV pool in the backend's memory, the
 * staging of its blocks through host memory (the data plane's view of a device pool), and what a
 * device backend prepares on the host: a step's flattened block tables, BF16 rounding. */
#include "td_backend.h"
#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

int td_backend_kv_pool_init(td_backend_t *b, td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks)
{
    if (n_blocks < 1 || l->block_bytes == 0)
        return td_err_set(TD_EINVAL, "kv pool of %d blocks", n_blocks);
    if ((size_t)n_blocks > SIZE_MAX / l->block_bytes)
        return td_err_set(TD_EOVERFLOW, "kv pool of %d blocks is too large", n_blocks);
    size_t bytes = TD_ALIGN_UP((size_t)n_blocks * l->block_bytes, (size_t)64);
    void *mem = b->alloc(b, bytes, b->kv_mem);
    if (!mem)
        return td_err_set(TD_ENOMEM, "kv pool: %s backend cannot allocate %d blocks of %zu bytes",
                          b->name, n_blocks, l->block_bytes);
    int rc = td_kv_pool_init_mem_kind(p, l, n_blocks, mem, b->kv_mem);
    if (rc)
        b->free(b, mem, b->kv_mem);
    return rc;
}

void td_backend_kv_pool_free(td_backend_t *b, td_kv_pool_t *p)
{
    void *mem = p->mem;
    td_mem_kind_t kind = p->mem_kind;
    td_kv_pool_free(p);
    b->free(b, mem, kind);
}

void td_backend_kv_block_out(td_backend_t *b, const td_kv_pool_t *p, int32_t id, void *dst)
{
    b->copy(b, dst, td_kv_block_data(p, id), p->layout.block_bytes);
    b->sync(b);
}

void td_backend_kv_block_in(td_backend_t *b, td_kv_pool_t *p, int32_t id, const void *src)
{
    b->copy(b, td_kv_block_data(p, id), src, p->layout.block_bytes);
    b->sync(b);
}

int td_tok_tables_build(td_tok_tables_t *tt, const td_attn_tok_t *toks, int T, int B)
{
    if ((size_t)T > tt->seq_cap) {
        size_t n = TD_MAX((size_t)T, 2 * tt->seq_cap);
        const int32_t **seq = realloc(tt->seq, n * sizeof(*seq));
        if (seq)
            tt->seq = seq;
        int32_t *len = realloc(tt->len, n * sizeof(int32_t));
        if (len)
            tt->len = len;
        int32_t *off = realloc(tt->off, n * sizeof(int32_t));
        if (off)
            tt->off = off;
        int32_t *ts = realloc(tt->tok_seq, n * sizeof(int32_t));
        if (ts)
            tt->tok_seq = ts;
        if (!seq || !len || !off || !ts)
            return td_err_set(TD_ENOMEM, "out of memory for the tables of %d tokens", T);
        tt->seq_cap = n;
    }
    int n_seq = 0, last = -1;
    size_t n_ids = 0;
    for (int t = 0; t < T; t++) { /* tokens of one sequence are usually adjacent: try the last */
        int s = last >= 0 && tt->seq[last] == toks[t].blocks ? last : -1;
        for (int k = 0; s < 0 && k < n_seq; k++)
            if (tt->seq[k] == toks[t].blocks)
                s = k;
        if (s < 0) {
            s = n_seq++;
            tt->seq[s] = toks[t].blocks;
            tt->len[s] = 0;
        }
        tt->len[s] = TD_MAX(tt->len[s], toks[t].pos / B + 1);
        tt->tok_seq[t] = s;
        last = s;
    }
    for (int s = 0; s < n_seq; s++) {
        tt->off[s] = (int32_t)n_ids;
        n_ids += (size_t)tt->len[s];
    }
    size_t n = (size_t)T * 4 + n_ids;
    if (n > tt->cap) {
        size_t cap = TD_MAX(n, 2 * tt->cap);
        int32_t *w = realloc(tt->words, cap * sizeof(int32_t));
        if (!w)
            return td_err_set(TD_ENOMEM, "out of memory for the tables of %d tokens", T);
        tt->words = w;
        tt->cap = cap;
    }
    int32_t *ids = tt->words + (size_t)T * 4;
    for (int s = 0; s < n_seq; s++)
        memcpy(ids + tt->off[s], tt->seq[s], (size_t)tt->len[s] * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        int32_t *w = tt->words + 4 * (size_t)t;
        w[0] = toks[t].pos;
        w[1] = toks[t].start;
        w[2] = tt->off[tt->tok_seq[t]];
        w[3] = 0;
    }
    tt->n_words = n;
    return 0;
}

void td_tok_tables_free(td_tok_tables_t *tt)
{
    free(tt->words);
    free(tt->seq);
    free(tt->len);
    free(tt->off);
    free(tt->tok_seq);
    memset(tt, 0, sizeof(*tt));
}

void td_bf16_round(const float *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4); /* read before out[i] (at or before in[i]) is written */
        uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
                         ? (uint16_t)((u >> 16) | 0x40) /* NaN stays a (quiet) NaN */
                         : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
        memcpy(&out[i], &h, 2);
    }
}

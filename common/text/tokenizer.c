/* tokenizer.c: the tokenizer's entry points for encoding: the token vector, vocabulary queries,
 * the pool of per-call scratch, and td_tokenizer_encode, which runs HF tokenizers' order of
 * operations over the files that hold each stage:
 *
 *   1. split out added tokens that match the raw text (non-normalized ones), leftmost-longest
 *      (tokenizer_added.c);
 *   2. normalize each remaining piece, then split out the normalized added tokens (same file);
 *   3. run the pre-tokenizer steps over each piece (depth first, so no step holds more than the
 *      piece it is splitting), the last being ByteLevel (tokenizer_pretok.c; known Split
 *      patterns matched by hand in tokenizer_pretok_fast.c, PCRE2 otherwise);
 *   4. BPE each resulting word on its bytes (ids of the byte-level chars, merged by rank;
 *      tokenizer_bpe.c);
 *   5. the post-processor's prefix/suffix ids when add_special_tokens (here).
 *
 * Decoding is in tokenizer_decode.c, loading in tokenizer_load*.c and tokenizer_tables.c. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* A scratch's word cache: slots, then word bytes, then ids (1.4 MiB, in one huge page). */
#define CACHE_BYTES                                                                       \
    (TD__CACHE_SLOTS * sizeof(td__cache_ent_t) + TD__CACHE_TEXT + TD__CACHE_IDS * sizeof(int32_t))

/* ---------------------------------------------------------------- small things */

void td_tokens_init(td_tokens_t *t)
{
    t->ids = NULL;
    t->len = t->cap = 0;
}

void td_tokens_free(td_tokens_t *t)
{
    free(t->ids);
    td_tokens_init(t);
}

int td__tokens_reserve(td_tokens_t *t, size_t extra)
{
    if (t->len + extra <= t->cap)
        return 0;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < t->len + extra)
        cap *= 2;
    int32_t *n = td_reallocarray(t->ids, cap, sizeof(int32_t));
    if (!n)
        return TD_ENOMEM;
    t->ids = n;
    t->cap = cap;
    return 0;
}

int td_tokens_push(td_tokens_t *t, int32_t id)
{
    int rc = td__tokens_reserve(t, 1);
    if (rc)
        return rc;
    t->ids[t->len++] = id;
    return 0;
}

size_t td_tokenizer_vocab_size(const td_tokenizer_t *tok)
{
    return tok->nids;
}

int32_t td_tokenizer_token_to_id(const td_tokenizer_t *tok, const char *token, size_t len)
{
    int32_t a = td__strmap_get(tok, &tok->added_map, token, len);
    if (a >= 0)
        return tok->added[a].id;
    return td__strmap_get(tok, &tok->vocab, token, len);
}

const char *td_tokenizer_id_to_token(const td_tokenizer_t *tok, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->nids || tok->ids[id].tok_len == UINT32_MAX)
        return NULL;
    if (len)
        *len = tok->ids[id].tok_len;
    return tok->arena + tok->ids[id].tok_off;
}

bool td_tokenizer_is_special(const td_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || (size_t)id >= tok->nids || tok->ids[id].added < 0)
        return false;
    return tok->added[tok->ids[id].added].special;
}

int32_t td_tokenizer_special_id(const td_tokenizer_t *tok, const char *name)
{
    if (td_str_eq(name, "bos"))
        return tok->bos_id;
    if (td_str_eq(name, "eos"))
        return tok->eos_id;
    if (td_str_eq(name, "pad"))
        return tok->pad_id;
    if (td_str_eq(name, "unk"))
        return tok->cfg_unk_id;
    return -1;
}

/* Replace invalid UTF-8 by U+FFFD, one per maximal invalid subpart (WHATWG, Rust lossy). */
static int sanitize_utf8(const char *p, size_t n, td_buf_t *out)
{
    td_buf_reset(out);
    for (size_t i = 0; i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)p + i, n - i);
        if (l) {
            size_t j = i + l;
            while (j < n && (l = td_utf8_valid_len((const uint8_t *)p + j, n - j)))
                j += l;
            if (td_buf_append(out, p + i, j - i))
                return TD_ENOMEM;
            i = j;
            continue;
        }
        /* length of the maximal subpart: a lead byte and the continuation bytes valid so far */
        uint8_t c = (uint8_t)p[i];
        size_t need = c >= 0xC2 && c <= 0xDF   ? 2
                      : c >= 0xE0 && c <= 0xEF ? 3
                      : c >= 0xF0 && c <= 0xF4 ? 4
                                               : 1;
        size_t k = 1;
        while (k < need && i + k < n) {
            uint8_t d = (uint8_t)p[i + k], lo = 0x80, hi = 0xBF;
            if (k == 1) {
                if (c == 0xE0)
                    lo = 0xA0;
                else if (c == 0xED)
                    hi = 0x9F;
                else if (c == 0xF0)
                    lo = 0x90;
                else if (c == 0xF4)
                    hi = 0x8F;
            }
            if (d < lo || d > hi)
                break;
            k++;
        }
        if (td_buf_append(out, "\xEF\xBF\xBD", 3))
            return TD_ENOMEM;
        i += k;
    }
    return 0;
}

/* ---------------------------------------------------------------- scratch */

void td__scratch_free(struct td_scratch *s)
{
    if (!s)
        return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    if (s->jstack)
        pcre2_jit_stack_free(s->jstack);
    for (size_t i = 0; i < TD__MAX_STEPS; i++)
        free(s->lv[i].v);
    td_buf_free(&s->text);
    td_buf_free(&s->norm);
    td_buf_free(&s->pfx);
    td_buf_free(&s->map);
    td_buf_free(&s->qtext);
    free(s->sym);
    free(s->heap);
    td_huge_free(s->cache, CACHE_BYTES);
    free(s);
}

static struct td_scratch *scratch_new(void)
{
    struct td_scratch *s = td_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->md = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jstack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    /* the word cache's slots, words and ids, in one huge page */
    char *c = td_huge_calloc(1, CACHE_BYTES);
    s->cache = (td__cache_ent_t *)c;
    s->cache_text = c ? c + TD__CACHE_SLOTS * sizeof(td__cache_ent_t) : NULL;
    s->cache_ids = c ? (int32_t *)(s->cache_text + TD__CACHE_TEXT) : NULL;
    if (!s->md || !s->mctx || !s->jstack || !s->cache || !s->cache_text || !s->cache_ids) {
        td__scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
    s->cache_single = true;
    td_buf_init(&s->text);
    td_buf_init(&s->norm);
    td_buf_init(&s->pfx);
    td_buf_init(&s->map);
    td_buf_init(&s->qtext);
    return s;
}

static struct td_scratch *scratch_get(td_tokenizer_t *tok)
{
    struct td_scratch *s = NULL;
    pthread_mutex_lock(&tok->pool_lock);
    if (tok->npool)
        s = tok->pool[--tok->npool];
    pthread_mutex_unlock(&tok->pool_lock);
    return s ? s : scratch_new();
}

static void scratch_put(td_tokenizer_t *tok, struct td_scratch *s)
{
    pthread_mutex_lock(&tok->pool_lock);
    if (tok->npool < TD_ARRAY_LEN(tok->pool)) {
        tok->pool[tok->npool++] = s;
        s = NULL;
    }
    pthread_mutex_unlock(&tok->pool_lock);
    td__scratch_free(s);
}

int td_tokenizer_encode(const td_tokenizer_t *ctok, const char *text, size_t len,
                        bool add_special_tokens, td_tokens_t *out)
{
    td_tokenizer_t *tok = (td_tokenizer_t *)ctok; /* only the scratch pool is touched */
    struct td_scratch *s = scratch_get(tok);
    if (!s)
        return TD_ENOMEM;
    int rc = 0;
    s->nq = 0; /* what an encode that failed left queued */
    td_buf_reset(&s->qtext);
    if (len && !text) {
        rc = td_err_set(TD_EINVAL, "tokenizer: NULL text");
        goto out;
    }
    for (size_t i = 0; i < len;) { /* validate; replace invalid sequences */
        uint64_t w8;
        if (i + 8 <= len && (memcpy(&w8, text + i, 8), !(w8 & 0x8080808080808080ull))) {
            i += 8; /* eight ASCII bytes */
            continue;
        }
        if ((uint8_t)text[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = td_utf8_valid_len((const uint8_t *)text + i, len - i);
        if (!l) {
            if ((rc = sanitize_utf8(text, len, &s->text)))
                goto out;
            text = s->text.data;
            len = s->text.len;
            break;
        }
        i += l;
    }
    if (add_special_tokens)
        for (size_t i = 0; i < tok->nprefix && !rc; i++)
            rc = td_tokens_push(out, tok->prefix[i]);
    if (!rc)
        rc = td__split_added(tok, s, &tok->trie_raw, text, len, td__seg_normalize, out);
    if (!rc)
        rc = td__bpe_flush(tok, s, out);
    if (add_special_tokens)
        for (size_t i = 0; i < tok->nsuffix && !rc; i++)
            rc = td_tokens_push(out, tok->suffix[i]);
out:
    /* keep pooled scratch small: drop what a large input grew */
    if (s->text.cap > (1 << 20))
        td_buf_free(&s->text);
    if (s->norm.cap > (1 << 20))
        td_buf_free(&s->norm);
    for (size_t i = 0; i < TD__MAX_STEPS; i++)
        if (s->lv[i].cap > (1 << 16)) {
            free(s->lv[i].v);
            s->lv[i] = (td__spanvec_t){0};
        }
    scratch_put(tok, s);
    return rc;
}

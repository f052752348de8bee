/* tokenizer.c: encoding (added tokens, normalization, pre-tokenization, byte-level BPE), decoding
 * and incremental decoding. Mirrors the order of operations of HF tokenizers' encode:
 *
 *   1. split out added tokens that match the raw text (non-normalized ones), leftmost-longest;
 *   2. normalize each remaining piece, then split out the normalized added tokens;
 *   3. run the pre-tokenizer steps over each piece (depth first, so no step holds more than the
 *      piece it is splitting), the last being ByteLevel;
 *   4. BPE each resulting word on its bytes (ids of the byte-level chars, merged by rank);
 *   5. the post-processor's prefix/suffix ids when add_special_tokens.
 */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum {
    CACHE_SLOTS = 1 << 14,  /* word cache slots (power of two) */
    CACHE_TEXT = 512 << 10, /* bytes of cached words */
    CACHE_IDS = 128 << 10,  /* ids of cached words */
    CACHE_MAX_WORD = 64,    /* longer words are not cached */
    SCAN_BPE_MAX = 128,     /* words up to this many bytes merge by scanning, longer by heap */
    MAX_STEPS = TD__MAX_PRETOK + 1, /* pre-tokenizer steps + the ByteLevel regex */
};

/* One piece of a split: [start, end) in the piece being split; `match` says whether the pattern
 * matched it (for the behavior rules). */
typedef struct span {
    size_t start, end;
    bool match;
} span_t;

typedef struct spanvec {
    span_t *v; /* [n] */
    size_t n, cap;
} spanvec_t;

typedef struct cache_ent {
    uint64_t hash; /* 0 = empty */
    uint32_t toff; /* word bytes in text arena */
    uint32_t ioff; /* ids in ids arena */
    uint16_t tlen, nids;
} cache_ent_t;

typedef struct sym {
    int32_t id;    /* token id of this symbol, -1 once merged into its left neighbour */
    int32_t prev;  /* index of the previous live symbol, -1 none */
    int32_t next;  /* index of the next live symbol, -1 none */
    uint32_t rank; /* scan mode: rank of the pair (this, next), UINT32_MAX none */
} sym_t;

struct td_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    spanvec_t lv[MAX_STEPS]; /* per pre-tokenizer depth */
    td_buf_t text;           /* input after U+FFFD replacement */
    td_buf_t norm;           /* normalized piece */
    td_buf_t pfx;            /* piece with ByteLevel's prefix space */
    td_buf_t map;            /* byte-level string of a word (ignore_merges lookup) */
    sym_t *sym;              /* [symcap] BPE symbols of the current word */
    size_t symcap;
    uint64_t *heap;     /* [symcap] BPE pair queue: rank << 32 | position */
    cache_ent_t *cache; /* [CACHE_SLOTS] */
    size_t cache_n;
    char *cache_text; /* [CACHE_TEXT] */
    size_t cache_text_len;
    int32_t *cache_ids; /* [CACHE_IDS] */
    size_t cache_ids_len;
};

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

static int tokens_reserve(td_tokens_t *t, size_t extra)
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
    int rc = tokens_reserve(t, 1);
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

/* ---------------------------------------------------------------- Unicode helpers */

static uint32_t cp_at(const char *p, size_t n, size_t *len)
{
    size_t l = td_utf8_valid_len((const uint8_t *)p, n);
    if (!l) { /* cannot happen on sanitized text */
        *len = 1;
        return 0xFFFD;
    }
    *len = l;
    return td_utf8_decode((const uint8_t *)p, l);
}

/* The code point that ends at p+n. */
static uint32_t cp_before(const char *p, size_t n)
{
    size_t i = n;
    while (i > 0 && n - i < 4 && ((uint8_t)p[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0)
        return 0xFFFD;
    size_t l;
    return cp_at(p + i - 1, n - i + 1, &l);
}

/* Unicode White_Space (Rust's char::is_whitespace and regex \s). */
static bool is_space_cp(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex \w: Alphabetic, marks, decimal numbers, connector punctuation, joiners. */
static bool is_word_cp(uint32_t c)
{
    if (c < 128)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
               (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
               (c >= 0x1F170 && c <= 0x1F189);
    }
}

/* Rust's char::is_numeric: general categories Nd, Nl, No. */
static bool is_numeric_cp(uint32_t c)
{
    if (c < 128)
        return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
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
    for (size_t i = 0; i < MAX_STEPS; i++)
        free(s->lv[i].v);
    td_buf_free(&s->text);
    td_buf_free(&s->norm);
    td_buf_free(&s->pfx);
    td_buf_free(&s->map);
    free(s->sym);
    free(s->heap);
    free(s->cache);
    free(s->cache_text);
    free(s->cache_ids);
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
    s->cache = td_calloc(CACHE_SLOTS, sizeof(cache_ent_t));
    s->cache_text = malloc(CACHE_TEXT);
    s->cache_ids = malloc(CACHE_IDS * sizeof(int32_t));
    if (!s->md || !s->mctx || !s->jstack || !s->cache || !s->cache_text || !s->cache_ids) {
        td__scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
    td_buf_init(&s->text);
    td_buf_init(&s->norm);
    td_buf_init(&s->pfx);
    td_buf_init(&s->map);
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

static int spans_push(spanvec_t *v, size_t start, size_t end, bool match)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        span_t *n = td_reallocarray(v->v, cap, sizeof(*n));
        if (!n)
            return TD_ENOMEM;
        v->v = n;
        v->cap = cap;
    }
    v->v[v->n++] = (span_t){start, end, match};
    return 0;
}

/* ---------------------------------------------------------------- BPE */

static inline const struct td__merge_ent *merge_get(const td_tokenizer_t *tok, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    const td__mergemap_t *m = &tok->merges;
    for (size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;;
         i = (i + 1) & m->mask) {
        const struct td__merge_ent *e = &m->ents[i];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
    }
}

static inline uint32_t pair_rank(const td_tokenizer_t *tok, const sym_t *sym, int32_t i)
{
    if (i < 0 || sym[i].next < 0)
        return UINT32_MAX;
    const struct td__merge_ent *e = merge_get(tok, sym[i].id, sym[sym[i].next].id);
    return e ? e->rank : UINT32_MAX;
}

/* Merge sym[0..n) in place, lowest rank first, leftmost among equals (HF Word::merge_all). */
static void bpe_merge_scan(const td_tokenizer_t *tok, sym_t *sym, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sym[i].rank = pair_rank(tok, sym, (int32_t)i);
    for (;;) {
        uint32_t best = UINT32_MAX;
        int32_t bi = -1;
        for (int32_t i = 0; i >= 0; i = sym[i].next)
            if (sym[i].rank < best) {
                best = sym[i].rank;
                bi = i;
            }
        if (bi < 0)
            return;
        int32_t r = sym[bi].next;
        sym[bi].id = merge_get(tok, sym[bi].id, sym[r].id)->id;
        sym[bi].next = sym[r].next;
        if (sym[r].next >= 0)
            sym[sym[r].next].prev = bi;
        sym[r].id = -1;
        sym[bi].rank = pair_rank(tok, sym, bi);
        if (sym[bi].prev >= 0)
            sym[sym[bi].prev].rank = pair_rank(tok, sym, sym[bi].prev);
    }
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (v <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* Same result as bpe_merge_scan in O(n log n), for long words. The heap never holds more
 * entries than live pairs plus merges done, which is below 2n; it has room for 2n. */
static void bpe_merge_heap(const td_tokenizer_t *tok, sym_t *sym, size_t n, uint64_t *heap)
{
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = pair_rank(tok, sym, (int32_t)i);
        if (r != UINT32_MAX)
            heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t rank = (uint32_t)(top >> 32);
        if (sym[i].id < 0 || sym[i].next < 0 || pair_rank(tok, sym, i) != rank)
            continue; /* stale entry */
        int32_t r = sym[i].next;
        sym[i].id = merge_get(tok, sym[i].id, sym[r].id)->id;
        sym[i].next = sym[r].next;
        if (sym[r].next >= 0)
            sym[sym[r].next].prev = i;
        sym[r].id = -1;
        if (sym[i].prev >= 0) {
            uint32_t pr = pair_rank(tok, sym, sym[i].prev);
            if (pr != UINT32_MAX)
                heap_push(heap, &hn, (uint64_t)pr << 32 | (uint32_t)sym[i].prev);
        }
        uint32_t nr = pair_rank(tok, sym, i);
        if (nr != UINT32_MAX)
            heap_push(heap, &hn, (uint64_t)nr << 32 | (uint32_t)i);
    }
}

static const cache_ent_t *cache_find(struct td_scratch *s, const char *w, size_t n, uint64_t h)
{
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_ent_t *e = &s->cache[i];
        if (!e->hash)
            return NULL;
        if (e->hash == h && e->tlen == n && memcmp(s->cache_text + e->toff, w, n) == 0)
            return e;
    }
}

static void cache_add(struct td_scratch *s, const char *w, size_t n, uint64_t h, const int32_t *ids,
                      size_t nids)
{
    if (s->cache_n >= CACHE_SLOTS / 2 || s->cache_text_len + n > CACHE_TEXT ||
        s->cache_ids_len + nids > CACHE_IDS) {
        memset(s->cache, 0, CACHE_SLOTS * sizeof(cache_ent_t));
        s->cache_n = s->cache_text_len = s->cache_ids_len = 0;
    }
    size_t i = h & (CACHE_SLOTS - 1);
    while (s->cache[i].hash)
        i = (i + 1) & (CACHE_SLOTS - 1);
    memcpy(s->cache_text + s->cache_text_len, w, n);
    memcpy(s->cache_ids + s->cache_ids_len, ids, nids * sizeof(int32_t));
    s->cache[i] = (cache_ent_t){.hash = h,
                                .toff = (uint32_t)s->cache_text_len,
                                .ioff = (uint32_t)s->cache_ids_len,
                                .tlen = (uint16_t)n,
                                .nids = (uint16_t)nids};
    s->cache_text_len += n;
    s->cache_ids_len += nids;
    s->cache_n++;
}

/* BPE one word (raw bytes) and append its ids. */
static int bpe_word(const td_tokenizer_t *tok, struct td_scratch *s, const char *w, size_t n,
                    td_tokens_t *out)
{
    if (!n)
        return 0;
    int rc = tokens_reserve(out, n);
    if (rc)
        return rc;
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = td__hash(w, n);
        const cache_ent_t *e = cache_find(s, w, n, h);
        if (e) {
            memcpy(out->ids + out->len, s->cache_ids + e->ioff, e->nids * sizeof(int32_t));
            out->len += e->nids;
            return 0;
        }
    }
    size_t start = out->len;
    int32_t whole = -1;
    if (tok->ignore_merges) {
        td_buf_reset(&s->map);
        if ((rc = td_buf_reserve(&s->map, 2 * n)))
            return rc;
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)w[i];
            memcpy(s->map.data + s->map.len, tok->byte_char[b], tok->byte_char_len[b]);
            s->map.len += tok->byte_char_len[b];
        }
        whole = td__strmap_get(tok, &tok->vocab, s->map.data, s->map.len);
    }
    if (whole >= 0) {
        out->ids[out->len++] = whole;
    } else {
        if (n > s->symcap) {
            size_t cap = TD_MAX(n, 2 * s->symcap);
            sym_t *ns = td_reallocarray(s->sym, cap, sizeof(sym_t));
            if (!ns)
                return TD_ENOMEM;
            s->sym = ns;
            uint64_t *nh = td_reallocarray(s->heap, 2 * cap, sizeof(uint64_t));
            if (!nh)
                return TD_ENOMEM;
            s->heap = nh;
            s->symcap = cap;
        }
        sym_t *sym = s->sym;
        size_t ns = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t id = tok->byte_id[(uint8_t)w[i]];
            if (id < 0)
                id = tok->unk_id; /* HF drops a char it cannot map unless unk_token is set */
            if (id < 0)
                continue;
            sym[ns] = (sym_t){.id = id, .prev = (int32_t)ns - 1, .next = (int32_t)ns + 1};
            ns++;
        }
        if (!ns)
            return 0;
        sym[ns - 1].next = -1;
        if (ns <= SCAN_BPE_MAX)
            bpe_merge_scan(tok, sym, ns);
        else
            bpe_merge_heap(tok, sym, ns, s->heap);
        for (int32_t i = 0; i >= 0; i = sym[i].next)
            out->ids[out->len++] = sym[i].id;
    }
    if (n <= CACHE_MAX_WORD)
        cache_add(s, w, n, h, out->ids + start, out->len - start);
    return 0;
}

/* ---------------------------------------------------------------- pre-tokenization */

static int regex_matches(const td_tokenizer_t *tok, struct td_scratch *s, const pcre2_code *re,
                         const char *p, size_t n, bool invert, spanvec_t *v)
{
    size_t off = 0, prev = 0;
    size_t last_end = SIZE_MAX;
    while (off <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return td_err_set(TD_EINTERNAL, "%s: pre-tokenizer regex failed: %s", tok->name,
                              (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: never right after the previous match, then step on */
            size_t cl = 1;
            if (ms < n)
                (void)cp_at(p + ms, n - ms, &cl);
            if (ms != last_end) {
                if (prev != ms && spans_push(v, prev, ms, invert))
                    return TD_ENOMEM;
                if (spans_push(v, ms, ms, !invert))
                    return TD_ENOMEM;
                prev = ms;
            }
            off = ms + cl;
            last_end = ms;
            continue;
        }
        if (prev != ms && spans_push(v, prev, ms, invert))
            return TD_ENOMEM;
        if (spans_push(v, ms, me, !invert))
            return TD_ENOMEM;
        prev = off = last_end = me;
    }
    if (prev != n && spans_push(v, prev, n, invert))
        return TD_ENOMEM;
    return 0;
}

static int digit_matches(const char *p, size_t n, spanvec_t *v)
{
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = cp_at(p + i, n - i, &l);
        if (is_numeric_cp(c)) {
            if (last < i && spans_push(v, last, i, false))
                return TD_ENOMEM;
            if (spans_push(v, i, i + l, true))
                return TD_ENOMEM;
            last = i + l;
        }
        i += l;
    }
    if (last < n && spans_push(v, last, n, false))
        return TD_ENOMEM;
    return 0;
}

/* Rewrite the match list in place into the pieces kept, per HF NormalizedString::split. A kept
 * piece has match = false; removed ones are dropped. */
static void apply_behavior(spanvec_t *v, td__split_behavior_t b)
{
    span_t *a = v->v;
    size_t n = v->n, w = 0;
    bool prev_match = false;
    switch (b) {
    case TD__SPLIT_ISOLATED:
        break;
    case TD__SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!a[i].match)
                a[w++] = a[i];
        v->n = w;
        break;
    case TD__SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (w > 0 && a[i].match == prev_match)
                a[w - 1].end = a[i].end;
            else
                a[w++] = a[i];
            prev_match = a[i].match;
        }
        v->n = w;
        break;
    case TD__SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (w > 0 && a[i].match && !prev_match)
                a[w - 1].end = a[i].end;
            else
                a[w++] = a[i];
            prev_match = a[i].match;
        }
        v->n = w;
        break;
    case TD__SPLIT_MERGED_NEXT: {
        /* the same fold run from the end: w counts kept pieces written from the back */
        size_t r = n;
        for (size_t i = n; i-- > 0;) {
            span_t cur = a[i];
            if (r < n && cur.match && !prev_match)
                a[r].start = cur.start;
            else
                a[--r] = cur;
            prev_match = cur.match;
        }
        memmove(a, a + r, (n - r) * sizeof(span_t));
        v->n = n - r;
        break;
    }
    }
}

static int bytelevel_step(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                          td_tokens_t *out)
{
    int rc;
    if (tok->bl_prefix_space && p[0] != ' ') {
        td_buf_reset(&s->pfx);
        if ((rc = td_buf_append_char(&s->pfx, ' ')) || (rc = td_buf_append(&s->pfx, p, n)))
            return rc;
        p = s->pfx.data;
        n = s->pfx.len;
    }
    if (!tok->bl_re)
        return bpe_word(tok, s, p, n, out);
    spanvec_t *v = &s->lv[tok->npretok];
    v->n = 0;
    if ((rc = regex_matches(tok, s, tok->bl_re, p, n, false, v)))
        return rc;
    for (size_t i = 0; i < v->n; i++)
        if ((rc = bpe_word(tok, s, p + v->v[i].start, v->v[i].end - v->v[i].start, out)))
            return rc;
    return 0;
}

static int pretok_run(const td_tokenizer_t *tok, struct td_scratch *s, size_t step, const char *p,
                      size_t n, td_tokens_t *out)
{
    if (!n)
        return 0;
    if (step == tok->npretok)
        return bytelevel_step(tok, s, p, n, out);
    const td__pretok_t *pt = &tok->pretok[step];
    spanvec_t *v = &s->lv[step];
    v->n = 0;
    int rc = pt->kind == TD__PRETOK_SPLIT ? regex_matches(tok, s, pt->re, p, n, pt->invert, v)
                                          : digit_matches(p, n, v);
    if (rc)
        return rc;
    apply_behavior(v, pt->behavior);
    for (size_t i = 0; i < v->n; i++) {
        span_t sp = s->lv[step].v[i];
        if (sp.end > sp.start &&
            (rc = pretok_run(tok, s, step + 1, p + sp.start, sp.end - sp.start, out)))
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- added tokens */

/* Longest added token starting at p[0], or -1; *len gets its length. */
static int32_t trie_longest(const td__trie_t *t, const char *p, size_t n, size_t *len)
{
    int32_t cur = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[cur].first_child;
        while (c >= 0 && t->nodes[c].byte != (uint8_t)p[i])
            c = t->nodes[c].next_sibling;
        if (c < 0)
            break;
        cur = c;
        if (t->nodes[cur].added >= 0) {
            best = t->nodes[cur].added;
            *len = i + 1;
        }
    }
    return best;
}

typedef int (*segment_fn)(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                          td_tokens_t *out);

/* HF AddedVocabulary::find_matches + split_with_indices: emit added-token ids and hand the text
 * between them to `seg`. */
static int split_added(const td_tokenizer_t *tok, struct td_scratch *s, const td__trie_t *t,
                       const char *p, size_t n, segment_fn seg, td_tokens_t *out)
{
    int rc;
    size_t start_offset = 0, pos = 0;
    if (t->nnodes > 1) {
        while (pos < n) {
            /* leftmost-longest: the first position where some token starts, its longest one */
            size_t i = pos, mlen = 0;
            int32_t ai = -1;
            for (; i < n; i++) {
                uint8_t b = (uint8_t)p[i];
                if (!(t->first[b >> 3] & (1u << (b & 7))))
                    continue;
                if ((ai = trie_longest(t, p + i, n - i, &mlen)) >= 0)
                    break;
            }
            if (ai < 0)
                break;
            size_t start = i, stop = i + mlen;
            pos = stop;
            const td__added_t *at = &tok->added[ai];
            if (tok->split_special && at->special)
                continue;
            if (at->single_word) {
                bool start_space = start == 0 || !is_word_cp(cp_before(p, start));
                size_t l;
                bool stop_space = stop == n || !is_word_cp(cp_at(p + stop, n - stop, &l));
                if (!start_space || !stop_space)
                    continue;
            }
            if (at->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t k = ns;
                    while (k > 0 && ns - k < 4 && ((uint8_t)p[k - 1] & 0xC0) == 0x80)
                        k--;
                    if (k == 0)
                        break;
                    size_t l;
                    if (!is_space_cp(cp_at(p + k - 1, ns - k + 1, &l)))
                        break;
                    ns = k - 1;
                }
                start = TD_MAX(ns, start_offset);
            }
            if (at->rstrip) {
                while (stop < n) {
                    size_t l;
                    if (!is_space_cp(cp_at(p + stop, n - stop, &l)))
                        break;
                    stop += l;
                }
            }
            if (start_offset < start &&
                (rc = seg(tok, s, p + start_offset, start - start_offset, out)))
                return rc;
            if ((rc = td_tokens_push(out, at->id)))
                return rc;
            start_offset = stop;
        }
    }
    if (start_offset < n)
        return seg(tok, s, p + start_offset, n - start_offset, out);
    return 0;
}

static int seg_pretok(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                      td_tokens_t *out)
{
    return pretok_run(tok, s, 0, p, n, out);
}

/* A piece between raw added tokens: normalize it, then split out the normalized added tokens. */
/* Append the normalization of [p, p+n) (utf8proc, `flags`) to `out`. */
static int norm_append(const td_tokenizer_t *tok, int flags, const char *p, size_t n, td_buf_t *out)
{
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)flags);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM
                   ? TD_ENOMEM
                   : td_err_set(TD_EINTERNAL, "%s: normalizer: %s", tok->name, utf8proc_errmsg(r));
    int rc = td_buf_append(out, dst, (size_t)r);
    free(dst);
    return rc;
}

/* A code point that NFC leaves as it is and that nothing before it can combine with or reorder
 * around: below U+0300, or a starter (combining class 0) without a decomposition that takes part
 * in no composition (Hangul jamo compose algorithmically, so they never count). Text can be cut
 * before such a character and each side normalized alone. */
static bool nfc_inert(uint32_t c)
{
    if (c < 0x300)
        return true;
    if (c >= 0x1100 && c <= 0x11FF)
        return false;
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)c);
    return pr->combining_class == 0 && pr->decomp_seqindex == UINT16_MAX &&
           pr->comb_index == UINT16_MAX;
}

/* NFC of [p, p+n) into s->norm, running utf8proc only over the stretches that hold characters
 * that are not inert (each with the inert starter before it). *same when nothing changes. */
static int nfc_regions(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                       bool *same)
{
    size_t i = 0, last_inert = 0, copied = 0;
    int rc;
    *same = true;
    td_buf_reset(&s->norm);
    while (i < n) {
        size_t l = 1;
        if ((uint8_t)p[i] < 0x80 || nfc_inert(cp_at(p + i, n - i, &l))) {
            last_inert = i;
            i += l;
            continue;
        }
        size_t j = i + l; /* the stretch of non-inert characters */
        while (j < n && (uint8_t)p[j] >= 0x80 && !nfc_inert(cp_at(p + j, n - j, &l)))
            j += l;
        *same = false;
        if ((rc = td_buf_append(&s->norm, p + copied, last_inert - copied)) ||
            (rc = norm_append(tok, tok->norm_utf8proc, p + last_inert, j - last_inert, &s->norm)))
            return rc;
        copied = last_inert = i = j;
    }
    if (*same)
        return 0;
    return td_buf_append(&s->norm, p + copied, n - copied);
}

/* A piece between raw added tokens: normalize it, then split out the normalized added tokens. */
static int seg_normalize(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                         td_tokens_t *out)
{
    int rc;
    if (tok->norm_utf8proc == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
        bool same;
        if ((rc = nfc_regions(tok, s, p, n, &same)))
            return rc;
        if (!same) {
            p = s->norm.data;
            n = s->norm.len;
        }
    } else if (tok->norm_utf8proc) {
        /* ASCII is unchanged by every form */
        bool ascii = true;
        for (size_t i = 0; i < n && ascii; i++)
            ascii = (uint8_t)p[i] < 0x80;
        if (!ascii) {
            td_buf_reset(&s->norm);
            if ((rc = norm_append(tok, tok->norm_utf8proc, p, n, &s->norm)))
                return rc;
            p = s->norm.data;
            n = s->norm.len;
        }
    }
    return split_added(tok, s, &tok->trie_norm, p, n, seg_pretok, out);
}

int td_tokenizer_encode(const td_tokenizer_t *ctok, const char *text, size_t len,
                        bool add_special_tokens, td_tokens_t *out)
{
    td_tokenizer_t *tok = (td_tokenizer_t *)ctok; /* only the scratch pool is touched */
    struct td_scratch *s = scratch_get(tok);
    if (!s)
        return TD_ENOMEM;
    int rc = 0;
    if (len && !text) {
        rc = td_err_set(TD_EINVAL, "tokenizer: NULL text");
        goto out;
    }
    for (size_t i = 0; i < len;) { /* validate; replace invalid sequences */
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
        rc = split_added(tok, s, &tok->trie_raw, text, len, seg_normalize, out);
    if (add_special_tokens)
        for (size_t i = 0; i < tok->nsuffix && !rc; i++)
            rc = td_tokens_push(out, tok->suffix[i]);
out:
    /* keep pooled scratch small: drop what a large input grew */
    if (s->text.cap > (1 << 20))
        td_buf_free(&s->text);
    if (s->norm.cap > (1 << 20))
        td_buf_free(&s->norm);
    for (size_t i = 0; i < MAX_STEPS; i++)
        if (s->lv[i].cap > (1 << 16)) {
            free(s->lv[i].v);
            s->lv[i] = (spanvec_t){0};
        }
    scratch_put(tok, s);
    return rc;
}

/* ---------------------------------------------------------------- decoding */

void td_detok_init(td_detok_t *st, bool skip_special_tokens)
{
    memset(st, 0, sizeof(*st));
    st->skip_special = skip_special_tokens;
}

/* Streaming WHATWG UTF-8 decoding: complete characters out, U+FFFD for each maximal invalid
 * subpart, an incomplete tail held in st->part. */
static int emit_bytes(td_detok_t *st, const uint8_t *p, size_t n, td_buf_t *out)
{
    if (td_buf_reserve(out, n + 8))
        return TD_ENOMEM;
    for (size_t i = 0; i < n;) {
        uint8_t b = p[i];
        if (st->npart == 0) {
            size_t l = td_utf8_valid_len(p + i, n - i);
            if (l) {
                size_t j = i + l;
                while (j < n && (l = td_utf8_valid_len(p + j, n - j)))
                    j += l;
                if (td_buf_append(out, p + i, j - i))
                    return TD_ENOMEM;
                i = j;
                continue;
            }
            uint8_t need = b >= 0xC2 && b <= 0xDF   ? 2
                           : b >= 0xE0 && b <= 0xEF ? 3
                           : b >= 0xF0 && b <= 0xF4 ? 4
                                                    : 0;
            if (!need) {
                if (td_buf_append(out, "\xEF\xBF\xBD", 3))
                    return TD_ENOMEM;
            } else {
                st->part[0] = b;
                st->npart = 1;
                st->need = need;
            }
            i++;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xBF, c = st->part[0];
        if (st->npart == 1) {
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            else if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        if (b < lo || b > hi) { /* the held bytes can never complete; b starts afresh */
            st->npart = 0;
            if (td_buf_append(out, "\xEF\xBF\xBD", 3))
                return TD_ENOMEM;
            continue;
        }
        st->part[st->npart++] = b;
        i++;
        if (st->npart == st->need) {
            if (td_buf_append(out, st->part, st->npart))
                return TD_ENOMEM;
            st->npart = 0;
        }
    }
    return 0;
}

int td_detok_finish(const td_tokenizer_t *tok, td_detok_t *st, td_buf_t *out)
{
    (void)tok;
    if (td_buf_reserve(out, 3))
        return TD_ENOMEM;
    if (st->npart) {
        st->npart = 0;
        return td_buf_append(out, "\xEF\xBF\xBD", 3);
    }
    return 0;
}

int td_detok_step(const td_tokenizer_t *tok, td_detok_t *st, int32_t id, td_buf_t *out)
{
    if (id < 0 || (size_t)id >= tok->nids ||
        (tok->ids[id].tok_len == UINT32_MAX && tok->ids[id].added < 0))
        return td_err_set(TD_ERANGE, "%s: token id %d is not in the vocabulary", tok->name, id);
    const td__idinfo_t *ii = &tok->ids[id];
    int rc;
    if (ii->added >= 0) {
        const td__added_t *at = &tok->added[ii->added];
        if (at->special && st->skip_special)
            return 0;
        /* an added token ends the byte-level chunk: HF decodes each chunk on its own */
        if ((rc = td_detok_finish(tok, st, out)))
            return rc;
        return td_buf_append(out, tok->arena + at->off, at->len);
    }
    return emit_bytes(st, (const uint8_t *)tok->arena + ii->dec_off, ii->dec_len, out);
}

int td_tokenizer_decode(const td_tokenizer_t *tok, const int32_t *ids, size_t n,
                        bool skip_special_tokens, td_buf_t *out)
{
    td_detok_t st;
    td_detok_init(&st, skip_special_tokens);
    if (td_buf_reserve(out, n * 4 + 1))
        return TD_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = td_detok_step(tok, &st, ids[i], out);
        if (rc == TD_ERANGE)
            return td_err_set(TD_ERANGE, "%s: token id %d (at index %zu) is not in the vocabulary",
                              tok->name, ids[i], i);
        if (rc)
            return rc;
    }
    return td_detok_finish(tok, &st, out);
}

/* tokenizer_tables.c: the loaded tokenizer's tables: the string arena, the vocabulary and
 * added-token maps, the merge table, and GPT-2's byte-level alphabet. */
#include "td_error.h"
#include "tokenizer_impl.h"
#include "tokenizer_load_impl.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint64_t td__hash(const void *p, size_t n)
{
    uint64_t h = XXH3_64bits(p, n);
    return h ? h : 1;
}

int td__arena_add(td_tokenizer_t *tok, const void *p, size_t n, uint32_t *off)
{
    if (tok->arena_len + n + 1 > UINT32_MAX)
        return td_err_set(TD_EOVERFLOW, "%s: tokenizer strings exceed 4 GiB", tok->name);
    if (tok->arena_len + n + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 20;
        while (cap < tok->arena_len + n + 1)
            cap *= 2;
        char *a = realloc(tok->arena, cap);
        if (!a)
            return TD_ENOMEM;
        tok->arena = a;
        tok->arena_cap = cap;
    }
    if (n)
        memcpy(tok->arena + tok->arena_len, p, n);
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += n;
    tok->arena[tok->arena_len++] = '\0'; /* every string stays NUL-terminated */
    return 0;
}

int td__strmap_init(td__strmap_t *m, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2)
        cap *= 2;
    m->ents = td_huge_calloc(cap, sizeof(*m->ents));
    if (!m->ents)
        return TD_ENOMEM;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

int32_t td__strmap_get(const td_tokenizer_t *tok, const td__strmap_t *m, const char *s, size_t n)
{
    if (!m->ents)
        return -1;
    uint64_t h = td__hash(s, n);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct td__strmap_ent *e = &m->ents[i];
        if (!e->hash)
            return -1;
        if (e->hash == h && e->len == n && memcmp(tok->arena + e->off, s, n) == 0)
            return e->id;
    }
}

/* Insert or overwrite; the key must already be in the arena at `off`. */
void td__strmap_put(td_tokenizer_t *tok, td__strmap_t *m, uint32_t off, uint32_t len, int32_t id)
{
    uint64_t h = td__hash(tok->arena + off, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct td__strmap_ent *e = &m->ents[i];
        if (!e->hash) {
            *e = (struct td__strmap_ent){.hash = h, .off = off, .len = len, .id = id};
            m->n++;
            return;
        }
        if (e->hash == h && e->len == len &&
            memcmp(tok->arena + e->off, tok->arena + off, len) == 0) {
            e->id = id;
            return;
        }
    }
}

int td__mergemap_init(td__mergemap_t *m, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2)
        cap *= 2;
    m->ents = td_huge_calloc(cap, sizeof(*m->ents));
    m->ids = malloc(TD_MAX(want, 1) * sizeof(*m->ids));
    if (!m->ents || !m->ids) {
        td_huge_free(m->ents, cap * sizeof(*m->ents));
        free(m->ids);
        m->ents = NULL;
        m->ids = NULL;
        return TD_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++)
        m->ents[i] = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

/* Later duplicates overwrite earlier ones, as HF's HashMap collect does. */
void td__mergemap_put(td__mergemap_t *m, int32_t left, int32_t right, uint32_t rank, int32_t id)
{
    uint64_t pair = td__merge_pair(left, right);
    m->ids[rank] = id;
    for (size_t i = td__merge_slot(pair, m->mask);; i = (i + 1) & m->mask) {
        uint64_t *e = &m->ents[i];
        if (*e == UINT64_MAX) {
            *e = pair | rank;
            m->n++;
            return;
        }
        if ((*e & ~(uint64_t)(TD__MERGE_RANKS - 1)) == pair) {
            *e = pair | rank;
            return;
        }
    }
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 onwards. */
void td__byte_level_init(td_tokenizer_t *tok)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            cp = (uint32_t)b;
        else
            cp = 256 + (uint32_t)n++;
        tok->byte_char_len[b] = (uint8_t)td_utf8_encode(cp, tok->byte_char[b]);
    }
}

/* Inverse map of td__byte_level_init for a code point, -1 when it is not a byte-level char. */
int td__byte_of_char(uint32_t cp)
{
    static int16_t inv[324];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        int16_t t[324];
        for (int i = 0; i < 324; i++)
            t[i] = -1;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
                t[b] = (int16_t)b;
            else
                t[256 + n++] = (int16_t)b;
        }
        memcpy(inv, t, sizeof(t));
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return cp < 324 ? inv[cp] : -1;
}

/* Copy the merges whose ids are both below the largest power of two that keeps them within
 * TD__MERGE_HOT_MAX into m->hot (none when even 2 would not, or the copy cannot be allocated:
 * every lookup then goes to the full table, which is only slower). */
static void mergemap_hot(td__mergemap_t *m)
{
    size_t below[TD__MERGE_ID_BITS + 1] = {0}; /* merges whose larger id needs k bits */
    for (size_t i = 0; i <= m->mask; i++) {
        uint64_t e = m->ents[i];
        if (e == UINT64_MAX)
            continue;
        uint32_t l, r;
        td__merge_ids(e, &l, &r);
        uint32_t big = TD_MAX(l, r);
        below[big ? 32 - __builtin_clz(big) : 0]++;
    }
    size_t n = 0, bits = 0; /* the hot table takes the merges whose ids have at most `bits` bits */
    for (size_t k = 0; k <= TD__MERGE_ID_BITS && n + below[k] <= TD__MERGE_HOT_MAX; k++) {
        n += below[k];
        bits = k;
    }
    m->hot_lim = 0;
    if (bits < 1)
        return;
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    m->hot = malloc(cap * sizeof(*m->hot));
    if (!m->hot)
        return;
    for (size_t i = 0; i < cap; i++)
        m->hot[i] = UINT64_MAX;
    m->hot_mask = cap - 1;
    uint32_t lim = 1u << bits;
    for (size_t i = 0; i <= m->mask; i++) {
        uint64_t e = m->ents[i];
        if (e == UINT64_MAX)
            continue;
        uint32_t l, r;
        td__merge_ids(e, &l, &r);
        if ((l | r) >= lim)
            continue;
        size_t j = td__merge_slot(e & ~(uint64_t)(TD__MERGE_RANKS - 1), m->hot_mask);
        while (m->hot[j] != UINT64_MAX)
            j = (j + 1) & m->hot_mask;
        m->hot[j] = e;
    }
    m->hot_lim = lim;
}

void td__mergemap_done(td__mergemap_t *m, size_t nranks)
{
    m->n_ranks = nranks;
    m->by_offset = nranks > 0;
    m->id_offset = nranks ? m->ids[0] : 0;
    for (size_t r = 0; r < nranks && m->by_offset; r++)
        m->by_offset = (int64_t)m->ids[r] == (int64_t)r + m->id_offset;
    mergemap_hot(m);
}

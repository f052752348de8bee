/* tokenizer_bpe.c: byte-level BPE of one pre-tokenized word (stage 4 of encode), with the
 * per-scratch word cache in front of it. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

enum {
    CACHE_MAX_WORD = 64, /* longer words are not cached (below TD__SCAN_MAX) */
};

static inline uint32_t merge_rank(const td_tokenizer_t *tok, int32_t a, int32_t b)
{
    uint64_t pair = td__merge_pair(a, b);
    size_t mask;
    const uint64_t *t = td__merge_table(&tok->merges, a, b, &mask);
    return td__merge_at(t, mask, pair, td__merge_slot(pair, mask));
}

static inline uint32_t pair_rank(const td_tokenizer_t *tok, const td__sym_t *sym, int32_t i)
{
    if (i < 0 || sym[i].next < 0)
        return UINT32_MAX;
    return merge_rank(tok, sym[i].id, sym[sym[i].next].id);
}

/* A batch merges up to TD__BPE_BATCH words in rounds: each round every unfinished word picks its
 * lowest-rank pair (leftmost among equals, HF Word::merge_all), merges it, and starts the lookups
 * of the two pairs that changed; then all those lookups are finished. The symbols of a word stay
 * packed (a merge moves the tail down one place), so picking is a pass over contiguous memory,
 * and the probes of different words, all cache misses on a large table, overlap. */

/* A probe's slot has SLOT_HOT set when it is in the hot table. */
#define SLOT_HOT 0x80000000u

/* Compute the slots of pairs lo..hi of sc and prefetch them. */
static inline void probe_start(const td__mergemap_t *m, td__scan_t *sc, uint32_t lo, uint32_t hi)
{
    sc->lo = lo;
    sc->hi = hi;
    for (uint32_t i = lo; i <= hi; i++) {
        size_t mask;
        const uint64_t *t = td__merge_table(m, sc->id[i], sc->id[i + 1], &mask);
        uint32_t slot = (uint32_t)td__merge_slot(td__merge_pair(sc->id[i], sc->id[i + 1]), mask);
        __builtin_prefetch(&t[slot]);
        sc->slot[i] = slot | (t == m->hot ? SLOT_HOT : 0);
    }
}

static inline void probe_finish(const td__mergemap_t *m, td__scan_t *sc)
{
    for (uint32_t i = sc->lo; i <= sc->hi; i++) {
        uint32_t slot = sc->slot[i];
        uint64_t pair = td__merge_pair(sc->id[i], sc->id[i + 1]);
        sc->rank[i] = slot & SLOT_HOT ? td__merge_at(m->hot, m->hot_mask, pair, slot & ~SLOT_HOT)
                                      : td__merge_at(m->ents, m->mask, pair, slot);
    }
    sc->lo = 1;
    sc->hi = 0;
}

/* Pick sc's lowest-rank pair (sc->best, sc->at) and prefetch the id it merges into. */
static inline void pick(const td__mergemap_t *m, td__scan_t *sc)
{
    uint32_t best = UINT32_MAX, at = 0;
    for (uint32_t i = 0; i + 1 < sc->n; i++)
        if (sc->rank[i] < best) {
            best = sc->rank[i];
            at = i;
        }
    sc->best = best;
    sc->at = at;
    if (best != UINT32_MAX && !m->by_offset)
        __builtin_prefetch(&m->ids[best]);
}

/* Do the merge pick chose and start the lookups of the pairs it changed. */
static inline void merge_picked(const td__mergemap_t *m, td__scan_t *sc)
{
    uint32_t bi = sc->at;
    sc->id[bi] = td__merge_id(m, sc->best);
    uint32_t n = --sc->n;
    uint32_t tail = n - bi - 1; /* symbols after the one absorbed into bi */
    memmove(&sc->id[bi + 1], &sc->id[bi + 2], tail * sizeof(int32_t));
    memmove(&sc->rank[bi + 1], &sc->rank[bi + 2], tail * sizeof(uint32_t));
    sc->rank[n - 1] = UINT32_MAX;
    if (n >= 2) /* the pairs (bi - 1, bi) and (bi, bi + 1), where they exist */
        probe_start(m, sc, bi ? bi - 1 : bi, bi + 1 < n ? bi : bi - 1);
}

/* Merge the symbols of the words sc[which[0..nw)] (each holds its byte ids in id[0..n)) to the
 * end. */
static void bpe_merge_batch(const td_tokenizer_t *tok, td__scan_t *sc, const size_t *which,
                            size_t nw)
{
    const td__mergemap_t *m = &tok->merges;
    size_t act[TD__BPE_BATCH], na = 0; /* the words still merging */
    for (size_t w = 0; w < nw; w++) {
        size_t k = which[w];
        sc[k].lo = 1;
        sc[k].hi = 0;
        if (sc[k].n >= 2) {
            sc[k].rank[sc[k].n - 1] = UINT32_MAX;
            probe_start(m, &sc[k], 0, sc[k].n - 2);
            act[na++] = k;
        }
    }
    for (size_t i = 0; i < na; i++)
        probe_finish(m, &sc[act[i]]);
    while (na) {
        for (size_t i = 0; i < na; i++)
            pick(m, &sc[act[i]]);
        size_t j = 0;
        for (size_t i = 0; i < na; i++)
            if (sc[act[i]].best != UINT32_MAX) {
                merge_picked(m, &sc[act[i]]);
                act[j++] = act[i];
            }
        na = j;
        for (size_t i = 0; i < na; i++)
            probe_finish(m, &sc[act[i]]);
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
static void bpe_merge_heap(const td_tokenizer_t *tok, td__sym_t *sym, size_t n, uint64_t *heap)
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
        sym[i].id = td__merge_id(&tok->merges, rank);
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

/* BPE a word longer than TD__SCAN_MAX bytes by heap and append its ids. 0 or TD_ENOMEM. */
static int bpe_long(const td_tokenizer_t *tok, struct td_scratch *s, const char *w, size_t n,
                    td_tokens_t *out)
{
    if (n > s->symcap) {
        size_t cap = TD_MAX(n, 2 * s->symcap);
        td__sym_t *ns = td_reallocarray(s->sym, cap, sizeof(td__sym_t));
        if (!ns)
            return TD_ENOMEM;
        s->sym = ns;
        uint64_t *nh = td_reallocarray(s->heap, 2 * cap, sizeof(uint64_t));
        if (!nh)
            return TD_ENOMEM;
        s->heap = nh;
        s->symcap = cap;
    }
    td__sym_t *sym = s->sym;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[(uint8_t)w[i]];
        if (id < 0)
            id = tok->unk_id; /* HF drops a char it cannot map unless unk_token is set */
        if (id < 0)
            continue;
        sym[ns] = (td__sym_t){.id = id, .prev = (int32_t)ns - 1, .next = (int32_t)ns + 1};
        ns++;
    }
    if (!ns)
        return 0;
    sym[ns - 1].next = -1;
    bpe_merge_heap(tok, sym, ns, s->heap);
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        out->ids[out->len++] = sym[i].id;
    return 0;
}

static const td__cache_ent_t *cache_find(struct td_scratch *s, const char *w, size_t n, uint64_t h)
{
    for (size_t i = h & (TD__CACHE_SLOTS - 1);; i = (i + 1) & (TD__CACHE_SLOTS - 1)) {
        const td__cache_ent_t *e = &s->cache[i];
        if (!e->hash)
            return NULL;
        if (e->hash == h && e->tlen == n && memcmp(s->cache_text + e->toff, w, n) == 0)
            return e;
    }
}

static void cache_add(struct td_scratch *s, const char *w, size_t n, uint64_t h, const int32_t *ids,
                      size_t nids)
{
    if (s->cache_n >= TD__CACHE_SLOTS / 2 || s->cache_text_len + n > TD__CACHE_TEXT ||
        s->cache_ids_len + nids > TD__CACHE_IDS) {
        memset(s->cache, 0, TD__CACHE_SLOTS * sizeof(td__cache_ent_t));
        s->cache_n = s->cache_text_len = s->cache_ids_len = 0;
    }
    size_t i = h & (TD__CACHE_SLOTS - 1);
    while (s->cache[i].hash)
        i = (i + 1) & (TD__CACHE_SLOTS - 1);
    memcpy(s->cache_text + s->cache_text_len, w, n);
    memcpy(s->cache_ids + s->cache_ids_len, ids, nids * sizeof(int32_t));
    s->cache[i] = (td__cache_ent_t){.hash = h,
                                    .toff = (uint32_t)s->cache_text_len,
                                    .ioff = (uint32_t)s->cache_ids_len,
                                    .tlen = (uint16_t)n,
                                    .nids = (uint16_t)nids};
    s->cache_text_len += n;
    s->cache_ids_len += nids;
    s->cache_n++;
}

/* The byte ids of w[0..n) into sc (unmappable bytes become unk_token, or are dropped). */
static void scan_fill(const td_tokenizer_t *tok, td__scan_t *sc, const char *w, size_t n)
{
    uint32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[(uint8_t)w[i]];
        if (id < 0)
            id = tok->unk_id; /* HF drops a char it cannot map unless unk_token is set */
        if (id >= 0)
            sc->id[ns++] = id;
    }
    sc->n = ns;
}

int td__bpe_self_init(td_tokenizer_t *tok)
{
    if (tok->ignore_merges)
        return 0;
    tok->bpe_self = td_calloc(tok->nids / 64 + 1, sizeof(uint64_t));
    td__scan_t *sc = td_calloc(TD__BPE_BATCH, sizeof(td__scan_t));
    if (!tok->bpe_self || !sc) {
        free(sc);
        return TD_ENOMEM;
    }
    size_t which[TD__BPE_BATCH];
    int32_t who[TD__BPE_BATCH];
    size_t nw = 0;
    for (size_t id = 0; id <= tok->nids; id++) {
        if (nw == TD__BPE_BATCH || (id == tok->nids && nw)) {
            bpe_merge_batch(tok, sc, which, nw);
            for (size_t k = 0; k < nw; k++)
                if (sc[k].n == 1 && sc[k].id[0] == who[k])
                    tok->bpe_self[who[k] / 64] |= 1ull << (who[k] % 64);
            nw = 0;
        }
        if (id == tok->nids)
            break;
        const td__idinfo_t *ii = &tok->ids[id];
        /* model tokens whose every char is a byte-level char (their decoded bytes are a copy) */
        if (ii->tok_len == UINT32_MAX || ii->dec_off == ii->tok_off || !ii->dec_len ||
            ii->dec_len > TD__SCAN_MAX)
            continue;
        scan_fill(tok, &sc[nw], tok->arena + ii->dec_off, ii->dec_len);
        which[nw] = nw;
        who[nw++] = (int32_t)id;
    }
    free(sc);
    return 0;
}

/* The byte-level string of w[0..n) into m (room for 2 n bytes); its length. */
static size_t byte_level(const td_tokenizer_t *tok, const char *w, size_t n, char *m)
{
    size_t ml = 0;
    for (size_t i = 0; i < n; i++) { /* byte-level chars are U+0021..U+0143: 1 or 2 bytes */
        uint8_t b = (uint8_t)w[i];
        m[ml] = tok->byte_char[b][0];
        m[ml + 1] = tok->byte_char[b][1];
        ml += tok->byte_char_len[b];
    }
    return ml;
}

/* The vocabulary entry whose hash and length are h and n, NULL none (the bytes still to compare). */
static const struct td__strmap_ent *vocab_slot(const td__strmap_t *m, uint64_t h, size_t n)
{
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct td__strmap_ent *e = &m->ents[i];
        if (!e->hash)
            return NULL;
        if (e->hash == h && e->len == n)
            return e;
    }
}

/* Count a batch's word-cache lookups and hits toward s->cache_single (tokenizer_impl.h). */
static void single_policy(struct td_scratch *s, size_t looks, size_t hits)
{
    s->win_looks += (uint32_t)looks;
    s->win_hits += (uint32_t)hits;
    if (s->win_looks < TD__CACHE_WINDOW)
        return;
    if (s->cache_single)
        s->cache_single = 4 * s->win_hits >= s->win_looks;
    else
        s->cache_single = ++s->win_count % 8 == 0;
    s->win_looks = s->win_hits = 0;
}

int td__bpe_flush(const td_tokenizer_t *tok, struct td_scratch *s, td_tokens_t *out)
{
    size_t nq = s->nq;
    if (!nq)
        return 0;
    s->nq = 0;
    size_t total = 0;
    for (size_t k = 0; k < nq; k++)
        total += s->qlen[k];
    int rc = td__tokens_reserve(out, total);
    if (rc) {
        td_buf_reset(&s->qtext);
        return rc;
    }
    const char *base = s->qtext.data;
    uint64_t h[TD__BPE_BATCH], vh[TD__BPE_BATCH];
    char vm[TD__BPE_BATCH][2 * TD__SCAN_MAX]; /* byte-level strings (byte_level: <= 2 n bytes) */
    size_t vn[TD__BPE_BATCH];
    const struct td__strmap_ent *ve[TD__BPE_BATCH];
    bool hit[TD__BPE_BATCH];
    size_t which[TD__BPE_BATCH], nw = 0;
    /* in passes, each starting the cache misses the next one needs: the word cache's slots
     * (prefetched when the words were queued), the vocabulary's slots, then its bytes */
    for (size_t k = 0; k < nq; k++) {
        h[k] = s->qhash[k];
        ve[k] = NULL;
        const td__cache_ent_t *e = h[k] ? cache_find(s, base + s->qoff[k], s->qlen[k], h[k]) : NULL;
        if ((hit[k] = e != NULL)) { /* copied out before any cache_add below can reset it */
            memcpy(s->qscan[k].id, s->cache_ids + e->ioff, e->nids * sizeof(int32_t));
            s->qscan[k].n = e->nids;
            continue;
        }
        if (tok->match) { /* longest match first, below */
            which[nw++] = k;
            continue;
        }
        if (tok->bpe_self) {
            vn[k] = byte_level(tok, base + s->qoff[k], s->qlen[k], vm[k]);
            vh[k] = td__hash(vm[k], vn[k]);
            __builtin_prefetch(&tok->vocab.ents[vh[k] & tok->vocab.mask]);
        }
    }
    if (tok->match) { /* the words it does not settle are merged */
        single_policy(s, nq, nq - nw);
        size_t left[TD__BPE_BATCH];
        nw = td__bpe_match(tok, s, which, nw, left);
        for (size_t i = 0; i < nw; i++) {
            which[i] = left[i];
            scan_fill(tok, &s->qscan[left[i]], base + s->qoff[left[i]], s->qlen[left[i]]);
        }
    }
    for (size_t k = 0; k < nq; k++)
        if (!hit[k] && !tok->match && tok->bpe_self &&
            (ve[k] = vocab_slot(&tok->vocab, vh[k], vn[k])))
            __builtin_prefetch(tok->arena + ve[k]->off);
    for (size_t k = 0; k < nq && !tok->match; k++) {
        td__scan_t *sc = &s->qscan[k];
        if (hit[k])
            continue;
        int32_t self = -1;
        if (ve[k]) {
            self = memcmp(tok->arena + ve[k]->off, vm[k], vn[k]) == 0
                       ? ve[k]->id
                       : td__strmap_get(tok, &tok->vocab, vm[k], vn[k]);
            if (self >= 0 && !(tok->bpe_self[self / 64] >> (self % 64) & 1))
                self = -1;
        }
        if (self >= 0) { /* a token BPE gives whole: found without merging */
            sc->id[0] = self;
            sc->n = 1;
            continue;
        }
        scan_fill(tok, sc, base + s->qoff[k], s->qlen[k]);
        which[nw++] = k;
    }
    bpe_merge_batch(tok, s->qscan, which, nw);
    for (size_t k = 0; k < nq; k++) {
        const td__scan_t *sc = &s->qscan[k];
        memcpy(out->ids + out->len, sc->id, sc->n * sizeof(int32_t));
        out->len += sc->n;
        if (!hit[k] && h[k] && (sc->n > 1 || !tok->match || s->cache_single))
            cache_add(s, base + s->qoff[k], s->qlen[k], h[k], sc->id, sc->n);
    }
    td_buf_reset(&s->qtext);
    return 0;
}

/* Queue a word of at most TD__SCAN_MAX bytes (h: its hash when it is short enough to be cached,
 * else 0) for the next batch; a full batch is looked up in the word cache and the rest merged. */
static int bpe_queue(const td_tokenizer_t *tok, struct td_scratch *s, const char *w, size_t n,
                     uint64_t h, td_tokens_t *out)
{
    size_t off = s->qtext.len;
    int rc = td_buf_append(&s->qtext, w, n);
    if (rc)
        return rc;
    s->qoff[s->nq] = (uint32_t)off;
    s->qlen[s->nq] = (uint32_t)n;
    s->qhash[s->nq] = h;
    if (++s->nq == TD__BPE_BATCH)
        return td__bpe_flush(tok, s, out);
    return 0;
}

/* BPE one word (raw bytes) and append its ids, or queue it (td__bpe_flush appends them). */
int td__bpe_word(const td_tokenizer_t *tok, struct td_scratch *s, const char *w, size_t n,
                 td_tokens_t *out)
{
    if (!n)
        return 0;
    int rc;
    uint64_t h = 0;
    if (n <= TD__SCAN_MAX && !tok->ignore_merges) {
        /* queued, the word cache's slot prefetched: the batch's lookups overlap their misses */
        if (n <= CACHE_MAX_WORD) {
            h = td__hash(w, n);
            __builtin_prefetch(&s->cache[h & (TD__CACHE_SLOTS - 1)]);
        }
        return bpe_queue(tok, s, w, n, h, out);
    }
    if (n <= CACHE_MAX_WORD) { /* a hit goes out at once, after what is queued */
        h = td__hash(w, n);
        const td__cache_ent_t *e = cache_find(s, w, n, h);
        if (e) {
            if ((rc = td__bpe_flush(tok, s, out)) || (rc = td__tokens_reserve(out, e->nids)))
                return rc;
            e = cache_find(s, w, n, h); /* the flush may have emptied the cache */
            if (e) {
                memcpy(out->ids + out->len, s->cache_ids + e->ioff, e->nids * sizeof(int32_t));
                out->len += e->nids;
                return 0;
            }
        }
    }
    if ((rc = td__bpe_flush(tok, s, out)) || (rc = td__tokens_reserve(out, n)))
        return rc;
    if (n > TD__SCAN_MAX) /* longer than any cached word */
        return bpe_long(tok, s, w, n, out);
    /* ignore_merges: a word that is a token is that token */
    td_buf_reset(&s->map);
    if ((rc = td_buf_reserve(&s->map, 2 * n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        memcpy(s->map.data + s->map.len, tok->byte_char[b], tok->byte_char_len[b]);
        s->map.len += tok->byte_char_len[b];
    }
    int32_t whole = td__strmap_get(tok, &tok->vocab, s->map.data, s->map.len);
    if (whole < 0) {
        if ((rc = bpe_queue(tok, s, w, n, h, out)))
            return rc;
        return td__bpe_flush(tok, s, out);
    }
    out->ids[out->len++] = whole;
    if (n <= CACHE_MAX_WORD)
        cache_add(s, w, n, h, &whole, 1);
    return 0;
}

/* tokenizer_bpe_match.c: byte-level BPE of a word by longest match, checked against the merge
 * order (what fast BPE encoders do: GitHub's `bpe` crate). Exact, not a heuristic:
 *
 * Split the word into tokens t1..tn, each a token whose own bytes BPE to it. If BPE of every
 * neighbouring pair ti ti+1 alone gives ti ti+1 back, BPE of the whole word gives t1..tn: as
 * long as no merge crosses a boundary, the merges inside ti are the ones BPE of ti alone does,
 * so the state around a boundary is one BPE of that pair alone passes through, and a merge
 * across it there would have been taken there too. Conversely BPE's own split has that property
 * (no merge crossed its boundaries). So the split is BPE's exactly when all pairs pass.
 *
 * The pair check: merge ranks only grow along BPE of a token (checked at load: every merge has a
 * higher rank than the merges that built its two parts), so BPE of a pair alone is the two
 * tokens' own merges taken in rank order. Across the boundary sit the right edge x of t1 (t1,
 * R(t1), R(R(t1)), ... back in time) and the left edge y of t2; each pair of edges (x, y) that
 * were neighbours at some time is visited, latest first, and the pair fails when (x, y) is a merge
 * whose rank comes before the merges that consumed x inside t1 (strictly: t1's own merge is to the
 * left and wins a tie) and y inside t2 (the boundary wins a tie there). That is the
 * depth of the two edges in lookups, each independent of the others.
 *
 * The split proposed is the longest proposable token at each position; a word where a pair then
 * fails (a tenth of unusual words) is merged by tokenizer_bpe.c instead, so nothing here decides
 * the output alone. Only vocabularies whose merged ids are rank + a fixed offset, one merge per
 * token (DeepSeek, Qwen), get this encoder; the rank of a merged token is then its id. Llama 3's
 * has several merges per token and keeps merging. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

enum {
    FIELD_MASK = (1u << TD__MTOK_FIELD) - 1,
    CHECKS = 512, /* pair checks collected before their lookups are finished */
};

/* The rank + 1 of the merge that made id (0 for a byte); ranks of merged ids are id - offset. */
static inline uint32_t crank(const td__bpematch_t *M, uint32_t id)
{
    uint32_t r = id - (uint32_t)M->id_offset;
    return r < M->n_ranks ? r + 1 : 0;
}

/* Element i (0-based) of a packed chain word, as an id; -1 past the end. */
static inline int32_t field(uint64_t w, unsigned i)
{
    return (int32_t)((w >> (i * TD__MTOK_FIELD)) & FIELD_MASK) - 1;
}

static inline uint64_t pack3(const int32_t *e, size_t n)
{
    uint64_t w = 0;
    for (size_t i = 0; i < 3 && i < n; i++)
        w |= (uint64_t)(uint32_t)(e[i] + 1) << (i * TD__MTOK_FIELD);
    return w;
}

/* Token t's right (right = true) or left chain into e[0..cap): its length. */
static size_t chain(const td__bpematch_t *M, int32_t t, bool right, int32_t *e, size_t cap)
{
    size_t n = 0;
    for (;;) {
        const td__mtok_t *k = &M->tk[t];
        size_t here = right ? 3 : 6;
        for (size_t i = 0; i < here && n < cap; i++) {
            int32_t v = i < 3 ? field(right ? k->rch : k->lch, (unsigned)i)
                              : field(k->lch2, (unsigned)(i - 3));
            if (v < 0)
                return n;
            e[n++] = v;
        }
        if (!(k->deep & (right ? TD__MTOK_RDEEP : TD__MTOK_LDEEP)) || n >= cap)
            return n;
        t = e[n - 1]; /* the chain goes on in its last element's own record */
    }
}

/* ---------------------------------------------------------------- load */

static void bpe_match_free(td__bpematch_t *M)
{
    if (!M)
        return;
    td_huge_free(M->pre, (M->pre_mask + 1) * sizeof(uint64_t));
    free(M->bloom);
    td_huge_free(M->tk, M->ntk * sizeof(td__mtok_t));
    free(M);
}

void td__bpe_match_free(td_tokenizer_t *tok)
{
    bpe_match_free(tok->match);
    tok->match = NULL;
}

static inline bool is_self(const td_tokenizer_t *tok, uint32_t id)
{
    return id < tok->nids && (tok->bpe_self[id / 64] >> (id % 64) & 1);
}

/* The records of the bytes and of the merged tokens whose parts all qualify, in rank order. */
static bool fill_records(const td_tokenizer_t *tok, td__bpematch_t *M, const uint64_t *pairs)
{
    for (int b = 0; b < 256; b++) {
        int32_t t = tok->byte_id[b];
        if (t < 0 || !is_self(tok, (uint32_t)t) || tok->ids[t].dec_len != 1)
            continue;
        M->tk[t] = (td__mtok_t){.off = tok->ids[t].dec_off, .len = 1};
    }
    for (uint32_t r = 0; r < M->n_ranks; r++) {
        uint32_t t = r + (uint32_t)M->id_offset;
        if (pairs[r] == UINT64_MAX || t >= M->ntk || !is_self(tok, t))
            continue;
        uint32_t L = (uint32_t)(pairs[r] >> 32), R = (uint32_t)pairs[r];
        const td__mtok_t *l = &M->tk[L], *rr = &M->tk[R];
        const td__idinfo_t *ii = &tok->ids[t];
        /* both parts checked already, made earlier (ranks grow toward the root), bytes adding up */
        if (!l->len || !rr->len || crank(M, L) > r || crank(M, R) > r ||
            ii->dec_len != (uint32_t)l->len + rr->len || ii->dec_len > TD__SCAN_MAX)
            continue;
        int32_t e[8];
        td__mtok_t k = {.off = ii->dec_off, .len = (uint8_t)ii->dec_len};
        e[0] = (int32_t)R; /* R, then R's own right chain */
        size_t n = 1 + chain(M, (int32_t)R, true, e + 1, 3);
        k.rch = pack3(e, n);
        if (n > 3)
            k.deep |= TD__MTOK_RDEEP;
        e[0] = (int32_t)L;
        n = 1 + chain(M, (int32_t)L, false, e + 1, 6);
        k.lch = pack3(e, n);
        if (n > 3)
            k.lch2 = pack3(e + 3, n - 3);
        if (n > 6)
            k.deep |= TD__MTOK_LDEEP;
        M->tk[t] = k;
    }
    return true;
}

/* Put every record's bytes into the prefix table; a token whose hash tag and length another
 * token of its probe run already has is left out (never proposed: words that need it are
 * merged). */
static bool fill_prefix(const td_tokenizer_t *tok, td__bpematch_t *M)
{
    size_t n = 0;
    for (size_t t = 0; t < M->ntk; t++)
        n += M->tk[t].len != 0;
    size_t cap = 1024;
    unsigned bits = 10;
    while (cap < 2 * n) {
        cap *= 2;
        bits++;
    }
    size_t words = 64;
    while (words * 64 < 8 * n)
        words *= 2;
    M->pre = td_huge_calloc(cap, sizeof(uint64_t));
    M->bloom = td_calloc(words, sizeof(uint64_t));
    if (!M->pre || !M->bloom)
        return false;
    M->pre_mask = cap - 1;
    M->pre_shift = 64 - bits;
    M->bloom_mask = words - 1;
    for (size_t t = 0; t < M->ntk; t++) {
        const td__mtok_t *k = &M->tk[t];
        if (!k->len)
            continue;
        const uint8_t *p = (const uint8_t *)tok->arena + k->off;
        uint64_t h = 0;
        for (size_t i = 0; i < k->len; i++)
            h = td__match_step(h, p[i]);
        h = td__match_fin(h);
        if (k->off >> TD__MATCH_OFF_BITS)
            continue;
        size_t i = (size_t)(h >> M->pre_shift);
        for (; M->pre[i]; i = (i + 1) & M->pre_mask)
            if (td__match_tag_is(M->pre[i], h) && td__match_len(M->pre[i]) == k->len)
                break;
        if (M->pre[i])
            continue;
        M->pre[i] = td__match_entry(h, k->off, k->len, (int32_t)t);
        M->bloom[td__match_bword(M, h)] |= td__match_bbits(h);
        if (k->len > M->maxlen)
            M->maxlen = k->len;
    }
    return true;
}

void td__bpe_match_init(td_tokenizer_t *tok)
{
    const td__mergemap_t *m = &tok->merges;
    tok->match = NULL;
    if (!tok->bpe_self || !m->by_offset || !m->n_ranks || m->id_offset < 0 ||
        tok->nids > FIELD_MASK - 1 || m->n_ranks > TD__MERGE_RANKS)
        return;
    td__bpematch_t *M = td_calloc(1, sizeof(*M));
    uint64_t *pairs = td_calloc(m->n_ranks, sizeof(uint64_t));
    if (!M || !pairs)
        goto fail;
    M->ntk = tok->nids;
    M->id_offset = m->id_offset;
    M->n_ranks = (uint32_t)m->n_ranks;
    M->tk = td_huge_calloc(M->ntk, sizeof(td__mtok_t));
    if (!M->tk)
        goto fail;
    /* the parts of each rank's merge (a rank a later duplicate pair took over has none) */
    memset(pairs, 0xff, m->n_ranks * sizeof(uint64_t));
    for (size_t i = 0; i <= m->mask; i++) {
        uint64_t e = m->ents[i];
        if (e == UINT64_MAX)
            continue;
        uint32_t l, r;
        td__merge_ids(e, &l, &r);
        pairs[e & (TD__MERGE_RANKS - 1)] = (uint64_t)l << 32 | r;
    }
    if (!fill_records(tok, M, pairs) || !fill_prefix(tok, M))
        goto fail;
    free(pairs);
    tok->match = M;
    return;
fail:
    free(pairs);
    bpe_match_free(M);
}

/* ---------------------------------------------------------------- encode */

/* One pair of edges to look up: fails its word when the pair merges with rank + 1 below consx
 * and at most consy. */
typedef struct check {
    uint64_t pair;
    uint32_t slot; /* in the hot table when SLOT_HOT is set */
    uint32_t consx, consy;
    uint32_t word; /* index into the batch */
} check_t;

#define SLOT_HOT 0x80000000u

typedef struct checks {
    check_t c[CHECKS];
    size_t n;
} checks_t;

/* Finish the lookups of the collected checks: a check that fails marks its word bad. */
static void checks_run(const td__mergemap_t *m, checks_t *cs, bool *bad)
{
    for (size_t i = 0; i < cs->n; i++) {
        const check_t *c = &cs->c[i];
        if (bad[c->word])
            continue;
        uint32_t r = c->slot & SLOT_HOT
                         ? td__merge_at(m->hot, m->hot_mask, c->pair, c->slot & ~SLOT_HOT)
                         : td__merge_at(m->ents, m->mask, c->pair, c->slot);
        if (r != UINT32_MAX && r + 1 < c->consx && r + 1 <= c->consy)
            bad[c->word] = true;
    }
    cs->n = 0;
}

static void check_add(const td__mergemap_t *m, checks_t *cs, bool *bad, uint32_t word,
                      int32_t x, int32_t y, uint32_t consx, uint32_t consy)
{
    if (cs->n == CHECKS)
        checks_run(m, cs, bad);
    size_t mask;
    const uint64_t *t = td__merge_table(m, x, y, &mask);
    uint64_t pair = td__merge_pair(x, y);
    uint32_t slot = (uint32_t)td__merge_slot(pair, mask);
    __builtin_prefetch(&t[slot]);
    cs->c[cs->n++] = (check_t){.pair = pair,
                               .slot = slot | (t == m->hot ? SLOT_HOT : 0),
                               .consx = consx,
                               .consy = consy,
                               .word = word};
}

/* Collect the checks of the pair (t1, t2): the edges that were neighbours, latest first. */
static void pair_checks(const td__bpematch_t *M, const td__mergemap_t *m, checks_t *cs, bool *bad,
                        uint32_t word, int32_t t1, int32_t t2)
{
    int32_t xs[TD__SCAN_MAX], ys[TD__SCAN_MAX];
    size_t nx = chain(M, t1, true, xs, TD__SCAN_MAX), ny = chain(M, t2, false, ys, TD__SCAN_MAX);
    int32_t x = t1, y = t2;
    uint32_t consx = UINT32_MAX, consy = UINT32_MAX, cx = crank(M, (uint32_t)x),
             cy = crank(M, (uint32_t)y);
    size_t ix = 0, iy = 0;
    for (;;) {
        check_add(m, cs, bad, word, x, y, consx, consy);
        if (cx > cy) { /* x was made after y: before it, its right part was the edge */
            if (ix == nx)
                break; /* cannot happen: a merged token's chain ends at a byte */
            consx = cx;
            x = xs[ix++];
            cx = crank(M, (uint32_t)x);
        } else if (cy) {
            if (iy == ny)
                break;
            consy = cy;
            y = ys[iy++];
            cy = crank(M, (uint32_t)y);
        } else {
            break; /* two bytes */
        }
    }
}

/* The entry of the token of len bytes whose hash is h (finished), 0 none. (A tag is a few bits:
 * another token's entry can have it, and the bytes are compared at the end.) */
static inline uint64_t probe(const td__bpematch_t *M, uint64_t h, size_t len)
{
    for (size_t i = (size_t)(h >> M->pre_shift);; i = (i + 1) & M->pre_mask) {
        uint64_t e = M->pre[i];
        if (!e || (td__match_tag_is(e, h) && td__match_len(e) == len))
            return e;
    }
}

static inline uint64_t hash_of(const uint8_t *w, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = td__match_step(h, w[i]);
    return td__match_fin(h);
}

/* The lengths of w[0..n)'s prefixes the Bloom filter lets through, the longest CANDS of them
 * with their hashes (the slots of the longest two prefetched). */
enum { CANDS = 8 };
typedef struct cands {
    uint64_t h[CANDS];
    uint8_t len[CANDS];
    size_t n; /* passed in all; the last min(n, CANDS) are kept, in ring order */
} cands_t;

static void cands_find(const td__bpematch_t *M, const uint8_t *w, size_t n, cands_t *c)
{
    uint64_t h = 0;
    c->n = 0;
    for (size_t i = 0; i < n; i++) {
        h = td__match_step(h, w[i]);
        uint64_t f = td__match_fin(h);
        if (td__match_maybe(M, f)) {
            c->h[c->n % CANDS] = f;
            c->len[c->n % CANDS] = (uint8_t)(i + 1);
            c->n++;
        }
    }
    for (size_t k = 0; k < 2 && k < c->n; k++)
        __builtin_prefetch(&M->pre[c->h[(c->n - 1 - k) % CANDS] >> M->pre_shift]);
}

static void bloom_prefetch(const td__bpematch_t *M, const uint8_t *w, size_t n)
{
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = td__match_step(h, w[i]);
        __builtin_prefetch(&M->bloom[td__match_bword(M, td__match_fin(h))]);
    }
}

/* The entry of the longest token among cands_find's prefixes c of w, 0 none. */
static uint64_t cands_pick(const td__bpematch_t *M, const cands_t *c, const uint8_t *w)
{
    size_t kept = TD_MIN(c->n, (size_t)CANDS);
    for (size_t k = 0; k < kept; k++) {
        size_t q = (c->n - 1 - k) % CANDS;
        uint64_t e = probe(M, c->h[q], c->len[q]);
        if (e)
            return e;
    }
    if (c->n <= CANDS)
        return 0;
    /* more passed the filter than were kept, and the kept ones were false positives */
    for (size_t l = c->len[(c->n - CANDS) % CANDS] - 1; l > 0; l--) {
        uint64_t h = hash_of(w, l);
        uint64_t e = td__match_maybe(M, h) ? probe(M, h, l) : 0;
        if (e)
            return e;
    }
    return 0;
}

/* The words of a batch: their tokens so far go in qscan[k].id, each one's start in .rank and
 * its bytes' place in tok->arena in .slot (the merging's arrays, unused here). */
enum { WHOLE, PREFIX }; /* a word's next round: is the rest a token; else its longest prefix */

size_t td__bpe_match(const td_tokenizer_t *tok, struct td_scratch *s, const size_t *which,
                     size_t nw, size_t *left)
{
    const td__bpematch_t *M = tok->match;
    const td__mergemap_t *m = &tok->merges;
    const char *base = s->qtext.data;
    uint32_t pos[TD__BPE_BATCH];
    uint8_t phase[TD__BPE_BATCH];
    uint64_t hw[TD__BPE_BATCH]; /* WHOLE: the rest's hash */
    cands_t cd[TD__BPE_BATCH];  /* PREFIX */
    bool bad[TD__BPE_BATCH];
    size_t act[TD__BPE_BATCH], na = 0;
    for (size_t i = 0; i < nw; i++) {
        pos[i] = 0;
        phase[i] = WHOLE;
        bad[i] = false;
        s->qscan[which[i]].n = 0;
        act[na++] = i;
    }
    /* rounds: each unfinished word asks whether the rest of it is a token, and when it is not,
     * takes its longest prefix that is; every word's probes are started before any is read */
    while (na) {
        /* the Bloom filter's words too: outside a benchmark loop it is not in the cache either */
        for (size_t a = 0; a < na; a++) {
            size_t i = act[a], k = which[i];
            const uint8_t *w = (const uint8_t *)base + s->qoff[k] + pos[i];
            size_t rest = s->qlen[k] - pos[i];
            if (phase[i] == WHOLE) {
                hw[i] = rest <= M->maxlen ? hash_of(w, rest) : 0;
                __builtin_prefetch(&M->pre[hw[i] >> M->pre_shift]);
            } else {
                bloom_prefetch(M, w, TD_MIN(rest - 1, M->maxlen));
            }
        }
        for (size_t a = 0; a < na; a++) {
            size_t i = act[a], k = which[i];
            size_t rest = s->qlen[k] - pos[i];
            if (phase[i] == PREFIX)
                cands_find(M, (const uint8_t *)base + s->qoff[k] + pos[i],
                           TD_MIN(rest - 1, M->maxlen), &cd[i]);
        }
        size_t j = 0;
        for (size_t a = 0; a < na; a++) {
            size_t i = act[a], k = which[i];
            td__scan_t *sc = &s->qscan[k];
            const uint8_t *w = (const uint8_t *)base + s->qoff[k] + pos[i];
            size_t rest = s->qlen[k] - pos[i];
            uint64_t e;
            if (phase[i] == WHOLE) {
                e = rest <= M->maxlen ? probe(M, hw[i], rest) : 0;
                if (!e) {
                    phase[i] = PREFIX;
                    act[j++] = i;
                    continue;
                }
            } else if (!(e = cands_pick(M, &cd[i], w))) {
                bad[i] = true; /* a byte with no token of its own: merged */
                continue;
            }
            int32_t t = td__match_id(e);
            uint32_t len = td__match_len(e);
            __builtin_prefetch(tok->arena + td__match_off(e));
            if (sc->n || len != rest)
                __builtin_prefetch(&M->tk[t]); /* for the pair checks */
            sc->rank[sc->n] = pos[i];
            sc->slot[sc->n] = td__match_off(e);
            sc->id[sc->n++] = t;
            pos[i] += len;
            phase[i] = WHOLE;
            if (pos[i] < s->qlen[k])
                act[j++] = i;
        }
        na = j;
    }
    /* the checks: each token's bytes (the table holds hashes), each pair's edges */
    checks_t cs;
    cs.n = 0;
    for (size_t i = 0; i < nw; i++) {
        const td__scan_t *sc = &s->qscan[which[i]];
        for (uint32_t q = 0; !bad[i] && q + 1 < sc->n; q++)
            pair_checks(M, m, &cs, bad, (uint32_t)i, sc->id[q], sc->id[q + 1]);
    }
    checks_run(m, &cs, bad);
    size_t nl = 0;
    for (size_t i = 0; i < nw; i++) {
        size_t k = which[i];
        const td__scan_t *sc = &s->qscan[k];
        const char *w = base + s->qoff[k];
        for (uint32_t q = 0; !bad[i] && q < sc->n; q++) {
            uint32_t end = q + 1 < sc->n ? sc->rank[q + 1] : s->qlen[k];
            if (memcmp(tok->arena + sc->slot[q], w + sc->rank[q], end - sc->rank[q]))
                bad[i] = true;
        }
        if (bad[i])
            left[nl++] = k;
    }
    return nl;
}

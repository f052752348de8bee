/* jsonmask.c: the token mask of a JSON automaton over a vocabulary: a byte trie of the tokens,
 * walked depth first from the automaton's state (a branch is cut at the first byte the automaton
 * rejects), with the masks of recent states cached (td_jsonfsm.h). */
#include "td_error.h"
#include "td_jsonfsm.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct tnode {
    int32_t child;   /* first child, -1: none */
    int32_t sibling; /* next sibling, -1: none */
    int32_t token;   /* first token whose bytes end here, -1: none (more in tok_next) */
    uint8_t byte;
} tnode_t;

struct td_vocab_trie {
    tnode_t *n;
    int n_nodes, cap;
    int vocab, max_len;
    int32_t *tok_next; /* [vocab] the next token with the same bytes, -1: none */
    uint8_t **bytes;   /* [vocab] own copies */
    uint32_t *lens;
    uint64_t *plain;   /* [ceil(vocab / 64)] tokens of plain string characters */
    struct td_vocab_trie *rest; /* the other tokens (NULL in that trie itself) */
};

/* Whole UTF-8 characters, none of them a quote, backslash or control byte. */
static bool plain_chars(const uint8_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n;) {
        uint8_t c = b[i];
        int more = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
                 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (more < 0 || c < 0x20 || c == '"' || c == '\\' || c == 0x7F)
            return false;
        for (int k = 1; k <= more; k++)
            if (i + (uint32_t)k >= n || b[i + k] < 0x80 || b[i + k] > 0xBF)
                return false;
        i += (uint32_t)more + 1;
    }
    return n > 0;
}

static int add_node(td_vocab_trie_t *t, uint8_t b)
{
    if (t->n_nodes == t->cap) {
        int cap = t->cap ? t->cap * 2 : 1024;
        tnode_t *p = td_reallocarray(t->n, (size_t)cap, sizeof(tnode_t));
        if (!p)
            return -1;
        t->n = p;
        t->cap = cap;
    }
    t->n[t->n_nodes] = (tnode_t){-1, -1, -1, b};
    return t->n_nodes++;
}

void td_vocab_trie_free(td_vocab_trie_t *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->vocab; i++)
        free(t->bytes[i]);
    free(t->bytes);
    free(t->lens);
    free(t->n);
    free(t->tok_next);
    free(t->plain);
    td_vocab_trie_free(t->rest);
    free(t);
}

int td_vocab_trie_size(const td_vocab_trie_t *t)
{
    return t->n_nodes;
}

static int build(const uint8_t *const *bytes, const uint32_t *lens, int vocab, bool split,
                 td_vocab_trie_t **out);

int td_vocab_trie_build(const uint8_t *const *bytes, const uint32_t *lens, int vocab,
                        td_vocab_trie_t **out)
{
    return build(bytes, lens, vocab, true, out);
}

static int build(const uint8_t *const *bytes, const uint32_t *lens, int vocab, bool split,
                 td_vocab_trie_t **out)
{
    td_vocab_trie_t *t = td_calloc(1, sizeof(*t));
    *out = NULL;
    if (!t)
        return td_err_set(TD_ENOMEM, "out of memory");
    t->vocab = vocab;
    t->tok_next = td_calloc((size_t)vocab + 1, sizeof(int32_t));
    t->bytes = td_calloc((size_t)vocab + 1, sizeof(uint8_t *));
    t->lens = td_calloc((size_t)vocab + 1, sizeof(uint32_t));
    if (!t->tok_next || !t->bytes || !t->lens || add_node(t, 0) < 0)
        goto oom;
    for (int id = 0; id < vocab; id++) {
        t->tok_next[id] = -1;
        if (!lens[id])
            continue;
        if (!(t->bytes[id] = td_calloc(lens[id], 1)))
            goto oom;
        memcpy(t->bytes[id], bytes[id], lens[id]);
        t->lens[id] = lens[id];
        t->max_len = TD_MAX(t->max_len, (int)lens[id]);
        int cur = 0;
        for (uint32_t k = 0; k < lens[id]; k++) {
            int c = t->n[cur].child, prev = -1;
            while (c >= 0 && t->n[c].byte < bytes[id][k]) {
                prev = c;
                c = t->n[c].sibling;
            }
            if (c < 0 || t->n[c].byte != bytes[id][k]) {
                int nn = add_node(t, bytes[id][k]);
                if (nn < 0)
                    goto oom;
                t->n[nn].sibling = c;
                if (prev < 0)
                    t->n[cur].child = nn;
                else
                    t->n[prev].sibling = nn;
                c = nn;
            }
            cur = c;
        }
        t->tok_next[id] = t->n[cur].token;
        t->n[cur].token = id;
    }
    if (split) {
        /* the plain-character tokens as a bitmap, the others in a trie of their own */
        uint32_t *rl = td_calloc((size_t)vocab + 1, sizeof(uint32_t));
        t->plain = td_calloc(((size_t)vocab + 63) / 64 + 1, sizeof(uint64_t));
        if (!rl || !t->plain) {
            free(rl);
            goto oom;
        }
        for (int id = 0; id < vocab; id++) {
            if (plain_chars(bytes[id], lens[id]))
                t->plain[id >> 6] |= 1ull << (id & 63);
            else
                rl[id] = lens[id];
        }
        int rc = build(bytes, rl, vocab, false, &t->rest);
        free(rl);
        if (rc)
            goto oom;
    }
    *out = t;
    return 0;
oom:
    td_vocab_trie_free(t);
    return td_err_set(TD_ENOMEM, "out of memory");
}

#define CACHE 32

typedef struct centry {
    bool used;
    size_t size;
    td_jsonfsm_state_t st;
    uint64_t *bits;
} centry_t;

struct td_jsonmask {
    td_jsonfsm_t *f;
    bool own_f;
    const td_vocab_trie_t *t;
    int32_t eos;
    int words;
    td_jsonfsm_state_t st;
    td_jsonfsm_state_t *walk; /* [max_len + 1] states along the trie path */
    centry_t cache[CACHE];
    int next_slot;
};

int td_jsonmask_new(td_jsonfsm_t *f, const td_vocab_trie_t *t, int32_t eos_id, bool own_f,
                    td_jsonmask_t **out)
{
    td_jsonmask_t *m = td_calloc(1, sizeof(*m));
    *out = NULL;
    if (!m)
        return td_err_set(TD_ENOMEM, "out of memory");
    m->f = f;
    m->own_f = own_f;
    m->t = t;
    m->eos = eos_id;
    m->words = (t->vocab + 63) / 64;
    m->walk = td_calloc((size_t)t->max_len + 2, sizeof(td_jsonfsm_state_t));
    if (!m->walk) {
        free(m);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    td_jsonfsm_start(f, &m->st);
    *out = m;
    return 0;
}

void td_jsonmask_free(td_jsonmask_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < CACHE; i++)
        free(m->cache[i].bits);
    free(m->walk);
    if (m->own_f)
        td_jsonfsm_free(m->f);
    free(m);
}

void td_jsonmask_reset(td_jsonmask_t *m)
{
    td_jsonfsm_start(m->f, &m->st);
}

static void mark(const td_vocab_trie_t *t, int32_t tok, uint64_t *bits)
{
    for (; tok >= 0; tok = t->tok_next[tok])
        bits[tok >> 6] |= 1ull << (tok & 63);
}

/* Every token below node `node` of trie t, whose path bytes led the automaton to walk[d]. */
static void dfs(td_jsonmask_t *m, const td_vocab_trie_t *t, int node, int d, uint64_t *bits)
{
    for (int c = t->n[node].child; c >= 0; c = t->n[c].sibling) {
        td_jsonfsm_state_t *s = &m->walk[d + 1];
        memcpy(s, &m->walk[d], td_jsonfsm_state_size(&m->walk[d]));
        if (!td_jsonfsm_byte(m->f, s, t->n[c].byte))
            continue;
        mark(t, t->n[c].token, bits);
        if (t->n[c].child >= 0)
            dfs(m, t, c, d + 1, bits);
    }
}

const uint64_t *td_jsonmask_allowed(td_jsonmask_t *m)
{
    size_t sz = td_jsonfsm_state_size(&m->st);
    for (int i = 0; i < CACHE; i++)
        if (m->cache[i].used && m->cache[i].size == sz && !memcmp(&m->cache[i].st, &m->st, sz))
            return m->cache[i].bits;
    centry_t *e = &m->cache[m->next_slot];
    m->next_slot = (m->next_slot + 1) % CACHE;
    if (!e->bits && !(e->bits = td_calloc((size_t)m->words, sizeof(uint64_t))))
        return NULL;
    memset(e->bits, 0, (size_t)m->words * sizeof(uint64_t));
    e->used = true;
    e->size = sz;
    memcpy(&e->st, &m->st, sz);
    memcpy(&m->walk[0], &m->st, sz);
    if (m->t->rest && td_jsonfsm_plain_string(m->f, &m->st)) {
        memcpy(e->bits, m->t->plain, (size_t)m->words * sizeof(uint64_t));
        dfs(m, m->t->rest, 0, 0, e->bits);
    } else {
        dfs(m, m->t, 0, 0, e->bits);
    }
    if (m->eos >= 0 && m->eos < m->t->vocab) {
        if (td_jsonfsm_complete(m->f, &m->st))
            e->bits[m->eos >> 6] |= 1ull << (m->eos & 63);
        else
            e->bits[m->eos >> 6] &= ~(1ull << (m->eos & 63));
    }
    return e->bits;
}

bool td_jsonmask_advance(td_jsonmask_t *m, int32_t id)
{
    if (id < 0 || id >= m->t->vocab)
        return false;
    if (id == m->eos)
        return td_jsonfsm_complete(m->f, &m->st);
    if (!m->t->lens[id])
        return false;
    return td_jsonfsm_feed(m->f, &m->st, m->t->bytes[id], m->t->lens[id]);
}

bool td_jsonmask_complete(const td_jsonmask_t *m)
{
    return td_jsonfsm_complete(m->f, &m->st);
}

/* tokenizer_impl.h: what the tokenizer's files share: the loaded tokenizer as data, the
 * pre-tokenizer program, the hash tables, and the per-call scratch. */
#ifndef TD_TOKENIZER_IMPL_H
#define TD_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "td_tokenizer.h"

#include <pcre2.h>
#include <pthread.h>

/* Split behaviors of the Split pre-tokenizer (HF SplitDelimiterBehavior). */
typedef enum td__split_behavior {
    TD__SPLIT_REMOVED,
    TD__SPLIT_ISOLATED,
    TD__SPLIT_MERGED_PREV,
    TD__SPLIT_MERGED_NEXT,
    TD__SPLIT_CONTIGUOUS,
} td__split_behavior_t;

typedef enum td__pretok_kind {
    TD__PRETOK_SPLIT,  /* regex (or escaped string) split */
    TD__PRETOK_DIGITS, /* char::is_numeric split */
} td__pretok_kind_t;

/* A Split pattern tokenizer_pretok_fast.c matches by hand (recognised by its exact text). */
typedef enum td__fast {
    TD__FAST_NONE,      /* PCRE2 alone */
    TD__FAST_DS_DIGITS, /* DeepSeek-V3's \p{N}{1,3} */
    TD__FAST_DS_CJK,    /* DeepSeek-V3's CJK run */
    TD__FAST_DS_WORDS,  /* DeepSeek-V3's words, punctuation and white space */
    TD__FAST_CL100K,    /* Llama 3's (OpenAI's cl100k) */
    TD__FAST_QWEN,      /* Qwen3's: cl100k's with digits one by one */
    TD__FAST_GPT2,      /* GPT-2's (ByteLevel use_regex) */
} td__fast_t;

/* The classes (bit k: td__fast_class_pat[k]) of each code point of the BMP, in blocks of 64 code
 * points with equal blocks stored once (the CJK ideographs share one): code point c
 * has blk[idx[c >> 6] * 64 + (c & 63)]. */
typedef struct td__fast_cls {
    uint8_t ascii[128]; /* the first two blocks, for one load */
    uint64_t has_n[16]; /* bit b: block b holds a \p{N} code point */
    uint16_t idx[1024]; /* block of each 64 code points */
    uint8_t blk[];      /* [64 * distinct blocks] */
} td__fast_cls_t;

/* Most pre-tokenizer steps before ByteLevel (encode keeps per-step scratch). */
#define TD__MAX_PRETOK 15

/* One pre-tokenizer step before the final ByteLevel step. */
typedef struct td__pretok {
    td__pretok_kind_t kind;
    td__split_behavior_t behavior;
    bool invert;            /* Split: the pattern marks what is kept, not the delimiters */
    bool individual_digits; /* Digits */
    pcre2_code *re;         /* Split: compiled pattern (JIT) */
    td__fast_t fast;        /* Split: the hand matcher of this pattern, or TD__FAST_NONE */
} td__pretok_t;

/* One added token (tokenizer.json "added_tokens"). */
typedef struct td__added {
    int32_t id;
    uint32_t off, len;   /* content bytes in tok->arena */
    uint32_t noff, nlen; /* normalized content (for normalized tokens) in tok->arena */
    bool special, lstrip, rstrip, single_word, normalized;
} td__added_t;

/* A byte trie over added-token contents for leftmost-longest matching. Node 0 is the root. */
typedef struct td__trie {
    struct td__trie_node {
        int32_t first_child;  /* index of first child, -1 none */
        int32_t next_sibling; /* index of next sibling, -1 none */
        int32_t added;        /* index into tok->added of the token ending here, -1 none */
        uint8_t byte;
    } * nodes; /* [nnodes] */
    size_t nnodes, cap;
    uint8_t first[32]; /* bitset of bytes that start some token */
    uint16_t nfirst;   /* bytes in it */
    uint8_t first_byte; /* the one when nfirst is 1 (found by memchr) */
} td__trie_t;

/* Vocabulary string -> id table (open addressing). */
typedef struct td__strmap {
    struct td__strmap_ent {
        uint64_t hash;     /* 0 = empty */
        uint32_t off, len; /* key bytes in tok->arena */
        int32_t id;
    } * ents;    /* [mask+1] */
    size_t mask; /* capacity - 1, capacity a power of two */
    size_t n;    /* entries in use */
} td__strmap_t;

/* Merge table: (left id, right id) -> rank, one 64-bit word per slot (left << 43 | right << 22 |
 * rank; UINT64_MAX = empty), so a probe touches 8 bytes and a cache line holds 8 slots; the id a
 * merge produces is looked up by rank in `ids` only when the merge is done. The loader refuses
 * ids above TD__MERGE_ID_MAX and more than TD__MERGE_RANKS merges (real vocabularies are far
 * below: 262,144 ids is 18 bits). */
typedef struct td__mergemap {
    uint64_t *ents; /* [mask+1] */
    int32_t *ids;   /* [n_ranks]: the id of merge rank r (tokenizer.json "merges"[r]) */
    size_t mask;    /* capacity - 1 */
    size_t n;
    size_t n_ranks; /* merges in tokenizer.json (a later duplicate pair leaves its rank unused) */
    /* true when ids[r] == r + id_offset for every rank (vocabularies laid out in merge order,
     * as DeepSeek's, Qwen's and OpenAI's are): the id is then computed, not read */
    bool by_offset;
    int32_t id_offset;
    /* A copy of every merge whose two ids are both below hot_lim (a power of two, the largest
     * whose merges fit TD__MERGE_HOT_MAX; 0 = no copy): the pairs of short tokens (bytes, common
     * pieces), most of the probes of any text, are looked up in this small table (256 KiB at
     * most, so it stays in the core's cache) instead of the large one. Exact: a pair below the
     * limit that is not here does not merge. */
    uint64_t *hot; /* [hot_mask + 1] */
    size_t hot_mask;
    uint32_t hot_lim;
} td__mergemap_t;

enum {
    TD__MERGE_RANK_BITS = 22,
    TD__MERGE_ID_BITS = 21,
    TD__MERGE_RANKS = 1 << TD__MERGE_RANK_BITS,
    TD__MERGE_ID_MAX = (1 << TD__MERGE_ID_BITS) - 2, /* all ones is the empty slot's */
    TD__MERGE_HOT_MAX = 1 << 14,                      /* merges in the hot table, at most */
};

/* The pair part of a slot word: left << 43 | right << 22 (ids at most TD__MERGE_ID_MAX). */
static inline uint64_t td__merge_pair(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << (TD__MERGE_ID_BITS + TD__MERGE_RANK_BITS) |
           (uint64_t)(uint32_t)right << TD__MERGE_RANK_BITS;
}

/* The id merge `rank` produces. */
static inline int32_t td__merge_id(const td__mergemap_t *m, uint32_t rank)
{
    return m->by_offset ? (int32_t)rank + m->id_offset : m->ids[rank];
}

/* The first slot to probe for a pair (td__merge_pair). */
static inline size_t td__merge_slot(uint64_t pair, size_t mask)
{
    return (size_t)(((pair >> TD__MERGE_RANK_BITS) * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* The slot array and mask a pair of ids (left, right) is looked up in: the hot table when both
 * are below its limit, else the full one. */
static inline const uint64_t *td__merge_table(const td__mergemap_t *m, int32_t left, int32_t right,
                                              size_t *mask)
{
    if (((uint32_t)left | (uint32_t)right) < m->hot_lim) {
        *mask = m->hot_mask;
        return m->hot;
    }
    *mask = m->mask;
    return m->ents;
}

/* Longest-match encoding (tokenizer_bpe_match.c). A word's BPE is the one split into tokens,
 * each of which BPE gives whole from its own bytes, in which BPE of every two neighbours alone
 * gives those two back (then no merge of the whole word ever crosses a boundary). So a word is
 * split greedily by the longest such token at each position, and each neighbouring pair is
 * checked against the merges that could cross it; a word that fails is merged as before. */

/* Per id, for the check: the token's right and left edges as BPE built it. Its last merge joined
 * L(t) and R(t); the right chain is R(t), R(R(t)), ... down to a byte, the left chain L(t),
 * L(L(t)), ...; ids + 1 in 21-bit fields, the nearest in the low bits, 0 past the end. */
typedef struct td__mtok {
    uint64_t rch;  /* right chain, first 3 */
    uint64_t lch;  /* left chain, first 3 */
    uint64_t lch2; /* left chain, 4th to 6th */
    uint32_t off;  /* the token's raw bytes in tok->arena (its decoded bytes) */
    uint8_t len;   /* their length; 0: not a token the encoder proposes or checks */
    uint8_t deep;  /* TD__MTOK_RDEEP / TD__MTOK_LDEEP: the chain goes on past what is here (it
                      goes on in the record of its last element here) */
    uint16_t pad;
} td__mtok_t;

enum {
    TD__MTOK_FIELD = 21, /* bits per chain element */
    TD__MTOK_RDEEP = 1,
    TD__MTOK_LDEEP = 2,
};

typedef struct td__bpematch {
    /* every proposable token's raw bytes by hash (td__match_step, td__match_fin): slot
     * (hash >> shift), then linear probing; an entry (8 bytes: the table is as small as it can
     * be, it is read at random) holds the hash's low TD__MATCH_TAG_BITS, where the token's raw
     * bytes are in tok->arena, their length - 1 and the id + 1 (td__match_entry); 0 = empty */
    uint64_t *pre;
    size_t pre_mask;
    unsigned pre_shift;
    /* a Bloom filter over the same hashes (two bits in one word: td__match_maybe), about a byte a
     * token, small enough to stay in the core's cache: most prefixes of a word are no token, and
     * are dropped here instead of by a probe of the table, which would miss the cache */
    uint64_t *bloom;
    size_t bloom_mask; /* words - 1 */
    td__mtok_t *tk; /* [ntk] by id */
    size_t ntk;
    uint32_t maxlen;    /* the longest proposable token, bytes */
    int32_t id_offset;  /* merged ids are rank + id_offset (by_offset vocabularies only) */
    uint32_t n_ranks;
} td__bpematch_t;

/* The running hash of a prefix: h = td__match_step(h, byte) from 0, then td__match_fin. */
static inline uint64_t td__match_step(uint64_t h, uint8_t b)
{
    return (h + b + 1) * 0x9E3779B97F4A7C15ull;
}

static inline uint64_t td__match_fin(uint64_t h)
{
    return h ^ (h >> 29);
}

enum {
    TD__MATCH_TAG_BITS = 14,
    TD__MATCH_OFF_BITS = 22, /* arena offsets of proposable tokens: below 4 MiB */
    TD__MATCH_LEN_BITS = 7,  /* lengths 1..128 */
};

static inline uint64_t td__match_entry(uint64_t h, uint32_t off, uint32_t len, int32_t id)
{
    return (h & ((1u << TD__MATCH_TAG_BITS) - 1)) << 50 | (uint64_t)off << 28 |
           (uint64_t)(len - 1) << 21 | (uint64_t)(id + 1);
}

static inline bool td__match_tag_is(uint64_t e, uint64_t h)
{
    return e >> 50 == (h & ((1u << TD__MATCH_TAG_BITS) - 1));
}

static inline int32_t td__match_id(uint64_t e)
{
    return (int32_t)(e & ((1u << 21) - 1)) - 1;
}

static inline uint32_t td__match_len(uint64_t e)
{
    return (uint32_t)(e >> 21 & ((1u << TD__MATCH_LEN_BITS) - 1)) + 1;
}

static inline uint32_t td__match_off(uint64_t e)
{
    return (uint32_t)(e >> 28 & ((1u << TD__MATCH_OFF_BITS) - 1));
}

/* The Bloom filter's word and bits of a finished hash h. */
static inline size_t td__match_bword(const td__bpematch_t *M, uint64_t h)
{
    return (size_t)(h >> 20) & M->bloom_mask;
}

static inline uint64_t td__match_bbits(uint64_t h)
{
    return 1ull << (h & 63) | 1ull << ((h >> 6) & 63);
}

/* Whether a token may have hash h (false: none has). */
static inline bool td__match_maybe(const td__bpematch_t *M, uint64_t h)
{
    uint64_t b = td__match_bbits(h);
    return (M->bloom[td__match_bword(M, h)] & b) == b;
}

/* The left and right ids of a merge table entry (td__merge_pair's layout). */
static inline void td__merge_ids(uint64_t e, uint32_t *l, uint32_t *r)
{
    *l = (uint32_t)(e >> (TD__MERGE_ID_BITS + TD__MERGE_RANK_BITS));
    *r = (uint32_t)(e >> TD__MERGE_RANK_BITS) & ((1u << TD__MERGE_ID_BITS) - 1);
}

/* The rank of `pair` (td__merge_pair) probing table t (td__merge_table) from slot i, UINT32_MAX
 * when it does not merge. */
static inline uint32_t td__merge_at(const uint64_t *t, size_t mask, uint64_t pair, size_t i)
{
    for (;; i = (i + 1) & mask) {
        uint64_t e = t[i];
        if ((e & ~(uint64_t)(TD__MERGE_RANKS - 1)) == pair)
            return (uint32_t)(e & (TD__MERGE_RANKS - 1));
        if (e == UINT64_MAX)
            return UINT32_MAX;
    }
}

/* Per id: what decode writes and where the token text is. */
typedef struct td__idinfo {
    uint32_t tok_off,
        tok_len; /* token text as in tokenizer.json, in arena; tok_len UINT32_MAX = no token */
    uint32_t dec_off, dec_len; /* decoded bytes (byte-level inverse), in arena */
    int32_t added;             /* index into tok->added, -1 for a model-vocab token */
} td__idinfo_t;

struct td_scratch;

struct td_tokenizer {
    char *name;  /* file name used in messages */
    char *arena; /* all strings: tokens, decoded bytes, added contents */
    size_t arena_len, arena_cap;

    td__idinfo_t *ids;    /* [nids] */
    size_t nids;          /* largest id + 1 */
    size_t ids_cap;       /* entries allocated in ids */
    size_t model_vocab_n; /* entries in model.vocab (HF get_vocab_size of the model) */

    td__strmap_t vocab; /* model vocab: token text -> id */
    td__mergemap_t merges;
    uint64_t *bpe_self; /* bitset over ids: BPE of the token's own bytes is that one token, so a
                           word that is such a token needs no merging; NULL with ignore_merges */
    td__bpematch_t *match; /* longest-match encoding; NULL where it does not apply (ids not in
                              merge order, ignore_merges, out of memory) */
    int32_t byte_id[256];   /* model id of the byte-level char of each byte, -1 none */
    char byte_char[256][3]; /* byte-level char of each byte, UTF-8 */
    uint8_t byte_char_len[256];
    int32_t unk_id; /* model.unk_token id, -1 none */
    bool ignore_merges;

    td__added_t *added; /* [nadded] */
    size_t nadded;
    td__strmap_t added_map; /* added token content -> index in added */
    td__trie_t trie_raw;    /* non-normalized added tokens */
    td__trie_t trie_norm;   /* normalized added tokens (normalized content) */
    bool split_special;     /* tokenizer_config split_special_tokens: specials not recognised */

    int norm_utf8proc; /* utf8proc option flags of the normalizer, 0 = none */

    td__pretok_t *pretok; /* [npretok] steps before the final ByteLevel */
    size_t npretok;
    bool bl_prefix_space; /* ByteLevel add_prefix_space */
    pcre2_code *bl_re;    /* ByteLevel use_regex: the GPT-2 pattern, or NULL */
    td__fast_t bl_fast;   /* its hand matcher (TD__FAST_GPT2), or TD__FAST_NONE */
    struct td__fast_cls *fast_cls; /* PCRE2's classes of the BMP for the hand matchers
                                      (tokenizer_pretok_fast.c); NULL when none is used */

    int32_t *prefix; /* [nprefix] ids the post-processor puts before the text */
    size_t nprefix;
    int32_t *suffix; /* [nsuffix] ids after */
    size_t nsuffix;

    int32_t bos_id, eos_id, pad_id, cfg_unk_id; /* tokenizer_config.json, -1 none */

    pthread_mutex_t pool_lock;
    struct td_scratch *pool[8]; /* idle scratch, reused by encode */
    size_t npool;
};

/* Sizes of the per-call scratch. */
enum {
    TD__CACHE_SLOTS = 1 << 14,          /* word cache slots (power of two) */
    TD__CACHE_TEXT = 512 << 10,         /* bytes of cached words */
    TD__CACHE_IDS = 128 << 10,          /* ids of cached words */
    TD__CACHE_WINDOW = 4096,            /* lookups per window of the single-token policy */
    TD__MAX_STEPS = TD__MAX_PRETOK + 1, /* pre-tokenizer steps + the ByteLevel regex */
};

/* One piece of a split: [start, end) in the piece being split; `match` says whether the pattern
 * matched it (for the behavior rules). */
typedef struct span {
    size_t start, end;
    bool match;
} td__span_t;

typedef struct spanvec {
    td__span_t *v; /* [n] */
    size_t n, cap;
} td__spanvec_t;

typedef struct cache_ent {
    uint64_t hash; /* 0 = empty */
    uint32_t toff; /* word bytes in text arena */
    uint32_t ioff; /* ids in ids arena */
    uint16_t tlen, nids;
} td__cache_ent_t;

/* Words up to this many bytes are merged in batches by scanning (tokenizer_bpe.c), longer ones
 * one at a time by heap. */
enum { TD__SCAN_MAX = 128, TD__BPE_BATCH = 32 };

/* One word of a batch being merged: the live symbols packed at the front of `id`, each with the
 * rank of the pair it starts; `slot` holds the probe slots of pairs being looked up. */
typedef struct td__scan {
    int32_t id[TD__SCAN_MAX];
    uint32_t rank[TD__SCAN_MAX]; /* UINT32_MAX: the pair does not merge (or no next symbol) */
    uint32_t slot[TD__SCAN_MAX];
    uint32_t n;      /* live symbols */
    uint32_t lo, hi; /* pairs lo..hi are being looked up; lo > hi: none */
    uint32_t best;   /* rank of the merge chosen this round, UINT32_MAX: the word is done */
    uint32_t at;     /* its position */
} td__scan_t;

/* A symbol of a long word (heap mode). */
typedef struct sym {
    int32_t id;    /* token id of this symbol, -1 once merged into its left neighbour */
    int32_t prev;  /* index of the previous live symbol, -1 none */
    int32_t next;  /* index of the next live symbol, -1 none */
} td__sym_t;

/* Per-call encode state, pooled on the tokenizer (scratch_get / scratch_put in tokenizer.c): one
 * encode at a time uses it, so nothing in it is locked. */
struct td_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    td__spanvec_t lv[TD__MAX_STEPS]; /* per pre-tokenizer depth */
    td_buf_t text;                   /* input after U+FFFD replacement */
    td_buf_t norm;                   /* normalized piece */
    td_buf_t pfx;                    /* piece with ByteLevel's prefix space */
    td_buf_t map;                    /* byte-level string of a word (ignore_merges lookup) */
    td__sym_t *sym;                  /* [symcap] BPE symbols of the current word */
    size_t symcap;
    uint64_t *heap;         /* [symcap] BPE pair queue: rank << 32 | position */
    td__cache_ent_t *cache; /* [TD__CACHE_SLOTS] */
    size_t cache_n;
    char *cache_text; /* [TD__CACHE_TEXT] */
    size_t cache_text_len;
    int32_t *cache_ids; /* [TD__CACHE_IDS] */
    size_t cache_ids_len;
    /* With tok->match a word of one token costs about what a cache hit does, so those words are
     * cached only while the cache pays: over windows of TD__CACHE_WINDOW lookups, while at least
     * a quarter hit (text that repeats its words); when fewer do (text of unusual words, which
     * only flood it) they are left out, and let in again for a window every eighth one to see. */
    uint32_t win_looks, win_hits, win_count;
    bool cache_single;
    /* words waiting to be merged together (td__bpe_word queues, td__bpe_flush runs them), so the
     * cache misses of their merge-table probes overlap */
    td_buf_t qtext;                   /* their bytes */
    uint32_t qoff[TD__BPE_BATCH];     /* word k is qtext[qoff[k], qoff[k] + qlen[k]) */
    uint32_t qlen[TD__BPE_BATCH];
    uint64_t qhash[TD__BPE_BATCH]; /* td__hash of the word when it is short enough to cache */
    size_t nq;
    td__scan_t qscan[TD__BPE_BATCH];
};

/* The code point at p[0] (n bytes left), its length in *len; U+FFFD with length 1 on an invalid
 * sequence (which sanitized text never has). Inline: every encode stage calls it per character. */
static inline uint32_t td__cp_at(const char *p, size_t n, size_t *len)
{
    size_t l = td_utf8_valid_len((const uint8_t *)p, n);
    if (!l) { /* cannot happen on sanitized text */
        *len = 1;
        return 0xFFFD;
    }
    *len = l;
    return td_utf8_decode((const uint8_t *)p, l);
}

/* Internal, shared between the tokenizer's files. */

/* xxh3 of n bytes at p, never 0 (0 marks an empty table slot). */
uint64_t td__hash(const void *p, size_t n);
/* The id stored for key [s, s+n) in m (keys live in tok->arena), -1 when absent. */
int32_t td__strmap_get(const td_tokenizer_t *tok, const td__strmap_t *m, const char *s, size_t n);
/* Free a scratch and everything it holds; NULL is a no-op. */
void td__scratch_free(struct td_scratch *s);

/* Make room for `extra` more ids in t. 0 or TD_ENOMEM (t unchanged). */
int td__tokens_reserve(td_tokens_t *t, size_t extra);
/* Stage 4: BPE one word of raw bytes [w, w+n) and append its ids to out (through the word cache
 * in s). Short words may wait in s for td__bpe_flush, which whoever appends other ids to out, and
 * encode at its end, calls first. 0 or TD_ENOMEM. */
int td__bpe_word(const td_tokenizer_t *tok, struct td_scratch *s, const char *w, size_t n,
                 td_tokens_t *out);
/* Fill tok->bpe_self (after the model is loaded), unless tok->ignore_merges. 0 or TD_ENOMEM. */
int td__bpe_self_init(td_tokenizer_t *tok);
/* Build tok->match (after td__bpe_self_init), or leave it NULL where it does not apply: it is
 * only faster, never required. */
void td__bpe_match_init(td_tokenizer_t *tok);
void td__bpe_match_free(td_tokenizer_t *tok);
/* Encode by longest match the queued words s->qscan[which[0..nw)] (raw bytes qtext[qoff[k],
 * +qlen[k])): a word it settles gets its ids in qscan[k].id[0..n); the others, in order, are
 * written to left[] for merging. Returns how many are left. */
size_t td__bpe_match(const td_tokenizer_t *tok, struct td_scratch *s, const size_t *which,
                     size_t nw, size_t *left);
/* Merge the words waiting in s and append their ids to out, in order. 0 or TD_ENOMEM. */
int td__bpe_flush(const td_tokenizer_t *tok, struct td_scratch *s, td_tokens_t *out);
/* Stage 3: run pre-tokenizer steps `step`.. over [p, p+n), then BPE each word, appending ids to
 * out. 0, TD_ENOMEM, or TD_EINTERNAL when PCRE2 fails (message set). */
int td__pretok_run(const td_tokenizer_t *tok, struct td_scratch *s, size_t step, const char *p,
                   size_t n, td_tokens_t *out);

/* The regex matches of a Split step over [p, p+n) as spans (matched ones with match = !invert),
 * by the hand matcher `fast` where it decides and PCRE2 (re, md, mctx) elsewhere; fast =
 * TD__FAST_NONE for PCRE2 alone. 0, TD_ENOMEM, or TD_EINTERNAL when PCRE2 fails (message set). */
int td__regex_split(const td_tokenizer_t *tok, pcre2_match_data *md, pcre2_match_context *mctx,
                    const pcre2_code *re, td__fast_t fast, const char *p, size_t n, bool invert,
                    td__spanvec_t *v);
/* The hand matcher of a pattern's exact text, TD__FAST_NONE when there is none. */
td__fast_t td__fast_kind(const char *pat, size_t len);
/* The pattern text of a hand matcher (TD__FAST_DS_DIGITS..TD__FAST_GPT2), NULL for others. */
const char *td__fast_pattern(td__fast_t kind);
/* The classes the hand matchers read, as patterns PCRE2 compiles the way the tokenizer's are (bit
 * k of fast_cls is class k). */
enum { TD__FAST_NCLASS = 6 };
extern const char *const td__fast_class_pat[TD__FAST_NCLASS];
/* Build *out (malloc'd): each BMP code point's classes, found by running the compiled
 * td__fast_class_pat over every one. 0, TD_ENOMEM or TD_EINTERNAL. */
int td__fast_table(pcre2_code *const cls[TD__FAST_NCLASS], td__fast_cls_t **out);
/* The classes of BMP code point c. */
static inline int td__fast_cls_of(const td__fast_cls_t *T, uint32_t c)
{
    return T->blk[(size_t)T->idx[c >> 6] * 64 + (c & 63)];
}
/* The next match of `kind` in [p, p+n) at or after off, with classes T (tok->fast_cls): 1 and
 * [*ms, *me), 0 when there is none, or TD__FAST_ASK when PCRE2 must decide (a code point above
 * U+FFFF, a caseless letter that is not ASCII). */
#define TD__FAST_ASK (-1)
int td__fast_next(td__fast_t kind, const td__fast_cls_t *T, const char *p, size_t n,
                  size_t off, size_t *ms, size_t *me);
/* Turn the hand matchers off: PCRE2 alone from then on (the tests' and benchmarks' reference;
 * before the tokenizer is shared). */
void td__fast_off(td_tokenizer_t *tok);

/* What td__split_added hands the text between added tokens to. */
typedef int (*td__segment_fn)(const td_tokenizer_t *tok, struct td_scratch *s, const char *p,
                              size_t n, td_tokens_t *out);
/* Stages 1 and 2: emit the ids of the added tokens of trie t found in [p, p+n) (HF
 * AddedVocabulary::find_matches + split_with_indices) and hand the text between them to seg.
 * 0 or the first error of seg / TD_ENOMEM. */
int td__split_added(const td_tokenizer_t *tok, struct td_scratch *s, const td__trie_t *t,
                    const char *p, size_t n, td__segment_fn seg, td_tokens_t *out);
/* A piece between raw added tokens: normalize it, then split out the normalized added tokens and
 * pre-tokenize the rest. A td__segment_fn. */
int td__seg_normalize(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
                      td_tokens_t *out);

#endif

/* tokenizer_added.c: stages 1 and 2 of encode: splitting out added tokens (leftmost-longest,
 * with their lstrip/rstrip/single_word rules) and normalizing the text between them. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* The code point that ends at p+n. */
static uint32_t cp_before(const char *p, size_t n)
{
    size_t i = n;
    while (i > 0 && n - i < 4 && ((uint8_t)p[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0)
        return 0xFFFD;
    size_t l;
    return td__cp_at(p + i - 1, n - i + 1, &l);
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

/* HF AddedVocabulary::find_matches + split_with_indices: emit added-token ids and hand the text
 * between them to `seg`. */
int td__split_added(const td_tokenizer_t *tok, struct td_scratch *s, const td__trie_t *t,
                    const char *p, size_t n, td__segment_fn seg, td_tokens_t *out)
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
                if (t->nfirst == 1 && b != t->first_byte) { /* skip to the next candidate */
                    const char *c = memchr(p + i, t->first_byte, n - i);
                    if (!c)
                        break;
                    i = (size_t)(c - p);
                } else if (!(t->first[b >> 3] & (1u << (b & 7)))) {
                    continue;
                }
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
                bool stop_space = stop == n || !is_word_cp(td__cp_at(p + stop, n - stop, &l));
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
                    if (!is_space_cp(td__cp_at(p + k - 1, ns - k + 1, &l)))
                        break;
                    ns = k - 1;
                }
                start = TD_MAX(ns, start_offset);
            }
            if (at->rstrip) {
                while (stop < n) {
                    size_t l;
                    if (!is_space_cp(td__cp_at(p + stop, n - stop, &l)))
                        break;
                    stop += l;
                }
            }
            if (start_offset < start &&
                (rc = seg(tok, s, p + start_offset, start - start_offset, out)))
                return rc;
            if ((rc = td__bpe_flush(tok, s, out)) || (rc = td_tokens_push(out, at->id)))
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
    return td__pretok_run(tok, s, 0, p, n, out);
}

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
        if ((uint8_t)p[i] < 0x80 || nfc_inert(td__cp_at(p + i, n - i, &l))) {
            last_inert = i;
            i += l;
            continue;
        }
        size_t j = i + l; /* the stretch of non-inert characters */
        while (j < n && (uint8_t)p[j] >= 0x80 && !nfc_inert(td__cp_at(p + j, n - j, &l)))
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
int td__seg_normalize(const td_tokenizer_t *tok, struct td_scratch *s, const char *p, size_t n,
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
    return td__split_added(tok, s, &tok->trie_norm, p, n, seg_pretok, out);
}

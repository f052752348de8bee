/* tokenizer_pretok_fast.c: hand-written matchers for the pre-tokenizer Split regexes of the
 * vocabularies tandem is tested on (DeepSeek-V3's three; Llama 3's, which is OpenAI's cl100k
 * pattern; Qwen3's variant of it; and GPT-2's, ByteLevel's use_regex), recognised by their exact
 * pattern text at load. Each gives the match PCRE2 would give at the same offset, or says it cannot
 * decide (TD__FAST_ASK) and the caller runs PCRE2 from that offset: none of these patterns looks
 * behind or anchors, so PCRE2 from an offset is exactly the search the caller continues.
 *
 * Character classes come from a table over U+0000..U+FFFF that PCRE2 itself fills at load: each
 * class (\p{L}, \p{N}, \p{M}, \p{P}, \p{S}, \s after the loader's rewrite) is compiled as the
 * tokenizer's patterns are and run over every code point of the BMP, so the table is the running
 * libpcre2's Unicode data, whatever its version. A decision that needs the class of a code point
 * above U+FFFF, or a caseless contraction letter that is not ASCII (PCRE2 folds 's' to U+017F),
 * asks PCRE2 instead. test_tokenizer_pretok and fuzz_tokenizer_encode compare both paths. */
#include "td_error.h"
#include "td_util.h"
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

enum {
    C_L = 1,
    C_N = 2,
    C_M = 4,
    C_P = 8,
    C_S = 16,
    C_WS = 32, /* \s as the loader rewrites it (Oniguruma's White_Space) */
};

/* The patterns, byte for byte as tokenizer.json holds them (after JSON unescaping). */
static const struct {
    td__fast_t kind;
    const char *pat;
} known[] = {
    {TD__FAST_DS_DIGITS, "\\p{N}{1,3}"},
    {TD__FAST_DS_CJK,
     "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+"},
    {TD__FAST_DS_WORDS,
     "[!\"#$%&'()*+,\\-./"
     ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
     " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
    {TD__FAST_CL100K, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {TD__FAST_QWEN, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {TD__FAST_GPT2,
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
};

td__fast_t td__fast_kind(const char *pat, size_t len)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(known); i++)
        if (strlen(known[i].pat) == len && memcmp(known[i].pat, pat, len) == 0)
            return known[i].kind;
    return TD__FAST_NONE;
}

const char *td__fast_pattern(td__fast_t kind)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(known); i++)
        if (known[i].kind == kind)
            return known[i].pat;
    return NULL;
}

/* ---------------------------------------------------------------- the class table */

const char *const td__fast_class_pat[TD__FAST_NCLASS] = {"\\p{L}+", "\\p{N}+", "\\p{M}+",
                                                         "\\p{P}+", "\\p{S}+", "\\s+"};

int td__fast_table(pcre2_code *const cls[TD__FAST_NCLASS], td__fast_cls_t **out)
{
    *out = NULL;
    /* every BMP code point but the surrogates, in order */
    size_t cap = 0x10000 * 3;
    char *subj = malloc(cap);
    uint8_t *tab = calloc(0x10000, 1);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    td__fast_cls_t *T = NULL;
    int rc = 0;
    if (!subj || !tab || !md) {
        rc = TD_ENOMEM;
        goto done;
    }
    size_t len = 0;
    for (uint32_t c = 0; c < 0x10000; c++)
        if (c < 0xD800 || c > 0xDFFF)
            len += td_utf8_encode(c, subj + len);
    for (int k = 0; k < TD__FAST_NCLASS && !rc; k++) {
        for (size_t off = 0; off < len;) {
            int m = pcre2_match(cls[k], (PCRE2_SPTR)subj, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
            if (m == PCRE2_ERROR_NOMATCH)
                break;
            if (m < 0) {
                rc = td_err_set(TD_EINTERNAL, "pre-tokenizer class table: PCRE2 error %d", m);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            for (size_t i = ov[0]; i < ov[1];) {
                size_t l;
                uint32_t c = td__cp_at(subj + i, ov[1] - i, &l);
                tab[c] |= (uint8_t)(1u << k);
                i += l;
            }
            off = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
        }
    }
    if (rc)
        goto done;
    /* blocks of 64, each distinct one stored once */
    size_t nblk = 0;
    uint16_t idx[1024], first[1024]; /* first[u]: the first block equal to distinct block u */
    for (size_t b = 0; b < 1024; b++) {
        size_t u;
        for (u = 0; u < nblk; u++)
            if (memcmp(tab + b * 64, tab + (size_t)first[u] * 64, 64) == 0)
                break;
        if (u == nblk)
            first[nblk++] = (uint16_t)b;
        idx[b] = (uint16_t)u;
    }
    T = malloc(sizeof(*T) + nblk * 64);
    if (!T) {
        rc = TD_ENOMEM;
        goto done;
    }
    memcpy(T->ascii, tab, 128);
    memcpy(T->idx, idx, sizeof(idx));
    memset(T->has_n, 0, sizeof(T->has_n));
    for (size_t u = 0; u < nblk; u++)
        memcpy(T->blk + u * 64, tab + (size_t)first[u] * 64, 64);
    for (size_t c = 0; c < 0x10000; c++)
        if (tab[c] & C_N)
            T->has_n[c >> 12] |= 1ull << (c >> 6 & 63);
done:
    pcre2_match_data_free(md);
    free(subj);
    free(tab);
    if (!rc)
        *out = T;
    return rc;
}

/* ---------------------------------------------------------------- matching */

#define ASK TD__FAST_ASK

/* The classes of the code point at p[i] (i < n) and its length; ASK above U+FFFF. The text is
 * valid UTF-8 (encode sanitizes it). */
static inline int cls_at(const td__fast_cls_t *T, const char *p, size_t i, size_t *len)
{
    unsigned b = (unsigned char)p[i];
    if (b < 0x80) {
        *len = 1;
        return T->ascii[b];
    }
    if (b < 0xE0) {
        *len = 2;
        return td__fast_cls_of(T, (b & 0x1F) << 6 | ((unsigned char)p[i + 1] & 0x3F));
    }
    if (b < 0xF0) {
        *len = 3;
        return td__fast_cls_of(T, (b & 0x0F) << 12 | ((unsigned char)p[i + 1] & 0x3F) << 6 |
                                      ((unsigned char)p[i + 2] & 0x3F));
    }
    *len = 4;
    return ASK;
}

/* The end of the longest run from i of code points whose classes meet `want` (any bit) and, when
 * `none` is set, miss every bit of `none` (want = 0: only the latter). SIZE_MAX: it reached a code
 * point it cannot classify. */
static inline size_t run_end(const td__fast_cls_t *T, const char *p, size_t n, size_t i, int want,
                             int none)
{
    while (i < n) {
        size_t l;
        int f = cls_at(T, p, i, &l);
        if (f == ASK)
            return SIZE_MAX;
        if (want ? !(f & want) : (f & none) != 0)
            return i;
        i += l;
    }
    return n;
}

/* The end of at most `more` further \p{N} code points from i (the rest of \p{N}{1,k} after its
 * first); SIZE_MAX: it reached a code point it cannot classify. */
static inline size_t digits_end(const td__fast_cls_t *T, const char *p, size_t n, size_t i,
                                int more)
{
    for (int k = 0; k < more && i < n; k++) {
        size_t l;
        int f = cls_at(T, p, i, &l);
        if (f == ASK)
            return SIZE_MAX;
        if (!(f & C_N))
            break;
        i += l;
    }
    return i;
}

static inline size_t crlf_end(const char *p, size_t n, size_t i)
{
    while (i < n && (p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at i, where p[i] is in \s: always a match. */
static int ws_alts(const td__fast_cls_t *T, const char *p, size_t n, size_t i, bool with_crlf,
                   size_t *me)
{
    size_t e = i, last = i, nl = SIZE_MAX, nch = 0;
    while (e < n) {
        size_t l;
        int f = cls_at(T, p, e, &l);
        if (f == ASK)
            return ASK;
        if (!(f & C_WS))
            break;
        if (p[e] == '\r' || p[e] == '\n')
            nl = e;
        last = e;
        nch++;
        e += l;
    }
    if (with_crlf && nl != SIZE_MAX) /* \s* gives back to the last CR or LF */
        *me = nl + 1;
    else if (e == n || nch == 1) /* \s+(?!\S) to the end, or \s+ of one */
        *me = e;
    else /* \s+(?!\S): all but the last, which is followed by \s */
        *me = last;
    return 1;
}

/* Whether any of the 16 bytes at p is in [lo, lo + span) (GCC/Clang vectors: SSE2, NEON). */
typedef uint8_t td__v16 __attribute__((vector_size(16)));
static inline bool any16_in(const char *p, uint8_t lo, uint8_t span)
{
    td__v16 v;
    memcpy(&v, p, 16);
    td__v16 m = (td__v16)((td__v16)(v - lo) < span);
    uint64_t a, b;
    memcpy(&a, &m, 8);
    memcpy(&b, (const char *)&m + 8, 8);
    return (a | b) != 0;
}

static inline bool ascii_alpha(unsigned char c)
{
    return (unsigned char)((c | 0x20) - 'a') < 26;
}

/* \p{N}{1,3} */
static int m_digits(const td__fast_cls_t *T, const char *p, size_t n, size_t off, size_t *ms,
                    size_t *me)
{
    for (size_t i = off; i < n;) {
        unsigned char b = (unsigned char)p[i];
        if (b < 0x80) { /* fast paths: ASCII, and code points in blocks without \p{N} */
            if (!(T->ascii[b] & C_N)) {
                i++;
                /* 16 bytes at a time while they are ASCII and not digits */
                while (i + 16 <= n && !any16_in(p + i, 0x80, 0x80) && !any16_in(p + i, '0', 10))
                    i += 16;
                continue;
            }
        } else if (b < 0xF0) {
            unsigned blk =
                b < 0xE0 ? (b & 0x1Fu) : (b & 0x0Fu) << 6 | ((unsigned char)p[i + 1] & 0x3Fu);
            if (!(T->has_n[blk >> 6] >> (blk & 63) & 1)) {
                i += b < 0xE0 ? 2 : 3;
                continue;
            }
        }
        size_t l;
        int f = cls_at(T, p, i, &l);
        if (f == ASK)
            return ASK;
        if (!(f & C_N)) {
            i += l;
            continue;
        }
        size_t e = digits_end(T, p, n, i + l, 2);
        if (e == SIZE_MAX)
            return ASK;
        *ms = i;
        *me = e;
        return 1;
    }
    return 0;
}

/* [\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+ : explicit code points, no table */
static inline bool cjk_at(const char *p, size_t n, size_t i)
{
    unsigned b = (unsigned char)p[i];
    if (b < 0xE3 || b > 0xE9 || n - i < 3)
        return false;
    uint32_t c =
        (b & 0x0F) << 12 | ((unsigned char)p[i + 1] & 0x3F) << 6 | ((unsigned char)p[i + 2] & 0x3F);
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
}

static int m_cjk(const char *p, size_t n, size_t off, size_t *ms, size_t *me)
{
    /* a lead byte E3..E9 is never a continuation byte, so bytes can be stepped one at a time */
    for (size_t i = off; i < n; i++) {
        while (i + 16 <= n && !any16_in(p + i, 0xE3, 7)) /* no lead byte E3..E9 */
            i += 16;
        if (i < n && cjk_at(p, n, i)) {
            size_t e = i + 3;
            while (e < n && cjk_at(p, n, e))
                e += 3;
            *ms = i;
            *me = e;
            return 1;
        }
    }
    return 0;
}

/* DeepSeek-V3's third:
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 *    ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+ */
static int m_ds_words(const td__fast_cls_t *T, const char *p, size_t n, size_t off, size_t *ms,
                      size_t *me)
{
    for (size_t i = off; i < n;) {
        size_t l0, l1;
        int f0 = cls_at(T, p, i, &l0), f1 = -2; /* -2: not read yet */
        if (f0 == ASK)
            return ASK;
        unsigned char b0 = (unsigned char)p[i];
        *ms = i;
        /* 1: one ASCII punctuation or symbol, then ASCII letters */
        if (b0 > 0x20 && b0 < 0x7F && !ascii_alpha(b0) && !(b0 >= '0' && b0 <= '9') && i + 1 < n &&
            ascii_alpha((unsigned char)p[i + 1])) {
            size_t e = i + 2;
            while (e < n && ascii_alpha((unsigned char)p[e]))
                e++;
            *me = e;
            return 1;
        }
        /* 2: an optional code point that is none of CR, LF, L, P, S; then L or M */
        if (b0 != '\r' && b0 != '\n' && !(f0 & (C_L | C_P | C_S)) && i + l0 < n) {
            f1 = cls_at(T, p, i + l0, &l1);
            if (f1 == ASK)
                return ASK;
            if (f1 & (C_L | C_M)) {
                size_t e = run_end(T, p, n, i + l0 + l1, C_L | C_M, 0);
                if (e == SIZE_MAX)
                    return ASK;
                *me = e;
                return 1;
            }
        }
        if (f0 & (C_L | C_M)) {
            size_t e = run_end(T, p, n, i + l0, C_L | C_M, 0);
            if (e == SIZE_MAX)
                return ASK;
            *me = e;
            return 1;
        }
        /* 3: an optional space, then P or S, then CR and LF */
        if (b0 == ' ' && i + 1 < n) {
            if (f1 == -2) {
                f1 = cls_at(T, p, i + 1, &l1);
                if (f1 == ASK)
                    return ASK;
            }
            if (f1 & (C_P | C_S)) {
                size_t e = run_end(T, p, n, i + 1, C_P | C_S, 0);
                if (e == SIZE_MAX)
                    return ASK;
                *me = crlf_end(p, n, e);
                return 1;
            }
        }
        if (f0 & (C_P | C_S)) {
            size_t e = run_end(T, p, n, i, C_P | C_S, 0);
            if (e == SIZE_MAX)
                return ASK;
            *me = crlf_end(p, n, e);
            return 1;
        }
        /* 4-6: white space */
        if (f0 & C_WS)
            return ws_alts(T, p, n, i, true, me);
        i += l0; /* no match starts here */
    }
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d at the apostrophe p[i]: the end, 0 when none, ASK when caseless
 * matching meets a letter that is not ASCII. */
static size_t contraction(const char *p, size_t n, size_t i, bool caseless)
{
    if (i + 1 >= n)
        return 0;
    unsigned char a = (unsigned char)p[i + 1];
    if (caseless && a >= 0x80)
        return (size_t)ASK;
    if (caseless)
        a |= (unsigned char)(ascii_alpha(a) ? 0x20 : 0);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return i + 2;
    if (a != 'r' && a != 'v' && a != 'l')
        return 0;
    if (i + 2 >= n)
        return 0;
    unsigned char b = (unsigned char)p[i + 2];
    if (caseless && b >= 0x80)
        return (size_t)ASK;
    if (caseless)
        b |= (unsigned char)(ascii_alpha(b) ? 0x20 : 0);
    return b == (a == 'l' ? 'l' : 'e') ? i + 3 : 0;
}

/* Llama 3's (OpenAI's cl100k, digits up to 3) and Qwen3's (digits one by one):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
 *    ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+ */
static int m_cl100k(const td__fast_cls_t *T, const char *p, size_t n, size_t off, int maxdig,
                    size_t *ms, size_t *me)
{
    for (size_t i = off; i < n;) {
        size_t l0, l1;
        int f0 = cls_at(T, p, i, &l0), f1 = -2;
        if (f0 == ASK)
            return ASK;
        unsigned char b0 = (unsigned char)p[i];
        *ms = i;
        if (b0 == '\'') {
            size_t e = contraction(p, n, i, true);
            if (e == (size_t)ASK)
                return ASK;
            if (e) {
                *me = e;
                return 1;
            }
        }
        if (b0 != '\r' && b0 != '\n' && !(f0 & (C_L | C_N)) && i + l0 < n) {
            f1 = cls_at(T, p, i + l0, &l1);
            if (f1 == ASK)
                return ASK;
            if (f1 & C_L) {
                size_t e = run_end(T, p, n, i + l0 + l1, C_L, 0);
                if (e == SIZE_MAX)
                    return ASK;
                *me = e;
                return 1;
            }
        }
        if (f0 & C_L) {
            size_t e = run_end(T, p, n, i + l0, C_L, 0);
            if (e == SIZE_MAX)
                return ASK;
            *me = e;
            return 1;
        }
        if (f0 & C_N) {
            size_t e = digits_end(T, p, n, i + l0, maxdig - 1);
            if (e == SIZE_MAX)
                return ASK;
            *me = e;
            return 1;
        }
        if (b0 == ' ' && i + 1 < n) { /* f1 was read: ' ' is none of CR, LF, L, N */
            if (!(f1 & (C_WS | C_L | C_N))) {
                size_t e = run_end(T, p, n, i + 1, 0, C_WS | C_L | C_N);
                if (e == SIZE_MAX)
                    return ASK;
                *me = crlf_end(p, n, e);
                return 1;
            }
        }
        if (!(f0 & (C_WS | C_L | C_N))) {
            size_t e = run_end(T, p, n, i, 0, C_WS | C_L | C_N);
            if (e == SIZE_MAX)
                return ASK;
            *me = crlf_end(p, n, e);
            return 1;
        }
        if (f0 & C_WS)
            return ws_alts(T, p, n, i, true, me);
        i += l0;
    }
    return 0;
}

/* GPT-2's: 's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
 * (every code point starts a match) */
static int m_gpt2(const td__fast_cls_t *T, const char *p, size_t n, size_t off, size_t *ms,
                  size_t *me)
{
    if (off >= n)
        return 0;
    size_t i = off, l0, l1;
    int f0 = cls_at(T, p, i, &l0);
    if (f0 == ASK)
        return ASK;
    unsigned char b0 = (unsigned char)p[i];
    *ms = i;
    if (b0 == '\'') {
        size_t e = contraction(p, n, i, false);
        if (e) {
            *me = e;
            return 1;
        }
    }
    size_t from = i;
    int f = f0;
    if (b0 == ' ' && i + 1 < n) { /* ' ' then one of the three classes */
        int f1 = cls_at(T, p, i + 1, &l1);
        if (f1 == ASK)
            return ASK;
        if (!(f1 & C_WS)) {
            from = i + 1;
            f = f1;
        }
    }
    int want = f & C_L ? C_L : f & C_N ? C_N : 0;
    if (want || !(f & C_WS)) {
        size_t e =
            want ? run_end(T, p, n, from, want, 0) : run_end(T, p, n, from, 0, C_WS | C_L | C_N);
        if (e == SIZE_MAX)
            return ASK;
        *me = e;
        return 1;
    }
    return ws_alts(T, p, n, i, false, me);
}

int td__fast_next(td__fast_t kind, const td__fast_cls_t *T, const char *p, size_t n, size_t off,
                  size_t *ms, size_t *me)
{
    switch (kind) {
    case TD__FAST_DS_DIGITS:
        return m_digits(T, p, n, off, ms, me);
    case TD__FAST_DS_CJK:
        return m_cjk(p, n, off, ms, me);
    case TD__FAST_DS_WORDS:
        return m_ds_words(T, p, n, off, ms, me);
    case TD__FAST_CL100K:
        return m_cl100k(T, p, n, off, 3, ms, me);
    case TD__FAST_QWEN:
        return m_cl100k(T, p, n, off, 1, ms, me);
    case TD__FAST_GPT2:
        return m_gpt2(T, p, n, off, ms, me);
    case TD__FAST_NONE:
        break;
    }
    return ASK;
}

void td__fast_off(td_tokenizer_t *tok)
{
    for (size_t i = 0; i < tok->npretok; i++)
        tok->pretok[i].fast = TD__FAST_NONE;
    tok->bl_fast = TD__FAST_NONE;
}

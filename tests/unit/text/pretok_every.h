/* pretok_every.h: a tokenizer whose pre-tokenizer holds every Split pattern that
 * common/text/tokenizer_pretok_fast.c matches by hand (as Isolated steps) and ByteLevel's GPT-2
 * one, loaded through the real loader (so each is compiled as a tokenizer.json's is), and the
 * comparison of a text's splits by the hand matcher and by PCRE2 alone. test_tokenizer_pretok
 * and fuzz_tokenizer_encode use it. */
#ifndef TD_TEST_PRETOK_EVERY_H
#define TD_TEST_PRETOK_EVERY_H

#include "td_error.h"
#include "td_tokenizer.h"
#include "td_util.h"
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Patterns in the tokenizer: steps 0..PRETOK_EVERY_N-2, then the ByteLevel one. */
#define PRETOK_EVERY_N 6

static inline void pretok_json_str(td_buf_t *b, const char *s)
{
    td_buf_append_char(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            td_buf_printf(b, "\\%c", c);
        else if (c < 0x20)
            td_buf_printf(b, "\\u%04x", c);
        else
            td_buf_append_char(b, (char)c);
    }
    td_buf_append_char(b, '"');
}

/* NULL (message on stderr) when it does not load or a pattern is not recognised. */
static inline td_tokenizer_t *pretok_every_load(void)
{
    td_buf_t j;
    td_buf_init(&j);
    td_buf_append_str(&j, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
                          "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\","
                          "\"pretokenizers\":[");
    for (int k = TD__FAST_DS_DIGITS; k <= TD__FAST_QWEN; k++) {
        td_buf_append_str(&j, "{\"type\":\"Split\",\"pattern\":{\"Regex\":");
        pretok_json_str(&j, td__fast_pattern((td__fast_t)k));
        td_buf_append_str(&j, "},\"behavior\":\"Isolated\",\"invert\":false},");
    }
    td_buf_append_str(&j, "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"
                          "]},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                          "\"added_tokens\":[],\"post_processor\":null,"
                          "\"decoder\":{\"type\":\"ByteLevel\"}}");
    td_tokenizer_t *tok = NULL;
    if (td_tokenizer_load_mem(j.data, j.len, NULL, 0, "every.json", &tok)) {
        fprintf(stderr, "pretok_every: %s\n", td_err_msg());
        tok = NULL;
    } else {
        bool ok = tok->npretok == PRETOK_EVERY_N - 1 && tok->bl_fast == TD__FAST_GPT2 &&
                  tok->fast_cls != NULL;
        for (size_t k = 0; ok && k < tok->npretok; k++)
            ok = tok->pretok[k].fast == (td__fast_t)(TD__FAST_DS_DIGITS + k);
        if (!ok) {
            fprintf(stderr, "pretok_every: a pattern was not recognised\n");
            td_tokenizer_free(tok);
            tok = NULL;
        }
    }
    td_buf_free(&j);
    return tok;
}

static inline void pretok_every_pat(const td_tokenizer_t *tok, int k, const pcre2_code **re,
                                    td__fast_t *fast)
{
    if (k < PRETOK_EVERY_N - 1) {
        *re = tok->pretok[k].re;
        *fast = tok->pretok[k].fast;
    } else {
        *re = tok->bl_re;
        *fast = tok->bl_fast;
    }
}

typedef struct pretok_cmp {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    td__spanvec_t a, b;
} pretok_cmp_t;

static inline void pretok_cmp_init(pretok_cmp_t *c)
{
    memset(c, 0, sizeof(*c));
    c->md = pcre2_match_data_create(1, NULL);
    c->mctx = pcre2_match_context_create(NULL);
    c->js = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!c->md || !c->mctx || !c->js)
        abort();
    pcre2_jit_stack_assign(c->mctx, NULL, c->js);
}

static inline void pretok_cmp_free(pretok_cmp_t *c)
{
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->js);
    free(c->a.v);
    free(c->b.v);
}

/* The splits of valid UTF-8 [p, p+n) by pattern k of `tok` through the hand matcher and through
 * PCRE2 alone: true when they are the same; else false, the first difference on stderr. */
static inline bool pretok_same(pretok_cmp_t *c, const td_tokenizer_t *tok, int k, const char *p,
                               size_t n)
{
    const pcre2_code *re;
    td__fast_t fast;
    pretok_every_pat(tok, k, &re, &fast);
    c->a.n = c->b.n = 0;
    if (td__regex_split(tok, c->md, c->mctx, re, fast, p, n, false, &c->a) ||
        td__regex_split(tok, c->md, c->mctx, re, TD__FAST_NONE, p, n, false, &c->b)) {
        fprintf(stderr, "pretok_same: %s\n", td_err_msg());
        return false;
    }
    size_t i = 0;
    while (i < c->a.n && i < c->b.n && c->a.v[i].start == c->b.v[i].start &&
           c->a.v[i].end == c->b.v[i].end && c->a.v[i].match == c->b.v[i].match)
        i++;
    if (i == c->a.n && i == c->b.n)
        return true;
    fprintf(stderr, "pattern %d (hand matcher %d) differs from PCRE2 at piece %zu of \"", k,
            (int)fast, i);
    for (size_t j = 0; j < n && j < 120; j++) {
        unsigned char ch = (unsigned char)p[j];
        if (ch >= 0x20 && ch < 0x7F && ch != '\\')
            fputc(ch, stderr);
        else
            fprintf(stderr, "\\x%02X", ch);
    }
    fprintf(stderr, "\" (%zu bytes):", n);
    if (i < c->a.n)
        fprintf(stderr, " hand [%zu,%zu)%s", c->a.v[i].start, c->a.v[i].end,
                c->a.v[i].match ? " match" : "");
    if (i < c->b.n)
        fprintf(stderr, " pcre2 [%zu,%zu)%s", c->b.v[i].start, c->b.v[i].end,
                c->b.v[i].match ? " match" : "");
    fputc('\n', stderr);
    return false;
}

#endif

/* tokenizer_pretok.c: the pre-tokenizer steps (stage 3 of encode): regex and digit splits with
 * HF's split behaviors, depth first, ending in the ByteLevel step that hands words to BPE. A
 * regex's matches come from its hand matcher where it has one (tokenizer_pretok_fast.c) and it
 * decides, from PCRE2 otherwise. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <string.h>
#include <utf8proc.h>

/* Rust's char::is_numeric: general categories Nd, Nl, No. */
static bool is_numeric_cp(uint32_t c)
{
    if (c < 128)
        return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static int spans_push(td__spanvec_t *v, size_t start, size_t end, bool match)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        td__span_t *n = td_reallocarray(v->v, cap, sizeof(*n));
        if (!n)
            return TD_ENOMEM;
        v->v = n;
        v->cap = cap;
    }
    v->v[v->n++] = (td__span_t){start, end, match};
    return 0;
}

int td__regex_split(const td_tokenizer_t *tok, pcre2_match_data *md, pcre2_match_context *mctx,
                    const pcre2_code *re, td__fast_t fast, const char *p, size_t n, bool invert,
                    td__spanvec_t *v)
{
    size_t off = 0, prev = 0;
    size_t last_end = SIZE_MAX;
    /* a JIT-compiled pattern is run by pcre2_jit_match, which skips pcre2_match's per-call checks
     * (the text is valid UTF-8 already) */
    size_t jit = 0;
    if (pcre2_pattern_info(re, PCRE2_INFO_JITSIZE, &jit) != 0)
        jit = 0;
    while (off <= n) {
        size_t ms, me;
        if (fast) { /* the hand matcher, where it can decide (tokenizer_pretok_fast.c) */
            int f = td__fast_next(fast, tok->fast_cls, p, n, off, &ms, &me);
            if (f == 0)
                break;
            if (f == 1) {
                if (prev != ms && spans_push(v, prev, ms, invert))
                    return TD_ENOMEM;
                if (spans_push(v, ms, me, !invert))
                    return TD_ENOMEM;
                prev = off = last_end = me;
                continue;
            }
        }
        int rc = jit ? pcre2_jit_match(re, (PCRE2_SPTR)p, n, off, 0, md, mctx)
                     : pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return td_err_set(TD_EINTERNAL, "%s: pre-tokenizer regex failed: %s", tok->name,
                              (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        ms = ov[0];
        me = ov[1];
        if (me == ms) { /* empty match: never right after the previous match, then step on */
            size_t cl = 1;
            if (ms < n)
                (void)td__cp_at(p + ms, n - ms, &cl);
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

static int digit_matches(const char *p, size_t n, td__spanvec_t *v)
{
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = td__cp_at(p + i, n - i, &l);
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
static void apply_behavior(td__spanvec_t *v, td__split_behavior_t b)
{
    td__span_t *a = v->v;
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
            td__span_t cur = a[i];
            if (r < n && cur.match && !prev_match)
                a[r].start = cur.start;
            else
                a[--r] = cur;
            prev_match = cur.match;
        }
        memmove(a, a + r, (n - r) * sizeof(td__span_t));
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
        return td__bpe_word(tok, s, p, n, out);
    td__spanvec_t *v = &s->lv[tok->npretok];
    v->n = 0;
    if ((rc = td__regex_split(tok, s->md, s->mctx, tok->bl_re, tok->bl_fast, p, n, false, v)))
        return rc;
    for (size_t i = 0; i < v->n; i++)
        if ((rc = td__bpe_word(tok, s, p + v->v[i].start, v->v[i].end - v->v[i].start, out)))
            return rc;
    return 0;
}

int td__pretok_run(const td_tokenizer_t *tok, struct td_scratch *s, size_t step, const char *p,
                   size_t n, td_tokens_t *out)
{
    if (!n)
        return 0;
    if (step == tok->npretok)
        return bytelevel_step(tok, s, p, n, out);
    const td__pretok_t *pt = &tok->pretok[step];
    td__spanvec_t *v = &s->lv[step];
    v->n = 0;
    int rc = pt->kind == TD__PRETOK_SPLIT
                 ? td__regex_split(tok, s->md, s->mctx, pt->re, pt->fast, p, n, pt->invert, v)
                 : digit_matches(p, n, v);
    if (rc)
        return rc;
    apply_behavior(v, pt->behavior);
    for (size_t i = 0; i < v->n; i++) {
        td__span_t sp = s->lv[step].v[i];
        if (sp.end > sp.start &&
            (rc = td__pretok_run(tok, s, step + 1, p + sp.start, sp.end - sp.start, out)))
            return rc;
    }
    return 0;
}

/* tokenizer_load_pretok.c: the "normalizer" and "pre_tokenizer" sections of tokenizer.json, and
 * the translation of their regexes from Oniguruma's dialect to PCRE2's. */
#include "td_error.h"
#include "tokenizer_load_impl.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

/* ---------------------------------------------------------------- regex */

/* Oniguruma (which HF uses) and PCRE2 disagree on one \s character: PCRE2's \s includes U+180E
 * MONGOLIAN VOWEL SEPARATOR (through \h), Oniguruma's is the Unicode White_Space property, which
 * does not. Rewrite \s / \S into explicit White_Space classes so both match the same. */
#define WS_RANGES                                                                                  \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
    "\\x{3000}"

static int translate_pattern(const char *pat, size_t len, td_buf_t *out)
{
    bool in_class = false;
    size_t class_start = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (d == 'Q') { /* \Q...\E literal: copy through */
                size_t e = i + 2;
                while (e + 1 < len && !(pat[e] == '\\' && pat[e + 1] == 'E'))
                    e++;
                size_t stop = e + 1 < len ? e + 2 : len;
                rc = td_buf_append(out, pat + i, stop - i);
                i = stop - 1;
                continue;
            }
            if (d == 's')
                rc = td_buf_append_str(out, in_class ? WS_RANGES : "[" WS_RANGES "]");
            else if (d == 'S' && !in_class)
                rc = td_buf_append_str(out, "[^" WS_RANGES "]");
            else
                rc = td_buf_append(out, pat + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i;
            rc = td_buf_append_char(out, c);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < len && pat[i + 1] == '^') {
                rc = rc ? rc : td_buf_append_char(out, '^');
                i++;
            }
            if (i + 1 < len && pat[i + 1] == ']') {
                rc = rc ? rc : td_buf_append_char(out, ']');
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') { /* [:alpha:] */
            const char *e = memmem(pat + i + 2, len - i - 2, ":]", 2);
            if (e) {
                size_t stop = (size_t)(e - pat) + 2;
                rc = td_buf_append(out, pat + i, stop - i);
                i = stop - 1;
                continue;
            }
        }
        if (in_class && c == ']' && i > class_start)
            in_class = false;
        rc = td_buf_append_char(out, c);
    }
    return rc;
}

/* Compile a pattern for PCRE2 (UTF, UCP, JIT), after rewriting \s and \S to Oniguruma's meaning.
 * NULL on error with td_err_msg naming `what` (a field of file `name`). */
static pcre2_code *regex_compile(const char *name, const char *what, const char *pat, size_t len)
{
    td_buf_t b;
    td_buf_init(&b);
    if (translate_pattern(pat, len, &b) || td_buf_reserve(&b, 1)) {
        td_buf_free(&b);
        td_err_set(TD_ENOMEM, "%s: field \"%s\": out of memory", name, what);
        return NULL;
    }
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)b.data, b.len, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    td_buf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        td_err_set(TD_EPARSE, "%s: field \"%s\": invalid regex: %s", name, what, (char *)msg);
        return NULL;
    }
    /* JIT is an optimisation: when it is unavailable pcre2_match interprets the pattern. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* Escape a literal string for PCRE2 (Split with {"String": ...}). */
static int regex_escape(const char *s, size_t n, td_buf_t *out)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (strchr("\\^$.|?*+()[]{}-#&~ \t\n\r\f\v", s[i]) && s[i]) {
            if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' ||
                s[i] == '\v')
                rc = td_buf_printf(out, "\\x{%x}", (unsigned)(unsigned char)s[i]);
            else
                rc = td_buf_append_char(out, '\\') || td_buf_append_char(out, s[i]);
        } else if (s[i] == '\0') {
            rc = td_buf_append_str(out, "\\x{0}");
        } else {
            rc = td_buf_append_char(out, s[i]);
        }
    }
    return rc ? TD_ENOMEM : 0;
}

/* ---------------------------------------------------------------- components */

int td__parse_normalizer(td__ld_t *L, json_object *n, const char *path, int *flags)
{
    if (!n)
        return 0;
    int rc = td__want_type(L, n, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = td__req_string(L, n, "type", path, &type, &tl)))
        return rc;
    if (strcmp(type, "Sequence") == 0) {
        char p[256];
        snprintf(p, sizeof(p), "%s.normalizers", path);
        json_object *arr = td__tok_jget(n, "normalizers");
        if ((rc = td__want_type(L, arr, json_type_array, p)))
            return rc;
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", p, i);
            if ((rc = td__parse_normalizer(L, json_object_array_get_idx(arr, i), pi, flags)))
                return rc;
        }
        return 0;
    }
    int f;
    if (strcmp(type, "NFC") == 0)
        f = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (strcmp(type, "NFD") == 0)
        f = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (strcmp(type, "NFKC") == 0)
        f = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (strcmp(type, "NFKD") == 0)
        f = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return td_err_set(TD_ENOTSUP, "%s: field \"%s.type\": normalizer \"%s\" is not supported",
                          L->file, path, type);
    if (*flags && *flags != f)
        return td_err_set(TD_ENOTSUP,
                          "%s: field \"%s\": only one Unicode normalization form is supported",
                          L->file, path);
    *flags = f;
    return 0;
}

static int parse_behavior(td__ld_t *L, json_object *o, const char *path, td__split_behavior_t *b)
{
    const char *s;
    size_t n;
    int rc = td__req_string(L, o, "behavior", path, &s, &n);
    if (rc)
        return rc;
    static const struct {
        const char *name;
        td__split_behavior_t b;
    } tab[] = {{"Removed", TD__SPLIT_REMOVED},
               {"Isolated", TD__SPLIT_ISOLATED},
               {"MergedWithPrevious", TD__SPLIT_MERGED_PREV},
               {"MergedWithNext", TD__SPLIT_MERGED_NEXT},
               {"Contiguous", TD__SPLIT_CONTIGUOUS}};
    for (size_t i = 0; i < TD_ARRAY_LEN(tab); i++)
        if (strcmp(s, tab[i].name) == 0) {
            *b = tab[i].b;
            return 0;
        }
    return td_err_set(TD_EPARSE, "%s: field \"%s.behavior\": unknown split behavior \"%s\"",
                      L->file, path, s);
}

static int push_pretok(td__ld_t *L, td__pretok_t *p)
{
    td_tokenizer_t *tok = L->tok;
    if (tok->npretok == TD__MAX_PRETOK) {
        if (p->re)
            pcre2_code_free(p->re);
        return td_err_set(TD_ENOTSUP, "%s: field \"pre_tokenizer\": more than %d steps", L->file,
                          TD__MAX_PRETOK);
    }
    td__pretok_t *n = td_reallocarray(tok->pretok, tok->npretok + 1, sizeof(*n));
    if (!n) {
        if (p->re)
            pcre2_code_free(p->re);
        return TD_ENOMEM;
    }
    tok->pretok = n;
    tok->pretok[tok->npretok++] = *p;
    return 0;
}

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* `last` says whether this is the final step; ByteLevel must be it. */
int td__parse_pretok(td__ld_t *L, json_object *p, const char *path, bool last, bool *have_bl)
{
    td_tokenizer_t *tok = L->tok;
    int rc = td__want_type(L, p, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = td__req_string(L, p, "type", path, &type, &tl)))
        return rc;
    if (*have_bl)
        return td_err_set(TD_ENOTSUP,
                          "%s: field \"%s\": pre-tokenizers after ByteLevel are not supported",
                          L->file, path);
    if (strcmp(type, "Sequence") == 0) {
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.pretokenizers", path);
        json_object *arr = td__tok_jget(p, "pretokenizers");
        if ((rc = td__want_type(L, arr, json_type_array, pp)))
            return rc;
        size_t n = json_object_array_length(arr);
        for (size_t i = 0; i < n; i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            if ((rc = td__parse_pretok(L, json_object_array_get_idx(arr, i), pi, last && i + 1 == n,
                                       have_bl)))
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        td__pretok_t st = {.kind = TD__PRETOK_SPLIT};
        if ((rc = parse_behavior(L, p, path, &st.behavior)) ||
            (rc = td__opt_bool(L, p, "invert", path, false, &st.invert)))
            return rc;
        json_object *pat = td__tok_jget(p, "pattern");
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.pattern", path);
        if ((rc = td__want_type(L, pat, json_type_object, pp)))
            return rc;
        json_object *re = td__tok_jget(pat, "Regex"), *str = td__tok_jget(pat, "String");
        char ppr[300];
        if (re) {
            snprintf(ppr, sizeof(ppr), "%s.Regex", pp);
            if ((rc = td__want_type(L, re, json_type_string, ppr)))
                return rc;
            st.re = regex_compile(L->file, ppr, json_object_get_string(re),
                                  (size_t)json_object_get_string_len(re));
            st.fast =
                td__fast_kind(json_object_get_string(re), (size_t)json_object_get_string_len(re));
        } else if (str) {
            snprintf(ppr, sizeof(ppr), "%s.String", pp);
            if ((rc = td__want_type(L, str, json_type_string, ppr)))
                return rc;
            td_buf_t b;
            td_buf_init(&b);
            if (regex_escape(json_object_get_string(str), (size_t)json_object_get_string_len(str),
                             &b)) {
                td_buf_free(&b);
                return TD_ENOMEM;
            }
            if (b.len == 0) /* an empty string never matches */
                td_buf_append_str(&b, "(?!)");
            st.re = regex_compile(L->file, ppr, b.data ? b.data : "", b.len);
            td_buf_free(&b);
        } else {
            return td_err_set(TD_EPARSE,
                              "%s: field \"%s\": expected {\"Regex\": ...} or {\"String\": ...}",
                              L->file, pp);
        }
        if (!st.re)
            return TD_EPARSE;
        return push_pretok(L, &st);
    }
    if (strcmp(type, "Digits") == 0) {
        td__pretok_t st = {.kind = TD__PRETOK_DIGITS};
        st.behavior = TD__SPLIT_ISOLATED;
        if ((rc = td__opt_bool(L, p, "individual_digits", path, false, &st.individual_digits)))
            return rc;
        if (!st.individual_digits)
            st.behavior = TD__SPLIT_CONTIGUOUS;
        return push_pretok(L, &st);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool use_regex, trim;
        if ((rc = td__opt_bool(L, p, "add_prefix_space", path, true, &tok->bl_prefix_space)) ||
            (rc = td__opt_bool(L, p, "use_regex", path, true, &use_regex)) ||
            (rc = td__opt_bool(L, p, "trim_offsets", path, true, &trim)))
            return rc;
        if (!last)
            return td_err_set(TD_ENOTSUP,
                              "%s: field \"%s\": ByteLevel must be the last pre-tokenizer", L->file,
                              path);
        if (use_regex) {
            char pp[256];
            snprintf(pp, sizeof(pp), "%s.use_regex", path);
            tok->bl_re = regex_compile(L->file, pp, gpt2_pattern, sizeof(gpt2_pattern) - 1);
            if (!tok->bl_re)
                return TD_EINTERNAL;
            tok->bl_fast = td__fast_kind(gpt2_pattern, sizeof(gpt2_pattern) - 1);
        }
        *have_bl = true;
        return 0;
    }
    return td_err_set(TD_ENOTSUP, "%s: field \"%s.type\": pre-tokenizer \"%s\" is not supported",
                      L->file, path, type);
}

/* After the pre-tokenizer: the class table of the hand matchers, when a step has one that reads
 * it. They are only faster, never required: without the table (out of memory) PCRE2 does it all. */
void td__pretok_fast_init(td__ld_t *L)
{
    td_tokenizer_t *tok = L->tok;
    bool need = tok->bl_fast != TD__FAST_NONE;
    for (size_t i = 0; i < tok->npretok; i++)
        need |= tok->pretok[i].fast != TD__FAST_NONE && tok->pretok[i].fast != TD__FAST_DS_CJK;
    if (!need)
        return;
    pcre2_code *cls[TD__FAST_NCLASS] = {0};
    int ok = 1;
    for (int k = 0; k < TD__FAST_NCLASS; k++) {
        const char *pat = td__fast_class_pat[k];
        ok &= (cls[k] = regex_compile(L->file, "pre_tokenizer", pat, strlen(pat))) != NULL;
    }
    if (!ok || td__fast_table(cls, &tok->fast_cls)) {
        td__fast_off(tok);
        td_err_clear();
    }
    for (int k = 0; k < TD__FAST_NCLASS; k++)
        if (cls[k])
            pcre2_code_free(cls[k]);
}

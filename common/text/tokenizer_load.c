/* tokenizer_load.c: reading tokenizer.json and tokenizer_config.json into a td_tokenizer_t.
 *
 * Every field is checked for its type; an error names the file and the field, in the dotted form
 * of the JSON path ("model.merges[12]", "pre_tokenizer.pretokenizers[1].pattern.Regex"). */
#include "td_error.h"
#include "td_log.h"
#include "tokenizer_impl.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#define ERRP(code, ...) td_err_set((code), __VA_ARGS__)

/* ---------------------------------------------------------------- arena and tables */

uint64_t td__hash(const void *p, size_t n)
{
    uint64_t h = XXH3_64bits(p, n);
    return h ? h : 1;
}

static int arena_add(td_tokenizer_t *tok, const void *p, size_t n, uint32_t *off)
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

static int strmap_init(td__strmap_t *m, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2)
        cap *= 2;
    m->ents = td_calloc(cap, sizeof(*m->ents));
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
static void strmap_put(td_tokenizer_t *tok, td__strmap_t *m, uint32_t off, uint32_t len, int32_t id)
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

static int mergemap_init(td__mergemap_t *m, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2)
        cap *= 2;
    m->ents = malloc(cap * sizeof(*m->ents));
    if (!m->ents)
        return TD_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        m->ents[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

static inline size_t merge_slot(uint64_t key, size_t mask)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* Later duplicates overwrite earlier ones, as HF's HashMap collect does. */
static void mergemap_put(td__mergemap_t *m, uint64_t key, uint32_t rank, int32_t id)
{
    for (size_t i = merge_slot(key, m->mask);; i = (i + 1) & m->mask) {
        struct td__merge_ent *e = &m->ents[i];
        if (e->key == UINT64_MAX) {
            *e = (struct td__merge_ent){.key = key, .rank = rank, .id = id};
            m->n++;
            return;
        }
        if (e->key == key) {
            e->rank = rank;
            e->id = id;
            return;
        }
    }
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 onwards. */
static void byte_level_init(td_tokenizer_t *tok)
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

/* Inverse map of byte_level_init for a code point, -1 when it is not a byte-level char. */
static int byte_of_char(uint32_t cp)
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

/* ---------------------------------------------------------------- JSON helpers */

typedef struct ld {
    td_tokenizer_t *tok;
    const char *file; /* file name for messages */
} ld_t;

static const char *jtype_name(json_object *o)
{
    return o ? json_type_to_name(json_object_get_type(o)) : "null";
}

/* Field `key` of object `o` (NULL if absent or JSON null). */
static json_object *jget(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v))
        return v;
    return NULL;
}

static int want_type(ld_t *L, json_object *v, json_type t, const char *field)
{
    if (!v || !json_object_is_type(v, t))
        return ERRP(TD_EPARSE, "%s: field \"%s\": expected %s, got %s", L->file, field,
                    json_type_to_name(t), jtype_name(v));
    return 0;
}

/* Optional boolean: absent/null gives `dflt`. */
static int opt_bool(ld_t *L, json_object *o, const char *key, const char *path, bool dflt,
                    bool *out)
{
    json_object *v = jget(o, key);
    *out = dflt;
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return ERRP(TD_EPARSE, "%s: field \"%s.%s\": expected boolean, got %s", L->file, path, key,
                    jtype_name(v));
    *out = json_object_get_boolean(v);
    return 0;
}

static int req_string(ld_t *L, json_object *o, const char *key, const char *path, const char **s,
                      size_t *n)
{
    json_object *v = jget(o, key);
    if (!v || !json_object_is_type(v, json_type_string))
        return ERRP(TD_EPARSE, "%s: field \"%s.%s\": expected string, got %s", L->file, path, key,
                    v ? jtype_name(v) : "nothing");
    *s = json_object_get_string(v);
    *n = (size_t)json_object_get_string_len(v);
    return 0;
}

static int parse_json(const char *file, const char *text, size_t len, json_object **out)
{
    if (len > INT32_MAX)
        return td_err_set(TD_EOVERFLOW, "%s: file too large (%zu bytes)", file, len);
    json_tokener *t = json_tokener_new_ex(64);
    if (!t)
        return TD_ENOMEM;
    json_object *o = json_tokener_parse_ex(t, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(t);
    if (!o && e == json_tokener_continue)
        e = json_tokener_error_parse_eof;
    if (!o || e != json_tokener_success) {
        int rc = td_err_set(TD_EPARSE, "%s: invalid JSON at byte %zu: %s", file,
                            json_tokener_get_parse_end(t), json_tokener_error_desc(e));
        json_object_put(o);
        json_tokener_free(t);
        return rc;
    }
    size_t end = json_tokener_get_parse_end(t);
    json_tokener_free(t);
    for (; end < len; end++) {
        char c = text[end];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            json_object_put(o);
            return td_err_set(TD_EPARSE, "%s: invalid JSON: trailing data at byte %zu", file, end);
        }
    }
    *out = o;
    return 0;
}

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

pcre2_code *td__regex_compile(const char *name, const char *what, const char *pat, size_t len)
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

static int parse_normalizer(ld_t *L, json_object *n, const char *path, int *flags)
{
    if (!n)
        return 0;
    int rc = want_type(L, n, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = req_string(L, n, "type", path, &type, &tl)))
        return rc;
    if (strcmp(type, "Sequence") == 0) {
        char p[256];
        snprintf(p, sizeof(p), "%s.normalizers", path);
        json_object *arr = jget(n, "normalizers");
        if ((rc = want_type(L, arr, json_type_array, p)))
            return rc;
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", p, i);
            if ((rc = parse_normalizer(L, json_object_array_get_idx(arr, i), pi, flags)))
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
        return ERRP(TD_ENOTSUP, "%s: field \"%s.type\": normalizer \"%s\" is not supported",
                    L->file, path, type);
    if (*flags && *flags != f)
        return ERRP(TD_ENOTSUP,
                    "%s: field \"%s\": only one Unicode normalization form is supported", L->file,
                    path);
    *flags = f;
    return 0;
}

static int parse_behavior(ld_t *L, json_object *o, const char *path, td__split_behavior_t *b)
{
    const char *s;
    size_t n;
    int rc = req_string(L, o, "behavior", path, &s, &n);
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
    return ERRP(TD_EPARSE, "%s: field \"%s.behavior\": unknown split behavior \"%s\"", L->file,
                path, s);
}

static int push_pretok(ld_t *L, td__pretok_t *p)
{
    td_tokenizer_t *tok = L->tok;
    if (tok->npretok == TD__MAX_PRETOK) {
        if (p->re)
            pcre2_code_free(p->re);
        return ERRP(TD_ENOTSUP, "%s: field \"pre_tokenizer\": more than %d steps", L->file,
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
static int parse_pretok(ld_t *L, json_object *p, const char *path, bool last, bool *have_bl)
{
    td_tokenizer_t *tok = L->tok;
    int rc = want_type(L, p, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = req_string(L, p, "type", path, &type, &tl)))
        return rc;
    if (*have_bl)
        return ERRP(TD_ENOTSUP,
                    "%s: field \"%s\": pre-tokenizers after ByteLevel are not supported", L->file,
                    path);
    if (strcmp(type, "Sequence") == 0) {
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.pretokenizers", path);
        json_object *arr = jget(p, "pretokenizers");
        if ((rc = want_type(L, arr, json_type_array, pp)))
            return rc;
        size_t n = json_object_array_length(arr);
        for (size_t i = 0; i < n; i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            if ((rc = parse_pretok(L, json_object_array_get_idx(arr, i), pi, last && i + 1 == n,
                                   have_bl)))
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        td__pretok_t st = {.kind = TD__PRETOK_SPLIT};
        if ((rc = parse_behavior(L, p, path, &st.behavior)) ||
            (rc = opt_bool(L, p, "invert", path, false, &st.invert)))
            return rc;
        json_object *pat = jget(p, "pattern");
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.pattern", path);
        if ((rc = want_type(L, pat, json_type_object, pp)))
            return rc;
        json_object *re = jget(pat, "Regex"), *str = jget(pat, "String");
        char ppr[300];
        if (re) {
            snprintf(ppr, sizeof(ppr), "%s.Regex", pp);
            if ((rc = want_type(L, re, json_type_string, ppr)))
                return rc;
            st.re = td__regex_compile(L->file, ppr, json_object_get_string(re),
                                      (size_t)json_object_get_string_len(re));
        } else if (str) {
            snprintf(ppr, sizeof(ppr), "%s.String", pp);
            if ((rc = want_type(L, str, json_type_string, ppr)))
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
            st.re = td__regex_compile(L->file, ppr, b.data ? b.data : "", b.len);
            td_buf_free(&b);
        } else {
            return ERRP(TD_EPARSE,
                        "%s: field \"%s\": expected {\"Regex\": ...} or {\"String\": ...}", L->file,
                        pp);
        }
        if (!st.re)
            return TD_EPARSE;
        return push_pretok(L, &st);
    }
    if (strcmp(type, "Digits") == 0) {
        td__pretok_t st = {.kind = TD__PRETOK_DIGITS};
        st.behavior = TD__SPLIT_ISOLATED;
        if ((rc = opt_bool(L, p, "individual_digits", path, false, &st.individual_digits)))
            return rc;
        if (!st.individual_digits)
            st.behavior = TD__SPLIT_CONTIGUOUS;
        return push_pretok(L, &st);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool use_regex, trim;
        if ((rc = opt_bool(L, p, "add_prefix_space", path, true, &tok->bl_prefix_space)) ||
            (rc = opt_bool(L, p, "use_regex", path, true, &use_regex)) ||
            (rc = opt_bool(L, p, "trim_offsets", path, true, &trim)))
            return rc;
        if (!last)
            return ERRP(TD_ENOTSUP, "%s: field \"%s\": ByteLevel must be the last pre-tokenizer",
                        L->file, path);
        if (use_regex) {
            char pp[256];
            snprintf(pp, sizeof(pp), "%s.use_regex", path);
            tok->bl_re = td__regex_compile(L->file, pp, gpt2_pattern, sizeof(gpt2_pattern) - 1);
            if (!tok->bl_re)
                return TD_EINTERNAL;
        }
        *have_bl = true;
        return 0;
    }
    return ERRP(TD_ENOTSUP, "%s: field \"%s.type\": pre-tokenizer \"%s\" is not supported", L->file,
                path, type);
}

/* ---------------------------------------------------------------- model */

/* Make ids[0..id] exist (new ones: no token), growing geometrically. */
static int ensure_id(td_tokenizer_t *tok, int64_t id)
{
    if ((size_t)id < tok->nids)
        return 0;
    static const td__idinfo_t none = {.tok_len = UINT32_MAX, .added = -1};
    size_t nn = (size_t)id + 1;
    if (nn > tok->ids_cap) {
        size_t cap = TD_MAX(nn, tok->ids_cap * 2);
        td__idinfo_t *ni = td_reallocarray(tok->ids, cap, sizeof(*ni));
        if (!ni)
            return TD_ENOMEM;
        tok->ids = ni;
        tok->ids_cap = cap;
    }
    for (size_t i = tok->nids; i < nn; i++)
        tok->ids[i] = none;
    tok->nids = nn;
    return 0;
}

static int add_model_token(ld_t *L, const char *s, size_t n, int64_t id, const char *key_for_msg)
{
    td_tokenizer_t *tok = L->tok;
    if (id < 0 || id >= INT32_MAX)
        return ERRP(TD_EPARSE, "%s: field \"model.vocab\": id %lld of token \"%s\" out of range",
                    L->file, (long long)id, key_for_msg);
    int rc = ensure_id(tok, id);
    if (rc)
        return rc;
    uint32_t off;
    rc = arena_add(tok, s, n, &off);
    if (rc)
        return rc;
    strmap_put(tok, &tok->vocab, off, (uint32_t)n, (int32_t)id);
    td__idinfo_t *ii = &tok->ids[id];
    ii->tok_off = off;
    ii->tok_len = (uint32_t)n;
    /* decoded bytes: the byte-level inverse when every char is a byte-level char, else the raw
     * text (HF ByteLevel decoder) */
    uint8_t tmp[1024];
    size_t nb = 0;
    bool all = n <= sizeof(tmp);
    for (size_t i = 0; all && i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)s + i, n - i);
        int b = l ? byte_of_char(td_utf8_decode((const uint8_t *)s + i, l)) : -1;
        if (b < 0)
            all = false;
        else
            tmp[nb++] = (uint8_t)b;
        i += l ? l : 1;
    }
    if (all) {
        if ((rc = arena_add(tok, tmp, nb, &ii->dec_off)))
            return rc;
        ii->dec_len = (uint32_t)nb;
    } else {
        ii->dec_off = off;
        ii->dec_len = (uint32_t)n;
    }
    return 0;
}

static int parse_merge(ld_t *L, json_object *m, size_t i, const char **a, size_t *an,
                       const char **b, size_t *bn)
{
    if (json_object_is_type(m, json_type_string)) {
        const char *s = json_object_get_string(m);
        size_t n = (size_t)json_object_get_string_len(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return ERRP(TD_EPARSE,
                        "%s: field \"model.merges[%zu]\": expected \"left right\", got \"%.80s\"",
                        L->file, i, s);
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = n - *an - 1;
        return 0;
    }
    if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
        json_object *x = json_object_array_get_idx(m, 0), *y = json_object_array_get_idx(m, 1);
        if (json_object_is_type(x, json_type_string) && json_object_is_type(y, json_type_string)) {
            *a = json_object_get_string(x);
            *an = (size_t)json_object_get_string_len(x);
            *b = json_object_get_string(y);
            *bn = (size_t)json_object_get_string_len(y);
            return 0;
        }
    }
    return ERRP(TD_EPARSE,
                "%s: field \"model.merges[%zu]\": expected \"a b\" or [\"a\", \"b\"], got %s",
                L->file, i, jtype_name(m));
}

static int parse_model(ld_t *L, json_object *m)
{
    td_tokenizer_t *tok = L->tok;
    int rc;
    if (!m)
        return ERRP(TD_EPARSE, "%s: field \"model\": missing", L->file);
    if ((rc = want_type(L, m, json_type_object, "model")))
        return rc;
    json_object *t = jget(m, "type");
    if (t && (!json_object_is_type(t, json_type_string) ||
              strcmp(json_object_get_string(t), "BPE") != 0))
        return ERRP(TD_ENOTSUP,
                    "%s: field \"model.type\": model \"%s\" is not supported (BPE only)", L->file,
                    json_object_get_string(t));
    json_object *dropout = jget(m, "dropout");
    if (dropout && !(json_object_is_type(dropout, json_type_double) ||
                     json_object_is_type(dropout, json_type_int)))
        return ERRP(TD_EPARSE, "%s: field \"model.dropout\": expected number, got %s", L->file,
                    jtype_name(dropout));
    if (dropout && json_object_get_double(dropout) > 0.0)
        return ERRP(TD_ENOTSUP, "%s: field \"model.dropout\": BPE dropout is not supported",
                    L->file);
    bool byte_fallback, fuse_unk;
    if ((rc = opt_bool(L, m, "byte_fallback", "model", false, &byte_fallback)) ||
        (rc = opt_bool(L, m, "fuse_unk", "model", false, &fuse_unk)) ||
        (rc = opt_bool(L, m, "ignore_merges", "model", false, &tok->ignore_merges)))
        return rc;
    if (byte_fallback)
        return ERRP(TD_ENOTSUP, "%s: field \"model.byte_fallback\": not supported", L->file);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        json_object *v = jget(m, affixes[i]);
        if (v && (!json_object_is_type(v, json_type_string) || json_object_get_string_len(v) != 0))
            return ERRP(TD_ENOTSUP, "%s: field \"model.%s\": only null or \"\" is supported",
                        L->file, affixes[i]);
    }
    json_object *vocab = jget(m, "vocab");
    if ((rc = want_type(L, vocab, json_type_object, "model.vocab")))
        return rc;
    size_t nv = (size_t)json_object_object_length(vocab);
    if ((rc = strmap_init(&tok->vocab, nv)))
        return rc;
    json_object_object_foreach(vocab, key, val)
    {
        if (!json_object_is_type(val, json_type_int))
            return ERRP(TD_EPARSE,
                        "%s: field \"model.vocab\": id of token \"%s\": expected int, got %s",
                        L->file, key, jtype_name(val));
        /* keys come from json-c's hash: their length is strlen, which is exact for vocab tokens
         * since the byte-level alphabet has no NUL */
        if ((rc = add_model_token(L, key, strlen(key), json_object_get_int64(val), key)))
            return rc;
    }
    tok->model_vocab_n = tok->vocab.n;

    json_object *merges = jget(m, "merges");
    if (merges && (rc = want_type(L, merges, json_type_array, "model.merges")))
        return rc;
    size_t nm = merges ? json_object_array_length(merges) : 0;
    if ((rc = mergemap_init(&tok->merges, nm)))
        return rc;
    td_buf_t cat;
    td_buf_init(&cat);
    for (size_t i = 0; i < nm; i++) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if ((rc = parse_merge(L, json_object_array_get_idx(merges, i), i, &a, &an, &b, &bn)))
            break;
        int32_t ia = td__strmap_get(tok, &tok->vocab, a, an);
        int32_t ib = td__strmap_get(tok, &tok->vocab, b, bn);
        td_buf_reset(&cat);
        if ((rc = td_buf_append(&cat, a, an)) || (rc = td_buf_append(&cat, b, bn)))
            break;
        int32_t ic = td__strmap_get(tok, &tok->vocab, cat.data, cat.len);
        if (ia < 0 || ib < 0 || ic < 0) {
            rc = ERRP(TD_EPARSE,
                      "%s: field \"model.merges[%zu]\": token \"%.*s\" is not in model.vocab",
                      L->file, i,
                      (int)TD_MIN(ia < 0   ? an
                                  : ib < 0 ? bn
                                           : cat.len,
                                  200),
                      ia < 0   ? a
                      : ib < 0 ? b
                               : cat.data);
            break;
        }
        mergemap_put(&tok->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, (uint32_t)i, ic);
    }
    td_buf_free(&cat);
    if (rc)
        return rc;

    tok->unk_id = -1;
    json_object *unk = jget(m, "unk_token");
    if (unk) {
        if ((rc = want_type(L, unk, json_type_string, "model.unk_token")))
            return rc;
        tok->unk_id = td__strmap_get(tok, &tok->vocab, json_object_get_string(unk),
                                     (size_t)json_object_get_string_len(unk));
    }
    for (int b = 0; b < 256; b++)
        tok->byte_id[b] =
            td__strmap_get(tok, &tok->vocab, tok->byte_char[b], tok->byte_char_len[b]);
    return 0;
}

/* ---------------------------------------------------------------- added tokens */

static int trie_node(td__trie_t *t, uint8_t byte)
{
    if (t->nnodes == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        struct td__trie_node *n = td_reallocarray(t->nodes, cap, sizeof(*n));
        if (!n)
            return TD_ENOMEM;
        t->nodes = n;
        t->cap = cap;
    }
    t->nodes[t->nnodes] = (struct td__trie_node){-1, -1, -1, byte};
    return (int)t->nnodes++;
}

static int trie_insert(td__trie_t *t, const uint8_t *s, size_t n, int32_t added)
{
    if (!t->nnodes && trie_node(t, 0) < 0)
        return TD_ENOMEM;
    if (!n)
        return 0;
    t->first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[cur].first_child, prev = -1;
        while (c >= 0 && t->nodes[c].byte != s[i]) {
            prev = c;
            c = t->nodes[c].next_sibling;
        }
        if (c < 0) {
            int nn = trie_node(t, s[i]);
            if (nn < 0)
                return TD_ENOMEM;
            c = nn;
            if (prev < 0)
                t->nodes[cur].first_child = c;
            else
                t->nodes[prev].next_sibling = c;
        }
        cur = c;
    }
    if (t->nodes[cur].added < 0) /* the first pattern wins among equal strings */
        t->nodes[cur].added = added;
    return 0;
}

static int normalize_str(int flags, const char *s, size_t n, td_buf_t *out)
{
    if (!flags)
        return td_buf_append(out, s, n);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)flags);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM ? TD_ENOMEM : TD_EINVAL;
    int rc = td_buf_append(out, dst, (size_t)r);
    free(dst);
    return rc;
}

static int parse_added(ld_t *L, json_object *arr)
{
    td_tokenizer_t *tok = L->tok;
    int rc;
    if (arr && (rc = want_type(L, arr, json_type_array, "added_tokens")))
        return rc;
    size_t n = arr ? json_object_array_length(arr) : 0;
    tok->added = td_calloc(n ? n : 1, sizeof(*tok->added));
    if (!tok->added || (rc = strmap_init(&tok->added_map, n)))
        return TD_ENOMEM;
    td_buf_t nb;
    td_buf_init(&nb);
    for (size_t i = 0; i < n && !rc; i++) {
        json_object *a = json_object_array_get_idx(arr, i);
        char path[64];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        if ((rc = want_type(L, a, json_type_object, path)))
            break;
        td__added_t at = {0};
        const char *content;
        size_t clen;
        json_object *jid = jget(a, "id");
        if (!jid || !json_object_is_type(jid, json_type_int)) {
            rc = ERRP(TD_EPARSE, "%s: field \"%s.id\": expected int, got %s", L->file, path,
                      jid ? jtype_name(jid) : "nothing");
            break;
        }
        if ((rc = req_string(L, a, "content", path, &content, &clen)) ||
            (rc = opt_bool(L, a, "special", path, false, &at.special)) ||
            (rc = opt_bool(L, a, "lstrip", path, false, &at.lstrip)) ||
            (rc = opt_bool(L, a, "rstrip", path, false, &at.rstrip)) ||
            (rc = opt_bool(L, a, "single_word", path, false, &at.single_word)) ||
            (rc = opt_bool(L, a, "normalized", path, !at.special, &at.normalized)))
            break;
        if (!clen)
            continue;                   /* HF ignores empty tokens */
        for (size_t k = 0; k < clen;) { /* raw invalid bytes: HF (serde) rejects them too */
            size_t l = td_utf8_valid_len((const uint8_t *)content + k, clen - k);
            if (!l) {
                rc = ERRP(TD_EPARSE, "%s: field \"%s.content\": not valid UTF-8", L->file, path);
                break;
            }
            k += l;
        }
        if (rc)
            break;
        /* HF's id assignment: an existing added/vocab token keeps its id, a new one takes the
         * next id past the model vocabulary. The file's "id" is only checked. */
        int32_t ai = td__strmap_get(tok, &tok->added_map, content, clen);
        int32_t id = ai >= 0 ? tok->added[ai].id : td__strmap_get(tok, &tok->vocab, content, clen);
        if (id < 0) {
            int64_t max = -1;
            for (size_t k = 0; k < tok->nadded; k++)
                max = TD_MAX(max, (int64_t)tok->added[k].id);
            int64_t vs = (int64_t)tok->model_vocab_n;
            id = (int32_t)(max < 0 ? vs : (max >= vs || vs == 0) ? max + 1 : vs);
        }
        if (json_object_get_int64(jid) != id)
            TD_LOG_W(
                "%s: added token \"%s\" has id %lld in the file, but HF tokenizers assigns %d; "
                "using %d",
                L->file, content, (long long)json_object_get_int64(jid), id, id);
        at.id = id;
        if ((rc = arena_add(tok, content, clen, &at.off)))
            break;
        at.len = (uint32_t)clen;
        td_buf_reset(&nb);
        if ((rc = normalize_str(tok->norm_utf8proc, content, clen, &nb)) ||
            (rc = arena_add(tok, nb.data ? nb.data : "", nb.len, &at.noff)))
            break;
        at.nlen = (uint32_t)nb.len;
        size_t idx;
        if (ai >= 0) {
            idx = (size_t)ai; /* same content again: the later entry's flags win */
        } else {
            idx = tok->nadded++;
            strmap_put(tok, &tok->added_map, at.off, at.len, (int32_t)idx);
        }
        tok->added[idx] = at;
        if ((rc = ensure_id(tok, id)))
            break;
        td__idinfo_t *ii = &tok->ids[id];
        ii->added = (int32_t)idx;
        ii->tok_off = at.off; /* HF's id_to_token looks at added tokens first */
        ii->tok_len = at.len;
    }
    td_buf_free(&nb);
    if (rc)
        return rc;
    /* HF's order: special tokens, then the others; each partitioned by `normalized` */
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < tok->nadded; k++) {
            td__added_t *at = &tok->added[k];
            if (at->special != (pass == 0))
                continue;
            td__trie_t *t = at->normalized ? &tok->trie_norm : &tok->trie_raw;
            const char *s = tok->arena + (at->normalized ? at->noff : at->off);
            size_t sl = at->normalized ? at->nlen : at->len;
            if ((rc = trie_insert(t, (const uint8_t *)s, sl, (int32_t)k)))
                return rc;
        }
    return 0;
}

/* ---------------------------------------------------------------- post-processor */

static int push_ids(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *a = td_reallocarray(*arr, *n + 1, sizeof(int32_t));
    if (!a)
        return TD_ENOMEM;
    a[(*n)++] = id;
    *arr = a;
    return 0;
}

static int parse_post(ld_t *L, json_object *p, const char *path)
{
    td_tokenizer_t *tok = L->tok;
    if (!p)
        return 0;
    int rc = want_type(L, p, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = req_string(L, p, "type", path, &type, &tl)))
        return rc;
    char pp[256];
    if (strcmp(type, "ByteLevel") == 0)
        return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        snprintf(pp, sizeof(pp), "%s.processors", path);
        json_object *arr = jget(p, "processors");
        if ((rc = want_type(L, arr, json_type_array, pp)))
            return rc;
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            if ((rc = parse_post(L, json_object_array_get_idx(arr, i), pi)))
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        int32_t ids[2];
        static const char *const keys[] = {"cls", "sep"};
        for (int k = 0; k < 2; k++) {
            json_object *v = jget(p, keys[k]);
            snprintf(pp, sizeof(pp), "%s.%s", path, keys[k]);
            if (!v || !json_object_is_type(v, json_type_array) ||
                json_object_array_length(v) != 2 ||
                !json_object_is_type(json_object_array_get_idx(v, 1), json_type_int))
                return ERRP(TD_EPARSE, "%s: field \"%s\": expected [\"token\", id]", L->file, pp);
            ids[k] = json_object_get_int(json_object_array_get_idx(v, 1));
        }
        if ((rc = push_ids(&tok->prefix, &tok->nprefix, ids[0])))
            return rc;
        return push_ids(&tok->suffix, &tok->nsuffix, ids[1]);
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        snprintf(pp, sizeof(pp), "%s.single", path);
        json_object *single = jget(p, "single"), *sp = jget(p, "special_tokens");
        if ((rc = want_type(L, single, json_type_array, pp)))
            return rc;
        bool seen_seq = false;
        for (size_t i = 0; i < json_object_array_length(single); i++) {
            json_object *piece = json_object_array_get_idx(single, i);
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            json_object *st = jget(piece, "SpecialToken"), *seq = jget(piece, "Sequence");
            if (seq) {
                if (seen_seq)
                    return ERRP(TD_ENOTSUP,
                                "%s: field \"%s\": more than one sequence in a template", L->file,
                                pi);
                seen_seq = true;
                continue;
            }
            const char *name;
            size_t nl;
            if (!st || (rc = req_string(L, st, "id", pi, &name, &nl)))
                return rc ? rc
                          : ERRP(TD_EPARSE, "%s: field \"%s\": expected SpecialToken or Sequence",
                                 L->file, pi);
            json_object *def = jget(sp, name), *ids = jget(def, "ids");
            if (!ids || !json_object_is_type(ids, json_type_array))
                return ERRP(TD_EPARSE, "%s: field \"%s.special_tokens\": no ids for \"%s\"",
                            L->file, path, name);
            for (size_t k = 0; k < json_object_array_length(ids); k++) {
                json_object *v = json_object_array_get_idx(ids, k);
                if (!json_object_is_type(v, json_type_int))
                    return ERRP(TD_EPARSE,
                                "%s: field \"%s.special_tokens.%s.ids[%zu]\": expected int",
                                L->file, path, name, k);
                if ((rc = push_ids(seen_seq ? &tok->suffix : &tok->prefix,
                                   seen_seq ? &tok->nsuffix : &tok->nprefix,
                                   json_object_get_int(v))))
                    return rc;
            }
        }
        return 0;
    }
    return ERRP(TD_ENOTSUP, "%s: field \"%s.type\": post-processor \"%s\" is not supported",
                L->file, path, type);
}

/* ---------------------------------------------------------------- tokenizer_config.json */

/* bos_token and friends: a string, or {"content": ...} (AddedToken form), or null. */
static int config_token(ld_t *L, json_object *cfg, const char *key, int32_t *id)
{
    td_tokenizer_t *tok = L->tok;
    json_object *v = jget(cfg, key);
    *id = -1;
    if (!v)
        return 0;
    if (json_object_is_type(v, json_type_object))
        v = jget(v, "content");
    if (!v || !json_object_is_type(v, json_type_string))
        return ERRP(TD_EPARSE, "%s: field \"%s\": expected string or {\"content\": string}",
                    L->file, key);
    *id = td_tokenizer_token_to_id(tok, json_object_get_string(v),
                                   (size_t)json_object_get_string_len(v));
    return 0;
}

static int parse_config(ld_t *L, json_object *cfg)
{
    td_tokenizer_t *tok = L->tok;
    int rc = want_type(L, cfg, json_type_object, "(top level)");
    if (rc)
        return rc;
    if ((rc = config_token(L, cfg, "bos_token", &tok->bos_id)) ||
        (rc = config_token(L, cfg, "eos_token", &tok->eos_id)) ||
        (rc = config_token(L, cfg, "pad_token", &tok->pad_id)) ||
        (rc = config_token(L, cfg, "unk_token", &tok->cfg_unk_id)) ||
        (rc = opt_bool(L, cfg, "split_special_tokens", "(top level)", false, &tok->split_special)))
        return rc;
    /* transformers rebuilds the post-processor from add_bos_token / add_eos_token when the config
     * sets them (LlamaTokenizerFast and newer generic backends): [bos] $A [eos]. */
    json_object *ab = jget(cfg, "add_bos_token"), *ae = jget(cfg, "add_eos_token");
    if (!ab && !ae)
        return 0;
    bool add_bos, add_eos;
    if ((rc = opt_bool(L, cfg, "add_bos_token", "(top level)", false, &add_bos)) ||
        (rc = opt_bool(L, cfg, "add_eos_token", "(top level)", false, &add_eos)))
        return rc;
    if (add_bos && tok->bos_id < 0)
        return ERRP(TD_EPARSE, "%s: field \"add_bos_token\": true, but bos_token is not a token",
                    L->file);
    if (add_eos && tok->eos_id < 0)
        return ERRP(TD_EPARSE, "%s: field \"add_eos_token\": true, but eos_token is not a token",
                    L->file);
    tok->nprefix = tok->nsuffix = 0;
    if (add_bos && (rc = push_ids(&tok->prefix, &tok->nprefix, tok->bos_id)))
        return rc;
    if (add_eos && (rc = push_ids(&tok->suffix, &tok->nsuffix, tok->eos_id)))
        return rc;
    return 0;
}

static int parse_decoder(ld_t *L, json_object *d, const char *path)
{
    if (!d)
        return ERRP(TD_ENOTSUP, "%s: field \"%s\": missing (a ByteLevel decoder is required)",
                    L->file, path);
    int rc = want_type(L, d, json_type_object, path);
    const char *type;
    size_t tl;
    if (rc || (rc = req_string(L, d, "type", path, &type, &tl)))
        return rc;
    if (strcmp(type, "ByteLevel") == 0)
        return 0;
    if (strcmp(type, "Sequence") == 0) {
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.decoders", path);
        json_object *arr = jget(d, "decoders");
        if ((rc = want_type(L, arr, json_type_array, pp)))
            return rc;
        if (json_object_array_length(arr) != 1)
            return ERRP(TD_ENOTSUP,
                        "%s: field \"%s\": only a single ByteLevel decoder is supported", L->file,
                        pp);
        snprintf(pp, sizeof(pp), "%s.decoders[0]", path);
        return parse_decoder(L, json_object_array_get_idx(arr, 0), pp);
    }
    return ERRP(TD_ENOTSUP, "%s: field \"%s.type\": decoder \"%s\" is not supported", L->file, path,
                type);
}

/* ---------------------------------------------------------------- entry points */

static int load_json(td_tokenizer_t *tok, json_object *root, json_object *cfg, const char *cfg_name)
{
    ld_t L = {.tok = tok, .file = tok->name};
    int rc = want_type(&L, root, json_type_object, "(top level)");
    if (rc)
        return rc;
    byte_level_init(tok);
    tok->bos_id = tok->eos_id = tok->pad_id = tok->cfg_unk_id = tok->unk_id = -1;
    json_object *trunc = jget(root, "truncation"), *pad = jget(root, "padding");
    if (trunc)
        return ERRP(TD_ENOTSUP, "%s: field \"truncation\": not supported (must be null)", L.file);
    if (pad)
        return ERRP(TD_ENOTSUP, "%s: field \"padding\": not supported (must be null)", L.file);
    if ((rc = parse_normalizer(&L, jget(root, "normalizer"), "normalizer", &tok->norm_utf8proc)))
        return rc;
    json_object *pt = jget(root, "pre_tokenizer");
    bool have_bl = false;
    if (pt && (rc = parse_pretok(&L, pt, "pre_tokenizer", true, &have_bl)))
        return rc;
    if (!have_bl)
        return ERRP(TD_ENOTSUP,
                    "%s: field \"pre_tokenizer\": a ByteLevel pre-tokenizer is required "
                    "(byte-level BPE only)",
                    L.file);
    if ((rc = parse_model(&L, jget(root, "model"))))
        return rc;
    if ((rc = parse_added(&L, jget(root, "added_tokens"))))
        return rc;
    if ((rc = parse_post(&L, jget(root, "post_processor"), "post_processor")))
        return rc;
    if ((rc = parse_decoder(&L, jget(root, "decoder"), "decoder")))
        return rc;
    for (size_t i = 0; i < tok->nprefix; i++)
        if (tok->prefix[i] < 0 || (size_t)tok->prefix[i] >= tok->nids)
            return ERRP(TD_EPARSE, "%s: field \"post_processor\": id %d is not in the vocabulary",
                        L.file, tok->prefix[i]);
    for (size_t i = 0; i < tok->nsuffix; i++)
        if (tok->suffix[i] < 0 || (size_t)tok->suffix[i] >= tok->nids)
            return ERRP(TD_EPARSE, "%s: field \"post_processor\": id %d is not in the vocabulary",
                        L.file, tok->suffix[i]);
    if (cfg) {
        ld_t C = {.tok = tok, .file = cfg_name};
        if ((rc = parse_config(&C, cfg)))
            return rc;
    }
    return 0;
}

static td_tokenizer_t *tok_new(const char *name)
{
    td_tokenizer_t *tok = td_calloc(1, sizeof(*tok));
    if (!tok)
        return NULL;
    tok->name = td_strdup(name ? name : "tokenizer.json");
    if (!tok->name || pthread_mutex_init(&tok->pool_lock, NULL)) {
        free(tok->name);
        free(tok);
        return NULL;
    }
    return tok;
}

static int load_common(const char *json, size_t len, const char *config, size_t config_len,
                       const char *name, const char *cfg_name, td_tokenizer_t **out)
{
    *out = NULL;
    td_tokenizer_t *tok = tok_new(name);
    if (!tok)
        return TD_ENOMEM;
    json_object *root = NULL, *cfg = NULL;
    int rc = parse_json(tok->name, json, len, &root);
    if (rc)
        goto err_free;
    if (config && (rc = parse_json(cfg_name, config, config_len, &cfg)))
        goto err_free;
    if ((rc = load_json(tok, root, cfg, cfg_name)))
        goto err_free;
    json_object_put(root);
    json_object_put(cfg);
    *out = tok;
    return 0;

err_free:
    json_object_put(root);
    json_object_put(cfg);
    td_tokenizer_free(tok);
    return rc;
}

int td_tokenizer_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                          const char *name, td_tokenizer_t **out)
{
    char cname[512];
    snprintf(cname, sizeof(cname), "%s (tokenizer_config.json)", name ? name : "tokenizer.json");
    return load_common(json, len, config, config_len, name, cname, out);
}

int td_tokenizer_load(const char *path, td_tokenizer_t **out)
{
    *out = NULL;
    if (!path || !*path)
        return td_err_set(TD_EINVAL, "tokenizer: empty path");
    td_buf_t file, cfgp;
    td_buf_init(&file);
    td_buf_init(&cfgp);
    char *json = NULL, *cfg = NULL;
    size_t jlen = 0, clen = 0;
    int rc;
    size_t pl = strlen(path);
    bool is_json = pl >= 5 && strcmp(path + pl - 5, ".json") == 0;
    if (is_json) {
        rc = td_buf_append_str(&file, path);
        const char *slash = strrchr(path, '/');
        rc = rc ? rc : slash ? td_buf_append(&cfgp, path, (size_t)(slash - path) + 1) : 0;
    } else {
        rc = td_buf_printf(&file, "%s/tokenizer.json", path);
        rc = rc ? rc : td_buf_printf(&cfgp, "%s/", path);
    }
    rc = rc ? rc : td_buf_append_str(&cfgp, "tokenizer_config.json");
    if (rc)
        goto out;
    if ((rc = td_file_read_all(file.data, &json, &jlen)))
        goto out;
    int crc = td_file_read_all(cfgp.data, &cfg, &clen);
    if (crc == TD_ENOENT) {
        cfg = NULL;
    } else if (crc) {
        rc = crc;
        goto out;
    }
    td_err_clear();
    rc = load_common(json, jlen, cfg, clen, file.data, cfgp.data, out);
out:
    free(json);
    free(cfg);
    td_buf_free(&file);
    td_buf_free(&cfgp);
    return rc;
}

void td_tokenizer_free(td_tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->npool; i++)
        td__scratch_free(tok->pool[i]);
    pthread_mutex_destroy(&tok->pool_lock);
    for (size_t i = 0; i < tok->npretok; i++)
        if (tok->pretok[i].re)
            pcre2_code_free(tok->pretok[i].re);
    if (tok->bl_re)
        pcre2_code_free(tok->bl_re);
    free(tok->pretok);
    free(tok->prefix);
    free(tok->suffix);
    free(tok->added);
    free(tok->added_map.ents);
    free(tok->trie_raw.nodes);
    free(tok->trie_norm.nodes);
    free(tok->vocab.ents);
    free(tok->merges.ents);
    free(tok->ids);
    free(tok->arena);
    free(tok->name);
    free(tok);
}

/* jinja_filters.c: Jinja2's filters and tests, transformers' globals (raise_exception,
 * strftime_now) and Jinja's (range, namespace, dict), with Python's semantics.
 *
 * Filters: abs attr capitalize count default d dictsort e escape first float format indent int
 * items join last length list lower map max min reject rejectattr replace reverse round safe
 * select selectattr sort string sum title tojson trim unique upper wordcount.
 * The tests are in jinja_tests.c.
 * The str, dict and list methods are in jinja_methods.c. */
#include "jinja_impl.h"

#include "td_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- argument helpers ------------------------------------------------------------------------ */

/* Argument `i` (positional) or `name` (keyword), else `def`. */
static jv_t arg(const jv_t *args, size_t n, jdict_t *kw, size_t i, const char *name, jv_t def)
{
    jv_t v;
    if (i < n)
        return args[i];
    if (kw && td__jdict_get_str(kw, name, strlen(name), &v))
        return v;
    return def;
}

static jv_t str_of(jr_t *r, jv_t v)
{
    return td__jv_to_str(&r->ar, v);
}

static jv_t mklist(jr_t *r, bool gen)
{
    jv_t l = td__jv_list(&r->ar, 0);
    l.u.l->gen = gen;
    return l;
}

/* ---- text ------------------------------------------------------------------------------------ */

/* Python's str.strip(chars) family; chars NULL: whitespace. which: 1 left, 2 right, 3 both. */
static jv_t py_strip(jr_t *r, const jstr_t *s, const jstr_t *chars, int which)
{
    size_t b = 0, e = s->n;
    while (b < e && (which & 1)) {
        size_t k = td_utf8_valid_len((const uint8_t *)s->p + b, e - b);
        if (k == 0)
            k = 1;
        uint32_t cp = td_utf8_decode((const uint8_t *)s->p + b, k);
        bool strip = chars ? memmem(chars->p, chars->n, s->p + b, k) != NULL && k > 0
                           : td__py_isspace(cp);
        if (!strip)
            break;
        b += k;
    }
    while (e > b && (which & 2)) {
        size_t k = 1;
        while (k < 4 && k < e - b && ((unsigned char)s->p[e - k] & 0xC0) == 0x80)
            k++;
        uint32_t cp = td_utf8_decode((const uint8_t *)s->p + e - k, k);
        bool strip = chars ? memmem(chars->p, chars->n, s->p + e - k, k) != NULL
                           : td__py_isspace(cp);
        if (!strip)
            break;
        e -= k;
    }
    return td__jv_str(&r->ar, s->p + b, e - b);
}

jv_t td__jr_strip(jr_t *r, const jstr_t *s, const jstr_t *chars, int which)
{
    return py_strip(r, s, chars, which);
}


static jv_t do_replace(jr_t *r, const jstr_t *s, const jstr_t *old, const jstr_t *new_,
                       int64_t count)
{
    jbuf_t b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) { /* Python inserts `new` between every character and at both ends */
        size_t cps = td__utf8_count(s->p, s->n);
        for (size_t c = 0; c <= cps; c++) {
            if (count < 0 || done < count) {
                td__jbuf_put(&r->ar, &b, new_->p, new_->n);
                done++;
            }
            if (c < cps) {
                size_t o = td__utf8_offset(s->p, s->n, c), e = td__utf8_offset(s->p, s->n, c + 1);
                td__jbuf_put(&r->ar, &b, s->p + o, e - o);
            }
        }
        return td__jbuf_str(&r->ar, &b);
    }
    while (i < s->n) {
        const char *hit = count >= 0 && done >= count
                              ? NULL
                              : memmem(s->p + i, s->n - i, old->p, old->n);
        if (!hit) {
            td__jbuf_put(&r->ar, &b, s->p + i, s->n - i);
            break;
        }
        td__jbuf_put(&r->ar, &b, s->p + i, (size_t)(hit - (s->p + i)));
        td__jbuf_put(&r->ar, &b, new_->p, new_->n);
        i = (size_t)(hit - s->p) + old->n;
        done++;
    }
    return td__jbuf_str(&r->ar, &b);
}

jv_t td__jr_replace(jr_t *r, const jstr_t *s, const jstr_t *old, const jstr_t *new_,
                    int64_t count)
{
    return do_replace(r, s, old, new_, count);
}

/* Python's str.splitlines() boundaries. */
static size_t line_break_len(const char *p, size_t n)
{
    unsigned char c = (unsigned char)p[0];
    if (c == '\r')
        return n > 1 && p[1] == '\n' ? 2 : 1;
    if (c == '\n' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E))
        return 1;
    if (n >= 2 && c == 0xC2 && (unsigned char)p[1] == 0x85)
        return 2;
    if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x80 &&
        ((unsigned char)p[2] == 0xA8 || (unsigned char)p[2] == 0xA9))
        return 3;
    return 0;
}

jlist_t *td__jr_splitlines(jr_t *r, const jstr_t *s)
{
    jv_t l = td__jv_list(&r->ar, 0);
    size_t start = 0;
    for (size_t i = 0; i < s->n;) {
        size_t k = line_break_len(s->p + i, s->n - i);
        if (k) {
            td__jlist_push(&r->ar, l.u.l, td__jv_str(&r->ar, s->p + start, i - start));
            i += k;
            start = i;
        } else {
            i++;
        }
    }
    if (start < s->n)
        td__jlist_push(&r->ar, l.u.l, td__jv_str(&r->ar, s->p + start, s->n - start));
    return l.u.l;
}

static jv_t do_indent(jr_t *r, const jstr_t *s, jv_t width, bool first, bool blank)
{
    jbuf_t ind = {0}, b = {0};
    if (width.t == JV_STR) {
        td__jbuf_put(&r->ar, &ind, width.u.s->p, width.u.s->n);
    } else if (width.t == JV_INT || width.t == JV_BOOL) { /* " " * width */
        int64_t w = width.t == JV_INT ? width.u.i : width.u.b;
        if (w > 4096)
            td__jr_fail(r, NULL, TD_ERANGE, "indent width %lld too large", (long long)w);
        for (int64_t i = 0; i < w; i++)
            td__jbuf_putc(&r->ar, &ind, ' ');
    } else {
        td__jr_type_error(r, NULL, "indent width must be an int or a str", width);
    }
    jbuf_t src = {0};
    td__jbuf_put(&r->ar, &src, s->p, s->n);
    td__jbuf_putc(&r->ar, &src, '\n');
    jlist_t *lines = td__jr_splitlines(r, td__jbuf_str(&r->ar, &src).u.s);
    if (first)
        td__jbuf_put(&r->ar, &b, ind.p, ind.n);
    for (size_t i = 0; i < lines->n; i++) {
        const jstr_t *ln = lines->v[i].u.s;
        if (i > 0) {
            td__jbuf_putc(&r->ar, &b, '\n');
            if (blank || ln->n > 0)
                td__jbuf_put(&r->ar, &b, ind.p, ind.n);
        }
        td__jbuf_put(&r->ar, &b, ln->p, ln->n);
    }
    return td__jbuf_str(&r->ar, &b);
}

/* printf-style `fmt % args` for %s %r %d %i %f %% (what templates use). */
static jv_t percent_format(jr_t *r, const node_t *at, const jstr_t *fmt, const jv_t *args,
                           size_t n)
{
    jbuf_t b = {0};
    size_t used = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char c = fmt->p[i];
        if (c != '%' || i + 1 >= fmt->n) {
            td__jbuf_putc(&r->ar, &b, c);
            continue;
        }
        char k = fmt->p[++i];
        if (k == '%') {
            td__jbuf_putc(&r->ar, &b, '%');
            continue;
        }
        if (used >= n)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: not enough arguments for format string");
        jv_t v = args[used++];
        char tmp[64];
        if (k == 's') {
            td__jv_str_to(&r->ar, &b, v);
        } else if (k == 'r') {
            td__jv_repr_to(&r->ar, &b, v);
        } else if ((k == 'd' || k == 'i') && (v.t == JV_INT || v.t == JV_BOOL || v.t == JV_FLOAT)) {
            snprintf(tmp, sizeof(tmp), "%lld",
                     (long long)(v.t == JV_FLOAT ? (int64_t)v.u.f : v.t == JV_INT ? v.u.i : v.u.b));
            td__jbuf_put(&r->ar, &b, tmp, strlen(tmp));
        } else if (k == 'f' && (v.t == JV_INT || v.t == JV_BOOL || v.t == JV_FLOAT)) {
            snprintf(tmp, sizeof(tmp), "%f",
                     v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_INT ? v.u.i : v.u.b));
            td__jbuf_put(&r->ar, &b, tmp, strlen(tmp));
        } else {
            td__jr_fail(r, at, TD_ENOTSUP, "format: conversion '%%%c' is not supported", k);
        }
    }
    if (used < n)
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: not all arguments converted during string formatting");
    return td__jbuf_str(&r->ar, &b);
}

jv_t td__jr_percent(jr_t *r, const node_t *at, const jstr_t *fmt, jv_t args)
{
    if (args.t == JV_LIST && args.u.l->tuple)
        return percent_format(r, at, fmt, args.u.l->v, args.u.l->n);
    return percent_format(r, at, fmt, &args, 1);
}

/* ---- attribute paths (selectattr, map, sort, join, sum) -------------------------------------- */

static jv_t attr_path(jr_t *r, const node_t *at, jv_t item, jv_t path)
{
    if (path.t == JV_INT)
        return td__jr_getitem(r, at, item, path);
    const jstr_t *s = str_of(r, path).u.s;
    size_t b = 0;
    for (size_t i = 0; i <= s->n; i++) {
        if (i < s->n && s->p[i] != '.')
            continue;
        jv_t part = td__jv_str(&r->ar, s->p + b, i - b);
        int64_t idx;
        if (td_parse_i64(part.u.s->p, &idx) == 0 && part.u.s->n > 0)
            part = td__jv_int(idx);
        item = td__jr_getitem(r, at, item, part);
        b = i + 1;
    }
    return item;
}

/* ---- filters --------------------------------------------------------------------------------- */

static const char *const filter_names[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper",
    "wordcount"};

/* Python signatures of the filters after the value: positional-or-keyword names in order, how
 * many are required; variadic ones (format, map, select...) take anything. */
static const struct fsig {
    const char *name;
    const char *params[5];
    int required;
    bool variadic;
} fsigs[] = {
    {"attr", {"name"}, 1, false},
    {"d", {"default_value", "boolean"}, 0, false},
    {"default", {"default_value", "boolean"}, 0, false},
    {"dictsort", {"case_sensitive", "by", "reverse"}, 0, false},
    {"float", {"default"}, 0, false},
    {"format", {NULL}, 0, true},
    {"indent", {"width", "first", "blank"}, 0, false},
    {"int", {"default", "base"}, 0, false},
    {"join", {"d", "attribute"}, 0, false},
    {"map", {NULL}, 0, true},
    {"max", {"case_sensitive", "attribute"}, 0, false},
    {"min", {"case_sensitive", "attribute"}, 0, false},
    {"reject", {NULL}, 0, true},
    {"rejectattr", {NULL}, 0, true},
    {"replace", {"old", "new", "count"}, 2, false},
    {"round", {"precision", "method"}, 0, false},
    {"select", {NULL}, 0, true},
    {"selectattr", {NULL}, 0, true},
    {"sort", {"reverse", "case_sensitive", "attribute"}, 0, false},
    {"sum", {"attribute", "start"}, 0, false},
    {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, 0, false},
    {"trim", {"chars"}, 0, false},
    {"unique", {"case_sensitive", "attribute"}, 0, false},
};

/* Python's TypeError for arguments a filter's signature does not take. */
static void check_signature(jr_t *r, const node_t *at, const char *f, size_t n, jdict_t *kw)
{
    static const struct fsig none = {NULL, {NULL}, 0, false};
    const struct fsig *sig = &none;
    for (size_t i = 0; i < TD_ARRAY_LEN(fsigs); i++)
        if (!strcmp(fsigs[i].name, f))
            sig = &fsigs[i];
    if (sig->variadic)
        return;
    size_t np = 0;
    while (np < 5 && sig->params[np])
        np++;
    if (n > np)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: filter '%s' takes at most %zu argument(s) "
                                      "(%zu given)",
                    f, np, n);
    size_t have = n;
    for (size_t k = 0; kw && k < kw->n; k++) {
        size_t at_i = np;
        for (size_t i = 0; i < np; i++)
            if (kw->k[k].t == JV_STR && !strcmp(kw->k[k].u.s->p, sig->params[i]))
                at_i = i;
        if (at_i == np || at_i < n)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: filter '%s' got %s keyword argument '%s'",
                        f, at_i == np ? "an unexpected" : "a repeated",
                        kw->k[k].t == JV_STR ? kw->k[k].u.s->p : "?");
        if ((int)at_i < sig->required)
            have++;
    }
    if ((int)TD_MIN(have, np) < sig->required)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: filter '%s' needs %d argument(s)", f,
                    sig->required);
}

bool td__jr_has_filter(const char *name)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(filter_names); i++)
        if (!strcmp(name, filter_names[i]))
            return true;
    return false;
}

/* select/reject/selectattr/rejectattr: keep items whose test (args[t0..]) says `keep`. */
static jv_t select_items(jr_t *r, const node_t *at, jv_t seq, bool by_attr, bool keep,
                         const jv_t *args, size_t n)
{
    jlist_t *items = td__jr_iter(r, at, seq);
    jv_t out = mklist(r, true);
    size_t t0 = by_attr ? 1 : 0;
    if (by_attr && n < 1)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: selectattr/rejectattr need an attribute");
    const jstr_t *test = n > t0 ? str_of(r, args[t0]).u.s : NULL;
    if (test && !td__jr_has_test(test->p))
        td__jr_fail(r, at, TD_EINVAL, "TemplateRuntimeError: no test named '%.60s'", test->p);
    for (size_t i = 0; i < items->n; i++) {
        td__jr_step(r, at);
        jv_t v = by_attr ? attr_path(r, at, items->v[i], args[0]) : items->v[i];
        bool ok = test ? td__jr_test(r, at, test, v, args + t0 + 1, n - t0 - 1)
                       : td__jv_truthy(v);
        if (ok == keep)
            td__jlist_push(&r->ar, out.u.l, items->v[i]);
    }
    return out;
}

static int sort_cmp_key(jr_t *r, const node_t *at, jv_t a, jv_t b, bool case_sensitive)
{
    if (!case_sensitive && a.t == JV_STR && b.t == JV_STR) {
        a = td__jr_recase(r, a.u.s, 3);
        b = td__jr_recase(r, b.u.s, 3);
    }
    int c;
    if (!td__jv_compare(a, b, &c))
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: '<' not supported between instances of '%s' and '%s'",
                    td__jv_type_name(a), td__jv_type_name(b));
    return c;
}

/* Stable insertion sort by key (lists in templates are short). */
static jv_t sorted(jr_t *r, const node_t *at, jlist_t *items, const jv_t *keys, bool reverse,
                   bool case_sensitive)
{
    size_t n = items->n;
    size_t *idx = td__jarena_alloc(&r->ar, (n ? n : 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        td__jr_step(r, at);
        while (j > 0) {
            int c = sort_cmp_key(r, at, keys[idx[j - 1]], keys[i], case_sensitive);
            if (reverse ? c >= 0 : c <= 0)
                break;
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    jv_t out = td__jv_list(&r->ar, n);
    for (size_t i = 0; i < n; i++)
        td__jlist_push(&r->ar, out.u.l, items->v[idx[i]]);
    return out;
}

static jv_t tojson(jr_t *r, const node_t *at, jv_t v, const jv_t *args, size_t n, jdict_t *kw)
{
    jv_t ascii = arg(args, n, kw, 0, "ensure_ascii", td__jv_bool(false));
    jv_t indent = arg(args, n, kw, 1, "indent", JV_NONE_V);
    jv_t seps = arg(args, n, kw, 2, "separators", JV_NONE_V);
    jv_t sort = arg(args, n, kw, 3, "sort_keys", td__jv_bool(false));
    const char *item_sep = NULL, *key_sep = NULL;
    if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR &&
        seps.u.l->v[1].t == JV_STR) {
        item_sep = seps.u.l->v[0].u.s->p;
        key_sep = seps.u.l->v[1].u.s->p;
    } else if (seps.t == JV_STR && td__utf8_count(seps.u.s->p, seps.u.s->n) == 2) {
        size_t cut = td__utf8_offset(seps.u.s->p, seps.u.s->n, 1); /* a, b = "xy" */
        item_sep = td__jv_str(&r->ar, seps.u.s->p, cut).u.s->p;
        key_sep = seps.u.s->p + cut;
    } else if (seps.t != JV_NONE) {
        td__jr_fail(r, at, TD_EINVAL, "tojson: separators must be a pair of strings");
    }
    int ind = -1;
    if (indent.t == JV_INT)
        ind = indent.u.i < 0 ? 0 : indent.u.i > 64 ? 64 : (int)indent.u.i;
    else if (indent.t != JV_NONE)
        td__jr_fail(r, at, TD_ENOTSUP, "tojson: indent must be an integer or None");
    jbuf_t b = {0};
    const char *bad = NULL;
    if (!td__jv_json_to(&r->ar, &b, v, td__jv_truthy(ascii), ind, item_sep, key_sep,
                        td__jv_truthy(sort), &bad))
        td__jr_fail(r, at, TD_EINVAL, "TypeError: Object of type %s is not JSON serializable",
                    bad ? bad : "object");
    return td__jbuf_str(&r->ar, &b);
}

static jv_t to_int(jr_t *r, jv_t v, jv_t def)
{
    if (v.t == JV_INT)
        return v;
    if (v.t == JV_BOOL)
        return td__jv_int(v.u.b);
    if (v.t == JV_FLOAT)
        return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? td__jv_int((int64_t)v.u.f) : def;
    if (v.t == JV_STR) {
        jv_t s = py_strip(r, v.u.s, NULL, 3);
        int64_t i;
        double f;
        if (td_parse_i64(s.u.s->p, &i) == 0)
            return td__jv_int(i);
        if (td_parse_double(s.u.s->p, &f) == 0 && isfinite(f) && fabs(f) < 9.2e18)
            return td__jv_int((int64_t)f);
    }
    return def;
}

jv_t td__jr_filter(jr_t *r, const node_t *at, const jstr_t *name, jv_t v, const jv_t *args,
                   size_t n, jdict_t *kw)
{
    const char *f = name->p;
    int64_t len;
    td__jr_step(r, at);
    check_signature(r, at, f, n, kw);
    if (!strcmp(f, "trim")) {
        jv_t chars = arg(args, n, kw, 0, "chars", JV_NONE_V);
        return py_strip(r, str_of(r, v).u.s, chars.t == JV_STR ? chars.u.s : NULL, 3);
    }
    if (!strcmp(f, "tojson"))
        return tojson(r, at, v, args, n, kw);
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (!td__jv_len(v, &len))
            td__jr_fail(r, at, TD_EINVAL, "TypeError: object of type '%s' has no len()",
                        v.t == JV_LIST ? "generator" : td__jv_type_name(v));
        return td__jv_int(len);
    }
    if (!strcmp(f, "string"))
        return str_of(r, v);
    if (!strcmp(f, "safe"))
        return v;
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") ||
        !strcmp(f, "title"))
        return td__jr_recase(r, str_of(r, v).u.s,
                             f[0] == 'u' ? 4 : f[0] == 'l' ? 3 : f[0] == 'c' ? 1 : 2);
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv_t def = arg(args, n, kw, 0, "default_value", td__jv_str(&r->ar, "", 0));
        bool boolean = td__jv_truthy(arg(args, n, kw, 1, "boolean", td__jv_bool(false)));
        return v.t == JV_UNDEF || (boolean && !td__jv_truthy(v)) ? def : v;
    }
    if (!strcmp(f, "items")) {
        if (v.t == JV_UNDEF)
            return mklist(r, true);
        if (v.t != JV_DICT)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: Can only get item pairs from a mapping.");
        jv_t out = mklist(r, true);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv_t pair = td__jv_list(&r->ar, 2);
            pair.u.l->tuple = true;
            td__jlist_push(&r->ar, pair.u.l, v.u.d->k[i]);
            td__jlist_push(&r->ar, pair.u.l, v.u.d->v[i]);
            td__jlist_push(&r->ar, out.u.l, pair);
        }
        return out;
    }
    if (!strcmp(f, "dictsort")) {
        if (v.t != JV_DICT)
            td__jr_type_error(r, at, "dictsort needs a mapping", v);
        bool cs = td__jv_truthy(arg(args, n, kw, 0, "case_sensitive", td__jv_bool(false)));
        jv_t by = arg(args, n, kw, 1, "by", td__jv_cstr(&r->ar, "key"));
        bool rev = td__jv_truthy(arg(args, n, kw, 2, "reverse", td__jv_bool(false)));
        bool by_value = by.t == JV_STR && !strcmp(by.u.s->p, "value");
        jv_t pairs = td__jv_list(&r->ar, v.u.d->n);
        jv_t *keys = td__jarena_alloc(&r->ar, (v.u.d->n + 1) * sizeof(jv_t));
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv_t pair = td__jv_list(&r->ar, 2);
            pair.u.l->tuple = true;
            td__jlist_push(&r->ar, pair.u.l, v.u.d->k[i]);
            td__jlist_push(&r->ar, pair.u.l, v.u.d->v[i]);
            td__jlist_push(&r->ar, pairs.u.l, pair);
            keys[i] = by_value ? v.u.d->v[i] : v.u.d->k[i];
        }
        return sorted(r, at, pairs.u.l, keys, rev, cs);
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject"))
        return select_items(r, at, v, false, f[0] == 's', args, n);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return select_items(r, at, v, true, f[0] == 's', args, n);
    if (!strcmp(f, "map")) {
        jlist_t *items = td__jr_iter(r, at, v);
        jv_t out = mklist(r, true);
        jv_t attr = arg(NULL, 0, kw, 0, "attribute", JV_UNDEF_V);
        jv_t def = arg(NULL, 0, kw, 0, "default", JV_UNDEF_V);
        for (size_t k = 0; attr.t != JV_UNDEF && kw && k < kw->n; k++)
            if (strcmp(kw->k[k].u.s->p, "attribute") && strcmp(kw->k[k].u.s->p, "default"))
                td__jr_fail(r, at, TD_EINVAL,
                            "FilterArgumentError: Unexpected keyword argument '%.60s'",
                            kw->k[k].u.s->p);
        if (attr.t == JV_UNDEF && n < 1)
            td__jr_fail(r, at, TD_EINVAL, "map: give a filter name or attribute=");
        const jstr_t *fname = attr.t == JV_UNDEF ? str_of(r, args[0]).u.s : NULL;
        if (fname && !td__jr_has_filter(fname->p))
            td__jr_fail(r, at, TD_EINVAL, "TemplateRuntimeError: no filter named '%.60s'",
                        fname->p);
        for (size_t i = 0; i < items->n; i++) {
            jv_t x;
            if (fname) {
                x = td__jr_filter(r, at, fname, items->v[i], args + 1, n - 1, NULL);
            } else {
                x = attr_path(r, at, items->v[i], attr);
                if (x.t == JV_UNDEF && def.t != JV_UNDEF)
                    x = def;
            }
            td__jlist_push(&r->ar, out.u.l, x);
        }
        return out;
    }
    if (!strcmp(f, "join")) {
        jv_t sep = arg(args, n, kw, 0, "d", td__jv_str(&r->ar, "", 0));
        jv_t attr = arg(args, n, kw, 1, "attribute", JV_NONE_V);
        jlist_t *items = td__jr_iter(r, at, v);
        jbuf_t b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                td__jv_str_to(&r->ar, &b, sep);
            td__jv_str_to(&r->ar, &b,
                          attr.t == JV_NONE ? items->v[i] : attr_path(r, at, items->v[i], attr));
        }
        return td__jbuf_str(&r->ar, &b);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jlist_t *items = td__jr_iter(r, at, v);
        if (items->n == 0)
            return JV_UNDEF_V;
        if (f[0] == 'l' && v.t == JV_LIST && v.u.l->gen)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: 'generator' object is not reversible");
        return items->v[f[0] == 'f' ? 0 : items->n - 1];
    }
    if (!strcmp(f, "list")) {
        jlist_t *items = td__jr_iter(r, at, v);
        jv_t out = td__jv_list(&r->ar, items->n);
        for (size_t i = 0; i < items->n; i++)
            td__jlist_push(&r->ar, out.u.l, items->v[i]);
        return out;
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JV_STR) {
            jlist_t *cs = td__jr_iter(r, at, v);
            jbuf_t b = {0};
            for (size_t i = cs->n; i-- > 0;)
                td__jbuf_put(&r->ar, &b, cs->v[i].u.s->p, cs->v[i].u.s->n);
            return td__jbuf_str(&r->ar, &b);
        }
        jlist_t *items = td__jr_iter(r, at, v);
        jv_t out = mklist(r, true);
        for (size_t i = items->n; i-- > 0;)
            td__jlist_push(&r->ar, out.u.l, items->v[i]);
        return out;
    }
    if (!strcmp(f, "replace")) {
        jv_t old = arg(args, n, kw, 0, "old", JV_UNDEF_V), nw = arg(args, n, kw, 1, "new", JV_UNDEF_V);
        jv_t count = arg(args, n, kw, 2, "count", JV_NONE_V);
        if (old.t != JV_STR || nw.t != JV_STR)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: replace() needs two strings");
        return do_replace(r, str_of(r, v).u.s, old.u.s, nw.u.s,
                          count.t == JV_INT ? count.u.i : -1);
    }
    if ((!strcmp(f, "int") || !strcmp(f, "float")) && v.t == JV_UNDEF)
        td__jr_type_error(r, at, "int/float of an undefined value", v); /* Undefined.__int__ raises */
    if (!strcmp(f, "int"))
        return to_int(r, v, arg(args, n, kw, 0, "default", td__jv_int(0)));
    if (!strcmp(f, "float")) {
        if (v.t == JV_FLOAT)
            return v;
        if (v.t == JV_INT || v.t == JV_BOOL)
            return td__jv_float(v.t == JV_INT ? (double)v.u.i : v.u.b);
        double d;
        if (v.t == JV_STR && td_parse_double(py_strip(r, v.u.s, NULL, 3).u.s->p, &d) == 0)
            return td__jv_float(d);
        return arg(args, n, kw, 0, "default", td__jv_float(0.0));
    }
    if (!strcmp(f, "abs")) {
        if (v.t == JV_INT)
            return td__jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT)
            return td__jv_float(fabs(v.u.f));
        td__jr_type_error(r, at, "bad operand type for abs()", v);
    }
    if (!strcmp(f, "round")) {
        jv_t prec = arg(args, n, kw, 0, "precision", td__jv_int(0));
        jv_t method = arg(args, n, kw, 1, "method", td__jv_cstr(&r->ar, "common"));
        double x = v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : NAN;
        if (isnan(x) || prec.t != JV_INT)
            td__jr_type_error(r, at, "round needs a number", v);
        double m = pow(10.0, (double)prec.u.i), y = x * m;
        const char *how = method.t == JV_STR ? method.u.s->p : "common";
        if (strcmp(how, "common") == 0) {
            if (v.t == JV_INT) /* Python's round(int, n) stays an int */
                return v;
            return td__jv_float(rint(y) / m); /* half to even, as Python's round */
        }
        if (strcmp(how, "ceil") && strcmp(how, "floor"))
            td__jr_fail(r, at, TD_EINVAL, "FilterArgumentError: method must be common, ceil "
                                          "or floor");
        return td__jv_float((how[0] == 'c' ? ceil(y) : floor(y)) / m);
    }
    if (!strcmp(f, "sum")) {
        jv_t attr = arg(args, n, kw, 0, "attribute", JV_NONE_V);
        jv_t acc = arg(args, n, kw, 1, "start", td__jv_int(0));
        jlist_t *items = td__jr_iter(r, at, v);
        for (size_t i = 0; i < items->n; i++) {
            jv_t x = attr.t == JV_NONE ? items->v[i] : attr_path(r, at, items->v[i], attr);
            bool xi = x.t == JV_INT || x.t == JV_BOOL, ai = acc.t == JV_INT || acc.t == JV_BOOL;
            if (!(xi || x.t == JV_FLOAT) || !(ai || acc.t == JV_FLOAT))
                td__jr_type_error(r, at, "sum() needs numbers", x);
            int64_t xv = x.t == JV_BOOL ? x.u.b : x.u.i, av = acc.t == JV_BOOL ? acc.u.b : acc.u.i;
            int64_t z;
            if (xi && ai && !__builtin_add_overflow(av, xv, &z))
                acc = td__jv_int(z);
            else if (xi && ai)
                td__jr_fail(r, at, TD_ERANGE, "integer overflow");
            else
                acc = td__jv_float((ai ? (double)av : acc.u.f) + (xi ? (double)xv : x.u.f));
        }
        return acc;
    }
    if (!strcmp(f, "min") || !strcmp(f, "max") || !strcmp(f, "sort") || !strcmp(f, "unique")) {
        bool is_sort = f[0] == 's', is_unique = f[0] == 'u';
        jv_t revv = arg(args, n, kw, 0, "reverse", td__jv_bool(false));
        if (is_sort && revv.t != JV_BOOL && revv.t != JV_INT) /* sorted(reverse=) wants an int */
            td__jr_type_error(r, at, "sort(reverse=) must be a bool", revv);
        bool rev = is_sort && td__jv_truthy(revv);
        bool cs = td__jv_truthy(arg(args, n, kw, is_sort ? 1 : 0, "case_sensitive",
                                    td__jv_bool(false)));
        jv_t attr = arg(args, n, kw, is_sort ? 2 : 1, "attribute", JV_NONE_V);
        jlist_t *items = td__jr_iter(r, at, v);
        jv_t *keys = td__jarena_alloc(&r->ar, (items->n + 1) * sizeof(jv_t));
        for (size_t i = 0; i < items->n; i++)
            keys[i] = attr.t == JV_NONE ? items->v[i] : attr_path(r, at, items->v[i], attr);
        if (is_unique) {
            jv_t out = mklist(r, true);
            jv_t seen = td__jv_list(&r->ar, 0);
            for (size_t i = 0; i < items->n; i++) {
                jv_t k = !cs && keys[i].t == JV_STR ? td__jr_recase(r, keys[i].u.s, 3)
                                                    : keys[i];
                bool dup = false;
                for (size_t j = 0; j < seen.u.l->n && !dup; j++)
                    dup = td__jv_equal(seen.u.l->v[j], k);
                if (!dup) {
                    td__jlist_push(&r->ar, seen.u.l, k);
                    td__jlist_push(&r->ar, out.u.l, items->v[i]);
                }
            }
            return out;
        }
        jv_t s = sorted(r, at, items, keys, rev, cs);
        if (is_sort)
            return s;
        if (s.u.l->n == 0)
            return JV_UNDEF_V;
        return f[1] == 'i' ? s.u.l->v[0] : s.u.l->v[s.u.l->n - 1];
    }
    if (!strcmp(f, "indent")) {
        jv_t width = arg(args, n, kw, 0, "width", td__jv_int(4));
        bool first = td__jv_truthy(arg(args, n, kw, 1, "first", td__jv_bool(false)));
        bool blank = td__jv_truthy(arg(args, n, kw, 2, "blank", td__jv_bool(false)));
        return do_indent(r, str_of(r, v).u.s, width, first, blank);
    }
    if (!strcmp(f, "format")) {
        const jstr_t *fmt = str_of(r, v).u.s;
        return percent_format(r, at, fmt, args, n);
    }
    if (!strcmp(f, "wordcount")) {
        const jstr_t *s = str_of(r, v).u.s;
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s->n; i++) {
            char c = s->p[i];
            bool w = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '_' || (unsigned char)c >= 0x80;
            words += w && !in;
            in = w;
        }
        return td__jv_int(words);
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e")) {
        const jstr_t *s = str_of(r, v).u.s;
        jbuf_t b = {0};
        for (size_t i = 0; i < s->n; i++) {
            const char *rep = s->p[i] == '&'    ? "&amp;"
                              : s->p[i] == '<'  ? "&lt;"
                              : s->p[i] == '>'  ? "&gt;"
                              : s->p[i] == '"'  ? "&#34;"
                              : s->p[i] == '\'' ? "&#39;"
                                                : NULL;
            if (rep)
                td__jbuf_put(&r->ar, &b, rep, strlen(rep));
            else
                td__jbuf_putc(&r->ar, &b, s->p[i]);
        }
        return td__jbuf_str(&r->ar, &b);
    }
    if (!strcmp(f, "attr")) {
        jv_t a = arg(args, n, kw, 0, "name", JV_UNDEF_V);
        if (a.t != JV_STR)
            td__jr_type_error(r, at, "attr needs a string name", a);
        return td__jr_getattr(r, at, v, a.u.s);
    }
    td__jr_fail(r, at, TD_EINTERNAL, "no filter named '%s'", f);
}

/* ---- globals --------------------------------------------------------------------------------- */

static jv_t g_raise(jr_t *r, const node_t *at, jfunc_t *self, const jv_t *args, size_t n,
                    jdict_t *kw)
{
    (void)self;
    jv_t msg = arg(args, n, kw, 0, "message", td__jv_str(&r->ar, "", 0));
    const jstr_t *s = str_of(r, msg).u.s;
    td__jr_set_raised();
    r->err = td_err_set(TD_EINVAL, "raise_exception: %.*s", (int)TD_MIN(s->n, 1000), s->p);
    (void)at;
    longjmp(r->jb, 1);
}

static jv_t g_strftime(jr_t *r, const node_t *at, jfunc_t *self, const jv_t *args, size_t n,
                       jdict_t *kw)
{
    (void)self;
    jv_t fmt = arg(args, n, kw, 0, "format", JV_UNDEF_V);
    if (fmt.t != JV_STR)
        td__jr_type_error(r, at, "strftime_now needs a format string", fmt);
    time_t now = r->now_s ? (time_t)r->now_s : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char out[512];
    size_t w = fmt.u.s->n ? strftime(out, sizeof(out), fmt.u.s->p, &tm) : 0;
    return td__jv_str(&r->ar, out, w);
}

static jv_t g_range(jr_t *r, const node_t *at, jfunc_t *self, const jv_t *args, size_t n,
                    jdict_t *kw)
{
    (void)self;
    (void)kw;
    int64_t a[3] = {0, 0, 1};
    for (size_t i = 0; i < n && i < 3; i++) {
        if (args[i].t != JV_INT && args[i].t != JV_BOOL)
            td__jr_type_error(r, at, "range() needs integers", args[i]);
        a[i] = args[i].t == JV_INT ? args[i].u.i : args[i].u.b;
    }
    if (n == 0 || n > 3)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: range expected 1 to 3 arguments, got %zu", n);
    int64_t start = n == 1 ? 0 : a[0], stop = n == 1 ? a[0] : a[1], step = n == 3 ? a[2] : 1;
    if (step == 0)
        td__jr_fail(r, at, TD_EINVAL, "ValueError: range() arg 3 must not be zero");
    double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                            : ceil(((double)start - (double)stop) / (double)-step);
    if (count > 100000) /* Jinja's sandbox: MAX_RANGE */
        td__jr_fail(r, at, TD_ERANGE,
                    "OverflowError: Range too big. The sandbox blocks ranges larger than "
                    "MAX_RANGE (100000).");
    jv_t l = td__jv_list(&r->ar, count > 0 ? (size_t)count : 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        td__jlist_push(&r->ar, l.u.l, td__jv_int(i));
    l.u.l->range = true; /* prints as range(start, stop[, step]) */
    l.u.l->range_args[0] = start;
    l.u.l->range_args[1] = stop;
    l.u.l->range_args[2] = step;
    return l;
}

static jv_t g_namespace(jr_t *r, const node_t *at, jfunc_t *self, const jv_t *args, size_t n,
                        jdict_t *kw)
{
    (void)self;
    jv_t ns = td__jv_dict(&r->ar);
    ns.t = self->name[0] == 'n' ? JV_NS : JV_DICT;
    for (size_t i = 0; i < n; i++) {
        if (args[i].t != JV_DICT)
            td__jr_type_error(r, at, "namespace()/dict() take a mapping", args[i]);
        for (size_t k = 0; k < args[i].u.d->n; k++)
            td__jdict_set(&r->ar, ns.u.d, args[i].u.d->k[k], args[i].u.d->v[k]);
    }
    for (size_t k = 0; kw && k < kw->n; k++)
        td__jdict_set(&r->ar, ns.u.d, kw->k[k], kw->v[k]);
    return ns;
}

static void add_fn(jr_t *r, jdict_t *g, const char *name, jfunc_call_t call)
{
    jfunc_t *fn = td__jarena_alloc(&r->ar, sizeof(*fn));
    fn->name = name;
    fn->call = call;
    td__jdict_set(&r->ar, g, td__jv_cstr(&r->ar, name), (jv_t){.t = JV_FUNC, .u.fn = fn});
}

void td__jr_add_globals(jr_t *r, jdict_t *g)
{
    add_fn(r, g, "raise_exception", g_raise);
    add_fn(r, g, "strftime_now", g_strftime);
    add_fn(r, g, "range", g_range);
    add_fn(r, g, "namespace", g_namespace);
    add_fn(r, g, "dict", g_namespace);
}

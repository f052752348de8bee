/* jinja_methods.c: the methods of str, dict and list values and of `loop` that Jinja2's
 * ImmutableSandboxedEnvironment lets a template call, with Python's semantics:
 *   str:  strip lstrip rstrip split rsplit splitlines startswith endswith upper lower title
 *         capitalize replace find rfind index count join isdigit isalpha isalnum isspace isupper
 *         islower removeprefix removesuffix format
 *   dict: items keys values get          list: index count          loop: cycle
 * Methods that would modify a value (list.append, dict.update, ...) do not exist here, as the
 * immutable sandbox refuses them. */
#include "jinja_impl.h"

#include "td_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>


static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
    "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "index", "count", "join",
    "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "removeprefix",
    "removesuffix", "format", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
static const char *const list_methods[] = {"index", "count", NULL};
static const char *const loop_methods[] = {"cycle", NULL};

/* ---- case mapping ---------------------------------------------------------------------------- */

static bool is_cased(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* mode: 1 capitalize, 2 Jinja's title filter, 3 lower, 4 upper, 5 str.title() */
jv_t td__jr_recase(jr_t *r, const jstr_t *s, int mode)
{
    jbuf_t b = {0};
    bool word_start = true, prev_cased = false;
    for (size_t i = 0; i < s->n;) {
        size_t k = td_utf8_valid_len((const uint8_t *)s->p + i, s->n - i);
        if (k == 0)
            k = 1;
        uint32_t cp = td_utf8_decode((const uint8_t *)s->p + i, k);
        bool up;
        switch (mode) {
        case 1: up = i == 0; break;
        case 2:
            up = word_start;
            word_start = td__py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' ||
                         cp == '[' || cp == '<';
            break;
        case 3: up = false; break;
        case 4: up = true; break;
        default:
            up = !prev_cased;
            prev_cased = is_cased(cp);
            break;
        }
        uint32_t m = (uint32_t)(up ? utf8proc_toupper((utf8proc_int32_t)cp)
                                   : utf8proc_tolower((utf8proc_int32_t)cp));
        char enc[4];
        td__jbuf_put(&r->ar, &b, enc, td_utf8_encode(m, enc));
        i += k;
    }
    return td__jbuf_str(&r->ar, &b);
}

/* ---- str ------------------------------------------------------------------------------------- */

static const jstr_t *want_str(jr_t *r, const node_t *at, const char *m, jv_t v)
{
    if (v.t != JV_STR)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: str.%s() argument must be str, not %s", m,
                    td__jv_type_name(v));
    return v.u.s;
}

static jv_t split(jr_t *r, const node_t *at, const jstr_t *s, jv_t sepv, int64_t maxsplit,
                  bool right)
{
    jv_t out = td__jv_list(&r->ar, 0);
    jlist_t *l = out.u.l;
    if (sepv.t == JV_NONE) {
        /* runs of whitespace; ends ignored */
        size_t n = s->n;
        size_t cps = td__utf8_count(s->p, n);
        size_t *off = td__jarena_alloc(&r->ar, (cps + 1) * sizeof(size_t));
        bool *ws = td__jarena_alloc(&r->ar, cps + 1);
        for (size_t i = 0, c = 0; i < n; c++) {
            size_t k = td_utf8_valid_len((const uint8_t *)s->p + i, n - i);
            if (k == 0)
                k = 1;
            off[c] = i;
            ws[c] = td__py_isspace(td_utf8_decode((const uint8_t *)s->p + i, k));
            i += k;
        }
        off[cps] = n;
        jv_t parts = td__jv_list(&r->ar, 0);
        if (!right) {
            size_t c = 0;
            while (c < cps) {
                while (c < cps && ws[c])
                    c++;
                if (c == cps)
                    break;
                if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                    size_t e = cps;
                    while (e > c && ws[e - 1])
                        e--;
                    td__jlist_push(&r->ar, l, td__jv_str(&r->ar, s->p + off[c], off[e] - off[c]));
                    break;
                }
                size_t b = c;
                while (c < cps && !ws[c])
                    c++;
                td__jlist_push(&r->ar, l, td__jv_str(&r->ar, s->p + off[b], off[c] - off[b]));
            }
            return out;
        }
        size_t c = cps;
        while (c > 0) {
            while (c > 0 && ws[c - 1])
                c--;
            if (c == 0)
                break;
            if (maxsplit >= 0 && (int64_t)parts.u.l->n >= maxsplit) {
                size_t b = 0;
                while (b < c && ws[b])
                    b++;
                td__jlist_push(&r->ar, parts.u.l,
                               td__jv_str(&r->ar, s->p + off[b], off[c] - off[b]));
                break;
            }
            size_t e = c;
            while (c > 0 && !ws[c - 1])
                c--;
            td__jlist_push(&r->ar, parts.u.l, td__jv_str(&r->ar, s->p + off[c], off[e] - off[c]));
        }
        for (size_t i = parts.u.l->n; i-- > 0;)
            td__jlist_push(&r->ar, l, parts.u.l->v[i]);
        return out;
    }
    const jstr_t *sep = want_str(r, at, "split", sepv);
    if (sep->n == 0)
        td__jr_fail(r, at, TD_EINVAL, "ValueError: empty separator");
    if (!right) {
        size_t i = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && (int64_t)l->n >= maxsplit
                                  ? NULL
                                  : memmem(s->p + i, s->n - i, sep->p, sep->n);
            if (!hit) {
                td__jlist_push(&r->ar, l, td__jv_str(&r->ar, s->p + i, s->n - i));
                return out;
            }
            td__jlist_push(&r->ar, l, td__jv_str(&r->ar, s->p + i, (size_t)(hit - s->p) - i));
            i = (size_t)(hit - s->p) + sep->n;
        }
    }
    jv_t parts = td__jv_list(&r->ar, 0);
    size_t e = s->n;
    for (;;) {
        ptrdiff_t hit = -1;
        if (!(maxsplit >= 0 && (int64_t)parts.u.l->n >= maxsplit) && e >= sep->n)
            for (size_t j = e - sep->n + 1; j-- > 0;)
                if (memcmp(s->p + j, sep->p, sep->n) == 0) {
                    hit = (ptrdiff_t)j;
                    break;
                }
        if (hit < 0) {
            td__jlist_push(&r->ar, parts.u.l, td__jv_str(&r->ar, s->p, e));
            break;
        }
        size_t b = (size_t)hit + sep->n;
        td__jlist_push(&r->ar, parts.u.l, td__jv_str(&r->ar, s->p + b, e - b));
        e = (size_t)hit;
    }
    for (size_t i = parts.u.l->n; i-- > 0;)
        td__jlist_push(&r->ar, l, parts.u.l->v[i]);
    return out;
}

static bool affix(jr_t *r, const node_t *at, const jstr_t *s, jv_t what, bool end)
{
    if (what.t == JV_LIST && what.u.l->tuple) {
        for (size_t i = 0; i < what.u.l->n; i++)
            if (affix(r, at, s, what.u.l->v[i], end))
                return true;
        return false;
    }
    if (what.t != JV_STR)
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: %s first arg must be str or a tuple of str, not %s",
                    end ? "endswith" : "startswith", td__jv_type_name(what));
    const jstr_t *a = what.u.s;
    return s->n >= a->n && memcmp(end ? s->p + s->n - a->n : s->p, a->p, a->n) == 0;
}

static bool all_cp(const jstr_t *s, int kind)
{
    if (s->n == 0)
        return false;
    bool any_cased = false;
    for (size_t i = 0; i < s->n;) {
        size_t k = td_utf8_valid_len((const uint8_t *)s->p + i, s->n - i);
        if (k == 0)
            k = 1;
        uint32_t cp = td_utf8_decode((const uint8_t *)s->p + i, k);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        bool ok = kind == 0 ? digit : kind == 1 ? alpha : kind == 2 ? alpha || digit
                  : kind == 3                                        ? td__py_isspace(cp)
                  : kind == 4 ? c != UTF8PROC_CATEGORY_LL && c != UTF8PROC_CATEGORY_LT
                              : c != UTF8PROC_CATEGORY_LU && c != UTF8PROC_CATEGORY_LT;
        if (!ok)
            return false;
        any_cased |= is_cased(cp);
        i += k;
    }
    return kind < 4 || any_cased;
}

static jv_t str_format(jr_t *r, const node_t *at, const jstr_t *fmt, const jv_t *args, size_t n,
                       jdict_t *kw)
{
    jbuf_t b = {0};
    size_t auto_i = 0;
    bool manual = false;
    for (size_t i = 0; i < fmt->n; i++) {
        char c = fmt->p[i];
        if ((c == '{' || c == '}') && i + 1 < fmt->n && fmt->p[i + 1] == c) {
            td__jbuf_putc(&r->ar, &b, c);
            i++;
            continue;
        }
        if (c != '{') {
            td__jbuf_putc(&r->ar, &b, c);
            continue;
        }
        const char *close = memchr(fmt->p + i, '}', fmt->n - i);
        if (!close)
            td__jr_fail(r, at, TD_EINVAL, "ValueError: Single '{' encountered in format string");
        const char *f = fmt->p + i + 1;
        size_t fl = (size_t)(close - f);
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            td__jr_fail(r, at, TD_ENOTSUP, "str.format: conversions and format specs are not "
                                           "supported");
        jv_t v = JV_UNDEF_V;
        bool numbered = fl > 0 && f[0] >= '0' && f[0] <= '9';
        if ((fl == 0 && manual) || (numbered && auto_i > 0))
            td__jr_fail(r, at, TD_EINVAL, "ValueError: cannot switch from %s field "
                                          "specification to %s field numbering",
                        manual ? "manual" : "automatic", manual ? "automatic" : "manual");
        manual |= numbered;
        if (fl == 0) {
            if (auto_i >= n)
                td__jr_fail(r, at, TD_EINVAL, "IndexError: Replacement index %zu out of range",
                            auto_i);
            v = args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = (size_t)atoi(f);
            if (k >= n)
                td__jr_fail(r, at, TD_EINVAL, "IndexError: Replacement index %zu out of range", k);
            v = args[k];
        } else if (!kw || !td__jdict_get_str(kw, f, fl, &v)) {
            td__jr_fail(r, at, TD_EINVAL, "KeyError: '%.*s'", (int)fl, f);
        }
        td__jv_str_to(&r->ar, &b, v);
        i = (size_t)(close - fmt->p);
    }
    return td__jbuf_str(&r->ar, &b);
}

static jv_t str_method(jr_t *r, const node_t *at, const char *m, const jstr_t *s, const jv_t *a,
                       size_t n, jdict_t *kw)
{
    jv_t a0 = n > 0 ? a[0] : JV_NONE_V, a1 = n > 1 ? a[1] : JV_NONE_V;
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
        return td__jr_strip(r, s, a0.t == JV_NONE ? NULL : want_str(r, at, m, a0),
                            m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv_t v;
        if (kw && td__jdict_get_str(kw, "sep", 3, &v))
            a0 = v;
        if (kw && td__jdict_get_str(kw, "maxsplit", 8, &v))
            a1 = v;
        int64_t maxsplit = a1.t == JV_INT ? a1.u.i : -1;
        return split(r, at, s, a0, maxsplit, m[0] == 'r');
    }
    if (!strcmp(m, "splitlines")) {
        jlist_t *l = td__jr_splitlines(r, s);
        return (jv_t){.t = JV_LIST, .u.l = l};
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return td__jv_bool(affix(r, at, s, a0, m[0] == 'e'));
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") ||
        !strcmp(m, "capitalize"))
        return td__jr_recase(r, s, m[0] == 'u' ? 4 : m[0] == 'l' ? 3 : m[0] == 't' ? 5 : 1);
    if (!strcmp(m, "replace"))
        return td__jr_replace(r, s, want_str(r, at, m, a0), want_str(r, at, m, a1),
                              n > 2 && a[2].t == JV_INT ? a[2].u.i : -1);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        const jstr_t *sub = want_str(r, at, m, a0);
        if (m[0] == 'c') {
            if (sub->n == 0)
                return td__jv_int((int64_t)td__utf8_count(s->p, s->n) + 1);
            int64_t c = 0;
            for (const char *p = s->p; (p = memmem(p, (size_t)(s->p + s->n - p), sub->p, sub->n));
                 p += sub->n)
                c++;
            return td__jv_int(c);
        }
        ptrdiff_t hit = -1;
        if (m[0] == 'r') {
            for (size_t j = s->n >= sub->n ? s->n - sub->n + 1 : 0; j-- > 0;)
                if (memcmp(s->p + j, sub->p, sub->n) == 0) {
                    hit = (ptrdiff_t)j;
                    break;
                }
        } else {
            const char *p = sub->n ? memmem(s->p, s->n, sub->p, sub->n) : s->p;
            hit = p ? p - s->p : -1;
        }
        if (hit < 0 && m[0] == 'i')
            td__jr_fail(r, at, TD_EINVAL, "ValueError: substring not found");
        return td__jv_int(hit < 0 ? -1 : (int64_t)td__utf8_count(s->p, (size_t)hit));
    }
    if (!strcmp(m, "join")) {
        jlist_t *items = td__jr_iter(r, at, a0);
        jbuf_t b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].t != JV_STR)
                td__jr_fail(r, at, TD_EINVAL,
                            "TypeError: sequence item %zu: expected str instance, %s found", i,
                            td__jv_type_name(items->v[i]));
            if (i)
                td__jbuf_put(&r->ar, &b, s->p, s->n);
            td__jbuf_put(&r->ar, &b, items->v[i].u.s->p, items->v[i].u.s->n);
        }
        return td__jbuf_str(&r->ar, &b);
    }
    if (!strncmp(m, "is", 2)) {
        static const char *const kinds[] = {"isdigit", "isalpha", "isalnum", "isspace", "isupper",
                                            "islower"};
        for (int k = 0; k < 6; k++)
            if (!strcmp(m, kinds[k]))
                return td__jv_bool(all_cp(s, k));
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        const jstr_t *x = want_str(r, at, m, a0);
        bool suf = m[6] == 's';
        if (!affix(r, at, s, a0, suf))
            return (jv_t){.t = JV_STR, .u.s = s};
        return td__jv_str(&r->ar, suf ? s->p : s->p + x->n, s->n - x->n);
    }
    if (!strcmp(m, "format"))
        return str_format(r, at, s, a, n, kw);
    td__jr_fail(r, at, TD_EINTERNAL, "no str method '%s'", m);
}

/* ---- dispatch -------------------------------------------------------------------------------- */

static jv_t call_method(jr_t *r, const node_t *at, jfunc_t *fn, const jv_t *a, size_t n,
                        jdict_t *kw)
{
    jv_t self = fn->bound;
    const char *m = fn->name;
    td__jr_step(r, at);
    if (self.t == JV_STR)
        return str_method(r, at, m, self.u.s, a, n, kw);
    if (self.t == JV_LOOP) {
        if (n == 0)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: no items for cycling given");
        return a[self.u.loop->index0 % n];
    }
    if (self.t == JV_DICT) {
        jdict_t *d = self.u.d;
        if (!strcmp(m, "get")) {
            jv_t v;
            if (n < 1)
                td__jr_fail(r, at, TD_EINVAL, "TypeError: get expected at least 1 argument");
            return td__jdict_get(d, a[0], &v) ? v : n > 1 ? a[1] : JV_NONE_V;
        }
        jv_t out = td__jv_list(&r->ar, d->n);
        for (size_t i = 0; i < d->n; i++) {
            jv_t x = m[0] == 'k' ? d->k[i] : d->v[i];
            if (m[0] == 'i') {
                x = td__jv_list(&r->ar, 2);
                x.u.l->tuple = true;
                td__jlist_push(&r->ar, x.u.l, d->k[i]);
                td__jlist_push(&r->ar, x.u.l, d->v[i]);
            }
            td__jlist_push(&r->ar, out.u.l, x);
        }
        return out;
    }
    /* list */
    jlist_t *l = self.u.l;
    if (n < 1)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: %s() takes exactly one argument", m);
    int64_t c = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (!td__jv_equal(l->v[i], a[0]))
            continue;
        if (m[0] == 'i')
            return td__jv_int((int64_t)i);
        c++;
    }
    if (m[0] == 'i')
        td__jr_fail(r, at, TD_EINVAL, "ValueError: value is not in list");
    return td__jv_int(c);
}

jv_t td__jr_method(jr_t *r, jv_t obj, const jstr_t *name)
{
    const char *const *names = obj.t == JV_STR                       ? str_methods
                               : obj.t == JV_DICT                    ? dict_methods
                               : obj.t == JV_LIST && !obj.u.l->gen   ? list_methods
                               : obj.t == JV_LOOP                    ? loop_methods
                                                                     : NULL;
    for (size_t i = 0; names && names[i]; i++) {
        if (strcmp(names[i], name->p) != 0)
            continue;
        jfunc_t *fn = td__jarena_alloc(&r->ar, sizeof(*fn));
        fn->name = names[i];
        fn->call = call_method;
        fn->bound = obj;
        return (jv_t){.t = JV_FUNC, .u.fn = fn};
    }
    return JV_UNDEF_V;
}

/* jinja_value.c: the arena, values, and Python's formatting of them: str(), repr(), json.dumps
 * (as transformers' tojson calls it), equality and ordering. */
#include "jinja_impl.h"

#include "td_error.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena ----------------------------------------------------------------------------------- */

struct jchunk {
    jchunk_t *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *td__jarena_alloc(jarena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (a->limit && a->used + n > a->limit) {
        *a->err = td_err_set(TD_ERANGE, "template used more than its %zu MiB memory limit",
                             a->limit >> 20);
        longjmp(*a->jb, 1);
    }
    jchunk_t *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 60000 ? n : 60000;
        c = malloc(sizeof(*c) + cap);
        if (!c) {
            *a->err = td_err_set(TD_ENOMEM, "template: out of memory");
            longjmp(*a->jb, 1);
        }
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void td__jarena_free(jarena_t *a)
{
    for (jchunk_t *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- constructors and containers ------------------------------------------------------------- */

jv_t td__jv_bool(bool b)
{
    return (jv_t){.t = JV_BOOL, .u.b = b};
}

jv_t td__jv_int(int64_t i)
{
    return (jv_t){.t = JV_INT, .u.i = i};
}

jv_t td__jv_float(double f)
{
    return (jv_t){.t = JV_FLOAT, .u.f = f};
}

jv_t td__jv_str(jarena_t *a, const char *p, size_t n)
{
    jstr_t *s = td__jarena_alloc(a, sizeof(*s) + n + 1);
    s->n = n;
    if (n)
        memcpy(s->p, p, n);
    s->p[n] = '\0';
    return (jv_t){.t = JV_STR, .u.s = s};
}

jv_t td__jv_cstr(jarena_t *a, const char *s)
{
    return td__jv_str(a, s, strlen(s));
}

jv_t td__jv_list(jarena_t *a, size_t cap)
{
    jlist_t *l = td__jarena_alloc(a, sizeof(*l));
    if (cap) {
        l->v = td__jarena_alloc(a, cap * sizeof(jv_t));
        l->cap = cap;
    }
    return (jv_t){.t = JV_LIST, .u.l = l};
}

jv_t td__jv_dict(jarena_t *a)
{
    return (jv_t){.t = JV_DICT, .u.d = td__jarena_alloc(a, sizeof(jdict_t))};
}

void td__jlist_push(jarena_t *a, jlist_t *l, jv_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv_t *nv = td__jarena_alloc(a, cap * sizeof(jv_t));
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(jv_t));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static bool dict_find(const jdict_t *d, jv_t k, size_t *at)
{
    for (size_t i = 0; i < d->n; i++)
        if (td__jv_equal(d->k[i], k)) {
            *at = i;
            return true;
        }
    return false;
}

void td__jdict_set(jarena_t *a, jdict_t *d, jv_t k, jv_t v)
{
    size_t at;
    if (dict_find(d, k, &at)) {
        d->v[at] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv_t *nk = td__jarena_alloc(a, cap * sizeof(jv_t));
        jv_t *nv = td__jarena_alloc(a, cap * sizeof(jv_t));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv_t));
            memcpy(nv, d->v, d->n * sizeof(jv_t));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

bool td__jdict_get(const jdict_t *d, jv_t k, jv_t *out)
{
    size_t at;
    if (!dict_find(d, k, &at))
        return false;
    *out = d->v[at];
    return true;
}

bool td__jdict_get_str(const jdict_t *d, const char *k, size_t n, jv_t *out)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->p, k, n) == 0) {
            *out = d->v[i];
            return true;
        }
    return false;
}

/* ---- truth, equality, order ------------------------------------------------------------------ */

bool td__jv_truthy(jv_t v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->n > 0;
    case JV_LIST: return v.u.l->gen || v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

static bool is_num(jv_t v)
{
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}

static double num(jv_t v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

bool td__jv_equal(jv_t a, jv_t b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return num(a) == num(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.u.s->n == b.u.s->n && memcmp(a.u.s->p, b.u.s->p, a.u.s->n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple || a.u.l->range != b.u.l->range)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!td__jv_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv_t o;
            if (!td__jdict_get(b.u.d, a.u.d->k[i], &o) || !td__jv_equal(a.u.d->v[i], o))
                return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_FUNC: return a.u.fn == b.u.fn;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

bool td__jv_compare(jv_t a, jv_t b, int *out)
{
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t i = a.t == JV_INT ? a.u.i : a.u.b, j = b.t == JV_INT ? b.u.i : b.u.b;
            *out = i < j ? -1 : i > j;
        } else {
            *out = x < y ? -1 : x > y;
        }
        return true;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = TD_MIN(a.u.s->n, b.u.s->n);
        int c = memcmp(a.u.s->p, b.u.s->p, n);
        *out = c ? (c < 0 ? -1 : 1) : (a.u.s->n < b.u.s->n ? -1 : a.u.s->n > b.u.s->n);
        return true;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = TD_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (td__jv_equal(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return td__jv_compare(a.u.l->v[i], b.u.l->v[i], out);
        }
        *out = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return true;
    }
    return false;
}

/* Python's len(); false when the value has none. */
bool td__jv_len(jv_t v, int64_t *n)
{
    switch (v.t) {
    case JV_STR: *n = (int64_t)td__utf8_count(v.u.s->p, v.u.s->n); return true;
    case JV_LIST:
        *n = (int64_t)v.u.l->n;
        return !v.u.l->gen;
    case JV_DICT:
    case JV_NS: *n = (int64_t)v.u.d->n; return v.t == JV_DICT;
    case JV_UNDEF: *n = 0; return true;
    default: return false;
    }
}

const char *td__jv_type_name(jv_t v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

/* ---- text helpers ---------------------------------------------------------------------------- */

bool td__py_isspace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t td__utf8_count(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

size_t td__utf8_offset(const char *p, size_t n, size_t idx)
{
    size_t i = 0, c = 0;
    for (; i < n; i++) {
        if (((unsigned char)p[i] & 0xC0) != 0x80) {
            if (c == idx)
                return i;
            c++;
        }
    }
    return n;
}

void td__py_float_repr(double f, char *out, size_t cap)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < sizeof(digits) - 1)
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char *o = out;
    size_t left = cap;
#define OUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                   \
        if (w_ > 0 && (size_t)w_ < left) {                                                         \
            o += w_;                                                                               \
            left -= (size_t)w_;                                                                    \
        }                                                                                          \
    } while (0)
    if (neg)
        OUT("-");
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                OUT("%c", (size_t)i < nd ? digits[i] : '0');
            OUT(".");
            if ((size_t)exp + 1 < nd)
                OUT("%s", digits + exp + 1);
            else
                OUT("0");
        } else {
            OUT("0.");
            for (int i = 0; i < -exp - 1; i++)
                OUT("0");
            OUT("%s", digits);
        }
    } else {
        OUT("%c", digits[0]);
        if (nd > 1)
            OUT(".%s", digits + 1);
        OUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef OUT
}

/* ---- output buffers -------------------------------------------------------------------------- */

void td__jbuf_put(jarena_t *a, jbuf_t *b, const char *p, size_t n)
{
    if (n == 0)
        return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n)
            cap *= 2;
        char *np = td__jarena_alloc(a, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void td__jbuf_putc(jarena_t *a, jbuf_t *b, char c)
{
    td__jbuf_put(a, b, &c, 1);
}

static void put_s(jarena_t *a, jbuf_t *b, const char *s)
{
    td__jbuf_put(a, b, s, strlen(s));
}

jv_t td__jbuf_str(jarena_t *a, const jbuf_t *b)
{
    return td__jv_str(a, b->p, b->n);
}

/* ---- str() and repr() ------------------------------------------------------------------------ */

static bool py_printable(uint32_t cp)
{
    if (cp == ' ')
        return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void repr_str(jarena_t *a, jbuf_t *b, const jstr_t *s)
{
    bool has_sq = memchr(s->p, '\'', s->n) != NULL, has_dq = memchr(s->p, '"', s->n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    td__jbuf_putc(a, b, q);
    for (size_t i = 0; i < s->n;) {
        size_t k = td_utf8_valid_len((const uint8_t *)s->p + i, s->n - i);
        if (k == 0)
            k = 1;
        uint32_t cp = k == 1 ? (unsigned char)s->p[i] : td_utf8_decode((const uint8_t *)s->p + i, k);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            td__jbuf_put(a, b, esc, 2);
        } else if (cp == '\t' || cp == '\n' || cp == '\r') {
            td__jbuf_put(a, b, cp == '\t' ? "\\t" : cp == '\n' ? "\\n" : "\\r", 2);
        } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && !py_printable(cp))) {
            int w = cp < 0x100     ? snprintf(esc, sizeof(esc), "\\x%02x", cp)
                    : cp < 0x10000 ? snprintf(esc, sizeof(esc), "\\u%04x", cp)
                                   : snprintf(esc, sizeof(esc), "\\U%08x", cp);
            td__jbuf_put(a, b, esc, (size_t)w);
        } else {
            td__jbuf_put(a, b, s->p + i, k);
        }
        i += k;
    }
    td__jbuf_putc(a, b, q);
}

static void repr_to(jarena_t *a, jbuf_t *b, jv_t v, int depth)
{
    if (depth > 200) {
        put_s(a, b, "...");
        return;
    }
    switch (v.t) {
    case JV_STR: repr_str(a, b, v.u.s); return;
    case JV_UNDEF: put_s(a, b, "Undefined"); return;
    case JV_LIST: {
        bool t = v.u.l->tuple;
        if (v.u.l->range || v.u.l->gen) {
            char tmp[96];
            const int64_t *ra = v.u.l->range_args;
            if (v.u.l->gen)
                snprintf(tmp, sizeof(tmp), "<generator object>");
            else if (ra[2] == 1)
                snprintf(tmp, sizeof(tmp), "range(%lld, %lld)", (long long)ra[0], (long long)ra[1]);
            else
                snprintf(tmp, sizeof(tmp), "range(%lld, %lld, %lld)", (long long)ra[0],
                         (long long)ra[1], (long long)ra[2]);
            put_s(a, b, tmp);
            return;
        }
        td__jbuf_putc(a, b, t ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                put_s(a, b, ", ");
            repr_to(a, b, v.u.l->v[i], depth + 1);
        }
        if (t && v.u.l->n == 1)
            td__jbuf_putc(a, b, ',');
        td__jbuf_putc(a, b, t ? ')' : ']');
        return;
    }
    case JV_DICT:
    case JV_NS:
        if (v.t == JV_NS)
            put_s(a, b, "<Namespace ");
        td__jbuf_putc(a, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                put_s(a, b, ", ");
            repr_to(a, b, v.u.d->k[i], depth + 1);
            put_s(a, b, ": ");
            repr_to(a, b, v.u.d->v[i], depth + 1);
        }
        td__jbuf_putc(a, b, '}');
        if (v.t == JV_NS)
            td__jbuf_putc(a, b, '>');
        return;
    default: td__jv_str_to(a, b, v); return;
    }
}

void td__jv_repr_to(jarena_t *a, jbuf_t *b, jv_t v)
{
    repr_to(a, b, v, 0);
}

void td__jv_str_to(jarena_t *a, jbuf_t *b, jv_t v)
{
    char tmp[64];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: put_s(a, b, "None"); return;
    case JV_BOOL: put_s(a, b, v.u.b ? "True" : "False"); return;
    case JV_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i); put_s(a, b, tmp); return;
    case JV_FLOAT: td__py_float_repr(v.u.f, tmp, sizeof(tmp)); put_s(a, b, tmp); return;
    case JV_STR: td__jbuf_put(a, b, v.u.s->p, v.u.s->n); return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS: repr_to(a, b, v, 0); return;
    case JV_FUNC:
        snprintf(tmp, sizeof(tmp), "<built-in function %.30s>", v.u.fn->name);
        put_s(a, b, tmp);
        return;
    case JV_MACRO:
        snprintf(tmp, sizeof(tmp), "<Macro '%.30s'>", v.u.m->def->name->p);
        put_s(a, b, tmp);
        return;
    case JV_LOOP:
        snprintf(tmp, sizeof(tmp), "<LoopContext %zu/%zu>", v.u.loop->index0 + 1,
                 v.u.loop->length);
        put_s(a, b, tmp);
        return;
    }
}

jv_t td__jv_to_str(jarena_t *a, jv_t v)
{
    if (v.t == JV_STR)
        return v;
    jbuf_t b = {0};
    td__jv_str_to(a, &b, v);
    return td__jbuf_str(a, &b);
}

/* ---- json.dumps ------------------------------------------------------------------------------ */

static void json_str(jarena_t *a, jbuf_t *b, const char *p, size_t n, bool ascii)
{
    td__jbuf_putc(a, b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        char esc[16];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            td__jbuf_put(a, b, esc, 2);
        } else if (c == '\n') {
            put_s(a, b, "\\n");
        } else if (c == '\r') {
            put_s(a, b, "\\r");
        } else if (c == '\t') {
            put_s(a, b, "\\t");
        } else if (c == '\b') {
            put_s(a, b, "\\b");
        } else if (c == '\f') {
            put_s(a, b, "\\f");
        } else if (c < 0x20 || (ascii && c == 0x7F)) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put_s(a, b, esc);
        } else if (c >= 0x80 && ascii) {
            size_t k = td_utf8_valid_len((const uint8_t *)p + i, n - i);
            if (k == 0)
                k = 1;
            uint32_t cp = td_utf8_decode((const uint8_t *)p + i, k);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                         0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof(esc), "\\u%04x", cp);
            }
            put_s(a, b, esc);
            i += k;
            continue;
        } else {
            td__jbuf_putc(a, b, (char)c);
        }
        i++;
    }
    td__jbuf_putc(a, b, '"');
}

typedef struct jopts {
    bool ascii, sort;
    int indent;
    const char *item_sep, *key_sep;
    const char *bad;
} jopts_t;

static void newline_indent(jarena_t *a, jbuf_t *b, const jopts_t *o, int level)
{
    td__jbuf_putc(a, b, '\n');
    for (int i = 0; i < o->indent * level; i++)
        td__jbuf_putc(a, b, ' ');
}

static bool json_key(jarena_t *a, jbuf_t *b, jv_t k, jopts_t *o)
{
    char tmp[64];
    switch (k.t) {
    case JV_STR: json_str(a, b, k.u.s->p, k.u.s->n, o->ascii); return true;
    case JV_INT: snprintf(tmp, sizeof(tmp), "\"%lld\"", (long long)k.u.i); break;
    case JV_FLOAT: tmp[0] = '"'; td__py_float_repr(k.u.f, tmp + 1, sizeof(tmp) - 2); strcat(tmp, "\""); break;
    case JV_BOOL: snprintf(tmp, sizeof(tmp), "\"%s\"", k.u.b ? "true" : "false"); break;
    case JV_NONE: snprintf(tmp, sizeof(tmp), "\"null\""); break;
    default: o->bad = "keys must be str, int, float, bool or None"; return false;
    }
    put_s(a, b, tmp);
    return true;
}

static int key_cmp(const void *x, const void *y)
{
    const jv_t *a = x, *b = y;
    int c = 0;
    td__jv_compare(a[0], b[0], &c);
    return c;
}

static bool json_to(jarena_t *a, jbuf_t *b, jv_t v, jopts_t *o, int level)
{
    char tmp[64];
    if (level > 500) {
        o->bad = "nesting too deep";
        return false;
    }
    switch (v.t) {
    case JV_NONE: put_s(a, b, "null"); return true;
    case JV_BOOL: put_s(a, b, v.u.b ? "true" : "false"); return true;
    case JV_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i); put_s(a, b, tmp); return true;
    case JV_FLOAT:
        if (isnan(v.u.f))
            put_s(a, b, "NaN");
        else if (isinf(v.u.f))
            put_s(a, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            td__py_float_repr(v.u.f, tmp, sizeof(tmp));
            put_s(a, b, tmp);
        }
        return true;
    case JV_STR: json_str(a, b, v.u.s->p, v.u.s->n, o->ascii); return true;
    case JV_LIST:
        if (v.u.l->range || v.u.l->gen) {
            o->bad = v.u.l->range ? "range" : "generator";
            return false;
        }
        if (v.u.l->n == 0) {
            put_s(a, b, "[]");
            return true;
        }
        td__jbuf_putc(a, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                put_s(a, b, o->item_sep);
            if (o->indent >= 0)
                newline_indent(a, b, o, level + 1);
            if (!json_to(a, b, v.u.l->v[i], o, level + 1))
                return false;
        }
        if (o->indent >= 0)
            newline_indent(a, b, o, level);
        td__jbuf_putc(a, b, ']');
        return true;
    case JV_DICT: {
        size_t n = v.u.d->n;
        if (n == 0) {
            put_s(a, b, "{}");
            return true;
        }
        jv_t *pairs = td__jarena_alloc(a, n * 2 * sizeof(jv_t));
        for (size_t i = 0; i < n; i++) {
            pairs[2 * i] = v.u.d->k[i];
            pairs[2 * i + 1] = v.u.d->v[i];
        }
        if (o->sort)
            qsort(pairs, n, 2 * sizeof(jv_t), key_cmp);
        td__jbuf_putc(a, b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i)
                put_s(a, b, o->item_sep);
            if (o->indent >= 0)
                newline_indent(a, b, o, level + 1);
            if (!json_key(a, b, pairs[2 * i], o))
                return false;
            put_s(a, b, o->key_sep);
            if (!json_to(a, b, pairs[2 * i + 1], o, level + 1))
                return false;
        }
        if (o->indent >= 0)
            newline_indent(a, b, o, level);
        td__jbuf_putc(a, b, '}');
        return true;
    }
    default: o->bad = td__jv_type_name(v); return false;
    }
}

bool td__jv_json_to(jarena_t *a, jbuf_t *b, jv_t v, bool ensure_ascii, int indent,
                    const char *item_sep, const char *key_sep, bool sort_keys, const char **bad)
{
    jopts_t o = {.ascii = ensure_ascii, .sort = sort_keys, .indent = indent,
                 .item_sep = item_sep ? item_sep : indent >= 0 ? "," : ", ",
                 .key_sep = key_sep ? key_sep : ": "};
    bool ok = json_to(a, b, v, &o, 0);
    if (!ok)
        *bad = o.bad;
    return ok;
}

jv_t td__jv_from_json(jarena_t *a, const struct json_object *cj)
{
    json_object *o = (json_object *)cj;
    switch (json_object_get_type(o)) {
    case json_type_null: return JV_NONE_V;
    case json_type_boolean: return td__jv_bool(json_object_get_boolean(o));
    case json_type_int: return td__jv_int(json_object_get_int64(o));
    case json_type_double: return td__jv_float(json_object_get_double(o));
    case json_type_string:
        return td__jv_str(a, json_object_get_string(o), (size_t)json_object_get_string_len(o));
    case json_type_array: {
        size_t n = json_object_array_length(o);
        jv_t l = td__jv_list(a, n);
        for (size_t i = 0; i < n; i++)
            td__jlist_push(a, l.u.l, td__jv_from_json(a, json_object_array_get_idx(o, i)));
        return l;
    }
    case json_type_object: {
        jv_t d = td__jv_dict(a);
        json_object_object_foreach(o, key, val)
            td__jdict_set(a, d.u.d, td__jv_cstr(a, key), td__jv_from_json(a, val));
        return d;
    }
    }
    return JV_NONE_V;
}

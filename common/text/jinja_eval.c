/* jinja_eval.c: the entry points (parse, render) and the evaluator: statements, expressions,
 * scopes, attribute and item access as Jinja2's sandbox does them, loops, macros and limits. */
#include "jinja_impl.h"

#include "td_error.h"

#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local bool raised;

bool td_jinja_raised(void)
{
    return raised;
}

void td__jr_clear_raised(void)
{
    raised = false;
}

_Noreturn void td__jr_fail(jr_t *r, const node_t *at, int code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (at)
        r->err = td_err_set(code, "%s:%d: %s", r->tpl->what, at->line, msg);
    else
        r->err = td_err_set(code, "%s: %s", r->tpl->what, msg);
    longjmp(r->jb, 1);
}

void td__jr_step(jr_t *r, const node_t *at)
{
    if (++r->steps > r->max_steps)
        td__jr_fail(r, at, TD_ERANGE, "more than %llu loop iterations and calls",
                    (unsigned long long)r->max_steps);
}

static void emit(jr_t *r, const node_t *at, const char *p, size_t n)
{
    if (r->out->n + n > r->max_output)
        td__jr_fail(r, at, TD_ERANGE, "output larger than %zu bytes", r->max_output);
    td__jbuf_put(&r->ar, r->out, p, n);
}

_Noreturn void td__jr_type_error(jr_t *r, const node_t *at, const char *what, jv_t v)
{
    if (v.t == JV_UNDEF && v.u.s)
        td__jr_fail(r, at, TD_EINVAL, "UndefinedError: '%.100s' is undefined", v.u.s->p);
    td__jr_fail(r, at, TD_EINVAL, "TypeError: %s, not %s", what, td__jv_type_name(v));
}

/* ---- scopes ---------------------------------------------------------------------------------- */

jscope_t *td__jr_scope_new(jr_t *r, jscope_t *parent)
{
    jscope_t *s = td__jarena_alloc(&r->ar, sizeof(*s));
    s->parent = parent;
    s->vars = td__jv_dict(&r->ar).u.d;
    return s;
}

static jv_t lookup(jscope_t *s, const jstr_t *name)
{
    jv_t v;
    for (; s; s = s->parent)
        if (td__jdict_get_str(s->vars, name->p, name->n, &v))
            return v;
    return (jv_t){.t = JV_UNDEF, .u.s = name};
}

static void assign(jr_t *r, jscope_t *s, const jstr_t *name, jv_t v)
{
    td__jdict_set(&r->ar, s->vars, (jv_t){.t = JV_STR, .u.s = name}, v);
}

/* ---- access ---------------------------------------------------------------------------------- */

_Noreturn static void undefined_error(jr_t *r, const node_t *at, jv_t undef)
{
    if (undef.u.s)
        td__jr_fail(r, at, TD_EINVAL, "UndefinedError: '%.100s' is undefined", undef.u.s->p);
    td__jr_fail(r, at, TD_EINVAL, "UndefinedError: a value is undefined");
}

static jv_t loop_attr(jr_t *r, jloop_t *l, const jstr_t *nm)
{
    const char *name = nm->p;
    size_t i = l->index0, n = l->length;
    if (!strcmp(name, "index"))
        return td__jv_int((int64_t)i + 1);
    if (!strcmp(name, "index0"))
        return td__jv_int((int64_t)i);
    if (!strcmp(name, "revindex"))
        return td__jv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0"))
        return td__jv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first"))
        return td__jv_bool(i == 0);
    if (!strcmp(name, "last"))
        return td__jv_bool(i + 1 == n);
    if (!strcmp(name, "length"))
        return td__jv_int((int64_t)n);
    if (!strcmp(name, "depth"))
        return td__jv_int((int64_t)l->depth0 + 1);
    if (!strcmp(name, "depth0"))
        return td__jv_int((int64_t)l->depth0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items->v[i - 1] : JV_UNDEF_V;
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items->v[i + 1] : JV_UNDEF_V;
    if (!strcmp(name, "cycle"))
        return td__jr_method(r, (jv_t){.t = JV_LOOP, .u.loop = l}, nm);
    return JV_UNDEF_V;
}

/* getattr(obj, name), then obj[name] (Jinja's order for `obj.name`). */
jv_t td__jr_getattr(jr_t *r, const node_t *at, jv_t obj, const jstr_t *name)
{
    jv_t v;
    switch (obj.t) {
    case JV_UNDEF: undefined_error(r, at, obj);
    case JV_NS:
        return td__jdict_get_str(obj.u.d, name->p, name->n, &v) ? v : JV_UNDEF_V;
    case JV_LOOP: return loop_attr(r, obj.u.loop, name);
    case JV_DICT:
        v = td__jr_method(r, obj, name);
        if (v.t != JV_UNDEF)
            return v;
        return td__jdict_get_str(obj.u.d, name->p, name->n, &v) ? v
                                                                : (jv_t){.t = JV_UNDEF, .u.s = name};
    default:
        v = td__jr_method(r, obj, name);
        return v.t != JV_UNDEF ? v : (jv_t){.t = JV_UNDEF, .u.s = name};
    }
}

static bool as_index(jv_t k, int64_t *i)
{
    if (k.t == JV_INT)
        *i = k.u.i;
    else if (k.t == JV_BOOL)
        *i = k.u.b;
    else
        return false;
    return true;
}

/* obj[key], then getattr(obj, key) for string keys (Jinja's order for `obj[key]`). */
jv_t td__jr_getitem(jr_t *r, const node_t *at, jv_t obj, jv_t key)
{
    jv_t v;
    int64_t i;
    switch (obj.t) {
    case JV_UNDEF: undefined_error(r, at, obj);
    case JV_DICT:
        if (td__jdict_get(obj.u.d, key, &v))
            return v;
        break;
    case JV_LIST:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0)
                i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : JV_UNDEF_V;
        }
        break;
    case JV_STR:
        if (as_index(key, &i)) {
            const jstr_t *s = obj.u.s;
            int64_t n = (int64_t)td__utf8_count(s->p, s->n);
            if (i < 0)
                i += n;
            if (i < 0 || i >= n)
                return JV_UNDEF_V;
            size_t b = td__utf8_offset(s->p, s->n, (size_t)i);
            size_t e = td__utf8_offset(s->p, s->n, (size_t)i + 1);
            return td__jv_str(&r->ar, s->p + b, e - b);
        }
        break;
    default: break;
    }
    if (key.t == JV_STR && obj.t != JV_DICT)
        return td__jr_getattr(r, at, obj, key.u.s);
    if (key.t == JV_STR) {
        v = td__jr_method(r, obj, key.u.s);
        if (v.t != JV_UNDEF)
            return v;
        return (jv_t){.t = JV_UNDEF, .u.s = key.u.s};
    }
    return JV_UNDEF_V;
}

static int64_t slice_arg(jr_t *r, const node_t *at, jv_t v, bool *given)
{
    int64_t i;
    *given = false;
    if (v.t == JV_NONE)
        return 0;
    if (!as_index(v, &i))
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: slice indices must be integers or None, not %s",
                    td__jv_type_name(v));
    *given = true;
    return i;
}

static int64_t clamp_index(int64_t i, bool given, int64_t def, int64_t n, int64_t step)
{
    if (!given)
        return def;
    if (i < 0) {
        i += n;
        if (i < 0)
            i = step < 0 ? -1 : 0;
    } else if (i >= n) {
        i = step < 0 ? n - 1 : n;
    }
    return i;
}

static jv_t slice(jr_t *r, const node_t *at, jv_t obj, jv_t a, jv_t b, jv_t c)
{
    if (obj.t == JV_UNDEF)
        undefined_error(r, at, obj);
    if (obj.t != JV_STR && obj.t != JV_LIST)
        return JV_UNDEF_V;
    bool ga, gb, gc;
    int64_t start = slice_arg(r, at, a, &ga), stop = slice_arg(r, at, b, &gb);
    int64_t step = slice_arg(r, at, c, &gc);
    if (!gc)
        step = 1;
    if (step == 0)
        td__jr_fail(r, at, TD_EINVAL, "ValueError: slice step cannot be zero");
    const jstr_t *s = obj.t == JV_STR ? obj.u.s : NULL;
    int64_t n = s ? (int64_t)td__utf8_count(s->p, s->n) : (int64_t)obj.u.l->n;
    start = clamp_index(start, ga, step > 0 ? 0 : n - 1, n, step);
    stop = clamp_index(stop, gb, step > 0 ? n : -1, n, step);
    if (s && step == 1) {
        if (stop <= start)
            return td__jv_str(&r->ar, "", 0);
        size_t bs = td__utf8_offset(s->p, s->n, (size_t)start);
        size_t be = td__utf8_offset(s->p, s->n, (size_t)stop);
        return td__jv_str(&r->ar, s->p + bs, be - bs);
    }
    jbuf_t out = {0};
    jv_t l = td__jv_list(&r->ar, 0);
    l.u.l->tuple = !s && obj.u.l->tuple;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (s) {
            size_t bs = td__utf8_offset(s->p, s->n, (size_t)i);
            size_t be = td__utf8_offset(s->p, s->n, (size_t)i + 1);
            td__jbuf_put(&r->ar, &out, s->p + bs, be - bs);
        } else {
            td__jlist_push(&r->ar, l.u.l, obj.u.l->v[i]);
        }
    }
    return s ? td__jbuf_str(&r->ar, &out) : l;
}

jlist_t *td__jr_iter(jr_t *r, const node_t *at, jv_t v)
{
    jv_t l;
    switch (v.t) {
    case JV_UNDEF: return td__jv_list(&r->ar, 0).u.l;
    case JV_LIST: return v.u.l;
    case JV_DICT:
        l = td__jv_list(&r->ar, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++)
            td__jlist_push(&r->ar, l.u.l, v.u.d->k[i]);
        return l.u.l;
    case JV_STR: {
        const jstr_t *s = v.u.s;
        l = td__jv_list(&r->ar, 0);
        for (size_t i = 0; i < s->n;) {
            size_t k = 1;
            while (i + k < s->n && ((unsigned char)s->p[i + k] & 0xC0) == 0x80)
                k++;
            td__jlist_push(&r->ar, l.u.l, td__jv_str(&r->ar, s->p + i, k));
            i += k;
        }
        return l.u.l;
    }
    default:
        td__jr_fail(r, at, TD_EINVAL, "TypeError: '%s' object is not iterable",
                    td__jv_type_name(v));
    }
}

/* ---- calls ----------------------------------------------------------------------------------- */


static jv_t call_macro(jr_t *r, const node_t *at, jmacro_t *m, const jv_t *args, size_t n,
                       jdict_t *kw)
{
    const node_t *def = m->def;
    if (n > def->n_kw)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: macro '%s' takes not more than %zu argument(s)",
                    def->name->p, def->n_kw);
    if (++r->depth > r->max_depth)
        td__jr_fail(r, at, TD_ERANGE, "macro calls nested deeper than %u", r->max_depth);
    td__jr_step(r, at);
    jscope_t *s = td__jr_scope_new(r, m->closure);
    for (size_t i = 0; kw && i < kw->n; i++) {
        bool known = false;
        for (size_t k = 0; k < def->n_kw; k++)
            known |= td__jv_equal(kw->k[i], (jv_t){.t = JV_STR, .u.s = def->kwnames[k]});
        if (!known)
            td__jr_fail(r, at, TD_EINVAL, "TypeError: macro '%s' takes no keyword argument '%s'",
                        def->name->p, kw->k[i].u.s->p);
    }
    for (size_t k = 0; k < def->n_kw; k++) {
        jv_t v;
        if (k < n)
            v = args[k];
        else if (kw && td__jdict_get_str(kw, def->kwnames[k]->p, def->kwnames[k]->n, &v))
            ;
        else if (def->kwargs[k])
            v = td__jr_eval(r, s, def->kwargs[k]);
        else
            v = (jv_t){.t = JV_UNDEF, .u.s = def->kwnames[k]};
        assign(r, s, def->kwnames[k], v);
    }
    jbuf_t out = {0}, *saved = r->out;
    int saved_ctl = r->loopctl;
    r->out = &out;
    td__jr_exec_body(r, s, def->body, def->n_body);
    r->out = saved;
    r->loopctl = saved_ctl;
    r->depth--;
    return td__jbuf_str(&r->ar, &out);
}

jv_t td__jr_call(jr_t *r, const node_t *at, jv_t fn, const jv_t *args, size_t n, jdict_t *kw)
{
    switch (fn.t) {
    case JV_FUNC: return fn.u.fn->call(r, at, fn.u.fn, args, n, kw);
    case JV_MACRO: return call_macro(r, at, fn.u.m, args, n, kw);
    case JV_UNDEF: undefined_error(r, at, fn);
    default:
        td__jr_fail(r, at, TD_EINVAL, "TypeError: '%s' object is not callable",
                    td__jv_type_name(fn));
    }
}

/* ---- operators ------------------------------------------------------------------------------- */

static bool is_int(jv_t v)
{
    return v.t == JV_INT || v.t == JV_BOOL;
}

static int64_t ival(jv_t v)
{
    return v.t == JV_INT ? v.u.i : v.u.b;
}

static double fval(jv_t v)
{
    return v.t == JV_FLOAT ? v.u.f : (double)ival(v);
}

_Noreturn static void bad_operands(jr_t *r, const node_t *at, const char *op, jv_t a, jv_t b)
{
    if (a.t == JV_UNDEF)
        undefined_error(r, at, a);
    if (b.t == JV_UNDEF)
        undefined_error(r, at, b);
    td__jr_fail(r, at, TD_EINVAL, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'",
                op, td__jv_type_name(a), td__jv_type_name(b));
}

static jv_t repeat(jr_t *r, const node_t *at, jv_t seq, int64_t k)
{
    if (k < 0)
        k = 0;
    size_t unit = seq.t == JV_STR ? seq.u.s->n : seq.u.l->n;
    if (unit && (uint64_t)k > r->max_output / unit)
        td__jr_fail(r, at, TD_ERANGE, "repetition larger than %zu", r->max_output);
    if (seq.t == JV_STR) {
        jbuf_t b = {0};
        for (int64_t i = 0; i < k; i++)
            td__jbuf_put(&r->ar, &b, seq.u.s->p, seq.u.s->n);
        return td__jbuf_str(&r->ar, &b);
    }
    jv_t l = td__jv_list(&r->ar, 0);
    l.u.l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++)
            td__jlist_push(&r->ar, l.u.l, seq.u.l->v[j]);
    return l;
}

static jv_t arith(jr_t *r, const node_t *at, const char *op, jv_t a, jv_t b)
{
    bool nums = (is_int(a) || a.t == JV_FLOAT) && (is_int(b) || b.t == JV_FLOAT);
    bool ints = is_int(a) && is_int(b);
    int64_t x, y, z;
    switch (op[0]) {
    case '+':
        if (ints) {
            if (__builtin_add_overflow(ival(a), ival(b), &z))
                td__jr_fail(r, at, TD_ERANGE, "integer overflow");
            return td__jv_int(z);
        }
        if (nums)
            return td__jv_float(fval(a) + fval(b));
        if (a.t == JV_STR && b.t == JV_STR) {
            jbuf_t o = {0};
            td__jbuf_put(&r->ar, &o, a.u.s->p, a.u.s->n);
            td__jbuf_put(&r->ar, &o, b.u.s->p, b.u.s->n);
            return td__jbuf_str(&r->ar, &o);
        }
        if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
            jv_t l = td__jv_list(&r->ar, a.u.l->n + b.u.l->n);
            l.u.l->tuple = a.u.l->tuple;
            for (size_t i = 0; i < a.u.l->n; i++)
                td__jlist_push(&r->ar, l.u.l, a.u.l->v[i]);
            for (size_t i = 0; i < b.u.l->n; i++)
                td__jlist_push(&r->ar, l.u.l, b.u.l->v[i]);
            return l;
        }
        break;
    case '-':
        if (ints) {
            if (__builtin_sub_overflow(ival(a), ival(b), &z))
                td__jr_fail(r, at, TD_ERANGE, "integer overflow");
            return td__jv_int(z);
        }
        if (nums)
            return td__jv_float(fval(a) - fval(b));
        break;
    case '*':
        if (op[1] == '*') {
            if (ints && ival(b) >= 0) {
                x = ival(a);
                z = 1;
                for (y = ival(b); y > 0; y--)
                    if (__builtin_mul_overflow(z, x, &z))
                        td__jr_fail(r, at, TD_ERANGE, "integer overflow");
                return td__jv_int(z);
            }
            if (nums)
                return td__jv_float(pow(fval(a), fval(b)));
            break;
        }
        if (ints) {
            if (__builtin_mul_overflow(ival(a), ival(b), &z))
                td__jr_fail(r, at, TD_ERANGE, "integer overflow");
            return td__jv_int(z);
        }
        if (nums)
            return td__jv_float(fval(a) * fval(b));
        if ((a.t == JV_STR || a.t == JV_LIST) && is_int(b))
            return repeat(r, at, a, ival(b));
        if ((b.t == JV_STR || b.t == JV_LIST) && is_int(a))
            return repeat(r, at, b, ival(a));
        break;
    case '/':
    case '%':
        if (!nums)
            break;
        if (fval(b) == 0.0)
            td__jr_fail(r, at, TD_EINVAL, "ZeroDivisionError: division by zero");
        if (op[0] == '/' && op[1] == '\0')
            return td__jv_float(fval(a) / fval(b));
        if (ints) {
            x = ival(a);
            y = ival(b);
            if (x == INT64_MIN && y == -1)
                td__jr_fail(r, at, TD_ERANGE, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return td__jv_int(op[0] == '%' ? m : q);
        }
        {
            /* CPython's float_divmod */
            double fa = fval(a), fb = fval(b), m = fmod(fa, fb), div = (fa - m) / fb;
            if (m != 0) {
                if ((fb < 0) != (m < 0)) {
                    m += fb;
                    div -= 1.0;
                }
            } else {
                m = copysign(0.0, fb);
            }
            double fl = floor(div);
            if (div - fl > 0.5)
                fl += 1.0;
            if (div == 0)
                fl = copysign(0.0, fa / fb);
            return td__jv_float(op[0] == '%' ? m : fl);
        }
    default: break;
    }
    bad_operands(r, at, op, a, b);
}

static bool contains(jr_t *r, const node_t *at, jv_t item, jv_t seq)
{
    switch (seq.t) {
    case JV_STR:
        if (item.t != JV_STR)
            td__jr_fail(r, at, TD_EINVAL,
                        "TypeError: 'in <string>' requires string as left operand, not %s",
                        td__jv_type_name(item));
        return item.u.s->n == 0 || memmem(seq.u.s->p, seq.u.s->n, item.u.s->p, item.u.s->n);
    case JV_LIST:
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (td__jv_equal(seq.u.l->v[i], item))
                return true;
        return false;
    case JV_DICT:
    case JV_NS: {
        jv_t v;
        return td__jdict_get(seq.u.d, item, &v);
    }
    case JV_UNDEF: return false;
    default:
        td__jr_fail(r, at, TD_EINVAL, "TypeError: argument of type '%s' is not iterable",
                    td__jv_type_name(seq));
    }
}

static jv_t compare(jr_t *r, const node_t *at, const char *op, jv_t a, jv_t b)
{
    if (!strcmp(op, "=="))
        return td__jv_bool(td__jv_equal(a, b));
    if (!strcmp(op, "!="))
        return td__jv_bool(!td__jv_equal(a, b));
    if (!strcmp(op, "in"))
        return td__jv_bool(contains(r, at, a, b));
    if (!strcmp(op, "notin"))
        return td__jv_bool(!contains(r, at, a, b));
    int c;
    if (!td__jv_compare(a, b, &c)) {
        if (a.t == JV_UNDEF)
            undefined_error(r, at, a);
        if (b.t == JV_UNDEF)
            undefined_error(r, at, b);
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: '%s' not supported between instances of '%s' and '%s'", op,
                    td__jv_type_name(a), td__jv_type_name(b));
    }
    switch (op[0]) {
    case '<': return td__jv_bool(op[1] ? c <= 0 : c < 0);
    default: return td__jv_bool(op[1] ? c >= 0 : c > 0);
    }
}

/* ---- expressions ----------------------------------------------------------------------------- */

static jdict_t *eval_kwargs(jr_t *r, jscope_t *s, const node_t *e)
{
    if (e->n_kw == 0)
        return NULL;
    jdict_t *kw = td__jv_dict(&r->ar).u.d;
    for (size_t i = 0; i < e->n_kw; i++)
        td__jdict_set(&r->ar, kw, (jv_t){.t = JV_STR, .u.s = e->kwnames[i]},
                      td__jr_eval(r, s, e->kwargs[i]));
    return kw;
}

static jv_t *eval_args(jr_t *r, jscope_t *s, const node_t *e)
{
    jv_t *args = td__jarena_alloc(&r->ar, (e->n_args ? e->n_args : 1) * sizeof(jv_t));
    for (size_t i = 0; i < e->n_args; i++)
        args[i] = td__jr_eval(r, s, e->args[i]);
    return args;
}

jv_t td__jr_eval(jr_t *r, jscope_t *s, const node_t *e)
{
    jv_t a, b;
    switch (e->kind) {
    case N_CONST: return e->lit;
    case N_NAME: return lookup(s, e->name);
    case N_ATTR: return td__jr_getattr(r, e, td__jr_eval(r, s, e->a), e->name);
    case N_ITEM:
        a = td__jr_eval(r, s, e->a);
        return td__jr_getitem(r, e, a, td__jr_eval(r, s, e->b));
    case N_SLICE: {
        jv_t x[3];
        for (int i = 0; i < 3; i++)
            x[i] = e->args[i] ? td__jr_eval(r, s, e->args[i]) : JV_NONE_V;
        return slice(r, e, td__jr_eval(r, s, e->a), x[0], x[1], x[2]);
    }
    case N_CALL: {
        jv_t fn = td__jr_eval(r, s, e->a);
        jv_t *args = eval_args(r, s, e);
        return td__jr_call(r, e, fn, args, e->n_args, eval_kwargs(r, s, e));
    }
    case N_FILTER: {
        a = e->a ? td__jr_eval(r, s, e->a) : r->hole;
        jv_t *args = eval_args(r, s, e);
        return td__jr_filter(r, e, e->name, a, args, e->n_args, eval_kwargs(r, s, e));
    }
    case N_TEST: {
        a = td__jr_eval(r, s, e->a);
        jv_t *args = eval_args(r, s, e);
        bool t = td__jr_test(r, e, e->name, a, args, e->n_args);
        return td__jv_bool(e->neg ? !t : t);
    }
    case N_BINOP:
        a = td__jr_eval(r, s, e->a);
        b = td__jr_eval(r, s, e->b);
        if (e->op[0] == '~') {
            jbuf_t o = {0};
            td__jv_str_to(&r->ar, &o, a);
            td__jv_str_to(&r->ar, &o, b);
            return td__jbuf_str(&r->ar, &o);
        }
        return arith(r, e, e->op, a, b);
    case N_CMP:
        a = td__jr_eval(r, s, e->a);
        return compare(r, e, e->op, a, td__jr_eval(r, s, e->b));
    case N_AND:
        a = td__jr_eval(r, s, e->a);
        return td__jv_truthy(a) ? td__jr_eval(r, s, e->b) : a;
    case N_OR:
        a = td__jr_eval(r, s, e->a);
        return td__jv_truthy(a) ? a : td__jr_eval(r, s, e->b);
    case N_NOT: return td__jv_bool(!td__jv_truthy(td__jr_eval(r, s, e->a)));
    case N_NEG:
    case N_POS:
        a = td__jr_eval(r, s, e->a);
        if (a.t == JV_FLOAT)
            return td__jv_float(e->kind == N_NEG ? -a.u.f : a.u.f);
        if (is_int(a)) {
            if (e->kind == N_NEG && ival(a) == INT64_MIN)
                td__jr_fail(r, e, TD_ERANGE, "integer overflow");
            return td__jv_int(e->kind == N_NEG ? -ival(a) : ival(a));
        }
        if (a.t == JV_UNDEF)
            undefined_error(r, e, a);
        td__jr_fail(r, e, TD_EINVAL, "TypeError: bad operand type for unary %c: '%s'",
                    e->kind == N_NEG ? '-' : '+', td__jv_type_name(a));
    case N_COND:
        if (td__jv_truthy(td__jr_eval(r, s, e->a)))
            return td__jr_eval(r, s, e->b);
        return e->c ? td__jr_eval(r, s, e->c) : JV_UNDEF_V;
    case N_LIST:
    case N_TUPLE: {
        jv_t l = td__jv_list(&r->ar, e->n_args);
        l.u.l->tuple = e->kind == N_TUPLE;
        for (size_t i = 0; i < e->n_args; i++)
            td__jlist_push(&r->ar, l.u.l, td__jr_eval(r, s, e->args[i]));
        return l;
    }
    case N_DICT: {
        jv_t d = td__jv_dict(&r->ar);
        for (size_t i = 0; i < e->n_args; i++) {
            a = td__jr_eval(r, s, e->args[i]);
            td__jdict_set(&r->ar, d.u.d, a, td__jr_eval(r, s, e->kwargs[i]));
        }
        return d;
    }
    default: td__jr_fail(r, e, TD_EINTERNAL, "not an expression");
    }
}

/* ---- statements ------------------------------------------------------------------------------ */

static void assign_target(jr_t *r, jscope_t *s, const node_t *t, jv_t v)
{
    if (t->kind == N_NAME) {
        assign(r, s, t->name, v);
        return;
    }
    if (t->kind == N_ATTR) {
        jv_t ns = lookup(s, t->a->name);
        if (ns.t != JV_NS)
            td__jr_fail(r, t, TD_EINVAL,
                        "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        td__jdict_set(&r->ar, ns.u.d, (jv_t){.t = JV_STR, .u.s = t->name}, v);
        return;
    }
    jlist_t *items = td__jr_iter(r, t, v);
    if (items->n != t->n_args)
        td__jr_fail(r, t, TD_EINVAL, "ValueError: %s values to unpack (expected %zu, got %zu)",
                    items->n > t->n_args ? "too many" : "not enough", t->n_args, items->n);
    for (size_t i = 0; i < t->n_args; i++)
        assign_target(r, s, t->args[i], items->v[i]);
}

static jv_t capture(jr_t *r, jscope_t *s, node_t *const *body, size_t n)
{
    jbuf_t out = {0}, *saved = r->out;
    r->out = &out;
    td__jr_exec_body(r, s, body, n);
    r->out = saved;
    return td__jbuf_str(&r->ar, &out);
}

static jv_t apply_chain(jr_t *r, jscope_t *s, const node_t *chain, jv_t v)
{
    jv_t saved = r->hole;
    r->hole = v;
    v = td__jr_eval(r, s, chain);
    r->hole = saved;
    return v;
}

static void exec_for(jr_t *r, jscope_t *outer, const node_t *st)
{
    jlist_t *items = td__jr_iter(r, st, td__jr_eval(r, outer, st->b));
    jscope_t *s = td__jr_scope_new(r, outer);
    const jstr_t *ln = td__jv_cstr(&r->ar, "loop").u.s;
    if (st->c) { /* the loop's `if`: filter first, so loop.length counts what is left */
        jv_t kept = td__jv_list(&r->ar, 0);
        for (size_t i = 0; i < items->n; i++) {
            td__jr_step(r, st);
            assign_target(r, s, st->a, items->v[i]);
            if (td__jv_truthy(td__jr_eval(r, s, st->c)))
                td__jlist_push(&r->ar, kept.u.l, items->v[i]);
        }
        items = kept.u.l;
    }
    jloop_t *loop = td__jarena_alloc(&r->ar, sizeof(*loop));
    loop->items = items;
    loop->length = items->n; /* depth0 stays 0: only recursive loops (refused) nest depths */
    for (size_t i = 0; i < items->n; i++) {
        td__jr_step(r, st);
        s->vars->n = 0; /* what an iteration sets does not reach the next one */
        loop->index0 = i;
        assign(r, s, ln, (jv_t){.t = JV_LOOP, .u.loop = loop});
        assign_target(r, s, st->a, items->v[i]);
        td__jr_exec_body(r, s, st->body, st->n_body);
        if (r->loopctl == 1) {
            r->loopctl = 0;
            break;
        }
        r->loopctl = 0;
    }
    if (items->n == 0 && st->n_orelse)
        td__jr_exec_body(r, outer, st->orelse, st->n_orelse);
}

static void exec_stmt(jr_t *r, jscope_t *s, const node_t *st)
{
    switch (st->kind) {
    case N_DATA: emit(r, st, st->lit.u.s->p, st->lit.u.s->n); return;
    case N_OUTPUT: {
        jv_t v = td__jr_eval(r, s, st->a);
        if (v.t == JV_STR) {
            emit(r, st, v.u.s->p, v.u.s->n);
        } else {
            jbuf_t b = {0};
            td__jv_str_to(&r->ar, &b, v);
            emit(r, st, b.p, b.n);
        }
        return;
    }
    case N_IF:
        if (td__jv_truthy(td__jr_eval(r, s, st->a)))
            td__jr_exec_body(r, s, st->body, st->n_body);
        else
            td__jr_exec_body(r, s, st->orelse, st->n_orelse);
        return;
    case N_FOR: exec_for(r, s, st); return;
    case N_SET: assign_target(r, s, st->a, td__jr_eval(r, s, st->b)); return;
    case N_SETBLOCK: {
        jv_t v = capture(r, s, st->body, st->n_body);
        if (st->c)
            v = apply_chain(r, s, st->c, v);
        assign_target(r, s, st->a, v);
        return;
    }
    case N_MACRO: {
        jmacro_t *m = td__jarena_alloc(&r->ar, sizeof(*m));
        m->def = st;
        m->closure = s;
        assign(r, s, st->name, (jv_t){.t = JV_MACRO, .u.m = m});
        return;
    }
    case N_FILTERBLK: {
        if (!st->c) {
            td__jr_exec_body(r, s, st->body, st->n_body);
            return;
        }
        jv_t v = apply_chain(r, s, st->c, capture(r, s, st->body, st->n_body));
        jbuf_t b = {0};
        td__jv_str_to(&r->ar, &b, v);
        emit(r, st, b.p, b.n);
        return;
    }
    case N_BREAK: r->loopctl = 1; return;
    case N_CONTINUE: r->loopctl = 2; return;
    default: td__jr_fail(r, st, TD_EINTERNAL, "not a statement");
    }
}

void td__jr_exec_body(jr_t *r, jscope_t *s, node_t *const *body, size_t n)
{
    for (size_t i = 0; i < n && r->loopctl == 0; i++)
        exec_stmt(r, s, body[i]);
}

void td__jr_set_raised(void)
{
    raised = true;
}

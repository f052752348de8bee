/* jinja_tests.c: Jinja2's tests (`x is defined`, `x is divisibleby 3`, ...) with Python's
 * semantics: boolean callable defined divisibleby eq equalto escaped even false filter float ge gt
 * greaterthan in integer iterable le lower lessthan lt mapping ne none number odd sameas sequence
 * string test true undefined upper, and == != < <= > >=. */
#include "jinja_impl.h"

#include "td_error.h"

#include <string.h>

/* ---- tests ----------------------------------------------------------------------------------- */

static const char *const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false",
    "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lower",
    "lessthan", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string",
    "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};

bool td__jr_has_test(const char *name)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(test_names); i++)
        if (!strcmp(name, test_names[i]))
            return true;
    return false;
}

static bool cmp_test(jr_t *r, const node_t *at, const char *op, jv_t a, jv_t b)
{
    int c;
    if (!td__jv_compare(a, b, &c))
        td__jr_fail(r, at, TD_EINVAL,
                    "TypeError: '%s' not supported between instances of '%s' and '%s'", op,
                    td__jv_type_name(a), td__jv_type_name(b));
    if (op[0] == '<')
        return op[1] ? c <= 0 : c < 0;
    return op[1] ? c >= 0 : c > 0;
}

/* Tests that take one argument; the others take none. */
static const char *const tests_with_arg[] = {"divisibleby", "eq", "equalto", "ne", "sameas",
                                             "lt", "lessthan", "le", "gt", "greaterthan",
                                             "ge", "in", "==", "!=", "<", "<=", ">", ">="};

bool td__jr_test(jr_t *r, const node_t *at, const jstr_t *name, jv_t v, const jv_t *args,
                 size_t n)
{
    const char *t = name->p;
    size_t want = 0;
    for (size_t i = 0; i < TD_ARRAY_LEN(tests_with_arg); i++)
        if (!strcmp(t, tests_with_arg[i]))
            want = 1;
    if (n != want)
        td__jr_fail(r, at, TD_EINVAL, "TypeError: test '%s' takes %zu argument(s) (%zu given)", t,
                    want, n);
    jv_t a0 = n > 0 ? args[0] : JV_UNDEF_V;
    int64_t len;
    if (!strcmp(t, "defined"))
        return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined"))
        return v.t == JV_UNDEF;
    if (!strcmp(t, "none"))
        return v.t == JV_NONE;
    if (!strcmp(t, "boolean"))
        return v.t == JV_BOOL;
    if (!strcmp(t, "true") || !strcmp(t, "false"))
        return v.t == JV_BOOL && v.u.b == (t[0] == 't');
    if (!strcmp(t, "integer"))
        return v.t == JV_INT;
    if (!strcmp(t, "float"))
        return v.t == JV_FLOAT;
    if (!strcmp(t, "number"))
        return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (!strcmp(t, "string"))
        return v.t == JV_STR;
    if (!strcmp(t, "mapping"))
        return v.t == JV_DICT;
    if (!strcmp(t, "iterable"))
        return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (!strcmp(t, "sequence"))
        return td__jv_len(v, &len) && v.t != JV_UNDEF;
    if (!strcmp(t, "callable"))
        return v.t == JV_FUNC || v.t == JV_MACRO || v.t == JV_UNDEF;
    if (!strcmp(t, "escaped"))
        return false;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != JV_STR)
            return false;
        jv_t c = td__jr_recase(r, v.u.s, t[0] == 'l' ? 3 : 4);
        return td__jv_equal(c, v);
    }
    if (!strcmp(t, "even") || !strcmp(t, "odd") || !strcmp(t, "divisibleby")) {
        if (v.t != JV_INT && v.t != JV_BOOL)
            td__jr_type_error(r, at, "the value must be an integer", v);
        int64_t x = v.t == JV_INT ? v.u.i : v.u.b, d = 2;
        if (t[0] == 'd') {
            if (a0.t != JV_INT || a0.u.i == 0)
                td__jr_type_error(r, at, "divisibleby needs a non-zero integer", a0);
            d = a0.u.i;
        }
        int64_t m = x % d;
        return t[0] == 'o' ? m != 0 : m == 0;
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "=="))
        return td__jv_equal(v, a0);
    if (!strcmp(t, "ne") || !strcmp(t, "!="))
        return !td__jv_equal(v, a0);
    if (!strcmp(t, "sameas"))
        return v.t == a0.t && v.t != JV_UNDEF && (v.t == JV_NONE ? true
                               : v.t == JV_BOOL                  ? v.u.b == a0.u.b
                                                                 : td__jv_equal(v, a0));
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<"))
        return cmp_test(r, at, "<", v, a0);
    if (!strcmp(t, "le") || !strcmp(t, "<="))
        return cmp_test(r, at, "<=", v, a0);
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">"))
        return cmp_test(r, at, ">", v, a0);
    if (!strcmp(t, "ge") || !strcmp(t, ">="))
        return cmp_test(r, at, ">=", v, a0);
    if (!strcmp(t, "in")) {
        jlist_t *l = td__jr_iter(r, at, a0);
        if (a0.t == JV_STR && v.t != JV_STR)
            td__jr_type_error(r, at, "'in <string>' requires string as left operand", v);
        if (a0.t == JV_STR)
            return v.t == JV_STR && (v.u.s->n == 0 || memmem(a0.u.s->p, a0.u.s->n, v.u.s->p,
                                                             v.u.s->n) != NULL);
        for (size_t i = 0; i < l->n; i++)
            if (td__jv_equal(l->v[i], v))
                return true;
        return false;
    }
    if (!strcmp(t, "filter") || !strcmp(t, "test"))
        return v.t == JV_STR && (t[0] == 'f' ? td__jr_has_filter(v.u.s->p)
                                             : td__jr_has_test(v.u.s->p));
    td__jr_fail(r, at, TD_EINTERNAL, "no test named '%s'", t);
}


/* jinja_parse.c: tokens -> tree, with Jinja2's grammar and operator precedence (lowest first):
 * conditional `x if c else y`, or, and, not, comparisons and `in` (chained), + -, ~, * / // %,
 * **, unary - +, then primaries with .attr, [item], [a:b:c], (call), | filter and `is` test. */
#include "jinja_impl.h"

#include "td_error.h"

#include <stdio.h>
#include <string.h>

#define MAX_NESTING 200

typedef struct parser {
    jparse_ctx_t *pc;
    const jtok_t *t;
    size_t n, i;
    int nesting;
} parser_t;

static node_t *parse_expr(parser_t *p, bool with_cond);
static node_t *parse_tuple(parser_t *p, bool with_cond, bool explicit_parens);
static node_t *parse_unary(parser_t *p, bool with_filter);
static void parse_body(parser_t *p, const char *const *ends, node_t ***out, size_t *n_out);

static const jtok_t *cur(parser_t *p)
{
    return &p->t[p->i];
}

static const jtok_t *advance(parser_t *p)
{
    const jtok_t *k = &p->t[p->i];
    if (k->t != JT_EOF)
        p->i++;
    return k;
}

static bool is_op(const jtok_t *k, const char *op)
{
    return k->t == JT_OP && strcmp(k->op, op) == 0;
}

static bool is_name(const jtok_t *k, const char *name)
{
    return k->t == JT_NAME && strcmp(k->s->p, name) == 0;
}

static const char *describe(const jtok_t *k, char *buf, size_t cap)
{
    switch (k->t) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "string literal";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    case JT_NAME: snprintf(buf, cap, "'%.40s'", k->s->p); return buf;
    case JT_OP: snprintf(buf, cap, "'%s'", k->op); return buf;
    }
    return "token";
}

_Noreturn static void fail_at(parser_t *p, const jtok_t *k, const char *fmt, const char *arg)
{
    td__jinja_parse_fail(p->pc, TD_EPARSE, k->line, k->col, fmt, arg);
}

_Noreturn static void unexpected(parser_t *p, const char *expected)
{
    char buf[64], msg[200];
    const jtok_t *k = cur(p);
    snprintf(msg, sizeof(msg), "unexpected %s, expected %s", describe(k, buf, sizeof(buf)),
             expected);
    fail_at(p, k, "%s", msg);
}

static void expect_op(parser_t *p, const char *op)
{
    if (!is_op(cur(p), op)) {
        char e[16];
        snprintf(e, sizeof(e), "'%s'", op);
        unexpected(p, e);
    }
    advance(p);
}

static const jstr_t *expect_name(parser_t *p)
{
    if (cur(p)->t != JT_NAME)
        unexpected(p, "a name");
    return advance(p)->s;
}

static void expect_block_end(parser_t *p)
{
    if (cur(p)->t != JT_BLOCK_END)
        unexpected(p, "'%}'");
    advance(p);
}

static node_t *mk(parser_t *p, node_kind_t kind, int line)
{
    node_t *nd = td__jarena_alloc(p->pc->ar, sizeof(*nd));
    nd->kind = kind;
    nd->line = line;
    return nd;
}

/* A growing node list in the arena. */
typedef struct nlist {
    node_t **v;
    size_t n, cap;
    const jstr_t **names;
} nlist_t;

static void nl_push(parser_t *p, nlist_t *l, node_t *nd, const jstr_t *name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        node_t **v = td__jarena_alloc(p->pc->ar, cap * sizeof(*v));
        const jstr_t **nm = td__jarena_alloc(p->pc->ar, cap * sizeof(*nm));
        if (l->n) {
            memcpy(v, l->v, l->n * sizeof(*v));
            memcpy(nm, l->names, l->n * sizeof(*nm));
        }
        l->v = v;
        l->names = nm;
        l->cap = cap;
    }
    l->names[l->n] = name;
    l->v[l->n++] = nd;
}

static void enter(parser_t *p)
{
    if (++p->nesting > MAX_NESTING)
        fail_at(p, cur(p), "%s", "template nested too deeply");
}

/* ---- expressions ----------------------------------------------------------------------------- */

/* ( args, name=value ) after the '(' has been seen */
static void parse_call_args(parser_t *p, node_t *nd)
{
    nlist_t pos = {0}, kw = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (pos.n + kw.n > 0)
            expect_op(p, ",");
        if (is_op(cur(p), ")"))
            break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            td__jinja_parse_fail(p->pc, TD_ENOTSUP, cur(p)->line, cur(p)->col,
                                 "*args and **kwargs in calls are not supported");
        if (cur(p)->t == JT_NAME && is_op(&p->t[p->i + 1], "=")) {
            const jstr_t *name = advance(p)->s;
            advance(p);
            nl_push(p, &kw, parse_expr(p, true), name);
        } else {
            if (kw.n > 0)
                fail_at(p, cur(p), "%s", "positional argument after keyword argument");
            nl_push(p, &pos, parse_expr(p, true), NULL);
        }
    }
    advance(p);
    nd->args = pos.v;
    nd->n_args = pos.n;
    nd->kwargs = kw.v;
    nd->kwnames = kw.names;
    nd->n_kw = kw.n;
}

static const jstr_t *dotted_name(parser_t *p)
{
    const jstr_t *name = expect_name(p);
    while (is_op(cur(p), ".") && p->t[p->i + 1].t == JT_NAME) {
        advance(p);
        const jstr_t *more = advance(p)->s;
        size_t n = name->n + 1 + more->n;
        jstr_t *s = td__jarena_alloc(p->pc->ar, sizeof(*s) + n + 1);
        memcpy(s->p, name->p, name->n);
        s->p[name->n] = '.';
        memcpy(s->p + name->n + 1, more->p, more->n);
        s->n = n;
        name = s;
    }
    return name;
}

static node_t *parse_filter(parser_t *p, node_t *operand)
{
    const jtok_t *k = cur(p);
    node_t *nd = mk(p, N_FILTER, k->line);
    nd->a = operand;
    nd->name = dotted_name(p);
    if (!td__jr_has_filter(nd->name->p))
        td__jinja_parse_fail(p->pc, TD_EPARSE, k->line, k->col, "no filter named '%.60s'",
                             nd->name->p);
    if (is_op(cur(p), "("))
        parse_call_args(p, nd);
    return nd;
}

static node_t *parse_primary(parser_t *p);

static node_t *parse_postfix(parser_t *p, node_t *nd);

static node_t *parse_test(parser_t *p, node_t *operand)
{
    const jtok_t *k = advance(p); /* is */
    node_t *nd = mk(p, N_TEST, k->line);
    nd->a = operand;
    if (is_name(cur(p), "not")) {
        advance(p);
        nd->neg = true;
    }
    const jtok_t *nk = cur(p);
    nd->name = dotted_name(p);
    if (!td__jr_has_test(nd->name->p))
        td__jinja_parse_fail(p->pc, TD_EPARSE, nk->line, nk->col, "no test named '%.60s'",
                             nd->name->p);
    const jtok_t *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, nd);
    } else if ((c->t == JT_NAME || c->t == JT_STRING || c->t == JT_INT || c->t == JT_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            fail_at(p, c, "%s", "you cannot chain multiple tests with is");
        node_t *arg = parse_postfix(p, parse_primary(p));
        nd->args = td__jarena_alloc(p->pc->ar, sizeof(node_t *));
        nd->args[0] = arg;
        nd->n_args = 1;
    }
    return nd;
}

static node_t *parse_subscript(parser_t *p, node_t *obj, int line)
{
    node_t *args[3] = {NULL, NULL, NULL};
    bool slice = false;
    if (!is_op(cur(p), ":"))
        args[0] = parse_expr(p, true);
    if (is_op(cur(p), ":")) {
        slice = true;
        advance(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ":"))
            args[1] = parse_expr(p, true);
        if (is_op(cur(p), ":")) {
            advance(p);
            if (!is_op(cur(p), "]"))
                args[2] = parse_expr(p, true);
        }
    }
    expect_op(p, "]");
    node_t *nd = mk(p, slice ? N_SLICE : N_ITEM, line);
    nd->a = obj;
    if (slice) {
        nd->args = td__jarena_alloc(p->pc->ar, 3 * sizeof(node_t *));
        memcpy(nd->args, args, sizeof(args));
        nd->n_args = 3;
    } else {
        nd->b = args[0];
    }
    return nd;
}

static node_t *parse_postfix(parser_t *p, node_t *nd)
{
    for (;;) {
        const jtok_t *k = cur(p);
        if (is_op(k, ".")) {
            advance(p);
            const jtok_t *a = cur(p);
            if (a->t == JT_NAME) {
                node_t *at = mk(p, N_ATTR, k->line);
                at->a = nd;
                at->name = advance(p)->s;
                nd = at;
            } else if (a->t == JT_INT) {
                node_t *it = mk(p, N_ITEM, k->line);
                it->a = nd;
                it->b = mk(p, N_CONST, k->line);
                it->b->lit = td__jv_int(advance(p)->i);
                nd = it;
            } else {
                unexpected(p, "an attribute name");
            }
        } else if (is_op(k, "[")) {
            advance(p);
            nd = parse_subscript(p, nd, k->line);
        } else if (is_op(k, "(")) {
            node_t *c = mk(p, N_CALL, k->line);
            c->a = nd;
            parse_call_args(p, c);
            nd = c;
        } else {
            return nd;
        }
    }
}

static node_t *parse_filter_expr(parser_t *p, node_t *nd)
{
    for (;;) {
        const jtok_t *k = cur(p);
        if (is_op(k, "|")) {
            advance(p);
            nd = parse_filter(p, nd);
        } else if (is_name(k, "is")) {
            nd = parse_test(p, nd);
        } else if (is_op(k, "(")) {
            node_t *c = mk(p, N_CALL, k->line);
            c->a = nd;
            parse_call_args(p, c);
            nd = c;
        } else {
            return nd;
        }
    }
}

static node_t *parse_seq(parser_t *p, node_kind_t kind, const char *close, int line)
{
    nlist_t l = {0}, vals = {0};
    while (!is_op(cur(p), close)) {
        if (l.n > 0) {
            expect_op(p, ",");
            if (is_op(cur(p), close))
                break;
        }
        nl_push(p, &l, parse_expr(p, true), NULL);
        if (kind == N_DICT) {
            expect_op(p, ":");
            nl_push(p, &vals, parse_expr(p, true), NULL);
        }
    }
    advance(p);
    node_t *nd = mk(p, kind, line);
    nd->args = l.v;
    nd->n_args = l.n;
    nd->kwargs = vals.v;
    nd->n_kw = vals.n;
    return nd;
}

static node_t *parse_primary(parser_t *p)
{
    const jtok_t *k = cur(p);
    node_t *nd;
    enter(p);
    if (k->t == JT_NAME) {
        advance(p);
        const char *s = k->s->p;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") ||
            !strcmp(s, "False")) {
            nd = mk(p, N_CONST, k->line);
            nd->lit = td__jv_bool(s[0] == 't' || s[0] == 'T');
        } else if (!strcmp(s, "none") || !strcmp(s, "None")) {
            nd = mk(p, N_CONST, k->line);
            nd->lit = JV_NONE_V;
        } else {
            nd = mk(p, N_NAME, k->line);
            nd->name = k->s;
        }
    } else if (k->t == JT_STRING) {
        jbuf_t b = {0};
        while (cur(p)->t == JT_STRING) {
            const jstr_t *s = advance(p)->s;
            td__jbuf_put(p->pc->ar, &b, s->p, s->n);
        }
        nd = mk(p, N_CONST, k->line);
        nd->lit = td__jbuf_str(p->pc->ar, &b);
    } else if (k->t == JT_INT || k->t == JT_FLOAT) {
        advance(p);
        nd = mk(p, N_CONST, k->line);
        nd->lit = k->t == JT_INT ? td__jv_int(k->i) : td__jv_float(k->f);
    } else if (is_op(k, "(")) {
        advance(p);
        nd = parse_tuple(p, true, true);
        expect_op(p, ")");
    } else if (is_op(k, "[")) {
        advance(p);
        nd = parse_seq(p, N_LIST, "]", k->line);
    } else if (is_op(k, "{")) {
        advance(p);
        nd = parse_seq(p, N_DICT, "}", k->line);
    } else {
        unexpected(p, "an expression");
    }
    p->nesting--;
    return nd;
}

static node_t *parse_unary(parser_t *p, bool with_filter)
{
    const jtok_t *k = cur(p);
    node_t *nd;
    enter(p);
    if (is_op(k, "-") || is_op(k, "+")) {
        advance(p);
        nd = mk(p, k->op[0] == '-' ? N_NEG : N_POS, k->line);
        nd->a = parse_unary(p, false);
    } else {
        nd = parse_primary(p);
    }
    nd = parse_postfix(p, nd);
    if (with_filter)
        nd = parse_filter_expr(p, nd);
    p->nesting--;
    return nd;
}

static node_t *binop(parser_t *p, node_kind_t kind, const char *op, node_t *a, node_t *b,
                     int line)
{
    node_t *nd = mk(p, kind, line);
    snprintf(nd->op, sizeof(nd->op), "%s", op);
    nd->a = a;
    nd->b = b;
    return nd;
}

static node_t *parse_pow(parser_t *p)
{
    node_t *l = parse_unary(p, true);
    while (is_op(cur(p), "**")) {
        int line = advance(p)->line;
        l = binop(p, N_BINOP, "**", l, parse_unary(p, true), line);
    }
    return l;
}

static node_t *parse_math2(parser_t *p)
{
    node_t *l = parse_pow(p);
    while (is_op(cur(p), "*") || is_op(cur(p), "/") || is_op(cur(p), "//") ||
           is_op(cur(p), "%")) {
        const jtok_t *k = advance(p);
        l = binop(p, N_BINOP, k->op, l, parse_pow(p), k->line);
    }
    return l;
}

static node_t *parse_concat(parser_t *p)
{
    node_t *l = parse_math2(p);
    while (is_op(cur(p), "~")) {
        int line = advance(p)->line;
        l = binop(p, N_BINOP, "~", l, parse_math2(p), line);
    }
    return l;
}

static node_t *parse_math1(parser_t *p)
{
    node_t *l = parse_concat(p);
    while (is_op(cur(p), "+") || is_op(cur(p), "-")) {
        const jtok_t *k = advance(p);
        l = binop(p, N_BINOP, k->op, l, parse_concat(p), k->line);
    }
    return l;
}

static node_t *parse_compare(parser_t *p)
{
    node_t *left = parse_math1(p), *result = NULL;
    for (;;) {
        const jtok_t *k = cur(p);
        const char *op = NULL;
        if (k->t == JT_OP && (!strcmp(k->op, "==") || !strcmp(k->op, "!=") ||
                              !strcmp(k->op, "<") || !strcmp(k->op, ">") ||
                              !strcmp(k->op, "<=") || !strcmp(k->op, ">="))) {
            op = k->op;
            advance(p);
        } else if (is_name(k, "in")) {
            op = "in";
            advance(p);
        } else if (is_name(k, "not") && is_name(&p->t[p->i + 1], "in")) {
            op = "notin";
            advance(p);
            advance(p);
        } else {
            break;
        }
        node_t *right = parse_math1(p);
        node_t *cmp = binop(p, N_CMP, op, left, right, k->line);
        result = result ? binop(p, N_AND, "", result, cmp, k->line) : cmp;
        left = right;
    }
    return result ? result : left;
}

static node_t *parse_not(parser_t *p)
{
    if (is_name(cur(p), "not")) {
        int line = advance(p)->line;
        enter(p);
        node_t *nd = mk(p, N_NOT, line);
        nd->a = parse_not(p);
        p->nesting--;
        return nd;
    }
    return parse_compare(p);
}

static node_t *parse_and(parser_t *p)
{
    node_t *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        int line = advance(p)->line;
        l = binop(p, N_AND, "", l, parse_not(p), line);
    }
    return l;
}

static node_t *parse_or(parser_t *p)
{
    node_t *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        int line = advance(p)->line;
        l = binop(p, N_OR, "", l, parse_and(p), line);
    }
    return l;
}

static node_t *parse_expr(parser_t *p, bool with_cond)
{
    enter(p);
    node_t *e = parse_or(p);
    while (with_cond && is_name(cur(p), "if")) {
        int line = advance(p)->line;
        node_t *nd = mk(p, N_COND, line);
        nd->b = e;
        nd->a = parse_or(p);
        if (is_name(cur(p), "else")) {
            advance(p);
            nd->c = parse_expr(p, true);
        }
        e = nd;
    }
    p->nesting--;
    return e;
}

/* An expression, or a tuple of them when commas follow. */
static node_t *parse_tuple(parser_t *p, bool with_cond, bool explicit_parens)
{
    int line = cur(p)->line;
    nlist_t l = {0};
    bool comma = false;
    for (;;) {
        const jtok_t *k = cur(p);
        if (l.n > 0 || comma) {
            if (k->t == JT_BLOCK_END || k->t == JT_VAR_END || is_op(k, ")") ||
                is_name(k, "in") || is_name(k, "if"))
                break;
        }
        if (explicit_parens && l.n == 0 && is_op(k, ")"))
            break;
        nl_push(p, &l, parse_expr(p, with_cond), NULL);
        if (!is_op(cur(p), ","))
            break;
        comma = true;
        advance(p);
    }
    if (l.n == 1 && !comma)
        return l.v[0];
    node_t *nd = mk(p, N_TUPLE, line);
    nd->args = l.v;
    nd->n_args = l.n;
    return nd;
}

/* ---- statements ------------------------------------------------------------------------------ */

/* A name, `ns.attr` (with_ns), or a tuple of names. */
static node_t *parse_target(parser_t *p, bool with_ns)
{
    const jtok_t *k = cur(p);
    if (with_ns && k->t == JT_NAME && is_op(&p->t[p->i + 1], ".") &&
        p->t[p->i + 2].t == JT_NAME) {
        node_t *nd = mk(p, N_ATTR, k->line);
        nd->a = mk(p, N_NAME, k->line);
        nd->a->name = advance(p)->s;
        advance(p);
        nd->name = advance(p)->s;
        return nd;
    }
    nlist_t l = {0};
    bool parens = false, comma = false;
    if (is_op(k, "(")) {
        parens = true;
        advance(p);
    }
    for (;;) {
        const jtok_t *nk = cur(p);
        if (nk->t != JT_NAME)
            unexpected(p, "a name to assign to");
        node_t *nd = mk(p, N_NAME, nk->line);
        nd->name = advance(p)->s;
        nl_push(p, &l, nd, NULL);
        if (!is_op(cur(p), ","))
            break;
        comma = true;
        advance(p);
        if (cur(p)->t != JT_NAME)
            break;
    }
    if (parens)
        expect_op(p, ")");
    if (l.n == 1 && !comma)
        return l.v[0];
    node_t *nd = mk(p, N_TUPLE, k->line);
    nd->args = l.v;
    nd->n_args = l.n;
    return nd;
}

static node_t *parse_for(parser_t *p, const jtok_t *tag)
{
    node_t *nd = mk(p, N_FOR, tag->line);
    nd->a = parse_target(p, false);
    if (!is_name(cur(p), "in"))
        unexpected(p, "'in'");
    advance(p);
    nd->b = parse_tuple(p, false, false);
    if (is_name(cur(p), "if")) {
        advance(p);
        nd->c = parse_expr(p, true);
    }
    if (is_name(cur(p), "recursive"))
        td__jinja_parse_fail(p->pc, TD_ENOTSUP, cur(p)->line, cur(p)->col,
                             "recursive loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"endfor", "else", NULL};
    parse_body(p, ends, &nd->body, &nd->n_body);
    if (is_name(cur(p), "else")) {
        advance(p);
        expect_block_end(p);
        static const char *const ends2[] = {"endfor", NULL};
        parse_body(p, ends2, &nd->orelse, &nd->n_orelse);
    }
    advance(p); /* endfor */
    expect_block_end(p);
    return nd;
}

static node_t *parse_if(parser_t *p, const jtok_t *tag)
{
    node_t *nd = mk(p, N_IF, tag->line);
    nd->a = parse_tuple(p, false, false);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    parse_body(p, ends, &nd->body, &nd->n_body);
    const jtok_t *k = advance(p);
    if (is_name(k, "elif")) {
        nd->orelse = td__jarena_alloc(p->pc->ar, sizeof(node_t *));
        nd->orelse[0] = parse_if(p, k); /* consumes through endif */
        nd->n_orelse = 1;
        return nd;
    }
    if (is_name(k, "else")) {
        expect_block_end(p);
        static const char *const ends2[] = {"endif", NULL};
        parse_body(p, ends2, &nd->orelse, &nd->n_orelse);
        advance(p);
    }
    expect_block_end(p);
    return nd;
}

static node_t *parse_set(parser_t *p, const jtok_t *tag)
{
    node_t *target = parse_target(p, true);
    if (is_op(cur(p), "=")) {
        advance(p);
        node_t *nd = mk(p, N_SET, tag->line);
        nd->a = target;
        nd->b = parse_tuple(p, true, false);
        expect_block_end(p);
        return nd;
    }
    node_t *nd = mk(p, N_SETBLOCK, tag->line);
    nd->a = target;
    if (is_op(cur(p), "|")) {
        advance(p);
        nd->c = parse_filter_expr(p, parse_filter(p, NULL));
    }
    expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    parse_body(p, ends, &nd->body, &nd->n_body);
    advance(p);
    expect_block_end(p);
    return nd;
}

static node_t *parse_macro(parser_t *p, const jtok_t *tag)
{
    node_t *nd = mk(p, N_MACRO, tag->line);
    nd->name = expect_name(p);
    nlist_t params = {0};
    expect_op(p, "(");
    bool defaults = false;
    while (!is_op(cur(p), ")")) {
        if (params.n > 0)
            expect_op(p, ",");
        if (is_op(cur(p), ")"))
            break;
        const jtok_t *nk = cur(p);
        const jstr_t *name = expect_name(p);
        node_t *def = NULL;
        if (is_op(cur(p), "=")) {
            advance(p);
            def = parse_expr(p, true);
            defaults = true;
        } else if (defaults) {
            fail_at(p, nk, "%s", "non-default argument follows default argument");
        }
        nl_push(p, &params, def, name);
    }
    advance(p);
    expect_block_end(p);
    nd->kwargs = params.v;
    nd->kwnames = params.names;
    nd->n_kw = params.n;
    static const char *const ends[] = {"endmacro", NULL};
    parse_body(p, ends, &nd->body, &nd->n_body);
    advance(p);
    expect_block_end(p);
    return nd;
}

static node_t *parse_statement(parser_t *p)
{
    const jtok_t *open = advance(p); /* {% */
    const jtok_t *tag = cur(p);
    if (tag->t != JT_NAME)
        unexpected(p, "a statement name");
    advance(p);
    const char *s = tag->s->p;
    node_t *nd;
    if (!strcmp(s, "for"))
        return parse_for(p, tag);
    if (!strcmp(s, "if"))
        return parse_if(p, tag);
    if (!strcmp(s, "set"))
        return parse_set(p, tag);
    if (!strcmp(s, "macro"))
        return parse_macro(p, tag);
    if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        nd = mk(p, s[0] == 'b' ? N_BREAK : N_CONTINUE, tag->line);
        expect_block_end(p);
        return nd;
    }
    if (!strcmp(s, "filter") || !strcmp(s, "generation")) {
        nd = mk(p, N_FILTERBLK, tag->line);
        if (s[0] == 'f')
            nd->c = parse_filter_expr(p, parse_filter(p, NULL));
        expect_block_end(p);
        const char *const ends[] = {s[0] == 'f' ? "endfilter" : "endgeneration", NULL};
        parse_body(p, ends, &nd->body, &nd->n_body);
        advance(p);
        expect_block_end(p);
        return nd;
    }
    static const char *const unsupported[] = {"include", "extends", "import", "from", "block",
                                              "call", "with", "autoescape", "trans"};
    for (size_t k = 0; k < TD_ARRAY_LEN(unsupported); k++)
        if (!strcmp(s, unsupported[k]))
            td__jinja_parse_fail(p->pc, TD_ENOTSUP, tag->line, tag->col,
                                 "the '%s' statement is not supported", s);
    (void)open;
    td__jinja_parse_fail(p->pc, TD_EPARSE, tag->line, tag->col, "unknown tag '%.40s'", s);
}

static bool at_end_tag(parser_t *p, const char *const *ends)
{
    if (cur(p)->t != JT_BLOCK_BEGIN || p->t[p->i + 1].t != JT_NAME)
        return false;
    for (size_t k = 0; ends && ends[k]; k++)
        if (is_name(&p->t[p->i + 1], ends[k]))
            return true;
    return false;
}

/* Statements up to one of `ends` (left with the name of that end tag current) or EOF. */
static void parse_body(parser_t *p, const char *const *ends, node_t ***out, size_t *n_out)
{
    nlist_t l = {0};
    const jtok_t *start = p->i > 0 ? &p->t[p->i - 1] : cur(p);
    enter(p);
    for (;;) {
        const jtok_t *k = cur(p);
        if (k->t == JT_EOF) {
            if (ends) {
                char msg[200];
                const char *need = ends[0];
                for (size_t e = 0; ends[e]; e++)
                    if (!strncmp(ends[e], "end", 3))
                        need = ends[e];
                snprintf(msg, sizeof(msg),
                         "unexpected end of template: the block opened at line %d needs '%s'",
                         start->line, need);
                fail_at(p, k, "%s", msg);
            }
            break;
        }
        if (at_end_tag(p, ends)) {
            advance(p); /* {% ; the end name is current */
            break;
        }
        if (k->t == JT_DATA) {
            node_t *nd = mk(p, N_DATA, k->line);
            nd->lit = (jv_t){.t = JV_STR, .u.s = k->s};
            advance(p);
            nl_push(p, &l, nd, NULL);
        } else if (k->t == JT_VAR_BEGIN) {
            advance(p);
            node_t *nd = mk(p, N_OUTPUT, k->line);
            nd->a = parse_tuple(p, true, false);
            if (cur(p)->t != JT_VAR_END)
                unexpected(p, "'}}'");
            advance(p);
            nl_push(p, &l, nd, NULL);
        } else if (k->t == JT_BLOCK_BEGIN) {
            const jtok_t *nk = &p->t[p->i + 1];
            static const char *const stray[] = {"endfor", "endif", "elif", "else", "endset",
                                                "endmacro", "endfilter", "endgeneration",
                                                "endraw"};
            for (size_t s = 0; nk->t == JT_NAME && s < TD_ARRAY_LEN(stray); s++)
                if (is_name(nk, stray[s]))
                    fail_at(p, nk, "unexpected '%s' (no block of that kind is open here)",
                            stray[s]);
            nl_push(p, &l, parse_statement(p), NULL);
        } else {
            unexpected(p, "template data or a tag");
        }
    }
    p->nesting--;
    *out = l.v;
    *n_out = l.n;
}

void td__jinja_parse_tokens(jparse_ctx_t *pc, const jtok_t *toks, size_t n, node_t ***body,
                            size_t *n_body)
{
    parser_t p = {.pc = pc, .t = toks, .n = n};
    parse_body(&p, NULL, body, n_body);
}

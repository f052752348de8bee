/* jinja.c: the engine's entry points (td_jinja.h): parse a template into its arena, render it
 * with a fresh per-render arena under the limits, free it. */
#include "jinja_impl.h"

#include "td_error.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

int td_jinja_parse(const char *src, size_t len, const char *what, td_jinja_t **out)
{
    *out = NULL;
    if (!src || !what)
        return td_err_set(TD_EINVAL, "td_jinja_parse: NULL argument");
    for (size_t i = 0; i < len;) {
        size_t k = td_utf8_valid_len((const uint8_t *)src + i, len - i);
        if (k == 0)
            return td_err_set(TD_EINVAL, "%s: invalid UTF-8 at byte %zu", what, i);
        i += k;
    }
    td_jinja_t *t = calloc(1, sizeof(*t));
    jparse_ctx_t *pc = calloc(1, sizeof(*pc));
    if (!t || !pc || !(t->what = td_strdup(what))) {
        free(pc);
        if (t)
            free(t->what);
        free(t);
        return td_err_set(TD_ENOMEM, "%s: out of memory", what);
    }
    pc->ar = &t->ar;
    pc->what = t->what;
    t->ar.jb = &pc->jb;
    t->ar.err = &pc->err;
    if (setjmp(pc->jb)) {
        int err = pc->err;
        free(pc);
        td_jinja_free(t);
        return err;
    }
    jtok_t *toks;
    size_t n;
    td__jinja_lex(pc, src, len, &toks, &n);
    td__jinja_parse_tokens(pc, toks, n, &t->body, &t->n_body);
    t->ar.jb = NULL;
    t->ar.err = NULL;
    free(pc);
    *out = t;
    return 0;
}

void td_jinja_free(td_jinja_t *t)
{
    if (!t)
        return;
    td__jarena_free(&t->ar);
    free(t->what);
    free(t);
}

int td_jinja_render(const td_jinja_t *t, const struct json_object *vars,
                    const td_jinja_opts_t *opts, td_buf_t *out)
{
    static const td_jinja_opts_t defaults;
    td__jr_clear_raised();
    if (!t || !out)
        return td_err_set(TD_EINVAL, "td_jinja_render: NULL argument");
    if (!opts)
        opts = &defaults;
    if (vars && !json_object_is_type((json_object *)vars, json_type_object))
        return td_err_set(TD_EINVAL, "td_jinja_render: vars must be a JSON object");
    jr_t *r = calloc(1, sizeof(*r));
    if (!r)
        return td_err_set(TD_ENOMEM, "%s: out of memory", t->what);
    const td_jinja_limits_t *l = &opts->limits;
    r->tpl = t;
    r->ar.jb = &r->jb;
    r->ar.err = &r->err;
    r->ar.limit = l->max_memory ? l->max_memory : TD_JINJA_DEFAULT_MAX_MEMORY;
    r->max_output = l->max_output ? l->max_output : TD_JINJA_DEFAULT_MAX_OUTPUT;
    r->max_steps = l->max_steps ? l->max_steps : TD_JINJA_DEFAULT_MAX_STEPS;
    r->max_depth = l->max_depth ? l->max_depth : TD_JINJA_DEFAULT_MAX_DEPTH;
    r->now_s = opts->now_s;
    int err = 0;
    if (setjmp(r->jb)) {
        err = r->err;
        goto done;
    }
    r->globals = td__jr_scope_new(r, NULL);
    td__jr_add_globals(r, r->globals->vars);
    if (vars) {
        jv_t v = td__jv_from_json(&r->ar, vars);
        for (size_t i = 0; i < v.u.d->n; i++)
            td__jdict_set(&r->ar, r->globals->vars, v.u.d->k[i], v.u.d->v[i]);
    }
    jscope_t *root = td__jr_scope_new(r, r->globals);
    jbuf_t buf = {0};
    r->out = &buf;
    td__jr_exec_body(r, root, t->body, t->n_body);
    err = td_buf_append(out, buf.p ? buf.p : "", buf.n);
    if (err)
        err = td_err_set(err, "%s: out of memory for %zu bytes of output", t->what, buf.n);
done:
    td__jarena_free(&r->ar);
    free(r);
    return err;
}


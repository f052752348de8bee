/* test_jinja.c: the Jinja engine (td_jinja.h) on its own.
 *
 * - semantics: every case of tests/chat/jinja_cases.json (whitespace control, loops, scoping,
 *   macros, operators, Python formatting of values, tojson, filters, tests, methods, errors)
 *   rendered here and by Python Jinja2 as transformers sets it up (tests/chat/hf_jinja.py
 *   --cases): outputs equal byte for byte, and where Python fails, C fails;
 * - malformed templates: TD_EPARSE / TD_ENOTSUP with "name:line:col: message";
 * - runaway templates: loop iterations, macro recursion, output size and memory stop with
 *   TD_ERANGE. */
#include "td_jinja.h"
#include "td_error.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *src_root(void)
{
    const char *r = getenv("TD_SOURCE_ROOT");
    return r ? r : ".";
}

static int render_str(const char *src, const char *vars_json, const td_jinja_opts_t *o,
                      td_buf_t *out)
{
    td_jinja_t *t = NULL;
    int rc = td_jinja_parse(src, strlen(src), "t", &t);
    if (rc)
        return rc;
    json_object *vars = vars_json ? json_tokener_parse(vars_json) : NULL;
    rc = td_jinja_render(t, vars, o, out);
    json_object_put(vars);
    td_jinja_free(t);
    return rc;
}

START_TEST(test_cases_against_python)
{
    char path[2048], cmd[4096];
    snprintf(path, sizeof(path), "%s/tests/chat/jinja_cases.json", src_root());
    const char *py = getenv("TD_PYTHON") ? getenv("TD_PYTHON") : "/usr/bin/python3";
    snprintf(cmd, sizeof(cmd), "TD_CHAT_NOW=1700000000 '%s' '%s/tests/chat/hf_jinja.py' --cases '%s'",
             py, src_root(), path);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    td_buf_t ref;
    td_buf_init(&ref);
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0)
        ck_assert_int_eq(td_buf_append(&ref, chunk, got), 0);
    ck_assert_msg(pclose(f) == 0, "reference renderer failed: %s", cmd);
    json_object *cases = json_object_from_file(path);
    ck_assert_ptr_nonnull(cases);
    size_t n = json_object_array_length(cases), nfail = 0, line = 0;
    td_buf_t out;
    td_buf_init(&out);
    for (char *save = NULL, *l = strtok_r(ref.data, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save), line++) {
        ck_assert_uint_lt(line, n);
        json_object *rec = json_tokener_parse(l), *c = json_object_array_get_idx(cases, line);
        json_object *name, *tpl, *vars = NULL, *want = NULL;
        ck_assert(json_object_object_get_ex(c, "name", &name));
        ck_assert(json_object_object_get_ex(c, "template", &tpl));
        json_object_object_get_ex(c, "vars", &vars);
        bool has_out = json_object_object_get_ex(rec, "output", &want);
        td_jinja_t *t = NULL;
        td_jinja_opts_t o = {.now_s = 1700000000};
        td_buf_reset(&out);
        ck_assert_int_eq(td_buf_reserve(&out, 1), 0);
        int rc = td_jinja_parse(json_object_get_string(tpl), (size_t)json_object_get_string_len(tpl),
                                json_object_get_string(name), &t);
        if (rc == 0)
            rc = td_jinja_render(t, vars, &o, &out);
        bool ok = has_out ? rc == 0 && out.len == (size_t)json_object_get_string_len(want) &&
                                memcmp(out.data, json_object_get_string(want), out.len) == 0
                          : rc != 0;
        if (!ok) {
            nfail++;
            fprintf(stderr, "MISMATCH %s\n  python: %s\n  C (%d):  %s\n",
                    json_object_get_string(name), l, rc, rc ? td_err_msg() : out.data);
        }
        td_jinja_free(t);
        json_object_put(rec);
    }
    ck_assert_uint_eq(line, n);
    fprintf(stderr, "jinja cases: %zu, %zu equal to Python Jinja2\n", n, n - nfail);
    ck_assert_uint_eq(nfail, 0);
    td_buf_free(&out);
    td_buf_free(&ref);
    json_object_put(cases);
}
END_TEST

START_TEST(test_malformed)
{
    static const struct {
        const char *src;
        int err;
        const char *msg;
    } cases[] = {
        {"{{ x", TD_EPARSE, "t:1:1: unclosed '{{'"},
        {"a\n{% if x %}", TD_EPARSE, "t:2:11: unexpected end of template: the block opened at "
                                     "line 2 needs 'endif'"},
        {"{% for x in y %}{% endif %}", TD_EPARSE, "t:1:20: unexpected 'endif'"},
        {"{% endfor %}", TD_EPARSE, "t:1:4: unexpected 'endfor'"},
        {"{{ 1 + }}", TD_EPARSE, "t:1:8: unexpected '}}', expected an expression"},
        {"{{ (1 }}", TD_EPARSE, "t:1:1: unclosed '{{'"},
        {"{{ [1, 2 }}", TD_EPARSE, "unclosed '{{'"},
        {"{{ 'abc }}", TD_EPARSE, "t:1:4: unterminated string literal"},
        {"{# never closed", TD_EPARSE, "t:1:1: unclosed comment"},
        {"{% raw %}x", TD_EPARSE, "t:1:1: unclosed raw block"},
        {"{% bogus %}", TD_EPARSE, "t:1:4: unknown tag 'bogus'"},
        {"{% do x %}", TD_EPARSE, "t:1:4: unknown tag 'do'"},
        {"{% include 'a' %}", TD_ENOTSUP, "t:1:4: the 'include' statement is not supported"},
        {"{% extends 'a' %}", TD_ENOTSUP, "the 'extends' statement is not supported"},
        {"{% for x in y recursive %}{% endfor %}", TD_ENOTSUP, "recursive loops"},
        {"{{ f(*a) }}", TD_ENOTSUP, "t:1:6: *args and **kwargs"},
        {"{{ x | nosuchfilter }}", TD_EPARSE, "t:1:8: no filter named 'nosuchfilter'"},
        {"{{ x is nosuchtest }}", TD_EPARSE, "t:1:9: no test named 'nosuchtest'"},
        {"{{ x @ y }}", TD_EPARSE, "t:1:6: unexpected character '@'"},
        {"line1\nline2 {% set %}", TD_EPARSE, "t:2:14: unexpected '%}', expected a name"},
        {"{% macro m(a=1, b) %}{% endmacro %}", TD_EPARSE, "non-default argument"},
        {"{{ f(a=1, 2) }}", TD_EPARSE, "positional argument after keyword argument"},
        {"{{ 'x\\u12' }}", TD_EPARSE, "invalid \\x, \\u or \\U escape"},
        {"{{ 99999999999999999999 }}", TD_EPARSE, "integer literal out of range"},
        {"{% if x %}{% else %}{% else %}{% endif %}", TD_EPARSE, "unexpected 'else'"},
        {"{% set x = 1 %", TD_EPARSE, "unclosed '{%'"},
        {"caf\xc3", TD_EINVAL, "t: invalid UTF-8 at byte 3"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        td_jinja_t *t = (td_jinja_t *)1;
        int rc = td_jinja_parse(cases[i].src, strlen(cases[i].src), "t", &t);
        ck_assert_msg(rc == cases[i].err, "case %zu (%s): got %s (%s)", i, cases[i].src,
                      td_err_name(rc), td_err_msg());
        ck_assert_msg(strstr(td_err_msg(), cases[i].msg) != NULL,
                      "case %zu (%s): message \"%s\" lacks \"%s\"", i, cases[i].src, td_err_msg(),
                      cases[i].msg);
        ck_assert_ptr_null(t);
    }
    /* deep nesting is refused, not a stack overflow */
    td_buf_t deep;
    td_buf_init(&deep);
    td_buf_append_str(&deep, "{{ ");
    for (int i = 0; i < 5000; i++)
        td_buf_append_str(&deep, "(");
    td_buf_append_str(&deep, "1");
    for (int i = 0; i < 5000; i++)
        td_buf_append_str(&deep, ")");
    td_buf_append_str(&deep, " }}");
    td_jinja_t *t = NULL;
    ck_assert_int_eq(td_jinja_parse(deep.data, deep.len, "t", &t), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "nested too deeply"));
    td_buf_free(&deep);
}
END_TEST

START_TEST(test_runtime_errors)
{
    td_buf_t out;
    td_buf_init(&out);
    td_buf_append_str(&out, "keep");
    ck_assert_int_eq(render_str("a\n{{ x.y }}", NULL, NULL, &out), TD_EINVAL);
    ck_assert_str_eq(td_err_msg(), "t:2: UndefinedError: 'x' is undefined");
    ck_assert(!td_jinja_raised());
    ck_assert_int_eq(render_str("{{ raise_exception('bad ' ~ n) }}", "{\"n\": 3}", NULL, &out),
                     TD_EINVAL);
    ck_assert(td_jinja_raised());
    ck_assert_str_eq(td_err_msg(), "raise_exception: bad 3");
    ck_assert_str_eq(out.data, "keep"); /* nothing appended on error */
    ck_assert_int_eq(render_str("{{ x }}", "[1]", NULL, &out), TD_EINVAL);
    td_buf_free(&out);
}
END_TEST

START_TEST(test_limits)
{
    td_buf_t out;
    td_buf_init(&out);
    /* loop iterations: 100000 * 100000 would take hours */
    ck_assert_int_eq(render_str("{% for i in range(100000) %}{% for j in range(100000) %}"
                                "{% endfor %}{% endfor %}",
                                NULL, NULL, &out),
                     TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "loop iterations"));
    ck_assert_int_eq(render_str("{{ range(100001) | length }}", NULL, NULL, &out), TD_ERANGE);
    /* unbounded macro recursion */
    ck_assert_int_eq(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL,
                                NULL, &out),
                     TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "nested deeper"));
    /* output size */
    td_jinja_opts_t o = {.limits = {.max_output = 1000}};
    ck_assert_int_eq(render_str("{% for i in range(1000) %}xx{% endfor %}", NULL, &o, &out),
                     TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "output larger than 1000 bytes"));
    ck_assert_int_eq(render_str("{{ 'x' * 100000 }}", NULL, &o, &out), TD_ERANGE);
    /* memory: a string doubling in a loop */
    o = (td_jinja_opts_t){.limits = {.max_memory = 1 << 20}};
    ck_assert_int_eq(render_str("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                                NULL, &o, &out),
                     TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "memory limit"));
    ck_assert_uint_eq(out.len, 0);
    /* within the limits the same template works */
    ck_assert_int_eq(render_str("{% for i in range(3) %}x{% endfor %}", NULL, &o, &out), 0);
    ck_assert_str_eq(out.data, "xxx");
    td_buf_free(&out);
}
END_TEST

static Suite *jinja_suite(void)
{
    Suite *s = suite_create("jinja");
    TCase *tc = tcase_create("jinja");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cases_against_python);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_runtime_errors);
    tcase_add_test(tc, test_limits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(jinja_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

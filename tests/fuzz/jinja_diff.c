/* jinja_diff.c: the C side of tests/fuzz/jinja_diff.py. Reads a JSON array of template sources,
 * renders each against the fuzz conversation (fuzz_jinja_vars.h) under the fuzz limits, and
 * writes one JSON object per line: {"output": ...} or {"error": ...}. `--vars` prints the
 * conversation instead, so the Python side renders with the same variables. */
#include "fuzz_jinja_vars.h"
#include "td_error.h"
#include "td_jinja.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--vars") == 0) {
        fputs(fuzz_jinja_vars, stdout);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: jinja_diff TEMPLATES.json | --vars\n");
        return 2;
    }
    json_object *srcs = json_object_from_file(argv[1]), *vars = json_tokener_parse(fuzz_jinja_vars);
    if (!srcs || !json_object_is_type(srcs, json_type_array) || !vars) {
        fprintf(stderr, "jinja_diff: %s: expected a JSON array of strings\n", argv[1]);
        return 2;
    }
    td_jinja_opts_t o = {.limits = FUZZ_JINJA_LIMITS, .now_s = 1700000000};
    for (size_t i = 0; i < json_object_array_length(srcs); i++) {
        json_object *s = json_object_array_get_idx(srcs, i), *rec = json_object_new_object();
        td_jinja_t *t = NULL;
        td_buf_t out;
        td_buf_init(&out);
        int rc = td_jinja_parse(json_object_get_string(s), (size_t)json_object_get_string_len(s),
                                "t", &t);
        if (rc == 0)
            rc = td_jinja_render(t, vars, &o, &out);
        if (rc)
            json_object_object_add(rec, "error", json_object_new_string(td_err_msg()));
        else
            json_object_object_add(rec, "output",
                                   json_object_new_string_len(out.data ? out.data : "", (int)out.len));
        puts(json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN));
        json_object_put(rec);
        td_jinja_free(t);
        td_buf_free(&out);
    }
    json_object_put(srcs);
    json_object_put(vars);
    return 0;
}

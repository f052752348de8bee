/* fuzz_jinja.c: fuzz target for the chat-template engine (td_jinja.h). The input is a template's
 * source; it is parsed and, when it parses, rendered against a fixed conversation (system, user,
 * an assistant tool call, a tool result; two tools; add_generation_prompt; enable_thinking)
 * under tight limits, so runaway templates end with TD_ERANGE. Checks: parse and render return 0
 * or a TD_E* code with a message, a failed render appends nothing, output stays under the
 * limit. */
#include "fuzz.h"
#include "td_error.h"
#include "td_jinja.h"
#include "fuzz_jinja_vars.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(
        b, "{{- bos_token }}{%- set ns = namespace(first=true, idx=0) %}\n"
           "{%- if tools %}{{ '<tools>' }}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}\n"
           "{%- for m in messages %}\n"
           "  {%- if m.role == 'assistant' and m.tool_calls is defined %}\n"
           "    {%- for c in m.tool_calls %}{{ c.function.name ~ '(' ~ c.function.arguments | "
           "tojson(indent=2) ~ ')' }}{% endfor %}\n"
           "  {%- elif m['role'] in ['user', 'system'] -%}\n"
           "    {{ '<|' + m.role + '|>' + m.content | trim }}{{ m.content[1:4] | upper }}\n"
           "  {%- else %}{{ m.content.split('t')[-1].strip() }}{% set ns.idx = loop.index0 %}\n"
           "  {%- endif %}\n"
           "{%- endfor %}\n"
           "{%- macro f(x, y=2) %}[{{ x * y }}]{% endmacro %}{{ f(ns.idx) }}\n"
           "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% if not enable_thinking %}"
           "<think></think>{% endif %}{% endif %}");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_object *vars;
    if (!vars)
        vars = json_tokener_parse(fuzz_jinja_vars);
    if (!vars)
        abort();
    td_jinja_t *t = NULL;
    int rc = td_jinja_parse((const char *)data, size, "fuzz", &t);
    if (rc) {
        if (rc >= 0 || t || td_err_msg()[0] == '\0')
            abort();
        return 0;
    }
    td_jinja_opts_t o = {.limits = FUZZ_JINJA_LIMITS, .now_s = 1700000000};
    td_buf_t out;
    td_buf_init(&out);
    rc = td_jinja_render(t, vars, &o, &out);
    if (rc < 0 ? out.len != 0 || td_err_msg()[0] == '\0' : rc != 0 || out.len > (1 << 16))
        abort();
    td_buf_free(&out);
    td_jinja_free(t);
    return 0;
}

/* api_tools.c: tools and tool_choice (OpenAI chat and Anthropic messages), and Anthropic
 * content blocks (text, tool_use, tool_result) turned into the OpenAI-style messages the chat
 * template renders. Everything lands in td_api_request_t in OpenAI's form. */
#include "api_impl.h"
#include "td_error.h"
#include "td_util.h"

#include <string.h>

#define fail td__api_fail
#define field td__api_field
#define type_name td__api_type_name
#define P td__api_param

static bool is_str(json_object *v)
{
    return v && json_object_is_type(v, json_type_string);
}

/* OpenAI's rule for function names: 1 to 64 of a-z, A-Z, 0-9, underscore, dash (and dots and
 * colons, which vLLM's clients use for namespaces). */
static bool valid_name(json_object *n)
{
    if (!is_str(n))
        return false;
    const char *s = json_object_get_string(n);
    size_t l = (size_t)json_object_get_string_len(n);
    if (l == 0 || l > 64)
        return false;
    for (size_t i = 0; i < l; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || ch == '.' || ch == ':'))
            return false;
    }
    return true;
}

static int name_error(td_api_ctx_t *c, const char *param, json_object *n)
{
    if (!is_str(n))
        return fail(c, param, TD_EINVAL, "'%s' must be a string, got %s", param,
                    n ? type_name(n) : "nothing");
    return fail(c, param, TD_EINVAL,
                "'%s' must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '-', '.', ':'", param);
}

/* Whether tools (OpenAI form) hold a function `name`. */
static bool has_tool(json_object *tools, const char *name)
{
    for (size_t i = 0; tools && i < json_object_array_length(tools); i++) {
        json_object *f = field(json_object_array_get_idx(tools, i), "function");
        json_object *n = f ? field(f, "name") : NULL;
        if (is_str(n) && strcmp(json_object_get_string(n), name) == 0)
            return true;
    }
    return false;
}

static const char *first_tool(json_object *tools)
{
    json_object *f = field(json_object_array_get_idx(tools, 0), "function");
    return json_object_get_string(field(f, "name"));
}

/* Checks shared by both APIs once the tools are in OpenAI form: unique names, and the choice.
 * Takes the reference `tools` (r owns it from here, also on error). */
static int finish_tools(td_api_ctx_t *c, td_api_request_t *r, json_object *tools,
                        const char *name_fmt)
{
    r->tools = tools;
    size_t n = json_object_array_length(tools);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < i; k++) {
            json_object *fi = field(json_object_array_get_idx(tools, i), "function");
            json_object *fk = field(json_object_array_get_idx(tools, k), "function");
            if (strcmp(json_object_get_string(field(fi, "name")),
                       json_object_get_string(field(fk, "name"))) == 0)
                return fail(c, P(name_fmt, i), TD_EINVAL, "'%s': tool '%s' is defined twice",
                            P(name_fmt, i), json_object_get_string(field(fi, "name")));
        }
    if (n == 0) { /* an empty list is no tools */
        json_object_put(tools);
        r->tools = NULL;
        if (r->tool_choice == TD_API_TOOLS_REQUIRED || r->tool_choice == TD_API_TOOLS_NAMED)
            return fail(c, "tool_choice", TD_EINVAL,
                        "'tool_choice' forces a tool call but 'tools' is empty");
        return 0;
    }
    if (r->tool_choice == TD_API_TOOLS_NAMED && !has_tool(tools, r->tool_name))
        return fail(c, "tool_choice", TD_EINVAL, "'tool_choice' names '%s', which is not in 'tools'",
                    r->tool_name);
    if (r->tool_choice == TD_API_TOOLS_REQUIRED) {
        r->tool_name = td_strdup(first_tool(tools));
        if (!r->tool_name)
            return TD_ENOMEM;
    }
    return 0;
}

static int set_name(td_api_request_t *r, json_object *n)
{
    r->tool_name = td_strndup(json_object_get_string(n), (size_t)json_object_get_string_len(n));
    return r->tool_name ? 0 : TD_ENOMEM;
}

int td__api_tools_openai(td_api_ctx_t *c, json_object *o, td_api_request_t *r)
{
    json_object *tc = field(o, "tool_choice");
    int rc;
    if (tc && is_str(tc)) {
        const char *s = json_object_get_string(tc);
        if (strcmp(s, "auto") == 0)
            r->tool_choice = TD_API_TOOLS_AUTO;
        else if (strcmp(s, "none") == 0)
            r->tool_choice = TD_API_TOOLS_NONE;
        else if (strcmp(s, "required") == 0)
            r->tool_choice = TD_API_TOOLS_REQUIRED;
        else
            return fail(c, "tool_choice", TD_EINVAL,
                        "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"%.64s\"", s);
    } else if (tc) {
        json_object *t = json_object_is_type(tc, json_type_object) ? field(tc, "type") : NULL;
        if (!is_str(t) || strcmp(json_object_get_string(t), "function") != 0)
            return fail(c, "tool_choice.type", TD_EINVAL,
                        "'tool_choice' must be a string or {\"type\": \"function\", ...}");
        json_object *f = field(tc, "function");
        json_object *n = f && json_object_is_type(f, json_type_object) ? field(f, "name") : NULL;
        if (!valid_name(n))
            return name_error(c, "tool_choice.function.name", n);
        r->tool_choice = TD_API_TOOLS_NAMED;
        if ((rc = set_name(r, n)))
            return rc;
    }
    json_object *tools = field(o, "tools");
    if (!tools) {
        if (r->tool_choice == TD_API_TOOLS_REQUIRED || r->tool_choice == TD_API_TOOLS_NAMED)
            return fail(c, "tool_choice", TD_EINVAL,
                        "'tool_choice' forces a tool call but there are no 'tools'");
        return 0;
    }
    if (!json_object_is_type(tools, json_type_array))
        return fail(c, "tools", TD_EINVAL, "'tools' must be an array, got %s", type_name(tools));
    for (size_t i = 0; i < json_object_array_length(tools); i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        if (!t || !json_object_is_type(t, json_type_object))
            return fail(c, P("tools[%zu]", i), TD_EINVAL, "'tools[%zu]' must be an object", i);
        json_object *ty = field(t, "type");
        if (!is_str(ty) || strcmp(json_object_get_string(ty), "function") != 0)
            return fail(c, P("tools[%zu].type", i), TD_EINVAL,
                        "'tools[%zu].type' must be \"function\"", i);
        json_object *f = field(t, "function");
        if (!f || !json_object_is_type(f, json_type_object))
            return fail(c, P("tools[%zu].function", i), TD_EINVAL,
                        "'tools[%zu].function' must be an object", i);
        json_object *n = field(f, "name");
        if (!valid_name(n))
            return name_error(c, P("tools[%zu].function.name", i), n);
        json_object *d = field(f, "description");
        if (d && !is_str(d))
            return fail(c, P("tools[%zu].function.description", i), TD_EINVAL,
                        "'tools[%zu].function.description' must be a string", i);
        json_object *pa = field(f, "parameters");
        if (pa && !json_object_is_type(pa, json_type_object))
            return fail(c, P("tools[%zu].function.parameters", i), TD_EINVAL,
                        "'tools[%zu].function.parameters' must be a JSON Schema object, got %s", i,
                        type_name(pa));
        json_object *st = field(f, "strict");
        if (st && !json_object_is_type(st, json_type_boolean))
            return fail(c, P("tools[%zu].function.strict", i), TD_EINVAL,
                        "'tools[%zu].function.strict' must be a boolean", i);
    }
    return finish_tools(c, r, json_object_get(tools), "tools[%zu].function.name");
}

int td__api_tools_anthropic(td_api_ctx_t *c, json_object *o, td_api_request_t *r)
{
    json_object *tc = field(o, "tool_choice");
    int rc;
    if (tc) {
        json_object *t = json_object_is_type(tc, json_type_object) ? field(tc, "type") : NULL;
        const char *s = is_str(t) ? json_object_get_string(t) : "";
        if (strcmp(s, "auto") == 0) {
            r->tool_choice = TD_API_TOOLS_AUTO;
        } else if (strcmp(s, "none") == 0) {
            r->tool_choice = TD_API_TOOLS_NONE;
        } else if (strcmp(s, "any") == 0) {
            r->tool_choice = TD_API_TOOLS_REQUIRED;
        } else if (strcmp(s, "tool") == 0) {
            json_object *n = field(tc, "name");
            if (!valid_name(n))
                return name_error(c, "tool_choice.name", n);
            r->tool_choice = TD_API_TOOLS_NAMED;
            if ((rc = set_name(r, n)))
                return rc;
        } else {
            return fail(c, "tool_choice.type", TD_EINVAL,
                        "tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\"");
        }
    }
    json_object *tools = field(o, "tools");
    if (!tools) {
        if (r->tool_choice == TD_API_TOOLS_REQUIRED || r->tool_choice == TD_API_TOOLS_NAMED)
            return fail(c, "tool_choice", TD_EINVAL,
                        "tool_choice: forces a tool call but there are no tools");
        return 0;
    }
    if (!json_object_is_type(tools, json_type_array))
        return fail(c, "tools", TD_EINVAL, "tools: must be an array, got %s", type_name(tools));
    json_object *out = json_object_new_array();
    if (!out)
        return TD_ENOMEM;
    for (size_t i = 0; i < json_object_array_length(tools); i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        const char *bad = NULL;
        rc = TD_EINVAL;
        if (!t || !json_object_is_type(t, json_type_object)) {
            bad = P("tools.%zu", i);
            rc = fail(c, bad, TD_EINVAL, "%s: must be an object", bad);
            goto fail;
        }
        json_object *ty = field(t, "type");
        if (ty && (!is_str(ty) || strcmp(json_object_get_string(ty), "custom") != 0)) {
            bad = P("tools.%zu.type", i);
            rc = fail(c, bad, TD_ENOTSUP, "%s: only custom (client) tools are supported", bad);
            goto fail;
        }
        json_object *n = field(t, "name");
        if (!valid_name(n)) {
            rc = name_error(c, P("tools.%zu.name", i), n);
            goto fail;
        }
        json_object *d = field(t, "description");
        if (d && !is_str(d)) {
            bad = P("tools.%zu.description", i);
            rc = fail(c, bad, TD_EINVAL, "%s: must be a string", bad);
            goto fail;
        }
        json_object *sc = field(t, "input_schema");
        if (!sc || !json_object_is_type(sc, json_type_object)) {
            bad = P("tools.%zu.input_schema", i);
            rc = fail(c, bad, TD_EINVAL, "%s: must be a JSON Schema object", bad);
            goto fail;
        }
        json_object *fn = json_object_new_object(), *w = json_object_new_object();
        json_object_object_add(fn, "name", json_object_get(n));
        if (d)
            json_object_object_add(fn, "description", json_object_get(d));
        json_object_object_add(fn, "parameters", json_object_get(sc));
        json_object_object_add(w, "type", json_object_new_string("function"));
        json_object_object_add(w, "function", fn);
        json_object_array_add(out, w);
    }
    return finish_tools(c, r, out, "tools.%zu.name");
fail:
    json_object_put(out);
    return rc;
}

/* Text of a string or an array of text blocks into b; false when a block is not text. */
static bool text_of(json_object *v, td_buf_t *b, size_t *bad)
{
    if (is_str(v))
        return td_buf_append(b, json_object_get_string(v), (size_t)json_object_get_string_len(v)) == 0;
    for (size_t k = 0; json_object_is_type(v, json_type_array) && k < json_object_array_length(v);
         k++) {
        json_object *bl = json_object_array_get_idx(v, k);
        json_object *ty = bl ? field(bl, "type") : NULL, *tx = bl ? field(bl, "text") : NULL;
        if (!is_str(ty) || strcmp(json_object_get_string(ty), "text") != 0 || !is_str(tx)) {
            *bad = k;
            return false;
        }
        td_buf_append(b, json_object_get_string(tx), (size_t)json_object_get_string_len(tx));
    }
    return json_object_is_type(v, json_type_array) || (*bad = 0, false);
}

static json_object *msg_new(const char *role, td_buf_t *text)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content",
                           json_object_new_string_len(text->data ? text->data : "", (int)text->len));
    return m;
}

/* One Anthropic message (blocks) appended to `all` as one or more OpenAI messages. */
static int convert_blocks(td_api_ctx_t *c, size_t i, bool assistant, json_object *content,
                          json_object *all)
{
    td_buf_t text, think;
    td_buf_init(&text);
    td_buf_init(&think);
    json_object *calls = NULL;
    int rc = 0;
    bool any_text = false;
    for (size_t k = 0; k < json_object_array_length(content) && !rc; k++) {
        json_object *bl = json_object_array_get_idx(content, k);
        json_object *ty = bl && json_object_is_type(bl, json_type_object) ? field(bl, "type") : NULL;
        const char *t = is_str(ty) ? json_object_get_string(ty) : "";
        if (strcmp(t, "text") == 0) {
            json_object *tx = field(bl, "text");
            if (!is_str(tx)) {
                const char *p = P("messages.%zu.content.%zu.text", i, k);
                rc = fail(c, p, TD_EINVAL, "%s: must be a string", p);
                break;
            }
            any_text = true;
            td_buf_append(&text, json_object_get_string(tx), (size_t)json_object_get_string_len(tx));
        } else if (assistant && strcmp(t, "thinking") == 0 && is_str(field(bl, "thinking"))) {
            td_buf_append_str(&think, json_object_get_string(field(bl, "thinking")));
        } else if (assistant && strcmp(t, "tool_use") == 0) {
            json_object *id = field(bl, "id"), *n = field(bl, "name"), *in = field(bl, "input");
            const char *p = NULL;
            if (!is_str(id))
                p = P("messages.%zu.content.%zu.id", i, k);
            else if (!is_str(n))
                p = P("messages.%zu.content.%zu.name", i, k);
            else if (!in || !json_object_is_type(in, json_type_object))
                p = P("messages.%zu.content.%zu.input", i, k);
            if (p) {
                rc = fail(c, p, TD_EINVAL, "%s: missing or of the wrong type", p);
                break;
            }
            if (!calls)
                calls = json_object_new_array();
            json_object *call = json_object_new_object(), *fn = json_object_new_object();
            json_object_object_add(call, "id", json_object_get(id));
            json_object_object_add(call, "type", json_object_new_string("function"));
            json_object_object_add(fn, "name", json_object_get(n));
            json_object_object_add(fn, "arguments",
                                   json_object_new_string(json_object_to_json_string_ext(
                                       in, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)));
            json_object_object_add(call, "function", fn);
            json_object_array_add(calls, call);
        } else if (!assistant && strcmp(t, "tool_result") == 0) {
            json_object *id = field(bl, "tool_use_id"), *ct = field(bl, "content");
            td_buf_t rt;
            td_buf_init(&rt);
            size_t bad = 0;
            if (!is_str(id)) {
                const char *p = P("messages.%zu.content.%zu.tool_use_id", i, k);
                rc = fail(c, p, TD_EINVAL, "%s: must be a string", p);
            } else if (ct && !text_of(ct, &rt, &bad)) {
                const char *p = is_str(ct) || !json_object_is_type(ct, json_type_array)
                                    ? P("messages.%zu.content.%zu.content", i, k)
                                    : P("messages.%zu.content.%zu.content.%zu", i, k, bad);
                rc = fail(c, p, TD_ENOTSUP, "%s: only text tool results are supported", p);
            } else {
                json_object *m = msg_new("tool", &rt);
                json_object_object_add(m, "tool_call_id", json_object_get(id));
                json_object_array_add(all, m);
            }
            td_buf_free(&rt);
        } else {
            const char *p = P("messages.%zu.content.%zu.type", i, k);
            rc = fail(c, p, TD_ENOTSUP, "%s: '%s' blocks are not supported here", p, t);
        }
    }
    if (!rc && (any_text || calls || assistant || json_object_array_length(content) == 0)) {
        json_object *m = msg_new(assistant ? "assistant" : "user", &text);
        if (calls)
            json_object_object_add(m, "tool_calls", json_object_get(calls));
        if (think.len)
            json_object_object_add(m, "reasoning_content",
                                   json_object_new_string_len(think.data, (int)think.len));
        json_object_array_add(all, m);
    }
    json_object_put(calls);
    td_buf_free(&text);
    td_buf_free(&think);
    return rc;
}

int td__api_anthropic_messages(td_api_ctx_t *c, json_object *sys, json_object *m,
                               json_object **out)
{
    json_object *all = json_object_new_array();
    int rc = 0;
    *out = NULL;
    if (!all)
        return TD_ENOMEM;
    if (sys) {
        td_buf_t b;
        td_buf_init(&b);
        size_t bad = 0;
        if (!text_of(sys, &b, &bad)) {
            td_buf_free(&b);
            json_object_put(all);
            return fail(c, "system", TD_EINVAL, "'system' must be a string or text blocks");
        }
        json_object_array_add(all, msg_new("system", &b));
        td_buf_free(&b);
    }
    for (size_t i = 0; i < json_object_array_length(m) && !rc; i++) {
        json_object *e = json_object_array_get_idx(m, i);
        json_object *role = e && json_object_is_type(e, json_type_object) ? field(e, "role") : NULL;
        const char *rs = is_str(role) ? json_object_get_string(role) : "";
        bool assistant = strcmp(rs, "assistant") == 0;
        if (!assistant && strcmp(rs, "user") != 0) {
            rc = fail(c, "messages", TD_EINVAL,
                      "messages.%zu.role: must be \"user\" or \"assistant\"", i);
            break;
        }
        json_object *ct = field(e, "content");
        if (ct && json_object_is_type(ct, json_type_array))
            rc = convert_blocks(c, i, assistant, ct, all);
        else
            json_object_array_add(all, json_object_get(e)); /* string content: as it is */
    }
    if (rc) {
        json_object_put(all);
        return rc;
    }
    *out = all;
    return 0;
}

/* api_responses.c: OpenAI Responses request bodies (`input` as a string or input items,
 * `instructions`, function `tools`, `tool_choice`) into the request form every chat-style API
 * shares: OpenAI-style messages and tools in Chat Completions' form. */
#include "api_impl.h"
#include "td_error.h"
#include "td_util.h"

#include <stdio.h>
#include <string.h>

#define fail td__api_fail
#define field td__api_field
#define type_name td__api_type_name
#define P td__api_param

static bool is_str(json_object *v)
{
    return v && json_object_is_type(v, json_type_string);
}

static json_object *msg(const char *role, json_object *content)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", content);
    return m;
}

/* A message item's content: a string, or input_text / output_text parts. */
static int content_of(td_api_ctx_t *c, size_t i, json_object *ct, json_object **out)
{
    if (is_str(ct)) {
        *out = json_object_get(ct);
        return 0;
    }
    if (!ct || !json_object_is_type(ct, json_type_array))
        return fail(c, P("input[%zu].content", i), TD_EINVAL,
                    "'input[%zu].content' must be a string or an array of text parts", i);
    td_buf_t b;
    td_buf_init(&b);
    for (size_t k = 0; k < json_object_array_length(ct); k++) {
        json_object *p = json_object_array_get_idx(ct, k);
        json_object *ty = p ? field(p, "type") : NULL, *tx = p ? field(p, "text") : NULL;
        const char *t = is_str(ty) ? json_object_get_string(ty) : "";
        if ((strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text")) ||
            !is_str(tx)) {
            td_buf_free(&b);
            return fail(c, P("input[%zu].content[%zu]", i, k), TD_ENOTSUP,
                        "'input[%zu].content[%zu]': only input_text and output_text parts are "
                        "supported",
                        i, k);
        }
        td_buf_append(&b, json_object_get_string(tx), (size_t)json_object_get_string_len(tx));
    }
    *out = json_object_new_string_len(b.data ? b.data : "", (int)b.len);
    td_buf_free(&b);
    return 0;
}

static int convert_input(td_api_ctx_t *c, json_object *o, json_object *all)
{
    json_object *ins = field(o, "instructions");
    if (ins && !is_str(ins))
        return fail(c, "instructions", TD_EINVAL, "'instructions' must be a string");
    if (ins)
        json_object_array_add(all, msg("system", json_object_get(ins)));
    json_object *in = field(o, "input");
    if (!in)
        return fail(c, "input", TD_EINVAL, "'input' is required");
    if (is_str(in)) {
        json_object_array_add(all, msg("user", json_object_get(in)));
        return 0;
    }
    if (!json_object_is_type(in, json_type_array) || json_object_array_length(in) == 0)
        return fail(c, "input", TD_EINVAL, "'input' must be a string or a non-empty array of items");
    json_object *calls = NULL; /* the assistant message consecutive function_calls join */
    for (size_t i = 0; i < json_object_array_length(in); i++) {
        json_object *it = json_object_array_get_idx(in, i);
        if (!it || !json_object_is_type(it, json_type_object))
            return fail(c, P("input[%zu]", i), TD_EINVAL, "'input[%zu]' must be an object", i);
        json_object *ty = field(it, "type");
        const char *t = is_str(ty) ? json_object_get_string(ty) : "message";
        if (strcmp(t, "function_call") == 0) {
            json_object *id = field(it, "call_id"), *n = field(it, "name"), *a = field(it, "arguments");
            const char *bad = !is_str(id) ? "call_id" : !is_str(n) ? "name" : !is_str(a) ? "arguments" : NULL;
            if (bad)
                return fail(c, P("input[%zu].%s", i, bad), TD_EINVAL,
                            "'input[%zu].%s' must be a string", i, bad);
            if (!calls) {
                json_object *m = msg("assistant", json_object_new_string(""));
                calls = json_object_new_array();
                json_object_object_add(m, "tool_calls", calls);
                json_object_array_add(all, m);
            }
            json_object *call = json_object_new_object(), *fn = json_object_new_object();
            json_object_object_add(call, "id", json_object_get(id));
            json_object_object_add(call, "type", json_object_new_string("function"));
            json_object_object_add(fn, "name", json_object_get(n));
            json_object_object_add(fn, "arguments", json_object_get(a));
            json_object_object_add(call, "function", fn);
            json_object_array_add(calls, call);
            continue;
        }
        calls = NULL;
        if (strcmp(t, "function_call_output") == 0) {
            json_object *id = field(it, "call_id"), *out = field(it, "output");
            if (!is_str(id))
                return fail(c, P("input[%zu].call_id", i), TD_EINVAL,
                            "'input[%zu].call_id' must be a string", i);
            if (!is_str(out))
                return fail(c, P("input[%zu].output", i), TD_EINVAL,
                            "'input[%zu].output' must be a string", i);
            json_object *m = msg("tool", json_object_get(out));
            json_object_object_add(m, "tool_call_id", json_object_get(id));
            json_object_array_add(all, m);
        } else if (strcmp(t, "message") == 0) {
            json_object *role = field(it, "role");
            const char *r = is_str(role) ? json_object_get_string(role) : "";
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") &&
                strcmp(r, "developer"))
                return fail(c, P("input[%zu].role", i), TD_EINVAL,
                            "'input[%zu].role' must be user, assistant, system or developer", i);
            json_object *content = NULL;
            int rc = content_of(c, i, field(it, "content"), &content);
            if (rc)
                return rc;
            json_object_array_add(all, msg(r, content));
        } else {
            return fail(c, P("input[%zu].type", i), TD_ENOTSUP,
                        "'input[%zu].type' \"%.40s\" is not supported (message, function_call, "
                        "function_call_output)",
                        i, t);
        }
    }
    return 0;
}

/* Responses' flat function tools ({type, name, description, parameters, strict}) and its
 * tool_choice ({type: "function", name}) rewritten as Chat Completions', then checked there. */
static int convert_tools(td_api_ctx_t *c, json_object *o, json_object *chat)
{
    json_object *tools = field(o, "tools");
    if (tools) {
        if (!json_object_is_type(tools, json_type_array))
            return fail(c, "tools", TD_EINVAL, "'tools' must be an array, got %s", type_name(tools));
        json_object *ct = json_object_new_array();
        json_object_object_add(chat, "tools", ct);
        for (size_t i = 0; i < json_object_array_length(tools); i++) {
            json_object *t = json_object_array_get_idx(tools, i);
            json_object *ty = t && json_object_is_type(t, json_type_object) ? field(t, "type") : NULL;
            if (!is_str(ty) || strcmp(json_object_get_string(ty), "function") != 0)
                return fail(c, P("tools[%zu].type", i), TD_ENOTSUP,
                            "'tools[%zu].type': only \"function\" tools are supported", i);
            json_object *fn = json_object_new_object(), *w = json_object_new_object();
            static const char *const keys[] = {"name", "description", "parameters", "strict"};
            for (size_t k = 0; k < 4; k++) {
                json_object *v = field(t, keys[k]);
                if (v)
                    json_object_object_add(fn, keys[k], json_object_get(v));
            }
            json_object_object_add(w, "type", json_object_new_string("function"));
            json_object_object_add(w, "function", fn);
            json_object_array_add(ct, w);
        }
    }
    json_object *tc = field(o, "tool_choice");
    if (tc && json_object_is_type(tc, json_type_object)) {
        json_object *n = field(tc, "name");
        json_object *w = json_object_new_object(), *fn = json_object_new_object();
        json_object_object_add(w, "type", json_object_get(field(tc, "type")));
        if (n)
            json_object_object_add(fn, "name", json_object_get(n));
        json_object_object_add(w, "function", fn);
        json_object_object_add(chat, "tool_choice", w);
    } else if (tc) {
        json_object_object_add(chat, "tool_choice", json_object_get(tc));
    }
    return 0;
}

/* Names of Chat Completions' tool fields as Responses spells them. */
static const char *responses_param(const char *p)
{
    static _Thread_local char buf[160];
    const char *f = p ? strstr(p, "].function.") : NULL;
    if (!f)
        return p;
    snprintf(buf, sizeof(buf), "%.*s].%s", (int)(f - p), p, f + strlen("].function."));
    return buf;
}

int td__api_responses(td_api_ctx_t *c, json_object *o, td_api_request_t *r)
{
    json_object *all = json_object_new_array(), *chat = json_object_new_object();
    int rc = all && chat ? convert_input(c, o, all) : TD_ENOMEM;
    if (!rc)
        rc = td_chat_msgs_from_json(&r->msgs, all);
    if (rc && !c->param)
        c->param = "input";
    if (!rc)
        rc = convert_tools(c, o, chat);
    if (!rc && (rc = td__api_tools_openai(c, chat, r)))
        c->param = responses_param(c->param);
    json_object_put(all);
    json_object_put(chat);
    return rc;
}

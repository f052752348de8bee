/* chat.c: chat templates on the Jinja engine (td_jinja.h): loading a model's template and special
 * tokens, the OpenAI `messages` parser, and rendering with the variables transformers passes. */
#include "td_chat.h"

#include "td_error.h"
#include "td_util.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tokenizer_config.json ------------------------------------------------------------------- */

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};

/* A token value: a string, {"content": string} or null. *out NULL when unset. */
static int token_value(json_object *v, const char *what, const char *field, const char **out)
{
    *out = NULL;
    if (!v || json_object_is_type(v, json_type_null))
        return 0;
    if (json_object_is_type(v, json_type_string)) {
        *out = json_object_get_string(v);
        return 0;
    }
    json_object *c = NULL;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c) &&
        json_object_is_type(c, json_type_string)) {
        *out = json_object_get_string(c);
        return 0;
    }
    return td_err_set(TD_EINVAL, "%s: field \"%s\": expected a string or {\"content\": string}",
                      what, field);
}

/* transformers' special_tokens_map: the special token attributes that are set, as strings. */
static int special_tokens(json_object *cfg, const char *what, td_chat_template_t *t)
{
    int err;
    const char *s;
    t->tokens = json_object_new_object();
    if (!t->tokens)
        return td_err_set(TD_ENOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < TD_ARRAY_LEN(special_names); i++) {
        json_object *v = NULL;
        json_object_object_get_ex(cfg, special_names[i], &v);
        if ((err = token_value(v, what, special_names[i], &s)))
            return err;
        if (s && *s)
            json_object_object_add(t->tokens, special_names[i], json_object_new_string(s));
        if (i == 0 || i == 1) {
            char *copy = td_strdup(s ? s : "");
            if (!copy)
                return td_err_set(TD_ENOMEM, "%s: out of memory", what);
            *(i == 0 ? &t->bos : &t->eos) = copy;
        }
    }
    json_object *add = NULL;
    if (json_object_object_get_ex(cfg, "additional_special_tokens", &add) && add &&
        json_object_is_type(add, json_type_array) && json_object_array_length(add) > 0) {
        json_object *list = json_object_new_array();
        json_object_object_add(t->tokens, "additional_special_tokens", list);
        for (size_t i = 0; i < json_object_array_length(add); i++) {
            if ((err = token_value(json_object_array_get_idx(add, i), what,
                                   "additional_special_tokens", &s)))
                return err;
            json_object_array_add(list, json_object_new_string(s ? s : ""));
        }
    }
    return 0;
}

/* The config's template text(s): a string, or a named list ("default", "tool_use"). */
static int template_texts(json_object *cfg, const char *what, const char **def, const char **tools)
{
    json_object *v = NULL;
    *def = *tools = NULL;
    if (!json_object_object_get_ex(cfg, "chat_template", &v) || v == NULL)
        return 0;
    if (json_object_is_type(v, json_type_string)) {
        *def = json_object_get_string(v);
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return td_err_set(TD_EINVAL, "%s: field \"chat_template\": expected a string or a list",
                          what);
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i), *name = NULL, *text = NULL;
        if (!json_object_object_get_ex(e, "name", &name) ||
            !json_object_object_get_ex(e, "template", &text) ||
            !json_object_is_type(text, json_type_string))
            return td_err_set(TD_EINVAL,
                              "%s: field \"chat_template[%zu]\": expected {\"name\", \"template\"}",
                              what, i);
        if (td_str_eq(json_object_get_string(name), "default"))
            *def = json_object_get_string(text);
        else if (td_str_eq(json_object_get_string(name), "tool_use"))
            *tools = json_object_get_string(text);
    }
    if (!*def)
        return td_err_set(TD_EINVAL, "%s: field \"chat_template\": no template named \"default\"",
                          what);
    return 0;
}

static int compile(const char *src, const char *what, const char *field, td_jinja_t **out)
{
    char name[1200];
    snprintf(name, sizeof(name), "%s: %s", what, field);
    return td_jinja_parse(src, strlen(src), name, out);
}

int td_chat_template_load_json(td_chat_template_t *t, const char *json, size_t len,
                               const char *what, const char *template_src)
{
    int err;
    memset(t, 0, sizeof(*t));
    if (!what)
        what = "tokenizer_config.json";
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return td_err_set(TD_ENOMEM, "%s: out of memory", what);
    json_object *cfg =
        len > INT32_MAX ? NULL : json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!cfg || jerr != json_tokener_success) {
        err = td_err_set(TD_EPARSE, "%s: not valid JSON: %s", what,
                         jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                                                      : "incomplete or too large");
        goto err_put;
    }
    if (!json_object_is_type(cfg, json_type_object)) {
        err = td_err_set(TD_EPARSE, "%s: expected a JSON object", what);
        goto err_put;
    }
    const char *def = template_src, *tools = NULL;
    if (!def && (err = template_texts(cfg, what, &def, &tools)))
        goto err_put;
    if (!def) {
        err = td_err_set(TD_ENOENT, "%s: no \"chat_template\"", what);
        goto err_put;
    }
    if ((err = compile(def, what, template_src ? "template" : "chat_template", &t->tpl)))
        goto err_free;
    if (tools && (err = compile(tools, what, "chat_template[tool_use]", &t->tpl_tools)))
        goto err_free;
    if ((err = special_tokens(cfg, what, t)))
        goto err_free;
    json_object_put(cfg);
    return 0;

err_free:
    td_chat_template_free(t);
err_put:
    json_object_put(cfg);
    return err;
}

int td_chat_template_load(td_chat_template_t *t, const char *path, const char *template_path)
{
    char *text = NULL, *src = NULL;
    size_t len = 0, src_len = 0;
    memset(t, 0, sizeof(*t));
    int err = td_file_read_all(path, &text, &len);
    if (err)
        return err;
    if (template_path) {
        if ((err = td_file_read_all(template_path, &src, &src_len)))
            goto out;
        err = td_chat_template_load_json(t, text, len, template_path, src);
        goto out;
    }
    err = td_chat_template_load_json(t, text, len, path, NULL);
    if (err == TD_ENOENT) { /* newer checkpoints keep the template in chat_template.jinja */
        char jpath[4096];
        const char *slash = strrchr(path, '/');
        snprintf(jpath, sizeof(jpath), "%.*schat_template.jinja",
                 slash ? (int)(slash - path + 1) : 0, path);
        if (td_file_read_all(jpath, &src, &src_len) == 0)
            err = td_chat_template_load_json(t, text, len, jpath, src);
        else
            err = td_err_set(TD_ENOENT, "%s: no \"chat_template\" and no %s", path, jpath);
    }
out:
    free(src);
    free(text);
    return err;
}

void td_chat_template_free(td_chat_template_t *t)
{
    if (!t)
        return;
    td_jinja_free(t->tpl);
    td_jinja_free(t->tpl_tools);
    json_object_put(t->tokens);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof(*t));
}

/* ---- OpenAI messages ------------------------------------------------------------------------- */

static const char *json_type_label(const json_object *v)
{
    return v ? json_type_to_name(json_object_get_type(v)) : "null";
}

static bool utf8_valid(const char *p, size_t n, size_t *bad_at)
{
    for (size_t i = 0; i < n;) {
        size_t k = td_utf8_valid_len((const uint8_t *)p + i, n - i);
        if (k == 0) {
            *bad_at = i;
            return false;
        }
        i += k;
    }
    return true;
}

static int check_text(json_object *v, size_t i, const char *field)
{
    size_t bad;
    if (!utf8_valid(json_object_get_string(v), (size_t)json_object_get_string_len(v), &bad))
        return td_err_set(TD_EINVAL, "messages[%zu].%s: invalid UTF-8 at byte %zu", i, field,
                          bad);
    return 0;
}

static int check_part_text(json_object *v, size_t i, size_t k)
{
    char field[48];
    snprintf(field, sizeof(field), "content[%zu].text", k);
    return check_text(v, i, field);
}

/* `content` as an array of {"type": "text", "text": string} parts, joined into one string. */
static int join_parts(json_object *arr, size_t i, json_object **out)
{
    td_buf_t b;
    td_buf_init(&b);
    int err = 0;
    for (size_t k = 0; err == 0 && k < json_object_array_length(arr); k++) {
        json_object *part = json_object_array_get_idx(arr, k), *type = NULL, *text = NULL;
        if (!json_object_is_type(part, json_type_object))
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu]: expected an object, got %s",
                             i, k, json_type_label(part));
        else if (!json_object_object_get_ex(part, "type", &type) ||
                 !json_object_is_type(type, json_type_string))
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu].type: missing or not a string",
                             i, k);
        else if (strcmp(json_object_get_string(type), "text") != 0)
            err = td_err_set(TD_ENOTSUP,
                             "messages[%zu].content[%zu].type: \"%.40s\" parts are not supported "
                             "(only \"text\")",
                             i, k, json_object_get_string(type));
        else if (!json_object_object_get_ex(part, "text", &text) ||
                 !json_object_is_type(text, json_type_string))
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu].text: %s", i, k,
                             text ? "expected a string" : "missing");
        else if ((err = check_part_text(text, i, k)) != 0)
            ;
        else if (td_buf_append(&b, json_object_get_string(text),
                               (size_t)json_object_get_string_len(text)))
            err = td_err_set(TD_ENOMEM, "messages[%zu].content: out of memory", i);
    }
    if (err == 0) {
        *out = json_object_new_string_len(b.data ? b.data : "", (int)b.len);
        if (!*out)
            err = td_err_set(TD_ENOMEM, "messages[%zu].content: out of memory", i);
    }
    td_buf_free(&b);
    return err;
}

static int parse_role(json_object *msg, size_t i, td_chat_role_t *role)
{
    static const struct {
        const char *name;
        td_chat_role_t role;
    } roles[] = {{"system", TD_CHAT_ROLE_SYSTEM},
                 {"developer", TD_CHAT_ROLE_SYSTEM},
                 {"user", TD_CHAT_ROLE_USER},
                 {"assistant", TD_CHAT_ROLE_ASSISTANT},
                 {"tool", TD_CHAT_ROLE_TOOL}};
    json_object *v = NULL;
    if (!json_object_object_get_ex(msg, "role", &v) || v == NULL)
        return td_err_set(TD_EINVAL, "messages[%zu].role: missing", i);
    if (!json_object_is_type(v, json_type_string))
        return td_err_set(TD_EINVAL, "messages[%zu].role: expected a string, got %s", i,
                          json_type_label(v));
    const char *s = json_object_get_string(v);
    for (size_t k = 0; k < TD_ARRAY_LEN(roles); k++) {
        if (strcmp(s, roles[k].name) == 0) {
            *role = roles[k].role;
            return 0;
        }
    }
    return td_err_set(TD_EINVAL,
                      "messages[%zu].role: unknown role \"%.64s\" (expected system, developer, "
                      "user, assistant or tool)",
                      i, s);
}

/* Tool calls: each {"function": {"name": string, "arguments": JSON text or object}}; the
 * arguments text is parsed into an object, as vLLM does before rendering. */
static int normalize_tool_calls(json_object *calls, size_t i, size_t *n_out)
{
    *n_out = 0;
    if (!json_object_is_type(calls, json_type_array))
        return td_err_set(TD_EINVAL, "messages[%zu].tool_calls: expected an array, got %s", i,
                          json_type_label(calls));
    size_t n = json_object_array_length(calls);
    for (size_t k = 0; k < n; k++) {
        json_object *c = json_object_array_get_idx(calls, k), *fn = NULL, *name = NULL,
                    *args = NULL;
        if (!json_object_is_type(c, json_type_object))
            return td_err_set(TD_EINVAL, "messages[%zu].tool_calls[%zu]: expected an object, got %s",
                              i, k, json_type_label(c));
        if (!json_object_object_get_ex(c, "function", &fn) ||
            !json_object_is_type(fn, json_type_object))
            return td_err_set(TD_EINVAL, "messages[%zu].tool_calls[%zu].function: %s", i, k,
                              fn ? "expected an object" : "missing");
        if (!json_object_object_get_ex(fn, "name", &name) ||
            !json_object_is_type(name, json_type_string))
            return td_err_set(TD_EINVAL, "messages[%zu].tool_calls[%zu].function.name: %s", i, k,
                              name ? "expected a string" : "missing");
        if (!json_object_object_get_ex(fn, "arguments", &args) || args == NULL) {
            json_object_object_add(fn, "arguments", json_object_new_object());
        } else if (json_object_is_type(args, json_type_string)) {
            const char *text = json_object_get_string(args);
            size_t tl = (size_t)json_object_get_string_len(args);
            json_object *parsed = NULL;
            if (tl == 0) {
                parsed = json_object_new_object();
            } else {
                json_tokener *tok = json_tokener_new();
                if (!tok)
                    return td_err_set(TD_ENOMEM, "messages[%zu]: out of memory", i);
                parsed = json_tokener_parse_ex(tok, text, (int)TD_MIN(tl, (size_t)INT32_MAX));
                bool ok = json_tokener_get_error(tok) == json_tokener_success &&
                          json_tokener_get_parse_end(tok) == tl;
                json_tokener_free(tok);
                if (!ok) {
                    json_object_put(parsed);
                    return td_err_set(TD_EINVAL,
                                      "messages[%zu].tool_calls[%zu].function.arguments: not "
                                      "valid JSON",
                                      i, k);
                }
            }
            json_object_object_add(fn, "arguments", parsed);
        } else if (!json_object_is_type(args, json_type_object)) {
            return td_err_set(TD_EINVAL,
                              "messages[%zu].tool_calls[%zu].function.arguments: expected a JSON "
                              "string or an object, got %s",
                              i, k, json_type_label(args));
        }
    }
    *n_out = n;
    return 0;
}

/* Validate and normalize one message in place (msg is the list's own copy). */
static int parse_msg(json_object *msg, size_t i, td_chat_msg_t *m)
{
    json_object *v = NULL, *calls = NULL;
    int err;
    if (!json_object_is_type(msg, json_type_object))
        return td_err_set(TD_EINVAL, "messages[%zu]: expected an object, got %s", i,
                          json_type_label(msg));
    if ((err = parse_role(msg, i, &m->role)))
        return err;
    if (json_object_object_get_ex(msg, "tool_calls", &calls) && calls != NULL) {
        if (m->role != TD_CHAT_ROLE_ASSISTANT)
            return td_err_set(TD_EINVAL, "messages[%zu].tool_calls: only assistant messages "
                                         "carry tool calls",
                              i);
        if ((err = normalize_tool_calls(calls, i, &m->n_tool_calls)))
            return err;
    }
    bool has = json_object_object_get_ex(msg, "content", &v);
    m->content = "";
    m->content_len = 0;
    if (!has || v == NULL) {
        if (m->role != TD_CHAT_ROLE_ASSISTANT || m->n_tool_calls == 0)
            return td_err_set(TD_EINVAL, "messages[%zu].content: %s", i,
                              has ? "is null" : "missing");
        v = json_object_new_string(""); /* as vLLM: templates get a string */
        if (!v)
            return td_err_set(TD_ENOMEM, "messages[%zu]: out of memory", i);
        json_object_object_add(msg, "content", v);
    } else if (json_object_is_type(v, json_type_array)) {
        json_object *joined = NULL;
        if ((err = join_parts(v, i, &joined)))
            return err;
        json_object_object_add(msg, "content", joined);
        v = joined;
    } else if (!json_object_is_type(v, json_type_string)) {
        return td_err_set(TD_EINVAL,
                          "messages[%zu].content: expected a string or an array of text parts, "
                          "got %s",
                          i, json_type_label(v));
    }
    if ((err = check_text(v, i, "content")))
        return err;
    m->content = json_object_get_string(v);
    m->content_len = (size_t)json_object_get_string_len(v);
    if (m->role == TD_CHAT_ROLE_ASSISTANT &&
        json_object_object_get_ex(msg, "reasoning_content", &v) && v != NULL) {
        if (!json_object_is_type(v, json_type_string))
            return td_err_set(TD_EINVAL,
                              "messages[%zu].reasoning_content: expected a string or null, got %s",
                              i, json_type_label(v));
        if ((err = check_text(v, i, "reasoning_content")))
            return err;
        m->reasoning = json_object_get_string(v);
        m->reasoning_len = (size_t)json_object_get_string_len(v);
    }
    return 0;
}

int td_chat_msgs_from_json(td_chat_msgs_t *out, const struct json_object *messages)
{
    memset(out, 0, sizeof(*out));
    json_object *arr = (json_object *)messages, *copy = NULL;
    if (!arr || !json_object_is_type(arr, json_type_array))
        return td_err_set(TD_EINVAL, "messages: expected an array, got %s", json_type_label(arr));
    size_t n = json_object_array_length(arr);
    if (json_object_deep_copy(arr, &copy, NULL) != 0)
        return td_err_set(TD_ENOMEM, "messages: out of memory");
    td_chat_msg_t *v = td_calloc(n ? n : 1, sizeof(*v));
    if (!v) {
        json_object_put(copy);
        return td_err_set(TD_ENOMEM, "messages: out of memory for %zu messages", n);
    }
    out->v = v;
    out->json = copy;
    for (size_t i = 0; i < n; i++) {
        int err = parse_msg(json_object_array_get_idx(copy, i), i, &v[i]);
        if (err) {
            td_chat_msgs_free(out);
            return err;
        }
        out->n = i + 1;
    }
    return 0;
}

int td_chat_msgs_parse(td_chat_msgs_t *out, const char *json, size_t len)
{
    memset(out, 0, sizeof(*out));
    if (!json || len > INT32_MAX)
        return td_err_set(TD_EINVAL, "messages: %s", json ? "JSON too large" : "NULL");
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return td_err_set(TD_ENOMEM, "messages: out of memory");
    json_object *arr = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    if (jerr == json_tokener_continue) {
        /* a top-level literal (`null`, `5`) needs a delimiter to complete; all input was used */
        arr = json_tokener_parse_ex(tok, " ", 1);
        jerr = json_tokener_get_error(tok);
        used = len;
    }
    json_tokener_free(tok);
    int err;
    if (jerr != json_tokener_success) {
        err = td_err_set(TD_EPARSE, "messages: not valid JSON: %s",
                         jerr == json_tokener_continue ? "unexpected end of input"
                                                       : json_tokener_error_desc(jerr));
        goto out;
    }
    while (used < len &&
           (json[used] == ' ' || json[used] == '\t' || json[used] == '\r' || json[used] == '\n'))
        used++;
    if (used != len) {
        err =
            td_err_set(TD_EPARSE, "messages: trailing data after the JSON value at byte %zu", used);
        goto out;
    }
    err = td_chat_msgs_from_json(out, arr);
out:
    json_object_put(arr);
    return err;
}

void td_chat_msgs_free(td_chat_msgs_t *m)
{
    if (!m)
        return;
    free(m->v);
    json_object_put(m->json);
    memset(m, 0, sizeof(*m));
}

/* ---- rendering ------------------------------------------------------------------------------- */

int td_chat_render(const td_chat_template_t *t, const td_chat_msgs_t *msgs,
                   const td_chat_opts_t *opts, td_buf_t *out)
{
    static const td_chat_opts_t defaults;
    static const char *const reserved[] = {"messages", "tools", "documents",
                                           "add_generation_prompt"};
    if (!t || !t->tpl || !msgs || !out)
        return td_err_set(TD_EINVAL, "td_chat_render: NULL argument or no template");
    if (!opts)
        opts = &defaults;
    json_object *kw = (json_object *)opts->kwargs;
    if (kw && !json_object_is_type(kw, json_type_object))
        return td_err_set(TD_EINVAL, "chat_template_kwargs: expected an object");
    for (size_t i = 0; kw && i < TD_ARRAY_LEN(reserved); i++)
        if (json_object_object_get_ex(kw, reserved[i], NULL))
            return td_err_set(TD_EINVAL, "chat_template_kwargs.%s: set by the request itself, "
                                         "not a template kwarg",
                              reserved[i]);
    json_object *tools = (json_object *)opts->tools;
    if (tools && !json_object_is_type(tools, json_type_array))
        return td_err_set(TD_EINVAL, "tools: expected an array");
    json_object *vars = json_object_new_object();
    if (!vars)
        return td_err_set(TD_ENOMEM, "chat template: out of memory");
    /* transformers: render(messages, tools, documents, add_generation_prompt,
     * **special_tokens_map, **kwargs) */
    json_object_object_foreach(t->tokens, tk, tv)
        json_object_object_add(vars, tk, json_object_get(tv));
    if (opts->disable_thinking)
        json_object_object_add(vars, "enable_thinking", json_object_new_boolean(0));
    if (kw) {
        json_object_object_foreach(kw, k, v)
            json_object_object_add(vars, k, json_object_get(v));
    }
    json_object_object_add(vars, "messages", msgs->json ? json_object_get(msgs->json)
                                                        : json_object_new_array());
    json_object_object_add(vars, "tools", tools ? json_object_get(tools) : NULL);
    json_object_object_add(vars, "documents", NULL);
    json_object_object_add(vars, "add_generation_prompt",
                           json_object_new_boolean(opts->add_generation_prompt));
    const td_jinja_t *tpl = tools && t->tpl_tools ? t->tpl_tools : t->tpl;
    td_jinja_opts_t jo = {.now_s = opts->now_s};
    int err = td_jinja_render(tpl, vars, &jo, out);
    json_object_put(vars);
    return err;
}

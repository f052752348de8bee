/* toolparse.c: tool calls in model output (DeepSeek-V3, Llama 3.1 JSON, Qwen3/Hermes, gpt-oss
 * harmony), see toolparse.h. */
#include "toolparse.h"
#include "td_error.h"
#include "td_tokenizer.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

static const char *const names[] = {"none", "deepseek_v3", "llama3_json", "qwen3", "harmony"};

const char *td_tool_fmt_name(td_tool_fmt_t f)
{
    return (unsigned)f < sizeof(names) / sizeof(names[0]) ? names[f] : "none";
}

int td_tool_fmt_from_name(const char *name, td_tool_fmt_t *out)
{
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (td_tool_fmt_t)i;
            return 0;
        }
    return td_err_set(TD_EINVAL,
                      "unknown tool parser '%s' (none, deepseek_v3, llama3_json, qwen3, harmony)",
                      name ? name : "");
}

static bool has_token(const td_tokenizer_t *tok, const char *t)
{
    return td_tokenizer_token_to_id(tok, t, strlen(t)) >= 0;
}

td_tool_fmt_t td_tool_fmt_detect(const td_tokenizer_t *tok)
{
    if (!tok)
        return TD_TOOL_FMT_NONE;
    if (has_token(tok, DS_CALLS_BEGIN))
        return TD_TOOL_FMT_DEEPSEEK;
    if (has_token(tok, "<|call|>") && has_token(tok, "<|channel|>"))
        return TD_TOOL_FMT_HARMONY;
    if (has_token(tok, "<tool_call>"))
        return TD_TOOL_FMT_QWEN3;
    if (has_token(tok, "<|python_tag|>"))
        return TD_TOOL_FMT_LLAMA3;
    return TD_TOOL_FMT_NONE;
}

bool td_tool_fmt_needs_special(td_tool_fmt_t f)
{
    return f == TD_TOOL_FMT_HARMONY;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static const char *find(const char *s, const char *end, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = s; p && p + n <= end; p++) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p || p + n > end)
            return NULL;
        if (memcmp(p, needle, n) == 0)
            return p;
    }
    return NULL;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && is_ws(**s))
        (*s)++;
    while (*e > *s && is_ws((*e)[-1]))
        (*e)--;
}

static int add_call(td_tool_parsed_t *p, const char *name, size_t nl, const char *args,
                    size_t al)
{
    const char *as = args, *ae = args + al;
    trim(&as, &ae);
    const char *ns = name, *ne = name + nl;
    trim(&ns, &ne);
    td_tool_call_t *v = td_reallocarray(p->calls, p->n_calls + 1, sizeof(*v));
    if (!v)
        return TD_ENOMEM;
    p->calls = v;
    td_tool_call_t *c = &v[p->n_calls];
    c->name = td_strndup(ns, (size_t)(ne - ns));
    c->arguments = as == ae ? td_strndup("{}", 2) : td_strndup(as, (size_t)(ae - as));
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return TD_ENOMEM;
    }
    p->n_calls++;
    return 0;
}

/* A {"name": ..., "arguments"|"parameters": ...} object: parsed whole when it is JSON; else, as
 * a prefilled-and-continued call is, `{"name": "NAME", "<key>": ` followed by the arguments
 * (the object's closing brace, when last, dropped). 1 when a call was added, 0 when s is not
 * such an object, <0 on error. */
static int name_args_object(td_tool_parsed_t *p, const char *s, const char *e, bool whole_only)
{
    trim(&s, &e);
    if (s == e || *s != '{')
        return 0;
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return TD_ENOMEM;
    json_object *o = json_tokener_parse_ex(tok, s, (int)TD_MIN((size_t)(e - s), (size_t)INT32_MAX));
    bool whole = o && json_tokener_get_error(tok) == json_tokener_success &&
                 json_tokener_get_parse_end(tok) == (size_t)(e - s);
    json_tokener_free(tok);
    if (whole && json_object_is_type(o, json_type_object)) {
        json_object *n = NULL, *a = NULL;
        json_object_object_get_ex(o, "name", &n);
        if (!json_object_object_get_ex(o, "arguments", &a))
            json_object_object_get_ex(o, "parameters", &a);
        int rc = 0;
        if (n && json_object_is_type(n, json_type_string)) {
            const char *at = a ? json_object_to_json_string_ext(a, JSON_C_TO_STRING_PLAIN |
                                                                       JSON_C_TO_STRING_NOSLASHESCAPE)
                               : "{}";
            rc = add_call(p, json_object_get_string(n), (size_t)json_object_get_string_len(n),
                          at, strlen(at));
            rc = rc ? rc : 1;
        }
        json_object_put(o);
        return rc;
    }
    json_object_put(o);
    if (whole_only)
        return 0;
    /* {"name": "NAME", "arguments": REST */
    const char *q = s + 1;
    while (q < e && is_ws(*q))
        q++;
    if ((size_t)(e - q) < 8 || memcmp(q, "\"name\"", 6) != 0)
        return 0;
    q += 6;
    while (q < e && is_ws(*q))
        q++;
    if (q >= e || *q++ != ':')
        return 0;
    while (q < e && is_ws(*q))
        q++;
    if (q >= e || *q++ != '"')
        return 0;
    const char *ns = q;
    while (q < e && *q != '"' && *q != '\\')
        q++;
    if (q >= e || *q != '"')
        return 0;
    const char *ne = q++;
    while (q < e && is_ws(*q))
        q++;
    if (q >= e || *q++ != ',')
        return 0;
    while (q < e && is_ws(*q))
        q++;
    if ((size_t)(e - q) >= 12 && memcmp(q, "\"arguments\"", 11) == 0)
        q += 11;
    else if ((size_t)(e - q) >= 13 && memcmp(q, "\"parameters\"", 12) == 0)
        q += 12;
    else
        return 0;
    while (q < e && is_ws(*q))
        q++;
    if (q >= e || *q++ != ':')
        return 0;
    /* complete arguments followed by more than the object's brace: not a call */
    json_tokener *at = json_tokener_new();
    if (!at)
        return TD_ENOMEM;
    json_object *av = json_tokener_parse_ex(at, q, (int)TD_MIN((size_t)(e - q), (size_t)INT32_MAX));
    size_t used = json_tokener_get_parse_end(at);
    bool complete = av && json_tokener_get_error(at) == json_tokener_success;
    json_object_put(av);
    json_tokener_free(at);
    if (complete) {
        const char *r = q + used;
        while (r < e && is_ws(*r))
            r++;
        if (r < e && *r == '}')
            r++;
        while (r < e && is_ws(*r))
            r++;
        if (r < e)
            return 0;
    }
    const char *ae = e;
    if (ae > q && ae[-1] == '}') { /* the object's brace, when the arguments' own is before it */
        const char *t = ae - 1;
        while (t > q && is_ws(t[-1]))
            t--;
        if (t > q && t[-1] == '}')
            ae--;
    }
    int rc = add_call(p, ns, (size_t)(ne - ns), q, (size_t)(ae - q));
    return rc ? rc : 1;
}

static int text_add(td_buf_t *t, const char *s, const char *e)
{
    return e > s ? td_buf_append(t, s, (size_t)(e - s)) : 0;
}

/* ---- the formats --------------------------------------------------------------------------- */

static int parse_deepseek(const char *s, const char *end, td_tool_parsed_t *p, td_buf_t *text)
{
    const char *b = find(s, end, DS_CALLS_BEGIN);
    const char *cb1 = find(s, end, DS_CALL_BEGIN);
    if (!b || (cb1 && cb1 < b))
        b = cb1;
    if (!b)
        return text_add(text, s, end);
    int rc = text_add(text, s, b);
    const char *q = b;
    for (;;) {
        const char *cb = find(q, end, DS_CALL_BEGIN);
        if (!cb || rc)
            break;
        cb += strlen(DS_CALL_BEGIN);
        const char *ce = find(cb, end, DS_CALL_END);
        const char *stop = ce ? ce : end;
        const char *sep = find(cb, stop, DS_SEP);
        if (!sep)
            break;
        const char *after = sep + strlen(DS_SEP);
        if (sep - cb == 8 && memcmp(cb, "function", 8) == 0) { /* V3: name\n```json\nARGS\n``` */
            const char *nl = memchr(after, '\n', (size_t)(stop - after));
            const char *ne = nl ? nl : stop;
            const char *as = nl ? nl + 1 : stop, *ae = stop;
            if ((size_t)(ae - as) >= 7 && memcmp(as, "```json", 7) == 0)
                as += 7;
            const char *fence = NULL;
            for (const char *t = as; (t = find(t, ae, "```")); t += 3)
                fence = t;
            if (fence)
                ae = fence;
            rc = add_call(p, after, (size_t)(ne - after), as, (size_t)(ae - as));
        } else { /* V3.1: NAME<sep>ARGS */
            rc = add_call(p, cb, (size_t)(sep - cb), after, (size_t)(stop - after));
        }
        if (!ce)
            break;
        q = ce + strlen(DS_CALL_END);
    }
    return rc;
}

static int parse_qwen(const char *s, const char *end, td_tool_parsed_t *p, td_buf_t *text)
{
    const char *q = s;
    int rc = 0;
    while (!rc) {
        const char *b = find(q, end, "<tool_call>");
        if (!b)
            return text_add(text, q, end);
        const char *in = b + strlen("<tool_call>");
        const char *ce = find(in, end, "</tool_call>");
        const char *stop = ce ? ce : end;
        int got = name_args_object(p, in, stop, false);
        if (got < 0)
            return got;
        if (got == 0) /* not a call: keep it as text */
            rc = text_add(text, q, ce ? ce + strlen("</tool_call>") : end);
        else
            rc = text_add(text, q, b);
        if (!ce)
            break;
        q = ce + strlen("</tool_call>");
    }
    return rc;
}

static int parse_llama(const char *s, const char *end, td_tool_parsed_t *p, td_buf_t *text)
{
    const char *q = s, *e = end;
    trim(&q, &e);
    if ((size_t)(e - q) >= 14 && memcmp(q, "<|python_tag|>", 14) == 0)
        q += 14;
    td_tool_parsed_t tmp = {0};
    int rc = 0;
    /* split on ';' outside strings and braces */
    while (q < e) {
        int depth = 0;
        bool str = false, esc = false;
        const char *t = q;
        for (; t < e; t++) {
            char c = *t;
            if (str) {
                if (esc)
                    esc = false;
                else if (c == '\\')
                    esc = true;
                else if (c == '"')
                    str = false;
            } else if (c == '"') {
                str = true;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                depth--;
            } else if (c == ';' && depth == 0) {
                break;
            }
        }
        bool last = t >= e;
        rc = name_args_object(&tmp, q, t, !(last && tmp.n_calls == 0));
        if (rc <= 0)
            break;
        rc = 0;
        q = last ? e : t + 1;
    }
    if (rc < 0 || tmp.n_calls == 0 || q < e) {
        td_tool_parsed_free(&tmp);
        return rc < 0 ? rc : text_add(text, s, end);
    }
    p->calls = tmp.calls;
    p->n_calls = tmp.n_calls;
    return 0;
}

static int parse_harmony(const char *s, const char *end, td_tool_parsed_t *p, td_buf_t *text)
{
    const char *q = s;
    bool channels = false;
    int rc = 0;
    while (!rc) {
        const char *ch = find(q, end, "<|channel|>");
        if (!ch)
            break;
        channels = true;
        const char *hs = ch + strlen("<|channel|>");
        const char *msg = find(hs, end, "<|message|>");
        if (!msg)
            break;
        const char *body = msg + strlen("<|message|>");
        const char *stops[] = {"<|call|>", "<|end|>", "<|return|>", "<|start|>"};
        const char *be = end;
        for (size_t i = 0; i < 4; i++) {
            const char *t = find(body, end, stops[i]);
            if (t && t < be)
                be = t;
        }
        const char *to = find(hs, msg, "to=functions.");
        if (to) {
            const char *ns = to + strlen("to=functions.");
            const char *ne = ns;
            while (ne < msg && !is_ws(*ne) && *ne != '<')
                ne++;
            rc = add_call(p, ns, (size_t)(ne - ns), body, (size_t)(be - body));
        } else if ((size_t)(msg - hs) >= 5 && memcmp(hs, "final", 5) == 0) {
            rc = text_add(text, body, be);
        }
        q = be;
    }
    if (!channels)
        return text_add(text, s, end);
    return rc;
}

int td_tool_parse(td_tool_fmt_t f, const char *s, size_t len, td_tool_parsed_t *out)
{
    memset(out, 0, sizeof(*out));
    td_buf_t text;
    td_buf_init(&text);
    const char *end = s + len;
    int rc;
    switch (f) {
    case TD_TOOL_FMT_DEEPSEEK: rc = parse_deepseek(s, end, out, &text); break;
    case TD_TOOL_FMT_QWEN3: rc = parse_qwen(s, end, out, &text); break;
    case TD_TOOL_FMT_LLAMA3: rc = parse_llama(s, end, out, &text); break;
    case TD_TOOL_FMT_HARMONY: rc = parse_harmony(s, end, out, &text); break;
    default: rc = text_add(&text, s, end); break;
    }
    if (!rc && !text.data)
        rc = td_buf_append(&text, "", 0);
    if (rc) {
        td_buf_free(&text);
        td_tool_parsed_free(out);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    out->text = td_buf_steal(&text, &out->text_len);
    return 0;
}

void td_tool_parsed_free(td_tool_parsed_t *p)
{
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->text);
    memset(p, 0, sizeof(*p));
}

int td_tool_prefill(td_tool_fmt_t f, const char *name, td_buf_t *out)
{
    switch (f) {
    case TD_TOOL_FMT_DEEPSEEK:
        return td_buf_printf(out, DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "%s\n```json\n",
                             name);
    case TD_TOOL_FMT_QWEN3:
        return td_buf_printf(out, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
    case TD_TOOL_FMT_LLAMA3: return td_buf_printf(out, "{\"name\": \"%s\", \"parameters\": ", name);
    case TD_TOOL_FMT_HARMONY:
        return td_buf_printf(out, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>",
                             name);
    default: return td_err_set(TD_ENOTSUP, "this model has no known tool-call format");
    }
}

static const char *start_marker(td_tool_fmt_t f)
{
    switch (f) {
    case TD_TOOL_FMT_DEEPSEEK: return DS_CALLS_BEGIN;
    case TD_TOOL_FMT_QWEN3: return "<tool_call>";
    case TD_TOOL_FMT_HARMONY: return "<|channel|>";
    default: return NULL;
    }
}

size_t td_tool_find_start(td_tool_fmt_t f, const char *s, size_t len)
{
    if (f == TD_TOOL_FMT_LLAMA3) { /* a call is the whole output: it starts with '{' or the tag */
        size_t i = 0;
        while (i < len && is_ws(s[i]))
            i++;
        if (i < len && (s[i] == '{' || s[i] == '<'))
            return 0;
        return len;
    }
    const char *m = start_marker(f);
    const char *t = m ? find(s, s + len, m) : NULL;
    return t ? (size_t)(t - s) : len;
}

size_t td_tool_holdback(td_tool_fmt_t f, const char *s, size_t len)
{
    if (f == TD_TOOL_FMT_LLAMA3) { /* all blank so far: the call may still come */
        for (size_t i = 0; i < len; i++)
            if (!is_ws(s[i]))
                return 0;
        return len;
    }
    const char *m = start_marker(f);
    if (!m)
        return 0;
    size_t ml = strlen(m);
    for (size_t k = TD_MIN(len, ml - 1); k > 0; k--)
        if (memcmp(s + len - k, m, k) == 0)
            return k;
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------------- */

int td_tool_stream_init(td_tool_stream_t *s, td_tool_fmt_t f, const char *prefill)
{
    memset(s, 0, sizeof(*s));
    s->fmt = f;
    td_buf_init(&s->held);
    s->in_call = prefill != NULL || f == TD_TOOL_FMT_HARMONY;
    return prefill ? td_buf_append_str(&s->held, prefill) : 0;
}

int td_tool_stream_feed(td_tool_stream_t *s, const char *text, size_t len, td_buf_t *release)
{
    int rc = td_buf_append(&s->held, text, len);
    if (rc || s->in_call || !s->held.len)
        return rc;
    size_t k = td_tool_find_start(s->fmt, s->held.data, s->held.len);
    size_t out;
    if (k < s->held.len) {
        s->in_call = true;
        out = k;
    } else {
        out = s->held.len - td_tool_holdback(s->fmt, s->held.data, s->held.len);
    }
    if (!out)
        return 0;
    if ((rc = td_buf_append(release, s->held.data, out)))
        return rc;
    memmove(s->held.data, s->held.data + out, s->held.len - out);
    s->held.len -= out;
    s->held.data[s->held.len] = '\0';
    return 0;
}

int td_tool_stream_end(td_tool_stream_t *s, td_tool_parsed_t *out)
{
    return td_tool_parse(s->fmt, s->held.data ? s->held.data : "", s->held.len, out);
}

void td_tool_stream_free(td_tool_stream_t *s)
{
    td_buf_free(&s->held);
}

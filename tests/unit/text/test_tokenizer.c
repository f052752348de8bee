/* test_tokenizer.c: the tokenizer against Hugging Face `tokenizers` (ids and texts produced by
 * tests/node/tokenize_ref.js into the build directory), round trips, incremental decoding,
 * malformed files, and a small hand-checked tokenizer. */
#include "td_error.h"
#include "td_tokenizer.h"
#include "td_util.h"
#include "td_check.h"
#include "tokenizer_models.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

static const char *ref_dir(void)
{
    const char *d = getenv("TD_TOKENIZER_REF");
    return d ? d : "tests/tokenizer";
}

/* ---------------------------------------------------------------- corpus and expected files */

typedef struct corpus {
    char *data;
    size_t n;
    const char **s; /* [n] string starts (into data) */
    size_t *len;    /* [n] */
} corpus_t;

static void corpus_load(corpus_t *c, const char *path)
{
    size_t len;
    ck_assert_msg(td_file_read_all(path, &c->data, &len) == 0, "%s", td_err_msg());
    size_t cap = 1024;
    c->s = malloc(cap * sizeof(*c->s));
    c->len = malloc(cap * sizeof(*c->len));
    c->n = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(c->data + i, '\n', len - i);
        ck_assert_ptr_nonnull(nl);
        size_t l = strtoul(c->data + i, NULL, 10);
        if (c->n == cap) {
            cap *= 2;
            c->s = realloc(c->s, cap * sizeof(*c->s));
            c->len = realloc(c->len, cap * sizeof(*c->len));
        }
        c->s[c->n] = nl + 1;
        c->len[c->n++] = l;
        i = (size_t)(nl + 1 - c->data) + l + 1;
    }
}

static void corpus_free(corpus_t *c)
{
    free(c->data);
    free(c->s);
    free(c->len);
}

static void parse_ids(const char *p, const char *end, td_tokens_t *t)
{
    t->len = 0;
    while (p < end) {
        char *e;
        long v = strtol(p, &e, 10);
        ck_assert(e > p);
        td_tokens_push(t, (int32_t)v);
        p = e;
        if (p < end && *p == ',')
            p++;
    }
}

static void parse_hex(const char *p, const char *end, td_buf_t *b)
{
    td_buf_reset(b);
    td_buf_reserve(b, 1);
    for (; p + 1 < end; p += 2) {
        int hi = p[0] <= '9' ? p[0] - '0' : p[0] - 'a' + 10;
        int lo = p[1] <= '9' ? p[1] - '0' : p[1] - 'a' + 10;
        td_buf_append_char(b, (char)(hi << 4 | lo));
    }
}

/* Printable excerpt of a string for messages. */
static const char *excerpt(const char *s, size_t n)
{
    static char buf[200];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 6 < sizeof(buf); i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 32 && c != 127)
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* Compare two id lists; on mismatch print the first differing position and return false. */
static bool ids_equal(const char *what, const char *tname, size_t idx, const char *s, size_t sl,
                      const td_tokens_t *exp, const td_tokens_t *got)
{
    size_t i = 0;
    while (i < exp->len && i < got->len && exp->ids[i] == got->ids[i])
        i++;
    if (i == exp->len && i == got->len)
        return true;
    fprintf(stderr,
            "MISMATCH %s %s string #%zu \"%s\" (%zu bytes): first difference at id index %zu: "
            "expected %d, got %d (lengths %zu vs %zu)\n",
            tname, what, idx, excerpt(s, sl), sl, i, i < exp->len ? exp->ids[i] : -1,
            i < got->len ? got->ids[i] : -1, exp->len, got->len);
    return false;
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)s + i, n - i);
        if (!l)
            return false;
        i += l;
    }
    return true;
}

static bool is_nfc(const char *s, size_t n)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    bool eq = r == (utf8proc_ssize_t)n && memcmp(d, s, n) == 0;
    free(d);
    return eq;
}

/* Decode ids one at a time and check the pieces: each valid UTF-8, concatenation == full. */
static bool incremental_ok(const td_tokenizer_t *tok, const td_tokens_t *ids, bool skip,
                           const td_buf_t *full)
{
    td_detok_t st;
    td_detok_init(&st, skip);
    td_buf_t acc, piece;
    td_buf_init(&acc);
    td_buf_init(&piece);
    bool ok = true;
    for (size_t i = 0; i < ids->len && ok; i++) {
        td_buf_reset(&piece);
        ok = td_detok_step(tok, &st, ids->ids[i], &piece) == 0 && valid_utf8(piece.data, piece.len);
        td_buf_append(&acc, piece.data, piece.len);
    }
    ok = ok && td_detok_finish(tok, &st, &acc) == 0;
    ok = ok && acc.len == full->len && memcmp(acc.data, full->data, acc.len) == 0;
    td_buf_free(&acc);
    td_buf_free(&piece);
    return ok;
}

START_TEST(test_hf_agreement)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/manifest.txt", ref_dir());
    char *manifest;
    size_t mlen;
    ck_assert_msg(td_file_read_all(path, &manifest, &mlen) == 0,
                  "%s (the reference is produced by the tokenizer_ref target)", td_err_msg());
    corpus_t corpus;
    snprintf(path, sizeof(path), "%s/corpus.bin", ref_dir());
    corpus_load(&corpus, path);
    ck_assert_uint_ge(corpus.n, 500);
    size_t total_bad = 0, ntok = 0;
    td_tokens_t got, exp, exp2;
    td_tokens_init(&got);
    td_tokens_init(&exp);
    td_tokens_init(&exp2);
    td_buf_t dec, want;
    td_buf_init(&dec);
    td_buf_init(&want);
    for (char *line = strtok(manifest, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128], tpath[1024], mode[16];
        ck_assert_int_eq(sscanf(line, "%127s %1023s %15s", name, tpath, mode), 3);
        bool full = strcmp(mode, "full") == 0;
        bool real = strchr(name, '_') == NULL || strcmp(name, "deepseek_v3") == 0 ||
                    strcmp(name, "llama3_template") == 0;
        td_tokenizer_t *tok;
        ck_assert_msg(td_tokenizer_load(tpath, &tok) == 0, "%s: %s", name, td_err_msg());
        snprintf(path, sizeof(path), "%s/%s.expected", ref_dir(), name);
        char *expd;
        size_t elen;
        ck_assert_msg(td_file_read_all(path, &expd, &elen) == 0, "%s", td_err_msg());
        size_t bad = 0, bad_dec = 0, bad_rt = 0, bad_inc = 0, nrand = 0;
        char *p = expd, *end = expd + elen;
        for (size_t i = 0; i < corpus.n; i++) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            ck_assert_ptr_nonnull(nl);
            char *f1 = memchr(p, ';', (size_t)(nl - p));
            char *f2 = memchr(f1 + 1, ';', (size_t)(nl - f1 - 1));
            char *f3 = memchr(f2 + 1, ';', (size_t)(nl - f2 - 1));
            ck_assert(f1 && f2 && f3);
            const char *s = corpus.s[i];
            size_t sl = corpus.len[i];
            /* with special tokens */
            parse_ids(p, f1, &exp);
            got.len = 0;
            ck_assert_int_eq(td_tokenizer_encode(tok, s, sl, true, &got), 0);
            bool ok = ids_equal("add_special=true", name, i, s, sl, &exp, &got);
            /* without */
            parse_ids(f1 + 1, f2, &exp2);
            got.len = 0;
            ck_assert_int_eq(td_tokenizer_encode(tok, s, sl, false, &got), 0);
            ok = ids_equal("add_special=false", name, i, s, sl, &exp2, &got) && ok;
            bad += !ok;
            if (full) {
                /* decode(ids without specials) as HF does it */
                parse_hex(f2 + 1, f3, &want);
                td_buf_reset(&dec);
                ck_assert_int_eq(td_tokenizer_decode(tok, exp2.ids, exp2.len, false, &dec), 0);
                if (dec.len != want.len || memcmp(dec.data, want.data, dec.len)) {
                    if (!bad_dec++)
                        fprintf(stderr, "MISMATCH %s decode string #%zu \"%s\"\n", name, i,
                                excerpt(s, sl));
                }
                if (!incremental_ok(tok, &exp2, false, &dec) && !bad_inc++)
                    fprintf(stderr, "MISMATCH %s incremental decode string #%zu\n", name, i);
                /* round trip: valid UTF-8 comes back unchanged (NFC tokenizers: when NFC) */
                if (real && valid_utf8(s, sl) && (strcmp(name, "qwen3") || is_nfc(s, sl)) &&
                    (dec.len != sl || memcmp(dec.data, s, sl)) && !bad_rt++)
                    fprintf(stderr, "MISMATCH %s round trip string #%zu \"%s\"\n", name, i,
                            excerpt(s, sl));
                parse_hex(f3 + 1, nl, &want);
                td_buf_reset(&dec);
                ck_assert_int_eq(td_tokenizer_decode(tok, exp.ids, exp.len, true, &dec), 0);
                if ((dec.len != want.len || memcmp(dec.data, want.data, dec.len)) && !bad_dec++)
                    fprintf(stderr, "MISMATCH %s decode(skip special) string #%zu\n", name, i);
            }
            p = nl + 1;
        }
        ck_assert(strncmp(p, "DECODE\n", 7) == 0);
        p += 7;
        while (p < end) { /* random id sequences */
            char *nl = memchr(p, '\n', (size_t)(end - p));
            char *f1 = memchr(p, ';', (size_t)(nl - p));
            char *f2 = memchr(f1 + 1, ';', (size_t)(nl - f1 - 1));
            parse_ids(p, f1, &exp);
            for (int skip = 0; skip < 2; skip++) {
                parse_hex(skip ? f2 + 1 : f1 + 1, skip ? nl : f2, &want);
                td_buf_reset(&dec);
                ck_assert_int_eq(td_tokenizer_decode(tok, exp.ids, exp.len, skip, &dec), 0);
                if ((dec.len != want.len || memcmp(dec.data, want.data, dec.len)) && !bad_dec++)
                    fprintf(stderr,
                            "MISMATCH %s decode of random ids line %zu (skip=%d): got \"%s\"\n",
                            name, nrand, skip, excerpt(dec.data, dec.len));
                if (!incremental_ok(tok, &exp, skip, &dec) && !bad_inc++)
                    fprintf(stderr, "MISMATCH %s incremental decode of random ids line %zu\n", name,
                            nrand);
            }
            nrand++;
            p = nl + 1;
        }
        fprintf(stderr,
                "tokenizer %-20s %zu strings x2: %zu encode mismatches; %zu random id sequences; "
                "decode mismatches %zu, incremental %zu, round trip %zu\n",
                name, corpus.n, bad, nrand, bad_dec, bad_inc, bad_rt);
        total_bad += bad + bad_dec + bad_inc + bad_rt;
        ntok++;
        free(expd);
        td_tokenizer_free(tok);
    }
    ck_assert_uint_ge(ntok, 3);
    ck_assert_msg(total_bad == 0, "%zu mismatches with HF tokenizers (see stderr)", total_bad);
    td_tokens_free(&got);
    td_tokens_free(&exp);
    td_tokens_free(&exp2);
    td_buf_free(&dec);
    td_buf_free(&want);
    corpus_free(&corpus);
    free(manifest);
}
END_TEST

/* ---------------------------------------------------------------- a small hand-checked tokenizer
 */

/* GPT-2's byte-to-unicode map, written out independently of the implementation. */
static size_t byte_char(unsigned b, char *out)
{
    unsigned cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        unsigned n = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                n++;
        cp = 256 + n;
    }
    return td_utf8_encode(cp, out);
}

#define MINI_MODEL                                                                                 \
    "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,\"bc\":5,"        \
    "\"abc\":6,\"\\u010a\":7,\"\\u0120a\":8,\"1\":9,\"2\":10,\"12\":11},"                          \
    "\"merges\":[\"b c\",[\"a\",\"b\"],\"a bc\",\"\\u0120 a\",\"1 2\"]}"
#define MINI_PRETOK "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"
#define MINI_ADDED                                                                                 \
    "[{\"id\":12,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"                      \
    "{\"id\":13,\"content\":\"</s>\",\"special\":true,\"normalized\":false},"                      \
    "{\"id\":14,\"content\":\"xyz\",\"special\":false,\"normalized\":true}]"
#define MINI_POST                                                                                  \
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":"  \
    "0}},"                                                                                         \
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</"                   \
    "s>\",\"type_id\":0}}],"                                                                       \
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[12],\"tokens\":[\"<s>\"]},"              \
    "\"</s>\":{\"id\":\"</s>\",\"ids\":[13],\"tokens\":[\"</s>\"]}}}"

static char *mini_json(const char *normalizer, const char *pretok, const char *model,
                       const char *added, const char *post)
{
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b,
                  "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"normalizer\":%s,"
                  "\"pre_tokenizer\":%s,%s%s%s\"added_tokens\":%s,\"post_processor\":%s,"
                  "\"decoder\":{\"type\":\"ByteLevel\"}}",
                  normalizer, pretok, model ? "\"model\":" : "", model ? model : "",
                  model ? "," : "", added, post);
    return td_buf_steal(&b, NULL);
}

static td_tokenizer_t *mini(void)
{
    char *j = mini_json("null", MINI_PRETOK, MINI_MODEL, MINI_ADDED, MINI_POST);
    td_tokenizer_t *tok;
    ck_assert_msg(td_tokenizer_load_mem(j, strlen(j), NULL, 0, "mini.json", &tok) == 0, "%s",
                  td_err_msg());
    free(j);
    return tok;
}

static void check_encode(td_tokenizer_t *tok, const char *text, bool special, const int32_t *want,
                         size_t n)
{
    td_tokens_t t;
    td_tokens_init(&t);
    ck_assert_int_eq(td_tokenizer_encode(tok, text, strlen(text), special, &t), 0);
    ck_assert_msg(t.len == n, "\"%s\": %zu ids, want %zu", text, t.len, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(t.ids[i] == want[i], "\"%s\" id %zu: %d, want %d", text, i, t.ids[i],
                      want[i]);
    td_tokens_free(&t);
}

START_TEST(test_mini_bpe)
{
    td_tokenizer_t *tok = mini();
    /* "b c" has the lowest rank, so abc = a + bc, then (a, bc) -> abc */
    check_encode(tok, "abc", false, (int32_t[]){6}, 1);
    check_encode(tok, "abc", true, (int32_t[]){12, 6, 13}, 3);
    check_encode(tok, "ab", false, (int32_t[]){4}, 1);
    /* " abc": Ġ a b c -> Ġ a bc -> Ġ abc; (Ġ, abc) is no merge */
    check_encode(tok, " abc", false, (int32_t[]){3, 6}, 2);
    check_encode(tok, " a", false, (int32_t[]){8}, 1);
    /* added tokens split first; "d" has no token and is dropped (no unk_token) */
    check_encode(tok, "ab<s>c", false, (int32_t[]){4, 12, 2}, 3);
    check_encode(tok, "d</s>xyz12", false, (int32_t[]){13, 14, 11}, 3);
    check_encode(tok, "", true, (int32_t[]){12, 13}, 2);

    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_tokenizer_decode(tok, (int32_t[]){12, 3, 6, 13, 7}, 5, false, &b), 0);
    ck_assert_str_eq(b.data, "<s> abc</s>\n");
    td_buf_reset(&b);
    ck_assert_int_eq(td_tokenizer_decode(tok, (int32_t[]){12, 3, 6, 14, 13}, 5, true, &b), 0);
    ck_assert_str_eq(b.data, " abcxyz");
    td_buf_reset(&b);
    ck_assert_int_eq(td_tokenizer_decode(tok, (int32_t[]){6, 99}, 2, false, &b), TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "99"));
    td_buf_free(&b);

    size_t len;
    ck_assert_int_eq(td_tokenizer_token_to_id(tok, "abc", 3), 6);
    ck_assert_int_eq(td_tokenizer_token_to_id(tok, "<s>", 3), 12);
    ck_assert_int_eq(td_tokenizer_token_to_id(tok, "zz", 2), -1);
    ck_assert_str_eq(td_tokenizer_id_to_token(tok, 3, &len), "\xC4\xA0");
    ck_assert_ptr_null(td_tokenizer_id_to_token(tok, 15, &len));
    ck_assert_uint_eq(td_tokenizer_vocab_size(tok), 15);
    ck_assert(td_tokenizer_is_special(tok, 12));
    ck_assert(!td_tokenizer_is_special(tok, 14));
    ck_assert(!td_tokenizer_is_special(tok, 6));
    td_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- malformed input */

static void expect_load_error(const char *json, const char *config, int code, const char *field)
{
    td_tokenizer_t *tok = (td_tokenizer_t *)1;
    int rc = td_tokenizer_load_mem(json, strlen(json), config, config ? strlen(config) : 0,
                                   "bad.json", &tok);
    ck_assert_msg(rc == code, "want %s, got %s (%s) for field %s", td_err_name(code),
                  td_err_name(rc), td_err_msg(), field);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(td_err_msg(), "bad.json"), "message names no file: %s", td_err_msg());
    ck_assert_msg(strstr(td_err_msg(), field), "message \"%s\" does not name \"%s\"", td_err_msg(),
                  field);
}

START_TEST(test_malformed)
{
    char *good = mini_json("null", MINI_PRETOK, MINI_MODEL, MINI_ADDED, MINI_POST);
    /* truncated JSON, at every length: an error naming the file, never a crash */
    char *cut = strdup(good);
    for (size_t n = 0; n < strlen(good); n += 7) {
        cut[n] = '\0';
        expect_load_error(cut, NULL, TD_EPARSE, "invalid JSON");
        strcpy(cut, good);
    }
    free(cut);
    char *j;
#define BAD(expr, code, field)                                                                     \
    do {                                                                                           \
        j = (expr);                                                                                \
        expect_load_error(j, NULL, code, field);                                                   \
        free(j);                                                                                   \
    } while (0)
    BAD(mini_json("null", MINI_PRETOK, NULL, MINI_ADDED, MINI_POST), TD_EPARSE, "\"model\"");
    BAD(mini_json("null", "{\"type\":\"Whitespace\"}", MINI_MODEL, MINI_ADDED, MINI_POST),
        TD_ENOTSUP, "pre_tokenizer.type");
    BAD(mini_json("null", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Bogus\"}]}",
                  MINI_MODEL, MINI_ADDED, MINI_POST),
        TD_ENOTSUP, "pre_tokenizer.pretokenizers[0].type");
    BAD(mini_json(
            "null", MINI_PRETOK,
            "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\",\"a q\"]}",
            MINI_ADDED, MINI_POST),
        TD_EPARSE, "model.merges[1]");
    BAD(mini_json("null", MINI_PRETOK,
                  "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}", MINI_ADDED,
                  MINI_POST),
        TD_EPARSE, "model.merges[0]"); /* merged token "ab" missing */
    /* the packed merge table holds ids up to 2^21 - 2: a merge of a larger id is refused, the
     * largest allowed one still loads */
    BAD(mini_json("null", MINI_PRETOK,
                  "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2097151,\"ab\":2},"
                  "\"merges\":[\"a b\"]}",
                  MINI_ADDED, MINI_POST),
        TD_EPARSE, "model.merges[0]");
    {
        td_tokenizer_t *tok;
        j = mini_json("null", MINI_PRETOK,
                      "{\"type\":\"BPE\",\"vocab\":{\"a\":2097149,\"b\":2097150,\"ab\":2,"
                      "\"c\":0,\"bc\":1,\"ca\":3},\"merges\":[\"b c\",\"a b\"]}",
                      MINI_ADDED, MINI_POST);
        ck_assert_msg(td_tokenizer_load_mem(j, strlen(j), NULL, 0, "edge.json", &tok) == 0, "%s",
                      td_err_msg());
        free(j);
        check_encode(tok, "ab", false, (int32_t[]){2}, 1);
        check_encode(tok, "abc", false, (int32_t[]){2097149, 1}, 2); /* (b, c) ranks first */
        check_encode(tok, "ba", false, (int32_t[]){2097150, 2097149}, 2);
        /* "ca" is a token no merge makes: a word of its bytes is not that token */
        check_encode(tok, "ca", false, (int32_t[]){0, 2097149}, 2);
        td_tokenizer_free(tok);
    }
    BAD(mini_json("null",
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                  "{\"Regex\":\"(ab\"},\"behavior\":\"Isolated\",\"invert\":false},"
                  "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}",
                  MINI_MODEL, MINI_ADDED, MINI_POST),
        TD_EPARSE, "pre_tokenizer.pretokenizers[0].pattern.Regex");
    BAD(mini_json("null",
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                  "{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},{\"type\":\"ByteLevel\"}]}",
                  MINI_MODEL, MINI_ADDED, MINI_POST),
        TD_EPARSE, "pre_tokenizer.pretokenizers[0].behavior");
    /* wrong types */
    BAD(mini_json("null", MINI_PRETOK, "{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}", MINI_ADDED,
                  MINI_POST),
        TD_EPARSE, "model.vocab");
    BAD(mini_json("null", MINI_PRETOK, "{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}",
                  MINI_ADDED, MINI_POST),
        TD_EPARSE, "model.vocab");
    BAD(mini_json("null", MINI_PRETOK, "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[1]}",
                  MINI_ADDED, MINI_POST),
        TD_EPARSE, "model.merges[0]");
    BAD(mini_json("null", MINI_PRETOK, "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}",
                  MINI_ADDED, MINI_POST),
        TD_EPARSE, "model.merges");
    BAD(mini_json("null", MINI_PRETOK, "{\"type\":\"Unigram\",\"vocab\":[]}", MINI_ADDED,
                  MINI_POST),
        TD_ENOTSUP, "model.type");
    BAD(mini_json("null", MINI_PRETOK, MINI_MODEL,
                  "[{\"id\":12,\"content\":\"<s>\",\"special\":\"yes\"}]", MINI_POST),
        TD_EPARSE, "added_tokens[0].special");
    BAD(mini_json("null", MINI_PRETOK, MINI_MODEL, "[{\"content\":\"<s>\"}]", MINI_POST), TD_EPARSE,
        "added_tokens[0].id");
    BAD(mini_json("null", MINI_PRETOK, MINI_MODEL, "{}", MINI_POST), TD_EPARSE, "added_tokens");
    BAD(mini_json("null", MINI_PRETOK, MINI_MODEL, "[{\"id\":20,\"content\":\"\xffx\"}]",
                  MINI_POST),
        TD_EPARSE, "added_tokens[0].content");
    BAD(mini_json("{\"type\":5}", MINI_PRETOK, MINI_MODEL, MINI_ADDED, MINI_POST), TD_EPARSE,
        "normalizer.type");
    BAD(mini_json("{\"type\":\"Lowercase\"}", MINI_PRETOK, MINI_MODEL, MINI_ADDED, MINI_POST),
        TD_ENOTSUP, "normalizer.type");
    BAD(mini_json("null", MINI_PRETOK, MINI_MODEL, MINI_ADDED, "{\"type\":\"Bogus\"}"), TD_ENOTSUP,
        "post_processor.type");
    BAD(mini_json(
            "null", MINI_PRETOK, MINI_MODEL, MINI_ADDED,
            "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\"}}],"
            "\"special_tokens\":{}}"),
        TD_EPARSE, "post_processor.special_tokens");
    BAD(mini_json("null", "[]", MINI_MODEL, MINI_ADDED, MINI_POST), TD_EPARSE, "pre_tokenizer");
    BAD(mini_json("null", "null", MINI_MODEL, MINI_ADDED, MINI_POST), TD_ENOTSUP, "pre_tokenizer");
    { /* more pre-tokenizer steps than encode keeps scratch for */
        td_buf_t pt;
        td_buf_init(&pt);
        td_buf_append_str(&pt, "{\"type\":\"Sequence\",\"pretokenizers\":[");
        for (int i = 0; i < 16; i++)
            td_buf_append_str(&pt, "{\"type\":\"Digits\",\"individual_digits\":true},");
        td_buf_append_str(&pt, "{\"type\":\"ByteLevel\"}]}");
        BAD(mini_json("null", pt.data, MINI_MODEL, MINI_ADDED, MINI_POST), TD_ENOTSUP,
            "more than 15 steps");
        td_buf_free(&pt);
    }
    BAD(strdup("[1,2,3]"), TD_EPARSE, "top level");
    BAD(strdup("{\"model\":{}} trailing"), TD_EPARSE, "trailing");
#undef BAD
    /* tokenizer_config.json: its own name in the message */
    td_tokenizer_t *tok = (td_tokenizer_t *)1;
    ck_assert_int_eq(
        td_tokenizer_load_mem(good, strlen(good), "{\"add_bos_token\":", 17, "bad.json", &tok),
        TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "tokenizer_config.json"));
    ck_assert_int_eq(
        td_tokenizer_load_mem(good, strlen(good), "{\"add_bos_token\":true}", 22, "bad.json", &tok),
        TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "add_bos_token"));
    ck_assert_int_eq(
        td_tokenizer_load_mem(good, strlen(good), "{\"bos_token\":7}", 15, "bad.json", &tok),
        TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "bos_token"));
    /* config sets BOS/EOS: [bos] $A [eos] replaces the template */
    const char *cfg =
        "{\"add_bos_token\":true,\"add_eos_token\":false,\"bos_token\":{\"content\":\"</s>\"},"
        "\"eos_token\":\"<s>\",\"pad_token\":null}";
    ck_assert_int_eq(td_tokenizer_load_mem(good, strlen(good), cfg, strlen(cfg), "ok.json", &tok),
                     0);
    check_encode(tok, "ab", true, (int32_t[]){13, 4}, 2);
    ck_assert_int_eq(td_tokenizer_special_id(tok, "bos"), 13);
    ck_assert_int_eq(td_tokenizer_special_id(tok, "eos"), 12);
    ck_assert_int_eq(td_tokenizer_special_id(tok, "pad"), -1);
    td_tokenizer_free(tok);

    /* files: missing, truncated on disk */
    ck_assert_int_eq(td_tokenizer_load("/nonexistent/model-dir", &tok), TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "/nonexistent/model-dir/tokenizer.json"));
    char dir[] = "/tmp/td-tok-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    ck_assert_int_eq(td_file_write_atomic(path, good, strlen(good) / 2), 0);
    ck_assert_int_eq(td_tokenizer_load(dir, &tok), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), path));
    ck_assert_int_eq(td_file_write_atomic(path, good, strlen(good)), 0);
    char cpath[256];
    snprintf(cpath, sizeof(cpath), "%s/tokenizer_config.json", dir);
    ck_assert_int_eq(td_file_write_atomic(cpath, "{\"split_special_tokens\":1}", 26), 0);
    ck_assert_int_eq(td_tokenizer_load(path, &tok), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), cpath));
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "split_special_tokens"));
    unlink(cpath);
    ck_assert_int_eq(td_tokenizer_load(path, &tok), 0);
    td_tokenizer_free(tok);
    unlink(path);
    rmdir(dir);
    free(good);
}
END_TEST

/* ---------------------------------------------------------------- streaming decode */

static int32_t byte_token(const td_tokenizer_t *tok, unsigned b)
{
    char c[4];
    size_t n = byte_char(b, c);
    int32_t id = td_tokenizer_token_to_id(tok, c, n);
    ck_assert_int_ge(id, 0);
    return id;
}

START_TEST(test_incremental)
{
    td_tokenizer_t *tok;
    ck_assert_int_eq(td_tokenizer_load(model_dir("llama3"), &tok), 0);
    td_detok_t st;
    td_buf_t out;
    td_buf_init(&out);
    /* U+1F600 as four byte tokens: nothing until the last one */
    const unsigned char emoji[] = {0xF0, 0x9F, 0x98, 0x80};
    td_detok_init(&st, false);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, emoji[i]), &out), 0);
        ck_assert_uint_eq(out.len, i < 3 ? 0 : 4);
    }
    ck_assert_int_eq(memcmp(out.data, emoji, 4), 0);
    ck_assert_int_eq(td_detok_finish(tok, &st, &out), 0);
    ck_assert_uint_eq(out.len, 4);
    /* a sequence that can never complete: U+FFFD as soon as that is certain */
    td_buf_reset(&out);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xF0), &out), 0);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0x9F), &out), 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 'a'), &out), 0);
    ck_assert_str_eq(out.data, "\xEF\xBF\xBD"
                               "a");
    /* an incomplete tail at the end of the stream: one U+FFFD */
    td_buf_reset(&out);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xE4), &out), 0);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xBD), &out), 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert_int_eq(td_detok_finish(tok, &st, &out), 0);
    ck_assert_str_eq(out.data, "\xEF\xBF\xBD");
    /* unknown id: an error, state unchanged */
    td_buf_reset(&out);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xE4), &out), 0);
    ck_assert_int_eq(td_detok_step(tok, &st, 1 << 30, &out), TD_ERANGE);
    ck_assert_int_eq(td_detok_step(tok, &st, -1, &out), TD_ERANGE);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xBD), &out), 0);
    ck_assert_int_eq(td_detok_step(tok, &st, byte_token(tok, 0xA0), &out), 0);
    ck_assert_str_eq(out.data, "你");
    /* whole text, token by token: every piece valid UTF-8, the sum is the text */
    const char *text = "héllo wörld 😀👨‍👩‍👧 世界 <|eot_id|> done";
    td_tokens_t ids;
    td_tokens_init(&ids);
    ck_assert_int_eq(td_tokenizer_encode(tok, text, strlen(text), false, &ids), 0);
    td_buf_t acc;
    td_buf_init(&acc);
    td_detok_init(&st, false);
    for (size_t i = 0; i < ids.len; i++) {
        td_buf_reset(&out);
        ck_assert_int_eq(td_detok_step(tok, &st, ids.ids[i], &out), 0);
        ck_assert(valid_utf8(out.data, out.len));
        td_buf_append(&acc, out.data, out.len);
    }
    ck_assert_int_eq(td_detok_finish(tok, &st, &acc), 0);
    ck_assert_str_eq(acc.data, text);
    /* vocabulary lookups by name */
    ck_assert_int_eq(td_tokenizer_token_to_id(tok, "<|eot_id|>", 10), 128009);
    size_t len;
    ck_assert_str_eq(td_tokenizer_id_to_token(tok, 128009, &len), "<|eot_id|>");
    ck_assert(td_tokenizer_is_special(tok, 128009));
    td_tokens_free(&ids);
    td_buf_free(&acc);
    td_buf_free(&out);
    td_tokenizer_free(tok);
}
END_TEST

START_TEST(test_config_tokens)
{
    td_tokenizer_t *tok;
    ck_assert_int_eq(td_tokenizer_load(model_dir("deepseek_v3"), &tok), 0);
    const char *bos = "<｜begin▁of▁sentence｜>";
    ck_assert_int_eq(td_tokenizer_special_id(tok, "bos"),
                     td_tokenizer_token_to_id(tok, bos, strlen(bos)));
    ck_assert_int_eq(td_tokenizer_special_id(tok, "bos"), 0); /* added_tokens[0] in the file */
    ck_assert_int_eq(td_tokenizer_special_id(tok, "eos"), 1);
    /* add_bos_token: BOS first with add_special_tokens, not without */
    td_tokens_t t;
    td_tokens_init(&t);
    ck_assert_int_eq(td_tokenizer_encode(tok, "hi", 2, true, &t), 0);
    ck_assert_int_eq(t.ids[0], 0);
    size_t n = t.len;
    t.len = 0;
    ck_assert_int_eq(td_tokenizer_encode(tok, "hi", 2, false, &t), 0);
    ck_assert_uint_eq(t.len, n - 1);
    ck_assert_int_ne(t.ids[0], 0);
    td_tokens_free(&t);
    td_tokenizer_free(tok);
}
END_TEST

/* NFC is run only over the stretches that need it: random strings of characters that compose,
 * reorder, decompose or block must tokenize as their whole-string utf8proc NFC does. */
START_TEST(test_nfc_regions)
{
    static const uint32_t pool[] = {'e',   'a',    'A',     ' ',     0x301,  0x308,  0x327,
                                    0x323, 0x338,  0x1100,  0x1161,  0x11A8, 0xAC00, 0x438,
                                    0x306, 0x3099, 0x304B,  0x915,   0x93C,  0x958,  0x212B,
                                    0x344, 0x4E2D, 0xCC6,   0xCD5,   0xCC2,  0x1E0A, 0xF73,
                                    0xF71, 0xF72,  0x1D15E, 0x1D165, 0x5D0,  0x5B7,  0x1F600};
    td_tokenizer_t *tok;
    ck_assert_int_eq(td_tokenizer_load(model_dir("qwen3"), &tok), 0);
    uint64_t r = 12345;
    td_buf_t b;
    td_buf_init(&b);
    td_tokens_t x, y;
    td_tokens_init(&x);
    td_tokens_init(&y);
    for (int it = 0; it < 3000; it++) {
        td_buf_reset(&b);
        int n = 1 + (int)(it % 12);
        for (int k = 0; k < n; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            char u[4];
            td_buf_append(&b, u, td_utf8_encode(pool[(r >> 33) % TD_ARRAY_LEN(pool)], u));
        }
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl =
            utf8proc_map((const utf8proc_uint8_t *)b.data, (utf8proc_ssize_t)b.len, &nfc,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        ck_assert_int_ge(nl, 0);
        x.len = y.len = 0;
        ck_assert_int_eq(td_tokenizer_encode(tok, b.data, b.len, false, &x), 0);
        ck_assert_int_eq(td_tokenizer_encode(tok, (const char *)nfc, (size_t)nl, false, &y), 0);
        ck_assert_msg(x.len == y.len && memcmp(x.ids, y.ids, x.len * sizeof(int32_t)) == 0,
                      "NFC stretches differ from whole-string NFC for \"%s\"",
                      excerpt(b.data, b.len));
        free(nfc);
    }
    td_buf_free(&b);
    td_tokens_free(&x);
    td_tokens_free(&y);
    td_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- threads */

typedef struct thr {
    td_tokenizer_t *tok;
    const char *text;
    td_tokens_t out;
    int rc;
} thr_t;

static void *thr_main(void *arg)
{
    thr_t *t = arg;
    td_tokens_init(&t->out);
    for (int i = 0; i < 20 && !t->rc; i++) {
        t->out.len = 0;
        t->rc = td_tokenizer_encode(t->tok, t->text, strlen(t->text), true, &t->out);
    }
    return NULL;
}

START_TEST(test_threads)
{
    td_tokenizer_t *tok;
    ck_assert_int_eq(td_tokenizer_load(model_dir("qwen3"), &tok), 0);
    const char *text =
        "<|im_start|>user\nDécomposé e\xCC\x81 text, 中文, code: for (i = 0; i < 10; i++) {}"
        "<|im_end|>\n";
    td_tokens_t ref;
    td_tokens_init(&ref);
    ck_assert_int_eq(td_tokenizer_encode(tok, text, strlen(text), true, &ref), 0);
    thr_t th[4];
    pthread_t tid[4];
    for (int i = 0; i < 4; i++) {
        th[i] = (thr_t){.tok = tok, .text = text};
        ck_assert_int_eq(pthread_create(&tid[i], NULL, thr_main, &th[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        ck_assert_int_eq(th[i].rc, 0);
        ck_assert_uint_eq(th[i].out.len, ref.len);
        ck_assert_int_eq(memcmp(th[i].out.ids, ref.ids, ref.len * sizeof(int32_t)), 0);
        td_tokens_free(&th[i].out);
    }
    td_tokens_free(&ref);
    td_tokenizer_free(tok);
}
END_TEST

Suite *tokenizer_suite(void);
Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("agreement");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_hf_agreement);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_mini_bpe);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_incremental);
    tcase_add_test(tc, test_config_tokens);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_nfc_regions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(tokenizer_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

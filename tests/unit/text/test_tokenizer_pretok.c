/* test_tokenizer_pretok.c: the hand matchers of the pre-tokenizer's Split regexes
 * (common/text/tokenizer_pretok_fast.c) against PCRE2, which test_tokenizer checks against
 * Hugging Face `tokenizers`: every pattern they know, over the HF reference corpus, random runs of
 * tokens decoded from the real vocabularies, every code point 0..0x10FFFF in ASCII contexts, and
 * random strings of code points of every class; each text's splits must be the same. */
#include "td_check.h"
#include "tokenizer_models.h"
#include "pretok_every.h"

#include <check.h>
#include <stdint.h>
#include <unistd.h>

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static td_tokenizer_t *every;
static pretok_cmp_t cmp;
static size_t decided[PRETOK_EVERY_N], asked[PRETOK_EVERY_N];

/* Both paths on one text for every pattern; also counts the matches the hand matcher decided and
 * those it asked PCRE2 for. The number of patterns that differ. */
static int check_text(const char *p, size_t n)
{
    /* encode hands the pre-tokenizer valid UTF-8 only (U+FFFD for each bad byte): so here */
    static td_buf_t fixed;
    for (size_t i = 0; i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)p + i, n - i);
        if (l) {
            i += l;
            continue;
        }
        td_buf_reset(&fixed);
        for (size_t j = 0; j < n;) {
            size_t m = td_utf8_valid_len((const uint8_t *)p + j, n - j);
            if (m)
                td_buf_append(&fixed, p + j, m);
            else
                td_buf_append_str(&fixed, "\xEF\xBF\xBD");
            j += m ? m : 1;
        }
        p = fixed.data;
        n = fixed.len;
        break;
    }
    int bad = 0;
    for (int k = 0; k < PRETOK_EVERY_N; k++) {
        bad += !pretok_same(&cmp, every, k, p, n);
        const pcre2_code *re;
        td__fast_t fast;
        pretok_every_pat(every, k, &re, &fast);
        for (size_t off = 0; off <= n;) {
            size_t ms, me;
            int r = td__fast_next(fast, every->fast_cls, p, n, off, &ms, &me);
            if (r == 0) {
                decided[k]++;
                break;
            }
            if (r == 1) {
                decided[k]++;
                off = me;
                continue;
            }
            asked[k]++;
            if (pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, cmp.md, cmp.mctx) < 0)
                break;
            off = pcre2_get_ovector_pointer(cmp.md)[1];
        }
    }
    return bad;
}

static double t0;

static void report(const char *what, size_t strings, size_t bad)
{
    double t = td_now_s();
    fprintf(stderr, "pretok %-18s %7zu strings, %zu differ (%.1f s); hand/asked per pattern:", what,
            strings, bad, t - t0);
    t0 = t;
    for (int k = 0; k < PRETOK_EVERY_N; k++) {
        fprintf(stderr, " %zu/%zu", decided[k], asked[k]);
        decided[k] = asked[k] = 0;
    }
    fputc('\n', stderr);
}

static void setup(void)
{
    t0 = td_now_s();
    every = pretok_every_load();
    ck_assert_ptr_nonnull(every);
    pretok_cmp_init(&cmp);
}

static void teardown(void)
{
    td_tokenizer_free(every);
    pretok_cmp_free(&cmp);
}

/* The real files' patterns are recognised; a pattern one character away is not, and keeps PCRE2
 * alone (no class table either). */
START_TEST(test_recognised)
{
    static const struct {
        const char *name;
        td__fast_t want[3];
    } m[] = {{"deepseek_v3", {TD__FAST_DS_DIGITS, TD__FAST_DS_CJK, TD__FAST_DS_WORDS}},
             {"llama3", {TD__FAST_CL100K}},
             {"llama3_1", {TD__FAST_CL100K}},
             {"qwen3", {TD__FAST_QWEN}}};
    for (size_t i = 0; i < TD_ARRAY_LEN(m); i++) {
        td_tokenizer_t *tok;
        ck_assert_msg(td_tokenizer_load(model_dir(m[i].name), &tok) == 0, "%s", td_err_msg());
        ck_assert_uint_eq(tok->npretok, m[i].want[1] ? 3 : 1);
        for (size_t k = 0; k < tok->npretok; k++)
            ck_assert_msg(tok->pretok[k].fast == m[i].want[k], "%s step %zu: matcher %d", m[i].name,
                          k, (int)tok->pretok[k].fast);
        ck_assert_ptr_nonnull(tok->fast_cls);
        td_tokenizer_free(tok);
    }
    /* the model the integration tests and the router benchmark build */
    const char *b = getenv("TD_BUILD_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/integration/model-deepseek_v3/tokenizer.json",
             b ? b : "build");
    td_tokenizer_t *tok;
    if (access(path, R_OK) == 0) {
        ck_assert_msg(td_tokenizer_load(path, &tok) == 0, "%s", td_err_msg());
        ck_assert_uint_eq(tok->npretok, 3);
        ck_assert_int_eq(tok->pretok[2].fast, TD__FAST_DS_WORDS);
        td_tokenizer_free(tok);
    } else {
        fprintf(stderr, "pretok: %s not built; its patterns not checked\n", path);
    }
    const char *pat = td__fast_pattern(TD__FAST_CL100K);
    size_t len = strlen(pat);
    ck_assert_int_eq(td__fast_kind(pat, len), TD__FAST_CL100K);
    ck_assert_int_eq(td__fast_kind(pat, len - 1), TD__FAST_NONE);
    ck_assert_int_eq(td__fast_kind("\\p{N}{1,4}", 10), TD__FAST_NONE);
    const char *j = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"normalizer\":null,"
                    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,4}\"},"
                    "\"behavior\":\"Isolated\",\"invert\":false},"
                    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                    "\"added_tokens\":[],\"post_processor\":null,"
                    "\"decoder\":{\"type\":\"ByteLevel\"}}";
    ck_assert_msg(td_tokenizer_load_mem(j, strlen(j), NULL, 0, "other.json", &tok) == 0, "%s",
                  td_err_msg());
    ck_assert_int_eq(tok->pretok[0].fast, TD__FAST_NONE);
    ck_assert_ptr_null(tok->fast_cls);
    td_tokenizer_free(tok);
    /* the table is PCRE2's classes: a few that Oniguruma and PCRE2 users trip on */
    const td__fast_cls_t *T = every->fast_cls;
    ck_assert_int_eq(T->ascii['a'], 1);               /* L */
    ck_assert_int_eq(td__fast_cls_of(T, '7'), 2);     /* N */
    ck_assert_int_eq(td__fast_cls_of(T, 0x0301), 4);  /* M */
    ck_assert_int_eq(td__fast_cls_of(T, '!'), 8);     /* P */
    ck_assert_int_eq(td__fast_cls_of(T, '+'), 16);    /* S */
    ck_assert_int_eq(td__fast_cls_of(T, ' '), 32);    /* \s */
    ck_assert_int_eq(td__fast_cls_of(T, 0x3000), 32); /* ideographic space */
    ck_assert_int_eq(td__fast_cls_of(T, 0x180E), 0);  /* not \s after the loader's rewrite (Cf) */
    ck_assert_int_eq(td__fast_cls_of(T, 0x00B2), 2);  /* superscript two: No */
    ck_assert_int_eq(td__fast_cls_of(T, 0xD800), 0);  /* surrogates are not in the text */
}
END_TEST

/* Small cases with known splits, by hand, through the production path (hand matcher first). */
START_TEST(test_known_splits)
{
    static const struct {
        int k;
        const char *text;
        const char *want; /* matched pieces joined by '|' */
    } c[] = {
        {0, "ab12345c\xD9\xA3", "123|45|\xD9\xA3"},
        {1, "x\xE4\xB8\x80\xE4\xB8\x81y\xE3\x81\x82", "\xE4\xB8\x80\xE4\xB8\x81|\xE3\x81\x82"},
        {2, "Hello, world!\n\n  x", "Hello|,| world|!\n\n| | x"},
        {2, "a.b 'em  \t", "a|.b| '|em|  \t"},
        {3, "I'll DON'T 123456 x  \n y", "I|'ll| DON|'T| |123|456| x|  \n| y"},
        {3, "'\xC5\xBFx", "'\xC5\xBF|x"}, /* (?i)'s also matches U+017F LONG S: PCRE2 decides */
        {4, "abc 123", "abc| |1|2|3"},
        {5, "it's  ok ", "it|'s| | ok| "},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(c); i++) {
        const pcre2_code *re;
        td__fast_t fast;
        pretok_every_pat(every, c[i].k, &re, &fast);
        cmp.a.n = 0;
        size_t n = strlen(c[i].text);
        ck_assert_int_eq(
            td__regex_split(every, cmp.md, cmp.mctx, re, fast, c[i].text, n, false, &cmp.a), 0);
        td_buf_t got;
        td_buf_init(&got);
        for (size_t s = 0; s < cmp.a.n; s++)
            if (cmp.a.v[s].match) {
                if (got.len)
                    td_buf_append_char(&got, '|');
                td_buf_append(&got, c[i].text + cmp.a.v[s].start,
                              cmp.a.v[s].end - cmp.a.v[s].start);
            }
        ck_assert_msg(got.len == strlen(c[i].want) && !memcmp(got.data, c[i].want, got.len),
                      "pattern %d on \"%s\": \"%.*s\", want \"%s\"", c[i].k, c[i].text,
                      (int)got.len, got.data ? got.data : "", c[i].want);
        td_buf_free(&got);
        ck_assert(pretok_same(&cmp, every, c[i].k, c[i].text, n));
    }
}
END_TEST

/* The 600 strings of the HF reference corpus (tests/tokenizer/gen_corpus.py), whole and as lines.
 */
START_TEST(test_corpus)
{
    const char *path = getenv("TD_TOKENIZER_CORPUS");
    char *data;
    size_t len;
    ck_assert_msg(path && td_file_read_all(path, &data, &len) == 0, "corpus: %s",
                  path ? td_err_msg() : "TD_TOKENIZER_CORPUS not set");
    size_t strings = 0, bad = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(data + i, '\n', len - i);
        ck_assert_ptr_nonnull(nl);
        size_t l = strtoul(data + i, NULL, 10);
        const char *s = nl + 1;
        bad += check_text(s, l) != 0;
        strings++;
        for (size_t a = 0; a < l;) { /* each line alone: other ends of text */
            const char *e = memchr(s + a, '\n', l - a);
            size_t b = e ? (size_t)(e - s) : l;
            bad += check_text(s + a, b - a) != 0;
            strings++;
            a = b + 1;
        }
        i = (size_t)(s - data) + l + 1;
    }
    free(data);
    ck_assert_uint_ge(strings, 600);
    /* mostly decided by hand: the corpus's emoji and other scripts above U+FFFF are the asks */
    for (int k = 0; k < PRETOK_EVERY_N; k++)
        ck_assert_msg(decided[k] > 10 * asked[k], "pattern %d: %zu decided, %zu asked", k,
                      decided[k], asked[k]);
    report("HF corpus", strings, bad);
    ck_assert_uint_eq(bad, 0);
}
END_TEST

/* Random runs of 1 to 16 tokens of the real vocabularies, decoded (U+FFFD where a run cuts a
 * character), and 64 consecutive ids as the router benchmark's prompts are made. */
START_TEST(test_token_runs)
{
    const char *names[] = {"deepseek_v3", "llama3", "qwen3"};
    td_buf_t text;
    td_buf_init(&text);
    size_t strings = 0, bad = 0;
    for (size_t m = 0; m < TD_ARRAY_LEN(names); m++) {
        td_tokenizer_t *tok;
        ck_assert_msg(td_tokenizer_load(model_dir(names[m]), &tok) == 0, "%s", td_err_msg());
        size_t nv = td_tokenizer_vocab_size(tok);
        uint64_t x = 0x2545F4914F6CDD1Dull + m;
        for (size_t r = 0; r < 6000; r++) {
            int32_t seq[64];
            size_t n = r < 5000 ? 1 + rnd(&x) % 16 : 64, at = rnd(&x) % nv;
            for (size_t i = 0; i < n; i++)
                seq[i] = (int32_t)(r < 5000 ? rnd(&x) % nv : (at + i) % nv);
            td_buf_reset(&text);
            ck_assert_int_eq(td_tokenizer_decode(tok, seq, n, true, &text), 0);
            bad += check_text(text.data ? text.data : "", text.len) != 0;
            strings++;
        }
        td_tokenizer_free(tok);
    }
    td_buf_free(&text);
    report("token runs", strings, bad);
    ck_assert_uint_eq(bad, 0);
}
END_TEST

/* Every code point (no surrogates) in contexts of ASCII (and a mark, a CJK character): each
 * template with '%' for the code point, repeated over 2048 consecutive code points a string. */
START_TEST(test_every_code_point)
{
    static const char *bmp_t[] = {
        "%",     " %",    "% ", "a%b", "'%s ", "1%2",       "\n% ",      " %\r\n",        "!%x",
        "  %  ", "'%ll",  "%%", "% %", "%'",   "%\xCC\x81", "\xCC\x81%", "\xE4\xB8\x80%", "x%.",
        "% \n",  "\t%\t", "'%", "%'S", " %1",  "% 1",
    };
    static const char *supp_t[] = {"%", " %a", "'%1", "!%\r\n", "a% ", "%%"};
    char *buf = malloc(2048 * 64);
    size_t strings = 0, bad = 0;
    for (int plane = 0; plane < 2; plane++) {
        const char **t = plane ? supp_t : bmp_t;
        size_t nt = plane ? TD_ARRAY_LEN(supp_t) : TD_ARRAY_LEN(bmp_t);
        uint32_t lo = plane ? 0x10000 : 0, hi = plane ? 0x110000 : 0x10000;
        for (size_t ti = 0; ti < nt; ti++)
            for (uint32_t c0 = lo; c0 < hi; c0 += 2048) {
                size_t n = 0;
                for (uint32_t c = c0; c < c0 + 2048 && c < hi; c++) {
                    if (c >= 0xD800 && c <= 0xDFFF)
                        continue;
                    for (const char *q = t[ti]; *q; q++)
                        if (*q == '%')
                            n += td_utf8_encode(c, buf + n);
                        else
                            buf[n++] = *q;
                }
                bad += check_text(buf, n) != 0;
                strings++;
            }
    }
    /* and each code point alone, where the end of the text is right after it */
    for (uint32_t c = 0; c < 0x110000; c += c < 0x10000 ? 1 : 97) {
        if (c >= 0xD800 && c <= 0xDFFF)
            continue;
        size_t n = td_utf8_encode(c, buf);
        bad += check_text(buf, n) != 0;
        strings++;
    }
    free(buf);
    report("every code point", strings, bad);
    ck_assert_uint_eq(bad, 0);
}
END_TEST

/* Random strings of 1 to 12 code points drawn from every class the table holds (a few of each
 * class value) and the characters the patterns name. */
START_TEST(test_class_mix)
{
    uint32_t pool[600];
    size_t np = 0;
    const td__fast_cls_t *T = every->fast_cls;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int v = 0; v < 64; v++) { /* up to 6 code points of each class value */
        uint32_t seen[256];
        size_t ns = 0;
        for (uint32_t c = 0; c < 0x10000 && ns < 256; c++)
            if (td__fast_cls_of(T, c) == v && (c < 0xD800 || c > 0xDFFF))
                seen[ns++] = c;
        for (size_t i = 0; i < ns && i < 6; i++)
            pool[np++] = seen[i < 2 ? i : rnd(&x) % ns];
    }
    static const uint32_t named[] = {
        ' ',    '\r',   '\n',   '\t',   '\'',   's',    'S',     'l',      'L',     'e',    'E',
        'r',    'v',    'd',    'm',    't',    'a',    'Z',     '0',      '9',     '!',    '.',
        '/',    '_',    0x017F, 0x212A, 0x0130, 0x0131, 0x1F600, 0x10400,  0x1D7CE, 0x3000, 0x00A0,
        0x180E, 0x0085, 0x2028, 0x4E00, 0x9FA5, 0x9FA6, 0x303F,  0x3040,   0x30FF,  0x3100, 0x0301,
        0x200D, 0xFE0F, 0x0660, 0x00B2, 0x2160, 0xE000, 0xFFFD,  0x10FFFF,
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(named); i++)
        pool[np++] = named[i];
    char buf[64];
    size_t strings = 0, bad = 0;
    for (size_t r = 0; r < 150000; r++) {
        size_t len = 1 + rnd(&x) % 12, n = 0;
        for (size_t i = 0; i < len; i++) {
            /* half the time from the named characters, which the patterns decide on */
            uint32_t c = rnd(&x) & 1 ? named[rnd(&x) % TD_ARRAY_LEN(named)] : pool[rnd(&x) % np];
            n += td_utf8_encode(c, buf + n);
        }
        bad += check_text(buf, n) != 0;
        strings++;
    }
    report("class mix", strings, bad);
    ck_assert_uint_eq(bad, 0);
}
END_TEST

Suite *tokenizer_pretok_suite(void);
Suite *tokenizer_pretok_suite(void)
{
    Suite *s = suite_create("tokenizer_pretok");
    TCase *tc = tcase_create("pretok");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_recognised);
    tcase_add_test(tc, test_known_splits);
    tcase_add_test(tc, test_corpus);
    tcase_add_test(tc, test_token_runs);
    tcase_add_test(tc, test_every_code_point);
    tcase_add_test(tc, test_class_mix);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(tokenizer_pretok_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_tokenizer_match.c: the longest-match BPE encoder (common/text/tokenizer_bpe_match.c)
 * against BPE by merging, which test_tokenizer checks against Hugging Face `tokenizers`. */
#include "td_error.h"
#include "td_tokenizer.h"
#include "td_util.h"
#include "td_check.h"
#include "tokenizer_models.h"
#include "tokenizer_impl.h" /* td__bpe_match_free: BPE by merging alone, the reference */

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_encode(td_tokenizer_t *tok, const char *text, const int32_t *want, size_t n)
{
    td_tokens_t t;
    td_tokens_init(&t);
    ck_assert_int_eq(td_tokenizer_encode(tok, text, strlen(text), false, &t), 0);
    ck_assert_msg(t.len == n, "\"%s\": %zu ids, want %zu", text, t.len, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(t.ids[i] == want[i], "\"%s\" id %zu: %d, want %d", text, i, t.ids[i],
                      want[i]);
    td_tokens_free(&t);
}

/* The longest-match encoder (tokenizer_bpe_match.c) on a vocabulary where the longest token is
 * wrong: "b c" merges first, so "abc" is a + bc although "ab" is a token; its check of the pair
 * (ab, c) must find that (b, c) merges before "ab" was made. */
#define MATCH_MODEL                                                                                \
    "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"bc\":3,\"ab\":4},"                 \
    "\"merges\":[\"b c\",\"a b\"]}"

START_TEST(test_match_mini)
{
    const char *j = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"normalizer\":null,"
                    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                    "\"use_regex\":true},\"model\":" MATCH_MODEL ",\"added_tokens\":[],"
                    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"}}";
    td_tokenizer_t *tok;
    ck_assert_msg(td_tokenizer_load_mem(j, strlen(j), NULL, 0, "match.json", &tok) == 0, "%s",
                  td_err_msg());
    ck_assert_ptr_nonnull(tok->match); /* ids in merge order: the encoder is on */
    check_encode(tok, "abc", (int32_t[]){0, 3}, 2);
    check_encode(tok, "abab", (int32_t[]){4, 4}, 2);
    check_encode(tok, "cab", (int32_t[]){2, 4}, 2);
    check_encode(tok, "abcab", (int32_t[]){0, 3, 4}, 3);
    check_encode(tok, "bcabc", (int32_t[]){3, 0, 3}, 3);
    td_tokenizer_free(tok);
}
END_TEST

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Encode `text` with both tokenizers; false (and a message, the first few times) when they
 * differ. */
static bool same_encoding(td_tokenizer_t *a, td_tokenizer_t *b, const char *name, const char *text,
                          size_t n, size_t *shown)
{
    td_tokens_t ta, tb;
    td_tokens_init(&ta);
    td_tokens_init(&tb);
    ck_assert_int_eq(td_tokenizer_encode(a, text, n, false, &ta), 0);
    ck_assert_int_eq(td_tokenizer_encode(b, text, n, false, &tb), 0);
    bool ok = ta.len == tb.len && !memcmp(ta.ids, tb.ids, ta.len * sizeof(int32_t));
    if (!ok && (*shown)++ < 5)
        fprintf(stderr, "MISMATCH %s longest match vs merging on \"%.*s\": %zu vs %zu ids\n",
                name, (int)TD_MIN(n, 80), text, ta.len, tb.len);
    td_tokens_free(&ta);
    td_tokens_free(&tb);
    return ok;
}

/* The longest-match encoder against BPE by merging (the same tokenizer, loaded again without the
 * encoder) on the real tokenizers whose ids follow their merges (Llama 3's has several merges per
 * token and is merged: checked below that the encoder is off there): every vocabulary token's
 * text alone, random pairs and runs of tokens (words BPE splits otherwise than the longest match
 * does), and runs of consecutive ids as a benchmark's random prompts are made. */
START_TEST(test_match_vs_merge)
{
    td_tokenizer_t *l3;
    ck_assert_msg(td_tokenizer_load(model_dir("llama3"), &l3) == 0, "%s", td_err_msg());
    ck_assert_ptr_null(l3->match);
    td_tokenizer_free(l3);
    const char *names[] = {"deepseek_v3", "qwen3"};
    td_buf_t text;
    td_buf_init(&text);
    for (size_t m = 0; m < TD_ARRAY_LEN(names); m++) {
        td_tokenizer_t *a, *b;
        ck_assert_msg(td_tokenizer_load(model_dir(names[m]), &a) == 0, "%s", td_err_msg());
        ck_assert_msg(td_tokenizer_load(model_dir(names[m]), &b) == 0, "%s", td_err_msg());
        ck_assert_msg(a->match != NULL, "%s: the longest-match encoder is off", names[m]);
        td__bpe_match_free(b);
        size_t nv = td_tokenizer_vocab_size(a), nids = 0, bad = 0, shown = 0, strings = 0;
        int32_t *ids = malloc(nv * sizeof(int32_t));
        for (size_t i = 0; i < nv; i++) {
            size_t len;
            if (!td_tokenizer_is_special(a, (int32_t)i) &&
                td_tokenizer_id_to_token(a, (int32_t)i, &len))
                ids[nids++] = (int32_t)i;
        }
        uint64_t x = 0x9E3779B97F4A7C15ull + m;
        for (size_t k = 0; k < nids + 6000; k++) {
            int32_t seq[64];
            size_t n;
            if (k < nids) { /* each token alone */
                seq[0] = ids[k];
                n = 1;
            } else if (k < nids + 4000) { /* 2 to 8 random tokens */
                n = 2 + rnd(&x) % 7;
                for (size_t i = 0; i < n; i++)
                    seq[i] = ids[rnd(&x) % nids];
            } else { /* 64 consecutive ids */
                size_t at = rnd(&x) % nids;
                n = 64;
                for (size_t i = 0; i < n; i++)
                    seq[i] = ids[(at + i) % nids];
            }
            td_buf_reset(&text);
            ck_assert_int_eq(td_tokenizer_decode(a, seq, n, false, &text), 0);
            bad += !same_encoding(a, b, names[m], text.data ? text.data : "", text.len, &shown);
            strings++;
        }
        fprintf(stderr, "tokenizer %-12s longest match vs merging: %zu strings, %zu differ\n",
                names[m], strings, bad);
        ck_assert_msg(bad == 0, "%s: %zu strings encode otherwise than by merging", names[m], bad);
        free(ids);
        td_tokenizer_free(a);
        td_tokenizer_free(b);
    }
    td_buf_free(&text);
}
END_TEST

Suite *tokenizer_match_suite(void);
Suite *tokenizer_match_suite(void)
{
    Suite *s = suite_create("tokenizer_match");
    TCase *tc = tcase_create("match");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_match_mini);
    tcase_add_test(tc, test_match_vs_merge);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(tokenizer_match_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

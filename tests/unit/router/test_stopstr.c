/* test_stopstr.c: stop-string search and hold-back over a growing text (router/stopstr.c),
 * including a randomised check that streaming by any chunking releases exactly the prefix a
 * whole-text search keeps, and never a byte that is later cut. */
#include "stopstr.h"
#include "td_check.h"

#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static size_t max_len(const char *const *stop, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strlen(stop[i]) > m)
            m = strlen(stop[i]);
    return m;
}

START_TEST(test_find)
{
    const char *stop[] = {"world", "lo w", ""};
    const char *t = "hello world";
    size_t pos = 99;
    /* earliest occurrence wins, whatever the order of the list */
    ck_assert_int_eq(td_stop_find(stop, 3, max_len(stop, 3), t, strlen(t), 0, &pos), 1);
    ck_assert_uint_eq(pos, 3);
    const char *one[] = {"world"};
    ck_assert_int_eq(td_stop_find(one, 1, 5, t, strlen(t), 0, &pos), 0);
    ck_assert_uint_eq(pos, 6);
    /* two starting at the same byte: the first listed */
    const char *same[] = {"wor", "world"};
    ck_assert_int_eq(td_stop_find(same, 2, 5, t, strlen(t), 0, &pos), 0);
    ck_assert_uint_eq(pos, 6);
    /* nothing, and no stop strings at all */
    const char *none[] = {"xyz"};
    ck_assert_int_eq(td_stop_find(none, 1, 3, t, strlen(t), 0, &pos), -1);
    ck_assert_int_eq(td_stop_find(NULL, 0, 0, t, strlen(t), 0, &pos), -1);
    /* an empty stop string never matches */
    const char *empty[] = {""};
    ck_assert_int_eq(td_stop_find(empty, 1, 0, t, strlen(t), 0, &pos), -1);
}
END_TEST

START_TEST(test_find_scanned)
{
    const char *stop[] = {"STOP"};
    const char *t = "abcSTOPdef";
    size_t pos;
    /* an occurrence ending in the new bytes is found even though it started in the old ones */
    ck_assert_int_eq(td_stop_find(stop, 1, 4, t, 7, 5, &pos), 0);
    ck_assert_uint_eq(pos, 3);
    /* the search does not look further back than a stop string's length */
    ck_assert_int_eq(td_stop_find(stop, 1, 4, t, 10, 7, &pos), -1);
    ck_assert_int_eq(td_stop_find(stop, 1, 4, t, 10, 10, &pos), -1);
    /* text shorter than the stop string */
    ck_assert_int_eq(td_stop_find(stop, 1, 4, "ST", 2, 0, &pos), -1);
}
END_TEST

START_TEST(test_holdback)
{
    const char *a[] = {"cde"};
    ck_assert_uint_eq(td_stop_holdback(a, 1, "abc", 3), 1);
    ck_assert_uint_eq(td_stop_holdback(a, 1, "abcd", 4), 2);
    ck_assert_uint_eq(td_stop_holdback(a, 1, "abx", 3), 0);
    /* the longest possible start over every stop string */
    const char *b[] = {"bcx", "c", "abcz"};
    ck_assert_uint_eq(td_stop_holdback(b, 3, "abc", 3), 3);
    const char *c[] = {"bcx", "c"};
    ck_assert_uint_eq(td_stop_holdback(c, 2, "abc", 3), 2);
    /* a one-byte stop string is found or not: nothing to hold */
    const char *d[] = {"c"};
    ck_assert_uint_eq(td_stop_holdback(d, 1, "abc", 3), 0);
    /* a whole stop string at the end is found by td_stop_find, not held: only proper prefixes */
    const char *e[] = {"bc"};
    ck_assert_uint_eq(td_stop_holdback(e, 1, "abc", 3), 0);
    ck_assert_uint_eq(td_stop_holdback(e, 1, "", 0), 0);
    ck_assert_uint_eq(td_stop_holdback(NULL, 0, "abc", 3), 0);
    /* bytes of a multi-byte character */
    const char *f[] = {"w\xc3\xb6rld"};
    ck_assert_uint_eq(td_stop_holdback(f, 1, "hello w\xc3\xb6", 9), 3);
}
END_TEST

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* Stream `text` in random chunks the way the router does and check what reaches the client. */
START_TEST(test_streaming_random)
{
    static const char *const pool[] = {"END",  "e E",  "\xc3\xb6\xc3\xb6", "zz", "aba",
                                       "\n\n", "abab", "w\xc3\xb6"};
    const char alphabet[][3] = {"a", "b", "e", "E", "N", "D", " ", "z", "\n", "w", "\xc3\xb6"};
    for (int iter = 0; iter < 3000; iter++) {
        char text[256];
        size_t len = 0;
        size_t want = 20 + next() % 60;
        while (len < want) {
            const char *sym = alphabet[next() % (sizeof(alphabet) / sizeof(alphabet[0]))];
            memcpy(text + len, sym, strlen(sym));
            len += strlen(sym);
        }
        const char *stop[3];
        size_t n = 1 + next() % 3;
        for (size_t i = 0; i < n; i++)
            stop[i] = pool[next() % (sizeof(pool) / sizeof(pool[0]))];
        size_t ml = max_len(stop, n);
        /* reference: cut at the earliest occurrence of any stop string in the whole text */
        size_t ref = len;
        for (size_t i = 0; i < n; i++) {
            const char *h = memmem(text, len, stop[i], strlen(stop[i]));
            if (h && (size_t)(h - text) < ref)
                ref = (size_t)(h - text);
        }
        /* stream: grow by 1..6 bytes, search, release all but the hold-back */
        size_t have = 0, scanned = 0, sent = 0, cut = len;
        bool stopped = false;
        while (have < len && !stopped) {
            have += 1 + next() % 6;
            if (have > len)
                have = len;
            size_t pos;
            int k = td_stop_find(stop, n, ml, text, have, scanned, &pos);
            scanned = have;
            if (k >= 0) {
                ck_assert_msg(pos >= sent, "released bytes that a stop string covers");
                cut = pos;
                stopped = true;
                break;
            }
            size_t safe = have - td_stop_holdback(stop, n, text, have);
            ck_assert_msg(safe >= sent, "hold-back shrank below what was released");
            sent = safe;
            ck_assert_msg(sent <= ref, "released byte %zu past the cut at %zu", sent, ref);
        }
        if (!stopped)
            ck_assert_uint_eq(ref, len);
        ck_assert_uint_eq(cut, ref);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stopstr");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_find);
    tcase_add_test(tc, test_find_scanned);
    tcase_add_test(tc, test_holdback);
    tcase_add_test(tc, test_streaming_random);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

/* test_auth.c: the API key file (router/auth.c): its grammar, errors that name the file and line
 * for every malformed line, lookup of hashed keys, reload keeping buckets, admission over the
 * requests, tokens and concurrency limits; and the token bucket (router/ratelimit.c). */
#include "auth.h"
#include "ratelimit.h"
#include "td_check.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "sha256:<hex of SHA-256(key)>" */
static void hash_of(const char *key, char out[72])
{
    uint8_t h[32];
    ck_assert_int_eq(td_sha256(key, strlen(key), h), 0);
    memcpy(out, "sha256:", 7);
    td_hex_encode(h, 32, out + 7);
}

START_TEST(test_bucket)
{
    td_bucket_t b;
    td_bucket_init(&b, 10, 60, 100.0); /* 10 per minute */
    ck_assert(td_bucket_take(&b, 10, 100.0));
    ck_assert(!td_bucket_take(&b, 1, 100.0));
    /* refills at 10/60 per second: one unit after 6 s */
    ck_assert_double_eq_tol(td_bucket_wait_s(&b, 1, 100.0), 6.0, 1e-9);
    ck_assert_double_eq_tol(td_bucket_reset_s(&b, 100.0), 60.0, 1e-9);
    ck_assert(!td_bucket_take(&b, 1, 105.9));
    ck_assert(td_bucket_take(&b, 1, 106.0));
    /* never above its capacity, however long it waits */
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 10, 1e-9);
    ck_assert_double_eq_tol(td_bucket_reset_s(&b, 10000.0), 0, 1e-9);
    /* more than the capacity can never pass */
    ck_assert(td_bucket_wait_s(&b, 11, 10000.0) < 0);
    /* a correction: give back what a reservation did not use, or take more (below zero) */
    ck_assert(td_bucket_take(&b, 8, 10000.0));
    td_bucket_give(&b, 3, 10000.0);
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 5, 1e-9);
    td_bucket_give(&b, -9, 10000.0);
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 0, 1e-9);
    ck_assert_double_eq_tol(td_bucket_wait_s(&b, 1, 10000.0), 30.0, 1e-9); /* from -4 to 1 */
    td_bucket_give(&b, 100, 10000.0);
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 10, 1e-9);
    /* a new limit keeps what was used */
    ck_assert(td_bucket_take(&b, 4, 10000.0));
    td_bucket_set_limit(&b, 20, 60, 10000.0);
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 16, 1e-9);
    td_bucket_set_limit(&b, 2, 60, 10000.0);
    ck_assert_double_eq_tol(td_bucket_available(&b, 10000.0), 0, 1e-9);
    /* a clock that goes back adds nothing */
    td_bucket_init(&b, 5, 1, 50.0);
    ck_assert(td_bucket_take(&b, 5, 50.0));
    ck_assert_double_eq_tol(td_bucket_available(&b, 40.0), 0, 1e-9);
}
END_TEST

START_TEST(test_parse_and_find)
{
    char ha[72], hb[72];
    hash_of("tdk-alpha", ha);
    hash_of("tdk-beta", hb);
    char text[1024];
    snprintf(text, sizeof(text),
             "# keys\n"
             "\n"
             "   %s tenant=acme rpm=60 tpm=1000 name=alice\n"
             "%s\ttenant=other\r\n"
             "tenant acme max_concurrent=2\n"
             "  # indented comment\n",
             ha, hb);
    td_keyset_t ks;
    ck_assert_int_eq(td_keyset_parse(text, strlen(text), "keys.txt", 60, 0, &ks), 0);
    ck_assert_uint_eq(ks.n_keys, 2);
    ck_assert_uint_eq(ks.n_tenants, 1);
    ck_assert_str_eq(ks.keys[0].tenant, "acme");
    ck_assert_str_eq(ks.keys[0].name, "alice");
    ck_assert_uint_eq(ks.keys[0].rpm, 60);
    ck_assert_uint_eq(ks.keys[0].tpm, 1000);
    ck_assert_uint_eq(ks.keys[0].line, 3);
    ck_assert_uint_eq(ks.keys[1].rpm, 0);
    ck_assert_ptr_null(ks.keys[1].name);
    ck_assert_str_eq(ks.tenants[0].name, "acme");
    ck_assert_uint_eq(ks.tenants[0].max_concurrent, 2);
    /* lookup by the key's text, never by its hash; one byte off matches nothing */
    ck_assert_ptr_eq(td_keyset_find(&ks, "tdk-alpha", 9), &ks.keys[0]);
    ck_assert_ptr_eq(td_keyset_find(&ks, "tdk-beta", 8), &ks.keys[1]);
    ck_assert_ptr_null(td_keyset_find(&ks, "tdk-alphA", 9));
    ck_assert_ptr_null(td_keyset_find(&ks, "tdk-alpha", 8));
    ck_assert_ptr_null(td_keyset_find(&ks, "", 0));
    ck_assert_ptr_null(td_keyset_find(&ks, ha, strlen(ha)));
    td_keyset_free(&ks);
    /* an empty file: no keys (every request is refused) */
    ck_assert_int_eq(td_keyset_parse("", 0, "empty", 60, 0, &ks), 0);
    ck_assert_uint_eq(ks.n_keys, 0);
    ck_assert_ptr_null(td_keyset_find(&ks, "x", 1));
    td_keyset_free(&ks);
}
END_TEST

/* Each malformed line gives TD_EINVAL naming "f.keys:LINE:" and the problem. */
START_TEST(test_malformed)
{
    char h[72], h2[72];
    hash_of("k1", h);
    hash_of("k2", h2);
    struct {
        const char *fmt; /* %s: a valid hash */
        unsigned line;
        const char *says;
    } cases[] = {
        {"tdk-plaintext-key tenant=a\n", 1, "stored hashed"},
        {"# c\nsha256:abcd tenant=a\n", 2, "64 hex digits"},
        {"sha256:zz%s tenant=a\n", 1, "64 hex digits"},
        {"%s\n", 1, "no tenant"},
        {"%s tenant=\n", 1, "tenant"},
        {"%s tenant=a b\n", 1, "name=value"},
        {"%s tenant=a tenant=b\n", 1, "twice"},
        {"%s tenant=a rpm=ten\n", 1, "rpm"},
        {"%s tenant=a tpm=-1\n", 1, "tpm"},
        {"%s tenant=a rpm=1000000000001\n", 1, "rpm"},
        {"%s tenant=a colour=red\n", 1, "unknown field \"colour\""},
        {"%s tenant=a/b\n", 1, "tenant"},
        {"\n\n%s tenant=a\n%s tenant=b\n", 4, "already on line 3"},
        {"tenant\n", 1, "needs a name"},
        {"tenant a\n", 1, "max_concurrent"},
        {"tenant a max_concurrent=x\n", 1, "max_concurrent"},
        {"tenant a max_concurrent=5000000000\n", 1, "too large"},
        {"tenant a limit=3\n", 1, "unknown field"},
        {"tenant a max_concurrent=1\ntenant a max_concurrent=2\n", 2, "already on line 1"},
        {"%s tenant=a a b c d e f g h i j k l m n o p q\n", 1, "too many fields"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        char text[512], want[64];
        snprintf(text, sizeof(text), cases[i].fmt, h, h);
        snprintf(want, sizeof(want), "f.keys:%u: ", cases[i].line);
        td_keyset_t ks;
        int rc = td_keyset_parse(text, strlen(text), "f.keys", 60, 0, &ks);
        ck_assert_msg(rc == TD_EINVAL, "case %zu: rc %d", i, rc);
        ck_assert_msg(td_str_startswith(td_err_msg(), want) &&
                          strstr(td_err_msg(), cases[i].says),
                      "case %zu: %s (want %s... %s)", i, td_err_msg(), want, cases[i].says);
        ck_assert_uint_eq(ks.n_keys, 0);
    }
    /* a NUL byte */
    td_keyset_t ks;
    char nul[] = "# a\n\0b";
    ck_assert_int_eq(td_keyset_parse(nul, sizeof(nul) - 1, "n.keys", 60, 0, &ks), TD_EINVAL);
    ck_assert_msg(strstr(td_err_msg(), "n.keys:2: ") != NULL, "%s", td_err_msg());
    (void)h2;
}
END_TEST

static char *write_tmp(const char *text)
{
    char *path = td_strdup("/tmp/test_auth.XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void rewrite(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_admit_and_reload)
{
    char ha[72], hb[72], text[512];
    hash_of("key-a", ha);
    hash_of("key-b", hb);
    snprintf(text, sizeof(text), "%s tenant=t1 rpm=2 tpm=100\ntenant t1 max_concurrent=3\n", ha);
    char *path = write_tmp(text);
    td_access_t a;
    ck_assert_int_eq(td_access_open(&a, path, 60), 0);
    double now = td_now_s();
    td_apikey_t *k = td_keyset_find(&a.keys, "key-a", 5);
    ck_assert_ptr_nonnull(k);
    td_admit_t ad, ad2, ad3;
    /* 2 requests per minute: two pass (headers count down), the third waits ~30 s */
    ck_assert_int_eq(td_access_admit(&a, k, 40, now, &ad), TD_ADMIT_OK);
    ck_assert_uint_eq(ad.lim_req, 2);
    ck_assert_uint_eq(ad.rem_req, 1);
    ck_assert_uint_eq(ad.lim_tok, 100);
    ck_assert_uint_eq(ad.rem_tok, 60);
    ck_assert_ptr_nonnull(ad.use);
    ck_assert_uint_eq(ad.use->active, 1);
    /* tokens: 70 more do not fit in the 60 left */
    ck_assert_int_eq(td_access_admit(&a, k, 70, now, &ad2), TD_ADMIT_TOKENS);
    ck_assert(ad2.retry_after_s > 0 && ad2.retry_after_s <= 6.1);
    ck_assert_uint_eq(ad.use->active, 1); /* a refusal charges nothing */
    /* more than the whole limit: refused as too large */
    ck_assert_int_eq(td_access_admit(&a, k, 101, now, &ad2), TD_ADMIT_TOO_LARGE);
    /* the first request used 10 of its 40: 30 go back */
    td_access_settle(&a, k->hash, 40, 10, now);
    ck_assert_uint_eq((uint64_t)td_bucket_available(&k->tok, now), 90);
    ck_assert_int_eq(td_access_admit(&a, k, 10, now, &ad2), TD_ADMIT_OK);
    ck_assert_int_eq(td_access_admit(&a, k, 10, now, &ad3), TD_ADMIT_REQUESTS);
    ck_assert_double_eq_tol(ad3.retry_after_s, 30, 1e-6);
    ck_assert_uint_eq(ad3.rem_req, 0);
    ck_assert_uint_eq(ad.use->active, 2);
    td_access_release(ad.use);
    td_access_release(ad2.use);
    ck_assert_uint_eq(ad.use->active, 0);
    /* reload: key-b added with a concurrency cap of 1 on its tenant; key-a keeps its buckets */
    snprintf(text, sizeof(text), "%s tenant=t1 rpm=2 tpm=100\n%s tenant=t2\ntenant t2 "
                                 "max_concurrent=1\n", ha, hb);
    rewrite(path, text);
    ck_assert_int_eq(td_access_reload(&a), 0);
    k = td_keyset_find(&a.keys, "key-a", 5);
    ck_assert_int_eq(td_access_admit(&a, k, 1, now, &ad3), TD_ADMIT_REQUESTS);
    td_apikey_t *kb = td_keyset_find(&a.keys, "key-b", 5);
    ck_assert_ptr_nonnull(kb);
    ck_assert_int_eq(td_access_admit(&a, kb, 1000000, now, &ad), TD_ADMIT_OK); /* no limits */
    ck_assert_uint_eq(ad.lim_req, 0);
    ck_assert_int_eq(td_access_admit(&a, kb, 1, now, &ad2), TD_ADMIT_CONCURRENCY);
    ck_assert(ad2.retry_after_s > 0);
    td_access_release(ad.use);
    ck_assert_int_eq(td_access_admit(&a, kb, 1, now, &ad2), TD_ADMIT_OK);
    td_access_release(ad2.use);
    /* a bad file on reload: the error names the file and line, the old keys stay */
    snprintf(text, sizeof(text), "%s tenant=t2\nbogus line\n", hb);
    rewrite(path, text);
    ck_assert_int_eq(td_access_reload(&a), TD_EINVAL);
    char want[256];
    snprintf(want, sizeof(want), "%s:2: ", path);
    ck_assert_msg(td_str_startswith(td_err_msg(), want), "%s", td_err_msg());
    ck_assert_uint_eq(a.keys.n_keys, 2);
    ck_assert_ptr_nonnull(td_keyset_find(&a.keys, "key-a", 5));
    /* a missing file on reload: likewise */
    unlink(path);
    ck_assert_int_ne(td_access_reload(&a), 0);
    ck_assert_msg(strstr(td_err_msg(), path) != NULL, "%s", td_err_msg());
    ck_assert_uint_eq(a.keys.n_keys, 2);
    /* removing a key: it no longer matches; a settle for it is a no-op */
    rewrite(path, text); /* still bad */
    snprintf(text, sizeof(text), "%s tenant=t2\n", hb);
    rewrite(path, text);
    uint8_t old[32];
    memcpy(old, k->hash, 32);
    ck_assert_int_eq(td_access_reload(&a), 0);
    ck_assert_ptr_null(td_keyset_find(&a.keys, "key-a", 5));
    td_access_settle(&a, old, 10, 0, now);
    td_access_close(&a);
    /* opening a bad file fails with the file and line */
    rewrite(path, "\n\nsha256:00 tenant=x\n");
    ck_assert_int_eq(td_access_open(&a, path, 60), TD_EINVAL);
    snprintf(want, sizeof(want), "%s:3: ", path);
    ck_assert_msg(td_str_startswith(td_err_msg(), want), "%s", td_err_msg());
    unlink(path);
    free(path);
}
END_TEST

START_TEST(test_constant_time_compare)
{
    /* td_auth_equal (CRYPTO_memcmp) is what td_keyset_find compares hashes with: equal only when
     * every byte is, wherever the first difference lies */
    uint8_t a[32], b[32];
    memset(a, 0x5a, 32);
    memcpy(b, a, 32);
    ck_assert(td_auth_equal(a, b, 32));
    for (int i = 0; i < 32; i++) {
        b[i] ^= 1;
        ck_assert(!td_auth_equal(a, b, 32));
        b[i] ^= 1;
    }
    /* keys whose hashes share a long prefix with a stored one do not match it: find compares
     * whole hashes, and every entry (the last entry is found as well as the first) */
    char text[8192] = "";
    size_t off = 0;
    for (int i = 0; i < 40; i++) {
        char key[32], h[72];
        snprintf(key, sizeof(key), "key-%d", i);
        hash_of(key, h);
        off += (size_t)snprintf(text + off, sizeof(text) - off, "%s tenant=t%d\n", h, i);
    }
    td_keyset_t ks;
    ck_assert_int_eq(td_keyset_parse(text, off, "many", 60, 0, &ks), 0);
    for (int i = 0; i < 40; i++) {
        char key[32], t[16];
        snprintf(key, sizeof(key), "key-%d", i);
        snprintf(t, sizeof(t), "t%d", i);
        td_apikey_t *k = td_keyset_find(&ks, key, strlen(key));
        ck_assert_ptr_nonnull(k);
        ck_assert_str_eq(k->tenant, t);
    }
    ck_assert_ptr_null(td_keyset_find(&ks, "key-40", 6));
    td_keyset_free(&ks);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_bucket);
    tcase_add_test(tc, test_parse_and_find);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_admit_and_reload);
    tcase_add_test(tc, test_constant_time_compare);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}

/* test_kvhash.c: chained block hashes, checked against the xxhsum tool (an independent XXH128
 * implementation's command line) over the same bytes, and the chaining properties. */
#include "td_kvhash.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* XXH128 of `data` as printed by `xxhsum -H2`. */
static void xxhsum(const uint8_t *data, size_t n, char out[33])
{
    char path[] = "/tmp/td_kvhash_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "xxhsum -H2 %s", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%32s", out), 1);
    pclose(p);
    unlink(path);
}

START_TEST(test_matches_xxhsum)
{
    int32_t tokens[40];
    for (int i = 0; i < 40; i++)
        tokens[i] = i * 7919 - 3; /* includes a negative id: serialised as two's complement */
    uint8_t fp[16];
    for (int i = 0; i < 16; i++)
        fp[i] = (uint8_t)(0xA0 + i);
    const char salt[] = "tenant-42";
    td_kvhash_t h[3];
    ck_assert_uint_eq(td_kvhash_blocks(tokens, 40, 16, fp, salt, strlen(salt), NULL, h, 3), 2);
    /* rebuild the exact bytes of block 0 and 1 and hash them with xxhsum */
    td_kvhash_t prev = {{0}};
    for (int blk = 0; blk < 2; blk++) {
        uint8_t buf[16 + 16 + 9 + 64];
        size_t n = 0;
        memcpy(buf + n, prev.b, 16), n += 16;
        memcpy(buf + n, fp, 16), n += 16;
        memcpy(buf + n, salt, 9), n += 9;
        for (int k = 0; k < 16; k++) {
            uint32_t v = (uint32_t)tokens[blk * 16 + k];
            for (int j = 0; j < 4; j++)
                buf[n++] = (uint8_t)(v >> (8 * j));
        }
        char want[33], got[33];
        xxhsum(buf, n, want);
        td_kvhash_hex(&h[blk], got);
        ck_assert_str_eq(got, want);
        prev = h[blk];
    }
}
END_TEST

START_TEST(test_chain_properties)
{
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = i;
    b[40] = 999; /* differs in block 2 (of 16-token blocks) */
    uint8_t fp[16] = {1};
    td_kvhash_t ha[4], hb[4], hc[4];
    ck_assert_uint_eq(td_kvhash_blocks(a, 64, 16, fp, NULL, 0, NULL, ha, 4), 4);
    ck_assert_uint_eq(td_kvhash_blocks(b, 64, 16, fp, NULL, 0, NULL, hb, 4), 4);
    ck_assert_int_eq(memcmp(&ha[1], &hb[1], 16), 0);  /* shared prefix, same hashes */
    ck_assert_int_ne(memcmp(&ha[2], &hb[2], 16), 0);  /* first differing block */
    ck_assert_int_ne(memcmp(&ha[3], &hb[3], 16), 0);  /* and everything after it */
    /* continuing a chain from a stored hash equals hashing the whole prompt */
    ck_assert_uint_eq(td_kvhash_blocks(a + 32, 32, 16, fp, NULL, 0, &ha[1], hc, 4), 2);
    ck_assert_int_eq(memcmp(&hc[0], &ha[2], 16), 0);
    ck_assert_int_eq(memcmp(&hc[1], &ha[3], 16), 0);
    /* another tenant or layout never shares a hash */
    ck_assert_uint_eq(td_kvhash_blocks(a, 16, 16, fp, "t2", 2, NULL, hc, 1), 1);
    ck_assert_int_ne(memcmp(&hc[0], &ha[0], 16), 0);
    uint8_t fp2[16] = {2};
    ck_assert_uint_eq(td_kvhash_blocks(a, 16, 16, fp2, NULL, 0, NULL, hc, 1), 1);
    ck_assert_int_ne(memcmp(&hc[0], &ha[0], 16), 0);
    /* partial blocks are not hashed; max_out bounds what is written */
    ck_assert_uint_eq(td_kvhash_blocks(a, 15, 16, fp, NULL, 0, NULL, hc, 4), 0);
    ck_assert_uint_eq(td_kvhash_blocks(a, 64, 16, fp, NULL, 0, NULL, hc, 1), 4);
    /* block sizes above the serialisation chunk (256 tokens) hash the same bytes */
    int32_t big[600];
    for (int i = 0; i < 600; i++)
        big[i] = i;
    td_kvhash_t x[1], y[2];
    ck_assert_uint_eq(td_kvhash_blocks(big, 600, 600, fp, NULL, 0, NULL, x, 1), 1);
    ck_assert_uint_eq(td_kvhash_blocks(big, 600, 300, fp, NULL, 0, NULL, y, 2), 2);
    ck_assert_int_ne(memcmp(&x[0], &y[1], 16), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvhash");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_matches_xxhsum);
    tcase_add_test(tc, test_chain_properties);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

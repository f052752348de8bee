/* test_kvhash.c: hash version 1. Every case of tests/data/kvhash-v1.txt (computed with the
 * xxhsum tool, independent of kvhash.c); the root and block encodings rebuilt here and hashed by
 * xxhsum; the chaining, tenant and fingerprint properties. */
#include "td_error.h"
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

static void put_le(uint8_t *p, uint32_t v)
{
    for (int j = 0; j < 4; j++)
        p[j] = (uint8_t)(v >> (8 * j));
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* One record of the vector file. */
typedef struct vcase {
    char name[64];
    uint8_t fp[16];
    uint8_t salt[256];
    size_t salt_len;
    size_t block_size;
    int32_t tokens[4096];
    size_t n_tokens;
    char root[33];
    size_t n_blocks;
    char hashes[64][33];
    size_t n_hashes;
} vcase_t;

static void check_case(const vcase_t *c)
{
    td_kvhash_t root, got[64];
    char hex[33];
    ck_assert_int_eq(td_kvhash_root(c->fp, c->salt, c->salt_len, &root), 0);
    td_kvhash_hex(&root, hex);
    ck_assert_msg(strcmp(hex, c->root) == 0, "%s: root %s, want %s", c->name, hex, c->root);
    size_t n = td_kvhash_blocks(c->tokens, c->n_tokens, c->block_size, &root, got, 64);
    ck_assert_msg(n == c->n_blocks, "%s: %zu blocks, want %zu", c->name, n, c->n_blocks);
    ck_assert_uint_eq(c->n_hashes, c->n_blocks);
    for (size_t i = 0; i < n; i++) {
        td_kvhash_hex(&got[i], hex);
        ck_assert_msg(strcmp(hex, c->hashes[i]) == 0, "%s: hash %zu %s, want %s", c->name, i, hex,
                      c->hashes[i]);
    }
    /* continuing from any block's hash gives the rest of the chain */
    if (n >= 2) {
        td_kvhash_t rest[64];
        ck_assert_uint_eq(td_kvhash_blocks(c->tokens + c->block_size, c->n_tokens - c->block_size,
                                           c->block_size, &got[0], rest, 64),
                          n - 1);
        ck_assert_int_eq(memcmp(rest, got + 1, (n - 1) * sizeof(td_kvhash_t)), 0);
    }
}

START_TEST(test_vector_file)
{
    const char *root = getenv("TD_SOURCE_ROOT");
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/data/kvhash-v1.txt", root ? root : ".");
    char *text;
    size_t len;
    if (td_file_read_all(path, &text, &len) != 0) {
        fprintf(stderr, "test_kvhash: %s missing: skipped\n", path);
        exit(77);
    }
    static vcase_t c;
    int cases = 0, in_case = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *sp = strchr(line, ' ');
        char *val = sp ? sp + 1 : line + strlen(line);
        if (sp)
            *sp = '\0';
        if (strcmp(line, "case") == 0) {
            ck_assert(!in_case);
            memset(&c, 0, sizeof(c));
            snprintf(c.name, sizeof(c.name), "%s", val);
            in_case = 1;
        } else if (strcmp(line, "fingerprint") == 0) {
            ck_assert_int_eq(unhex(val, c.fp, 16), 0);
        } else if (strcmp(line, "salt") == 0) {
            if (strcmp(val, "-") != 0) {
                c.salt_len = strlen(val) / 2;
                ck_assert_uint_le(c.salt_len, sizeof(c.salt));
                ck_assert_int_eq(unhex(val, c.salt, c.salt_len), 0);
            }
        } else if (strcmp(line, "block_size") == 0) {
            c.block_size = strtoul(val, NULL, 10);
        } else if (strcmp(line, "tokens") == 0) {
            for (char *s2 = NULL, *t = strtok_r(strcmp(val, "-") ? val : "", ",", &s2); t;
                 t = strtok_r(NULL, ",", &s2)) {
                int64_t v;
                ck_assert_int_eq(td_parse_i64(t, &v), 0);
                ck_assert_uint_lt(c.n_tokens, TD_ARRAY_LEN(c.tokens));
                c.tokens[c.n_tokens++] = (int32_t)v;
            }
        } else if (strcmp(line, "root") == 0) {
            snprintf(c.root, sizeof(c.root), "%s", val);
        } else if (strcmp(line, "blocks") == 0) {
            c.n_blocks = strtoul(val, NULL, 10);
        } else if (strcmp(line, "hash") == 0) {
            unsigned idx;
            char h[33];
            ck_assert_int_eq(sscanf(val, "%u %32s", &idx, h), 2);
            ck_assert_uint_eq(idx, c.n_hashes);
            ck_assert_uint_lt(c.n_hashes, 64);
            memcpy(c.hashes[c.n_hashes++], h, 33);
        } else if (strcmp(line, "end") == 0) {
            ck_assert(in_case);
            check_case(&c);
            cases++;
            in_case = 0;
        } else {
            ck_abort_msg("%s: unknown key \"%s\"", path, line);
        }
    }
    ck_assert(!in_case);
    ck_assert_int_ge(cases, 6);
    free(text);
}
END_TEST

START_TEST(test_matches_xxhsum)
{
    int32_t tokens[40];
    for (int i = 0; i < 40; i++)
        tokens[i] = i * 7919 - 3; /* includes a negative id: serialised as two's complement */
    uint8_t fp[16];
    for (int i = 0; i < 16; i++)
        fp[i] = (uint8_t)(0xA0 + i);
    const char salt[] = "tenant-42";
    /* the root: "tandem-kv" || u32le(1) || fingerprint || u32le(9) || salt */
    uint8_t rb[9 + 4 + 16 + 4 + 9];
    memcpy(rb, "tandem-kv", 9);
    put_le(rb + 9, TD_KVHASH_VERSION);
    memcpy(rb + 13, fp, 16);
    put_le(rb + 29, 9);
    memcpy(rb + 33, salt, 9);
    char want[33], got[33];
    td_kvhash_t root;
    ck_assert_int_eq(td_kvhash_root(fp, salt, strlen(salt), &root), 0);
    xxhsum(rb, sizeof(rb), want);
    td_kvhash_hex(&root, got);
    ck_assert_str_eq(got, want);
    /* the blocks: h_{i-1} || tokens as u32le */
    td_kvhash_t h[3];
    ck_assert_uint_eq(td_kvhash_blocks(tokens, 40, 16, &root, h, 3), 2);
    td_kvhash_t prev = root;
    for (int blk = 0; blk < 2; blk++) {
        uint8_t buf[16 + 64];
        memcpy(buf, prev.b, 16);
        for (int k = 0; k < 16; k++)
            put_le(buf + 16 + 4 * k, (uint32_t)tokens[blk * 16 + k]);
        xxhsum(buf, sizeof(buf), want);
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
    td_kvhash_t r, ha[4], hb[4], hc[4];
    ck_assert_int_eq(td_kvhash_root(fp, NULL, 0, &r), 0);
    ck_assert_uint_eq(td_kvhash_blocks(a, 64, 16, &r, ha, 4), 4);
    ck_assert_uint_eq(td_kvhash_blocks(b, 64, 16, &r, hb, 4), 4);
    ck_assert_int_eq(memcmp(&ha[1], &hb[1], 16), 0); /* shared prefix, same hashes */
    ck_assert_int_ne(memcmp(&ha[2], &hb[2], 16), 0); /* first differing block */
    ck_assert_int_ne(memcmp(&ha[3], &hb[3], 16), 0); /* and everything after it */
    /* continuing a chain from a stored hash equals hashing the whole prompt */
    ck_assert_uint_eq(td_kvhash_blocks(a + 32, 32, 16, &ha[1], hc, 4), 2);
    ck_assert_int_eq(memcmp(&hc[0], &ha[2], 16), 0);
    ck_assert_int_eq(memcmp(&hc[1], &ha[3], 16), 0);
    /* another tenant or layout never shares a hash */
    td_kvhash_t r2;
    ck_assert_int_eq(td_kvhash_root(fp, "t2", 2, &r2), 0);
    ck_assert_int_ne(memcmp(&r2, &r, 16), 0);
    ck_assert_uint_eq(td_kvhash_blocks(a, 16, 16, &r2, hc, 1), 1);
    ck_assert_int_ne(memcmp(&hc[0], &ha[0], 16), 0);
    uint8_t fp2[16] = {2};
    ck_assert_int_eq(td_kvhash_root(fp2, NULL, 0, &r2), 0);
    ck_assert_uint_eq(td_kvhash_blocks(a, 16, 16, &r2, hc, 1), 1);
    ck_assert_int_ne(memcmp(&hc[0], &ha[0], 16), 0);
    /* the salt is length-prefixed: an empty salt and a one-NUL salt differ */
    ck_assert_int_eq(td_kvhash_root(fp, "", 1, &r2), 0);
    ck_assert_int_ne(memcmp(&r2, &r, 16), 0);
    /* partial blocks are not hashed; max_out bounds what is written */
    ck_assert_uint_eq(td_kvhash_blocks(a, 15, 16, &r, hc, 4), 0);
    ck_assert_uint_eq(td_kvhash_blocks(a, 64, 16, &r, hc, 1), 4);
    ck_assert_uint_eq(td_kvhash_blocks(a, 64, 16, &r, hc, 0), 4);
    /* block sizes above the serialisation chunk (256 tokens) hash the same bytes */
    int32_t big[600];
    for (int i = 0; i < 600; i++)
        big[i] = i;
    td_kvhash_t x[1], y[2];
    ck_assert_uint_eq(td_kvhash_blocks(big, 600, 600, &r, x, 1), 1);
    ck_assert_uint_eq(td_kvhash_blocks(big, 600, 300, &r, y, 2), 2);
    ck_assert_int_ne(memcmp(&x[0], &y[1], 16), 0);
    /* bad salts are refused, naming the salt */
    ck_assert_int_eq(td_kvhash_root(fp, NULL, 3, &r2), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "salt"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvhash");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_vector_file);
    tcase_add_test(tc, test_matches_xxhsum);
    tcase_add_test(tc, test_chain_properties);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

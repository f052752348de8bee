/* test_kvdisk.c: the disk tier on real files in a temporary directory with a real libuv loop:
 * store/load round trips, a restart (a new tier on the same directory), corrupted, truncated and
 * foreign files detected, deleted and reported, LRU eviction under the cap, a failing directory
 * turning the tier off, close with work in flight, and the block file parser. */
#include "td_error.h"
#include "td_kvdisk.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { BB = 4096, FILE_BYTES = TD_KVDISK_HEADER_BYTES + BB };

static char tmpdir[256];
static uv_loop_t loop;
static const uint8_t FP[16] = {0xA0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t FP2[16] = {0xB0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

typedef struct result {
    int calls, status;
} result_t;

static void done_cb(td_kvdisk_t *d, const td_kvhash_t *h, int status, void *arg)
{
    result_t *r = arg;
    r->calls++;
    r->status = status;
}

static void closed_cb(void *arg)
{
    (*(int *)arg)++;
}

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/td_kvdisk_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    ck_assert_int_eq(uv_loop_init(&loop), 0);
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static td_kvhash_t hash_of(int i)
{
    td_kvhash_t h;
    for (int k = 0; k < 16; k++)
        h.b[k] = (uint8_t)(i * 37 + k * 11 + 1);
    return h;
}

static void fill(uint8_t *b, int i)
{
    for (int k = 0; k < BB; k++)
        b[k] = (uint8_t)(i * 131 + k * 7);
}

static td_kvdisk_t *open_tier(const uint8_t fp[16], uint64_t cap)
{
    td_kvdisk_opts_t o = {.dir = tmpdir, .max_bytes = cap, .block_bytes = BB};
    memcpy(o.fingerprint, fp, 16);
    td_kvdisk_t *d;
    int rc = td_kvdisk_open(&loop, &o, &d);
    ck_assert_msg(rc == 0, "open: %s", td_err_msg());
    return d;
}

static void close_tier(td_kvdisk_t *d)
{
    int closed = 0;
    td_kvdisk_close(d, closed_cb, &closed);
    ck_assert_int_eq(closed, 0); /* never from inside close */
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(closed, 1);
}

static void file_path(const uint8_t fp[16], int i, char *out, size_t n)
{
    char fh[33], hh[33];
    td_kvhash_t h = hash_of(i);
    td_hex_encode(fp, 16, fh);
    td_kvhash_hex(&h, hh);
    snprintf(out, n, "%s/%s/%.2s/%s", tmpdir, fh, hh, hh);
}

static int store_sync(td_kvdisk_t *d, int i)
{
    static uint8_t buf[BB];
    fill(buf, i);
    td_kvhash_t h = hash_of(i);
    result_t r = {0};
    int rc = td_kvdisk_store(d, &h, buf, done_cb, &r);
    if (rc)
        return rc;
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(r.calls, 1);
    return r.status;
}

/* Load block i; 0 means the bytes were checked equal to fill(i). */
static int load_sync(td_kvdisk_t *d, int i)
{
    static uint8_t got[BB], want[BB];
    td_kvhash_t h = hash_of(i);
    result_t r = {0};
    int rc = td_kvdisk_load(d, &h, got, done_cb, &r);
    if (rc)
        return rc;
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(r.calls, 1);
    if (r.status == 0) {
        fill(want, i);
        ck_assert_int_eq(memcmp(got, want, BB), 0);
    }
    return r.status;
}

static int count_tmp_files(void)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "test -z \"$(find %s -name '*.tmp')\"", tmpdir);
    return system(cmd) == 0 ? 0 : 1;
}

START_TEST(test_store_load_reopen)
{
    td_kvdisk_t *d = open_tier(FP, 1 << 30);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(store_sync(d, i), 0);
    for (int i = 0; i < 5; i++) {
        td_kvhash_t h = hash_of(i);
        ck_assert(td_kvdisk_contains(d, &h));
        ck_assert_int_eq(load_sync(d, i), 0);
    }
    td_kvhash_t h9 = hash_of(9), h0 = hash_of(0);
    ck_assert(!td_kvdisk_contains(d, &h9));
    ck_assert_int_eq(load_sync(d, 9), TD_ENOENT); /* a miss, no callback */
    uint8_t buf[BB];
    ck_assert_int_eq(td_kvdisk_store(d, &h0, buf, done_cb, NULL), 1); /* already there */
    td_kvdisk_stats_t st;
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.files, 5);
    ck_assert_uint_eq(st.bytes, 5 * FILE_BYTES);
    ck_assert_uint_eq(st.hits, 5);
    ck_assert_uint_eq(st.misses, 1);
    ck_assert(st.enabled);
    ck_assert_int_eq(count_tmp_files(), 0);
    close_tier(d);

    /* a restart: a new tier on the same directory finds every block */
    d = open_tier(FP, 1 << 30);
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.files, 5);
    ck_assert_uint_eq(st.corrupt, 0);
    td_kvhash_t list[8];
    ck_assert_uint_eq(td_kvdisk_list(d, list, 8), 5);
    for (int i = 0; i < 5; i++) {
        td_kvhash_t h = hash_of(i);
        ck_assert(td_kvdisk_contains(d, &h));
        ck_assert_int_eq(load_sync(d, i), 0);
    }
    /* a second process may not share the directory */
    td_kvdisk_opts_t o = {.dir = tmpdir, .max_bytes = 1 << 30, .block_bytes = BB};
    memcpy(o.fingerprint, FP, 16);
    td_kvdisk_t *d2;
    ck_assert_int_eq(td_kvdisk_open(&loop, &o, &d2), TD_EBUSY);
    close_tier(d);
}
END_TEST

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t c;
    ck_assert_int_eq(pread(fd, &c, 1, off), 1);
    c ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

/* A valid block file for block i, but of fingerprint fp, at `path`. */
static void write_foreign(const char *path, const uint8_t fp[16], int i)
{
    static uint8_t buf[FILE_BYTES];
    fill(buf + TD_KVDISK_HEADER_BYTES, i);
    td_kvhash_t h = hash_of(i);
    td_kvdisk_header_encode(buf, fp, &h, buf + TD_KVDISK_HEADER_BYTES, BB);
    ck_assert_int_eq(td_file_write_atomic(path, buf, sizeof(buf)), 0);
}

START_TEST(test_corrupt_truncated_foreign)
{
    td_kvdisk_t *d = open_tier(FP, 1 << 30);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(store_sync(d, i), 0);
    char p[512];
    file_path(FP, 0, p, sizeof(p));
    flip_byte(p, TD_KVDISK_HEADER_BYTES + 100); /* payload */
    file_path(FP, 1, p, sizeof(p));
    ck_assert_int_eq(truncate(p, FILE_BYTES / 2), 0);
    file_path(FP, 2, p, sizeof(p));
    write_foreign(p, FP2, 2);
    file_path(FP, 3, p, sizeof(p));
    flip_byte(p, 20); /* header */
    ck_assert_int_eq(load_sync(d, 0), TD_ECHECKSUM);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "checksum"));
    ck_assert_int_eq(load_sync(d, 1), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "truncated"));
    ck_assert_int_eq(load_sync(d, 2), TD_EMISMATCH);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "fingerprint"));
    ck_assert_int_eq(load_sync(d, 3), TD_ECHECKSUM);
    for (int i = 0; i < 4; i++) {
        td_kvhash_t h = hash_of(i);
        ck_assert(!td_kvdisk_contains(d, &h)); /* dropped from the index */
        file_path(FP, i, p, sizeof(p));
        ck_assert_int_ne(access(p, F_OK), 0); /* and from the disk */
        ck_assert_int_eq(load_sync(d, i), TD_ENOENT);
    }
    td_kvdisk_stats_t st;
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.corrupt, 4);
    ck_assert_uint_eq(st.files, 2);
    ck_assert_uint_eq(st.bytes, 2 * FILE_BYTES);
    ck_assert(st.enabled); /* a bad file is not a bad disk */
    ck_assert_int_eq(load_sync(d, 4), 0);
    ck_assert_int_eq(store_sync(d, 0), 0); /* the block can be stored again */
    ck_assert_int_eq(load_sync(d, 0), 0);
    close_tier(d);

    /* at open: truncated, foreign and bad-header files are dropped, leftovers removed */
    file_path(FP, 4, p, sizeof(p));
    ck_assert_int_eq(truncate(p, 10), 0);
    file_path(FP, 5, p, sizeof(p));
    write_foreign(p, FP2, 5);
    file_path(FP, 0, p, sizeof(p));
    strcat(p, ".tmp");
    ck_assert_int_eq(td_file_write_atomic(p, "torn", 4), 0);
    d = open_tier(FP, 1 << 30);
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.files, 1);
    ck_assert_uint_eq(st.corrupt, 2);
    td_kvhash_t h4 = hash_of(4), h5 = hash_of(5);
    ck_assert(!td_kvdisk_contains(d, &h4));
    ck_assert(!td_kvdisk_contains(d, &h5));
    ck_assert_int_eq(count_tmp_files(), 0);
    ck_assert_int_eq(load_sync(d, 0), 0);
    close_tier(d);
}
END_TEST

START_TEST(test_other_fingerprint_separate)
{
    td_kvdisk_t *d = open_tier(FP, 1 << 30);
    ck_assert_int_eq(store_sync(d, 1), 0);
    close_tier(d);
    d = open_tier(FP2, 1 << 30); /* another model or layout on the same root */
    td_kvhash_t h = hash_of(1);
    ck_assert(!td_kvdisk_contains(d, &h));
    ck_assert_int_eq(load_sync(d, 1), TD_ENOENT);
    close_tier(d);
    d = open_tier(FP, 1 << 30); /* left alone */
    ck_assert(td_kvdisk_contains(d, &h));
    close_tier(d);
}
END_TEST

START_TEST(test_lru_eviction)
{
    td_kvdisk_t *d = open_tier(FP, 3 * FILE_BYTES);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(store_sync(d, i), 0);
    ck_assert_int_eq(load_sync(d, 0), 0); /* 0 is now the most recently used; 1 the least */
    ck_assert_int_eq(store_sync(d, 3), 0);
    td_kvhash_t h[4] = {hash_of(0), hash_of(1), hash_of(2), hash_of(3)};
    ck_assert(td_kvdisk_contains(d, &h[0]));
    ck_assert(!td_kvdisk_contains(d, &h[1]));
    ck_assert(td_kvdisk_contains(d, &h[2]));
    ck_assert(td_kvdisk_contains(d, &h[3]));
    char p[512];
    file_path(FP, 1, p, sizeof(p));
    ck_assert_int_ne(access(p, F_OK), 0);
    td_kvdisk_stats_t st;
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.evictions, 1);
    ck_assert_uint_eq(st.files, 3);
    ck_assert_uint_le(st.bytes, 3 * FILE_BYTES);
    td_kvhash_t list[4];
    ck_assert_uint_eq(td_kvdisk_list(d, list, 4), 3);
    ck_assert_int_eq(memcmp(&list[0], &h[3], 16), 0); /* most recently used first */
    ck_assert_int_eq(memcmp(&list[1], &h[0], 16), 0);
    close_tier(d);
    /* reopened with a smaller cap: the oldest files go at once */
    d = open_tier(FP, 2 * FILE_BYTES);
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.files, 2);
    ck_assert_uint_eq(st.evictions, 1);
    close_tier(d);
    /* a block larger than the cap is refused */
    d = open_tier(FP, FILE_BYTES - 1);
    uint8_t buf[BB] = {0};
    ck_assert_int_eq(td_kvdisk_store(d, &h[1], buf, done_cb, NULL), TD_ENOSPC);
    close_tier(d);
}
END_TEST

/* The listener (the cluster index's view of the tier): stores that finish, evictions, a bad file
 * found at load, and the tier turning off, in order. */
typedef struct changes {
    int n;
    int8_t block[16]; /* hash_of(i)'s i, or -1 for "every block" */
    bool added[16];
} changes_t;

static void on_change(void *ud, const td_kvhash_t *h, bool added)
{
    changes_t *c = ud;
    int i = -1;
    for (int k = 0; h && k < 16; k++) {
        td_kvhash_t x = hash_of(k);
        if (memcmp(&x, h, sizeof(x)) == 0)
            i = k;
    }
    ck_assert(h == NULL || i >= 0);
    ck_assert_int_lt(c->n, 16);
    c->block[c->n] = (int8_t)i;
    c->added[c->n++] = added;
}

START_TEST(test_listener)
{
    td_kvdisk_t *d = open_tier(FP, 2 * FILE_BYTES);
    changes_t c = {0};
    td_kvdisk_set_listener(d, on_change, &c);
    ck_assert_int_eq(store_sync(d, 0), 0);
    ck_assert_int_eq(store_sync(d, 1), 0);
    ck_assert_int_eq(store_sync(d, 2), 0); /* evicts 0, the least recently used */
    int want_b[] = {0, 1, 0, 2};
    bool want_a[] = {true, true, false, true};
    ck_assert_int_eq(c.n, 4);
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(c.block[k], want_b[k]);
        ck_assert_int_eq(c.added[k], want_a[k]);
    }
    /* a flipped payload byte: the load fails and the block is gone */
    char p[512];
    file_path(FP, 1, p, sizeof(p));
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, TD_KVDISK_HEADER_BYTES + 3, SEEK_SET);
    fputc(0x5a ^ fgetc(f), f);
    fclose(f);
    ck_assert_int_eq(load_sync(d, 1), TD_ECHECKSUM);
    ck_assert_int_eq(c.n, 5);
    ck_assert_int_eq(c.block[4], 1);
    ck_assert(!c.added[4]);
    /* the tier turns off: every block at once */
    file_path(FP, 3, p, sizeof(p));
    *strrchr(p, '/') = '\0';
    ck_assert_int_eq(td_file_write_atomic(p, "x", 1), 0);
    ck_assert_int_lt(store_sync(d, 3), 0);
    ck_assert_int_eq(c.block[c.n - 1], -1);
    ck_assert(!c.added[c.n - 1]);
    close_tier(d);
}
END_TEST

START_TEST(test_failing_disk_turns_off)
{
    td_kvdisk_t *d = open_tier(FP, 1 << 30);
    ck_assert_int_eq(store_sync(d, 1), 0);
    /* a regular file where block 2's prefix directory must go: every write there fails */
    char p[512];
    file_path(FP, 2, p, sizeof(p));
    *strrchr(p, '/') = '\0';
    ck_assert_int_eq(td_file_write_atomic(p, "x", 1), 0);
    int rc = store_sync(d, 2);
    ck_assert_int_lt(rc, 0);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "kvdisk"));
    td_kvdisk_stats_t st;
    td_kvdisk_stats(d, &st);
    ck_assert(!st.enabled);
    ck_assert_uint_eq(st.errors, 1);
    ck_assert_uint_eq(st.files, 1);
    /* later calls fail fast, without callbacks, and nothing is advertised */
    td_kvhash_t h1 = hash_of(1), h3 = hash_of(3);
    uint8_t buf[BB] = {0};
    result_t r = {0};
    ck_assert_int_eq(td_kvdisk_store(d, &h3, buf, done_cb, &r), TD_EDISABLED);
    ck_assert_int_eq(td_kvdisk_load(d, &h1, buf, done_cb, &r), TD_EDISABLED);
    ck_assert(!td_kvdisk_contains(d, &h1));
    ck_assert_int_eq(uv_run(&loop, UV_RUN_NOWAIT), 0);
    ck_assert_int_eq(r.calls, 0);
    close_tier(d);
}
END_TEST

START_TEST(test_close_in_flight)
{
    td_kvdisk_t *d = open_tier(FP, 1 << 30);
    enum { N = 64 };
    static uint8_t bufs[N][BB];
    result_t r[N] = {{0}};
    for (int i = 0; i < N; i++) {
        fill(bufs[i], i);
        td_kvhash_t h = hash_of(i);
        ck_assert_int_eq(td_kvdisk_store(d, &h, bufs[i], done_cb, &r[i]), 0);
    }
    int closed = 0;
    td_kvdisk_close(d, closed_cb, &closed);
    td_kvhash_t h0 = hash_of(0);
    ck_assert_int_eq(td_kvdisk_store(d, &h0, bufs[0], done_cb, NULL), TD_ECLOSED);
    ck_assert_int_eq(td_kvdisk_load(d, &h0, bufs[0], done_cb, NULL), TD_ECLOSED);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(closed, 1);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        ck_assert(r[i].status == 0 || r[i].status == TD_ECANCELED);
        ok += r[i].status == 0;
    }
    ck_assert_int_eq(count_tmp_files(), 0);
    d = open_tier(FP, 1 << 30); /* exactly the stores that reported success are there */
    td_kvdisk_stats_t st;
    td_kvdisk_stats(d, &st);
    ck_assert_uint_eq(st.files, (uint64_t)ok);
    ck_assert_uint_eq(st.corrupt, 0);
    for (int i = 0; i < N; i++)
        if (r[i].status == 0)
            ck_assert_int_eq(load_sync(d, i), 0);
    /* close with loads in flight, and with nothing in flight */
    static uint8_t dst[4][BB];
    int started = 0;
    for (int i = 0; i < N && started < 4; i++)
        if (r[i].status == 0) {
            td_kvhash_t h = hash_of(i);
            ck_assert_int_eq(td_kvdisk_load(d, &h, dst[started++], NULL, NULL), 0);
        }
    close_tier(d);
    close_tier(open_tier(FP, 1 << 30));
}
END_TEST

START_TEST(test_parse)
{
    static uint8_t f[FILE_BYTES];
    fill(f + TD_KVDISK_HEADER_BYTES, 7);
    td_kvhash_t h = hash_of(7), other = hash_of(8);
    td_kvdisk_header_encode(f, FP, &h, f + TD_KVDISK_HEADER_BYTES, BB);
    ck_assert_int_eq(memcmp(f, TD_KVDISK_MAGIC, 8), 0);
    const uint8_t *pl;
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP, &h, BB, &pl), 0);
    ck_assert_ptr_eq(pl, f + TD_KVDISK_HEADER_BYTES);
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP, NULL, BB, &pl), 0);
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP2, &h, BB, &pl), TD_EMISMATCH);
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP, &other, BB, &pl), TD_EMISMATCH);
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP, &h, BB + 1, &pl), TD_EMISMATCH);
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES - 1, FP, &h, BB, &pl), TD_EPARSE);
    ck_assert_int_eq(td_kvdisk_parse(f, 40, FP, &h, BB, &pl), TD_EPARSE);
    for (int off = 0; off < TD_KVDISK_HEADER_BYTES; off++) { /* every header byte counts */
        f[off] ^= 1;
        ck_assert_int_ne(td_kvdisk_parse(f, FILE_BYTES, FP, &h, BB, &pl), 0);
        f[off] ^= 1;
    }
    f[FILE_BYTES - 1] ^= 1;
    ck_assert_int_eq(td_kvdisk_parse(f, FILE_BYTES, FP, &h, BB, &pl), TD_ECHECKSUM);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvdisk");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_store_load_reopen);
    tcase_add_test(tc, test_corrupt_truncated_foreign);
    tcase_add_test(tc, test_other_fingerprint_separate);
    tcase_add_test(tc, test_lru_eviction);
    tcase_add_test(tc, test_failing_disk_turns_off);
    tcase_add_test(tc, test_listener);
    tcase_add_test(tc, test_close_in_flight);
    tcase_add_test(tc, test_parse);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

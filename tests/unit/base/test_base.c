/* test_base.c: error table, utilities, logging, configuration layering and the proto library. */
#include "control.pb-c.h"
#include "td_config.h"
#include "td_error.h"
#include "td_log.h"
#include "td_rng.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(test_error_table)
{
    ck_assert_str_eq(td_strerror(0), "success");
    ck_assert_str_eq(td_strerror(TD_EINVAL), "invalid argument");
    ck_assert_str_eq(td_err_name(TD_ECHECKSUM), "TD_ECHECKSUM");
    ck_assert_str_eq(td_strerror(12345), "unknown error");
    /* every code has a distinct message and name */
    for (int a = -1; a > TD_ERR_LAST_; a--) {
        ck_assert_str_ne(td_strerror(a), "unknown error");
        for (int b = a - 1; b > TD_ERR_LAST_; b--)
            ck_assert_str_ne(td_err_name(a), td_err_name(b));
    }
    ck_assert_int_eq(td_err_from_errno(2 /* ENOENT */), TD_ENOENT);
    ck_assert_int_eq(td_err_set(TD_EPARSE, "file %s field %s", "a.json", "model"), TD_EPARSE);
    ck_assert_str_eq(td_err_msg(), "file a.json field model");
    td_err_clear();
    ck_assert_str_eq(td_err_msg(), "");
}
END_TEST

START_TEST(test_buf)
{
    td_buf_t b;
    td_buf_init(&b);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(td_buf_printf(&b, "%d,", i), 0);
    ck_assert(td_str_startswith(b.data, "0,1,2,"));
    ck_assert(td_str_endswith(b.data, "998,999,"));
    ck_assert_uint_eq(strlen(b.data), b.len);
    char big[600];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    td_buf_reset(&b);
    ck_assert_int_eq(td_buf_printf(&b, "[%s]", big), 0);
    ck_assert_uint_eq(b.len, 601);
    size_t n;
    char *s = td_buf_steal(&b, &n);
    ck_assert_uint_eq(n, 601);
    ck_assert_ptr_null(b.data);
    free(s);
    td_buf_free(&b);
}
END_TEST

START_TEST(test_buf_i64)
{
    const int64_t vals[] = {0, 1, -1, 9, 10, -10, 1234567890123, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    td_buf_t b, want;
    td_buf_init(&b);
    td_buf_init(&want);
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        ck_assert_int_eq(td_buf_append_i64(&b, vals[i]), 0);
        ck_assert_int_eq(td_buf_append_char(&b, ','), 0);
        ck_assert_int_eq(td_buf_printf(&want, "%" PRId64 ",", vals[i]), 0);
    }
    ck_assert_str_eq(b.data, want.data);
    ck_assert_uint_eq(b.len, want.len);
    td_buf_free(&b);
    td_buf_free(&want);
}
END_TEST

START_TEST(test_huge_calloc)
{
    size_t sizes[] = {100, (3u << 20) + 5, 2u << 20};
    for (size_t k = 0; k < 3; k++) {
        uint8_t *p = td_huge_calloc(sizes[k], 1);
        ck_assert_ptr_nonnull(p);
        if (sizes[k] >= (1u << 20)) /* mapped on its own, on a 2 MiB boundary */
            ck_assert_uint_eq((uintptr_t)p % (2u << 20), 0);
        for (size_t i = 0; i < sizes[k]; i += 4093)
            ck_assert_uint_eq(p[i], 0);
        ck_assert_uint_eq(p[sizes[k] - 1], 0);
        memset(p, 0xAB, sizes[k]);
        td_huge_free(p, sizes[k]);
    }
    ck_assert_ptr_null(td_huge_calloc(SIZE_MAX / 2, 4));
    td_huge_free(NULL, 5u << 20);
}
END_TEST

START_TEST(test_json_string)
{
    td_buf_t b;
    td_buf_init(&b);
    const char in[] = "a\"b\\c\n\x01\x1f\t h\xc3\xa9";
    ck_assert_int_eq(td_buf_append_json_string(&b, in, sizeof(in) - 1), 0);
    ck_assert_str_eq(b.data, "\"a\\\"b\\\\c\\n\\u0001\\u001f\\t h\xc3\xa9\"");
    td_buf_reset(&b);
    ck_assert_int_eq(td_buf_append_json_string(&b, "nul\0x", 5), 0);
    ck_assert_str_eq(b.data, "\"nul\\u0000x\"");
    td_buf_free(&b);
}
END_TEST

START_TEST(test_parse)
{
    int64_t i;
    uint64_t u;
    double d;
    bool v;
    ck_assert_int_eq(td_parse_i64("-42", &i), 0);
    ck_assert_int_eq(i, -42);
    ck_assert_int_eq(td_parse_i64("42x", &i), TD_EINVAL);
    ck_assert_int_eq(td_parse_i64("", &i), TD_EINVAL);
    ck_assert_int_eq(td_parse_i64("99999999999999999999", &i), TD_ERANGE);
    ck_assert_int_eq(td_parse_u64("-1", &u), TD_EINVAL);
    ck_assert_int_eq(td_parse_size("64M", &u), 0);
    ck_assert_uint_eq(u, 64ull << 20);
    ck_assert_int_eq(td_parse_size("2GiB", &u), 0);
    ck_assert_uint_eq(u, 2ull << 30);
    ck_assert_int_eq(td_parse_size("2X", &u), TD_EINVAL);
    ck_assert_int_eq(td_parse_size("99999999999T", &u), TD_ERANGE);
    ck_assert_int_eq(td_parse_double("0.25", &d), 0);
    ck_assert(d == 0.25);
    ck_assert_int_eq(td_parse_double("nan", &d), TD_EINVAL);
    ck_assert_int_eq(td_parse_bool("On", &v), 0);
    ck_assert(v);
    ck_assert_int_eq(td_parse_bool("off", &v), 0);
    ck_assert(!v);
    ck_assert_int_eq(td_parse_bool("maybe", &v), TD_EINVAL);
}
END_TEST

START_TEST(test_hex_and_paths)
{
    uint8_t b[4];
    ck_assert_int_eq(td_hex_decode("00aBfF10", 8, b), 0);
    ck_assert(b[0] == 0x00 && b[1] == 0xab && b[2] == 0xff && b[3] == 0x10);
    char hex[9];
    td_hex_encode(b, 4, hex);
    ck_assert_str_eq(hex, "00abff10");
    ck_assert_int_eq(td_hex_decode("0g", 2, b), TD_EINVAL);
    ck_assert_int_eq(td_hex_decode("abc", 3, b), TD_EINVAL);
    ck_assert_int_eq(td_hex_decode("", 0, b), 0);
    /* the served model name: the last component, trailing '/' ignored */
    char n[8];
    ck_assert_str_eq(td_path_basename("/m/llama/", n, sizeof(n)), "llama");
    ck_assert_str_eq(td_path_basename("/m/llama", n, sizeof(n)), "llama");
    ck_assert_str_eq(td_path_basename("llama//", n, sizeof(n)), "llama");
    ck_assert_str_eq(td_path_basename("/", n, sizeof(n)), "/");
    ck_assert_str_eq(td_path_basename("/m/a-very-long-name", n, sizeof(n)), "a-very-");
}
END_TEST

START_TEST(test_utf8)
{
    const uint8_t euro[] = {0xE2, 0x82, 0xAC};
    ck_assert_uint_eq(td_utf8_valid_len(euro, 3), 3);
    ck_assert_uint_eq(td_utf8_valid_len(euro, 2), 0);
    ck_assert_uint_eq(td_utf8_decode(euro, 3), 0x20AC);
    const uint8_t overlong[] = {0xC0, 0xAF};
    ck_assert_uint_eq(td_utf8_valid_len(overlong, 2), 0);
    const uint8_t surrogate[] = {0xED, 0xA0, 0x80};
    ck_assert_uint_eq(td_utf8_valid_len(surrogate, 3), 0);
    char out[4];
    for (uint32_t cp = 1; cp < 0x110000; cp += 97) {
        if (cp >= 0xD800 && cp < 0xE000)
            continue;
        size_t n = td_utf8_encode(cp, out);
        ck_assert_uint_eq(td_utf8_valid_len((uint8_t *)out, n), n);
        ck_assert_uint_eq(td_utf8_decode((uint8_t *)out, n), cp);
    }
    /* "a€" cut after each byte: the complete prefix never splits the euro sign */
    const uint8_t s[] = {'a', 0xE2, 0x82, 0xAC};
    ck_assert_uint_eq(td_utf8_complete_prefix(s, 1), 1);
    ck_assert_uint_eq(td_utf8_complete_prefix(s, 2), 1);
    ck_assert_uint_eq(td_utf8_complete_prefix(s, 3), 1);
    ck_assert_uint_eq(td_utf8_complete_prefix(s, 4), 4);
    const uint8_t emoji[] = {0xF0, 0x9F, 0x98, 0x80};
    ck_assert_uint_eq(td_utf8_complete_prefix(emoji, 3), 0);
    ck_assert_uint_eq(td_utf8_complete_prefix(emoji, 4), 4);
}
END_TEST

static char tmpdir[] = "/tmp/td_test_XXXXXX";

static void write_file(const char *path, const char *text)
{
    ck_assert_int_eq(td_file_write_atomic(path, text, strlen(text)), 0);
}

START_TEST(test_files)
{
    char path[256], *data;
    size_t len;
    snprintf(path, sizeof(path), "%s/f.txt", tmpdir);
    write_file(path, "hello");
    ck_assert_int_eq(td_file_read_all(path, &data, &len), 0);
    ck_assert_uint_eq(len, 5);
    ck_assert_str_eq(data, "hello");
    free(data);
    td_mmap_t m;
    ck_assert_int_eq(td_mmap_open(&m, path), 0);
    ck_assert_uint_eq(m.len, 5);
    ck_assert_int_eq(memcmp(m.data, "hello", 5), 0);
    td_mmap_close(&m);
    snprintf(path, sizeof(path), "%s/missing", tmpdir);
    ck_assert_int_eq(td_file_read_all(path, &data, &len), TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "missing"));
}
END_TEST

/* The line of /proc/self/maps whose range starts at p, into line. */
static bool maps_line(const void *p, char *line, size_t n)
{
    FILE *f = fopen("/proc/self/maps", "r");
    bool found = false;
    while (f && !found && fgets(line, (int)n, f))
        found = strtoull(line, NULL, 16) == (unsigned long long)(uintptr_t)p;
    if (f)
        fclose(f);
    return found;
}

/* td_mmap_to_anon: the same bytes at the same address, now anonymous memory: a later write to the
 * file no longer shows through, and the line in /proc/self/maps names no file. */
START_TEST(test_mmap_to_anon)
{
    char path[256], line[512];
    snprintf(path, sizeof(path), "%s/w.bin", tmpdir);
    size_t len = ((size_t)5 << 20) + 123; /* more than two huge pages, not a whole page */
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 7 + (i >> 12));
    ck_assert_int_eq(td_file_write_atomic(path, buf, len), 0);
    td_mmap_t m;
    ck_assert_int_eq(td_mmap_open(&m, path), 0);
    const uint8_t *at = m.data;
    ck_assert(maps_line(at, line, sizeof(line)));
    ck_assert_ptr_nonnull(strstr(line, "w.bin"));
    ck_assert_int_eq(td_mmap_to_anon(&m), 0);
    ck_assert_ptr_eq(m.data, at);
    ck_assert_uint_eq(m.len, len);
    ck_assert_int_eq(memcmp(m.data, buf, len), 0);
    ck_assert(maps_line(at, line, sizeof(line)));
    ck_assert_ptr_null(strstr(line, "w.bin"));
    ck_assert_ptr_null(strchr(line, '/'));
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "XYZ", 3, 4096), 3);
    close(fd);
    ck_assert_int_eq(memcmp(m.data, buf, len), 0);
    td_mmap_close(&m);
    /* an empty file: nothing to copy */
    write_file(path, "");
    ck_assert_int_eq(td_mmap_open(&m, path), 0);
    ck_assert_int_eq(td_mmap_to_anon(&m), 0);
    ck_assert_uint_eq(m.len, 0);
    td_mmap_close(&m);
    free(buf);
}
END_TEST

typedef struct test_cfg {
    char *host;
    int64_t port;
    bool verbose;
    uint64_t pool;
    double ratio;
} test_cfg_t;

static const td_opt_t test_opts[] = {
    {"http.host", TD_OPT_STR, offsetof(test_cfg_t, host), "127.0.0.1", "listen address", 0, 0},
    {"http.port", TD_OPT_INT, offsetof(test_cfg_t, port), "8000", "listen port", 1, 65535},
    {"verbose", TD_OPT_BOOL, offsetof(test_cfg_t, verbose), "false", "chatty", 0, 0},
    {"kv.pool-size", TD_OPT_SIZE, offsetof(test_cfg_t, pool), "1G", "pool bytes", 0, 0},
    {"kv.ratio", TD_OPT_DOUBLE, offsetof(test_cfg_t, ratio), "0.5", "ratio", 0, 1},
};

START_TEST(test_config_layers)
{
    char ini[256];
    snprintf(ini, sizeof(ini), "%s/t.ini", tmpdir);
    write_file(ini, "verbose = yes\n[http]\nhost = 0.0.0.0\nport = 9000\n[kv]\npool-size = 2M\n");
    test_cfg_t c = {0};
    /* defaults only */
    char *argv0[] = {"prog", NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, NULL, 1, argv0, NULL, 0, NULL), 0);
    ck_assert_str_eq(c.host, "127.0.0.1");
    ck_assert_int_eq(c.port, 8000);
    ck_assert_uint_eq(c.pool, 1ull << 30);
    td_config_free(test_opts, 5, &c);
    /* file, then env, then flags: later wins */
    setenv("TDTEST_HTTP_PORT", "9100", 1);
    setenv("TDTEST_KV_RATIO", "0.75", 1);
    setenv("TDTEST_NOT_AN_OPTION", "x", 1); /* ignored: environments are shared */
    char *argv[] = {"prog", "--config", ini, "--http.port=9200", "--kv-ratio", "0.25", "pos", NULL};
    int pos[2];
    size_t npos;
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, "TDTEST", 7, argv, pos, 2, &npos), 0);
    ck_assert_str_eq(c.host, "0.0.0.0");  /* file */
    ck_assert(c.verbose);                 /* file */
    ck_assert_uint_eq(c.pool, 2ull << 20); /* file */
    ck_assert_int_eq(c.port, 9200);       /* flag over env over file */
    ck_assert(c.ratio == 0.25);           /* flag over env */
    ck_assert_uint_eq(npos, 1);
    ck_assert_str_eq(argv[pos[0]], "pos");
    td_config_free(test_opts, 5, &c);
    /* env over file */
    char *argv2[] = {"prog", "--config", ini, NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, "TDTEST", 3, argv2, NULL, 0, NULL), 0);
    ck_assert_int_eq(c.port, 9100);
    td_config_free(test_opts, 5, &c);
    unsetenv("TDTEST_HTTP_PORT");
    unsetenv("TDTEST_KV_RATIO");
    unsetenv("TDTEST_NOT_AN_OPTION");
}
END_TEST

START_TEST(test_config_errors)
{
    char ini[256];
    test_cfg_t c = {0};
    snprintf(ini, sizeof(ini), "%s/bad.ini", tmpdir);
    write_file(ini, "[http]\nport = 80\nprot = 81\n");
    char *argv[] = {"prog", NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, ini, NULL, 1, argv, NULL, 0, NULL),
                     TD_EUNKNOWNKEY);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "bad.ini:3"));
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "\"prot\""));
    td_config_free(test_opts, 5, &c);

    write_file(ini, "[http]\nport = eighty\n");
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, ini, NULL, 1, argv, NULL, 0, NULL), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "http.port"));
    td_config_free(test_opts, 5, &c);

    write_file(ini, "[http]\nport = 70000\n");
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, ini, NULL, 1, argv, NULL, 0, NULL), TD_ERANGE);
    td_config_free(test_opts, 5, &c);

    write_file(ini, "[http\nport = 1\n");
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, ini, NULL, 1, argv, NULL, 0, NULL), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "bad.ini:1"));
    td_config_free(test_opts, 5, &c);

    char *argv_bad[] = {"prog", "--htp.port=1", NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, NULL, 2, argv_bad, NULL, 0, NULL),
                     TD_EUNKNOWNKEY);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--htp.port"));
    td_config_free(test_opts, 5, &c);

    char *argv_pos[] = {"prog", "stray", NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, NULL, 2, argv_pos, NULL, 0, NULL),
                     TD_EINVAL);
    td_config_free(test_opts, 5, &c);

    char *argv_missing[] = {"prog", "--config", "/nonexistent/x.ini", NULL};
    ck_assert_int_eq(td_config_load(test_opts, 5, &c, NULL, NULL, 3, argv_missing, NULL, 0, NULL),
                     TD_ENOENT);
    td_config_free(test_opts, 5, &c);
}
END_TEST

static char *log_capture(td_log_format_t fmt, const char *req)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    td_log_init("unit", TD_LOG_INFO, fmt, fds[1]);
    td_log_set_journald(false);
    td_logf(TD_LOG_DEBUG, req, "hidden");
    td_logf(TD_LOG_WARN, req, "disk \"%s\" full", "a b");
    close(fds[1]);
    static char out[1024];
    ssize_t n = read(fds[0], out, sizeof(out) - 1);
    close(fds[0]);
    out[n > 0 ? n : 0] = '\0';
    return out;
}

START_TEST(test_log)
{
    char *s = log_capture(TD_LOG_LOGFMT, "r-1");
    ck_assert_ptr_null(strstr(s, "hidden"));
    ck_assert_ptr_nonnull(strstr(s, "level=warn comp=unit req=r-1 msg=\"disk \\\"a b\\\" full\""));
    s = log_capture(TD_LOG_JSON, NULL);
    ck_assert_ptr_nonnull(strstr(s, "\"level\":\"warn\",\"comp\":\"unit\",\"msg\":\"disk \\\"a b\\\" full\"}"));
    ck_assert_ptr_null(strstr(s, "\"req\""));
    /* journald prefix */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    td_log_init("unit", TD_LOG_INFO, TD_LOG_LOGFMT, fds[1]);
    td_log_set_journald(true);
    td_logf(TD_LOG_ERROR, NULL, "boom");
    close(fds[1]);
    char buf[256];
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    ck_assert(td_str_startswith(buf, "<3>level=error"));
    td_log_init("unit", TD_LOG_WARN, TD_LOG_LOGFMT, 2);
    td_log_level_t lv;
    ck_assert_int_eq(td_log_level_parse("debug", &lv), 0);
    ck_assert_int_eq(lv, TD_LOG_DEBUG);
    ck_assert_int_eq(td_log_level_parse("loud", &lv), TD_EINVAL);
}
END_TEST

/* Known answers: splitmix64 from 0 (the reference's first value) and xoshiro256** after
 * td_rng_seed, computed by an independent implementation of the published algorithms. */
START_TEST(test_rng)
{
    uint64_t x = 0;
    ck_assert_uint_eq(td_rng_splitmix64(&x), 0xe220a8397b1dcdafull);
    td_rng_t r;
    td_rng_seed(&r, 0);
    ck_assert_uint_eq(r.s[0], 0xe220a8397b1dcdafull);
    ck_assert_uint_eq(r.s[3], 0xf88bb8a8724c81ecull);
    ck_assert_uint_eq(td_rng_next(&r), 0x99ec5f36cb75f2b4ull);
    ck_assert_uint_eq(td_rng_next(&r), 0xbf6e1f784956452aull);
    ck_assert_uint_eq(td_rng_next(&r), 0x1a5f849d4933e6e0ull);
    td_rng_seed(&r, 42);
    ck_assert_uint_eq(td_rng_next(&r), 0x15780b2e0c2ec716ull);
    td_rng_t c = r; /* a copy continues the same stream */
    ck_assert_uint_eq(td_rng_next(&r), 0x6104d9866d113a7eull);
    ck_assert_uint_eq(td_rng_next(&c), 0x6104d9866d113a7eull);
    double u = td_rng_uniform(&r);
    ck_assert(u == (double)(0xae17533239e499a1ull >> 11) * 0x1.0p-53);
    for (int i = 0; i < 1000; i++) {
        u = td_rng_uniform(&r);
        ck_assert(u >= 0.0 && u < 1.0);
    }
}
END_TEST

START_TEST(test_proto_roundtrip)
{
    Tandem__Hello hello = TANDEM__HELLO__INIT;
    hello.role = TANDEM__ROLE__ROLE_DECODE;
    hello.worker_id = "decode-0";
    hello.total_blocks = 4096;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HELLO;
    f.hello = &hello;
    size_t n = tandem__frame__get_packed_size(&f);
    uint8_t *buf = malloc(n);
    ck_assert_uint_eq(tandem__frame__pack(&f, buf), n);
    Tandem__Frame *g = tandem__frame__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(g->body_case, TANDEM__FRAME__BODY_HELLO);
    ck_assert_str_eq(g->hello->worker_id, "decode-0");
    ck_assert_uint_eq(g->hello->total_blocks, 4096);
    tandem__frame__free_unpacked(g, NULL);
    /* truncated frame is rejected, not misread */
    ck_assert_ptr_null(tandem__frame__unpack(NULL, n - 3, buf));
    free(buf);
}
END_TEST

static Suite *base_suite(void)
{
    Suite *s = suite_create("base");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_error_table);
    tcase_add_test(tc, test_buf);
    tcase_add_test(tc, test_buf_i64);
    tcase_add_test(tc, test_huge_calloc);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_json_string);
    tcase_add_test(tc, test_hex_and_paths);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_files);
    tcase_add_test(tc, test_mmap_to_anon);
    tcase_add_test(tc, test_config_layers);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_log);
    tcase_add_test(tc, test_rng);
    tcase_add_test(tc, test_proto_roundtrip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (!mkdtemp(tmpdir))
        return 1;
    int failed = td_check_run(base_suite());
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        return 1;
    return failed ? 1 : 0;
}

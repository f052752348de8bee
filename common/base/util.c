/* util.c: buffers, files, time, allocation and string helpers. */
#include "td_util.h"
#include "td_error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void td_buf_init(td_buf_t *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void td_buf_free(td_buf_t *b)
{
    free(b->data);
    td_buf_init(b);
}

void td_buf_reset(td_buf_t *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

int td_buf_reserve(td_buf_t *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return TD_EOVERFLOW;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return TD_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int td_buf_append(td_buf_t *b, const void *p, size_t n)
{
    int rc = td_buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int td_buf_append_str(td_buf_t *b, const char *s)
{
    return td_buf_append(b, s, strlen(s));
}

int td_buf_append_char(td_buf_t *b, char c)
{
    return td_buf_append(b, &c, 1);
}

int td_buf_append_i64(td_buf_t *b, int64_t v)
{
    char d[24];
    size_t i = sizeof(d);
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        d[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        d[--i] = '-';
    return td_buf_append(b, d + i, sizeof(d) - i);
}

int td_buf_printf(td_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return TD_EINVAL;
    if ((size_t)n < sizeof(small))
        return td_buf_append(b, small, (size_t)n);
    int rc = td_buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int td_buf_append_json_string(td_buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    int rc = td_buf_reserve(b, n + 2);
    if (rc)
        return rc;
    b->data[b->len++] = '"';
    size_t run = 0; /* start of the current run of bytes that need no escaping */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if ((rc = td_buf_append(b, s + run, i - run)))
            return rc;
        char esc[6] = {'\\', 0};
        size_t elen = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            esc[1] = 'u', esc[2] = '0', esc[3] = '0', esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
            elen = 6;
        }
        if ((rc = td_buf_append(b, esc, elen)))
            return rc;
        run = i + 1;
    }
    if ((rc = td_buf_append(b, s + run, n - run)))
        return rc;
    return td_buf_append_char(b, '"');
}

char *td_buf_steal(td_buf_t *b, size_t *len)
{
    char *p = b->data;
    if (len)
        *len = b->len;
    if (!p)
        p = calloc(1, 1);
    td_buf_init(b);
    return p;
}

int td_file_read_all(const char *path, char **out, size_t *len)
{
    *out = NULL;
    if (len)
        *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return td_err_set(td_err_from_errno(e), "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return td_err_set(TD_EIO, "%s: not a regular file", path);
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return td_err_set(TD_ENOMEM, "%s: cannot allocate %zu bytes", path, cap);
    }
    for (;;) {
        if (n + 1 >= cap) { /* file grew while reading */
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return td_err_set(TD_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return td_err_set(td_err_from_errno(e), "%s: read: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int td_file_write_atomic(const char *path, const void *data, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return TD_ENOMEM;
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return td_err_set(td_err_from_errno(e), "%s: %s", path, strerror(e));
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            free(tmp);
            return td_err_set(td_err_from_errno(e), "%s: write: %s", path, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return td_err_set(td_err_from_errno(e), "%s: %s", path, strerror(e));
    }
    free(tmp);
    return 0;
}

int td_mmap_open(td_mmap_t *m, const char *path)
{
    m->data = NULL;
    m->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return td_err_set(td_err_from_errno(e), "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return td_err_set(TD_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        m->data = (const uint8_t *)"";
        return 0;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return td_err_set(td_err_from_errno(e), "%s: mmap: %s", path, strerror(e));
    m->data = p;
    m->len = (size_t)st.st_size;
    return 0;
}

void td_mmap_close(td_mmap_t *m)
{
    if (m->data && m->len)
        munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

enum { HUGE_PAGE = 2 << 20, HUGE_MIN = 1 << 20 };

/* A zeroed private anonymous read-write mapping of len bytes (a multiple of the page size) at an
 * address that is `phase` past a 2 MiB boundary, marked for transparent huge pages: one page
 * more is mapped, then trimmed on both sides. MAP_FAILED (errno set) when out of memory. */
static void *map_huge(size_t len, uintptr_t phase)
{
    uint8_t *raw =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return MAP_FAILED;
    uint8_t *p = raw + (phase + HUGE_PAGE - (uintptr_t)raw % HUGE_PAGE) % HUGE_PAGE;
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + len + HUGE_PAGE > p + len)
        munmap(p + len, (size_t)(raw + len + HUGE_PAGE - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advice only: without it the pages are small */
#endif
    return p;
}

int td_mmap_to_anon(td_mmap_t *m)
{
    if (!m->len)
        return 0;
    size_t len = TD_ALIGN_UP(m->len, (size_t)sysconf(_SC_PAGESIZE));
    /* at the mapping's offset within a huge page, so that the pages move to its address whole */
    uint8_t *p = map_huge(len, (uintptr_t)m->data % HUGE_PAGE);
    if (p == MAP_FAILED)
        return td_err_set(TD_ENOMEM, "copying a %zu-byte mapping: %s", m->len, strerror(errno));
    memcpy(p, m->data, m->len);
    void *at = MAP_FAILED;
    if (mprotect(p, len, PROT_READ) == 0)
        at = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)m->data);
    if (at == MAP_FAILED) {
        int e = errno;
        munmap(p, len);
        return td_err_set(TD_EIO, "moving a %zu-byte copy over its mapping: %s", m->len,
                          strerror(e));
    }
    return 0;
}

uint64_t td_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double td_now_s(void)
{
    return (double)td_now_ns() / 1e9;
}

uint64_t td_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *td_calloc(size_t n, size_t size)
{
    return calloc(n, size);
}

void *td_huge_calloc(size_t n, size_t size)
{
    if (size && n > (SIZE_MAX - 2 * HUGE_PAGE) / size)
        return NULL;
    if (n * size < HUGE_MIN) /* not worth a page of its own */
        return calloc(n, size);
    uint8_t *p = map_huge(TD_ALIGN_UP(TD_MAX(n * size, 1), (size_t)HUGE_PAGE), 0);
    return p == MAP_FAILED ? NULL : p;
}

void td_huge_free(void *p, size_t bytes)
{
    if (p && bytes < HUGE_MIN)
        free(p);
    else if (p)
        munmap(p, TD_ALIGN_UP(TD_MAX(bytes, 1), (size_t)HUGE_PAGE));
}

void *td_reallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return realloc(p, n * size);
}

char *td_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

char *td_strndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

bool td_str_eq(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

bool td_str_startswith(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool td_str_endswith(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

int td_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return TD_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno == ERANGE)
        return TD_ERANGE;
    if (*end != '\0' || end == s)
        return TD_EINVAL;
    *out = v;
    return 0;
}

int td_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return TD_EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno == ERANGE)
        return TD_ERANGE;
    if (*end != '\0' || end == s)
        return TD_EINVAL;
    *out = v;
    return 0;
}

int td_parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return TD_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE)
        return TD_ERANGE;
    if (*end != '\0' || end == s || isnan(v))
        return TD_EINVAL;
    *out = v;
    return 0;
}

int td_parse_bool(const char *s, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    if (!s)
        return TD_EINVAL;
    for (size_t i = 0; i < TD_ARRAY_LEN(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return TD_EINVAL;
}

int td_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return TD_EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return TD_ERANGE;
    if (end == s)
        return TD_EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default:
        return TD_EINVAL;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return TD_EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return TD_ERANGE;
    *out = (uint64_t)v << shift;
    return 0;
}

size_t td_utf8_valid_len(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0) {
        return (n >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c < 0xF0) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && p[1] < 0xA0)
            return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0)
            return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90)
            return 0;
        if (c == 0xF4 && p[1] >= 0x90)
            return 0;
        return 4;
    }
    return 0;
}

uint32_t td_utf8_decode(const uint8_t *p, size_t len)
{
    switch (len) {
    case 1:
        return p[0];
    case 2:
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
        return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
               ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    }
}

size_t td_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t td_utf8_complete_prefix(const uint8_t *p, size_t n)
{
    /* Walk back over at most 3 continuation bytes to the last lead byte. */
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && (p[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return back ? n : 0; /* only continuation bytes: nothing can complete them */
    uint8_t c = p[i - 1];
    size_t need;
    if (c < 0x80)
        return n;
    else if (c >= 0xF0 && c < 0xF5)
        need = 4;
    else if (c >= 0xE0)
        need = c < 0xF0 ? 3 : 1;
    else if (c >= 0xC2)
        need = 2;
    else
        need = 1; /* invalid lead: it will never complete, emit it */
    if (back + 1 >= need)
        return n;
    return i - 1;
}

void td_hex_encode(const uint8_t *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = '\0';
}

char *td_path_basename(const char *path, char *out, size_t n)
{
    size_t l = strlen(path);
    while (l > 1 && path[l - 1] == '/')
        l--;
    size_t b = l;
    while (b > 0 && path[b - 1] != '/')
        b--;
    if (b == l && l > 0) /* only slashes: "/" */
        b = l - 1;
    snprintf(out, n, "%.*s", (int)(l - b), path + b);
    return out;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int td_hex_decode(const char *s, size_t len, uint8_t *out)
{
    if (len % 2)
        return TD_EINVAL;
    for (size_t i = 0; i < len; i += 2) {
        int hi = hex_digit(s[i]), lo = hex_digit(s[i + 1]);
        if (hi < 0 || lo < 0)
            return TD_EINVAL;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* td_util.h: small utilities every tandem component uses: growable byte buffers, whole-file
 * reads and read-only mmaps, monotonic time, checked allocation and string helpers. */
#ifndef TD_UTIL_H
#define TD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TD_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TD_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((a)-1))

/* A growable byte buffer. `data` is always NUL-terminated past `len` (when cap > 0), so a buffer
 * holding text can be passed as a C string. The buffer owns `data`; td_buf_free releases it. */
typedef struct td_buf {
    char *data;
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated, including room for the terminating NUL */
} td_buf_t;

void td_buf_init(td_buf_t *b);
void td_buf_free(td_buf_t *b);
void td_buf_reset(td_buf_t *b); /* len = 0, keeps the allocation */
/* Make room for `extra` more bytes. 0 or TD_ENOMEM / TD_EOVERFLOW. */
int td_buf_reserve(td_buf_t *b, size_t extra);
int td_buf_append(td_buf_t *b, const void *p, size_t n);
int td_buf_append_str(td_buf_t *b, const char *s);
int td_buf_append_char(td_buf_t *b, char c);
/* v in decimal (what "%" PRId64 writes), without printf's cost on hot paths. */
int td_buf_append_i64(td_buf_t *b, int64_t v);
int td_buf_printf(td_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append `s` (n bytes of UTF-8) as a JSON string literal, quotes included: '"', '\\' and control
 * characters are escaped, everything else is copied as is. */
int td_buf_append_json_string(td_buf_t *b, const char *s, size_t n);
/* Take ownership of the data (caller frees with free()); leaves `b` empty. */
char *td_buf_steal(td_buf_t *b, size_t *len);

/* Read a whole file into a new NUL-terminated buffer the caller frees. On error, td_err_msg names
 * the file. */
int td_file_read_all(const char *path, char **out, size_t *len);
/* Write a file atomically (temporary file in the same directory, fsync, rename). */
int td_file_write_atomic(const char *path, const void *data, size_t len);

/* A read-only memory map of a whole file. */
typedef struct td_mmap {
    const uint8_t *data;
    size_t len;
} td_mmap_t;
int td_mmap_open(td_mmap_t *m, const char *path);
/* Replace the file mapping by a private anonymous copy at the same address (read-only, so every
 * pointer into it stays valid), asking for transparent huge pages (MADV_HUGEPAGE: 2 MiB pages
 * where the address is 2 MiB-aligned, as the kernel maps large files). The copy is not shared
 * with other processes mapping the file and is not written back. Call it while nothing reads the
 * mapping from another thread. 0 (also for an empty file) or TD_ENOMEM / TD_EIO; on error the
 * file mapping is left as it was. */
int td_mmap_to_anon(td_mmap_t *m);
void td_mmap_close(td_mmap_t *m);

/* Monotonic clock. */
uint64_t td_now_ns(void);
double td_now_s(void);
/* Wall-clock time in nanoseconds since the Unix epoch. */
uint64_t td_wall_ns(void);

/* Allocation that aborts on failure is not offered: callers handle TD_ENOMEM. These return NULL
 * when n * size overflows. */
void *td_calloc(size_t n, size_t size);
void *td_reallocarray(void *p, size_t n, size_t size);
/* Zeroed memory for a large table read at random (a tokenizer's hash tables): from 1 MiB up,
 * mapped on its own, aligned to and rounded up to 2 MiB and marked for transparent huge pages, so
 * its lookups do not each miss the TLB (smaller: calloc). NULL when out of memory or n * size
 * overflows; td_huge_free(p, n * size), with the same size, gives it back (NULL is a no-op). */
void *td_huge_calloc(size_t n, size_t size);
void td_huge_free(void *p, size_t bytes);
char *td_strdup(const char *s);
char *td_strndup(const char *s, size_t n);

/* String helpers. */
bool td_str_eq(const char *a, const char *b); /* NULL-safe */
/* The last component of `path`, trailing '/' ignored ("/m/llama/" -> "llama"), into out[n]
 * (truncated to fit). Returns out. */
char *td_path_basename(const char *path, char *out, size_t n);
bool td_str_startswith(const char *s, const char *prefix);
bool td_str_endswith(const char *s, const char *suffix);
/* Parse integers and booleans strictly (whole string, no trailing garbage). 0 or TD_EINVAL /
 * TD_ERANGE. Booleans accept 1/0, true/false, yes/no, on/off. */
int td_parse_i64(const char *s, int64_t *out);
int td_parse_u64(const char *s, uint64_t *out);
int td_parse_double(const char *s, double *out);
int td_parse_bool(const char *s, bool *out);
/* Parse a size with an optional K/M/G/T suffix (powers of 1024), e.g. "64M". */
int td_parse_size(const char *s, uint64_t *out);

/* UTF-8: length of the valid sequence starting at p (1..4), or 0 when invalid/truncated. */
size_t td_utf8_valid_len(const uint8_t *p, size_t n);
/* Decode one code point from a valid sequence of `len` bytes. */
uint32_t td_utf8_decode(const uint8_t *p, size_t len);
/* Encode a code point; returns bytes written (1..4). `out` must hold 4 bytes. */
size_t td_utf8_encode(uint32_t cp, char *out);
/* Length of the longest prefix of [p, p+n) that ends on a complete UTF-8 sequence. */
size_t td_utf8_complete_prefix(const uint8_t *p, size_t n);

/* Hex encode `n` bytes into `out` (2n+1 bytes with NUL). */
void td_hex_encode(const uint8_t *p, size_t n, char *out);
/* Decode `len` hex digits (either case; len even) of s into out[len / 2]. 0, or TD_EINVAL on an
 * odd length or a character that is not a hex digit (out is then unspecified). */
int td_hex_decode(const char *s, size_t len, uint8_t *out);

#endif

/* sse.c: scanning OpenAI response chunks without allocating. A chunk arrives per token, so this is
 * the client's hot path: one validating pass over the JSON that picks out the few fields a
 * benchmark needs (whether `choices` is non-empty, the text of choices[0], usage.completion_tokens)
 * instead of building a document tree. Anything that is not one well-formed JSON object is an
 * error, as json.loads would raise in vLLM's client. */
#include "bench.h"
#include "td_error.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 64 };

/* What a value is, for the fields we capture. */
typedef enum path {
    P_NONE,
    P_ROOT,
    P_CHOICES,
    P_CHOICE0,
    P_DELTA, /* choices[0].delta or choices[0].message */
    P_USAGE,
    P_TEXT,    /* capture a string */
    P_NTOK,    /* capture usage.completion_tokens */
    P_SRVTTFT, /* capture srv_ttft_us */
    P_SRVRECV, /* capture srv_recv_ns */
    P_SRVSEND  /* capture srv_send_ns */
} path_t;

typedef struct scan {
    const char *p, *end, *start;
    int depth;
    td_bench_chunk_t *out;
} scan_t;

static int fail(scan_t *s, const char *what)
{
    return td_err_set(TD_EPARSE, "malformed JSON chunk at byte %zu: %s", (size_t)(s->p - s->start),
                      what);
}

static void ws(scan_t *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* At '"'. Sets [*b, *e) to the raw contents. */
static int string(scan_t *s, const char **b, const char **e)
{
    s->p++;
    *b = s->p;
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        if (c == '"') {
            *e = s->p++;
            return 0;
        }
        if (c < 0x20)
            return fail(s, "control character in string");
        if (c == '\\') {
            if (s->p + 1 >= s->end)
                return fail(s, "truncated escape");
            char x = s->p[1];
            if (x == 'u') {
                if (s->end - s->p < 6 || !is_hex(s->p[2]) || !is_hex(s->p[3]) || !is_hex(s->p[4]) ||
                    !is_hex(s->p[5]))
                    return fail(s, "bad \\u escape");
                s->p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", x) || x == 0)
                return fail(s, "bad escape");
            s->p += 2;
            continue;
        }
        s->p++;
    }
    return fail(s, "unterminated string");
}

static int number(scan_t *s, int64_t *iv, bool *is_int)
{
    const char *b = s->p;
    bool integer = true;
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p >= s->end)
        return fail(s, "bad number");
    if (*s->p == '0') {
        s->p++;
    } else if (*s->p >= '1' && *s->p <= '9') {
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    } else {
        return fail(s, "bad number");
    }
    if (s->p < s->end && *s->p == '.') {
        integer = false;
        s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9')
            return fail(s, "bad fraction");
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        integer = false;
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9')
            return fail(s, "bad exponent");
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    }
    *is_int = integer && (s->p - b) < 19;
    if (*is_int) {
        int64_t v = 0;
        bool neg = *b == '-';
        for (const char *q = b + neg; q < s->p; q++)
            v = v * 10 + (*q - '0');
        *iv = neg ? -v : v;
    }
    return 0;
}

static int literal(scan_t *s, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0)
        return fail(s, "unexpected character");
    s->p += n;
    return 0;
}

static int value(scan_t *s, path_t path);

static path_t key_path(path_t obj, const char *k, size_t n)
{
#define KEY(lit) (n == sizeof(lit) - 1 && memcmp(k, lit, n) == 0)
    switch (obj) {
    case P_ROOT:
        if (KEY("choices"))
            return P_CHOICES;
        if (KEY("usage"))
            return P_USAGE;
        if (KEY("srv_ttft_us"))
            return P_SRVTTFT;
        if (KEY("srv_recv_ns"))
            return P_SRVRECV;
        if (KEY("srv_send_ns"))
            return P_SRVSEND;
        return P_NONE;
    case P_CHOICE0:
        if (KEY("text"))
            return P_TEXT;
        if (KEY("delta") || KEY("message"))
            return P_DELTA;
        return P_NONE;
    case P_DELTA:
        return KEY("content") ? P_TEXT : P_NONE;
    case P_USAGE:
        return KEY("completion_tokens") ? P_NTOK : P_NONE;
    default:
        return P_NONE;
    }
#undef KEY
}

static int object(scan_t *s, path_t path)
{
    s->p++; /* '{' */
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        ws(s);
        if (s->p >= s->end || *s->p != '"')
            return fail(s, "expected a key");
        const char *kb, *ke;
        int rc = string(s, &kb, &ke);
        if (rc)
            return rc;
        ws(s);
        if (s->p >= s->end || *s->p != ':')
            return fail(s, "expected ':'");
        s->p++;
        rc = value(s, key_path(path, kb, (size_t)(ke - kb)));
        if (rc)
            return rc;
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        }
        return fail(s, "expected ',' or '}'");
    }
}

static int array(scan_t *s, path_t path)
{
    s->p++; /* '[' */
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return 0;
    }
    for (size_t i = 0;; i++) {
        if (path == P_CHOICES)
            s->out->has_choices = true;
        int rc = value(s, path == P_CHOICES && i == 0 ? P_CHOICE0 : P_NONE);
        if (rc)
            return rc;
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 0;
        }
        return fail(s, "expected ',' or ']'");
    }
}

static int value(scan_t *s, path_t path)
{
    ws(s);
    if (s->p >= s->end)
        return fail(s, "truncated");
    int rc;
    switch (*s->p) {
    case '{':
        if (++s->depth > MAX_DEPTH)
            return fail(s, "nested too deeply");
        rc = object(s, path == P_ROOT || path == P_CHOICE0 || path == P_DELTA || path == P_USAGE
                           ? path
                           : P_NONE);
        s->depth--;
        return rc;
    case '[':
        if (++s->depth > MAX_DEPTH)
            return fail(s, "nested too deeply");
        rc = array(s, path == P_CHOICES ? path : P_NONE);
        s->depth--;
        return rc;
    case '"': {
        const char *b, *e;
        rc = string(s, &b, &e);
        if (rc == 0 && path == P_TEXT) {
            s->out->text = b;
            s->out->text_len = (size_t)(e - b);
        }
        return rc;
    }
    case 't':
        return literal(s, "true");
    case 'f':
        return literal(s, "false");
    case 'n':
        return literal(s, "null");
    default: {
        int64_t v = 0;
        bool is_int = false;
        rc = number(s, &v, &is_int);
        if (rc == 0 && is_int && path == P_NTOK)
            s->out->completion_tokens = v;
        if (rc == 0 && is_int && path == P_SRVTTFT)
            s->out->srv_ttft_us = v;
        if (rc == 0 && is_int && path == P_SRVRECV)
            s->out->srv_recv_ns = v;
        if (rc == 0 && is_int && path == P_SRVSEND)
            s->out->srv_send_ns = v;
        return rc;
    }
    }
}

int td_bench_chunk_scan(const char *json, size_t len, td_bench_chunk_t *out)
{
    *out = (td_bench_chunk_t){false, NULL, 0, -1, -1, -1, -1};
    scan_t s = {json, json + len, json, 0, out};
    ws(&s);
    if (s.p >= s.end || *s.p != '{')
        return fail(&s, "not a JSON object");
    int rc = value(&s, P_ROOT);
    if (rc)
        return rc;
    ws(&s);
    if (s.p != s.end)
        return fail(&s, "trailing data");
    return 0;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v = v * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

int td_bench_json_unescape(const char *s, size_t n, td_buf_t *out)
{
    int rc = td_buf_reserve(out, n);
    if (rc)
        return rc;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != '\\')
            j++;
        if (j > i && (rc = td_buf_append(out, s + i, j - i)))
            return rc;
        if (j >= n)
            break;
        if (j + 1 >= n)
            return td_err_set(TD_EPARSE, "truncated escape");
        char x = s[j + 1];
        char c;
        switch (x) {
        case 'n':
            c = '\n';
            break;
        case 't':
            c = '\t';
            break;
        case 'r':
            c = '\r';
            break;
        case 'b':
            c = '\b';
            break;
        case 'f':
            c = '\f';
            break;
        case '/':
            c = '/';
            break;
        case '\\':
            c = '\\';
            break;
        case '"':
            c = '"';
            break;
        case 'u': {
            if (j + 6 > n)
                return td_err_set(TD_EPARSE, "truncated \\u escape");
            uint32_t cp = (uint32_t)hex4(s + j + 2);
            i = j + 6;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u') {
                uint32_t lo = (uint32_t)hex4(s + i + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD; /* lone surrogate, as Python's json would keep it; not valid UTF-8 */
            char u[4];
            size_t k = td_utf8_encode(cp, u);
            if ((rc = td_buf_append(out, u, k)))
                return rc;
            continue;
        }
        default:
            return td_err_set(TD_EPARSE, "bad escape");
        }
        if ((rc = td_buf_append_char(out, c)))
            return rc;
        i = j + 2;
    }
    return 0;
}

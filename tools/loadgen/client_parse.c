/* client_parse.c: the load generator's HTTP/1.1 response parser (status line, headers,
 * Content-Length, chunked and read-to-close bodies, SSE lines) and the per-request results it
 * fills in. Lines are parsed in place when they do not straddle reads; chunks are scanned
 * without building JSON trees. */
#include "client_impl.h"
#include "td_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *td_bench_err_name(td_bench_err_t e)
{
    switch (e) {
    case TD_BENCH_OK:
        return "ok";
    case TD_BENCH_ERR_CONNECT:
        return "connect";
    case TD_BENCH_ERR_HTTP:
        return "http";
    case TD_BENCH_ERR_STREAM:
        return "stream";
    case TD_BENCH_ERR_TIMEOUT:
        return "timeout";
    default:
        return "?";
    }
}

void td_bench_result_init(td_bench_result_t *r)
{
    memset(r, 0, sizeof(*r));
    td_buf_init(&r->text);
    r->usage_completion_tokens = -1;
    r->srv_ttft = r->req_leg = r->resp_leg = -1;
}

void td_bench_result_free(td_bench_result_t *r)
{
    free(r->error);
    free(r->itl);
    td_buf_free(&r->text);
    r->error = NULL;
    r->itl = NULL;
}

void td_bench_result_fail(td_bench_result_t *r, td_bench_err_t kind, const char *fmt, ...)
{
    if (r->err != TD_BENCH_OK)
        return;
    r->err = kind;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    r->error = td_strdup(msg);
}

int td_bench_result_add_itl(td_bench_result_t *r, double v)
{
    if (r->n_itl == r->cap_itl) {
        size_t cap = r->cap_itl ? r->cap_itl * 2 : 64;
        double *p = td_reallocarray(r->itl, cap, sizeof(double));
        if (!p)
            return TD_ENOMEM;
        r->itl = p;
        r->cap_itl = cap;
    }
    r->itl[r->n_itl++] = v;
    return 0;
}

/* ---- response parsing ---- */

void td__bench_complete(conn_t *c, uint64_t now)
{
    td_bench_result_t *r = c->r;
    r->http_status = c->status;
    if (c->status != 200) {
        size_t n = c->body.len;
        while (n > 0 && (c->body.data[n - 1] == '\n' || c->body.data[n - 1] == '\r'))
            n--;
        td_bench_result_fail(r, TD_BENCH_ERR_HTTP, "HTTP %d: %.*s", c->status, (int)n,
                             n ? c->body.data : "");
        td__bench_finish(c, true);
        return;
    }
    if (!c->stream) {
        td_bench_chunk_t ch;
        if (td_bench_chunk_scan(c->body.data ? c->body.data : "", c->body.len, &ch) != 0) {
            td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "response body: %s", td_err_msg());
            td__bench_finish(c, true);
            return;
        }
        if (!ch.has_choices) {
            td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "response body has no choices");
            td__bench_finish(c, true);
            return;
        }
        if (ch.text && td_bench_json_unescape(ch.text, ch.text_len, &r->text) != 0) {
            td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "response text: %s", td_err_msg());
            td__bench_finish(c, true);
            return;
        }
        r->usage_completion_tokens = ch.completion_tokens;
        r->ttft = r->latency = (double)(now - c->send_ns) * 1e-9;
        r->n_chunks = 1;
        td__bench_finish(c, true);
        return;
    }
    if (!c->first) {
        td_bench_result_fail(r, TD_BENCH_ERR_STREAM,
                             "never received a chunk with choices to calculate TTFT");
        td__bench_finish(c, true);
        return;
    }
    r->latency = (double)(c->last_ns - c->send_ns) * 1e-9;
    td__bench_finish(c, true);
}

/* One SSE line (no newline). Returns false when the request failed (c->r is gone). */
static bool sse_line(conn_t *c, const char *p, size_t n, uint64_t now)
{
    if (n > 0 && p[n - 1] == '\r')
        n--;
    if (n < 5 || memcmp(p, "data:", 5) != 0)
        return true; /* blank line (event end), comment, or a field vLLM's client never uses */
    p += 5;
    n -= 5;
    if (n > 0 && *p == ' ') {
        p++;
        n--;
    }
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0)
        return true;
    td_bench_chunk_t ch;
    td_bench_result_t *r = c->r;
    if (td_bench_chunk_scan(p, n, &ch) != 0) {
        td__bench_fail(c, TD_BENCH_ERR_STREAM, "SSE data: %s", td_err_msg());
        return false;
    }
    if (ch.has_choices) {
        if (!c->first) {
            c->first = true;
            r->ttft = (double)(now - c->send_ns) * 1e-9;
        } else if (td_bench_result_add_itl(r, (double)(now - c->last_ns) * 1e-9) != 0) {
            td__bench_fail(c, TD_BENCH_ERR_STREAM, "out of memory");
            return false;
        }
        c->last_ns = now;
        r->n_chunks++;
        if (ch.text && td_bench_json_unescape(ch.text, ch.text_len, &r->text) != 0) {
            td__bench_fail(c, TD_BENCH_ERR_STREAM, "SSE text: %s", td_err_msg());
            return false;
        }
    } else if (c->chat && c->first) {
        c->last_ns = now; /* vLLM's chat client moves the end time on every chunk */
    }
    if (ch.completion_tokens >= 0)
        r->usage_completion_tokens = ch.completion_tokens;
    if (ch.srv_ttft_us >= 0 && r->srv_ttft < 0)
        r->srv_ttft = (double)ch.srv_ttft_us * 1e-6;
    if (ch.srv_send_ns > 0 && ch.srv_recv_ns > 0 && r->resp_leg < 0) {
        r->resp_leg = ((double)now - (double)ch.srv_send_ns) * 1e-9;
        r->req_leg = ((double)ch.srv_recv_ns - (double)c->send_ns) * 1e-9;
    }
    return true;
}

/* Body bytes (after de-chunking). false when the request failed. */
static bool body_bytes(conn_t *c, const char *p, size_t n, uint64_t now)
{
    if (c->status != 200) {
        if (c->body.len < MAX_ERR_BODY)
            td_buf_append(&c->body, p, TD_MIN(n, MAX_ERR_BODY - c->body.len));
        return true;
    }
    if (!c->stream) {
        if (c->body.len + n > MAX_BODY) {
            td__bench_fail(c, TD_BENCH_ERR_STREAM, "response body over %d bytes", MAX_BODY);
            return false;
        }
        if (td_buf_append(&c->body, p, n) != 0) {
            td__bench_fail(c, TD_BENCH_ERR_STREAM, "out of memory");
            return false;
        }
        return true;
    }
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        if (!nl) {
            if (c->sse.len + n > MAX_LINE) {
                td__bench_fail(c, TD_BENCH_ERR_STREAM, "SSE line over %d bytes", MAX_LINE);
                return false;
            }
            td_buf_append(&c->sse, p, n);
            return true;
        }
        size_t k = (size_t)(nl - p);
        bool ok;
        if (c->sse.len) {
            td_buf_append(&c->sse, p, k);
            ok = sse_line(c, c->sse.data, c->sse.len, now);
            td_buf_reset(&c->sse);
        } else {
            ok = sse_line(c, p, k, now);
        }
        if (!ok)
            return false;
        p += k + 1;
        n -= k + 1;
    }
    return true;
}

/* Collect a CRLF-terminated line. Returns 1 with [*lp, *ln) set when complete, 0 when more bytes
 * are needed (everything consumed), -1 on overflow. *used gets the bytes consumed. */
static int take_line(conn_t *c, const char *p, size_t n, const char **lp, size_t *ln, size_t *used)
{
    const char *nl = memchr(p, '\n', n);
    if (!nl) {
        if (c->line.len + n > MAX_LINE)
            return -1;
        td_buf_append(&c->line, p, n);
        *used = n;
        return 0;
    }
    size_t k = (size_t)(nl - p);
    *used = k + 1;
    if (c->line.len) {
        if (c->line.len + k > MAX_LINE)
            return -1;
        td_buf_append(&c->line, p, k);
        *lp = c->line.data;
        *ln = c->line.len;
    } else {
        *lp = p;
        *ln = k;
    }
    if (*ln > 0 && (*lp)[*ln - 1] == '\r')
        (*ln)--;
    return 1;
}

static bool header_is(const char *p, size_t n, const char *name, const char **val, size_t *vlen)
{
    size_t k = strlen(name);
    if (n <= k || strncasecmp(p, name, k) != 0 || p[k] != ':')
        return false;
    p += k + 1;
    n -= k + 1;
    while (n && (*p == ' ' || *p == '\t')) {
        p++;
        n--;
    }
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    *val = p;
    *vlen = n;
    return true;
}

static bool contains_token(const char *v, size_t n, const char *tok)
{
    size_t k = strlen(tok);
    for (size_t i = 0; i + k <= n; i++)
        if (strncasecmp(v + i, tok, k) == 0)
            return true;
    return false;
}

/* Parse [p, p+n) for the request on c; stops when the request is over (completed or failed). */
void td__bench_parse(conn_t *c, const char *p, size_t n, uint64_t now)
{
    while (n > 0 && c->r) {
        const char *lp = NULL;
        size_t ln = 0, used = 0;
        int got;
        switch (c->st) {
        case S_STATUS:
        case S_HEADERS:
        case S_CHUNK_SIZE:
        case S_TRAILER:
            got = take_line(c, p, n, &lp, &ln, &used);
            p += used;
            n -= used;
            if (got < 0) {
                td__bench_fail(c, TD_BENCH_ERR_STREAM, "HTTP line over %d bytes", MAX_LINE);
                return;
            }
            if (got == 0)
                return;
            if (c->st == S_STATUS) {
                int minor = ln >= 12 ? lp[7] - '0' : -1, status = 0;
                for (size_t i = 9; i < 12 && ln >= 12; i++)
                    status = lp[i] >= '0' && lp[i] <= '9' ? status * 10 + (lp[i] - '0') : -1000;
                if (ln < 12 || memcmp(lp, "HTTP/1.", 7) != 0 || minor < 0 || minor > 9 ||
                    lp[8] != ' ' || status < 100 || (ln > 12 && lp[12] != ' ')) {
                    td_buf_reset(&c->line);
                    td__bench_fail(c, TD_BENCH_ERR_STREAM, "malformed HTTP status line");
                    return;
                }
                c->status = status;
                c->keepalive = minor >= 1;
                c->st = S_HEADERS;
            } else if (c->st == S_HEADERS) {
                const char *v;
                size_t vn;
                if (ln == 0) {
                    if (c->status >= 100 && c->status < 200) { /* 1xx: another status follows */
                        c->st = S_STATUS;
                    } else if (c->chunked) {
                        c->st = S_CHUNK_SIZE;
                    } else if (c->has_len) {
                        c->st = S_BODY_CL;
                        if (c->remain == 0) {
                            td_buf_reset(&c->line);
                            td__bench_complete(c, now);
                            return;
                        }
                    } else {
                        c->st = S_BODY_EOF;
                        c->keepalive = false;
                    }
                } else if (header_is(lp, ln, "content-length", &v, &vn)) {
                    char tmp[24];
                    int64_t len;
                    if (vn == 0 || vn >= sizeof(tmp) ||
                        (memcpy(tmp, v, vn), tmp[vn] = 0, td_parse_i64(tmp, &len)) != 0 ||
                        len < 0) {
                        td_buf_reset(&c->line);
                        td__bench_fail(c, TD_BENCH_ERR_STREAM, "bad Content-Length");
                        return;
                    }
                    c->has_len = true;
                    c->remain = len;
                } else if (header_is(lp, ln, "transfer-encoding", &v, &vn)) {
                    c->chunked = contains_token(v, vn, "chunked");
                } else if (header_is(lp, ln, "connection", &v, &vn)) {
                    if (contains_token(v, vn, "close"))
                        c->keepalive = false;
                    else if (contains_token(v, vn, "keep-alive"))
                        c->keepalive = true;
                } else if (memchr(lp, ':', ln) == NULL) {
                    td_buf_reset(&c->line);
                    td__bench_fail(c, TD_BENCH_ERR_STREAM, "malformed HTTP header line");
                    return;
                }
            } else if (c->st == S_CHUNK_SIZE) {
                uint64_t size = 0;
                size_t i = 0;
                for (; i < ln && i < 16; i++) {
                    char h = lp[i];
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0)
                        break;
                    size = size * 16 + (uint64_t)d;
                }
                if (i == 0 || (i < ln && lp[i] != ';' && lp[i] != ' ' && lp[i] != '\t') ||
                    size > (1ULL << 40)) {
                    td_buf_reset(&c->line);
                    td__bench_fail(c, TD_BENCH_ERR_STREAM, "malformed chunk size");
                    return;
                }
                c->remain = (int64_t)size;
                c->st = size ? S_CHUNK_DATA : S_TRAILER;
            } else { /* S_TRAILER */
                if (ln == 0) {
                    td_buf_reset(&c->line);
                    td__bench_complete(c, now);
                    return;
                }
            }
            td_buf_reset(&c->line);
            break;
        case S_BODY_CL:
        case S_CHUNK_DATA: {
            size_t k = (size_t)TD_MIN((int64_t)n, c->remain);
            if (!body_bytes(c, p, k, now))
                return;
            p += k;
            n -= k;
            c->remain -= (int64_t)k;
            if (c->remain == 0) {
                if (c->st == S_BODY_CL) {
                    td__bench_complete(c, now);
                    return;
                }
                c->st = S_CHUNK_CRLF;
                c->remain = 2;
            }
            break;
        }
        case S_CHUNK_CRLF:
            while (n > 0 && c->remain > 0) {
                char want = c->remain == 2 ? '\r' : '\n';
                if (*p != want) {
                    if (c->remain == 2 && *p == '\n') { /* tolerate a bare LF */
                        c->remain = 0;
                        p++;
                        n--;
                        break;
                    }
                    td__bench_fail(c, TD_BENCH_ERR_STREAM, "missing CRLF after chunk data");
                    return;
                }
                p++;
                n--;
                c->remain--;
            }
            if (c->remain == 0)
                c->st = S_CHUNK_SIZE;
            break;
        case S_BODY_EOF:
            if (!body_bytes(c, p, n, now))
                return;
            return;
        }
    }
    if (n > 0 && !c->r && !c->closing) {
        /* bytes after a complete response that nobody asked for: the connection is unusable */
        td__bench_conn_close(c);
    }
}

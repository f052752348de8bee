/* http_parse.c: the HTTP server's requests (td_http.h): request heads parsed by picohttpparser,
 * which libh2o exports; how the body comes (Content-Length, chunked decoded in place behind the
 * head, Expect: 100-continue), framing that cannot be trusted refused; the request's bytes moved to
 * its own buffer and handed to its route; the accessors handlers read them with. */
#include "http_impl.h"
#include "td_error.h"

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>

/* picohttpparser, exported by libh2o (libh2o-dev ships no header for it; its chunked decoder
 * state is in http_impl.h, inside the connection). */
struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len,
                      const char **path, size_t *path_len, int *minor_version,
                      struct phr_header *headers, size_t *num_headers, size_t last_len);
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

/* ---- requests ----------------------------------------------------------------------------- */

static const char *at(const td_http_req_t *r, span_t s)
{
    return r->raw.data + s.off;
}

const char *td_http_method(const td_http_req_t *r, size_t *len)
{
    *len = r->method.len;
    return at(r, r->method);
}

bool td_http_method_is(const td_http_req_t *r, const char *method)
{
    return r->method.len == strlen(method) && memcmp(at(r, r->method), method, r->method.len) == 0;
}

const char *td_http_path(const td_http_req_t *r, size_t *len)
{
    *len = r->path.len;
    return at(r, r->path);
}

const char *td_http_query(const td_http_req_t *r, size_t *len)
{
    if (!r->has_query) {
        *len = 0;
        return NULL;
    }
    *len = r->query.len;
    return at(r, r->query);
}

const char *td_http_body(const td_http_req_t *r, size_t *len)
{
    *len = r->body_len;
    return r->body_len ? r->raw.data + r->body_off : "";
}

const char *td_http_header(const td_http_req_t *r, const char *name, size_t *len)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < r->nh; i++)
        if (r->hname[i].len == n && strncasecmp(at(r, r->hname[i]), name, n) == 0) {
            *len = r->hval[i].len;
            return at(r, r->hval[i]);
        }
    return NULL;
}

void td_http_peer(const td_http_req_t *r, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    char host[64] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&r->c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
            uv_ip4_name(sin, host, sizeof(host));
            port = ntohs(sin->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(sin6, host, sizeof(host));
            port = ntohs(sin6->sin6_port);
        }
    }
    snprintf(out, n, "%s:%d", host, port);
}

/* ---- parsing ------------------------------------------------------------------------------ */

static bool token_has(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t j = i;
        while (j < n && v[j] != ',')
            j++;
        size_t e = j;
        while (e > i && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - i == tl && strncasecmp(v + i, tok, tl) == 0)
            return true;
        i = j;
    }
    return false;
}

static bool span_is(const char *base, span_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && strncasecmp(base + s.off, lit, n) == 0;
}

/* Move the request's bytes [0, total) from `in` to req.raw and hand the request to its route.
 * Both buffers keep their storage from request to request (a burst's is released). */
static void dispatch(conn_t *c, size_t total)
{
    td_http_req_t *r = &c->req;
    if (r->raw.cap > KEEP_CAP)
        td_buf_free(&r->raw);
    td_buf_reset(&r->raw);
    if (td_buf_append(&r->raw, c->in.data, total) != 0) {
        td__http_error_close(c, 500, NULL, "out of memory for a request of %zu bytes", total);
        return;
    }
    if (total == c->in.len) {
        td__http_buf_trim(&c->in);
    } else {
        memmove(c->in.data, c->in.data + total, c->in.len - total);
        c->in.len -= total;
        c->in.data[c->in.len] = '\0';
    }
    c->last_len = 0;
    c->state = C_HANDLING;
    r->answered = false;
    uv_timer_stop(&c->timer);
    td_http_server_t *s = c->s;
    const char *path = at(r, r->path);
    for (route_t *rt = s->routes; rt; rt = rt->next)
        if (r->path.len == rt->path_len && memcmp(path, rt->path, rt->path_len) == 0) {
            rt->fn(r, rt->ud);
            return;
        }
    td_http_respond_error(r, 404, "not_found_error", NULL, "not_found", "no route for %.*s",
                          (int)TD_MIN(r->path.len, 200), path);
}

/* The head at the front of `in` parsed (n bytes): fill the request, choose how its body comes.
 * false when it was refused (answered and closing). */
static bool head_parsed(conn_t *c, int n, const char *m, size_t ml, const char *p, size_t pl,
                        int minor, const struct phr_header *h, size_t nh)
{
    td_http_req_t *r = &c->req;
    const char *base = c->in.data;
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)p[i] < 0x21 || p[i] == 0x7f) {
            td__http_error_close(c, 400, "bad_request", "the request target holds a control byte");
            return false;
        }
    r->method = (span_t){(uint32_t)(m - base), (uint32_t)ml};
    /* absolute form (http://host/path): the path starts at the authority's end */
    size_t skip = 0;
    size_t scheme = pl >= 7 && strncasecmp(p, "http://", 7) == 0    ? 7
                    : pl >= 8 && strncasecmp(p, "https://", 8) == 0 ? 8
                                                                    : 0;
    if (scheme) {
        const char *slash = memchr(p + scheme, '/', pl - scheme);
        skip = slash ? (size_t)(slash - p) : pl;
    }
    const char *path = p + skip;
    size_t plen = pl - skip;
    const char *q = memchr(path, '?', plen);
    r->has_query = q != NULL;
    r->path = (span_t){(uint32_t)(path - base), (uint32_t)(q ? (size_t)(q - path) : plen)};
    r->query = q ? (span_t){(uint32_t)(q + 1 - base), (uint32_t)(plen - (size_t)(q - path) - 1)}
                 : (span_t){0, 0};
    r->nh = nh;
    r->http10 = minor == 0;
    r->head_only = ml == 4 && memcmp(m, "HEAD", 4) == 0;
    r->on_gone = NULL;
    r->gone_due = false;
    td_buf_reset(&r->hdrs);
    c->keep_alive = minor >= 1;
    bool expect_continue = false, chunked = false, have_len = false, te = false;
    uint64_t len = 0;
    for (size_t i = 0; i < nh; i++) {
        if (!h[i].name) { /* obsolete line folding */
            td__http_error_close(c, 400, "bad_request", "a folded header line");
            return false;
        }
        r->hname[i] = (span_t){(uint32_t)(h[i].name - base), (uint32_t)h[i].name_len};
        r->hval[i] = (span_t){(uint32_t)(h[i].value - base), (uint32_t)h[i].value_len};
        const char *v = h[i].value;
        size_t vl = h[i].value_len;
        if (span_is(base, r->hname[i], "content-length")) {
            uint64_t x = 0;
            if (!vl || vl > 19) {
                td__http_error_close(c, 400, "bad_request", "an invalid content-length");
                return false;
            }
            for (size_t k = 0; k < vl; k++) {
                if (v[k] < '0' || v[k] > '9') {
                    td__http_error_close(c, 400, "bad_request", "an invalid content-length");
                    return false;
                }
                x = x * 10 + (uint64_t)(v[k] - '0');
            }
            if (have_len && x != len) {
                td__http_error_close(c, 400, "bad_request", "two different content-length headers");
                return false;
            }
            have_len = true;
            len = x;
        } else if (span_is(base, r->hname[i], "transfer-encoding")) {
            te = true;
            chunked = vl >= 7 && strncasecmp(v + vl - 7, "chunked", 7) == 0 &&
                      (vl == 7 || v[vl - 8] == ' ' || v[vl - 8] == ',' || v[vl - 8] == '\t');
        } else if (span_is(base, r->hname[i], "connection")) {
            if (token_has(v, vl, "close"))
                c->keep_alive = false;
            else if (minor == 0 && token_has(v, vl, "keep-alive"))
                c->keep_alive = true;
        } else if (span_is(base, r->hname[i], "expect")) {
            if (vl == 12 && strncasecmp(v, "100-continue", 12) == 0)
                expect_continue = minor >= 1;
            else {
                td__http_error_close(c, 417, NULL, "unsupported expectation");
                return false;
            }
        }
    }
    if (te && (!chunked || have_len)) {
        td__http_error_close(c, 400, "bad_request",
                    chunked ? "both transfer-encoding and content-length"
                            : "a transfer-encoding other than chunked");
        return false;
    }
    c->head_len = (size_t)n;
    r->body_off = (size_t)n;
    r->body_len = 0;
    if (chunked) {
        c->state = C_CHUNKED;
        c->body_len = 0;
        memset(&c->dec, 0, sizeof(c->dec));
        c->dec.consume_trailer = 1;
    } else if (have_len && len) {
        if (len > c->s->max_body) {
            td__http_error_close(c, 413, "request_too_large",
                        "the request body is %llu bytes (the limit is %zu bytes)",
                        (unsigned long long)len, c->s->max_body);
            return false;
        }
        c->state = C_BODY;
        c->body_len = (size_t)len;
    } else {
        c->state = C_BODY;
        c->body_len = 0;
    }
    if (expect_continue && c->state == C_BODY && c->in.len - (size_t)n >= c->body_len)
        expect_continue = false; /* the body is here already */
    if (expect_continue)
        td_buf_append_str(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
    return true;
}

/* Parse and hand on every request `in` holds whole, while the connection is between requests. */
void td__http_process(conn_t *c)
{
    while (!c->closing && c->state != C_HANDLING && c->state != C_LINGER) {
        if (c->state == C_HEAD) {
            if (!c->in.len)
                return;
            const char *m, *p;
            size_t ml, pl, nh = HEADERS_MAX;
            int minor;
            struct phr_header h[HEADERS_MAX];
            int n = phr_parse_request(c->in.data, c->in.len, &m, &ml, &p, &pl, &minor, h, &nh,
                                      c->last_len);
            if (n == -2) {
                if (c->in.len >= HEAD_MAX) {
                    td__http_error_close(c, 431, "request_too_large",
                                "the request head is over %d bytes", HEAD_MAX);
                    return;
                }
                c->last_len = c->in.len;
                return;
            }
            if (n < 0) {
                td__http_error_close(c, 400, "bad_request",
                            "the request is not HTTP/1.x: its request line or headers do not "
                            "parse");
                return;
            }
            if (!head_parsed(c, n, m, ml, p, pl, minor, h, nh))
                return;
            td__http_timer_arm(c, REQ_TIMEOUT_MS); /* the body's bytes */
        }
        if (c->state == C_BODY) {
            if (c->in.len - c->head_len < c->body_len)
                return;
            c->req.body_len = c->body_len;
            dispatch(c, c->head_len + c->body_len);
            continue;
        }
        /* C_CHUNKED: decode what arrived, in place right behind what is decoded already */
        size_t at = c->head_len + c->body_len, sz = c->in.len - at;
        ssize_t left = phr_decode_chunked(&c->dec, c->in.data + at, &sz);
        if (left == -1) {
            td__http_error_close(c, 400, "bad_request", "the chunked request body does not parse");
            return;
        }
        c->body_len += sz; /* decoded in place: the rest (a next request's bytes) follows */
        c->in.len = at + sz + (left > 0 ? (size_t)left : 0);
        c->in.data[c->in.len] = '\0';
        if (c->body_len > c->s->max_body) {
            td__http_error_close(c, 413, "request_too_large",
                        "the chunked request body is over the limit of %zu bytes",
                        c->s->max_body);
            return;
        }
        if (left == -2)
            return;
        c->req.body_len = c->body_len;
        dispatch(c, c->head_len + c->body_len);
    }
}

/* scrape.c: the target's own view: GET /metrics before and after a run and read vLLM's (or
 * tandem's, same names under `tandem_`) TTFT / ITL / E2E histograms and token counters. Runs
 * outside the measured window, so a plain blocking socket is enough. */
#include "bench.h"
#include "td_error.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static bool ends_with(const char *s, size_t n, const char *suf)
{
    size_t k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static void hist_add(td_bench_prom_hist_t *h, double le, double v)
{
    h->found = true;
    size_t i = 0;
    while (i < h->n && h->le[i] < le)
        i++;
    if (i < h->n && h->le[i] == le) {
        h->count[i] += v;
        return;
    }
    if (h->n == TD_ARRAY_LEN(h->le))
        return;
    memmove(h->le + i + 1, h->le + i, (h->n - i) * sizeof(double));
    memmove(h->count + i + 1, h->count + i, (h->n - i) * sizeof(double));
    h->le[i] = le;
    h->count[i] = v;
    h->n++;
}

/* Which histogram a metric base name (without _bucket/_sum/_count) is. */
static td_bench_prom_hist_t *which(td_bench_scrape_t *s, const char *name, size_t n)
{
    if (ends_with(name, n, "time_to_first_token_seconds"))
        return &s->ttft;
    if (ends_with(name, n, "e2e_request_latency_seconds"))
        return &s->e2e;
    if (ends_with(name, n, "inter_token_latency_seconds"))
        return &s->itl;
    if (ends_with(name, n, "time_per_output_token_seconds"))
        return &s->tpot;
    return NULL;
}

int td_bench_scrape_parse(const char *text, size_t len, td_bench_scrape_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *line = p;
        size_t ln = (size_t)(eol - p);
        p = eol + (eol < end);
        if (ln == 0 || line[0] == '#')
            continue;
        size_t nm = 0;
        while (nm < ln && line[nm] != '{' && line[nm] != ' ')
            nm++;
        const char *labels = NULL;
        size_t lab_n = 0, i = nm;
        if (i < ln && line[i] == '{') {
            const char *close = memchr(line + i, '}', ln - i);
            if (!close)
                return td_err_set(TD_EPARSE, "/metrics: unterminated label set");
            labels = line + i + 1;
            lab_n = (size_t)(close - labels);
            i = (size_t)(close - line) + 1;
        }
        while (i < ln && line[i] == ' ')
            i++;
        char num[64];
        size_t k = 0;
        while (i < ln && line[i] != ' ' && k + 1 < sizeof(num))
            num[k++] = line[i++];
        num[k] = 0;
        char *ep;
        double v = strtod(num, &ep);
        if (k == 0 || *ep)
            return td_err_set(TD_EPARSE, "/metrics: bad sample value \"%s\"", num);
        td_bench_prom_hist_t *h;
        if (ends_with(line, nm, "_bucket") && (h = which(out, line, nm - 7))) {
            const char *le = NULL;
            for (size_t j = 0; labels && j + 4 <= lab_n; j++)
                if (memcmp(labels + j, "le=\"", 4) == 0 &&
                    (j == 0 || labels[j - 1] == ',' || labels[j - 1] == ' ')) {
                    le = labels + j + 4;
                    break;
                }
            if (!le)
                return td_err_set(TD_EPARSE, "/metrics: bucket without le");
            double b = strncmp(le, "+Inf", 4) == 0 ? INFINITY : strtod(le, NULL);
            hist_add(h, b, v);
        } else if (ends_with(line, nm, "_sum") && (h = which(out, line, nm - 4))) {
            h->sum += v;
            h->found = true;
        } else if (ends_with(line, nm, "_count") && (h = which(out, line, nm - 6))) {
            h->total += v;
            h->found = true;
        } else if (ends_with(line, nm, "prompt_tokens_total") ||
                   ends_with(line, nm, "prompt_tokens")) {
            out->prompt_tokens += v;
        } else if (ends_with(line, nm, "generation_tokens_total") ||
                   ends_with(line, nm, "generation_tokens")) {
            out->generation_tokens += v;
        }
    }
    out->ok = true;
    return 0;
}

static void hist_diff(const td_bench_prom_hist_t *a, const td_bench_prom_hist_t *b,
                      td_bench_prom_hist_t *o)
{
    *o = *b;
    o->sum = b->sum - a->sum;
    o->total = b->total - a->total;
    for (size_t i = 0; i < o->n; i++)
        for (size_t j = 0; j < a->n; j++)
            if (a->le[j] == o->le[i])
                o->count[i] -= a->count[j];
}

void td_bench_scrape_diff(const td_bench_scrape_t *before, const td_bench_scrape_t *after,
                          td_bench_scrape_t *out)
{
    *out = *after;
    hist_diff(&before->ttft, &after->ttft, &out->ttft);
    hist_diff(&before->e2e, &after->e2e, &out->e2e);
    hist_diff(&before->itl, &after->itl, &out->itl);
    hist_diff(&before->tpot, &after->tpot, &out->tpot);
    out->prompt_tokens = after->prompt_tokens - before->prompt_tokens;
    out->generation_tokens = after->generation_tokens - before->generation_tokens;
    out->ok = before->ok && after->ok;
}

double td_bench_hist_quantile(const td_bench_prom_hist_t *h, double q)
{
    if (h->n == 0)
        return NAN;
    double total = h->count[h->n - 1];
    if (!(total > 0))
        return NAN;
    double rank = q * total;
    for (size_t i = 0; i < h->n; i++) {
        if (h->count[i] >= rank) {
            if (isinf(h->le[i]))
                return i > 0 ? h->le[i - 1] : NAN; /* as Prometheus: the highest finite bound */
            double lo = i > 0 ? h->le[i - 1] : 0, clo = i > 0 ? h->count[i - 1] : 0;
            double in = h->count[i] - clo;
            return in > 0 ? lo + (h->le[i] - lo) * (rank - clo) / in : h->le[i];
        }
    }
    return NAN;
}

/* Whether `len` bytes hold a whole HTTP answer (Content-Length or the last chunk seen). */
static bool answer_complete(const char *p, size_t len)
{
    const char *hend = strstr(p, "\r\n\r\n");
    if (!hend)
        return false;
    size_t body = len - (size_t)(hend + 4 - p);
    for (const char *h = p; h < hend; h++)
        if ((*h == '\n') && strncasecmp(h + 1, "content-length:", 15) == 0)
            return body >= (size_t)strtoull(h + 16, NULL, 10);
    return len >= 5 && memcmp(p + len - 5, "0\r\n\r\n", 5) == 0 && body >= 5;
}

int td_bench_scrape_fetch(const char *host, int port, const char *api_key, td_bench_scrape_t *out)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return td_err_set(TD_EUNREACH, "/metrics: cannot resolve %s", host);
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = 0;
    td_buf_t b;
    td_buf_init(&b);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        rc = td_err_set(TD_ECONNREFUSED, "/metrics: connect to %s:%d: %s", host, port,
                        strerror(errno));
        goto out;
    }
    if ((rc = td_buf_printf(&b, "GET /metrics HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n",
                            host, port)) ||
        (api_key && (rc = td_buf_printf(&b, "Authorization: Bearer %s\r\n", api_key))) ||
        (rc = td_buf_append_str(&b, "\r\n")))
        goto out;
    if (write(fd, b.data, b.len) != (ssize_t)b.len) {
        rc = td_err_set(TD_EIO, "/metrics: write: %s", strerror(errno));
        goto out;
    }
    td_buf_reset(&b);
    uint64_t deadline = td_now_ns() + 5000000000ULL;
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        uint64_t now = td_now_ns();
        if (now >= deadline || poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1)) <= 0) {
            rc = td_err_set(TD_ETIMEDOUT, "/metrics: no complete answer in 5 s");
            goto out;
        }
        if ((rc = td_buf_reserve(&b, 65536)))
            goto out;
        ssize_t n = read(fd, b.data + b.len, 65536);
        if (n < 0) {
            rc = td_err_set(TD_EIO, "/metrics: read: %s", strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        b.len += (size_t)n;
        b.data[b.len] = 0;
        if (b.len > 256 * 1024 * 1024) {
            rc = td_err_set(TD_EOVERFLOW, "/metrics: answer too large");
            goto out;
        }
        if (answer_complete(b.data, b.len))
            break; /* servers may keep the connection open despite Connection: close */
    }
    if (!td_str_startswith(b.data ? b.data : "", "HTTP/1.") || b.len < 12 ||
        memcmp(b.data + 9, "200", 3) != 0) {
        rc = td_err_set(TD_EPROTO, "/metrics: answer is not HTTP 200");
        goto out;
    }
    const char *body = strstr(b.data, "\r\n\r\n");
    if (!body) {
        rc = td_err_set(TD_EPROTO, "/metrics: malformed HTTP answer");
        goto out;
    }
    body += 4;
    /* chunked bodies: the chunk-size lines are not sample lines; drop lines that are bare hex */
    rc = td_bench_scrape_parse(body, b.len - (size_t)(body - b.data), out);
    if (rc != 0 && strstr(b.data, "ransfer-Encoding: chunked")) {
        td_buf_t clean;
        td_buf_init(&clean);
        const char *p = body;
        while (*p) {
            size_t sz = strtoul(p, (char **)&p, 16);
            if (sz == 0 || *p != '\r')
                break;
            p += 2;
            td_buf_append(&clean, p, sz);
            p += sz;
            if (*p == '\r')
                p += 2;
        }
        rc = td_bench_scrape_parse(clean.data ? clean.data : "", clean.len, out);
        td_buf_free(&clean);
    }
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    td_buf_free(&b);
    return rc;
}

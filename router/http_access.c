/* http_access.c: the HTTP API's error bodies in each API's shape, and its access checks: the API
 * key a request presents (http.api_key, the key file of auth.c), the admission of a keyed
 * request against its key's limits and its tenant's cap (429 with OpenAI's x-ratelimit-*
 * headers and Retry-After), and the settlement when it ends. */
#include "http_impl.h"

#include "auth.h"
#include "td_frame.h"
#include "td_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>


const char *td__openai_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 405:
        return "invalid_request_error";
    case 413:
        return "invalid_request_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable_error";
    case 504:
        return "timeout_error";
    default:
        return "server_error";
    }
}

const char *td__anthropic_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

/* Answer an error in the API's own shape (Anthropic for /v1/messages, else OpenAI). */
void td__http_error(td_http_req_t *r, td_api_kind_t kind, int status, const char *param,
                          const char *code, const char *msg)
{
    if (status == 503)
        td_http_add_header(r, "Retry-After", "1");
    if (kind != TD_API_MESSAGES) {
        td_http_respond_error(r, status, td__openai_type(status), param, code, "%s", msg);
        return;
    }
    td_buf_t b;
    td_buf_init(&b);
    td_buf_append_str(&b, "{\"type\":\"error\",\"error\":{\"type\":\"");
    td_buf_append_str(&b, td__anthropic_type(status));
    td_buf_append_str(&b, "\",\"message\":");
    td_buf_append_json_string(&b, msg, strlen(msg));
    td_buf_append_str(&b, "}}");
    if (b.data)
        td_http_respond(r, status, "application/json", b.data, b.len);
    else
        td_http_respond(r, 500, "text/plain", "out of memory", 13);
    td_buf_free(&b);
}

/* The key a request presents: 'Authorization: Bearer KEY' or 'x-api-key: KEY', or NULL. */
static const char *presented_key(td_http_req_t *r, size_t *len)
{
    const char *h = td_http_header(r, "authorization", len);
    if (h && *len > 7 && strncasecmp(h, "Bearer ", 7) == 0) {
        *len -= 7;
        return h + 7;
    }
    return td_http_header(r, "x-api-key", len);
}

/* Whether the request carries a valid API key (when keys are configured: http.api_key, the key
 * file); answers 401 if not. *key is the key file's entry that matched (NULL for http.api_key or
 * when no key is needed). */
bool td__http_authorized(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind,
                           td_apikey_t **key)
{
    const char *want = rt->cfg.api_key;
    bool need = (want && *want) || rt->access;
    *key = NULL;
    if (!need)
        return true;
    size_t len = 0;
    const char *got = presented_key(r, &len);
    if (got && rt->access && (*key = td_keyset_find(&rt->access->keys, got, len)) != NULL)
        return true;
    size_t wlen = want ? strlen(want) : 0;
    if (got && wlen && len == wlen && td_auth_equal((const uint8_t *)got, (const uint8_t *)want, wlen))
        return true;
    td__http_error(r, kind, 401, NULL, "invalid_api_key",
                  got ? "Incorrect API key provided."
                      : "Missing API key: send it as 'Authorization: Bearer KEY' or "
                        "'x-api-key: KEY'");
    return false;
}

/* OpenAI's reset durations: "20ms", "1.5s", "6m0s". */
static void fmt_duration(char *out, size_t n, double s)
{
    if (s < 1) {
        snprintf(out, n, "%dms", (int)(s * 1000 + 0.999));
    } else if (s < 60) {
        snprintf(out, n, "%gs", (double)(int)(s * 1000 + 0.999) / 1000);
    } else {
        long t = (long)(s + 0.999);
        if (t >= 3600)
            snprintf(out, n, "%ldh%ldm%lds", t / 3600, t / 60 % 60, t % 60);
        else
            snprintf(out, n, "%ldm%lds", t / 60, t % 60);
    }
}

/* The x-ratelimit-* headers of a keyed request (the limits it has). */
static void ratelimit_headers(td_http_req_t *r, const td_admit_t *a)
{
    char v[64];
    if (a->lim_req) {
        snprintf(v, sizeof(v), "%" PRIu64, a->lim_req);
        td_http_add_header(r, "x-ratelimit-limit-requests", v);
        snprintf(v, sizeof(v), "%" PRIu64, a->rem_req);
        td_http_add_header(r, "x-ratelimit-remaining-requests", v);
        fmt_duration(v, sizeof(v), a->reset_req_s);
        td_http_add_header(r, "x-ratelimit-reset-requests", v);
    }
    if (a->lim_tok) {
        snprintf(v, sizeof(v), "%" PRIu64, a->lim_tok);
        td_http_add_header(r, "x-ratelimit-limit-tokens", v);
        snprintf(v, sizeof(v), "%" PRIu64, a->rem_tok);
        td_http_add_header(r, "x-ratelimit-remaining-tokens", v);
        fmt_duration(v, sizeof(v), a->reset_tok_s);
        td_http_add_header(r, "x-ratelimit-reset-tokens", v);
    }
}

bool td__http_admit(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind, td_apikey_t *k,
                    uint64_t tokens, td_http_grant_t *g)
{
    td_admit_t a;
    double now = td_now_s();
    td_admit_result_t res = td_access_admit(rt->access, k, tokens, now, &a);
    ratelimit_headers(r, &a);
    if (res == TD_ADMIT_OK) {
        memcpy(g->key_hash, k->hash, 32);
        g->reserved = tokens;
        g->use = a.use;
        return true;
    }
    char msg[512], ra[32];
    const char *code = "rate_limit_exceeded";
    switch (res) {
    case TD_ADMIT_REQUESTS:
        snprintf(msg, sizeof(msg),
                 "Rate limit reached for requests: limit %" PRIu64 " per %gs. Please try again "
                 "in %.3gs.",
                 k->rpm, rt->cfg.limit_window_s, a.retry_after_s);
        break;
    case TD_ADMIT_TOKENS:
        snprintf(msg, sizeof(msg),
                 "Rate limit reached for tokens: limit %" PRIu64 " per %gs, requested %" PRIu64
                 " (prompt + max_tokens). Please try again in %.3gs.",
                 k->tpm, rt->cfg.limit_window_s, tokens, a.retry_after_s);
        break;
    case TD_ADMIT_TOO_LARGE:
        snprintf(msg, sizeof(msg),
                 "Request too large: it reserves %" PRIu64 " tokens (prompt + max_tokens) and "
                 "the key's limit is %" PRIu64 " per %gs. Lower max_tokens or the prompt.",
                 tokens, k->tpm, rt->cfg.limit_window_s);
        break;
    default:
        snprintf(msg, sizeof(msg),
                 "Too many concurrent requests for tenant %s: its limit is reached. Please try "
                 "again when one ends.",
                 k->tenant);
        code = "concurrency_limit_exceeded";
        break;
    }
    if (res == TD_ADMIT_TOO_LARGE) /* waiting cannot help: the official clients read this */
        td_http_add_header(r, "x-should-retry", "false");
    if (a.retry_after_s > 0) {
        snprintf(ra, sizeof(ra), "%d", (int)(a.retry_after_s + 0.999));
        td_http_add_header(r, "Retry-After", ra);
        snprintf(ra, sizeof(ra), "%d", (int)(a.retry_after_s * 1000 + 0.999));
        td_http_add_header(r, "retry-after-ms", ra);
    }
    td__http_error(r, kind, 429, NULL, code, msg);
    return false;
}

void td__http_grant_end(td_router_t *rt, td_http_grant_t *g, uint64_t used)
{
    if (!g->use)
        return;
    if (rt->access)
        td_access_settle(rt->access, g->key_hash, g->reserved, used, td_now_s());
    td_access_release(g->use);
    g->use = NULL;
}

/* http_impl.h: what the HTTP API's files share (http_api.c: the endpoints and job events;
 * http_access.c: error bodies and access checks; http_misc.c: models, tokenize, health, metrics). Loop thread only. */
#ifndef TD_ROUTER_HTTP_IMPL_H
#define TD_ROUTER_HTTP_IMPL_H

#include "router.h"

#include <stdbool.h>
#include <stdint.h>

struct td_apikey;
struct td_tenant_use;

/* The error "type" of an HTTP status in OpenAI's and in Anthropic's vocabulary. */
const char *td__openai_type(int status);
const char *td__anthropic_type(int status);
/* Answer an error in the API's own shape (Anthropic for /v1/messages, else OpenAI); 503 adds
 * Retry-After. */
void td__http_error(td_http_req_t *r, td_api_kind_t kind, int status, const char *param,
                    const char *code, const char *msg);

/* Whether the request carries a valid API key when keys are configured (http.api_key, the key
 * file); answers 401 if not. *key: the key file's entry that matched, else NULL. */
bool td__http_authorized(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind,
                         struct td_apikey **key);

/* What a keyed request's admission charged, until td__http_grant_end. */
typedef struct td_http_grant {
    uint8_t key_hash[32];       /* the key (it may leave on a reload meanwhile) */
    uint64_t reserved;          /* tokens reserved: prompt + max_tokens of every choice */
    struct td_tenant_use *use;  /* its tenant's in-flight record; NULL: nothing charged */
} td_http_grant_t;

/* Admit a request of key k reserving `tokens`: true (g filled, the x-ratelimit-* headers added)
 * or false with a 429 answered. */
bool td__http_admit(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind, struct td_apikey *k,
                    uint64_t tokens, td_http_grant_t *g);
/* The request ended having used `used` tokens (prompt + completion): the difference goes back to
 * the key, the tenant's slot is released. No-op when nothing was charged. */
void td__http_grant_end(td_router_t *rt, td_http_grant_t *g, uint64_t used);

/* Whether the request's method is m; else 405 with Allow answered. */
bool td__http_method_is(td_http_req_t *r, const char *m, td_api_kind_t kind);

/* http_misc.c's endpoints (ud: the router). */
void td__http_models(td_http_req_t *r, void *ud);
void td__http_tokenize(td_http_req_t *r, void *ud);
void td__http_detokenize(td_http_req_t *r, void *ud);
void td__http_health(td_http_req_t *r, void *ud);
void td__http_metrics(td_http_req_t *r, void *ud);

#endif

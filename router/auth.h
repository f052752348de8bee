/* auth.h: the HTTP API's access control: API keys from a file, each naming its tenant and its
 * limits, and the state those limits need (token buckets per key, requests in flight per tenant).
 *
 * The key file (http.api_keys_file) holds one entry per line; '#' starts a comment line:
 *
 *     sha256:<64 hex digits> tenant=NAME [rpm=N] [tpm=N] [name=LABEL]
 *     tenant NAME max_concurrent=N
 *
 * A key is stored as the SHA-256 of its text (`tandem apikey new` makes a key and its line,
 * `tandem apikey hash` hashes an existing one), so the file is no secret. rpm and tpm are the
 * requests and tokens a key may use per window (http.limit_window_s, 60 s: per minute); absent
 * or 0 means no limit. A tenant line caps the requests of that tenant in flight, over all its
 * keys. A presented key is hashed and compared with every entry in constant time
 * (CRYPTO_memcmp), so neither the match nor its position shows in the timing.
 *
 * Reload (SIGHUP) parses the file again and swaps it in only when it is valid; keys present in
 * both keep their buckets, so a reload neither resets nor refills a key's limits.
 *
 * Threading: loop thread only. Pointers to keys are valid until the next reload; a request that
 * outlives one keeps the key's hash (td_access_settle) and its tenant's use record (stable until
 * td_access_close).
 */
#ifndef TD_ROUTER_AUTH_H
#define TD_ROUTER_AUTH_H

#include "ratelimit.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_APIKEY_MAX_NAME 64 /* bytes of a tenant name or a key's label */

typedef struct td_apikey {
    uint8_t hash[32]; /* SHA-256 of the key's text */
    char *tenant;     /* its tenant: the KV cache salt of its requests */
    char *name;       /* label for logs (name=), or NULL */
    uint64_t rpm;     /* requests per window; 0: no limit */
    uint64_t tpm;     /* tokens per window (prompt + max_tokens reserved); 0: no limit */
    unsigned line;    /* where it is in the file */
    td_bucket_t req, tok;
} td_apikey_t;

typedef struct td_tenant_limit {
    char *name;
    uint32_t max_concurrent; /* requests in flight; 0: no cap */
    unsigned line;
} td_tenant_limit_t;

typedef struct td_keyset {
    td_apikey_t *keys; /* [n_keys] */
    size_t n_keys;
    td_tenant_limit_t *tenants; /* [n_tenants] */
    size_t n_tenants;
} td_keyset_t;

/* Parse a key file's text; `file` names it in errors ("FILE:LINE: what is wrong"). Buckets start
 * full (window_s, now). 0, TD_EINVAL (td_err_msg names the file and line), TD_ENOMEM. */
int td_keyset_parse(const char *text, size_t len, const char *file, double window_s, double now,
                    td_keyset_t *out);
void td_keyset_free(td_keyset_t *ks);
/* The entry for a presented key (hashed, compared with every entry in constant time), or NULL. */
td_apikey_t *td_keyset_find(const td_keyset_t *ks, const char *key, size_t len);

/* Requests of one tenant in flight (records are kept until td_access_close). */
typedef struct td_tenant_use {
    char *name;
    uint32_t active;
    struct td_tenant_use *next;
} td_tenant_use_t;

typedef struct td_access {
    char *path;      /* the key file */
    double window_s; /* the limits' window */
    td_keyset_t keys;
    td_tenant_use_t *uses;
} td_access_t;

/* Load the key file. 0 or an error naming the file (and line). */
int td_access_open(td_access_t *a, const char *path, double window_s);
/* Read the file again; on any error the old keys stay and the error is returned (td_err_msg
 * names the file and line). */
int td_access_reload(td_access_t *a);
void td_access_close(td_access_t *a);

typedef enum td_admit_result {
    TD_ADMIT_OK,
    TD_ADMIT_REQUESTS,    /* over its requests per window */
    TD_ADMIT_TOKENS,      /* over its tokens per window */
    TD_ADMIT_TOO_LARGE,   /* needs more tokens than the key's whole limit */
    TD_ADMIT_CONCURRENCY, /* its tenant has max_concurrent requests in flight */
} td_admit_result_t;

/* What an admission decided and what the x-ratelimit-* headers say. */
typedef struct td_admit {
    td_admit_result_t result;
    double retry_after_s;           /* when refused: seconds until it would pass */
    td_tenant_use_t *use;           /* OK: the tenant's record, release with td_access_release */
    uint64_t lim_req, rem_req;      /* requests: limit and remaining (lim 0: no limit) */
    double reset_req_s;             /* seconds until the requests bucket is full */
    uint64_t lim_tok, rem_tok;      /* tokens: likewise */
    double reset_tok_s;
} td_admit_t;

/* Admit one request of key k that reserves `tokens` (prompt + max_tokens of every choice): all
 * of its limits pass and are charged, or none is. */
td_admit_result_t td_access_admit(td_access_t *a, td_apikey_t *k, uint64_t tokens, double now,
                                  td_admit_t *out);
/* A request ended having used `used` of the `reserved` tokens: the difference goes back to the
 * key's bucket (the key may be gone after a reload: nothing then). */
void td_access_settle(td_access_t *a, const uint8_t hash[32], uint64_t reserved, uint64_t used,
                      double now);
/* A request admitted with td_access_admit ended. */
void td_access_release(td_tenant_use_t *use);

#endif

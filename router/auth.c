/* auth.c: API keys from a file, their limits and the tenants' requests in flight (auth.h). */
#include "auth.h"

#include "td_error.h"
#include "td_frame.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIMIT 1000000000000ull /* rpm, tpm, max_concurrent above this are refused */

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct parser {
    const char *file;
    unsigned line;
    double window_s, now;
    td_keyset_t *ks;
    size_t cap_keys, cap_tenants;
} parser_t;

static int perr(const parser_t *p, const char *fmt, const char *a, const char *b)
{
    char what[512];
    snprintf(what, sizeof(what), fmt, a ? a : "", b ? b : "");
    return td_err_set(TD_EINVAL, "%s:%u: %s", p->file, p->line, what);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TD_APIKEY_MAX_NAME)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':' || c == '@'))
            return false;
    }
    return true;
}

static int parse_limit(const parser_t *p, const char *field, const char *v, uint64_t *out)
{
    if (td_parse_u64(v, out) != 0 || *out > MAX_LIMIT)
        return perr(p, "%s: \"%s\" is not a whole number in 0..1000000000000", field, v);
    return 0;
}

/* Split the line (NUL-terminated, modified in place) into whitespace-separated fields. */
static size_t split(char *s, char **f, size_t max)
{
    size_t n = 0;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == '\r')
            *s++ = '\0';
        if (!*s)
            break;
        if (n == max)
            return max + 1;
        f[n++] = s;
        while (*s && *s != ' ' && *s != '\t' && *s != '\r')
            s++;
    }
    return n;
}

static int key_line(parser_t *p, char **f, size_t n)
{
    td_keyset_t *ks = p->ks;
    const char *hex = f[0] + 7;
    uint8_t hash[32];
    if (strlen(hex) != 64 || td_hex_decode(hex, 64, hash) != 0)
        return perr(p, "a key's hash is 'sha256:' and 64 hex digits%s%s", NULL, NULL);
    for (size_t i = 0; i < ks->n_keys; i++)
        if (memcmp(ks->keys[i].hash, hash, 32) == 0) {
            char l[16];
            snprintf(l, sizeof(l), "%u", ks->keys[i].line);
            return perr(p, "the same key is already on line %s%s", l, NULL);
        }
    if (ks->n_keys == p->cap_keys) {
        size_t cap = p->cap_keys ? p->cap_keys * 2 : 8;
        td_apikey_t *t = td_reallocarray(ks->keys, cap, sizeof(*t));
        if (!t)
            return TD_ENOMEM;
        ks->keys = t;
        p->cap_keys = cap;
    }
    td_apikey_t *k = &ks->keys[ks->n_keys];
    memset(k, 0, sizeof(*k));
    memcpy(k->hash, hash, 32);
    k->line = p->line;
    ks->n_keys++; /* from here on freed with the set */
    for (size_t i = 1; i < n; i++) {
        char *eq = strchr(f[i], '=');
        if (!eq)
            return perr(p, "\"%s\": fields are name=value (tenant, rpm, tpm, name)%s", f[i], NULL);
        *eq = '\0';
        const char *v = eq + 1;
        int rc = 0;
        if (strcmp(f[i], "tenant") == 0 || strcmp(f[i], "name") == 0) {
            char **dst = f[i][0] == 't' ? &k->tenant : &k->name;
            if (*dst)
                return perr(p, "%s is given twice%s", f[i], NULL);
            if (!name_ok(v))
                return perr(p, "%s: \"%s\" is not 1-64 of A-Z a-z 0-9 - _ . : @", f[i], v);
            if (!(*dst = td_strdup(v)))
                return TD_ENOMEM;
        } else if (strcmp(f[i], "rpm") == 0) {
            rc = parse_limit(p, "rpm", v, &k->rpm);
        } else if (strcmp(f[i], "tpm") == 0) {
            rc = parse_limit(p, "tpm", v, &k->tpm);
        } else {
            return perr(p, "unknown field \"%s\" (a key line takes tenant, rpm, tpm, name)%s",
                        f[i], NULL);
        }
        if (rc)
            return rc;
    }
    if (!k->tenant)
        return perr(p, "the key has no tenant= (every key names its tenant)%s%s", NULL, NULL);
    td_bucket_init(&k->req, (double)k->rpm, p->window_s, p->now);
    td_bucket_init(&k->tok, (double)k->tpm, p->window_s, p->now);
    return 0;
}

static int tenant_line(parser_t *p, char **f, size_t n)
{
    td_keyset_t *ks = p->ks;
    if (n < 2 || !name_ok(f[1]))
        return perr(p, "'tenant' needs a name (1-64 of A-Z a-z 0-9 - _ . : @)%s%s", NULL, NULL);
    for (size_t i = 0; i < ks->n_tenants; i++)
        if (strcmp(ks->tenants[i].name, f[1]) == 0) {
            char l[16];
            snprintf(l, sizeof(l), "%u", ks->tenants[i].line);
            return perr(p, "tenant %s is already on line %s", f[1], l);
        }
    if (ks->n_tenants == p->cap_tenants) {
        size_t cap = p->cap_tenants ? p->cap_tenants * 2 : 4;
        td_tenant_limit_t *t = td_reallocarray(ks->tenants, cap, sizeof(*t));
        if (!t)
            return TD_ENOMEM;
        ks->tenants = t;
        p->cap_tenants = cap;
    }
    td_tenant_limit_t *t = &ks->tenants[ks->n_tenants];
    memset(t, 0, sizeof(*t));
    t->line = p->line;
    if (!(t->name = td_strdup(f[1])))
        return TD_ENOMEM;
    ks->n_tenants++;
    bool have = false;
    for (size_t i = 2; i < n; i++) {
        char *eq = strchr(f[i], '=');
        if (!eq || (*eq = '\0', strcmp(f[i], "max_concurrent") != 0))
            return perr(p, "unknown field \"%s\" (a tenant line takes max_concurrent=N)%s", f[i],
                        NULL);
        uint64_t v;
        int rc = parse_limit(p, "max_concurrent", eq + 1, &v);
        if (rc)
            return rc;
        if (v > UINT32_MAX)
            return perr(p, "max_concurrent: %s is too large%s", eq + 1, NULL);
        t->max_concurrent = (uint32_t)v;
        have = true;
    }
    if (!have)
        return perr(p, "tenant %s: give max_concurrent=N%s", f[1], NULL);
    return 0;
}

int td_keyset_parse(const char *text, size_t len, const char *file, double window_s, double now,
                    td_keyset_t *out)
{
    memset(out, 0, sizeof(*out));
    parser_t p = {.file = file ? file : "keys", .window_s = window_s, .now = now, .ks = out};
    if (memchr(text, '\0', len)) {
        p.line = 1;
        for (const char *c = text; *c; c++)
            p.line += *c == '\n';
        td_err_set(TD_EINVAL, "%s:%u: the file holds a NUL byte", p.file, p.line);
        return TD_EINVAL;
    }
    int rc = 0;
    const char *s = text, *end = text + len;
    char *buf = NULL;
    while (s < end && !rc) {
        p.line++;
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        free(buf);
        if (!(buf = td_strndup(s, n))) {
            rc = TD_ENOMEM;
            break;
        }
        s += n + 1;
        char *f[16];
        size_t nf = split(buf, f, 16);
        if (nf == 0 || f[0][0] == '#')
            continue;
        if (nf > 16)
            rc = perr(&p, "too many fields%s%s", NULL, NULL);
        else if (strncmp(f[0], "sha256:", 7) == 0)
            rc = key_line(&p, f, nf);
        else if (strcmp(f[0], "tenant") == 0)
            rc = tenant_line(&p, f, nf);
        else
            rc = perr(&p, "a line is 'sha256:<hash> tenant=NAME ...' (keys are stored hashed: "
                          "`tandem apikey hash` prints the line) or 'tenant NAME "
                          "max_concurrent=N'%s%s",
                      NULL, NULL);
    }
    free(buf);
    if (rc) {
        if (rc == TD_ENOMEM)
            td_err_set(TD_ENOMEM, "%s: out of memory", p.file);
        td_keyset_free(out);
    }
    return rc;
}

void td_keyset_free(td_keyset_t *ks)
{
    for (size_t i = 0; i < ks->n_keys; i++) {
        free(ks->keys[i].tenant);
        free(ks->keys[i].name);
    }
    free(ks->keys);
    for (size_t i = 0; i < ks->n_tenants; i++)
        free(ks->tenants[i].name);
    free(ks->tenants);
    memset(ks, 0, sizeof(*ks));
}

td_apikey_t *td_keyset_find(const td_keyset_t *ks, const char *key, size_t len)
{
    uint8_t h[32];
    if (td_sha256(key, len, h) != 0)
        return NULL;
    td_apikey_t *found = NULL;
    /* every entry is compared, in constant time, whatever matched before */
    for (size_t i = 0; i < ks->n_keys; i++)
        if (td_auth_equal(ks->keys[i].hash, h, 32))
            found = &ks->keys[i];
    return found;
}

/* ---- the router's access state ------------------------------------------------------------- */

static int load(const char *path, double window_s, td_keyset_t *out)
{
    char *text = NULL;
    size_t len = 0;
    int rc = td_file_read_all(path, &text, &len);
    if (rc)
        return td_err_set(rc, "%s: %s", path, td_strerror(rc));
    rc = td_keyset_parse(text, len, path, window_s, td_now_s(), out);
    free(text);
    return rc;
}

int td_access_open(td_access_t *a, const char *path, double window_s)
{
    memset(a, 0, sizeof(*a));
    a->window_s = window_s;
    if (!(a->path = td_strdup(path)))
        return TD_ENOMEM;
    int rc = load(path, window_s, &a->keys);
    if (rc) {
        free(a->path);
        a->path = NULL;
    }
    return rc;
}

int td_access_reload(td_access_t *a)
{
    td_keyset_t ks;
    int rc = load(a->path, a->window_s, &ks);
    if (rc)
        return rc;
    double now = td_now_s();
    /* keys in both files keep what they used */
    for (size_t i = 0; i < ks.n_keys; i++) {
        td_apikey_t *k = &ks.keys[i];
        for (size_t j = 0; j < a->keys.n_keys; j++) {
            const td_apikey_t *o = &a->keys.keys[j];
            if (memcmp(o->hash, k->hash, 32) != 0)
                continue;
            k->req = o->req;
            k->tok = o->tok;
            td_bucket_set_limit(&k->req, (double)k->rpm, a->window_s, now);
            td_bucket_set_limit(&k->tok, (double)k->tpm, a->window_s, now);
        }
    }
    td_keyset_free(&a->keys);
    a->keys = ks;
    return 0;
}

void td_access_close(td_access_t *a)
{
    td_keyset_free(&a->keys);
    for (td_tenant_use_t *u = a->uses, *n; u; u = n) {
        n = u->next;
        free(u->name);
        free(u);
    }
    free(a->path);
    memset(a, 0, sizeof(*a));
}

static td_tenant_use_t *use_of(td_access_t *a, const char *tenant)
{
    for (td_tenant_use_t *u = a->uses; u; u = u->next)
        if (strcmp(u->name, tenant) == 0)
            return u;
    td_tenant_use_t *u = calloc(1, sizeof(*u));
    if (!u || !(u->name = td_strdup(tenant))) {
        free(u);
        return NULL;
    }
    u->next = a->uses;
    a->uses = u;
    return u;
}

static uint32_t max_concurrent(const td_access_t *a, const char *tenant)
{
    for (size_t i = 0; i < a->keys.n_tenants; i++)
        if (strcmp(a->keys.tenants[i].name, tenant) == 0)
            return a->keys.tenants[i].max_concurrent;
    return 0;
}

static void fill_headers(td_apikey_t *k, double now, td_admit_t *out)
{
    out->lim_req = k->rpm;
    out->lim_tok = k->tpm;
    if (k->rpm) {
        out->rem_req = (uint64_t)td_bucket_available(&k->req, now);
        out->reset_req_s = td_bucket_reset_s(&k->req, now);
    }
    if (k->tpm) {
        out->rem_tok = (uint64_t)td_bucket_available(&k->tok, now);
        out->reset_tok_s = td_bucket_reset_s(&k->tok, now);
    }
}

td_admit_result_t td_access_admit(td_access_t *a, td_apikey_t *k, uint64_t tokens, double now,
                                  td_admit_t *out)
{
    memset(out, 0, sizeof(*out));
    td_tenant_use_t *u = use_of(a, k->tenant);
    uint32_t cap = max_concurrent(a, k->tenant);
    td_admit_result_t r = TD_ADMIT_OK;
    if (k->tpm && (double)tokens > k->tok.cap) {
        r = TD_ADMIT_TOO_LARGE;
    } else if (k->rpm && td_bucket_wait_s(&k->req, 1, now) > 0) {
        r = TD_ADMIT_REQUESTS;
        out->retry_after_s = td_bucket_wait_s(&k->req, 1, now);
    } else if (k->tpm && td_bucket_wait_s(&k->tok, (double)tokens, now) > 0) {
        r = TD_ADMIT_TOKENS;
        out->retry_after_s = td_bucket_wait_s(&k->tok, (double)tokens, now);
    } else if (!u || (cap && u->active >= cap)) {
        r = TD_ADMIT_CONCURRENCY;
        out->retry_after_s = 1;
    }
    if (r == TD_ADMIT_OK) {
        if (k->rpm)
            td_bucket_take(&k->req, 1, now);
        if (k->tpm)
            td_bucket_take(&k->tok, (double)tokens, now);
        u->active++;
        out->use = u;
    }
    out->result = r;
    fill_headers(k, now, out);
    return r;
}

void td_access_settle(td_access_t *a, const uint8_t hash[32], uint64_t reserved, uint64_t used,
                      double now)
{
    for (size_t i = 0; i < a->keys.n_keys; i++) {
        td_apikey_t *k = &a->keys.keys[i];
        if (memcmp(k->hash, hash, 32) == 0 && k->tpm) {
            td_bucket_give(&k->tok, (double)reserved - (double)used, now);
            return;
        }
    }
}

void td_access_release(td_tenant_use_t *use)
{
    if (use && use->active)
        use->active--;
}

/* registry.c: the cluster listener and the worker registry. Workers connect, authenticate (td_rpc),
 * send Hello, then heartbeats; frames about requests go to reqs_worker.c. A worker whose connection
 * closes or whose heartbeats stop is out of rotation at once. */
#include "router.h"

#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *role_name(int role)
{
    return role == TANDEM__ROLE__ROLE_PREFILL  ? "prefill"
           : role == TANDEM__ROLE__ROLE_DECODE ? "decode"
                                               : "?";
}

static void worker_metrics(td_router_t *rt, td_worker_t *w)
{
    td_buf_t lab;
    td_buf_init(&lab);
    td_buf_append_str(&lab, "worker=\"");
    td_metrics_escape(w->id, &lab);
    td_buf_printf(&lab, "\",worker_role=\"%s\"", role_name(w->role));
    if (lab.data) {
        w->m_up = td_metrics_gauge(rt->metrics, "worker_up",
                                   "1 while the worker is registered and heartbeating", lab.data);
        w->m_kv = td_metrics_gauge(rt->metrics, "worker_kv_cache_usage_perc",
                                   "Fraction of the worker's KV blocks in use (from heartbeats)",
                                   lab.data);
        w->m_running =
            td_metrics_gauge(rt->metrics, "worker_num_requests_running",
                             "Sequences running on the worker (from heartbeats)", lab.data);
        w->m_waiting =
            td_metrics_gauge(rt->metrics, "worker_num_requests_waiting",
                             "Sequences waiting on the worker (from heartbeats)", lab.data);
    }
    td_buf_free(&lab);
}

static void worker_free(td_worker_t *w)
{
    free(w->id);
    free(w->model);
    free(w->blob);
    free(w);
}

static void registry_del(td_router_t *rt, td_worker_t *w)
{
    for (size_t i = 0; i < rt->n_workers; i++)
        if (rt->workers[i] == w) {
            memmove(&rt->workers[i], &rt->workers[i + 1],
                    (rt->n_workers - i - 1) * sizeof(*rt->workers));
            rt->n_workers--;
            return;
        }
}

/* Take a worker out of rotation: requests it held are retried or failed, then it is freed. */
static void worker_remove(td_router_t *rt, td_worker_t *w, const char *why)
{
    td_logf(TD_LOG_WARN, NULL, "worker %s (%s) out of rotation: %s", w->id, role_name(w->role),
            why);
    w->load.alive = false;
    if (w->m_up)
        td_metric_set(w->m_up, 0);
    registry_del(rt, w);
    td_kvmirror_worker_gone(rt, w);
    td_rpc_conn_t *c = w->conn;
    if (c) {
        td_cluster_conn_t *cc = td_rpc_conn_get_data(c);
        if (cc)
            cc->worker = NULL;
    }
    td_reqs_worker_gone(rt, w);
    w->conn = NULL;
    worker_free(w);
}

td_worker_t *td_registry_find(td_router_t *rt, const char *id)
{
    for (size_t i = 0; i < rt->n_workers; i++)
        if (strcmp(rt->workers[i]->id, id) == 0)
            return rt->workers[i];
    return NULL;
}

bool td_registry_has_decode(const td_router_t *rt)
{
    for (size_t i = 0; i < rt->n_workers; i++) {
        const td_worker_t *w = rt->workers[i];
        if (w->role == TANDEM__ROLE__ROLE_DECODE && w->load.alive && !w->load.draining)
            return true;
    }
    return false;
}

/* The reference fingerprint for a model: that of the first registered worker still present. */
static const td_worker_t *reference(const td_router_t *rt, const char *model)
{
    for (size_t i = 0; i < rt->n_workers; i++)
        if (td_str_eq(rt->workers[i]->model, model))
            return rt->workers[i];
    return NULL;
}

/* Tell the peer why (an Error frame without a request id), then close its connection. */
static void refuse(td_rpc_conn_t *c, int code, const char *msg)
{
    td_msg_send_error(c, 0, code, msg);
    td_rpc_conn_close(c, code, msg);
}

static void on_hello(td_router_t *rt, td_cluster_conn_t *cc, const Tandem__Hello *h)
{
    td_rpc_conn_t *c = cc->conn;
    const char *peer = td_rpc_conn_peer_id(c);
    char msg[512];
    if (cc->worker) {
        refuse(c, TD_EPROTO, "Hello sent twice on one connection");
        return;
    }
    if (h->role != TANDEM__ROLE__ROLE_PREFILL && h->role != TANDEM__ROLE__ROLE_DECODE) {
        snprintf(msg, sizeof(msg), "worker %s: Hello.role must be PREFILL or DECODE", peer);
        TD_LOG_W("%s", msg);
        refuse(c, TD_EINVAL, msg);
        return;
    }
    if (!h->layout || h->layout->fingerprint.len == 0 ||
        h->layout->fingerprint.len > sizeof(((td_worker_t *)0)->fp)) {
        snprintf(msg, sizeof(msg), "worker %s: Hello.layout.fingerprint missing or malformed",
                 peer);
        TD_LOG_W("%s", msg);
        refuse(c, TD_EINVAL, msg);
        return;
    }
    /* the authenticated id is the worker's id; Hello.worker_id must agree when given */
    if (h->worker_id && *h->worker_id && strcmp(h->worker_id, peer) != 0) {
        snprintf(msg, sizeof(msg),
                 "worker %s: Hello.worker_id \"%.100s\" differs from the authenticated id", peer,
                 h->worker_id);
        TD_LOG_W("%s", msg);
        refuse(c, TD_EINVAL, msg);
        return;
    }
    /* same id again: the new connection replaces the old entry */
    td_worker_t *old = td_registry_find(rt, peer);
    if (old) {
        td_rpc_conn_t *oc = old->conn;
        worker_remove(rt, old, "replaced by a new connection with the same id");
        if (oc)
            td_rpc_conn_close(oc, TD_ECLOSED, "replaced by a new connection with the same id");
    }
    const char *model = h->model ? h->model : "";
    char base[256];
    td_path_basename(rt->cfg.model, base, sizeof(base));
    if (*model && strcmp(model, rt->model_name) != 0 && strcmp(model, base) != 0 &&
        strcmp(model, rt->cfg.model) != 0)
        td_logf(TD_LOG_WARN, NULL,
                "worker %s serves model \"%.100s\", this router \"%s\" (%s): check that they "
                "are the same model",
                peer, model, rt->model_name, rt->cfg.model);
    const td_worker_t *ref = reference(rt, model);
    if (ref && (ref->fp_len != h->layout->fingerprint.len ||
                memcmp(ref->fp, h->layout->fingerprint.data, ref->fp_len) != 0)) {
        char a[65], b[65];
        td_hex_encode(ref->fp, ref->fp_len, a);
        td_hex_encode(h->layout->fingerprint.data, h->layout->fingerprint.len, b);
        snprintf(msg, sizeof(msg),
                 "worker %s: KV layout fingerprint %s differs from %s of worker %s (model "
                 "\"%.100s\"): refused",
                 peer, b, a, ref->id, model);
        TD_LOG_W("%s", msg);
        refuse(c, TD_EMISMATCH, msg);
        return;
    }
    td_worker_t *w = td_calloc(1, sizeof(*w));
    if (!w)
        goto oom;
    w->id = td_strdup(peer);
    w->model = td_strdup(model);
    w->blob = malloc(h->ucx_address.len ? h->ucx_address.len : 1);
    if (!w->id || !w->model || !w->blob)
        goto oom_free;
    memcpy(w->blob, h->ucx_address.data, h->ucx_address.len);
    w->blob_len = h->ucx_address.len;
    w->serial = ++rt->next_serial;
    w->conn = c;
    w->role = h->role;
    memcpy(w->fp, h->layout->fingerprint.data, h->layout->fingerprint.len);
    w->fp_len = h->layout->fingerprint.len;
    w->block_tokens = h->layout->block_tokens;
    w->block_bytes = h->layout->block_bytes;
    w->total_blocks = h->total_blocks;
    w->max_running = h->max_running;
    w->load.alive = true;
    w->load.total_blocks = h->total_blocks;
    w->load.free_blocks = h->total_blocks;
    w->hb_total = w->hb_free = h->total_blocks;
    w->last_hb = td_now_s();
    if (rt->n_workers == rt->cap_workers) {
        size_t cap = rt->cap_workers ? rt->cap_workers * 2 : 8;
        td_worker_t **t = td_reallocarray(rt->workers, cap, sizeof(*t));
        if (!t)
            goto oom_free;
        rt->workers = t;
        rt->cap_workers = cap;
    }
    rt->workers[rt->n_workers++] = w;
    cc->worker = w;
    td_kvmirror_worker_up(rt, w);
    worker_metrics(rt, w);
    if (w->m_up)
        td_metric_set(w->m_up, 1);
    td_logf(TD_LOG_INFO, NULL,
            "worker %s registered: role=%s model=%s blocks=%u block_tokens=%u max_running=%u",
            w->id, role_name(w->role), w->model, w->total_blocks, w->block_tokens, w->max_running);
    td_reqs_kick(rt);
    return;
oom_free:
    worker_free(w);
oom:
    refuse(c, TD_ENOMEM, "router out of memory");
}

static void on_heartbeat(td_router_t *rt, td_worker_t *w, const Tandem__Heartbeat *hb)
{
    w->last_hb = td_now_s();
    w->n_hb++;
    if (!hb->load)
        return;
    const Tandem__Load *l = hb->load;
    td_place_heartbeat(&w->load, l->queued_prefill_tokens, l->running_sequences, l->free_blocks,
                       l->total_blocks ? l->total_blocks : w->total_blocks,
                       l->draining || w->drain_req);
    w->hb_queued_tokens = l->queued_prefill_tokens;
    w->hb_running = l->running_sequences;
    w->hb_waiting = l->waiting_sequences;
    w->hb_free = l->free_blocks;
    w->hb_total = l->total_blocks;
    w->fetch_bps = l->fetch_bytes_per_s;
    w->n_hb_cache = TD_MIN(l->n_cache, (size_t)TD_WORKER_MAX_TIERS);
    for (size_t i = 0; i < w->n_hb_cache; i++) {
        const Tandem__CacheTier *t = l->cache[i];
        td_worker_tier_t *c = &w->hb_cache[i];
        snprintf(c->name, sizeof(c->name), "%s", t->tier ? t->tier : "");
        c->cached_blocks = t->cached_blocks;
        c->queries = t->queries;
        c->hits = t->hits;
    }
    if (w->m_kv && l->total_blocks)
        td_metric_set(w->m_kv, 1.0 - (double)l->free_blocks / l->total_blocks);
    if (w->m_running)
        td_metric_set(w->m_running, l->running_sequences);
    if (w->m_waiting)
        td_metric_set(w->m_waiting, l->waiting_sequences);
    td_reqs_kick(rt);
}

static void cl_ready(td_rpc_conn_t *c, void *ud)
{
    td_cluster_conn_t *cc = td_calloc(1, sizeof(*cc));
    if (!cc) {
        td_rpc_conn_close(c, TD_ENOMEM, "out of memory");
        return;
    }
    cc->conn = c;
    td_rpc_conn_set_data(c, cc);
    td_logf(TD_LOG_DEBUG, NULL, "cluster connection from %s", td_rpc_conn_peer_id(c));
}

static void cl_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    td_router_t *rt = ud;
    td_cluster_conn_t *cc = td_rpc_conn_get_data(c);
    if (!cc)
        return;
    if (f->body_case == TANDEM__FRAME__BODY_HELLO) {
        on_hello(rt, cc, f->hello);
        return;
    }
    td_worker_t *w = cc->worker;
    if (!w) {
        char msg[200];
        snprintf(msg, sizeof(msg), "frame %d before Hello", (int)f->body_case);
        refuse(c, TD_EPROTO, msg);
        return;
    }
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_HEARTBEAT:
        on_heartbeat(rt, w, f->heartbeat);
        break;
    case TANDEM__FRAME__BODY_DECODE_ACCEPT:
    case TANDEM__FRAME__BODY_PREFILL_DONE:
    case TANDEM__FRAME__BODY_TOKEN_CHUNK:
    case TANDEM__FRAME__BODY_ERROR:
        w->last_hb = td_now_s(); /* any frame shows it is alive */
        td_reqs_on_frame(rt, w, f);
        break;
    default:
        td_logf(TD_LOG_WARN, NULL, "worker %s sent an unexpected frame (%d): ignored", w->id,
                (int)f->body_case);
        break;
    }
}

static void cl_close(td_rpc_conn_t *c, int status, void *ud)
{
    td_router_t *rt = ud;
    td_cluster_conn_t *cc = td_rpc_conn_get_data(c);
    if (!cc) {
        if (status && status != TD_ECLOSED)
            td_logf(TD_LOG_INFO, NULL, "cluster connection refused: %s", td_rpc_conn_reason(c));
        return;
    }
    td_rpc_conn_set_data(c, NULL);
    if (cc->worker) {
        char why[300];
        snprintf(why, sizeof(why), "connection closed (%s%s%s)", td_strerror(status),
                 *td_rpc_conn_reason(c) ? ": " : "", td_rpc_conn_reason(c));
        cc->worker->conn = NULL;
        worker_remove(rt, cc->worker, why);
    }
    free(cc);
}

void td_registry_sweep(td_router_t *rt, double now)
{
    double limit = rt->cfg.heartbeat_timeout_s > 0 ? rt->cfg.heartbeat_timeout_s : 2.0;
    for (size_t i = 0; i < rt->n_workers;) {
        td_worker_t *w = rt->workers[i];
        if (now - w->last_hb <= limit) {
            i++;
            continue;
        }
        char why[160];
        snprintf(why, sizeof(why), "no heartbeat for %.1f s", now - w->last_hb);
        td_rpc_conn_t *c = w->conn;
        worker_remove(rt, w, why); /* removes index i */
        if (c)
            td_rpc_conn_close(c, TD_ETIMEDOUT, why);
    }
}

int td_registry_drain(td_router_t *rt, const char *id, bool on)
{
    td_worker_t *w = td_registry_find(rt, id);
    if (!w)
        return td_err_set(TD_ENOENT, "no worker \"%s\" is registered", id);
    Tandem__Drain d = TANDEM__DRAIN__INIT;
    d.on = on;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_DRAIN;
    f.drain = &d;
    int rc = w->conn ? td_rpc_send(w->conn, &f) : TD_ECLOSED;
    if (rc)
        return td_err_set(rc, "worker %s: could not send Drain: %s", id, td_strerror(rc));
    w->load.draining = on;
    w->drain_req = on;
    td_logf(TD_LOG_INFO, NULL, "worker %s: drain %s", id, on ? "on" : "off");
    if (!on)
        td_reqs_kick(rt);
    return 0;
}

int td_registry_start(td_router_t *rt)
{
    td_rpc_opts_t o = {0};
    o.secret = rt->secret;
    o.secret_len = rt->secret_len;
    o.cb.on_ready = cl_ready;
    o.cb.on_frame = cl_frame;
    o.cb.on_close = cl_close;
    o.ud = rt;
    return td_rpc_server_start(rt->loop, rt->cfg.cluster_listen, &o, &rt->cluster);
}

/* routers.c: the control plane of a worker: one reconnecting td_rpc client per router in
 * `routers`, Hello on every new connection, heartbeats with the load, and the frames routers
 * send (the role's task, Cancel, Drain). A lost router connection starts a new data-plane epoch
 * (td_kvx_renew) before the worker registers again. */
#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"
#include "td_worker.h"

#include "td_config_build.h"

#include <stdlib.h>
#include <string.h>

void td_wk_send_error(td_wk_router_t *rt, uint64_t req, int code, const char *msg)
{
    td_msg_send_error(rt->conn, req, code, msg);
}

void td_wk_fill_load(td_worker_t *w, Tandem__Load *l)
{
    uint64_t queued = 0;
    uint32_t running = 0, waiting = 0;
    for (td_wk_seq_t *s = w->head; s; s = s->next) {
        if (s->dead)
            continue;
        if (s->state == TD_WK_PREFILL)
            queued += (uint64_t)(td_wk_prefill_target(s) - s->stored);
        if (s->state == TD_WK_RUN)
            running++;
        else
            waiting++;
    }
    l->queued_prefill_tokens = queued;
    l->running_sequences = running;
    l->waiting_sequences = waiting;
    l->free_blocks = (uint32_t)w->pool.n_free;
    l->total_blocks = (uint32_t)w->pool.n_blocks;
    l->draining = w->draining;
    l->fetch_bytes_per_s = w->fetch_bytes_per_s;
    td_metric_set(w->m.running, running);
    td_metric_set(w->m.waiting, waiting);
    td_metric_set(w->m.kv_usage, 1.0 - (double)w->pool.n_free / w->pool.n_blocks);
    td_metric_set(w->m.cached_blocks, w->pool.n_cached);
    double ev = (double)w->pool.evictions - td_metric_value(w->m.evictions);
    if (ev > 0)
        td_metric_add(w->m.evictions, ev);
    /* the cache tiers, from the same counters /metrics shows */
    Tandem__CacheTier *t = w->load_tiers;
    tandem__cache_tier__init(&t[0]);
    t[0].tier = "pool";
    t[0].cached_blocks = (uint64_t)w->pool.n_cached;
    t[0].queries = (uint64_t)td_metric_value(w->m.cache_queries);
    t[0].hits = (uint64_t)td_metric_value(w->m.cache_hits);
    w->load_tier_p[0] = &t[0];
    l->cache = w->load_tier_p;
    l->n_cache = 1;
    if (w->disk) {
        td_kvdisk_stats_t st;
        td_kvdisk_stats(w->disk, &st);
        tandem__cache_tier__init(&t[1]);
        t[1].tier = "disk";
        t[1].cached_blocks = st.files;
        t[1].queries = (uint64_t)td_metric_value(w->m.disk_queries);
        t[1].hits = (uint64_t)td_metric_value(w->m.disk_hits);
        t[1].load_s_per_token = w->load_s_per_block / w->pool.layout.block_size;
        w->load_tier_p[1] = &t[1];
        l->n_cache = 2;
        td_metric_set(w->m.disk_files, (double)st.files);
        td_metric_set(w->m.disk_bytes, (double)st.bytes);
        td_metric_set(w->m.disk_enabled, st.enabled);
        td_metric_add(w->m.disk_corrupt, (double)st.corrupt - td_metric_value(w->m.disk_corrupt));
        td_metric_add(w->m.disk_errors, (double)st.errors - td_metric_value(w->m.disk_errors));
        td_metric_add(w->m.disk_evictions,
                      (double)st.evictions - td_metric_value(w->m.disk_evictions));
    }
}

void td_wk_send_heartbeats(td_worker_t *w)
{
    Tandem__Load l = TANDEM__LOAD__INIT;
    td_wk_fill_load(w, &l);
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = ++w->hb_seq;
    hb.load = &l;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    for (int i = 0; i < w->n_routers; i++)
        if (w->routers[i].conn)
            td_rpc_send(w->routers[i].conn, &f);
}

static void on_cancel(td_worker_t *w, td_wk_router_t *rt, uint64_t req)
{
    td_wk_seq_t *s = td_wk_seq_find_req(w, rt, req);
    if (!s)
        return;
    TD_LOG_D("request %llu canceled", (unsigned long long)req);
    td_wk_seq_cancel(w, s);
}

static void on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    td_wk_router_t *rt = ud;
    td_worker_t *w = rt->w;
    (void)c;
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_DECODE_TASK:
    case TANDEM__FRAME__BODY_PREFILL_TASK:
        if (f->body_case == w->role->task_case) {
            w->role->on_task(w, rt, f);
        } else {
            uint64_t req = f->body_case == TANDEM__FRAME__BODY_DECODE_TASK
                               ? f->decode_task->request_id
                               : f->prefill_task->request_id;
            char msg[96];
            snprintf(msg, sizeof(msg), "a %s worker takes no %s", w->role->name,
                     f->body_case == TANDEM__FRAME__BODY_DECODE_TASK ? "DecodeTask"
                                                                     : "PrefillTask");
            td_wk_send_error(rt, req, TD_EINVAL, msg);
        }
        break;
    case TANDEM__FRAME__BODY_CANCEL:
        on_cancel(w, rt, f->cancel->request_id);
        break;
    case TANDEM__FRAME__BODY_DRAIN:
        w->draining = f->drain->on || w->stopping;
        TD_LOG_I("draining %s by router %s", w->draining ? "on" : "off", rt->addr);
        td_wk_send_heartbeats(w);
        break;
    case TANDEM__FRAME__BODY_ERROR:
        TD_LOG_W("router %s: %s", rt->addr, f->error->message);
        break;
    default:
        TD_LOG_W("router %s sent an unexpected frame (type %d)", rt->addr, (int)f->body_case);
    }
}

static void on_ready(td_rpc_conn_t *c, void *ud)
{
    td_wk_router_t *rt = ud;
    td_worker_t *w = rt->w;
    rt->conn = c;
    rt->gen++;
    size_t blob_len;
    const void *blob = td_kvx_blob(w->kvx, &blob_len);
    Tandem__KvLayout lay = TANDEM__KV_LAYOUT__INIT;
    lay.fingerprint.data = w->layout.fingerprint;
    lay.fingerprint.len = 16;
    lay.block_tokens = (uint32_t)w->layout.block_size;
    lay.block_bytes = w->layout.block_bytes;
    lay.num_layers = (uint32_t)w->layout.n_layers;
    lay.bytes_per_layer = w->layout.layer_bytes;
    lay.dtype = "f32";
    Tandem__Hello h = TANDEM__HELLO__INIT;
    h.role = w->role->role;
    h.worker_id = w->cfg.id;
    h.model = w->model_name;
    h.layout = &lay;
    h.ucx_address.data = (uint8_t *)blob;
    h.ucx_address.len = blob_len;
    h.total_blocks = (uint32_t)w->pool.n_blocks;
    h.max_running = (uint32_t)w->cfg.max_running;
    h.version = TD_VERSION;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HELLO;
    f.hello = &h;
    td_rpc_send(c, &f);
    td_wk_send_heartbeats(w);
    TD_LOG_I("registered with router %s", rt->addr);
    if (!w->ready_sent) {
        w->ready_sent = true;
        td_daemon_ready(w->daemon, "serving");
    }
}

static void on_close(td_rpc_conn_t *c, int status, void *ud)
{
    td_wk_router_t *rt = ud;
    td_worker_t *w = rt->w;
    if (rt->conn != c)
        return; /* a connection attempt that never became ready */
    rt->conn = NULL;
    TD_LOG_W("lost router %s (%s): canceling its requests", rt->addr,
             status ? td_rpc_conn_reason(c) : "closed");
    /* We may have been cut off the network: a new data-plane epoch, so the next Hello carries a
     * blob that tells peers to replace their endpoints to us (ours are replaced now). Transfers
     * in flight for other routers' requests finish on the old endpoints (td_kvx_renew). Not
     * while stopping: the clients stop after the data plane may have begun to close. */
    if (!w->stopped && !w->stopping)
        td_kvx_renew(w->kvx);
    td_wk_seq_t *next;
    for (td_wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->rt == rt && s->rt_gen == rt->gen && !s->dead)
            td_wk_seq_cancel(w, s);
    }
}

int td_wk_routers_start(td_worker_t *w)
{
    const td_wk_cfg_t *c = &w->cfg;
    char *list = td_strdup(c->routers ? c->routers : ""), *save = NULL;
    int rc = 0;
    if (!list)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (char *a = strtok_r(list, ", ", &save); a && !rc; a = strtok_r(NULL, ", ", &save)) {
        if (w->n_routers == TD_WK_MAX_ROUTERS) {
            rc = td_err_set(TD_EINVAL, "routers: at most %d", TD_WK_MAX_ROUTERS);
            break;
        }
        td_wk_router_t *rt = &w->routers[w->n_routers];
        rt->w = w;
        snprintf(rt->addr, sizeof(rt->addr), "%s", a);
        td_rpc_opts_t ro = {.secret = w->secret,
                            .secret_len = w->secret_len,
                            .id = c->id,
                            .cb = {.on_ready = on_ready, .on_frame = on_frame, .on_close = on_close},
                            .ud = rt};
        if ((rc = td_rpc_client_start(w->loop, a, &ro, true, &rt->cl)))
            rc = td_err_set(rc, "routers: \"%s\": %s", a, td_err_msg());
        else
            w->n_routers++;
    }
    free(list);
    if (!rc && w->n_routers == 0)
        rc = td_err_set(TD_EINVAL, "routers: no router address given");
    return rc;
}

void td_wk_routers_stop(td_worker_t *w)
{
    for (int i = 0; i < w->n_routers; i++)
        td_rpc_client_stop(w->routers[i].cl);
}

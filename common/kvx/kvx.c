/* kvx.c: the KV data plane over UCX (see td_kvx.h and docs/dataplane.md): creating and closing a
 * td_kvx_t (UCX context and worker, the pool allocated and registered once, our blob), the
 * accessors, and the translation of UCX status codes. What the other files do is listed in
 * kvx_impl.h.
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CLOSE_WAIT_NS 3000000000ull

/* ---- errors ----------------------------------------------------------------------------------*/

/* UCX status -> TD_E* code, at the boundary (see kvx_impl.h). */
int td__ucs_to_td(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return 0;
    case UCS_ERR_NO_MEMORY:
        return TD_ENOMEM;
    case UCS_ERR_CANCELED:
        return TD_ECANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return TD_ETIMEDOUT;
    case UCS_ERR_UNREACHABLE:
        return TD_EUNREACH;
    case UCS_ERR_REJECTED:
        return TD_ECONNREFUSED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
        return TD_ECONNRESET;
    case UCS_ERR_INVALID_PARAM:
        return TD_EINVAL;
    case UCS_ERR_UNSUPPORTED:
        return TD_ENOTSUP;
    default:
        return TD_EIO;
    }
}

/* Set td_err_msg naming `what` and UCX's message; returns the translated code. */
int td__ucx_err(ucs_status_t st, const char *what)
{
    return td_err_set(td__ucs_to_td(st), "kvx: %s: %s", what, ucs_status_string(st));
}

/* ---- create and close ------------------------------------------------------------------------*/

/* Fill p[n] from /dev/urandom. 0 or TD_EIO. */
static int fill_random(void *p, size_t n)
{
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f)
        return td_err_set(TD_EIO, "kvx: cannot open /dev/urandom");
    size_t got = fread(p, 1, n, f);
    fclose(f);
    return got == n ? 0 : td_err_set(TD_EIO, "kvx: short read from /dev/urandom");
}

/* Set UCX option `name` in cfg unless the environment sets UCX_<name>. 0 or the UCX error. */
static int set_default(ucp_config_t *cfg, const char *name, const char *value)
{
    char env[128];
    snprintf(env, sizeof(env), "UCX_%s", name);
    if (getenv(env))
        return 0; /* the operator's setting wins */
    ucs_status_t st = ucp_config_modify(cfg, name, value);
    if (st != UCS_OK)
        return td__ucx_err(st, name);
    return 0;
}

/* Build our blob (header, worker address, packed rkey) into k->blob. 0, TD_ENOMEM or the UCX
 * error. Needs the worker and the registered pool. */
static int build_blob(td_kvx_t *k)
{
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucs_status_t st = ucp_worker_get_address(k->worker, &addr, &addr_len);
    if (st != UCS_OK)
        return td__ucx_err(st, "ucp_worker_get_address");
    st = ucp_rkey_pack(k->ctx, k->memh, &rkey, &rkey_len);
    if (st != UCS_OK) {
        ucp_worker_release_address(k->worker, addr);
        return td__ucx_err(st, "ucp_rkey_pack");
    }
    blob_hdr_t h = {.version = KVX_VERSION,
                    .mem = (uint16_t)k->layout.mem,
                    .instance = k->instance,
                    .block_bytes = k->layout.block_bytes,
                    .n_blocks = k->layout.n_blocks,
                    .addr_len = (uint32_t)addr_len,
                    .rkey_len = (uint32_t)rkey_len,
                    .flags = k->opts.pool == TD_KVX_POOL_MMAP ? 0 : BLOB_F_UCX_POOL,
                    .pool_addr = (uint64_t)(uintptr_t)k->pool,
                    .epoch = k->epoch};
    memcpy(h.magic, BLOB_MAGIC, 4);
    memcpy(h.fingerprint, k->layout.fingerprint, 16);
    k->blob_len = sizeof(h) + addr_len + rkey_len;
    k->blob = malloc(k->blob_len);
    int rc = 0;
    if (k->blob) {
        memcpy(k->blob, &h, sizeof(h));
        memcpy(k->blob + sizeof(h), addr, addr_len);
        memcpy(k->blob + sizeof(h) + addr_len, rkey, rkey_len);
    } else {
        rc = TD_ENOMEM;
    }
    ucp_rkey_buffer_release(rkey);
    ucp_worker_release_address(k->worker, addr);
    return rc;
}

/* Allocate (UCX or mmap, per opts.pool) and register the pool once; k->pool is zero-filled.
 * 0 or an error; what was done is undone by free_ucx. */
static int map_pool(td_kvx_t *k)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = k->pool_bytes,
    };
    if (k->opts.pool != TD_KVX_POOL_MMAP) {
        mp.address = NULL;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
    } else {
        void *p =
            mmap(NULL, k->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return td_err_set(TD_ENOMEM, "kvx: cannot map a pool of %zu bytes", k->pool_bytes);
        k->pool = p;
        k->pool_mmap = true;
        mp.address = p;
    }
    ucs_status_t st = ucp_mem_map(k->ctx, &mp, &k->memh);
    if (st != UCS_OK)
        return td__ucx_err(st, "ucp_mem_map");
    if (k->opts.pool != TD_KVX_POOL_MMAP) {
        ucp_mem_attr_t a = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        st = ucp_mem_query(k->memh, &a);
        if (st != UCS_OK)
            return td__ucx_err(st, "ucp_mem_query");
        k->pool = a.address;
        memset(k->pool, 0, k->pool_bytes);
    }
    return 0;
}

/* Unregister and free the pool, destroy the worker and the context; each part may be absent. */
static void free_ucx(td_kvx_t *k)
{
    if (k->memh)
        ucp_mem_unmap(k->ctx, k->memh);
    k->memh = NULL;
    if (k->pool && k->pool_mmap)
        munmap(k->pool, k->pool_bytes);
    k->pool = NULL;
    if (k->worker)
        ucp_worker_destroy(k->worker);
    k->worker = NULL;
    if (k->ctx)
        ucp_cleanup(k->ctx);
    k->ctx = NULL;
}

td_kvx_t *td_kvx_new(uv_loop_t *loop, const td_kvx_layout_t *layout, const td_kvx_opts_t *opts)
{
    if (!loop || !layout || layout->block_bytes == 0 || layout->n_blocks == 0 ||
        layout->mem != TD_KVX_MEM_HOST || layout->block_bytes % 64 != 0 ||
        layout->block_bytes > (1ull << 40) / layout->n_blocks) {
        td_err_set(TD_EINVAL, "kvx: bad layout (block_bytes must be a non-zero multiple of 64, "
                              "n_blocks > 0, pool under 1 TiB, memory type host)");
        return NULL;
    }
    td_kvx_t *k = calloc(1, sizeof(*k));
    if (!k) {
        td_err_set(TD_ENOMEM, "kvx: out of memory");
        return NULL;
    }
    k->loop = loop;
    k->layout = *layout;
    k->pool_bytes = (size_t)layout->block_bytes * layout->n_blocks;
    if (opts)
        k->opts = *opts;
    if (k->opts.keepalive_s <= 0)
        k->opts.keepalive_s = 0.5;
    if (k->opts.connect_s <= 0)
        k->opts.connect_s = 10;
    k->efd = -1;
    k->busy_poll = getenv("TD_KVX_BUSY_POLL") && strcmp(getenv("TD_KVX_BUSY_POLL"), "1") == 0;
    if (fill_random(&k->instance, sizeof(k->instance)) < 0)
        goto err_free;
    k->instance |= 1; /* never 0 */
    k->epoch = 1;

    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        td__ucx_err(st, "ucp_config_read");
        goto err_free;
    }
    char ka[32];
    snprintf(ka, sizeof(ka), "%gs", k->opts.keepalive_s);
    int rc = set_default(cfg, "KEEPALIVE_INTERVAL", ka);
    /* peer failure on shared memory: only when mm transports can be in use (UCX warns about a
     * setting nothing consumes) */
    const char *tls = getenv("UCX_TLS");
    if (rc == 0 && (!tls || strstr(tls, "sm") || strstr(tls, "mm") || strstr(tls, "posix") ||
                    strstr(tls, "sysv") || strstr(tls, "all")))
        rc = set_default(cfg, "MM_ERROR_HANDLING", "y");
    if (rc < 0) {
        ucp_config_release(cfg);
        goto err_free;
    }
    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    st = ucp_init(&up, cfg, &k->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        td__ucx_err(st, "ucp_init");
        k->ctx = NULL;
        goto err_free;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(k->ctx, &wp, &k->worker);
    if (st != UCS_OK) {
        td__ucx_err(st, "ucp_worker_create");
        k->worker = NULL;
        goto err_ucx;
    }
    st = ucp_worker_get_efd(k->worker, &k->efd);
    if (st != UCS_OK) {
        td__ucx_err(st, "ucp_worker_get_efd");
        goto err_ucx;
    }
    if (td__recv_set_handlers(k) < 0)
        goto err_ucx;
    if (map_pool(k) < 0 || build_blob(k) < 0)
        goto err_ucx;

    td__loop_start(k);
    return k;

err_ucx:
    free_ucx(k);
err_free:
    free(k->blob);
    free(k);
    return NULL;
}

/* Progress until no operation is in flight or the deadline passes. */
static void drain(td_kvx_t *k, uint64_t wait_ns)
{
    uint64_t end = td_now_ns() + wait_ns;
    do {
        ucp_worker_progress(k->worker);
        td__run_tasks(k);
    } while ((td__total_ops(k) > 0 || k->tq_head) && td_now_ns() < end);
}

/* Order: fail every transfer, drain their operations, close endpoints (and rkeys), drain again,
 * run the remaining callbacks, free the peers and UCX, then close the loop handles. */
void td_kvx_close(td_kvx_t *k, void (*cb)(void *arg), void *arg)
{
    TD_ASSERT(!k->in_service); /* not from inside a td_kvx callback */
    k->closing = true;
    k->close_cb = cb;
    k->close_arg = arg;
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        for (xfer_t *x = p->tx; x; x = x->next) {
            if (x->status == 0)
                x->status = TD_ECANCELED;
            td__queue_tx_check(x);
        }
        for (rx_t *r = p->rx; r; r = r->next) {
            if (r->status == 0)
                r->status = TD_ECANCELED;
            td__queue_rx_check(r);
        }
    }
    /* operations first, then rkeys and endpoints, as for a failed peer */
    drain(k, CLOSE_WAIT_NS);
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        td__peer_close_retired(p);
        td__peer_close_ep(p);
    }
    drain(k, CLOSE_WAIT_NS);
    if (td__total_ops(k) > 0)
        TD_LOG_W("kvx: close: %u operations never completed", td__total_ops(k));
    while (k->tq_head) {
        task_t *t = k->tq_head;
        k->tq_head = t->next;
        free(t->data);
        free(t);
    }
    k->tq_tail = NULL;
    td_kvx_peer_t *p = k->peers;
    while (p) {
        td_kvx_peer_t *pn = p->next;
        while (p->tx) {
            xfer_t *x = p->tx;
            p->tx = x->next;
            td__xfer_callback(x, x->status ? x->status : TD_ECANCELED);
            td__xfer_free(x);
        }
        while (p->rx) {
            rx_t *r = p->rx;
            p->rx = r->next;
            free(r->done_payload);
            free(r);
        }
        free(p->blob);
        free(p);
        p = pn;
    }
    k->peers = NULL;
    free_ucx(k);
    td__free_orphans(k); /* the worker is gone: no late completion can reach them now */
    free(k->blob);
    k->blob = NULL;
    td__loop_close(k); /* frees k once the handles have closed, then runs cb */
}

/* ---- accessors -------------------------------------------------------------------------------*/

uint8_t *td_kvx_pool(td_kvx_t *k)
{
    return k->pool;
}

const td_kvx_layout_t *td_kvx_layout(const td_kvx_t *k)
{
    return &k->layout;
}

const void *td_kvx_blob(td_kvx_t *k, size_t *len)
{
    *len = k->blob_len;
    return k->blob;
}

uint64_t td_kvx_epoch(const td_kvx_t *k)
{
    return k->epoch;
}

uint64_t td_kvx_renew(td_kvx_t *k)
{
    k->epoch++;
    blob_hdr_t h;
    memcpy(&h, k->blob, sizeof(h));
    h.epoch = k->epoch;
    memcpy(k->blob, &h, sizeof(h));
    if (k->closing)
        return k->epoch;
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        if (!p->ep || p->tearing || (p->state != PEER_READY && p->state != PEER_CONNECTING))
            continue;
        td__peer_retire_ep(p);
        int rc = td__peer_connect(p); /* HELLO with our new blob on a fresh endpoint */
        if (rc < 0) {
            TD_LOG_W("kvx: peer %016llx: cannot reconnect for the new epoch: %s",
                     (unsigned long long)p->instance, td_err_msg());
            td__peer_fail(p, rc);
        }
    }
    TD_LOG_I("kvx: data-plane epoch %llu", (unsigned long long)k->epoch);
    return k->epoch;
}

void td_kvx_stats(const td_kvx_t *k, td_kvx_stats_t *out)
{
    *out = k->stats;
    out->retired_open = 0;
    for (const td_kvx_peer_t *p = k->peers; p; p = p->next)
        for (const kvx_oldep_t *o = p->retired; o; o = o->next)
            out->retired_open++;
}

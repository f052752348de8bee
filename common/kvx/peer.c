/* peer.c: the peer table. A peer is learnt from its blob (td_kvx_connect, or the HELLO it sends
 * us), keeps a copy of that blob for reconnecting, and owns one endpoint and one unpacked rkey
 * while connected. Here: parsing and checking peer blobs, creating endpoints and choosing the
 * mechanism per endpoint, the HELLO / HELLO_ACK handshake, and what happens to a dead peer
 * (every transfer fails, then teardown in order: operations, rkey, endpoint).
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEARDOWN_WAIT_NS 1000000000ull /* wait this long for a failed peer's operations */
#define RETIRE_GRACE_NS 1000000000ull  /* a retired endpoint stays open at least this long */
#define RETIRE_WAIT_NS 60000000000ull  /* and at most this long */
#define RETIRE_SETTLE_NS 10000000000ull /* see td__peer_retired_step */

td_kvx_peer_t *td__find_peer(td_kvx_t *k, uint64_t instance)
{
    for (td_kvx_peer_t *p = k->peers; p; p = p->next)
        if (p->instance == instance)
            return p;
    return NULL;
}

/* ---- peer blobs ------------------------------------------------------------------------------*/

/* Parse and check a blob against our layout. On success *h holds its header. TD_EPARSE for a
 * malformed blob, TD_EMISMATCH for another layout, TD_EINVAL for our own blob. */
static int parse_blob(const td_kvx_t *k, const void *blob, size_t len, blob_hdr_t *h)
{
    if (!blob || len < sizeof(*h))
        return td_err_set(TD_EPARSE, "kvx: blob of %zu bytes is too short", len);
    memcpy(h, blob, sizeof(*h));
    if (memcmp(h->magic, BLOB_MAGIC, 4) != 0 || h->version != KVX_VERSION)
        return td_err_set(TD_EPARSE, "kvx: blob: bad magic or version %u", h->version);
    if ((uint64_t)h->addr_len + h->rkey_len + sizeof(*h) != len || h->addr_len == 0 ||
        h->rkey_len == 0)
        return td_err_set(TD_EPARSE,
                          "kvx: blob: lengths (address %u, rkey %u) do not add up to %zu",
                          h->addr_len, h->rkey_len, len);
    if (h->block_bytes != k->layout.block_bytes ||
        memcmp(h->fingerprint, k->layout.fingerprint, 16) != 0 || h->mem > TD_KVX_MEM_HOST)
        return td_err_set(TD_EMISMATCH,
                          "kvx: peer %016llx layout differs (block_bytes %llu vs ours %llu, or "
                          "fingerprint)",
                          (unsigned long long)h->instance, (unsigned long long)h->block_bytes,
                          (unsigned long long)k->layout.block_bytes);
    if (h->instance == k->instance)
        return td_err_set(TD_EINVAL, "kvx: blob is our own");
    return 0;
}

/* Keep a copy of a parsed blob (h, its header) as p's, replacing the one it had. 0 or TD_ENOMEM
 * (p unchanged). An endpoint or rkey made from the old blob stays valid (UCX copied them). */
static int store_blob(td_kvx_peer_t *p, const blob_hdr_t *h, const void *blob, size_t len)
{
    uint8_t *copy = malloc(len);
    if (!copy)
        return TD_ENOMEM;
    memcpy(copy, blob, len);
    free(p->blob);
    p->blob = copy;
    p->blob_len = len;
    p->epoch = h->epoch;
    p->pool_addr = h->pool_addr;
    p->blob_flags = h->flags;
    p->n_blocks = h->n_blocks;
    p->addr = (const ucp_address_t *)(p->blob + sizeof(*h));
    p->rkey_buf = p->blob + sizeof(*h) + h->addr_len;
    return 0;
}

/* Add a peer for a parsed blob (h, its header) to k's table, keeping a copy of the blob. NULL when
 * out of memory. The peer is owned by k and freed by td_kvx_close. */
static td_kvx_peer_t *new_peer(td_kvx_t *k, const blob_hdr_t *h, const void *blob, size_t len)
{
    td_kvx_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    if (store_blob(p, h, blob, len) < 0) {
        free(p);
        return NULL;
    }
    p->kvx = k;
    p->instance = h->instance;
    p->next = k->peers;
    k->peers = p;
    return p;
}

/* ---- endpoints -------------------------------------------------------------------------------*/

/* UCX callback context: the endpoint failed; handled from the loop (TASK_PEER_ERR). */
static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    td_kvx_peer_t *p = arg;
    task_t *t = td__new_task(TASK_PEER_ERR);
    t->peer = p;
    t->ep = ep;
    t->status = td__ucs_to_td(st);
    td__queue_task(p->kvx, t);
}

/* The mechanism for p's new endpoint: opts.mech when forced, else from the endpoint's lanes. */
static td_kvx_mech_t detect_mech(td_kvx_peer_t *p)
{
    td_kvx_mech_t m = p->kvx->opts.mech;
    if (m != TD_KVX_MECH_AUTO)
        return m;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return TD_KVX_MECH_AM;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    /* Real one-sided puts: RDMA lanes, or shared-memory lanes (sysv/posix) into a peer pool that
     * UCX allocated (mapped by the sender; a private pool is reachable only by emulated puts).
     * Everything else (TCP) emulates puts in software: rendezvous AM is faster there. */
    bool put_lane = text && strstr(text, "put[");
    bool rdma = text && (strstr(text, "rc_") || strstr(text, "dc_") || strstr(text, "ud_") ||
                         strstr(text, "gga"));
    bool shm = text && (strstr(text, "sysv/") || strstr(text, "posix/"));
    free(text);
    if (put_lane && (rdma || (shm && (p->blob_flags & BLOB_F_UCX_POOL))))
        return TD_KVX_MECH_PUT;
    return TD_KVX_MECH_AM;
}

/* UCX callback context: a forced close finished; nothing is waiting for it. */
static void ep_close_cb(void *req, ucs_status_t st, void *user_data)
{
    ucp_request_free(req);
}

/* Destroy an rkey and force-close an endpoint (either may be NULL). */
static void force_close(ucp_ep_h ep, ucp_rkey_h rkey)
{
    if (rkey)
        ucp_rkey_destroy(rkey);
    if (ep) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
            .flags = UCP_EP_CLOSE_FLAG_FORCE,
            .cb.send = ep_close_cb,
        };
        ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
        (void)sp; /* a request completes through ep_close_cb; an error status means it is gone */
    }
}

void td__peer_close_ep(td_kvx_peer_t *p)
{
    if (p->ep || p->rkey) {
        force_close(p->ep, p->rkey);
        p->rkey = NULL;
    }
    if (p->ep) {
        p->ep = NULL;
        p->ep_gen++;
        p->ep_ops = 0;
        /* UCX may never complete some requests of the closed endpoint (a rendezvous send to a
         * dead receiver): the transfers stop waiting for them and complete with their error */
        td__xfer_give_up(p, -1);
        /* failed pulls and fetches waited for this: no more data reaches their blocks */
        for (xfer_t *x = p->tx; x; x = x->next)
            if ((x->kind == XFER_PULL || x->kind == XFER_FETCH) && x->status != 0)
                td__queue_tx_check(x);
    }
    p->tearing = false;
}

/* ---- retired endpoints ---------------------------------------------------------------------*/

void td__op_gen_done(td_kvx_peer_t *p, uint32_t gen)
{
    if (gen == p->ep_gen) {
        TD_ASSERT(p->ep_ops > 0);
        p->ep_ops--;
        return;
    }
    for (kvx_oldep_t *o = p->retired; o; o = o->next)
        if (o->gen == gen) {
            TD_ASSERT(o->ops_out > 0);
            o->ops_out--;
            return;
        }
    /* an endpoint already closed: its requests were detached and counted off then */
}

void td__peer_retire_ep(td_kvx_peer_t *p)
{
    td_kvx_t *k = p->kvx;
    if (!p->ep)
        return;
    kvx_oldep_t *o = calloc(1, sizeof(*o));
    if (!o) {
        /* no room to keep it: close it now, as a failed peer's (its transfers fail) */
        TD_LOG_W("kvx: peer %016llx: out of memory retiring its endpoint, closing it",
                 (unsigned long long)p->instance);
        td__peer_close_ep(p);
        p->state = PEER_IDLE;
        return;
    }
    uint64_t now = td_now_ns();
    o->ep = p->ep;
    o->rkey = p->rkey;
    o->gen = p->ep_gen;
    o->ops_out = p->ep_ops;
    o->grace_ns = now + RETIRE_GRACE_NS;
    o->deadline_ns = now + RETIRE_WAIT_NS;
    o->next = p->retired;
    p->retired = o;
    p->ep = NULL;
    p->rkey = NULL;
    p->ep_gen++;
    p->ep_ops = 0;
    p->state = PEER_IDLE;
    k->stats.eps_retired++;
    TD_LOG_I("kvx: peer %016llx: endpoint retired (%u operations on it), connecting afresh",
             (unsigned long long)p->instance, o->ops_out);
    td__start_timer(k);
}

void td__peer_close_retired(td_kvx_peer_t *p)
{
    while (p->retired) {
        kvx_oldep_t *o = p->retired;
        p->retired = o->next;
        force_close(o->ep, o->rkey);
        free(o);
    }
}

/* True while an incoming transfer from p begun on generation `gen` or earlier is open. */
static bool rx_before(const td_kvx_peer_t *p, uint32_t gen)
{
    for (const rx_t *r = p->rx; r; r = r->next)
        if (r->gen <= gen)
            return true;
    return false;
}

bool td__peer_retired_step(td_kvx_peer_t *p)
{
    uint64_t now = td_now_ns();
    kvx_oldep_t **pp = &p->retired;
    while (*pp) {
        kvx_oldep_t *o = *pp;
        /* done: nothing of ours on it, past the grace, and no incoming transfer from the peer
         * open (one the peer posted on its old endpoint before it read our HELLO may ride this
         * one); under steady incoming traffic, once those begun before the retirement are done
         * and the peer has had RETIRE_SETTLE_NS to switch */
        bool done = o->ops_out == 0 && now >= o->grace_ns &&
                    (!p->rx || (!rx_before(p, o->gen) && now >= o->grace_ns + RETIRE_SETTLE_NS));
        if (!done && now < o->deadline_ns) {
            pp = &o->next;
            continue;
        }
        if (!done)
            TD_LOG_W("kvx: peer %016llx: retired endpoint still busy (%u operations) after %.0f s, "
                     "closing it",
                     (unsigned long long)p->instance, o->ops_out, RETIRE_WAIT_NS / 1e9);
        *pp = o->next;
        force_close(o->ep, o->rkey);
        uint32_t gen = o->gen;
        bool left = o->ops_out > 0;
        free(o);
        if (left) /* what UCX may never complete there now fails (as for a failed peer) */
            td__xfer_give_up(p, gen);
    }
    return p->retired != NULL;
}

/* Create p's endpoint (peer error handling, error callback), unpack its rkey and choose the
 * mechanism. 0 or the UCX error, with no endpoint left open. */
static int create_ep(td_kvx_peer_t *p)
{
    td_kvx_t *k = p->kvx;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = p->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = peer_err_cb, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(k->worker, &ep_params, &p->ep);
    if (st != UCS_OK) {
        p->ep = NULL;
        return td__ucx_err(st, "ucp_ep_create");
    }
    st = ucp_ep_rkey_unpack(p->ep, p->rkey_buf, &p->rkey);
    if (st != UCS_OK) {
        int rc = td__ucx_err(st, "ucp_ep_rkey_unpack");
        td__peer_close_ep(p);
        return rc;
    }
    p->mech = detect_mech(p);
    return 0;
}

/* Create the endpoint and send HELLO with our blob. */
int td__peer_connect(td_kvx_peer_t *p)
{
    td_kvx_t *k = p->kvx;
    int rc = create_ep(p);
    if (rc < 0)
        return rc;
    rc = td__ctl_send(p, NULL, AM_HELLO, NULL, k->blob, k->blob_len);
    if (rc < 0) {
        td__peer_close_ep(p);
        return rc;
    }
    p->state = PEER_CONNECTING;
    p->deadline_ns = td_now_ns() + (uint64_t)(k->opts.connect_s * 1e9);
    td__start_timer(k);
    return 0;
}

/* ---- failure and teardown --------------------------------------------------------------------*/

/* Mark p failed: every transfer to and from it fails; teardown follows once its operations have
 * completed (or after TEARDOWN_WAIT_NS). */
void td__peer_fail(td_kvx_peer_t *p, int status)
{
    td_kvx_t *k = p->kvx;
    if (p->state != PEER_FAILED && p->state != PEER_REFUSED) {
        p->state = PEER_FAILED;
        k->stats.peer_failures++;
    }
    p->fail_status = status;
    for (xfer_t *x = p->tx; x; x = x->next) {
        if (x->status == 0)
            x->status = status;
        td__queue_tx_check(x);
    }
    for (rx_t *r = p->rx; r; r = r->next) {
        if (r->status == 0)
            r->status = status;
        td__queue_rx_check(r);
    }
    if (p->ep && !p->tearing) {
        p->tearing = true;
        p->deadline_ns = td_now_ns() + TEARDOWN_WAIT_NS;
        td__start_timer(k);
    }
}

/* Teardown order for a failed peer: its operations first (UCX completes them with errors once the
 * endpoint failed), then its rkey, then a forced endpoint close. */
void td__peer_teardown_step(td_kvx_peer_t *p)
{
    if (!p->tearing)
        return;
    if (p->ops_out > 0 && td_now_ns() < p->deadline_ns)
        return;
    if (p->ops_out > 0)
        TD_LOG_W("kvx: peer %016llx: %u operations still pending after %.1f s, forcing close",
                 (unsigned long long)p->instance, p->ops_out, TEARDOWN_WAIT_NS / 1e9);
    td__peer_close_retired(p); /* the peer failed: its old endpoints go too */
    td__peer_close_ep(p);
    /* transfers queued after the failure reconnect from the stored blob */
    bool queued = false;
    for (xfer_t *x = p->tx; x; x = x->next)
        if (!x->posted && x->status == 0)
            queued = true;
    if (queued && !p->kvx->closing) {
        p->state = PEER_IDLE;
        int rc = td__peer_connect(p);
        if (rc < 0)
            td__peer_fail(p, rc);
    }
}

/* An endpoint error reported by peer_err_cb: fail the peer unless that endpoint was already
 * replaced or closed. */
void td__peer_ep_error(td_kvx_t *k, task_t *t)
{
    if (t->ep == t->peer->ep && t->peer->ep) {
        TD_LOG_W("kvx: peer %016llx failed: %s", (unsigned long long)t->peer->instance,
                 td_strerror(t->status));
        td__peer_fail(t->peer, t->status);
    }
}

/* ---- handshake -------------------------------------------------------------------------------*/

/* A HELLO: learn (or re-learn) the sender from its blob, open our endpoint back, answer with
 * HELLO_ACK (TD_EMISMATCH when its layout differs), and start the transfers waiting for it. */
void td__peer_hello(td_kvx_t *k, task_t *t)
{
    blob_hdr_t h;
    int rc = parse_blob(k, t->data, t->len, &h);
    if (rc == TD_EPARSE || rc == TD_EINVAL) {
        TD_LOG_W("kvx: dropped HELLO: %s", td_err_msg());
        return;
    }
    td_kvx_peer_t *p = td__find_peer(k, h.instance);
    if (!p) {
        p = new_peer(k, &h, t->data, t->len);
        if (!p) {
            TD_LOG_E("kvx: out of memory for a new peer");
            return;
        }
    }
    if (rc == TD_EMISMATCH) {
        TD_LOG_W("kvx: refused peer %016llx: %s", (unsigned long long)h.instance, td_err_msg());
        p->state = PEER_REFUSED;
    }
    if (p->tearing) {
        td__peer_close_retired(p);
        td__peer_close_ep(p); /* the peer came back before our teardown finished */
    }
    if (h.epoch > p->epoch && p->state != PEER_REFUSED) {
        /* a new epoch: the peer may have been cut off, and our endpoint to it may sit behind
         * TCP's retransmission backoff; answer on a fresh one */
        if (store_blob(p, &h, t->data, t->len) == 0)
            td__peer_retire_ep(p);
    }
    if (!p->ep) {
        rc = create_ep(p);
        if (rc < 0) {
            TD_LOG_W("kvx: cannot answer HELLO of %016llx: %s", (unsigned long long)h.instance,
                     td_err_msg());
            return;
        }
        if (p->state != PEER_REFUSED)
            p->state = PEER_READY;
    }
    wire_hdr_t a = {.status = p->state == PEER_REFUSED ? TD_EMISMATCH : 0};
    td__ctl_send(p, NULL, AM_HELLO_ACK, &a, NULL, 0);
    if (p->state == PEER_READY)
        for (xfer_t *x = p->tx; x; x = x->next)
            td__queue_tx_check(x);
}

/* The answer to our HELLO: ready (start the queued transfers), or refused (fail them). */
void td__peer_hello_ack(td_kvx_t *k, task_t *t)
{
    td_kvx_peer_t *p = td__find_peer(k, t->hdr.instance);
    if (!p || p->state != PEER_CONNECTING)
        return;
    if (t->hdr.status == 0) {
        p->state = PEER_READY;
        for (xfer_t *x = p->tx; x; x = x->next)
            td__queue_tx_check(x);
        return;
    }
    TD_LOG_W("kvx: peer %016llx refused us: %s", (unsigned long long)p->instance,
             td_strerror(t->hdr.status));
    td__peer_fail(p, t->hdr.status);
    if (t->hdr.status == TD_EMISMATCH)
        p->state = PEER_REFUSED;
}

/* ---- public API ------------------------------------------------------------------------------*/

int td_kvx_connect(td_kvx_t *k, const void *blob, size_t len, td_kvx_peer_t **out)
{
    blob_hdr_t h;
    *out = NULL;
    int rc = parse_blob(k, blob, len, &h);
    if (rc < 0)
        return rc;
    td_kvx_peer_t *p = td__find_peer(k, h.instance);
    if (!p) {
        p = new_peer(k, &h, blob, len);
        if (!p)
            return TD_ENOMEM;
    }
    if (p->state == PEER_REFUSED)
        return td_err_set(TD_EMISMATCH, "kvx: peer %016llx refused our layout",
                          (unsigned long long)p->instance);
    if (h.epoch > p->epoch) {
        /* the peer started a new epoch (it registered again after losing the control plane):
         * new transfers go on a fresh endpoint */
        if (store_blob(p, &h, blob, len) < 0)
            return TD_ENOMEM;
        if (!p->tearing && (p->state == PEER_READY || p->state == PEER_CONNECTING))
            td__peer_retire_ep(p);
    }
    if (p->state == PEER_IDLE || (p->state == PEER_FAILED && !p->tearing)) {
        rc = td__peer_connect(p);
        if (rc < 0)
            return rc;
    }
    *out = p;
    return 0;
}

/* Pushes and pulls we started; the pullbacks answering the peer's pulls do not count. */
uint32_t td_kvx_peer_pending(const td_kvx_peer_t *p)
{
    uint32_t n = 0;
    for (const xfer_t *x = p->tx; x; x = x->next)
        if (x->kind != XFER_PULLBACK)
            n++;
    return n;
}

bool td_kvx_peer_ready(const td_kvx_peer_t *p)
{
    return p->state == PEER_READY;
}

td_kvx_mech_t td_kvx_peer_mech(const td_kvx_peer_t *p)
{
    return p->ep ? p->mech : TD_KVX_MECH_AUTO;
}

/* recv.c: incoming transfers. The active-message handler checks each message's header and turns
 * it into a task or into state of the receive it belongs to (rx_t, one per sender transfer id):
 * DATA runs are received straight into the pool, DONE carries the destination ids, checksums and
 * note. Once DONE and every run are in, td__rx_check verifies the checksums, delivers the
 * transfer to on_recv (or, for the answer to one of our pulls or fetches, completes it) and sends
 * the ACK.
 *
 * Ownership: a receive (rx_t) is owned by its peer's rx list until td__rx_check frees it; a
 * rendezvous descriptor UCX hands to am_cb stays UCX's, kept alive by returning UCS_INPROGRESS,
 * until td__rx_recv receives it from the loop.
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* True when blocks [first, first + n) are a non-empty range inside our pool. */
static bool range_ok(const td_kvx_t *k, uint32_t first, uint32_t n)
{
    return n > 0 && first < k->layout.n_blocks && n <= k->layout.n_blocks - first;
}

/* The receive of p's transfer `id`; when `create`, a new one if none (never NULL then: aborts
 * when out of memory, as it runs in UCX callback context). */
static rx_t *find_rx(td_kvx_peer_t *p, uint64_t id, bool create)
{
    for (rx_t *r = p->rx; r; r = r->next)
        if (r->xfer_id == id)
            return r;
    if (!create)
        return NULL;
    rx_t *r = calloc(1, sizeof(*r));
    TD_ASSERT(r != NULL);
    r->peer = p;
    r->xfer_id = id;
    r->gen = p->ep_gen;
    r->next = p->rx;
    p->rx = r;
    return r;
}

/* UCX callback context: one rendezvous data run of r is in place (or failed). */
static void recv_data_cb(void *req, ucs_status_t st, size_t length, void *user_data)
{
    rx_t *r = user_data;
    td__op_finished(r->peer, NULL, r, st);
    ucp_request_free(req);
}

/* Whether messages other than HELLO / HELLO_ACK from p are taken: p known, connecting or
 * ready. */
static bool peer_accepts(const td_kvx_peer_t *p)
{
    return p && (p->state == PEER_READY || p->state == PEER_CONNECTING);
}

/* UCX callback context: every active message (UCP_AM_FLAG_WHOLE_MSG). Drops malformed messages
 * and those from unknown or refused peers; eager payloads are copied before returning, DATA
 * rendezvous descriptors are kept (UCS_INPROGRESS) for td__rx_recv. */
static ucs_status_t am_cb(void *arg, const void *header, size_t header_len, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    td_kvx_t *k = arg;
    wire_hdr_t h;
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    if (header_len != sizeof(h)) {
        TD_LOG_W("kvx: dropped message with a %zu-byte header", header_len);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if (h.magic != KVX_MAGIC || h.version != KVX_VERSION || h.type == 0 || h.type >= AM_LAST_) {
        TD_LOG_W("kvx: dropped message with bad magic/version/type");
        return UCS_OK;
    }
    if (h.type == AM_HELLO) {
        task_t *t = td__new_task(TASK_HELLO);
        t->hdr = h;
        t->data = malloc(len ? len : 1);
        TD_ASSERT(t->data != NULL);
        if (!rndv)
            memcpy(t->data, data, len);
        t->len = rndv ? 0 : len;
        td__queue_task(k, t);
        return UCS_OK;
    }
    td_kvx_peer_t *p = td__find_peer(k, h.instance);
    if (h.type == AM_HELLO_ACK) {
        task_t *t = td__new_task(TASK_HELLO_ACK);
        t->hdr = h;
        td__queue_task(k, t);
        return UCS_OK;
    }
    if (!peer_accepts(p)) {
        TD_LOG_W("kvx: dropped message type %u from unknown or refused peer %016llx", h.type,
                 (unsigned long long)h.instance);
        return UCS_OK;
    }
    switch (h.type) {
    case AM_DATA: {
        rx_t *r = find_rx(p, h.xfer_id, true);
        uint64_t bb = k->layout.block_bytes;
        if (!range_ok(k, h.block, h.n_blocks) || len != (uint64_t)h.n_blocks * bb) {
            if (r->status == 0)
                r->status = td_err_set(TD_EPROTO, "kvx: data run %u+%u (%zu bytes) outside pool",
                                       h.block, h.n_blocks, len);
            td__queue_rx_check(r);
            return UCS_OK;
        }
        uint8_t *dst = k->pool + h.block * bb;
        if (!rndv) {
            memcpy(dst, data, len);
            r->runs_done++;
            td__queue_rx_check(r);
            return UCS_OK;
        }
        task_t *t = td__new_task(TASK_RECV);
        t->peer = p;
        t->rx = r;
        t->desc = data;
        t->dst = dst;
        t->len = len;
        r->ops_out++;
        p->ops_out++;
        td__queue_task(k, t);
        return UCS_INPROGRESS; /* received from the loop: no UCX calls from this callback */
    }
    case AM_DONE: {
        rx_t *r = find_rx(p, h.xfer_id, true);
        size_t want = (size_t)h.n_blocks * 4 +
                      (h.flags & TD_KVX_F_CSUM ? (size_t)h.n_blocks * 8 : 0) + h.note_len;
        if (rndv || len != want || h.n_blocks > k->layout.n_blocks ||
            h.note_len > TD_KVX_NOTE_MAX) {
            if (r->status == 0)
                r->status = TD_EPROTO;
            r->n_blocks = 0;
        } else {
            r->done_payload = malloc(len ? len : 1);
            TD_ASSERT(r->done_payload != NULL);
            memcpy(r->done_payload, data, len);
            r->n_blocks = h.n_blocks;
            r->note_len = h.note_len;
            const uint32_t *ids = (const uint32_t *)r->done_payload;
            for (uint32_t i = 0; i < h.n_blocks; i++)
                if (ids[i] >= k->layout.n_blocks && r->status == 0)
                    r->status = TD_EPROTO;
        }
        if (h.status < 0 && r->status == 0)
            r->status = h.status;
        r->done_seen = true;
        r->n_runs = h.n_runs;
        r->flags = h.flags;
        r->pull_id = h.pull_id;
        td__queue_rx_check(r);
        return UCS_OK;
    }
    case AM_ACK: {
        task_t *t = td__new_task(TASK_ACK);
        t->peer = p;
        t->hdr = h;
        td__queue_task(k, t);
        return UCS_OK;
    }
    case AM_PULL:
    case AM_FETCH: {
        task_t *t = td__new_task(h.type == AM_PULL ? TASK_PULL : TASK_FETCH);
        t->peer = p;
        t->hdr = h;
        t->len = rndv ? 0 : len;
        t->data = malloc(len ? len : 1);
        TD_ASSERT(t->data != NULL);
        if (!rndv)
            memcpy(t->data, data, len);
        td__queue_task(k, t);
        return UCS_OK;
    }
    }
    return UCS_OK;
}

/* A receive is complete: verify, deliver, acknowledge, forget. */
void td__rx_check(rx_t *r)
{
    td_kvx_peer_t *p = r->peer;
    td_kvx_t *k = p->kvx;
    r->check_queued = false;
    if (r->ops_out > 0)
        return;
    bool complete = r->done_seen && r->runs_done >= r->n_runs;
    if (!complete && r->status == 0)
        return;
    if (!r->done_seen && p->state != PEER_FAILED && !k->closing) {
        /* a bad run before DONE: wait for DONE so the ACK can name the error */
        return;
    }
    int status = r->status;
    const uint32_t *ids = (const uint32_t *)r->done_payload;
    if (status == 0 && (r->flags & TD_KVX_F_CSUM)) {
        for (uint32_t i = 0; i < r->n_blocks; i++) {
            uint64_t want;
            memcpy(&want, r->done_payload + (size_t)r->n_blocks * 4 + (size_t)i * 8, 8);
            uint64_t got =
                XXH3_64bits(k->pool + ids[i] * k->layout.block_bytes, k->layout.block_bytes);
            if (got != want) {
                status = td_err_set(TD_ECHECKSUM,
                                    "kvx: block %u from peer %016llx: checksum "
                                    "%016llx, sender said %016llx",
                                    ids[i], (unsigned long long)p->instance,
                                    (unsigned long long)got, (unsigned long long)want);
                break;
            }
        }
    }
    /* unlink before calling out */
    rx_t **pp = &p->rx;
    while (*pp != r)
        pp = &(*pp)->next;
    *pp = r->next;
    if (status == 0)
        k->stats.recv_ok++;
    else
        k->stats.recv_failed++;
    if (r->pull_id) {
        /* the answer to one of our pulls */
        for (xfer_t *x = p->tx; x; x = x->next) {
            if (x->id == r->pull_id && (x->kind == XFER_PULL || x->kind == XFER_FETCH)) {
                int st = x->kind == XFER_FETCH ? td__fetch_answered(x, r, status) : status;
                if (x->status == 0)
                    x->status = st;
                x->acked = true;
                td__queue_tx_check(x);
                break;
            }
        }
    } else if (k->opts.on_recv && !k->closing) {
        size_t note_off =
            (size_t)r->n_blocks * 4 + (r->flags & TD_KVX_F_CSUM ? (size_t)r->n_blocks * 8 : 0);
        td_kvx_recv_t info = {
            .status = status,
            .blocks = ids,
            .n_blocks = ids ? r->n_blocks : 0,
            .note = ids && r->note_len ? r->done_payload + note_off : NULL,
            .note_len = ids ? r->note_len : 0,
        };
        k->opts.on_recv(k, p, &info, k->opts.arg);
    }
    /* CONNECTING too: after a new epoch (td_kvx_renew) a transfer the peer began on the retired
     * endpoint completes while our HELLO on the fresh one is unanswered; UCX sends the ACK once
     * the fresh endpoint is wired up */
    if (r->done_seen && (p->state == PEER_READY || p->state == PEER_CONNECTING) && p->ep) {
        wire_hdr_t h = {.xfer_id = r->xfer_id, .status = status};
        td__ctl_send(p, NULL, AM_ACK, &h, NULL, 0);
    }
    free(r->done_payload);
    free(r);
}

/* Receive one rendezvous data run queued by am_cb; completes through recv_data_cb. */
void td__rx_recv(td_kvx_t *k, task_t *t)
{
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
        .cb.recv_am = recv_data_cb,
        .user_data = t->rx,
        .memh = k->memh,
    };
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(k->worker, t->desc, t->dst, t->len, &prm);
    if (!UCS_PTR_IS_PTR(sp))
        td__op_finished(t->peer, NULL, t->rx, UCS_PTR_STATUS(sp));
}

int td__recv_set_handlers(td_kvx_t *k)
{
    for (unsigned id = AM_HELLO; id < AM_LAST_; id++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            .id = id,
            .cb = am_cb,
            .arg = k,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
        };
        ucs_status_t st = ucp_worker_set_am_recv_handler(k->worker, &hp);
        if (st != UCS_OK)
            return td__ucx_err(st, "ucp_worker_set_am_recv_handler");
    }
    return 0;
}

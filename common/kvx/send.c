/* send.c: outgoing transfers. A push (or a pullback answering a peer's pull) is coalesced into
 * runs and each run posted as one UCX operation: a rendezvous active message (AM) or a put
 * followed by a flush (PUT); then DONE names the destination ids, checksums and note, and the
 * transfer completes when the receiver's ACK arrives or it fails. A pull is one PULL message; it
 * completes when the peer's answering DONE has been received and verified (recv.c). Also the
 * control-message sender every file uses.
 *
 * Ownership: a transfer (xfer_t) is owned by its peer's tx list from td_kvx_push/pull until
 * td__tx_check completes it; the source (push) or destination (pull) blocks are the caller's and
 * UCX may read or write them until the transfer's callback runs.
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint32_t td_kvx_coalesce(const uint32_t *src, const uint32_t *dst, uint32_t n, td_kvx_run_t *runs)
{
    uint32_t nr = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (nr > 0) {
            td_kvx_run_t *r = &runs[nr - 1];
            uint32_t last = r->first + r->len - 1;
            if (src[i] == src[last] + 1 && dst[i] == dst[last] + 1 && src[last] != UINT32_MAX &&
                dst[last] != UINT32_MAX) {
                r->len++;
                continue;
            }
        }
        runs[nr].first = i;
        runs[nr].len = 1;
        nr++;
    }
    return nr;
}

/* ---- request handles -------------------------------------------------------------------------*/

/* A new handle for one request on p, of x when given (with `len` bytes of payload room), linked
 * on x->ops and counted on p and x. NULL when out of memory (nothing counted then). */
static kvx_op_t *op_new(td_kvx_peer_t *p, xfer_t *x, size_t len)
{
    kvx_op_t *o = calloc(1, sizeof(*o) + len);
    if (!o)
        return NULL;
    o->kvx = p->kvx;
    o->peer = p;
    o->x = x;
    o->gen = p->ep_gen;
    p->ep_ops++;
    p->ops_out++;
    if (x) {
        x->ops_out++;
        o->next = x->ops;
        if (x->ops)
            x->ops->prev = o;
        x->ops = o;
    }
    return o;
}

/* Unlink o from the list it is on (x->ops, k->orphans, or none). */
static void op_unlink(kvx_op_t *o)
{
    kvx_op_t **head = o->detached ? &o->kvx->orphans : o->x ? &o->x->ops : NULL;
    if (!head)
        return;
    if (o->prev)
        o->prev->next = o->next;
    else
        *head = o->next;
    if (o->next)
        o->next->prev = o->prev;
    o->prev = o->next = NULL;
}

/* UCX callback context: o's request completed with st: account it unless it was detached, and
 * free o. */
static void op_done(kvx_op_t *o, ucs_status_t st)
{
    op_unlink(o);
    if (!o->detached) {
        td__op_gen_done(o->peer, o->gen);
        td__op_finished(o->peer, o->x, NULL, st);
    }
    free(o);
}

/* UCX callback context: a send request (data run, flush, control message) completed or failed. */
static void op_send_cb(void *req, ucs_status_t st, void *user_data)
{
    op_done(user_data, st);
    ucp_request_free(req);
}

/* Undo op_new for a request that finished at posting, and free o. */
static void op_cancel(kvx_op_t *o)
{
    op_unlink(o);
    td__op_gen_done(o->peer, o->gen);
    o->peer->ops_out--;
    if (o->x)
        o->x->ops_out--;
    free(o);
}

/* Count what posting o's request (of a transfer) returned: in flight (a request: op_send_cb
 * finishes it), or finished at once (NULL, or an error: the first error is recorded on x). */
static void track(kvx_op_t *o, ucs_status_ptr_t sp)
{
    xfer_t *x = o->x;
    if (UCS_PTR_IS_PTR(sp))
        return;
    op_cancel(o);
    ucs_status_t st = UCS_PTR_STATUS(sp);
    if (st != UCS_OK && x->status == 0)
        x->status = td__ucs_to_td(st);
}

/* True when generation `gen` of p's endpoints is a retired endpoint still open. */
static bool gen_open(const td_kvx_peer_t *p, uint32_t gen)
{
    for (const kvx_oldep_t *o = p->retired; o; o = o->next)
        if (o->gen == gen)
            return true;
    return false;
}

/* Whether td__xfer_give_up(p, gen) gives up on o. */
static bool gives_up(const td_kvx_peer_t *p, const kvx_op_t *o, int64_t gen)
{
    return gen >= 0 ? o->gen == (uint32_t)gen : !gen_open(p, o->gen);
}

/* Detach the request handles of x that td__xfer_give_up(p, gen) gives up on (all when gen is
 * INT64_MIN: td_kvx_close) (see kvx_op_t): uncounted on x and its peer, moved to k->orphans; a
 * late completion only frees the handle. */
static void detach_ops(xfer_t *x, int64_t gen)
{
    td_kvx_peer_t *p = x->peer;
    td_kvx_t *k = p->kvx;
    kvx_op_t *next;
    for (kvx_op_t *o = x->ops; o; o = next) {
        next = o->next;
        if (gen != INT64_MIN && !gives_up(p, o, gen))
            continue;
        op_unlink(o);
        TD_ASSERT(p->ops_out > 0 && x->ops_out > 0);
        td__op_gen_done(p, o->gen);
        p->ops_out--;
        x->ops_out--;
        o->x = NULL;
        o->detached = true;
        o->next = k->orphans;
        if (k->orphans)
            k->orphans->prev = o;
        k->orphans = o;
    }
}

void td__xfer_give_up(td_kvx_peer_t *p, int64_t gen)
{
    uint32_t n_ops = 0, n_x = 0;
    for (xfer_t *x = p->tx; x; x = x->next) {
        uint32_t before = x->ops_out;
        detach_ops(x, gen);
        if (x->ops_out == before)
            continue;
        n_ops += before - x->ops_out;
        n_x++;
        if (x->status == 0)
            x->status = td_err_set(TD_ECONNRESET, "kvx: peer %016llx: endpoint closed",
                                   (unsigned long long)p->instance);
        td__queue_tx_check(x);
    }
    if (n_x > 0)
        TD_LOG_W("kvx: peer %016llx: %u transfers give up on %u operations UCX did not complete "
                 "on the closed endpoint",
                 (unsigned long long)p->instance, n_x, n_ops);
}

void td__free_orphans(td_kvx_t *k)
{
    TD_ASSERT(k->worker == NULL);
    while (k->orphans) {
        kvx_op_t *o = k->orphans;
        k->orphans = o->next;
        free(o);
    }
}

/* ---- sending control messages ----------------------------------------------------------------*/

/* Send a control message on p's endpoint. The header and the payload copy live in the request's
 * handle until the send completes. Counts as one operation of p (and of x when given). */
int td__ctl_send(td_kvx_peer_t *p, xfer_t *x, uint32_t type, const wire_hdr_t *proto,
                 const void *payload, size_t len)
{
    td_kvx_t *k = p->kvx;
    if (!p->ep)
        return td_err_set(TD_ECONNRESET, "kvx: peer %016llx has no endpoint",
                          (unsigned long long)p->instance);
    kvx_op_t *m = op_new(p, x, len);
    if (!m)
        return TD_ENOMEM;
    if (proto)
        m->hdr = *proto;
    m->hdr.magic = KVX_MAGIC;
    m->hdr.version = KVX_VERSION;
    m->hdr.type = type;
    m->hdr.instance = k->instance;
    if (len)
        memcpy(m->payload, payload, len);
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = op_send_cb,
        .user_data = m,
        /* eager: the receiver gets the whole message in its callback (no rendezvous to answer) */
        .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
    };
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(p->ep, type, &m->hdr, sizeof(m->hdr), m->payload, len, &prm);
    if (UCS_PTR_IS_PTR(sp))
        return 0;
    ucs_status_t st = UCS_PTR_STATUS(sp);
    op_cancel(m); /* finished at posting: x's status untouched (the caller records rc) */
    if (st != UCS_OK)
        return td__ucx_err(st, "am send");
    return 0;
}

/* ---- posting data ----------------------------------------------------------------------------*/

/* Post the data operations of a push (or pullback) on a ready peer. */
static void post_push(xfer_t *x)
{
    td_kvx_peer_t *p = x->peer;
    td_kvx_t *k = p->kvx;
    uint64_t bb = k->layout.block_bytes;
    td_kvx_run_t *runs = malloc(sizeof(*runs) * (x->n ? x->n : 1));
    if (!runs) {
        x->status = TD_ENOMEM;
        x->posted = true;
        return;
    }
    uint32_t nr = x->n ? td_kvx_coalesce(x->src, x->dst, x->n, runs) : 0;
    x->posted = true;
    bool am = p->mech != TD_KVX_MECH_PUT;
    for (uint32_t i = 0; i < nr && x->status == 0; i++) {
        uint32_t s = x->src[runs[i].first], d = x->dst[runs[i].first], len = runs[i].len;
        kvx_op_t *o = op_new(p, x, 0);
        if (!o) {
            x->status = TD_ENOMEM;
            break;
        }
        ucp_request_param_t prm = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = op_send_cb,
            .user_data = o,
            .memh = k->memh,
        };
        k->stats.ops_posted++;
        ucs_status_ptr_t sp;
        if (am) {
            o->hdr = (wire_hdr_t){.magic = KVX_MAGIC,
                                  .version = KVX_VERSION,
                                  .type = AM_DATA,
                                  .instance = k->instance,
                                  .xfer_id = x->id,
                                  .block = d,
                                  .n_blocks = len};
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY;
            sp = ucp_am_send_nbx(p->ep, AM_DATA, &o->hdr, sizeof(o->hdr), k->pool + s * bb,
                                 len * bb, &prm);
        } else {
            sp = ucp_put_nbx(p->ep, k->pool + s * bb, len * bb, p->pool_addr + d * bb, p->rkey,
                             &prm);
        }
        track(o, sp);
    }
    free(runs);
    x->payload_b = (uint64_t)x->n * bb;
    if (!am && x->status == 0) {
        /* remote completion of every put before the notification */
        kvx_op_t *o = op_new(p, x, 0);
        if (o) {
            ucp_request_param_t prm = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                .cb.send = op_send_cb,
                .user_data = o,
            };
            track(o, ucp_ep_flush_nbx(p->ep, &prm));
        } else {
            x->status = TD_ENOMEM;
        }
    }
    x->remote_done = nr; /* runs the receiver must see (AM) */
    if (!am)
        x->remote_done = 0;
}

/* Send DONE for a push: ids, checksums, note. AM: right after the data (the receiver waits for
 * every run); PUT: after the flush completed. */
static void send_done(xfer_t *x, int32_t status)
{
    td_kvx_peer_t *p = x->peer;
    td_kvx_t *k = p->kvx;
    bool csum = x->flags & TD_KVX_F_CSUM;
    size_t len = (size_t)x->n * 4 + (csum ? (size_t)x->n * 8 : 0) + x->note_len;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        x->status = TD_ENOMEM;
        x->done_sent = true;
        return;
    }
    memcpy(buf, x->dst, (size_t)x->n * 4);
    if (csum && status == 0) {
        for (uint32_t i = 0; i < x->n; i++) {
            uint64_t c =
                XXH3_64bits(k->pool + x->src[i] * k->layout.block_bytes, k->layout.block_bytes);
            if (i == 0 && (x->flags & TD_KVX_F_TEST_BAD_CSUM))
                c ^= 1;
            memcpy(buf + (size_t)x->n * 4 + (size_t)i * 8, &c, 8);
        }
    }
    if (x->note_len)
        memcpy(buf + len - x->note_len, x->note, x->note_len);
    wire_hdr_t h = {.xfer_id = x->id,
                    .pull_id = x->pull_id,
                    .status = status,
                    .flags = x->flags & TD_KVX_F_CSUM,
                    .n_blocks = x->n,
                    .n_runs = status == 0 ? (uint32_t)x->remote_done : 0,
                    .note_len = x->note_len};
    x->done_sent = true;
    int rc = td__ctl_send(p, x, AM_DONE, &h, buf, len);
    free(buf);
    if (rc < 0 && x->status == 0)
        x->status = rc;
}

/* Send PULL for a pull: the peer's source ids, then our destination ids. */
static void send_pull(xfer_t *x)
{
    size_t len = (size_t)x->n * 8;
    uint8_t *buf = malloc(len);
    if (!buf) {
        x->status = TD_ENOMEM;
        x->done_sent = true;
        return;
    }
    memcpy(buf, x->src, (size_t)x->n * 4);
    memcpy(buf + (size_t)x->n * 4, x->dst, (size_t)x->n * 4);
    wire_hdr_t h = {.xfer_id = x->id, .flags = x->flags, .n_blocks = x->n};
    x->posted = true;
    x->done_sent = true;
    int rc = td__ctl_send(x->peer, x, AM_PULL, &h, buf, len);
    free(buf);
    if (rc < 0 && x->status == 0)
        x->status = rc;
}

/* ---- transfer lifetime -----------------------------------------------------------------------*/

void td__xfer_free(xfer_t *x)
{
    if (x->ops)
        detach_ops(x, INT64_MIN); /* td_kvx_close: UCX may still complete them while it destroys
                                     the worker */
    TD_ASSERT(x->ops_out == 0);
    free(x->src);
    free(x->dst);
    free(x->note);
    free(x->keys);
    free(x);
}

void td__xfer_unlink(xfer_t *x)
{
    xfer_t **pp = &x->peer->tx;
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    TD_ASSERT(*pp == x);
    *pp = x->next;
}

/* Advance an outgoing transfer; complete it when nothing references it any more. */
void td__tx_check(xfer_t *x)
{
    td_kvx_peer_t *p = x->peer;
    td_kvx_t *k = p->kvx;
    x->check_queued = false;
    bool asks = x->kind == XFER_PULL || x->kind == XFER_FETCH;
    if (x->status == 0 && p->state == PEER_READY) {
        if (asks) {
            if (!x->posted) {
                if (x->kind == XFER_PULL)
                    send_pull(x);
                else
                    td__fetch_send(x);
            }
        } else {
            if (!x->posted)
                post_push(x);
            bool am = p->mech != TD_KVX_MECH_PUT;
            if (x->status == 0 && !x->done_sent && (am || x->ops_out == 0))
                send_done(x, 0);
        }
    }
    if (x->ops_out > 0)
        return;
    TD_ASSERT(x->ops == NULL);
    if (x->status == 0 && !x->acked)
        return;
    /* a failed pull or fetch whose peer failed: the peer's pushes into our blocks may still be
     * in flight until the endpoint is closed (td__peer_close_ep checks it again then) */
    if (x->status != 0 && asks && p->tearing)
        return;
    if (x->status == 0 && !asks)
        k->stats.bytes_pushed += x->payload_b;
    td__xfer_unlink(x);
    td__xfer_callback(x, x->status || !k->closing ? x->status : TD_ECANCELED);
    td__xfer_free(x);
}

void td__xfer_callback(xfer_t *x, int status)
{
    if (x->kind == XFER_FETCH && x->fcb)
        x->fcb(status, status == 0 ? x->n_got : 0, x->arg);
    else if (x->cb)
        x->cb(status, x->arg);
}

xfer_t *td__xfer_new(td_kvx_peer_t *p, xfer_kind_t kind, const uint32_t *src, const uint32_t *dst,
                     uint32_t n)
{
    xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    x->src = calloc((size_t)(n ? n : 1), 4);
    x->dst = malloc((size_t)(n ? n : 1) * 4);
    if (!x->src || !x->dst) {
        td__xfer_free(x);
        return NULL;
    }
    if (n && src)
        memcpy(x->src, src, (size_t)n * 4);
    if (n)
        memcpy(x->dst, dst, (size_t)n * 4);
    x->peer = p;
    x->kind = kind;
    x->n = n;
    x->id = ++p->kvx->next_id;
    /* append: transfers to one peer start in submission order */
    xfer_t **pp = &p->tx;
    while (*pp)
        pp = &(*pp)->next;
    *pp = x;
    return x;
}

/* 0 when every id is below limit, else TD_ERANGE naming the first bad one and its index. */
int td__check_ids(uint32_t limit, const uint32_t *ids, uint32_t n, const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= limit)
            return td_err_set(TD_ERANGE, "kvx: %s block %u (index %u) >= pool size %u", what,
                              ids[i], i, limit);
    return 0;
}

/* td_kvx_push and td_kvx_pull: check, copy, connect when needed, and queue the first check.
 * Same return contract as td_kvx_push (cb runs only when this returns 0). */
static int start_xfer(td_kvx_peer_t *p, xfer_kind_t kind, const uint32_t *src, const uint32_t *dst,
                      uint32_t n, const void *note, uint32_t note_len, unsigned flags,
                      td_kvx_done_cb cb, void *arg)
{
    td_kvx_t *k = p->kvx;
    if (k->closing)
        return td_err_set(TD_ECLOSED, "kvx: closing");
    if (n == 0 || !src || !dst || !cb)
        return td_err_set(TD_EINVAL, "kvx: empty transfer or missing callback");
    if (note_len > TD_KVX_NOTE_MAX || (note_len && !note))
        return td_err_set(TD_EINVAL, "kvx: note of %u bytes (max %u)", note_len, TD_KVX_NOTE_MAX);
    if (p->state == PEER_REFUSED)
        return td_err_set(TD_EMISMATCH, "kvx: peer %016llx refused our layout",
                          (unsigned long long)p->instance);
    bool push = kind == XFER_PUSH;
    int rc = td__check_ids(push ? k->layout.n_blocks : p->n_blocks, src, n,
                       push ? "source" : "remote source");
    if (rc == 0)
        rc = td__check_ids(push ? p->n_blocks : k->layout.n_blocks, dst, n,
                       push ? "remote destination" : "destination");
    if (rc < 0)
        return rc;
    xfer_t *x = td__xfer_new(p, kind, src, dst, n);
    if (!x)
        return TD_ENOMEM;
    if (note_len) {
        x->note = malloc(note_len);
        if (!x->note) {
            td__xfer_unlink(x);
            td__xfer_free(x);
            return TD_ENOMEM;
        }
        memcpy(x->note, note, note_len);
        x->note_len = note_len;
    }
    x->flags = flags;
    x->cb = cb;
    x->arg = arg;
    return td__xfer_launch(x);
}

int td__xfer_launch(xfer_t *x)
{
    td_kvx_peer_t *p = x->peer;
    if (p->state == PEER_IDLE || (p->state == PEER_FAILED && !p->tearing)) {
        int rc = td__peer_connect(p);
        if (rc < 0) {
            td__xfer_unlink(x);
            td__xfer_free(x);
            return rc;
        }
    }
    td__queue_tx_check(x); /* posted from the loop, never from inside the caller's stack */
    return 0;
}

int td_kvx_push(td_kvx_peer_t *p, const uint32_t *src, const uint32_t *dst, uint32_t n,
                const void *note, uint32_t note_len, unsigned flags, td_kvx_done_cb cb, void *arg)
{
    return start_xfer(p, XFER_PUSH, src, dst, n, note, note_len, flags, cb, arg);
}

int td_kvx_pull(td_kvx_peer_t *p, const uint32_t *src, const uint32_t *dst, uint32_t n,
                unsigned flags, td_kvx_done_cb cb, void *arg)
{
    return start_xfer(p, XFER_PULL, src, dst, n, NULL, 0, flags, cb, arg);
}

/* ---- answers from the peer -------------------------------------------------------------------*/

/* The ACK names one of our pushes or pullbacks; an unknown id (already failed) is ignored. */
void td__tx_ack(td_kvx_t *k, task_t *t)
{
    for (xfer_t *x = t->peer->tx; x; x = x->next) {
        if (x->id == t->hdr.xfer_id && (x->kind == XFER_PUSH || x->kind == XFER_PULLBACK)) {
            if (t->hdr.status < 0 && x->status == 0)
                x->status = t->hdr.status;
            x->acked = true;
            td__queue_tx_check(x);
            break;
        }
    }
}

/* Serve a PULL: a pullback (a push without user callback) of the requested blocks, queued until
 * the peer is ready; a bad request is answered at once by a DONE carrying the error. */
void td__serve_pull(td_kvx_t *k, task_t *t)
{
    td_kvx_peer_t *p = t->peer;
    uint32_t n = t->hdr.n_blocks;
    const uint32_t *src = (const uint32_t *)t->data, *dst = src + n;
    int rc = 0;
    if (n == 0 || t->len != (size_t)n * 8)
        rc = TD_EPROTO;
    if (rc == 0)
        rc = td__check_ids(k->layout.n_blocks, src, n, "pulled");
    if (rc == 0) { /* queued until the peer is ready */
        xfer_t *x = td__xfer_new(p, XFER_PULLBACK, src, dst, n);
        if (x) {
            x->pull_id = t->hdr.xfer_id;
            x->flags = t->hdr.flags & TD_KVX_F_CSUM;
            td__queue_tx_check(x);
            return;
        }
        rc = TD_ENOMEM;
    }
    td__answer_error(p, t->hdr.xfer_id, rc);
}

void td__answer_error(td_kvx_peer_t *p, uint64_t pull_id, int status)
{
    wire_hdr_t h = {.xfer_id = ++p->kvx->next_id, .pull_id = pull_id, .status = status};
    td__ctl_send(p, NULL, AM_DONE, &h, NULL, 0);
}

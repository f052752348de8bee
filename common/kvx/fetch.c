/* fetch.c: fetching blocks by content key. A FETCH message names the wanted contents (16-byte
 * keys: KV block hashes) and the requester's destination blocks; the holder's on_fetch resolves
 * the keys to blocks of its own pool (which may take a while: disk reads) and answers with
 * td_kvx_fetch_answer, a pullback (send.c's push path, its DONE naming the fetch) of a leading run
 * of them, or a DONE carrying an error. The requester's transfer completes in recv.c when that
 * answer is in and verified; td__fetch_answered checks that the answer is the leading run asked
 * for. So a fetch moves its bytes exactly as a push does, on every transport and mechanism.
 *
 * Ownership: the requester's transfer (XFER_FETCH) owns copies of the keys and dst ids; the
 * holder's pullback owns copies of its src and dst ids, and the holder's source blocks are its
 * own until the answer's callback runs.
 */
#include "kvx_impl.h"
#include "td_error.h"
#include "td_log.h"

#include <stdlib.h>
#include <string.h>

/* The FETCH payload: a 16-byte head, then the keys, then the dst ids (docs/dataplane.md). */
typedef struct fetch_head {
    uint32_t n;         /* keys, >= 1 */
    uint32_t key_bytes; /* TD_KVX_KEY_BYTES */
    uint32_t flags;     /* TD_KVX_F_CSUM or 0 */
    uint32_t reserved;  /* 0 */
} fetch_head_t;

size_t td_kvx_fetch_size(uint32_t n)
{
    return sizeof(fetch_head_t) + (size_t)n * (TD_KVX_KEY_BYTES + 4);
}

void td_kvx_fetch_encode(uint8_t *out, const uint8_t *keys, const uint32_t *dst, uint32_t n,
                         unsigned flags)
{
    fetch_head_t h = {.n = n, .key_bytes = TD_KVX_KEY_BYTES, .flags = flags & TD_KVX_F_CSUM};
    memcpy(out, &h, sizeof(h));
    memcpy(out + sizeof(h), keys, (size_t)n * TD_KVX_KEY_BYTES);
    memcpy(out + sizeof(h) + (size_t)n * TD_KVX_KEY_BYTES, dst, (size_t)n * 4);
}

int td_kvx_fetch_parse(const void *buf, size_t len, uint32_t max_n, uint32_t dst_limit,
                       uint32_t *dst_out, td_kvx_fetch_req_t *out)
{
    fetch_head_t h;
    memset(out, 0, sizeof(*out));
    if (!buf || len < sizeof(h))
        return td_err_set(TD_EPROTO, "kvx: fetch of %zu bytes is shorter than its head", len);
    memcpy(&h, buf, sizeof(h));
    if (h.key_bytes != TD_KVX_KEY_BYTES)
        return td_err_set(TD_EPROTO, "kvx: fetch: key_bytes %u, not %u", h.key_bytes,
                          TD_KVX_KEY_BYTES);
    if (h.n == 0 || h.n > max_n)
        return td_err_set(TD_EPROTO, "kvx: fetch: n %u outside [1, %u]", h.n, max_n);
    if (h.flags & ~(uint32_t)TD_KVX_F_CSUM || h.reserved != 0)
        return td_err_set(TD_EPROTO, "kvx: fetch: unknown flags %#x or reserved %#x", h.flags,
                          h.reserved);
    if (len != td_kvx_fetch_size(h.n))
        return td_err_set(TD_EPROTO, "kvx: fetch of %u keys is %zu bytes, not %zu", h.n, len,
                          td_kvx_fetch_size(h.n));
    const uint8_t *p = buf;
    memcpy(dst_out, p + sizeof(h) + (size_t)h.n * TD_KVX_KEY_BYTES, (size_t)h.n * 4);
    for (uint32_t i = 0; i < h.n; i++)
        if (dst_out[i] >= dst_limit)
            return td_err_set(TD_EPROTO, "kvx: fetch: dst block %u (index %u) >= pool size %u",
                              dst_out[i], i, dst_limit);
    out->n = h.n;
    out->flags = h.flags;
    out->keys = p + sizeof(h);
    out->dst = dst_out;
    return 0;
}

/* ---- the requester ----------------------------------------------------------------------------*/

int td_kvx_fetch(td_kvx_peer_t *p, const uint8_t *keys, const uint32_t *dst, uint32_t n,
                 unsigned flags, td_kvx_fetch_cb cb, void *arg)
{
    td_kvx_t *k = p->kvx;
    if (k->closing)
        return td_err_set(TD_ECLOSED, "kvx: closing");
    if (n == 0 || !keys || !dst || !cb)
        return td_err_set(TD_EINVAL, "kvx: empty fetch or missing callback");
    if (n > p->n_blocks)
        return td_err_set(TD_EINVAL, "kvx: fetch of %u blocks from a pool of %u", n, p->n_blocks);
    if (p->state == PEER_REFUSED)
        return td_err_set(TD_EMISMATCH, "kvx: peer %016llx refused our layout",
                          (unsigned long long)p->instance);
    int rc = td__check_ids(k->layout.n_blocks, dst, n, "destination");
    if (rc < 0)
        return rc;
    xfer_t *x = td__xfer_new(p, XFER_FETCH, NULL, dst, n);
    if (!x)
        return TD_ENOMEM;
    x->keys = malloc((size_t)n * TD_KVX_KEY_BYTES);
    if (!x->keys) {
        td__xfer_unlink(x);
        td__xfer_free(x);
        return TD_ENOMEM;
    }
    memcpy(x->keys, keys, (size_t)n * TD_KVX_KEY_BYTES);
    x->flags = flags & TD_KVX_F_CSUM;
    x->fcb = cb;
    x->arg = arg;
    return td__xfer_launch(x);
}

void td__fetch_send(xfer_t *x)
{
    size_t len = td_kvx_fetch_size(x->n);
    uint8_t *buf = malloc(len);
    x->posted = true;
    x->done_sent = true;
    if (!buf) {
        x->status = TD_ENOMEM;
        return;
    }
    td_kvx_fetch_encode(buf, x->keys, x->dst, x->n, x->flags);
    wire_hdr_t h = {.xfer_id = x->id, .flags = x->flags, .n_blocks = x->n};
    int rc = td__ctl_send(x->peer, x, AM_FETCH, &h, buf, len);
    free(buf);
    if (rc < 0 && x->status == 0)
        x->status = rc;
}

int td__fetch_answered(xfer_t *x, const rx_t *r, int status)
{
    if (status != 0)
        return status;
    const uint32_t *ids = (const uint32_t *)r->done_payload;
    if (r->n_blocks == 0 || r->n_blocks > x->n || !ids)
        return td_err_set(TD_EPROTO, "kvx: fetch answered with %u blocks of %u", r->n_blocks, x->n);
    if ((x->flags & TD_KVX_F_CSUM) && !(r->flags & TD_KVX_F_CSUM))
        return td_err_set(TD_EPROTO, "kvx: fetch answered without the checksums it asked for");
    for (uint32_t i = 0; i < r->n_blocks; i++)
        if (ids[i] != x->dst[i])
            return td_err_set(TD_EPROTO, "kvx: fetch answer %u went to block %u, not %u", i, ids[i],
                              x->dst[i]);
    x->n_got = r->n_blocks;
    return 0;
}

/* ---- the holder -------------------------------------------------------------------------------*/

void td__serve_fetch(td_kvx_t *k, task_t *t)
{
    td_kvx_peer_t *p = t->peer;
    uint32_t max_n = p->n_blocks < k->layout.n_blocks ? p->n_blocks : k->layout.n_blocks;
    uint32_t *dst = malloc((size_t)(max_n ? max_n : 1) * 4);
    td_kvx_fetch_req_t req;
    int rc = dst ? td_kvx_fetch_parse(t->data, t->len, max_n, p->n_blocks, dst, &req) : TD_ENOMEM;
    if (rc == 0 && !k->opts.on_fetch)
        rc = td_err_set(TD_ENOTSUP, "kvx: this process serves no fetches");
    if (rc < 0) {
        TD_LOG_W("kvx: fetch %llu of peer %016llx refused: %s", (unsigned long long)t->hdr.xfer_id,
                 (unsigned long long)p->instance, td_err_msg());
        td__answer_error(p, t->hdr.xfer_id, rc);
        free(dst);
        return;
    }
    req.peer = p;
    req.id = t->hdr.xfer_id;
    k->opts.on_fetch(k, &req, k->opts.arg);
    free(dst);
}

int td_kvx_fetch_answer(td_kvx_peer_t *p, uint64_t id, unsigned flags, const uint32_t *src,
                        const uint32_t *dst, uint32_t n, int status, td_kvx_done_cb cb, void *arg)
{
    td_kvx_t *k = p->kvx;
    if (k->closing)
        return td_err_set(TD_ECLOSED, "kvx: closing");
    if (n == 0) {
        if (p->state == PEER_READY && p->ep)
            td__answer_error(p, id, status < 0 ? status : TD_ENOENT);
        return 0;
    }
    if (!src || !dst || !cb)
        return td_err_set(TD_EINVAL, "kvx: fetch answer without ids or callback");
    int rc = td__check_ids(k->layout.n_blocks, src, n, "source");
    if (rc == 0)
        rc = td__check_ids(p->n_blocks, dst, n, "remote destination");
    if (rc < 0)
        return rc;
    xfer_t *x = td__xfer_new(p, XFER_PULLBACK, src, dst, n);
    if (!x)
        return TD_ENOMEM;
    x->pull_id = id;
    x->flags = flags & (TD_KVX_F_CSUM | TD_KVX_F_TEST_BAD_CSUM);
    x->cb = cb;
    x->arg = arg;
    return td__xfer_launch(x);
}

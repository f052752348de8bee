/* kvx_impl.h: what the data plane's files share (see td_kvx.h and docs/dataplane.md): the wire
 * and blob formats, the peer, transfer and task structs, and the td__ functions one file calls in
 * another.
 *
 * Structure: UCX callbacks (active messages, request completions, endpoint errors) only record
 * what happened and queue a task; the service routine, run from the libuv loop (event-fd poll,
 * prepare and idle handles), progresses the worker, runs the tasks (which post UCX operations and
 * call user callbacks) and re-arms the worker before the loop sleeps.
 *
 * Files:
 *   kvx.c   create and close: UCX context and worker, the pool (allocated and registered once),
 *           our blob, the accessors and error translation from UCX;
 *   loop.c  the task queue, request accounting, the service routine and the libuv handles;
 *   peer.c  the peer table: peer blobs, endpoints and mechanism choice, the HELLO handshake,
 *           failure and teardown of a dead peer;
 *   send.c  outgoing transfers: coalescing, posting pushes and pulls, control messages, DONE,
 *           completion and the sender's callback, serving a peer's pull;
 *   recv.c  incoming transfers: the active-message handler, receiving data runs, the DONE
 *           payload (ids, checksums, note), verification and delivery to on_recv, the ACK;
 *   fetch.c fetches by content key: the FETCH message (encode, parse), sending it, serving a
 *           peer's through on_fetch and td_kvx_fetch_answer, and checking the answer.
 *
 * Threading: everything here runs on the loop thread. Functions marked "UCX callback context"
 * may run inside ucp_worker_progress: they must not post UCX operations or call user code.
 */
#ifndef TD_KVX_IMPL_H
#define TD_KVX_IMPL_H

#include "td_kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#define KVX_MAGIC 0x5856 /* "VX" */
#define KVX_VERSION 2 /* 2: the blob carries the data-plane epoch */
#define BLOB_MAGIC "TKVX"
#define BLOB_F_UCX_POOL 1u /* pool allocated by UCX: shared-memory transports can map it */

/* Active-message ids, one per message type (docs/dataplane.md, Formats). */
enum am_id {
    AM_HELLO = 1,     /* payload: sender's blob */
    AM_HELLO_ACK = 2, /* status */
    AM_DATA = 3,      /* block, n_blocks; payload: the run's bytes (rendezvous) */
    AM_DONE = 4, /* n_blocks, n_runs, flags, note_len, pull_id; payload: dst ids, csums, note */
    AM_ACK = 5,  /* status for xfer_id */
    AM_PULL = 6, /* n_blocks, flags; payload: src ids (receiver's), dst ids (sender's) */
    AM_FETCH = 7, /* payload: the FETCH message (fetch.c): keys, dst ids (sender's) */
    AM_LAST_,
};

/* Header of every message (the AM header). Host byte order: both ends are little-endian. */
typedef struct wire_hdr {
    uint16_t magic;    /* KVX_MAGIC */
    uint16_t version;  /* KVX_VERSION */
    uint32_t type;     /* enum am_id */
    uint64_t instance; /* sender's instance id */
    uint64_t xfer_id;  /* sender's transfer id */
    uint64_t pull_id;  /* DONE: the requester's pull id this push answers (0: plain push) */
    int32_t status;    /* HELLO_ACK, ACK, DONE */
    uint32_t flags;    /* TD_KVX_F_* */
    uint32_t block;    /* DATA: first destination block of the run */
    uint32_t n_blocks; /* DATA: blocks in the run; DONE, PULL: blocks in the transfer */
    uint32_t n_runs;   /* DONE: data messages the receiver must have before delivering */
    uint32_t note_len; /* DONE: bytes of note after the ids and checksums */
} wire_hdr_t;

/* Blob: fixed header then the worker address then the packed rkey. */
typedef struct blob_hdr {
    char magic[4];           /* "TKVX" */
    uint16_t version;        /* KVX_VERSION */
    uint16_t mem;            /* td_kvx_mem_t */
    uint64_t instance;       /* random per td_kvx_t */
    uint64_t block_bytes;    /* layout */
    uint32_t n_blocks;       /* layout */
    uint32_t addr_len;       /* bytes of worker address */
    uint32_t rkey_len;       /* bytes of packed rkey */
    uint32_t flags;          /* BLOB_F_* */
    uint64_t pool_addr;      /* virtual address of block 0 in the owner's process */
    uint8_t fingerprint[16]; /* layout */
    uint64_t epoch;          /* the owner's data-plane epoch (td_kvx_renew): starts at 1 */
} blob_hdr_t;

/* Where a peer stands (peer.c moves it between states). */
enum peer_state {
    PEER_IDLE = 0,   /* no endpoint */
    PEER_CONNECTING, /* HELLO sent, waiting for HELLO_ACK */
    PEER_READY,
    PEER_FAILED,  /* endpoint error seen; teardown pending or done */
    PEER_REFUSED, /* fingerprint mismatch: never exchanges blocks */
};

/* What an outgoing transfer is for. */
typedef enum xfer_kind {
    XFER_PUSH = 0,
    XFER_PULL,     /* we asked the peer to push into us */
    XFER_PULLBACK, /* we push to answer the peer's pull or fetch (a fetch's has a callback) */
    XFER_FETCH,    /* we asked the peer for blocks by key; it answers with a pullback */
} xfer_kind_t;

/* One outgoing transfer (send.c). Owned by its peer's tx list until td__tx_check completes it;
 * ids and note are copies of the caller's. */
typedef struct xfer {
    struct xfer *next;
    td_kvx_peer_t *peer;
    xfer_kind_t kind;
    uint64_t id;
    uint64_t pull_id; /* XFER_PULLBACK: the requester's pull id */
    uint32_t n;       /* blocks */
    uint32_t *src;    /* [n] source block ids (ours for push, the peer's for pull) */
    uint32_t *dst;    /* [n] destination block ids */
    uint8_t *note;    /* [note_len] */
    uint32_t note_len;
    unsigned flags;
    td_kvx_done_cb cb;
    td_kvx_fetch_cb fcb;   /* XFER_FETCH: called instead of cb */
    void *arg;
    uint8_t *keys;         /* XFER_FETCH: [n * TD_KVX_KEY_BYTES] */
    uint32_t n_got;        /* XFER_FETCH: blocks the answer delivered */
    int status;            /* first error seen */
    uint32_t ops_out;      /* UCX requests in flight that reference this transfer */
    bool posted;           /* data operations posted */
    bool done_sent;        /* AM_DONE / AM_PULL posted */
    bool acked;            /* ACK (push) or answering DONE (pull) received */
    bool check_queued;     /* a TASK_TX_CHECK is queued for it */
    uint64_t payload_b;    /* bytes moved */
    int32_t remote_done;   /* runs the receiver must see (AM mechanism), sent in DONE */
    struct kvx_op *ops;    /* the ops_out requests in flight, each with its handle (kvx_op_t) */
} xfer_t;

/* The handle of one UCX send request (a data run, a flush, a control message): its user data.
 * It holds what UCX reads until the request completes (the AM header, a control message's
 * payload), so it lives until the completion callback, which frees it.
 *
 * Ownership: a request of a transfer is linked on x->ops and counted in x->ops_out and
 * peer->ops_out. When the transfer gives up on it (td__xfer_give_up: its endpoint was
 * force-closed, and UCX 1.13 does not complete every request of a force-closed endpoint, e.g. a
 * rendezvous send waiting for a dead receiver), it is detached: x set to NULL, the counts
 * decremented, moved to k->orphans, and the transfer may complete and be freed. A late completion
 * of a detached handle only frees it; those UCX never completes are freed by td_kvx_close after
 * the worker is destroyed. A control message without transfer (HELLO, ACK, ...) is on no list.
 * No data moves for a request after its endpoint was force-closed: UCX replaced its lanes, and a
 * message naming that endpoint is dropped, so the transfer's blocks are free once it gave up. */
typedef struct kvx_op {
    struct kvx_op *prev, *next; /* on x->ops, or on k->orphans once detached */
    td_kvx_t *kvx;
    td_kvx_peer_t *peer;
    struct xfer *x; /* the transfer it belongs to; NULL without one or once detached */
    bool detached;
    uint32_t gen;   /* the endpoint generation of the peer it was posted on (p->ep_gen) */
    wire_hdr_t hdr; /* AM header (data run, control message): UCX 1.13 reads it until the send
                       completes */
    uint8_t payload[]; /* control message: [len] bytes, a copy of the caller's */
} kvx_op_t;

/* One incoming transfer, keyed by the sender's transfer id (recv.c). Owned by its peer's rx list
 * until td__rx_check delivers and frees it. */
typedef struct rx {
    struct rx *next;
    td_kvx_peer_t *peer;
    uint64_t xfer_id;
    uint32_t gen; /* the peer's endpoint generation when it began */
    int status;
    uint32_t runs_done; /* data messages whose bytes are in place */
    uint32_t ops_out;   /* receive operations in flight */
    bool done_seen;
    bool check_queued;
    uint64_t pull_id;
    uint32_t n_runs;
    uint32_t n_blocks;
    uint32_t flags;
    uint8_t *done_payload; /* ids [n_blocks] u32, csums [n_blocks] u64 (F_CSUM), note */
    uint32_t note_len;
} rx_t;

/* A retired endpoint of a peer (peer.c): replaced for new transfers by a fresh one (the peer or
 * we started a new epoch), kept open until the operations posted on it and the incoming transfers
 * begun before it was retired are finished or failed, then closed (rkey, forced close). Owned by
 * its peer's `retired` list. */
typedef struct kvx_oldep {
    struct kvx_oldep *next;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint32_t gen;         /* the endpoint generation it carried */
    uint32_t ops_out;     /* our operations still in flight on it */
    uint64_t grace_ns;    /* not closed before this (messages the peer sent it before it switched) */
    uint64_t deadline_ns; /* closed at this time whatever is left on it */
} kvx_oldep_t;

/* A remote td_kvx_t, known from its blob (peer.c). Owned by kvx (peers list) until td_kvx_close,
 * even after it failed. */
struct td_kvx_peer {
    td_kvx_peer_t *next;
    td_kvx_t *kvx;
    enum peer_state state;
    uint64_t instance;
    uint8_t *blob; /* [blob_len] copy of the peer's blob */
    size_t blob_len;
    const ucp_address_t *addr; /* inside blob */
    const void *rkey_buf;      /* inside blob, [rkey_len] */
    uint64_t pool_addr;
    uint32_t blob_flags; /* BLOB_F_* of the peer */
    uint32_t n_blocks;   /* blocks in the peer's pool */
    uint64_t epoch; /* the newest data-plane epoch seen in its blob */
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint32_t ep_gen;        /* generation of ep: bumped whenever ep is retired or closed */
    uint32_t ep_ops;        /* our operations in flight on ep (of generation ep_gen) */
    kvx_oldep_t *retired;   /* retired endpoints still open, newest first */
    td_kvx_mech_t mech;
    xfer_t *tx; /* our transfers to this peer, oldest first */
    rx_t *rx;   /* incoming transfers from this peer */
    uint32_t ops_out;
    uint64_t deadline_ns; /* CONNECTING: HELLO timeout; FAILED: forced teardown */
    bool tearing;         /* FAILED with endpoint still open */
    int fail_status;
};

/* What a queued task does (loop.c dispatches each to the file of its concern). */
typedef enum task_type {
    TASK_HELLO,     /* blob */
    TASK_HELLO_ACK, /* instance, status */
    TASK_RECV,      /* rx, desc, dst pointer, len */
    TASK_RX_CHECK,
    TASK_TX_CHECK,
    TASK_ACK,  /* instance, xfer_id, status */
    TASK_PULL, /* instance, payload */
    TASK_FETCH, /* instance, payload */
    TASK_PEER_ERR,
} task_type_t;

/* Work a UCX callback leaves for the loop. Owned by k's queue; td__run_tasks frees it and its
 * `data` after it ran, td_kvx_close frees those that never ran. */
typedef struct task {
    struct task *next;
    task_type_t type;
    td_kvx_peer_t *peer;
    rx_t *rx;
    xfer_t *x;
    wire_hdr_t hdr;
    void *desc;    /* TASK_RECV: UCX data descriptor */
    void *dst;     /* TASK_RECV: where the bytes go */
    size_t len;    /* TASK_RECV: bytes; HELLO, PULL, FETCH: payload bytes */
    uint8_t *data; /* HELLO, PULL, FETCH: payload copy */
    ucp_ep_h ep;   /* PEER_ERR: the failed endpoint */
    int status;
} task_t;

/* The data plane: one per loop thread, everything owned here is freed by td_kvx_close. */
struct td_kvx {
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    uv_timer_t timer; /* deadlines: handshakes, teardowns */
    uv_timer_t tick;  /* while transfers are open: a fallback wakeup every TICK_MS (loop.c) */
    bool tick_on;
    uint64_t spin_until_ns; /* keep polling until then after the last progress */
    int handles_open;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    int efd;
    uint8_t *pool; /* [n_blocks * block_bytes] */
    size_t pool_bytes;
    bool pool_mmap; /* allocated by us with mmap (else by UCX) */
    td_kvx_layout_t layout;
    td_kvx_opts_t opts;
    uint64_t instance;
    uint64_t epoch; /* ours, in our blob: td_kvx_renew bumps it */
    uint8_t *blob;
    size_t blob_len;
    td_kvx_peer_t *peers;
    kvx_op_t *orphans; /* detached request handles UCX has not completed (kvx_op_t) */
    task_t *tq_head, *tq_tail;
    uint64_t next_id;
    td_kvx_stats_t stats;
    bool in_service;
    bool closing;
    bool timer_on;
    bool busy_poll; /* TD_KVX_BUSY_POLL=1: never sleep (for measurements only) */
    void (*close_cb)(void *);
    void *close_arg;
};

/* ---- kvx.c: errors ---------------------------------------------------------------------------*/

/* Translate a UCX status into a TD_E* code (0 for UCS_OK, TD_EIO for anything unmapped). */
int td__ucs_to_td(ucs_status_t st);
/* Set td_err_msg to "kvx: <what>: <UCX's message>" and return the translated code. */
int td__ucx_err(ucs_status_t st, const char *what);

/* ---- loop.c: tasks, request accounting, the service routine ---------------------------------*/

/* A new zeroed task of `type`. Never NULL (aborts when out of memory, see loop.c). The task, and
 * its `data` when set, are owned by the queue once queued and freed after they ran. */
task_t *td__new_task(task_type_t type);
/* Append t to k's queue; it runs from the loop. UCX callback context allowed. */
void td__queue_task(td_kvx_t *k, task_t *t);
/* Queue one TASK_TX_CHECK (TASK_RX_CHECK) for x (r) unless one is already queued. UCX callback
 * context allowed. */
void td__queue_tx_check(xfer_t *x);
void td__queue_rx_check(rx_t *r);
/* One UCX request of p completed with st: count it down on p and on x or r (either may be NULL),
 * record the first error, count a received run, and queue the checks. UCX callback context. */
void td__op_finished(td_kvx_peer_t *p, xfer_t *x, rx_t *r, ucs_status_t st);
/* Run the tasks queued so far (not those they queue); frees each. True when any ran. */
bool td__run_tasks(td_kvx_t *k);
/* UCX operations in flight over all peers. */
uint32_t td__total_ops(const td_kvx_t *k);
/* Start the deadline timer (handshakes, teardowns) unless it runs or k is closing. */
void td__start_timer(td_kvx_t *k);
/* Initialise and start the loop handles (event-fd poll, prepare, idle, timers) on k->loop. */
void td__loop_start(td_kvx_t *k);
/* Close the loop handles. When the last one has closed, frees k and then runs k->close_cb. */
void td__loop_close(td_kvx_t *k);

/* ---- peer.c: the peer table, endpoints, handshake, failure ----------------------------------*/

/* The peer with this instance id, or NULL. */
td_kvx_peer_t *td__find_peer(td_kvx_t *k, uint64_t instance);
/* Create p's endpoint and send HELLO with our blob; p becomes PEER_CONNECTING. 0 or the error
 * (the endpoint is closed again then). */
int td__peer_connect(td_kvx_peer_t *p);
/* Mark p failed with `status`: every transfer to and from it fails; teardown follows. */
void td__peer_fail(td_kvx_peer_t *p, int status);
/* Destroy p's rkey and force-close its endpoint (UCX then no longer references either); the
 * transfers of p give up on the requests they still have in flight (td__xfer_give_up). */
void td__peer_close_ep(td_kvx_peer_t *p);
/* Force-close p's retired endpoints (rkey first), whatever is left on them. */
void td__peer_close_retired(td_kvx_peer_t *p);
/* Retire p's endpoint (kept open for what was posted on it, kvx_oldep_t) so the next connect
 * makes a fresh one; p becomes PEER_IDLE. No-op without an endpoint. */
void td__peer_retire_ep(td_kvx_peer_t *p);
/* Close the retired endpoints of p that are done (nothing of theirs in flight, past the grace)
 * or past their deadline. True while p still has retired endpoints. */
bool td__peer_retired_step(td_kvx_peer_t *p);
/* UCX callback context allowed: one operation of p posted on endpoint generation `gen` is no
 * longer in flight (completed, finished at posting, or detached). */
void td__op_gen_done(td_kvx_peer_t *p, uint32_t gen);
/* One step of a failed peer's teardown: closes the endpoint once its operations are done or the
 * wait expired, then reconnects when transfers were queued after the failure. */
void td__peer_teardown_step(td_kvx_peer_t *p);
/* Tasks: an incoming HELLO (t->data: the sender's blob), its HELLO_ACK, an endpoint error. */
void td__peer_hello(td_kvx_t *k, task_t *t);
void td__peer_hello_ack(td_kvx_t *k, task_t *t);
void td__peer_ep_error(td_kvx_t *k, task_t *t);

/* ---- send.c: outgoing transfers and control messages ----------------------------------------*/

/* Send a control message of `type` on p's endpoint, header fields from `proto` (may be NULL).
 * The payload is copied. Counts as one operation of p (and of x when given). 0 or an error
 * (TD_ECONNRESET without an endpoint, TD_ENOMEM, the UCX error). */
int td__ctl_send(td_kvx_peer_t *p, xfer_t *x, uint32_t type, const wire_hdr_t *proto,
                 const void *payload, size_t len);
/* Task: advance x; complete it (callback, free) when nothing references it any more. */
void td__tx_check(xfer_t *x);
/* Task: the receiver's ACK of one of our pushes (t->hdr: xfer_id, status). */
void td__tx_ack(td_kvx_t *k, task_t *t);
/* Task: the peer asked us to push blocks to it (t->data: src ids then dst ids). */
void td__serve_pull(td_kvx_t *k, task_t *t);
/* Free x and what it owns (ids, note). x must be unlinked; requests it still has in flight are
 * detached first (kvx_op_t). */
void td__xfer_free(xfer_t *x);
/* An endpoint of p was force-closed: every transfer of p gives up on the requests it still has in
 * flight on a closed endpoint (UCX may never complete them) and its check is queued, so it
 * completes with its error. With gen >= 0 only the requests of that endpoint generation (a
 * retired endpoint closed at its deadline), else every request except those on retired endpoints
 * still open. The handles are detached (see kvx_op_t). */
void td__xfer_give_up(td_kvx_peer_t *p, int64_t gen);
/* Free the detached handles UCX never completed. Only once the worker is destroyed. */
void td__free_orphans(td_kvx_t *k);
/* A new transfer of p of `kind` with copies of src (NULL: zeros) and dst, appended to p's tx
 * list. NULL when out of memory. */
xfer_t *td__xfer_new(td_kvx_peer_t *p, xfer_kind_t kind, const uint32_t *src, const uint32_t *dst,
                     uint32_t n);
/* 0 when every id is below limit, else TD_ERANGE naming the first bad one and its index. */
int td__check_ids(uint32_t limit, const uint32_t *ids, uint32_t n, const char *what);
/* Remove x from its peer's tx list (it must be there). */
void td__xfer_unlink(xfer_t *x);
/* Connect x's peer when needed and queue x's first check. 0, or the connect error (x is then
 * unlinked and freed; its callback never runs). */
int td__xfer_launch(xfer_t *x);
/* Run x's user callback (cb, or fcb for a fetch) with `status`, if it has one. */
void td__xfer_callback(xfer_t *x, int status);
/* Send a control message answering the peer's pull or fetch `pull_id` with an error. */
void td__answer_error(td_kvx_peer_t *p, uint64_t pull_id, int status);

/* ---- fetch.c: fetches by content key ---------------------------------------------------------*/

/* Post the FETCH message of x (from td__tx_check). */
void td__fetch_send(xfer_t *x);
/* Task: the peer asked us for blocks by key (t->data: the FETCH message). */
void td__serve_fetch(td_kvx_t *k, task_t *t);
/* r answers fetch x: check it (a leading run of the asked dst ids, checksums when asked) and set
 * x->n_got. Returns the transfer's status: `status` (the receive's), or TD_EPROTO. */
int td__fetch_answered(xfer_t *x, const rx_t *r, int status);

/* ---- recv.c: incoming transfers -------------------------------------------------------------*/

/* Register the active-message handler for every message id on k's worker. 0 or the UCX error. */
int td__recv_set_handlers(td_kvx_t *k);
/* Task: receive one rendezvous data run into the pool (t->desc, t->dst, t->len). */
void td__rx_recv(td_kvx_t *k, task_t *t);
/* Task: when r is complete (or failed), verify, deliver, acknowledge and free it. */
void td__rx_check(rx_t *r);

#endif

/* kvx.c: the KV data plane over UCX (see td_kvx.h and docs/dataplane.md).
 *
 * Structure: UCX callbacks (active messages, request completions, endpoint errors) only record
 * what happened and queue a task; the service routine, run from the libuv loop (event-fd poll,
 * prepare and idle handles), progresses the worker, runs the tasks (which post UCX operations and
 * call user callbacks) and re-arms the worker before the loop sleeps.
 */
#include "td_kvx.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <xxhash.h>

#define KVX_MAGIC 0x5856 /* "VX" */
#define KVX_VERSION 1
#define BLOB_MAGIC "TKVX"
#define BLOB_F_UCX_POOL 1u /* pool allocated by UCX: shared-memory transports can map it */
#define SERVICE_ROUNDS 64
#define TICK_MS 1
#define SPIN_NS 50000ull /* keep polling this long after the last progress while busy */
#define TEARDOWN_WAIT_NS 1000000000ull /* wait this long for a failed peer's operations */
#define CLOSE_WAIT_NS 3000000000ull

enum am_id {
    AM_HELLO = 1,     /* payload: sender's blob */
    AM_HELLO_ACK = 2, /* status */
    AM_DATA = 3,      /* block, n_blocks; payload: the run's bytes (rendezvous) */
    AM_DONE = 4, /* n_blocks, n_runs, flags, note_len, pull_id; payload: dst ids, csums, note */
    AM_ACK = 5,  /* status for xfer_id */
    AM_PULL = 6, /* n_blocks, flags; payload: src ids (receiver's), dst ids (sender's) */
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
} blob_hdr_t;

enum peer_state {
    PEER_IDLE = 0,   /* no endpoint */
    PEER_CONNECTING, /* HELLO sent, waiting for HELLO_ACK */
    PEER_READY,
    PEER_FAILED,  /* endpoint error seen; teardown pending or done */
    PEER_REFUSED, /* fingerprint mismatch: never exchanges blocks */
};

typedef enum xfer_kind {
    XFER_PUSH = 0,
    XFER_PULL,     /* we asked the peer to push into us */
    XFER_PULLBACK, /* we push to answer the peer's pull; no user callback */
} xfer_kind_t;

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
    void *arg;
    int status;            /* first error seen */
    uint32_t ops_out;      /* UCX requests in flight that reference this transfer */
    bool posted;           /* data operations posted */
    bool done_sent;        /* AM_DONE / AM_PULL posted */
    bool acked;            /* ACK (push) or answering DONE (pull) received */
    bool check_queued;     /* a TASK_TX_CHECK is queued for it */
    uint64_t payload_b;    /* bytes moved */
    int32_t remote_done;   /* runs the receiver must see (AM mechanism), sent in DONE */
    struct wire_hdr *hdrs; /* [runs] AM headers of the data runs: UCX 1.13 reads them until the
                              send completes */
} xfer_t;

typedef struct rx {
    struct rx *next;
    td_kvx_peer_t *peer;
    uint64_t xfer_id;
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
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    td_kvx_mech_t mech;
    xfer_t *tx; /* our transfers to this peer, oldest first */
    rx_t *rx;   /* incoming transfers from this peer */
    uint32_t ops_out;
    uint64_t deadline_ns; /* CONNECTING: HELLO timeout; FAILED: forced teardown */
    bool tearing;         /* FAILED with endpoint still open */
    int fail_status;
};

typedef enum task_type {
    TASK_HELLO,     /* blob */
    TASK_HELLO_ACK, /* instance, status */
    TASK_RECV,      /* rx, desc, dst pointer, len */
    TASK_RX_CHECK,
    TASK_TX_CHECK,
    TASK_ACK,  /* instance, xfer_id, status */
    TASK_PULL, /* instance, payload */
    TASK_PEER_ERR,
} task_type_t;

typedef struct task {
    struct task *next;
    task_type_t type;
    td_kvx_peer_t *peer;
    rx_t *rx;
    xfer_t *x;
    wire_hdr_t hdr;
    void *desc;    /* TASK_RECV: UCX data descriptor */
    void *dst;     /* TASK_RECV: where the bytes go */
    size_t len;    /* TASK_RECV: bytes; HELLO, PULL: payload bytes */
    uint8_t *data; /* HELLO, PULL: payload copy */
    ucp_ep_h ep;   /* PEER_ERR: the failed endpoint */
    int status;
} task_t;

struct td_kvx {
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    uv_timer_t timer; /* deadlines: handshakes, teardowns */
    uv_timer_t tick;  /* while transfers are open: a fallback wakeup every TICK_MS */
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
    uint8_t *blob;
    size_t blob_len;
    td_kvx_peer_t *peers;
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

/* ---- small helpers ---------------------------------------------------------------------------*/

static int ucs_to_td(ucs_status_t st)
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

static int ucx_err(ucs_status_t st, const char *what)
{
    return td_err_set(ucs_to_td(st), "kvx: %s: %s", what, ucs_status_string(st));
}

static void queue_task(td_kvx_t *k, task_t *t)
{
    t->next = NULL;
    if (k->tq_tail)
        k->tq_tail->next = t;
    else
        k->tq_head = t;
    k->tq_tail = t;
}

/* Allocation failures inside UCX callbacks cannot be reported to anyone: abort loudly rather than
 * lose a completion (a few dozen bytes; the process is out of memory anyway). */
static task_t *new_task(task_type_t type)
{
    task_t *t = calloc(1, sizeof(*t));
    TD_ASSERT(t != NULL);
    t->type = type;
    return t;
}

static td_kvx_peer_t *find_peer(td_kvx_t *k, uint64_t instance)
{
    for (td_kvx_peer_t *p = k->peers; p; p = p->next)
        if (p->instance == instance)
            return p;
    return NULL;
}

static bool range_ok(const td_kvx_t *k, uint32_t first, uint32_t n)
{
    return n > 0 && first < k->layout.n_blocks && n <= k->layout.n_blocks - first;
}

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

/* ---- sending control messages ----------------------------------------------------------------*/

typedef struct ctl_msg {
    td_kvx_peer_t *peer;
    xfer_t *x; /* when the message belongs to a transfer (DONE, PULL) */
    wire_hdr_t hdr;
    uint8_t payload[]; /* [len] */
} ctl_msg_t;

static void op_finished(td_kvx_peer_t *p, xfer_t *x, rx_t *r, ucs_status_t st);

static void ctl_send_cb(void *req, ucs_status_t st, void *user_data)
{
    ctl_msg_t *m = user_data;
    op_finished(m->peer, m->x, NULL, st);
    free(m);
    ucp_request_free(req);
}

/* Send a control message on p's endpoint. The payload is copied. Counts as one operation of p
 * (and of x when given). */
static int ctl_send(td_kvx_peer_t *p, xfer_t *x, uint32_t type, const wire_hdr_t *proto,
                    const void *payload, size_t len)
{
    td_kvx_t *k = p->kvx;
    if (!p->ep)
        return td_err_set(TD_ECONNRESET, "kvx: peer %016llx has no endpoint",
                          (unsigned long long)p->instance);
    ctl_msg_t *m = malloc(sizeof(*m) + len);
    if (!m)
        return TD_ENOMEM;
    m->peer = p;
    m->x = x;
    if (proto)
        m->hdr = *proto;
    else
        memset(&m->hdr, 0, sizeof(m->hdr));
    m->hdr.magic = KVX_MAGIC;
    m->hdr.version = KVX_VERSION;
    m->hdr.type = type;
    m->hdr.instance = k->instance;
    if (len)
        memcpy(m->payload, payload, len);
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = ctl_send_cb,
        .user_data = m,
        /* eager: the receiver gets the whole message in its callback (no rendezvous to answer) */
        .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
    };
    p->ops_out++;
    if (x)
        x->ops_out++;
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(p->ep, type, &m->hdr, sizeof(m->hdr), m->payload, len, &prm);
    if (UCS_PTR_IS_PTR(sp))
        return 0;
    ucs_status_t st = UCS_PTR_STATUS(sp);
    p->ops_out--;
    if (x)
        x->ops_out--;
    free(m);
    if (st != UCS_OK)
        return ucx_err(st, "am send");
    return 0;
}

/* ---- peers: connect, fail, tear down ---------------------------------------------------------*/

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    td_kvx_peer_t *p = arg;
    task_t *t = new_task(TASK_PEER_ERR);
    t->peer = p;
    t->ep = ep;
    t->status = ucs_to_td(st);
    queue_task(p->kvx, t);
}

static void queue_tx_check(xfer_t *x)
{
    if (x->check_queued)
        return;
    x->check_queued = true;
    task_t *t = new_task(TASK_TX_CHECK);
    t->x = x;
    queue_task(x->peer->kvx, t);
}

static void queue_rx_check(rx_t *r)
{
    if (r->check_queued)
        return;
    r->check_queued = true;
    task_t *t = new_task(TASK_RX_CHECK);
    t->rx = r;
    queue_task(r->peer->kvx, t);
}

static void start_timer(td_kvx_t *k);

/* Mark p failed: every transfer to and from it fails; teardown follows once its operations have
 * completed (or after TEARDOWN_WAIT_NS). */
static void peer_fail(td_kvx_peer_t *p, int status)
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
        queue_tx_check(x);
    }
    for (rx_t *r = p->rx; r; r = r->next) {
        if (r->status == 0)
            r->status = status;
        queue_rx_check(r);
    }
    if (p->ep && !p->tearing) {
        p->tearing = true;
        p->deadline_ns = td_now_ns() + TEARDOWN_WAIT_NS;
        start_timer(k);
    }
}

static void ep_close_cb(void *req, ucs_status_t st, void *user_data)
{
    ucp_request_free(req);
}

static void close_ep(td_kvx_peer_t *p)
{
    if (p->rkey) {
        ucp_rkey_destroy(p->rkey);
        p->rkey = NULL;
    }
    if (p->ep) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
            .flags = UCP_EP_CLOSE_FLAG_FORCE,
            .cb.send = ep_close_cb,
        };
        ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &prm);
        (void)sp; /* a request completes through ep_close_cb; an error status means it is gone */
        p->ep = NULL;
    }
    p->tearing = false;
}

static int connect_peer(td_kvx_peer_t *p);

/* Teardown order for a failed peer: its operations first (UCX completes them with errors once the
 * endpoint failed), then its rkey, then a forced endpoint close. */
static void peer_teardown_step(td_kvx_peer_t *p)
{
    if (!p->tearing)
        return;
    if (p->ops_out > 0 && td_now_ns() < p->deadline_ns)
        return;
    if (p->ops_out > 0)
        TD_LOG_W("kvx: peer %016llx: %u operations still pending after %.1f s, forcing close",
                 (unsigned long long)p->instance, p->ops_out, TEARDOWN_WAIT_NS / 1e9);
    close_ep(p);
    /* transfers queued after the failure reconnect from the stored blob */
    bool queued = false;
    for (xfer_t *x = p->tx; x; x = x->next)
        if (!x->posted && x->status == 0)
            queued = true;
    if (queued && !p->kvx->closing) {
        p->state = PEER_IDLE;
        int rc = connect_peer(p);
        if (rc < 0)
            peer_fail(p, rc);
    }
}

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
        return ucx_err(st, "ucp_ep_create");
    }
    st = ucp_ep_rkey_unpack(p->ep, p->rkey_buf, &p->rkey);
    if (st != UCS_OK) {
        int rc = ucx_err(st, "ucp_ep_rkey_unpack");
        close_ep(p);
        return rc;
    }
    p->mech = detect_mech(p);
    return 0;
}

/* Create the endpoint and send HELLO with our blob. */
static int connect_peer(td_kvx_peer_t *p)
{
    td_kvx_t *k = p->kvx;
    int rc = create_ep(p);
    if (rc < 0)
        return rc;
    rc = ctl_send(p, NULL, AM_HELLO, NULL, k->blob, k->blob_len);
    if (rc < 0) {
        close_ep(p);
        return rc;
    }
    p->state = PEER_CONNECTING;
    p->deadline_ns = td_now_ns() + (uint64_t)(k->opts.connect_s * 1e9);
    start_timer(k);
    return 0;
}

/* Parse and check a blob against our layout. On success *h holds its header. */
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

static td_kvx_peer_t *new_peer(td_kvx_t *k, const blob_hdr_t *h, const void *blob, size_t len)
{
    td_kvx_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->blob = malloc(len);
    if (!p->blob) {
        free(p);
        return NULL;
    }
    memcpy(p->blob, blob, len);
    p->blob_len = len;
    p->kvx = k;
    p->instance = h->instance;
    p->pool_addr = h->pool_addr;
    p->blob_flags = h->flags;
    p->n_blocks = h->n_blocks;
    p->addr = (const ucp_address_t *)(p->blob + sizeof(*h));
    p->rkey_buf = p->blob + sizeof(*h) + h->addr_len;
    p->next = k->peers;
    k->peers = p;
    return p;
}

int td_kvx_connect(td_kvx_t *k, const void *blob, size_t len, td_kvx_peer_t **out)
{
    blob_hdr_t h;
    *out = NULL;
    int rc = parse_blob(k, blob, len, &h);
    if (rc < 0)
        return rc;
    td_kvx_peer_t *p = find_peer(k, h.instance);
    if (!p) {
        p = new_peer(k, &h, blob, len);
        if (!p)
            return TD_ENOMEM;
    }
    if (p->state == PEER_REFUSED)
        return td_err_set(TD_EMISMATCH, "kvx: peer %016llx refused our layout",
                          (unsigned long long)p->instance);
    if (p->state == PEER_IDLE || (p->state == PEER_FAILED && !p->tearing)) {
        rc = connect_peer(p);
        if (rc < 0)
            return rc;
    }
    *out = p;
    return 0;
}

/* ---- outgoing transfers ----------------------------------------------------------------------*/

static void data_send_cb(void *req, ucs_status_t st, void *user_data)
{
    xfer_t *x = user_data;
    op_finished(x->peer, x, NULL, st);
    ucp_request_free(req);
}

static void op_finished(td_kvx_peer_t *p, xfer_t *x, rx_t *r, ucs_status_t st)
{
    TD_ASSERT(p->ops_out > 0);
    p->ops_out--;
    if (x) {
        TD_ASSERT(x->ops_out > 0);
        x->ops_out--;
        if (st != UCS_OK && x->status == 0)
            x->status = ucs_to_td(st);
        queue_tx_check(x);
    }
    if (r) {
        TD_ASSERT(r->ops_out > 0);
        r->ops_out--;
        if (st != UCS_OK && r->status == 0)
            r->status = ucs_to_td(st);
        else if (st == UCS_OK)
            r->runs_done++;
        queue_rx_check(r);
    }
}

/* Count one request of x: completed immediately (NULL), in flight, or failed. */
static void track(xfer_t *x, ucs_status_ptr_t sp)
{
    td_kvx_peer_t *p = x->peer;
    if (UCS_PTR_IS_PTR(sp))
        return;
    p->ops_out--;
    x->ops_out--;
    ucs_status_t st = UCS_PTR_STATUS(sp);
    if (st != UCS_OK && x->status == 0)
        x->status = ucs_to_td(st);
}

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
    if (am && nr > 0) {
        x->hdrs = calloc(nr, sizeof(*x->hdrs));
        if (!x->hdrs) {
            x->status = TD_ENOMEM;
            free(runs);
            return;
        }
    }
    for (uint32_t i = 0; i < nr && x->status == 0; i++) {
        uint32_t s = x->src[runs[i].first], d = x->dst[runs[i].first], len = runs[i].len;
        ucp_request_param_t prm = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = data_send_cb,
            .user_data = x,
            .memh = k->memh,
        };
        p->ops_out++;
        x->ops_out++;
        k->stats.ops_posted++;
        ucs_status_ptr_t sp;
        if (am) {
            wire_hdr_t *h = &x->hdrs[i];
            *h = (wire_hdr_t){.magic = KVX_MAGIC,
                              .version = KVX_VERSION,
                              .type = AM_DATA,
                              .instance = k->instance,
                              .xfer_id = x->id,
                              .block = d,
                              .n_blocks = len};
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY;
            sp = ucp_am_send_nbx(p->ep, AM_DATA, h, sizeof(*h), k->pool + s * bb, len * bb, &prm);
        } else {
            sp = ucp_put_nbx(p->ep, k->pool + s * bb, len * bb, p->pool_addr + d * bb, p->rkey,
                             &prm);
        }
        track(x, sp);
    }
    free(runs);
    x->payload_b = (uint64_t)x->n * bb;
    if (!am && x->status == 0) {
        /* remote completion of every put before the notification */
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = data_send_cb,
            .user_data = x,
        };
        p->ops_out++;
        x->ops_out++;
        track(x, ucp_ep_flush_nbx(p->ep, &prm));
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
    int rc = ctl_send(p, x, AM_DONE, &h, buf, len);
    free(buf);
    if (rc < 0 && x->status == 0)
        x->status = rc;
}

static void xfer_free(xfer_t *x)
{
    free(x->src);
    free(x->dst);
    free(x->note);
    free(x->hdrs);
    free(x);
}

static void unlink_tx(xfer_t *x)
{
    xfer_t **pp = &x->peer->tx;
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    TD_ASSERT(*pp == x);
    *pp = x->next;
}

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
    int rc = ctl_send(x->peer, x, AM_PULL, &h, buf, len);
    free(buf);
    if (rc < 0 && x->status == 0)
        x->status = rc;
}

/* Advance an outgoing transfer; complete it when nothing references it any more. */
static void tx_check(xfer_t *x)
{
    td_kvx_peer_t *p = x->peer;
    td_kvx_t *k = p->kvx;
    x->check_queued = false;
    if (x->status == 0 && p->state == PEER_READY) {
        if (x->kind == XFER_PULL) {
            if (!x->posted)
                send_pull(x);
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
    if (x->status == 0 && !x->acked)
        return;
    if (x->status == 0 && x->kind != XFER_PULL)
        k->stats.bytes_pushed += x->payload_b;
    unlink_tx(x);
    if (x->cb && !k->closing)
        x->cb(x->status, x->arg);
    else if (x->cb)
        x->cb(x->status ? x->status : TD_ECANCELED, x->arg);
    xfer_free(x);
}

static xfer_t *new_xfer(td_kvx_peer_t *p, xfer_kind_t kind, const uint32_t *src,
                        const uint32_t *dst, uint32_t n)
{
    xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    x->src = malloc((size_t)(n ? n : 1) * 4);
    x->dst = malloc((size_t)(n ? n : 1) * 4);
    if (!x->src || !x->dst) {
        xfer_free(x);
        return NULL;
    }
    if (n) {
        memcpy(x->src, src, (size_t)n * 4);
        memcpy(x->dst, dst, (size_t)n * 4);
    }
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

static int check_ids(uint32_t limit, const uint32_t *ids, uint32_t n, const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= limit)
            return td_err_set(TD_ERANGE, "kvx: %s block %u (index %u) >= pool size %u", what,
                              ids[i], i, limit);
    return 0;
}

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
    int rc = check_ids(push ? k->layout.n_blocks : p->n_blocks, src, n,
                       push ? "source" : "remote source");
    if (rc == 0)
        rc = check_ids(push ? p->n_blocks : k->layout.n_blocks, dst, n,
                       push ? "remote destination" : "destination");
    if (rc < 0)
        return rc;
    xfer_t *x = new_xfer(p, kind, src, dst, n);
    if (!x)
        return TD_ENOMEM;
    if (note_len) {
        x->note = malloc(note_len);
        if (!x->note) {
            unlink_tx(x);
            xfer_free(x);
            return TD_ENOMEM;
        }
        memcpy(x->note, note, note_len);
        x->note_len = note_len;
    }
    x->flags = flags;
    x->cb = cb;
    x->arg = arg;
    if (p->state == PEER_IDLE || (p->state == PEER_FAILED && !p->tearing)) {
        rc = connect_peer(p);
        if (rc < 0) {
            unlink_tx(x);
            xfer_free(x);
            return rc;
        }
    }
    queue_tx_check(x); /* posted from the loop, never from inside the caller's stack */
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

/* ---- incoming --------------------------------------------------------------------------------*/

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
    r->next = p->rx;
    p->rx = r;
    return r;
}

static void recv_data_cb(void *req, ucs_status_t st, size_t length, void *user_data)
{
    rx_t *r = user_data;
    op_finished(r->peer, NULL, r, st);
    ucp_request_free(req);
}

static bool peer_accepts(const td_kvx_peer_t *p)
{
    return p && (p->state == PEER_READY || p->state == PEER_CONNECTING);
}

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
        task_t *t = new_task(TASK_HELLO);
        t->hdr = h;
        t->data = malloc(len ? len : 1);
        TD_ASSERT(t->data != NULL);
        if (!rndv)
            memcpy(t->data, data, len);
        t->len = rndv ? 0 : len;
        queue_task(k, t);
        return UCS_OK;
    }
    td_kvx_peer_t *p = find_peer(k, h.instance);
    if (h.type == AM_HELLO_ACK) {
        task_t *t = new_task(TASK_HELLO_ACK);
        t->hdr = h;
        queue_task(k, t);
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
            queue_rx_check(r);
            return UCS_OK;
        }
        uint8_t *dst = k->pool + h.block * bb;
        if (!rndv) {
            memcpy(dst, data, len);
            r->runs_done++;
            queue_rx_check(r);
            return UCS_OK;
        }
        task_t *t = new_task(TASK_RECV);
        t->peer = p;
        t->rx = r;
        t->desc = data;
        t->dst = dst;
        t->len = len;
        r->ops_out++;
        p->ops_out++;
        queue_task(k, t);
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
        queue_rx_check(r);
        return UCS_OK;
    }
    case AM_ACK: {
        task_t *t = new_task(TASK_ACK);
        t->peer = p;
        t->hdr = h;
        queue_task(k, t);
        return UCS_OK;
    }
    case AM_PULL: {
        task_t *t = new_task(TASK_PULL);
        t->peer = p;
        t->hdr = h;
        t->len = rndv ? 0 : len;
        t->data = malloc(len ? len : 1);
        TD_ASSERT(t->data != NULL);
        if (!rndv)
            memcpy(t->data, data, len);
        queue_task(k, t);
        return UCS_OK;
    }
    }
    return UCS_OK;
}

/* A receive is complete: verify, deliver, acknowledge, forget. */
static void rx_check(rx_t *r)
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
            if (x->id == r->pull_id && x->kind == XFER_PULL) {
                if (x->status == 0)
                    x->status = status;
                x->acked = true;
                queue_tx_check(x);
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
    if (r->done_seen && p->state == PEER_READY && p->ep) {
        wire_hdr_t h = {.xfer_id = r->xfer_id, .status = status};
        ctl_send(p, NULL, AM_ACK, &h, NULL, 0);
    }
    free(r->done_payload);
    free(r);
}

/* ---- tasks -----------------------------------------------------------------------------------*/

static void do_hello(td_kvx_t *k, task_t *t)
{
    blob_hdr_t h;
    int rc = parse_blob(k, t->data, t->len, &h);
    if (rc == TD_EPARSE || rc == TD_EINVAL) {
        TD_LOG_W("kvx: dropped HELLO: %s", td_err_msg());
        return;
    }
    td_kvx_peer_t *p = find_peer(k, h.instance);
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
    if (p->tearing)
        close_ep(p); /* the peer came back before our teardown finished */
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
    ctl_send(p, NULL, AM_HELLO_ACK, &a, NULL, 0);
    if (p->state == PEER_READY)
        for (xfer_t *x = p->tx; x; x = x->next)
            queue_tx_check(x);
}

static void do_hello_ack(td_kvx_t *k, task_t *t)
{
    td_kvx_peer_t *p = find_peer(k, t->hdr.instance);
    if (!p || p->state != PEER_CONNECTING)
        return;
    if (t->hdr.status == 0) {
        p->state = PEER_READY;
        for (xfer_t *x = p->tx; x; x = x->next)
            queue_tx_check(x);
        return;
    }
    TD_LOG_W("kvx: peer %016llx refused us: %s", (unsigned long long)p->instance,
             td_strerror(t->hdr.status));
    peer_fail(p, t->hdr.status);
    if (t->hdr.status == TD_EMISMATCH)
        p->state = PEER_REFUSED;
}

static void do_pull(td_kvx_t *k, task_t *t)
{
    td_kvx_peer_t *p = t->peer;
    uint32_t n = t->hdr.n_blocks;
    const uint32_t *src = (const uint32_t *)t->data, *dst = src + n;
    int rc = 0;
    if (n == 0 || t->len != (size_t)n * 8)
        rc = TD_EPROTO;
    if (rc == 0)
        rc = check_ids(k->layout.n_blocks, src, n, "pulled");
    if (rc == 0) { /* queued until the peer is ready */
        xfer_t *x = new_xfer(p, XFER_PULLBACK, src, dst, n);
        if (x) {
            x->pull_id = t->hdr.xfer_id;
            x->flags = t->hdr.flags & TD_KVX_F_CSUM;
            queue_tx_check(x);
            return;
        }
        rc = TD_ENOMEM;
    }
    wire_hdr_t h = {.xfer_id = ++k->next_id, .pull_id = t->hdr.xfer_id, .status = rc};
    ctl_send(p, NULL, AM_DONE, &h, NULL, 0);
}

static void do_recv(td_kvx_t *k, task_t *t)
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
        op_finished(t->peer, NULL, t->rx, UCS_PTR_STATUS(sp));
}

static void run_task(td_kvx_t *k, task_t *t)
{
    switch (t->type) {
    case TASK_HELLO:
        do_hello(k, t);
        break;
    case TASK_HELLO_ACK:
        do_hello_ack(k, t);
        break;
    case TASK_RECV:
        do_recv(k, t);
        break;
    case TASK_RX_CHECK:
        rx_check(t->rx);
        break;
    case TASK_TX_CHECK:
        tx_check(t->x);
        break;
    case TASK_ACK:
        for (xfer_t *x = t->peer->tx; x; x = x->next) {
            if (x->id == t->hdr.xfer_id && x->kind != XFER_PULL) {
                if (t->hdr.status < 0 && x->status == 0)
                    x->status = t->hdr.status;
                x->acked = true;
                queue_tx_check(x);
                break;
            }
        }
        break;
    case TASK_PULL:
        do_pull(k, t);
        break;
    case TASK_PEER_ERR:
        if (t->ep == t->peer->ep && t->peer->ep) {
            TD_LOG_W("kvx: peer %016llx failed: %s", (unsigned long long)t->peer->instance,
                     td_strerror(t->status));
            peer_fail(t->peer, t->status);
        }
        break;
    }
}

/* Run the tasks queued so far (not those they queue). True when any ran. */
static bool run_tasks(td_kvx_t *k)
{
    task_t *t = k->tq_head;
    if (!t)
        return false;
    k->tq_head = k->tq_tail = NULL;
    while (t) {
        task_t *next = t->next;
        run_task(k, t);
        free(t->data);
        free(t);
        t = next;
    }
    return true;
}

static void teardown_steps(td_kvx_t *k)
{
    for (td_kvx_peer_t *p = k->peers; p; p = p->next)
        if (p->tearing)
            peer_teardown_step(p);
}

/* ---- loop integration ------------------------------------------------------------------------*/

static void idle_cb(uv_idle_t *h);
static uint32_t total_ops(const td_kvx_t *k);

/* True while any operation is in flight or any transfer, ours or a peer's, is not finished. */
static bool transfers_open(const td_kvx_t *k)
{
    for (const td_kvx_peer_t *p = k->peers; p; p = p->next)
        if (p->ops_out > 0 || p->rx || (p->tx && p->state == PEER_READY))
            return true;
    return false;
}

/* Progress the worker and run tasks until nothing is left, then arm the event fd so the loop can
 * sleep. While operations are in flight it does not sleep: it keeps an idle handle active so the
 * loop polls the worker once per iteration (UCX's shared-memory transports do not signal the
 * event fd when send resources free up, and a rendezvous needs both sides to progress; measured
 * on sm: 0.08 GB/s sleeping between events against 0.9 polling while busy). When idle, it arms
 * the worker and the loop sleeps. Bounded: under sustained traffic it yields to the loop. */
static void tick_cb(uv_timer_t *h);

static void service(td_kvx_t *k)
{
    if (k->in_service || !k->worker)
        return;
    k->in_service = true;
    bool spin = true, progressed = false;
    for (int round = 0; round < SERVICE_ROUNDS; round++) {
        unsigned n = 0;
        while (n < 1024 && ucp_worker_progress(k->worker))
            n++;
        bool did = run_tasks(k);
        teardown_steps(k);
        if (did || n > 0) {
            k->spin_until_ns = td_now_ns() + SPIN_NS;
            progressed = true;
        }
        if (did || k->tq_head)
            continue;
        if (n > 0 && round + 1 < SERVICE_ROUNDS)
            continue;
        if (k->busy_poll || total_ops(k) > 0 || td_now_ns() < k->spin_until_ns)
            break; /* poll again on the next loop iteration */
        if (ucp_worker_arm(k->worker) == UCS_ERR_BUSY)
            continue;
        spin = false;
        break;
    }
    if (spin && !progressed)
        sched_yield(); /* let the peer we wait for run: on an oversubscribed host a spinning
                          receiver otherwise holds the core its sender needs for a time slice */
    if (spin)
        uv_idle_start(&k->idle, idle_cb);
    else
        uv_idle_stop(&k->idle);
    bool open = !spin && transfers_open(k);
    if (open && !k->tick_on && !k->closing)
        uv_timer_start(&k->tick, tick_cb, TICK_MS, TICK_MS);
    else if (!open && k->tick_on)
        uv_timer_stop(&k->tick);
    k->tick_on = open;
    k->in_service = false;
}

static void tick_cb(uv_timer_t *h)
{
    service(h->data);
}

static void idle_cb(uv_idle_t *h)
{
    service(h->data);
}

static void prepare_cb(uv_prepare_t *h)
{
    service(h->data);
}

static void poll_cb(uv_poll_t *h, int status, int events)
{
    td_kvx_t *k = h->data;
    k->stats.wakeups++;
    service(k);
}

static void timer_cb(uv_timer_t *h)
{
    td_kvx_t *k = h->data;
    uint64_t now = td_now_ns();
    bool need = false;
    for (td_kvx_peer_t *p = k->peers; p; p = p->next) {
        if (p->state == PEER_CONNECTING && now > p->deadline_ns) {
            TD_LOG_W("kvx: peer %016llx: no answer to HELLO in %.1f s",
                     (unsigned long long)p->instance, k->opts.connect_s);
            peer_fail(p, td_err_set(TD_ETIMEDOUT, "kvx: handshake timed out"));
        }
        if (p->tearing)
            peer_teardown_step(p);
        if (p->state == PEER_CONNECTING || p->tearing)
            need = true;
    }
    if (!need) {
        uv_timer_stop(&k->timer);
        k->timer_on = false;
    }
    service(k);
}

static void start_timer(td_kvx_t *k)
{
    if (k->timer_on || k->closing)
        return;
    k->timer_on = true;
    uv_timer_start(&k->timer, timer_cb, 50, 50);
}

/* ---- create and close ------------------------------------------------------------------------*/

static int fill_random(void *p, size_t n)
{
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f)
        return td_err_set(TD_EIO, "kvx: cannot open /dev/urandom");
    size_t got = fread(p, 1, n, f);
    fclose(f);
    return got == n ? 0 : td_err_set(TD_EIO, "kvx: short read from /dev/urandom");
}

static int set_default(ucp_config_t *cfg, const char *name, const char *value)
{
    char env[128];
    snprintf(env, sizeof(env), "UCX_%s", name);
    if (getenv(env))
        return 0; /* the operator's setting wins */
    ucs_status_t st = ucp_config_modify(cfg, name, value);
    if (st != UCS_OK)
        return ucx_err(st, name);
    return 0;
}

static int build_blob(td_kvx_t *k)
{
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucs_status_t st = ucp_worker_get_address(k->worker, &addr, &addr_len);
    if (st != UCS_OK)
        return ucx_err(st, "ucp_worker_get_address");
    st = ucp_rkey_pack(k->ctx, k->memh, &rkey, &rkey_len);
    if (st != UCS_OK) {
        ucp_worker_release_address(k->worker, addr);
        return ucx_err(st, "ucp_rkey_pack");
    }
    blob_hdr_t h = {.version = KVX_VERSION,
                    .mem = (uint16_t)k->layout.mem,
                    .instance = k->instance,
                    .block_bytes = k->layout.block_bytes,
                    .n_blocks = k->layout.n_blocks,
                    .addr_len = (uint32_t)addr_len,
                    .rkey_len = (uint32_t)rkey_len,
                    .flags = k->opts.pool == TD_KVX_POOL_MMAP ? 0 : BLOB_F_UCX_POOL,
                    .pool_addr = (uint64_t)(uintptr_t)k->pool};
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
        return ucx_err(st, "ucp_mem_map");
    if (k->opts.pool != TD_KVX_POOL_MMAP) {
        ucp_mem_attr_t a = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        st = ucp_mem_query(k->memh, &a);
        if (st != UCS_OK)
            return ucx_err(st, "ucp_mem_query");
        k->pool = a.address;
        memset(k->pool, 0, k->pool_bytes);
    }
    return 0;
}

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

    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        ucx_err(st, "ucp_config_read");
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
        ucx_err(st, "ucp_init");
        k->ctx = NULL;
        goto err_free;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(k->ctx, &wp, &k->worker);
    if (st != UCS_OK) {
        ucx_err(st, "ucp_worker_create");
        k->worker = NULL;
        goto err_ucx;
    }
    st = ucp_worker_get_efd(k->worker, &k->efd);
    if (st != UCS_OK) {
        ucx_err(st, "ucp_worker_get_efd");
        goto err_ucx;
    }
    for (unsigned id = AM_HELLO; id < AM_LAST_; id++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            .id = id,
            .cb = am_cb,
            .arg = k,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
        };
        st = ucp_worker_set_am_recv_handler(k->worker, &hp);
        if (st != UCS_OK) {
            ucx_err(st, "ucp_worker_set_am_recv_handler");
            goto err_ucx;
        }
    }
    if (map_pool(k) < 0 || build_blob(k) < 0)
        goto err_ucx;

    uv_poll_init(loop, &k->poll, k->efd);
    uv_prepare_init(loop, &k->prepare);
    uv_idle_init(loop, &k->idle);
    uv_timer_init(loop, &k->timer);
    uv_timer_init(loop, &k->tick);
    k->poll.data = k->prepare.data = k->idle.data = k->timer.data = k->tick.data = k;
    k->handles_open = 5;
    uv_poll_start(&k->poll, UV_READABLE, poll_cb);
    uv_prepare_start(&k->prepare, prepare_cb);
    uv_unref((uv_handle_t *)&k->prepare);
    uv_unref((uv_handle_t *)&k->idle);
    uv_unref((uv_handle_t *)&k->timer);
    uv_unref((uv_handle_t *)&k->tick);
    return k;

err_ucx:
    free_ucx(k);
err_free:
    free(k->blob);
    free(k);
    return NULL;
}

static void handle_closed(uv_handle_t *h)
{
    td_kvx_t *k = h->data;
    if (--k->handles_open > 0)
        return;
    void (*cb)(void *) = k->close_cb;
    void *arg = k->close_arg;
    free(k);
    if (cb)
        cb(arg);
}

static uint32_t total_ops(const td_kvx_t *k)
{
    uint32_t n = 0;
    for (const td_kvx_peer_t *p = k->peers; p; p = p->next)
        n += p->ops_out;
    return n;
}

/* Progress until no operation is in flight or the deadline passes. */
static void drain(td_kvx_t *k, uint64_t wait_ns)
{
    uint64_t end = td_now_ns() + wait_ns;
    do {
        ucp_worker_progress(k->worker);
        run_tasks(k);
    } while ((total_ops(k) > 0 || k->tq_head) && td_now_ns() < end);
}

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
            queue_tx_check(x);
        }
        for (rx_t *r = p->rx; r; r = r->next) {
            if (r->status == 0)
                r->status = TD_ECANCELED;
            queue_rx_check(r);
        }
    }
    /* operations first, then rkeys and endpoints, as for a failed peer */
    drain(k, CLOSE_WAIT_NS);
    for (td_kvx_peer_t *p = k->peers; p; p = p->next)
        close_ep(p);
    drain(k, CLOSE_WAIT_NS);
    if (total_ops(k) > 0)
        TD_LOG_W("kvx: close: %u operations never completed", total_ops(k));
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
            if (x->cb)
                x->cb(x->status ? x->status : TD_ECANCELED, x->arg);
            xfer_free(x);
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
    free(k->blob);
    k->blob = NULL;
    uv_close((uv_handle_t *)&k->poll, handle_closed);
    uv_close((uv_handle_t *)&k->prepare, handle_closed);
    uv_close((uv_handle_t *)&k->idle, handle_closed);
    uv_close((uv_handle_t *)&k->timer, handle_closed);
    uv_close((uv_handle_t *)&k->tick, handle_closed);
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

void td_kvx_stats(const td_kvx_t *k, td_kvx_stats_t *out)
{
    *out = k->stats;
}

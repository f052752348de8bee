/* td_kvx.h: the KV data plane. Moves KV-cache blocks between the registered pools of two
 * processes over UCX (shared memory, TCP or RDMA, chosen by UCX from UCX_TLS), driven from a
 * libuv loop.
 *
 * A td_kvx_t owns one UCX context and worker, one pool of `n_blocks` blocks of `block_bytes` bytes
 * registered once with ucp_mem_map, and a table of peers. Its *blob* (td_kvx_blob) carries the
 * worker address, the packed rkey and the pool layout to a peer over the control plane (UCX has no
 * authentication: the blob must travel only over an authenticated channel). A peer is connected
 * from its blob; the first message on a new endpoint is a HELLO carrying our blob, so the remote
 * side learns us, checks our fingerprint and opens its own endpoint back (symmetric peers: either
 * side can push, pull, acknowledge).
 *
 * push: local block ids -> remote block ids. Adjacent runs are coalesced into one operation each.
 * The receiver learns of a transfer only through its on_recv callback, which runs after every byte
 * is in place (and, with TD_KVX_F_CSUM, checked against the sender's per-block XXH3-64). The
 * sender's callback runs when the receiver has acknowledged (status 0) or when the transfer failed.
 * pull: asks the peer to push the given blocks of its pool into ours; same guarantees.
 * fetch: asks the peer for blocks by content name (a 16-byte key, the KV block hash) rather than
 * by id: the peer's on_fetch resolves the keys (pinning the blocks it holds, reading others from
 * disk) and answers with td_kvx_fetch_answer, a push of a leading run of them into our blocks;
 * the requester learns how many arrived (checked with TD_KVX_F_CSUM).
 *
 * Threading: everything runs on the loop thread that created the td_kvx_t. Callbacks are never
 * called from inside UCX callbacks or from inside td_kvx_push/pull; they run from the loop.
 *
 * Wire format and mechanisms: see docs/dataplane.md.
 */
#ifndef TD_KVX_H
#define TD_KVX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct td_kvx td_kvx_t;
typedef struct td_kvx_peer td_kvx_peer_t;

/* Where a pool's memory lives. Only host memory for now (Debian's UCX has no CUDA support); the
 * code never assumes it beyond the allocation. */
typedef enum td_kvx_mem {
    TD_KVX_MEM_HOST = 0,
} td_kvx_mem_t;

/* Layout of a pool: block-major, block i at byte offset i * block_bytes. The engine's KV layout
 * maps onto this. Two pools exchange blocks only when block_bytes and fingerprint are equal. */
typedef struct td_kvx_layout {
    uint64_t block_bytes;    /* bytes per block, > 0, multiple of 64 */
    uint32_t n_blocks;       /* blocks in the pool, > 0 */
    uint8_t fingerprint[16]; /* layout fingerprint (model digest, dtype, block size, ...) */
    td_kvx_mem_t mem;        /* memory type of the pool */
} td_kvx_layout_t;

/* Which UCX operation moves the bytes of a block run. */
typedef enum td_kvx_mech {
    TD_KVX_MECH_AUTO = 0, /* per endpoint: PUT over RDMA lanes, or over shared-memory lanes into a
                             peer pool UCX allocated; AM otherwise (TCP) */
    TD_KVX_MECH_AM = 1,   /* rendezvous active message received straight into the block */
    TD_KVX_MECH_PUT = 2,  /* one-sided put into the remote rkey, then a flush */
} td_kvx_mech_t;

/* What the receiver learns about one incoming transfer. Valid only during the callback. */
typedef struct td_kvx_recv {
    int status;             /* 0, or TD_ECHECKSUM / TD_ECONNRESET / TD_EPROTO ... */
    const uint32_t *blocks; /* [n_blocks] destination block ids in our pool, in sender order */
    uint32_t n_blocks;
    const void *note; /* [note_len] bytes the sender attached (request id, first token, ...) */
    uint32_t note_len;
} td_kvx_recv_t;

/* Called on the receiver for each incoming push, after its data is in place (status 0), or when
 * it failed after some data may have been written (status < 0: the named blocks hold garbage;
 * n_blocks is 0 when the sender failed before its DONE message named them). */
typedef void (*td_kvx_recv_cb)(td_kvx_t *kvx, td_kvx_peer_t *peer, const td_kvx_recv_t *r,
                               void *arg);
/* Called exactly once for each push or pull that td_kvx_push/pull accepted (returned 0). Status 0:
 * the data is in place at the destination (and verified there with TD_KVX_F_CSUM). When it runs,
 * UCX no longer touches the source or destination blocks of this transfer. */
typedef void (*td_kvx_done_cb)(int status, void *arg);

/* Bytes of a fetch key (a block's content name: the KV block hash, td_kvhash.h). */
#define TD_KVX_KEY_BYTES 16u

/* Called once for each fetch that td_kvx_fetch accepted: status 0 and n_got >= 1: the blocks
 * dst[0, n_got) of the request hold the content of keys[0, n_got) (verified with TD_KVX_F_CSUM;
 * the peer may serve fewer than asked: a leading run); status < 0 and n_got 0: nothing usable
 * (TD_ENOENT: the peer holds none of them; TD_ECHECKSUM, TD_EPROTO, or the peer's failure). When
 * it runs, UCX no longer touches the destination blocks. */
typedef void (*td_kvx_fetch_cb)(int status, uint32_t n_got, void *arg);

/* A peer's fetch, as the holder sees it in on_fetch. Valid only during the callback: copy what
 * the answer needs (peer, id, flags, dst). */
typedef struct td_kvx_fetch_req {
    td_kvx_peer_t *peer; /* the requester (owned by kvx, valid until td_kvx_close) */
    uint64_t id;         /* its fetch id, named in the answer */
    unsigned flags;      /* TD_KVX_F_CSUM: the answer must carry checksums */
    uint32_t n;
    const uint8_t *keys; /* [n * TD_KVX_KEY_BYTES] the wanted contents, in order */
    const uint32_t *dst; /* [n] the requester's block ids for them */
} td_kvx_fetch_req_t;
/* Serve a fetch: resolve the keys now or later and answer exactly once with
 * td_kvx_fetch_answer. Runs from the loop. */
typedef void (*td_kvx_fetch_serve_cb)(td_kvx_t *kvx, const td_kvx_fetch_req_t *req, void *arg);

/* Who allocates the pool's memory. */
typedef enum td_kvx_pool_alloc {
    TD_KVX_POOL_UCX = 0,  /* ucp_mem_map(ALLOCATE): a shared-memory segment that local peers map,
                             so shared-memory puts are single copies */
    TD_KVX_POOL_MMAP = 1, /* private anonymous memory, registered */
} td_kvx_pool_alloc_t;

typedef struct td_kvx_opts {
    td_kvx_mech_t mech;       /* TD_KVX_MECH_AUTO */
    double keepalive_s;       /* UCX keepalive interval, bounds dead-peer detection; 0 -> 0.5 s */
    double connect_s;         /* a HELLO not acknowledged in this time fails; 0 -> 10 s */
    td_kvx_recv_cb on_recv;   /* may be NULL (incoming pushes acknowledged, not reported) */
    void *arg;                /* passed to on_recv */
    td_kvx_pool_alloc_t pool; /* TD_KVX_POOL_UCX */
    td_kvx_fetch_serve_cb on_fetch; /* may be NULL: fetches are answered TD_ENOTSUP */
} td_kvx_opts_t;

/* Flags for td_kvx_push / td_kvx_pull. */
enum {
    TD_KVX_F_CSUM = 1u << 0,           /* per-block XXH3-64 checked by the receiver */
    TD_KVX_F_TEST_BAD_CSUM = 1u << 15, /* tests only: send a wrong checksum for the first block */
};

/* Largest note a push may carry. */
#define TD_KVX_NOTE_MAX 4096u

/* Create a data plane on `loop` (which must outlive it): UCX context and worker, the pool
 * (allocated, zero-filled and registered once), the loop handles. `opts` may be NULL. Reads the
 * usual UCX_* environment (UCX_TLS ...). Returns NULL on error with td_err_msg set. */
td_kvx_t *td_kvx_new(uv_loop_t *loop, const td_kvx_layout_t *layout, const td_kvx_opts_t *opts);

/* Close: fails every pending transfer (callbacks run with TD_ECANCELED before this returns),
 * destroys rkeys, force-closes endpoints, unregisters and frees the pool, destroys the worker and
 * context, then closes the loop handles; `cb` (may be NULL) runs from the loop when the memory is
 * freed. Do not use `kvx` or its peers after this call, and do not call it from inside a td_kvx
 * callback (on_recv, done): defer it to the loop. */
void td_kvx_close(td_kvx_t *kvx, void (*cb)(void *arg), void *arg);

/* The pool: block i lives at td_kvx_pool(kvx) + i * block_bytes. Owned by kvx. */
uint8_t *td_kvx_pool(td_kvx_t *kvx);
const td_kvx_layout_t *td_kvx_layout(const td_kvx_t *kvx);

/* Our blob for the control plane. Owned by kvx, valid until close. */
const void *td_kvx_blob(td_kvx_t *kvx, size_t *len);

/* Connect to the peer described by `blob` (received over the control plane). Checks the layout
 * (TD_EMISMATCH when the fingerprint or block size differ, TD_EPARSE for a malformed blob).
 * Returns the cached peer when that instance is already known. Endpoint creation is lazy; a push
 * issued before the handshake completes waits for it. The peer is owned by kvx. A known peer's
 * blob with a newer epoch (td_kvx_renew) replaces the stored one and retires the peer's endpoint:
 * new transfers go on a fresh one, those already posted finish on the old one. */
int td_kvx_connect(td_kvx_t *kvx, const void *blob, size_t len, td_kvx_peer_t **out);

/* Push `n` blocks: our block src[i] -> the peer's block dst[i]. `src`, `dst` and `note` are copied;
 * the source blocks must stay unchanged until `cb` runs. Returns 0 (cb will run exactly once, from
 * the loop) or a negative code and cb never runs: TD_EINVAL / TD_ERANGE (bad ids, naming the
 * index in td_err_msg), TD_ENOMEM, TD_EMISMATCH (the peer refused our layout), TD_ECLOSED, or the
 * endpoint error when reconnecting a failed peer fails at once (e.g. TD_EUNREACH). A peer that
 * failed earlier is reconnected from its stored blob. */
int td_kvx_push(td_kvx_peer_t *peer, const uint32_t *src, const uint32_t *dst, uint32_t n,
                const void *note, uint32_t note_len, unsigned flags, td_kvx_done_cb cb, void *arg);

/* Pull `n` blocks: the peer's block src[i] -> our block dst[i]. The destination blocks must not be
 * used until `cb` runs. Same return contract as td_kvx_push. */
int td_kvx_pull(td_kvx_peer_t *peer, const uint32_t *src, const uint32_t *dst, uint32_t n,
                unsigned flags, td_kvx_done_cb cb, void *arg);

/* Fetch `n` blocks by content: keys[i] (TD_KVX_KEY_BYTES each) into our block dst[i]. The peer
 * serves a leading run of them (td_kvx_fetch_req_t, td_kvx_fetch_answer). The destination blocks
 * must not be used until `cb` runs. Same return contract as td_kvx_push (TD_ERANGE for a dst id
 * outside our pool, TD_EINVAL for n == 0 or n above the peer's pool size). */
int td_kvx_fetch(td_kvx_peer_t *peer, const uint8_t *keys, const uint32_t *dst, uint32_t n,
                 unsigned flags, td_kvx_fetch_cb cb, void *arg);

/* Answer fetch `id` of `peer` (from on_fetch's request, `flags` as it asked, plus test flags):
 * with n >= 1, push our blocks src[i] -> the requester's dst[i] for its first n keys, in order;
 * `cb` runs when the requester acknowledged or the push failed, and the source blocks must stay
 * unchanged until then. With n == 0, tell it `status` (< 0, e.g. TD_ENOENT: none held); cb never
 * runs. Returns 0, or an error and cb never runs (TD_ERANGE, TD_ENOMEM, TD_ECLOSED, the endpoint
 * error). */
int td_kvx_fetch_answer(td_kvx_peer_t *peer, uint64_t id, unsigned flags, const uint32_t *src,
                        const uint32_t *dst, uint32_t n, int status, td_kvx_done_cb cb, void *arg);

/* The FETCH message's payload (docs/dataplane.md, Formats), exposed for tests and fuzzing.
 * td_kvx_fetch_size: its bytes for n keys. td_kvx_fetch_encode writes it into out (that many
 * bytes). td_kvx_fetch_parse checks `len` bytes at `buf` (any alignment): n >= 1 and <= max_n,
 * the key size, known flags only, the exact length, every destination id below dst_limit. On
 * success out->keys points into buf and out->dst into `dst_out` ([max_n], aligned copies); peer
 * and id are left 0. TD_EPROTO (td_err_msg says which field) otherwise. */
size_t td_kvx_fetch_size(uint32_t n);
void td_kvx_fetch_encode(uint8_t *out, const uint8_t *keys, const uint32_t *dst, uint32_t n,
                         unsigned flags);
int td_kvx_fetch_parse(const void *buf, size_t len, uint32_t max_n, uint32_t dst_limit,
                       uint32_t *dst_out, td_kvx_fetch_req_t *out);

/* Start a new data-plane epoch: after this process may have been cut off the network (it lost a
 * control connection and registers again). Our blob carries the new epoch (fetch it again with
 * td_kvx_blob for the control plane). Every endpoint we hold is retired, not failed: operations
 * already posted on it finish (or fail) there, and it is closed once they and the incoming
 * transfers begun before are done (kept at least 1 s, at most 60 s); each such peer is sent a
 * HELLO on a fresh endpoint (a new connection, so nothing waits behind whatever the old one still
 * retransmits), and a peer that reads it, or is handed the new blob, retires its own endpoint to
 * us the same way. Returns the new epoch. */
uint64_t td_kvx_renew(td_kvx_t *kvx);
/* Our data-plane epoch (1 until the first td_kvx_renew). */
uint64_t td_kvx_epoch(const td_kvx_t *kvx);

/* Transfers of this peer not yet completed (pushes and pulls we started). */
uint32_t td_kvx_peer_pending(const td_kvx_peer_t *peer);
/* True while the peer's endpoint is usable (handshake done, no error seen since). */
bool td_kvx_peer_ready(const td_kvx_peer_t *peer);
/* The mechanism in use toward this peer (AM or PUT; AUTO while it has no endpoint). */
td_kvx_mech_t td_kvx_peer_mech(const td_kvx_peer_t *peer);

/* Counters for tests and /metrics. */
typedef struct td_kvx_stats {
    uint64_t ops_posted;    /* UCX data operations posted (one per coalesced run) */
    uint64_t bytes_pushed;  /* payload bytes of completed outgoing transfers */
    uint64_t recv_ok;       /* incoming transfers delivered with status 0 */
    uint64_t recv_failed;   /* incoming transfers delivered with an error */
    uint64_t peer_failures; /* endpoint errors seen */
    uint64_t wakeups;       /* times the loop woke us through the event fd */
    uint64_t eps_retired;   /* endpoints retired for a new epoch (ours or a peer's) */
    uint64_t retired_open;  /* of those, still open now (what was posted on them not done) */
} td_kvx_stats_t;
void td_kvx_stats(const td_kvx_t *kvx, td_kvx_stats_t *out);

/* Coalesce block-id pairs into runs where both sides are consecutive. Writes at most `n` runs
 * (first index into src/dst and length) and returns how many. Exposed for tests. */
typedef struct td_kvx_run {
    uint32_t first; /* index into src/dst of the run's first pair */
    uint32_t len;   /* blocks in the run */
} td_kvx_run_t;
uint32_t td_kvx_coalesce(const uint32_t *src, const uint32_t *dst, uint32_t n, td_kvx_run_t *runs);

#endif

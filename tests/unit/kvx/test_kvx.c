/* test_kvx.c: the KV data plane within one process: run coalescing, layout and blob checks, the
 * FETCH message's parser, and two pools on one loop pushing, pulling and fetching blocks through
 * UCX (multi-process tests are in
 * tests/integration/kvx_test.py). */
#include "td_error.h"
#include "td_kvx.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* UCX 1.13.1 leaks ~100 bytes inside uct_mm_iface_t_new when a shared-memory interface is
 * created after another context in the process went away; not ours, suppressed under LSan. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:uct_mm_iface_t_new\nleak:libuct.so.0\n"; /* frames are unsymbolised */
}

#define BB 4096u
#define NB 64u

/* ---- coalescing --------------------------------------------------------------------------- */

START_TEST(test_coalesce_known)
{
    /* three runs: 0-2 -> 10-12, 5-6 -> 3-4, 9 -> 0 */
    uint32_t src[] = {0, 1, 2, 5, 6, 9}, dst[] = {10, 11, 12, 3, 4, 0};
    td_kvx_run_t runs[6];
    ck_assert_uint_eq(td_kvx_coalesce(src, dst, 6, runs), 3);
    ck_assert_uint_eq(runs[0].first, 0);
    ck_assert_uint_eq(runs[0].len, 3);
    ck_assert_uint_eq(runs[1].first, 3);
    ck_assert_uint_eq(runs[1].len, 2);
    ck_assert_uint_eq(runs[2].first, 5);
    ck_assert_uint_eq(runs[2].len, 1);
    /* adjacent on one side only: no merge */
    uint32_t s2[] = {4, 5}, d2[] = {7, 9};
    ck_assert_uint_eq(td_kvx_coalesce(s2, d2, 2, runs), 2);
    /* descending ids never merge */
    uint32_t s3[] = {5, 4}, d3[] = {5, 4};
    ck_assert_uint_eq(td_kvx_coalesce(s3, d3, 2, runs), 2);
}
END_TEST

START_TEST(test_coalesce_random)
{
    /* property: runs partition [0, n), are consecutive inside, and maximal */
    srand(7);
    uint32_t src[200], dst[200];
    td_kvx_run_t runs[200];
    for (int iter = 0; iter < 200; iter++) {
        uint32_t n = 1 + (uint32_t)(rand() % 200);
        for (uint32_t i = 0; i < n; i++) {
            bool step = rand() % 3 != 0 && i > 0;
            src[i] = step ? src[i - 1] + 1 : (uint32_t)(rand() % 1000);
            dst[i] = step ? dst[i - 1] + 1 : (uint32_t)(rand() % 1000);
        }
        uint32_t nr = td_kvx_coalesce(src, dst, n, runs), covered = 0;
        for (uint32_t r = 0; r < nr; r++) {
            ck_assert_uint_eq(runs[r].first, covered);
            for (uint32_t j = 1; j < runs[r].len; j++) {
                ck_assert_uint_eq(src[runs[r].first + j], src[runs[r].first] + j);
                ck_assert_uint_eq(dst[runs[r].first + j], dst[runs[r].first] + j);
            }
            covered += runs[r].len;
            if (r + 1 < nr) {
                uint32_t last = runs[r].first + runs[r].len - 1, next = last + 1;
                ck_assert(!(src[next] == src[last] + 1 && dst[next] == dst[last] + 1));
            }
        }
        ck_assert_uint_eq(covered, n);
    }
}
END_TEST

/* ---- two pools on one loop ------------------------------------------------------------------ */

typedef struct rec {
    int n_recv;
    int last_status;
    uint32_t last_blocks;
    bool data_ok; /* destination blocks held the expected bytes when the completion ran */
    char note[64];
} rec_t;

static uint8_t expect_byte(uint32_t src_block, uint32_t off, uint8_t salt)
{
    return (uint8_t)(src_block * 31 + off * 7 + salt);
}

static void fill(td_kvx_t *k, uint8_t salt)
{
    for (uint32_t b = 0; b < NB; b++)
        for (uint32_t i = 0; i < BB; i++)
            td_kvx_pool(k)[(size_t)b * BB + i] = expect_byte(b, i, salt);
}

static bool holds(td_kvx_t *k, uint32_t dst, uint32_t src, uint8_t salt)
{
    for (uint32_t i = 0; i < BB; i++)
        if (td_kvx_pool(k)[(size_t)dst * BB + i] != expect_byte(src, i, salt))
            return false;
    return true;
}

/* the note carries: salt, then the source ids */
static void on_recv(td_kvx_t *k, td_kvx_peer_t *p, const td_kvx_recv_t *r, void *arg)
{
    rec_t *rc = arg;
    rc->n_recv++;
    rc->last_status = r->status;
    rc->last_blocks = r->n_blocks;
    rc->data_ok = false;
    if (r->status == 0 && r->note_len == 1 + 4 * r->n_blocks) {
        const uint8_t *note = r->note;
        rc->data_ok = true;
        for (uint32_t i = 0; i < r->n_blocks; i++) {
            uint32_t src;
            memcpy(&src, note + 1 + 4 * i, 4);
            if (!holds(k, r->blocks[i], src, note[0]))
                rc->data_ok = false;
        }
    }
}

static void done_cb(int status, void *arg)
{
    int *out = arg;
    *out = status;
}

static uv_loop_t loop;
static td_kvx_t *ka, *kb;
static rec_t ra, rb;
static td_kvx_peer_t *a_to_b;

/* ---- the holder's side of a fetch (kb serves; keys name source blocks: key byte 0 = id) ---- */

typedef enum serve_mode { SERVE_ALL, SERVE_TWO, SERVE_NONE, SERVE_BAD_CSUM, SERVE_LATER } serve_mode_t;
static serve_mode_t serve_mode;
static int serve_calls, served_status;
static struct {
    td_kvx_peer_t *peer;
    uint64_t id;
    unsigned flags;
    uint32_t n, src[NB], dst[NB];
} later; /* SERVE_LATER: the request kept for an answer after the loop ran */

static void served_cb(int status, void *arg)
{
    (void)arg;
    served_status = status;
}

static void on_fetch(td_kvx_t *k, const td_kvx_fetch_req_t *req, void *arg)
{
    (void)k;
    (void)arg;
    serve_calls++;
    uint32_t src[NB];
    for (uint32_t i = 0; i < req->n; i++)
        src[i] = req->keys[(size_t)i * TD_KVX_KEY_BYTES];
    uint32_t n = serve_mode == SERVE_TWO ? 2 : serve_mode == SERVE_NONE ? 0 : req->n;
    unsigned flags = req->flags | (serve_mode == SERVE_BAD_CSUM ? TD_KVX_F_TEST_BAD_CSUM : 0);
    served_status = 1;
    if (serve_mode == SERVE_LATER) {
        later.peer = req->peer;
        later.id = req->id;
        later.flags = req->flags;
        later.n = req->n;
        memcpy(later.src, src, 4 * req->n);
        memcpy(later.dst, req->dst, 4 * req->n);
        return;
    }
    ck_assert_int_eq(td_kvx_fetch_answer(req->peer, req->id, flags, src, req->dst, n, TD_ENOENT,
                                         served_cb, NULL),
                     0);
}

static td_kvx_t *make(const char *fp, uint64_t bb, rec_t *r)
{
    td_kvx_layout_t l = {.block_bytes = bb, .n_blocks = NB};
    strncpy((char *)l.fingerprint, fp, 16);
    td_kvx_opts_t o = {.on_recv = on_recv, .arg = r};
    if (r == &rb)
        o.on_fetch = on_fetch;
    return td_kvx_new(&loop, &l, &o);
}

/* make() with UCX_TLS=tcp for this context only (the environment is restored). */
static td_kvx_t *make_tcp(rec_t *r)
{
    const char *tls = getenv("UCX_TLS");
    char *saved = tls ? strdup(tls) : NULL;
    setenv("UCX_TLS", "tcp", 1);
    td_kvx_t *k = make("fp-one", BB, r);
    if (saved)
        setenv("UCX_TLS", saved, 1);
    else
        unsetenv("UCX_TLS");
    free(saved);
    return k;
}

static void run_until(int *status, double limit_s)
{
    double end = td_now_s() + limit_s;
    while (*status == 1 && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
}

static void setup(void)
{
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    memset(&ra, 0, sizeof(ra));
    memset(&rb, 0, sizeof(rb));
    ka = make("fp-one", BB, &ra);
    kb = make("fp-one", BB, &rb);
    ck_assert_ptr_nonnull(ka);
    ck_assert_ptr_nonnull(kb);
    size_t len;
    const void *blob = td_kvx_blob(kb, &len);
    ck_assert_int_eq(td_kvx_connect(ka, blob, len, &a_to_b), 0);
}

static void teardown(void)
{
    td_kvx_close(ka, NULL, NULL);
    td_kvx_close(kb, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static int push_note(td_kvx_peer_t *p, const uint32_t *src, const uint32_t *dst, uint32_t n,
                     uint8_t salt, unsigned flags, int *status)
{
    uint8_t note[1 + 4 * NB];
    note[0] = salt;
    memcpy(note + 1, src, 4 * n);
    *status = 1;
    return td_kvx_push(p, src, dst, n, note, 1 + 4 * n, flags, done_cb, status);
}

START_TEST(test_push_pull)
{
    fill(ka, 1);
    uint32_t src[NB], dst[NB];
    /* whole pool, reversed: no two blocks coalesce */
    for (uint32_t i = 0; i < NB; i++) {
        src[i] = i;
        dst[i] = NB - 1 - i;
    }
    int st;
    ck_assert_int_eq(push_note(a_to_b, src, dst, NB, 1, TD_KVX_F_CSUM, &st), 0);
    ck_assert_int_eq(st, 1); /* the callback never runs inside td_kvx_push */
    run_until(&st, 30);
    ck_assert_int_eq(st, 0);
    ck_assert_int_eq(rb.n_recv, 1);
    ck_assert_int_eq(rb.last_status, 0);
    ck_assert_uint_eq(rb.last_blocks, NB);
    ck_assert(rb.data_ok);
    td_kvx_stats_t s;
    td_kvx_stats(ka, &s);
    ck_assert_uint_eq(s.ops_posted, NB);
    ck_assert_uint_eq(s.bytes_pushed, (uint64_t)NB * BB);

    /* a contiguous run is one operation */
    fill(ka, 2);
    for (uint32_t i = 0; i < 16; i++) {
        src[i] = 8 + i;
        dst[i] = 40 + i;
    }
    ck_assert_int_eq(push_note(a_to_b, src, dst, 16, 2, 0, &st), 0);
    run_until(&st, 30);
    ck_assert_int_eq(st, 0);
    ck_assert(rb.data_ok);
    td_kvx_stats(ka, &s);
    ck_assert_uint_eq(s.ops_posted, NB + 1);

    /* pull: a takes b's blocks 3, 4, 60 into its 0, 1, 2 */
    fill(kb, 9);
    uint32_t ps[] = {3, 4, 60}, pd[] = {0, 1, 2};
    st = 1;
    ck_assert_int_eq(td_kvx_pull(a_to_b, ps, pd, 3, TD_KVX_F_CSUM, done_cb, &st), 0);
    run_until(&st, 30);
    ck_assert_int_eq(st, 0);
    for (int i = 0; i < 3; i++)
        ck_assert(holds(ka, pd[i], ps[i], 9));
    ck_assert_int_eq(ra.n_recv, 0); /* a pull's answer is not an incoming push */
}
END_TEST

START_TEST(test_checksum_mismatch)
{
    fill(ka, 3);
    uint32_t src[] = {1, 2}, dst[] = {5, 9};
    int st;
    ck_assert_int_eq(push_note(a_to_b, src, dst, 2, 3, TD_KVX_F_CSUM | TD_KVX_F_TEST_BAD_CSUM, &st),
                     0);
    run_until(&st, 30);
    ck_assert_int_eq(st, TD_ECHECKSUM);
    ck_assert_int_eq(rb.n_recv, 1);
    ck_assert_int_eq(rb.last_status, TD_ECHECKSUM);
}
END_TEST

START_TEST(test_bad_input)
{
    uint32_t ok[] = {1}, bad[] = {NB};
    int st = 1;
    ck_assert_int_eq(td_kvx_push(a_to_b, ok, bad, 1, NULL, 0, 0, done_cb, &st), TD_ERANGE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "pool size"));
    ck_assert_int_eq(td_kvx_push(a_to_b, bad, ok, 1, NULL, 0, 0, done_cb, &st), TD_ERANGE);
    ck_assert_int_eq(td_kvx_pull(a_to_b, bad, ok, 1, 0, done_cb, &st), TD_ERANGE);
    ck_assert_int_eq(td_kvx_push(a_to_b, ok, ok, 0, NULL, 0, 0, done_cb, &st), TD_EINVAL);
    ck_assert_int_eq(td_kvx_push(a_to_b, ok, ok, 1, "x", TD_KVX_NOTE_MAX + 1, 0, done_cb, &st),
                     TD_EINVAL);
    ck_assert_int_eq(td_kvx_push(a_to_b, ok, ok, 1, NULL, 0, 0, NULL, NULL), TD_EINVAL);
    ck_assert_int_eq(st, 1); /* refused transfers never call back */

    /* blobs: truncated, garbage, own, other fingerprint, other block size */
    size_t len;
    const uint8_t *blob = td_kvx_blob(kb, &len);
    td_kvx_peer_t *p;
    ck_assert_int_eq(td_kvx_connect(ka, blob, len - 1, &p), TD_EPARSE);
    ck_assert_int_eq(td_kvx_connect(ka, "garbage", 7, &p), TD_EPARSE);
    uint8_t *copy = malloc(len);
    memcpy(copy, blob, len);
    copy[0] ^= 0xff;
    ck_assert_int_eq(td_kvx_connect(ka, copy, len, &p), TD_EPARSE);
    free(copy);
    const void *own = td_kvx_blob(ka, &len);
    ck_assert_int_eq(td_kvx_connect(ka, own, len, &p), TD_EINVAL);
    rec_t rc = {0};
    td_kvx_t *other = make("fp-two", BB, &rc);
    ck_assert_ptr_nonnull(other);
    blob = td_kvx_blob(other, &len);
    ck_assert_int_eq(td_kvx_connect(ka, blob, len, &p), TD_EMISMATCH);
    td_kvx_close(other, NULL, NULL);
    other = make("fp-one", BB * 2, &rc);
    ck_assert_ptr_nonnull(other);
    blob = td_kvx_blob(other, &len);
    ck_assert_int_eq(td_kvx_connect(ka, blob, len, &p), TD_EMISMATCH);
    td_kvx_close(other, NULL, NULL);
}
END_TEST

static int closed_calls;
static void on_closed(void *arg)
{
    closed_calls++;
}

START_TEST(test_close_cancels)
{
    fill(ka, 4);
    uint32_t src[] = {1}, dst[] = {2};
    int st;
    ck_assert_int_eq(push_note(a_to_b, src, dst, 1, 4, 0, &st), 0);
    /* close before the loop ever ran: the transfer fails, its callback runs during close */
    td_kvx_close(ka, on_closed, NULL);
    ck_assert_int_lt(st, 0);
    ck_assert_int_ne(st, 1);
    ka = make("fp-one", BB, &ra); /* for teardown */
    ck_assert_ptr_nonnull(ka);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(closed_calls, 1);
}
END_TEST

START_TEST(test_bad_layout)
{
    uv_loop_t l;
    uv_loop_init(&l);
    td_kvx_layout_t lay = {.block_bytes = 0, .n_blocks = 4};
    ck_assert_ptr_null(td_kvx_new(&l, &lay, NULL));
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "layout"));
    lay.block_bytes = 100; /* not a multiple of 64 */
    ck_assert_ptr_null(td_kvx_new(&l, &lay, NULL));
    lay.block_bytes = 4096;
    lay.n_blocks = 0;
    ck_assert_ptr_null(td_kvx_new(&l, &lay, NULL));
    lay.n_blocks = 4;
    lay.mem = (td_kvx_mem_t)7;
    ck_assert_ptr_null(td_kvx_new(&l, &lay, NULL));
    uv_loop_close(&l);
}
END_TEST

/* ---- fetch ------------------------------------------------------------------------------- */

typedef struct fetch_rec {
    int status; /* 1 until the callback ran */
    uint32_t n_got;
} fetch_rec_t;

static void fetch_cb(int status, uint32_t n_got, void *arg)
{
    fetch_rec_t *f = arg;
    f->status = status;
    f->n_got = n_got;
}

/* a fetches b's blocks `src` by key into its blocks 20.. */
static int fetch_from_b(const uint32_t *src, uint32_t n, fetch_rec_t *f)
{
    uint8_t keys[NB * TD_KVX_KEY_BYTES];
    uint32_t dst[NB];
    memset(keys, 0xee, sizeof(keys));
    for (uint32_t i = 0; i < n; i++) {
        keys[(size_t)i * TD_KVX_KEY_BYTES] = (uint8_t)src[i];
        dst[i] = 20 + i;
    }
    f->status = 1;
    f->n_got = 99;
    return td_kvx_fetch(a_to_b, keys, dst, n, TD_KVX_F_CSUM, fetch_cb, f);
}

/* Answer the fetch kept in `later` in full and wait for the requester's callback (f): every one
 * of its n blocks arrived. */
static void answer_later(fetch_rec_t *f, uint32_t n)
{
    ck_assert_int_eq(td_kvx_fetch_answer(later.peer, later.id, later.flags, later.src, later.dst,
                                         later.n, 0, served_cb, NULL),
                     0);
    run_until(&f->status, 30);
    ck_assert_int_eq(f->status, 0);
    ck_assert_uint_eq(f->n_got, n);
}

START_TEST(test_fetch)
{
    fill(kb, 5);
    uint32_t src[] = {7, 8, 9, 30};
    fetch_rec_t f;
    serve_calls = 0;

    serve_mode = SERVE_ALL; /* every block, checked on arrival */
    ck_assert_int_eq(fetch_from_b(src, 4, &f), 0);
    ck_assert_int_eq(f.status, 1);
    run_until(&f.status, 30);
    ck_assert_int_eq(f.status, 0);
    ck_assert_uint_eq(f.n_got, 4);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert(holds(ka, 20 + i, src[i], 5));
    run_until(&served_status, 30);
    ck_assert_int_eq(served_status, 0); /* the holder's callback: its blocks are free again */
    ck_assert_int_eq(ra.n_recv, 0);     /* an answer is not an incoming push */

    fill(kb, 6);
    serve_mode = SERVE_TWO; /* a leading run only */
    ck_assert_int_eq(fetch_from_b(src, 4, &f), 0);
    run_until(&f.status, 30);
    ck_assert_int_eq(f.status, 0);
    ck_assert_uint_eq(f.n_got, 2);
    ck_assert(holds(ka, 20, src[0], 6) && holds(ka, 21, src[1], 6));
    ck_assert(holds(ka, 22, src[2], 5)); /* untouched */

    serve_mode = SERVE_NONE; /* the holder has none of them (evicted) */
    ck_assert_int_eq(fetch_from_b(src, 4, &f), 0);
    run_until(&f.status, 30);
    ck_assert_int_eq(f.status, TD_ENOENT);
    ck_assert_uint_eq(f.n_got, 0);

    serve_mode = SERVE_BAD_CSUM; /* the bytes do not match the holder's checksum */
    ck_assert_int_eq(fetch_from_b(src, 4, &f), 0);
    run_until(&f.status, 30);
    ck_assert_int_eq(f.status, TD_ECHECKSUM);
    ck_assert_uint_eq(f.n_got, 0);
    run_until(&served_status, 30);
    ck_assert_int_eq(served_status, TD_ECHECKSUM);

    fill(kb, 7);
    serve_mode = SERVE_LATER; /* answered after the loop ran (a disk read on a real holder) */
    ck_assert_int_eq(fetch_from_b(src, 3, &f), 0);
    double end = td_now_s() + 30;
    while (serve_calls < 5 && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(serve_calls, 5);
    end = td_now_s() + 0.2;
    while (td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(f.status, 1); /* waits for the answer */
    answer_later(&f, 3);
    for (uint32_t i = 0; i < 3; i++)
        ck_assert(holds(ka, 20 + i, src[i], 7));
    ck_assert_int_eq(serve_calls, 5);

    /* refused at once: no callback */
    uint32_t bad[] = {NB};
    uint8_t key[TD_KVX_KEY_BYTES] = {0};
    ck_assert_int_eq(td_kvx_fetch(a_to_b, key, bad, 1, 0, fetch_cb, &f), TD_ERANGE);
    ck_assert_int_eq(td_kvx_fetch(a_to_b, key, bad, 0, 0, fetch_cb, &f), TD_EINVAL);
    ck_assert_int_eq(td_kvx_fetch(a_to_b, key, bad, NB + 1, 0, fetch_cb, &f), TD_EINVAL);
}
END_TEST

START_TEST(test_fetch_no_server)
{
    /* a serves no fetches (no on_fetch): b's fetch from a is answered TD_ENOTSUP */
    size_t len;
    const void *blob = td_kvx_blob(ka, &len);
    td_kvx_peer_t *b_to_a;
    ck_assert_int_eq(td_kvx_connect(kb, blob, len, &b_to_a), 0);
    uint8_t key[TD_KVX_KEY_BYTES] = {1};
    uint32_t dst[] = {3};
    fetch_rec_t f = {1, 99};
    ck_assert_int_eq(td_kvx_fetch(b_to_a, key, dst, 1, TD_KVX_F_CSUM, fetch_cb, &f), 0);
    run_until(&f.status, 30);
    ck_assert_int_eq(f.status, TD_ENOTSUP);
    ck_assert_uint_eq(f.n_got, 0);
}
END_TEST

/* Two contexts over TCP: *a (receives into r) connected to *b (the holder: rb, serves fetches). */
static void tcp_pair(rec_t *r, td_kvx_t **a, td_kvx_t **b, td_kvx_peer_t **a_b)
{
    *a = make_tcp(r);
    *b = make_tcp(&rb);
    ck_assert_ptr_nonnull(*a);
    ck_assert_ptr_nonnull(*b);
    size_t len;
    const void *blob = td_kvx_blob(*b, &len);
    ck_assert_int_eq(td_kvx_connect(*a, blob, len, a_b), 0);
}

/* Fetch 2 blocks (keys, dst) through p from a holder that keeps the request (SERVE_LATER, in
 * `later`) without answering; returns once the holder has it. */
static void fetch_held(td_kvx_peer_t *p, const uint8_t *keys, const uint32_t *dst, fetch_rec_t *f)
{
    serve_mode = SERVE_LATER;
    serve_calls = 0;
    ck_assert_int_eq(td_kvx_fetch(p, keys, dst, 2, TD_KVX_F_CSUM, fetch_cb, f), 0);
    double end = td_now_s() + 30;
    while (serve_calls == 0 && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(serve_calls, 1);
}

START_TEST(test_fetch_holder_closes)
{
    /* the holder goes away before it answers: the fetch fails, after UCX let go of the blocks.
     * Over TCP, where a closed endpoint is a closed socket (shared memory notices only the death
     * of the process, which tests/integration covers). */
    rec_t rr = {0};
    td_kvx_t *kr, *kh;
    td_kvx_peer_t *r_to_h;
    tcp_pair(&rr, &kr, &kh, &r_to_h);
    uint8_t keys[2 * TD_KVX_KEY_BYTES] = {1};
    uint32_t dst[] = {20, 21};
    fetch_rec_t f = {1, 99};
    fetch_held(r_to_h, keys, dst, &f);
    td_kvx_close(kh, NULL, NULL);
    run_until(&f.status, 60);
    ck_assert_int_lt(f.status, 0);
    ck_assert_int_ne(f.status, 1);
    ck_assert_uint_eq(f.n_got, 0);
    td_kvx_close(kr, NULL, NULL);
}
END_TEST

/* A new epoch (td_kvx_renew, a worker registering again after losing its router): b's blob
 * changes, both sides replace their endpoints, a fetch begun before survives it (it finishes on
 * the retired endpoints), a push queued across it goes on the fresh one, an old blob retires
 * nothing, and the retired endpoints are closed once done. */
static void renew_scenario(td_kvx_t *a, td_kvx_t *b, td_kvx_peer_t *a_b, rec_t *rec_b)
{
    size_t len0;
    const void *b0 = td_kvx_blob(b, &len0);
    uint8_t *old_blob = malloc(len0);
    memcpy(old_blob, b0, len0);
    fill(a, 5);
    fill(b, 6);
    /* both directions connected: a pushed to b, so b opened its endpoint back */
    uint32_t src[] = {1, 2, 3}, dst[] = {10, 11, 12};
    int st;
    ck_assert_int_eq(push_note(a_b, src, dst, 3, 5, TD_KVX_F_CSUM, &st), 0);
    run_until(&st, 30);
    ck_assert_int_eq(st, 0);
    ck_assert_uint_eq(td_kvx_epoch(b), 1);

    /* a fetch from b, held by b's on_fetch (SERVE_LATER) across the renewal */
    uint8_t keys[2 * TD_KVX_KEY_BYTES] = {0};
    keys[0] = 7;
    keys[TD_KVX_KEY_BYTES] = 8;
    uint32_t fdst[] = {30, 31};
    fetch_rec_t f = {1, 99};
    fetch_held(a_b, keys, fdst, &f);

    ck_assert_uint_eq(td_kvx_renew(b), 2);
    ck_assert_uint_eq(td_kvx_epoch(b), 2);
    size_t len1;
    const uint8_t *b1 = td_kvx_blob(b, &len1);
    ck_assert_uint_eq(len1, len0);
    double end;
    ck_assert(memcmp(b1, old_blob, len0) != 0);
    td_kvx_stats_t sa, sb;
    td_kvx_stats(b, &sb);
    ck_assert_uint_eq(sb.eps_retired, 1); /* b's endpoint to a */
    ck_assert_uint_eq(sb.retired_open, 1);
    /* a push queued before the loop ran again: it goes on whatever endpoint is current */
    uint32_t src2[] = {4}, dst2[] = {13};
    int st2;
    ck_assert_int_eq(push_note(a_b, src2, dst2, 1, 5, TD_KVX_F_CSUM, &st2), 0);
    /* a reads b's HELLO (the new epoch) on a fresh endpoint and retires its own */
    end = td_now_s() + 30;
    do {
        uv_run(&loop, UV_RUN_NOWAIT);
        td_kvx_stats(a, &sa);
    } while (sa.eps_retired == 0 && td_now_s() < end);
    ck_assert_uint_eq(sa.eps_retired, 1);
    run_until(&st2, 30);
    ck_assert_int_eq(st2, 0);
    ck_assert(rec_b->data_ok);
    ck_assert_int_eq(f.status, 1); /* the fetch still waits for b's answer */

    /* b answers the fetch begun before the renewal */
    answer_later(&f, 2);
    ck_assert(holds(a, 30, 7, 6));
    ck_assert(holds(a, 31, 8, 6));

    /* the new blob is already known, an old one is older: neither retires anything */
    td_kvx_peer_t *p;
    ck_assert_int_eq(td_kvx_connect(a, b1, len1, &p), 0);
    ck_assert_ptr_eq(p, a_b);
    ck_assert_int_eq(td_kvx_connect(a, old_blob, len0, &p), 0);
    ck_assert_ptr_eq(p, a_b);
    td_kvx_stats(a, &sa);
    ck_assert_uint_eq(sa.eps_retired, 1);
    ck_assert_int_eq(push_note(a_b, src, dst, 3, 5, TD_KVX_F_CSUM, &st), 0);
    run_until(&st, 30);
    ck_assert_int_eq(st, 0);

    /* the retired endpoints close once nothing of theirs is open (after their 1 s grace) */
    end = td_now_s() + 10;
    do {
        uv_run(&loop, UV_RUN_NOWAIT);
        td_kvx_stats(a, &sa);
        td_kvx_stats(b, &sb);
    } while ((sa.retired_open || sb.retired_open) && td_now_s() < end);
    ck_assert_uint_eq(sa.retired_open, 0);
    ck_assert_uint_eq(sb.retired_open, 0);
    ck_assert_uint_eq(sa.peer_failures, 0);
    ck_assert_uint_eq(sb.peer_failures, 0);
    free(old_blob);
}

START_TEST(test_renew)
{
    renew_scenario(ka, kb, a_to_b, &rb);
}
END_TEST

START_TEST(test_renew_tcp)
{
    /* the transport of separate hosts, where an endpoint that saw a cut is the problem */
    rec_t r1 = {0};
    td_kvx_t *a, *b;
    td_kvx_peer_t *a_b;
    tcp_pair(&r1, &a, &b, &a_b);
    renew_scenario(a, b, a_b, &rb);
    td_kvx_close(a, NULL, NULL);
    td_kvx_close(b, NULL, NULL);
}
END_TEST

START_TEST(test_fetch_parse)
{
    enum { N = 3 };
    uint8_t keys[N * TD_KVX_KEY_BYTES];
    uint32_t dst[N] = {4, 0, 63}, out_dst[NB];
    for (size_t i = 0; i < sizeof(keys); i++)
        keys[i] = (uint8_t)(i * 5);
    uint8_t msg[512];
    size_t len = td_kvx_fetch_size(N);
    ck_assert_uint_eq(len, 16 + N * 20);
    td_kvx_fetch_encode(msg, keys, dst, N, TD_KVX_F_CSUM | TD_KVX_F_TEST_BAD_CSUM);
    td_kvx_fetch_req_t r;
    ck_assert_int_eq(td_kvx_fetch_parse(msg, len, NB, NB, out_dst, &r), 0);
    ck_assert_uint_eq(r.n, N);
    ck_assert_uint_eq(r.flags, TD_KVX_F_CSUM); /* test flags never travel */
    ck_assert_int_eq(memcmp(r.keys, keys, sizeof(keys)), 0);
    ck_assert_int_eq(memcmp(r.dst, dst, sizeof(dst)), 0);
    /* at an odd address too */
    uint8_t odd[513];
    memcpy(odd + 1, msg, len);
    ck_assert_int_eq(td_kvx_fetch_parse(odd + 1, len, NB, NB, out_dst, &r), 0);

    struct {
        size_t off;      /* byte to change, or SIZE_MAX for none */
        uint8_t val;
        long dlen;       /* length change */
        uint32_t max_n, limit;
        const char *msg; /* in td_err_msg */
    } bad[] = {
        {SIZE_MAX, 0, -(long)len, NB, NB, "shorter"},
        {SIZE_MAX, 0, -1, NB, NB, "bytes"},
        {SIZE_MAX, 0, 1, NB, NB, "bytes"},
        {SIZE_MAX, 0, -15, NB, NB, "bytes"},
        {0, 0, 0, NB, NB, "n 0"},        /* n = 0 */
        {0, 4, 0, NB, NB, "bytes"},      /* n = 4: length disagrees */
        {3, 0x80, 0, NB, NB, "outside"}, /* huge n */
        {SIZE_MAX, 0, 0, 2, NB, "outside"}, /* n over the pool */
        {4, 8, 0, NB, NB, "key_bytes"},
        {8, 3, 0, NB, NB, "flags"},
        {12, 1, 0, NB, NB, "reserved"},
        {SIZE_MAX, 0, 0, NB, 63, "dst block 63"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t m[512];
        memcpy(m, msg, len);
        if (bad[i].off != SIZE_MAX)
            m[bad[i].off] = bad[i].val;
        size_t l = (size_t)((long)len + bad[i].dlen);
        ck_assert_msg(td_kvx_fetch_parse(m, l, bad[i].max_n, bad[i].limit, out_dst, &r) ==
                          TD_EPROTO,
                      "case %zu accepted", i);
        ck_assert_msg(strstr(td_err_msg(), bad[i].msg), "case %zu: %s", i, td_err_msg());
    }
    ck_assert_int_eq(td_kvx_fetch_parse(NULL, 0, NB, NB, out_dst, &r), TD_EPROTO);
}
END_TEST

static Suite *kvx_suite(void)
{
    Suite *s = suite_create("kvx");
    TCase *tc = tcase_create("pure");
    tcase_add_test(tc, test_coalesce_known);
    tcase_add_test(tc, test_coalesce_random);
    tcase_add_test(tc, test_bad_layout);
    tcase_add_test(tc, test_fetch_parse);
    suite_add_tcase(s, tc);
    tc = tcase_create("loopback");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_push_pull);
    tcase_add_test(tc, test_checksum_mismatch);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_close_cancels);
    tcase_add_test(tc, test_fetch);
    tcase_add_test(tc, test_fetch_no_server);
    tcase_add_test(tc, test_fetch_holder_closes);
    tcase_add_test(tc, test_renew);
    tcase_add_test(tc, test_renew_tcp);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(kvx_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

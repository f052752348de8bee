/* test_fetch.c: cross-worker fetch (common/worker/fetch.c) between worker cores in one process:
 * real pools over real data planes (UCX) on one loop, real sequences, a real disk tier. A holder
 * publishes a prompt's blocks; a requester given a fetch hint takes them instead of computing
 * them, or computes what did not arrive: a holder that holds only part of them, none of them,
 * only on disk, or never answers (the deadline; the late blocks stay the data plane's). */
#include "td_check.h"
#include "td_error.h"
#include "td_worker.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* UCX 1.13.1 leaks ~100 bytes inside uct_mm_iface_t_new (see test_kvx.c). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:uct_mm_iface_t_new\nleak:libuct.so.0\n";
}

#define BLOCK 4
#define NBLK 16
#define NTOK (5 * BLOCK + 1) /* 5 full blocks may come from a cache, the last token is computed */

static uv_loop_t loop;
static td_model_t model;
static td_worker_t H, R, X; /* holder, requester, a holder that never answers */
static int failures;

static void record_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg)
{
    (void)w;
    (void)s;
    (void)code;
    (void)msg;
    failures++;
}

static const td_worker_role_t test_role = {.name = "test", .report_failure = record_failure};

static void never_answer(td_kvx_t *k, const td_kvx_fetch_req_t *req, void *arg)
{
    (void)k;
    (void)req;
    (void)arg;
}

static void worker(td_worker_t *w, const char *id, td_kvx_fetch_serve_cb serve)
{
    memset(w, 0, sizeof(*w));
    w->role = &test_role;
    w->model = &model;
    w->mc = &model.cfg;
    w->loop = &loop;
    w->stopped = true; /* td_wk_schedule builds no steps: nothing computes here */
    w->cfg.id = (char *)id;
    w->cfg.model = (char *)"test-model";
    w->cfg.max_running = 64;
    w->cfg.max_batch_tokens = 64;
    w->cfg.prefill_chunk = 64;
    w->cfg.prefix_cache = true;
    w->cfg.fetch_timeout_s = 5;
    w->cfg.disk_load = (char *)"auto";
    td_kv_layout_t l = {
        .dtype = TD_DTYPE_F32, .block_size = BLOCK, .n_layers = 1, .token_floats = 16};
    l.layer_bytes = BLOCK * 16 * sizeof(float);
    l.block_bytes = l.layer_bytes;
    memcpy(l.fingerprint, "fetch-test-fp-16", 16);
    w->layout = l;
    td_kvx_layout_t xl = {.block_bytes = l.block_bytes, .n_blocks = NBLK};
    memcpy(xl.fingerprint, l.fingerprint, 16);
    td_kvx_opts_t xo = {.on_fetch = serve, .arg = w};
    w->kvx = td_kvx_new(&loop, &xl, &xo);
    ck_assert_ptr_nonnull(w->kvx);
    ck_assert_int_eq(td_kv_pool_init_mem(&w->pool, &l, NBLK, td_kvx_pool(w->kvx)), 0);
    ck_assert_int_eq(td_wk_metrics_init(w), 0);
}

static void worker_free(td_worker_t *w)
{
    while (w->head) {
        w->head->state = TD_WK_RUN;
        w->head->loads_out = 0;
        td_wk_seq_maybe_free(w, w->head);
    }
    if (w->disk)
        td_wk_disk_close(w, NULL, NULL);
    td_kvx_close(w->kvx, NULL, NULL);
}

static void setup(void)
{
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    memset(&model, 0, sizeof(model));
    model.cfg.vocab_size = 100;
    model.cfg.max_ctx = 4096;
    model.cfg.eos_id = -1;
    failures = 0;
    worker(&H, "h", td_wk_fetch_serve);
    worker(&R, "r", td_wk_fetch_serve);
    worker(&X, "x", never_answer);
}

static void teardown(void)
{
    worker_free(&R); /* first: its fetch from X still waits and is canceled here */
    worker_free(&H);
    worker_free(&X);
    uv_run(&loop, UV_RUN_DEFAULT);
    td_kv_pool_free(&R.pool);
    td_kv_pool_free(&H.pool);
    td_kv_pool_free(&X.pool);
    td_wk_metrics_free(&R);
    td_wk_metrics_free(&H);
    td_wk_metrics_free(&X);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static void tokens(int32_t *t, int salt)
{
    for (int i = 0; i < NTOK; i++)
        t[i] = (i * 7 + salt) % 100;
}

/* The byte pattern block i of prompt `salt` holds. */
static uint8_t pattern(int salt, int block, size_t off)
{
    return (uint8_t)(salt * 13 + block * 31 + off);
}

static td_wk_seq_t *seq(td_worker_t *w, int salt)
{
    int32_t t[NTOK];
    tokens(t, salt);
    int code;
    td_wk_seq_t *s = td_wk_seq_new(w, NULL, (uint64_t)salt, t, NTOK, NULL, NULL, &code);
    ck_assert_ptr_nonnull(s);
    s->state = TD_WK_PREFILL;
    return s;
}

/* The holder computes (writes the pattern of) the first `n` blocks of prompt `salt` and
 * publishes them, then the sequence ends: they stay in its prefix cache. */
static void hold(td_worker_t *w, int salt, int n)
{
    td_wk_seq_t *s = seq(w, salt);
    ck_assert_int_eq(td_kv_seq_reserve(&w->pool, &s->kv, n * BLOCK), 0);
    for (int b = 0; b < n; b++) {
        uint8_t *d = td_kv_block_data(&w->pool, s->kv.blocks[b]);
        for (size_t i = 0; i < w->layout.block_bytes; i++)
            d[i] = pattern(salt, b, i);
    }
    s->kv.n_tokens = s->stored = n * BLOCK;
    td_wk_cache_publish(w, s);
    td_wk_seq_kill(w, s);
}

static void run_while_loading(td_wk_seq_t *s, double limit_s)
{
    double end = td_now_s() + limit_s;
    while (s->state == TD_WK_LOADING && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_ne(s->state, TD_WK_LOADING);
}

/* The requester admits prompt `salt` with a hint naming `holder` for `blocks` blocks. */
static td_wk_seq_t *fetch(td_worker_t *holder, int salt, uint32_t blocks)
{
    td_wk_seq_t *s = seq(&R, salt);
    td_wk_cache_admit(&R, s, s->n_prompt - 1);
    size_t len;
    const void *blob = td_kvx_blob(holder->kvx, &len);
    Tandem__FetchHint h = TANDEM__FETCH_HINT__INIT;
    h.holder = (char *)holder->cfg.id;
    h.holder_blob.data = (uint8_t *)blob;
    h.holder_blob.len = len;
    h.blocks = blocks;
    td_wk_fetch_start(&R, s, &h);
    return s;
}

static void check_blocks(td_wk_seq_t *s, int salt, int n)
{
    for (int b = 0; b < n; b++) {
        const uint8_t *d = td_kv_block_data(&R.pool, s->kv.blocks[b]);
        for (size_t i = 0; i < R.layout.block_bytes; i++)
            ck_assert_msg(d[i] == pattern(salt, b, i), "block %d byte %zu", b, i);
    }
}

static double fail_count(const char *reason)
{
    for (int i = 0; i < 6; i++)
        if (strcmp(td_wk_fetch_reasons[i], reason) == 0)
            return td_metric_value(R.m.fetch_fail[i]);
    ck_abort_msg("no reason %s", reason);
    return 0;
}

START_TEST(test_fetch_all)
{
    hold(&H, 1, 5);
    td_wk_seq_t *s = fetch(&H, 1, 5);
    ck_assert_int_eq(s->state, TD_WK_LOADING);
    run_while_loading(s, 30);
    ck_assert_int_eq(s->state, TD_WK_PREFILL);
    ck_assert_int_eq(s->stored, 5 * BLOCK);
    ck_assert_int_eq(s->cached_tokens, 5 * BLOCK);
    check_blocks(s, 1, 5);
    ck_assert(td_metric_value(R.m.fetch_blocks) == 5);
    ck_assert(td_metric_value(R.m.fetch_bytes) == 5.0 * R.layout.block_bytes);
    ck_assert(td_metric_value(R.m.fetch_bw) > 0);
    ck_assert(R.fetch_bytes_per_s > 0);
    /* the fetched blocks are now the requester's cache too */
    ck_assert_int_eq(s->n_published, 5);
    ck_assert_int_ge(td_kv_cache_find(&R.pool, &s->hashes[4]), 0);
    double end = td_now_s() + 10;
    while (td_metric_value(H.m.fetch_served) < 5 && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert(td_metric_value(H.m.fetch_served) == 5);
    ck_assert_int_eq(H.pool.n_free, NBLK); /* unpinned: cached, evictable */

    /* the same prompt again: the requester's own cache covers the hint, nothing is fetched */
    td_wk_seq_t *again = fetch(&H, 1, 5);
    ck_assert_int_eq(again->state, TD_WK_PREFILL);
    ck_assert_int_eq(again->stored, 5 * BLOCK);
    ck_assert(td_metric_value(R.m.fetch_blocks) == 5);
    ck_assert_int_eq(failures, 0);
}
END_TEST

START_TEST(test_fetch_partial_and_missing)
{
    hold(&H, 2, 2); /* the holder has only the first two blocks (the rest was evicted) */
    td_wk_seq_t *s = fetch(&H, 2, 5);
    run_while_loading(s, 30);
    ck_assert_int_eq(s->stored, 2 * BLOCK);
    ck_assert_int_eq(s->kv.n_blocks, 2); /* the others went back to the pool */
    check_blocks(s, 2, 2);
    ck_assert(td_metric_value(R.m.fetch_blocks) == 2);

    td_wk_seq_t *m = fetch(&H, 3, 5); /* none of them */
    run_while_loading(m, 30);
    ck_assert_int_eq(m->state, TD_WK_PREFILL);
    ck_assert_int_eq(m->stored, 0);
    ck_assert_int_eq(m->kv.n_blocks, 0);
    ck_assert(fail_count("missing") == 1);
    ck_assert_int_eq(failures, 0);
}
END_TEST

static void disk_closed(void *arg)
{
    *(int *)arg = 1;
}

START_TEST(test_fetch_from_disk)
{
    char dir[] = "/tmp/td-fetch-test-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    H.cfg.disk_dir = dir;
    H.cfg.disk_max = 1 << 20;
    ck_assert_int_eq(td_wk_disk_open(&H), 0);
    ck_assert_ptr_nonnull(H.disk);
    hold(&H, 4, 5); /* written through to disk */
    double end = td_now_s() + 10;
    td_kvdisk_stats_t st = {0};
    while (st.files < 5 && td_now_s() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        td_kvdisk_stats(H.disk, &st);
    }
    ck_assert_uint_eq(st.files, 5);
    /* the pool forgets them: every block taken for new content, then freed */
    int32_t ids[NBLK];
    for (int i = 0; i < NBLK; i++)
        ck_assert_int_eq(td_kv_block_alloc(&H.pool, &ids[i]), 0);
    for (int i = 0; i < NBLK; i++)
        td_kv_block_unref(&H.pool, ids[i]);
    ck_assert_int_eq(H.pool.n_cached, 0);
    td_wk_seq_t *s = fetch(&H, 4, 5);
    run_while_loading(s, 30);
    ck_assert_int_eq(s->stored, 5 * BLOCK);
    check_blocks(s, 4, 5);
    ck_assert_int_eq(H.pool.n_cached, 5); /* read back into the holder's pool as well */
    int closed = 0;
    td_wk_disk_close(&H, disk_closed, &closed);
    end = td_now_s() + 10;
    while (!closed && td_now_s() < end)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(closed, 1);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_fetch_deadline)
{
    R.cfg.fetch_timeout_s = 0.2;
    hold(&X, 5, 5);
    int free0 = R.pool.n_free;
    td_wk_seq_t *s = fetch(&X, 5, 5);
    ck_assert_int_eq(s->state, TD_WK_LOADING);
    run_while_loading(s, 30);
    ck_assert_int_eq(s->stored, 0);
    ck_assert(fail_count("timeout") == 1);
    /* the given-up fetch's blocks are still the data plane's: not free, not the sequence's */
    ck_assert_int_eq(s->kv.n_blocks, 0);
    ck_assert_int_eq(R.pool.n_free, free0 - 5);
    /* a holder that cannot be reached at all */
    Tandem__FetchHint h = TANDEM__FETCH_HINT__INIT;
    h.holder = (char *)"nowhere";
    h.holder_blob.data = (uint8_t *)"garbage";
    h.holder_blob.len = 7;
    h.blocks = 5;
    td_wk_seq_t *g = seq(&R, 6);
    td_wk_cache_admit(&R, g, g->n_prompt - 1);
    td_wk_fetch_start(&R, g, &h);
    ck_assert_int_eq(g->state, TD_WK_PREFILL);
    ck_assert(fail_count("refused") == 1);
    /* teardown closes R's data plane: the late callback frees the blocks (LSan checks) */
}
END_TEST

static Suite *fetch_suite(void)
{
    Suite *s = suite_create("fetch");
    TCase *tc = tcase_create("loopback");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fetch_all);
    tcase_add_test(tc, test_fetch_partial_and_missing);
    tcase_add_test(tc, test_fetch_from_disk);
    tcase_add_test(tc, test_fetch_deadline);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(fetch_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

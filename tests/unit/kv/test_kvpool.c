/* test_kvpool.c: the KV pool's prefix cache (tier 0, common/kv/kv.c): published blocks outlive
 * their sequence, are found by hash and shared by reference, are evicted least recently used
 * only when an allocation needs room, and always from the end of a prefix; a listener hears of
 * every publish and eviction (what the cluster KV index announces). */
#include "td_check.h"
#include "td_error.h"
#include "td_kv.h"

#include <check.h>
#include <string.h>

static td_kv_pool_t pool;

static void setup_pool(int n)
{
    td_kv_layout_t l = {.dtype = TD_DTYPE_F32, .block_size = 4, .n_layers = 1, .token_floats = 4};
    l.layer_bytes = l.block_bytes = 4 * 4 * sizeof(float);
    ck_assert_int_eq(td_kv_pool_init(&pool, &l, n), 0);
}

static td_kvhash_t H(int i)
{
    td_kvhash_t h;
    memset(&h, 0, sizeof(h));
    h.b[0] = (uint8_t)i;
    h.b[9] = 0x5a;
    return h;
}

/* A sequence of n full blocks whose blocks are published as H(base), H(base + 1), ... */
static void publish_seq(td_kv_seq_t *s, int base, int n)
{
    td_kv_seq_init(s);
    ck_assert_int_eq(td_kv_seq_reserve(&pool, s, 4 * n), 0);
    for (int i = 0; i < n; i++) {
        td_kvhash_t h = H(base + i);
        ck_assert(td_kv_block_publish(&pool, s->blocks[i], &h));
    }
    s->n_tokens = 4 * n;
}

START_TEST(test_cached_after_release_and_shared)
{
    setup_pool(8);
    td_kv_seq_t a, b;
    publish_seq(&a, 0, 3);
    int32_t first = a.blocks[0];
    td_kv_seq_release(&pool, &a);
    ck_assert_int_eq(pool.n_free, 8); /* cached blocks can still be allocated */
    ck_assert_int_eq(pool.n_cached, 3);
    ck_assert_int_eq(pool.n_evictable, 3);
    td_kvhash_t h[4] = {H(0), H(1), H(2), H(7)};
    td_kv_seq_init(&b);
    ck_assert_int_eq(td_kv_seq_attach_cached(&pool, &b, h, 4), 3); /* stops at the first miss */
    ck_assert_int_eq(b.n_tokens, 12);
    ck_assert_int_eq(b.blocks[0], first);
    ck_assert_int_eq(pool.n_evictable, 0);
    ck_assert_int_eq(pool.n_free, 5);
    /* a second sequence shares the same blocks */
    td_kv_seq_t c;
    td_kv_seq_init(&c);
    ck_assert_int_eq(td_kv_seq_attach_cached(&pool, &c, h, 2), 2);
    ck_assert_int_eq(c.blocks[1], b.blocks[1]);
    ck_assert_int_eq(pool.refs[c.blocks[1]], 2);
    td_kv_seq_release(&pool, &c);
    td_kv_seq_release(&pool, &b);
    ck_assert_int_eq(pool.n_evictable, 3);
    td_kv_pool_free(&pool);
}
END_TEST

START_TEST(test_duplicate_content_not_published_twice)
{
    setup_pool(4);
    td_kv_seq_t a, b;
    publish_seq(&a, 0, 1);
    td_kv_seq_init(&b);
    ck_assert_int_eq(td_kv_seq_reserve(&pool, &b, 4), 0);
    td_kvhash_t h = H(0);
    ck_assert(!td_kv_block_publish(&pool, b.blocks[0], &h)); /* a holds it already */
    td_kv_seq_release(&pool, &b);
    ck_assert_int_eq(pool.n_cached, 1);
    ck_assert_int_eq(pool.n_stack, 3); /* b's block went back as a plain free block */
    td_kv_seq_release(&pool, &a);
    td_kv_pool_free(&pool);
}
END_TEST

START_TEST(test_lru_evicts_only_when_needed_and_from_the_end)
{
    setup_pool(4);
    td_kv_seq_t a, b, c;
    publish_seq(&a, 0, 2); /* prefix X: H0, H1 */
    publish_seq(&b, 10, 2); /* prefix Y: H10, H11 */
    td_kv_seq_release(&pool, &a);
    td_kv_seq_release(&pool, &b);
    ck_assert_int_eq(pool.n_cached, 4);
    ck_assert_int_eq(pool.evictions, 0);
    /* use X again: it becomes the most recently used */
    td_kvhash_t x[2] = {H(0), H(1)}, y[2] = {H(10), H(11)};
    td_kv_seq_init(&a);
    ck_assert_int_eq(td_kv_seq_attach_cached(&pool, &a, x, 2), 2);
    td_kv_seq_release(&pool, &a);
    /* one new block: Y's last block goes first (the end of the least recently used prefix) */
    td_kv_seq_init(&c);
    ck_assert_int_eq(td_kv_seq_reserve(&pool, &c, 4), 0);
    ck_assert_int_eq(pool.evictions, 1);
    ck_assert_int_ge(td_kv_cache_find(&pool, &y[0]), 0);
    ck_assert_int_lt(td_kv_cache_find(&pool, &y[1]), 0);
    ck_assert_int_ge(td_kv_cache_find(&pool, &x[1]), 0);
    td_kv_seq_init(&b);
    ck_assert_int_eq(td_kv_seq_attach_cached(&pool, &b, y, 2), 1);
    td_kv_seq_release(&pool, &b);
    td_kv_seq_release(&pool, &c);
    /* everything referenced: allocation fails rather than stealing a referenced block */
    td_kv_seq_t all;
    td_kv_seq_init(&all);
    ck_assert_int_eq(td_kv_seq_reserve(&pool, &all, 16), 0);
    ck_assert_int_eq(pool.n_cached, 0);
    int32_t id;
    ck_assert_int_eq(td_kv_block_alloc(&pool, &id), TD_ENOSPC);
    td_kv_seq_release(&pool, &all);
    td_kv_pool_free(&pool);
}
END_TEST

typedef struct heard {
    int added, evicted;
    td_kvhash_t last;
} heard_t;

static void listen_cache(void *ud, int32_t id, const td_kvhash_t *h, bool added)
{
    heard_t *x = ud;
    (void)id;
    if (added)
        x->added++;
    else
        x->evicted++;
    x->last = *h;
}

START_TEST(test_listener_hears_publish_and_evict)
{
    setup_pool(2);
    heard_t x = {0};
    pool.on_cache = listen_cache;
    pool.on_cache_ud = &x;
    td_kv_seq_t a, b;
    publish_seq(&a, 0, 2);
    ck_assert_int_eq(x.added, 2);
    td_kv_seq_release(&pool, &a); /* cached, not evicted: nothing to say */
    ck_assert_int_eq(x.evicted, 0);
    /* an allocation that reuses a cached block says which one left the cache */
    td_kv_seq_init(&b);
    ck_assert_int_eq(td_kv_seq_reserve(&pool, &b, 4), 0);
    ck_assert_int_eq(x.evicted, 1);
    ck_assert_int_lt(td_kv_cache_find(&pool, &x.last), 0);
    /* the end of the prefix went (H1); a publish of content still cached (H0) says nothing */
    td_kvhash_t h0 = H(0), h1 = H(1), h5 = H(5);
    ck_assert_mem_eq(x.last.b, h1.b, 16);
    ck_assert(!td_kv_block_publish(&pool, b.blocks[0], &h0));
    ck_assert_int_eq(x.added, 2);
    ck_assert(td_kv_block_publish(&pool, b.blocks[0], &h5));
    ck_assert_int_eq(x.added, 3);
    td_kv_seq_release(&pool, &b);
    td_kv_pool_free(&pool);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("kvpool");
    TCase *tc = tcase_create("kvpool");
    tcase_add_test(tc, test_cached_after_release_and_shared);
    tcase_add_test(tc, test_duplicate_content_not_published_twice);
    tcase_add_test(tc, test_lru_evicts_only_when_needed_and_from_the_end);
    tcase_add_test(tc, test_listener_hears_publish_and_evict);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}

/* test_kvindex.c: the router's KV index mirror against a brute-force model under random
 * add/remove/remove_worker operations, and prefix queries. */
#include "kvindex.h"
#include "td_check.h"

#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { NB = 3000, NW = 12 };

static td_kvhash_t H(int b)
{
    td_kvhash_t h;
    uint8_t fp[16] = {0};
    int32_t tok[4] = {b, b * 3, b * 5, b * 7};
    td_kvhash_t root;
    ck_assert_int_eq(td_kvhash_root(fp, NULL, 0, &root), 0);
    td_kvhash_blocks(tok, 4, 4, &root, &h, 1);
    return h;
}

START_TEST(test_random_against_model)
{
    static int8_t model[NB][NW]; /* tier, or -1 */
    memset(model, -1, sizeof(model));
    static td_kvhash_t hs[NB];
    for (int b = 0; b < NB; b++)
        hs[b] = H(b);
    td_kvindex_t *ix = td_kvindex_new();
    unsigned seed = 12345;
    for (int step = 0; step < 60000; step++) {
        int b = rand_r(&seed) % NB, w = rand_r(&seed) % NW, op = rand_r(&seed) % 100;
        if (op < 60) {
            int tier = rand_r(&seed) % 3;
            ck_assert_int_eq(td_kvindex_add(ix, &hs[b], (uint32_t)w, (uint8_t)tier), 0);
            model[b][w] = (int8_t)tier;
        } else if (op < 99) {
            td_kvindex_remove(ix, &hs[b], (uint32_t)w);
            model[b][w] = -1;
        } else {
            td_kvindex_remove_worker(ix, (uint32_t)w);
            for (int k = 0; k < NB; k++)
                model[k][w] = -1;
        }
        if (step % 5000 == 0 || step == 59999) {
            size_t blocks = 0;
            for (int k = 0; k < NB; k++) {
                bool any = false;
                for (int v = 0; v < NW; v++) {
                    ck_assert_int_eq(td_kvindex_tier(ix, &hs[k], (uint32_t)v), model[k][v]);
                    any |= model[k][v] >= 0;
                }
                blocks += any;
            }
            ck_assert_uint_eq(td_kvindex_blocks(ix), blocks);
        }
    }
    td_kvindex_free(ix);
}
END_TEST

START_TEST(test_prefix)
{
    td_kvhash_t hs[6];
    for (int i = 0; i < 6; i++)
        hs[i] = H(1000 + i);
    td_kvindex_t *ix = td_kvindex_new();
    for (int i = 0; i < 6; i++)
        td_kvindex_add(ix, &hs[i], 1, i < 4 ? TD_TIER_POOL : TD_TIER_DISK);
    td_kvindex_add(ix, &hs[0], 2, TD_TIER_POOL);
    td_kvindex_add(ix, &hs[2], 2, TD_TIER_POOL); /* a hole at block 1 */
    ck_assert_uint_eq(td_kvindex_prefix(ix, hs, 6, 1, TD_TIER_DISK), 6);
    ck_assert_uint_eq(td_kvindex_prefix(ix, hs, 6, 1, TD_TIER_POOL), 4);
    ck_assert_uint_eq(td_kvindex_prefix(ix, hs, 6, 2, TD_TIER_DISK), 1);
    ck_assert_uint_eq(td_kvindex_prefix(ix, hs, 6, 3, TD_TIER_DISK), 0);
    td_kvindex_remove(ix, &hs[2], 1);
    ck_assert_uint_eq(td_kvindex_prefix(ix, hs, 6, 1, TD_TIER_DISK), 2);
    td_kvindex_free(ix);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvindex");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_random_against_model);
    tcase_add_test(tc, test_prefix);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

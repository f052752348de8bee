/* test_sim.c: the SIMULATED engine kind (common/engine/sim.c) behind td_engine_step: positions
 * advance as in a real step, sampled tokens are a deterministic function of seed and position
 * that never is EOS, the sampler's state follows (max_tokens finishes), and a step takes at least
 * the latency model's time. */
#include "td_check.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_util.h"

#include <check.h>
#include <string.h>

static td_model_t model;
static td_kv_pool_t pool;

static td_engine_t *sim(double step_us, double prefill_us)
{
    memset(&model, 0, sizeof(model));
    model.cfg.vocab_size = 7;
    model.cfg.eos_id = 3;
    model.cfg.max_ctx = 1000;
    td_kv_layout_t l = {.dtype = TD_DTYPE_F32, .block_size = 4, .n_layers = 1, .token_floats = 16};
    l.layer_bytes = l.block_bytes = 4 * 16 * sizeof(float);
    ck_assert_int_eq(td_kv_pool_init(&pool, &l, 64), 0);
    td_sim_opts_t o = {.step_us = step_us, .prefill_us_per_token = prefill_us};
    td_engine_t *e;
    ck_assert_int_eq(td_engine_create_sim(&model, &o, &e), 0);
    ck_assert(td_engine_is_sim(e));
    return e;
}

/* Run a prompt of n tokens then `steps` decodes with seed; write the sampled tokens. */
static void run(td_engine_t *e, uint64_t seed, int n, int steps, int32_t *out, td_finish_t *fin)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.seed = seed;
    p.eos_id = model.cfg.eos_id;
    p.max_tokens = steps + 1;
    td_sampler_t smp;
    ck_assert_int_eq(td_sampler_init(&smp, &p, model.cfg.vocab_size), 0);
    td_kv_seq_t kv;
    td_kv_seq_init(&kv);
    int32_t toks[64] = {0};
    float logits[7];
    td_sample_t o;
    td_batch_seq_t b = {.kv = &kv, .tokens = toks, .n_tokens = n, .logits = logits, .smp = &smp,
                        .out = &o};
    for (int k = 0; k <= steps; k++) {
        ck_assert_int_eq(td_engine_step(e, &pool, &b, 1), 0);
        ck_assert_int_eq(kv.n_tokens, n + k);
        out[k] = o.token;
        *fin = o.finish;
        toks[kv.n_tokens] = o.token;
        b.tokens = toks + kv.n_tokens;
        b.n_tokens = 1;
        b.decode = true;
    }
    td_kv_seq_release(&pool, &kv);
    td_sampler_free(&smp);
}

START_TEST(test_deterministic_never_eos)
{
    td_engine_t *e = sim(0, 0);
    int32_t a[21], b[21], c[21];
    td_finish_t fa, fb, fc;
    run(e, 42, 5, 20, a, &fa);
    run(e, 42, 5, 20, b, &fb);
    run(e, 43, 5, 20, c, &fc);
    ck_assert_mem_eq(a, b, sizeof(a));
    ck_assert(memcmp(a, c, sizeof(a)) != 0); /* the seed matters */
    for (int i = 0; i < 21; i++)
        ck_assert(a[i] >= 0 && a[i] < 7 && a[i] != 3);
    ck_assert_int_eq(fa, TD_FINISH_LENGTH); /* the sampler counted every token: max_tokens */
    td_engine_free(e);
    td_kv_pool_free(&pool);
}
END_TEST

START_TEST(test_step_takes_model_time)
{
    td_engine_t *e = sim(20000, 1000); /* 20 ms + 1 ms per prompt token */
    td_kv_seq_t kv;
    td_kv_seq_init(&kv);
    int32_t toks[10] = {0};
    td_batch_seq_t b = {.kv = &kv, .tokens = toks, .n_tokens = 10};
    double t0 = td_now_s();
    ck_assert_int_eq(td_engine_step(e, &pool, &b, 1), 0);
    ck_assert(td_now_s() - t0 >= 0.030); /* nanosleep never returns early */
    ck_assert_int_eq(kv.n_tokens, 10);
    ck_assert_int_eq(kv.n_blocks, 3); /* its blocks were reserved */
    td_kv_seq_release(&pool, &kv);
    td_engine_free(e);
    td_kv_pool_free(&pool);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("sim");
    TCase *tc = tcase_create("sim");
    tcase_add_test(tc, test_deterministic_never_eos);
    tcase_add_test(tc, test_step_takes_model_time);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}

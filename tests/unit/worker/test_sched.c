/* test_sched.c: the worker's scheduler (common/worker/sched.c) on a real KV pool with real
 * sequences: the token budget, prefill chunking, and which sequence a full pool preempts. The
 * steps themselves are not run: each test applies a step's effect on the cache by hand (every
 * scheduled sequence stores its tokens), as the engine would. Also where the sequence table's
 * resume of a migrated sequence puts it (td_wk_seq_resume). */
#include "td_check.h"
#include "td_error.h"
#include "td_worker.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4

static td_model_t model;
static td_worker_t W;
static int failures, last_fail_code;

static void record_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg)
{
    (void)w;
    (void)s;
    (void)msg;
    failures++;
    last_fail_code = code;
}

static const td_worker_role_t test_role = {.name = "test", .report_failure = record_failure};

/* A worker with a pool of n_blocks blocks of BLOCK tokens and the given budgets. */
static td_worker_t *worker(int n_blocks, int max_batch_tokens, int prefill_chunk)
{
    memset(&W, 0, sizeof(W));
    memset(&model, 0, sizeof(model));
    model.cfg.vocab_size = 100;
    model.cfg.max_ctx = 4096;
    model.cfg.eos_id = -1;
    W.role = &test_role;
    W.model = &model;
    W.mc = &model.cfg;
    W.cfg.max_batch_tokens = max_batch_tokens;
    W.cfg.prefill_chunk = prefill_chunk;
    W.cfg.max_running = 64;
    W.cfg.id = "w";
    td_kv_layout_t l = {.dtype = TD_DTYPE_F32, .block_size = BLOCK, .n_layers = 1,
                        .token_floats = 16};
    l.layer_bytes = BLOCK * 16 * sizeof(float);
    l.block_bytes = l.layer_bytes;
    ck_assert_int_eq(td_kv_pool_init(&W.pool, &l, n_blocks), 0);
    failures = last_fail_code = 0;
    return &W;
}

static void worker_free(td_worker_t *w)
{
    while (w->head) {
        w->head->state = TD_WK_RUN;
        td_wk_seq_maybe_free(w, w->head);
    }
    td_kv_pool_free(&w->pool);
    free(w->items);
    free(w->logits);
}

static td_wk_seq_t *prompt(td_worker_t *w, int n)
{
    int32_t toks[512];
    ck_assert_int_le(n, 512);
    for (int i = 0; i < n; i++)
        toks[i] = i % 100;
    int code;
    td_wk_seq_t *s = td_wk_seq_new(w, NULL, (uint64_t)n, toks, (size_t)n, NULL, NULL, &code);
    ck_assert_ptr_nonnull(s);
    s->state = TD_WK_PREFILL;
    return s;
}

/* A running sequence whose first n tokens are stored; token n is the next step's input. */
static td_wk_seq_t *running(td_worker_t *w, int n)
{
    td_wk_seq_t *s = prompt(w, n + 1);
    ck_assert_int_eq(td_kv_seq_reserve(&w->pool, &s->kv, n), 0);
    s->kv.n_tokens = s->stored = n;
    s->state = TD_WK_RUN;
    return s;
}

/* What a step does to the cache: each scheduled sequence stores its tokens; a decode also gets
 * its next token, and a prompt whose last chunk ran starts running. */
static void apply_step(td_worker_t *w)
{
    for (int i = 0; i < w->n_items; i++) {
        td_wk_item_t *it = &w->items[i];
        td_wk_seq_t *s = it->s;
        s->kv.n_tokens += it->n;
        s->stored = s->kv.n_tokens;
        if (it->decode || it->sample)
            ck_assert_int_eq(td_wk_seq_push_token(s, 7), 0);
        if (it->sample)
            s->state = TD_WK_RUN;
        else if (s->recompute && s->stored == td_wk_prefill_target(s)) {
            s->recompute = false;
            s->state = TD_WK_RUN;
        }
    }
    w->n_items = 0;
}

START_TEST(test_token_budget)
{
    td_worker_t *w = worker(64, 50, 32);
    td_wk_seq_t *r[3];
    for (int i = 0; i < 3; i++)
        r[i] = running(w, 5);
    td_wk_seq_t *p1 = prompt(w, 100), *p2 = prompt(w, 100);
    ck_assert_int_eq(td_wk_sched_build(w), 5);
    for (int i = 0; i < 3; i++) {
        ck_assert_ptr_eq(w->items[i].s, r[i]);
        ck_assert_int_eq(w->items[i].n, 1);
        ck_assert(w->items[i].decode && w->items[i].sample);
    }
    ck_assert_ptr_eq(w->items[3].s, p1);
    ck_assert_int_eq(w->items[3].n, 32); /* engine.prefill_chunk */
    ck_assert_ptr_eq(w->items[4].s, p2);
    ck_assert_int_eq(w->items[4].n, 50 - 3 - 32); /* what is left of engine.max_batch_tokens */
    ck_assert(!w->items[3].sample && !w->items[4].sample);
    /* the blocks for exactly those tokens are reserved */
    ck_assert_int_eq(p2->kv.n_blocks, (15 + BLOCK - 1) / BLOCK);
    worker_free(w);
}
END_TEST

START_TEST(test_chunking)
{
    td_worker_t *w = worker(64, 1000, 16);
    td_wk_seq_t *p = prompt(w, 40);
    int want[] = {16, 16, 8};
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(td_wk_sched_build(w), 1);
        ck_assert_int_eq(w->items[0].n, want[k]);
        ck_assert_int_eq(w->items[0].sample, k == 2); /* logits only after the last chunk */
        ck_assert(!w->items[0].decode);
        apply_step(w);
    }
    ck_assert_int_eq(p->state, TD_WK_RUN);
    ck_assert_int_eq(td_wk_sched_build(w), 1);
    ck_assert(w->items[0].decode);
    worker_free(w);
}
END_TEST

/* A full pool: the oldest running sequence needing a block takes it from the newest. */
START_TEST(test_preempt_newest)
{
    td_worker_t *w = worker(6, 1000, 512);
    td_wk_seq_t *a = running(w, 8), *b = running(w, 8), *c = running(w, 8); /* 2 blocks each */
    ck_assert_int_eq(w->pool.n_free, 0);
    td_wk_seq_t *late = prompt(w, 4);
    ck_assert_int_eq(td_wk_sched_build(w), 2);
    ck_assert_ptr_eq(w->items[0].s, a);
    ck_assert_ptr_eq(w->items[1].s, b);
    ck_assert(c->recompute);
    ck_assert_int_eq(c->state, TD_WK_PREFILL);
    ck_assert_int_eq(c->kv.n_blocks, 0);
    ck_assert_int_eq(late->kv.n_blocks, 0); /* nothing admitted in a step that preempted */
    ck_assert(!a->recompute && !b->recompute);
    apply_step(w);
    /* next step: a and b run on in their blocks; c waits until there is room again */
    ck_assert_int_eq(td_wk_sched_build(w), 2);
    ck_assert_int_eq(w->pool.n_free, 0);
    ck_assert_int_eq(failures, 0);
    worker_free(w);
}
END_TEST

/* The newest running sequence that runs out preempts itself, not an older one. */
START_TEST(test_preempt_self_when_newest)
{
    td_worker_t *w = worker(5, 1000, 512);
    td_wk_seq_t *a = running(w, 6), *b = running(w, 6), *c = running(w, 4); /* 2 + 2 + 1 */
    ck_assert_int_eq(w->pool.n_free, 0);
    ck_assert_int_eq(td_wk_sched_build(w), 2);
    ck_assert_ptr_eq(w->items[0].s, a);
    ck_assert_ptr_eq(w->items[1].s, b);
    ck_assert(c->recompute && !a->recompute && !b->recompute);
    ck_assert_int_eq(w->pool.n_free, 1); /* c's block went back */
    apply_step(w);
    /* recompute: c's KV comes back as a prefill of everything but its pending token */
    ck_assert_int_eq(td_wk_sched_build(w), 3);
    ck_assert_ptr_eq(w->items[2].s, c);
    ck_assert_int_eq(w->items[2].n, td_wk_prefill_target(c));
    ck_assert(!w->items[2].sample);
    worker_free(w);
}
END_TEST

/* Two half-computed prompts that fill the pool between them: the older takes the newer's blocks
 * instead of both waiting forever. */
START_TEST(test_prefill_no_deadlock)
{
    td_worker_t *w = worker(4, 1000, 8);
    td_wk_seq_t *a = prompt(w, 12), *b = prompt(w, 12);
    ck_assert_int_eq(td_wk_sched_build(w), 2); /* 8 tokens each: the pool is full */
    apply_step(w);
    ck_assert_int_eq(w->pool.n_free, 0);
    ck_assert_int_eq(td_wk_sched_build(w), 1);
    ck_assert_ptr_eq(w->items[0].s, a);
    ck_assert_int_eq(w->items[0].n, 4);
    ck_assert(w->items[0].sample);
    ck_assert_int_eq(b->stored, 0); /* b starts over when there is room */
    ck_assert_int_eq(b->kv.n_blocks, 0);
    apply_step(w);
    ck_assert_int_eq(a->state, TD_WK_RUN);
    ck_assert_int_eq(failures, 0);
    worker_free(w);
}
END_TEST

START_TEST(test_prompt_never_fits)
{
    td_worker_t *w = worker(2, 1000, 16);
    prompt(w, 20); /* 5 blocks: more than the pool holds */
    ck_assert_int_eq(td_wk_sched_build(w), 0);
    ck_assert_int_eq(failures, 1);
    ck_assert_int_eq(last_fail_code, TD_ENOSPC);
    ck_assert_ptr_null(w->head); /* freed */
    ck_assert_int_eq(w->pool.n_free, 2);
    worker_free(w);
}
END_TEST

/* A task that resumes a migrated sequence (td_wk_seq_resume): its sampler starts at the position
 * after the generated tokens (seeded stream and max_tokens count), max_tokens stays the first
 * attempt's (the room after the request's own prompt, not after prompt + generated), usage counts
 * the generated tokens as completion tokens, and a resume with nothing left is refused. */
START_TEST(test_resume_position)
{
    td_worker_t *w = worker(64, 256, 64);
    model.cfg.max_ctx = 30;
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    sp.temperature = 0.8f;
    sp.top_p = 1;
    sp.seed = 77;
    sp.max_tokens = 0; /* the rest of the context */
    sp.logprobs = -1;
    int32_t toks[12];
    for (int i = 0; i < 12; i++)
        toks[i] = i;
    int code;
    /* prompt of 8 plus 4 generated: 30 - 8 = 22 tokens in all, 4 of them done */
    td_wk_seq_t *s = td_wk_seq_new(w, NULL, 1, toks, 12, &sp, NULL, &code);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(s->smp.p.max_tokens, 18); /* what seq_new alone would keep */
    ck_assert_int_eq(td_wk_seq_resume(w, s, 4, &sp), 0);
    ck_assert_int_eq(s->smp.p.max_tokens, 22);
    ck_assert_int_eq(s->smp.n_generated, 4);
    td_sampler_t ref;
    td_sampling_t p = s->smp.p;
    ck_assert_int_eq(td_sampler_init(&ref, &p, 100), 0);
    for (int i = 0; i < 4; i++)
        (void)td_rng_next(&ref.rng); /* four draws, as four sampled tokens took */
    ck_assert_uint_eq(td_rng_next(&ref.rng), td_rng_next(&s->smp.rng));
    td_sampler_free(&ref);
    ck_assert_int_eq(td_wk_seq_push_token(s, 9), 0);
    uint32_t pr, co, ca;
    s->cached_tokens = 11; /* cached blocks of prompt + generated: usage counts the prompt's */
    td_wk_seq_usage(s, &pr, &co, &ca);
    ck_assert_uint_eq(pr, 8);
    ck_assert_uint_eq(co, 5);
    ck_assert_uint_eq(ca, 8);
    /* an explicit max_tokens is kept; a resume past it, or of every token, is refused */
    sp.max_tokens = 6;
    td_wk_seq_t *t = td_wk_seq_new(w, NULL, 2, toks, 12, &sp, NULL, &code);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(td_wk_seq_resume(w, t, 4, &sp), 0);
    ck_assert_int_eq(t->smp.p.max_tokens, 6);
    td_wk_seq_t *u = td_wk_seq_new(w, NULL, 3, toks, 12, &sp, NULL, &code);
    ck_assert_int_eq(td_wk_seq_resume(w, u, 6, &sp), TD_EINVAL);
    ck_assert_int_eq(td_wk_seq_resume(w, u, 12, &sp), TD_EINVAL);
    ck_assert_int_eq(td_wk_seq_resume(w, u, 0, &sp), 0); /* not a resume */
    ck_assert_int_eq(u->n_resumed, 0);
    worker_free(w);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("sched");
    TCase *tc = tcase_create("sched");
    tcase_add_test(tc, test_token_budget);
    tcase_add_test(tc, test_chunking);
    tcase_add_test(tc, test_preempt_newest);
    tcase_add_test(tc, test_preempt_self_when_newest);
    tcase_add_test(tc, test_prefill_no_deadlock);
    tcase_add_test(tc, test_prompt_never_fits);
    tcase_add_test(tc, test_resume_position);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}

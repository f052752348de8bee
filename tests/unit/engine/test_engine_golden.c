/* test_engine_golden.c: the engine against outputs of trusted implementations (shared/golden/:
 * DeepSeek's own inference/model.py for the DeepSeek checkpoints, llama.cpp and an independent
 * float64 forward for the GGUF Llama). Greedy ids must match exactly and each step's top-5
 * logprobs within 1e-3: the prompt is prefilled, then one token per step.
 *
 * The folder is $TD_GOLDEN_DIR, else $TD_SOURCE_ROOT/../shared/golden (meson sets
 * TD_SOURCE_ROOT). When it is absent the suite says which folder it looked for and exits 77,
 * which meson reports as SKIP; when it is there every test runs and checks. */
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "golden_fixture.h"
#include "td_check.h"

#include <check.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Run one golden case; returns the largest top-5 logprob error seen. */
static double run_golden(const char *name, const char *model_rel, int block_size)
{
    char path[4200], gpath[4200];
    snprintf(path, sizeof(path), "%s/%s/%s", golden_dir, name, model_rel);
    snprintf(gpath, sizeof(gpath), "%s/%s/golden.json", golden_dir, name);
    json_object *g = json_object_from_file(gpath);
    ck_assert_msg(g != NULL, "cannot read %s", gpath);
    json_object *jp, *jg, *jt;
    ck_assert(json_object_object_get_ex(g, "prompt_token_ids", &jp));
    ck_assert(json_object_object_get_ex(g, "greedy_token_ids", &jg));
    ck_assert(json_object_object_get_ex(g, "top5_logprobs_per_step", &jt));

    td_model_t *m;
    int rc = td_model_load(path, &m);
    ck_assert_msg(rc == 0, "load %s: %s", path, td_err_msg());
    td_engine_t *e;
    td_engine_opts_t o = {.n_threads = 2};
    ck_assert_int_eq(td_engine_create(m, &o, &e), 0);
    td_kv_layout_t lay;
    ck_assert_int_eq(td_kv_layout_init(&lay, m, block_size), 0);
    td_kv_pool_t pool;
    ck_assert_int_eq(td_kv_pool_init(&pool, &lay, 64), 0);
    td_kv_seq_t seq;
    td_kv_seq_init(&seq);

    int V = m->cfg.vocab_size, np = (int)json_object_array_length(jp);
    int ng = (int)json_object_array_length(jg);
    int32_t *prompt = calloc((size_t)np, sizeof(int32_t));
    float *logits = calloc((size_t)V, sizeof(float));
    for (int i = 0; i < np; i++)
        prompt[i] = json_object_get_int(json_object_array_get_idx(jp, i));
    td_batch_seq_t b = {&seq, prompt, np, logits};
    ck_assert_msg(td_engine_step(e, &pool, &b, 1) == 0, "%s", td_err_msg());
    double max_err = 0;
    for (int step = 0; step < ng; step++) {
        int want = json_object_get_int(json_object_array_get_idx(jg, step));
        json_object *top = json_object_array_get_idx(jt, step);
        for (size_t k = 0; k < json_object_array_length(top); k++) {
            json_object *pair = json_object_array_get_idx(top, k);
            int id = json_object_get_int(json_object_array_get_idx(pair, 0));
            double lp = json_object_get_double(json_object_array_get_idx(pair, 1));
            double err = fabs(log_softmax_at(logits, V, id) - lp);
            max_err = fmax(max_err, err);
            ck_assert_msg(err < 1e-3, "%s step %d token %d: logprob %.6f, golden %.6f", name, step,
                          id, log_softmax_at(logits, V, id), lp);
        }
        int got = argmax(logits, V);
        ck_assert_msg(got == want, "%s step %d: greedy %d, golden %d", name, step, got, want);
        int32_t tok = got;
        td_batch_seq_t d = {&seq, &tok, 1, logits};
        ck_assert_int_eq(td_engine_step(e, &pool, &d, 1), 0);
    }
    printf("golden %-18s block %2d: %d greedy ids match, max top-5 logprob error %.3g\n", name,
           block_size, ng, max_err);
    td_kv_seq_release(&pool, &seq);
    td_kv_pool_free(&pool);
    td_engine_free(e);
    td_model_free(m);
    free(prompt);
    free(logits);
    json_object_put(g);
    return max_err;
}

START_TEST(test_golden_deepseek_v3)
{
    run_golden("deepseek_v3_tiny", "", 16);
    run_golden("deepseek_v3_tiny", "", 4);
}
END_TEST

START_TEST(test_golden_deepseek_v2)
{
    run_golden("deepseek_v2_tiny", "", 16);
}
END_TEST

START_TEST(test_golden_llama_gguf)
{
    run_golden("llama_tiny", "model.gguf", 16);
    run_golden("llama_tiny", "model.gguf", 64);
}
END_TEST

/* `tandem generate` end to end: the greedy continuation it prints is the golden one. */
START_TEST(test_generate_cli)
{
    const char *build = getenv("TD_BUILD_ROOT");
    char exe[4200], cmd[9000], line[4096];
    snprintf(exe, sizeof(exe), "%s/tools/tandem", build ? build : ".");
    ck_assert_msg(access(exe, X_OK) == 0, "%s is not built (meson sets TD_BUILD_ROOT)", exe);
    char gpath[4200];
    snprintf(gpath, sizeof(gpath), "%s/llama_tiny/golden.json", golden_dir);
    json_object *g = json_object_from_file(gpath), *jp, *jg;
    ck_assert_ptr_nonnull(g);
    ck_assert(json_object_object_get_ex(g, "prompt_token_ids", &jp));
    ck_assert(json_object_object_get_ex(g, "greedy_token_ids", &jg));
    char ids[1024] = "", want[1024] = "output ids:";
    for (size_t i = 0; i < json_object_array_length(jp); i++)
        snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%s%d", i ? "," : "",
                 json_object_get_int(json_object_array_get_idx(jp, i)));
    for (size_t i = 0; i < json_object_array_length(jg); i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%d", i ? "," : " ",
                 json_object_get_int(json_object_array_get_idx(jg, i)));
    snprintf(cmd, sizeof(cmd),
             "%s generate %s/llama_tiny/model.gguf --prompt-ids %s --max-tokens %zu --ignore-eos "
             "--chunk 3 --block-size 4",
             exe, golden_dir, ids, json_object_array_length(jg));
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    bool found = false, tput = false;
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        found |= strcmp(line, want) == 0;
        tput |= strncmp(line, "decode: ", 8) == 0 && strstr(line, "tokens/s") != NULL;
    }
    ck_assert_int_eq(pclose(p), 0);
    ck_assert_msg(found, "no line \"%s\" from: %s", want, cmd);
    ck_assert(tput);
    json_object_put(g);
}
END_TEST

int main(void)
{
    if (!have_golden()) {
        printf("SKIP: golden fixtures not found at %s (set TD_GOLDEN_DIR)\n", golden_dir);
        return 77;
    }
    Suite *s = suite_create("engine_golden");
    TCase *tc = tcase_create("golden");
    tcase_add_test(tc, test_golden_deepseek_v3);
    tcase_add_test(tc, test_golden_deepseek_v2);
    tcase_add_test(tc, test_golden_llama_gguf);
    tcase_add_test(tc, test_generate_cli);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}

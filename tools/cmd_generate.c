/* cmd_generate.c: `tandem generate`: offline generation in one process: load a model, prefill a
 * prompt (token ids, or text when the model has a tokenizer.json), decode with the sampler, print
 * the output and the prefill and decode throughput, as text or (--json) as one JSON object. */
#include "cli.h"
#include "sampling_flags.h"
#include "td_chat.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_sampler.h"
#include "td_tokenizer.h"
#include "td_util.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem generate MODEL (--prompt TEXT | --messages JSON | --prompt-ids IDS) "
            "[options]\n"
            "\n"
            "MODEL is a Hugging Face model directory (config.json + safetensors) or a GGUF file.\n"
            "Text prompts need the directory's tokenizer.json; chat messages also its\n"
            "tokenizer_config.json chat template (any Jinja chat template).\n"
            "\n"
            "  --prompt TEXT          prompt text (encoded with the model's tokenizer)\n"
            "  --messages JSON        chat messages, OpenAI style: [{\"role\": \"user\", ...}]\n"
            "  --prompt-ids LIST      prompt as comma-separated decimal token ids\n"
            "  --max-tokens N         tokens to generate (default 32)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-k K              keep the K most likely tokens (0 = off)\n"
            "  --top-p P              nucleus sampling threshold (1 = off)\n"
            "  --min-p P              drop tokens below P x the best probability (0 = off)\n"
            "  --seed N               sampling seed (default 0)\n"
            "  --stop-ids LIST        stop after any of these token ids\n"
            "  --ignore-eos           keep generating past the end-of-sequence token\n"
            "  --logprobs N           print each generated token's logprob and the top N\n"
            "  --presence-penalty X, --frequency-penalty X   [-2, 2], over generated tokens\n"
            "  --repetition-penalty X over prompt and generated tokens ((0, 100], 1 = off)\n"
            "  --min-tokens N         EOS and the stop ids masked before N tokens\n"
            "  --logit-bias LIST      ID:BIAS,... added to the logits (BIAS in [-100, 100])\n"
            "  --threads N            CPU threads (default 2)\n"
            "  --block-size N         KV cache block size in tokens (default 16)\n"
            "  --chunk N              prefill in chunks of N tokens (default: the whole prompt)\n"
            "  --json                 print one JSON object instead of text: prompt_ids, ids,\n"
            "                         text (null without a tokenizer), finish_reason, logprobs\n"
            "                         (one {id, logprob, top} per generated token, natural log,\n"
            "                         %%.9g; top has --logprobs N entries), timings (seconds)\n");
}

typedef struct gen_args {
    const char *model;
    const char *prompt;
    const char *messages;
    int32_t *prompt_ids;
    int n_prompt;
    td_sampling_t sp;
    int threads, block, chunk;
    bool json;
} gen_args_t;

static int parse_args(int argc, char **argv, gen_args_t *a)
{
    enum { O_PROMPT = 256, O_MSGS, O_IDS, O_THREADS, O_BLOCK, O_CHUNK, O_JSON, O_HELP };
    static const struct option opts[] = {{"prompt", required_argument, 0, O_PROMPT},
                                         {"messages", required_argument, 0, O_MSGS},
                                         {"prompt-ids", required_argument, 0, O_IDS},
                                         TD_SAMPLING_FLAG_OPTIONS,
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"block-size", required_argument, 0, O_BLOCK},
                                         {"chunk", required_argument, 0, O_CHUNK},
                                         {"json", no_argument, 0, O_JSON},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    td_sampling_defaults(&a->sp);
    a->sp.max_tokens = 32;
    a->threads = 2;
    a->block = 16;
    int c, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        size_t n;
        switch (c) {
        case O_PROMPT:
            a->prompt = optarg;
            break;
        case O_MSGS:
            a->messages = optarg;
            break;
        case O_IDS:
            free(a->prompt_ids);
            a->prompt_ids = NULL;
            rc = td_sampling_flags_parse_ids("--prompt-ids", optarg, false, &a->prompt_ids, &n);
            a->n_prompt = rc ? 0 : (int)n;
            break;
        case O_THREADS:
            rc = td_sampling_flags_parse_int("--threads", optarg, 1, 256, &a->threads);
            break;
        case O_BLOCK:
            rc = td_sampling_flags_parse_int("--block-size", optarg, 1, 4096, &a->block);
            break;
        case O_CHUNK:
            rc = td_sampling_flags_parse_int("--chunk", optarg, 1, 1 << 20, &a->chunk);
            break;
        case O_JSON:
            a->json = true;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            if (td_sampling_flags_has(c))
                rc = td_sampling_flags_apply(c, optarg, &a->sp);
            else
                rc = td_err_set(TD_EINVAL, "unknown or incomplete option \"%s\"", argv[optind - 1]);
        }
    }
    if (rc)
        return rc;
    if (optind != argc - 1)
        return td_err_set(TD_EINVAL, "expected one MODEL argument");
    a->model = argv[optind];
    if ((a->prompt != NULL) + (a->messages != NULL) + (a->prompt_ids != NULL) != 1)
        return td_err_set(TD_EINVAL, "give exactly one of --prompt, --messages and --prompt-ids");
    return 0;
}

/* Every id of `ids` (from `flag`) must be in the model's vocabulary. 0 or TD_EINVAL saying which
 * element (counted from 1, as the flag parser counts) is out of range. */
static int check_vocab(const char *flag, const int32_t *ids, int n, int vocab)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= vocab)
            return td_err_set(TD_EINVAL, "%s: token %d is %d; the vocabulary has ids 0..%d", flag,
                              i + 1, ids[i], vocab - 1);
    return 0;
}

/* A logprob as a JSON number at float precision, or null when it is not finite. */
static void json_logprob(FILE *f, float lp)
{
    if (isfinite(lp))
        fprintf(f, "%.9g", (double)lp);
    else
        fputs("null", f);
}

/* What --json prints: the generated tokens with their logprobs and alternatives. */
typedef struct gen_out {
    int n;             /* tokens generated */
    int32_t *ids;      /* [max_tokens] */
    float *logprob;    /* [max_tokens] natural log of each generated token's probability */
    td_logprob_t *top; /* [max_tokens][n_top_max] alternatives, best first */
    int *n_top;        /* [max_tokens] entries of `top` used per token */
    int n_top_max;     /* the --logprobs N asked for (0 when none) */
} gen_out_t;

/* Print the --json object on one line. `text` is the decoded output, NULL without a tokenizer.
 * 0, or TD_ENOMEM escaping the text. */
static int print_json(FILE *f, const int32_t *prompt, int np, const gen_out_t *g,
                      const td_buf_t *text, const char *finish, double prefill_s, double decode_s)
{
    td_buf_t esc;
    td_buf_init(&esc);
    if (text && td_buf_append_json_string(&esc, text->data ? text->data : "", text->len))
        return td_err_set(TD_ENOMEM, "out of memory");
    fputs("{\"prompt_ids\": [", f);
    for (int i = 0; i < np; i++)
        fprintf(f, "%s%d", i ? ", " : "", prompt[i]);
    fputs("], \"ids\": [", f);
    for (int i = 0; i < g->n; i++)
        fprintf(f, "%s%d", i ? ", " : "", g->ids[i]);
    fprintf(f, "], \"text\": %s, \"finish_reason\": \"%s\", \"logprobs\": [",
            text ? esc.data : "null", finish);
    for (int i = 0; i < g->n; i++) {
        fprintf(f, "%s{\"id\": %d, \"logprob\": ", i ? ", " : "", g->ids[i]);
        json_logprob(f, g->logprob[i]);
        fputs(", \"top\": [", f);
        for (int k = 0; k < g->n_top[i]; k++) {
            const td_logprob_t *t = &g->top[(size_t)i * g->n_top_max + k];
            fprintf(f, "%s{\"id\": %d, \"logprob\": ", k ? ", " : "", t->id);
            json_logprob(f, t->logprob);
            fputc('}', f);
        }
        fputs("]}", f);
    }
    /* decode steps: one per generated token after the first (which came from the prefill) */
    fprintf(f,
            "], \"timings\": {\"prefill_tokens\": %d, \"prefill_s\": %.9g, "
            "\"decode_tokens\": %d, \"decode_s\": %.9g}}\n",
            np, prefill_s, g->n - 1, decode_s);
    td_buf_free(&esc);
    return 0;
}

int td_cmd_generate(int argc, char **argv)
{
    gen_args_t a = {0};
    td_model_t *m = NULL;
    td_engine_t *e = NULL;
    td_tokenizer_t *tok = NULL;
    td_kv_pool_t pool = {0};
    td_kv_seq_t seq;
    td_sampler_t smp = {0};
    td_tokens_t ptoks;
    float *logits = NULL;
    gen_out_t g = {0};
    td_buf_t text;
    int rc, status = 1;
    td_kv_seq_init(&seq);
    td_tokens_init(&ptoks);
    td_buf_init(&text);

    if ((rc = parse_args(argc, argv, &a))) {
        fprintf(stderr, "tandem generate: %s\n\n", td_err_msg());
        usage(stderr);
        free(a.prompt_ids);
        return 2;
    }
    if ((rc = td_model_load(a.model, &m)))
        goto fail;
    /* a tokenizer is optional: GGUF files and fixtures without tokenizer.json work with ids */
    if (td_tokenizer_load(a.model, &tok) != 0) {
        if (a.prompt || a.messages) {
            fprintf(stderr, "tandem generate: --prompt needs a tokenizer: %s\n", td_err_msg());
            goto out;
        }
        tok = NULL;
    }
    const int32_t *prompt = a.prompt_ids;
    int np = a.n_prompt;
    if (a.messages) { /* render the chat template, then tokenize (it writes BOS itself) */
        char cfg[4096];
        td_chat_template_t tpl = {0};
        td_chat_msgs_t msgs = {0};
        td_chat_opts_t copts = {.add_generation_prompt = true};
        td_buf_t rendered;
        td_buf_init(&rendered);
        snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", a.model);
        rc = td_chat_template_load(&tpl, cfg, NULL);
        if (!rc)
            rc = td_chat_msgs_parse(&msgs, a.messages, strlen(a.messages));
        if (!rc)
            rc = td_chat_render(&tpl, &msgs, &copts, &rendered);
        if (!rc)
            rc = td_tokenizer_encode(tok, rendered.data, rendered.len, false, &ptoks);
        td_buf_free(&rendered);
        td_chat_msgs_free(&msgs);
        td_chat_template_free(&tpl);
        if (rc)
            goto fail;
        prompt = ptoks.ids;
        np = (int)ptoks.len;
    } else if (a.prompt) {
        if ((rc = td_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, &ptoks)))
            goto fail;
        prompt = ptoks.ids;
        np = (int)ptoks.len;
    }
    if (np == 0) {
        fprintf(stderr, "tandem generate: the prompt encodes to no tokens\n");
        goto out;
    }
    const td_model_cfg_t *c = &m->cfg;
    if (a.sp.eos_id < 0)
        a.sp.eos_id = c->eos_id;
    if ((rc = check_vocab(a.prompt_ids ? "--prompt-ids" : a.prompt ? "--prompt" : "--messages",
                          prompt, np, c->vocab_size)) ||
        (rc = check_vocab("--stop-ids", a.sp.stop_ids, a.sp.n_stop, c->vocab_size)))
        goto fail;
    td_engine_opts_t eo = {.n_threads = a.threads};
    td_kv_layout_t lay;
    int total = np + a.sp.max_tokens;
    if ((rc = td_engine_create(m, &eo, &e)) || (rc = td_kv_layout_init(&lay, m, a.block)) ||
        (rc = td_kv_pool_init(&pool, &lay, (total + a.block - 1) / a.block)) ||
        (rc = td_sampler_init(&smp, &a.sp, c->vocab_size)) ||
        (rc = td_sampler_context(&smp, prompt, np, 0)))
        goto fail;
    logits = malloc((size_t)c->vocab_size * sizeof(float));
    size_t mt = (size_t)a.sp.max_tokens;
    g.n_top_max = TD_MAX(a.sp.logprobs, 0);
    g.ids = malloc(mt * sizeof(int32_t));
    g.logprob = malloc(mt * sizeof(float));
    g.n_top = malloc(mt * sizeof(int));
    g.top = a.json && g.n_top_max ? td_calloc(mt * (size_t)g.n_top_max, sizeof(td_logprob_t)) : NULL;
    if (!logits || !g.ids || !g.logprob || !g.n_top || (a.json && g.n_top_max && !g.top)) {
        rc = td_err_set(TD_ENOMEM, "out of memory");
        goto fail;
    }
    if (!a.json) {
        printf("model: %s (%s, %d layers, vocab %d)\n", a.model, td_arch_name(c->arch),
               c->n_layers, c->vocab_size);
        printf("prompt: %d tokens\n", np);
    }

    double t0 = td_now_s();
    int chunk = a.chunk > 0 ? a.chunk : np;
    for (int i = 0; i < np; i += chunk) {
        td_batch_seq_t b = {&seq, prompt + i, TD_MIN(chunk, np - i), logits};
        if ((rc = td_engine_step(e, &pool, &b, 1)))
            goto fail;
    }
    double t1 = td_now_s();
    const char *finish = "length";
    td_detok_t dt;
    td_detok_init(&dt, true);
    for (;;) {
        td_sample_t s;
        td_sampler_sample(&smp, logits, &s);
        g.ids[g.n] = s.token;
        g.logprob[g.n] = s.logprob;
        g.n_top[g.n] = s.n_top;
        if (g.top)
            memcpy(&g.top[(size_t)g.n * g.n_top_max], s.top, (size_t)s.n_top * sizeof(s.top[0]));
        g.n++;
        if (tok && (rc = td_detok_step(tok, &dt, s.token, &text)))
            goto fail;
        if (!a.json && a.sp.logprobs >= 0) {
            printf("token %d logprob %.4f top:", s.token, s.logprob);
            for (int k = 0; k < s.n_top; k++)
                printf(" %d:%.4f", s.top[k].id, s.top[k].logprob);
            printf("\n");
        }
        if (s.finish != TD_FINISH_NONE) {
            finish = s.finish == TD_FINISH_STOP ? "stop" : "length";
            break;
        }
        td_batch_seq_t b = {&seq, &s.token, 1, logits};
        if ((rc = td_engine_step(e, &pool, &b, 1)))
            goto fail;
    }
    double t2 = td_now_s();
    if (tok && (rc = td_detok_finish(tok, &dt, &text)))
        goto fail;
    if (a.json) {
        if ((rc = print_json(stdout, prompt, np, &g, tok ? &text : NULL, finish, t1 - t0, t2 - t1)))
            goto fail;
        status = 0;
        goto out;
    }
    printf("output ids:");
    for (int i = 0; i < g.n; i++)
        printf("%s%d", i ? "," : " ", g.ids[i]);
    printf("\n");
    if (tok)
        printf("output text: %s\n", text.data ? text.data : "");
    printf("finish: %s\n", finish);
    /* decode steps: one per generated token after the first (which came from the prefill) */
    printf("prefill: %d tokens in %.3f s (%.1f tokens/s)\n", np, t1 - t0, np / (t1 - t0));
    if (g.n > 1)
        printf("decode: %d tokens in %.3f s (%.1f tokens/s)\n", g.n - 1, t2 - t1,
               (g.n - 1) / (t2 - t1));
    status = 0;
    goto out;
fail:
    fprintf(stderr, "tandem generate: %s\n", td_err_msg());
out:
    td_buf_free(&text);
    free(g.ids);
    free(g.logprob);
    free(g.n_top);
    free(g.top);
    free(logits);
    td_sampler_free(&smp);
    if (pool.mem) {
        td_kv_seq_release(&pool, &seq);
        td_kv_pool_free(&pool);
    }
    td_engine_free(e);
    td_tokenizer_free(tok);
    td_tokens_free(&ptoks);
    td_model_free(m);
    free(a.prompt_ids);
    return status;
}

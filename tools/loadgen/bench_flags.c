/* bench_flags.c: the flags of `tandem bench` (vLLM's benchmark_serving names where they exist)
 * and their checks. */
#include "bench_cmd_impl.h"
#include "td_error.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void td__bench_usage(FILE *f)
{
    fprintf(f,
            "usage: tandem bench [options]\n"
            "\n"
            "Open-loop load against an OpenAI-compatible server, measured as `vllm bench serve`\n"
            "measures (same definitions and result-JSON keys).\n"
            "\n"
            "target\n"
            "  --base-url URL            http://HOST:PORT (default http://127.0.0.1:8000)\n"
            "  --endpoint PATH           /v1/completions (default) or /v1/chat/completions\n"
            "  --backend B               openai (default), openai-chat, rpc, rpc-chat (the\n"
            "                            router's internal RPC: --base-url tcp://HOST:RPC_PORT)\n"
            "  --secret-file FILE        rpc: the cluster secret (default $TANDEM_CLUSTER_SECRET)\n"
            "  --model NAME              the request's \"model\" (default \"default\")\n"
            "  --api-key KEY             Authorization: Bearer KEY (default $OPENAI_API_KEY)\n"
            "  --no-stream               ask for whole responses instead of SSE\n"
            "  --timeout S               per-request timeout (default 600; 0 = none)\n"
            "  --app-timestamps          time chunks when the loop reads them, as vLLM's client\n"
            "                            does (default: when the kernel received them)\n"
            "load\n"
            "  --num-prompts N           requests per run (default 1000)\n"
            "  --duration S              instead: rate x S requests per run\n"
            "  --request-rate LIST       req/s, comma-separated sweep, inf = all at once (default "
            "inf)\n"
            "  --burstiness B            Gamma shape: 1 Poisson, inf constant rate (default 1)\n"
            "  --max-concurrency N       cap on requests in flight (default none)\n"
            "  --num-warmups N           requests before each run, not measured (default 0)\n"
            "  --seed N                  arrivals and workload seed (default 0)\n"
            "workload\n"
            "  --dataset-name D          random (default), prefix, multiturn, sharegpt, mooncake\n"
            "  --dataset-path FILE       ShareGPT JSON, or a Mooncake trace (JSON lines)\n"
            "  --tokenizer MODEL_DIR     token-exact lengths with this tokenizer.json\n"
            "  --random-input-len N      (default 1024)   --random-output-len N (default 128)\n"
            "  --random-range-ratio R    lengths uniform in [len(1-R), len(1+R)] (default 0)\n"
            "  --random-prefix-len N     tokens shared by every prompt (default 0)\n"
            "  --prefix-groups N         (default 8)  --prefix-prompts-per-group N (default 16)\n"
            "  --prefix-system-len N     (default 512) --prefix-question-len N (default 64)\n"
            "  --sessions N              multi-turn sessions (default 16) --turns N (default 4)\n"
            "  --sharegpt-output-len N   fixed output length for ShareGPT\n"
            "mooncake trace (arrivals from its timestamps; a finite --request-rate rescales\n"
            "them to that mean rate)\n"
            "  --trace-block-tokens N    tokens synthesized per hash id (default 512, 1-512)\n"
            "  --trace-time-scale X      arrival times x X (default 1; 0.5 = twice as fast)\n"
            "  --trace-start N           skip the first N requests (default 0)\n"
            "  --trace-limit N           replay N requests (default 0 = to the end)\n"
            "  --trace-max-input-len N   cut prompts to N tokens by whole blocks (default none)\n"
            "  --trace-max-output-len N  cap output lengths to N (default none)\n"
            "  --ignore-eos              ask the server to generate exactly max_tokens\n"
            "results\n"
            "  --metric-percentiles LIST percentiles to report (default 90,95,99)\n"
            "  --goodput SLO...          ttft:MS tpot:MS e2el:MS (one or more)\n"
            "  --result-file PATH        write the result JSON (a sweep adds -qps<rate>)\n"
            "  --save-detailed           per-request arrays in the JSON\n"
            "  --html PATH               self-contained HTML report with plots\n"
            "  --scrape-metrics          GET the target's /metrics before and after each run\n"
            "  --label TEXT              label in the result file\n"
            "  --no-progress             no progress line\n");
}

static int parse_list(const char *flag, const char *s, double *out, size_t max, size_t *n,
                      bool allow_inf)
{
    char *copy = td_strdup(s), *save = NULL;
    int rc = copy ? 0 : TD_ENOMEM;
    *n = 0;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && rc == 0;
         t = strtok_r(NULL, ",", &save)) {
        double v;
        if (allow_inf && (strcmp(t, "inf") == 0 || strcmp(t, "INF") == 0))
            v = INFINITY;
        else if (td_parse_double(t, &v) != 0 || !isfinite(v))
            rc = td_err_set(TD_EINVAL, "%s: \"%s\" is not a number", flag, t);
        if (rc == 0 && *n == max)
            rc = td_err_set(TD_EINVAL, "%s: at most %zu values", flag, max);
        if (rc == 0)
            out[(*n)++] = v;
    }
    if (rc == 0 && *n == 0)
        rc = td_err_set(TD_EINVAL, "%s: empty list", flag);
    free(copy);
    return rc;
}

static int parse_slo(const char *s, td_bench_slo_t *slo)
{
    const char *colon = strchr(s, ':');
    double v;
    if (!colon || td_parse_double(colon + 1, &v) != 0 || !(v >= 0))
        return td_err_set(TD_EINVAL, "--goodput: \"%s\" is not KEY:MS with MS >= 0", s);
    size_t k = (size_t)(colon - s);
    if (k == 4 && memcmp(s, "ttft", 4) == 0)
        slo->ttft_ms = v;
    else if (k == 4 && memcmp(s, "tpot", 4) == 0)
        slo->tpot_ms = v;
    else if (k == 4 && memcmp(s, "e2el", 4) == 0)
        slo->e2el_ms = v;
    else
        return td_err_set(TD_EINVAL, "--goodput: unknown metric in \"%s\" (ttft, tpot, e2el)", s);
    return 0;
}

static int num_arg(const char *flag, const char *s, int64_t lo, int64_t *out)
{
    if (td_parse_i64(s, out) != 0 || *out < lo)
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not an integer >= %lld", flag, s,
                          (long long)lo);
    return 0;
}

static int dbl_arg(const char *flag, const char *s, bool allow_inf, double *out)
{
    if (allow_inf && strcmp(s, "inf") == 0) {
        *out = INFINITY;
        return 0;
    }
    if (td_parse_double(s, out) != 0 || !isfinite(*out))
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not a number", flag, s);
    return 0;
}

static int parse_url(const char *url, opts_t *o, char *host, size_t hn)
{
    const char *p = url;
    if (td_str_startswith(p, "http://"))
        p += 7;
    else if (td_str_startswith(p, "tcp://")) /* the rpc backend's address */
        p += 6;
    else if (strstr(p, "://"))
        return td_err_set(
            TD_EINVAL, "--base-url: only http:// (and tcp:// for rpc) is supported (\"%s\")", url);
    const char *colon = strrchr(p, ':'), *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    int port = 80;
    if (colon && (!slash || colon < slash)) {
        char ps[16];
        size_t pl = (size_t)((slash ? slash : p + strlen(p)) - colon - 1);
        int64_t v;
        if (pl == 0 || pl >= sizeof(ps))
            return td_err_set(TD_EINVAL, "--base-url: bad port in \"%s\"", url);
        memcpy(ps, colon + 1, pl);
        ps[pl] = 0;
        if (td_parse_i64(ps, &v) != 0 || v < 1 || v > 65535)
            return td_err_set(TD_EINVAL, "--base-url: bad port in \"%s\"", url);
        port = (int)v;
        len = (size_t)(colon - p);
    }
    if (len == 0 || len >= hn)
        return td_err_set(TD_EINVAL, "--base-url: no host in \"%s\"", url);
    memcpy(host, p, len);
    host[len] = 0;
    o->host = host;
    o->port = port;
    return 0;
}

enum {
    O_URL = 256,
    O_ENDPOINT,
    O_BACKEND,
    O_MODEL,
    O_KEY,
    O_SECRET,
    O_NOSTREAM,
    O_TIMEOUT,
    O_NUM,
    O_DUR,
    O_RATE,
    O_BURST,
    O_MAXC,
    O_WARM,
    O_SEED,
    O_DS,
    O_DSPATH,
    O_TOK,
    O_RIN,
    O_ROUT,
    O_RRATIO,
    O_RPREFIX,
    O_PGROUPS,
    O_PPER,
    O_PSYS,
    O_PQ,
    O_SESS,
    O_TURNS,
    O_SGOUT,
    O_TBLOCK,
    O_TSCALE,
    O_TSTART,
    O_TLIMIT,
    O_TMAXIN,
    O_TMAXOUT,
    O_IGNEOS,
    O_PCTS,
    O_GOODPUT,
    O_RESULT,
    O_DETAILED,
    O_HTML,
    O_SCRAPE,
    O_LABEL,
    O_NOPROG,
    O_APPTS,
    O_HELP
};

int td__bench_parse_opts(int argc, char **argv, opts_t *o, char *host, size_t hn, bool *help)
{
    static const struct option lo[] = {{"base-url", 1, 0, O_URL},
                                       {"endpoint", 1, 0, O_ENDPOINT},
                                       {"backend", 1, 0, O_BACKEND},
                                       {"model", 1, 0, O_MODEL},
                                       {"api-key", 1, 0, O_KEY},
                                       {"secret-file", 1, 0, O_SECRET},
                                       {"no-stream", 0, 0, O_NOSTREAM},
                                       {"timeout", 1, 0, O_TIMEOUT},
                                       {"num-prompts", 1, 0, O_NUM},
                                       {"duration", 1, 0, O_DUR},
                                       {"request-rate", 1, 0, O_RATE},
                                       {"burstiness", 1, 0, O_BURST},
                                       {"max-concurrency", 1, 0, O_MAXC},
                                       {"num-warmups", 1, 0, O_WARM},
                                       {"seed", 1, 0, O_SEED},
                                       {"dataset-name", 1, 0, O_DS},
                                       {"dataset-path", 1, 0, O_DSPATH},
                                       {"tokenizer", 1, 0, O_TOK},
                                       {"random-input-len", 1, 0, O_RIN},
                                       {"random-output-len", 1, 0, O_ROUT},
                                       {"random-range-ratio", 1, 0, O_RRATIO},
                                       {"random-prefix-len", 1, 0, O_RPREFIX},
                                       {"prefix-groups", 1, 0, O_PGROUPS},
                                       {"prefix-prompts-per-group", 1, 0, O_PPER},
                                       {"prefix-system-len", 1, 0, O_PSYS},
                                       {"prefix-question-len", 1, 0, O_PQ},
                                       {"sessions", 1, 0, O_SESS},
                                       {"turns", 1, 0, O_TURNS},
                                       {"sharegpt-output-len", 1, 0, O_SGOUT},
                                       {"trace-block-tokens", 1, 0, O_TBLOCK},
                                       {"trace-time-scale", 1, 0, O_TSCALE},
                                       {"trace-start", 1, 0, O_TSTART},
                                       {"trace-limit", 1, 0, O_TLIMIT},
                                       {"trace-max-input-len", 1, 0, O_TMAXIN},
                                       {"trace-max-output-len", 1, 0, O_TMAXOUT},
                                       {"ignore-eos", 0, 0, O_IGNEOS},
                                       {"metric-percentiles", 1, 0, O_PCTS},
                                       {"goodput", 1, 0, O_GOODPUT},
                                       {"result-file", 1, 0, O_RESULT},
                                       {"save-detailed", 0, 0, O_DETAILED},
                                       {"html", 1, 0, O_HTML},
                                       {"scrape-metrics", 0, 0, O_SCRAPE},
                                       {"label", 1, 0, O_LABEL},
                                       {"no-progress", 0, 0, O_NOPROG},
                                       {"app-timestamps", 0, 0, O_APPTS},
                                       {"help", 0, 0, O_HELP},
                                       {0, 0, 0, 0}};
    int c, rc = 0;
    int64_t v;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_URL:
            rc = parse_url(optarg, o, host, hn);
            break;
        case O_ENDPOINT:
            o->endpoint = optarg;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "openai") == 0)
                o->chat = false;
            else if (strcmp(optarg, "openai-chat") == 0)
                o->chat = true;
            else if (strcmp(optarg, "rpc") == 0 || strcmp(optarg, "rpc-chat") == 0) {
                o->rpc = true;
                o->chat = strcmp(optarg, "rpc-chat") == 0;
            } else
                rc = td_err_set(TD_EINVAL, "--backend: \"%s\" (openai, openai-chat, rpc, rpc-chat)",
                                optarg);
            break;
        case O_SECRET:
            o->secret_file = optarg;
            break;
        case O_MODEL:
            o->model = optarg;
            break;
        case O_KEY:
            o->api_key = optarg;
            break;
        case O_NOSTREAM:
            o->stream = false;
            break;
        case O_TIMEOUT:
            rc = dbl_arg("--timeout", optarg, false, &o->timeout_s);
            if (rc == 0 && o->timeout_s < 0)
                rc = td_err_set(TD_EINVAL, "--timeout must be >= 0");
            break;
        case O_NUM:
            if ((rc = num_arg("--num-prompts", optarg, 1, &v)) == 0)
                o->num_prompts = (size_t)v;
            break;
        case O_DUR:
            rc = dbl_arg("--duration", optarg, false, &o->duration);
            if (rc == 0 && !(o->duration > 0))
                rc = td_err_set(TD_EINVAL, "--duration must be > 0");
            break;
        case O_RATE:
            rc = parse_list("--request-rate", optarg, o->rates, TD_ARRAY_LEN(o->rates), &o->n_rates,
                            true);
            for (size_t i = 0; rc == 0 && i < o->n_rates; i++)
                if (!(o->rates[i] > 0))
                    rc = td_err_set(TD_EINVAL, "--request-rate: rates must be > 0");
            break;
        case O_BURST:
            rc = dbl_arg("--burstiness", optarg, true, &o->burstiness);
            if (rc == 0 && !(o->burstiness > 0))
                rc = td_err_set(TD_EINVAL, "--burstiness must be > 0");
            break;
        case O_MAXC:
            if ((rc = num_arg("--max-concurrency", optarg, 1, &v)) == 0)
                o->max_concurrency = (long)v;
            break;
        case O_WARM:
            if ((rc = num_arg("--num-warmups", optarg, 0, &v)) == 0)
                o->warmups = (size_t)v;
            break;
        case O_SEED:
            if ((rc = num_arg("--seed", optarg, 0, &v)) == 0)
                o->seed = o->wl.seed = (uint64_t)v;
            break;
        case O_DS:
            if (strcmp(optarg, "random") == 0)
                o->wl.kind = TD_BENCH_WL_RANDOM;
            else if (strcmp(optarg, "prefix") == 0 ||
                     strcmp(optarg, "generated-shared-prefix") == 0)
                o->wl.kind = TD_BENCH_WL_PREFIX;
            else if (strcmp(optarg, "multiturn") == 0)
                o->wl.kind = TD_BENCH_WL_MULTITURN;
            else if (strcmp(optarg, "sharegpt") == 0)
                o->wl.kind = TD_BENCH_WL_SHAREGPT;
            else if (strcmp(optarg, "mooncake") == 0 || strcmp(optarg, "mooncake_trace") == 0)
                o->wl.kind = TD_BENCH_WL_MOONCAKE;
            else
                rc = td_err_set(TD_EINVAL,
                                "--dataset-name: \"%s\" (random, prefix, multiturn, "
                                "sharegpt, mooncake)",
                                optarg);
            break;
        case O_DSPATH:
            o->wl.dataset_path = optarg;
            break;
        case O_TOK:
            o->tokenizer = optarg;
            break;
        case O_RIN:
            rc = num_arg("--random-input-len", optarg, 1, &o->wl.input_len);
            break;
        case O_ROUT:
            rc = num_arg("--random-output-len", optarg, 1, &o->wl.output_len);
            break;
        case O_RRATIO:
            rc = dbl_arg("--random-range-ratio", optarg, false, &o->wl.range_ratio);
            break;
        case O_RPREFIX:
            rc = num_arg("--random-prefix-len", optarg, 0, &o->wl.prefix_len);
            break;
        case O_PGROUPS:
            rc = num_arg("--prefix-groups", optarg, 1, &o->wl.num_groups);
            break;
        case O_PPER:
            rc = num_arg("--prefix-prompts-per-group", optarg, 1, &o->wl.prompts_per_group);
            break;
        case O_PSYS:
            rc = num_arg("--prefix-system-len", optarg, 0, &o->wl.system_prompt_len);
            break;
        case O_PQ:
            rc = num_arg("--prefix-question-len", optarg, 1, &o->wl.question_len);
            break;
        case O_SESS:
            rc = num_arg("--sessions", optarg, 1, &o->wl.num_sessions);
            break;
        case O_TURNS:
            rc = num_arg("--turns", optarg, 1, &o->wl.turns_per_session);
            break;
        case O_SGOUT:
            rc = num_arg("--sharegpt-output-len", optarg, 1, &o->wl.sharegpt_output_len);
            break;
        case O_TBLOCK:
            rc = num_arg("--trace-block-tokens", optarg, 1, &o->wl.trace_block_tokens);
            if (rc == 0 && o->wl.trace_block_tokens > TD_BENCH_TRACE_BLOCK)
                rc = td_err_set(TD_EINVAL, "--trace-block-tokens: at most %d (the trace's block)",
                                TD_BENCH_TRACE_BLOCK);
            break;
        case O_TSCALE:
            rc = dbl_arg("--trace-time-scale", optarg, false, &o->wl.trace_time_scale);
            if (rc == 0 && !(o->wl.trace_time_scale > 0))
                rc = td_err_set(TD_EINVAL, "--trace-time-scale must be > 0");
            break;
        case O_TSTART:
            rc = num_arg("--trace-start", optarg, 0, &o->wl.trace_start);
            break;
        case O_TLIMIT:
            rc = num_arg("--trace-limit", optarg, 1, &o->wl.trace_limit);
            break;
        case O_TMAXIN:
            rc = num_arg("--trace-max-input-len", optarg, 1, &o->wl.trace_max_input_len);
            break;
        case O_TMAXOUT:
            rc = num_arg("--trace-max-output-len", optarg, 1, &o->wl.trace_max_output_len);
            break;
        case O_IGNEOS:
            o->ignore_eos = true;
            break;
        case O_PCTS:
            rc = parse_list("--metric-percentiles", optarg, o->pcts, TD_ARRAY_LEN(o->pcts),
                            &o->n_pcts, false);
            for (size_t i = 0; rc == 0 && i < o->n_pcts; i++)
                if (!(o->pcts[i] > 0 && o->pcts[i] < 100))
                    rc = td_err_set(TD_EINVAL, "--metric-percentiles: values in (0, 100)");
            break;
        case O_GOODPUT:
            /* vLLM takes `--goodput ttft:500 tpot:50`: this value and every following word that
             * is not a flag; a single quoted "ttft:500 tpot:50" works too */
            o->have_slo = true;
            for (char *save = NULL, *t = strtok_r(optarg, " ", &save); t && rc == 0;
                 t = strtok_r(NULL, " ", &save))
                rc = parse_slo(t, &o->slo);
            while (rc == 0 && optind < argc && argv[optind][0] != '-')
                rc = parse_slo(argv[optind++], &o->slo);
            break;
        case O_RESULT:
            o->result_file = optarg;
            break;
        case O_DETAILED:
            o->save_detailed = true;
            break;
        case O_HTML:
            o->html_file = optarg;
            break;
        case O_SCRAPE:
            o->scrape = true;
            break;
        case O_LABEL:
            o->label = optarg;
            break;
        case O_NOPROG:
            o->progress = false;
            break;
        case 'h':
        case O_APPTS:
            o->app_timestamps = true;
            break;
        case O_HELP:
            *help = true;
            return 0;
        default:
            rc = td_err_set(TD_EINVAL, "unknown option (see tandem bench --help)");
        }
    }
    if (rc == 0 && optind < argc)
        rc = td_err_set(TD_EINVAL, "unexpected argument \"%s\"", argv[optind]);
    if (rc == 0 && o->duration > 0)
        for (size_t i = 0; i < o->n_rates; i++)
            if (isinf(o->rates[i]))
                rc = td_err_set(TD_EINVAL, "--duration needs finite --request-rate values");
    if (o->endpoint && td_str_endswith(o->endpoint, "chat/completions"))
        o->chat = true;
    if (rc == 0 && o->wl.kind == TD_BENCH_WL_MULTITURN && !o->chat)
        rc = td_err_set(TD_EINVAL, "--dataset-name multiturn needs --backend openai-chat");
    return rc;
}

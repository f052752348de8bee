/* cmd_ctl.c: `tandem ctl`: talk to a running cluster through a router's internal RPC
 * (td_client.h): status, workers, requests, cache, drain / undrain, generate, batch, tokenize. */
#include "cli.h"
#include "sampling_flags.h"
#include "td_client.h"
#include "td_error.h"
#include "td_msg.h"
#include "td_rpc.h"
#include "td_util.h"

#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem ctl [--router ADDR] [--secret-file FILE] [--timeout S] COMMAND ...\n"
            "\n"
            "ADDR is a router's rpc address (default 127.0.0.1:8100). The cluster secret comes\n"
            "from --secret-file, else $TANDEM_CLUSTER_SECRET, else\n"
            "$CREDENTIALS_DIRECTORY/cluster-secret.\n"
            "\n"
            "commands:\n"
            "  status                 workers, their load and heartbeat age\n"
            "  workers [--json]       one line per worker: role, alive, draining, load (running,\n"
            "                         waiting, queued prefill tokens), KV usage, this router's\n"
            "                         sequences on it (IN_FLIGHT), cached blocks per tier\n"
            "  requests [--json]      sequences in flight on the router: id, state, workers, age,\n"
            "                         prompt and generated tokens\n"
            "  cache [--json]         prefix cache per worker and tier: cached blocks, queried and\n"
            "                         hit prompt tokens, hit rate; the cluster's totals\n"
            "  drain WORKER           the worker takes no new requests; undrain WORKER reverts\n"
            "  tokenize TEXT          token ids of TEXT (with the model's special tokens)\n"
            "  generate [options]     stream one completion; options:\n"
            "      --prompt TEXT | --messages JSON | --prompt-ids 1,2,3\n"
            "      --max-tokens N  --temperature T  --top-k K  --top-p P  --min-p P  --seed N\n"
            "      --stop STRING (repeatable)  --stop-ids 1,2  --ignore-eos  --logprobs N\n"
            "      --presence-penalty X  --frequency-penalty X  --repetition-penalty X\n"
            "      --min-tokens N  --logit-bias ID:BIAS,...\n"
            "      --ids           print the generated token ids (`output ids: ...`) too\n"
            "  batch FILE             run every JSON line of FILE ({\"prompt\"|\"prompt_ids\"|\n"
            "                         \"messages\", \"max_tokens\", \"temperature\", \"top_k\",\n"
            "                         \"top_p\", \"min_p\", \"seed\", \"stop\", \"ignore_eos\",\n"
            "                         \"presence_penalty\", \"frequency_penalty\",\n"
            "                         \"repetition_penalty\", \"min_tokens\", \"logit_bias\",\n"
            "                         \"tenant\"}) at\n"
            "                         once; print one JSON line per request, in order\n");
}

typedef struct ctl {
    const char *router;
    const char *secret_file;
    double timeout;
    td_client_t *cl;
} ctl_t;

/* ---- status ---------------------------------------------------------------------------------- */

static const char *role_name(Tandem__Role r)
{
    return r == TANDEM__ROLE__ROLE_PREFILL ? "prefill"
           : r == TANDEM__ROLE__ROLE_DECODE ? "decode"
                                             : "?";
}

static int cmd_status(ctl_t *c, const char *drain, bool undrain)
{
    Tandem__StatusResponse *st;
    int rc = td_client_status(c->cl, drain, undrain, false, c->timeout, &st);
    if (rc)
        return rc;
    printf("router %s  model %s  running %u  waiting %u\n", st->router_id, st->model, st->running,
           st->waiting);
    printf("%-24s %-8s %-6s %-9s %8s %8s %12s %9s %9s\n", "WORKER", "ROLE", "ALIVE", "DRAINING",
           "RUNNING", "WAITING", "FREE_BLOCKS", "ASSIGNED", "HB_AGE_S");
    for (size_t i = 0; i < st->n_workers; i++) {
        Tandem__WorkerStatus *w = st->workers[i];
        Tandem__Load *l = w->load;
        printf("%-24s %-8s %-6s %-9s %8u %8u %6u/%-5u %9llu %9.2f\n", w->worker_id,
               role_name(w->role), w->alive ? "yes" : "no", l && l->draining ? "yes" : "no",
               l ? l->running_sequences : 0, l ? l->waiting_sequences : 0,
               l ? l->free_blocks : 0, l ? l->total_blocks : 0,
               (unsigned long long)w->assigned, w->last_heartbeat_age);
    }
    tandem__status_response__free_unpacked(st, NULL);
    return 0;
}

/* ---- workers, requests, cache ---------------------------------------------------------------- */

/* The tier named `name` of a worker's last heartbeat, or NULL. */
static const Tandem__CacheTier *tier_of(const Tandem__Load *l, const char *name)
{
    for (size_t i = 0; l && i < l->n_cache; i++)
        if (l->cache[i]->tier && !strcmp(l->cache[i]->tier, name))
            return l->cache[i];
    return NULL;
}

/* Share of the KV pool in use, 0..1 (0 before a heartbeat). */
static double kv_usage(const Tandem__Load *l)
{
    return l && l->total_blocks ? 1.0 - (double)l->free_blocks / l->total_blocks : 0.0;
}

static double hit_rate(uint64_t hits, uint64_t queries)
{
    return queries ? (double)hits / (double)queries : 0.0;
}

static json_object *tier_json(uint64_t blocks, uint64_t queries, uint64_t hits)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "cached_blocks", json_object_new_int64((int64_t)blocks));
    json_object_object_add(o, "queries", json_object_new_int64((int64_t)queries));
    json_object_object_add(o, "hits", json_object_new_int64((int64_t)hits));
    json_object_object_add(o, "hit_rate", json_object_new_double(hit_rate(hits, queries)));
    return o;
}

/* {"pool": {...}, "disk": {...}} of one worker. */
static json_object *tiers_json(const Tandem__Load *l)
{
    json_object *o = json_object_new_object();
    for (size_t i = 0; l && i < l->n_cache; i++) {
        const Tandem__CacheTier *t = l->cache[i];
        json_object_object_add(o, t->tier ? t->tier : "",
                               tier_json(t->cached_blocks, t->queries, t->hits));
    }
    return o;
}

static json_object *worker_json(const Tandem__WorkerStatus *w)
{
    const Tandem__Load *l = w->load;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(w->worker_id));
    json_object_object_add(o, "role", json_object_new_string(role_name(w->role)));
    json_object_object_add(o, "alive", json_object_new_boolean(w->alive));
    json_object_object_add(o, "draining", json_object_new_boolean(l && l->draining));
    json_object_object_add(o, "running", json_object_new_int(l ? (int)l->running_sequences : 0));
    json_object_object_add(o, "waiting", json_object_new_int(l ? (int)l->waiting_sequences : 0));
    json_object_object_add(o, "queued_prefill_tokens",
                           json_object_new_int64(l ? (int64_t)l->queued_prefill_tokens : 0));
    json_object_object_add(o, "free_blocks", json_object_new_int(l ? (int)l->free_blocks : 0));
    json_object_object_add(o, "total_blocks", json_object_new_int(l ? (int)l->total_blocks : 0));
    json_object_object_add(o, "kv_usage", json_object_new_double(kv_usage(l)));
    json_object_object_add(o, "in_flight", json_object_new_int((int)w->in_flight));
    json_object_object_add(o, "assigned", json_object_new_int64((int64_t)w->assigned));
    json_object_object_add(o, "heartbeat_age_s", json_object_new_double(w->last_heartbeat_age));
    json_object_object_add(o, "cache", tiers_json(l));
    return o;
}

static void print_json(json_object *o)
{
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
}

/* "pool=12 disk=3", or "-" before the worker's first heartbeat with cache figures. */
static void print_tiers(const Tandem__Load *l)
{
    if (!l || !l->n_cache) {
        printf("-");
        return;
    }
    for (size_t i = 0; i < l->n_cache; i++)
        printf("%s%s=%llu", i ? " " : "", l->cache[i]->tier,
               (unsigned long long)l->cache[i]->cached_blocks);
}

static int cmd_workers(ctl_t *c, bool json)
{
    Tandem__StatusResponse *st;
    int rc = td_client_status(c->cl, NULL, false, false, c->timeout, &st);
    if (rc)
        return rc;
    if (json) {
        json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "router", json_object_new_string(st->router_id));
        json_object_object_add(o, "model", json_object_new_string(st->model));
        for (size_t i = 0; i < st->n_workers; i++)
            json_object_array_add(a, worker_json(st->workers[i]));
        json_object_object_add(o, "workers", a);
        print_json(o);
    } else {
        printf("%-16s %-8s %-5s %-8s %7s %7s %10s %7s %9s  %s\n", "WORKER", "ROLE", "ALIVE",
               "DRAINING", "RUNNING", "WAITING", "QUEUED_TOK", "KV_USE%", "IN_FLIGHT",
               "CACHED_BLOCKS");
        for (size_t i = 0; i < st->n_workers; i++) {
            const Tandem__WorkerStatus *w = st->workers[i];
            const Tandem__Load *l = w->load;
            printf("%-16s %-8s %-5s %-8s %7u %7u %10llu %7.1f %9u  ", w->worker_id,
                   role_name(w->role), w->alive ? "yes" : "no", l && l->draining ? "yes" : "no",
                   l ? l->running_sequences : 0, l ? l->waiting_sequences : 0,
                   l ? (unsigned long long)l->queued_prefill_tokens : 0ULL, 100.0 * kv_usage(l),
                   w->in_flight);
            print_tiers(l);
            printf("\n");
        }
    }
    tandem__status_response__free_unpacked(st, NULL);
    return 0;
}

static int cmd_requests(ctl_t *c, bool json)
{
    Tandem__StatusResponse *st;
    int rc = td_client_status(c->cl, NULL, false, true, c->timeout, &st);
    if (rc)
        return rc;
    if (json) {
        json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object_object_add(o, "router", json_object_new_string(st->router_id));
        json_object_object_add(o, "running", json_object_new_int((int)st->running));
        json_object_object_add(o, "waiting", json_object_new_int((int)st->waiting));
        for (size_t i = 0; i < st->n_requests; i++) {
            const Tandem__RequestStatus *r = st->requests[i];
            json_object *q = json_object_new_object();
            json_object_object_add(q, "id", json_object_new_string(r->id));
            json_object_object_add(q, "index", json_object_new_int((int)r->index));
            json_object_object_add(q, "state", json_object_new_string(r->state));
            json_object_object_add(q, "decode_worker", json_object_new_string(r->decode_worker));
            json_object_object_add(q, "prefill_worker",
                                   json_object_new_string(r->prefill_worker));
            json_object_object_add(q, "age_s", json_object_new_double(r->age_s));
            json_object_object_add(q, "prompt_tokens", json_object_new_int((int)r->prompt_tokens));
            json_object_object_add(q, "generated_tokens",
                                   json_object_new_int64((int64_t)r->generated_tokens));
            json_object_object_add(q, "retries", json_object_new_int((int)r->retries));
            json_object_array_add(a, q);
        }
        json_object_object_add(o, "requests", a);
        print_json(o);
    } else {
        printf("router %s  running %u  waiting %u\n", st->router_id, st->running, st->waiting);
        printf("%-14s %5s %-10s %-16s %-16s %8s %7s %9s\n", "REQUEST", "INDEX", "STATE", "DECODE",
               "PREFILL", "AGE_S", "PROMPT", "GENERATED");
        for (size_t i = 0; i < st->n_requests; i++) {
            const Tandem__RequestStatus *r = st->requests[i];
            printf("%-14s %5u %-10s %-16s %-16s %8.2f %7u %9llu\n", r->id, r->index, r->state,
                   *r->decode_worker ? r->decode_worker : "-",
                   *r->prefill_worker ? r->prefill_worker : "-", r->age_s, r->prompt_tokens,
                   (unsigned long long)r->generated_tokens);
        }
    }
    tandem__status_response__free_unpacked(st, NULL);
    return 0;
}

static const char *const TIERS[] = {"pool", "disk"};
#define N_TIERS (sizeof(TIERS) / sizeof(TIERS[0]))

static int cmd_cache(ctl_t *c, bool json)
{
    Tandem__StatusResponse *st;
    int rc = td_client_status(c->cl, NULL, false, false, c->timeout, &st);
    if (rc)
        return rc;
    uint64_t tot[N_TIERS][3] = {{0}}; /* cached blocks, queries, hits */
    for (size_t i = 0; i < st->n_workers; i++)
        for (size_t k = 0; k < N_TIERS; k++) {
            const Tandem__CacheTier *t = tier_of(st->workers[i]->load, TIERS[k]);
            if (t) {
                tot[k][0] += t->cached_blocks;
                tot[k][1] += t->queries;
                tot[k][2] += t->hits;
            }
        }
    if (json) {
        json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object *total = json_object_new_object();
        for (size_t i = 0; i < st->n_workers; i++) {
            const Tandem__WorkerStatus *w = st->workers[i];
            json_object *x = json_object_new_object();
            json_object_object_add(x, "id", json_object_new_string(w->worker_id));
            json_object_object_add(x, "role", json_object_new_string(role_name(w->role)));
            json_object_object_add(x, "tiers", tiers_json(w->load));
            json_object_array_add(a, x);
        }
        for (size_t k = 0; k < N_TIERS; k++)
            json_object_object_add(total, TIERS[k], tier_json(tot[k][0], tot[k][1], tot[k][2]));
        json_object_object_add(o, "workers", a);
        json_object_object_add(o, "total", total);
        print_json(o);
    } else {
        printf("%-16s %-8s %-5s %13s %14s %14s %8s\n", "WORKER", "ROLE", "TIER", "CACHED_BLOCKS",
               "QUERY_TOKENS", "HIT_TOKENS", "HIT_RATE");
        for (size_t i = 0; i < st->n_workers; i++) {
            const Tandem__WorkerStatus *w = st->workers[i];
            for (size_t k = 0; w->load && k < w->load->n_cache; k++) {
                const Tandem__CacheTier *t = w->load->cache[k];
                printf("%-16s %-8s %-5s %13llu %14llu %14llu %7.1f%%\n", w->worker_id,
                       role_name(w->role), t->tier, (unsigned long long)t->cached_blocks,
                       (unsigned long long)t->queries, (unsigned long long)t->hits,
                       100.0 * hit_rate(t->hits, t->queries));
            }
        }
        for (size_t k = 0; k < N_TIERS; k++)
            printf("%-16s %-8s %-5s %13llu %14llu %14llu %7.1f%%\n", "(cluster)", "-", TIERS[k],
                   (unsigned long long)tot[k][0], (unsigned long long)tot[k][1],
                   (unsigned long long)tot[k][2], 100.0 * hit_rate(tot[k][2], tot[k][1]));
    }
    tandem__status_response__free_unpacked(st, NULL);
    return 0;
}

/* ---- generate -------------------------------------------------------------------------------- */

typedef struct gen_out {
    td_buf_t text;
    int32_t *ids;
    size_t n_ids, cap_ids;
    Tandem__Finish finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    bool stream; /* print text as it arrives */
} gen_out_t;

static int on_chunk(const Tandem__TokenChunk *ch, void *ud)
{
    gen_out_t *o = ud;
    if (o->n_ids + ch->n_tokens > o->cap_ids) {
        size_t cap = TD_MAX(o->cap_ids * 2, o->n_ids + ch->n_tokens + 16);
        int32_t *p = realloc(o->ids, cap * sizeof(int32_t));
        if (!p)
            return 1;
        o->ids = p;
        o->cap_ids = cap;
    }
    if (ch->n_tokens)
        memcpy(o->ids + o->n_ids, ch->tokens, ch->n_tokens * sizeof(int32_t));
    o->n_ids += ch->n_tokens;
    if (ch->text.len) {
        td_buf_append(&o->text, ch->text.data, ch->text.len);
        if (o->stream) {
            fwrite(ch->text.data, 1, ch->text.len, stdout);
            fflush(stdout);
        }
    }
    if (ch->finish != TANDEM__FINISH__FINISH_NONE) {
        o->finish = ch->finish;
        o->prompt_tokens = ch->prompt_tokens;
        o->completion_tokens = ch->completion_tokens;
        o->cached_tokens = ch->cached_tokens;
    }
    return 0;
}

static const char *finish_name(Tandem__Finish f)
{
    return f == TANDEM__FINISH__FINISH_STOP     ? "stop"
           : f == TANDEM__FINISH__FINISH_LENGTH ? "length"
           : f == TANDEM__FINISH__FINISH_ABORT  ? "abort"
                                                : "none";
}

/* One request to send: the sampling settings in the engine's form (smp, filled from flags or a
 * batch line), their proto form (sp, which points into smp) and the request around them. */
typedef struct gen_req {
    Tandem__GenerateRequest r;
    td_sampling_t smp;
    Tandem__Sampling sp;
    int32_t *prompt_ids;
    char *stop_store[16];
    int32_t bias_ids[16]; /* a batch line's logit_bias (smp points here) */
    float bias_values[16];
} gen_req_t;

/* An empty request: sampling defaults with 32 tokens, text wanted. */
static void gen_req_init(gen_req_t *g)
{
    memset(g, 0, sizeof(*g));
    tandem__generate_request__init(&g->r);
    td_sampling_defaults(&g->smp);
    g->smp.max_tokens = 32;
    g->r.want_text = true;
}

/* Point the request at its parts, with the sampling settings converted, once g no longer moves
 * and smp is final. */
static void gen_req_ready(gen_req_t *g)
{
    if (g->smp.n_logit_bias && !g->smp.logit_bias_ids) { /* a batch line's */
        g->smp.logit_bias_ids = g->bias_ids;
        g->smp.logit_bias_values = g->bias_values;
    }
    td_msg_sampling_to_proto(&g->smp, g->smp.seed, &g->sp);
    g->r.sampling = &g->sp;
    g->r.stop = g->stop_store;
}

static void gen_req_free(gen_req_t *g)
{
    free(g->prompt_ids);
}

/* generate's options into g (before anything is sent). 0, or TD_EINVAL naming the option. */
static int generate_parse(int argc, char **argv, gen_req_t *g, bool *print_ids)
{
    enum { O_PROMPT = 256, O_MSGS, O_IDS, O_STOP, O_PRINTIDS };
    static const struct option opts[] = {{"prompt", required_argument, 0, O_PROMPT},
                                         {"messages", required_argument, 0, O_MSGS},
                                         {"prompt-ids", required_argument, 0, O_IDS},
                                         TD_SAMPLING_FLAG_OPTIONS,
                                         {"stop", required_argument, 0, O_STOP},
                                         {"ids", no_argument, 0, O_PRINTIDS},
                                         {0, 0, 0, 0}};
    int ch, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case O_PROMPT:
            g->r.prompt = optarg;
            break;
        case O_MSGS:
            g->r.messages_json = optarg;
            break;
        case O_IDS:
            free(g->prompt_ids);
            g->prompt_ids = NULL;
            g->r.n_tokens = 0;
            rc = td_sampling_flags_parse_ids("--prompt-ids", optarg, false, &g->prompt_ids,
                                             &g->r.n_tokens);
            g->r.tokens = g->prompt_ids;
            break;
        case O_STOP:
            if (g->r.n_stop < TD_ARRAY_LEN(g->stop_store))
                g->stop_store[g->r.n_stop++] = optarg;
            else
                rc = td_err_set(TD_EINVAL, "generate: more than %zu --stop strings",
                                TD_ARRAY_LEN(g->stop_store));
            break;
        case O_PRINTIDS:
            *print_ids = true;
            break;
        default:
            if (td_sampling_flags_has(ch))
                rc = td_sampling_flags_apply(ch, optarg, &g->smp);
            else
                rc = td_err_set(TD_EINVAL, "generate: unknown or incomplete option \"%s\"",
                                argv[optind - 1]);
        }
    }
    if (!rc && !g->r.prompt && !g->r.messages_json && !g->r.n_tokens)
        rc = td_err_set(TD_EINVAL, "generate: give --prompt, --messages or --prompt-ids");
    return rc;
}

/* Stream the completion g (parsed by generate_parse) and print it. */
static int cmd_generate(ctl_t *c, gen_req_t *g, bool print_ids)
{
    gen_req_ready(g);
    gen_out_t o = {.stream = true};
    td_buf_init(&o.text);
    int rc = td_client_generate(c->cl, &g->r, on_chunk, &o, c->timeout);
    if (!rc) {
        printf("\n");
        if (print_ids) {
            printf("output ids:");
            for (size_t i = 0; i < o.n_ids; i++)
                printf("%s%d", i ? "," : " ", o.ids[i]);
            printf("\n");
        }
        printf("finish: %s  prompt_tokens: %u  completion_tokens: %u  cached_tokens: %u\n",
               finish_name(o.finish), o.prompt_tokens, o.completion_tokens, o.cached_tokens);
    }
    td_buf_free(&o.text);
    free(o.ids);
    return rc;
}

/* ---- batch ----------------------------------------------------------------------------------- */

typedef struct batch_item {
    gen_req_t g;
    gen_out_t o;
    json_object *line; /* owns the strings g points into */
} batch_item_t;

static int parse_line(json_object *j, batch_item_t *b, size_t lineno)
{
    gen_req_t *g = &b->g;
    json_object *v;
    if (!json_object_is_type(j, json_type_object))
        return td_err_set(TD_EINVAL, "line %zu: not a JSON object", lineno);
    if (json_object_object_get_ex(j, "prompt", &v))
        g->r.prompt = (char *)json_object_get_string(v);
    if (json_object_object_get_ex(j, "messages", &v))
        g->r.messages_json = (char *)json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    if (json_object_object_get_ex(j, "prompt_ids", &v)) {
        if (!json_object_is_type(v, json_type_array))
            return td_err_set(TD_EINVAL, "line %zu: prompt_ids: not an array", lineno);
        size_t n = json_object_array_length(v);
        g->prompt_ids = td_calloc(TD_MAX(n, 1), sizeof(int32_t));
        if (!g->prompt_ids)
            return TD_ENOMEM;
        for (size_t i = 0; i < n; i++)
            g->prompt_ids[i] = json_object_get_int(json_object_array_get_idx(v, i));
        g->r.tokens = g->prompt_ids;
        g->r.n_tokens = n;
    }
    if (json_object_object_get_ex(j, "max_tokens", &v))
        g->smp.max_tokens = json_object_get_int(v);
    if (json_object_object_get_ex(j, "temperature", &v))
        g->smp.temperature = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "top_k", &v))
        g->smp.top_k = json_object_get_int(v);
    if (json_object_object_get_ex(j, "top_p", &v))
        g->smp.top_p = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "min_p", &v))
        g->smp.min_p = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "seed", &v))
        g->smp.seed = (uint64_t)json_object_get_int64(v);
    if (json_object_object_get_ex(j, "ignore_eos", &v))
        g->smp.ignore_eos = json_object_get_boolean(v);
    if (json_object_object_get_ex(j, "presence_penalty", &v))
        g->smp.presence_penalty = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "frequency_penalty", &v))
        g->smp.frequency_penalty = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "repetition_penalty", &v))
        g->smp.repetition_penalty = (float)json_object_get_double(v);
    if (json_object_object_get_ex(j, "min_tokens", &v))
        g->smp.min_tokens = json_object_get_int(v);
    if (json_object_object_get_ex(j, "logit_bias", &v) && json_object_is_type(v, json_type_object)) {
        json_object_object_foreach(v, key, val)
        {
            if (g->smp.n_logit_bias == 16)
                return td_err_set(TD_EINVAL, "line %zu: logit_bias: at most 16 entries", lineno);
            g->bias_ids[g->smp.n_logit_bias] = atoi(key);
            g->bias_values[g->smp.n_logit_bias++] = (float)json_object_get_double(val);
        }
    }
    if (json_object_object_get_ex(j, "tenant", &v)) {
        g->r.tenant.data = (uint8_t *)json_object_get_string(v);
        g->r.tenant.len = (size_t)json_object_get_string_len(v);
    }
    if (json_object_object_get_ex(j, "stop", &v) && json_object_is_type(v, json_type_array))
        for (size_t i = 0; i < json_object_array_length(v) && g->r.n_stop < 16; i++)
            g->stop_store[g->r.n_stop++] =
                (char *)json_object_get_string(json_object_array_get_idx(v, i));
    if (!g->r.prompt && !g->r.messages_json && !g->r.n_tokens)
        return td_err_set(TD_EINVAL, "line %zu: no prompt, prompt_ids or messages", lineno);
    return 0;
}

static int cmd_batch(ctl_t *c, const char *path)
{
    char *data;
    size_t len;
    int rc = td_file_read_all(path, &data, &len);
    if (rc)
        return td_err_set(rc, "%s: %s", path, td_err_msg());
    size_t n = 0, cap = 64;
    batch_item_t *items = td_calloc(cap, sizeof(*items));
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line && !rc;
         line = strtok_r(NULL, "\n", &save)) {
        if (!*line)
            continue;
        if (n == cap) {
            batch_item_t *p = td_reallocarray(items, cap * 2, sizeof(*items));
            if (!p) {
                rc = TD_ENOMEM;
                break;
            }
            items = p;
            memset(items + cap, 0, cap * sizeof(*items));
            cap *= 2;
        }
        batch_item_t *b = &items[n];
        gen_req_init(&b->g);
        td_buf_init(&b->o.text);
        b->line = json_tokener_parse(line);
        n++;
        rc = b->line ? parse_line(b->line, b, n)
                     : td_err_set(TD_EPARSE, "%s: line %zu is not JSON", path, n);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        /* the array may have moved while it grew: point each request at its own parts now */
        gen_req_ready(&items[i].g);
        items[i].g.r.request_id = i + 1;
        rc = td_client_generate_start(c->cl, &items[i].g.r, on_chunk, &items[i].o);
    }
    if (!rc) {
        td_client_wait(c->cl, c->timeout);
        for (size_t i = 0; i < n; i++) {
            const char *msg;
            int st = td_client_result(c->cl, i + 1, &msg);
            json_object *o = json_object_new_object();
            json_object *ids = json_object_new_array();
            for (size_t k = 0; k < items[i].o.n_ids; k++)
                json_object_array_add(ids, json_object_new_int(items[i].o.ids[k]));
            json_object_object_add(o, "index", json_object_new_int((int)i));
            json_object_object_add(o, "ids", ids);
            json_object_object_add(
                o, "text",
                json_object_new_string_len(items[i].o.text.data ? items[i].o.text.data : "",
                                           (int)items[i].o.text.len));
            json_object_object_add(o, "finish",
                                   json_object_new_string(finish_name(items[i].o.finish)));
            json_object_object_add(o, "prompt_tokens",
                                   json_object_new_int((int)items[i].o.prompt_tokens));
            json_object_object_add(o, "cached_tokens",
                                   json_object_new_int((int)items[i].o.cached_tokens));
            json_object_object_add(o, "error", st ? json_object_new_string(msg) : NULL);
            printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
            json_object_put(o);
        }
    }
    for (size_t i = 0; i < n; i++) {
        gen_req_free(&items[i].g);
        td_buf_free(&items[i].o.text);
        free(items[i].o.ids);
        json_object_put(items[i].line);
    }
    free(items);
    free(data);
    return rc;
}

/* ---- tokenize -------------------------------------------------------------------------------- */

static int cmd_tokenize(ctl_t *c, const char *text)
{
    Tandem__TokenizeResponse *r;
    int rc = td_client_tokenize(c->cl, text, true, NULL, 0, c->timeout, &r);
    if (rc)
        return rc;
    for (size_t i = 0; i < r->n_ids; i++)
        printf("%s%d", i ? "," : "", r->ids[i]);
    printf("\n");
    tandem__tokenize_response__free_unpacked(r, NULL);
    return 0;
}

int td_cmd_ctl(int argc, char **argv)
{
    ctl_t c = {.router = "127.0.0.1:8100", .timeout = 600};
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc)
            break;
        if (!strcmp(argv[i], "--router"))
            c.router = argv[++i];
        else if (!strcmp(argv[i], "--secret-file"))
            c.secret_file = argv[++i];
        else if (!strcmp(argv[i], "--timeout"))
            c.timeout = atof(argv[++i]);
        else
            break;
    }
    if (i >= argc || !strncmp(argv[i], "--", 2)) {
        fprintf(stderr, "tandem ctl: %s\n\n", i < argc ? "unknown option" : "no command");
        usage(stderr);
        return 2;
    }
    /* the command and its arguments are checked before anything connects */
    enum { C_STATUS, C_WORKERS, C_REQUESTS, C_CACHE, C_DRAIN, C_UNDRAIN, C_TOKENIZE, C_GENERATE,
           C_BATCH, C_BAD };
    const char *cmd = argv[i];
    int nargs = argc - i;
    char **args = argv + i;
    bool json = nargs == 2 && !strcmp(args[1], "--json");
    int which = C_BAD;
    if (!strcmp(cmd, "status") && nargs == 1)
        which = C_STATUS;
    else if (!strcmp(cmd, "workers") && (nargs == 1 || json))
        which = C_WORKERS;
    else if (!strcmp(cmd, "requests") && (nargs == 1 || json))
        which = C_REQUESTS;
    else if (!strcmp(cmd, "cache") && (nargs == 1 || json))
        which = C_CACHE;
    else if (!strcmp(cmd, "drain") && nargs == 2)
        which = C_DRAIN;
    else if (!strcmp(cmd, "undrain") && nargs == 2)
        which = C_UNDRAIN;
    else if (!strcmp(cmd, "tokenize") && nargs == 2)
        which = C_TOKENIZE;
    else if (!strcmp(cmd, "generate"))
        which = C_GENERATE;
    else if (!strcmp(cmd, "batch") && nargs == 2)
        which = C_BATCH;
    if (which == C_BAD) {
        fprintf(stderr, "tandem ctl: unknown command or wrong arguments: %s\n\n", cmd);
        usage(stderr);
        return 2;
    }
    gen_req_t g;
    gen_req_init(&g);
    bool print_ids = false;
    int rc = which == C_GENERATE ? generate_parse(nargs, args, &g, &print_ids) : 0;
    uint8_t *secret;
    size_t slen;
    if (!rc && !(rc = td_rpc_secret_load(getenv("TANDEM_CLUSTER_SECRET"), c.secret_file, &secret,
                                         &slen))) {
        rc = td_client_open(c.router, secret, slen, "tandem-ctl", TD_MIN(c.timeout, 10.0), &c.cl);
        free(secret);
    }
    if (!rc) {
        switch (which) {
        case C_STATUS:
            rc = cmd_status(&c, NULL, false);
            break;
        case C_WORKERS:
            rc = cmd_workers(&c, json);
            break;
        case C_REQUESTS:
            rc = cmd_requests(&c, json);
            break;
        case C_CACHE:
            rc = cmd_cache(&c, json);
            break;
        case C_DRAIN:
        case C_UNDRAIN:
            rc = cmd_status(&c, args[1], which == C_UNDRAIN);
            break;
        case C_TOKENIZE:
            rc = cmd_tokenize(&c, args[1]);
            break;
        case C_GENERATE:
            rc = cmd_generate(&c, &g, print_ids);
            break;
        default:
            rc = cmd_batch(&c, args[1]);
        }
    }
    gen_req_free(&g);
    td_client_close(c.cl);
    if (rc) {
        fprintf(stderr, "tandem ctl: %s\n", td_err_msg());
        return 1;
    }
    return 0;
}

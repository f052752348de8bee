/* placement.c: round robin, least loaded, power-of-two-choices and kv_aware (predicted time to
 * first token, cache affinity with an imbalance guard) over heartbeat load. */
#include "placement.h"
#include "td_error.h"
#include "td_util.h"

#include <string.h>

int td_place_policy_parse(const char *s, td_place_policy_t *out)
{
    if (strcmp(s, "round_robin") == 0)
        *out = TD_PLACE_ROUND_ROBIN;
    else if (strcmp(s, "least_loaded") == 0)
        *out = TD_PLACE_LEAST_LOADED;
    else if (strcmp(s, "p2c") == 0 || strcmp(s, "power_of_two") == 0)
        *out = TD_PLACE_P2C;
    else if (strcmp(s, "kv_aware") == 0)
        *out = TD_PLACE_KV_AWARE;
    else
        return td_err_set(TD_EINVAL,
                          "unknown placement policy \"%s\" (kv_aware, round_robin, least_loaded, "
                          "p2c)",
                          s);
    return 0;
}

const char *td_place_policy_name(td_place_policy_t p)
{
    switch (p) {
    case TD_PLACE_ROUND_ROBIN: return "round_robin";
    case TD_PLACE_LEAST_LOADED: return "least_loaded";
    case TD_PLACE_KV_AWARE: return "kv_aware";
    default: return "p2c";
    }
}

void td_placer_init(td_placer_t *p, td_place_policy_t policy, const td_place_limits_t *limits,
                    uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->policy = policy;
    if (limits)
        p->limits = *limits;
    p->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    p->kv = (td_place_kv_t){.s_per_token = 50e-6, .seq_s = 2e-3, .imbalance = 1.5};
}

void td_placer_set_kv(td_placer_t *p, const td_place_kv_t *kv)
{
    p->kv = *kv;
    if (!(p->kv.s_per_token > 0))
        p->kv.s_per_token = 50e-6;
    if (p->kv.seq_s < 0)
        p->kv.seq_s = 0;
    if (p->kv.imbalance < 1)
        p->kv.imbalance = 1;
}

void td_place_heartbeat(td_place_load_t *l, uint64_t queued_prefill_tokens, uint32_t running,
                        uint32_t free_blocks, uint32_t total_blocks, bool draining)
{
    l->queued_prefill_tokens = queued_prefill_tokens;
    l->running = running;
    l->free_blocks = free_blocks;
    l->total_blocks = total_blocks;
    l->draining = draining;
    l->pending_tokens = 0;
    l->pending_seqs = 0;
    l->pending_blocks = 0;
}

void td_place_prefill_done(td_place_load_t *l, uint64_t tokens, bool since_hb)
{
    uint64_t *q = since_hb ? &l->pending_tokens : &l->queued_prefill_tokens;
    *q -= TD_MIN(*q, tokens);
}

void td_place_seq_done(td_place_load_t *l, bool since_hb)
{
    uint32_t *n = since_hb ? &l->pending_seqs : &l->running;
    if (*n > 0)
        (*n)--;
}

static uint64_t next_rand(td_placer_t *p)
{
    uint64_t x = p->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    p->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

typedef enum { PREFILL, DECODE } kind_t;

/* One choice: what the worker must have room for (`need`: prefill tokens or decode blocks) and,
 * for kv_aware, the prompt's length and the remote prefill estimate (decode). */
typedef struct req {
    kind_t k;
    uint64_t need;
    uint64_t tokens;
    double remote_s;
} req_t;

static bool eligible(const td_placer_t *p, const td_place_load_t *l, kind_t k, uint64_t need)
{
    if (!l->alive || l->draining)
        return false;
    if (k == PREFILL) {
        uint64_t q = l->queued_prefill_tokens + l->pending_tokens;
        /* an idle worker always takes a request, however long: the mark bounds queues */
        return !p->limits.max_queued_tokens || q == 0 || q + need <= p->limits.max_queued_tokens;
    }
    uint64_t free = l->free_blocks > l->pending_blocks ? l->free_blocks - l->pending_blocks : 0;
    if (need > free)
        return false;
    if (p->limits.max_running && l->running + l->pending_seqs >= p->limits.max_running)
        return false;
    if (p->limits.max_kv_usage > 0 && l->total_blocks) {
        double used = (double)(l->total_blocks - free + need) / l->total_blocks;
        if (used > p->limits.max_kv_usage)
            return false;
    }
    return true;
}

static double score(const td_place_load_t *l, kind_t k)
{
    if (k == PREFILL)
        return (double)(l->queued_prefill_tokens + l->pending_tokens);
    double usage = 0;
    if (l->total_blocks) {
        uint64_t free = l->free_blocks > l->pending_blocks ? l->free_blocks - l->pending_blocks : 0;
        usage = (double)(l->total_blocks - free) / l->total_blocks;
    }
    return (double)(l->running + l->pending_seqs) + usage;
}

/* ---- kv_aware ---- */

static double cost_per_token(const td_placer_t *p, const td_place_load_t *l)
{
    return l->s_per_token > 0 ? l->s_per_token : p->kv.s_per_token;
}

/* What the worker has to do before this request's prefill could start, in seconds. */
static double kv_load(const td_placer_t *p, const td_place_load_t *l, kind_t k)
{
    double t = (double)(l->queued_prefill_tokens + l->pending_tokens) * cost_per_token(p, l);
    return k == PREFILL ? t : t + score(l, DECODE) * p->kv.seq_s;
}

/* What loading one cached token from below the pool (disk) costs this worker, in seconds. */
static double slow_cost_per_token(const td_placer_t *p, const td_place_load_t *l)
{
    double compute = cost_per_token(p, l);
    return l->slow_s_per_token > 0 ? TD_MIN(l->slow_s_per_token, compute) : 0.5 * compute;
}

/* What fetching one token's KV from another worker costs this one, in seconds (the hint is only
 * sent when it is quicker than computing; half the compute cost until measured, as for disk). */
static double fetch_cost_per_token(const td_placer_t *p, const td_place_load_t *l)
{
    double compute = cost_per_token(p, l);
    return l->fetch_s_per_token > 0 ? TD_MIN(l->fetch_s_per_token, compute) : 0.5 * compute;
}

/* Tokens of a request the worker would compute; *cached: those it holds, *fetch: those it would
 * fetch (none credited to a `hot` worker). */
static uint64_t kv_computed(const td_place_load_t *l, uint64_t tokens, bool hot, uint64_t *cached,
                            uint64_t *fetch)
{
    *cached = hot ? 0 : TD_MIN(l->cached_tokens, tokens);
    *fetch = hot ? 0 : TD_MIN(l->fetch_tokens, tokens - *cached);
    return tokens - *cached - *fetch;
}

/* The request's own prefill on this worker, in seconds; a `hot` worker gets no cache credit. */
static double kv_own(const td_placer_t *p, const td_place_load_t *l, const req_t *rq, bool hot)
{
    if (rq->k == DECODE && !l->local)
        return rq->remote_s;
    uint64_t cached, fetch, computed = kv_computed(l, rq->tokens, hot, &cached, &fetch);
    uint64_t slow = TD_MIN(l->cached_slow_tokens, cached);
    return (double)computed * cost_per_token(p, l) + (double)slow * slow_cost_per_token(p, l) +
           (double)fetch * fetch_cost_per_token(p, l);
}

/* Sequences a decode worker runs or was just given. */
static uint64_t seqs_of(const td_place_load_t *l)
{
    return (uint64_t)l->running + l->pending_seqs;
}

static int pick_kv(td_placer_t *p, td_place_load_t *loads, size_t n, const req_t *rq, size_t n_ok)
{
    kind_t k = rq->k;
    double mean = 0;
    uint64_t seqs = 0;
    for (size_t i = 0; i < n; i++)
        if (eligible(p, &loads[i], k, rq->need)) {
            mean += kv_load(p, &loads[i], k);
            seqs += seqs_of(&loads[i]);
        }
    mean /= (double)n_ok;
    double bar = p->kv.imbalance * mean + p->kv.seq_s;
    /* decode: the share of sequences a worker would have with this one */
    double seq_bar = TD_MAX(p->kv.imbalance * (double)(seqs + 1) / (double)n_ok, 2.0);
    int best = -1;
    bool best_crowded = false;
    double best_s = 0;
    /* the scan rotates as least_loaded's does, so equal predictions take turns */
    for (size_t step = 0; step < n; step++) {
        size_t i = (size_t)((p->rr_next[k] + step) % n);
        if (!eligible(p, &loads[i], k, rq->need))
            continue;
        double load = kv_load(p, &loads[i], k);
        bool crowded = k == DECODE && (double)(seqs_of(&loads[i]) + 1) > seq_bar;
        double t = load + kv_own(p, &loads[i], rq, crowded || load > bar);
        if (best < 0 || (best_crowded && !crowded) || (crowded == best_crowded && t < best_s)) {
            best = (int)i;
            best_s = t;
            best_crowded = crowded;
        }
    }
    p->rr_next[k] = (uint64_t)best + 1;
    return best;
}

double td_place_prefill_ttft(const td_placer_t *p, const td_place_load_t *l, uint64_t tokens)
{
    req_t rq = {PREFILL, tokens, tokens, 0};
    return kv_load(p, l, PREFILL) + kv_own(p, l, &rq, false);
}

static int pick(td_placer_t *p, td_place_load_t *loads, size_t n, const req_t *rq)
{
    kind_t k = rq->k;
    uint64_t need = rq->need;
    size_t n_ok = 0;
    for (size_t i = 0; i < n; i++)
        n_ok += eligible(p, &loads[i], k, need);
    if (n_ok == 0)
        return -1;
    int best = -1;
    switch (p->policy) {
    case TD_PLACE_ROUND_ROBIN:
        for (size_t step = 0; step < n && best < 0; step++) {
            size_t i = (size_t)((p->rr_next[k] + step) % n);
            if (eligible(p, &loads[i], k, need)) {
                best = (int)i;
                p->rr_next[k] = i + 1;
            }
        }
        break;
    case TD_PLACE_LEAST_LOADED:
        /* the scan starts where the last choice left off, so ties (idle workers, say) take
         * turns instead of the lowest index getting every request */
        for (size_t step = 0; step < n; step++) {
            size_t i = (size_t)((p->rr_next[k] + step) % n);
            if (eligible(p, &loads[i], k, need) &&
                (best < 0 || score(&loads[i], k) < score(&loads[best], k)))
                best = (int)i;
        }
        p->rr_next[k] = (uint64_t)best + 1;
        break;
    case TD_PLACE_P2C: {
        /* draw two distinct eligible workers (the n-th eligible by rank) */
        size_t a = (size_t)(next_rand(p) % n_ok), b = a;
        if (n_ok > 1) {
            b = (size_t)(next_rand(p) % (n_ok - 1));
            if (b >= a)
                b++;
        }
        int ia = -1, ib = -1;
        for (size_t i = 0, rank = 0; i < n; i++) {
            if (!eligible(p, &loads[i], k, need))
                continue;
            if (rank == a)
                ia = (int)i;
            if (rank == b)
                ib = (int)i;
            rank++;
        }
        best = score(&loads[ib], k) < score(&loads[ia], k) ? ib : ia;
        break;
    }
    case TD_PLACE_KV_AWARE:
        best = pick_kv(p, loads, n, rq, n_ok);
        break;
    }
    return best;
}

int td_place_prefill(td_placer_t *p, td_place_load_t *loads, size_t n, uint64_t tokens)
{
    req_t rq = {PREFILL, tokens, tokens, 0};
    int i = pick(p, loads, n, &rq);
    uint64_t cached, fetch;
    if (i >= 0)
        loads[i].pending_tokens += kv_computed(&loads[i], tokens, false, &cached, &fetch);
    return i;
}

int td_place_decode_prompt(td_placer_t *p, td_place_load_t *loads, size_t n, uint32_t blocks,
                           uint64_t tokens, double remote_s)
{
    req_t rq = {DECODE, blocks, tokens, remote_s};
    int i = pick(p, loads, n, &rq);
    if (i >= 0) {
        loads[i].pending_seqs++;
        loads[i].pending_blocks += blocks;
        uint64_t cached, fetch;
        if (loads[i].local)
            loads[i].pending_tokens += kv_computed(&loads[i], tokens, false, &cached, &fetch);
    }
    return i;
}

int td_place_decode(td_placer_t *p, td_place_load_t *loads, size_t n, uint32_t blocks)
{
    return td_place_decode_prompt(p, loads, n, blocks, 0, 0);
}

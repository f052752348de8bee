/* placement.h: choosing a worker for a request from the workers' reported load.
 *
 * Policies: round_robin (in turn among eligible workers), least_loaded (the lowest score),
 * power-of-two-choices (two eligible workers drawn at random, the lower score wins: near
 * least_loaded's balance without herding every router onto one worker between heartbeats), and
 * kv_aware (the default: the lowest predicted time to first token, which counts what the worker
 * already holds of the prompt in its prefix cache, from the cluster KV index).
 * A worker past its high-water mark, draining, or not alive is never chosen, whatever the policy.
 *
 * Scores: a prefill worker's is the prefill tokens it has queued plus the request's uncached
 * tokens; a decode worker's is its running sequences plus the share of its KV blocks in use.
 * Each choice also adds the request to the worker's local estimate at once, so a burst between
 * two heartbeats spreads out instead of landing on the worker that looked idlest.
 *
 * kv_aware, in seconds: a worker's load is its queued prefill tokens x its prefill cost per token
 * (plus, for a decode worker, (running + pending sequences + KV share in use) x seq_s, the batch
 * and KV pressure of least_loaded in time units); the request adds (prompt tokens - the cached
 * ones it holds) x cost, or for a decode worker that will not prefill the prompt itself the
 * caller's estimate of the remote prefill. The guard: a worker whose load exceeds imbalance x
 * the candidates' mean load (plus one seq_s of slack, so a single request in flight does not
 * count as imbalance) is scored as if it held nothing, so a hot prefix cannot pile everything
 * onto its holder. A decode worker is also guarded by its sequences (running plus just placed):
 * one that would pass imbalance x the candidates' mean with this request (and run more than 2)
 * is crowded: it gets no cache credit and is chosen only when every candidate is crowded. The
 * time estimate alone would not bound them, since a holder's cached requests look cheap to it
 * while each still takes a batch slot and KV; with the guard no decode worker runs more than
 * imbalance x the mean of them (bench: the hotprefix cluster scenario).
 * Without an index every cached count is 0 and the order is least_loaded's.
 * Cached tokens the worker holds only on disk cost their load: its measured seconds per token
 * loaded, at most its prefill cost (a worker loads only what is cheaper than computing), and
 * half the prefill cost until measured; a pool hit costs nothing.
 */
#ifndef TD_ROUTER_PLACEMENT_H
#define TD_ROUTER_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum td_place_policy {
    TD_PLACE_ROUND_ROBIN,
    TD_PLACE_LEAST_LOADED,
    TD_PLACE_P2C,
    TD_PLACE_KV_AWARE,
} td_place_policy_t;

/* Parse "round_robin", "least_loaded", "p2c" (also "power_of_two"), "kv_aware". 0 or
 * TD_EINVAL. */
int td_place_policy_parse(const char *s, td_place_policy_t *out);
const char *td_place_policy_name(td_place_policy_t p);

/* What the router knows of one worker's load: the last heartbeat plus what the router has sent it
 * since (pending_*), which the next heartbeat supersedes. */
typedef struct td_place_load {
    bool alive;
    bool draining;
    uint64_t queued_prefill_tokens; /* prefill: tokens waiting to be prefilled */
    uint32_t running;               /* decode: sequences in the running batch */
    uint32_t free_blocks;           /* decode: KV blocks free */
    uint32_t total_blocks;          /* decode: KV blocks in the pool */
    uint64_t pending_tokens;        /* prefill tokens sent since the last heartbeat */
    uint32_t pending_seqs;          /* sequences sent since the last heartbeat */
    uint32_t pending_blocks;        /* KV blocks those sequences will need */
    /* kv_aware only; the caller fills these for each request */
    uint64_t cached_tokens; /* prompt tokens of this request the worker holds (cluster index) */
    uint64_t cached_slow_tokens; /* of those, the ones below its pool (disk): loaded, not free */
    double s_per_token;     /* the worker's measured prefill seconds per token (0: the default) */
    double slow_s_per_token; /* its measured seconds to load such a token (0: unmeasured) */
    /* of the tokens it lacks, those it would fetch from another worker when it prefills (the
     * fetch hint's rule, fetchhint.c), and its measured seconds to fetch one (0: unmeasured) */
    uint64_t fetch_tokens;
    double fetch_s_per_token;
    bool local;             /* decode: the worker would prefill this request itself */
} td_place_load_t;

/* High-water marks: past any of them a worker gets nothing new. 0 disables a mark. */
typedef struct td_place_limits {
    uint64_t max_queued_tokens; /* prefill */
    uint32_t max_running;       /* decode */
    double max_kv_usage;        /* decode: fraction of blocks in use, (0, 1] */
} td_place_limits_t;

/* kv_aware's cost model. */
typedef struct td_place_kv {
    double s_per_token; /* prefill seconds per uncached token before a worker's own is measured */
    double seq_s;       /* decode: what one running sequence adds to a local prefill's wait, s */
    double imbalance;   /* the guard: load above this x the mean loses cache affinity (>= 1) */
} td_place_kv_t;

typedef struct td_placer {
    td_place_policy_t policy;
    td_place_limits_t limits;
    td_place_kv_t kv;
    uint64_t rr_next[2]; /* where the next scan starts, prefill [0] and decode [1]: round robin's
                            cursor, and least_loaded's among equal scores */
    uint64_t rng;      /* xorshift state for p2c (seeded; deterministic in tests) */
} td_placer_t;

void td_placer_init(td_placer_t *p, td_place_policy_t policy, const td_place_limits_t *limits,
                    uint64_t seed);
/* Set kv_aware's cost model (td_placer_init sets 50 us per token, 2 ms per sequence, 1.5). */
void td_placer_set_kv(td_placer_t *p, const td_place_kv_t *kv);

/* Pick a prefill worker for a request with `tokens` uncached prompt tokens among loads[0..n).
 * Returns the index, or -1 when none is eligible. The chosen worker's pending load grows. */
int td_place_prefill(td_placer_t *p, td_place_load_t *loads, size_t n, uint64_t tokens);
/* Pick a decode worker for a sequence that needs `blocks` KV blocks. -1 when none fits. */
int td_place_decode(td_placer_t *p, td_place_load_t *loads, size_t n, uint32_t blocks);
/* td_place_decode for a prompt of `tokens` tokens: kv_aware weighs each worker's cached share
 * of it (loads[i].cached_tokens, .local) against `remote_s`, the predicted prefill time on a
 * prefill worker for candidates that will not prefill it themselves. A chosen worker that
 * prefills locally also gets the uncached tokens added to its pending prefill load. */
int td_place_decode_prompt(td_placer_t *p, td_place_load_t *loads, size_t n, uint32_t blocks,
                           uint64_t tokens, double remote_s);
/* kv_aware's predicted time to first token on a prefill worker (load plus the request). */
double td_place_prefill_ttft(const td_placer_t *p, const td_place_load_t *l, uint64_t tokens);

/* The router saw work end that the worker's load still counts until its next heartbeat (which
 * supersedes this): a prefill of `tokens` tokens computed (its first token or PrefillDone), or a
 * sequence finished. `since_hb`: it was placed after the last heartbeat, so it is counted in the
 * pending estimate, else in the reported figures. Without this a worker that just finished a
 * request looks busy for up to a heartbeat, and kv_aware would send the next turn elsewhere. */
void td_place_prefill_done(td_place_load_t *l, uint64_t tokens, bool since_hb);
void td_place_seq_done(td_place_load_t *l, bool since_hb);

/* A heartbeat arrived: replace the reported figures and forget the pending estimate. */
void td_place_heartbeat(td_place_load_t *l, uint64_t queued_prefill_tokens, uint32_t running,
                        uint32_t free_blocks, uint32_t total_blocks, bool draining);

#endif

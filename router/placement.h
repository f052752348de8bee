/* placement.h: choosing a worker for a request from the workers' reported load.
 *
 * Policies: round_robin (in turn among eligible workers), least_loaded (the lowest score), and
 * power-of-two-choices (two eligible workers drawn at random, the lower score wins: near
 * least_loaded's balance without herding every router onto one worker between heartbeats).
 * A worker past its high-water mark, draining, or not alive is never chosen, whatever the policy.
 *
 * Scores: a prefill worker's is the prefill tokens it has queued plus the request's uncached
 * tokens; a decode worker's is its running sequences plus the share of its KV blocks in use.
 * Each choice also adds the request to the worker's local estimate at once, so a burst between
 * two heartbeats spreads out instead of landing on the worker that looked idlest.
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
} td_place_policy_t;

/* Parse "round_robin", "least_loaded", "p2c" (also "power_of_two"). 0 or TD_EINVAL. */
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
} td_place_load_t;

/* High-water marks: past any of them a worker gets nothing new. 0 disables a mark. */
typedef struct td_place_limits {
    uint64_t max_queued_tokens; /* prefill */
    uint32_t max_running;       /* decode */
    double max_kv_usage;        /* decode: fraction of blocks in use, (0, 1] */
} td_place_limits_t;

typedef struct td_placer {
    td_place_policy_t policy;
    td_place_limits_t limits;
    uint64_t rr_next[2]; /* where the next scan starts, prefill [0] and decode [1]: round robin's
                            cursor, and least_loaded's among equal scores */
    uint64_t rng;      /* xorshift state for p2c (seeded; deterministic in tests) */
} td_placer_t;

void td_placer_init(td_placer_t *p, td_place_policy_t policy, const td_place_limits_t *limits,
                    uint64_t seed);

/* Pick a prefill worker for a request with `tokens` uncached prompt tokens among loads[0..n).
 * Returns the index, or -1 when none is eligible. The chosen worker's pending load grows. */
int td_place_prefill(td_placer_t *p, td_place_load_t *loads, size_t n, uint64_t tokens);
/* Pick a decode worker for a sequence that needs `blocks` KV blocks. -1 when none fits. */
int td_place_decode(td_placer_t *p, td_place_load_t *loads, size_t n, uint32_t blocks);

/* A heartbeat arrived: replace the reported figures and forget the pending estimate. */
void td_place_heartbeat(td_place_load_t *l, uint64_t queued_prefill_tokens, uint32_t running,
                        uint32_t free_blocks, uint32_t total_blocks, bool draining);

#endif

/* ratelimit.h: token buckets for the per-key limits of the HTTP API (requests and tokens per
 * window, auth.c). A bucket holds up to `cap` units and refills continuously at cap / window_s
 * units per second, so a key may burst to its whole limit and then runs at the average rate.
 *
 * Plain data, no allocation; times are td_now_s() seconds passed in by the caller (tests use
 * their own clock). Loop thread only.
 */
#ifndef TD_ROUTER_RATELIMIT_H
#define TD_ROUTER_RATELIMIT_H

#include <stdbool.h>

typedef struct td_bucket {
    double cap;   /* units when full: the limit per window */
    double rate;  /* refill, units per second (cap / window_s) */
    double level; /* units available at time t; may be negative after a correction */
    double t;     /* seconds (caller's clock) of the last refill */
} td_bucket_t;

/* A full bucket of `cap` units refilling over `window_s` seconds (> 0). */
void td_bucket_init(td_bucket_t *b, double cap, double window_s, double now);
/* Change the limit, keeping the units used so far (a reload that raises a limit adds the
 * difference at once; one that lowers it may leave the bucket empty). */
void td_bucket_set_limit(td_bucket_t *b, double cap, double window_s, double now);
/* Take n units if that many are available now: true (taken) or false (nothing changes). */
bool td_bucket_take(td_bucket_t *b, double n, double now);
/* Give back n units (negative n takes them regardless, the level may go below zero); never
 * beyond cap. Used to correct a reservation once the real cost is known. */
void td_bucket_give(td_bucket_t *b, double n, double now);
/* Units available now (after refill), at least 0. */
double td_bucket_available(td_bucket_t *b, double now);
/* Seconds until n units are available (0 when they are now; a negative value when n exceeds the
 * capacity and never can be). */
double td_bucket_wait_s(td_bucket_t *b, double n, double now);
/* Seconds until the bucket is full again (OpenAI's x-ratelimit-reset-*). */
double td_bucket_reset_s(td_bucket_t *b, double now);

#endif

/* ratelimit.c: token buckets (see ratelimit.h). */
#include "ratelimit.h"

static void refill(td_bucket_t *b, double now)
{
    if (now > b->t) {
        b->level += (now - b->t) * b->rate;
        if (b->level > b->cap)
            b->level = b->cap;
        b->t = now;
    }
}

void td_bucket_init(td_bucket_t *b, double cap, double window_s, double now)
{
    b->cap = cap;
    b->rate = window_s > 0 ? cap / window_s : cap;
    b->level = cap;
    b->t = now;
}

void td_bucket_set_limit(td_bucket_t *b, double cap, double window_s, double now)
{
    refill(b, now);
    double used = b->cap - b->level;
    b->cap = cap;
    b->rate = window_s > 0 ? cap / window_s : cap;
    b->level = cap - used;
}

bool td_bucket_take(td_bucket_t *b, double n, double now)
{
    refill(b, now);
    if (b->level < n)
        return false;
    b->level -= n;
    return true;
}

void td_bucket_give(td_bucket_t *b, double n, double now)
{
    refill(b, now);
    b->level += n;
    if (b->level > b->cap)
        b->level = b->cap;
}

double td_bucket_available(td_bucket_t *b, double now)
{
    refill(b, now);
    return b->level > 0 ? b->level : 0;
}

double td_bucket_wait_s(td_bucket_t *b, double n, double now)
{
    refill(b, now);
    if (n > b->cap)
        return -1;
    if (b->level >= n)
        return 0;
    return b->rate > 0 ? (n - b->level) / b->rate : -1;
}

double td_bucket_reset_s(td_bucket_t *b, double now)
{
    refill(b, now);
    return b->rate > 0 ? (b->cap - b->level) / b->rate : 0;
}

/* td_rng.h: the project's one seeded pseudo-random generator: xoshiro256** (Blackman and Vigna)
 * with its state filled from a splitmix64 stream. The same seed gives the same stream on every
 * machine, which the sampler's seeded requests and the load generator's schedules rely on.
 * Not for anything secret. A td_rng_t is plain data: copy it to fork a stream; one thread at a
 * time uses a given one. */
#ifndef TD_RNG_H
#define TD_RNG_H

#include <stdint.h>

/* xoshiro256** state. Never all zero once seeded. */
typedef struct td_rng {
    uint64_t s[4];
} td_rng_t;

/* The next value of the splitmix64 stream whose state is *x (which it advances). */
uint64_t td_rng_splitmix64(uint64_t *x);
/* Seed r from `seed` (any value, 0 included): s[0..3] are the first four splitmix64 values. */
void td_rng_seed(td_rng_t *r, uint64_t seed);
/* The next 64 random bits. */
uint64_t td_rng_next(td_rng_t *r);
/* Uniform in [0, 1): the top 53 bits of td_rng_next times 2^-53. */
double td_rng_uniform(td_rng_t *r);

#endif

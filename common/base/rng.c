/* rng.c: xoshiro256** seeded through splitmix64 (td_rng.h), as in the authors' reference code
 * (prng.di.unimi.it). */
#include "td_rng.h"

uint64_t td_rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void td_rng_seed(td_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = td_rng_splitmix64(&x);
}

/* Rotate x left by k (0 < k < 64). */
static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t td_rng_next(td_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double td_rng_uniform(td_rng_t *r)
{
    return (double)(td_rng_next(r) >> 11) * 0x1.0p-53;
}

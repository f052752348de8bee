/* fuzz_driver.c: a deterministic mutation driver for builds without libFuzzer (gcc, CI): starts
 * from the target's valid seed and feeds it N mutated copies (bit flips, byte overwrites with
 * boundary values, truncation, 8-byte length fields set to extreme values, duplicated spans).
 * Run under ASan+UBSan, a crash or out-of-bounds read fails the test.
 *
 * usage: fuzz_TARGET [ITERATIONS] [SEED]   (also: fuzz_TARGET FILE... replays files;
 *        fuzz_TARGET --write-seed FILE writes the seed, for a libFuzzer corpus) */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 17;
}

static size_t mutate(const uint8_t *seed, size_t n, uint8_t *out, size_t cap)
{
    size_t len = n < cap ? n : cap;
    memcpy(out, seed, len);
    int k = 1 + (int)(rnd() % 4);
    for (int i = 0; i < k && len > 0; i++) {
        size_t at = rnd() % len;
        switch (rnd() % 6) {
        case 0:
            out[at] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: {
            static const uint8_t vals[] = {0, 1, 0x7f, 0x80, 0xff, '"', '[', '{', ',', '9'};
            out[at] = vals[rnd() % sizeof(vals)];
            break;
        }
        case 2:
            len = at;
            break;
        case 3:
            if (at + 8 <= len) {
                static const uint64_t big[] = {
                    0, 1, 0xffffffffull, 0x7fffffffffffffffull, ~0ull, 1ull << 32, 1ull << 40};
                uint64_t v = big[rnd() % (sizeof(big) / sizeof(big[0]))];
                memcpy(out + at, &v, 8);
            }
            break;
        case 4: { /* duplicate a span over another place */
            size_t from = rnd() % len, n2 = 1 + rnd() % 16;
            if (from + n2 <= len && at + n2 <= len)
                memmove(out + at, out + from, n2);
            break;
        }
        default:
            out[at] = (uint8_t)rnd();
        }
    }
    return len;
}

static int write_seed(const char *path)
{
    td_buf_t seed;
    td_buf_init(&seed);
    fuzz_seed(&seed);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(seed.data, 1, seed.len, f) == seed.len;
    if (f && fclose(f) != 0)
        ok = 0;
    td_buf_free(&seed);
    if (!ok)
        fprintf(stderr, "cannot write %s\n", path);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-seed") == 0)
        return write_seed(argv[2]);
    if (argc > 1 && argv[1][0] != '-' && (argv[1][0] < '0' || argv[1][0] > '9')) {
        for (int i = 1; i < argc; i++) {
            char *d;
            size_t n;
            if (td_file_read_all(argv[i], &d, &n) != 0) {
                fprintf(stderr, "cannot read %s\n", argv[i]);
                return 2;
            }
            LLVMFuzzerTestOneInput((const uint8_t *)d, n);
            free(d);
        }
        return 0;
    }
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    td_buf_t seed;
    td_buf_init(&seed);
    fuzz_seed(&seed);
    if (LLVMFuzzerTestOneInput((const uint8_t *)seed.data, seed.len) != 0) {
        fprintf(stderr, "the seed input is rejected\n");
        return 1;
    }
    uint8_t *buf = malloc(seed.len + 1);
    if (!buf)
        return 1;
    for (long i = 0; i < iters; i++) {
        size_t n = mutate((const uint8_t *)seed.data, seed.len, buf, seed.len);
        /* exact-size copy so ASan sees reads past the end */
        uint8_t *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        LLVMFuzzerTestOneInput(exact, n);
        free(exact);
    }
    printf("%ld mutated inputs parsed without a crash\n", iters);
    free(buf);
    td_buf_free(&seed);
    return 0;
}

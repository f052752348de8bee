/* bench_placement.c: the router's CPU per placement with the cluster KV index, at the 4 prefill
 * + 64 decode topology.
 *
 * Usage: bench_placement [--blocks N] [--groups G] [--system-blocks S] [--holders H]
 *                        [--prompt-blocks P] [--n PLACEMENTS]
 *
 * Builds the router's index mirror (kvindex.c) as a shared-system-prompt workload leaves it:
 * G groups whose S-block system prompt is held by H workers each (one prefill worker, the rest
 * decode workers), every other block (to N in all) held by one worker at random. Then each
 * placement does what the router does for one request under kv_aware (reqs_place.c): hash the
 * prompt (a group's system prompt plus its own blocks, P in all, plus a partial block), ask
 * the index for each of the 64 decode candidates' and 4 prefill candidates' cached prefix,
 * predict the remote prefill, and choose a decode and a prefill worker (placement.c). Prints
 * microseconds per placement against p2c on the same loads without the index (the peer measured
 * in the same run), and the index's bytes per block.
 */
#include "kvindex.h"
#include "placement.h"
#include "td_kvhash.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_PREFILL = 4, N_DECODE = 64, BT = 16 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void)
{
    uint64_t x = rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static void fleet(td_place_load_t *l, size_t n, bool decode)
{
    for (size_t i = 0; i < n; i++) {
        memset(&l[i], 0, sizeof(l[i]));
        l[i].alive = true;
        td_place_heartbeat(&l[i], decode ? 0 : next() % 2000, decode ? (uint32_t)(next() % 8) : 0,
                           decode ? 1000 : 0, decode ? 1200 : 0, false);
    }
}

int main(int argc, char **argv)
{
    size_t blocks = 1000000, groups = 16, sys_blocks = 64, holders = 5, prompt_blocks = 68,
           n = 100000;
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t v = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--blocks"))
            blocks = v;
        else if (!strcmp(argv[i], "--groups"))
            groups = v;
        else if (!strcmp(argv[i], "--system-blocks"))
            sys_blocks = v;
        else if (!strcmp(argv[i], "--holders"))
            holders = v;
        else if (!strcmp(argv[i], "--prompt-blocks"))
            prompt_blocks = v;
        else if (!strcmp(argv[i], "--n"))
            n = v;
        else {
            fprintf(stderr, "bench_placement: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (prompt_blocks < sys_blocks || holders < 1 || holders > N_DECODE) {
        fprintf(stderr, "bench_placement: need --prompt-blocks >= --system-blocks and 1 <= "
                        "--holders <= %d\n", N_DECODE);
        return 2;
    }
    uint8_t fp[16] = {1, 2, 3};
    td_kvhash_t root;
    td_kvhash_root(fp, NULL, 0, &root);
    td_kvindex_t *ix = td_kvindex_new();
    td_kvindex_reserve(ix, blocks);
    size_t toks = prompt_blocks * BT + 5;
    int32_t *sys = malloc(groups * sys_blocks * BT * sizeof(int32_t));
    int32_t *prompt = malloc(toks * sizeof(int32_t));
    td_kvhash_t *h = malloc(prompt_blocks * sizeof(*h));
    /* workers 0..3 prefill, 4..67 decode; group g's system prompt on prefill g % 4 and
     * holders - 1 decode workers */
    for (size_t g = 0; g < groups; g++) {
        int32_t *t = sys + g * sys_blocks * BT;
        for (size_t k = 0; k < sys_blocks * BT; k++)
            t[k] = (int32_t)(next() % 129000);
        td_kvhash_blocks(t, sys_blocks * BT, BT, &root, h, sys_blocks);
        for (size_t k = 0; k < sys_blocks; k++) {
            td_kvindex_add(ix, &h[k], (uint32_t)(g % N_PREFILL), 0);
            for (size_t d = 0; d + 1 < holders; d++)
                td_kvindex_add(ix, &h[k], (uint32_t)(N_PREFILL + (g * 7 + d * 13) % N_DECODE),
                               d % 3 == 2 ? 2 : 0);
        }
    }
    while (td_kvindex_blocks(ix) < blocks) {
        td_kvhash_t x;
        uint64_t a = next(), b = next();
        memcpy(x.b, &a, 8);
        memcpy(x.b + 8, &b, 8);
        td_kvindex_add(ix, &x, (uint32_t)(next() % (N_PREFILL + N_DECODE)), 0);
    }
    td_placer_t kv, p2c;
    td_placer_init(&kv, TD_PLACE_KV_AWARE, NULL, 1);
    td_placer_init(&p2c, TD_PLACE_P2C, NULL, 1);
    td_place_load_t dl[N_DECODE], pl[N_PREFILL];
    double secs[2] = {0};
    uint64_t hits = 0;
    for (int pass = 0; pass < 2; pass++) {
        rng = 12345;
        double t0 = td_now_s();
        for (size_t r = 0; r < n; r++) {
            if (r % 64 == 0) { /* a heartbeat round */
                fleet(dl, N_DECODE, true);
                fleet(pl, N_PREFILL, false);
            }
            size_t g = next() % groups;
            memcpy(prompt, sys + g * sys_blocks * BT, sys_blocks * BT * sizeof(int32_t));
            for (size_t k = sys_blocks * BT; k < toks; k++)
                prompt[k] = (int32_t)(next() % 129000);
            if (pass == 0) {
                /* kv_aware: hash once, every candidate's prefix, remote prefill, both choices */
                size_t nh = td_kvhash_blocks(prompt, (toks - 1) / BT * BT, BT, &root, h,
                                             prompt_blocks);
                double remote = -1;
                for (size_t i = 0; i < N_PREFILL; i++) {
                    size_t slow;
                    pl[i].cached_tokens =
                        td_kvindex_prefix_tiers(ix, h, nh, (uint32_t)i, UINT8_MAX, &slow) * BT;
                    pl[i].cached_slow_tokens = slow * BT;
                    double t = td_place_prefill_ttft(&kv, &pl[i], toks);
                    if (remote < 0 || t < remote)
                        remote = t;
                }
                for (size_t i = 0; i < N_DECODE; i++) {
                    size_t slow;
                    dl[i].cached_tokens = td_kvindex_prefix_tiers(
                                              ix, h, nh, (uint32_t)(N_PREFILL + i), UINT8_MAX,
                                              &slow) * BT;
                    dl[i].cached_slow_tokens = slow * BT;
                    dl[i].local = dl[i].cached_tokens >= 0.8 * toks;
                }
                int d = td_place_decode_prompt(&kv, dl, N_DECODE, 80, toks, remote);
                if (d >= 0 && !dl[d].local) {
                    int p = td_place_prefill(&kv, pl, N_PREFILL, toks);
                    hits += p >= 0 ? pl[p].cached_tokens : 0;
                } else if (d >= 0) {
                    hits += dl[d].cached_tokens;
                }
            } else {
                td_place_decode_prompt(&p2c, dl, N_DECODE, 80, toks, 0);
                td_place_prefill(&p2c, pl, N_PREFILL, toks);
            }
        }
        secs[pass] = td_now_s() - t0;
    }
    double us_kv = secs[0] / (double)n * 1e6, us_p2c = secs[1] / (double)n * 1e6;
    printf("index: %zu blocks, %zu groups x %zu system blocks on %zu holders each; %.1f bytes "
           "per block (%.1f MiB)\n",
           td_kvindex_blocks(ix), groups, sys_blocks, holders,
           (double)td_kvindex_bytes(ix) / (double)td_kvindex_blocks(ix),
           (double)td_kvindex_bytes(ix) / (1 << 20));
    printf("kv_aware placement over %d prefill + %d decode candidates, %zu-block prompts: %.2f us "
           "per placement (hash, 68 prefix lookups, both choices); p2c without the index %.2f "
           "us: ratio %.1f; %.0f%% of prompt tokens placed on a holder\n",
           N_PREFILL, N_DECODE, prompt_blocks, us_kv, us_p2c, us_kv / us_p2c,
           100.0 * (double)hits / ((double)n * (double)toks));
    td_kvindex_free(ix);
    free(sys);
    free(prompt);
    free(h);
    return 0;
}

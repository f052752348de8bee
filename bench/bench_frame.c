/* bench_frame.c: packing the frames the router sends most, one-pass (td_frame_encode) against
 * protobuf-c's two walks (get_packed_size + pack), measured in the same run.
 *
 * Usage: bench_frame [--rounds R] [--n N] [--tokens T]
 *
 * Frames: PrefillTask and DecodeTask with a T-token prompt (default 64) and the sampling the
 * router sets, and a one-token TokenChunk with its text (what the RPC front end streams). Each
 * round packs each frame N times (default 200,000) both ways, alternating; printed per frame:
 * the median process CPU nanoseconds per frame of each and their ratio (protobuf-c / one-pass:
 * above 1 means the one-pass packer is faster). */
#include "control.pb-c.h"
#include "td_frame.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ns per frame, protobuf-c's way */
static double run_protobuf_c(const ProtobufCMessage *m, td_buf_t *b, int n)
{
    double t0 = cpu_s();
    for (int i = 0; i < n; i++) {
        b->len = 0;
        size_t sz = protobuf_c_message_get_packed_size(m);
        if (td_buf_reserve(b, TD_FRAME_HEADER + sz))
            exit(1);
        protobuf_c_message_pack(m, (uint8_t *)b->data + TD_FRAME_HEADER);
        b->len = TD_FRAME_HEADER + sz;
    }
    return (cpu_s() - t0) / n * 1e9;
}

static double run_one_pass(const ProtobufCMessage *m, td_buf_t *b, int n)
{
    double t0 = cpu_s();
    for (int i = 0; i < n; i++) {
        b->len = 0;
        if (td_frame_encode(m, b))
            exit(1);
    }
    return (cpu_s() - t0) / n * 1e9;
}

int main(int argc, char **argv)
{
    int rounds = 7, n = 200000, T = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            T = atoi(argv[i + 1]);
    }
    if (rounds < 1 || rounds > 99 || n < 1 || T < 1) {
        fprintf(stderr, "usage: bench_frame [--rounds 1..99] [--n N] [--tokens T]\n");
        return 2;
    }
    int32_t *toks = malloc((size_t)T * sizeof(int32_t));
    if (!toks)
        return 1;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < T; i++) { /* ids spread over a 129k vocabulary, as prompts' are */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % 129280);
    }
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    sp.temperature = 0.7f;
    sp.top_p = 0.95f;
    sp.max_tokens = 4;
    sp.seed = 1234567;
    sp.ignore_eos = 1;
    sp.logprobs = -1;
    uint8_t blob[180], tenant[] = "default";
    memset(blob, 7, sizeof(blob));
    uint32_t blocks[4] = {11, 12, 13, 14};
    Tandem__PrefillTask pt = TANDEM__PREFILL_TASK__INIT;
    pt.request_id = 1001;
    pt.n_tokens = (size_t)T;
    pt.tokens = toks;
    pt.sampling = &sp;
    pt.decode_worker = "decode-1";
    pt.decode_blob = (ProtobufCBinaryData){sizeof(blob), blob};
    pt.n_dst_blocks = 4;
    pt.dst_blocks = blocks;
    pt.decode_request_id = 5001;
    pt.tenant = (ProtobufCBinaryData){sizeof(tenant) - 1, tenant};
    Tandem__DecodeTask dt = TANDEM__DECODE_TASK__INIT;
    dt.request_id = 1001;
    dt.n_tokens = (size_t)T;
    dt.tokens = toks;
    dt.sampling = &sp;
    dt.tenant = pt.tenant;
    int32_t one = 4242;
    uint8_t text[] = " hello";
    Tandem__TokenChunk tc = TANDEM__TOKEN_CHUNK__INIT;
    tc.request_id = 1001;
    tc.n_tokens = 1;
    tc.tokens = &one;
    tc.text = (ProtobufCBinaryData){sizeof(text) - 1, text};
    Tandem__Frame f[3] = {TANDEM__FRAME__INIT, TANDEM__FRAME__INIT, TANDEM__FRAME__INIT};
    f[0].body_case = TANDEM__FRAME__BODY_PREFILL_TASK;
    f[0].prefill_task = &pt;
    f[1].body_case = TANDEM__FRAME__BODY_DECODE_TASK;
    f[1].decode_task = &dt;
    f[2].body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    f[2].token_chunk = &tc;
    const char *name[3] = {"PrefillTask", "DecodeTask", "TokenChunk"};
    td_buf_t b;
    td_buf_init(&b);
    printf("# bench_frame --rounds %d --n %d --tokens %d (process CPU time, medians)\n", rounds, n,
           T);
    printf("%-12s %6s %14s %13s %7s\n", "frame", "bytes", "protobuf-c_ns", "one-pass_ns",
           "ratio");
    for (int k = 0; k < 3; k++) {
        double a[99], o[99];
        for (int r = 0; r < rounds; r++) {
            a[r] = run_protobuf_c(&f[k].base, &b, n);
            o[r] = run_one_pass(&f[k].base, &b, n);
        }
        double ma = median(a, rounds), mo = median(o, rounds);
        printf("%-12s %6zu %14.0f %13.0f %7.2f\n", name[k], b.len, ma, mo, ma / mo);
    }
    td_buf_free(&b);
    free(toks);
    return 0;
}

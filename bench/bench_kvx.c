/* bench_kvx.c: throughput and latency of the KV data plane (common/kvx/) between two processes on
 * one machine, against the limits measured in the same run.
 *
 *   bench_kvx [--pool MiB] [--mech am|put|both] [--sizes 65536,1048576,...] [--small BYTES]
 *             [--seconds S] [--window W]
 *
 * UCX_TLS picks the transport (bench/xfer.sh runs tcp and sm). For each mechanism and block size
 * the parent pushes its whole pool as scattered blocks (no two adjacent, so each block is one UCX
 * operation of exactly that size) to a forked receiver, W pushes in flight, and prints GB/s and the
 * ratios to:
 *   memcpy: one core copying a pool-sized working set (the copy limit for shared memory);
 *   tcp:    a plain loopback TCP socket pair moving the same bytes (the limit for TCP).
 * Latency: one block pushed with its completion, measured on the receiver as (on_recv time - send
 * time) with the shared CLOCK_MONOTONIC, and on the sender as push -> acknowledged.
 */
#include "td_error.h"
#include "td_kvx.h"
#include "td_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

static size_t pool_bytes = 256ull << 20;
static double seconds = 1.0;
static int window = 2;
static bool ucx_alloc = true; /* --ucx-alloc 0: private mmap pools; 1: pools allocated by UCX
                                 (shared-memory segments) */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* ---- limits ---------------------------------------------------------------------------------*/

static double memcpy_gbs(void)
{
    uint8_t *a = malloc(pool_bytes), *b = malloc(pool_bytes);
    memset(a, 1, pool_bytes);
    memset(b, 2, pool_bytes);
    double best = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = td_now_ns();
        memcpy(b, a, pool_bytes);
        double gbs = pool_bytes / (double)(td_now_ns() - t0);
        if (gbs > best)
            best = gbs;
        memcpy(a, b, 64); /* keep the copies observable */
    }
    free(a);
    free(b);
    return best;
}

/* A loopback TCP socket pair moving pool-sized messages: child reads into a pool-sized buffer. */
static double tcp_gbs(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &sl) < 0) {
        perror("bench_kvx: tcp");
        return 0;
    }
    int rounds = 8;
    pid_t pid = fork();
    if (pid == 0) {
        int c = accept(ls, NULL, NULL);
        uint8_t *buf = malloc(pool_bytes);
        for (int i = 0; i < rounds; i++)
            if (read_all(c, buf, pool_bytes) < 0)
                _exit(1);
        write_all(c, "k", 1);
        _exit(0);
    }
    close(ls);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    connect(s, (struct sockaddr *)&sa, sizeof(sa));
    uint8_t *buf = malloc(pool_bytes);
    memset(buf, 3, pool_bytes);
    uint64_t t0 = td_now_ns();
    for (int i = 0; i < rounds; i++)
        write_all(s, buf, pool_bytes);
    char k;
    read_all(s, &k, 1);
    double gbs = (double)rounds * pool_bytes / (double)(td_now_ns() - t0);
    close(s);
    waitpid(pid, NULL, 0);
    free(buf);
    return gbs;
}

/* ---- receiver (child) -----------------------------------------------------------------------*/

typedef struct rstate {
    td_kvx_t *kvx;
    uv_poll_t ctl;
    int fd;
    double lat_us[4096];
    int n_lat;
} rstate_t;

static void r_on_recv(td_kvx_t *k, td_kvx_peer_t *p, const td_kvx_recv_t *r, void *arg)
{
    rstate_t *s = arg;
    uint64_t t_send;
    if (r->status == 0 && r->note_len == 9 && ((const char *)r->note)[0] == 'L') {
        memcpy(&t_send, (const char *)r->note + 1, 8);
        if (s->n_lat < 4096)
            s->lat_us[s->n_lat++] = (td_now_ns() - t_send) / 1e3;
    }
}

static void r_closed(void *arg)
{
}

static void r_ctl(uv_poll_t *h, int status, int events)
{
    rstate_t *s = h->data;
    char c;
    if (read(s->fd, &c, 1) == 1)
        return;
    /* the sender is done: report latency, close */
    if (s->n_lat > 0) {
        qsort(s->lat_us, (size_t)s->n_lat, sizeof(double), cmp_double);
        double med = s->lat_us[s->n_lat / 2];
        write_all(s->fd, &med, sizeof(med));
    }
    uv_poll_stop(h);
    uv_close((uv_handle_t *)h, NULL);
    td_kvx_close(s->kvx, r_closed, NULL);
}

static void run_receiver(int fd, const td_kvx_layout_t *layout)
{
    static rstate_t s;
    static uv_loop_t rloop;
    uv_loop_t *loop = &rloop;
    uv_loop_init(loop); /* never the default loop inherited from the parent */
    td_kvx_opts_t o = {
        .on_recv = r_on_recv, .arg = &s, .pool = ucx_alloc ? TD_KVX_POOL_UCX : TD_KVX_POOL_MMAP};
    s.fd = fd;
    s.kvx = td_kvx_new(loop, layout, &o);
    if (!s.kvx) {
        fprintf(stderr, "bench_kvx: receiver: %s\n", td_err_msg());
        _exit(1);
    }
    size_t len;
    const void *blob = td_kvx_blob(s.kvx, &len);
    uint32_t l32 = (uint32_t)len;
    write_all(fd, &l32, 4);
    write_all(fd, blob, len);
    uv_poll_init(loop, &s.ctl, fd);
    s.ctl.data = &s;
    uv_poll_start(&s.ctl, UV_READABLE | UV_DISCONNECT, r_ctl);
    uv_run(loop, UV_RUN_DEFAULT);
    _exit(0);
}

/* ---- sender ---------------------------------------------------------------------------------*/

typedef struct sstate {
    int inflight;
    int failed;
    uint64_t bytes_done;
} sstate_t;

static void s_done(int status, void *arg)
{
    sstate_t *s = arg;
    s->inflight--;
    if (status != 0 && s->failed++ == 0)
        fprintf(stderr, "bench_kvx: push failed: %s\n", td_strerror(status));
}

/* Push the pool as scattered blocks for `seconds`; returns GB/s. Sets *lat_send_us and
 * *lat_recv_us (one-block handoff) when lat is true. */
static double run_config(td_kvx_mech_t mech, uint64_t block_bytes, bool lat, double *lat_send_us,
                         double *lat_recv_us, uint64_t *ops, td_kvx_mech_t *used)
{
    td_kvx_layout_t layout = {.block_bytes = block_bytes,
                              .n_blocks = (uint32_t)(pool_bytes / block_bytes)};
    memcpy(layout.fingerprint, "bench-kvx-layout", 16);
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(sv[0]);
        run_receiver(sv[1], &layout);
    }
    close(sv[1]);
    uv_loop_t loop_mem, *loop = &loop_mem;
    uv_loop_init(loop);
    td_kvx_opts_t o = {.mech = mech, .pool = ucx_alloc ? TD_KVX_POOL_UCX : TD_KVX_POOL_MMAP};
    td_kvx_t *k = td_kvx_new(loop, &layout, &o);
    if (!k) {
        fprintf(stderr, "bench_kvx: %s\n", td_err_msg());
        exit(1);
    }
    memset(td_kvx_pool(k), 0x5a, pool_bytes);
    uint32_t l32;
    read_all(sv[0], &l32, 4);
    uint8_t *blob = malloc(l32);
    read_all(sv[0], blob, l32);
    td_kvx_peer_t *peer;
    if (td_kvx_connect(k, blob, l32, &peer) < 0) {
        fprintf(stderr, "bench_kvx: connect: %s\n", td_err_msg());
        exit(1);
    }
    free(blob);
    uint32_t n = layout.n_blocks;
    uint32_t *src = malloc(n * 4), *dst = malloc(n * 4);
    /* scattered: even blocks then odd ones on both sides, so no two neighbours are adjacent */
    uint32_t j = 0;
    for (uint32_t i = 0; i < n; i += 2)
        src[j++] = i;
    for (uint32_t i = 1; i < n; i += 2)
        src[j++] = i;
    for (uint32_t i = 0; i < n; i++)
        dst[i] = src[n - 1 - i];
    sstate_t s = {0};
    /* warm up: handshake and first touch of the receiver's pool */
    td_kvx_push(peer, src, dst, n, NULL, 0, 0, s_done, &s);
    s.inflight = 1;
    while (s.inflight > 0)
        uv_run(loop, UV_RUN_ONCE);
    td_kvx_stats_t st0;
    td_kvx_stats(k, &st0);
    uint64_t t0 = td_now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    uint64_t pushes = 0;
    while (td_now_ns() < end || s.inflight > 0) {
        while (s.inflight < window && td_now_ns() < end && !s.failed) {
            if (td_kvx_push(peer, src, dst, n, NULL, 0, 0, s_done, &s) < 0)
                break;
            s.inflight++;
            pushes++;
        }
        uv_run(loop, UV_RUN_ONCE);
    }
    double gbs = (double)pushes * pool_bytes / (double)(td_now_ns() - t0);
    td_kvx_stats_t st1;
    td_kvx_stats(k, &st1);
    *used = td_kvx_peer_mech(peer);
    *ops = pushes ? (st1.ops_posted - st0.ops_posted) / pushes : 0;
    if (lat) {
        double v[200];
        for (int i = 0; i < 200; i++) {
            char note[9] = {'L'};
            uint64_t t = td_now_ns();
            memcpy(note + 1, &t, 8);
            uint32_t a = (uint32_t)i % n, b = (uint32_t)(i * 7) % n;
            td_kvx_push(peer, &a, &b, 1, note, 9, 0, s_done, &s);
            s.inflight = 1;
            while (s.inflight > 0)
                uv_run(loop, UV_RUN_ONCE);
            v[i] = (td_now_ns() - t) / 1e3;
        }
        qsort(v, 200, sizeof(double), cmp_double);
        *lat_send_us = v[100];
    }
    shutdown(sv[0], SHUT_WR);
    double med = 0;
    if (lat && read_all(sv[0], &med, sizeof(med)) == 0)
        *lat_recv_us = med;
    waitpid(pid, NULL, 0);
    close(sv[0]);
    td_kvx_close(k, NULL, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    free(src);
    free(dst);
    return s.failed ? 0 : gbs;
}

static const char *mech_name(td_kvx_mech_t m)
{
    return m == TD_KVX_MECH_PUT ? "put" : m == TD_KVX_MECH_AM ? "am" : "auto";
}

int main(int argc, char **argv)
{
    const char *mechs = "all";
    const char *sizes = "65536,262144,1048576,4194304,16777216";
    uint64_t small = 16384;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--pool") == 0)
            pool_bytes = strtoull(argv[i + 1], NULL, 10) << 20;
        else if (strcmp(argv[i], "--mech") == 0)
            mechs = argv[i + 1];
        else if (strcmp(argv[i], "--sizes") == 0)
            sizes = argv[i + 1];
        else if (strcmp(argv[i], "--small") == 0)
            small = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--ucx-alloc") == 0)
            ucx_alloc = atoi(argv[i + 1]) != 0;
        else if (strcmp(argv[i], "--window") == 0)
            window = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_kvx: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    const char *tls = getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)";
    bool on_tcp = strstr(tls, "tcp") != NULL;
    printf("# UCX_TLS=%s pool=%zu MiB window=%d seconds=%.1f pool_alloc=%s\n", tls,
           pool_bytes >> 20, window, seconds, ucx_alloc ? "ucx" : "mmap");
    printf("# limits are re-measured right before each row (the machine's load drifts): memcpy\n"
           "# always, the plain TCP socket pair when UCX_TLS names tcp\n");
    printf("%-10s %-8s %10s %8s %8s %8s %8s %8s %8s %12s %12s\n", "tls", "mech", "block",
           "ops/push", "GB/s", "memcpy", "ratio", "tcp", "ratio", "lat_recv_us", "lat_ack_us");
    uint64_t list[32];
    int nl = 0;
    for (const char *p = sizes; *p && nl < 31;) {
        list[nl++] = strtoull(p, (char **)&p, 10);
        if (*p == ',')
            p++;
    }
    list[nl++] = small; /* many small blocks */
    td_kvx_mech_t ms[3];
    int nm = 0;
    if (strcmp(mechs, "auto") == 0 || strcmp(mechs, "all") == 0)
        ms[nm++] = TD_KVX_MECH_AUTO;
    if (strcmp(mechs, "am") == 0 || strcmp(mechs, "both") == 0 || strcmp(mechs, "all") == 0)
        ms[nm++] = TD_KVX_MECH_AM;
    if (strcmp(mechs, "put") == 0 || strcmp(mechs, "both") == 0 || strcmp(mechs, "all") == 0)
        ms[nm++] = TD_KVX_MECH_PUT;
    for (int m = 0; m < nm; m++) {
        for (int i = 0; i < nl; i++) {
            double ls = 0, lr = 0;
            uint64_t ops = 0;
            td_kvx_mech_t used = ms[m];
            char mname[16];
            if (list[i] == 0 || pool_bytes / list[i] < 2 || list[i] % 64)
                continue;
            bool lat = i == nl - 1;
            double mc = memcpy_gbs();
            double tc = on_tcp ? tcp_gbs() : 0;
            double g = run_config(ms[m], list[i], lat, &ls, &lr, &ops, &used);
            snprintf(mname, sizeof(mname), "%s%s%s", ms[m] == TD_KVX_MECH_AUTO ? "auto:" : "",
                     ms[m] == TD_KVX_MECH_AUTO ? mech_name(used) : mech_name(ms[m]), "");
            printf("%-10s %-8s %10llu %8llu %8.2f %8.2f %8.2f %8.2f %8.2f", tls, mname,
                   (unsigned long long)list[i], (unsigned long long)ops, g, mc, g / mc, tc,
                   tc > 0 ? g / tc : 0.0);
            if (lat)
                printf(" %12.1f %12.1f", lr, ls);
            printf("\n");
            fflush(stdout);
        }
    }
    return 0;
}

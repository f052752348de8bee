/* kvx_peer.c: one data-plane process for the integration tests (driven by kvx_test.py).
 *
 * Prints "BLOB <hex>" at start, then reads commands on stdin, one per line, and answers on stdout:
 *   CONNECT <name> <hexblob>                  -> CONNECTED <name> | ERR <name> <TD_E...>
 *   FILL <seed>                               -> FILLED   (every block gets pattern(seed, id))
 *   PUSH <tag> <name> <seed> <flags> <src,..> <dst,..>
 *                                             -> DONE <tag> <status> <ms> (later)
 *   PULL <tag> <name> <seed> <flags> <src,..> <dst,..>
 *                                             -> DONE <tag> <status> <ms> <verified>
 *   STATS                                     -> STATS <ops_posted> <recv_ok> <recv_failed> ...
 *   QUIT                                      -> BYE, after td_kvx_close
 * and, for every incoming push: RECV <status> <n_blocks> <verified>, where verified says that each
 * destination block held pattern(seed, src) at the moment the completion arrived (the sender's
 * seed and source ids travel in the note). flags: 1 checksum, 2 send a wrong checksum.
 */
#include "td_error.h"
#include "td_kvx.h"
#include "td_util.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <uv.h>

/* UCX 1.13.1 leaks ~100 bytes inside uct_mm_iface_t_new when a shared-memory interface is
 * created after another context in the process went away; not ours, suppressed under LSan. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:uct_mm_iface_t_new\nleak:libuct.so.0\n"; /* frames are unsymbolised */
}

#define MAX_PEERS 16
#define MAX_IDS 65536

static uv_loop_t *loop;
static td_kvx_t *kvx;
static uv_pipe_t in_pipe;
static td_buf_t line_buf;
static struct {
    char name[32];
    td_kvx_peer_t *peer;
} peers[MAX_PEERS];
static int n_peers;
static bool quitting;

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Block content as a function of (seed, block id): differs for every seed and every block. */
static void pattern_fill(uint8_t *p, uint64_t bytes, uint64_t seed, uint32_t id)
{
    uint64_t base = splitmix(seed * 0x100000001b3ull + id);
    for (uint64_t j = 0; j < bytes / 8; j++) {
        uint64_t w = base ^ (j * 0x9e3779b97f4a7c15ull);
        memcpy(p + j * 8, &w, 8);
    }
}

static bool pattern_check(const uint8_t *p, uint64_t bytes, uint64_t seed, uint32_t id)
{
    uint64_t base = splitmix(seed * 0x100000001b3ull + id);
    for (uint64_t j = 0; j < bytes / 8; j++) {
        uint64_t w = base ^ (j * 0x9e3779b97f4a7c15ull), got;
        memcpy(&got, p + j * 8, 8);
        if (got != w)
            return false;
    }
    return true;
}

static int parse_ids(const char *s, uint32_t *ids, uint32_t max)
{
    uint32_t n = 0;
    while (*s && n < max) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s)
            return -1;
        ids[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return (int)n;
}

static td_kvx_peer_t *find(const char *name)
{
    for (int i = 0; i < n_peers; i++)
        if (strcmp(peers[i].name, name) == 0)
            return peers[i].peer;
    return NULL;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static bool verify_blocks(const uint32_t *dst, const uint32_t *src, uint32_t n, uint64_t seed)
{
    const td_kvx_layout_t *l = td_kvx_layout(kvx);
    for (uint32_t i = 0; i < n; i++)
        if (!pattern_check(td_kvx_pool(kvx) + dst[i] * l->block_bytes, l->block_bytes, seed,
                           src[i]))
            return false;
    return true;
}

static void on_recv(td_kvx_t *k, td_kvx_peer_t *peer, const td_kvx_recv_t *r, void *arg)
{
    bool ok = false;
    if (r->status == 0 && r->note_len > 0) {
        /* note: "<seed> <src,src,...>" */
        char *note = td_strndup(r->note, r->note_len);
        uint32_t *src = malloc(sizeof(uint32_t) * MAX_IDS);
        char *sp = note ? strchr(note, ' ') : NULL;
        if (note && src && sp) {
            uint64_t seed = strtoull(note, NULL, 10);
            int n = parse_ids(sp + 1, src, MAX_IDS);
            ok = n == (int)r->n_blocks && verify_blocks(r->blocks, src, r->n_blocks, seed);
        }
        free(src);
        free(note);
    }
    say("RECV %s %u %d", r->status ? td_err_name(r->status) : "OK", r->n_blocks, ok);
}

typedef struct op {
    char tag[32];
    uint64_t t0;
    bool pull;
    uint64_t seed;
    uint32_t n;
    uint32_t *src, *dst;
} op_t;

static void op_done(int status, void *arg)
{
    op_t *o = arg;
    double ms = (td_now_ns() - o->t0) / 1e6;
    if (o->pull) {
        bool ok = status == 0 && verify_blocks(o->dst, o->src, o->n, o->seed);
        say("DONE %s %s %.3f %d", o->tag, status ? td_err_name(status) : "OK", ms, ok);
    } else {
        say("DONE %s %s %.3f", o->tag, status ? td_err_name(status) : "OK", ms);
    }
    free(o->src);
    free(o->dst);
    free(o);
}

static void closed(void *arg)
{
    say("BYE");
}

static void cmd_xfer(char **tok, int nt, bool pull)
{
    /* PUSH|PULL tag name seed flags src dst */
    if (nt != 7) {
        say("ERR %s usage", nt > 1 ? tok[1] : "?");
        return;
    }
    td_kvx_peer_t *p = find(tok[2]);
    op_t *o = calloc(1, sizeof(*o));
    o->src = malloc(sizeof(uint32_t) * MAX_IDS);
    o->dst = malloc(sizeof(uint32_t) * MAX_IDS);
    snprintf(o->tag, sizeof(o->tag), "%s", tok[1]);
    o->seed = strtoull(tok[3], NULL, 10);
    o->pull = pull;
    unsigned f = (unsigned)strtoul(tok[4], NULL, 10);
    unsigned flags = (f & 1 ? TD_KVX_F_CSUM : 0) | (f & 2 ? TD_KVX_F_TEST_BAD_CSUM : 0);
    int ns = parse_ids(tok[5], o->src, MAX_IDS), nd = parse_ids(tok[6], o->dst, MAX_IDS);
    int rc = TD_EINVAL;
    o->t0 = td_now_ns();
    if (p && ns > 0 && ns == nd) {
        o->n = (uint32_t)ns;
        if (pull) {
            rc = td_kvx_pull(p, o->src, o->dst, o->n, flags, op_done, o);
        } else {
            td_buf_t note;
            td_buf_init(&note);
            td_buf_printf(&note, "%s %s", tok[3], tok[5]);
            rc = td_kvx_push(p, o->src, o->dst, o->n, note.data, (uint32_t)note.len, flags, op_done,
                             o);
            td_buf_free(&note);
        }
    }
    if (rc < 0) {
        say("REJECT %s %s %s", o->tag, td_err_name(rc), td_err_msg());
        free(o->src);
        free(o->dst);
        free(o);
    }
}

static int hex_decode(const char *s, uint8_t **out, size_t *len)
{
    size_t n = strlen(s);
    if (n % 2)
        return TD_EPARSE;
    uint8_t *b = malloc(n / 2 + 1);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            free(b);
            return TD_EPARSE;
        }
        b[i] = (uint8_t)v;
    }
    *out = b;
    *len = n / 2;
    return 0;
}

static void run_line(char *line)
{
    char *tok[16];
    int nt = 0;
    for (char *s = strtok(line, " "); s && nt < 16; s = strtok(NULL, " "))
        tok[nt++] = s;
    if (nt == 0 || quitting)
        return;
    if (strcmp(tok[0], "CONNECT") == 0 && nt == 3) {
        uint8_t *blob;
        size_t len;
        td_kvx_peer_t *p = NULL;
        int rc = hex_decode(tok[2], &blob, &len);
        if (rc == 0) {
            rc = td_kvx_connect(kvx, blob, len, &p);
            free(blob);
        }
        if (rc < 0) {
            say("ERR %s %s", tok[1], td_err_name(rc));
            return;
        }
        if (!find(tok[1]) && n_peers < MAX_PEERS) {
            snprintf(peers[n_peers].name, sizeof(peers[n_peers].name), "%s", tok[1]);
            peers[n_peers++].peer = p;
        } else {
            for (int i = 0; i < n_peers; i++)
                if (strcmp(peers[i].name, tok[1]) == 0)
                    peers[i].peer = p;
        }
        say("CONNECTED %s", tok[1]);
    } else if (strcmp(tok[0], "FILL") == 0 && nt == 2) {
        const td_kvx_layout_t *l = td_kvx_layout(kvx);
        uint64_t seed = strtoull(tok[1], NULL, 10);
        for (uint32_t i = 0; i < l->n_blocks; i++)
            pattern_fill(td_kvx_pool(kvx) + i * l->block_bytes, l->block_bytes, seed, i);
        say("FILLED");
    } else if (strcmp(tok[0], "PUSH") == 0) {
        cmd_xfer(tok, nt, false);
    } else if (strcmp(tok[0], "PULL") == 0) {
        cmd_xfer(tok, nt, true);
    } else if (strcmp(tok[0], "STATS") == 0) {
        td_kvx_stats_t s;
        td_kvx_stats(kvx, &s);
        say("STATS ops=%llu recv_ok=%llu recv_failed=%llu peer_failures=%llu wakeups=%llu",
            (unsigned long long)s.ops_posted, (unsigned long long)s.recv_ok,
            (unsigned long long)s.recv_failed, (unsigned long long)s.peer_failures,
            (unsigned long long)s.wakeups);
    } else if (strcmp(tok[0], "MECH") == 0 && nt == 2) {
        td_kvx_peer_t *p = find(tok[1]);
        say("MECH %s %d", tok[1], p ? (int)td_kvx_peer_mech(p) : -1);
    } else if (strcmp(tok[0], "QUIT") == 0) {
        quitting = true;
        uv_read_stop((uv_stream_t *)&in_pipe);
        uv_close((uv_handle_t *)&in_pipe, NULL);
        td_kvx_close(kvx, closed, NULL);
    } else {
        say("ERR ? unknown command %s", tok[0]);
    }
}

static void alloc_cb(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
    static char mem[65536];
    buf->base = mem;
    buf->len = sizeof(mem);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    if (n < 0) {
        /* driver went away: quit */
        if (!quitting) {
            char q[] = "QUIT";
            run_line(q);
        }
        return;
    }
    td_buf_append(&line_buf, buf->base, (size_t)n);
    char *nl;
    while (!quitting && (nl = memchr(line_buf.data, '\n', line_buf.len))) {
        size_t len = (size_t)(nl - line_buf.data);
        char *line = td_strndup(line_buf.data, len);
        memmove(line_buf.data, nl + 1, line_buf.len - len - 1);
        line_buf.len -= len + 1;
        line_buf.data[line_buf.len] = '\0';
        run_line(line);
        free(line);
    }
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the driver */
    td_kvx_layout_t layout = {.block_bytes = 65536, .n_blocks = 64};
    td_kvx_opts_t opts = {.on_recv = on_recv};
    const char *fp = "tandem-test-fp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--blocks") == 0)
            layout.n_blocks = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--block-bytes") == 0)
            layout.block_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--fp") == 0)
            fp = argv[i + 1];
        else if (strcmp(argv[i], "--mech") == 0)
            opts.mech = strcmp(argv[i + 1], "put") == 0  ? TD_KVX_MECH_PUT
                        : strcmp(argv[i + 1], "am") == 0 ? TD_KVX_MECH_AM
                                                         : TD_KVX_MECH_AUTO;
        else if (strcmp(argv[i], "--ucx-alloc") == 0)
            opts.pool = strcmp(argv[i + 1], "0") == 0 ? TD_KVX_POOL_MMAP : TD_KVX_POOL_UCX;
    }
    strncpy((char *)layout.fingerprint, fp, sizeof(layout.fingerprint));
    loop = uv_default_loop();
    kvx = td_kvx_new(loop, &layout, &opts);
    if (!kvx) {
        fprintf(stderr, "kvx_peer: %s\n", td_err_msg());
        return 1;
    }
    size_t len;
    const uint8_t *blob = td_kvx_blob(kvx, &len);
    char *hex = malloc(2 * len + 1);
    td_hex_encode(blob, len, hex);
    say("BLOB %s", hex);
    free(hex);
    td_buf_init(&line_buf);
    uv_pipe_init(loop, &in_pipe, 0);
    uv_pipe_open(&in_pipe, 0);
    uv_read_start((uv_stream_t *)&in_pipe, alloc_cb, read_cb);
    uv_run(loop, UV_RUN_DEFAULT);
    td_buf_free(&line_buf);
    uv_loop_close(loop);
    return 0;
}

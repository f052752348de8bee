/* bench_router.c: the router's own added latency per request.
 *
 * Usage: bench_router --listen ADDR --router RPC_ADDR --secret-file F [--n N] [--prompt-len L]
 *
 * One decode worker registers with two routers: the real tandem-router, and this program, which
 * listens on --listen as a minimal router (the cluster protocol and nothing else). Each round
 * sends the same one-token request (a locally prefilled prompt of L tokens, max_tokens 1, greedy)
 *   direct:  straight to the worker as a DecodeTask, until its last TokenChunk
 *   routed:  through the real router's RPC (GenerateRequest by token ids, td_client)
 * alternating, one at a time, and prints p50/p90/p99 of both and of their difference: what the
 * router adds (admission, placement, its hop, the chunk relay) on top of the worker's own time.
 */
#include "td_client.h"
#include "td_error.h"
#include "td_rpc.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench {
    uv_loop_t loop;
    td_rpc_conn_t *worker; /* the decode worker, once it said Hello */
    bool done;
    double t_done;
    uint64_t next_id;
} bench_t;

static void on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    bench_t *b = ud;
    if (f->body_case == TANDEM__FRAME__BODY_HELLO && f->hello->role == TANDEM__ROLE__ROLE_DECODE)
        b->worker = c;
    else if (f->body_case == TANDEM__FRAME__BODY_TOKEN_CHUNK &&
             f->token_chunk->finish != TANDEM__FINISH__FINISH_NONE) {
        b->done = true;
        b->t_done = td_now_s();
    } else if (f->body_case == TANDEM__FRAME__BODY_ERROR) {
        fprintf(stderr, "worker error: %s\n", f->error->message);
        exit(1);
    }
}

static void on_close(td_rpc_conn_t *c, int status, void *ud)
{
    bench_t *b = ud;
    if (b->worker == c)
        b->worker = NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *router = NULL, *secret_file = NULL;
    int n = 200, plen = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
        else if (!strcmp(argv[i], "--router"))
            router = argv[i + 1];
        else if (!strcmp(argv[i], "--secret-file"))
            secret_file = argv[i + 1];
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt-len"))
            plen = atoi(argv[i + 1]);
    }
    if (!listen || !router || !secret_file || n < 1 || plen < 1) {
        fprintf(stderr, "usage: bench_router --listen ADDR --router RPC_ADDR --secret-file F "
                        "[--n N] [--prompt-len L]\n");
        return 2;
    }
    uint8_t *secret;
    size_t slen;
    if (td_rpc_secret_load(NULL, secret_file, &secret, &slen)) {
        fprintf(stderr, "%s\n", td_err_msg());
        return 1;
    }
    bench_t b = {0};
    uv_loop_init(&b.loop);
    td_rpc_opts_t o = {.secret = secret, .secret_len = slen,
                       .cb = {.on_frame = on_frame, .on_close = on_close}, .ud = &b};
    td_rpc_server_t *srv;
    if (td_rpc_server_start(&b.loop, listen, &o, &srv)) {
        fprintf(stderr, "listen %s: %s\n", listen, td_err_msg());
        return 1;
    }
    printf("bench_router: listening port=%d\n", td_rpc_server_port(srv));
    fflush(stdout);
    double t_end = td_now_s() + 60;
    while (!b.worker && td_now_s() < t_end)
        uv_run(&b.loop, UV_RUN_NOWAIT);
    if (!b.worker) {
        fprintf(stderr, "no decode worker registered within 60 s\n");
        return 1;
    }
    td_client_t *cl;
    if (td_client_open(router, secret, slen, "bench", 10, &cl)) {
        fprintf(stderr, "router %s: %s\n", router, td_err_msg());
        return 1;
    }
    int32_t *prompt = td_calloc((size_t)plen, sizeof(int32_t));
    for (int i = 0; i < plen; i++)
        prompt[i] = 100 + i;
    double *direct = td_calloc((size_t)n, sizeof(double));
    double *routed = td_calloc((size_t)n, sizeof(double));
    double *diff = td_calloc((size_t)n, sizeof(double));
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    sp.max_tokens = 1;
    sp.top_p = 1;
    sp.logprobs = -1;
    for (int r = -10; r < n; r++) { /* 10 warm-up rounds */
        Tandem__DecodeTask t = TANDEM__DECODE_TASK__INIT;
        t.request_id = ++b.next_id;
        t.tokens = prompt;
        t.n_tokens = (size_t)plen;
        t.sampling = &sp;
        t.local_prefill = true;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_DECODE_TASK;
        f.decode_task = &t;
        b.done = false;
        double t0 = td_now_s();
        td_rpc_send(b.worker, &f);
        while (!b.done)
            uv_run(&b.loop, UV_RUN_ONCE);
        double d = b.t_done - t0;

        Tandem__GenerateRequest g = TANDEM__GENERATE_REQUEST__INIT;
        g.tokens = prompt;
        g.n_tokens = (size_t)plen;
        g.sampling = &sp;
        t0 = td_now_s();
        if (td_client_generate(cl, &g, NULL, NULL, 30)) {
            fprintf(stderr, "routed request: %s\n", td_err_msg());
            return 1;
        }
        double rt = td_now_s() - t0;
        /* keep heartbeats flowing on our side */
        uv_run(&b.loop, UV_RUN_NOWAIT);
        if (r >= 0) {
            direct[r] = d * 1e6;
            routed[r] = rt * 1e6;
            diff[r] = (rt - d) * 1e6;
        }
    }
    printf("requests: %d one-token requests, prompt %d tokens, alternating\n", n, plen);
    printf("direct to the worker   p50 %8.1f us  p90 %8.1f us  p99 %8.1f us\n",
           pct(direct, n, 50), pct(direct, n, 90), pct(direct, n, 99));
    printf("through the router     p50 %8.1f us  p90 %8.1f us  p99 %8.1f us\n",
           pct(routed, n, 50), pct(routed, n, 90), pct(routed, n, 99));
    printf("router added (paired)  p50 %8.1f us  p90 %8.1f us  p99 %8.1f us\n",
           pct(diff, n, 50), pct(diff, n, 90), pct(diff, n, 99));
    td_client_close(cl);
    td_rpc_server_close(srv);
    uv_run(&b.loop, UV_RUN_NOWAIT);
    free(prompt);
    free(direct);
    free(routed);
    free(diff);
    free(secret);
    return 0;
}

/* client_impl.h: what the load generator's HTTP client files share: the client and connection
 * structs, the response parser's states, and the calls between connection handling (client.c)
 * and response parsing (client_parse.c). Everything runs on the client's loop thread. */
#ifndef TD_BENCH_CLIENT_IMPL_H
#define TD_BENCH_CLIENT_IMPL_H

#include "bench.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

/* Buffer sizes and limits of the client. */
enum {
    RBUF_SIZE = 256 * 1024,
    MAX_LINE = 64 * 1024,        /* header or SSE line */
    MAX_ERR_BODY = 512,          /* bytes of an error body kept for the message */
    MAX_BODY = 64 * 1024 * 1024, /* non-streamed body */
};

/* Where the response parser is (td__bench_parse). */
typedef enum state {
    S_STATUS,
    S_HEADERS,
    S_BODY_CL,    /* Content-Length bytes left in `remain` */
    S_BODY_EOF,   /* body until the connection closes */
    S_CHUNK_SIZE, /* reading a chunk-size line */
    S_CHUNK_DATA, /* `remain` bytes of chunk data left */
    S_CHUNK_CRLF, /* the CRLF after chunk data */
    S_TRAILER,    /* trailer lines after the last chunk */
} state_t;

typedef struct conn conn_t;

/* The client: one target, its connections, and the read buffer they share. Loop thread only. */
struct td_bench_client {
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    td_bench_target_t t;
    td_buf_t head; /* request head up to (not including) Content-Length */
    td_bench_done_cb cb;
    void *arg;
    conn_t *idle; /* idle keep-alive connections (singly linked through next) */
    conn_t *all;  /* every open connection (doubly linked) */
    size_t inflight, nconns;
    size_t alive; /* connection structs not yet freed (open or closing) */
    bool closing;
    char rbuf[RBUF_SIZE]; /* every read lands here and is consumed in its callback */
};

/* One connection and the request it carries. Loop thread only. */
struct conn {
    int fd;           /* the socket, -1 before connecting; closed after `poll` is */
    uv_poll_t poll;   /* readiness of fd (initialised at connect: has_poll) */
    uv_timer_t timer; /* the request's deadline */
    td_bench_client_t *cl;
    td_bench_result_t *r; /* the request on this connection, or NULL when idle */
    conn_t *next;         /* idle list */
    conn_t *all_prev, *all_next;
    td_buf_t wbuf; /* request bytes */
    size_t woff;   /* bytes of wbuf already written */
    td_buf_t line; /* a header, chunk-size or SSE line that straddles reads */
    td_buf_t sse;  /* an SSE line that straddles reads */
    td_buf_t body; /* non-streamed body, or the start of an error body */
    state_t st;
    int status;
    int64_t remain;
    uint64_t send_ns, last_ns; /* monotonic ns: request sent, last chunk with choices */
    int handles;               /* open uv handles (timer, poll) */
    int poll_events;           /* what `poll` currently waits for */
    bool stream, chat, has_poll, connecting, writing, chunked, has_len, keepalive, got_bytes,
        reused, first, closing;
};

/* ---- client.c */

/* Close the connection; it must carry no request. Freed once its handles have closed. */
void td__bench_conn_close(conn_t *c);
/* The request on `c` is over (r->err says how). Hands the connection back (idle when reusable,
 * else closed) before calling the user's callback, which may submit more work. */
void td__bench_finish(conn_t *c, bool reusable);
/* Fail the request on `c` with `kind` and a printf message, and close the connection. */
void td__bench_fail(conn_t *c, td_bench_err_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- client_parse.c */

/* Parse [p, p+n) for the request on c (now: monotonic ns of the read); stops when the request is
 * over (completed or failed). */
void td__bench_parse(conn_t *c, const char *p, size_t n, uint64_t now);
/* The response on c is whole (at the end of its body, or at EOF for a read-to-close body): fill
 * in the result and finish the request. */
void td__bench_complete(conn_t *c, uint64_t now);

#endif

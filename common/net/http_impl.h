/* http_impl.h: what the HTTP server's two files share: http.c (connections, writing, responses,
 * streams, the server) and http_parse.c (requests: heads, bodies, the accessors, the route).
 * Loop thread only. */
#ifndef TD_HTTP_IMPL_H
#define TD_HTTP_IMPL_H

#include "td_http.h"
#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

/* picohttpparser's chunked decoder (http_parse.c declares its functions): the fields as in every
 * release; newer ones append counters, which `reserve` leaves room for. Zeroed before a body. */
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk;
    char consume_trailer;
    char hex_count;
    char state;
    uint64_t reserve[4];
};

enum {
    HEAD_MAX = 64 << 10,     /* bytes of a request head */
    HEADERS_MAX = 100,       /* header lines of a request */
    READ_BUF = 64 << 10,     /* the server's read buffer: every read lands there first */
    KEEP_CAP = 256 << 10,    /* a buffer grown past this by a burst is released when emptied */
    REQ_TIMEOUT_MS = 10000,  /* a request head, or a body's next bytes, must come within this */
    LINGER_MS = 2000,        /* longest wait for the client's close after the last response */
};

enum { C_HEAD, C_BODY, C_CHUNKED, C_HANDLING, C_LINGER };

typedef struct span {
    uint32_t off, len;
} span_t;

struct td_http_req {
    struct conn *c;
    td_buf_t raw; /* the request's bytes: head, then the (decoded) body */
    span_t method, path, query, hname[HEADERS_MAX], hval[HEADERS_MAX];
    bool has_query;
    size_t nh;
    size_t body_off, body_len;
    td_buf_t hdrs; /* response headers added by the handler, "name: value\r\n" each */
    bool answered;
    bool head_only; /* HEAD: the response goes without its body */
    bool http10;
    void (*on_gone)(void *ud); /* td_http_req_watch */
    void *gone_ud;
    bool gone_due; /* the client was gone when the watch began: told from the idle pass */
};

struct td_http_stream {
    struct conn *c;
    td_buf_t pending; /* bytes queued this iteration, unframed */
    bool active;      /* started, its end not written yet */
    bool ended;       /* td_http_stream_end called */
    bool canceled;
    bool chunked; /* HTTP/1.1: chunked framing; HTTP/1.0: raw bytes until the close */
    void (*on_cancel)(td_http_stream_t *st, void *ud);
    void *ud;
};

typedef struct conn {
    uv_tcp_t tcp; /* must be first */
    uv_timer_t timer;
    uv_shutdown_t shut;
    td_http_server_t *s;
    struct conn *prev, *next;       /* the server's connections */
    struct conn *dirty_next;        /* the server's `dirty` list */
    int state;
    int open;        /* libuv handles not closed yet */
    int hold;        /* callbacks running that may answer: not freed under them */
    bool dirty;      /* on the dirty list */
    bool parsing;    /* in process_input: answers are written when it returns */
    bool resume;     /* parse buffered input at the next idle pass */
    bool closing;    /* handles being closed */
    bool keep_alive; /* the current request allows another after it */
    bool peer_eof;   /* the client closed (or reset) its side */
    bool reading;
    bool shut_done;
    td_buf_t in;    /* bytes read and not yet given to a request */
    size_t last_len; /* of `in`, seen by the last incomplete head parse */
    size_t head_len; /* BODY, CHUNKED: the head's bytes at the front of `in` */
    size_t body_len; /* BODY: Content-Length; CHUNKED: decoded so far, right after the head
                      * (the bytes not decoded yet follow it) */
    struct phr_chunked_decoder dec;
    td_buf_t out; /* framed bytes to write, ahead of the stream's pending ones */
    size_t wq;    /* bytes handed to uv_write and not written yet */
    struct td_http_req req;
    struct td_http_stream st;
} conn_t;

typedef struct route {
    char *path;
    size_t path_len;
    td_http_handler_fn fn;
    void *ud;
    struct route *next;
} route_t;

struct td_http_server {
    uv_loop_t *loop;
    size_t max_body;
    char *server_name;
    route_t *routes;
    uv_tcp_t listener;
    uv_idle_t flush; /* active while `dirty` holds connections: writes them next iteration */
    conn_t *dirty;
    conn_t *conns;
    size_t n_conns;
    bool listening;
    bool closing;
    bool flush_closed;
    char *rbuf;     /* [READ_BUF], shared by the connections (one loop thread) */
    time_t date_at; /* the second `date` was formatted for */
    char date[40];
};

/* http.c */
/* An error the server itself answers (bad framing, limits) on the request being read, with the
 * OpenAI-style body; the connection closes after it. */
void td__http_error_close(conn_t *c, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void td__http_timer_arm(conn_t *c, uint64_t ms);
/* Empty b, releasing its storage when a burst grew it past KEEP_CAP. */
void td__http_buf_trim(td_buf_t *b);

/* http_parse.c */
/* Parse and hand to its route every request `in` holds whole, while c is between requests. */
void td__http_process(conn_t *c);

#endif

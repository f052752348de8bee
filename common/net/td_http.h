/* td_http.h: the HTTP/1.1 server every daemon runs (the router's API, every daemon's /metrics and
 * /health), on the daemon's libuv loop (request heads parsed by picohttpparser, from libh2o).
 *
 * Routes are exact paths. A handler answers at once (td_http_respond*) or starts a stream
 * (td_http_stream_start) that the daemon feeds later from the loop (server-sent events). Request
 * bodies (sized or chunked) arrive whole, up to `max_body` bytes; larger ones are refused with 413
 * before the handler runs. Keep-alive, pipelining, HEAD and HTTP/1.0 clients are served; errors
 * the server answers itself (400, 413, 417, 431) have OpenAI-style JSON bodies. Connections are
 * read throughout, so a client that goes away is seen at once: mid-stream it triggers the stream's
 * on_cancel, before its answer the watch's on_gone.
 *
 * Threading: loop thread only. Ownership: a td_http_req_t is valid until it has been answered
 * (or, when streaming, until td_http_stream_end); response bytes are copied.
 */
#ifndef TD_HTTP_H
#define TD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "td_util.h" /* td_buf_t */

typedef struct td_http_server td_http_server_t;
typedef struct td_http_req td_http_req_t;
typedef struct td_http_stream td_http_stream_t;

/* Handle one request. It must answer (respond or start a stream) before returning or later from
 * the loop. */
typedef void (*td_http_handler_fn)(td_http_req_t *req, void *ud);

typedef struct td_http_opts {
    size_t max_body;        /* largest request body accepted, bytes; 0 = 16 MiB */
    const char *server_name; /* Server header; NULL = "tandem" */
} td_http_opts_t;

td_http_server_t *td_http_server_new(uv_loop_t *loop, const td_http_opts_t *opts);
/* Route requests for `path` (exact match, query string ignored) to fn. 0, TD_ENOMEM. */
int td_http_route(td_http_server_t *s, const char *path, td_http_handler_fn fn, void *ud);
/* Listen on "host:port" (port 0 picks one). Call after the routes are added. */
int td_http_listen(td_http_server_t *s, const char *addr);
int td_http_port(const td_http_server_t *s);
/* Stop accepting, close idle connections; the server is freed once every connection is gone. */
void td_http_server_close(td_http_server_t *s);

/* Request accessors. Strings are not NUL-terminated: use the lengths. */
const char *td_http_method(const td_http_req_t *r, size_t *len);
const char *td_http_path(const td_http_req_t *r, size_t *len);  /* without the query string */
const char *td_http_query(const td_http_req_t *r, size_t *len); /* after '?', or NULL */
const char *td_http_body(const td_http_req_t *r, size_t *len);
bool td_http_method_is(const td_http_req_t *r, const char *method);
/* Value of a request header (case-insensitive name), or NULL. */
const char *td_http_header(const td_http_req_t *r, const char *name, size_t *len);
/* Peer address as text ("127.0.0.1:5555") into out. */
void td_http_peer(const td_http_req_t *r, char *out, size_t n);

/* Watch the client of a request not answered yet (a whole response built later): if it closes
 * (or shuts down its sending side of) its connection first, on_gone(ud) runs once, from the loop.
 * Answering the request (td_http_respond*, td_http_stream_start) ends the watch. Returns 0. */
int td_http_req_watch(td_http_req_t *r, void (*on_gone)(void *ud), void *ud);

/* Add a response header before responding. */
void td_http_add_header(td_http_req_t *r, const char *name, const char *value);
/* Answer with a complete body (copied). */
void td_http_respond(td_http_req_t *r, int status, const char *content_type, const char *body,
                     size_t len);
/* Answer with an OpenAI-style error: {"error":{"message","type","param","code"}}. `param` and
 * `code` may be NULL (rendered as null). */
void td_http_respond_error(td_http_req_t *r, int status, const char *type, const char *param,
                           const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Start a streamed response (e.g. text/event-stream). on_cancel runs once if the client goes
 * away before td_http_stream_end; after it, writes fail with TD_ECANCELED but the caller still
 * calls td_http_stream_end to release the stream. */
td_http_stream_t *td_http_stream_start(td_http_req_t *r, int status, const char *content_type,
                                       void (*on_cancel)(td_http_stream_t *st, void *ud),
                                       void *ud);
/* Queue bytes (copied). What a stream queues in one loop iteration is written at the start of the
 * next, in one piece. 0, TD_ECANCELED, TD_ENOMEM. */
int td_http_stream_write(td_http_stream_t *st, const void *data, size_t len);
/* The same for a buffer the caller fills again and again: its bytes are queued and it is left
 * empty (the stream may take its storage and hand back an empty one of its own, so nothing is
 * copied). 0, TD_ECANCELED (b is left as it was), TD_ENOMEM. */
int td_http_stream_write_buf(td_http_stream_t *st, td_buf_t *b);
/* Bytes queued and not yet handed to the socket (back-pressure signal). */
size_t td_http_stream_pending(const td_http_stream_t *st);
/* Finish the response (what is queued goes out with the end, at the start of the next loop
 * iteration) and release the stream. */
void td_http_stream_end(td_http_stream_t *st);

#endif

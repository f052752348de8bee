/* td_rpc.h: authenticated control-plane connections over libuv (TCP or unix sockets).
 *
 * Every connection carries length-prefixed tandem.Frame messages (td_frame.h). Before anything
 * else the two sides run a mutual HMAC-SHA256 challenge over the shared cluster secret:
 *
 *   server -> client  AuthChallenge { nonce: 32 random bytes, protocol_version }
 *   client -> server  AuthResponse  { client_nonce, worker_id,
 *                                     mac = HMAC(secret, "tandem-auth-v1 client" nonce client_nonce id) }
 *   server -> client  AuthResult    { ok, message,
 *                                     mac = HMAC(secret, "tandem-auth-v1 server" client_nonce nonce) }
 *
 * A connection whose peer sends anything else first, a wrong MAC, a frame over the size limit or
 * bytes that are not a Frame is closed with a clear status (TD_EAUTH, TD_EPROTO) through on_close;
 * nothing else on the loop is affected. A handshake that does not finish within its deadline is
 * closed with TD_ETIMEDOUT. Without a secret neither side starts (TD_EAUTH): there is no
 * unauthenticated mode.
 *
 * Rotation: a server may hold a previous secret besides the current one and accepts a client
 * that proves either; its own proof uses the secret that client used, so a client with only the
 * old or only the new secret both connect while a rotation is under way.
 *
 * Servers (routers) accept many connections. Clients (workers, CLI) connect to one address and,
 * when `reconnect` is set, reconnect with exponential backoff after any failure or close until
 * td_rpc_client_stop.
 *
 * Ownership: the library allocates td_rpc_conn_t and frees it after on_close returns. Frames
 * handed to on_frame are valid only during the callback. td_rpc_send copies what it sends.
 * All functions must be called on the loop's thread.
 */
#ifndef TD_RPC_H
#define TD_RPC_H

#include "control.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct td_rpc_conn td_rpc_conn_t;
typedef struct td_rpc_server td_rpc_server_t;
typedef struct td_rpc_client td_rpc_client_t;

typedef struct td_rpc_callbacks {
    /* The peer authenticated; frames may flow. */
    void (*on_ready)(td_rpc_conn_t *c, void *ud);
    /* One frame from an authenticated peer. The frame is freed after the callback returns. */
    void (*on_frame)(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud);
    /* The connection is gone: status 0 for an orderly close, else a TD_E* code (td_err_msg-like
     * text in td_rpc_conn_reason). Called once per connection that was accepted or connected,
     * whether or not it became ready. The conn is freed after this returns. */
    void (*on_close)(td_rpc_conn_t *c, int status, void *ud);
} td_rpc_callbacks_t;

typedef struct td_rpc_opts {
    const uint8_t *secret;     /* cluster secret, secret_len bytes; required */
    size_t secret_len;
    const uint8_t *secret_prev; /* server: the previous secret, also accepted while a rotation
                                   is under way (NULL: none); clients use `secret` only */
    size_t secret_prev_len;
    size_t max_frame;          /* largest frame payload accepted, bytes; 0 = TD_FRAME_DEFAULT_MAX */
    uint64_t handshake_ms;     /* deadline for the handshake; 0 = 5000 */
    const char *id;            /* client: worker id sent in AuthResponse */
    td_rpc_callbacks_t cb;
    void *ud;                  /* passed to every callback */
} td_rpc_opts_t;

/* Parse "host:port", "tcp://host:port", "[v6]:port" or "unix:/path". 0 or TD_EINVAL. */
typedef struct td_rpc_addr {
    bool is_unix;
    char path[108];            /* unix socket path */
    struct sockaddr_storage sa; /* TCP address */
} td_rpc_addr_t;
int td_rpc_addr_parse(const char *text, td_rpc_addr_t *out);

/* Start listening. On success *out is a server owned by the caller (td_rpc_server_close). */
int td_rpc_server_start(uv_loop_t *loop, const char *addr, const td_rpc_opts_t *opts,
                        td_rpc_server_t **out);
/* Replace the secrets a server accepts (a rotation: the new one and, until every client has it,
 * the previous one; prev may be NULL). Connections already authenticated stay. Copies both.
 * 0, TD_EAUTH (no secret), TD_ENOMEM. */
int td_rpc_server_set_secrets(td_rpc_server_t *s, const uint8_t *secret, size_t len,
                              const uint8_t *prev, size_t prev_len);
/* The TCP port actually bound (useful with port 0), or 0 for unix sockets. */
int td_rpc_server_port(const td_rpc_server_t *s);
/* Stop listening and close every connection (each gets on_close with TD_ECLOSED); the server is
 * freed once everything is closed. */
void td_rpc_server_close(td_rpc_server_t *s);

/* Connect (and keep reconnecting when `reconnect`). On success *out is owned by the caller
 * (td_rpc_client_stop). Every attempt ends in on_close, including one whose connect failed
 * (TD_ECONNREFUSED, TD_EUNREACH) and so never became ready. */
int td_rpc_client_start(uv_loop_t *loop, const char *addr, const td_rpc_opts_t *opts,
                        bool reconnect, td_rpc_client_t **out);
/* The currently connected and authenticated conn, or NULL. */
td_rpc_conn_t *td_rpc_client_conn(td_rpc_client_t *cl);
/* Number of connection attempts made so far (for tests and status). */
uint64_t td_rpc_client_attempts(const td_rpc_client_t *cl);
/* Stop reconnecting, close the connection; freed once closed. */
void td_rpc_client_stop(td_rpc_client_t *cl);

/* Queue one frame for sending. The frames a connection is sent in one loop iteration leave
 * together in one write at the start of the next iteration (the loop does not block first), or at
 * once past 256 KiB; closing the connection writes them first. 0, TD_ECLOSED when the conn is
 * closing, TD_EAGAIN before the handshake finished, TD_ENOMEM. */
int td_rpc_send(td_rpc_conn_t *c, const Tandem__Frame *f);
/* Write the frames sent so far now instead of at the next loop iteration (what the kernel does
 * not take at once stays queued in the loop). */
void td_rpc_conn_flush(td_rpc_conn_t *c);
/* Close a connection (on_close follows with `status`). */
void td_rpc_conn_close(td_rpc_conn_t *c, int status, const char *reason);
/* The authenticated peer id (client's worker_id as seen by the server), "" before auth. */
const char *td_rpc_conn_peer_id(const td_rpc_conn_t *c);
/* Why the connection closed, "" when it has not. */
const char *td_rpc_conn_reason(const td_rpc_conn_t *c);
/* Bytes sent and not yet written to the kernel (back-pressure signal). */
size_t td_rpc_conn_write_queue(const td_rpc_conn_t *c);
/* A per-connection user pointer, NULL at first. */
void td_rpc_conn_set_data(td_rpc_conn_t *c, void *data);
void *td_rpc_conn_get_data(const td_rpc_conn_t *c);

/* The cluster secret every daemon and client needs: `secret` (the option's text) when set, else
 * the contents of `file` when set, else $CREDENTIALS_DIRECTORY/cluster-secret (systemd's
 * LoadCredential=) when that exists. Surrounding whitespace is trimmed; fewer than 16 bytes is
 * refused. On success *out (heap, caller frees) and *len. 0, TD_EAUTH (none configured or too
 * short, td_err_msg says which), TD_EIO / TD_ENOENT naming the file. */
int td_rpc_secret_load(const char *secret, const char *file, uint8_t **out, size_t *len);

#endif

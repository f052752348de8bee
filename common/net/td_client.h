/* td_client.h: the C client of a router's internal RPC (Generate, Cancel, Tokenize, Status),
 * used by `tandem ctl` and by services that call tandem without HTTP.
 *
 * The client owns a private libuv loop and one authenticated connection (td_rpc: the cluster
 * secret's HMAC challenge). Calls are blocking from the caller's point of view; several generate
 * requests can run at once: start them with td_client_generate_start, then td_client_wait runs
 * the connection until all of them have finished, calling each one's chunk callback as TokenChunk
 * frames arrive. Not thread-safe: one thread per client.
 */
#ifndef TD_CLIENT_H
#define TD_CLIENT_H

#include "control.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_client td_client_t;

/* Connect to a router's rpc address ("host:port" or "unix:/path") and authenticate within
 * timeout_s. 0 or TD_ECONNREFUSED / TD_EAUTH / TD_ETIMEDOUT ... with td_err_msg saying why. */
int td_client_open(const char *addr, const uint8_t *secret, size_t secret_len, const char *id,
                   double timeout_s, td_client_t **out);
void td_client_close(td_client_t *c);

/* Called for every TokenChunk of a request (valid during the call only). Return nonzero to cancel
 * the request (a Cancel goes to the router; the request then ends with TD_ECANCELED). */
typedef int (*td_client_chunk_fn)(const Tandem__TokenChunk *chunk, void *ud);

/* Start a Generate request. The client chooses req->request_id when it is 0 (written back).
 * 0, or TD_ECLOSED when the connection is gone. */
int td_client_generate_start(td_client_t *c, Tandem__GenerateRequest *req, td_client_chunk_fn fn,
                             void *ud);
/* Run until every started request has finished, or timeout_s passes (then the rest are canceled
 * and fail with TD_ETIMEDOUT). Returns 0 when all ended normally, else the first failure. */
int td_client_wait(td_client_t *c, double timeout_s);
/* The outcome of a finished request: 0, or a TD_E* code with its message in *msg (owned by the
 * client, valid until close). TD_ENOENT when the id is unknown. */
int td_client_result(td_client_t *c, uint64_t request_id, const char **msg);
/* Start one request and wait for it. */
int td_client_generate(td_client_t *c, Tandem__GenerateRequest *req, td_client_chunk_fn fn,
                       void *ud, double timeout_s);

/* Tokenize text (ids != NULL: detokenize them instead). The response is the caller's to free
 * with tandem__tokenize_response__free_unpacked. */
int td_client_tokenize(td_client_t *c, const char *text, bool add_special, const int32_t *ids,
                       size_t n_ids, double timeout_s, Tandem__TokenizeResponse **out);

/* The router's view of the cluster, after applying a drain (`drain_worker` non-NULL) or undrain;
 * with the sequences in flight when `with_requests`. Free with
 * tandem__status_response__free_unpacked. */
int td_client_status(td_client_t *c, const char *drain_worker, bool undrain, bool with_requests,
                     double timeout_s, Tandem__StatusResponse **out);

#endif

/* decode.h: the parts of tandem-decode. A decode worker takes DecodeTask (task.c): it reserves
 * the prompt's blocks for a prefill worker's pushes (recv.c) or prefills the prompt itself on the
 * shared worker core (common/worker/); then the sequence runs in the continuous batch, one token
 * per step, each token streamed to the router until it finishes (stream.c). */
#ifndef TD_DECODE_H
#define TD_DECODE_H

#include "td_worker.h"

/* task.c: a DecodeTask from router rt. */
void td_decode_on_task(td_worker_t *w, td_wk_router_t *rt, const Tandem__Frame *f);

/* recv.c: KV pushed into our pool, the blocks' lifetime, the wait deadline. */
void td_decode_on_kv_recv(td_kvx_t *kvx, td_kvx_peer_t *peer, const td_kvx_recv_t *r, void *arg);
bool td_decode_blocks_busy(const td_worker_t *w, const td_wk_seq_t *s);
void td_decode_sweep(td_worker_t *w, double now);

/* stream.c: tokens to the router. */
void td_decode_report_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg);
/* The first token (sampled here after a local prefill, or by the prefill worker): stream it,
 * then run or finish. */
void td_decode_first_token(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *smp);
void td_decode_decoded(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *out);

#endif

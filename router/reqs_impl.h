/* reqs_impl.h: what the parts of the request state machine share, and nothing else includes.
 *
 *   reqs.c         the sequence id table, frames to workers, leaving workers, ending a job
 *   reqs_job.c     the front ends' side: td_job_* (new, prompt, stop strings, start, abort, free)
 *   reqs_place.c   placing sequences on workers and the waiting queue
 *   reqs_worker.c  frames from workers, worker failures and retries
 *   reqs_text.c    generated tokens to text: detokenization, stop strings, finishing a sequence
 *   reqs_sweep.c   deadlines and shutdown
 *
 * Everything runs on the router's loop thread.
 */
#ifndef TD_ROUTER_REQS_IMPL_H
#define TD_ROUTER_REQS_IMPL_H

#include "router.h"

/* ---- reqs.c ---------------------------------------------------------------------------------- */

/* Enter s under its current id (s->id != 0) in the id table. */
void td__reqs_hash_add(td_router_t *rt, td_seq_t *s);
/* Remove s from the id table (nothing when unplaced) and set its id to 0. */
void td__reqs_hash_del(td_router_t *rt, td_seq_t *s);
/* The sequence whose current attempt has router id `id`, or NULL (id 0: NULL). */
td_seq_t *td__reqs_find(td_router_t *rt, uint64_t id);

/* Send one frame to worker w: the only way frames for requests reach workers. 0, TD_ECLOSED
 * when w is NULL or its connection is gone, or td_rpc_send's error. The frame is copied. */
int td__reqs_send(td_worker_t *w, Tandem__Frame *f);
/* Send Cancel{id} to w (nothing when w is gone). */
void td__reqs_send_cancel(td_worker_t *w, uint64_t id);

/* The tokens a task for s carries: its prompt, then (migration) the tokens generated so far,
 * *n in all. Returns s->prompt when nothing was generated, else a new array the caller frees
 * (*owned, else NULL); NULL on allocation failure. */
const int32_t *td__reqs_task_tokens(const td_seq_t *s, size_t *n, int32_t **owned);

/* The sequence leaves the waiting queue and its workers (Cancel to each that still holds it when
 * `cancel`), forgets its id and is unplaced again (TD_SEQ_NEW). */
void td__reqs_detach(td_router_t *rt, td_seq_t *s, bool cancel);
/* Take j off rt->jobs (and rt->aborts when queued there). */
void td__reqs_job_unlink(td_router_t *rt, td_job_t *j);
/* End j with a failure: cancel every unfinished sequence, count it, call ops->fail. Nothing when
 * it ended already. After this the job is the front end's to free. */
void td__reqs_job_fail(td_job_t *j, int http_status, int code, const char *msg);
/* The one line logged for every request that ends (INFO): both ids, the outcome (`http_status`
 * 0: ok, with the first sequence's finish reason; else the status and `err`), usage as the
 * client's response counts it, the workers of the last attempt, TTFT and end-to-end seconds. */
void td__reqs_log_end(const td_job_t *j, int http_status, const char *err);
/* When every sequence of j finished: end it and call ops->done. */
void td__reqs_job_maybe_done(td_job_t *j);

/* ---- reqs_place.c ---------------------------------------------------------------------------- */

/* Put s in the waiting queue, at the tail (`at_head` false: a new arrival) or at the head
 * (`at_head`: it was taken from the head and still found no worker, so the order is kept). Its
 * list of decode workers already tried is cleared: capacity may appear on any of them. */
void td__reqs_wait_insert(td_router_t *rt, td_seq_t *s, bool at_head);
/* Take s out of the waiting queue (nothing when it is not waiting); it is TD_SEQ_NEW again. */
void td__reqs_wait_del(td_router_t *rt, td_seq_t *s);
/* Remember that decode worker w refused s (ENOSPC) or could not be reached, so this placement
 * round skips it. 0 or TD_ENOMEM. */
int td__reqs_add_tried(td_seq_t *s, const td_worker_t *w);
/* Choose a worker of `role` for s among those the placement policy allows (decode: not yet
 * tried by s; prefill: same layout fingerprint as `pair`), `amount` KV blocks (decode) or prompt
 * tokens (prefill). The chosen worker's pending load grows. NULL when none is eligible. */
td_worker_t *td__reqs_choose(td_router_t *rt, int role, td_seq_t *s, const td_worker_t *pair,
                             uint64_t amount);
/* Try to place s on a decode worker: 0 (DecodeTask sent, TD_SEQ_ACCEPTING), TD_ENOSPC when no
 * decode worker can take it now, TD_ERANGE (td_err_msg says why) when none ever could, or
 * TD_ENOMEM. */
int td__reqs_place(td_router_t *rt, td_seq_t *s);
/* Place s or, when no worker can take it now, queue it. `admit` applies the waiting limit (new
 * requests); re-queued sequences were admitted already. 0, TD_EBUSY (queue full) or
 * td__reqs_place's other errors. */
int td__reqs_place_or_wait(td_router_t *rt, td_seq_t *s, bool admit);

/* ---- reqs_worker.c --------------------------------------------------------------------------- */

/* A worker failed s (died, stalled, missed a deadline, refused a prefill, could not be
 * reached). Re-place it on another pair, within migration.max_attempts: from the start when it
 * has generated nothing, else (migration.enabled) resumed with the prompt plus every token so far,
 * so the client's stream continues from the next token. A decode worker still registered
 * (s->dw set: it stalled) is skipped by this placement round. Otherwise fail the job (503,
 * `why`). Returns whether the job still exists. */
bool td__reqs_retry(td_router_t *rt, td_seq_t *s, const char *why);

/* ---- reqs_text.c ----------------------------------------------------------------------------- */

/* One generated token of s from its decode worker, with its logprob record (NULL unless asked):
 * detokenize, look for stop strings, hand the client what is safe to release. Returns false when
 * the sequence or the whole job ended (stop string, or a token outside the vocabulary). */
bool td__reqs_token(td_router_t *rt, td_seq_t *s, int32_t id, const Tandem__TokenLogprob *lp);
/* s ended (the worker finished it when `stop` is NULL, else stop string `stop` did): release the
 * rest of its text, count it, report ops->finish. The job may be complete afterwards
 * (td__reqs_job_maybe_done). */
void td__reqs_finish(td_router_t *rt, td_seq_t *s, td_resp_finish_t why, const char *stop);

/* ---- reqs_sweep.c ---------------------------------------------------------------------------- */

/* Whether the current attempt of s has missed the deadline of its stage at time `now` (c's
 * deadline.* options): reservation (DecodeTask sent, no answer), prefill (no PrefillDone), KV
 * handoff (PrefillDone, no token), first token (accepted, no token), token stall (no token since
 * the last). Returns `why` filled with a message naming the worker and the option, or NULL. */
const char *td__reqs_stage_late(const td_router_cfg_t *c, const td_seq_t *s, double now,
                                char *why, size_t cap);

/* ---- reqs_job.c ------------------------------------------------------------------------------ */

/* The defer timer's callback: fail every job whose abort was requested. */
void td__reqs_on_defer(uv_timer_t *t);

#endif

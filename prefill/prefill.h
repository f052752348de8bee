/* prefill.h: the parts of tandem-prefill. A prefill worker takes PrefillTask (task.c), computes
 * the prompt chunk by chunk on the shared worker core (common/worker/), pushes each block into
 * the decode worker's pool as soon as it is full and the rest with the first token after the last
 * chunk (push.c), and reports PrefillDone. */
#ifndef TD_PREFILL_H
#define TD_PREFILL_H

#include "td_worker.h"

/* task.c: a PrefillTask from router rt. */
void td_prefill_on_task(td_worker_t *w, td_wk_router_t *rt, const Tandem__Frame *f);

/* push.c */
/* PrefillDone{status, message} for request `req` (the one builder of that frame): through s's
 * router with s's transfer figures when s is given, else to rt (a task refused before it had a
 * sequence). */
void td_prefill_send_done(td_wk_router_t *rt, td_wk_seq_t *s, uint64_t req, int status,
                          const char *msg);
/* role callbacks */
void td_prefill_report_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg);
void td_prefill_abandon(td_worker_t *w, td_wk_seq_t *s);
void td_prefill_chunk_done(td_worker_t *w, td_wk_seq_t *s);
void td_prefill_prefilled(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *first);

#endif

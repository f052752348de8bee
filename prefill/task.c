/* task.c: a PrefillTask: admit the prompt (its cached prefix, and the blocks the router's fetch
 * hint says another worker holds), check the decode worker's block list, connect to the decode
 * worker's data plane, and queue the prompt for the scheduler. */
#include "prefill.h"
#include "td_error.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void td_prefill_on_task(td_worker_t *w, td_wk_router_t *rt, const Tandem__Frame *f)
{
    const Tandem__PrefillTask *t = f->prefill_task;
    int code;
    td_wk_seq_t *s = td_wk_seq_new(w, rt, t->request_id, t->tokens, t->n_tokens, t->sampling,
                                   &t->tenant, &code);
    if (!s) {
        td_prefill_send_done(rt, NULL, t->request_id, code, td_err_msg());
        return;
    }
    s->state = TD_WK_PREFILL;
    if (td_wk_seq_resume(w, s, t->generated, t->sampling)) {
        td_wk_seq_fail(w, s, TD_EINVAL, td_err_msg());
        return;
    }
    int need = (s->n_prompt + w->layout.block_size - 1) / w->layout.block_size;
    if ((int)t->n_dst_blocks != need) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%zu destination blocks for a prompt of %d blocks",
                 t->n_dst_blocks, need);
        td_wk_seq_fail(w, s, TD_EINVAL, msg);
        return;
    }
    s->dst = td_calloc((size_t)need, sizeof(uint32_t));
    if (!s->dst) {
        td_wk_seq_fail(w, s, TD_ENOMEM, "out of memory");
        return;
    }
    memcpy(s->dst, t->dst_blocks, (size_t)need * sizeof(uint32_t));
    s->n_dst = need;
    s->dst_req = t->decode_request_id;
    /* the cached prefix, leaving at least the last token to compute (its logits) */
    td_wk_cache_admit(w, s, s->n_prompt - 1);
    /* what another worker holds beyond that, when the router found one (fetch.c) */
    td_wk_fetch_start(w, s, t->fetch);
    int rc = td_kvx_connect(w->kvx, t->decode_blob.data, t->decode_blob.len, &s->peer);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "cannot reach decode worker %s: %s", t->decode_worker,
                 td_err_msg());
        td_wk_seq_fail(w, s, rc, msg);
        return;
    }
    td_wk_schedule(w);
}

/* task.c: a DecodeTask: admit the prompt and either queue it for local prefill or reserve its
 * blocks for the prefill worker's pushes, answering DecodeAccept with the block ids. */
#include "decode.h"
#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>

void td_decode_on_task(td_worker_t *w, td_wk_router_t *rt, const Tandem__Frame *f)
{
    const Tandem__DecodeTask *t = f->decode_task;
    int code;
    td_wk_seq_t *s = td_wk_seq_new(w, rt, t->request_id, t->tokens, t->n_tokens, t->sampling,
                                   &t->tenant, &code);
    if (!s) {
        td_wk_send_error(rt, t->request_id, code, td_err_msg());
        return;
    }
    if (td_wk_seq_resume(w, s, t->generated, t->sampling)) {
        td_wk_send_error(rt, t->request_id, TD_EINVAL, td_err_msg());
        s->state = TD_WK_PREFILL; /* nothing reserved: free at once */
        td_wk_seq_kill(w, s);
        return;
    }
    Tandem__DecodeAccept acc = TANDEM__DECODE_ACCEPT__INIT;
    acc.request_id = t->request_id;
    acc.worker_request_id = s->id;
    uint32_t *ids = NULL;
    if (t->local_prefill) {
        s->state = TD_WK_PREFILL;
        /* the cached prefix, leaving at least the last token to compute (its logits), then what
         * another worker holds beyond it when the router found one (fetch.c) */
        td_wk_cache_admit(w, s, s->n_prompt - 1);
        td_wk_fetch_start(w, s, t->fetch);
    } else {
        int rc = td_kv_seq_reserve(&w->pool, &s->kv, s->n_prompt);
        ids = td_calloc((size_t)TD_MAX(s->kv.n_blocks, 1), sizeof(uint32_t));
        if (rc || !ids) {
            free(ids);
            td_wk_send_error(rt, t->request_id, rc ? rc : TD_ENOMEM,
                             rc ? "no free KV blocks for the prompt" : "out of memory");
            s->state = TD_WK_PREFILL; /* nothing will arrive: free at once */
            td_wk_seq_kill(w, s);
            return;
        }
        for (int i = 0; i < s->kv.n_blocks; i++)
            ids[i] = (uint32_t)s->kv.blocks[i];
        acc.n_blocks = (size_t)s->kv.n_blocks;
        acc.blocks = ids;
        s->state = TD_WK_WAIT_KV;
        s->kv_deadline = td_now_s() + w->cfg.kv_wait_s;
    }
    Tandem__Frame fr = TANDEM__FRAME__INIT;
    fr.body_case = TANDEM__FRAME__BODY_DECODE_ACCEPT;
    fr.decode_accept = &acc;
    td_wk_send(s, &fr);
    free(ids);
    td_wk_schedule(w);
}

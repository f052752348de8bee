/* push.c: a prefill worker's side of the KV handoff. After every chunk the blocks that are full
 * go to the decode worker's pool (they will not change again); after the last chunk the rest go
 * with a KvNote carrying the first token and the total block count; PrefillDone follows when
 * every push has completed. A canceled prefill sends an aborted last note so the decode worker
 * frees its reserved blocks. */
#include "prefill.h"
#include "td_error.h"
#include "td_kvx.h"
#include "td_util.h"

#include <stdlib.h>

/* What a push's completion needs to find its sequence again (the sequence may be gone). */
typedef struct push_ctx {
    td_worker_t *w;
    uint64_t seq_id;
    uint32_t n;
} push_ctx_t;

void td_prefill_send_done(td_wk_router_t *rt, td_wk_seq_t *s, uint64_t req, int status,
                          const char *msg)
{
    Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
    d.request_id = req;
    d.status = status;
    d.message = (char *)(msg ? msg : "");
    if (s && s->t_push0 > 0) {
        d.kv_bytes = s->push_bytes;
        d.kv_seconds = td_now_s() - s->t_push0;
        d.compute_seconds = s->t_push0 - s->t_start;
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
    f.prefill_done = &d;
    if (s)
        td_wk_send(s, &f);
    else if (rt && rt->conn)
        td_rpc_send(rt->conn, &f);
}

void td_prefill_report_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg)
{
    (void)w;
    td_prefill_send_done(s->rt, s, s->req, code, msg);
}

/* Every push of s completed: report, then free. */
static void prefill_done(td_worker_t *w, td_wk_seq_t *s)
{
    double kv_s = td_now_s() - s->t_push0;
    td_prefill_send_done(s->rt, s, s->req, s->push_status,
                         s->push_status ? td_strerror(s->push_status) : "");
    td_metric_add(s->push_status ? w->m.req_fail : w->m.req_ok, 1);
    td_metric_observe(w->m.xfer_s, kv_s);
    if (!s->push_status)
        td_metric_observe(w->m.tail_s, td_now_s() - s->t_final);
    td_wk_seq_kill(w, s);
}

static void on_push_done(int status, void *arg)
{
    push_ctx_t *pc = arg;
    td_worker_t *w = pc->w;
    td_wk_seq_t *s = td_wk_seq_find(w, pc->seq_id);
    if (s) {
        s->pushes_out--;
        if (status && !s->push_status)
            s->push_status = status;
        if (!status) {
            s->push_bytes += (uint64_t)pc->n * w->layout.block_bytes;
            td_metric_add(w->m.xfer_bytes, (double)pc->n * w->layout.block_bytes);
        }
        if (s->dead)
            td_wk_seq_maybe_free(w, s);
        else if (s->state == TD_WK_PUSHING && s->pushes_out == 0)
            prefill_done(w, s);
    }
    free(pc);
}

/* Push our blocks [s->pushed, upto) to the decode worker, with a note. 0 or TD_E*. */
static int push_blocks(td_worker_t *w, td_wk_seq_t *s, int upto, const Tandem__KvNote *note)
{
    int n = upto - s->pushed;
    if (n <= 0)
        return 0;
    uint8_t nb[TD_KVX_NOTE_MAX];
    size_t nl = tandem__kv_note__get_packed_size(note);
    if (nl > sizeof(nb))
        return td_err_set(TD_EOVERFLOW, "KV note of %zu bytes", nl);
    tandem__kv_note__pack(note, nb);
    uint32_t *src = td_calloc((size_t)n, sizeof(uint32_t));
    push_ctx_t *pc = td_calloc(1, sizeof(*pc));
    if (!pc || !src) {
        free(pc);
        free(src);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        src[i] = (uint32_t)s->kv.blocks[s->pushed + i];
    *pc = (push_ctx_t){w, s->id, (uint32_t)n};
    if (s->pushes_out == 0 && s->pushed == 0)
        s->t_push0 = td_now_s();
    int rc = td_kvx_push(s->peer, src, s->dst + s->pushed, (uint32_t)n, nb, (uint32_t)nl,
                         w->cfg.kv_checksum ? TD_KVX_F_CSUM : 0, on_push_done, pc);
    free(src);
    if (rc) {
        free(pc);
        return rc;
    }
    s->pushed = upto;
    s->sent += n;
    s->pushes_out++;
    return 0;
}

void td_prefill_chunk_done(td_worker_t *w, td_wk_seq_t *s)
{
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    note.request_id = s->dst_req;
    int rc = push_blocks(w, s, s->stored / w->layout.block_size, &note);
    if (rc)
        td_wk_seq_fail(w, s, rc, td_err_msg());
}

/* The last push always exists (it re-sends the final block when every block already went), so
 * the note always arrives, and it announces how many blocks the decode worker must have received
 * before it may use them. */
void td_prefill_prefilled(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *first)
{
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    int32_t ids[TD_SAMPLER_MAX_LOGPROBS];
    float lps[TD_SAMPLER_MAX_LOGPROBS];
    note.request_id = s->dst_req;
    note.last = true;
    note.cached_tokens = (uint32_t)s->cached_tokens;
    note.first_token = first->token;
    note.first_logprob = first->logprob;
    for (int k = 0; k < first->n_top; k++) {
        ids[k] = first->top[k].id;
        lps[k] = first->top[k].logprob;
    }
    note.n_top_ids = note.n_top_logprobs = (size_t)first->n_top;
    note.top_ids = ids;
    note.top_logprobs = lps;
    if (s->pushed == s->n_dst)
        s->pushed--;
    note.total_blocks = (uint32_t)(s->sent + (s->n_dst - s->pushed));
    s->state = TD_WK_PUSHING;
    s->t_final = td_now_s();
    /* tell the router the prompt is done: only the handoff remains */
    Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
    d.request_id = s->req;
    d.computed = true;
    d.message = "";
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
    f.prefill_done = &d;
    td_wk_send(s, &f);
    int rc = push_blocks(w, s, s->n_dst, &note);
    if (rc)
        td_wk_seq_fail(w, s, rc, td_err_msg());
}

/* One last push (of any block: the decode worker discards it) whose note is marked aborted. */
void td_prefill_abandon(td_worker_t *w, td_wk_seq_t *s)
{
    if (!s->peer || s->n_dst == 0 || s->state == TD_WK_PUSHING)
        return;
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    note.request_id = s->dst_req;
    note.last = note.aborted = true;
    note.total_blocks = (uint32_t)s->sent + 1;
    uint8_t nb[64];
    size_t nl = tandem__kv_note__pack(&note, nb);
    uint32_t src = s->kv.n_blocks > 0 ? (uint32_t)s->kv.blocks[0] : 0, dst = s->dst[0];
    push_ctx_t *pc = td_calloc(1, sizeof(*pc));
    if (!pc)
        return;
    *pc = (push_ctx_t){w, s->id, 0};
    if (td_kvx_push(s->peer, &src, &dst, 1, nb, (uint32_t)nl, 0, on_push_done, pc) == 0)
        s->pushes_out++;
    else
        free(pc);
}

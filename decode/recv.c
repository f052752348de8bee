/* recv.c: a decode worker's side of the KV handoff. Pushes may complete in any order: the
 * sequence counts the blocks that arrived and runs only when the last note has come and the count
 * matches its total. Reserved blocks are never reused while a prefill worker may still write into
 * them: until that note (or an aborted one) has arrived, or kv.wait_s has passed. */
#include "decode.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>

bool td_decode_blocks_busy(const td_worker_t *w, const td_wk_seq_t *s)
{
    (void)w;
    return s->state == TD_WK_WAIT_KV && !(s->kv_total >= 0 && s->kv_recv >= s->kv_total) &&
           td_now_s() < s->kv_deadline;
}

/* Every block is in: join the running batch with the prefill worker's first token. */
static void kv_complete(td_worker_t *w, td_wk_seq_t *s)
{
    if (s->dead || s->kv_aborted) {
        td_wk_seq_kill(w, s);
        return;
    }
    Tandem__KvNote *nt = s->note;
    if (nt->first_token < 0 || nt->first_token >= w->mc->vocab_size) {
        td_wk_seq_fail(w, s, TD_EPROTO, "the prefill worker sent an invalid first token");
        return;
    }
    s->kv.n_tokens = s->stored = s->n_prompt;
    s->cached_tokens = (int)nt->cached_tokens;
    td_wk_cache_publish(w, s);
    td_sample_t smp = {.token = nt->first_token, .logprob = nt->first_logprob};
    smp.n_top = (int)TD_MIN(nt->n_top_ids, (size_t)TD_SAMPLER_MAX_LOGPROBS);
    smp.n_top = (int)TD_MIN((size_t)smp.n_top, nt->n_top_logprobs);
    for (int k = 0; k < smp.n_top; k++)
        smp.top[k] = (td_logprob_t){nt->top_ids[k], nt->top_logprobs[k]};
    smp.finish = td_sampler_accept(&s->smp, smp.token);
    if (smp.finish == TD_FINISH_NONE && s->n_toks + 1 >= w->mc->max_ctx)
        smp.finish = TD_FINISH_LENGTH;
    td_decode_first_token(w, s, &smp);
    td_wk_schedule(w);
}

void td_decode_on_kv_recv(td_kvx_t *kvx, td_kvx_peer_t *peer, const td_kvx_recv_t *r, void *arg)
{
    (void)kvx;
    (void)peer;
    td_worker_t *w = arg;
    if (r->note_len == 0) {
        if (r->status)
            TD_LOG_W("a KV transfer failed before naming its request: %s",
                     td_strerror(r->status));
        return;
    }
    Tandem__KvNote *nt = tandem__kv_note__unpack(NULL, r->note_len, r->note);
    if (!nt) {
        TD_LOG_W("a KV push carried a malformed note (%u bytes)", r->note_len);
        return;
    }
    td_wk_seq_t *s = td_wk_seq_find(w, nt->request_id);
    if (!s || s->state != TD_WK_WAIT_KV) {
        tandem__kv_note__free_unpacked(nt, NULL);
        return; /* canceled and freed already (its deadline passed) */
    }
    td_metric_add(w->m.recv_bytes, (double)r->n_blocks * w->layout.block_bytes);
    s->kv_recv += (int)r->n_blocks;
    if (r->status) {
        char msg[160];
        snprintf(msg, sizeof(msg), "KV transfer from the prefill worker failed: %s",
                 td_strerror(r->status));
        td_wk_seq_fail(w, s, r->status, msg);
    }
    if (nt->last) {
        s->kv_total = (int)nt->total_blocks;
        s->kv_aborted = nt->aborted;
        if (s->note)
            tandem__kv_note__free_unpacked(s->note, NULL);
        s->note = nt;
        nt = NULL;
    }
    if (nt)
        tandem__kv_note__free_unpacked(nt, NULL);
    if (s->kv_total >= 0 && s->kv_recv >= s->kv_total)
        kv_complete(w, s);
    else if (s->dead)
        td_wk_seq_maybe_free(w, s);
}

/* Sequences whose prefill worker never finished. */
void td_decode_sweep(td_worker_t *w, double now)
{
    td_wk_seq_t *next;
    for (td_wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->state == TD_WK_WAIT_KV && now >= s->kv_deadline) {
            if (!s->dead)
                td_wk_seq_fail(w, s, TD_ETIMEDOUT, "the prompt's KV did not arrive in time");
            else
                td_wk_seq_maybe_free(w, s);
        }
    }
}

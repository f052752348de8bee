/* structured.c: structured outputs on the sampling worker: the model's vocabulary as a byte trie
 * (from the model directory's tokenizer, built once, at the first request that asks) and each
 * such request's schema compiled into a token mask for its sampler (td_jsonfsm.h). */
#include "td_error.h"
#include "td_log.h"
#include "td_tokenizer.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>
#include <string.h>

static int build_trie(td_worker_t *w)
{
    if (w->vocab_trie)
        return 0;
    if (w->vocab_trie_failed)
        return td_err_set(TD_ENOENT, "structured outputs: the model's tokenizer did not load");
    td_tokenizer_t *tok;
    double t0 = td_now_s();
    int rc = td_tokenizer_load(w->cfg.model, &tok);
    if (rc) {
        w->vocab_trie_failed = true;
        return td_err_set(rc, "structured outputs need the model's tokenizer: %s", td_err_msg());
    }
    int V = w->mc->vocab_size;
    uint8_t **bytes = td_calloc((size_t)V, sizeof(uint8_t *));
    uint32_t *lens = td_calloc((size_t)V, sizeof(uint32_t));
    td_buf_t b;
    td_buf_init(&b);
    rc = bytes && lens ? 0 : td_err_set(TD_ENOMEM, "out of memory");
    size_t tv = td_tokenizer_vocab_size(tok);
    for (int id = 0; !rc && id < V && (size_t)id < tv; id++) {
        if (td_tokenizer_is_special(tok, id))
            continue; /* never text: EOS is allowed by the mask's own rule */
        b.len = 0;
        if (td_tokenizer_token_bytes(tok, id, &b) || !b.len)
            continue;
        if (!(bytes[id] = td_calloc(b.len, 1))) {
            rc = td_err_set(TD_ENOMEM, "out of memory");
            break;
        }
        memcpy(bytes[id], b.data, b.len);
        lens[id] = (uint32_t)b.len;
    }
    if (!rc)
        rc = td_vocab_trie_build((const uint8_t *const *)bytes, lens, V, &w->vocab_trie);
    for (int id = 0; bytes && id < V; id++)
        free(bytes[id]);
    free(bytes);
    free(lens);
    td_buf_free(&b);
    td_tokenizer_free(tok);
    if (rc)
        w->vocab_trie_failed = true;
    else
        TD_LOG_I("structured outputs: vocabulary trie of %d tokens, %d nodes in %.2fs", V,
                 td_vocab_trie_size(w->vocab_trie), td_now_s() - t0);
    return rc;
}

int td_wk_structured(td_worker_t *w, td_wk_seq_t *s, const td_sampling_t *p)
{
    if (!p->json_mode)
        return 0;
    int rc = build_trie(w);
    if (rc)
        return rc;
    /* compiled per request (a schema compiles in microseconds); the mask caches per state */
    td_jsonfsm_t *f;
    if ((rc = td_jsonfsm_compile(p->json_mode == 2 ? p->json_schema : NULL,
                                 p->json_mode == 2 ? p->json_schema_len : 0, &f)))
        return rc;
    td_jsonmask_t *m;
    if ((rc = td_jsonmask_new(f, w->vocab_trie, p->eos_id, true, &m))) {
        td_jsonfsm_free(f);
        return rc;
    }
    return td_sampler_set_mask(&s->smp, m);
}

void td_wk_structured_free(td_worker_t *w)
{
    td_vocab_trie_free(w->vocab_trie);
    w->vocab_trie = NULL;
}

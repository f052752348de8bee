/* tokenizer_load_added.c: the "added_tokens" section of tokenizer.json: HF's id assignment, the
 * normalized form of each token, and the two tries encode matches them with. */
#include "td_error.h"
#include "tokenizer_load_impl.h"

#include "td_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int trie_node(td__trie_t *t, uint8_t byte)
{
    if (t->nnodes == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        struct td__trie_node *n = td_reallocarray(t->nodes, cap, sizeof(*n));
        if (!n)
            return TD_ENOMEM;
        t->nodes = n;
        t->cap = cap;
    }
    t->nodes[t->nnodes] = (struct td__trie_node){-1, -1, -1, byte};
    return (int)t->nnodes++;
}

static int trie_insert(td__trie_t *t, const uint8_t *s, size_t n, int32_t added)
{
    if (!t->nnodes && trie_node(t, 0) < 0)
        return TD_ENOMEM;
    if (!n)
        return 0;
    if (!(t->first[s[0] >> 3] & (1u << (s[0] & 7)))) {
        t->nfirst++;
        t->first_byte = s[0];
    }
    t->first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[cur].first_child, prev = -1;
        while (c >= 0 && t->nodes[c].byte != s[i]) {
            prev = c;
            c = t->nodes[c].next_sibling;
        }
        if (c < 0) {
            int nn = trie_node(t, s[i]);
            if (nn < 0)
                return TD_ENOMEM;
            c = nn;
            if (prev < 0)
                t->nodes[cur].first_child = c;
            else
                t->nodes[prev].next_sibling = c;
        }
        cur = c;
    }
    if (t->nodes[cur].added < 0) /* the first pattern wins among equal strings */
        t->nodes[cur].added = added;
    return 0;
}

static int normalize_str(int flags, const char *s, size_t n, td_buf_t *out)
{
    if (!flags)
        return td_buf_append(out, s, n);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)flags);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM ? TD_ENOMEM : TD_EINVAL;
    int rc = td_buf_append(out, dst, (size_t)r);
    free(dst);
    return rc;
}

int td__parse_added(td__ld_t *L, json_object *arr)
{
    td_tokenizer_t *tok = L->tok;
    int rc;
    if (arr && (rc = td__want_type(L, arr, json_type_array, "added_tokens")))
        return rc;
    size_t n = arr ? json_object_array_length(arr) : 0;
    tok->added = td_calloc(n ? n : 1, sizeof(*tok->added));
    if (!tok->added || (rc = td__strmap_init(&tok->added_map, n)))
        return TD_ENOMEM;
    td_buf_t nb;
    td_buf_init(&nb);
    for (size_t i = 0; i < n && !rc; i++) {
        json_object *a = json_object_array_get_idx(arr, i);
        char path[64];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        if ((rc = td__want_type(L, a, json_type_object, path)))
            break;
        td__added_t at = {0};
        const char *content;
        size_t clen;
        json_object *jid = td__tok_jget(a, "id");
        if (!jid || !json_object_is_type(jid, json_type_int)) {
            rc = td_err_set(TD_EPARSE, "%s: field \"%s.id\": expected int, got %s", L->file, path,
                            jid ? td__jtype_name(jid) : "nothing");
            break;
        }
        if ((rc = td__req_string(L, a, "content", path, &content, &clen)) ||
            (rc = td__opt_bool(L, a, "special", path, false, &at.special)) ||
            (rc = td__opt_bool(L, a, "lstrip", path, false, &at.lstrip)) ||
            (rc = td__opt_bool(L, a, "rstrip", path, false, &at.rstrip)) ||
            (rc = td__opt_bool(L, a, "single_word", path, false, &at.single_word)) ||
            (rc = td__opt_bool(L, a, "normalized", path, !at.special, &at.normalized)))
            break;
        if (!clen)
            continue;                   /* HF ignores empty tokens */
        for (size_t k = 0; k < clen;) { /* raw invalid bytes: HF (serde) rejects them too */
            size_t l = td_utf8_valid_len((const uint8_t *)content + k, clen - k);
            if (!l) {
                rc = td_err_set(TD_EPARSE, "%s: field \"%s.content\": not valid UTF-8", L->file,
                                path);
                break;
            }
            k += l;
        }
        if (rc)
            break;
        /* HF's id assignment: an existing added/vocab token keeps its id, a new one takes the
         * next id past the model vocabulary. The file's "id" is only checked. */
        int32_t ai = td__strmap_get(tok, &tok->added_map, content, clen);
        int32_t id = ai >= 0 ? tok->added[ai].id : td__strmap_get(tok, &tok->vocab, content, clen);
        if (id < 0) {
            int64_t max = -1;
            for (size_t k = 0; k < tok->nadded; k++)
                max = TD_MAX(max, (int64_t)tok->added[k].id);
            int64_t vs = (int64_t)tok->model_vocab_n;
            id = (int32_t)(max < 0 ? vs : (max >= vs || vs == 0) ? max + 1 : vs);
        }
        if (json_object_get_int64(jid) != id)
            TD_LOG_W(
                "%s: added token \"%s\" has id %lld in the file, but HF tokenizers assigns %d; "
                "using %d",
                L->file, content, (long long)json_object_get_int64(jid), id, id);
        at.id = id;
        if ((rc = td__arena_add(tok, content, clen, &at.off)))
            break;
        at.len = (uint32_t)clen;
        td_buf_reset(&nb);
        if ((rc = normalize_str(tok->norm_utf8proc, content, clen, &nb)) ||
            (rc = td__arena_add(tok, nb.data ? nb.data : "", nb.len, &at.noff)))
            break;
        at.nlen = (uint32_t)nb.len;
        size_t idx;
        if (ai >= 0) {
            idx = (size_t)ai; /* same content again: the later entry's flags win */
        } else {
            idx = tok->nadded++;
            td__strmap_put(tok, &tok->added_map, at.off, at.len, (int32_t)idx);
        }
        tok->added[idx] = at;
        if ((rc = td__ensure_id(tok, id)))
            break;
        td__idinfo_t *ii = &tok->ids[id];
        ii->added = (int32_t)idx;
        ii->tok_off = at.off; /* HF's id_to_token looks at added tokens first */
        ii->tok_len = at.len;
    }
    td_buf_free(&nb);
    if (rc)
        return rc;
    /* HF's order: special tokens, then the others; each partitioned by `normalized` */
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < tok->nadded; k++) {
            td__added_t *at = &tok->added[k];
            if (at->special != (pass == 0))
                continue;
            td__trie_t *t = at->normalized ? &tok->trie_norm : &tok->trie_raw;
            const char *s = tok->arena + (at->normalized ? at->noff : at->off);
            size_t sl = at->normalized ? at->nlen : at->len;
            if ((rc = trie_insert(t, (const uint8_t *)s, sl, (int32_t)k)))
                return rc;
        }
    return 0;
}

/* tokenizer_load_model.c: the "model" section of tokenizer.json: the BPE vocabulary (with the
 * decoded bytes of each token) and the merges. */
#include "td_error.h"
#include "tokenizer_load_impl.h"

#include <string.h>

/* Make ids[0..id] exist (new ones: no token), growing geometrically. */
int td__ensure_id(td_tokenizer_t *tok, int64_t id)
{
    if ((size_t)id < tok->nids)
        return 0;
    static const td__idinfo_t none = {.tok_len = UINT32_MAX, .added = -1};
    size_t nn = (size_t)id + 1;
    if (nn > tok->ids_cap) {
        size_t cap = TD_MAX(nn, tok->ids_cap * 2);
        td__idinfo_t *ni = td_reallocarray(tok->ids, cap, sizeof(*ni));
        if (!ni)
            return TD_ENOMEM;
        tok->ids = ni;
        tok->ids_cap = cap;
    }
    for (size_t i = tok->nids; i < nn; i++)
        tok->ids[i] = none;
    tok->nids = nn;
    return 0;
}

static int add_model_token(td__ld_t *L, const char *s, size_t n, int64_t id,
                           const char *key_for_msg)
{
    td_tokenizer_t *tok = L->tok;
    if (id < 0 || id >= INT32_MAX)
        return td_err_set(TD_EPARSE,
                          "%s: field \"model.vocab\": id %lld of token \"%s\" out of range",
                          L->file, (long long)id, key_for_msg);
    int rc = td__ensure_id(tok, id);
    if (rc)
        return rc;
    uint32_t off;
    rc = td__arena_add(tok, s, n, &off);
    if (rc)
        return rc;
    td__strmap_put(tok, &tok->vocab, off, (uint32_t)n, (int32_t)id);
    td__idinfo_t *ii = &tok->ids[id];
    ii->tok_off = off;
    ii->tok_len = (uint32_t)n;
    /* decoded bytes: the byte-level inverse when every char is a byte-level char, else the raw
     * text (HF ByteLevel decoder) */
    uint8_t tmp[1024];
    size_t nb = 0;
    bool all = n <= sizeof(tmp);
    for (size_t i = 0; all && i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)s + i, n - i);
        int b = l ? td__byte_of_char(td_utf8_decode((const uint8_t *)s + i, l)) : -1;
        if (b < 0)
            all = false;
        else
            tmp[nb++] = (uint8_t)b;
        i += l ? l : 1;
    }
    if (all) {
        if ((rc = td__arena_add(tok, tmp, nb, &ii->dec_off)))
            return rc;
        ii->dec_len = (uint32_t)nb;
    } else {
        ii->dec_off = off;
        ii->dec_len = (uint32_t)n;
    }
    return 0;
}

static int parse_merge(td__ld_t *L, json_object *m, size_t i, const char **a, size_t *an,
                       const char **b, size_t *bn)
{
    if (json_object_is_type(m, json_type_string)) {
        const char *s = json_object_get_string(m);
        size_t n = (size_t)json_object_get_string_len(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return td_err_set(
                TD_EPARSE,
                "%s: field \"model.merges[%zu]\": expected \"left right\", got \"%.80s\"", L->file,
                i, s);
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = n - *an - 1;
        return 0;
    }
    if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
        json_object *x = json_object_array_get_idx(m, 0), *y = json_object_array_get_idx(m, 1);
        if (json_object_is_type(x, json_type_string) && json_object_is_type(y, json_type_string)) {
            *a = json_object_get_string(x);
            *an = (size_t)json_object_get_string_len(x);
            *b = json_object_get_string(y);
            *bn = (size_t)json_object_get_string_len(y);
            return 0;
        }
    }
    return td_err_set(TD_EPARSE,
                      "%s: field \"model.merges[%zu]\": expected \"a b\" or [\"a\", \"b\"], got %s",
                      L->file, i, td__jtype_name(m));
}

int td__parse_model(td__ld_t *L, json_object *m)
{
    td_tokenizer_t *tok = L->tok;
    int rc;
    if (!m)
        return td_err_set(TD_EPARSE, "%s: field \"model\": missing", L->file);
    if ((rc = td__want_type(L, m, json_type_object, "model")))
        return rc;
    json_object *t = td__tok_jget(m, "type");
    if (t && (!json_object_is_type(t, json_type_string) ||
              strcmp(json_object_get_string(t), "BPE") != 0))
        return td_err_set(TD_ENOTSUP,
                          "%s: field \"model.type\": model \"%s\" is not supported (BPE only)",
                          L->file, json_object_get_string(t));
    json_object *dropout = td__tok_jget(m, "dropout");
    if (dropout && !(json_object_is_type(dropout, json_type_double) ||
                     json_object_is_type(dropout, json_type_int)))
        return td_err_set(TD_EPARSE, "%s: field \"model.dropout\": expected number, got %s",
                          L->file, td__jtype_name(dropout));
    if (dropout && json_object_get_double(dropout) > 0.0)
        return td_err_set(TD_ENOTSUP, "%s: field \"model.dropout\": BPE dropout is not supported",
                          L->file);
    bool byte_fallback, fuse_unk;
    if ((rc = td__opt_bool(L, m, "byte_fallback", "model", false, &byte_fallback)) ||
        (rc = td__opt_bool(L, m, "fuse_unk", "model", false, &fuse_unk)) ||
        (rc = td__opt_bool(L, m, "ignore_merges", "model", false, &tok->ignore_merges)))
        return rc;
    if (byte_fallback)
        return td_err_set(TD_ENOTSUP, "%s: field \"model.byte_fallback\": not supported", L->file);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        json_object *v = td__tok_jget(m, affixes[i]);
        if (v && (!json_object_is_type(v, json_type_string) || json_object_get_string_len(v) != 0))
            return td_err_set(TD_ENOTSUP, "%s: field \"model.%s\": only null or \"\" is supported",
                              L->file, affixes[i]);
    }
    json_object *vocab = td__tok_jget(m, "vocab");
    if ((rc = td__want_type(L, vocab, json_type_object, "model.vocab")))
        return rc;
    size_t nv = (size_t)json_object_object_length(vocab);
    if ((rc = td__strmap_init(&tok->vocab, nv)))
        return rc;
    json_object_object_foreach(vocab, key, val)
    {
        if (!json_object_is_type(val, json_type_int))
            return td_err_set(TD_EPARSE,
                              "%s: field \"model.vocab\": id of token \"%s\": expected int, got %s",
                              L->file, key, td__jtype_name(val));
        /* keys come from json-c's hash: their length is strlen, which is exact for vocab tokens
         * since the byte-level alphabet has no NUL */
        if ((rc = add_model_token(L, key, strlen(key), json_object_get_int64(val), key)))
            return rc;
    }
    tok->model_vocab_n = tok->vocab.n;

    json_object *merges = td__tok_jget(m, "merges");
    if (merges && (rc = td__want_type(L, merges, json_type_array, "model.merges")))
        return rc;
    size_t nm = merges ? json_object_array_length(merges) : 0;
    if (nm > TD__MERGE_RANKS)
        return td_err_set(TD_EPARSE, "%s: field \"model.merges\": %zu merges; at most %d are supported",
                          L->file, nm, TD__MERGE_RANKS);
    if ((rc = td__mergemap_init(&tok->merges, nm)))
        return rc;
    td_buf_t cat;
    td_buf_init(&cat);
    for (size_t i = 0; i < nm; i++) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if ((rc = parse_merge(L, json_object_array_get_idx(merges, i), i, &a, &an, &b, &bn)))
            break;
        int32_t ia = td__strmap_get(tok, &tok->vocab, a, an);
        int32_t ib = td__strmap_get(tok, &tok->vocab, b, bn);
        td_buf_reset(&cat);
        if ((rc = td_buf_append(&cat, a, an)) || (rc = td_buf_append(&cat, b, bn)))
            break;
        int32_t ic = td__strmap_get(tok, &tok->vocab, cat.data, cat.len);
        if (ia < 0 || ib < 0 || ic < 0) {
            rc = td_err_set(TD_EPARSE,
                            "%s: field \"model.merges[%zu]\": token \"%.*s\" is not in model.vocab",
                            L->file, i,
                            (int)TD_MIN(ia < 0   ? an
                                        : ib < 0 ? bn
                                                 : cat.len,
                                        200),
                            ia < 0   ? a
                            : ib < 0 ? b
                                     : cat.data);
            break;
        }
        if (ia > TD__MERGE_ID_MAX || ib > TD__MERGE_ID_MAX) {
            rc = td_err_set(TD_EPARSE,
                            "%s: field \"model.merges[%zu]\": token id %d is above %d, the largest "
                            "a merge may use",
                            L->file, i, TD_MAX(ia, ib), TD__MERGE_ID_MAX);
            break;
        }
        td__mergemap_put(&tok->merges, ia, ib, (uint32_t)i, ic);
    }
    td_buf_free(&cat);
    if (rc)
        return rc;
    td__mergemap_done(&tok->merges, nm);

    tok->unk_id = -1;
    json_object *unk = td__tok_jget(m, "unk_token");
    if (unk) {
        if ((rc = td__want_type(L, unk, json_type_string, "model.unk_token")))
            return rc;
        tok->unk_id = td__strmap_get(tok, &tok->vocab, json_object_get_string(unk),
                                     (size_t)json_object_get_string_len(unk));
    }
    for (int b = 0; b < 256; b++)
        tok->byte_id[b] =
            td__strmap_get(tok, &tok->vocab, tok->byte_char[b], tok->byte_char_len[b]);
    return 0;
}

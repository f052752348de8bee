/* tokenizer_load_post.c: what decides the ids around the text and the way back: the
 * "post_processor" and "decoder" sections of tokenizer.json, and tokenizer_config.json (whose
 * add_bos_token / add_eos_token replace the post-processor's ids). */
#include "td_error.h"
#include "tokenizer_load_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- post-processor */

static int push_ids(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *a = td_reallocarray(*arr, *n + 1, sizeof(int32_t));
    if (!a)
        return TD_ENOMEM;
    a[(*n)++] = id;
    *arr = a;
    return 0;
}

int td__parse_post(td__ld_t *L, json_object *p, const char *path)
{
    td_tokenizer_t *tok = L->tok;
    if (!p)
        return 0;
    int rc = td__want_type(L, p, json_type_object, path);
    if (rc)
        return rc;
    const char *type;
    size_t tl;
    if ((rc = td__req_string(L, p, "type", path, &type, &tl)))
        return rc;
    char pp[256];
    if (strcmp(type, "ByteLevel") == 0)
        return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        snprintf(pp, sizeof(pp), "%s.processors", path);
        json_object *arr = td__tok_jget(p, "processors");
        if ((rc = td__want_type(L, arr, json_type_array, pp)))
            return rc;
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            if ((rc = td__parse_post(L, json_object_array_get_idx(arr, i), pi)))
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        int32_t ids[2];
        static const char *const keys[] = {"cls", "sep"};
        for (int k = 0; k < 2; k++) {
            json_object *v = td__tok_jget(p, keys[k]);
            snprintf(pp, sizeof(pp), "%s.%s", path, keys[k]);
            if (!v || !json_object_is_type(v, json_type_array) ||
                json_object_array_length(v) != 2 ||
                !json_object_is_type(json_object_array_get_idx(v, 1), json_type_int))
                return td_err_set(TD_EPARSE, "%s: field \"%s\": expected [\"token\", id]", L->file,
                                  pp);
            ids[k] = json_object_get_int(json_object_array_get_idx(v, 1));
        }
        if ((rc = push_ids(&tok->prefix, &tok->nprefix, ids[0])))
            return rc;
        return push_ids(&tok->suffix, &tok->nsuffix, ids[1]);
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        snprintf(pp, sizeof(pp), "%s.single", path);
        json_object *single = td__tok_jget(p, "single"), *sp = td__tok_jget(p, "special_tokens");
        if ((rc = td__want_type(L, single, json_type_array, pp)))
            return rc;
        bool seen_seq = false;
        for (size_t i = 0; i < json_object_array_length(single); i++) {
            json_object *piece = json_object_array_get_idx(single, i);
            char pi[300];
            snprintf(pi, sizeof(pi), "%s[%zu]", pp, i);
            json_object *st = td__tok_jget(piece, "SpecialToken"), *seq = td__tok_jget(piece, "Sequence");
            if (seq) {
                if (seen_seq)
                    return td_err_set(TD_ENOTSUP,
                                      "%s: field \"%s\": more than one sequence in a template",
                                      L->file, pi);
                seen_seq = true;
                continue;
            }
            const char *name;
            size_t nl;
            if (!st || (rc = td__req_string(L, st, "id", pi, &name, &nl)))
                return rc ? rc
                          : td_err_set(TD_EPARSE,
                                       "%s: field \"%s\": expected SpecialToken or Sequence",
                                       L->file, pi);
            json_object *def = td__tok_jget(sp, name), *ids = td__tok_jget(def, "ids");
            if (!ids || !json_object_is_type(ids, json_type_array))
                return td_err_set(TD_EPARSE, "%s: field \"%s.special_tokens\": no ids for \"%s\"",
                                  L->file, path, name);
            for (size_t k = 0; k < json_object_array_length(ids); k++) {
                json_object *v = json_object_array_get_idx(ids, k);
                if (!json_object_is_type(v, json_type_int))
                    return td_err_set(TD_EPARSE,
                                      "%s: field \"%s.special_tokens.%s.ids[%zu]\": expected int",
                                      L->file, path, name, k);
                if ((rc = push_ids(seen_seq ? &tok->suffix : &tok->prefix,
                                   seen_seq ? &tok->nsuffix : &tok->nprefix,
                                   json_object_get_int(v))))
                    return rc;
            }
        }
        return 0;
    }
    return td_err_set(TD_ENOTSUP, "%s: field \"%s.type\": post-processor \"%s\" is not supported",
                      L->file, path, type);
}

/* ---------------------------------------------------------------- tokenizer_config.json */

/* bos_token and friends: a string, or {"content": ...} (AddedToken form), or null. */
static int config_token(td__ld_t *L, json_object *cfg, const char *key, int32_t *id)
{
    td_tokenizer_t *tok = L->tok;
    json_object *v = td__tok_jget(cfg, key);
    *id = -1;
    if (!v)
        return 0;
    if (json_object_is_type(v, json_type_object))
        v = td__tok_jget(v, "content");
    if (!v || !json_object_is_type(v, json_type_string))
        return td_err_set(TD_EPARSE, "%s: field \"%s\": expected string or {\"content\": string}",
                          L->file, key);
    *id = td_tokenizer_token_to_id(tok, json_object_get_string(v),
                                   (size_t)json_object_get_string_len(v));
    return 0;
}

int td__parse_config(td__ld_t *L, json_object *cfg)
{
    td_tokenizer_t *tok = L->tok;
    int rc = td__want_type(L, cfg, json_type_object, "(top level)");
    if (rc)
        return rc;
    if ((rc = config_token(L, cfg, "bos_token", &tok->bos_id)) ||
        (rc = config_token(L, cfg, "eos_token", &tok->eos_id)) ||
        (rc = config_token(L, cfg, "pad_token", &tok->pad_id)) ||
        (rc = config_token(L, cfg, "unk_token", &tok->cfg_unk_id)) ||
        (rc = td__opt_bool(L, cfg, "split_special_tokens", "(top level)", false,
                           &tok->split_special)))
        return rc;
    /* transformers rebuilds the post-processor from add_bos_token / add_eos_token when the config
     * sets them (LlamaTokenizerFast and newer generic backends): [bos] $A [eos]. */
    json_object *ab = td__tok_jget(cfg, "add_bos_token"), *ae = td__tok_jget(cfg, "add_eos_token");
    if (!ab && !ae)
        return 0;
    bool add_bos, add_eos;
    if ((rc = td__opt_bool(L, cfg, "add_bos_token", "(top level)", false, &add_bos)) ||
        (rc = td__opt_bool(L, cfg, "add_eos_token", "(top level)", false, &add_eos)))
        return rc;
    if (add_bos && tok->bos_id < 0)
        return td_err_set(
            TD_EPARSE, "%s: field \"add_bos_token\": true, but bos_token is not a token", L->file);
    if (add_eos && tok->eos_id < 0)
        return td_err_set(
            TD_EPARSE, "%s: field \"add_eos_token\": true, but eos_token is not a token", L->file);
    tok->nprefix = tok->nsuffix = 0;
    if (add_bos && (rc = push_ids(&tok->prefix, &tok->nprefix, tok->bos_id)))
        return rc;
    if (add_eos && (rc = push_ids(&tok->suffix, &tok->nsuffix, tok->eos_id)))
        return rc;
    return 0;
}

int td__parse_decoder(td__ld_t *L, json_object *d, const char *path)
{
    if (!d)
        return td_err_set(TD_ENOTSUP, "%s: field \"%s\": missing (a ByteLevel decoder is required)",
                          L->file, path);
    int rc = td__want_type(L, d, json_type_object, path);
    const char *type;
    size_t tl;
    if (rc || (rc = td__req_string(L, d, "type", path, &type, &tl)))
        return rc;
    if (strcmp(type, "ByteLevel") == 0)
        return 0;
    if (strcmp(type, "Sequence") == 0) {
        char pp[256];
        snprintf(pp, sizeof(pp), "%s.decoders", path);
        json_object *arr = td__tok_jget(d, "decoders");
        if ((rc = td__want_type(L, arr, json_type_array, pp)))
            return rc;
        if (json_object_array_length(arr) != 1)
            return td_err_set(TD_ENOTSUP,
                              "%s: field \"%s\": only a single ByteLevel decoder is supported",
                              L->file, pp);
        snprintf(pp, sizeof(pp), "%s.decoders[0]", path);
        return td__parse_decoder(L, json_object_array_get_idx(arr, 0), pp);
    }
    return td_err_set(TD_ENOTSUP, "%s: field \"%s.type\": decoder \"%s\" is not supported", L->file,
                      path, type);
}

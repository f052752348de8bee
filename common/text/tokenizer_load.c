/* tokenizer_load.c: reading tokenizer.json and tokenizer_config.json into a td_tokenizer_t.
 *
 * Every field is checked for its type; an error names the file and the field, in the dotted form
 * of the JSON path ("model.merges[12]", "pre_tokenizer.pretokenizers[1].pattern.Regex"). */
#include "td_error.h"
#include "tokenizer_load_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- JSON helpers */

const char *td__jtype_name(json_object *o)
{
    return o ? json_type_to_name(json_object_get_type(o)) : "null";
}

/* Field `key` of object `o` (NULL if absent or JSON null). */
json_object *td__tok_jget(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v))
        return v;
    return NULL;
}

int td__want_type(td__ld_t *L, json_object *v, json_type t, const char *field)
{
    if (!v || !json_object_is_type(v, t))
        return td_err_set(TD_EPARSE, "%s: field \"%s\": expected %s, got %s", L->file, field,
                          json_type_to_name(t), td__jtype_name(v));
    return 0;
}

/* Optional boolean: absent/null gives `dflt`. */
int td__opt_bool(td__ld_t *L, json_object *o, const char *key, const char *path, bool dflt,
                 bool *out)
{
    json_object *v = td__tok_jget(o, key);
    *out = dflt;
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return td_err_set(TD_EPARSE, "%s: field \"%s.%s\": expected boolean, got %s", L->file, path,
                          key, td__jtype_name(v));
    *out = json_object_get_boolean(v);
    return 0;
}

int td__req_string(td__ld_t *L, json_object *o, const char *key, const char *path, const char **s,
                   size_t *n)
{
    json_object *v = td__tok_jget(o, key);
    if (!v || !json_object_is_type(v, json_type_string))
        return td_err_set(TD_EPARSE, "%s: field \"%s.%s\": expected string, got %s", L->file, path,
                          key, v ? td__jtype_name(v) : "nothing");
    *s = json_object_get_string(v);
    *n = (size_t)json_object_get_string_len(v);
    return 0;
}

static int parse_json(const char *file, const char *text, size_t len, json_object **out)
{
    if (len > INT32_MAX)
        return td_err_set(TD_EOVERFLOW, "%s: file too large (%zu bytes)", file, len);
    json_tokener *t = json_tokener_new_ex(64);
    if (!t)
        return TD_ENOMEM;
    json_object *o = json_tokener_parse_ex(t, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(t);
    if (!o && e == json_tokener_continue)
        e = json_tokener_error_parse_eof;
    if (!o || e != json_tokener_success) {
        int rc = td_err_set(TD_EPARSE, "%s: invalid JSON at byte %zu: %s", file,
                            json_tokener_get_parse_end(t), json_tokener_error_desc(e));
        json_object_put(o);
        json_tokener_free(t);
        return rc;
    }
    size_t end = json_tokener_get_parse_end(t);
    json_tokener_free(t);
    for (; end < len; end++) {
        char c = text[end];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            json_object_put(o);
            return td_err_set(TD_EPARSE, "%s: invalid JSON: trailing data at byte %zu", file, end);
        }
    }
    *out = o;
    return 0;
}

/* ---------------------------------------------------------------- entry points */

static int load_json(td_tokenizer_t *tok, json_object *root, json_object *cfg, const char *cfg_name)
{
    td__ld_t L = {.tok = tok, .file = tok->name};
    int rc = td__want_type(&L, root, json_type_object, "(top level)");
    if (rc)
        return rc;
    td__byte_level_init(tok);
    tok->bos_id = tok->eos_id = tok->pad_id = tok->cfg_unk_id = tok->unk_id = -1;
    json_object *trunc = td__tok_jget(root, "truncation"), *pad = td__tok_jget(root, "padding");
    if (trunc)
        return td_err_set(TD_ENOTSUP, "%s: field \"truncation\": not supported (must be null)",
                          L.file);
    if (pad)
        return td_err_set(TD_ENOTSUP, "%s: field \"padding\": not supported (must be null)",
                          L.file);
    if ((rc = td__parse_normalizer(&L, td__tok_jget(root, "normalizer"), "normalizer",
                                   &tok->norm_utf8proc)))
        return rc;
    json_object *pt = td__tok_jget(root, "pre_tokenizer");
    bool have_bl = false;
    if (pt && (rc = td__parse_pretok(&L, pt, "pre_tokenizer", true, &have_bl)))
        return rc;
    td__pretok_fast_init(&L);
    if (!have_bl)
        return td_err_set(TD_ENOTSUP,
                          "%s: field \"pre_tokenizer\": a ByteLevel pre-tokenizer is required "
                          "(byte-level BPE only)",
                          L.file);
    if ((rc = td__parse_model(&L, td__tok_jget(root, "model"))) || (rc = td__bpe_self_init(tok)))
        return rc;
    td__bpe_match_init(tok);
    if ((rc = td__parse_added(&L, td__tok_jget(root, "added_tokens"))))
        return rc;
    if ((rc = td__parse_post(&L, td__tok_jget(root, "post_processor"), "post_processor")))
        return rc;
    if ((rc = td__parse_decoder(&L, td__tok_jget(root, "decoder"), "decoder")))
        return rc;
    for (size_t i = 0; i < tok->nprefix; i++)
        if (tok->prefix[i] < 0 || (size_t)tok->prefix[i] >= tok->nids)
            return td_err_set(TD_EPARSE,
                              "%s: field \"post_processor\": id %d is not in the vocabulary",
                              L.file, tok->prefix[i]);
    for (size_t i = 0; i < tok->nsuffix; i++)
        if (tok->suffix[i] < 0 || (size_t)tok->suffix[i] >= tok->nids)
            return td_err_set(TD_EPARSE,
                              "%s: field \"post_processor\": id %d is not in the vocabulary",
                              L.file, tok->suffix[i]);
    if (cfg) {
        td__ld_t C = {.tok = tok, .file = cfg_name};
        if ((rc = td__parse_config(&C, cfg)))
            return rc;
    }
    return 0;
}

static td_tokenizer_t *tok_new(const char *name)
{
    td_tokenizer_t *tok = td_calloc(1, sizeof(*tok));
    if (!tok)
        return NULL;
    tok->name = td_strdup(name ? name : "tokenizer.json");
    if (!tok->name || pthread_mutex_init(&tok->pool_lock, NULL)) {
        free(tok->name);
        free(tok);
        return NULL;
    }
    return tok;
}

static int load_common(const char *json, size_t len, const char *config, size_t config_len,
                       const char *name, const char *cfg_name, td_tokenizer_t **out)
{
    *out = NULL;
    td_tokenizer_t *tok = tok_new(name);
    if (!tok)
        return TD_ENOMEM;
    json_object *root = NULL, *cfg = NULL;
    int rc = parse_json(tok->name, json, len, &root);
    if (rc)
        goto err_free;
    if (config && (rc = parse_json(cfg_name, config, config_len, &cfg)))
        goto err_free;
    if ((rc = load_json(tok, root, cfg, cfg_name)))
        goto err_free;
    json_object_put(root);
    json_object_put(cfg);
    *out = tok;
    return 0;

err_free:
    json_object_put(root);
    json_object_put(cfg);
    td_tokenizer_free(tok);
    return rc;
}

int td_tokenizer_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                          const char *name, td_tokenizer_t **out)
{
    char cname[512];
    snprintf(cname, sizeof(cname), "%s (tokenizer_config.json)", name ? name : "tokenizer.json");
    return load_common(json, len, config, config_len, name, cname, out);
}

int td_tokenizer_load(const char *path, td_tokenizer_t **out)
{
    *out = NULL;
    if (!path || !*path)
        return td_err_set(TD_EINVAL, "tokenizer: empty path");
    td_buf_t file, cfgp;
    td_buf_init(&file);
    td_buf_init(&cfgp);
    char *json = NULL, *cfg = NULL;
    size_t jlen = 0, clen = 0;
    int rc;
    size_t pl = strlen(path);
    bool is_json = pl >= 5 && strcmp(path + pl - 5, ".json") == 0;
    if (is_json) {
        rc = td_buf_append_str(&file, path);
        const char *slash = strrchr(path, '/');
        rc = rc ? rc : slash ? td_buf_append(&cfgp, path, (size_t)(slash - path) + 1) : 0;
    } else {
        rc = td_buf_printf(&file, "%s/tokenizer.json", path);
        rc = rc ? rc : td_buf_printf(&cfgp, "%s/", path);
    }
    rc = rc ? rc : td_buf_append_str(&cfgp, "tokenizer_config.json");
    if (rc)
        goto out;
    if ((rc = td_file_read_all(file.data, &json, &jlen)))
        goto out;
    int crc = td_file_read_all(cfgp.data, &cfg, &clen);
    if (crc == TD_ENOENT) {
        cfg = NULL;
    } else if (crc) {
        rc = crc;
        goto out;
    }
    td_err_clear();
    rc = load_common(json, jlen, cfg, clen, file.data, cfgp.data, out);
out:
    free(json);
    free(cfg);
    td_buf_free(&file);
    td_buf_free(&cfgp);
    return rc;
}

void td_tokenizer_free(td_tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->npool; i++)
        td__scratch_free(tok->pool[i]);
    pthread_mutex_destroy(&tok->pool_lock);
    for (size_t i = 0; i < tok->npretok; i++)
        if (tok->pretok[i].re)
            pcre2_code_free(tok->pretok[i].re);
    if (tok->bl_re)
        pcre2_code_free(tok->bl_re);
    free(tok->fast_cls);
    free(tok->pretok);
    free(tok->prefix);
    free(tok->suffix);
    free(tok->added);
    td_huge_free(tok->added_map.ents, (tok->added_map.mask + 1) * sizeof(*tok->added_map.ents));
    free(tok->trie_raw.nodes);
    free(tok->trie_norm.nodes);
    td_huge_free(tok->vocab.ents, (tok->vocab.mask + 1) * sizeof(*tok->vocab.ents));
    td_huge_free(tok->merges.ents, (tok->merges.mask + 1) * sizeof(*tok->merges.ents));
    free(tok->merges.ids);
    free(tok->merges.hot);
    free(tok->bpe_self);
    td__bpe_match_free(tok);
    free(tok->ids);
    free(tok->arena);
    free(tok->name);
    free(tok);
}

/* model.c: opening a model: mapping its files (one safetensors file, the shards that
 * model.safetensors.index.json names, or a GGUF file), then the configuration (model_config.c),
 * the weights (model_bind.c) and the digest (model_digest.c); and freeing it. */
#include "model_impl.h"
#include "td_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int map_file(td__loader_t *L, const char *path, td_mmap_t **out)
{
    td_model_t *m = L->m;
    td_mmap_t *maps = td_reallocarray(m->maps, (size_t)m->n_maps + 1, sizeof(*maps));
    if (!maps)
        return td_err_set(TD_ENOMEM, "out of memory");
    m->maps = maps;
    char *p = td_strdup(path);
    char **files = td_reallocarray(L->ix.files, (size_t)L->ix.n_files + 1, sizeof(char *));
    if (!p || !files) {
        free(p);
        if (files)
            L->ix.files = files;
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    L->ix.files = files;
    L->ix.files[L->ix.n_files++] = p;
    int rc = td_mmap_open(&maps[m->n_maps], path);
    if (rc)
        return rc;
    *out = &maps[m->n_maps++];
    return 0;
}

/* Shards named by model.safetensors.index.json's weight_map, each mapped once. */
static int open_sharded(td__loader_t *L, const char *dir, const char *index_path)
{
    json_object *o;
    int rc = td__json_read(index_path, &o);
    if (rc)
        return rc;
    json_object *wm = td__jget(o, "weight_map");
    if (!wm || !json_object_is_type(wm, json_type_object)) {
        json_object_put(o);
        return td_err_set(TD_EPARSE, "%s: no \"weight_map\" object", index_path);
    }
    char **seen = NULL;
    int n_seen = 0;
    json_object_object_foreach(wm, tname, fv)
    {
        const char *f =
            json_object_is_type(fv, json_type_string) ? json_object_get_string(fv) : NULL;
        if (!f || strchr(f, '/') || strcmp(f, "..") == 0) {
            rc = td_err_set(TD_EPARSE, "%s: tensor \"%s\": bad shard file name", index_path, tname);
            break;
        }
        bool dup = false;
        for (int i = 0; i < n_seen && !dup; i++)
            dup = strcmp(seen[i], f) == 0;
        if (dup)
            continue;
        char **s2 = td_reallocarray(seen, (size_t)n_seen + 1, sizeof(char *));
        if (!s2) {
            rc = td_err_set(TD_ENOMEM, "out of memory");
            break;
        }
        seen = s2;
        seen[n_seen++] = (char *)f;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, f);
        td_mmap_t *mm;
        if ((rc = map_file(L, path, &mm)))
            break;
        rc = td__safetensors_parse(&L->ix, mm, L->ix.files[L->ix.n_files - 1]);
        if (rc)
            break;
    }
    /* every tensor the index names must be in the shard it names */
    if (!rc)
        rc = td__index_finish(&L->ix);
    if (!rc) {
        json_object_object_foreach(wm, tname2, fv2)
        {
            const td__tensor_t *t = td__index_find(&L->ix, tname2);
            const char *f = json_object_get_string(fv2);
            if (!t || !td_str_endswith(t->file, f)) {
                rc = td_err_set(TD_ENOENT, "%s: tensor \"%s\" is not in shard %s", index_path,
                                tname2, f);
                break;
            }
        }
    }
    free(seen);
    json_object_put(o);
    return rc;
}

int td_model_load(const char *path, td_model_t **out)
{
    *out = NULL;
    td__loader_t L = {0};
    td_model_t *m = td_calloc(1, sizeof(*m));
    if (!m || !(m->path = td_strdup(path))) {
        free(m);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    L.m = m;
    struct stat st;
    int rc;
    char cfg[4096], p2[4096];
    if (stat(path, &st) != 0) {
        rc = td_err_set(TD_ENOENT, "%s: no such file or directory", path);
        goto err;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg, sizeof(cfg), "%s/config.json", path);
        L.cfg_path = cfg;
        if ((rc = td__config_json(&L, cfg)))
            goto err;
        snprintf(p2, sizeof(p2), "%s/model.safetensors.index.json", path);
        if (access(p2, R_OK) == 0) {
            if ((rc = open_sharded(&L, path, p2)))
                goto err;
        } else {
            snprintf(p2, sizeof(p2), "%s/model.safetensors", path);
            td_mmap_t *mm;
            if ((rc = map_file(&L, p2, &mm)) ||
                (rc = td__safetensors_parse(&L.ix, mm, L.ix.files[L.ix.n_files - 1])))
                goto err;
        }
    } else {
        L.gguf = true;
        L.cfg_path = path;
        td_mmap_t *mm;
        if ((rc = map_file(&L, path, &mm)) ||
            (rc = td__gguf_parse(&L.ix, mm, L.ix.files[L.ix.n_files - 1])))
            goto err;
        if ((rc = td__index_finish(&L.ix)) || (rc = td__config_gguf(&L)))
            goto err;
    }
    if ((rc = td__index_finish(&L.ix)) || (rc = td__config_check(&L)) ||
        (rc = td__bind_weights(&L)) || (rc = td__digest(&L)))
        goto err;
    td__index_free(&L.ix);
    *out = m;
    return 0;
err:
    td__index_free(&L.ix);
    td_model_free(m);
    return rc;
}

int td_model_weights_to_anon(td_model_t *m)
{
    for (int i = 0; i < m->n_maps; i++) {
        int rc = td_mmap_to_anon(&m->maps[i]);
        if (rc)
            return rc;
    }
    return 0;
}

void td_model_free(td_model_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_maps; i++)
        td_mmap_close(&m->maps[i]);
    free(m->maps);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->path);
    free(m);
}

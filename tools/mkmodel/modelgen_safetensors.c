/* modelgen_safetensors.c: the safetensors copy, single file or sharded with index.json, with
 * optional FP8 weights and fused expert tensors. */
#include "modelgen_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ST_PLAIN, ST_FP8_W, ST_FP8_SCALE, ST_FUSED_GATE_UP, ST_FUSED_DOWN };

typedef struct st_entry {
    char name[96];
    int what;               /* ST_* */
    const mg_tensor_t *src; /* ST_PLAIN, ST_FP8_*: the tensor; fused: expert 0's gate/down */
    int layer;              /* fused: layer index */
    int ndim;
    int64_t shape[3];
    const char *dtype; /* "F32", "BF16", "F16", "F8_E4M3" */
    size_t nbytes;
    int shard;
} st_entry_t;

static size_t dtype_size(td_modelgen_dtype_t d)
{
    return d == TD_MODELGEN_F32 ? 4 : 2;
}

static const char *st_dtype_name(td_modelgen_dtype_t d)
{
    return d == TD_MODELGEN_BF16 ? "BF16" : d == TD_MODELGEN_F16 ? "F16" : "F32";
}

static int st_entries(const mg_ctx_t *c, st_entry_t **out, int *n_out)
{
    const mg_hp_t *h = &c->hp;
    st_entry_t *v = td_calloc((size_t)c->list.n * 2 + 8, sizeof(*v));
    if (!v)
        return TD_ENOMEM;
    int n = 0;
    for (int i = 0; i < c->list.n; i++) {
        const mg_tensor_t *t = &c->list.t[i];
        int layer = -1, ex = -1;
        char proj[16] = "";
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj", &layer, &ex, proj) ==
                3 &&
            c->o->fused_experts) {
            if (ex != 0 || strcmp(proj, "up") == 0)
                continue;
            st_entry_t *e = &v[n++];
            bool gu = strcmp(proj, "gate") == 0;
            snprintf(e->name, sizeof(e->name), "model.layers.%d.mlp.experts.%s", layer,
                     gu ? "gate_up_proj" : "down_proj");
            e->what = gu ? ST_FUSED_GATE_UP : ST_FUSED_DOWN;
            e->src = t;
            e->layer = layer;
            e->ndim = 3;
            e->shape[0] = h->n_exp;
            e->shape[1] = gu ? 2 * t->rows : t->rows;
            e->shape[2] = t->cols;
            e->dtype = st_dtype_name(c->o->dtype);
            e->nbytes = (size_t)(e->shape[0] * e->shape[1] * e->shape[2]) * dtype_size(c->o->dtype);
            continue;
        }
        st_entry_t *e = &v[n++];
        snprintf(e->name, sizeof(e->name), "%s", t->name);
        e->src = t;
        e->ndim = t->cols ? 2 : 1;
        e->shape[0] = t->rows;
        e->shape[1] = t->cols;
        if (td__mg_tensor_fp8(c, t)) {
            e->what = ST_FP8_W;
            e->dtype = "F8_E4M3";
            e->nbytes = (size_t)td__mg_numel(t);
            st_entry_t *s = &v[n++];
            int w = snprintf(s->name, sizeof(s->name), "%s_scale_inv", t->name);
            TD_ASSERT(w > 0 && (size_t)w < sizeof(s->name)); /* names are short */
            s->what = ST_FP8_SCALE;
            s->src = t;
            s->ndim = 2;
            s->shape[0] = (t->rows + FP8_BLOCK - 1) / FP8_BLOCK;
            s->shape[1] = (t->cols + FP8_BLOCK - 1) / FP8_BLOCK;
            s->dtype = "F32";
            s->nbytes = (size_t)(s->shape[0] * s->shape[1]) * 4;
        } else {
            e->what = ST_PLAIN;
            e->dtype = st_dtype_name(c->o->dtype);
            e->nbytes = (size_t)td__mg_numel(t) * dtype_size(c->o->dtype);
        }
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Bytes of entry `e` into out[e->nbytes]. */
static int st_produce(const mg_ctx_t *c, const st_entry_t *e, uint8_t *out)
{
    const mg_tensor_t *t = e->src;
    int64_t n = td__mg_numel(t);
    float *w = td_calloc((size_t)n, sizeof(float));
    int err = 0;
    if (!w)
        return TD_ENOMEM;
    switch (e->what) {
    case ST_PLAIN:
        err = td__mg_canonical(c, t, w);
        if (!err)
            td__mg_encode(c->o->dtype, w, n, out);
        break;
    case ST_FP8_W:
    case ST_FP8_SCALE: {
        size_t ns = (size_t)(((t->rows + FP8_BLOCK - 1) / FP8_BLOCK) *
                             ((t->cols + FP8_BLOCK - 1) / FP8_BLOCK));
        uint8_t *q = malloc((size_t)n);
        float *s = td_calloc(ns, sizeof(float));
        if (!q || !s) {
            err = TD_ENOMEM;
        } else {
            td__mg_gen_raw(c->o->seed, t, c->hp.hidden, w);
            td__mg_fp8_quantize(w, t->rows, t->cols, q, s);
            if (e->what == ST_FP8_W)
                memcpy(out, q, (size_t)n);
            else
                memcpy(out, s, ns * sizeof(float));
        }
        free(q);
        free(s);
        break;
    }
    case ST_FUSED_GATE_UP:
    case ST_FUSED_DOWN: {
        size_t esz = dtype_size(c->o->dtype);
        size_t off = 0;
        for (int ex = 0; ex < c->hp.n_exp && !err; ex++) {
            const char *projs[2] = {e->what == ST_FUSED_GATE_UP ? "gate" : "down", "up"};
            int np = e->what == ST_FUSED_GATE_UP ? 2 : 1;
            for (int k = 0; k < np && !err; k++) {
                char name[96];
                snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.%s_proj.weight",
                         e->layer, ex, projs[k]);
                err = td__mg_canonical_by_name(c, name, w);
                if (!err)
                    td__mg_encode(c->o->dtype, w, n, out + off);
                off += (size_t)n * esz;
            }
        }
        break;
    }
    }
    free(w);
    return err;
}

static int st_write_shard(const mg_ctx_t *c, const st_entry_t *v, int n, int shard,
                          const char *fname)
{
    td_buf_t hdr;
    mg_file_t mf = {0};
    uint8_t *buf = NULL;
    int err;
    size_t off = 0, maxb = 0;
    td_buf_init(&hdr);
    err = td_buf_append_str(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n && !err; i++) {
        if (v[i].shard != shard)
            continue;
        err |= td_buf_printf(&hdr, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", v[i].name, v[i].dtype);
        for (int d = 0; d < v[i].ndim; d++)
            err |= td_buf_printf(&hdr, "%s%lld", d ? "," : "", (long long)v[i].shape[d]);
        err |= td_buf_printf(&hdr, "],\"data_offsets\":[%zu,%zu]}", off, off + v[i].nbytes);
        off += v[i].nbytes;
        maxb = TD_MAX(maxb, v[i].nbytes);
    }
    err |= td_buf_append_char(&hdr, '}');
    while (!err && hdr.len % 8)
        err = td_buf_append_char(&hdr, ' ');
    if (err) {
        err = TD_ENOMEM;
        goto out;
    }
    buf = malloc(maxb ? maxb : 1);
    if (!buf) {
        err = TD_ENOMEM;
        goto out;
    }
    err = td__mg_file_open(&mf, c->o->out_dir, fname);
    if (err)
        goto out;
    uint64_t hl = hdr.len;
    err = td__mg_file_write(&mf, &hl, 8);
    if (!err)
        err = td__mg_file_write(&mf, hdr.data, hdr.len);
    for (int i = 0; i < n && !err; i++) {
        if (v[i].shard != shard)
            continue;
        err = st_produce(c, &v[i], buf);
        if (!err)
            err = td__mg_file_write(&mf, buf, v[i].nbytes);
    }
    err = td__mg_file_close(&mf, err);
out:
    free(buf);
    td_buf_free(&hdr);
    return err;
}

int td__mg_write_safetensors(const mg_ctx_t *c, int *n_files)
{
    st_entry_t *v = NULL;
    int n = 0, err = st_entries(c, &v, &n);
    if (err)
        return err;
    int shards = TD_MAX(1, c->o->shards);
    size_t total = 0, acc = 0;
    for (int i = 0; i < n; i++)
        total += v[i].nbytes;
    /* Fill shard k until it holds about k+1 / shards of the bytes; a scale stays with its weight.
     */
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].what != ST_FP8_SCALE && k < shards - 1 &&
            acc >= total / (size_t)shards * (size_t)(k + 1))
            k++;
        v[i].shard = k;
        acc += v[i].nbytes;
    }
    if (shards == 1) {
        td__mg_remove_stale(c->o->out_dir, "model.safetensors.index.json");
        err = st_write_shard(c, v, n, 0, "model.safetensors");
    } else {
        td_buf_t idx;
        td_buf_init(&idx);
        err = td_buf_printf(&idx, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {",
                            total);
        for (int i = 0; i < n && !err; i++)
            err = td_buf_printf(&idx, "%s\n    \"%s\": \"model-%05d-of-%05d.safetensors\"",
                                i ? "," : "", v[i].name, v[i].shard + 1, shards);
        if (!err)
            err = td_buf_append_str(&idx, "\n  }\n}\n");
        td__mg_remove_stale(c->o->out_dir, "model.safetensors");
        for (int s = 0; s < shards && !err; s++) {
            char fname[64];
            snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", s + 1, shards);
            err = st_write_shard(c, v, n, s, fname);
        }
        if (!err)
            err = td__mg_write_text(c->o->out_dir, "model.safetensors.index.json", &idx);
        td_buf_free(&idx);
    }
    *n_files = shards;
    free(v);
    return err;
}

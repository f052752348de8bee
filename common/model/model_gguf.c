/* model_gguf.c: the GGUF v3 format: magic "GGUF", version, tensor and metadata counts, the
 * metadata key/values, the tensor infos (name, dims innermost first, ggml type, offset), then the
 * data section at the next multiple of general.alignment. Every read is bounds-checked through a
 * cursor; a count or size that cannot fit in the file is rejected before anything is allocated. */
#include "model_impl.h"
#include "td_error.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q6_K = 14,
       GGML_BF16 = 30 };

typedef struct cursor {
    const uint8_t *p;
    size_t len, off;
    const char *path;
} cursor_t;

static int need(cursor_t *c, size_t n, const char *what)
{
    if (n > c->len - c->off)
        return td_err_set(TD_EPARSE, "%s: truncated GGUF file reading %s at byte %zu", c->path,
                          what, c->off);
    return 0;
}

static int rd_u32(cursor_t *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int rd_u64(cursor_t *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

/* A string: u64 length then bytes. *out is a new NUL-terminated copy. */
static int rd_str(cursor_t *c, char **out, const char *what)
{
    uint64_t n;
    int rc = rd_u64(c, &n, what);
    if (rc)
        return rc;
    if ((rc = need(c, n, what)))
        return rc;
    *out = td_strndup((const char *)c->p + c->off, (size_t)n);
    if (!*out)
        return td_err_set(TD_ENOMEM, "%s: out of memory", c->path);
    c->off += n;
    return 0;
}

static size_t scalar_size(int type)
{
    switch (type) {
    case TD__GGUF_U8:
    case TD__GGUF_I8:
    case TD__GGUF_BOOL:
        return 1;
    case TD__GGUF_U16:
    case TD__GGUF_I16:
        return 2;
    case TD__GGUF_U32:
    case TD__GGUF_I32:
    case TD__GGUF_F32:
        return 4;
    case TD__GGUF_U64:
    case TD__GGUF_I64:
    case TD__GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static double scalar_value(int type, const uint8_t *p)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } u;
    memcpy(&u, p, scalar_size(type));
    switch (type) {
    case TD__GGUF_U8:
    case TD__GGUF_BOOL:
        return u.u8;
    case TD__GGUF_I8:
        return u.i8;
    case TD__GGUF_U16:
        return u.u16;
    case TD__GGUF_I16:
        return u.i16;
    case TD__GGUF_U32:
        return u.u32;
    case TD__GGUF_I32:
        return u.i32;
    case TD__GGUF_F32:
        return u.f32;
    case TD__GGUF_U64:
        return (double)u.u64;
    case TD__GGUF_I64:
        return (double)u.i64;
    default:
        return u.f64;
    }
}

static int parse_kv(cursor_t *c, td__gguf_kv_t *kv)
{
    int rc = rd_str(c, &kv->key, "a metadata key");
    if (rc)
        return rc;
    uint32_t type;
    if ((rc = rd_u32(c, &type, kv->key)))
        return rc;
    kv->type = (int)type;
    if (type == TD__GGUF_STRING)
        return rd_str(c, &kv->str, kv->key);
    if (type == TD__GGUF_ARRAY) {
        uint32_t at;
        uint64_t n;
        if ((rc = rd_u32(c, &at, kv->key)) || (rc = rd_u64(c, &n, kv->key)))
            return rc;
        kv->arr_type = (int)at;
        kv->arr_len = n;
        kv->arr_data = c->p + c->off;
        if (at == TD__GGUF_STRING) {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t sl;
                if ((rc = rd_u64(c, &sl, kv->key)) || (rc = need(c, sl, kv->key)))
                    return rc;
                c->off += sl;
            }
            return 0;
        }
        size_t es = scalar_size((int)at);
        if (es == 0)
            return td_err_set(TD_EPARSE, "%s: metadata \"%s\": unsupported array element type %u",
                              c->path, kv->key, at);
        if (n > (c->len - c->off) / es)
            return need(c, SIZE_MAX, kv->key);
        c->off += n * es;
        return 0;
    }
    size_t es = scalar_size((int)type);
    if (es == 0)
        return td_err_set(TD_EPARSE, "%s: metadata \"%s\": unknown value type %u", c->path, kv->key,
                          type);
    if ((rc = need(c, es, kv->key)))
        return rc;
    kv->num = scalar_value((int)type, c->p + c->off);
    c->off += es;
    return 0;
}

int td__gguf_parse(td__index_t *ix, const td_mmap_t *m, const char *path)
{
    cursor_t c = {m->data, m->len, 0, path};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    int rc;
    if ((rc = rd_u32(&c, &magic, "the magic")))
        return rc;
    if (memcmp(m->data, "GGUF", 4) != 0)
        return td_err_set(TD_EPARSE, "%s: not a GGUF file (bad magic)", path);
    if ((rc = rd_u32(&c, &version, "the version")))
        return rc;
    if (version != 3)
        return td_err_set(TD_ENOTSUP, "%s: GGUF version %u (only 3 is supported)", path, version);
    if ((rc = rd_u64(&c, &n_tensors, "the tensor count")) ||
        (rc = rd_u64(&c, &n_kv, "the metadata count")))
        return rc;
    /* each metadata entry takes at least 12 bytes, each tensor info at least 24 */
    if (n_kv > m->len / 12 || n_tensors > m->len / 24)
        return td_err_set(TD_EPARSE,
                          "%s: GGUF header claims %llu tensors and %llu metadata "
                          "entries, more than the file can hold",
                          path, (unsigned long long)n_tensors, (unsigned long long)n_kv);
    ix->kv = td_calloc(n_kv ? n_kv : 1, sizeof(*ix->kv));
    if (!ix->kv)
        return td_err_set(TD_ENOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n_kv; i++) {
        ix->n_kv = i + 1;
        if ((rc = parse_kv(&c, &ix->kv[i])))
            return rc;
    }
    uint64_t align = 32;
    const td__gguf_kv_t *ak = td__gguf_find(ix, "general.alignment");
    if (ak) {
        /* written as "not within [1, 65536]" so that a NaN float fails it before any cast */
        if (ak->type == TD__GGUF_STRING || ak->type == TD__GGUF_ARRAY ||
            !(ak->num >= 1 && ak->num <= 65536))
            return td_err_set(TD_EPARSE, "%s: general.alignment is not a power of two", path);
        align = (uint64_t)ak->num;
        if ((double)align != ak->num || (align & (align - 1)))
            return td_err_set(TD_EPARSE, "%s: general.alignment is not a power of two", path);
    }
    /* tensor infos: read them all, then resolve offsets against the data section */
    td__tensor_t *infos = td_calloc(n_tensors ? n_tensors : 1, sizeof(*infos));
    uint64_t *offs = td_calloc(n_tensors ? n_tensors : 1, sizeof(*offs));
    if (!infos || !offs) {
        rc = td_err_set(TD_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        td__tensor_t *t = &infos[i];
        uint32_t nd, type;
        if ((rc = rd_str(&c, &t->name, "a tensor name")))
            goto out;
        if ((rc = rd_u32(&c, &nd, t->name)))
            goto out;
        if (nd < 1 || nd > TD__MAX_DIMS) {
            rc = td_err_set(TD_EPARSE, "%s: tensor \"%s\": %u dimensions", path, t->name, nd);
            goto out;
        }
        t->ndim = (int)nd;
        uint64_t ne[TD__MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) {
            if ((rc = rd_u64(&c, &ne[d], t->name)))
                goto out;
            if (ne[d] > (1ull << 40)) {
                rc = td_err_set(TD_EPARSE, "%s: tensor \"%s\": dimension %u is %llu", path, t->name,
                                d, (unsigned long long)ne[d]);
                goto out;
            }
            t->shape[nd - 1 - d] = (int64_t)ne[d]; /* GGUF lists the innermost first */
        }
        if ((rc = rd_u32(&c, &type, t->name)) || (rc = rd_u64(&c, &offs[i], t->name)))
            goto out;
        switch (type) {
        case GGML_F32:
            t->dtype = TD_DTYPE_F32;
            break;
        case GGML_F16:
            t->dtype = TD_DTYPE_F16;
            break;
        case GGML_BF16:
            t->dtype = TD_DTYPE_BF16;
            break;
        case GGML_Q8_0:
            t->dtype = TD_DTYPE_Q8_0;
            break;
        case GGML_Q4_0:
            t->dtype = TD_DTYPE_Q4_0;
            break;
        case GGML_Q4_K:
            t->dtype = TD_DTYPE_Q4_K;
            break;
        case GGML_Q6_K:
            t->dtype = TD_DTYPE_Q6_K;
            break;
        default:
            t->dtype = -1;
        }
        snprintf(t->dtype_str, sizeof(t->dtype_str), "ggml type %u", type);
    }
    uint64_t data_start = TD_ALIGN_UP((uint64_t)c.off, align);
    if (data_start > m->len) {
        rc = td_err_set(TD_EPARSE, "%s: truncated GGUF file: no data section", path);
        goto out;
    }
    uint64_t data_len = m->len - data_start;
    for (uint64_t i = 0; i < n_tensors; i++) {
        td__tensor_t *t = &infos[i];
        if (t->dtype < 0) {
            rc = td_err_set(TD_ENOTSUP, "%s: tensor \"%s\": unsupported %s", path, t->name,
                            t->dtype_str);
            goto out;
        }
        uint64_t count = 1;
        bool too_big = false;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t ne = (uint64_t)t->shape[d];
            too_big |= ne != 0 && count > (1ull << 48) / ne;
            count *= too_big ? 1 : ne;
        }
        int64_t cols = t->shape[t->ndim - 1];
        uint64_t bytes;
        int blk = td_dtype_block((td_dtype_t)t->dtype);
        if (cols % blk) {
            rc = td_err_set(TD_EPARSE,
                            "%s: tensor \"%s\": %s rows of %lld values (not a multiple of %d)",
                            path, t->name, td_dtype_name((td_dtype_t)t->dtype), (long long)cols,
                            blk);
            goto out;
        }
        bytes = (uint64_t)td_dtype_row_bytes((td_dtype_t)t->dtype, blk) * (count / (uint64_t)blk);
        if (too_big || offs[i] % align || offs[i] > data_len || bytes > data_len - offs[i]) {
            rc = td_err_set(TD_EPARSE,
                            "%s: tensor \"%s\": offset %llu + %llu bytes outside the %llu-byte "
                            "data section (or misaligned)",
                            path, t->name, (unsigned long long)offs[i], (unsigned long long)bytes,
                            (unsigned long long)data_len);
            goto out;
        }
        t->data = m->data + data_start + offs[i];
        t->nbytes = (size_t)bytes;
        t->file = path;
        if ((rc = td__index_add(ix, t)))
            goto out;
    }
out:
    if (infos)
        for (uint64_t i = 0; i < n_tensors; i++)
            free(infos[i].name);
    free(infos);
    free(offs);
    return rc;
}

/* model_safetensors.c: the safetensors format: an 8-byte little-endian header length, a JSON
 * header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
 * data. Every offset and size is checked against the file before a tensor is recorded. */
#include "model_impl.h"
#include "td_error.h"

#include <stdio.h>
#include <string.h>

static int dtype_from_str(const char *s)
{
    if (strcmp(s, "F32") == 0)
        return TD_DTYPE_F32;
    if (strcmp(s, "F16") == 0)
        return TD_DTYPE_F16;
    if (strcmp(s, "BF16") == 0)
        return TD_DTYPE_BF16;
    if (strcmp(s, "F8_E4M3") == 0)
        return TD_DTYPE_F8_E4M3;
    return -1;
}

/* Element size of dtypes safetensors may hold that we do not compute with (0: unknown). */
static size_t other_elt_size(const char *s)
{
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4},  {"U32", 4},    {"I16", 2},
             {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < TD_ARRAY_LEN(t); i++)
        if (strcmp(s, t[i].name) == 0)
            return t[i].size;
    return 0;
}

static int parse_entry(td__index_t *ix, const char *path, const char *name, json_object *v,
                       const uint8_t *base, uint64_t data_len)
{
    json_object *jd, *js, *jo;
    if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "dtype", &jd) ||
        !json_object_object_get_ex(v, "shape", &js) ||
        !json_object_object_get_ex(v, "data_offsets", &jo) ||
        !json_object_is_type(jd, json_type_string) || !json_object_is_type(js, json_type_array) ||
        !json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2)
        return td_err_set(TD_EPARSE,
                          "%s: tensor \"%s\": header entry needs dtype, shape and data_offsets",
                          path, name);
    td__tensor_t t = {0};
    t.name = (char *)name;
    const char *ds = json_object_get_string(jd);
    snprintf(t.dtype_str, sizeof(t.dtype_str), "%s", ds);
    t.dtype = dtype_from_str(ds);
    size_t elt = t.dtype >= 0 ? td__dtype_elt_size((td_dtype_t)t.dtype) : other_elt_size(ds);
    if (elt == 0)
        return td_err_set(TD_ENOTSUP, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name, ds);
    size_t nd = json_object_array_length(js);
    if (nd > TD__MAX_DIMS)
        return td_err_set(TD_ENOTSUP, "%s: tensor \"%s\": %zu dimensions (at most %d)", path, name,
                          nd, TD__MAX_DIMS);
    t.ndim = (int)nd;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_object *d = json_object_array_get_idx(js, i);
        if (!json_object_is_type(d, json_type_int) || json_object_get_int64(d) < 0)
            return td_err_set(TD_EPARSE, "%s: tensor \"%s\": bad shape", path, name);
        t.shape[i] = json_object_get_int64(d);
        if (t.shape[i] != 0 && count > UINT64_MAX / 16 / (uint64_t)t.shape[i])
            return td_err_set(TD_EPARSE, "%s: tensor \"%s\": shape overflows", path, name);
        count *= (uint64_t)t.shape[i];
    }
    json_object *jb = json_object_array_get_idx(jo, 0), *je = json_object_array_get_idx(jo, 1);
    if (!json_object_is_type(jb, json_type_int) || !json_object_is_type(je, json_type_int))
        return td_err_set(TD_EPARSE, "%s: tensor \"%s\": bad data_offsets", path, name);
    int64_t b = json_object_get_int64(jb), e = json_object_get_int64(je);
    if (b < 0 || e < b || (uint64_t)e > data_len)
        return td_err_set(TD_EPARSE,
                          "%s: tensor \"%s\": data_offsets [%lld, %lld] outside the %llu data "
                          "bytes of the file",
                          path, name, (long long)b, (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != count * elt)
        return td_err_set(TD_EPARSE,
                          "%s: tensor \"%s\": %lld data bytes but shape and dtype %s need %llu",
                          path, name, (long long)(e - b), ds, (unsigned long long)(count * elt));
    t.data = base + b;
    t.nbytes = (size_t)(e - b);
    t.file = path;
    return td__index_add(ix, &t);
}

int td__safetensors_parse(td__index_t *ix, const td_mmap_t *m, const char *path)
{
    if (m->len < 8)
        return td_err_set(TD_EPARSE, "%s: truncated safetensors file (%zu bytes)", path, m->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | m->data[i];
    if (hlen > m->len - 8 || hlen > (100u << 20))
        return td_err_set(TD_EPARSE,
                          "%s: safetensors header length %llu exceeds the file (%zu bytes)", path,
                          (unsigned long long)hlen, m->len);
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return td_err_set(TD_ENOMEM, "%s: out of memory", path);
    json_object *root = json_tokener_parse_ex(tok, (const char *)m->data + 8, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return td_err_set(TD_EPARSE, "%s: safetensors header is not a JSON object", path);
    }
    const uint8_t *base = m->data + 8 + hlen;
    uint64_t data_len = m->len - 8 - hlen;
    int rc = 0;
    json_object_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        rc = parse_entry(ix, path, key, val, base, data_len);
        if (rc)
            break;
    }
    json_object_put(root);
    return rc;
}

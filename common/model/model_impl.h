/* model_impl.h: what the model loader's files share: the tensor index that the safetensors and
 * GGUF parsers fill and model_bind.c binds weights from, the GGUF metadata table, the loading
 * context with its configuration and binding helpers, and the architecture table (model_arch.c)
 * whose rows point at one family file each (model_llama.c, model_deepseek.c). */
#ifndef TD_MODEL_IMPL_H
#define TD_MODEL_IMPL_H

#include "td_model.h"

#include <json-c/json.h>

#define TD__MAX_DIMS 4

/* One tensor found in a weight file. The data points into a mapping owned by the model. */
typedef struct td__tensor {
    char *name;                  /* owned */
    const char *file;            /* path of the file holding it (owned by the index) */
    int dtype;                   /* td_dtype_t, or -1 when the stored dtype is not supported */
    char dtype_str[16];          /* as stored ("F32", "I64", "ggml type 12"), for messages */
    int ndim;                    /* 1..TD__MAX_DIMS */
    int64_t shape[TD__MAX_DIMS]; /* outermost first (row-major), as safetensors writes it */
    const uint8_t *data;         /* nbytes bytes inside the mapping */
    size_t nbytes;
} td__tensor_t;

typedef enum td__gguf_type {
    TD__GGUF_U8 = 0,
    TD__GGUF_I8 = 1,
    TD__GGUF_U16 = 2,
    TD__GGUF_I16 = 3,
    TD__GGUF_U32 = 4,
    TD__GGUF_I32 = 5,
    TD__GGUF_F32 = 6,
    TD__GGUF_BOOL = 7,
    TD__GGUF_STRING = 8,
    TD__GGUF_ARRAY = 9,
    TD__GGUF_U64 = 10,
    TD__GGUF_I64 = 11,
    TD__GGUF_F64 = 12,
} td__gguf_type_t;

/* One GGUF metadata entry. Scalars are decoded; arrays are left in the mapping. */
typedef struct td__gguf_kv {
    char *key;    /* owned */
    int type;     /* td__gguf_type_t */
    double num;   /* numeric and bool scalars */
    char *str;    /* TD__GGUF_STRING: owned, NUL-terminated */
    int arr_type; /* TD__GGUF_ARRAY: element type */
    uint64_t arr_len;
    const uint8_t *arr_data; /* first element, inside the mapping */
} td__gguf_kv_t;

/* All tensors of a model, sorted by name once complete, and the GGUF metadata if any. */
typedef struct td__index {
    td__tensor_t *t; /* [n] */
    size_t n, cap;
    char **files; /* [n_files] owned paths */
    int n_files;
    td__gguf_kv_t *kv; /* [n_kv] GGUF only */
    size_t n_kv;
} td__index_t;

void td__index_free(td__index_t *ix);
/* Add a tensor (copies the name). 0 or TD_ENOMEM. */
int td__index_add(td__index_t *ix, const td__tensor_t *t);
/* Sort by name and reject duplicates (TD_EPARSE naming the tensor and both files). */
int td__index_finish(td__index_t *ix);
const td__tensor_t *td__index_find(const td__index_t *ix, const char *name);
const td__gguf_kv_t *td__gguf_find(const td__index_t *ix, const char *key);

/* Element size in bytes of a dtype with a fixed element size (not Q8_0). */
size_t td__dtype_elt_size(td_dtype_t t);
/* Convert n values of dtype t at src to fp32 out[n] (Q8_0: n a multiple of 32). */
void td__convert_f32(td_dtype_t t, const uint8_t *src, int64_t n, float *out);

/* Parse one safetensors file already mapped at `m` (path for messages) into `ix`. */
int td__safetensors_parse(td__index_t *ix, const td_mmap_t *m, const char *path);
/* Parse a GGUF v3 file mapped at `m` into `ix` (tensors and metadata). */
int td__gguf_parse(td__index_t *ix, const td_mmap_t *m, const char *path);

/* ---------- loading ---------- */

typedef struct td__names td__names_t;

/* One model being opened (td_model_load). */
typedef struct td__loader {
    td_model_t *m;
    td__index_t ix;
    bool gguf;
    const char *cfg_path; /* config.json or the GGUF file, for messages */
    const td__names_t *N; /* tensor names of the format (HF or GGUF), set when binding */
} td__loader_t;

/* Tensor names of one format; "%d" is the layer. */
struct td__names {
    const char *embd, *norm, *head;
    const char *attn_norm, *ffn_norm, *q, *k, *v, *o, *qb, *kb, *vb, *qn, *kn;
    const char *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b;
    const char *gate, *up, *down, *router, *router_bias;
    const char *sh_gate, *sh_up, *sh_down;
};

/* config.json: the hyperparameters into L->m->cfg (model_config.c). 0 or TD_EPARSE / TD_ENOTSUP
 * naming the field, or the error of reading the file. */
int td__config_json(td__loader_t *L, const char *path);
/* GGUF metadata: the hyperparameters into L->m->cfg; L->ix holds the finished index. */
int td__config_gguf(td__loader_t *L);
/* Sanity of the hyperparameters, so the forward pass can trust them: TD_EPARSE otherwise. */
int td__config_check(td__loader_t *L);

/* Read and parse the JSON file `path`: *out is its value (the caller puts it), or NULL when it is
 * not valid JSON. 0, or the error of reading the file. */
int td__json_read(const char *path, json_object **out);
/* JSON field `k` of object o, or NULL when o is NULL or the field is absent or null. */
json_object *td__jget(json_object *o, const char *k);
/* Integer field in [0, 2^30] (a list: its first element); absent: `def`, or TD_EPARSE when
 * required. TD_EPARSE when it is not such an integer. */
int td__jint(td__loader_t *L, json_object *o, const char *k, int def, bool required, int *out);
/* Number field; absent: `def`. TD_EPARSE when it is not a number. */
int td__jfloat(td__loader_t *L, json_object *o, const char *k, double def, float *out);
/* Boolean field; absent: `def`. */
bool td__jbool(json_object *o, const char *k, bool def);
/* String field, or NULL when absent or not a string. Owned by o. */
const char *td__jstr(json_object *o, const char *k);
/* GGUF metadata "<arch>.<key>" as an integer in [-1, 2^30]; absent: `def`, or TD_EPARSE when
 * required. TD_EPARSE when not a whole number in range. */
int td__gint(td__loader_t *L, const char *arch, const char *key, bool required, int def, int *out);
/* GGUF metadata "<arch>.<key>" as a float; absent: `def`. TD_EPARSE when not a number. */
int td__gflt(td__loader_t *L, const char *arch, const char *key, double def, float *out);

/* Every weight of the model into L->m (model_bind.c): the embeddings, output norm and head, and
 * per layer the two norms and what the architecture's family binds. 0 or the first error. */
int td__bind_weights(td__loader_t *L);
/* Record p as an allocation the model frees. Returns p, or NULL (p freed) when p is NULL or the
 * list cannot grow. */
void *td__own(td_model_t *m, void *p);
/* The tensor `name`, or NULL: *rc = TD_ENOENT when missing and required, TD_ENOTSUP when its
 * dtype is not supported (then NULL even when not required). */
const td__tensor_t *td__find(td__loader_t *L, const char *name, bool required, int *rc);
/* TD_EMISMATCH naming t, its shape and the expected one (`want`, e.g. "64, 128"). */
int td__shape_err(const td__tensor_t *t, const char *want);
/* Bind a [rows][cols] matrix view starting `sub` matrices into t (for stacked experts), with its
 * F8_E4M3 block scales when t is F8_E4M3. 0 or TD_EMISMATCH / TD_ENOENT. */
int td__bind_view(td__loader_t *L, const td__tensor_t *t, int64_t rows, int64_t cols, int64_t sub,
                  td_mat_t *out);
/* Bind the 2-D tensor `name` as a [rows][cols] matrix. Missing and not required: zero mat, 0. */
int td__get_mat(td__loader_t *L, const char *name, int64_t rows, int64_t cols, bool required,
                td_mat_t *out);
/* A vector of n values converted to an fp32 copy the model owns. Missing and not required: NULL,
 * 0. */
int td__get_vec(td__loader_t *L, const char *name, int64_t n, bool required, float **out);
/* The dense SwiGLU MLP of layer l (gate, up, down: [inter][hidden] x2, [hidden][inter]). */
int td__bind_mlp(td__loader_t *L, int l, td_layer_w_t *w);
/* buf = fmt with layer l ("%d"); returns buf. */
const char *td__nm(char *buf, size_t n, const char *fmt, int l);

/* The model's digest into L->m->digest (model_digest.c). 0 or TD_ENOMEM. */
int td__digest(td__loader_t *L);

/* ---------- architectures ---------- */

/* What the loader does differently for one family of architectures (one file each). */
typedef struct td__family {
    /* config.json fields beyond the common ones; NULL: none. 0 or TD_EPARSE / TD_ENOTSUP. */
    int (*parse_json)(td__loader_t *L, json_object *o);
    /* GGUF metadata beyond the common ones (`a`: general.architecture); may refine cfg.arch
     * within the family. 0 or TD_EPARSE / TD_ENOTSUP. */
    int (*parse_gguf)(td__loader_t *L, const char *a);
    /* The family's own hyperparameters are in range (the common ones are checked already). */
    bool (*check)(const td_model_cfg_t *c);
    /* Bind layer l's attention and feed-forward weights (its two norms are bound already). */
    int (*bind_layer)(td__loader_t *L, int l, td_layer_w_t *w);
} td__family_t;

/* One row of the architecture table. */
typedef struct td__arch_row {
    td_arch_desc_t desc;        /* what other modules see (td_arch_desc) */
    const td__family_t *family; /* how it loads */
    const char *hf_types[3];    /* config.json model_type values, NULL-terminated */
    const char *gguf_arch;      /* GGUF general.architecture, or NULL: no GGUF form */
    bool qkv_bias;              /* llama family: q/k/v projection biases required (Qwen2) */
    bool qk_norm;               /* llama family: per-head q/k RMSNorm weights required (Qwen3) */
} td__arch_row_t;

/* The row of `a`, or NULL when a is not a td_arch_t value. */
const td__arch_row_t *td__arch_row(td_arch_t a);
/* The architecture whose row lists config.json model_type `mt` (or GGUF architecture `ga`),
 * or -1. The first row in td_arch_t order wins. */
int td__arch_from_hf(const char *mt);
int td__arch_from_gguf(const char *ga);

extern const td__family_t td__family_llama;
extern const td__family_t td__family_deepseek;
int td__llama_kv_token_floats(const td_model_cfg_t *c);
int td__deepseek_kv_token_floats(const td_model_cfg_t *c);

#endif

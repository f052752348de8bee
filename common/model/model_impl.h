/* model_impl.h: what the model loader's files share: the tensor index that the safetensors and
 * GGUF parsers fill and model.c binds weights from, and the GGUF metadata table. */
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

/* Parse one safetensors file already mapped at `m` (path for messages) into `ix`. */
int td__safetensors_parse(td__index_t *ix, const td_mmap_t *m, const char *path);
/* Parse a GGUF v3 file mapped at `m` into `ix` (tensors and metadata). */
int td__gguf_parse(td__index_t *ix, const td_mmap_t *m, const char *path);

#endif

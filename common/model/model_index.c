/* model_index.c: the tensor index the safetensors and GGUF parsers fill (sorted by name, looked
 * up by binary search) and the GGUF metadata lookup. */
#include "model_impl.h"
#include "td_error.h"

#include <stdlib.h>
#include <string.h>

void td__index_free(td__index_t *ix)
{
    for (size_t i = 0; i < ix->n; i++)
        free(ix->t[i].name);
    free(ix->t);
    for (int i = 0; i < ix->n_files; i++)
        free(ix->files[i]);
    free(ix->files);
    for (size_t i = 0; i < ix->n_kv; i++) {
        free(ix->kv[i].key);
        free(ix->kv[i].str);
    }
    free(ix->kv);
    memset(ix, 0, sizeof(*ix));
}

int td__index_add(td__index_t *ix, const td__tensor_t *t)
{
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 256;
        td__tensor_t *p = td_reallocarray(ix->t, cap, sizeof(*p));
        if (!p)
            return td_err_set(TD_ENOMEM, "out of memory indexing tensors");
        ix->t = p;
        ix->cap = cap;
    }
    ix->t[ix->n] = *t;
    ix->t[ix->n].name = td_strdup(t->name);
    if (!ix->t[ix->n].name)
        return td_err_set(TD_ENOMEM, "out of memory indexing tensors");
    ix->n++;
    return 0;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const td__tensor_t *)a)->name, ((const td__tensor_t *)b)->name);
}

int td__index_finish(td__index_t *ix)
{
    if (ix->n > 1)
        qsort(ix->t, ix->n, sizeof(*ix->t), cmp_tensor);
    for (size_t i = 1; i < ix->n; i++)
        if (strcmp(ix->t[i - 1].name, ix->t[i].name) == 0)
            return td_err_set(TD_EPARSE, "tensor \"%s\" appears twice (%s and %s)", ix->t[i].name,
                              ix->t[i - 1].file, ix->t[i].file);
    return 0;
}

const td__tensor_t *td__index_find(const td__index_t *ix, const char *name)
{
    td__tensor_t key = {.name = (char *)name};
    return ix->n ? bsearch(&key, ix->t, ix->n, sizeof(*ix->t), cmp_tensor) : NULL;
}

const td__gguf_kv_t *td__gguf_find(const td__index_t *ix, const char *key)
{
    for (size_t i = 0; i < ix->n_kv; i++)
        if (ix->kv[i].key && strcmp(ix->kv[i].key, key) == 0)
            return &ix->kv[i];
    return NULL;
}

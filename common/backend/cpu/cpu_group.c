/* cpu_group.c: F16 matrices in groups of rows, the copy the CPU backend multiplies them from.
 *
 * One token's F16 kernel (cpu_fma.c) sums three rows at a time, each with its own chain of
 * multiply-adds in column order (the order every kernel keeps, so that decode, prefill and any
 * split give the same bits). Stored row after row, those three rows are three places in memory
 * read at once, and the hardware prefetcher follows them worse than one sequential stream:
 * measured here (AMD EPYC, one thread, 768- and 2304-column F16 rows from memory), three rows
 * read where they are stored, with the best software prefetch found, streamed at 77-89% of a
 * plain sum's read bandwidth; the same rows grouped as below at 82-99%, with no software prefetch
 * at all (BENCHMARKS.md).
 *
 * The layout: rows in groups of TD_CPU_GROUP (the last group may hold fewer, gr rows); group g
 * starts where its first row would (g * TD_CPU_GROUP rows of 2 * cols bytes in), and holds, per 8
 * columns k in order, those 8 halves of each of its rows in row order: row r's columns
 * [8k, 8k + 8) are at group + (k * gr + r % TD_CPU_GROUP) * 16. The same bytes, the same size.
 *
 * The copies are made when the engine is created (the backend's prepare hook, for every matrix it
 * multiplies whole), else the first time a matrix is multiplied, and found again by its address
 * (as the CUDA backend's weight cache does; the model outlives the backend): the weights are not
 * read where they are stored again, so a file mapping's pages are left to the page cache, which
 * may reclaim them. The backend's operations come from one thread at a time (td_cpu_pool_run is
 * not reentrant), so the table needs no lock. */
#include "cpu_impl.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct grouped {
    const void *data; /* the matrix as stored: the key, with its shape */
    int64_t rows, cols;
    uint8_t *copy;
    size_t bytes;
} grouped_t;

struct td_cpu_groups {
    grouped_t *ents; /* open addressing by data address, cap a power of two */
    size_t n, cap;
    bool failed; /* a copy could not be made: logged once, the stored rows used */
};

td_cpu_groups_t *td__cpu_groups_new(void)
{
    return td_calloc(1, sizeof(td_cpu_groups_t));
}

void td__cpu_groups_free(td_cpu_groups_t *gs)
{
    if (!gs)
        return;
    for (size_t i = 0; i < gs->cap; i++)
        if (gs->ents[i].copy)
            td_huge_free(gs->ents[i].copy, gs->ents[i].bytes);
    free(gs->ents);
    free(gs);
}

bool td__cpu_groupable(const td_mat_t *W)
{
    return W->dtype == TD_DTYPE_F16 && W->cols % 32 == 0 && W->rows > 0;
}

const uint8_t *td__cpu_group_at(const uint8_t *copy, const td_mat_t *W, int64_t r, int64_t c,
                                int64_t *step)
{
    const int64_t g = r / TD_CPU_GROUP, gr = TD_MIN(TD_CPU_GROUP, W->rows - g * TD_CPU_GROUP);
    *step = gr * 16;
    return copy +
           (size_t)(g * TD_CPU_GROUP * W->cols * 2 + c / 8 * gr * 16 + r % TD_CPU_GROUP * 16);
}

static void fill(const td_mat_t *W, uint8_t *dst)
{
    const size_t rb = (size_t)W->cols * 2;
    for (int64_t r0 = 0; r0 < W->rows; r0 += TD_CPU_GROUP) {
        const int64_t gr = TD_MIN(TD_CPU_GROUP, W->rows - r0);
        for (int64_t i = 0; i < gr; i++) {
            const uint8_t *src = (const uint8_t *)W->data + (size_t)(r0 + i) * rb;
            uint8_t *d = dst + (size_t)r0 * rb + (size_t)i * 16;
            for (int64_t k = 0; k < W->cols / 8; k++)
                memcpy(d + (size_t)(k * gr * 16), src + k * 16, 16);
        }
    }
}

static inline size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static bool grow(td_cpu_groups_t *gs)
{
    size_t cap = gs->cap ? 2 * gs->cap : 64;
    grouped_t *ents = td_calloc(cap, sizeof(grouped_t));
    if (!ents)
        return false;
    for (size_t i = 0; i < gs->cap; i++) {
        if (!gs->ents[i].data)
            continue;
        size_t s = slot_of(gs->ents[i].data, cap);
        while (ents[s].data)
            s = (s + 1) & (cap - 1);
        ents[s] = gs->ents[i];
    }
    free(gs->ents);
    gs->ents = ents;
    gs->cap = cap;
    return true;
}

const uint8_t *td__cpu_groups_get(td_cpu_groups_t *gs, const td_mat_t *W)
{
    if (!gs || !td__cpu_groupable(W))
        return NULL;
    size_t s = 0;
    if (gs->cap) {
        for (s = slot_of(W->data, gs->cap); gs->ents[s].data; s = (s + 1) & (gs->cap - 1))
            if (gs->ents[s].data == W->data && gs->ents[s].rows == W->rows &&
                gs->ents[s].cols == W->cols)
                return gs->ents[s].copy;
    }
    if (gs->failed)
        return NULL;
    if (2 * (gs->n + 1) > gs->cap) {
        if (!grow(gs))
            goto fail;
        for (s = slot_of(W->data, gs->cap); gs->ents[s].data; s = (s + 1) & (gs->cap - 1))
            ;
    }
    const size_t bytes = (size_t)W->rows * (size_t)W->cols * 2;
    uint8_t *copy = td_huge_calloc(bytes, 1);
    if (!copy)
        goto fail;
    fill(W, copy);
    gs->ents[s] = (grouped_t){W->data, W->rows, W->cols, copy, bytes};
    gs->n++;
    return copy;
fail:
    gs->failed = true;
    TD_LOG_W("cpu backend: no memory for a grouped copy of a %lld x %lld F16 matrix; F16 "
             "matrices are multiplied from their stored rows from now on",
             (long long)W->rows, (long long)W->cols);
    return NULL;
}

/* cpu_impl.h: what the CPU backend's files share: the thread pool and the kernel attribute. */
#ifndef TD_CPU_IMPL_H
#define TD_CPU_IMPL_H

#include "td_model.h"

#include <stdbool.h>
#include <stdint.h>

/* Hot kernels are compiled twice, for x86-64-v3 (AVX2, FMA) and the baseline, and picked at load
 * time; elsewhere they are compiled once. Not under the sanitizers: their ifunc resolvers run
 * before the sanitizer's runtime is up (ThreadSanitizer crashes in them). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TD_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TD_CPU_KERNEL
#endif

/* Ask GCC to vectorise a loop its default -O2 cost model leaves scalar (int8 -> float widening). */
#if defined(__GNUC__) && !defined(__clang__)
#define TD_CPU_VECTORIZE __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define TD_CPU_VECTORIZE
#endif

/* A fixed pool of threads that split index ranges. The caller's thread takes part. */
typedef struct td_cpu_pool td_cpu_pool_t;

/* fn(ctx, begin, end, tid) runs on thread tid for [begin, end); tid < n_threads. */
typedef void (*td_cpu_job_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads >= 1 (the caller counts as one). NULL on failure. */
td_cpu_pool_t *td_cpu_pool_create(int n_threads);
void td_cpu_pool_free(td_cpu_pool_t *p);
/* Split [0, n) into one contiguous range per thread and wait for all. A NULL pool runs fn
 * on the caller alone. Not reentrant: one caller at a time. */
void td_cpu_pool_run(td_cpu_pool_t *p, int64_t n, td_cpu_job_fn fn, void *ctx);

/* Fill b's memory hooks (cpu_mem.c): host memory for every kind. */
struct td_backend;
void td__cpu_mem_hooks(struct td_backend *b);

float td__cpu_dot(const float *a, const float *b, int64_t n);

/* Columns [c0, c0 + n) of row r of W as fp32 (cpu_dequant.c): a pointer into W's data for F32,
 * else buf[n] filled. c0 and n keep every block whole (multiples of 256 but for the row's end). */
const float *td__cpu_row_chunk(const td_mat_t *W, int64_t r, int64_t c0, int64_t n, float *buf);

/* *out = the dot product of columns [c0, c0 + n) of row r of W with x[n], summed in the one-row
 * matmul kernel's order over the values td__cpu_row_chunk gives (so bitwise the same), without
 * storing the row: Q8_0, Q4_0, Q4_K and Q6_K where the CPU has AVX2 and F16C, F16 where it has
 * F16C. False (nothing done) otherwise. */
bool td__cpu_dot_row(const td_mat_t *W, int64_t r, int64_t c0, int64_t n, const float *x,
                     float *out);

#endif

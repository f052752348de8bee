/* td_cuda.h: the CUDA backend (built with -Dcuda=enabled, or auto where /usr/local/cuda exists):
 * the td_backend_t table on one GPU. GEMMs are cuBLAS with fp32 accumulation, weights converted
 * once to BF16 on upload (or kept fp32: fp32_gemm) and activations rounded to BF16 at each GEMM's
 * input; everything else (norms, RoPE, SwiGLU, attention, the KV cache) is fp32. Activations and
 * the KV pool live in device memory (the engine's arena in managed memory); weights and tables
 * stay host memory on the engine's side and are copied by the backend (td_backend.h).
 *
 * Operations queue on one stream. A CUDA failure inside an operation (an interface with no error
 * return) aborts the process with the operation and CUDA's message. */
#ifndef TD_CUDA_H
#define TD_CUDA_H

#include "td_backend.h"

#include <stdbool.h>

typedef struct td_cuda_opts {
    int device;     /* CUDA device ordinal */
    bool fp32_gemm; /* keep weights fp32 and multiply in fp32 (the equivalence tests' tight mode) */
} td_cuda_opts_t;

/* How many CUDA devices this process sees; 0 with the reason in td_err_msg (no driver, no GPU). */
int td_cuda_device_count(void);

/* The CUDA backend on opts->device (NULL: device 0, BF16 GEMMs). 0, TD_ENOTSUP (no such device:
 * td_err_msg says why) or TD_ENOMEM. */
int td_cuda_backend_create(const td_cuda_opts_t *opts, td_backend_t **out);

/* The device's name and its compute capability (major * 10 + minor). */
const char *td_cuda_device_name(const td_backend_t *b, int *cc);

/* Measured in this process: device-to-device copy bandwidth in GB/s (bytes read + written, the
 * HBM roofline for a memory-bound decode) and a large BF16 cuBLAS GEMM in TFLOP/s (the ceiling
 * for prefill). 0 or TD_ENOMEM. */
int td_cuda_measure_peaks(td_backend_t *b, double *hbm_gbs, double *gemm_tflops);

/* Bytes of device memory the backend holds for weights (after conversion). */
size_t td_cuda_weight_bytes(const td_backend_t *b);

#endif

/*
 * no_cuda.c - the CUDA entry points of a CPU-only build: same symbols, a clear status.
 * Compiled instead of native/src/cuda/ when CMake finds no CUDA compiler (or PQ2_CUDA=OFF).
 */
#include "common/errors.h"

static pq2_status no_cuda(const char *fn)
{
    return pq2_set_error(PQ2_ERR_NO_CUDA,
                         "%s: libpq2 was built without CUDA; rebuild with a CUDA compiler "
                         "(nvcc on PATH, or -DPQ2_CUDA=ON) to use the GPU entry points",
                         fn);
}

PQ2_API pq2_status pq2_cuda_init(void)
{
    return no_cuda("pq2_cuda_init");
}

PQ2_API pq2_status pq2_quantize_q8_cuda(const void *x, int32_t x_dtype, int64_t m, int64_t k,
                                        int8_t *q8, float *scales, int32_t *sums, void *stream)
{
    (void)x, (void)x_dtype, (void)m, (void)k, (void)q8, (void)scales, (void)sums, (void)stream;
    return no_cuda("pq2_quantize_q8_cuda");
}

PQ2_API pq2_status pq2_matmul_config_for(const pq2_weights *w, int64_t m, pq2_matmul_config *cfg)
{
    (void)w, (void)m, (void)cfg;
    return no_cuda("pq2_matmul_config_for");
}

PQ2_API pq2_status pq2_matmul_workspace_size(const pq2_weights *w, int64_t m,
                                             const pq2_matmul_config *cfg, size_t *bytes)
{
    (void)w, (void)m, (void)cfg, (void)bytes;
    return no_cuda("pq2_matmul_workspace_size");
}

PQ2_API pq2_status pq2_matmul_cuda(const pq2_weights *w, const void *x, int32_t x_dtype, void *y,
                                   int32_t y_dtype, int64_t m, const pq2_matmul_config *cfg,
                                   void *workspace, size_t workspace_bytes, void *stream)
{
    (void)w, (void)x, (void)x_dtype, (void)y, (void)y_dtype, (void)m, (void)cfg, (void)workspace,
        (void)workspace_bytes, (void)stream;
    return no_cuda("pq2_matmul_cuda");
}

PQ2_API pq2_status pq2_matmul_q8_cuda(const pq2_weights *w, const int8_t *q8, const float *scales,
                                      const int32_t *sums, void *y, int32_t y_dtype, int64_t m,
                                      const pq2_matmul_config *cfg, void *workspace,
                                      size_t workspace_bytes, void *stream)
{
    (void)w, (void)q8, (void)scales, (void)sums, (void)y, (void)y_dtype, (void)m, (void)cfg,
        (void)workspace, (void)workspace_bytes, (void)stream;
    return no_cuda("pq2_matmul_q8_cuda");
}

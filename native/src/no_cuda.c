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

PQ2_API pq2_status pq2_q8_kernel_operand_bytes(int64_t m, int64_t k, size_t *bytes)
{
    (void)m, (void)k, (void)bytes;
    return no_cuda("pq2_q8_kernel_operand_bytes");
}

PQ2_API pq2_status pq2_quantize_q8_cuda(const void *x, int32_t x_dtype, int64_t m, int64_t k,
                                        const pq2_q8 *out, void *stream)
{
    (void)x, (void)x_dtype, (void)m, (void)k, (void)out, (void)stream;
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

PQ2_API pq2_status pq2_matmul_q8_cuda(const pq2_weights *w, const pq2_q8 *x, void *y,
                                      int32_t y_dtype, int64_t m, const pq2_matmul_config *cfg,
                                      void *workspace, size_t workspace_bytes, void *stream)
{
    (void)w, (void)x, (void)y, (void)y_dtype, (void)m, (void)cfg, (void)workspace,
        (void)workspace_bytes, (void)stream;
    return no_cuda("pq2_matmul_q8_cuda");
}

PQ2_API pq2_status pq2_rotate_cuda(const void *x, int32_t x_dtype, void *y, int32_t y_dtype,
                                   int64_t m, int64_t width, const pq2_rotation *rot, int32_t flags,
                                   void *stream)
{
    (void)x, (void)x_dtype, (void)y, (void)y_dtype, (void)m, (void)width, (void)rot, (void)flags,
        (void)stream;
    return no_cuda("pq2_rotate_cuda");
}

PQ2_API pq2_status pq2_norm_rotate_q8_cuda(const void *x, const void *residual, void *h_out,
                                           int32_t dtype, const void *norm_weight,
                                           int32_t norm_dtype, float eps, int64_t m, int64_t width,
                                           const pq2_rotation *rot, const pq2_q8 *out, void *normed,
                                           int32_t normed_dtype, void *stream)
{
    (void)x, (void)residual, (void)h_out, (void)dtype, (void)norm_weight, (void)norm_dtype,
        (void)eps, (void)m, (void)width, (void)rot, (void)out, (void)normed, (void)normed_dtype,
        (void)stream;
    return no_cuda("pq2_norm_rotate_q8_cuda");
}

PQ2_API pq2_status pq2_swiglu_rotate_q8_cuda(const void *gate, const void *up, int64_t ld,
                                             int32_t dtype, int64_t m, int64_t width,
                                             const pq2_rotation *rot, const pq2_q8 *out,
                                             void *stream)
{
    (void)gate, (void)up, (void)ld, (void)dtype, (void)m, (void)width, (void)rot, (void)out,
        (void)stream;
    return no_cuda("pq2_swiglu_rotate_q8_cuda");
}

PQ2_API pq2_status pq2_rotate_q8_cuda(const void *x, int32_t dtype, int64_t m, int64_t width,
                                      const pq2_rotation *rot, int32_t v_heads, int32_t k_heads,
                                      const pq2_q8 *out, void *stream)
{
    (void)x, (void)dtype, (void)m, (void)width, (void)rot, (void)v_heads, (void)k_heads, (void)out,
        (void)stream;
    return no_cuda("pq2_rotate_q8_cuda");
}

PQ2_API pq2_status pq2_gated_norm_rotate_q8_cuda(const void *o, const void *z, int64_t ld_z,
                                                 int32_t z_dtype, const void *norm_weight,
                                                 int32_t norm_dtype, float eps, int64_t m,
                                                 int64_t width, const pq2_rotation *rot,
                                                 int32_t v_heads, int32_t k_heads,
                                                 const pq2_q8 *out, void *stream)
{
    (void)o, (void)z, (void)ld_z, (void)z_dtype, (void)norm_weight, (void)norm_dtype, (void)eps;
    (void)m, (void)width, (void)rot, (void)v_heads, (void)k_heads, (void)out, (void)stream;
    return no_cuda("pq2_gated_norm_rotate_q8_cuda");
}

PQ2_API pq2_status pq2_get_rows_cuda(const pq2_weights *w, const int32_t *ids, int64_t n_ids,
                                     void *out, int32_t out_dtype, const pq2_rotation *rot,
                                     void *stream)
{
    (void)w, (void)ids, (void)n_ids, (void)out, (void)out_dtype, (void)rot, (void)stream;
    return no_cuda("pq2_get_rows_cuda");
}

PQ2_API pq2_status pq2_dequantize_cuda(const pq2_weights *w, void *out, int32_t out_dtype,
                                       void *stream)
{
    (void)w, (void)out, (void)out_dtype, (void)stream;
    return no_cuda("pq2_dequantize_cuda");
}

PQ2_API pq2_status pq2_attention_decode_cuda(const pq2_attention_decode *a, void *stream)
{
    (void)a, (void)stream;
    return no_cuda("pq2_attention_decode_cuda");
}

// attention.cu - the CUDA entry point of attention decode (pq2.h pq2_attention_decode_cuda):
// checks every argument, then launches attention/decode.cu's kernel.
#include <cmath>

#include "attention/attention.h"
#include "device/device.h"
#include "device/launch.cuh"

namespace {

bool in(int64_t v, int64_t lo, int64_t hi)
{
    return v >= lo && v <= hi;
}

pq2_status check(const char *fn, const pq2_attention_decode *a)
{
    PQ2_CHECK_PTR(fn, a);
    PQ2_CHECK_PTR(fn, a->q);
    PQ2_CHECK_PTR(fn, a->k_cache);
    PQ2_CHECK_PTR(fn, a->v_cache);
    PQ2_CHECK_PTR(fn, a->positions);
    PQ2_CHECK_PTR(fn, a->m);
    PQ2_CHECK_PTR(fn, a->l);
    PQ2_CHECK_PTR(fn, a->acc);
    if (a->dtype != PQ2_DTYPE_BF16)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: dtype=%d: attention decode serves bf16 (PQ2_DTYPE_BF16 = 2) only",
                             fn, (int)a->dtype);
    if (!in(a->head_dim, PQ2_ATTENTION_MIN_HEAD_DIM, PQ2_ATTENTION_MAX_HEAD_DIM) ||
        (a->head_dim & (a->head_dim - 1)) != 0)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED, "%s: head_dim=%lld is not a power of two in %d..%d", fn,
            (long long)a->head_dim, PQ2_ATTENTION_MIN_HEAD_DIM, PQ2_ATTENTION_MAX_HEAD_DIM);
    if (!in(a->batch, 1, 65535) || !in(a->n_head_kv, 1, 65535))
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: batch=%lld n_head_kv=%lld: each must be 1..65535",
                             fn, (long long)a->batch, (long long)a->n_head_kv);
    if (a->n_head < a->n_head_kv || a->n_head % a->n_head_kv != 0 ||
        a->n_head / a->n_head_kv > PQ2_ATTENTION_MAX_GROUP)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: n_head=%lld n_head_kv=%lld: need n_head = n_head_kv * group "
                             "with group 1..%d",
                             fn, (long long)a->n_head, (long long)a->n_head_kv,
                             PQ2_ATTENTION_MAX_GROUP);
    if (a->chunk < 32 || a->chunk > 65536 || a->chunk % 32 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: chunk=%lld is not a multiple of 32 in 32..65536",
                             fn, (long long)a->chunk);
    if (!in(a->chunks, 1, INT32_MAX) || a->n_chunks < a->chunks)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: chunks=%lld n_chunks=%lld: need 1 <= chunks <= n_chunks and "
                             "chunks < 2^31",
                             fn, (long long)a->chunks, (long long)a->n_chunks);
    if (a->stride_b < 0 || a->stride_h < 0 || a->stride_s < a->head_dim ||
        a->stride_s > INT32_MAX / a->chunk || a->stride_b % 8 != 0 || a->stride_h % 8 != 0 ||
        a->stride_s % 8 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: cache strides b=%lld h=%lld s=%lld (chunk %lld): need multiples "
                             "of 8 (16-byte rows), non-negative, head_dim <= s and chunk * s < "
                             "2^31",
                             fn, (long long)a->stride_b, (long long)a->stride_h,
                             (long long)a->stride_s, (long long)a->chunk);
    // every slot index (and the element offsets below it) fits int64
    const double slots = (double)a->batch * (double)a->n_head * (double)a->n_chunks;
    if (slots * (double)a->head_dim >= 9.0e18)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: batch x n_head x n_chunks x head_dim overflows",
                             fn);
    if (!std::isfinite(a->scale))
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: scale=%g must be finite", fn,
                             (double)a->scale);
    PQ2_CHECK_ALIGN(fn, a->q, 16);
    PQ2_CHECK_ALIGN(fn, a->k_cache, 16);
    PQ2_CHECK_ALIGN(fn, a->v_cache, 16);
    PQ2_CHECK_ALIGN(fn, a->positions, 8);
    PQ2_CHECK_ALIGN(fn, a->m, 4);
    PQ2_CHECK_ALIGN(fn, a->l, 4);
    PQ2_CHECK_ALIGN(fn, a->acc, 4);
    return PQ2_OK;
}

}  // namespace

extern "C" PQ2_API pq2_status pq2_attention_decode_cuda(const pq2_attention_decode *a, void *stream)
{
    static const char fn[] = "pq2_attention_decode_cuda";
    PQ2_CHECK(check(fn, a));
    pq2_device dev;
    PQ2_CHECK(pq2_device_get(fn, &dev));
    return pq2_attention_launch(fn, *a, dev.max_smem, pq2_pdl_ok(),
                                static_cast<cudaStream_t>(stream));
}

// quantize.cuh - the Q8 activation quantiser's launcher, shared by the matmul entry points.
#pragma once
#include "common.cuh"

// Quantises x[m][k] into scales/sums and q8 unless it is NULL (see pq2.h) and, when bits is not NULL, their
// bit-sliced copy (common.cuh; m * k/128 * PQ2_BITS_GROUP_WORDS words) on `stream`, and zeroes
// zero[0..n_zero) in the same launch (the matmul's arrival counters). Arguments already
// validated except dtype. pdl: launch as a programmatic dependent of the stream's previous
// kernel (Hopper).
// When records is not NULL (m <= 8), also the token-constant records (decode.cuh, pq2_decode_needs_records).
pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m,
                               int64_t k, int8_t *q8, float *scales, int32_t *sums,
                               uint32_t *bits, int4 *records, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream);

// The bit-sliced copy of q8[m][k] (plane order, as the quantiser writes it) into bits, the same
// words the quantiser writes, and zero[0..n_zero) cleared in the same launch. pdl: as
// pq2_quantize_launch (the kernel reads q8 only after the previous kernel of the stream is done,
// and lets the matmul that follows start streaming weights).
pq2_status pq2_bitslice_launch(const char *fn, const int8_t *q8, int64_t m, int64_t k, uint32_t *bits,
                               uint32_t *zero, int32_t n_zero, bool pdl, cudaStream_t stream);

// True when the current device (already initialised) supports programmatic dependent launch.
bool pq2_pdl_ok();

// The token-constant records (decode.cuh) of the caller's scales and sums [m][k/128], m in 2..8,
// and zero[0..n_zero) cleared, as a programmatic dependent launch like the two above.
pq2_status pq2_token_records_launch(const char *fn, const float *scales, const int32_t *sums, int64_t m,
                                    int64_t k, int4 *records, uint32_t *zero, int32_t n_zero, bool pdl,
                                    cudaStream_t stream);

// quantize.h - the launchers of the Q8 activation kernels: the quantiser and the two small
// kernels that make the row-block family's workspace operands from an existing Q8 operand.
// Arguments are validated by the caller. Each clears zero[0..n_zero) (the matmul's arrival
// counters) in the same launch. pdl: launch as a programmatic dependent of the stream's previous
// kernel (sm_90): the kernel reads its inputs only after that kernel has finished, and lets the
// matmul that follows start streaming weights.
#pragma once

#include <cuda_runtime.h>

#include "common/errors.h"

// Quantises x[m][k] (x_dtype) into scales/sums and, unless NULL, q8 (pq2.h); when bits is not
// NULL also the bit-sliced copy (device/codes.cuh; m * k/128 * PQ2_BITS_GROUP_WORDS words), when
// records is not NULL (m <= 8) the token-constant records. sms: the device's multiprocessors (they
// pick the tasks per warp of the kernel above m = 16).
pq2_status pq2_quantize_launch(const char *fn, const void *x, int32_t x_dtype, int64_t m, int64_t k,
                               int8_t *q8, float *scales, int32_t *sums, uint32_t *bits,
                               int4 *records, uint32_t *zero, int32_t n_zero, bool pdl, int sms,
                               cudaStream_t stream);

// The bit-sliced copy of q8[m][k] (plane order): the words the quantiser writes.
pq2_status pq2_bitslice_launch(const char *fn, const int8_t *q8, int64_t m, int64_t k,
                               uint32_t *bits, uint32_t *zero, int32_t n_zero, bool pdl,
                               cudaStream_t stream);

// The token-constant records of scales and sums [m][k/128], m in 2..8.
pq2_status pq2_token_records_launch(const char *fn, const float *scales, const int32_t *sums,
                                    int64_t m, int64_t k, int4 *records, uint32_t *zero,
                                    int32_t n_zero, bool pdl, cudaStream_t stream);

// ---- the Q8 operand (pq2.h pq2_q8) ----

// Bytes of the kernel operand of an m x k operand (m > 0, k a positive multiple of 128) into
// *bytes: the bit slices (m == 1), the token records (2 <= m <= 8), nothing above. Returns 0
// (and leaves *bytes) where the operand's q8 (m * k bytes) or its kernel operand would be larger
// than PQ2_MAX_BYTES, else 1.
int pq2_q8_kernel_operand_size(int64_t m, int64_t k, size_t *bytes);

// The pointers a writer of a Q8 operand fills (bits and records NULL where not given or not
// read at this m).
struct pq2_q8_sink {
    int8_t *q8;
    float *scales;
    int32_t *sums;
    uint32_t *bits;
    int4 *records;
};

// Checks the operand *q of m x k (its pointers and their alignment; q8 may be NULL only at
// m == 1 with a kernel operand) and resolves its parts. `name` names the argument in messages.
pq2_status pq2_q8_resolve(const char *fn, const char *name, const pq2_q8 *q, int64_t m, int64_t k,
                          pq2_q8_sink *sink);

// rotate.h - the row transforms of the weight path (FORMATS.md "Prism Hadamard rotation"): per
// row of m, a source (activations; residual add + RMSNorm; SwiGLU; the gdn_v_grouped
// permutation; or rows of a PQ2_0 matrix), then the signs and the block Hadamard transform,
// then a sink (dense output or the matmul's Q8 operand). One launcher; arguments validated by
// the caller (api/rotate.cu, api/get_rows_dequantize.cu).
#pragma once

#include <cuda_runtime.h>

#include "common/view.h"

enum pq2_row_source {
    PQ2_SOURCE_PLAIN = 0,    // x
    PQ2_SOURCE_NORM = 1,     // h = x (+ residual, h written out); RMSNorm(h) * weight
    PQ2_SOURCE_SWIGLU = 2,   // silu(gate) * up
    PQ2_SOURCE_PERMUTE = 3,  // x in grouped V-head order (gdn_v_grouped), or x when nv = 0
    PQ2_SOURCE_WEIGHTS = 4,  // rows ids[i] of a PQ2_0 matrix, dequantised
    PQ2_SOURCE_GATED = 5,    // RMSNorm per V head of x (f32) * weight * silu(x2), as PERMUTE
};

struct pq2_row_transform {
    int32_t source;
    // the source: x[m][ld] (SWIGLU: gate, x2 = up), of x_dtype; GATED: x[m][width] f32 (the
    // recurrence's output), x2[m][ld] of x_dtype (the gate z), norm_weight [width / nv]
    const void *x, *x2;
    int32_t x_dtype;
    int64_t ld;
    // NORM: h = x + residual (residual NULL: h = x), written to h_out unless NULL
    const void *residual;     // [m][width] x_dtype
    void *h_out;              // [m][width] x_dtype, overlapping neither x nor residual
    const void *norm_weight;  // [width], norm_dtype
    int32_t norm_dtype;
    float eps;
    void *normed;  // [m][width] normed_dtype: RMSNorm(h) * weight before the rotation, or NULL
    int32_t normed_dtype;
    // PERMUTE: V heads nv (0: no permutation), K heads nk, head width hd = width / nv; GATED:
    // nv V heads of hd = width / nv (a power of two, 4..128), permuted when nk > 0
    int32_t nv, nk;
    // WEIGHTS: the matrix (device data) and the row ids [m]
    pq2_view w;
    const int32_t *ids;
    // the rotation: B = 2^log2b (log2b 0: none), signs [width] or NULL, inverse
    int32_t log2b;
    const int8_t *signs;
    int32_t inverse;
    // the sink: y[m][width] of y_dtype, or the Q8 operand (q8 may be NULL, bits at m == 1 and
    // records at 2 <= m <= 8 may be NULL)
    void *y;
    int32_t y_dtype;
    int8_t *q8;
    float *scales;
    int32_t *sums;
    uint32_t *bits;
    int4 *records;
    int64_t m, width;
};

// Elements per block: a power-of-two multiple of max(B, 128) that divides width, at most
// max(B, 1024) (width % 128 == 0 and width % B == 0 checked by the caller).
int64_t pq2_row_tile(int64_t width, int32_t log2b);

// Launches the transform (pdl: as a programmatic dependent of the stream's previous kernel; sms:
// the device's multiprocessors, which pick the RMSNorm's load depth, or a block per row).
pq2_status pq2_row_transform_launch(const char *fn, const pq2_row_transform &t, bool pdl, int sms,
                                    cudaStream_t stream);

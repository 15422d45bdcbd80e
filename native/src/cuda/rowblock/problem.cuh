// problem.cuh - what a row-block kernel receives: one validated problem (device pointers to the
// weight regions, the activations in their workspace formats, the output), and the facts of the
// family that the host side and the kernels share.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "pq2.h"

// Largest token class: the family serves m = 1..PQ2_ROWBLOCK_MAX_M (pq2.h).
// The fields keep their order: it fixes the kernel parameter offsets, and so the SASS.
struct pq2_rowblock_problem {
    const uint8_t *codes;     // code plane (PLANES) or tile-major code region (TILES)
    const uint16_t *wscales;  // fp16 scale plane / tile-major scale region
    const int8_t *q8;         // [m][k] plane order
    const float *xs;          // [m][k/128]
    const int32_t *sums;      // [m][k/128]
    const uint32_t *xbits;    // [m][k/128][PQ2_BITS_GROUP_WORDS] bit-sliced q8 (m == 1)
    void *y;                  // [m][n], y_dtype
    float *partial;           // split row blocks: [row block][split][m][16 * row_subtiles] fp32
    uint32_t *counters;       // split row blocks: one arrival counter per row block, zero on entry
    int64_t n, k;
    int32_t m, layout, y_dtype;
    int32_t layout_rt;    // TILES: the file's tile height rt; PLANES: 0
    int32_t splits;       // blocks per row block (1 = no split)
    int32_t tc_cap;       // m > 8: token-constant units per warp in shared memory
    const int4 *records;  // [k/128][PQ2_TC_PAIRS] token-constant records (2 <= m <= 8)
};

// The token class of m, which picks a kernel instance: 1 (m == 1: bit slices), 2 (m == 2:
// column planes), 8 (m <= 8) or 16 (m <= 16).
static inline int pq2_rowblock_tokens_class(int64_t m)
{
    return m <= 2 ? (int)m : m <= 8 ? 8 : 16;
}

// True when the kernel reads the bit-sliced activations (device/codes.cuh): m == 1.
static inline bool pq2_rowblock_needs_bits(int64_t m)
{
    return m == 1;
}

// True when the kernel reads the token-constant records (device/codes.cuh): 2 <= m <= 8. Lane tq of
// a warp needs record pair tq (m == 2: pair 0) of each unit's group: one 16-byte load instead of
// four loads and their address arithmetic.
static inline bool pq2_rowblock_needs_records(int64_t m)
{
    return m >= 2 && m <= 8;
}

// Row blocks of `row_subtiles` 16-row sub-tiles covering n rows.
__host__ __device__ inline int64_t pq2_rowblock_row_blocks(int64_t n, int32_t row_subtiles)
{
    return (n + 16 * row_subtiles - 1) / (16 * row_subtiles);
}

// decode.cuh - the small-batch (M = 1..16, decode) matmul family: launcher interface.
#pragma once
#include "common.cuh"

// One validated problem, device pointers resolved to the code and scale regions of the layout.
struct pq2_decode_problem {
    const uint8_t *codes;    // code plane (PLANES) or tile-major code region (TILES)
    const uint16_t *wscales; // fp16 scale plane / tile-major scale region
    const int8_t *q8;        // [m][k] plane order
    const float *xs;         // [m][k/128]
    const int32_t *sums;     // [m][k/128]
    void *y;                 // [m][n], y_dtype
    float *partial;          // split-K partial sums [split][m][n] (split > 1)
    uint32_t *counters;      // split-K completion counters, one per row block, zero on entry
    int64_t n, k;
    int32_t m, layout, y_dtype;
};

// Row blocks (blocks along N) of a configuration: ceil(n / (16 * rt)).
static inline int64_t pq2_decode_row_blocks(int64_t n, int32_t rt) { return (n + 16 * rt - 1) / (16 * rt); }

// Groups per split and the number of splits that are non-empty for cfg.split requested.
static inline void pq2_decode_split(int64_t groups, int32_t split, int64_t *per, int32_t *used)
{
    int64_t p = (groups + split - 1) / split;
    *per = p;
    *used = (int32_t)((groups + p - 1) / p);
}

// Launches the decode kernel for a validated problem and configuration (cfg already checked
// against the supported set by pq2_decode_check_config).
pq2_status pq2_decode_launch(const char *fn, const pq2_decode_problem &p,
                             const pq2_decode_config &cfg, cudaStream_t stream);

// PQ2_OK when the family has an instance for cfg with this layout and m, else an error.
pq2_status pq2_decode_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                   int32_t layout_rt, int64_t m);

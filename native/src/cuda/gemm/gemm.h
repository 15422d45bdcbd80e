// gemm.h - the host side of the GEMM families (any m, tiles layout; portable and sm_90a):
// configuration checks, grid, workspace needs, one-time device setup and the launch.
#pragma once

#include <cuda_runtime.h>

#include "common/errors.h"

// One validated problem: the weight regions (tiles layout), the Q8 operand, the output, and the
// workspace of split configurations.
struct pq2_gemm_problem {
    const uint8_t *codes;     // tile-major code region
    const uint16_t *wscales;  // tile-major scale region
    const int8_t *q8;         // [m][k] plane order
    const float *xs;          // [m][k/128]
    const int32_t *sums;      // [m][k/128]
    void *y;                  // [m][n], y_dtype
    float *partial;           // splits > 1: [tile][split][128 x tokens] fp32; stream-K:
                              // [block][2][128 x tokens] fp32
    uint32_t *counters;       // splits > 1 or stream-K: one arrival counter per tile, zero
    int64_t n, k, m;
    int32_t rt;  // the file's tile height
    int32_t y_dtype;
    int32_t splits;
    int32_t tiles;         // stream-K: row blocks x token blocks
    int32_t token_blocks;  // stream-K: token blocks (of `tokens` tokens)
};

// The kernels' shared-memory limits (the sm_90a kernels only on a compute capability 9.0 device).
pq2_status pq2_gemm_init_device(const char *fn, int cc, int max_smem_optin);

// Whether this libpq2 holds the sm_90a kernels of PQ2_FAMILY_GEMM_SM90.
bool pq2_gemm_sm90_built();

// Whether a device of compute capability cc runs PQ2_FAMILY_GEMM_SM90 with this build.
inline bool pq2_gemm_sm90_runs(int cc)
{
    return cc == 90 && pq2_gemm_sm90_built();
}

// The sm_90a kernels load the token scales and sums in rows of 4 groups (16 bytes): they serve
// k a multiple of 4 * 128; their TMA coordinates are 32-bit: k below 2^31.
constexpr int64_t kGemmSm90KMultiple = 512, kGemmSm90KLimit = (int64_t)1 << 31;

// Whether PQ2_FAMILY_GEMM_SM90 serves weights of k columns on a device of compute capability cc.
inline bool pq2_gemm_sm90_serves(int cc, int64_t k)
{
    return pq2_gemm_sm90_runs(cc) && k % kGemmSm90KMultiple == 0 && k < kGemmSm90KLimit;
}

// PQ2_OK when cfg is a valid GEMM configuration for this layout that the device can run.
pq2_status pq2_gemm_check_config(const char *fn, const pq2_matmul_config &cfg, int32_t layout,
                                 int64_t k, int cc, int max_smem);
// PQ2_OK when cfg's grid for this problem fits the launch and its 32-bit counts (checked before
// any kernel of a call runs).
pq2_status pq2_gemm_check_grid(const char *fn, const pq2_matmul_config &cfg, int64_t n, int64_t k,
                               int64_t m);

// The splits the dispatcher gives a GEMM fallback configuration (splits 0): enough blocks to
// fill the device once, at most 16, each split keeping at least 8 groups.
int32_t pq2_gemm_auto_splits(const pq2_matmul_config &cfg, int64_t n, int64_t k, int64_t m,
                             int sms);

// Blocks of the grid (row blocks x token blocks x splits; stream-K: blocks x sms, at most one
// per unit) and the workspace beyond the Q8 operand: arrival counters (one per tile) and partial
// sums, for a grid of `grid` blocks.
int64_t pq2_gemm_grid(const pq2_matmul_config &cfg, int64_t n, int64_t k, int64_t m, int sms);
size_t pq2_gemm_counters(const pq2_matmul_config &cfg, int64_t n, int64_t m);
size_t pq2_gemm_partial_floats(const pq2_matmul_config &cfg, int64_t grid);

// Launches the grid of `grid` blocks (pq2_gemm_grid) of a configuration the caller has checked
// (pq2_gemm_check_config, pq2_gemm_check_grid).
pq2_status pq2_gemm_launch(const char *fn, const pq2_gemm_problem &p, const pq2_matmul_config &cfg,
                           int64_t grid, bool after_kernel, cudaStream_t stream);

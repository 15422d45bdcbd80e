// rowblock.h - the host side of the row-block family (m <= PQ2_ROWBLOCK_MAX_M): configuration
// checks, grid and shared-memory sizes, workspace needs, one-time device setup and the launch.
#pragma once

#include <cuda_runtime.h>

#include "common/errors.h"
#include "rowblock/problem.cuh"

// One-time per device: lets every compiled kernel use the shared memory it may need.
pq2_status pq2_rowblock_init_device(const char *fn, int max_smem_optin);

// True when the build holds the kernel that runs cfg on this layout at m.
bool pq2_rowblock_has_kernel(const pq2_matmul_config &cfg, int32_t layout, int32_t layout_rt,
                             int64_t m);

// PQ2_OK when cfg is valid for this layout and m, compiled, and fits the device (compute
// capability cc, max_smem bytes of shared memory per block), else an error naming the values.
pq2_status pq2_rowblock_check_config(const char *fn, const pq2_matmul_config &cfg, int32_t layout,
                                     int32_t layout_rt, int64_t m, int64_t k, int cc, int max_smem);

// The grid of cfg on a device with `sms` multiprocessors: one block per row block, splits
// blocks per row block (splits > 1), or with blocks > 0 at most blocks * sms blocks that loop
// over the row blocks.
int64_t pq2_rowblock_grid(const pq2_matmul_config &cfg, int64_t n, int sms);

// Workspace a call needs beyond the Q8 activations: arrival counters (one per row block, zero
// before the kernel) and fp32 partial sums, both for split row blocks only.
size_t pq2_rowblock_counters(const pq2_matmul_config &cfg, int64_t n);
size_t pq2_rowblock_partial_floats(const pq2_matmul_config &cfg, int64_t m, int64_t blocks);

// Launches `blocks` (pq2_rowblock_grid) blocks of the kernel for cfg. after_kernel: the stream's
// previous operation is a kernel that writes the activations (sm_90: launch as its programmatic
// dependent).
pq2_status pq2_rowblock_launch(const char *fn, const pq2_rowblock_problem &p,
                               const pq2_matmul_config &cfg, int64_t blocks, bool after_kernel,
                               cudaStream_t stream);

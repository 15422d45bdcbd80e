// instantiate.cuh - compiles the kernels of one token class and lists them in that class's table.
// Included once by each kernels_m*.cu after it defines PQ2_ROWBLOCK_TU_TOKS (the class) and
// PQ2_ROWBLOCK_TU_TABLE (the table's name). The kernel list is instances.inc, or in a tuning
// build instances_tuning.inc; the lines of other token classes compile nothing here.
#pragma once

#include "rowblock/kernel_table.h"
#include "rowblock/kernels.cuh"

namespace {

template <int GRID, int LAYOUT, int LR, int RS, int U, int TOKS, int STAGES>
pq2_rowblock_kernel kernel_entry()
{
    pq2_rowblock_kernel k{{GRID, LAYOUT, LR, RS, U, TOKS, STAGES}, nullptr, nullptr};
    if constexpr (TOKS == PQ2_ROWBLOCK_TU_TOKS) {
        if constexpr (GRID == PQ2_GRID_RING)
            k.ring = rowblock_ring_kernel<RS, U, TOKS>;
        else
            k.fn = rowblock_kernel<LAYOUT, RS, U, TOKS, STAGES, GRID, LR>;
    }
    return k;
}

const pq2_rowblock_kernel kKernels[] = {
#define PQ2_ROWBLOCK_KERNEL(G, L, LR, RS, U, T, S) \
    kernel_entry<PQ2_GRID_##G, PQ2_LAYOUT_##L, LR, RS, U, T, S>(),
#ifdef PQ2_TUNING_KERNELS
#include "rowblock/instances_tuning.inc"
#else
#include "rowblock/instances.inc"
#endif
#undef PQ2_ROWBLOCK_KERNEL
};

}  // namespace

const pq2_rowblock_kernel_table PQ2_ROWBLOCK_TU_TABLE = {
    kKernels, (int)(sizeof kKernels / sizeof kKernels[0])};

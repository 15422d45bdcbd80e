// kernel_table.h - the compiled row-block kernels as data: one table per token class (one
// translation unit each, kernels_m*.cu), each entry a kernel's key and its function.
#pragma once

#include "rowblock/problem.cuh"

// What identifies a compiled kernel (the columns of instances.inc).
struct pq2_rowblock_key {
    int grid;          // PQ2_GRID_ROWS, _PERSIST, _SPLIT or _RING (kernels.cuh)
    int layout;        // PQ2_LAYOUT_TILES or PQ2_LAYOUT_PLANES
    int layout_rt;     // TILES: the file's tile height; PLANES: = row_subtiles
    int row_subtiles;  // 16-row sub-tiles per row block
    int unroll;        // 128-groups per register batch or ring slot
    int toks;          // token class (problem.cuh)
    int stages;        // 1 or 2; RING: 0 (the ring depth is a launch argument)
};

using pq2_rowblock_fn = void (*)(const pq2_rowblock_problem);
using pq2_rowblock_ring_fn = void (*)(const pq2_rowblock_problem, int stages);

struct pq2_rowblock_kernel {
    pq2_rowblock_key key;
    pq2_rowblock_fn fn;         // register kernels, else NULL
    pq2_rowblock_ring_fn ring;  // RING, else NULL
};

struct pq2_rowblock_kernel_table {
    const pq2_rowblock_kernel *kernels;
    int count;
};

extern const pq2_rowblock_kernel_table pq2_rowblock_kernels_m1, pq2_rowblock_kernels_m2,
    pq2_rowblock_kernels_m8, pq2_rowblock_kernels_m16;

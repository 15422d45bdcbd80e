// kernels_m1.cu - the row-block kernels of token class 1 (m == 1, bit slices): one translation unit
// per class, so that the classes compile in parallel.
#define PQ2_ROWBLOCK_TU_TOKS 1
#define PQ2_ROWBLOCK_TU_TABLE pq2_rowblock_kernels_m1
#include "rowblock/instantiate.cuh"

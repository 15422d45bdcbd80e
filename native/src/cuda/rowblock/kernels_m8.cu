// kernels_m8.cu - the row-block kernels of token class 8 (3 <= m <= 8): one translation unit
// per class, so that the classes compile in parallel.
#define PQ2_ROWBLOCK_TU_TOKS 8
#define PQ2_ROWBLOCK_TU_TABLE pq2_rowblock_kernels_m8
#include "rowblock/instantiate.cuh"

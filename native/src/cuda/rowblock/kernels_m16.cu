// kernels_m16.cu - the row-block kernels of token class 16 (9 <= m <= 16): one translation unit
// per class, so that the classes compile in parallel.
#define PQ2_ROWBLOCK_TU_TOKS 16
#define PQ2_ROWBLOCK_TU_TABLE pq2_rowblock_kernels_m16
#include "rowblock/instantiate.cuh"

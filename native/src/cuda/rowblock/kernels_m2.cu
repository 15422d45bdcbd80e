// kernels_m2.cu - the row-block kernels of token class 2 (m == 2, column planes): one translation
// unit per class, so that the classes compile in parallel.
#define PQ2_ROWBLOCK_TU_TOKS 2
#define PQ2_ROWBLOCK_TU_TABLE pq2_rowblock_kernels_m2
#include "rowblock/instantiate.cuh"

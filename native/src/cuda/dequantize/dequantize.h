// dequantize.h - pq2_dequantize_cuda's kernel: a PQ2_0 matrix (any layout) to a dense [n][k]
// matrix of (code - 1) * d. Arguments validated by the caller (api/get_rows_dequantize.cu: the
// view, the pointers and their alignment); the grid's limits here.
#pragma once

#include <cuda_runtime.h>

#include "common/view.h"

// Launches the dense copy of w (w.n rows) into out (out_dtype, 16-byte aligned) on stream.
pq2_status pq2_dequantize_launch(const char *fn, const pq2_view &w, void *out, int32_t out_dtype,
                                 cudaStream_t stream);

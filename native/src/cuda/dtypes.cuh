// dtypes.cuh - the activation and output element types of pq2.h (pq2_dtype) on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>

#include "pq2.h"

// Stores v as element i of a y buffer of `dtype` (round to nearest even).
__device__ __forceinline__ void pq2_store_from_f32(void *p, size_t i, int dtype, float v)
{
    switch (dtype) {
    case PQ2_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case PQ2_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

// dtypes.cuh - the activation and output element types of pq2.h (pq2_dtype) on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>

#include "common/errors.h"
#include "pq2.h"

// Bytes of one element of `dtype` (f32: 4, f16 and bf16: 2).
__host__ __device__ constexpr size_t pq2_dtype_bytes(int dtype)
{
    return dtype == PQ2_DTYPE_F32 ? 4 : 2;
}

// PQ2_ERR_INVALID_ARGUMENT (naming the entry point fn and the argument) unless dtype is a
// pq2_dtype.
inline pq2_status pq2_check_dtype(const char *fn, const char *name, int32_t dtype)
{
    if (dtype != PQ2_DTYPE_F32 && dtype != PQ2_DTYPE_F16 && dtype != PQ2_DTYPE_BF16)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: %s=%d is not f32 (0), f16 (1) or bf16 (2)", fn, name, (int)dtype);
    return PQ2_OK;
}

// Stores v as element i of a y buffer of `dtype` (round to nearest even).
__device__ __forceinline__ void pq2_store_from_f32(void *p, size_t i, int dtype, float v)
{
    switch (dtype) {
    case PQ2_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case PQ2_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

// Two values as one 32-bit word of a 16-bit dtype (f16, else bf16), each rounded to nearest even
// as pq2_store_from_f32 rounds it.
__device__ __forceinline__ uint32_t pq2_pack2(int32_t dtype, float a, float b)
{
    if (dtype == PQ2_DTYPE_F16) {
        const __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// Elements i..i+3 of an output row in one 8- or 16-byte store (i is a multiple of 4, the buffer
// 16-byte aligned: the entry points check it), each rounded as pq2_store_from_f32 rounds it.
// __stwb is a plain (write-back) store that the compiler keeps whole; a vector assignment it
// splits into 4-byte stores.
__device__ __forceinline__ void pq2_store4(void *base, int32_t dtype, int64_t i,
                                           const float (&v)[4])
{
    if (dtype == PQ2_DTYPE_F16 || dtype == PQ2_DTYPE_BF16)
        __stwb(reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i),
               make_uint2(pq2_pack2(dtype, v[0], v[1]), pq2_pack2(dtype, v[2], v[3])));
    else
        __stwb(reinterpret_cast<float4 *>(static_cast<float *>(base) + i),
               make_float4(v[0], v[1], v[2], v[3]));
}

// The four x values at p (element i of the lane's row), as floats.
template <int DTYPE> __device__ __forceinline__ void pq2_load4(const void *p, float (&v)[4])
{
    if constexpr (DTYPE == PQ2_DTYPE_F32) {
        float4 f = *static_cast<const float4 *>(p);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (DTYPE == PQ2_DTYPE_F16) {
        uint2 u = *static_cast<const uint2 *>(p);
        float2 a = __half22float2(*reinterpret_cast<__half2 *>(&u.x));
        float2 b = __half22float2(*reinterpret_cast<__half2 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    } else {
        uint2 u = *static_cast<const uint2 *>(p);
        float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
        float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

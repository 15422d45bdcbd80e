/* error.c - thread-local last error, status names, version queries. */
#include <stdarg.h>
#include <stdio.h>

#include "common/errors.h"

#ifndef PQ2_VERSION
#define PQ2_VERSION "0.0.0"
#endif
#ifndef PQ2_CUDA_ARCHS
#define PQ2_CUDA_ARCHS ""
#endif

/* One buffer per thread: concurrent callers never see each other's messages. */
static _Thread_local char pq2_error_buf[512];

pq2_status pq2_set_error(pq2_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pq2_error_buf, sizeof pq2_error_buf, fmt, ap);
    va_end(ap);
    return status;
}

pq2_status pq2_ok(void)
{
    pq2_error_buf[0] = '\0';
    return PQ2_OK;
}

PQ2_API const char *pq2_last_error(void)
{
    return pq2_error_buf;
}

PQ2_API uint32_t pq2_abi_version(void)
{
    return PQ2_ABI_VERSION;
}

PQ2_API int32_t pq2_built_with_cuda(void)
{
#ifdef PQ2_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}

PQ2_API int32_t pq2_built_with_tuning_kernels(void)
{
#ifdef PQ2_TUNING_KERNELS
    return 1;
#else
    return 0;
#endif
}

PQ2_API const char *pq2_version_string(void)
{
#ifdef PQ2_WITH_CUDA
#ifdef PQ2_TUNING_KERNELS
    return PQ2_VERSION " (cuda " PQ2_CUDA_ARCHS ", tuning kernels)";
#else
    return PQ2_VERSION " (cuda " PQ2_CUDA_ARCHS ")";
#endif
#else
    return PQ2_VERSION " (cpu only)";
#endif
}

PQ2_API const char *pq2_status_name(int32_t status)
{
    switch (status) {
    case PQ2_OK: return "PQ2_OK";
    case PQ2_ERR_INVALID_ARGUMENT: return "PQ2_ERR_INVALID_ARGUMENT";
    case PQ2_ERR_NULL_POINTER: return "PQ2_ERR_NULL_POINTER";
    case PQ2_ERR_SHAPE: return "PQ2_ERR_SHAPE";
    case PQ2_ERR_ALIGNMENT: return "PQ2_ERR_ALIGNMENT";
    case PQ2_ERR_UNREPRESENTABLE: return "PQ2_ERR_UNREPRESENTABLE";
    case PQ2_ERR_NO_CUDA: return "PQ2_ERR_NO_CUDA";
    case PQ2_ERR_CUDA: return "PQ2_ERR_CUDA";
    case PQ2_ERR_UNSUPPORTED: return "PQ2_ERR_UNSUPPORTED";
    case PQ2_ERR_WORKSPACE: return "PQ2_ERR_WORKSPACE";
    default: return "PQ2_STATUS_UNKNOWN";
    }
}

pq2_status pq2_check_buffer(const char *fn, const char *name, size_t have, uint64_t count,
                            uint64_t elem)
{
    uint64_t need;
    if (!pq2_mul_size(count, elem, &need) || (uint64_t)have < need)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %s holds %zu bytes, the shape needs %llu", fn,
                             name, have, (unsigned long long)(count * elem));
    return PQ2_OK;
}

// launch.cuh - the host side of every CUDA launch: CUDA errors as statuses, the launch
// configuration (with programmatic dependent launch). Pointer alignment checks are in
// common/errors.h.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/errors.h"

// Turns a CUDA runtime error into a status + message naming the entry point and the call.
#define PQ2_CUDA_TRY(fn, call)                                                              \
    do {                                                                                    \
        cudaError_t pq2_err_ = (call);                                                      \
        if (pq2_err_ != cudaSuccess)                                                        \
            return pq2_set_error(PQ2_ERR_CUDA, "%s: %s failed: %s (%s)", fn, #call,         \
                                 cudaGetErrorName(pq2_err_), cudaGetErrorString(pq2_err_)); \
    } while (0)

// After a launch: launch-configuration errors surface here (never a sticky device error).
static inline pq2_status pq2_launch_status(const char *fn)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return pq2_set_error(PQ2_ERR_CUDA, "%s: kernel launch failed: %s (%s)", fn,
                             cudaGetErrorName(e), cudaGetErrorString(e));
    return pq2_ok();
}

// One kernel launch configuration. pdl: launch as a programmatic dependent of the preceding
// kernel of the stream (Hopper; a no-op attribute elsewhere): the kernel may start while that one
// finishes and must call pq2_pdl_handoff() before reading what it wrote. Used in place
// (cfg points at attr): pq2_launch l(...); cudaLaunchKernelEx(&l.cfg, kernel, args...).
struct pq2_launch {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    pq2_launch(dim3 grid, unsigned block, size_t smem, cudaStream_t stream, bool pdl)
        : cfg(), attr()
    {
        cfg.gridDim = grid;
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        if (pdl) {
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
        }
    }
    pq2_launch(const pq2_launch &) = delete;
    pq2_launch &operator=(const pq2_launch &) = delete;
};

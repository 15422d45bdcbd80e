// probe_common.cuh - what the standalone probes (probe_stream.cu, probe_mma.cu) share; they
// include it by a relative path, so each still builds with one nvcc command and no libpq2.
#pragma once
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

// Aborts the probe with file, line, call and CUDA error text.
#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

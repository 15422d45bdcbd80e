// e3_kernels.cu - LAB (issue 37, E3; not product code): the E3 kernels (kernel_wgmma_e3.cuh) in
// their own translation units, so that they compile beside launch.cu. lab/e1/build.sh copies
// this file twice into the build's gemm/ folder: e3_kernels_narrow.cu (PQ2_E3_WIDE 0: warps 8,
// modes 9..12) and e3_kernels_wide.cu (PQ2_E3_WIDE 1: warps 12, modes 9..16); launch.cu
// (lab/e1/launch.patch) calls e3_kernel(). 128 tokens, stages 4 and 6.
#ifndef PQ2_E3_WIDE
#error "define PQ2_E3_WIDE: 0 (the narrow block) or 1 (the wide block)"
#endif

#include "gemm/kernel_wgmma_e3.cuh"

namespace pq2_gemm {

#if PQ2_E3_WIDE
wgmma_e3_fn e3_kernel_wide(int tokens, int stages, int mode)
#else
wgmma_e3_fn e3_kernel_narrow(int tokens, int stages, int mode)
#endif
{
    return tokens == 128 ? e3_kernel_of_stages<128, PQ2_E3_WIDE>(stages, mode) : nullptr;
}

}  // namespace pq2_gemm

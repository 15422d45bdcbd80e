// arrival.cuh - the arrival of the blocks that split one output tile (both matmul families):
// each writes its partial sums to the workspace, and the last to arrive adds them all in split
// order, so the result bits never depend on which block is last.
#pragma once

// Called by every thread of a block after it has written its partials: true in every thread of
// the block that arrives last of `count` on *counter, which then sees every other block's
// partials (read them with __ldcg, past L1). The caller, in that block, resets the counter.
__device__ __forceinline__ bool pq2_last_to_arrive(unsigned *counter, int count)
{
    __threadfence();  // this thread's partials are visible device-wide before the block counts
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(count - 1);
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

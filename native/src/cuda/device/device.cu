// device.cu - per-device facts and one-time setup (device.h).
#include <atomic>

#include "attention/attention.h"
#include "device/device.h"
#include "device/launch.cuh"
#include "dispatch/select.h"
#include "gemm/gemm.h"
#include "rowblock/rowblock.h"

namespace {

constexpr int kMaxDevices = 64;

struct device_slot {
    std::atomic<int> ready;  // 0 = not read yet
    pq2_device facts;
};
device_slot g_devices[kMaxDevices];

}  // namespace

pq2_status pq2_device_get(const char *fn, pq2_device *out)
{
    int dev = 0;
    PQ2_CUDA_TRY(fn, cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: device ordinal %d is beyond %d", fn, dev,
                             kMaxDevices);
    device_slot &d = g_devices[dev];
    if (!d.ready.load(std::memory_order_acquire)) {
        // Racing threads compute the same values; the stores are idempotent.
        int major = 0, minor = 0, sms = 0, smem = 0;
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        PQ2_CUDA_TRY(fn,
                     cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (major * 10 + minor < 80)
            return pq2_set_error(
                PQ2_ERR_UNSUPPORTED,
                "%s: device %d has compute capability %d.%d; pq2 kernels need 8.0 or newer (int8 "
                "mma.m16n8k32, cp.async)",
                fn, dev, major, minor);
        PQ2_CHECK(pq2_select_check_table(fn));
        PQ2_CHECK(pq2_rowblock_init_device(fn, smem));
        PQ2_CHECK(pq2_gemm_init_device(fn, major * 10 + minor, smem));
        PQ2_CHECK(pq2_attention_init_device(fn, smem));
        d.facts.sms = sms, d.facts.cc = major * 10 + minor, d.facts.max_smem = smem;
        d.ready.store(1, std::memory_order_release);
    }
    *out = d.facts;
    return PQ2_OK;
}

bool pq2_pdl_ok()
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    // 9.x only: the kernels' griddepcontrol is compiled for sm_90a; a newer device runs code
    // JIT-compiled from the compute_80 PTX, which has no wait, so a PDL launch there could read
    // what the kernel before has not finished writing.
    const int cc = g_devices[dev].facts.cc;
    return g_devices[dev].ready.load(std::memory_order_acquire) && cc >= 90 && cc < 100;
}

// pdl.cu - LAB (issue 36, not product): the research note's alternative A'. One kernel per
// projection, PDL-chained in a CUDA graph, each a grid of one CTA per SM small enough (ring <= ~110
// KB, <= 128 registers) that the next projection's CTAs share the SM, and whose per-warp bulk-copy
// ring is filled BEFORE griddepcontrol.wait. Between two projections, optionally, a producer kernel
// (17 CTAs: trigger, wait, read the projection's output, spin S us, write the next operand) as
// today's producers sit between today's calls.
//
// The question: does the next grid's early ring fill keep the memory busy through the chain
// (grid end -> producer -> grid release), so that per-call boundaries stop costing the idle memory
// they cost today (calls 1.45x, producers + calls 1.94x the floor on the H200)?
//
// The projections' core is ring.cu's (the product's m = 1 bit-slice unit core), the operand read
// from global memory (L1), each warp's partial stored at the grid's end (no cross-CTA combine: an
// optimistic bound for the projection's own work). Every variant of one NW gives the same partials
// bit for bit (each warp's units and their order depend only on NW); the probe checks that on
// poisoned outputs.
//     nvcc -O3 -std=c++17 -arch=sm_90a -Inative/src/cuda -Inative/include -o build/lab-pdl lab/seg/pdl.cu
//     build/lab-pdl [out.json]
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device/ptx.cuh"
#include "rowblock/activations.cuh"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

constexpr int kUnit = 1088;    // 32 rows x 128 weights: 1024 code bytes + 32 fp16 scale pairs
constexpr int kActMax = 4352;  // uint4 of the largest operand (K = 17408: 136 groups x 32 lanes)

struct MP {
    const uint8_t *w;   // the matrix's first unit
    const uint4 *act;   // its operand: G groups x 32 lanes x 16 B
    float *y;           // [P][NW][32] the warps' partials
    unsigned long long *stamp;  // [P][2]: wait released, end (or null)
    int nu, G;          // units, groups a row block
    int chunk, slots;   // units a copy, slots a warp's ring
    int prefill;        // 1: the ring's first slots are issued before the wait
    int ko;             // knockouts (timing only, wrong bits): 1 no griddepcontrol.wait, 2 no operand loads
};

struct PP {
    const float *y;     // the previous projection's partials
    const uint4 *src;   // the operand's pattern
    uint4 *act;         // the next projection's operand
    int n;              // uint4 to write
    int spin_ns;
};

__device__ __forceinline__ void bulk_copy_pol(uint64_t *bar, void *dst, const void *src,
                                              uint32_t bytes, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ uint64_t evict_first()
{
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;");
}
__device__ __forceinline__ void pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// [a, b) of U split over n parts, part i (32-bit: U < 2^26 here)
__device__ __forceinline__ void range_of(int U, int i, int n, int &a, int &b)
{
    a = (int)((unsigned long long)U * i / n), b = (int)((unsigned long long)U * (i + 1) / n);
}

// The product's m = 1 unit core (ring.cu's): one unit in shared memory, its operand group in global.
struct Core {
    lane_consts<1> lc;
    int gid;
    float acc[2][2];
    __device__ explicit Core(int lane) : lc(lane), gid(lane >> 2)
    {
        acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = 0.0f;
    }
    template <bool NOACT = false>
    __device__ __forceinline__ void unit(const uint8_t *u, const uint4 *act_g, int lane)
    {
        const uint4 w0 = *reinterpret_cast<const uint4 *>(u + lane * 16);
        const uint4 w1 = *reinterpret_cast<const uint4 *>(u + 512 + lane * 16);
        const uint32_t sc0 = *reinterpret_cast<const uint32_t *>(u + 1024 + gid * 4);
        const uint32_t sc1 = *reinterpret_cast<const uint32_t *>(u + 1024 + 32 + gid * 4);
        // a plain load: the operand is written while this grid lives (NOACT: a stand-in from the
        // pointer's bits, no load)
        const uint4 bx = NOACT ? make_uint4((uint32_t)(uintptr_t)act_g, lane, 3u * lane, 5u * lane) : act_g[lane];
        const int ns = (int)(bx.x & 0xff) * lc.c_neg;
        const uint4 w[2] = {w0, w1};
        const uint32_t sc[2] = {sc0, sc1};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float2 wf = __half22float2(*reinterpret_cast<const __half2 *>(&sc[r]));
            const uint32_t a[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
            const int init[4] = {ns, 0, ns, 0};
            int d[4];
            pq2_bmma_and_popc(d, a, bx.x, bx.y, init);
            pq2_bmma_and_popc(d, a, bx.z, bx.w, d);
            acc[r][0] = fmaf((float)(d[0] + lc.f2 * d[1]), wf.x * 0.5f, acc[r][0]);
            acc[r][1] = fmaf((float)(d[2] + lc.f2 * d[3]), wf.y * 0.5f, acc[r][1]);
        }
    }
};

// One projection: CTA c takes its contiguous share of the units, warp w its contiguous share of
// that, streamed through the warp's own ring (lane 0 refills a slot once the warp has read it).
template <int NW>
__global__ void __launch_bounds__(NW * 32, 2) mat_kernel(const MP p)
{
    extern __shared__ __align__(128) uint8_t smem[];
    const int SLOT = p.chunk * kUnit;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = blockIdx.x, P = gridDim.x;
    uint8_t *ring = smem + (size_t)warp * p.slots * SLOT;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)NW * p.slots * SLOT) + warp * p.slots;
    pdl_trigger();  // the next kernel may launch (it waits before reading what this one writes)
    int c0, c1, a, b;
    range_of(p.nu, c, P, c0, c1);
    range_of(c1 - c0, warp, NW, a, b);
    const int f0 = c0 + a, f1 = c0 + b;
    const int nslots = (f1 - f0 + p.chunk - 1) / p.chunk;
    const uint64_t pol = evict_first();
    if (lane == 0) {
        for (int s = 0; s < p.slots; ++s) mbar_init_count(full + s, 1);
        mbar_init_fence();
    }
    __syncwarp();
    auto issue = [&](int i) {  // slot i of the warp's walk
        if (lane == 0 && i < nslots) {
            const int s = i % p.slots, f = f0 + i * p.chunk, n = min(p.chunk, f1 - f);
            mbar_expect_tx(full + s, (uint32_t)n * kUnit);
            bulk_copy_pol(full + s, ring + (size_t)s * SLOT, p.w + (size_t)f * kUnit, (uint32_t)n * kUnit, pol);
        }
    };
    if (p.prefill)
        for (int i = 0; i < p.slots; ++i) issue(i);
    if (!(p.ko & 1)) pdl_wait();  // the operand (the previous producer's output) is read only after this
    if (p.stamp && threadIdx.x == 0) p.stamp[2 * c] = gtime();
    if (!p.prefill)
        for (int i = 0; i < p.slots; ++i) issue(i);
    Core core(lane);
    int g = f0 % p.G;
    for (int i = 0; i < nslots; ++i) {
        const int s = i % p.slots, f = f0 + i * p.chunk, n = min(p.chunk, f1 - f);
        mbar_wait(full + s, (uint32_t)(i / p.slots) & 1u);
        const uint8_t *sl = ring + (size_t)s * SLOT;
        for (int u = 0; u < n; ++u) {
            if (p.ko & 2) core.unit<true>(sl + u * kUnit, p.act + g * 32, lane);
            else core.unit(sl + u * kUnit, p.act + g * 32, lane);
            if (++g == p.G) g = 0;
        }
        fence_proxy_async();
        __syncwarp();
        issue(i + p.slots);
    }
    p.y[((size_t)c * NW + warp) * 32 + lane] = core.acc[0][0] + core.acc[0][1] + core.acc[1][0] + core.acc[1][1];
    if (p.stamp) {
        __syncthreads();
        if (threadIdx.x == 0) p.stamp[2 * c + 1] = gtime();
    }
}

// A producer stand-in: 17 CTAs of 256 threads. Trigger, wait for the projection, read one of its
// partials (an L2 round trip), spin, write the next operand (the fixed pattern: every variant's
// operands are the same bits).
__global__ void __launch_bounds__(256) prod_kernel(const PP p)
{
    pdl_trigger();
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p.y + (i & 4095)));
    if (p.spin_ns && threadIdx.x == 0) {
        const unsigned long long t0 = gtime();
        while (gtime() - t0 < (unsigned long long)p.spin_ns) {
        }
    }
    __syncthreads();
    for (int e = i; e < p.n; e += gridDim.x * blockDim.x) {
        uint4 x = p.src[e];
        if (v != v) x.x ^= 1u;  // never (the partials are finite): keeps the read on the path
        p.act[e] = x;
    }
}

__device__ __forceinline__ uint32_t hash32(uint64_t x)
{
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
    return (uint32_t)x;
}

// Every operand element of every matrix distinct (seeded by the matrix): 8 bit planes' words
__global__ void fill_pattern(uint4 *a, long long n)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        a[e] = make_uint4(hash32(4 * e), hash32(4 * e + 1), hash32(4 * e + 2), hash32(4 * e + 3));
}

// Weights: every 4-byte word a hash of its offset; codes 0..2 (bits 0xaa), scales finite fp16
// (0x3c00 | 10 bits: 1.0 .. 2.0)
__global__ void fill_weights(uint32_t *w, long long words)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < words; e += (long long)gridDim.x * blockDim.x) {
        const uint32_t h = hash32((uint64_t)e ^ 0x5bd1e995ull);
        const int in_unit = (int)((e * 4) % kUnit);
        w[e] = in_unit < 1024 ? (h & 0xaaaaaaaau) : (0x3c003c00u | (h & 0x03ff03ffu));
    }
}

// A short busy wait ahead of each timed graph, so that its submission overlaps the spin
__global__ void busy(int ns)
{
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < (unsigned long long)ns) {
    }
}

// the floor: a float sum over the same bytes (torch's floor reader, as ring.cu's)
__global__ void fsum(const float4 *p, long long n, float *sink)
{
    float s = 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 1.2345f) sink[0] = s;
}

struct Cfg {
    int nw, chunk, slots, prefill, pdl, prod;  // prod: -1 none, else the spin in ns
    std::string note;
    int one = 0;
    int ko = 0;  // 1: every unit as one matrix in one launch (the stream's ceiling in this form)
    std::vector<float> ms;
    double hop_us = 0, occ = 0;  // stamps: a grid's last end -> the next grid's first release (median); occupancy
    int ok = 1;
};

int main(int argc, char **argv)
{
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    struct Sh { long long n, k; };
    const Sh in_proj{16384, 5120}, qkv{14336, 5120}, out{5120, 6144}, gate_up{34816, 5120},
        down{5120, 17408}, head{248320, 5120};
    std::vector<Sh> mats;
    for (int l = 0; l < 64; ++l) mats.push_back(l % 4 == 3 ? qkv : in_proj), mats.push_back(out),
                                 mats.push_back(gate_up), mats.push_back(down);
    mats.push_back(head);
    const int nm = (int)mats.size();
    std::vector<long long> moff{0};
    for (auto &s : mats) moff.push_back(moff.back() + s.n / 32 * (s.k / 128));
    const size_t bytes = (size_t)moff.back() * kUnit;
    printf("%s, %d SMs; %d matrices, %.3f GB\n", prop.name, sms, nm, bytes / 1e9);

    uint8_t *w;
    CK(cudaMalloc(&w, bytes + 4096));
    fill_weights<<<sms * 8, 256>>>(reinterpret_cast<uint32_t *>(w), (long long)(bytes / 4));
    // patterns: every matrix's own operand; acts: what the kernels read (the producers copy
    // patterns[j + 1] into acts[j + 1])
    uint4 *patterns, *acts;
    const size_t act_bytes = (size_t)nm * kActMax * sizeof(uint4);
    CK(cudaMalloc(&patterns, act_bytes));
    CK(cudaMalloc(&acts, act_bytes));
    fill_pattern<<<sms * 4, 256>>>(patterns, (long long)nm * kActMax);
    CK(cudaMemcpy(acts, patterns, act_bytes, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());
    float *ys;
    const size_t ystride = (size_t)sms * 16 * 32;
    CK(cudaMalloc(&ys, (size_t)nm * ystride * sizeof(float)));
    unsigned long long *mst;
    CK(cudaMalloc(&mst, (size_t)nm * sms * 2 * sizeof(unsigned long long)));
    float *fsum_sink;
    CK(cudaMalloc(&fsum_sink, 64));
    CK(cudaFuncSetAttribute(mat_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prop.sharedMemPerBlockOptin));
    CK(cudaFuncSetAttribute(mat_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prop.sharedMemPerBlockOptin));
    // the whole carve-out to shared memory, for every kernel, so that the SMs' splits agree and two
    // projections' CTAs and a producer's fit an SM (the operands then come from L2 more often)
    CK(cudaFuncSetAttribute(mat_kernel<8>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CK(cudaFuncSetAttribute(mat_kernel<16>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CK(cudaFuncSetAttribute(prod_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    {
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, mat_kernel<8>));
        printf("mat_kernel<8>: %d registers, %zu B local\n", fa.numRegs, fa.localSizeBytes);
        CK(cudaFuncGetAttributes(&fa, mat_kernel<16>));
        printf("mat_kernel<16>: %d registers, %zu B local\n", fa.numRegs, fa.localSizeBytes);
    }

    // the rows: rings of ~35, ~70, ~104 KB (two CTAs an SM) and ~209 KB (one), fill before / after
    // the wait, PDL on / off, no producers / producers spinning 0, 1, 2 us
    std::vector<Cfg> cfgs;
    const int rings[][3] = {{8, 2, 2}, {8, 4, 2}, {8, 4, 3}, {16, 2, 3}, {8, 4, 6}};
    for (auto &r : rings)
        for (int prefill : {1, 0})
            for (int prod : {-1, 0, 1000, 2000}) {
                if (!prefill && prod > 0) continue;
                cfgs.push_back(Cfg{r[0], r[1], r[2], prefill, 1, prod, ""});
            }
    cfgs.push_back(Cfg{8, 4, 3, 1, 0, -1, "no pdl"});
    cfgs.push_back(Cfg{8, 4, 3, 1, 0, 1000, "no pdl"});
    for (auto &r : rings) {
        cfgs.push_back(Cfg{r[0], r[1], r[2], 1, 0, -1, "one launch"});
        cfgs.back().one = 1;
    }
    // knockouts (timing only): what a projection's boundary pays with no producers
    for (int ko : {1, 2, 3}) {
        for (auto &r : {rings[2], rings[3]}) {
            cfgs.push_back(Cfg{r[0], r[1], r[2], 1, 1, -1, ko == 1 ? "ko 1: no wait" : ko == 2 ? "ko 2: no operand loads" : "ko 3: neither"});
            cfgs.back().ko = ko;
        }
        cfgs.push_back(Cfg{8, 4, 3, 1, 0, -1, "one launch, knockout"});
        cfgs.back().one = 1, cfgs.back().ko = ko;
    }

    auto smem_of = [&](const Cfg &c) { return (size_t)c.nw * c.slots * c.chunk * kUnit + 8 * c.nw * c.slots; };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto record = [&](const Cfg &c, bool stamps) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        if (c.one) {
            MP p{w, acts, ys, stamps ? mst : nullptr, (int)moff.back(), 40, c.chunk, c.slots, 1, c.ko};
            cudaLaunchConfig_t lc{};
            lc.gridDim = dim3(sms), lc.blockDim = dim3(c.nw * 32), lc.dynamicSmemBytes = smem_of(c), lc.stream = st;
            if (c.nw == 8) CK(cudaLaunchKernelEx(&lc, mat_kernel<8>, p));
            else CK(cudaLaunchKernelEx(&lc, mat_kernel<16>, p));
            return;
        }
        for (int j = 0; j < nm; ++j) {
            MP p{w + (size_t)moff[j] * kUnit, acts + (size_t)j * kActMax, ys + (size_t)j * ystride,
                 stamps ? mst + (size_t)j * sms * 2 : nullptr, (int)(moff[j + 1] - moff[j]),
                 (int)(mats[j].k / 128), c.chunk, c.slots, c.prefill, c.ko};
            cudaLaunchConfig_t lc{};
            lc.gridDim = dim3(sms), lc.blockDim = dim3(c.nw * 32), lc.dynamicSmemBytes = smem_of(c), lc.stream = st;
            lc.attrs = at, lc.numAttrs = (c.pdl && j > 0) ? 1 : 0;
            if (c.nw == 8) CK(cudaLaunchKernelEx(&lc, mat_kernel<8>, p));
            else CK(cudaLaunchKernelEx(&lc, mat_kernel<16>, p));
            if (c.prod >= 0 && j + 1 < nm) {
                PP q{ys + (size_t)j * ystride, patterns + (size_t)(j + 1) * kActMax, acts + (size_t)(j + 1) * kActMax,
                     (int)(mats[j + 1].k / 128 * 32), c.prod};
                cudaLaunchConfig_t pc{};
                pc.gridDim = dim3(17), pc.blockDim = dim3(256), pc.stream = st;
                pc.attrs = at, pc.numAttrs = c.pdl ? 1 : 0;
                CK(cudaLaunchKernelEx(&pc, prod_kernel, q));
            }
        }
    };
    auto graph_of = [&](const Cfg &c, bool stamps) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        record(c, stamps);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        return ge;
    };
    // reference partials per NW (the first config of each NW, no producers), on poisoned outputs
    std::vector<float> ref8, ref16, got((size_t)nm * ystride);
    auto check = [&](Cfg &c) {
        CK(cudaMemset(ys, 0xff, (size_t)nm * ystride * sizeof(float)));  // NaN poison
        // the operands the producers write are poisoned too: a read before the producer's store
        // (or of another matrix's operand) changes the partials
        CK(cudaMemcpy(acts, patterns, act_bytes, cudaMemcpyDeviceToDevice));
        if (c.prod >= 0) CK(cudaMemset(acts + kActMax, 0xa5, act_bytes - kActMax * sizeof(uint4)));
        cudaGraphExec_t ge = graph_of(c, false);
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaMemcpy(got.data(), ys, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        // only [P][NW][32] of each matrix's stride is written
        std::vector<float> used;
        for (int j = 0; j < (c.one ? 1 : nm); ++j)
            used.insert(used.end(), got.begin() + (size_t)j * ystride, got.begin() + (size_t)j * ystride + (size_t)sms * c.nw * 32);
        for (float v : used)
            if (v != v) return false;
        if (c.one || c.ko) return true;  // other partials (or wrong ones, by design): only the poison is checked
        std::vector<float> &ref = c.nw == 8 ? ref8 : ref16;
        if (ref.empty()) {
            ref = used;
            return true;
        }
        return memcmp(ref.data(), used.data(), used.size() * sizeof(float)) == 0;
    };
    int bad = 0;
    for (auto &c : cfgs) {
        c.ok = check(c);
        bad += !c.ok;
        int occ = 0;
        if (c.nw == 8) CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mat_kernel<8>, c.nw * 32, smem_of(c)));
        else CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mat_kernel<16>, c.nw * 32, smem_of(c)));
        c.occ = occ;
    }
    printf("checks: %s (%d of %zu configs differ from their NW's reference or left a NaN)\n", bad ? "FAILED" : "passed", bad, cfgs.size());

    // timing: graphs alternate within each round; a float-sum floor reader in every round
    std::vector<cudaGraphExec_t> ges;
    for (auto &c : cfgs) ges.push_back(graph_of(c, false));
    float *fl;
    const long long nf = (long long)(bytes / 16);
    fl = reinterpret_cast<float *>(w);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> floor_ms;
    const int rounds = 5;
    for (auto &ge : ges) CK(cudaGraphLaunch(ge, st));  // warm-up
    CK(cudaStreamSynchronize(st));
    for (int r = 0; r < rounds; ++r) {
        busy<<<1, 32, 0, st>>>(200000);
        CK(cudaEventRecord(e0, st));
        fsum<<<sms * 4, 512, 0, st>>>(reinterpret_cast<const float4 *>(fl), nf, fsum_sink);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        floor_ms.push_back(ms);
        for (size_t i = 0; i < cfgs.size(); ++i) {
            busy<<<1, 32, 0, st>>>(200000);
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ges[i], st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            cfgs[i].ms.push_back(ms);
        }
    }
    CK(cudaGetLastError());
    std::sort(floor_ms.begin(), floor_ms.end());
    const float floor = floor_ms[rounds / 2];

    // stamps: one more replay with them, per boundary j -> j + 1: the next grid's first release
    // after this grid's last end (median over boundaries), and with producers the whole chain
    std::vector<unsigned long long> hm((size_t)nm * sms * 2);
    for (auto &c : cfgs) {
        if (c.one) continue;
        cudaGraphExec_t ge = graph_of(c, true);
        CK(cudaGraphLaunch(ge, st));  // a warm-up, then the replay read
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaMemcpy(hm.data(), mst, hm.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<double> hops;
        for (int j = 0; j + 1 < nm; ++j) {
            unsigned long long end = 0, rel = ~0ull;
            for (int k = 0; k < sms; ++k) {
                end = std::max(end, hm[((size_t)j * sms + k) * 2 + 1]);
                rel = std::min(rel, hm[((size_t)(j + 1) * sms + k) * 2]);
            }
            hops.push_back(((double)(long long)(rel - end)) * 1e-3);
        }
        std::sort(hops.begin(), hops.end());
        c.hop_us = hops[hops.size() / 2];
    }

    printf("floor (float sum): %.3f ms = %.0f GB/s\n", floor, bytes / (floor * 1e-3) / 1e9);
    printf("%3s %5s %5s %7s %4s %7s %4s %4s %8s %7s %8s %s\n", "nw", "chunk", "slots", "ringKB", "pre", "prod_us", "pdl", "occ",
           "ms", "xfloor", "hop_us", "ok / note");
    FILE *js = argc > 1 ? fopen(argv[1], "w") : nullptr;
    if (js) fprintf(js, "{\"device\": \"%s\", \"floor_ms\": %.4f, \"gb\": %.4f, \"checks\": %s, \"rows\": [\n", prop.name, floor, bytes / 1e9, bad ? "false" : "true");
    for (size_t i = 0; i < cfgs.size(); ++i) {
        Cfg &c = cfgs[i];
        std::vector<float> s = c.ms;
        std::sort(s.begin(), s.end());
        const float med = s[rounds / 2];
        printf("%3d %5d %5d %7.1f %4d %7.1f %4d %4.0f %8.3f %7.3f %8.2f %s\n", c.nw, c.chunk, c.slots, smem_of(c) / 1024.0, c.prefill,
               c.prod < 0 ? -1.0 : c.prod / 1000.0, c.pdl, c.occ, med, med / floor, c.one ? -1.0 : c.hop_us, c.ok ? "ok" : "BAD");
        if (!c.note.empty()) printf("    (%s)\n", c.note.c_str());
        if (js) {
            fprintf(js, "  {\"nw\": %d, \"chunk\": %d, \"slots\": %d, \"ring_kb\": %.1f, \"prefill\": %d, \"prod_ns\": %d, \"pdl\": %d, \"one\": %d, \"ko\": %d, \"occ\": %.0f, \"hop_us\": %.3f, \"ok\": %d, \"ms\": [",
                    c.nw, c.chunk, c.slots, smem_of(c) / 1024.0, c.prefill, c.prod, c.pdl, c.one, c.ko, c.occ, c.hop_us, c.ok);
            for (int r = 0; r < rounds; ++r) fprintf(js, "%.4f%s", c.ms[r], r + 1 < rounds ? ", " : "");
            fprintf(js, "]}%s\n", i + 1 < cfgs.size() ? "," : "");
        }
    }
    if (js) fprintf(js, "]}\n"), fclose(js);
    return bad ? 2 : 0;
}

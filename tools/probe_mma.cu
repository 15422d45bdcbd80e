// probe_mma.cu - issue rate and dependent latency of the warp-level MMAs a decode kernel could
// build on, on this GPU: int8 IMMA m16n8k32 (the masked-plane core) against the binary
// AND+POPC BMMA m16n8k128 and m16n8k256 (the bit-sliced core, bench/NOTES.md v11).
//
// Standalone (no libpq2; includes tools/probe_common.cuh): nvcc -O3 -arch=sm_90a -o probe_mma tools/probe_mma.cu
//   ./probe_mma [--json FILE]
//
// throughput: every SM full of warps (W warps per block, B blocks per SM), each warp running
//             CH independent accumulator chains for ITER iterations; the result is MMAs per SM
//             per clock (SM clock read from the device attribute; the wall time of the launch).
// latency:    one warp, one dependent chain, clock64() around ITER MMAs: cycles per MMA.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_common.cuh"

enum Op { IMMA_K32 = 0, BMMA_K128 = 1, BMMA_K256 = 2 };
static const char *op_name[] = {"imma.m16n8k32.s8.u8", "bmma.m16n8k128.and.popc",
                                "bmma.m16n8k256.and.popc"};

template <int OP>
__device__ __forceinline__ void mma(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    if constexpr (OP == IMMA_K32) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else if constexpr (OP == BMMA_K128) {
        asm volatile("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, "
                     "{%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

template <int OP, int CH>
__global__ void mma_loop(const uint32_t *in, int *out, int iters, long long *cycles)
{
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = in[(threadIdx.x + i) & 63];
    for (int i = 0; i < 2; ++i) b[i] = in[(threadIdx.x + 7 + i) & 63];
    int c[CH][4] = {};
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int ch = 0; ch < CH; ++ch) mma<OP>(c[ch], a, b);
    }
    long long t1 = clock64();
    int s = 0;
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (cycles && threadIdx.x == 0 && blockIdx.x == 0) *cycles = t1 - t0;
}

struct Row {
    std::string op, what;
    int warps_per_sm, chains;
    double value;
};

template <int OP, int CH>
static double throughput(const uint32_t *in, int *out, int sms, int warps, int blocks_per_sm,
                         double clock_hz)
{
    const int iters = 4096;
    dim3 grid(sms * blocks_per_sm), block(32 * warps);
    mma_loop<OP, CH><<<grid, block>>>(in, out, iters, nullptr);  // warm-up
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
        CK(cudaEventRecord(e0));
        mma_loop<OP, CH><<<grid, block>>>(in, out, iters, nullptr);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    double mmas_per_sm = double(iters) * CH * warps * blocks_per_sm;
    return mmas_per_sm / (best * 1e-3 * clock_hz);
}

template <int OP>
static double latency(const uint32_t *in, int *out, long long *cyc)
{
    const int iters = 4096;
    mma_loop<OP, 1><<<1, 32>>>(in, out, iters, cyc);
    mma_loop<OP, 1><<<1, 32>>>(in, out, iters, cyc);
    CK(cudaDeviceSynchronize());
    long long c;
    CK(cudaMemcpy(&c, cyc, sizeof c, cudaMemcpyDeviceToHost));
    return double(c) / iters;
}

template <int OP>
static void run_op(std::vector<Row> &rows, const uint32_t *in, int *out, long long *cyc, int sms,
                   double clk)
{
    rows.push_back({op_name[OP], "latency_cycles", 1, 1, latency<OP>(in, out, cyc)});
    const int wsm[] = {4, 8, 16, 32};
    for (int w : wsm) {
        int warps = w < 16 ? w : 16, bps = w / warps;
        rows.push_back({op_name[OP], "per_sm_per_clk", w, 1,
                        throughput<OP, 1>(in, out, sms, warps, bps, clk)});
        rows.push_back({op_name[OP], "per_sm_per_clk", w, 4,
                        throughput<OP, 4>(in, out, sms, warps, bps, clk)});
    }
}

int main(int argc, char **argv)
{
    const char *json = nullptr;
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int clk_khz = 0;
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
    double clk = clk_khz * 1e3;
    uint32_t *in;
    int *out;
    long long *cyc;
    CK(cudaMalloc(&in, 64 * 4));
    std::vector<uint32_t> h(64);
    for (int i = 0; i < 64; ++i) h[i] = 0x9e3779b9u * (i + 1);
    CK(cudaMemcpy(in, h.data(), 64 * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out, size_t(prop.multiProcessorCount) * 32 * 512 * sizeof(int)));
    CK(cudaMalloc(&cyc, sizeof(long long)));
    std::vector<Row> rows;
    int sms = prop.multiProcessorCount;
    run_op<IMMA_K32>(rows, in, out, cyc, sms, clk);
    run_op<BMMA_K128>(rows, in, out, cyc, sms, clk);
    run_op<BMMA_K256>(rows, in, out, cyc, sms, clk);
    printf("%s, %d SMs, clock %.0f MHz (attribute)\n", prop.name, sms, clk / 1e6);
    printf("%-26s %-16s %6s %6s %10s\n", "op", "what", "w/SM", "chains", "value");
    for (auto &r : rows)
        printf("%-26s %-16s %6d %6d %10.3f\n", r.op.c_str(), r.what.c_str(), r.warps_per_sm,
               r.chains, r.value);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"gpu\": \"%s\", \"sms\": %d, \"clock_mhz\": %.0f, \"rows\": [\n", prop.name,
                sms, clk / 1e6);
        for (size_t i = 0; i < rows.size(); ++i)
            fprintf(f, "  {\"op\": \"%s\", \"what\": \"%s\", \"warps_per_sm\": %d, \"chains\": %d, "
                       "\"value\": %.4f}%s\n",
                    rows[i].op.c_str(), rows[i].what.c_str(), rows[i].warps_per_sm,
                    rows[i].chains, rows[i].value, i + 1 < rows.size() ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}

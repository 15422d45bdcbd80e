// probe_stream.cu - how fast can ONE graph node read N bytes on this GPU? The ceiling our decode
// kernels are measured against, per call size, without any decode arithmetic.
//
// Standalone (no libpq2; includes tools/probe_common.cuh): nvcc -O3 -arch=sm_90a -o probe_stream tools/probe_stream.cu
//   ./probe_stream [--tiles | --compute] [--json FILE]
//
// For each decode shape's byte count (TARGETS.md) it times pure-read kernels as CUDA-graph
// replays over rotating copies (>= 4 copies and >= 256 MB, like tools/bench_decode.py), each
// launch a programmatic dependent of the previous one (Hopper PDL, as the decode kernels), and
// prints the best per-call time of each access pattern:
//   chunked     one block per chunk of one row block's bytes (tiles rt 2: K/128 * 1088 B), its
//               warps splitting the chunk (the row-block decode family's pattern);
//   persistent  a grid of B blocks per SM, every warp reading one contiguous slice;
//   gridstride  a grid of B blocks per SM, 16-byte loads strided by the whole grid;
// the chunked pattern also as DEPENDENT calls, each waiting for the previous grid (as a decode
// call waits for its activations) either before any load or after its first loads;
// and then the 257-call decode pass (layer order of bench_decode.py, 257 distinct buffers) with
// each pattern, with one and with two graph nodes per call (an empty kernel standing in for the
// activation quantiser). Loads: ld.global.nc.L1::no_allocate.v4, `unroll` in flight per lane.
//
// --tiles (only this section): the row-block decode kernels' exact pattern on a tiles rt-2 layout
// (one block per row block, warps splitting its units, U units of 16-byte code loads plus the
// scale words per batch), with the scales apart (the layout), inline, or absent, per shape as
// independent and as dependent calls, and in the dependent 257-call pass (bench/NOTES.md v9).
// --compute (only this section): that dependent read with C integer instructions of work per
// 1 KB unit between a warp's loads, U 1/2/4 or next-loads-first, uncapped and at most 32 warps
// per SM (bench/NOTES.md v9-compute).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_common.cuh"

#define COMMA ,

__device__ __forceinline__ uint4 ld16(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Reads vectors [v0, v1) (16 bytes each) of base, lane-strided, U loads in flight.
template <int U>
__device__ __forceinline__ uint32_t read_range(const uint8_t *base, size_t v0, size_t v1, int lane)
{
    uint32_t acc = 0;
    size_t i = v0 + lane;
    for (; i + 32 * (U - 1) < v1; i += 32 * U) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = ld16(base + (i + 32 * u) * 16);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
    }
    for (; i < v1; i += 32) {
        const uint4 w = ld16(base + i * 16);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    return acc;
}

// The result is stored only when it equals a value it never takes in practice, after the PDL
// wait (as the decode kernels store): no dead-code elimination, no write traffic.
__device__ __forceinline__ void sink(uint32_t acc, uint32_t *out)
{
    pdl_wait();
    if (acc == 0x9e3779b9u) out[threadIdx.x] = acc;
}

// DEP: the call depends on the previous one (as a decode call on its activations): the grid
// waits for the previous grid before its loads (1) or after issuing its first U loads per lane
// (2: what the decode kernels do with their first weight batch), or (3) after asking L2 to
// prefetch the warp's whole range (cp.async.bulk.prefetch.L2) and issuing its first U loads;
// 0: only its final store waits.
template <int U, int DEP>
__global__ void chunked(const uint8_t *base, size_t chunk_vecs, size_t total_vecs, uint32_t *out)
{
    pdl_launch();
    if (DEP == 1) pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const size_t c0 = blockIdx.x * chunk_vecs, c1 = c0 + chunk_vecs < total_vecs ? c0 + chunk_vecs : total_vecs;
    const size_t n = c1 - c0;
    const size_t v0 = c0 + n * warp / warps, v1 = c0 + n * (warp + 1) / warps;
    if (DEP == 3 && lane == 0) {
        for (size_t b = v0 * 16; b < v1 * 16; b += 16384) {
            const size_t bytes = v1 * 16 - b < 16384 ? v1 * 16 - b : 16384;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + b), "r"((uint32_t)bytes) : "memory");
        }
    }
    if (DEP >= 2) {
        uint4 w[U];
        size_t i = v0 + lane;
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = i + 32 * u < v1 ? ld16(base + (i + 32 * u) * 16) : make_uint4(0, 0, 0, 0);
        pdl_wait();
        uint32_t acc = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
        const size_t next = v0 + 32 * U < v1 ? v0 + 32 * U : v1;
        sink(acc ^ read_range<U>(base, next, v1, lane), out);
        return;
    }
    sink(read_range<U>(base, v0, v1, lane), out);
}

template <int U>
__global__ void persistent(const uint8_t *base, size_t total_vecs, uint32_t *out)
{
    pdl_launch();
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
    const size_t w = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    sink(read_range<U>(base, total_vecs * w / warps, total_vecs * (w + 1) / warps, lane), out);
}

template <int U>
__global__ void gridstride(const uint8_t *base, size_t total_vecs, uint32_t *out)
{
    pdl_launch();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + stride * (U - 1) < total_vecs; i += stride * U) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = ld16(base + (i + stride * u) * 16);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
    }
    for (; i < total_vecs; i += stride) {
        const uint4 w = ld16(base + i * 16);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    sink(acc, out);
}


__device__ __forceinline__ uint32_t ld4(const uint8_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// --tiles and --compute: the row-block decode kernels' exact access pattern on a tiles rt-2
// layout (one block per row block, warp w of W taking units [w*G/W, (w+1)*G/W), U units per
// register batch, load then use), with the fp16 scales where the layout puts them: SC 0 codes
// only (1024 B per unit), 1 a separate scale region after all codes (the tiles layout of FORMATS
// v1: 64 B per unit there), 2 interleaved (each unit's 64 scale bytes right after its 1024 code
// bytes). Each lane loads its 16 code bytes of both sub-tiles and, as the kernels do, the scale
// word of row gid of each. dep: wait for the previous grid after the first batch (what the
// decode kernels do), else only before the final store. C: integer instructions of work per
// unit between a warp's loads (four independent IMAD chains over the loaded words: the decode
// loop does ~116 instructions per unit, ~74 of them on the integer pipe). PIPE 1: the next
// unit's loads are issued before this unit's work (two register sets, U = 1).
template <int U, int SC, int C, int PIPE>
__global__ void tiles_read(const uint8_t *base, int groups, size_t units, int dep, uint32_t *out)
{
    pdl_launch();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5, gid = lane >> 2;
    const int g0 = warp * groups / warps, g1 = (warp + 1) * groups / warps;
    const size_t unit0 = (size_t)blockIdx.x * groups;
    constexpr int kUnit = SC == 2 ? 1088 : 1024, kScaleStride = SC == 2 ? 1088 : 64;
    const uint8_t *codes = base + unit0 * kUnit + lane * 16;
    const uint8_t *scales = SC == 2 ? base + unit0 * 1088 + 1024 + gid * 4 : base + units * 1024 + unit0 * 64 + gid * 4;
    uint32_t a0 = lane, a1 = lane + 1, a2 = lane + 2, a3 = lane + 3;
    constexpr int SLOTS = PIPE ? 2 : U;
    uint4 w[SLOTS][2];
    uint32_t sc[SLOTS][2];
    auto load = [&](int slot, int g) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            w[slot][r] = ld16(codes + (size_t)g * kUnit + r * 512);
            sc[slot][r] = SC ? ld4(scales + (size_t)g * kScaleStride + r * 32) : 0u;
        }
    };
    auto work = [&](int slot) {  // every loaded word reaches the result
#pragma unroll
        for (int c = 0; c < C / 4; ++c) {
            const uint4 v = w[slot][c & 1];
            a0 = a0 * 0x9E3779B1u + v.x;
            a1 = a1 * 0x85EBCA6Bu + v.y;
            a2 = a2 * 0xC2B2AE35u + v.z;
            a3 = a3 * 0x27D4EB2Fu + (v.w ^ sc[slot][c & 1]);
        }
        a0 ^= w[slot][0].x ^ w[slot][1].y ^ sc[slot][0];
        a1 ^= w[slot][0].y ^ w[slot][1].x ^ sc[slot][1];
        a2 ^= w[slot][0].z ^ w[slot][1].w;
        a3 ^= w[slot][0].w ^ w[slot][1].z;
    };
    bool waited = false;
    auto wait_once = [&] {
        if (!waited) pdl_wait(), waited = true;
    };
    if (PIPE) {
        if (g0 < g1) load(0, g0);
        if (g0 + 1 < g1) load(1, g0 + 1);
        if (dep) wait_once();
        for (int g = g0; g < g1; ++g) {
            // slot (g - g0) & 1 holds unit g; refill it with unit g + 2 after use
            if (((g - g0) & 1) == 0) {
                work(0);
                if (g + 2 < g1) load(0, g + 2);
            } else {
                work(1);
                if (g + 2 < g1) load(1, g + 2);
            }
        }
    } else {
        for (int g = g0; g < g1; g += U) {
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (g + u < g1) load(u, g + u);
            if (dep) wait_once();
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (g + u < g1) work(u);
        }
    }
    wait_once();
    const uint32_t acc = a0 ^ a1 ^ a2 ^ a3;
    if (acc == 0x9e3779b9u) out[threadIdx.x] = acc;
}

__global__ void empty_node(uint32_t *out)
{
    pdl_launch();
    pdl_wait();
    if (out == nullptr) out[0] = 0;
}

// ---- host -------------------------------------------------------------------------------------

struct shape {
    const char *name;
    long n, k, calls;
    size_t bytes() const { return (size_t)n * (k / 128) * 34; }
    size_t chunk() const { return (size_t)(k / 128) * 1088; }  // one tiles rt-2 row block
};
const shape kShapes[] = {{"gate_up", 34816, 5120, 64}, {"down", 5120, 17408, 64}, {"in_proj", 16384, 5120, 48},
                         {"qkv", 14336, 5120, 16},     {"out", 5120, 6144, 64},   {"lm_head", 248320, 5120, 1}};

enum kind { CHUNKED, PERSISTENT, GRIDSTRIDE, TILES };
const char *kKindName[] = {"chunked", "persistent", "gridstride", "tiles"};

struct variant {
    kind kd;
    int warps, unroll, per_sm;  // per_sm: blocks per SM (persistent, gridstride)
    int dep = 0;                // chunked: 0 independent calls, 1 wait first, 2 first loads then wait,
                                // 3 L2 prefetch of the range + first loads, then wait; tiles: 0 or 2
    int sc = 0;                 // tiles: scales 0 none, 1 separate region, 2 interleaved
    int compute = 0, pipe = 0;  // tiles: tiles_read's C and PIPE
    int cap = 0;                // tiles: at most this many warps per SM (shared memory padding), 0 = none
};

int g_sms = 0;
uint32_t *g_out = nullptr;

// A launch with programmatic dependent launch on, as the decode kernels are launched.
struct pdl_config {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    pdl_config(dim3 grid, dim3 block, cudaStream_t s)
    {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        cfg.stream = s;
        cfg.gridDim = grid;
        cfg.blockDim = block;
    }
    pdl_config(const pdl_config &) = delete;
    pdl_config &operator=(const pdl_config &) = delete;
};

// KERNEL<u, EXTRA...>(args) for the variant's unroll u in {1, 2, 4, 8}.
#define PROBE_BY_UNROLL(KERNEL, EXTRA, ...)                                                \
    switch (v.unroll) {                                                                     \
    case 1: CK(cudaLaunchKernelEx(&l.cfg, KERNEL<1 EXTRA>, __VA_ARGS__)); break;            \
    case 2: CK(cudaLaunchKernelEx(&l.cfg, KERNEL<2 EXTRA>, __VA_ARGS__)); break;            \
    case 4: CK(cudaLaunchKernelEx(&l.cfg, KERNEL<4 EXTRA>, __VA_ARGS__)); break;            \
    default: CK(cudaLaunchKernelEx(&l.cfg, KERNEL<8 EXTRA>, __VA_ARGS__)); break;           \
    }

// One call: (buffer, bytes, chunk bytes); tiles: groups per row block.
struct call {
    const uint8_t *base;
    size_t bytes, chunk;
    int groups = 0;
};

std::string vname(const variant &v);

void launch(const variant &v, const call &c, cudaStream_t s)
{
    const uint8_t *base = c.base;
    const size_t bytes = c.bytes, chunk = c.chunk;
    const size_t vecs = bytes / 16;
    if (v.kd == TILES) {
        const size_t units = bytes / (v.sc ? 1088 : 1024);
        pdl_config l{dim3((unsigned)(units / c.groups)), dim3(v.warps * 32), s};
        if (v.cap) l.cfg.dynamicSmemBytes = (size_t)(200 * 1024) / (v.cap / v.warps);  // cap/warps blocks per SM
        bool launched = false;
        // The instances the --tiles and --compute sections use.
#define PROBE_TILES(UU, SS, CC, PP)                                                                          \
    if (!launched && v.unroll == UU && v.sc == SS && v.compute == CC && v.pipe == PP) {                       \
        if (v.cap)                                                                                            \
            CK(cudaFuncSetAttribute(tiles_read<UU COMMA SS COMMA CC COMMA PP>,                                \
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));                \
        CK(cudaLaunchKernelEx(&l.cfg, tiles_read<UU COMMA SS COMMA CC COMMA PP>, base, c.groups, units, v.dep, g_out)); \
        launched = true;                                                                                      \
    }
#define PROBE_TILES_SC(UU) PROBE_TILES(UU, 0, 0, 0) PROBE_TILES(UU, 1, 0, 0) PROBE_TILES(UU, 2, 0, 0)
#define PROBE_TILES_C(CC) \
    PROBE_TILES(1, 1, CC, 1) PROBE_TILES(2, 1, CC, 0) PROBE_TILES(4, 1, CC, 0)
        PROBE_TILES_SC(1) PROBE_TILES_SC(2) PROBE_TILES_SC(4) PROBE_TILES_SC(8)
        PROBE_TILES(1, 1, 64, 0) PROBE_TILES(1, 1, 128, 0) PROBE_TILES(1, 1, 192, 0)
        PROBE_TILES_C(0) PROBE_TILES_C(64) PROBE_TILES_C(128) PROBE_TILES_C(192)
#undef PROBE_TILES_C
#undef PROBE_TILES_SC
#undef PROBE_TILES
        if (!launched) {
            fprintf(stderr, "no tiles_read instance for %s\n", vname(v).c_str());
            exit(1);
        }
        return;
    }
    if (v.kd == CHUNKED) {
        pdl_config l{dim3((unsigned)((bytes + chunk - 1) / chunk)), dim3(v.warps * 32), s};
        const size_t cv = chunk / 16;
        if (v.dep == 0) PROBE_BY_UNROLL(chunked, COMMA 0, base, cv, vecs, g_out)
        if (v.dep == 1) PROBE_BY_UNROLL(chunked, COMMA 1, base, cv, vecs, g_out)
        if (v.dep == 2) PROBE_BY_UNROLL(chunked, COMMA 2, base, cv, vecs, g_out)
        if (v.dep == 3) PROBE_BY_UNROLL(chunked, COMMA 3, base, cv, vecs, g_out)
        return;
    }
    pdl_config l{dim3((unsigned)(g_sms * v.per_sm)), dim3(v.warps * 32), s};
    if (v.kd == PERSISTENT)
        PROBE_BY_UNROLL(persistent, , base, vecs, g_out)
    else
        PROBE_BY_UNROLL(gridstride, , base, vecs, g_out)
}

void launch_empty(cudaStream_t s)
{
    pdl_config l{dim3(5), dim3(256), s};
    CK(cudaLaunchKernelEx(&l.cfg, empty_node, g_out));
}

// Median microseconds per call of `calls` captured in one graph (optionally with an empty node
// before each), over `replays` replays.
double graph_us(const std::vector<call> &calls, const variant &v, bool two_nodes, int replays)
{
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (const call &c : calls) {
        if (two_nodes) launch_empty(s);
        launch(v, c, s);
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int r = 0; r < replays; ++r) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0 / calls.size());
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    return t[t.size() / 2];
}

std::string vname(const variant &v)
{
    char b[96];
    if (v.kd == CHUNKED)
        snprintf(b, sizeof b, "chunked w%d u%d%s", v.warps, v.unroll,
                 v.dep == 1 ? " wait-first" : v.dep == 2 ? " load-wait" : v.dep == 3 ? " prefetch-wait" : "");
    else if (v.kd == TILES)
        snprintf(b, sizeof b, "tiles w%d u%d %s%s", v.warps, v.unroll,
                 v.sc == 0 ? "codes-only" : v.sc == 1 ? "scales-apart" : "scales-inline", v.dep ? " load-wait" : "");
    else
        snprintf(b, sizeof b, "%s w%d u%d b%d", kKindName[v.kd], v.warps, v.unroll, v.per_sm);
    return b;
}

// --tiles: the decode kernels' access pattern with the scales apart, inline or absent, per shape
// (independent and dependent calls) and in the dependent 257-call pass.
void tiles_section(uint8_t *base, const std::vector<size_t> &pass_bytes34, double best_bw, FILE *jf)
{
    const char *sc_name[] = {"codes-only", "scales-apart", "scales-inline"};
    if (jf) fprintf(jf, "{\"read_gbs\": %.1f, \"tiles\": [\n", best_bw);
    bool first = true;
    printf("\ntiles access (rt 2): best per-call time; %% of read bandwidth counts the call's bytes (34 B per 128 weights; codes-only: 32)\n");
    printf("%-8s | %-40s %8s %6s | %-40s %8s %6s\n", "shape", "independent", "us", "%bw", "dependent (load-wait)", "us", "%bw");
    for (const shape &sh : kShapes) {
        const int groups = (int)(sh.k / 128);
        const size_t units = (size_t)(sh.n / 32) * groups;
        for (int sc = 0; sc < 3; ++sc) {
            const size_t bytes = units * (sc ? 1088 : 1024);
            const size_t stride = (bytes + 4095) & ~(size_t)4095;
            const size_t copies = std::max<size_t>(4, ((size_t)256 << 20) / bytes + 1);
            std::vector<call> calls;
            for (size_t c = 0; c < copies; ++c) calls.push_back({base + c * stride, bytes, 0, groups});
            double best[2] = {1e30, 1e30};
            std::string bestv[2];
            for (int dep : {0, 2})
                for (int w : {4, 8, 16})
                    for (int u : {1, 2, 4}) {
                        variant v{TILES, w, u, 0, dep, sc};
                        const double us = graph_us(calls, v, false, 20);
                        if (us < best[dep ? 1 : 0]) best[dep ? 1 : 0] = us, bestv[dep ? 1 : 0] = vname(v);
                        if (jf)
                            fprintf(jf, "%s{\"shape\": \"%s\", \"bytes\": %zu, \"variant\": \"%s\", \"us\": %.3f}",
                                    first ? "" : ",\n", sh.name, bytes, vname(v).c_str(), us), first = false;
                    }
            auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / best_bw; };
            printf("%-8s | %-40s %8.2f %5.1f%% | %-40s %8.2f %5.1f%%\n", sh.name, bestv[0].c_str(), best[0], pct(best[0]),
                   bestv[1].c_str(), best[1], pct(best[1]));
        }
    }
    if (jf) fprintf(jf, "\n], \"pass\": [\n");
    // The dependent pass, layer order, 257 distinct buffers.
    first = true;
    for (int sc = 0; sc < 3; ++sc) {
        std::vector<call> pass;
        size_t off = 0, total = 0;
        for (size_t i = 0; i < pass_bytes34.size(); ++i) {
            const size_t units = pass_bytes34[i] / 1088;
            const shape *sh = nullptr;
            for (const shape &s : kShapes)
                if (s.bytes() == pass_bytes34[i]) sh = &s;
            const size_t bytes = units * (sc ? 1088 : 1024);
            pass.push_back({base + off, bytes, 0, (int)(sh->k / 128)});
            off += (bytes + 4095) & ~(size_t)4095;
            total += bytes;
        }
        const double floor_ms = total / (best_bw * 1e9) * 1e3;
        for (const variant &v : {variant{TILES, 8, 1, 0, 2, sc}, variant{TILES, 16, 1, 0, 2, sc}, variant{TILES, 8, 2, 0, 2, sc},
                                 variant{TILES, 4, 4, 0, 2, sc}}) {
            const double ms = graph_us(pass, v, true, 10) * pass.size() / 1e3;
            printf("  pass %-40s 2 nodes/call  %.3f ms = %.2fx floor (%s)\n", vname(v).c_str(), ms, ms / floor_ms, sc_name[sc]);
            if (jf)
                fprintf(jf, "%s{\"variant\": \"%s\", \"ms\": %.4f, \"floor_ms\": %.4f}", first ? "" : ",\n",
                        vname(v).c_str(), ms, floor_ms), first = false;
        }
    }
    if (jf) fprintf(jf, "\n]}\n");
}

// --compute: how the work between a warp's loads slows the dependent read (scales apart).
void compute_section(uint8_t *base, double best_bw, FILE *jf)
{
    if (jf) fprintf(jf, "{\"read_gbs\": %.1f, \"compute\": [\n", best_bw);
    bool first = true;
    // modes: U 1 load-then-compute, U 1 next loads first, U 2, U 4 (load then compute)
    const int kPipe[4] = {0, 1, 0, 0}, kU[4] = {1, 1, 2, 4};
    for (int capped = 0; capped < 2; ++capped) {
        printf("\ntiles access + C instructions of work per unit between a warp's loads (dependent calls, %s);"
               " best of 4, 8, 16 warps per block; %% of read bandwidth\n", capped ? "at most 32 warps per SM" : "no occupancy cap");
        printf("%-8s %4s | %-20s | %-20s | %-20s | %-20s\n", "shape", "C", "U1 load, compute", "U1 next loads first",
               "U2 load, compute", "U4 load, compute");
        for (const shape &sh : kShapes) {
            if (!strcmp(sh.name, "lm_head")) continue;
            const int groups = (int)(sh.k / 128);
            const size_t units = (size_t)(sh.n / 32) * groups, bytes = units * 1088;
            const size_t stride = (bytes + 4095) & ~(size_t)4095;
            const size_t copies = std::max<size_t>(4, ((size_t)256 << 20) / bytes + 1);
            std::vector<call> calls;
            for (size_t c = 0; c < copies; ++c) calls.push_back({base + c * stride, bytes, 0, groups});
            auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / best_bw; };
            for (int cc : {0, 64, 128, 192}) {
                printf("%-8s %4d |", sh.name, cc);
                for (int mode = 0; mode < 4; ++mode) {
                    double best = 1e30;
                    int bw_ = 0;
                    for (int w : {4, 8, 16}) {
                        variant v{TILES, w, kU[mode], 0, 2, 1};
                        v.compute = cc, v.pipe = kPipe[mode], v.cap = capped ? 32 : 0;
                        const double us = graph_us(calls, v, false, 20);
                        if (us < best) best = us, bw_ = w;
                        if (jf)
                            fprintf(jf, "%s{\"shape\": \"%s\", \"compute\": %d, \"pipe\": %d, \"unroll\": %d, \"cap\": %d, "
                                        "\"warps\": %d, \"us\": %.3f}",
                                    first ? "" : ",\n", sh.name, cc, v.pipe, v.unroll, v.cap, w, us), first = false;
                    }
                    printf(" %6.2f us %5.1f%% w%-2d |", best, pct(best), bw_);
                }
                printf("\n");
            }
        }
    }
    if (jf) fprintf(jf, "\n]}\n");
}

int main(int argc, char **argv)
{
    const char *json = nullptr;
    bool tiles_only = false, compute_only = false;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        if (!strcmp(argv[i], "--tiles")) tiles_only = true;
        if (!strcmp(argv[i], "--compute")) compute_only = true;
    }
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaMalloc(&g_out, 4096));

    // One arena for the pass (257 distinct matrices, 6.8 GB); the per-shape rotations reuse it.
    std::vector<size_t> pass_bytes;
    std::vector<size_t> pass_chunk;
    for (int layer = 0; layer < 64; ++layer) {
        const shape &first = layer % 4 == 3 ? kShapes[3] : kShapes[2];
        for (const shape *s : {&first, &kShapes[4], &kShapes[0], &kShapes[1]}) {
            pass_bytes.push_back(s->bytes());
            pass_chunk.push_back(s->chunk());
        }
    }
    pass_bytes.push_back(kShapes[5].bytes());
    pass_chunk.push_back(kShapes[5].chunk());
    size_t arena = 0;
    for (size_t b : pass_bytes) arena += (b + 4095) & ~(size_t)4095;
    uint8_t *base = nullptr;
    CK(cudaMalloc(&base, arena));
    CK(cudaMemset(base, 0x5a, arena));
    CK(cudaDeviceSynchronize());

    std::vector<variant> vars;
    for (int w : {4, 8, 16})
        for (int u : {2, 4, 8})
            for (int d : {0, 1, 2, 3}) vars.push_back({CHUNKED, w, u, 0, d});
    for (int w : {8, 16})
        for (int u : {2, 4, 8})
            for (int b : {1, 2, 4}) {
                if (w * b > 64) continue;
                vars.push_back({PERSISTENT, w, u, b});
                vars.push_back({GRIDSTRIDE, w, u, b});
            }

    // Read bandwidth: 2 GiB, the best variant.
    double best_bw = 0;
    std::string bw_var;
    {
        const size_t big = (size_t)2 << 30;
        for (const variant &v : vars) {
            if (v.kd == CHUNKED) continue;
            const double us = graph_us({{base, big, 43520}}, v, false, 10);
            const double gbs = big / (us * 1e-6) / 1e9;
            if (gbs > best_bw) best_bw = gbs, bw_var = vname(v);
        }
    }
    printf("device %s, %d SMs; read bandwidth %.0f GB/s (2 GiB, %s)\n", prop.name, g_sms, best_bw, bw_var.c_str());

    FILE *jf = json ? fopen(json, "w") : nullptr;
    if (compute_only) {
        compute_section(base, best_bw, jf);
        if (jf) fclose(jf);
        return 0;
    }
    if (tiles_only) {
        tiles_section(base, pass_bytes, best_bw, jf);
        if (jf) fclose(jf);
        return 0;
    }
    if (jf) fprintf(jf, "{\"device\": \"%s\", \"sms\": %d, \"read_gbs\": %.1f, \"shapes\": [\n", prop.name, g_sms, best_bw);
    printf("\n%-8s %9s | %-26s %8s %6s | %-26s %8s %6s | %-30s %8s %6s | %-30s %8s %6s\n", "shape", "MB", "best chunked", "us", "%bw",
           "best persistent/gridstride", "us", "%bw", "best chunked, dependent calls", "us", "%bw",
           "dependent, L2 prefetch first", "us", "%bw");
    bool first_row = true;
    for (const shape &sh : kShapes) {
        const size_t bytes = sh.bytes();
        const size_t stride = (bytes + 4095) & ~(size_t)4095;
        const size_t copies = std::max<size_t>(4, ((size_t)256 << 20) / bytes + 1);
        std::vector<call> calls;
        for (size_t c = 0; c < copies; ++c) calls.push_back({base + c * stride, bytes, sh.chunk()});
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        std::string bestv[4];
        for (const variant &v : vars) {
            const double us = graph_us(calls, v, false, 20);
            const int slot = v.kd != CHUNKED ? 1 : v.dep == 3 ? 3 : v.dep ? 2 : 0;
            if (us < best[slot]) best[slot] = us, bestv[slot] = vname(v);
            if (jf)
                fprintf(jf, "%s{\"shape\": \"%s\", \"bytes\": %zu, \"variant\": \"%s\", \"us\": %.3f}", first_row ? "" : ",\n",
                        sh.name, bytes, vname(v).c_str(), us), first_row = false;
        }
        auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / best_bw; };
        printf("%-8s %9.2f | %-26s %8.2f %5.1f%% | %-26s %8.2f %5.1f%% | %-30s %8.2f %5.1f%% | %-30s %8.2f %5.1f%%\n",
               sh.name, bytes / 1e6, bestv[0].c_str(), best[0], pct(best[0]), bestv[1].c_str(), best[1], pct(best[1]),
               bestv[2].c_str(), best[2], pct(best[2]), bestv[3].c_str(), best[3], pct(best[3]));
    }
    if (jf) fprintf(jf, "\n], \"pass\": [\n");

    // The pass: 257 distinct buffers in layer order.
    std::vector<call> pass;
    size_t off = 0, total = 0;
    for (size_t i = 0; i < pass_bytes.size(); ++i) {
        pass.push_back({base + off, pass_bytes[i], pass_chunk[i]});
        off += (pass_bytes[i] + 4095) & ~(size_t)4095;
        total += pass_bytes[i];
    }
    const double floor_ms = total / (best_bw * 1e9) * 1e3;
    printf("\npass: 257 calls, %.3f GB, floor %.3f ms\n", total / 1e9, floor_ms);
    bool first_pass = true;
    for (const variant &v : {variant{CHUNKED, 8, 4, 0, 1}, variant{CHUNKED, 8, 4, 0, 2}, variant{CHUNKED, 8, 4, 0, 3},
                             variant{CHUNKED, 16, 4, 0, 3}, variant{CHUNKED, 4, 8, 0, 1}, variant{CHUNKED, 4, 8, 0, 2},
                             variant{CHUNKED, 4, 8, 0, 3}, variant{CHUNKED, 16, 2, 0}, variant{CHUNKED, 8, 4, 0}, variant{CHUNKED, 4, 8, 0},
                             variant{PERSISTENT, 16, 4, 2}, variant{PERSISTENT, 8, 8, 4}, variant{GRIDSTRIDE, 16, 4, 2}}) {
        for (bool two : {false, true}) {
            const double us = graph_us(pass, v, two, 10);
            const double ms = us * pass.size() / 1e3;
            printf("  %-26s %s  %.3f ms = %.2fx floor\n", vname(v).c_str(), two ? "2 nodes/call" : "1 node/call ",
                   ms, ms / floor_ms);
            if (jf)
                fprintf(jf, "%s{\"variant\": \"%s\", \"nodes_per_call\": %d, \"ms\": %.4f, \"floor_ms\": %.4f}",
                        first_pass ? "" : ",\n", vname(v).c_str(), two ? 2 : 1, ms, floor_ms), first_pass = false;
        }
    }
    // Per-node floor: 257 empty nodes and 257 tiny reads (64 KB).
    {
        std::vector<call> tiny;
        for (int i = 0; i < 257; ++i) tiny.push_back({base + (size_t)i * 65536, 65536, 4096});
        const double us1 = graph_us(tiny, variant{CHUNKED, 8, 2, 0}, false, 10);
        const double us2 = graph_us(tiny, variant{CHUNKED, 8, 2, 0}, true, 10);
        const double us3 = graph_us(tiny, variant{CHUNKED, 8, 2, 0, 1}, false, 10);
        const double us4 = graph_us(tiny, variant{CHUNKED, 8, 2, 0, 1}, true, 10);
        printf("\nper call, 64 KB read: %.2f us (1 node), %.2f us (2 nodes); dependent (wait first): %.2f us "
               "(1 node), %.2f us (2 nodes)\n", us1, us2, us3, us4);
        if (jf) fprintf(jf, "\n], \"tiny_read_us\": [%.3f, %.3f], \"tiny_dependent_us\": [%.3f, %.3f]}\n", us1, us2, us3, us4);
    }
    if (jf) fclose(jf);
    CK(cudaFree(base));
    return 0;
}

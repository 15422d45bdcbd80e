// launch.cu - the GEMM families' host side (gemm.h): their compiled kernels (kPortable, kSm90:
// token tiles x pipeline depths), configuration checks, grid, workspace, the sm_90a kernels'
// tensor maps, launch.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>

#include "device/launch.cuh"
#include "gemm/kernel_mma.cuh"
#include "gemm/kernel_wgmma.cuh"

namespace {

using gemm_fn = void (*)(const pq2_gemm_problem);

template <int BM> gemm_fn mma_kernel(int stages)
{
    switch (stages) {
    case 2: return pq2_gemm::gemm_kernel<BM, 2>;
    case 3: return pq2_gemm::gemm_kernel<BM, 3>;
    case 4: return pq2_gemm::gemm_kernel<BM, 4>;
    default: return nullptr;
    }
}

using wgmma_fn = void (*)(const pq2_gemm_problem, const pq2_gemm::wg_maps);

template <int BN, bool SK, bool WIDE = false, bool PAIRS = false> wgmma_fn wgmma_kernel(int stages)
{
    switch (stages) {
    case 3: return pq2_gemm::wgmma_kernel<BN, 3, SK, WIDE, PAIRS>;
    case 4: return pq2_gemm::wgmma_kernel<BN, 4, SK, WIDE, PAIRS>;
    case 5: return pq2_gemm::wgmma_kernel<BN, 5, SK, WIDE, PAIRS>;
    case 6: return pq2_gemm::wgmma_kernel<BN, 6, SK, WIDE, PAIRS>;
    default: return nullptr;
    }
}

template <int BN> wgmma_fn wgmma_kernel(int stages, bool streamk)
{
    return streamk ? wgmma_kernel<BN, true>(stages) : wgmma_kernel<BN, false>(stages);
}

// The sm_90a family's block shapes (config warps, unroll): the consumers and a producer warp
// (8, 1); wide blocks, a producer warpgroup (12, 1) and with two groups a consumer iteration
// (12, 2) (gemm/kernel_wgmma.cuh).
constexpr int kWideWarps = 12;

bool is_wide(const pq2_matmul_config &cfg)
{
    return cfg.warps == kWideWarps;
}

wgmma_fn find_wgmma_kernel(const pq2_matmul_config &cfg)
{
    const bool sk = cfg.blocks > 0;
    if (is_wide(cfg)) {
        if (sk) return nullptr;
        if (cfg.tokens == 96)
            return cfg.unroll == 2 ? wgmma_kernel<96, false, true, true>(cfg.stages)
                                   : wgmma_kernel<96, false, true>(cfg.stages);
        return cfg.tokens == 128 && cfg.unroll == 1 ? wgmma_kernel<128, false, true>(cfg.stages)
                                                    : nullptr;
    }
    if (cfg.unroll != 1) return nullptr;
    switch (cfg.tokens) {
    case 32: return wgmma_kernel<32>(cfg.stages, sk);
    case 64: return wgmma_kernel<64>(cfg.stages, sk);
    case 96: return wgmma_kernel<96>(cfg.stages, sk);
    case 128: return wgmma_kernel<128>(cfg.stages, sk);
    default: return nullptr;
    }
}

bool is_sm90(const pq2_matmul_config &cfg)
{
    return cfg.family == PQ2_FAMILY_GEMM_SM90;
}

// A stream-K grid (sm_90a family, blocks > 0): `blocks` blocks per SM share the tiles' groups.
bool is_streamk(const pq2_matmul_config &cfg)
{
    return is_sm90(cfg) && cfg.blocks > 0;
}

gemm_fn find_kernel(const pq2_matmul_config &cfg)
{
    switch (cfg.tokens) {
    case 32: return mma_kernel<32>(cfg.stages);
    case 64: return mma_kernel<64>(cfg.stages);
    case 128: return mma_kernel<128>(cfg.stages);
    default: return nullptr;
    }
}

size_t smem_bytes(const pq2_matmul_config &cfg)
{
    if (is_sm90(cfg)) switch (cfg.tokens) {
        case 32: return pq2_gemm::wg_smem_bytes<32>(cfg.stages);
        case 64: return pq2_gemm::wg_smem_bytes<64>(cfg.stages);
        case 96: return pq2_gemm::wg_smem_bytes<96>(cfg.stages);
        default: return pq2_gemm::wg_smem_bytes<128>(cfg.stages);
        }
    switch (cfg.tokens) {
    case 32: return pq2_gemm::smem_bytes<32>(cfg.stages);
    case 64: return pq2_gemm::smem_bytes<64>(cfg.stages);
    default: return pq2_gemm::smem_bytes<128>(cfg.stages);
    }
}

// The configurations a family compiles: its token tiles (0 ends a shorter list) and pipeline
// depths.
struct gemm_space {
    int32_t family;
    const char *name;
    int tokens[4];
    int min_stages, max_stages;
};
constexpr gemm_space kPortable = {PQ2_FAMILY_GEMM, "GEMM", {32, 64, 128, 0}, 2, 4};
constexpr gemm_space kSm90 = {PQ2_FAMILY_GEMM_SM90, "GEMM_SM90", {32, 64, 96, 128}, 3, 6};
// The (warps, unroll) block shapes; the portable family has the first only.
constexpr int kShapes[3][2] = {{8, 1}, {kWideWarps, 1}, {kWideWarps, 2}};

bool has_tokens(const gemm_space &space, int tokens)
{
    for (int t : space.tokens)
        if (t != 0 && t == tokens) return true;
    return false;
}

// The family's token tiles as text ("32, 64 or 128") into buf.
const char *tokens_text(const gemm_space &space, char (&buf)[64])
{
    int n = 0, at = 0;
    for (int t : space.tokens) n += t != 0;
    for (int i = 0; i < n; ++i)
        at += std::snprintf(buf + at, sizeof buf - at, "%s%d",
                            i == 0       ? ""
                            : i == n - 1 ? " or "
                                         : ", ",
                            space.tokens[i]);
    return buf;
}

const gemm_space &space_of(const pq2_matmul_config &cfg)
{
    return is_sm90(cfg) ? kSm90 : kPortable;
}

const void *kernel_of(const pq2_matmul_config &cfg)
{
    return is_sm90(cfg) ? reinterpret_cast<const void *>(find_wgmma_kernel(cfg))
                        : reinterpret_cast<const void *>(find_kernel(cfg));
}

int64_t row_blocks(int64_t n)
{
    return (n + pq2_gemm::kRows - 1) / pq2_gemm::kRows;
}
int64_t token_blocks(const pq2_matmul_config &cfg, int64_t m)
{
    return (m + cfg.tokens - 1) / cfg.tokens;
}
int32_t splits_of(const pq2_matmul_config &cfg)
{
    return cfg.splits > 1 ? cfg.splits : 1;
}

}  // namespace

pq2_status pq2_gemm_init_device(const char *fn, int cc, int max_smem_optin)
{
    for (const gemm_space *space : {&kPortable, &kSm90}) {
        if (space == &kSm90 && !pq2_gemm_sm90_runs(cc)) continue;
        const bool sm90 = space == &kSm90;
        pq2_matmul_config c = {};
        c.family = space->family;
        for (const int (&shape)[2] : kShapes)
            for (int tokens : space->tokens)
                for (int stages = space->min_stages; tokens != 0 && stages <= space->max_stages;
                     ++stages)
                    for (int blocks = 0; blocks <= (sm90 ? 1 : 0); ++blocks) {
                        c.warps = shape[0], c.unroll = shape[1];
                        c.tokens = tokens, c.stages = stages, c.blocks = blocks;
                        if ((sm90 || c.warps == 8) && kernel_of(c) != nullptr &&
                            smem_bytes(c) <= (size_t)max_smem_optin)
                            PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(
                                                 kernel_of(c),
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem_bytes(c)));
                    }
    }
    return PQ2_OK;
}

bool pq2_gemm_sm90_built()
{
#ifdef PQ2_HAS_SM90A
    return true;
#else
    return false;
#endif
}

pq2_status pq2_gemm_check_config(const char *fn, const pq2_matmul_config &cfg, int32_t layout,
                                 int64_t k, int cc, int max_smem)
{
    if (layout != PQ2_LAYOUT_TILES)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: the GEMM family (m > %d) reads the tiles layout; repack the weights to tiles "
            "(pyq2 repack --layout tiles)",
            fn, PQ2_ROWBLOCK_MAX_M);
    if (cfg.row_subtiles != 8 || (cfg.warps != 8 && !(is_sm90(cfg) && is_wide(cfg))) ||
        cfg.unroll < 1 || cfg.unroll > (is_sm90(cfg) ? 2 : 1))
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: GEMM config row_subtiles=%d warps=%d unroll=%d: the family takes "
                             "row_subtiles 8, warps 8, unroll 1 (PQ2_FAMILY_GEMM_SM90 also warps "
                             "12 with unroll 1 or 2)",
                             fn, (int)cfg.row_subtiles, (int)cfg.warps, (int)cfg.unroll);
    if (cfg.blocks != 0 && !(is_sm90(cfg) && cfg.blocks > 0 && cfg.blocks <= 4 && cfg.splits <= 1))
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: GEMM config blocks=%d splits=%d: blocks (a stream-K grid of "
                             "1..4 blocks per SM) is 0 but in PQ2_FAMILY_GEMM_SM90 without splits",
                             fn, (int)cfg.blocks, (int)cfg.splits);
    if (is_sm90(cfg)) {
        if (!pq2_gemm_sm90_runs(cc))
            return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                                 "%s: config family PQ2_FAMILY_GEMM_SM90 needs a compute "
                                 "capability 9.0 device and a libpq2 built for sm_90a (this "
                                 "device: %d.%d; built for sm_90a: %s)",
                                 fn, cc / 10, cc % 10, pq2_gemm_sm90_built() ? "yes" : "no");
        if (!pq2_gemm_sm90_serves(cc, k))
            return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                                 "%s: config family PQ2_FAMILY_GEMM_SM90 needs k a multiple of "
                                 "%lld below %lld (k=%lld); PQ2_FAMILY_GEMM serves any k",
                                 fn, (long long)kGemmSm90KMultiple, (long long)kGemmSm90KLimit,
                                 (long long)k);
    }
    const gemm_space &space = space_of(cfg);
    if (!has_tokens(space, cfg.tokens)) {
        char text[64];
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: %s config tokens=%d is not %s", fn,
                             space.name, (int)cfg.tokens, tokens_text(space, text));
    }
    if (cfg.stages < space.min_stages || cfg.stages > space.max_stages)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: %s config stages=%d is not in %d..%d",
                             fn, space.name, (int)cfg.stages, space.min_stages, space.max_stages);
    if (is_sm90(cfg) && find_wgmma_kernel(cfg) == nullptr)  // tokens and stages are compiled
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: GEMM_SM90 config warps=%d unroll=%d tokens=%d blocks=%d: warps "
                             "12 runs tile grids (blocks 0) of 96 or 128 tokens, unroll 2 only "
                             "with warps 12 at 96 tokens",
                             fn, (int)cfg.warps, (int)cfg.unroll, (int)cfg.tokens, (int)cfg.blocks);
    if (cfg.splits < 0 || cfg.splits > 16)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: GEMM config splits=%d is not in 0..16",
                             fn, (int)cfg.splits);
    if (smem_bytes(cfg) > (size_t)max_smem)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: GEMM config tokens=%d stages=%d needs %zu bytes of shared memory; the device "
            "allows %d",
            fn, (int)cfg.tokens, (int)cfg.stages, smem_bytes(cfg), max_smem);
    return PQ2_OK;
}

pq2_status pq2_gemm_check_grid(const char *fn, const pq2_matmul_config &cfg, int64_t n, int64_t k,
                               int64_t m)
{
    const int64_t rows = row_blocks(n), toks = token_blocks(cfg, m);
    if (rows > INT32_MAX || toks > 65535)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: n=%lld m=%lld: too many blocks for one grid (m <= %lld)", fn,
                             (long long)n, (long long)m, (long long)65535 * cfg.tokens);
    if ((splits_of(cfg) > 1 || is_streamk(cfg)) && rows * toks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: n=%lld m=%lld: more than 2^31 - 1 tiles to count for split or "
                             "stream-K configurations; use splits 1 and blocks 0",
                             fn, (long long)n, (long long)m);
    if (is_streamk(cfg) && rows * toks * (k / 128) > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: n=%lld k=%lld m=%lld: a stream-K grid (config blocks > 0) takes "
                             "at most 2^31 - 1 tile groups; use blocks 0",
                             fn, (long long)n, (long long)k, (long long)m);
    return PQ2_OK;
}

int32_t pq2_gemm_auto_splits(const pq2_matmul_config &cfg, int64_t n, int64_t k, int64_t m, int sms)
{
    const int64_t blocks = row_blocks(n) * token_blocks(cfg, m), groups = k / 128;
    int64_t s = 1;
    while (s < 16 && blocks * (s * 2) <= sms && groups / (s * 2) >= 8) s *= 2;
    return (int32_t)s;
}

int64_t pq2_gemm_grid(const pq2_matmul_config &cfg, int64_t n, int64_t k, int64_t m, int sms)
{
    const int64_t tiles = row_blocks(n) * token_blocks(cfg, m);
    if (is_streamk(cfg)) return std::min((int64_t)cfg.blocks * sms, tiles * (k / 128));
    return tiles * splits_of(cfg);
}

size_t pq2_gemm_counters(const pq2_matmul_config &cfg, int64_t n, int64_t m)
{
    return splits_of(cfg) > 1 || is_streamk(cfg) ? (size_t)(row_blocks(n) * token_blocks(cfg, m))
                                                 : 0;
}

size_t pq2_gemm_partial_floats(const pq2_matmul_config &cfg, int64_t grid)
{
    const size_t tile = (size_t)pq2_gemm::kRows * cfg.tokens;
    if (is_streamk(cfg)) return (size_t)grid * 2 * tile;  // each block's first and last segment
    return splits_of(cfg) > 1 ? (size_t)grid * tile : 0;
}

namespace {

// cuTensorMapEncodeTiled from the driver the runtime loaded (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder()
{
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            f = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return encode;
}

// One TMA map: `rank` dimensions (dims[0] contiguous), the byte strides of dims 1.., a box.
pq2_status encode_map(const char *fn, const char *what, CUtensorMap *map, CUtensorMapDataType type,
                      cuuint32_t rank, const void *base, const cuuint64_t *dims,
                      const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle swizzle)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode)
        return pq2_set_error(PQ2_ERR_CUDA,
                             "%s: the driver has no cuTensorMapEncodeTiled (the sm_90a GEMM "
                             "needs a CUDA 12 driver)",
                             fn);
    const cuuint32_t step[4] = {1, 1, 1, 1};
    const CUresult r =
        encode(map, type, rank, const_cast<void *>(base), dims, strides, box, step,
               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return pq2_set_error(PQ2_ERR_CUDA,
                             "%s: cuTensorMapEncodeTiled failed for the %s map (CUresult %d; "
                             "dims %llu x %llu, base %p)",
                             fn, what, (int)r, (unsigned long long)dims[0],
                             (unsigned long long)dims[1], base);
    return PQ2_OK;
}

// The maps of kernel_wgmma.cuh: the Q8 values (m rows of k bytes) in boxes of `tokens` rows x
// one 128-byte group with the 128-byte swizzle; the codes and scales as (sub-tile, rt sub-tiles,
// groups, tiles) with a box of one group of the 8 / rt tiles of a block.
pq2_status make_maps(const char *fn, const pq2_gemm_problem &p, int tokens, pq2_gemm::wg_maps *m)
{
    const cuuint64_t groups = (cuuint64_t)(p.k / 128), rt = (cuuint64_t)p.rt;
    const cuuint64_t tiles = (cuuint64_t)((p.n + 16 * p.rt - 1) / (16 * p.rt));
    const cuuint32_t block_tiles = (cuuint32_t)(pq2_gemm::kSubtiles / p.rt);
    {
        const cuuint64_t dims[2] = {(cuuint64_t)p.k, (cuuint64_t)p.m}, strides[1] = {dims[0]};
        const cuuint32_t box[2] = {128, (cuuint32_t)tokens};
        PQ2_CHECK(encode_map(fn, "activations", &m->q8, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p.q8,
                             dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B));
    }
    {
        const cuuint64_t dims[4] = {128, rt, groups, tiles};
        const cuuint64_t strides[3] = {512, rt * 512, groups * rt * 512};
        const cuuint32_t box[4] = {128, (cuuint32_t)rt, 1, block_tiles};
        PQ2_CHECK(encode_map(fn, "codes", &m->codes, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, p.codes,
                             dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE));
    }
    const cuuint64_t dims[4] = {16, rt, groups, tiles};
    const cuuint64_t strides[3] = {32, rt * 32, groups * rt * 32};
    const cuuint32_t box[4] = {16, (cuuint32_t)rt, 1, block_tiles};
    return encode_map(fn, "weight scales", &m->scales, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, p.wscales,
                      dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace

pq2_status pq2_gemm_launch(const char *fn, const pq2_gemm_problem &p, const pq2_matmul_config &cfg,
                           int64_t blocks, bool after_kernel, cudaStream_t stream)
{
    const int64_t rows = row_blocks(p.n), toks = token_blocks(cfg, p.m);
    const bool streamk = is_streamk(cfg);
    const dim3 grid = streamk ? dim3((unsigned)blocks)
                              : dim3((unsigned)rows, (unsigned)toks, (unsigned)splits_of(cfg));
    pq2_gemm_problem q = p;
    q.splits = splits_of(cfg);
    q.tiles = streamk ? (int32_t)(rows * toks) : 0;
    q.token_blocks = streamk ? (int32_t)toks : 0;
    if (is_sm90(cfg)) {
        pq2_gemm::wg_maps maps;
        PQ2_CHECK(make_maps(fn, q, cfg.tokens, &maps));
        const int threads =
            is_wide(cfg) ? pq2_gemm::wg_threads<true>() : pq2_gemm::wg_threads<false>();
        pq2_launch l(grid, threads, smem_bytes(cfg), stream, after_kernel);
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, find_wgmma_kernel(cfg), q, maps));
        return pq2_launch_status(fn);
    }
    pq2_launch l(grid, pq2_gemm::kThreads, smem_bytes(cfg), stream, after_kernel);
    PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, find_kernel(cfg), q));
    return pq2_launch_status(fn);
}

// launch.cu - the row-block family's host side (rowblock.h): finds the compiled kernel of a
// configuration in the per-token-class tables, checks configurations, sizes grids, shared memory
// and workspace, sets the kernels' attributes once per device, launches.
#include "device/launch.cuh"
#include "rowblock/kernel_table.h"
#include "rowblock/kernels.cuh"
#include "rowblock/rowblock.h"

namespace {

constexpr int kMaxWarps = 16;        // 512 threads: the kernels' launch bounds
constexpr int kMaxBlocksPerSm = 32;  // a multiprocessor holds at most 32 blocks
constexpr int kMaxSplits = 16;       // blocks per row block (config splits)
constexpr int kStaticSmem =
    16;  // static shared memory of a register kernel, at most (reduce_store)

const pq2_rowblock_kernel_table *const kTables[] = {
    &pq2_rowblock_kernels_m1, &pq2_rowblock_kernels_m2, &pq2_rowblock_kernels_m8,
    &pq2_rowblock_kernels_m16};

int grid_kind(const pq2_matmul_config &cfg)
{
    return cfg.stages >= 3  ? PQ2_GRID_RING
           : cfg.splits > 1 ? PQ2_GRID_SPLIT
           : cfg.blocks > 0 ? PQ2_GRID_PERSIST
                            : PQ2_GRID_ROWS;
}

// The compiled kernel that runs cfg on this layout at m, or NULL.
const pq2_rowblock_kernel *find_kernel(const pq2_matmul_config &cfg, int32_t layout,
                                       int32_t layout_rt, int64_t m)
{
    const int grid = grid_kind(cfg);
    const pq2_rowblock_key want = {grid,
                                   layout,
                                   layout == PQ2_LAYOUT_TILES ? layout_rt : cfg.row_subtiles,
                                   cfg.row_subtiles,
                                   cfg.unroll,
                                   pq2_rowblock_tokens_class(m),
                                   grid == PQ2_GRID_RING ? 0 : cfg.stages};
    for (const pq2_rowblock_kernel_table *t : kTables)
        for (int i = 0; i < t->count; ++i) {
            const pq2_rowblock_kernel &k = t->kernels[i];
            const pq2_rowblock_key &h = k.key;
            if ((k.fn || k.ring) && h.grid == want.grid && h.layout == want.layout &&
                h.layout_rt == want.layout_rt && h.row_subtiles == want.row_subtiles &&
                h.unroll == want.unroll && h.toks == want.toks && h.stages == want.stages)
                return &k;
        }
    return nullptr;
}

// Units of token constants each warp stages in shared memory (m > 8; 0 otherwise): the most
// groups a warp of cfg takes of a k-column row block (or of its split).
int64_t tc_cap(const pq2_matmul_config &cfg, int64_t m, int64_t k)
{
    if (m <= 8) return 0;
    const int64_t splits = cfg.splits > 1 ? cfg.splits : 1;
    const int64_t groups = ((k >> 7) + splits - 1) / splits;  // a block's groups, at most
    return (groups + cfg.warps - 1) / cfg.warps;
}

// Shared memory of one launch: the cross-warp reduction; with stages >= 3 also the warps'
// rings; at m > 8 also the warps' token constants.
size_t smem_bytes(const pq2_matmul_config &cfg, int64_t m, int64_t k)
{
    const int nt = m > 8 ? 2 : 1;
    const size_t tc =
        (size_t)cfg.warps * tc_cap(cfg, m, k) * 8 * 16;  // 8 records of 16 bytes per unit
    const size_t red = (size_t)cfg.warps * cfg.row_subtiles * nt * 128 * sizeof(float);
    if (cfg.stages < 3) return red + tc;
    const size_t ring =
        (size_t)cfg.warps * cfg.stages * (cfg.unroll * cfg.row_subtiles * 544 + sizeof(uint64_t));
    return (ring > red ? ((ring + 15) & ~(size_t)15) : red) + tc;
}

// Lets kernel f take all the shared memory a block may have (max_smem_optin, static included).
template <class F> cudaError_t allow_dynamic_smem(F f, int max_smem_optin)
{
    cudaFuncAttributes a;
    const cudaError_t e = cudaFuncGetAttributes(&a, f);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                max_smem_optin - (int)a.sharedSizeBytes);
}

const char *grid_text(const pq2_matmul_config &cfg)
{
    return cfg.splits > 1 ? " (split row blocks)" : cfg.blocks > 0 ? " (persistent grid)" : "";
}

// Row blocks of several tile rows (coarse) or of part of one (fine), on a tiles file.
const char *rows_text(const pq2_matmul_config &cfg, int32_t layout, int32_t layout_rt)
{
    if (layout != PQ2_LAYOUT_TILES || cfg.row_subtiles == layout_rt) return "";
    return cfg.row_subtiles > layout_rt ? " (coarse rows)" : " (fine rows)";
}

}  // namespace

bool pq2_rowblock_has_kernel(const pq2_matmul_config &cfg, int32_t layout, int32_t layout_rt,
                             int64_t m)
{
    return find_kernel(cfg, layout, layout_rt, m) != nullptr;
}

size_t pq2_rowblock_counters(const pq2_matmul_config &cfg, int64_t n)
{
    return cfg.splits > 1 ? (size_t)pq2_rowblock_row_blocks(n, cfg.row_subtiles) : 0;
}

size_t pq2_rowblock_partial_floats(const pq2_matmul_config &cfg, int64_t m, int64_t blocks)
{
    // blocks = row blocks * splits, each writing m x 16 * row_subtiles partial sums
    return cfg.splits > 1 ? (size_t)blocks * m * 16 * cfg.row_subtiles : 0;
}

pq2_status pq2_rowblock_check_config(const char *fn, const pq2_matmul_config &cfg, int32_t layout,
                                     int32_t layout_rt, int64_t m, int64_t k, int cc, int max_smem)
{
    if (layout != PQ2_LAYOUT_TILES && layout != PQ2_LAYOUT_PLANES)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                             "%s: the row-block family reads the planes or tiles layout", fn);
    if (cfg.row_subtiles != 1 && cfg.row_subtiles != 2 && cfg.row_subtiles != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config row_subtiles=%d is not 1, 2 or 4", fn,
                             (int)cfg.row_subtiles);
    if (cfg.warps < 1 || cfg.warps > kMaxWarps)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config warps=%d is not in 1..%d", fn,
                             (int)cfg.warps, kMaxWarps);
    if (cfg.unroll != 1 && cfg.unroll != 2 && cfg.unroll != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config unroll=%d is not 1, 2 or 4", fn,
                             (int)cfg.unroll);
    if (cfg.stages < 1 || cfg.stages > 8)
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: config stages=%d is not in 1..8 (1-2 register batches, 3-8 shared-memory ring "
            "slots)",
            fn, (int)cfg.stages);
    if (cfg.blocks < 0 || cfg.blocks > kMaxBlocksPerSm)
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: config blocks=%d is not in 0..%d (0 = one block per row block, else blocks per "
            "multiprocessor of a persistent grid)",
            fn, (int)cfg.blocks, kMaxBlocksPerSm);
    if (cfg.splits < 0 || cfg.splits > kMaxSplits)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: config splits=%d is not in 0..%d (blocks per row block)", fn,
                             (int)cfg.splits, kMaxSplits);
    if (cfg.stages >= 3) {
        if (layout == PQ2_LAYOUT_PLANES)
            return pq2_set_error(
                PQ2_ERR_UNSUPPORTED,
                "%s: config stages=%d: the bulk-copy ring reads the tiles layout only (planes: "
                "stages 1 or 2)",
                fn, (int)cfg.stages);
        if (cfg.row_subtiles != layout_rt)
            return pq2_set_error(
                PQ2_ERR_UNSUPPORTED,
                "%s: config row_subtiles=%d stages=%d: the bulk-copy ring reads whole tiles "
                "(row_subtiles = the layout's rt %d); coarse and fine rows run on the register "
                "kernels (stages 1 or 2)",
                fn, (int)cfg.row_subtiles, (int)cfg.stages, (int)layout_rt);
        if (cfg.blocks != 0 || cfg.splits > 1)
            return pq2_set_error(
                PQ2_ERR_UNSUPPORTED,
                "%s: config blocks=%d splits=%d with stages=%d: the bulk-copy ring runs one block "
                "per row block (blocks 0, splits 0)",
                fn, (int)cfg.blocks, (int)cfg.splits, (int)cfg.stages);
        if (cc < 90)
            return pq2_set_error(
                PQ2_ERR_UNSUPPORTED,
                "%s: config stages=%d (bulk-copy ring) needs compute capability 9.0; this device "
                "has %d.%d (use stages 1 or 2)",
                fn, (int)cfg.stages, cc / 10, cc % 10);
    }
    if (cfg.splits > 1 && cfg.blocks != 0)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: config splits=%d with blocks=%d: split row blocks run one grid block per split "
            "(blocks 0)",
            fn, (int)cfg.splits, (int)cfg.blocks);
    const size_t smem = smem_bytes(cfg, m, k);
    if (smem > (size_t)(max_smem - kStaticSmem))  // (less the split kernels' static arrival flag)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: config warps=%d unroll=%d stages=%d row_subtiles=%d needs %zu bytes of shared "
            "memory per block at m=%lld k=%lld; the device allows %d",
            fn, (int)cfg.warps, (int)cfg.unroll, (int)cfg.stages, (int)cfg.row_subtiles, smem,
            (long long)m, (long long)k, max_smem - kStaticSmem);
    if (!find_kernel(cfg, layout, layout_rt, m))
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: no compiled row-block kernel for layout %s (rt %d) row_subtiles=%d%s unroll=%d "
            "stages=%d%s m=%lld%s",
            fn, layout == PQ2_LAYOUT_TILES ? "tiles" : "planes", (int)layout_rt,
            (int)cfg.row_subtiles, rows_text(cfg, layout, layout_rt), (int)cfg.unroll,
            (int)cfg.stages, grid_text(cfg), (long long)m,
            pq2_built_with_tuning_kernels() ? ""
                                            : " (this build has the tuned table's kernels only; "
                                              "build with -DPQ2_TUNING_KERNELS=ON for the rest)");
    return PQ2_OK;
}

pq2_status pq2_rowblock_init_device(const char *fn, int max_smem_optin)
{
    for (const pq2_rowblock_kernel_table *t : kTables)
        for (int i = 0; i < t->count; ++i) {
            const pq2_rowblock_kernel &k = t->kernels[i];
            if (k.fn) PQ2_CUDA_TRY(fn, allow_dynamic_smem(k.fn, max_smem_optin));
            if (k.ring) {
                PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(k.ring,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      max_smem_optin));
                PQ2_CUDA_TRY(fn, cudaFuncSetAttribute(
                                     k.ring, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            }
        }
    return PQ2_OK;
}

int64_t pq2_rowblock_grid(const pq2_matmul_config &cfg, int64_t n, int sms)
{
    const int64_t row_blocks = pq2_rowblock_row_blocks(n, cfg.row_subtiles);
    if (cfg.splits > 1) return row_blocks * cfg.splits;
    const int64_t persistent = (int64_t)cfg.blocks * sms;
    return cfg.blocks > 0 && persistent < row_blocks ? persistent : row_blocks;
}

pq2_status pq2_rowblock_launch(const char *fn, const pq2_rowblock_problem &p,
                               const pq2_matmul_config &cfg, int64_t blocks, bool after_kernel,
                               cudaStream_t stream)
{
    const int64_t row_blocks = pq2_rowblock_row_blocks(p.n, cfg.row_subtiles);
    if (blocks > INT32_MAX || p.k / 128 * row_blocks > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n=%lld k=%lld: too many row blocks for one grid",
                             fn, (long long)p.n, (long long)p.k);
    const pq2_rowblock_kernel *k = find_kernel(cfg, p.layout, p.layout_rt, p.m);
    if (!k)  // pq2_rowblock_check_config has refused this configuration already
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: no compiled row-block kernel", fn);
    pq2_rowblock_problem q = p;
    q.tc_cap = (int32_t)tc_cap(cfg, p.m, p.k);
    pq2_launch l((unsigned)blocks, cfg.warps * 32, smem_bytes(cfg, p.m, p.k), stream, after_kernel);
    if (k->ring)
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, k->ring, q, (int)cfg.stages));
    else
        PQ2_CUDA_TRY(fn, cudaLaunchKernelEx(&l.cfg, k->fn, q));
    return pq2_launch_status(fn);
}

// select.cu - the dispatcher's table (select.h). The table is data, tuned_configs.inc; the
// compiled kernel list rowblock/instances.inc is derived from it (tools/tune/instances.py).
#include <cmath>

#include "dispatch/select.h"
#include "gemm/gemm.h"
#include "rowblock/rowblock.h"

namespace {

struct tuned_entry {
    int32_t layout;
    int32_t m_max;      // serves m <= m_max (and above the previous entry's m_max for this shape)
    int64_t n, k;       // 0, 0: any shape (the fallback lines)
    int32_t layout_rt;  // TILES: the layout's rt this entry is for; PLANES: 0
    pq2_matmul_config cfg;
};

#define TILES PQ2_LAYOUT_TILES
#define PLANES PQ2_LAYOUT_PLANES
#define ROWBLOCK PQ2_FAMILY_ROWBLOCK
#define GEMM PQ2_FAMILY_GEMM
#define GEMM_SM90 PQ2_FAMILY_GEMM_SM90
#define PQ2_TUNED(layout, m_max, n, k, layout_rt, family, row_subtiles, tokens, warps, unroll, \
                  stages, blocks, splits)                                                      \
    {layout, m_max,     n,                                                                     \
     k,      layout_rt, {family, row_subtiles, tokens, warps, unroll, stages, blocks, splits}},
const tuned_entry kTable[] = {
#include "dispatch/tuned_configs.inc"
};
#undef PQ2_TUNED
#undef ROWBLOCK
#undef GEMM
#undef GEMM_SM90
#undef TILES
#undef PLANES

// Whether entry e can serve m for this layout and rt: entries of the sm_90a family only when
// `sm90` (the device runs them).
bool serves(const tuned_entry &e, int32_t layout, int32_t layout_rt, int64_t m, bool sm90)
{
    return e.layout == layout && m <= e.m_max && (sm90 || e.cfg.family != PQ2_FAMILY_GEMM_SM90) &&
           (layout != PQ2_LAYOUT_TILES || e.layout_rt == layout_rt);
}

// The first entry for (layout, layout_rt, n, k) that serves m, or NULL.
const tuned_entry *lookup(int32_t layout, int32_t layout_rt, int64_t n, int64_t k, int64_t m,
                          bool sm90 = false)
{
    for (const tuned_entry &e : kTable)
        if (e.n == n && e.k == k && serves(e, layout, layout_rt, m, sm90)) return &e;
    return nullptr;
}

// For a shape the table does not list, at m <= kNearestMaxM: the first entry serving m of the
// listed shape nearest (n, k), by |log2(n / n_e)| + |log2(k / k_e)|; NULL when none serves m.
// Above m = 8 the fallback lines are faster (NOTES: nearest-tuned-shape).
constexpr int64_t kNearestMaxM = 8;

const tuned_entry *nearest(int32_t layout, int32_t layout_rt, int64_t n, int64_t k, int64_t m,
                           bool sm90)
{
    if (m > kNearestMaxM) return nullptr;
    const double ln = std::log2((double)n), lk = std::log2((double)k);
    const tuned_entry *best = nullptr;
    double best_d = 0.0;
    for (const tuned_entry &e : kTable) {
        if (e.n == 0 || !serves(e, layout, layout_rt, m, sm90)) continue;
        const double d =
            std::fabs(ln - std::log2((double)e.n)) + std::fabs(lk - std::log2((double)e.k));
        if (!best || d < best_d) {  // strictly nearer: the first entry of a shape is kept
            best = &e;
            best_d = d;
        }
    }
    return best;
}

}  // namespace

pq2_matmul_config pq2_select_config(const pq2_view &v, int64_t m, int sms, int cc)
{
    const int32_t rt = v.layout == PQ2_LAYOUT_TILES ? v.rt : 0;
    const bool sm90 = pq2_gemm_sm90_serves(cc, v.k);
    const tuned_entry *e = lookup(v.layout, rt, v.n, v.k, m, sm90);
    if (!e) e = nearest(v.layout, rt, v.n, v.k, m, sm90);
    if (!e) e = lookup(v.layout, rt, 0, 0, m, sm90);
    if (!e) {
        pq2_matmul_config none = {};  // family 0: the caller says there is no kernel
        return none;
    }
    pq2_matmul_config cfg = e->cfg;
    if ((cfg.family == PQ2_FAMILY_GEMM || cfg.family == PQ2_FAMILY_GEMM_SM90) && cfg.splits == 0 &&
        cfg.blocks == 0)
        cfg.splits = pq2_gemm_auto_splits(cfg, v.n, v.k, m, sms);
    return cfg;
}

pq2_status pq2_select_check_table(const char *fn)
{
    for (const tuned_entry &e : kTable)
        for (int64_t m = 1;
             e.cfg.family == PQ2_FAMILY_ROWBLOCK && m <= e.m_max && m <= PQ2_ROWBLOCK_MAX_M; ++m) {
            if (lookup(e.layout, e.layout_rt, e.n, e.k, m) != &e)
                continue;  // an earlier entry serves m
            if (!pq2_rowblock_has_kernel(e.cfg, e.layout, e.layout_rt, m))
                return pq2_set_error(
                    PQ2_ERR_UNSUPPORTED,
                    "%s: libpq2 was built without the kernel its tuned table names for layout %d "
                    "rt %d n=%lld k=%lld m=%lld (rebuild after tools/tune/instances.py)",
                    fn, (int)e.layout, (int)e.layout_rt, (long long)e.n, (long long)e.k,
                    (long long)m);
        }
    const int32_t layouts[][2] = {{PQ2_LAYOUT_PLANES, 0},
                                  {PQ2_LAYOUT_TILES, 1},
                                  {PQ2_LAYOUT_TILES, 2},
                                  {PQ2_LAYOUT_TILES, 4}};
    for (const auto &l : layouts)
        for (int64_t m = 1; m <= PQ2_ROWBLOCK_MAX_M; ++m)
            if (!lookup(l[0], l[1], 0, 0, m))
                return pq2_set_error(
                    PQ2_ERR_UNSUPPORTED,
                    "%s: libpq2's tuned table has no fallback for layout %d rt %d at m=%lld", fn,
                    (int)l[0], (int)l[1], (long long)m);
    return PQ2_OK;
}

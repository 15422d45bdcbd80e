// dispatch.cu - the CUDA entry points of pq2.h: argument checks, workspace carving, the
// configuration table of the decode family and its fallback rule, one-time device setup.
#include <atomic>

#include "decode.cuh"
#include "quantize.cuh"

// ---- device setup ---------------------------------------------------------------------------

namespace {

constexpr int kMaxDevices = 64;
// Per-device facts read once (init-time cache; the only global state of the library).
struct device_info {
    std::atomic<int> ready;  // 0 = not read yet
    int sms, cc, max_smem;
};
device_info g_dev[kMaxDevices];

pq2_status device_facts(const char *fn, int *sms, int *max_smem, int *cc = nullptr)
{
    int dev = 0;
    PQ2_CUDA_TRY(fn, cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices)
        return pq2_set_error(PQ2_ERR_UNSUPPORTED, "%s: device ordinal %d is beyond %d", fn, dev, kMaxDevices);
    device_info &d = g_dev[dev];
    if (!d.ready.load(std::memory_order_acquire)) {
        // Racing threads compute the same values; the stores are idempotent.
        int major = 0, minor = 0, n = 0, smem = 0;
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        PQ2_CUDA_TRY(fn, cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (major * 10 + minor < 80)
            return pq2_set_error(PQ2_ERR_UNSUPPORTED,
                                 "%s: device %d has compute capability %d.%d; pq2 kernels need 8.0 or "
                                 "newer (int8 mma.m16n8k32, cp.async)", fn, dev, major, minor);
        PQ2_CHECK(pq2_decode_init_device(fn, smem));
        PQ2_CHECK(pq2_rowblock_init_device(fn, smem));
        d.sms = n, d.cc = major * 10 + minor, d.max_smem = smem;
        d.ready.store(1, std::memory_order_release);
    }
    *sms = d.sms;
    *max_smem = d.max_smem;
    if (cc) *cc = d.cc;
    return PQ2_OK;
}

// ---- the decode configuration table ---------------------------------------------------------

struct tuned_entry {
    int32_t layout;
    int32_t m_max;  // serves m <= m_max (and above the previous entry's m_max for this shape)
    int64_t n, k;
    int32_t layout_rt;  // TILES: the layout's rt this entry is for; PLANES: 0
    pq2_decode_config cfg;
};

#define TILES PQ2_LAYOUT_TILES
#define PLANES PQ2_LAYOUT_PLANES
#define STREAM PQ2_DECODE_STREAM
#define ROWBLOCK PQ2_DECODE_ROWBLOCK
#define PQ2_TUNED(layout, m_max, n, k, layout_rt, family, rt, warps, unroll, stages, blocks, splits) \
    {layout, m_max, n, k, layout_rt, {rt, warps, unroll, stages, blocks, family, splits}},
const tuned_entry kTable[] = {
#include "decode_table.inc"
    {-1, 0, 0, 0, 0, {0, 0, 0, 0, 0, 0, 0}}};
#undef PQ2_TUNED
#undef STREAM
#undef ROWBLOCK
#undef TILES
#undef PLANES

// Fallback for shapes the table does not list. TILES: the row-block family, 8 warps per row
// block, one unit per register batch (compiled for every rt at m <= 8 and rt 1-2 at m <= 16);
// otherwise the stream family with one full wave of warps, each keeping three chunks of 2
// units (3 KB at rt 1) in flight.
pq2_decode_config fallback_config(const pq2_view &v, int64_t m)
{
    pq2_decode_config c;
    c.blocks = 0;
    c.splits = 0;
    if (v.layout == PQ2_LAYOUT_TILES && (m <= 8 || v.rt <= 2)) {
        c.family = PQ2_DECODE_ROWBLOCK;
        c.rt = v.rt;
        c.warps = 8;
        c.unroll = 1;
        c.stages = 1;
        return c;
    }
    c.family = PQ2_DECODE_STREAM;
    c.rt = v.layout == PQ2_LAYOUT_TILES ? v.rt : 2;
    c.warps = 4;
    c.unroll = 2;
    c.stages = 4;
    return c;
}

pq2_decode_config choose_config(const pq2_view &v, int64_t m)
{
    for (const tuned_entry *e = kTable; e->layout >= 0; ++e)
        if (e->layout == v.layout && e->n == v.n && e->k == v.k && m <= e->m_max &&
            (v.layout != PQ2_LAYOUT_TILES || e->layout_rt == v.rt))
            return e->cfg;
    return fallback_config(v, m);
}

// Workspace carving, every region 256-byte aligned.
struct workspace_plan {
    size_t q8, xs, sums, bits, records, counters, partial, total;
};

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

workspace_plan plan_workspace(const pq2_view &v, int64_t m, const pq2_decode_config &cfg, int64_t blocks)
{
    workspace_plan w;
    size_t off = 0;
    w.q8 = off, off = align256(off + (size_t)m * v.k);
    w.xs = off, off = align256(off + (size_t)m * v.groups * sizeof(float));
    w.sums = off, off = align256(off + (size_t)m * v.groups * sizeof(int32_t));
    const size_t bits = pq2_decode_needs_bits(cfg, m) ? (size_t)m * v.groups * PQ2_BITS_GROUP_WORDS : 0;
    w.bits = off, off = align256(off + bits * sizeof(uint32_t));
    const size_t records = pq2_decode_needs_records(cfg, m) ? (size_t)v.groups * PQ2_TC_PAIRS * sizeof(int4) : 0;
    w.records = off, off = align256(off + records);
    const size_t counters = pq2_decode_counters(cfg, v.n);
    w.counters = off, off = align256(off + counters * sizeof(uint32_t));
    const size_t partial = cfg.family == PQ2_DECODE_STREAM ? (size_t)2 * blocks * cfg.warps * m * 16 * cfg.rt
                           : cfg.splits > 1 ? (size_t)blocks * m * 16 * cfg.rt  // blocks = row blocks * splits
                                            : 0;
    w.partial = off, off = align256(off + partial * sizeof(float));
    w.total = off;
    return w;
}

// Shared checks of the matmul entry points: weights view, m, dtype, config; fills v, cfg and
// the grid size.
pq2_status prepare(const char *fn, const pq2_weights *w, int64_t m, int32_t y_dtype,
                   const pq2_decode_config *cfg_in, pq2_view *v, pq2_decode_config *cfg,
                   int64_t *blocks)
{
    PQ2_CHECK(pq2_view_of_weights(v, fn, "", w));
    if (v->layout != PQ2_LAYOUT_PLANES && v->layout != PQ2_LAYOUT_TILES)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: weights in layout %s; the GPU kernels read planes or tiles "
                             "(convert once with pq2_convert_layout / pyq2 repack)",
                             fn, pq2_layout_name(v->layout));
    if (m < 1 || m > PQ2_DECODE_MAX_M)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld; the decode kernels serve m in 1..%d", fn,
                             (long long)m, PQ2_DECODE_MAX_M);
    if (y_dtype != PQ2_DTYPE_F32 && y_dtype != PQ2_DTYPE_F16 && y_dtype != PQ2_DTYPE_BF16)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: y_dtype=%d is not f32 (0), f16 (1) or bf16 (2)",
                             fn, (int)y_dtype);
    PQ2_CHECK_ALIGN(fn, w->data, 16);
    int sms, max_smem, cc;
    PQ2_CHECK(device_facts(fn, &sms, &max_smem, &cc));
    *cfg = cfg_in ? *cfg_in : choose_config(*v, m);
    if (!cfg_in && cfg->family == PQ2_DECODE_STREAM)  // chunks must tile k/128: shrink for odd k
        while (cfg->unroll > 1 && v->groups % cfg->unroll != 0) cfg->unroll /= 2;
    if (cfg->family == PQ2_DECODE_ROWBLOCK) {
        PQ2_CHECK(pq2_rowblock_check_config(fn, *cfg, v->layout, v->rt, m, v->k, cc, max_smem));
        *blocks = pq2_rowblock_grid(*cfg, v->n, sms);
        return PQ2_OK;
    }
    if (cfg->family != PQ2_DECODE_STREAM)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config family=%d is not PQ2_DECODE_STREAM (0) or "
                             "PQ2_DECODE_ROWBLOCK (1)", fn, (int)cfg->family);
    if (cfg->splits != 0 && cfg->splits != 1)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: config splits=%d: the stream family takes 0 or 1 "
                             "(it splits row blocks by its own plan)", fn, (int)cfg->splits);
    PQ2_CHECK(pq2_decode_check_config(fn, *cfg, v->layout, v->rt, m, v->k, max_smem));
    return pq2_decode_grid(fn, cfg, v->layout, m, v->n, v->k, sms, blocks);
}

pq2_status run_decode(const char *fn, const pq2_view &v, const pq2_decode_config &cfg,
                      int64_t blocks, int64_t m, const int8_t *q8, const float *xs,
                      const int32_t *sums, void *y, int32_t y_dtype, uint8_t *ws,
                      const workspace_plan &plan, bool after_kernel, cudaStream_t stream)
{
    pq2_decode_problem p;
    p.codes = v.data;
    p.wscales = reinterpret_cast<const uint16_t *>(v.data + v.scale_offset);
    p.q8 = q8, p.xs = xs, p.sums = sums, p.y = y;
    p.xbits = reinterpret_cast<const uint32_t *>(ws + plan.bits);
    p.records = reinterpret_cast<const int4 *>(ws + plan.records);
    p.partial = reinterpret_cast<float *>(ws + plan.partial);
    p.counters = reinterpret_cast<uint32_t *>(ws + plan.counters);
    p.n = v.n, p.k = v.k, p.m = (int32_t)m, p.layout = v.layout, p.y_dtype = y_dtype;
    p.layout_rt = v.layout == PQ2_LAYOUT_TILES ? v.rt : 0;
    p.splits = cfg.family == PQ2_DECODE_ROWBLOCK && cfg.splits > 1 ? cfg.splits : 1;
    p.tc_cap = 0;  // pq2_rowblock_launch sets it
    if (cfg.family == PQ2_DECODE_ROWBLOCK) return pq2_rowblock_launch(fn, p, cfg, blocks, after_kernel, stream);
    return pq2_decode_launch(fn, p, cfg, blocks, after_kernel, stream);
}

}  // namespace

// Programmatic dependent launch needs compute capability 9.0.
bool pq2_pdl_ok()
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    return g_dev[dev].ready.load(std::memory_order_acquire) && g_dev[dev].cc >= 90;
}

// ---- entry points ---------------------------------------------------------------------------

extern "C" PQ2_API pq2_status pq2_cuda_init(void)
{
    int sms, max_smem;
    PQ2_CHECK(device_facts("pq2_cuda_init", &sms, &max_smem));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_decode_config_for(const pq2_weights *w, int64_t m,
                                                    pq2_decode_config *cfg)
{
    static const char fn[] = "pq2_decode_config_for";
    PQ2_CHECK_PTR(fn, cfg);
    pq2_view v;
    int64_t blocks;
    PQ2_CHECK(prepare(fn, w, m, PQ2_DTYPE_F32, nullptr, &v, cfg, &blocks));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_workspace_size(const pq2_weights *w, int64_t m,
                                                        const pq2_decode_config *cfg_in, size_t *bytes)
{
    static const char fn[] = "pq2_matmul_workspace_size";
    PQ2_CHECK_PTR(fn, bytes);
    pq2_view v;
    pq2_decode_config cfg;
    int64_t blocks;
    PQ2_CHECK(prepare(fn, w, m, PQ2_DTYPE_F32, cfg_in, &v, &cfg, &blocks));
    *bytes = plan_workspace(v, m, cfg, blocks).total;
    return pq2_ok();
}

static pq2_status check_workspace(const char *fn, void *workspace, size_t bytes, size_t need)
{
    if (need > 0 && workspace == nullptr)
        return pq2_set_error(PQ2_ERR_WORKSPACE, "%s: workspace is NULL; %zu bytes needed", fn, need);
    if (bytes < need)
        return pq2_set_error(PQ2_ERR_WORKSPACE, "%s: workspace_bytes=%zu < %zu needed", fn, bytes, need);
    PQ2_CHECK_ALIGN(fn, workspace, 256);
    return PQ2_OK;
}

// What both matmul entry points do first: validate the weights and configuration and carve the
// caller's workspace.
struct matmul_call {
    pq2_view v;
    pq2_decode_config cfg;
    int64_t blocks;
    workspace_plan plan;
    uint8_t *ws;
    uint32_t *bits;  // the bit-sliced q8 in the workspace when the kernel reads it (m == 1), else NULL
    int4 *records;   // the token-constant records when the kernel reads them (2 <= m <= 8), else NULL
};

static pq2_status begin_matmul(const char *fn, const pq2_weights *w, int64_t m, int32_t y_dtype,
                               const pq2_decode_config *cfg_in, void *workspace, size_t workspace_bytes,
                               matmul_call *c)
{
    PQ2_CHECK(prepare(fn, w, m, y_dtype, cfg_in, &c->v, &c->cfg, &c->blocks));
    c->plan = plan_workspace(c->v, m, c->cfg, c->blocks);
    PQ2_CHECK(check_workspace(fn, workspace, workspace_bytes, c->plan.total));
    c->ws = static_cast<uint8_t *>(workspace);
    c->bits = pq2_decode_needs_bits(c->cfg, m) ? reinterpret_cast<uint32_t *>(c->ws + c->plan.bits) : nullptr;
    c->records = pq2_decode_needs_records(c->cfg, m) ? reinterpret_cast<int4 *>(c->ws + c->plan.records) : nullptr;
    return PQ2_OK;
}

extern "C" PQ2_API pq2_status pq2_matmul_cuda(const pq2_weights *w, const void *x, int32_t x_dtype,
                                              void *y, int32_t y_dtype, int64_t m,
                                              const pq2_decode_config *cfg_in, void *workspace,
                                              size_t workspace_bytes, void *stream)
{
    static const char fn[] = "pq2_matmul_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_ALIGN(fn, x, 16);
    PQ2_CHECK_ALIGN(fn, y, 16);
    if (x_dtype != PQ2_DTYPE_F32 && x_dtype != PQ2_DTYPE_F16 && x_dtype != PQ2_DTYPE_BF16)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT, "%s: x_dtype=%d is not f32 (0), f16 (1) or bf16 (2)",
                             fn, (int)x_dtype);
    matmul_call c;
    PQ2_CHECK(begin_matmul(fn, w, m, y_dtype, cfg_in, workspace, workspace_bytes, &c));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // Arrival counters (stream family, split row blocks) start at zero: the quantiser clears them.
    const int32_t n_counters = (int32_t)pq2_decode_counters(c.cfg, c.v.n);
    int8_t *q8 = reinterpret_cast<int8_t *>(c.ws + c.plan.q8);
    float *xs = reinterpret_cast<float *>(c.ws + c.plan.xs);
    int32_t *sums = reinterpret_cast<int32_t *>(c.ws + c.plan.sums);
    // The bit-slice kernels (m == 1) read no q8: the quantiser writes none for them.
    PQ2_CHECK(pq2_quantize_launch(fn, x, x_dtype, m, c.v.k, c.bits ? nullptr : q8, xs, sums, c.bits, c.records,
                                  reinterpret_cast<uint32_t *>(c.ws + c.plan.counters), n_counters,
                                  pq2_pdl_ok(), s));
    PQ2_CHECK(run_decode(fn, c.v, c.cfg, c.blocks, m, q8, xs, sums, y, y_dtype, c.ws, c.plan, pq2_pdl_ok(), s));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_q8_cuda(const pq2_weights *w, const int8_t *q8,
                                                 const float *scales, const int32_t *sums, void *y,
                                                 int32_t y_dtype, int64_t m,
                                                 const pq2_decode_config *cfg_in, void *workspace,
                                                 size_t workspace_bytes, void *stream)
{
    static const char fn[] = "pq2_matmul_q8_cuda";
    PQ2_CHECK_PTR(fn, q8);
    PQ2_CHECK_PTR(fn, scales);
    PQ2_CHECK_PTR(fn, sums);
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_ALIGN(fn, q8, 16);
    PQ2_CHECK_ALIGN(fn, scales, 4);
    PQ2_CHECK_ALIGN(fn, sums, 4);
    PQ2_CHECK_ALIGN(fn, y, 16);
    matmul_call c;
    PQ2_CHECK(begin_matmul(fn, w, m, y_dtype, cfg_in, workspace, workspace_bytes, &c));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // Arrival counters (stream family, split row blocks) must start at zero (pq2_matmul_cuda
    // clears them in its quantiser).
    const int32_t n_counters = (int32_t)pq2_decode_counters(c.cfg, c.v.n);
    uint32_t *counters = reinterpret_cast<uint32_t *>(c.ws + c.plan.counters);
    // What the kernel reads beyond the caller's arrays is made here, in the workspace, by a kernel
    // that also clears the counters: the bit-sliced q8 (m == 1) or the token-constant records
    // (2 <= m <= 8). Both are programmatic dependent launches where the device has them, as in
    // pq2_matmul_cuda: the matmul streams its first weights meanwhile (NOTES v14c).
    const bool pdl = pq2_pdl_ok();
    if (c.bits) {
        PQ2_CHECK(pq2_bitslice_launch(fn, q8, m, c.v.k, c.bits, counters, n_counters, pdl, s));
    } else if (c.records) {
        PQ2_CHECK(pq2_token_records_launch(fn, scales, sums, m, c.v.k, c.records, counters, n_counters, pdl, s));
    } else if (n_counters > 0) {
        PQ2_CUDA_TRY(fn, cudaMemsetAsync(counters, 0, (size_t)n_counters * sizeof(uint32_t), s));
    }
    const bool after_kernel = pdl && (c.bits || c.records);  // the matmul follows a PDL launch
    PQ2_CHECK(run_decode(fn, c.v, c.cfg, c.blocks, m, q8, scales, sums, y, y_dtype, c.ws, c.plan, after_kernel, s));
    return pq2_ok();
}

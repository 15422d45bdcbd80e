// matmul.cu - the CUDA entry points of the matmul and the quantiser (pq2.h): argument checks, the
// choice of configuration, workspace carving, and the launches (quantize/, rowblock/, gemm/). The
// dispatcher's table is dispatch/select.cu; the rest of the weight path is api/rotate.cu and
// api/get_rows_dequantize.cu.
#include "device/codes.cuh"
#include "device/device.h"
#include "device/dtypes.cuh"
#include "device/launch.cuh"
#include "dispatch/select.h"
#include "gemm/gemm.h"
#include "quantize/quantize.h"
#include "rowblock/rowblock.h"

namespace {

// Workspace regions of one call, byte offsets, each 256-byte aligned.
struct workspace_plan {
    size_t q8, xs, sums, bits, records, counters, partial, total;
};

size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

bool is_gemm(const pq2_matmul_config &cfg)
{
    return cfg.family == PQ2_FAMILY_GEMM || cfg.family == PQ2_FAMILY_GEMM_SM90;
}

// The operands the row-block kernels read besides the Q8 (device/codes.cuh): bit slices at m == 1,
// token-constant records at 2 <= m <= 8.
bool needs_bits(const pq2_matmul_config &cfg, int64_t m)
{
    return !is_gemm(cfg) && pq2_rowblock_needs_bits(m);
}
bool needs_records(const pq2_matmul_config &cfg, int64_t m)
{
    return !is_gemm(cfg) && pq2_rowblock_needs_records(m);
}

workspace_plan plan_workspace(const pq2_view &v, int64_t m, const pq2_matmul_config &cfg,
                              int64_t blocks)
{
    workspace_plan w;
    size_t off = 0;
    w.q8 = off, off = align256(off + (size_t)m * v.k);
    w.xs = off, off = align256(off + (size_t)m * v.groups * sizeof(float));
    w.sums = off, off = align256(off + (size_t)m * v.groups * sizeof(int32_t));
    const size_t bits = needs_bits(cfg, m) ? (size_t)m * v.groups * PQ2_BITS_GROUP_WORDS : 0;
    w.bits = off, off = align256(off + bits * sizeof(uint32_t));
    const size_t records =
        needs_records(cfg, m) ? (size_t)v.groups * PQ2_TC_PAIRS * sizeof(int4) : 0;
    w.records = off, off = align256(off + records);
    const size_t counters =
        is_gemm(cfg) ? pq2_gemm_counters(cfg, v.n, m) : pq2_rowblock_counters(cfg, v.n);
    w.counters = off, off = align256(off + counters * sizeof(uint32_t));
    const size_t partial = is_gemm(cfg) ? pq2_gemm_partial_floats(cfg, blocks)
                                        : pq2_rowblock_partial_floats(cfg, m, blocks);
    w.partial = off, off = align256(off + partial * sizeof(float));
    w.total = off;
    return w;
}

// What every matmul entry point checks first: the weights, m, the output dtype, the
// configuration (the caller's or the dispatcher's); fills v, cfg, the grid size and the device's
// facts.
pq2_status prepare(const char *fn, const pq2_weights *w, int64_t m, int32_t y_dtype,
                   const pq2_matmul_config *cfg_in, pq2_view *v, pq2_matmul_config *cfg,
                   int64_t *blocks, pq2_device *device)
{
    PQ2_CHECK(pq2_view_of_weights(v, fn, "", w));
    if (v->layout != PQ2_LAYOUT_PLANES && v->layout != PQ2_LAYOUT_TILES)
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: weights in layout %s; the GPU kernels read planes or tiles (convert once with "
            "pq2_convert_layout / pyq2 repack)",
            fn, pq2_layout_name(v->layout));
    if (m < 1 || m > INT32_MAX)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld must be in 1..%d", fn, (long long)m,
                             INT32_MAX);
    PQ2_CHECK(pq2_check_dtype(fn, "y_dtype", y_dtype));
    PQ2_CHECK_ALIGN(fn, w->data, 16);
    PQ2_CHECK(pq2_device_get(fn, device));
    const pq2_device &dev = *device;
    *cfg = cfg_in ? *cfg_in : pq2_select_config(*v, m, dev.sms, dev.cc);
    if (!cfg_in && cfg->family == 0)
        return pq2_set_error(
            PQ2_ERR_UNSUPPORTED,
            "%s: m=%lld on the %s layout: above m = %d the matmul (GEMM family) reads the "
            "tiles layout; repack the weights to tiles",
            fn, (long long)m, pq2_layout_name(v->layout), PQ2_ROWBLOCK_MAX_M);
    if (is_gemm(*cfg)) {
        PQ2_CHECK(pq2_gemm_check_config(fn, *cfg, v->layout, v->k, dev.cc, dev.max_smem));
        PQ2_CHECK(pq2_gemm_check_grid(fn, *cfg, v->n, v->k, m));
        *blocks = pq2_gemm_grid(*cfg, v->n, v->k, m, dev.sms);
        return PQ2_OK;
    }
    if (cfg->family != PQ2_FAMILY_ROWBLOCK)
        return pq2_set_error(
            PQ2_ERR_INVALID_ARGUMENT,
            "%s: config family=%d is not PQ2_FAMILY_ROWBLOCK (1), PQ2_FAMILY_GEMM (2) or "
            "PQ2_FAMILY_GEMM_SM90 (3)",
            fn, (int)cfg->family);
    if (m > PQ2_ROWBLOCK_MAX_M)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: m=%lld: the row-block family serves m in 1..%d",
                             fn, (long long)m, PQ2_ROWBLOCK_MAX_M);
    PQ2_CHECK(pq2_rowblock_check_config(fn, *cfg, v->layout, v->rt, m, v->k, dev.cc, dev.max_smem));
    *blocks = pq2_rowblock_grid(*cfg, v->n, dev.sms);
    return PQ2_OK;
}

// The configuration the dispatcher gives where its sm_90a choice cannot run (a Q8 operand whose
// scales or sums are not 16-byte aligned): the table as on a device without the sm_90a family.
pq2_matmul_config portable_fallback(const pq2_view &v, int64_t m, const pq2_device &dev)
{
    return pq2_select_config(v, m, dev.sms, 0);
}

pq2_status check_workspace(const char *fn, void *workspace, size_t bytes, size_t need)
{
    if (need > 0 && workspace == nullptr)
        return pq2_set_error(PQ2_ERR_WORKSPACE, "%s: workspace is NULL; %zu bytes needed", fn,
                             need);
    if (bytes < need)
        return pq2_set_error(PQ2_ERR_WORKSPACE, "%s: workspace_bytes=%zu < %zu needed", fn, bytes,
                             need);
    PQ2_CHECK_ALIGN(fn, workspace, 256);
    return PQ2_OK;
}

// A validated matmul call: weights, configuration, grid, the device and the caller's workspace
// carved.
struct matmul_call {
    pq2_view v;
    pq2_matmul_config cfg;
    int64_t blocks;
    pq2_device dev;
    workspace_plan plan;
    uint8_t *ws;
    uint32_t *bits;      // the bit-sliced q8 when the kernel reads it, else NULL
    int4 *records;       // the token-constant records when the kernel reads them, else NULL
    uint32_t *counters;  // arrival counters of split configurations, cleared before the kernel
    int32_t n_counters;
};

pq2_status begin_matmul(const char *fn, const pq2_weights *w, int64_t m, int32_t y_dtype,
                        const pq2_matmul_config *cfg_in, void *workspace, size_t workspace_bytes,
                        matmul_call *c)
{
    PQ2_CHECK(prepare(fn, w, m, y_dtype, cfg_in, &c->v, &c->cfg, &c->blocks, &c->dev));
    c->plan = plan_workspace(c->v, m, c->cfg, c->blocks);
    PQ2_CHECK(check_workspace(fn, workspace, workspace_bytes, c->plan.total));
    c->ws = static_cast<uint8_t *>(workspace);
    c->bits = needs_bits(c->cfg, m) ? reinterpret_cast<uint32_t *>(c->ws + c->plan.bits) : nullptr;
    c->records =
        needs_records(c->cfg, m) ? reinterpret_cast<int4 *>(c->ws + c->plan.records) : nullptr;
    c->counters = reinterpret_cast<uint32_t *>(c->ws + c->plan.counters);
    c->n_counters = (int32_t)(is_gemm(c->cfg) ? pq2_gemm_counters(c->cfg, c->v.n, m)
                                              : pq2_rowblock_counters(c->cfg, c->v.n));
    return PQ2_OK;
}

// The matmul kernel of the call's family.
pq2_status run_matmul(const char *fn, const matmul_call &c, int64_t m, const int8_t *q8,
                      const float *xs, const int32_t *sums, void *y, int32_t y_dtype,
                      bool after_kernel, cudaStream_t stream)
{
    if (is_gemm(c.cfg)) {
        pq2_gemm_problem p;
        p.codes = c.v.data;
        p.wscales = reinterpret_cast<const uint16_t *>(c.v.data + c.v.scale_offset);
        p.q8 = q8, p.xs = xs, p.sums = sums, p.y = y;
        p.partial = reinterpret_cast<float *>(c.ws + c.plan.partial);
        p.counters = c.counters;
        p.n = c.v.n, p.k = c.v.k, p.m = m, p.rt = c.v.rt, p.y_dtype = y_dtype, p.splits = 1;
        p.tiles = 0, p.token_blocks = 0;  // pq2_gemm_launch sets them
        return pq2_gemm_launch(fn, p, c.cfg, c.blocks, after_kernel, stream);
    }
    pq2_rowblock_problem p;
    p.codes = c.v.data;
    p.wscales = reinterpret_cast<const uint16_t *>(c.v.data + c.v.scale_offset);
    p.q8 = q8, p.xs = xs, p.sums = sums, p.y = y;
    p.xbits = c.bits;
    p.records = c.records;
    p.partial = reinterpret_cast<float *>(c.ws + c.plan.partial);
    p.counters = c.counters;
    p.n = c.v.n, p.k = c.v.k, p.m = (int32_t)m, p.layout = c.v.layout, p.y_dtype = y_dtype;
    p.layout_rt = c.v.layout == PQ2_LAYOUT_TILES ? c.v.rt : 0;
    p.splits = c.cfg.splits > 1 ? c.cfg.splits : 1;
    p.tc_cap = 0;  // pq2_rowblock_launch sets it
    return pq2_rowblock_launch(fn, p, c.cfg, c.blocks, after_kernel, stream);
}

}  // namespace

extern "C" PQ2_API pq2_status pq2_cuda_init(void)
{
    pq2_device dev;
    PQ2_CHECK(pq2_device_get("pq2_cuda_init", &dev));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_config_for(const pq2_weights *w, int64_t m,
                                                    pq2_matmul_config *cfg)
{
    static const char fn[] = "pq2_matmul_config_for";
    PQ2_CHECK_PTR(fn, cfg);
    pq2_view v;
    int64_t blocks;
    pq2_device dev;
    PQ2_CHECK(prepare(fn, w, m, PQ2_DTYPE_F32, nullptr, &v, cfg, &blocks, &dev));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_workspace_size(const pq2_weights *w, int64_t m,
                                                        const pq2_matmul_config *cfg_in,
                                                        size_t *bytes)
{
    static const char fn[] = "pq2_matmul_workspace_size";
    PQ2_CHECK_PTR(fn, bytes);
    PQ2_CHECK_ALIGN(fn, bytes, PQ2_ALIGNOF(size_t));
    pq2_view v;
    pq2_matmul_config cfg;
    int64_t blocks;
    pq2_device dev;
    PQ2_CHECK(prepare(fn, w, m, PQ2_DTYPE_F32, cfg_in, &v, &cfg, &blocks, &dev));
    *bytes = plan_workspace(v, m, cfg, blocks).total;
    if (!cfg_in && cfg.family == PQ2_FAMILY_GEMM_SM90) {
        // pq2_matmul_q8_cuda may fall back to the portable family (an operand whose scales or
        // sums are not 16-byte aligned): the workspace serves both.
        const pq2_matmul_config portable = portable_fallback(v, m, dev);
        const int64_t grid = pq2_gemm_grid(portable, v.n, v.k, m, dev.sms);
        const size_t other = plan_workspace(v, m, portable, grid).total;
        if (other > *bytes) *bytes = other;
    }
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_q8_kernel_operand_bytes(int64_t m, int64_t k, size_t *bytes)
{
    static const char fn[] = "pq2_q8_kernel_operand_bytes";
    PQ2_CHECK_PTR(fn, bytes);
    PQ2_CHECK_ALIGN(fn, bytes, PQ2_ALIGNOF(size_t));
    if (m <= 0 || k <= 0 || k % 128 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: m=%lld k=%lld: need m > 0 and k a positive multiple of 128", fn,
                             (long long)m, (long long)k);
    size_t size;
    if (!pq2_q8_kernel_operand_size(m, k, &size))
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: m=%lld k=%lld: the Q8 operand is too large (over %llu bytes)", fn,
                             (long long)m, (long long)k, (unsigned long long)PQ2_MAX_BYTES);
    *bytes = size;
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_quantize_q8_cuda(const void *x, int32_t x_dtype, int64_t m,
                                                   int64_t k, const pq2_q8 *out, void *stream)
{
    static const char fn[] = "pq2_quantize_q8_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK(pq2_check_dtype(fn, "x_dtype", x_dtype));
    if (m <= 0 || k <= 0 || k % 128 != 0)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: m=%lld k=%lld: need m > 0 and k a positive multiple of 128", fn,
                             (long long)m, (long long)k);
    PQ2_CHECK_ALIGN(fn, x, 16);
    pq2_q8_sink o;
    PQ2_CHECK(pq2_q8_resolve(fn, "out", out, m, k, &o));
    pq2_device dev;
    PQ2_CHECK(pq2_device_get(fn, &dev));
    PQ2_CHECK(pq2_quantize_launch(fn, x, x_dtype, m, k, o.q8, o.scales, o.sums, o.bits, o.records,
                                  nullptr, 0, pq2_pdl_ok(), dev.sms,
                                  static_cast<cudaStream_t>(stream)));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_cuda(const pq2_weights *w, const void *x, int32_t x_dtype,
                                              void *y, int32_t y_dtype, int64_t m,
                                              const pq2_matmul_config *cfg_in, void *workspace,
                                              size_t workspace_bytes, void *stream)
{
    static const char fn[] = "pq2_matmul_cuda";
    PQ2_CHECK_PTR(fn, x);
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_ALIGN(fn, x, 16);
    PQ2_CHECK_ALIGN(fn, y, 16);
    PQ2_CHECK(pq2_check_dtype(fn, "x_dtype", x_dtype));
    matmul_call c;
    PQ2_CHECK(begin_matmul(fn, w, m, y_dtype, cfg_in, workspace, workspace_bytes, &c));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int8_t *q8 = reinterpret_cast<int8_t *>(c.ws + c.plan.q8);
    float *xs = reinterpret_cast<float *>(c.ws + c.plan.xs);
    int32_t *sums = reinterpret_cast<int32_t *>(c.ws + c.plan.sums);
    // The bit-slice kernels (m == 1) read no q8: the quantiser writes none for them. It also
    // clears the arrival counters of split row blocks.
    PQ2_CHECK(pq2_quantize_launch(fn, x, x_dtype, m, c.v.k, c.bits ? nullptr : q8, xs, sums, c.bits,
                                  c.records, c.counters, c.n_counters, pq2_pdl_ok(), c.dev.sms, s));
    PQ2_CHECK(run_matmul(fn, c, m, q8, xs, sums, y, y_dtype, pq2_pdl_ok(), s));
    return pq2_ok();
}

extern "C" PQ2_API pq2_status pq2_matmul_q8_cuda(const pq2_weights *w, const pq2_q8 *x, void *y,
                                                 int32_t y_dtype, int64_t m,
                                                 const pq2_matmul_config *cfg_in, void *workspace,
                                                 size_t workspace_bytes, void *stream)
{
    static const char fn[] = "pq2_matmul_q8_cuda";
    PQ2_CHECK_PTR(fn, y);
    PQ2_CHECK_ALIGN(fn, y, 16);
    matmul_call c;
    PQ2_CHECK(begin_matmul(fn, w, m, y_dtype, cfg_in, workspace, workspace_bytes, &c));
    pq2_q8_sink in;
    PQ2_CHECK(pq2_q8_resolve(fn, "x", x, m, c.v.k, &in));
    if (c.cfg.family == PQ2_FAMILY_GEMM_SM90 &&
        !(pq2_aligned(in.scales, 16) && pq2_aligned(in.sums, 16))) {
        // The sm_90a kernels load scales and sums in 16-byte rows; the ABI asks 4 bytes.
        if (cfg_in)
            return pq2_set_error(PQ2_ERR_ALIGNMENT,
                                 "%s: x->scales %p and x->sums %p must be 16-byte aligned for "
                                 "PQ2_FAMILY_GEMM_SM90",
                                 fn, (const void *)in.scales, (const void *)in.sums);
        const pq2_matmul_config portable = portable_fallback(c.v, m, c.dev);
        PQ2_CHECK(begin_matmul(fn, w, m, y_dtype, &portable, workspace, workspace_bytes, &c));
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool pdl = pq2_pdl_ok();
    if (in.q8 == nullptr && !c.bits)
        return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: x->q8 is NULL; this configuration reads q8",
                             fn);
    bool after_kernel = pdl;  // the matmul follows a kernel (the caller's producer, or one below)
    const bool given = (c.bits && in.bits) || (c.records && in.records);
    if (given || (!c.bits && !c.records)) {
        // Nothing to make: the caller's operand has what the kernel reads.
        if (given) c.bits = in.bits, c.records = in.records;
        if (c.n_counters > 0) {
            PQ2_CUDA_TRY(
                fn, cudaMemsetAsync(c.counters, 0, (size_t)c.n_counters * sizeof(uint32_t), s));
            after_kernel = false;
        }
    } else if (c.bits) {
        // Made here, in the workspace, by a kernel that also clears the counters: the bit-sliced
        // q8 (m == 1) or the token-constant records (2 <= m <= 8), as programmatic dependent
        // launches where the device has them: the matmul streams its first weights meanwhile.
        PQ2_CHECK(
            pq2_bitslice_launch(fn, in.q8, m, c.v.k, c.bits, c.counters, c.n_counters, pdl, s));
    } else {
        PQ2_CHECK(pq2_token_records_launch(fn, in.scales, in.sums, m, c.v.k, c.records, c.counters,
                                           c.n_counters, pdl, s));
    }
    PQ2_CHECK(run_matmul(fn, c, m, in.q8, in.scales, in.sums, y, y_dtype, after_kernel, s));
    return pq2_ok();
}

// decode.cuh - the small-batch (M = 1..16, decode) matmul family: launcher interface.
#pragma once
#include "common.cuh"

// One validated problem, device pointers resolved to the code and scale regions of the layout.
struct pq2_decode_problem {
    const uint8_t *codes;    // code plane (PLANES) or tile-major code region (TILES)
    const uint16_t *wscales; // fp16 scale plane / tile-major scale region
    const int8_t *q8;        // [m][k] plane order
    const float *xs;         // [m][k/128]
    const int32_t *sums;     // [m][k/128]
    const uint32_t *xbits;   // [m][k/128][PQ2_BITS_GROUP_WORDS] bit-sliced q8 (pq2_decode_needs_bits)
    void *y;                 // [m][n], y_dtype
    float *partial;          // partial sums of row blocks split between warps [2 * warps][m][16*rt]
    uint32_t *counters;      // arrival counters, one per row block, zero on entry
    int64_t n, k;
    int32_t m, layout, y_dtype;
    int32_t layout_rt;       // TILES: the layout's rt (row-block family: a multiple of the config's rt); PLANES: 0
    int32_t splits;          // row-block family: blocks per row block (1 = no split)
    int32_t tc_cap;          // row-block family, m > 8: token-constant units per warp in shared memory
    const int4 *records;     // [k/128][4] token-constant records (pq2_decode_needs_records); last, so that
                             // the fields before keep their parameter offsets
};

// The token class of m, which picks a kernel instance: 1 (m == 1), 8 (m <= 8) or 16.
static inline int pq2_decode_tokens_class(int64_t m) { return m == 1 ? 1 : m <= 8 ? 8 : 16; }

// True when the call's kernel reads the bit-sliced activations (common.cuh): the row-block
// family at m == 1.
static inline bool pq2_decode_needs_bits(const pq2_decode_config &cfg, int64_t m)
{
    return cfg.family == PQ2_DECODE_ROWBLOCK && m == 1;
}

// True when the call's kernel reads the token-constant records (common.cuh): the row-block
// family at 2 <= m <= 8. Lane tq of a warp needs record pair tq (m == 2: pair 0) of each unit's
// group: one 16-byte load instead of four loads and their address arithmetic (NOTES v15e).
static inline bool pq2_decode_needs_records(const pq2_decode_config &cfg, int64_t m)
{
    return cfg.family == PQ2_DECODE_ROWBLOCK && m >= 2 && m <= 8;
}

// Row blocks (blocks along N) of a configuration: ceil(n / (16 * rt)).
__host__ __device__ inline int64_t pq2_decode_row_blocks(int64_t n, int32_t rt) { return (n + 16 * rt - 1) / (16 * rt); }

// Arrival counters a call needs in its workspace (zeroed before the kernel): one per row block
// for the stream family and for split row blocks (row-block family, splits > 1), else none.
static inline size_t pq2_decode_counters(const pq2_decode_config &cfg, int64_t n)
{
    const bool needed = cfg.family == PQ2_DECODE_STREAM || (cfg.family == PQ2_DECODE_ROWBLOCK && cfg.splits > 1);
    return needed ? (size_t)pq2_decode_row_blocks(n, cfg.rt) : 0;
}

// The last contributor to a split row block rb (rows of tr = 16*rt): adds the partial sums of its
// `count` contributors in contributor order (deterministic whoever arrives last) and stores
// them. slot(i) points at contributor i's partials, [m][tr] fp32, written by other blocks (read
// with __ldcg, past L1). Thread t of nthreads takes outputs t, t + nthreads, ...
template <class SLOT>
__device__ __forceinline__ void pq2_store_partial_sums(const pq2_decode_problem &p, int64_t rb, int tr, int count,
                                                       SLOT slot, int t, int nthreads)
{
    for (int e = t; e < p.m * tr; e += nthreads) {
        const int tok = e / tr, row = e % tr;
        const int64_t n_row = rb * tr + row;
        float v = 0.0f;
        for (int i = 0; i < count; ++i) v += __ldcg(slot(i) + e);
        if (n_row < p.n) pq2_store_from_f32(p.y, (size_t)tok * p.n + n_row, p.y_dtype, v);
    }
}

// One-time per device: lets every decode kernel use up to max_smem_optin bytes of shared memory.
pq2_status pq2_decode_init_device(const char *fn, int max_smem_optin);

// The checks both families make: rt 1, 2 or 4 (for a tile-major layout equal to the layout's,
// or with coarse_rows a multiple of it: row blocks of several tile rows), warps in 1..max_warps,
// unroll 1, 2 or 4. PQ2_OK or an error naming the value.
pq2_status pq2_decode_check_shape(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                  int32_t layout_rt, int max_warps, bool coarse_rows = false);
// PQ2_ERR_UNSUPPORTED naming cfg when a launch needs more than max_smem bytes of shared memory.
pq2_status pq2_decode_check_smem(const char *fn, const pq2_decode_config &cfg, size_t smem, int max_smem);

// PQ2_OK when the family has an instance for cfg with this layout and m that fits in max_smem
// bytes of shared memory per block and whose unroll divides k/128, else an error naming the
// values.
pq2_status pq2_decode_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                   int32_t layout_rt, int64_t m, int64_t k, int max_smem);

// The grid size cfg gives on a device with `sms` multiprocessors: cfg->blocks, or one full wave
// when 0, capped so that no warp is without work (which may also lower cfg->warps for tiny
// problems). Deterministic per device.
pq2_status pq2_decode_grid(const char *fn, pq2_decode_config *cfg, int32_t layout, int64_t m,
                           int64_t n, int64_t k, int sms, int64_t *blocks);

// Launches the decode kernel for a validated problem and configuration. Needs p.counters
// (row blocks of cfg.rt) zeroed and p.partial sized 2 * blocks * cfg.warps * m * 16 * cfg.rt
// floats. after_kernel: the preceding stream operation is a kernel that writes the activations
// (Hopper: launch as its programmatic dependent).
pq2_status pq2_decode_launch(const char *fn, const pq2_decode_problem &p,
                             const pq2_decode_config &cfg, int64_t blocks, bool after_kernel,
                             cudaStream_t stream);

// ---- the row-block family (decode_rowblock.cu; planes and tiles, no workspace beyond the Q8
// data) ----

// Units of token constants each warp stages in shared memory (m > 8; 0 otherwise): the most
// groups a warp of cfg takes of a k-column row block (or of its split).
int64_t pq2_rowblock_tc_cap(const pq2_decode_config &cfg, int64_t m, int64_t k);
// Shared memory of one row-block launch (the cross-warp reduction; with stages >= 3 also the
// warps' rings; m > 8 also the warps' token constants).
size_t pq2_rowblock_smem(const pq2_decode_config &cfg, int64_t m, int64_t k);
pq2_status pq2_rowblock_init_device(const char *fn, int max_smem_optin);
// PQ2_OK when the row-block family has an instance for cfg with this layout and m that fits the
// device (compute capability cc, max_smem bytes of shared memory per block), else an error
// naming the values.
pq2_status pq2_rowblock_check_config(const char *fn, const pq2_decode_config &cfg, int32_t layout,
                                     int32_t layout_rt, int64_t m, int64_t k, int cc, int max_smem);
// The grid of cfg on a device with `sms` multiprocessors: one block per row block
// (ceil(n / (16*rt))), cfg.splits blocks per row block (splits > 1), or with cfg.blocks > 0 at
// most cfg.blocks * sms blocks that loop over the row blocks.
int64_t pq2_rowblock_grid(const pq2_decode_config &cfg, int64_t n, int sms);
// Launches `blocks` (pq2_rowblock_grid) blocks.
pq2_status pq2_rowblock_launch(const char *fn, const pq2_decode_problem &p, const pq2_decode_config &cfg,
                               int64_t blocks, bool after_kernel, cudaStream_t stream);

/*
 * pq2.h - the C ABI of libpq2: PQ2_0 ternary-weight layouts, reference arithmetic and CUDA kernels.
 *
 * Plain C, fixed-width types, pointers and CUDA streams as `void *`. Every entry point returns a
 * pq2_status; on failure pq2_last_error() (thread-local) names the offending values. The library
 * never aborts, exits or prints.
 *
 * Host entry points (suffix _host or layout/format conversions) take host memory only. Device
 * entry points (suffix _cuda) take device memory only; in a build without CUDA they return
 * PQ2_ERR_NO_CUDA. Every host buffer comes with its byte count, checked against the shape
 * arguments; a device buffer must hold what its shape arguments say (a device pointer cannot be
 * checked). A pointer to numbers (float *, int32_t *, size_t *, host or device) must be aligned
 * for its type (alignof: 4 for float and int32_t), and the device entry points ask more where
 * they say so; a misaligned pointer is refused with PQ2_ERR_ALIGNMENT before any buffer is read
 * or written. Untyped (void *) and byte (int8_t *) buffers take any address unless the entry point
 * says otherwise.
 *
 * The declarations between PQ2_CDEF_BEGIN and PQ2_CDEF_END are also the cffi declarations of the
 * Python package (bindings/gen_cdef.py derives them from this file): keep them to plain
 * declarations, `#define NAME <integer>` constants and enums with explicit values.
 *
 * FORMATS.md (repository root) specifies every byte this header names, and is cited by section:
 * the block formats (1: PQ2_0 in 1.1, PTQ1_0 1.2, TQ2_0 1.3, conversions 1.4), the resident
 * layouts RAW, PLANES and TILES of an N x K matrix (2, with the format version), the group-128 Q8
 * activations and their plane order (3.1), the reference matmul (3.2) and the Prism Hadamard
 * rotation contract (4).
 */
#ifndef PQ2_H
#define PQ2_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define PQ2_API __declspec(dllexport)
#else
#define PQ2_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* PQ2_CDEF_BEGIN */

/* Bumped on any incompatible change of a signature, struct, enum value or layout. */
#define PQ2_ABI_VERSION 7

/* Format version written to repacked files as pyq2.format_version. */
#define PQ2_FORMAT_VERSION 2

#define PQ2_BLOCK_WEIGHTS 128
#define PQ2_BLOCK_BYTES 34
#define PTQ1_BLOCK_BYTES 28
#define TQ2_BLOCK_WEIGHTS 256
#define TQ2_BLOCK_BYTES 66

/* Largest m (rows of x) the row-block kernel family serves; above it the GEMM family does. */
#define PQ2_ROWBLOCK_MAX_M 16

typedef enum pq2_status {
    PQ2_OK = 0,
    PQ2_ERR_INVALID_ARGUMENT = 1, /* a value out of range: dtype, layout, rt, flags */
    PQ2_ERR_NULL_POINTER = 2,
    PQ2_ERR_SHAPE = 3,           /* K % 128, N or M out of range, buffer size mismatch */
    PQ2_ERR_ALIGNMENT = 4,       /* a pointer not aligned as the entry point requires */
    PQ2_ERR_UNREPRESENTABLE = 5, /* data the target format cannot hold (code 3 into PTQ1_0) */
    PQ2_ERR_NO_CUDA = 6,         /* library built without CUDA */
    PQ2_ERR_CUDA = 7,            /* a CUDA runtime error; the message has its name */
    PQ2_ERR_UNSUPPORTED = 8,     /* valid request this build or device does not serve */
    PQ2_ERR_WORKSPACE = 9        /* workspace missing or smaller than the size query said */
} pq2_status;

typedef enum pq2_layout {
    PQ2_LAYOUT_RAW = 0,
    PQ2_LAYOUT_PLANES = 1,
    PQ2_LAYOUT_TILES = 2
} pq2_layout;

typedef enum pq2_dtype { PQ2_DTYPE_F32 = 0, PQ2_DTYPE_F16 = 1, PQ2_DTYPE_BF16 = 2 } pq2_dtype;

/* A PQ2_0 weight matrix W[N][K] in one of the layouts. `data` is host memory for host entry
 * points and device memory for _cuda entry points; `bytes` is the size of the buffer at data,
 * which must hold at least pq2_layout_bytes(layout, n, k, rt) (PQ2_ERR_SHAPE otherwise). rt is
 * the TILES layout's tile height in 16-row sub-tiles (1, 2 or 4) and ignored (pass 0) for the
 * other layouts. */
typedef struct pq2_weights {
    const void *data;
    size_t bytes;
    int64_t n;
    int64_t k;
    int32_t layout;
    int32_t rt;
} pq2_weights;

/* ---- library ---- */
PQ2_API uint32_t pq2_abi_version(void);
PQ2_API const char *pq2_version_string(void); /* "0.1.0 (cuda 90a-real,80)" or "0.1.0 (cpu only)" */
PQ2_API int32_t pq2_built_with_cuda(void);    /* 1 when the CUDA half is compiled in */
/* 1 when the build holds every kernel configuration the tuner searches (CMake option
 * PQ2_TUNING_KERNELS), 0 when only those the tuned table and its fallback use. */
PQ2_API int32_t pq2_built_with_tuning_kernels(void);
PQ2_API const char *pq2_status_name(int32_t status); /* "PQ2_ERR_SHAPE", never NULL */
PQ2_API const char *pq2_last_error(void);            /* thread-local; "" after success */

/* ---- layouts (host memory) ---- */
/* Bytes a matrix of n x k takes in `layout` (rt for TILES). */
PQ2_API pq2_status pq2_layout_bytes(int32_t layout, int64_t n, int64_t k, int32_t rt,
                                    size_t *bytes);
/* Any layout to any layout. src->data holds pq2_layout_bytes(src) bytes; dst_bytes must equal
 * pq2_layout_bytes(dst_layout, n, k, dst_rt). Converting to TILES writes the padding rows;
 * converting from TILES ignores them. src and dst must not overlap. */
PQ2_API pq2_status pq2_convert_layout(const pq2_weights *src, void *dst, size_t dst_bytes,
                                      int32_t dst_layout, int32_t dst_rt);

/* ---- formats to and from PQ2_0 raw blocks (host memory), n_blocks 128-weight blocks ---- */
/* PTQ1_0 -> PQ2_0 blocks, lossless (FORMATS.md 1.4). */
PQ2_API pq2_status pq2_ptq1_to_pq2(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                   int64_t n_blocks);
/* PQ2_0 -> PTQ1_0; a block holding code 3 fails with PQ2_ERR_UNREPRESENTABLE naming the row and
 * block (row = block / blocks_per_row; pass blocks_per_row = K/128, or n_blocks for a flat
 * list). dst is left unspecified on failure. */
PQ2_API pq2_status pq2_pq2_to_ptq1(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                   int64_t n_blocks, int64_t blocks_per_row);
/* TQ2_0 -> PQ2_0, lossless (FORMATS.md 1.4): n_tq2_blocks input blocks of 256 weights give
 * 2*n_tq2_blocks output blocks. */
PQ2_API pq2_status pq2_tq2_to_pq2(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                  int64_t n_tq2_blocks);

/* ---- reference arithmetic (host memory) ---- */
/* out[N][K] f32 = the dequantised weights (FORMATS.md 1.1); out_bytes must be N*K*4. */
PQ2_API pq2_status pq2_dequantize_host(const pq2_weights *w, float *out, size_t out_bytes);
/* Group-128 Q8 of x[m][k] (f32, row-major), by the rules of FORMATS.md 3.1: q8[m][k] in plane
 * order, scales[m][k/128] f32, sums[m][k/128] int32. Each *_bytes is the size of its buffer and
 * must be at least what m and k need. */
PQ2_API pq2_status pq2_quantize_q8_host(const float *x, size_t x_bytes, int64_t m, int64_t k,
                                        int8_t *q8, size_t q8_bytes, float *scales,
                                        size_t scales_bytes, int32_t *sums, size_t sums_bytes);
/* y[m][N] f32 = x[m][K] . W^T through the Q8 integer path, exactly as FORMATS.md 3.2 writes it:
 * the reference GPU results are checked against. x_bytes and y_bytes are the sizes of x and y:
 * at least m * K * 4 and m * N * 4. */
PQ2_API pq2_status pq2_matmul_host(const pq2_weights *w, const float *x, size_t x_bytes, int64_t m,
                                   float *y, size_t y_bytes);

/* ---- CUDA (device memory; PQ2_ERR_NO_CUDA without CUDA) ---- */
/* One-time setup for the current device (kernel attributes, device properties). Optional:
 * every entry point calls it on first use, but a host that captures CUDA graphs should call it
 * once before capture. */
PQ2_API pq2_status pq2_cuda_init(void);
/* The Q8 operand of a matmul on activations x[m][k] (device memory; FORMATS.md 3.1, 3.3):
 * what pq2_quantize_q8_cuda and the fused producers below write and pq2_matmul_q8_cuda reads.
 *   q8, scales, sums  the group-128 Q8: q8[m][k] in plane order, scales[m][k/128] fp32,
 *                     sums[m][k/128] int32 (q8 16-byte aligned, the others 4)
 *   kernel_operand    NULL, or pq2_q8_kernel_operand_bytes(m, k) bytes (16-byte aligned) that
 *                     a writer fills with what the matmul kernels read besides (an internal
 *                     format: bit slices at m = 1, token records at 2 <= m <= 8; 0 bytes above).
 *                     Given to pq2_matmul_q8_cuda, it saves the kernel that would derive it: a
 *                     producer writing it is the only kernel before the matmul.
 * At m = 1 with a kernel operand, q8 may be NULL: the m = 1 kernels read only the bit slices,
 * the scales and the sums. */
typedef struct pq2_q8 {
    int8_t *q8;
    float *scales;
    int32_t *sums;
    void *kernel_operand;
} pq2_q8;
/* Bytes of the kernel operand of a Q8 operand of m x k (0 for m > 8). Pure. An m x k whose
 * operand (q8 or kernel operand) would be larger than the address space is refused with
 * PQ2_ERR_SHAPE, as the other size queries refuse theirs. */
PQ2_API pq2_status pq2_q8_kernel_operand_bytes(int64_t m, int64_t k, size_t *bytes);
/* Group-128 Q8 of x[m][k] on the GPU into *out, bit-exact with pq2_quantize_q8_host. x is f32,
 * f16 or bf16 by x_dtype; x 16-byte aligned, rows contiguous. */
PQ2_API pq2_status pq2_quantize_q8_cuda(const void *x, int32_t x_dtype, int64_t m, int64_t k,
                                        const pq2_q8 *out, void *stream);
/* Launch configuration of a matmul. Hosts normally pass NULL and get the dispatcher's choice
 * (a table tuned per shape and m, with a fallback for other shapes); the tuner and tests pass
 * explicit values. A configuration outside its family's fields below is refused with
 * PQ2_ERR_INVALID_ARGUMENT; one the build has no kernel for, or that does not fit the device, with
 * PQ2_ERR_UNSUPPORTED; both name the values. The fields per family:
 *
 *  field         PQ2_FAMILY_ROWBLOCK (m <= 16; planes, tiles)    PQ2_FAMILY_GEMM (any m; tiles)
 *  row_subtiles  16-row sub-tiles per row block: 1, 2, 4 (*)    8 (128 weight rows per block)
 *  tokens        0                                               tokens per block: 32, 64, 128
 *  warps         warps per block, 1..16                          8
 *  unroll        128-groups per register batch or ring slot:     1
 *                1, 2 or 4
 *  stages        1: load a register batch, then compute it;      depth of the shared-memory
 *                2: two batches, the next loading during the     pipeline (cp.async): 2..4
 *                compute; 3..8 (sm_90, TILES): a per-warp ring
 *                of that many slots filled by bulk copies
 *  blocks        0: one block per row block; 1..32 (TILES,       0
 *                stages 1-2): a persistent grid of at most
 *                that many blocks per multiprocessor
 *  splits        0 or 1: none; 2..16 (stages 1-2, blocks 0):     0 or 1: none; 2..16: the
 *                a row block's groups split over that many       128-groups split over that
 *                blocks, the last to finish adding the           many blocks, added the same
 *                partials in split order (deterministic;         way
 *                needs workspace)
 * PQ2_FAMILY_GEMM_SM90 (any m; tiles; compute capability 9.0 and a build with sm_90a; k a
 * multiple of 512 below 2^31; a pq2_matmul_q8_cuda operand's scales and sums 16-byte aligned):
 * the fields of PQ2_FAMILY_GEMM with tokens 32, 64, 96 or 128 and stages 3..6 (the depth of a TMA
 * pipeline fed by a producer warp), and blocks 0 (a block per tile) or 1..4 with splits 0 or 1:
 * a stream-K grid of that many blocks per multiprocessor sharing the tiles' 128-groups evenly, a
 * tile several blocks share added by the last of them in block order (deterministic; needs
 * workspace; tiles x k/128 below 2^31; one block per multiprocessor is resident at 64 tokens and
 * up, two at 32, so more run in waves). warps 8 (unroll 1): the two consumer warpgroups and a
 * producer warp; warps 12 (blocks 0, tokens 96 or 128): a producer warpgroup that gives its
 * registers to the consumers, and with unroll 2 (tokens 96) two 128-groups per consumer iteration,
 * one promoted while the next multiplies; every shape gives the same bits. Where it does not serve,
 * the dispatcher passes its table lines by, and a misaligned operand falls back to PQ2_FAMILY_GEMM
 * (the dispatcher's workspace size covers both); an explicit one is refused.
 * (*) TILES: any whatever the file's tile height rt (above rt "coarse rows": a block takes
 * several tile rows; below, "fine rows": part of one), except with stages >= 3 (= rt).
 * ROWBLOCK at m > 8 also holds a block's activation scales and sums in shared memory, 128 bytes
 * per 128-group (of k/128, or of a split's share): the default configuration fits up to k of
 * about 200000 on sm_90.
 *
 * ROWBLOCK: one block per row block, its warps splitting the 128-groups and loading the codes
 * straight into registers (decode batches: the weights dominate). GEMM, GEMM_SM90: blocks of 128
 * weight rows x `tokens` tokens, the codes and the activations staged in shared memory and
 * multiplied on the int8 tensor cores (mma.sync; wgmma), the partial products promoted to fp32
 * with both scales per group (prefill: the arithmetic dominates); for the same tokens and splits
 * both give the same bits. ARCHITECTURE.md says why each is built so. */
#define PQ2_FAMILY_ROWBLOCK 1
#define PQ2_FAMILY_GEMM 2
#define PQ2_FAMILY_GEMM_SM90 3
typedef struct pq2_matmul_config {
    int32_t family; /* PQ2_FAMILY_ROWBLOCK, PQ2_FAMILY_GEMM or PQ2_FAMILY_GEMM_SM90 */
    int32_t row_subtiles;
    int32_t tokens;
    int32_t warps;
    int32_t unroll;
    int32_t stages;
    int32_t blocks;
    int32_t splits;
} pq2_matmul_config;

/* The configuration the dispatcher picks for this problem (writes *cfg). Pure. */
PQ2_API pq2_status pq2_matmul_config_for(const pq2_weights *w, int64_t m, pq2_matmul_config *cfg);
/* Workspace bytes pq2_matmul_cuda / pq2_matmul_q8_cuda need for this problem with cfg (NULL =
 * the dispatcher's choice). Pure: depends only on its arguments and the device. */
PQ2_API pq2_status pq2_matmul_workspace_size(const pq2_weights *w, int64_t m,
                                             const pq2_matmul_config *cfg, size_t *bytes);
/* y[m][N] (y_dtype) = x[m][K] (x_dtype) . W^T with W in PLANES or TILES layout on the device.
 * Quantises x to Q8 inside the call (into the workspace), accumulates in fp32; any m >= 1: the
 * row-block family up to PQ2_ROWBLOCK_MAX_M, the GEMM family (TILES only) above. No allocation,
 * synchronisation or host<->device copy: safe to capture in a CUDA graph. Deterministic: the same
 * inputs and configuration give the same bits on every run. Pointers 16-byte aligned (x, y,
 * weights), workspace 256-byte aligned with at least pq2_matmul_workspace_size() bytes; the
 * workspace holds no state between calls. Stream order (compute capability 9.0): the call's kernels
 * are programmatic dependents of the kernel before them, so they start streaming the WEIGHTS before
 * that kernel has finished; x, the workspace and y are ordered as usual (x may be prefetched into
 * L2 early, which reads nothing the call uses before that kernel has finished). Do not write the
 * weights in the kernel launched right before the call on the same stream; weights written earlier
 * (by a copy, or by a kernel with at least one other kernel after it before the call) are safe.
 * pq2_matmul_q8_cuda's matmul is such a dependent too (of the caller's kernel that made its Q8
 * operand, or of its own small kernel), except after the memset that clears a split configuration's
 * counters. */
PQ2_API pq2_status pq2_matmul_cuda(const pq2_weights *w, const void *x, int32_t x_dtype, void *y,
                                   int32_t y_dtype, int64_t m, const pq2_matmul_config *cfg,
                                   void *workspace, size_t workspace_bytes, void *stream);
/* The same product on a Q8 operand made upstream (pq2_quantize_q8_cuda or a fused producer),
 * for the same m and k = W's. Without a kernel operand, at m <= 8 this call first makes it in
 * the workspace with one small kernel (inside pq2_matmul_cuda the quantiser writes it), chained
 * as pq2_matmul_cuda chains its quantiser and matmul (see there: the weights must not be
 * written by the kernel launched right before); with one, the matmul is the call's only
 * kernel. */
PQ2_API pq2_status pq2_matmul_q8_cuda(const pq2_weights *w, const pq2_q8 *x, void *y,
                                      int32_t y_dtype, int64_t m, const pq2_matmul_config *cfg,
                                      void *workspace, size_t workspace_bytes, void *stream);

/* ---- the rotation and the rest of the weight path (CUDA) ----
 * The Prism Hadamard rotation of Ternary-Bonsai-2 files (FORMATS.md): a folded weight W' = W
 * diag(s) H reads x' = H_B(s * x): signs s over the whole width, then the normalised
 * Walsh-Hadamard transform (Sylvester order) on every block of B elements. The inverse is
 * h = s * (H_B z). A rotation is its block size and the width's sign vector. */
typedef struct pq2_rotation {
    int32_t block;       /* B: a power of two, 64..4096, dividing the width */
    const int8_t *signs; /* [width] of +1 / -1, device memory; NULL: all +1 (sign_mode identity) */
} pq2_rotation;
#define PQ2_ROTATE_INVERSE 1

/* y[m][width] = H_B(s * x) (flags 0) or s * (H_B x) (PQ2_ROTATE_INVERSE). x and y f32, f16 or
 * bf16, 16-byte aligned, width % 128 == 0; y == x (same dtype) rotates in place, any other
 * overlap is refused. */
PQ2_API pq2_status pq2_rotate_cuda(const void *x, int32_t x_dtype, void *y, int32_t y_dtype,
                                   int64_t m, int64_t width, const pq2_rotation *rot, int32_t flags,
                                   void *stream);

/* The producers of a matmul's Q8 operand, each one kernel: a source, then the rotation (rot
 * NULL: none), then the Q8 operand exactly as pq2_quantize_q8_cuda would write it of the same
 * rotated values (bit-identical), kernel operand included when out has one: so a producer then
 * pq2_matmul_q8_cuda is two kernels per projection, and one producer serves every weight that
 * reads the same activation. Inputs of dtype (f32, f16, bf16) are 16-byte aligned, rows
 * contiguous; width % 128 == 0. Each is a programmatic dependent of the kernel before it (it
 * reads its inputs after that kernel has finished) and lets the matmul after it start
 * streaming weights. */

/* h = x + residual (residual NULL: h = x), written to h_out unless NULL (h_out must not overlap
 * x or residual); then RMSNorm: n = h / sqrt(mean(h^2) + eps) * norm_weight (norm_dtype), written
 * un-rotated to normed (normed_dtype) unless NULL, for the consumers that read the un-folded
 * activation; then rotate n and quantise it into *out. */
PQ2_API pq2_status pq2_norm_rotate_q8_cuda(const void *x, const void *residual, void *h_out,
                                           int32_t dtype, const void *norm_weight,
                                           int32_t norm_dtype, float eps, int64_t m, int64_t width,
                                           const pq2_rotation *rot, const pq2_q8 *out, void *normed,
                                           int32_t normed_dtype, void *stream);
/* silu(gate) * up (gate and up: rows of ld elements, e.g. the two halves of a fused gate_up
 * output with ld = 2 * width), rotated and quantised into *out. */
PQ2_API pq2_status pq2_swiglu_rotate_q8_cuda(const void *gate, const void *up, int64_t ld,
                                             int32_t dtype, int64_t m, int64_t width,
                                             const pq2_rotation *rot, const pq2_q8 *out,
                                             void *stream);
/* x, first permuted from the tiled to the grouped V-head order when v_heads > 0 (the
 * gdn_v_grouped contract of FORMATS.md 4, with n_v = v_heads and n_k = k_heads), rotated and
 * quantised into *out. The permutation needs v_heads a multiple of k_heads, width / v_heads a
 * multiple of 4 and width <= 2^31 - 1 (PQ2_ERR_SHAPE). */
PQ2_API pq2_status pq2_rotate_q8_cuda(const void *x, int32_t dtype, int64_t m, int64_t width,
                                      const pq2_rotation *rot, int32_t v_heads, int32_t k_heads,
                                      const pq2_q8 *out, void *stream);

/* The gated RMSNorm of a Gated-DeltaNet layer's output, then as pq2_rotate_q8_cuda: per row and
 * V head j of hd = width / v_heads elements (a power of two, 4..128), y = o_j / sqrt(mean(o_j^2)
 * + eps) * norm_weight * silu(z_j); o f32 rows of width elements, z rows of ld_z elements of
 * z_dtype (e.g. a column range of a fused output; ld_z >= width and a multiple of 8),
 * norm_weight [hd] of norm_dtype, all three 16-byte aligned; then y permuted from the tiled to
 * the grouped V-head order when k_heads > 0 (v_heads a multiple of k_heads; k_heads 0: none),
 * rotated and quantised into *out. width <= 2^31 - 1. */
PQ2_API pq2_status pq2_gated_norm_rotate_q8_cuda(const void *o, const void *z, int64_t ld_z,
                                                 int32_t z_dtype, const void *norm_weight,
                                                 int32_t norm_dtype, float eps, int64_t m,
                                                 int64_t width, const pq2_rotation *rot,
                                                 int32_t v_heads, int32_t k_heads,
                                                 const pq2_q8 *out, void *stream);

/* out[i][k] = row ids[i] of W (any layout, device memory, 16-byte aligned) dequantised, then,
 * when rot is not NULL, its inverse rotation s * (H_B z) (the token embedding of a folded file).
 * out f32, f16 or bf16, 16-byte aligned. An id outside 0..N-1 gives a row of NaN. */
PQ2_API pq2_status pq2_get_rows_cuda(const pq2_weights *w, const int32_t *ids, int64_t n_ids,
                                     void *out, int32_t out_dtype, const pq2_rotation *rot,
                                     void *stream);
/* out[N][K] = W (any layout, device memory) dequantised (FORMATS.md 1.1), exact in every dtype
 * that holds the value (f32 always), else rounded to nearest even. W's data and out 16-byte
 * aligned; K at most 65535 * 2048. */
PQ2_API pq2_status pq2_dequantize_cuda(const pq2_weights *w, void *out, int32_t out_dtype,
                                       void *stream);

/* ---- attention decode over a KV cache (CUDA) ----
 * The streaming part of a decode step's attention (flash-decoding): for each sequence b, KV head
 * h and chunk c of `chunk` cache positions, the partial softmax sums of h's group of query heads
 * over the positions of c up to positions[b] (each query attends to positions 0..positions[b],
 * which the caches already hold). A host merges the chunks 0..positions[b] / chunk of each query
 * head: out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c, M = max_c m_c. Scores are
 * scale * q.k with q and k in bf16 and fp32 sums; the softmax weights are rounded to bf16 before
 * they multiply v (fp32 sums). Deterministic: a fixed order of sums. Slots of chunks past
 * positions[b] / chunk are not written. Needs compute capability 8.0 (bf16 mma.sync, ldmatrix,
 * cp.async); a programmatic dependent of the kernel before it (reads after it has finished). */
#define PQ2_ATTENTION_MIN_HEAD_DIM 32  /* head widths served: the powers of two from ... */
#define PQ2_ATTENTION_MAX_HEAD_DIM 256 /* ... to this */
#define PQ2_ATTENTION_MAX_GROUP 8      /* query heads per KV head, at most */

typedef struct pq2_attention_decode {
    int32_t dtype;            /* of q and both caches: PQ2_DTYPE_BF16 (the only one served) */
    const void *q;            /* [batch][n_head][head_dim], contiguous, 16-byte aligned: the queries
                                 as they meet the keys (normed and rotated) */
    const void *k_cache;      /* element (b, h, s, d) at b * stride_b + h * stride_h + s * stride_s
                                 + d, 16-byte aligned */
    const void *v_cache;      /* the same strides, 16-byte aligned */
    const int64_t *positions; /* [batch]: 0 <= positions[b] < chunks * chunk, within the caches */
    float *m;                 /* [batch][n_head][n_chunks]: the slot's largest score */
    float *l;                 /* [batch][n_head][n_chunks]: sum of exp(score - m) */
    float *acc;               /* [batch][n_head][n_chunks][head_dim]: sum of exp(score - m) v */
    int64_t batch;            /* 1..65535 */
    int64_t n_head;           /* query heads: n_head_kv * group, group 1..PQ2_ATTENTION_MAX_GROUP;
                                 query head h reads KV head h / group */
    int64_t n_head_kv;        /* 1..65535 */
    int64_t head_dim;         /* a power of two, PQ2_ATTENTION_MIN_HEAD_DIM..MAX_HEAD_DIM */
    int64_t stride_b, stride_h, stride_s; /* the caches' element strides: multiples of 8, >= 0;
                                            head_dim <= stride_s, chunk * stride_s < 2^31 */
    int64_t n_chunks; /* slots per (sequence, query head) in m, l and acc: >= chunks */
    int64_t chunks;   /* chunks launched per (sequence, KV head) */
    int64_t chunk;    /* positions per chunk: a multiple of 32, 32..65536 */
    float scale;      /* the scores' factor, finite */
} pq2_attention_decode;

PQ2_API pq2_status pq2_attention_decode_cuda(const pq2_attention_decode *a, void *stream);

/* PQ2_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PQ2_H */

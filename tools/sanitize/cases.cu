// cases.cu - small calls of every libpq2 CUDA kernel family, for compute-sanitizer (memcheck,
// racecheck, initcheck, synccheck): run_sanitizers.sh builds and runs it. Inputs are
// initialised, workspaces and outputs are not (initcheck then reports any read of memory no
// kernel wrote). The values do not matter here; the pytest suites check them.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pq2.h"

namespace {

int failures = 0;

void check(const char *what, pq2_status st)
{
    if (st != PQ2_OK) {
        std::printf("FAIL %s: %s %s\n", what, pq2_status_name(st), pq2_last_error());
        ++failures;
    }
}

void cuda_check(const char *what, cudaError_t e)
{
    if (e != cudaSuccess) {
        std::printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

// Device memory filled with a deterministic byte pattern (or left unwritten).
void *device_bytes(size_t bytes, bool fill)
{
    void *p = nullptr;
    cuda_check("cudaMalloc", cudaMalloc(&p, bytes < 256 ? 256 : bytes));
    if (fill) {
        std::vector<unsigned char> h(bytes);
        unsigned s = 12345;
        for (size_t i = 0; i < bytes; ++i)
            h[i] = (unsigned char)((s = s * 1103515245u + 12345u) >> 16);
        cuda_check("cudaMemcpy", cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
    }
    return p;
}

// A weight matrix with finite fp16 scales: random codes, every scale 1.0 (0x3c00).
pq2_weights weights(int64_t n, int64_t k, int32_t layout, int32_t rt)
{
    size_t bytes = 0;
    check("pq2_layout_bytes", pq2_layout_bytes(layout, n, k, rt, &bytes));
    std::vector<unsigned char> raw((size_t)(n * k / 128) * 34);
    unsigned s = 777;
    for (size_t b = 0; b < raw.size(); b += 34) {
        raw[b] = 0x00, raw[b + 1] = 0x3c;
        for (int i = 2; i < 34; ++i) raw[b + i] = (unsigned char)((s = s * 1103515245u + 1u) >> 16);
    }
    std::vector<unsigned char> host(bytes);
    pq2_weights src = {raw.data(), raw.size(), n, k, PQ2_LAYOUT_RAW, 0};
    check("pq2_convert_layout", pq2_convert_layout(&src, host.data(), bytes, layout, rt));
    void *d = device_bytes(bytes, false);
    cuda_check("cudaMemcpy", cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice));
    return pq2_weights{d, bytes, n, k, layout, rt};
}

// Floats in [-1, 1) as f32 (the dtype every case uses).
void *device_floats(size_t count)
{
    std::vector<float> h(count);
    unsigned s = 99;
    for (size_t i = 0; i < count; ++i)
        h[i] = (float)((s = s * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
    void *d = device_bytes(count * 4, false);
    cuda_check("cudaMemcpy", cudaMemcpy(d, h.data(), count * 4, cudaMemcpyHostToDevice));
    return d;
}

void matmul(const char *what, const pq2_weights &w, int64_t m, const pq2_matmul_config *cfg)
{
    size_t ws_bytes = 0;
    check("workspace size", pq2_matmul_workspace_size(&w, m, cfg, &ws_bytes));
    void *x = device_floats((size_t)(m * w.k));
    void *y = device_bytes((size_t)(m * w.n) * 4, false);
    void *ws = device_bytes(ws_bytes, false);
    check(what,
          pq2_matmul_cuda(&w, x, PQ2_DTYPE_F32, y, PQ2_DTYPE_F32, m, cfg, ws, ws_bytes, nullptr));
    cuda_check(what, cudaDeviceSynchronize());
    cudaFree(x), cudaFree(y), cudaFree(ws);
}

struct q8_operand {
    pq2_q8 op;
    void *mem[4];
};

q8_operand make_q8(int64_t m, int64_t k, bool kernel_operand)
{
    q8_operand o = {};
    size_t kob = 0;
    check("kernel operand bytes", pq2_q8_kernel_operand_bytes(m, k, &kob));
    o.mem[0] = device_bytes((size_t)(m * k), false);
    o.mem[1] = device_bytes((size_t)(m * k / 128) * 4, false);
    o.mem[2] = device_bytes((size_t)(m * k / 128) * 4, false);
    o.mem[3] = kernel_operand && kob ? device_bytes(kob, false) : nullptr;
    o.op = {static_cast<int8_t *>(o.mem[0]), static_cast<float *>(o.mem[1]),
            static_cast<int32_t *>(o.mem[2]), o.mem[3]};
    return o;
}

void free_q8(q8_operand &o)
{
    for (void *p : o.mem)
        if (p) cudaFree(p);
}

// A producer's Q8 operand into pq2_matmul_q8_cuda.
void producer_then_matmul(const pq2_weights &w, int64_t m, const pq2_rotation &rot)
{
    const int64_t k = w.k;
    q8_operand o = make_q8(m, k, true);
    void *x = device_floats((size_t)(m * k)), *res = device_floats((size_t)(m * k));
    void *h = device_bytes((size_t)(m * k) * 4, false),
         *normed = device_bytes((size_t)(m * k) * 4, false);
    void *nw = device_floats((size_t)k);
    check("norm_rotate_q8",
          pq2_norm_rotate_q8_cuda(x, res, h, PQ2_DTYPE_F32, nw, PQ2_DTYPE_F32, 1e-6f, m, k, &rot,
                                  &o.op, normed, PQ2_DTYPE_F32, nullptr));
    size_t ws_bytes = 0;
    check("workspace size", pq2_matmul_workspace_size(&w, m, nullptr, &ws_bytes));
    void *y = device_bytes((size_t)(m * w.n) * 4, false), *ws = device_bytes(ws_bytes, false);
    check("matmul_q8 after producer",
          pq2_matmul_q8_cuda(&w, &o.op, y, PQ2_DTYPE_F32, m, nullptr, ws, ws_bytes, nullptr));
    cuda_check("producer + matmul_q8", cudaDeviceSynchronize());
    for (void *p : {x, res, h, normed, nw, y, ws}) cudaFree(p);
    free_q8(o);
}

}  // namespace

int main()
{
    check("pq2_cuda_init", pq2_cuda_init());
    const pq2_weights tiles = weights(160, 384, PQ2_LAYOUT_TILES, 2);
    const pq2_weights planes = weights(160, 384, PQ2_LAYOUT_PLANES, 0);
    // Row-block family: every token class on both layouts; GEMM family: tuned choice, a split,
    // every token tile.
    for (int64_t m : {1, 2, 5, 9, 16}) {
        char what[64];
        std::snprintf(what, sizeof what, "rowblock tiles m=%lld", (long long)m);
        matmul(what, tiles, m, nullptr);
        std::snprintf(what, sizeof what, "rowblock planes m=%lld", (long long)m);
        matmul(what, planes, m, nullptr);
    }
    for (int64_t m : {17, 40, 130}) matmul("gemm tuned", tiles, m, nullptr);
    for (int32_t tokens : {32, 64, 128}) {
        const pq2_matmul_config cfg = {PQ2_FAMILY_GEMM, 8, tokens, 8, 1, 2, 0, 3};
        matmul("gemm split 3", tiles, 70, &cfg);
    }
    // The sm_90a GEMM (k a multiple of 512; a compute capability 9.0 device): the dispatcher's
    // choice, every token tile with the shallowest and deepest pipeline, with and without splits.
    const pq2_weights tiles512 = weights(160, 512, PQ2_LAYOUT_TILES, 2);
    int dev = 0, major = 0;
    cuda_check("device", cudaGetDevice(&dev));
    cuda_check("cc", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major == 9) {
        matmul("gemm sm90 tuned", tiles512, 300, nullptr);
        for (int32_t tokens : {32, 64, 96, 128})
            for (int32_t stages : {3, 6})
                for (int32_t splits : {1, 2}) {
                    const pq2_matmul_config cfg = {
                        PQ2_FAMILY_GEMM_SM90, 8, tokens, 8, 1, stages, 0, splits};
                    matmul("gemm sm90", tiles512, 130, &cfg);
                }
        // Stream-K grids: 2000 rows x 300 tokens of 4 groups (at 32 tokens 640 units on 132 or
        // 264 blocks): blocks of several segments, whole tiles and tiles shared by 2-4 blocks.
        const pq2_weights wide512 = weights(2000, 512, PQ2_LAYOUT_TILES, 2);
        for (int32_t tokens : {32, 64, 128})
            for (int32_t blocks : {1, 2}) {
                const pq2_matmul_config cfg = {PQ2_FAMILY_GEMM_SM90, 8, tokens, 8, 1, 4, blocks, 1};
                matmul("gemm sm90 stream-K", wide512, 300, &cfg);
            }
    }
    // Quantiser alone (the row kernel at m <= 16; the flat one a task per warp at 20, two at
    // 3001: 9003 tasks, more than a wave of resident warps on 132 SMs, an odd count), rotation,
    // producers, lookup, dequantisation.
    const int64_t k = 384;
    for (int64_t m : {1, 4, 20, 3001}) {
        q8_operand o = make_q8(m, k, true);
        void *x = device_floats((size_t)(m * k));
        check("quantize_q8", pq2_quantize_q8_cuda(x, PQ2_DTYPE_F32, m, k, &o.op, nullptr));
        cuda_check("quantize_q8", cudaDeviceSynchronize());
        cudaFree(x);
        free_q8(o);
    }
    std::vector<signed char> hs(4096);
    for (size_t i = 0; i < hs.size(); ++i) hs[i] = (i * 7 % 3) ? 1 : -1;
    void *signs = device_bytes(hs.size(), false);
    cuda_check("signs", cudaMemcpy(signs, hs.data(), hs.size(), cudaMemcpyHostToDevice));
    const pq2_rotation rot = {128, static_cast<const int8_t *>(signs)};
    for (int64_t m : {1, 3}) producer_then_matmul(tiles, m, rot);
    {
        const int64_t m = 3, width = 4096 + 1024;  // two tiles of a 1024-block rotation
        const pq2_rotation big = {1024, nullptr};
        void *x = device_floats((size_t)(m * width)),
             *y = device_bytes((size_t)(m * width) * 4, false);
        check("rotate",
              pq2_rotate_cuda(x, PQ2_DTYPE_F32, y, PQ2_DTYPE_F32, m, width, &big, 0, nullptr));
        check("rotate inverse in place", pq2_rotate_cuda(y, PQ2_DTYPE_F32, y, PQ2_DTYPE_F32, m,
                                                         width, &big, PQ2_ROTATE_INVERSE, nullptr));
        q8_operand o = make_q8(m, width, true);
        void *up = device_floats((size_t)(m * width));
        check("swiglu_rotate_q8", pq2_swiglu_rotate_q8_cuda(x, up, width, PQ2_DTYPE_F32, m, width,
                                                            &big, &o.op, nullptr));
        check("rotate_q8 permuted",
              pq2_rotate_q8_cuda(x, PQ2_DTYPE_F32, m, width, &big, 40, 8, &o.op, nullptr));
        check("gated_norm_rotate_q8 permuted",
              pq2_gated_norm_rotate_q8_cuda(x, up, width, PQ2_DTYPE_F32, up, PQ2_DTYPE_F32, 1e-6f,
                                            m, width, &big, 40, 8, &o.op, nullptr));
        check("norm_rotate_q8 B 1024",
              pq2_norm_rotate_q8_cuda(x, up, y, PQ2_DTYPE_F32, up, PQ2_DTYPE_F32, 1e-6f, m, width,
                                      &big, &o.op, nullptr, PQ2_DTYPE_F32, nullptr));
        {  // grids larger than the device holds at once (300 rows): the RMSNorm a block per row
           // (5 tiles), and a block per tile with the pass 2 loads deep (rows of 9 tiles)
            const int64_t rows = 300, wide = 9216;
            q8_operand big_o = make_q8(rows, wide, true);
            void *bx = device_floats((size_t)(rows * wide)),
                 *bh = device_bytes((size_t)(rows * wide) * 4, false);
            for (int64_t w : {5120, 9216})
                check(w == 5120 ? "norm_rotate_q8 300 rows of 5120 (a block per row)"
                                : "norm_rotate_q8 300 rows of 9216 (2 loads deep)",
                      pq2_norm_rotate_q8_cuda(bx, bx, bh, PQ2_DTYPE_F32, bx, PQ2_DTYPE_F32, 1e-6f,
                                              rows, w, &big, &big_o.op, nullptr, PQ2_DTYPE_F32,
                                              nullptr));
            for (void *p : {bx, bh}) cudaFree(p);
            free_q8(big_o);
        }
        // the Hadamard's cross-warp stages: one exchange (B 256, 512), one per stage (B 2048)
        for (int32_t b : {256, 512, 2048}) {
            const pq2_rotation r = {b, nullptr};
            check("rotate B",
                  pq2_rotate_cuda(x, PQ2_DTYPE_F32, y, PQ2_DTYPE_F32, m, 4096, &r, 0, nullptr));
        }
        cuda_check("row transforms", cudaDeviceSynchronize());
        for (void *p : {x, y, up}) cudaFree(p);
        free_q8(o);
    }
    {
        const int32_t hid[4] = {0, 159, 7, 160};  // 160: out of range, a NaN row
        void *ids = device_bytes(sizeof hid, false);
        cuda_check("ids", cudaMemcpy(ids, hid, sizeof hid, cudaMemcpyHostToDevice));
        void *out = device_bytes(4 * 384 * 4, false);
        check("get_rows", pq2_get_rows_cuda(&tiles, static_cast<const int32_t *>(ids), 4, out,
                                            PQ2_DTYPE_F32, &rot, nullptr));
        void *dense = device_bytes(160 * 384 * 2, false);
        check("dequantize", pq2_dequantize_cuda(&planes, dense, PQ2_DTYPE_BF16, nullptr));
        check("dequantize tiles", pq2_dequantize_cuda(&tiles, dense, PQ2_DTYPE_F16, nullptr));
        // raw blocks (2-byte aligned code words), k past one 2048-element chunk, f32
        const pq2_weights raw = weights(37, 2176, PQ2_LAYOUT_RAW, 0);
        void *dense_raw = device_bytes(37 * 2176 * 4, false);
        check("dequantize raw", pq2_dequantize_cuda(&raw, dense_raw, PQ2_DTYPE_F32, nullptr));
        cuda_check("lookup", cudaDeviceSynchronize());
        for (void *p : {ids, out, dense, dense_raw, const_cast<void *>(raw.data)}) cudaFree(p);
    }
    {
        // attention decode: 3 sequences, positions at a chunk's start, inside and at the end of
        // the cache; head widths 128 (group 3) and 256 (group 8); the caches' rows random bytes
        const int64_t pos[3] = {0, 299, 599}, batch = 3, kvh = 2, context = 600, chunk = 256;
        void *positions = device_bytes(sizeof pos, false);
        cuda_check("positions", cudaMemcpy(positions, pos, sizeof pos, cudaMemcpyHostToDevice));
        for (int64_t d : {128, 256}) {
            const int64_t group = d == 128 ? 3 : 8, heads = kvh * group, n_chunks = 3;
            void *q = device_bytes((size_t)(batch * heads * d * 2), true);
            void *k = device_bytes((size_t)(batch * kvh * context * d * 2), true);
            void *v = device_bytes((size_t)(batch * kvh * context * d * 2), true);
            void *m = device_bytes((size_t)(batch * heads * n_chunks * 4), false);
            void *l = device_bytes((size_t)(batch * heads * n_chunks * 4), false);
            void *acc = device_bytes((size_t)(batch * heads * n_chunks * d * 4), false);
            pq2_attention_decode a = {};
            a.dtype = PQ2_DTYPE_BF16, a.q = q, a.k_cache = k, a.v_cache = v;
            a.positions = static_cast<const int64_t *>(positions);
            a.m = static_cast<float *>(m), a.l = static_cast<float *>(l);
            a.acc = static_cast<float *>(acc);
            a.batch = batch, a.n_head = heads, a.n_head_kv = kvh, a.head_dim = d;
            a.stride_b = kvh * context * d, a.stride_h = context * d, a.stride_s = d;
            a.n_chunks = n_chunks, a.chunks = 3, a.chunk = chunk, a.scale = 0.0625f;
            check(d == 128 ? "attention decode d 128" : "attention decode d 256",
                  pq2_attention_decode_cuda(&a, nullptr));
            cuda_check("attention", cudaDeviceSynchronize());
            for (void *p : {q, k, v, m, l, acc}) cudaFree(p);
        }
        cudaFree(positions);
    }
    std::printf("%s: %d failing calls\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}

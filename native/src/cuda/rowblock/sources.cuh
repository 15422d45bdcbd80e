// sources.cuh - where a lane's weight bytes come from: the register batch a warp loads, and one
// weight source per layout (tiles, planes) and per row-block height relative to the file's tile
// height (coarse and fine rows). Every source gives the same batch: per sub-tile the lane's 16
// code bytes in MMA A-fragment order and its two rows' scales as one word.
#pragma once

#include <type_traits>

#include "device/ptx.cuh"
#include "rowblock/problem.cuh"

// The weight bytes of up to U units for one lane: per sub-tile its 16 code bytes as the four
// words of its A fragment, (row gid, row gid+8) x (code bytes tq*8..+3, tq*8+4..+7) (the tiles
// lane order, FORMATS.md), and the scale word of rows gid (low half) and gid+8 (high half).
template <int RS, int U> struct batch {
    uint4 codes[U][RS];
    uint32_t scales[U][RS];
};

// Calls load(u, r) for sub-tile r of units u in [0, n) of a batch of U (every weight source's
// loop).
template <int RS, int U, class F> __device__ __forceinline__ void for_each_load(int n, F load)
{
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RS; ++r)
            if (u < n) load(u, r);
}

// Loads units [0, n) of a batch starting at unit pointer `codes` (already + lane*16) and scale
// word pointer `scales` (already + gid). Units are RS*512 code bytes and RS*8 scale words apart.
template <int RS, int U>
__device__ __forceinline__ void load_batch(batch<RS, U> &b, const uint8_t *codes,
                                           const uint32_t *scales, int n)
{
    for_each_load<RS, U>(n, [&](int u, int r) {
        b.codes[u][r] = ld_stream16(codes + (u * RS + r) * 512);
        b.scales[u][r] = ld_stream4(scales + (u * RS + r) * 8);
    });
}

// Where a lane's weight bytes come from. TILES: the units are one contiguous stream (unit u at
// u*RS*512 code bytes, u*RS*8 scale words). PLANES: per sub-tile the lane's two rows of the code
// plane (8 bytes of each per group) and of the fp16 scale plane; rows past n re-read row n-1
// (their results are never stored).
template <int LAYOUT, int RS, int U> struct weight_src;

template <int RS, int U> struct weight_src<PQ2_LAYOUT_TILES, RS, U> {
    const uint8_t *codes;    // + lane*16
    const uint32_t *scales;  // + gid
    // Row block rb, the warp's groups from g_begin: flat unit rb*G + g_begin.
    __device__ weight_src(const pq2_rowblock_problem &p, int rb, int g_begin, int lane)
        : codes(p.codes + ((size_t)rb * (size_t)(p.k >> 7) + g_begin) * (RS * 512) + lane * 16),
          scales(reinterpret_cast<const uint32_t *>(p.wscales) +
                 ((size_t)rb * (size_t)(p.k >> 7) + g_begin) * (RS * 8) + (lane >> 2))
    {
    }
    // Units [i, i+n) of the warp's range into b.
    __device__ __forceinline__ void load(batch<RS, U> &b, int i, int n) const
    {
        load_batch<RS, U>(b, codes + (size_t)i * (RS * 512), scales + i * (RS * 8), n);
    }
    // Running pointers: unit 0 becomes unit `units`.
    __device__ __forceinline__ void advance(int units)
    {
        codes += units * (RS * 512), scales += units * (RS * 8);
    }
};

// Coarse rows (row blocks of several tile rows: RS a multiple of the file's tile height LR): row
// block rb takes tile rows rb*H .. rb*H + H - 1 (H = RS / LR), sub-tile r from tile row r / LR,
// so each activation fragment serves RS sub-tiles instead of LR. Tile rows past the file's last
// re-read the last one (their rows are past n and never stored).
template <int RS, int U, int LR> struct coarse_src {
    static_assert(RS % LR == 0 && RS > LR, "a coarse row block takes whole tile rows");
    static constexpr int H = RS / LR;
    const uint8_t *codes[H];    // + lane*16
    const uint32_t *scales[H];  // + gid
    __device__ coarse_src(const pq2_rowblock_problem &p, int rb, int g_begin, int lane)
    {
        const int64_t G = p.k >> 7, tile_rows = pq2_rowblock_row_blocks(p.n, LR);
#pragma unroll
        for (int h = 0; h < H; ++h) {
            const size_t unit =
                (size_t)min((int64_t)rb * H + h, tile_rows - 1) * (size_t)G + g_begin;
            codes[h] = p.codes + unit * (LR * 512) + lane * 16;
            scales[h] =
                reinterpret_cast<const uint32_t *>(p.wscales) + unit * (LR * 8) + (lane >> 2);
        }
    }
    __device__ __forceinline__ void load(batch<RS, U> &b, int i, int n) const
    {
        for_each_load<RS, U>(n, [&](int u, int r) {
            b.codes[u][r] =
                ld_stream16(codes[r / LR] + (size_t)(i + u) * (LR * 512) + (r % LR) * 512);
            b.scales[u][r] = ld_stream4(scales[r / LR] + (i + u) * (LR * 8) + (r % LR) * 8);
        });
    }
    __device__ __forceinline__ void advance(int units)
    {
#pragma unroll
        for (int h = 0; h < H; ++h) codes[h] += units * (LR * 512), scales[h] += units * (LR * 8);
    }
};

// Fine rows (row blocks of part of a tile row: the file's tile height LR a multiple of RS): row
// block rb takes sub-tiles (rb % H) * RS .. + RS - 1 of tile row rb / H (H = LR / RS); a warp's
// units are then RS * 512 contiguous bytes every LR * 512. The fallback of tiles rt 4 files at
// m > 8, where an rt 4 row block needs more registers than a block of 512 threads has.
template <int RS, int U, int LR> struct fine_src {
    static_assert(LR % RS == 0 && LR > RS, "a fine row block takes part of one tile row");
    static constexpr int H = LR / RS;
    const uint8_t *codes;    // + lane*16
    const uint32_t *scales;  // + gid
    __device__ fine_src(const pq2_rowblock_problem &p, int rb, int g_begin, int lane)
    {
        const size_t unit = (size_t)(rb / H) * (size_t)(p.k >> 7) + g_begin;
        const int part = rb % H;
        codes = p.codes + unit * (LR * 512) + part * (RS * 512) + lane * 16;
        scales = reinterpret_cast<const uint32_t *>(p.wscales) + unit * (LR * 8) + part * (RS * 8) +
                 (lane >> 2);
    }
    __device__ __forceinline__ void load(batch<RS, U> &b, int i, int n) const
    {
        for_each_load<RS, U>(n, [&](int u, int r) {
            b.codes[u][r] = ld_stream16(codes + (size_t)(i + u) * (LR * 512) + r * 512);
            b.scales[u][r] = ld_stream4(scales + (i + u) * (LR * 8) + r * 8);
        });
    }
    __device__ __forceinline__ void advance(int units)
    {
        codes += units * (LR * 512), scales += units * (LR * 8);
    }
};

template <int RS, int U> struct weight_src<PQ2_LAYOUT_PLANES, RS, U> {
    const uint8_t *codes[RS][2];    // rows gid, gid+8 of sub-tile r, + g_begin*32 + tq*8
    const uint16_t *scales[RS][2];  // the same rows, + g_begin
    __device__ weight_src(const pq2_rowblock_problem &p, int rb, int g_begin, int lane)
    {
        const int G = (int)(p.k >> 7);
#pragma unroll
        for (int r = 0; r < RS; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t row =
                    min((int64_t)rb * (16 * RS) + r * 16 + (lane >> 2) + h * 8, p.n - 1);
                codes[r][h] = p.codes + row * (p.k >> 2) + g_begin * 32 + (lane & 3) * 8;
                scales[r][h] = p.wscales + row * G + g_begin;
            }
    }
    __device__ __forceinline__ void load(batch<RS, U> &b, int i, int n) const
    {
        for_each_load<RS, U>(n, [&](int u, int r) {
            const uint2 lo = ld_stream8(codes[r][0] + (unsigned)(i + u) * 32u);
            const uint2 hi = ld_stream8(codes[r][1] + (unsigned)(i + u) * 32u);
            b.codes[u][r] = make_uint4(lo.x, hi.x, lo.y, hi.y);  // fragment order
            // Scales are 2 bytes per row and group: L1-cached, the next groups' share the sector.
            b.scales[u][r] = (uint32_t)__ldg(scales[r][0] + (unsigned)(i + u)) |
                             ((uint32_t)__ldg(scales[r][1] + (unsigned)(i + u)) << 16);
        });
    }
};

// The weight source of a kernel instance: LAYOUT, RS sub-tiles per row block, U units per batch,
// LR the tiles file's tile height (for PLANES equal to RS).
template <int LAYOUT, int RS, int U, int LR>
using weight_source_t =
    std::conditional_t<(LAYOUT == PQ2_LAYOUT_TILES && LR < RS), coarse_src<RS, U, LR>,
                       std::conditional_t<(LAYOUT == PQ2_LAYOUT_TILES && LR > RS),
                                          fine_src<RS, U, LR>, weight_src<LAYOUT, RS, U>>>;

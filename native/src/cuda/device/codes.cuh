// codes.cuh - every place of the CUDA half that knows the GPU order of the 2-bit codes and
// of the activation formats the kernels read from the workspace (FORMATS.md: "Bit-sliced
// activations", "Token-constant records"). The byte layouts of the blocks are common/blocks.h.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

// ---- the 2-bit code order on the GPU --------------------------------------------------------
// A code byte holds the codes of 4 consecutive weights, weight 4b+s at bits 2s..2s+1. Masking a
// 32-bit word of code bytes with the plane-s mask leaves code * 4^s in every byte (at most 192:
// the MMA reads A as u8), i.e. the codes that meet activation plane s of the Q8 plane order.
// The exact int32 MMA result of plane s is therefore 4^s times the plane's dot product.
template <int S> __device__ __forceinline__ uint32_t pq2_plane(uint32_t codes)
{
    return codes & (0x03030303u << (2 * S));
}

// The same plane moved to the top two bits of every byte: code * 64 whatever s (at most 192).
// Bits 2s..2s+1 of a byte shifted left by 6-2s stay in that byte; the mask drops what crossed in.
template <int S> __device__ __forceinline__ uint32_t pq2_plane_top(uint32_t codes)
{
    return (codes << (6 - 2 * S)) & 0xC0C0C0C0u;
}

// The A fragments of the four planes of a lane's 16 code bytes of one sub-tile (fragment order:
// {row gid, row gid+8} x {code bytes tq*8..+3, tq*8+4..+7}), masked in place (pq2_plane:
// code * 4^s) or moved to the top two bits of each byte (TOP, pq2_plane_top: code * 64).
template <bool TOP, int S> __device__ __forceinline__ uint32_t plane_of(uint32_t v)
{
    if constexpr (TOP)
        return pq2_plane_top<S>(v);
    else
        return pq2_plane<S>(v);
}

template <bool TOP>
__device__ __forceinline__ void plane_fragments(const uint4 &w, uint32_t (&a)[4][4])
{
    a[0][0] = plane_of<TOP, 0>(w.x), a[0][1] = plane_of<TOP, 0>(w.y),
    a[0][2] = plane_of<TOP, 0>(w.z), a[0][3] = plane_of<TOP, 0>(w.w);
    a[1][0] = plane_of<TOP, 1>(w.x), a[1][1] = plane_of<TOP, 1>(w.y),
    a[1][2] = plane_of<TOP, 1>(w.z), a[1][3] = plane_of<TOP, 1>(w.w);
    a[2][0] = plane_of<TOP, 2>(w.x), a[2][1] = plane_of<TOP, 2>(w.y),
    a[2][2] = plane_of<TOP, 2>(w.z), a[2][3] = plane_of<TOP, 2>(w.w);
    a[3][0] = plane_of<TOP, 3>(w.x), a[3][1] = plane_of<TOP, 3>(w.y),
    a[3][2] = plane_of<TOP, 3>(w.z), a[3][3] = plane_of<TOP, 3>(w.w);
}

// ---- bit-sliced activations (workspace only; the m == 1 row-block kernels) -------------------
// Per token and 128-group, 128 words (512 bytes): word (b*4 + tq)*4 + w for bit b of the q8
// byte (two's complement: bit 7 weighs -128), lane quad tq (0..3) and w in 0..3:
//   w = 0, 1 ("B1"): bits 8c + 2s and 8c + 2s + 1 both hold bit b of q of element
//                    32*tq + 16*w + 4*c + s (c, s in 0..3);
//   w = 2, 3 ("B2"): word w - 2 AND 0xAAAAAAAA (the odd bits only).
// So B1 meets both bits of the code of the same weight in a lane's code word (tiles and planes
// lanes hold code bytes tq*8 + 4w + c), and AND-POPC(codes, B1) + AND-POPC(codes, B2) is
// sum(code * bit b of q): the integer dot of bit plane b, exactly.
#define PQ2_BITS_GROUP_WORDS 128

// One warp writes the 128 bit-sliced words of one group (the order above) from the q of elements
// 4*lane + s (s = 0..3), with one 16-byte store per lane. The lanes of octet tq = lane >> 3 hold
// elements 32*tq..32*tq + 31, exactly those of the words of bit b and lane quad tq, so the
// transposition stays inside the octet, and lane 8*tq + b writes them (words 16*b + 4*tq ..+3):
//  1. in the lane, the 8x8 bit matrix whose row 2s is q[s]'s byte (odd rows zero), transposed
//     with three masked swaps: byte b of {lo, hi} then holds bit b of q[s] at bit 2s;
//  2. across the octet, the 8x8 byte matrix E[j][b] (row j in lane j of the octet) transposed in
//     three exchanges (lanes xor 4, 2, 1; one shuffle and two byte permutes each): lane b ends
//     with E[4w + c][b] in byte c of word w, i.e. bit b of element 32*tq + 16*w + 4*c + s at bit
//     2s, the B1 order;
//  3. times 3 copies each bit to bit 2s + 1.
// Transposes, not a loop over the bits, and only three dependent shuffles: the quantiser is on
// every call's critical path (NOTES: quantiser-evidence).
__device__ __forceinline__ void bitslice_group(const int (&q)[4], int lane,
                                               uint32_t *__restrict__ out)
{
    uint32_t lo = (uint32_t)(q[0] & 0xff) | (uint32_t)(q[1] & 0xff) << 16;
    uint32_t hi = (uint32_t)(q[2] & 0xff) | (uint32_t)(q[3] & 0xff) << 16;
    uint32_t t;
    t = (lo ^ (lo >> 7)) & 0x00AA00AAu, lo ^= t ^ (t << 7);  // 1x1 blocks
    t = (hi ^ (hi >> 7)) & 0x00AA00AAu, hi ^= t ^ (t << 7);
    t = (lo ^ (lo >> 14)) & 0x0000CCCCu, lo ^= t ^ (t << 14);  // 2x2 blocks
    t = (hi ^ (hi >> 14)) & 0x0000CCCCu, hi ^= t ^ (t << 14);
    t = (lo ^ (hi << 4)) & 0xF0F0F0F0u, lo ^= t, hi ^= t >> 4;  // 4x4 blocks (across the words)

    const int j = lane & 7;
    const bool x4 = j & 4, x2 = j & 2, x1 = j & 1;
    uint32_t r = __shfl_xor_sync(0xffffffffu, x4 ? lo : hi, 4);  // 4x4 blocks
    const uint32_t a4 = x4 ? r : lo, b4 = x4 ? hi : r;
    r = __shfl_xor_sync(0xffffffffu, __byte_perm(a4, b4, x2 ? 0x5410 : 0x7632), 2);  // 2x2 blocks
    const uint32_t a2 = __byte_perm(a4, r, x2 ? 0x3254 : 0x5410),
                   b2 = __byte_perm(b4, r, x2 ? 0x3276 : 0x7610);
    r = __shfl_xor_sync(0xffffffffu, __byte_perm(a2, b2, x1 ? 0x6420 : 0x7531), 1);  // 1x1 blocks
    const uint32_t w0 = __byte_perm(a2, r, x1 ? 0x3514 : 0x5240),
                   w1 = __byte_perm(b2, r, x1 ? 0x3716 : 0x7260);

    const uint32_t b1_0 = w0 * 3u, b1_1 = w1 * 3u;  // both bits of each weight
    *reinterpret_cast<uint4 *>(out + 4 * (4 * j + (lane >> 3))) =
        make_uint4(b1_0, b1_1, b1_0 & 0xAAAAAAAAu, b1_1 & 0xAAAAAAAAu);
}

// Token-constant records (the row-block kernels at 2 <= m <= 8; rowblock/problem.cuh,
// pq2_rowblock_needs_records): per 128-group, PQ2_TC_PAIRS records of 16 bytes, record pair holding
// {-sum[t0], -sum[t1], xs[t0], xs[t1]} (the floats as their bits) of tokens t0 = min(2 pair, m-1),
// t1 = min(2 pair + 1, m-1).
#define PQ2_TC_PAIRS 4

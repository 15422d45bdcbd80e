/*
 * blocks.h - the one place that knows the block byte layouts (PQ2_0, PTQ1_0, TQ2_0), the PQ2_0
 * 2-bit code order, the Q8 plane order and fp16 <-> fp32 conversion (FORMATS.md). Includable from
 * C11, C++ and CUDA; the GPU's own view of the code order is in cuda/device/codes.cuh.
 */
#ifndef PQ2_COMMON_BLOCKS_H
#define PQ2_COMMON_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- block formats ------------------------------------------------------------------------- */
/* Blocks are only ever read from and written to byte buffers with memcpy (GGUF data and the
 * 34-byte row stride give no alignment guarantee); the structs fix the byte offsets. fp16
 * scales are little endian, as GGUF stores them; the library assumes a little-endian host. */

/* PQ2_0: 128 weights in 34 bytes (2.125 bits/weight). Weight j is the 2-bit code at shift
 * 2*(j%4) of qs[j/4]; value (code - 1) * d; code 3 (+2) is valid. */
typedef struct pq2_block {
    uint16_t d;
    uint8_t qs[32];
} pq2_block;
PQ2_STATIC_ASSERT(sizeof(pq2_block) == PQ2_BLOCK_BYTES, "PQ2_0 block is 34 bytes");
PQ2_STATIC_ASSERT(offsetof(pq2_block, qs) == 2, "PQ2_0 scale first");

/* PTQ1_0: the same 128 ternary weights in 28 bytes (1.75 bits/weight): five base-3 digits per
 * qs byte, four per qh byte, scale LAST. */
typedef struct ptq1_block {
    uint8_t qs[24];
    uint8_t qh[2];
    uint16_t d;
} ptq1_block;
PQ2_STATIC_ASSERT(sizeof(ptq1_block) == PTQ1_BLOCK_BYTES, "PTQ1_0 block is 28 bytes");
PQ2_STATIC_ASSERT(offsetof(ptq1_block, d) == 26, "PTQ1_0 scale last");

/* TQ2_0 (upstream): 256 weights in 66 bytes (2.0625 bits/weight), scale LAST. Element e sits in
 * qs[32*(e/128) + e%32] at shift 2*((e%128)/32): four 32-byte bit planes per half block. */
typedef struct tq2_block {
    uint8_t qs[64];
    uint16_t d;
} tq2_block;
PQ2_STATIC_ASSERT(sizeof(tq2_block) == TQ2_BLOCK_BYTES, "TQ2_0 block is 66 bytes");
PQ2_STATIC_ASSERT(offsetof(tq2_block, d) == 64, "TQ2_0 scale last");

/* The PQ2_0 bit order: code of weight j (0..127) of a block's qs[32]. */
static inline PQ2_HD unsigned pq2_get_code(const uint8_t *qs, int j)
{
    return (unsigned)(qs[j >> 2] >> (2 * (j & 3))) & 3u;
}

/* Whole-block forms of the same order: codes[j] (0..3) <-> qs[32]. */
static inline PQ2_HD void pq2_pack_codes(const uint8_t *codes, uint8_t *qs)
{
    for (int b = 0; b < 32; b++)
        qs[b] = (uint8_t)(codes[4 * b] | codes[4 * b + 1] << 2 | codes[4 * b + 2] << 4 |
                          codes[4 * b + 3] << 6);
}

static inline PQ2_HD void pq2_unpack_codes(const uint8_t *qs, uint8_t *codes)
{
    for (int j = 0; j < PQ2_BLOCK_WEIGHTS; j++) codes[j] = (uint8_t)pq2_get_code(qs, j);
}

/* TQ2_0 code of element e (0..255) of a block's qs[64]. */
static inline PQ2_HD unsigned tq2_get_code(const uint8_t *qs, int e)
{
    return (unsigned)(qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3u;
}

/* PTQ1_0 digit n (0..4) of a packed byte: the byte is ceil(q * 256 / 243) of the base-3 number
 * q = sum x_n * 3^(4-n), so b * 3^n mod 256 keeps the fraction that starts at digit n and * 3 >> 8
 * extracts it. Always 0..2; digit x means weight x - 1, i.e. PQ2_0 code x. */
static inline PQ2_HD unsigned ptq1_get_digit(uint8_t b, int n)
{
    unsigned pow3 = 1;
    for (int i = 0; i < n; i++) pow3 *= 3u;
    return ((b * pow3) & 0xffu) * 3u >> 8;
}

/* Packs up to five digits (x[0] most significant; missing trailing digits are 0). */
static inline PQ2_HD uint8_t ptq1_pack_digits(const unsigned *x, int count)
{
    unsigned q = 0;
    for (int n = 0; n < 5; n++) q = q * 3u + (n < count ? x[n] : 0u);
    return (uint8_t)((q * 256u + 242u) / 243u); /* ceil(q * 256 / 243) */
}

/* PTQ1_0 element order: the weight index (0..127) of digit n of qs[i] (i < 24, n < 5) and of
 * digit n of qh[h] (h < 2, n < 4). */
static inline PQ2_HD int ptq1_qs_element(int i, int n)
{
    return i < 16 ? 16 * n + i : 80 + 8 * n + (i - 16);
}
static inline PQ2_HD int ptq1_qh_element(int h, int n)
{
    return 120 + 2 * n + h;
}

/* Group-128 Q8 "plane order" (pq2.h, FORMATS.md): q of element i of a group is stored at
 * (i % 4) * 32 + i / 4, so plane s lines up with the codes at shift 2*s of the 32 code bytes. */
static inline PQ2_HD int pq2_q8_plane_index(int i)
{
    return (i & 3) * 32 + (i >> 2);
}

/* ---- fp16 <-> fp32 (IEEE binary16), exact, no compiler half type ---------------------------- */

static inline PQ2_HD float pq2_bits_to_f32(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline PQ2_HD uint32_t pq2_f32_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* Every fp16 value is exactly representable in fp32: subnormals are renormalised, inf stays inf,
 * a NaN keeps its sign and payload. */
static inline PQ2_HD float pq2_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return pq2_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return pq2_bits_to_f32(sign);
        /* subnormal man * 2^-24: shift the leading 1 up to the implicit bit position (bit 10) */
        int e = 1;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        return pq2_bits_to_f32(sign | ((uint32_t)(e + 112) << 23) | ((man & 0x3ffu) << 13));
    }
    /* rebias 15 -> 127 */
    return pq2_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* Round to nearest, ties to even; |x| >= 65520 gives inf; results below half the smallest
 * subnormal (2^-25) give signed zero; a NaN stays a (quiet) NaN with its sign and top payload. */
static inline PQ2_HD uint16_t pq2_f32_to_f16(float x)
{
    uint32_t bits = pq2_f32_to_bits(x);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t exp = (bits >> 23) & 0xffu;
    uint32_t man = bits & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    if (exp >= 143) return (uint16_t)(sign | 0x7c00u); /* >= 2^16: beyond the largest finite */
    if (exp >= 113) {
        /* normal fp16 (2^-14 <= |x| < 2^16): drop 13 mantissa bits; a carry out of the mantissa
         * correctly bumps the exponent, up to 0x7c00 = inf */
        uint32_t h = ((exp - 112) << 10) | (man >> 13);
        uint32_t rem = man & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (exp < 102) return (uint16_t)sign; /* |x| < 2^-25 (including fp32 subnormals) */
    /* fp16 subnormal: units of 2^-24; the 24-bit significand shifts right by 126 - exp (14..24) */
    {
        uint32_t sig = man | 0x800000u;
        uint32_t shift = 126 - exp;
        uint32_t h = sig >> shift;
        uint32_t rem = sig & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++; /* h = 0x400 is the smallest normal */
        return (uint16_t)(sign | h);
    }
}

#ifdef __cplusplus
}
#endif

#endif /* PQ2_COMMON_BLOCKS_H */

/* layouts.c - where block (row, g) of a PQ2_0 matrix lives in each layout of pq2.h. */
#include <inttypes.h>
#include <stdio.h>

#include "common/view.h"

const char *pq2_layout_name(int32_t layout)
{
    switch (layout) {
    case PQ2_LAYOUT_RAW: return "raw";
    case PQ2_LAYOUT_PLANES: return "planes";
    case PQ2_LAYOUT_TILES: return "tiles";
    default: return "unknown";
    }
}

pq2_status pq2_view_init(pq2_view *v, const char *fn, const char *what, int32_t layout, int64_t n,
                         int64_t k, int32_t rt)
{
    memset(v, 0, sizeof *v);
    if (layout != PQ2_LAYOUT_RAW && layout != PQ2_LAYOUT_PLANES && layout != PQ2_LAYOUT_TILES)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: %slayout %" PRId32 " is not 0 (raw), 1 (planes) or 2 (tiles)", fn,
                             what, layout);
    if (layout == PQ2_LAYOUT_TILES && rt != 1 && rt != 2 && rt != 4)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: %srt=%" PRId32 " is not 1, 2 or 4 for layout tiles", fn, what,
                             rt);
    if (n <= 0) return pq2_set_error(PQ2_ERR_SHAPE, "%s: %sn=%" PRId64 " must be > 0", fn, what, n);
    if (k <= 0 || k % PQ2_BLOCK_WEIGHTS != 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %sk=%" PRId64 " is not a positive multiple of 128",
                             fn, what, k);

    v->n = n;
    v->k = k;
    v->groups = k / PQ2_BLOCK_WEIGHTS;
    v->layout = layout;
    v->rows = n;
    if (layout == PQ2_LAYOUT_TILES) {
        v->rt = rt;
        v->tile_rows = (int64_t)PQ2_SUBTILE_ROWS * rt;
        /* ceil without n + TR - 1, which could overflow */
        int64_t tiles = n / v->tile_rows + (n % v->tile_rows != 0);
        if (tiles > INT64_MAX / v->tile_rows)
            return pq2_set_error(PQ2_ERR_SHAPE,
                                 "%s: %sn=%" PRId64 " rt=%" PRId32 " has too many rows", fn, what,
                                 n, rt);
        v->rows = tiles * v->tile_rows;
    }

    uint64_t row_bytes, bytes;
    if (!pq2_mul_size((uint64_t)v->groups, PQ2_BLOCK_BYTES, &row_bytes) ||
        !pq2_mul_size((uint64_t)v->rows, row_bytes, &bytes))
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: %sn=%" PRId64 " k=%" PRId64
                             " layout %s is too large (over %" PRIu64 " bytes)",
                             fn, what, n, k, pq2_layout_name(layout), PQ2_MAX_BYTES);
    v->bytes = (size_t)bytes;
    /* code region: rows * k/4 bytes, then the fp16 scales */
    v->scale_offset = (size_t)v->rows * (size_t)(k / 4);
    return PQ2_OK;
}

pq2_status pq2_view_of_weights(pq2_view *v, const char *fn, const char *what, const pq2_weights *w)
{
    if (w == NULL) return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %sweights is NULL", fn, what);
    if (w->data == NULL)
        return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %sweights->data is NULL", fn, what);
    PQ2_CHECK(pq2_view_init(v, fn, what, w->layout, w->n, w->k, w->rt));
    v->data = (uint8_t *)(uintptr_t)w->data;
    return PQ2_OK;
}

/* Byte offsets of block (row, g). RAW and PLANES keep the block's 32 code bytes contiguous;
 * TILES splits them into eight 4-byte pieces: qs[tq*8 + 4*hb .. +3] at lane L = 4*gid + tq,
 * lane byte 8*hb + 4*half, for sub-tile row 8*half + gid (pq2.h). This returns the offset of
 * the piece tq = 0, hb = 0. */
static inline size_t tiles_code_offset(const pq2_view *v, int64_t row, int64_t g)
{
    int64_t t = row / v->tile_rows;
    int64_t in_tile = row % v->tile_rows;
    int64_t r = in_tile / PQ2_SUBTILE_ROWS;
    int64_t in_sub = in_tile % PQ2_SUBTILE_ROWS;
    int64_t gid = in_sub % 8;
    int64_t half = in_sub / 8;
    return (size_t)(((t * v->groups + g) * v->rt + r) * PQ2_SUBTILE_BYTES + gid * 4 * 16 +
                    half * 4);
}

/* Piece (tq, hb) of a TILES block (4 bytes, qs[tq*8 + 4*hb ..]): one lane (16 bytes) per tq,
 * 8 bytes further for the second half of the lane's 8 code bytes. */
#define PQ2_TILES_LANE_BYTES 16
#define PQ2_TILES_PIECE(tq, hb) ((tq) * PQ2_TILES_LANE_BYTES + (hb) * 8)

static inline size_t scale_offset(const pq2_view *v, int64_t row, int64_t g)
{
    switch (v->layout) {
    case PQ2_LAYOUT_RAW: return (size_t)(row * v->groups + g) * PQ2_BLOCK_BYTES;
    case PQ2_LAYOUT_PLANES: return v->scale_offset + (size_t)(row * v->groups + g) * 2;
    default: {
        /* pairs: the scales of sub-tile rows i and i+8 are adjacent, so the lane that holds
         * rows gid and gid+8 of an MMA fragment reads both with one 4-byte load */
        int64_t t = row / v->tile_rows;
        int64_t in_tile = row % v->tile_rows;
        int64_t r = in_tile / PQ2_SUBTILE_ROWS, in_sub = in_tile % PQ2_SUBTILE_ROWS;
        int64_t idx =
            ((t * v->groups + g) * v->rt + r) * PQ2_SUBTILE_ROWS + (in_sub % 8) * 2 + in_sub / 8;
        return v->scale_offset + (size_t)idx * 2;
    }
    }
}

static inline void read_block(const pq2_view *v, int64_t row, int64_t g, pq2_block *out)
{
    const uint8_t *p;
    switch (v->layout) {
    case PQ2_LAYOUT_RAW:
        memcpy(out, v->data + (size_t)(row * v->groups + g) * PQ2_BLOCK_BYTES, PQ2_BLOCK_BYTES);
        return;
    case PQ2_LAYOUT_PLANES:
        memcpy(out->qs, v->data + (size_t)row * (size_t)(v->k / 4) + (size_t)g * 32, 32);
        break;
    default:
        p = v->data + tiles_code_offset(v, row, g);
        for (int tq = 0; tq < 4; tq++)
            for (int hb = 0; hb < 2; hb++)
                memcpy(out->qs + tq * 8 + hb * 4, p + PQ2_TILES_PIECE(tq, hb), 4);
        break;
    }
    memcpy(&out->d, v->data + scale_offset(v, row, g), 2);
}

static inline void write_block(const pq2_view *v, int64_t row, int64_t g, const pq2_block *in)
{
    uint8_t *p;
    switch (v->layout) {
    case PQ2_LAYOUT_RAW:
        memcpy(v->data + (size_t)(row * v->groups + g) * PQ2_BLOCK_BYTES, in, PQ2_BLOCK_BYTES);
        return;
    case PQ2_LAYOUT_PLANES:
        memcpy(v->data + (size_t)row * (size_t)(v->k / 4) + (size_t)g * 32, in->qs, 32);
        break;
    default:
        p = v->data + tiles_code_offset(v, row, g);
        for (int tq = 0; tq < 4; tq++)
            for (int hb = 0; hb < 2; hb++)
                memcpy(p + PQ2_TILES_PIECE(tq, hb), in->qs + tq * 8 + hb * 4, 4);
        break;
    }
    memcpy(v->data + scale_offset(v, row, g), &in->d, 2);
}

void pq2_view_read_block(const pq2_view *v, int64_t row, int64_t g, pq2_block *out)
{
    read_block(v, row, g, out);
}

PQ2_API pq2_status pq2_layout_bytes(int32_t layout, int64_t n, int64_t k, int32_t rt, size_t *bytes)
{
    pq2_view v;
    PQ2_CHECK_PTR("pq2_layout_bytes", bytes);
    PQ2_CHECK(pq2_view_init(&v, "pq2_layout_bytes", "", layout, n, k, rt));
    *bytes = v.bytes;
    return pq2_ok();
}

PQ2_API pq2_status pq2_convert_layout(const pq2_weights *src, void *dst, size_t dst_bytes,
                                      int32_t dst_layout, int32_t dst_rt)
{
    static const char fn[] = "pq2_convert_layout";
    pq2_view s, d;
    PQ2_CHECK(pq2_view_of_weights(&s, fn, "src ", src));
    PQ2_CHECK_PTR(fn, dst);
    PQ2_CHECK(pq2_view_init(&d, fn, "dst ", dst_layout, s.n, s.k, dst_rt));
    if (dst_bytes != d.bytes) {
        char rt_text[16] = "";
        if (dst_layout == PQ2_LAYOUT_TILES)
            snprintf(rt_text, sizeof rt_text, " rt=%" PRId32, dst_rt);
        return pq2_set_error(
            PQ2_ERR_SHAPE,
            "%s: dst_bytes %zu != %zu needed for n=%" PRId64 " k=%" PRId64 " layout %s%s", fn,
            dst_bytes, d.bytes, d.n, d.k, pq2_layout_name(dst_layout), rt_text);
    }
    d.data = (uint8_t *)dst;
    uintptr_t s0 = (uintptr_t)s.data, d0 = (uintptr_t)d.data;
    if (s0 < d0 + d.bytes && d0 < s0 + s.bytes)
        return pq2_set_error(PQ2_ERR_INVALID_ARGUMENT,
                             "%s: src [%p, +%zu) and dst [%p, +%zu) overlap", fn, (void *)s.data,
                             s.bytes, (void *)d.data, d.bytes);

    if (s.layout == d.layout && s.rt == d.rt) {
        memcpy(d.data, s.data, d.bytes);
        return pq2_ok();
    }

    /* Padding rows of TILES: code 1 (0b01) in every position = weight 0, scale +0.0. */
    pq2_block pad;
    memset(&pad, 0, sizeof pad);
    memset(pad.qs, 0x55, sizeof pad.qs);

    pq2_block blk;
    for (int64_t row = 0; row < d.rows; row++) {
        for (int64_t g = 0; g < d.groups; g++) {
            if (row < s.n) {
                read_block(&s, row, g, &blk);
                write_block(&d, row, g, &blk);
            } else {
                write_block(&d, row, g, &pad);
            }
        }
    }
    return pq2_ok();
}

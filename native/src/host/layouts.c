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
    if (w->bytes < v->bytes)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: %sweights->bytes=%zu, the %s layout of n=%" PRId64 " k=%" PRId64
                             " takes %zu",
                             fn, what, w->bytes, pq2_layout_name(w->layout), w->n, w->k, v->bytes);
    v->data = (uint8_t *)(uintptr_t)w->data;
    return PQ2_OK;
}

/* Where a row's blocks live: code piece i (qs[4i .. 4i+3]) of block g at code[i] + g * code_step,
 * its scale at scale + g * scale_step (every layout's offsets are linear in g). */
typedef struct row_map {
    size_t code[8], code_step, scale, scale_step;
} row_map;

static void row_map_of(const pq2_view *v, int64_t row, row_map *m)
{
    for (int i = 0; i < 8; i++) m->code[i] = pq2_code_offset(v, row, 0, 4 * i);
    m->code_step = pq2_code_offset(v, row, 1, 0) - m->code[0];
    m->scale = pq2_scale_offset(v, row, 0);
    m->scale_step = pq2_scale_offset(v, row, 1) - m->scale;
}

/* Blocks move as the 4-byte pieces qs[4i .. 4i+3], contiguous in every layout. */
static inline void read_block(const pq2_view *v, int64_t row, int64_t g, pq2_block *out)
{
    for (int i = 0; i < 8; i++)
        memcpy(out->qs + 4 * i, v->data + pq2_code_offset(v, row, g, 4 * i), 4);
    memcpy(&out->d, v->data + pq2_scale_offset(v, row, g), 2);
}

static inline void write_block(const pq2_view *v, int64_t row, int64_t g, const pq2_block *in)
{
    for (int i = 0; i < 8; i++)
        memcpy(v->data + pq2_code_offset(v, row, g, 4 * i), in->qs + 4 * i, 4);
    memcpy(v->data + pq2_scale_offset(v, row, g), &in->d, 2);
}

void pq2_view_read_block(const pq2_view *v, int64_t row, int64_t g, pq2_block *out)
{
    read_block(v, row, g, out);
}

PQ2_API pq2_status pq2_layout_bytes(int32_t layout, int64_t n, int64_t k, int32_t rt, size_t *bytes)
{
    pq2_view v;
    PQ2_CHECK_PTR("pq2_layout_bytes", bytes);
    PQ2_CHECK_ALIGN("pq2_layout_bytes", bytes, PQ2_ALIGNOF(size_t));
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

    /* Row by row, each row's piece offsets found once (the per-piece tile arithmetic of
     * pq2_code_offset costs a division per 4 bytes). */
    for (int64_t row = 0; row < d.rows; row++) {
        row_map dm, sm;
        row_map_of(&d, row, &dm);
        if (row >= s.n) {
            for (int64_t g = 0; g < d.groups; g++) write_block(&d, row, g, &pad);
            continue;
        }
        row_map_of(&s, row, &sm);
        for (int64_t g = 0; g < d.groups; g++) {
            const uint8_t *src = s.data;
            uint8_t *dst = d.data;
            for (int i = 0; i < 8; i++)
                memcpy(dst + dm.code[i] + (size_t)g * dm.code_step,
                       src + sm.code[i] + (size_t)g * sm.code_step, 4);
            memcpy(dst + dm.scale + (size_t)g * dm.scale_step,
                   src + sm.scale + (size_t)g * sm.scale_step, 2);
        }
    }
    return pq2_ok();
}

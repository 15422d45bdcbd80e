/*
 * view.h - a validated PQ2_0 matrix in one of the layouts of pq2.h (FORMATS.md "Resident
 * layouts"): the sizes and region offsets every entry point checks a pq2_weights against.
 */
#ifndef PQ2_COMMON_VIEW_H
#define PQ2_COMMON_VIEW_H

#include "common/blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A sub-tile of the tiles layout: 16 rows x one 128-group, 512 code bytes (16 per lane of a
 * warp: one m16n8k32 MMA A fragment each). A tile is rt sub-tiles stacked along the rows. */
#define PQ2_SUBTILE_ROWS 16
#define PQ2_SUBTILE_BYTES 512

/* A validated PQ2_0 matrix in one layout (see pq2.h). rows = n, or T*TR for TILES (padding
 * included). Offsets are in bytes from `data`. */
typedef struct pq2_view {
    uint8_t *data;
    int64_t n;
    int64_t k;
    int64_t groups; /* G = k / 128 */
    int64_t rows;   /* rows stored, padding included */
    int32_t layout;
    int32_t rt;          /* TILES only, else 0 */
    int64_t tile_rows;   /* TR = 16 * rt, TILES only */
    size_t scale_offset; /* start of the scale region (PLANES, TILES) */
    size_t bytes;        /* pq2_layout_bytes */
} pq2_view;

/* Short layout name for messages: "raw", "planes", "tiles" or "unknown". */
const char *pq2_layout_name(int32_t layout);

/* Validates layout, n (> 0), k (> 0, % 128), rt (TILES: 1, 2, 4) and sizes (no overflow) and
 * fills *v with data = NULL. Errors name `fn` and prefix values with `what` (e.g. "src "). */
pq2_status pq2_view_init(pq2_view *v, const char *fn, const char *what, int32_t layout, int64_t n,
                         int64_t k, int32_t rt);

/* pq2_view_init of a pq2_weights, also checking w and w->data for NULL. */
pq2_status pq2_view_of_weights(pq2_view *v, const char *fn, const char *what, const pq2_weights *w);

/* Where block (row, g) lives (FORMATS.md "Resident layouts"), in bytes from the view's data;
 * row < v->rows (the padding rows of TILES may be addressed). Host and device alike. */

/* Code byte b (0..31, qs[b]) of block (row, g). RAW and PLANES keep a block's 32 code bytes
 * contiguous; TILES stores qs[tq*8 + 4*hb + c] of sub-tile row 8*half + gid in lane
 * L = 4*gid + tq at lane byte 8*hb + 4*half + c. */
static inline PQ2_HD size_t pq2_code_offset(const pq2_view *v, int64_t row, int64_t g, int b)
{
    if (v->layout == PQ2_LAYOUT_RAW) return (size_t)(row * v->groups + g) * PQ2_BLOCK_BYTES + 2 + b;
    if (v->layout == PQ2_LAYOUT_PLANES)
        return (size_t)row * (size_t)(v->k / 4) + (size_t)g * 32 + b;
    const int64_t t = row / v->tile_rows, in_tile = row % v->tile_rows;
    const int64_t r = in_tile / PQ2_SUBTILE_ROWS, in_sub = in_tile % PQ2_SUBTILE_ROWS;
    const int64_t lane = (in_sub % 8) * 4 + b / 8;
    const int64_t byte = ((b % 8) / 4) * 8 + (in_sub / 8) * 4 + b % 4;
    return (size_t)(((t * v->groups + g) * v->rt + r) * PQ2_SUBTILE_BYTES + lane * 16 + byte);
}

/* The fp16 scale of block (row, g). TILES keeps the scales of sub-tile rows i and i + 8 side by
 * side, so the lane holding rows gid and gid + 8 of an MMA fragment reads both in one word. */
static inline PQ2_HD size_t pq2_scale_offset(const pq2_view *v, int64_t row, int64_t g)
{
    if (v->layout == PQ2_LAYOUT_RAW) return (size_t)(row * v->groups + g) * PQ2_BLOCK_BYTES;
    if (v->layout == PQ2_LAYOUT_PLANES) return v->scale_offset + (size_t)(row * v->groups + g) * 2;
    const int64_t t = row / v->tile_rows, in_tile = row % v->tile_rows;
    const int64_t r = in_tile / PQ2_SUBTILE_ROWS, in_sub = in_tile % PQ2_SUBTILE_ROWS;
    const int64_t idx =
        ((t * v->groups + g) * v->rt + r) * PQ2_SUBTILE_ROWS + (in_sub % 8) * 2 + in_sub / 8;
    return v->scale_offset + (size_t)idx * 2;
}

/* Copies block (row, g) of a host view out as a PQ2_0 block (32 code bytes + fp16 scale bits).
 * row < v->rows (padding rows of TILES may be read). */
void pq2_view_read_block(const pq2_view *v, int64_t row, int64_t g, pq2_block *out);

#ifdef __cplusplus
}
#endif

#endif /* PQ2_COMMON_VIEW_H */

/* formats.c - PTQ1_0 and TQ2_0 blocks to and from PQ2_0 raw blocks (layouts: common/blocks.h). */
#include <inttypes.h>

#include "common/blocks.h"

/* Checks `bytes` (the argument called `name`) == count blocks of block_bytes of `format`. */
static pq2_status check_bytes(const char *fn, const char *name, size_t bytes, int64_t count,
                              uint64_t block_bytes, const char *format)
{
    uint64_t need;
    if (!pq2_mul_size((uint64_t)count, block_bytes, &need))
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %" PRId64 " %s blocks are too large", fn, count,
                             format);
    if ((uint64_t)bytes != need)
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: %s %zu != %" PRIu64 " needed for %" PRId64
                             " %s blocks of %" PRIu64 " bytes",
                             fn, name, bytes, need, count, format, block_bytes);
    return PQ2_OK;
}

static pq2_status check_count(const char *fn, const char *count_name, int64_t count)
{
    if (count <= 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: %s=%" PRId64 " must be > 0", fn, count_name,
                             count);
    return PQ2_OK;
}

PQ2_API pq2_status pq2_ptq1_to_pq2(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                   int64_t n_blocks)
{
    static const char fn[] = "pq2_ptq1_to_pq2";
    PQ2_CHECK_PTR(fn, src);
    PQ2_CHECK_PTR(fn, dst);
    PQ2_CHECK(check_count(fn, "n_blocks", n_blocks));
    PQ2_CHECK(check_bytes(fn, "src_bytes", src_bytes, n_blocks, PTQ1_BLOCK_BYTES, "PTQ1_0"));
    PQ2_CHECK(check_bytes(fn, "dst_bytes", dst_bytes, n_blocks, PQ2_BLOCK_BYTES, "PQ2_0"));

    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    for (int64_t b = 0; b < n_blocks; b++) {
        ptq1_block in;
        pq2_block out;
        uint8_t codes[PQ2_BLOCK_WEIGHTS];
        memcpy(&in, s + (size_t)b * PTQ1_BLOCK_BYTES, sizeof in);
        for (int i = 0; i < 24; i++)
            for (int n = 0; n < 5; n++)
                codes[ptq1_qs_element(i, n)] = (uint8_t)ptq1_get_digit(in.qs[i], n);
        for (int h = 0; h < 2; h++)
            for (int n = 0; n < 4; n++)
                codes[ptq1_qh_element(h, n)] = (uint8_t)ptq1_get_digit(in.qh[h], n);
        pq2_pack_codes(codes, out.qs);
        out.d = in.d;
        memcpy(d + (size_t)b * PQ2_BLOCK_BYTES, &out, sizeof out);
    }
    return pq2_ok();
}

PQ2_API pq2_status pq2_pq2_to_ptq1(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                   int64_t n_blocks, int64_t blocks_per_row)
{
    static const char fn[] = "pq2_pq2_to_ptq1";
    PQ2_CHECK_PTR(fn, src);
    PQ2_CHECK_PTR(fn, dst);
    PQ2_CHECK(check_count(fn, "n_blocks", n_blocks));
    PQ2_CHECK(check_count(fn, "blocks_per_row", blocks_per_row));
    PQ2_CHECK(check_bytes(fn, "src_bytes", src_bytes, n_blocks, PQ2_BLOCK_BYTES, "PQ2_0"));
    PQ2_CHECK(check_bytes(fn, "dst_bytes", dst_bytes, n_blocks, PTQ1_BLOCK_BYTES, "PTQ1_0"));

    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    for (int64_t b = 0; b < n_blocks; b++) {
        pq2_block in;
        ptq1_block out;
        uint8_t codes[PQ2_BLOCK_WEIGHTS];
        unsigned x[5];
        memcpy(&in, s + (size_t)b * PQ2_BLOCK_BYTES, sizeof in);
        pq2_unpack_codes(in.qs, codes);
        unsigned has3 = 0;
        for (int j = 0; j < PQ2_BLOCK_WEIGHTS; j++) has3 |= codes[j] == 3;
        if (has3)
            return pq2_set_error(PQ2_ERR_UNREPRESENTABLE,
                                 "%s: block %" PRId64 " of row %" PRId64
                                 " holds code 3 (+2), which PTQ1_0 cannot encode",
                                 fn, b % blocks_per_row, b / blocks_per_row);
        for (int i = 0; i < 24; i++) {
            for (int n = 0; n < 5; n++) x[n] = codes[ptq1_qs_element(i, n)];
            out.qs[i] = ptq1_pack_digits(x, 5);
        }
        for (int h = 0; h < 2; h++) {
            for (int n = 0; n < 4; n++) x[n] = codes[ptq1_qh_element(h, n)];
            out.qh[h] = ptq1_pack_digits(x, 4);
        }
        out.d = in.d;
        memcpy(d + (size_t)b * PTQ1_BLOCK_BYTES, &out, sizeof out);
    }
    return pq2_ok();
}

PQ2_API pq2_status pq2_tq2_to_pq2(const void *src, size_t src_bytes, void *dst, size_t dst_bytes,
                                  int64_t n_tq2_blocks)
{
    static const char fn[] = "pq2_tq2_to_pq2";
    PQ2_CHECK_PTR(fn, src);
    PQ2_CHECK_PTR(fn, dst);
    PQ2_CHECK(check_count(fn, "n_tq2_blocks", n_tq2_blocks));
    if (n_tq2_blocks > INT64_MAX / 2)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n_tq2_blocks=%" PRId64 " is too large", fn,
                             n_tq2_blocks);
    PQ2_CHECK(check_bytes(fn, "src_bytes", src_bytes, n_tq2_blocks, TQ2_BLOCK_BYTES, "TQ2_0"));
    PQ2_CHECK(check_bytes(fn, "dst_bytes", dst_bytes, 2 * n_tq2_blocks, PQ2_BLOCK_BYTES, "PQ2_0"));

    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    for (int64_t b = 0; b < n_tq2_blocks; b++) {
        tq2_block in;
        memcpy(&in, s + (size_t)b * TQ2_BLOCK_BYTES, sizeof in);
        for (int half = 0; half < 2; half++) {
            pq2_block out;
            uint8_t codes[PQ2_BLOCK_WEIGHTS];
            for (int j = 0; j < PQ2_BLOCK_WEIGHTS; j++)
                codes[j] = (uint8_t)tq2_get_code(in.qs, half * PQ2_BLOCK_WEIGHTS + j);
            pq2_pack_codes(codes, out.qs);
            out.d = in.d;
            memcpy(d + ((size_t)b * 2 + (size_t)half) * PQ2_BLOCK_BYTES, &out, sizeof out);
        }
    }
    return pq2_ok();
}

// operand.cu - the Q8 operand of pq2.h (pq2_q8): its kernel operand's size and parts, and the
// checks every writer and reader of one makes.
#include "device/codes.cuh"
#include "device/launch.cuh"
#include "quantize/quantize.h"

int pq2_q8_kernel_operand_size(int64_t m, int64_t k, size_t *bytes)
{
    uint64_t q8, size = 0;
    if (!pq2_mul_size((uint64_t)m, (uint64_t)k, &q8)) return 0;
    const uint64_t groups = (uint64_t)(k / 128);
    if (m == 1 && !pq2_mul_size(groups, PQ2_BITS_GROUP_WORDS * sizeof(uint32_t), &size)) return 0;
    if (m >= 2 && m <= 8 && !pq2_mul_size(groups, PQ2_TC_PAIRS * sizeof(int4), &size)) return 0;
    *bytes = (size_t)size;
    return 1;
}

pq2_status pq2_q8_resolve(const char *fn, const char *name, const pq2_q8 *q, int64_t m, int64_t k,
                          pq2_q8_sink *sink)
{
    if (q == nullptr) return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    if (q->scales == nullptr || q->sums == nullptr)
        return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %s->%s is NULL", fn, name,
                             q->scales ? "sums" : "scales");
    size_t operand_bytes;
    if (!pq2_q8_kernel_operand_size(m, k, &operand_bytes))
        return pq2_set_error(PQ2_ERR_SHAPE,
                             "%s: %s of m=%lld k=%lld is too large (over %llu bytes)", fn, name,
                             (long long)m, (long long)k, (unsigned long long)PQ2_MAX_BYTES);
    const bool operand = q->kernel_operand != nullptr && operand_bytes > 0;
    if (q->q8 == nullptr && !(m == 1 && operand))
        return pq2_set_error(PQ2_ERR_NULL_POINTER,
                             "%s: %s->q8 is NULL (allowed only at m = 1 with a kernel operand)", fn,
                             name);
    if (!pq2_aligned(q->q8, 16) || !pq2_aligned(q->scales, 4) || !pq2_aligned(q->sums, 4) ||
        !pq2_aligned(q->kernel_operand, 16))
        return pq2_set_error(
            PQ2_ERR_ALIGNMENT,
            "%s: %s: q8 %p and kernel_operand %p must be 16-byte aligned, scales %p and "
            "sums %p 4-byte aligned",
            fn, name, (void *)q->q8, q->kernel_operand, (void *)q->scales, (void *)q->sums);
    sink->q8 = q->q8, sink->scales = q->scales, sink->sums = q->sums;
    sink->bits = operand && m == 1 ? static_cast<uint32_t *>(q->kernel_operand) : nullptr;
    sink->records = operand && m > 1 ? static_cast<int4 *>(q->kernel_operand) : nullptr;
    return PQ2_OK;
}

// operand.cu - the Q8 operand of pq2.h (pq2_q8): its kernel operand's size and parts, and the
// checks every writer and reader of one makes.
#include "device/codes.cuh"
#include "device/launch.cuh"
#include "quantize/quantize.h"

size_t pq2_q8_kernel_operand_size(int64_t m, int64_t k)
{
    const size_t groups = (size_t)(k / 128);
    if (m == 1) return groups * PQ2_BITS_GROUP_WORDS * sizeof(uint32_t);
    if (m >= 2 && m <= 8) return groups * PQ2_TC_PAIRS * sizeof(int4);
    return 0;
}

pq2_status pq2_q8_resolve(const char *fn, const char *name, const pq2_q8 *q, int64_t m, int64_t k,
                          pq2_q8_sink *sink)
{
    if (q == nullptr) return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    if (q->scales == nullptr || q->sums == nullptr)
        return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %s->%s is NULL", fn, name,
                             q->scales ? "sums" : "scales");
    const bool operand = q->kernel_operand != nullptr && pq2_q8_kernel_operand_size(m, k) > 0;
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

/*
 * errors.h - the thread-local last error and the argument-check macros every entry point uses
 * (null pointers, alignment), plus the overflow-checked size arithmetic. Shared by the C host half
 * and the CUDA half.
 */
#ifndef PQ2_COMMON_ERRORS_H
#define PQ2_COMMON_ERRORS_H

#include <stddef.h>
#include <stdint.h>

#include "pq2.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define PQ2_HD __host__ __device__
#else
#define PQ2_HD
#endif

#if defined(__cplusplus)
#define PQ2_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define PQ2_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#if defined(__GNUC__)
#define PQ2_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define PQ2_PRINTF(fmt_index, first_arg)
#endif

/* Formats the thread-local last error (truncated to 511 bytes) and returns `status`, so that a
 * check reads `return pq2_set_error(PQ2_ERR_SHAPE, "pq2_x: k=%" PRId64 " ...", k);`.
 * Every message starts with the entry point's name and names the offending values. */
pq2_status pq2_set_error(pq2_status status, const char *fmt, ...) PQ2_PRINTF(2, 3);
/* Clears the last error to "" and returns PQ2_OK: every successful entry point ends with it. */
pq2_status pq2_ok(void);

/* Propagates a non-OK status (whose message is already set) to the caller. */
#define PQ2_CHECK(expr)                                            \
    do {                                                           \
        pq2_status pq2_check_status_ = (expr);                     \
        if (pq2_check_status_ != PQ2_OK) return pq2_check_status_; \
    } while (0)

/* Null pointer argument check; `fn` is the entry point name. */
#define PQ2_CHECK_PTR(fn, ptr)                                                                     \
    do {                                                                                           \
        if ((ptr) == NULL) return pq2_set_error(PQ2_ERR_NULL_POINTER, "%s: %s is NULL", fn, #ptr); \
    } while (0)

/* 1 when p is a multiple of a (a power of two); NULL is aligned (null checks are separate). */
static inline int pq2_aligned(const void *p, uintptr_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* The alignment of a type, for PQ2_CHECK_ALIGN in C and C++ alike. */
#if defined(__cplusplus)
#define PQ2_ALIGNOF(type) alignof(type)
#else
#define PQ2_ALIGNOF(type) _Alignof(type)
#endif

/* PQ2_ERR_ALIGNMENT unless ptr is a-byte aligned (pq2.h: a pointer to numbers is aligned for its
 * type, the device operands as each entry point says); `fn` is the entry point name. */
#define PQ2_CHECK_ALIGN(fn, ptr, a)                                                           \
    do {                                                                                      \
        if (!pq2_aligned((ptr), (a)))                                                         \
            return pq2_set_error(PQ2_ERR_ALIGNMENT, "%s: %s = %p is not %d-byte aligned", fn, \
                                 #ptr, (const void *)(ptr), (int)(a));                        \
    } while (0)

/* Largest byte count the library handles: every size fits both size_t and int64_t. */
#if SIZE_MAX < INT64_MAX
#define PQ2_MAX_BYTES ((uint64_t)SIZE_MAX)
#else
#define PQ2_MAX_BYTES ((uint64_t)INT64_MAX)
#endif

/* a * b into *out when both are >= 0 and the product is <= PQ2_MAX_BYTES; returns 0 otherwise. */
static inline int pq2_mul_size(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > PQ2_MAX_BYTES / a) return 0;
    *out = a * b;
    return 1;
}

/* PQ2_ERR_SHAPE (naming fn, the buffer and both sizes) unless a buffer of `have` bytes holds
 * `count` elements of `elem` bytes; count * elem must not overflow (callers check the shape
 * first). */
pq2_status pq2_check_buffer(const char *fn, const char *name, size_t have, uint64_t count,
                            uint64_t elem);

#ifdef __cplusplus
}
#endif

#endif /* PQ2_COMMON_ERRORS_H */

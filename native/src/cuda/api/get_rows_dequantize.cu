// get_rows_dequantize.cu - the CUDA entry points that turn a weight matrix back into dense
// values (pq2.h): rows of it by id, optionally rotated back (a row transform, rotate/rotate.h),
// and the whole matrix (a kernel of its own, dequantize/dequantize.h).
#include "api/transform.h"
#include "dequantize/dequantize.h"
#include "device/device.h"
#include "device/dtypes.cuh"
#include "device/launch.cuh"

extern "C" PQ2_API pq2_status pq2_get_rows_cuda(const pq2_weights *w, const int32_t *ids,
                                                int64_t n_ids, void *out, int32_t out_dtype,
                                                const pq2_rotation *rot, void *stream)
{
    static const char fn[] = "pq2_get_rows_cuda";
    pq2_row_transform t{};
    PQ2_CHECK(pq2_view_of_weights(&t.w, fn, "", w));
    PQ2_CHECK_ALIGN(fn, w->data, 16);
    PQ2_CHECK_PTR(fn, ids);
    PQ2_CHECK_PTR(fn, out);
    PQ2_CHECK(pq2_check_dtype(fn, "out_dtype", out_dtype));
    if (n_ids <= 0)
        return pq2_set_error(PQ2_ERR_SHAPE, "%s: n_ids=%lld must be > 0", fn, (long long)n_ids);
    PQ2_CHECK_ALIGN(fn, ids, 4);
    PQ2_CHECK_ALIGN(fn, out, 16);
    PQ2_CHECK(pq2_api_set_rotation(fn, rot, t.w.k, &t));
    t.source = PQ2_SOURCE_WEIGHTS, t.ids = ids, t.inverse = 1;
    t.y = out, t.y_dtype = out_dtype, t.m = n_ids, t.width = t.w.k;
    return pq2_api_launch_transform(fn, t, stream);
}

extern "C" PQ2_API pq2_status pq2_dequantize_cuda(const pq2_weights *w, void *out,
                                                  int32_t out_dtype, void *stream)
{
    static const char fn[] = "pq2_dequantize_cuda";
    pq2_view v;
    PQ2_CHECK(pq2_view_of_weights(&v, fn, "", w));
    PQ2_CHECK_ALIGN(fn, w->data, 16);
    PQ2_CHECK_PTR(fn, out);
    PQ2_CHECK(pq2_check_dtype(fn, "out_dtype", out_dtype));
    PQ2_CHECK_ALIGN(fn, out, 16);
    pq2_device dev;
    PQ2_CHECK(pq2_device_get(fn, &dev));
    PQ2_CHECK(pq2_dequantize_launch(fn, v, out, out_dtype, static_cast<cudaStream_t>(stream)));
    return pq2_ok();
}

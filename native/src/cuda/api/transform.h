// transform.h - what the entry points that launch a row transform share (api/rotate.cu,
// api/get_rows_dequantize.cu); defined in api/rotate.cu.
#pragma once

#include "rotate/rotate.h"

// The rotation of a width (NULL: none) into t->log2b and t->signs: rot->block a power of two in
// 64..4096 that divides width, rot->signs 4-byte aligned; errors name `fn`.
pq2_status pq2_api_set_rotation(const char *fn, const pq2_rotation *rot, int64_t width,
                                pq2_row_transform *t);

// The device check (its one-time setup on first use) and the launch of t on `stream`.
pq2_status pq2_api_launch_transform(const char *fn, const pq2_row_transform &t, void *stream);

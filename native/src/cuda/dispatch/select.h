// select.h - the dispatcher: the configuration that runs a problem when the host passes none
// (the tuned table, tuned_configs.inc, then its fallback lines), and the check that the build
// compiled every kernel the table names.
#pragma once

#include "common/view.h"

// The configuration for weights v at m: the table's entry for this layout, tile height, shape
// and m, else its fallback line for the layout and tile height (a GEMM line's splits 0 resolved
// for a device of `sms` multiprocessors); family 0 when there is none (planes above m = 16).
// Entries of PQ2_FAMILY_GEMM_SM90 count only where they serve (a compute capability cc 9.0
// device, a build with sm_90a, k a multiple of 512); elsewhere the next entry serves.
pq2_matmul_config pq2_select_config(const pq2_view &v, int64_t m, int sms, int cc);

// PQ2_ERR_UNSUPPORTED when an entry of the table, at some m of its range, or a layout and tile
// height without a fallback line, has no compiled kernel: a build whose instance list is stale.
pq2_status pq2_select_check_table(const char *fn);

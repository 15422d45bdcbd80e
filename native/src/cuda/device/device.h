// device.h - facts about the current CUDA device, read once per device, and the one-time setup
// that goes with them (kernel attributes, the tuned table's check). The library's only global
// state: an init-time cache, safe to race on.
#pragma once

#include "common/errors.h"

struct pq2_device {
    int sms;       // multiprocessors
    int cc;        // compute capability, major * 10 + minor
    int max_smem;  // shared memory a block may opt in to, bytes
};

// The facts of the current device, after its one-time setup (the first call per device does
// it). PQ2_ERR_UNSUPPORTED for a device below compute capability 8.0; errors name `fn`.
pq2_status pq2_device_get(const char *fn, pq2_device *d);

// True when the current device (already set up) runs the kernels' programmatic dependent launch
// code (compute capability 9.x: the sm_90a build).
bool pq2_pdl_ok();

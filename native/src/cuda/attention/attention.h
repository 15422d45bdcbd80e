// attention.h - the attention decode kernel's host side (attention/decode.cu): its one-time
// per-device setup and its launch. The entry point's argument checks are in api/attention.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/errors.h"

// Lets every instance take the shared memory it needs (those the device cannot hold are left
// alone: the launch refuses them).
pq2_status pq2_attention_init_device(const char *fn, int max_smem_optin);

// Launches the kernel for a checked problem (api/attention.cu: pq2.h's head widths and groups,
// bf16).
pq2_status pq2_attention_launch(const char *fn, const pq2_attention_decode &a, int max_smem_optin,
                                bool pdl, cudaStream_t stream);

"""LAB (issue 35): gate_up m = 16 through one configuration, for Nsight Compute (the ring kernel
against the register kernel of the same warps). Launches the config 6 times.

    PYQ2_LIBRARY=build/lab-ring-lane/libpq2.so python lab/m16ring/ncu_ring.py WARPS UNROLL STAGES
"""

import sys

import torch

sys.path.insert(0, ".")
from tests.lib.test_matmul import MODEL_SHAPES, activations, matmul_config, weights  # noqa: E402

warps, unroll, stages = (int(a) for a in sys.argv[1:4])
shape = MODEL_SHAPES["gate_up"]
codes, scales, w = weights(shape, "ternary", "tiles", 2)
x = activations(16, shape[1], "normal", torch.bfloat16, 16)
y = torch.empty((16, shape[0]), dtype=torch.float32, device="cuda")
cfg = matmul_config(2, warps, unroll, stages)
for _ in range(6):
    w.matmul(x, out=y, cfg=cfg)
torch.cuda.synchronize()
print("done", warps, unroll, stages)

"""LAB (issue 37): one gate_up M = 2048 GEMM of a probe label, replayed a few times, for Nsight
Compute (the E1/E3 lab library: PYQ2_LIBRARY=build/lab-e1/libpq2.so).

    ncu --kernel-name regex:wgmma --launch-skip 3 --launch-count 1 ... \\
        python lab/e1/ncu_one.py e128s6u7
"""

import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "lab/e1")
from probe_e1 import cfg_of  # noqa: E402

from tests.lib.test_matmul import MODEL_SHAPES, activations, weights  # noqa: E402

label = sys.argv[1]
shape = MODEL_SHAPES["gate_up"]
_, _, w = weights(shape, "ternary", "tiles", 2)
x = activations(2048, shape[1], "normal", torch.bfloat16, 1)
y = torch.empty(2048, shape[0], dtype=torch.bfloat16, device="cuda")
for _ in range(5):
    w.matmul(x, out=y, cfg=cfg_of(label))
torch.cuda.synchronize()
print(label, "ok")

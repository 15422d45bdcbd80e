"""LAB (issue 35): the ring kernel capped at 96 registers (build/lab-ring) against the register
kernel of the same warps (stages 1, unroll 1: the same core, split and order, so the same bits),
at m = 4, 8, 9, 16 on four 27B shapes, outputs poisoned first; and the table's own configuration
against the Q8 reference.

    PYQ2_LIBRARY=build/lab-ring/libpq2.so python lab/m16ring/check_ring.py
"""

import sys

import torch

sys.path.insert(0, ".")
from tests.lib.test_matmul import (  # noqa: E402
    MODEL_SHAPES,
    activations,
    matmul_config,
    q8_reference,
    quantize_q8,
    rel_rms,
    weights,
)

bad = 0
for name in ("gate_up", "down", "qkv", "out"):
    shape = MODEL_SHAPES[name]
    codes, scales, w = weights(shape, "ternary", "tiles", 2)
    for m in (4, 8, 9, 16):
        x = activations(m, shape[1], "normal", torch.bfloat16, m)
        base = torch.full((m, shape[0]), float("nan"), dtype=torch.float32, device="cuda")
        w.matmul(x, out=base)
        q8, xs, sums = quantize_q8(x)
        err = rel_rms(base, q8_reference(codes, scales, q8, xs, sums))
        for warps in (2, 4, 8):
            same_warps = torch.full_like(base, float("nan"))
            w.matmul(x, out=same_warps, cfg=matmul_config(2, warps, 1, 1))
            for unroll in (1, 2):
                for stages in (3, 4, 6):
                    cfg = matmul_config(2, warps, unroll, stages)
                    y = torch.full_like(base, float("nan"))
                    try:
                        w.matmul(x, out=y, cfg=cfg)
                    except Exception as e:  # refused (shared memory): report, go on
                        print(f"{name} m={m} w{warps} u{unroll} s{stages}: refused: {e}")
                        continue
                    torch.cuda.synchronize()
                    same = torch.equal(y, same_warps)
                    if not same:
                        bad += 1
                        print(f"{name} m={m} w{warps} u{unroll} s{stages}: DIFFERS "
                              f"(rel {rel_rms(y, same_warps):.3g})")  # fmt: skip
        print(
            f"{name} m={m}: ring configs checked (table vs reference: rel {err:.2g})"
        )
print("CHECKS:", "all bit-identical" if bad == 0 else f"{bad} differ")
sys.exit(1 if bad else 0)

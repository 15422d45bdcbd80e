"""rstd_q8.py - lab (issue 36, segment-tile-dataflow): how far Q8 of the rotated normed row moves if
rstd is applied to the group scales after Q8 instead of to the elements before the rotation.

today:     v = H(s * (h * rstd * w)),  q = Q8(v),  scale_g
proposed:  u = H(s * (h * w)),         q' = Q8(u), scale'_g = scale_g(u) * rstd
All in fp32 with the reference's Q8 (pyq2.spec.reference). Reports how many codes differ, by how
much, and the relative change of dot(Q8 x, w) over random ternary rows. No GPU.

    PYTHONPATH=. python lab/seg/rstd_q8.py
"""

import numpy as np

from pyq2.spec.reference import _q8_groups


def fwht32(x, block):
    y = x.astype(np.float32).reshape(-1, block).copy()
    h = 1
    while h < block:
        z = y.reshape(y.shape[0], block // (2 * h), 2, h)
        a, b = z[:, :, 0, :].copy(), z[:, :, 1, :].copy()
        z[:, :, 0, :], z[:, :, 1, :] = a + b, a - b
        h *= 2
    return (y * np.float32(1.0 / np.sqrt(block))).reshape(x.shape)


def main():
    rng = np.random.default_rng(7)
    k, block, rows = 5120, 1024, 64
    diffs, total, rel = 0, 0, []
    big = 0
    for trial in range(200):
        h = (rng.standard_normal(k) * rng.choice([0.3, 1.0, 4.0])).astype(np.float32)
        h[rng.integers(0, k, 8)] *= np.float32(20.0)  # a few outliers, as residual streams have
        w = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
        s = rng.choice(np.array([-1.0, 1.0], np.float32), k)
        rstd = np.float32(1.0) / np.sqrt(np.mean(h.astype(np.float32) ** 2, dtype=np.float32) + np.float32(1e-6))
        v = fwht32(s * (h * rstd * w), block)[None, :]
        u = fwht32(s * (h * w), block)[None, :]
        q, sc = _q8_groups(v)
        q2, sc2 = _q8_groups(u)
        sc2 = (sc2 * rstd).astype(np.float32)
        d = np.abs(q.astype(np.int32) - q2.astype(np.int32))
        diffs += int((d > 0).sum())
        big += int((d > 1).sum())
        total += d.size
        wt = rng.integers(-1, 2, (rows, k)).astype(np.float64)
        x1 = (q[0].astype(np.float64) * sc[0][:, None]).reshape(k)
        x2 = (q2[0].astype(np.float64) * sc2[0][:, None]).reshape(k)
        exact = wt @ v[0].astype(np.float64)
        y1, y2 = wt @ x1, wt @ x2
        rel.append(np.linalg.norm(y2 - y1) / np.linalg.norm(y1))
        rel.append(-np.linalg.norm(y1 - exact) / np.linalg.norm(exact))  # today's own Q8 error, negative tag
    r = np.array(rel)
    print(f"codes differing: {diffs} of {total} ({diffs / total:.2e}), by more than 1: {big}")
    print(f"dot change from moving rstd: median {np.median(r[r >= 0]):.2e}, max {r[r >= 0].max():.2e}")
    print(f"today's Q8 error against the unquantised row: median {np.median(-r[r < 0]):.2e}")


if __name__ == "__main__":
    main()

"""sim.py - lab (issue 36): a fluid model of one SM of a persistent segment kernel.

NW warps each own a ring of B / NW bytes and an equal share of every matrix. The SM's read rate R
is shared equally among the warps with requests outstanding. Data issued at time t lands no
earlier than t + L. A warp consumes landed data at C * R / NW (C: the core's rate over the read
rate) unless it is held. At every matrix end the warps meet at a barrier. Then warp w is held
for hold(w) us: uniform (all S) or staggered (S * (w + 1) / NW). The result is the time over the
byte floor. The model is calibrated on the H200 ring probe (NOTES: segment-stalls-and-prefetch)
and then predicts faster cores and the tile-dataflow design's staggered waits.

    python lab/seg/sim.py
"""

import itertools

R_SM = 4530e9 / 132 / 1e6  # bytes a us an SM (H200 read rate over 132 SMs)
# the 27B's m = 1 matrices in step order, MB: out, gate_up, down, in_proj a layer; the head
LAYER_MB = (8.36, 47.35, 23.67, 22.28)
HEAD_MB = 337.0


def matrices(layers=64):
    mats = [mb for _ in range(layers) for mb in LAYER_MB] + [HEAD_MB]
    return [mb * 1e6 / 132 for mb in mats]  # bytes an SM


def simulate(C, S, stagger, B=112 * 1024, NW=8, L=2.2, dt=0.02, layers=64, rate=None):
    R_SM = rate or globals()['R_SM']
    mats = matrices(layers)
    share = [m / NW for m in mats]  # bytes a warp a matrix
    total = sum(share)
    cap = B / NW
    issued = [0.0] * NW      # bytes requested (cumulative over the walk)
    landed = [0.0] * NW      # bytes landed
    consumed = [0.0] * NW
    pending = [[] for _ in range(NW)]  # (time issued, cumulative bytes up to here)
    ends = list(itertools.accumulate(share))  # a warp's cumulative bytes at each matrix's end
    j = [0] * NW             # the matrix each warp consumes
    held_until = [0.0] * NW
    at_barrier = [False] * NW
    t = 0.0
    crate = C * R_SM / NW
    while min(consumed) < total - 1e-6:
        # issue: requests up to the ring's free space (the walk never waits for activations)
        for w in range(NW):
            room = consumed[w] + cap - issued[w]
            if room > 0 and issued[w] < total:
                issued[w] = min(total, issued[w] + room)
                pending[w].append((t, issued[w]))
        # serve: R shared by the warps with data past its latency
        ready = [w for w in range(NW) if landed[w] < issued[w] and pending[w] and pending[w][0][0] + L <= t]
        if ready:
            per = R_SM * dt / len(ready)
            for w in ready:
                # serve in order; a request's bytes land only after its own latency
                left = per
                while left > 0 and pending[w] and pending[w][0][0] + L <= t:
                    top = pending[w][0][1]
                    take = min(left, top - landed[w])
                    landed[w] += take
                    left -= take
                    if landed[w] >= top - 1e-9:
                        pending[w].pop(0)
        # consume
        for w in range(NW):
            if at_barrier[w] or t < held_until[w]:
                continue
            end = ends[j[w]]
            can = min(landed[w], end) - consumed[w]
            if can > 0:
                consumed[w] += min(can, crate * dt)
            if consumed[w] >= end - 1e-9:
                at_barrier[w] = True
        if all(at_barrier):  # the matrix's end: every warp met; then the holds
            for w in range(NW):
                at_barrier[w] = False
                j[w] = min(j[w] + 1, len(ends) - 1)
                Sj, stj = S(j[w]) if callable(S) else (S, stagger)  # the next matrix's wait
                hold = Sj * (w + 1) / NW if stj else Sj
                held_until[w] = t + hold
        t += dt
    floor = total * NW / R_SM
    return t / floor


def per_kind(waits):
    """A wait function from (S, staggered) per kind: out, gate_up, down, in_proj; the head's as in_proj's."""
    return lambda j: waits[min(j % 4, 3)] if j < 256 else waits[3]


def main():
    print("calibration (NOTES: segment-stalls-and-prefetch): H200, C 1.45, uniform stalls 0-3 us:",
          [round(simulate(1.45, S, False), 3) for S in (0, 1, 2, 3)], "measured 1.118 1.115 1.282 1.458")
    print(f"\n{'C':>4} {'S us':>5} {'uniform':>8} {'staggered':>10}")
    for C in (1.45, 1.7, 2.0, 2.5, 3.0):
        for S in (1.0, 2.0, 3.0, 4.0, 5.0):
            u = simulate(C, S, False)
            s = simulate(C, S, True)
            print(f"{C:4.2f} {S:5.1f} {u:8.3f} {s:10.3f}", flush=True)
    # the designs' waits a kind (the matrix's wait before it; j % 4: 0 out, 1 gate_up, 2 down, 3 in_proj)
    designs = {
        "WR mode 7 as measured (about 5 us each)": per_kind([(5.0, False)] * 4),
        "tile dataflow: norms 4 us, SwiGLU staggered 3 us, out 3 us": per_kind(
            [(3.0, False), (4.0, False), (3.0, True), (4.0, False)]),
        "tile dataflow, norms without rstd (staggered 3 us)": per_kind(
            [(3.0, False), (3.0, True), (3.0, True), (3.0, True)]),
    }
    print()
    for name, f in designs.items():
        print(f"{name:<62}", " ".join(f"C {C}: {simulate(C, f, False):.3f}" for C in (1.45, 2.0, 2.5, 3.0)), flush=True)


if __name__ == "__main__":
    main()

"""LAB (issue 36): read td.cu's JSON and print what the decision needs: each mode's x-floor by
variant, the cost a full boundary (variant 1 against variant 0 of the same mode, over 256
boundaries), the stamps' chain by role, and the best variant 3 against today's path.

    python3 lab/seg/td_report.py td.json --today 1.55
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--today", type=float, required=True, help="today's producers + calls, x floor, same device")
    a = ap.parse_args()
    d = json.load(open(a.json))
    floor = d["floor_ms"]
    print(f"{d['device']}: floor {floor:.3f} ms for {d['gb']:.3f} GB")

    def med(r):
        return sorted(r["ms"])[1]

    modes = {}
    for r in d["rows"]:
        if r["variant"] < 0 or r.get("compute", 1) == 0:
            continue
        key = (r["needed"], r.get("bal", 0), r.get("red", 0), r.get("fused", 0), r.get("own", 0), r["prod_ns"], r.get("rel", 1))
        modes.setdefault(key, {})[r["variant"]] = med(r) / floor
    print("needed bal red fused own prodns rel |   v0    v1    v2    v3 | full boundary us")
    best3 = None
    for key, v in sorted(modes.items()):
        cols = " ".join(f"{v[i]:5.2f}" if i in v else "    -" for i in range(4))
        fb = f"{(v[1] - v[0]) * floor * 1e3 / 256:6.1f}" if 0 in v and 1 in v else "     -"
        print(f"{key[0]:6} {key[1]:3} {key[2]:3} {key[3]:5} {key[4]:3} {key[5]:6} {key[6]:3} | {cols} | {fb}")
        if 3 in v and (best3 is None or v[3] < best3[0]):
            best3 = (v[3], key)
    for s in d.get("stamps", []):
        print(f"stamps v{s['variant']} mode {s.get('mode', s.get('bal'))} {s['role']:8} skew {s['skew']:5.2f} seen {s['seen']:5.2f} "
              f"prod {s['prod']:5.2f} copy {s['copy']:5.2f} start {s['start']:5.2f} total {s['total']:5.2f}")
    if best3:
        verdict = "beats" if best3[0] < a.today else "does not beat"
        print(f"best variant 3: {best3[0]:.3f}x (mode {best3[1]}), {verdict} today's {a.today:.2f}x")


if __name__ == "__main__":
    main()

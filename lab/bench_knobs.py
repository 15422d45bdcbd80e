"""LAB: `pyq2 bench ...` with the mixer kernels' module constants set from PQ2_KNOBS
("ATTENTION_TILES=4,GDN_BV=64,GDN_WARPS=4"), for an A/B of the whole model before a product change.

    PQ2_KNOBS=ATTENTION_TILES=4 python lab/bench_knobs.py bench --synthetic bonsai-2-27b --whole --ms 16
"""

import os
import sys

from pyq2.runtime import mixer_kernels as mk

for kv in filter(None, os.environ.get("PQ2_KNOBS", "").split(",")):
    k, v = kv.split("=")
    assert hasattr(mk, k), k
    setattr(mk, k, int(v))
    print(f"knob {k} = {v}", file=sys.stderr)

from pyq2.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))

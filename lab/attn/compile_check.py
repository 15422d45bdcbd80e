"""LAB: compile the attention decode kernels for sm_90a without a GPU (Triton's own compiler and
ptxas) at the probe's variants: shared memory, registers and spills per variant.

    /tmp/tvenv/bin/python lab/attn/compile_check.py   (a venv with triton 3.6 and numpy)
"""

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from persist import _attention_partial_persist  # noqa: E402

from pyq2.runtime.mixer_kernels import _attention_partial  # noqa: E402

COMMON = {
    "q_gate": "*fp32", "k_in": "*fp32", "v_in": "*fp32", "k_cache": "*bf16", "v_cache": "*bf16",
    "positions": "*i64", "q_norm": "*fp32", "k_norm": "*fp32", "cos": "*fp32", "sin": "*fp32",
    "m_out": "*fp32", "l_out": "*fp32", "acc_out": "*fp32",
    "s_qg": "i32", "s_k": "i32", "s_v": "i32", "s_cb": "i32", "s_ch": "i32", "s_cs": "i32",
    "n_chunks": "i32", "scale": "fp32", "eps": "fp32",
}  # fmt: skip
PERSIST = {"chunks": "i32", "n_items": "i32", "nprog": "i32"}


def compile_one(fn, persist, bs, tiles, warps, stages, store_first=False):
    sig = dict(COMMON)
    if persist:
        sig.update(PERSIST)
    consts = {"H": 24, "G": 6, "BG": 16, "D": 256, "HALF": 32, "NROT": 64, "BS": bs,
              "TILES": tiles, "PDL": True, "LINE": 64, "LINES": 4}  # fmt: skip
    if persist:
        consts["HKV"] = 4
        consts["STORE_FIRST"] = store_first
    for k in consts:
        sig[k] = "constexpr"
    # the JIT's specialisation: 16-byte aligned pointers and strides divisible by 16 (without these
    # hints the loads compile to scalar ld.global.b16 and the counts below mean nothing)
    aligned = [n for n, t in sig.items() if t.startswith("*")]
    aligned += ["s_qg", "s_k", "s_v", "s_cb", "s_ch", "s_cs", "n_chunks"]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(k.asm["cubin"])
    res = subprocess.run(["cuobjdump", "--dump-resource-usage", fh.name], capture_output=True,
                         text=True).stdout  # fmt: skip
    os.unlink(fh.name)
    line = [ln for ln in res.splitlines() if "REG" in ln]
    return k.metadata.shared, (line[0].strip() if line else res[-200:])


VARIANTS = [(128, 2, 8, 1), (128, 2, 4, 1), (64, 4, 8, 2), (64, 4, 4, 2), (64, 4, 4, 1),
            (32, 8, 4, 2), (32, 8, 4, 3), (32, 8, 2, 2), (32, 4, 4, 2), (128, 1, 4, 1),
            (128, 1, 8, 1), (64, 2, 4, 2), (64, 1, 4, 1), (32, 2, 4, 2)]  # fmt: skip
if __name__ == "__main__":
    for persist, fn, sf in ((False, _attention_partial, False),
                            (True, _attention_partial_persist, False),
                            (True, _attention_partial_persist, True)):  # fmt: skip
        for bs, tiles, warps, stages in VARIANTS:
            try:
                smem, usage = compile_one(fn, persist, bs, tiles, warps, stages, sf)
                print(f"{'persist' if persist else 'today  '}{' sf' if sf else '   '} bs {bs:3d} tiles {tiles} warps {warps}"
                      f" stages {stages}: smem {smem // 1024} KB | {usage}", flush=True)
            except Exception as e:
                print(f"{'persist' if persist else 'today  '} bs {bs} tiles {tiles} warps {warps} "
                      f"stages {stages}: ERROR {type(e).__name__}: {str(e)[:400]}", flush=True)

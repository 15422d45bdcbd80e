"""A model file's tensors as the float arrays they stand for, in the file's own conventions.

`read_float_weights(gf)` gives every tensor of a GGUF file (raw PQ2_0 / PTQ1_0 / TQ2_0, or
repacked by pyq2, fused or not) as a float32 numpy array in numpy order (a ggml [K, N] matrix is
[N, K]): PQ2-family weights dequantised; folded weights (the file's prism.hadamard.* contract,
FORMATS.md 4) unfolded, so that they read un-rotated activations; F32,
F16 and BF16 tensors as they are. The file's tensor and key conventions are otherwise kept (the
qwen35 conventions are pyq2.spec.qwen35's). One exception makes the result one convention: a
folded `ssm_out` of a file whose contract says `gdn_v_grouped` reads its input in the grouped
V-head order (the decode step permutes the tiled mixer output before rotating it); its columns
are put back in the tiled order every other tensor of the layer uses.

This is for models that fit in host memory as float32 (the CPU reference, the demo's float
twin); `max_bytes` refuses a larger one before reading anything.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..spec import formats, reference
from ..spec.rotation import Rotation
from . import weights as weight_io
from .contents import read_contents
from .io import GGUFFile
from .weights import Entry

DEFAULT_MAX_BYTES = 8 << 30  # float32 bytes the CPU reference takes by default
_DENSE = {"F32": np.float32, "F16": np.float16}


def float_bytes(gf: GGUFFile) -> int:
    """The float32 bytes read_float_weights would hold for the file."""
    total = 0
    for e in read_contents(gf, check_bytes=False).entries:
        total += 4 * int(np.prod(e.ne, dtype=np.int64))
    return total


def read_float_weights(
    gf: GGUFFile, max_bytes: int = DEFAULT_MAX_BYTES, backend: str = "auto"
) -> dict[str, np.ndarray]:
    """name -> float32 array of every original tensor of the file (module docstring)."""
    need = float_bytes(gf)
    if need > max_bytes:
        raise FormatError(
            f"{gf.path}: its tensors take {need / 2**30:.1f} GiB as float32, more than the "
            f"{max_bytes / 2**30:.1f} GiB the CPU path allows: run it on a GPU"
        )
    contents = read_contents(gf)
    rot = Rotation.from_file(gf, contents.input_widths())
    conv = weight_io.Backend(backend)
    v_heads = gf.value(f"{gf.value('general.architecture')}.ssm.time_step_rank")
    k_heads = gf.value(f"{gf.value('general.architecture')}.ssm.group_count")
    out: dict[str, np.ndarray] = {}
    for e in contents.entries:
        if e.info is None:
            out[e.name] = _dense(gf, e)
            continue
        w = _dequantized(conv, gf, e)
        if rot is not None and rot.carries(e.name):
            w = reference.unfold(w, rot.block, rot.signs_for(e.info.k))
            if rot.gdn_v_grouped and e.name.endswith(".ssm_out.weight"):
                w = _grouped_columns_to_tiled(w, v_heads, k_heads, e.name)
        out[e.name] = np.asarray(w, dtype=np.float32)
    return out


def _dequantized(conv: weight_io.Backend, gf: GGUFFile, e: Entry) -> np.ndarray:
    assert e.info is not None and e.stored is not None
    n, k = e.info.n, e.info.k
    rows = weight_io.slice_rows(k, e.stored.layout.tile_rows)
    out = np.empty((n, k), dtype=np.float32)
    for r0, raw in e.slices(conv, gf, rows):
        m = len(raw) // (k // formats.PQ2_BLOCK_WEIGHTS * formats.PQ2_BLOCK_BYTES)
        out[r0 : r0 + m] = formats.pq2_dequantize(raw, m, k)
    return out


def _dense(gf: GGUFFile, e: Entry) -> np.ndarray:
    t = e.tensor
    shape = tuple(reversed(t.ne))
    data = np.concatenate(list(e.chunks(gf))) if t.nbytes else np.zeros(0, np.uint8)
    if t.type_name in _DENSE:
        return data.view(_DENSE[t.type_name]).astype(np.float32).reshape(shape)
    if t.type_name == "BF16":
        bits = data.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    raise FormatError(f"{gf.path}: tensor '{t.name}' is {t.type_name}, which pyq2 cannot read")


def _grouped_columns_to_tiled(w: np.ndarray, v_heads, k_heads, name: str) -> np.ndarray:
    if not (isinstance(v_heads, int) and isinstance(k_heads, int) and k_heads > 0):
        raise FormatError(f"{name}: gdn_v_grouped needs ssm.time_step_rank and ssm.group_count")
    perm = reference.gdn_v_grouped(np.arange(w.shape[1]), v_heads, k_heads)
    tiled = np.empty_like(w)
    tiled[:, perm] = w  # W_grouped @ x[perm] == W_tiled @ x
    return tiled

"""A whole model on the GPU for a host: `load(path)` or `synthetic(preset)`.

`load` memory-maps a GGUF file (raw PQ2_0 / PTQ1_0 / TQ2_0, or repacked by pyq2) and checks it
before it allocates any GPU memory: the architecture map, the rotation contract, every weight's
stored size and metadata, the dense tensors' types. It then uploads one tensor at a time:
PQ2-family weights converted on the fly to the resident layout (tiles, rt 2 by default) in
slices of rows through one pinned staging buffer, so host memory stays near one slice, every
scale checked on the way (a non-finite one is a FormatError naming tensor, row and block, and
frees what was uploaded); the norms and other small tensors as they are (F32, F16, BF16).
`synthetic` builds a model of a preset's shapes (pyq2.arch.PRESETS) with random ternary weights
directly on the GPU, for benchmarks without a file.

A Model holds per tensor its device buffer, layout, tile height, logical shape, stored type
and the rotation width it reads; the rotation's sign vectors are on the device too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import formats, gguf_io, layouts, weight_io
from .arch import PRESETS, Dims, Plan, decode_plan
from .errors import FormatError
from .gguf_types import type_name
from .gpu import DeviceRotation, PQ2Weights, _torch
from .rotation import Rotation

# ggml types of the dense tensors a model may hold, and their numpy storage
DENSE_TYPES = {0: ("F32", np.float32), 1: ("F16", np.float16), 30: ("BF16", np.uint16)}

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)


@dataclass
class Weight:
    """One PQ2-family weight on the GPU: the matrix, its stored type and the rotation width
    (its input width K when the file folds it, else None)."""

    name: str
    matrix: PQ2Weights
    source: str  # "PQ2_0", "PTQ1_0", "TQ2_0" (for a repacked file, the type it came from)
    rotation_width: int | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.n, self.matrix.k


@dataclass
class Model:
    plan: Plan
    rotation: Rotation | None
    weights: dict[str, Weight]
    dense: dict[str, Any]  # name -> torch tensor (F32, F16, BF16; gguf shape reversed)
    rotations: dict[int, DeviceRotation] = field(default_factory=dict)  # width -> device signs
    source: str = ""
    gdn_v_grouped: bool = False  # the Gated-DeltaNet output is permuted before ssm_out

    def rotation_for(self, width: int) -> DeviceRotation | None:
        return self.rotations.get(width)

    def step_bytes(self, m: int) -> int:
        """Bytes of weights one decode step of m tokens reads: every projection whole, m rows of
        the embedding (PQ2_0 bytes: 34 per 128 weights)."""
        emb = self.weights[self.plan.embedding].matrix
        proj = (self.weights[n].matrix for n in self.plan.weights()[1:])
        rows = min(m, emb.n) * formats.pq2_matrix_bytes(1, emb.k)
        return rows + sum(formats.pq2_matrix_bytes(w.n, w.k) for w in proj)


def _plan_and_rotation(gf) -> tuple[Plan, Rotation | None, dict[str, Any]]:
    """Everything load checks before it allocates: the plan, the contract, and per tensor the
    WeightInfo (PQ2 family) or the dense type."""
    names = [t.name for t in gf.tensors]
    plan = decode_plan(names, gf)
    infos: dict[str, Any] = {}
    for t in gf.tensors:
        info = gf.weight_info(t)
        if info is not None:
            gf.validate_weight_bytes(t, info, weight_io.stored_bytes(info))
            infos[t.name] = info
        elif t.type_id in DENSE_TYPES:
            infos[t.name] = DENSE_TYPES[t.type_id]
        else:
            raise FormatError(
                f"{gf.path}: tensor '{t.name}' has type {type_name(t.type_id)}, which pyq2 does "
                f"not load (PQ2_0, PTQ1_0, TQ2_0, F32, F16, BF16)"
            )
    for name in plan.weights():
        if not hasattr(infos[name], "k"):
            raise FormatError(f"{gf.path}: '{name}' is read by a projection but is not ternary")
    widths = {n: i.k for n, i in infos.items() if hasattr(i, "k")}
    rotation = Rotation.from_file(gf, widths)
    return plan, rotation, infos


def _upload_weight(backend, gf, t, info, layout: str, rt: int, staging, device) -> PQ2Weights:
    """The weight converted to `layout` slice by slice into one device buffer."""
    torch = _torch()
    rt = layouts.layout_rt(layout, rt)
    total = layouts.layout_bytes(layout, info.n, info.k, rt)
    dev = torch.empty(total, dtype=torch.uint8, device=device)
    tr = layouts.tile_rows(layout, rt)
    rows = weight_io.slice_rows(info.k, tr, weight_io.stored_tile_rows(info))
    scale_start = layouts.region_bytes(layout, info.n, info.k, rt)[0]
    g = info.k // formats.PQ2_BLOCK_WEIGHTS
    for r0, raw in weight_io.raw_slices(backend, gf, t, info, rows):
        n = raw.size // (g * formats.PQ2_BLOCK_BYTES)
        formats.check_scales(raw, blocks_per_row=g, tensor=t.name, first_row=r0)
        conv = backend.convert(raw, n, info.k, "raw", layout, 0, rt)
        codes = -(-n // tr) * tr * info.k // 4  # the slice's stored rows, padding included
        for offset, piece in (
            (r0 * info.k // 4, conv[:codes]),
            (scale_start + r0 * g * 2, conv[codes:]),
        ):
            if piece.size > staging.numel():  # rows wider than the staging buffer
                staging = torch.empty(piece.size, dtype=torch.uint8).pin_memory()
            host = staging[: piece.size]
            host.copy_(torch.from_numpy(piece))
            dev[offset : offset + piece.size].copy_(host, non_blocking=True)
            torch.cuda.current_stream(dev.device).synchronize()  # the staging buffer is reused
    return PQ2Weights(dev, info.n, info.k, layout, rt)


def _upload_dense(gf, t, storage, device):
    torch = _torch()
    _, np_type = storage
    arr = np.frombuffer(gf.data(t), dtype=np_type).reshape(tuple(reversed(t.ne)))
    out = torch.from_numpy(arr.copy()).to(device)
    return out.view(torch.bfloat16) if np_type is np.uint16 else out


def load(
    path,
    layout: str = "tiles",
    rt: int = 2,
    device: str = "cuda",
    progress: Progress | None = None,
) -> Model:
    """The model in the file at `path` on the GPU (module docstring). FormatError (nothing kept
    on the GPU) for a file pyq2 cannot serve."""
    torch = _torch()
    if layout not in ("planes", "tiles"):
        raise ValueError(f"layout {layout!r}: the matmul reads 'planes' or 'tiles'")
    with gguf_io.open_gguf(path) as gf:
        plan, rotation, infos = _plan_and_rotation(gf)
        total = sum(t.nbytes for t in gf.tensors)
        staging = torch.empty(
            2 * weight_io.CONVERT_CHUNK + (1 << 20), dtype=torch.uint8
        ).pin_memory()
        backend = weight_io.Backend("native")
        weights: dict[str, Weight] = {}
        dense: dict[str, Any] = {}
        done = 0
        try:
            for t in gf.tensors:
                info = infos[t.name]
                if hasattr(info, "k"):
                    m = _upload_weight(backend, gf, t, info, layout, rt, staging, device)
                    folded = rotation is not None and (
                        rotation.folds(t.name) or t.name in rotation.inverse_weight_names
                    )
                    weights[t.name] = Weight(
                        t.name, m, type_name(info.source_type), info.k if folded else None
                    )
                else:
                    dense[t.name] = _upload_dense(gf, t, info, device)
                done += t.nbytes
                if progress:
                    progress(done, total, t.name)
        except BaseException:
            weights.clear()
            dense.clear()
            torch.cuda.empty_cache()
            raise
    rotations: dict[int, DeviceRotation] = {}
    if rotation is not None:
        for w in {w.rotation_width for w in weights.values()}:
            if w is not None:
                rotations[w] = DeviceRotation.of(rotation, w, device)
    grouped = rotation is not None and rotation.gdn_v_grouped
    return Model(plan, rotation, weights, dense, rotations, str(Path(path)), grouped)


def synthetic(preset: str | Dims, device: str = "cuda", block: int = 1024, seed: int = 0) -> Model:
    """A model of a preset's shapes (pyq2.arch.PRESETS) with random ternary weights (codes
    uniform in 0..2, scales 0.01) in the tiles layout, random signs for every input width, norm
    weights 1, small random dense tensors: real-shaped work for a benchmark, built on the GPU."""
    torch = _torch()
    dims = PRESETS[preset] if isinstance(preset, str) else preset
    tensors = dims.tensors()
    plan = decode_plan([n for n, _, _ in tensors], dims.keys())
    gen = torch.Generator(device=device).manual_seed(seed)
    scale = np.float16(0.01).view(np.uint16).item()
    # bytes of four codes in 0..2: 81 of the 256 byte values
    lut = torch.tensor(
        [b for b in range(256) if all((b >> s) & 3 != 3 for s in (0, 2, 4, 6))],
        dtype=torch.uint8,
        device=device,
    )
    weights, dense, widths = {}, {}, set()
    for name, kind, ne in tensors:
        if kind == "dense":
            dense[name] = torch.ones(tuple(reversed(ne)), device=device, dtype=torch.bfloat16)
            continue
        k, n = ne
        codes, scales = layouts.region_bytes("tiles", n, k, 2)
        data = torch.empty(codes + scales, dtype=torch.uint8, device=device)
        idx = torch.randint(0, lut.numel(), (codes,), generator=gen, device=device)
        data[:codes] = lut[idx]
        data[codes:].view(torch.int16).fill_(scale)
        weights[name] = Weight(name, PQ2Weights(data, n, k, "tiles", 2), "PQ2_0", k)
        widths.add(k)
    rotations = {}
    for w in sorted(widths):
        s = torch.randint(0, 2, (w,), generator=gen, device=device, dtype=torch.int8) * 2 - 1
        rotations[w] = DeviceRotation(block if w % block == 0 else 128, s)
    return Model(plan, None, weights, dense, rotations, f"synthetic {preset}", True)

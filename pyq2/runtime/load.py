"""A whole model on the GPU for a host: `load(path)` or `synthetic(preset)`.

`load` memory-maps a GGUF file (raw PQ2_0 / PTQ1_0 / TQ2_0, or repacked by pyq2, fused or not)
and checks it before it allocates any GPU memory (`check`): the architecture map, the rotation
contract, every weight's stored size and metadata, the fused tensors' metadata (pyq2.offline.fuse),
the dense tensors' types. It then uploads the tensors: PQ2-family weights converted on the fly
to the resident layout (tiles, rt 2 by default) in slices of rows, each weight by one of
LOAD_THREADS threads (libpq2 converts without the GIL) through that thread's pinned staging
buffer and stream, so host memory stays near one slice a thread, every scale checked on the way
(a non-finite one is a FormatError naming tensor, row and block, and frees what was uploaded);
the norms and other small tensors as they are (F32, F16, BF16). `synthetic` builds a model of
a preset's shapes (pyq2.plan.decode.PRESETS) with random ternary weights directly on the GPU,
for benchmarks without a file, whole or one rank's shard of it (pyq2.plan.tensor_parallel).

A tensor-parallel shard (`pyq2 repack --tp G`) loads as a model of its parts: `Model.tp` is
(G, rank), `Model.splits` what it holds of each cut tensor, the plan counts the rank's own
Gated-DeltaNet heads, and each row-parallel weight's rotation is the whole width's restricted
to its columns (its slice of the signs). Its head must hold the rows
pyq2.plan.tensor_parallel.head_rows gives its rank, the order its decode step gathers the logits
in; the step needs a collective (pyq2.runtime.step).

A Model holds per weight (by its original name) its device matrix, stored type and the rotation
width it reads; the rotation's sign vectors are on the device too. A fused tensor of the file
is one matrix (`Model.fused`, which the decode step runs as it is), and its members are Weights
that know their rows in it. Its members must be whole tiles of the layout loaded into, else
they are uploaded as matrices of their own.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..gguf import io as gguf_io
from ..gguf import weights as weight_io
from ..gguf.contents import Contents, read_contents
from ..gguf.io import Tensor
from ..gguf.metadata import Member
from ..gguf.splits import Split
from ..gguf.types import DENSE_TYPES, type_name
from ..gguf.weights import Entry, Progress
from ..lib.cuda import DeviceRotation, PQ2Weights
from ..lib.optional import require_torch
from ..plan.decode import PRESETS, Dims, Plan, decode_plan
from ..plan.tensor_parallel import head_rows, rank_signs, shard_plan
from ..spec import formats, layouts
from ..spec.layouts import Layout
from ..spec.rotation import Rotation


@dataclass(frozen=True)
class Part:
    """Where a weight's rows are: rows [row0, row0 + rows) of a fused matrix."""

    matrix: PQ2Weights
    row0: int
    rows: int

    def copy(self) -> PQ2Weights:
        """The rows as a matrix of their own (a device copy: its code and scale pieces)."""
        f = self.matrix
        codes, scales = f.geometry.row_ranges(self.row0, self.row0 + self.rows)
        pieces = [f.data[codes.start : codes.stop], f.data[scales.start : scales.stop]]
        data = (
            np.concatenate(pieces)
            if isinstance(f.data, np.ndarray)
            else require_torch().cat(pieces)
        )
        return PQ2Weights(data, self.rows, f.k, f.layout, f.rt)


@dataclass(eq=False)
class Weight:
    """One PQ2-family weight on the GPU: the matrix, its stored type and the rotation width
    (its input width K when the file folds it, else None).

    A member of a fused matrix has `part` and no matrix of its own until `matrix` is first
    asked for, which copies its rows out (more device memory; the decode step never asks)."""

    name: str
    stored: PQ2Weights | None
    source: str  # "PQ2_0", "PTQ1_0", "TQ2_0" (for a repacked file, the type it came from)
    rotation_width: int | None
    part: Part | None = None

    @property
    def matrix(self) -> PQ2Weights:
        if self.stored is None:
            if self.part is None:
                raise ValueError(f"weight '{self.name}' has no matrix")
            self.stored = self.part.copy()
        return self.stored

    @property
    def shape(self) -> tuple[int, int]:
        if self.stored is None and self.part is not None:
            return self.part.rows, self.part.matrix.k
        return self.matrix.n, self.matrix.k


@dataclass
class Fused:
    """A fused tensor of the file on the GPU: its matrix (named as the file names it) and its
    members (pyq2.gguf.metadata.Member), in row order."""

    weight: Weight
    members: tuple[Member, ...]


@dataclass
class Model:
    plan: Plan
    rotation: Rotation | None
    weights: dict[str, Weight]  # every ternary weight by its original name
    dense: dict[str, Any]  # name -> torch tensor (F32, F16, BF16; gguf shape reversed)
    rotations: dict[int, DeviceRotation] = field(default_factory=dict)  # width -> device signs
    source: str = ""
    gdn_v_grouped: bool = False  # the Gated-DeltaNet output is permuted before ssm_out
    fused: dict[str, Fused] = field(default_factory=dict)  # the file's fused tensors by name
    tp: tuple[int, int] | None = None  # a tensor-parallel shard's (G, rank); None: whole
    # a shard's parts (pyq2.plan.tensor_parallel)
    splits: dict[str, Split] = field(default_factory=dict)
    # the matrices decode steps concatenate (pyq2.runtime.step.concat_rows), by member names:
    # made once for every step of the model
    concatenated: dict[tuple[str, ...], PQ2Weights] = field(default_factory=dict)
    # the side projections' weights of a stage, concatenated in a step's dtype (DecodeStep):
    # made once for every step of the model
    side_weights: dict[tuple[tuple[str, ...], Any], Any] = field(default_factory=dict)

    def rotation_for(self, width: int) -> DeviceRotation | None:
        return self.rotations.get(width)

    def fused_for(self, names: Sequence[str]) -> Fused | None:
        """The fused matrix whose members are exactly `names`, in this order, if there is one."""
        for f in self.fused.values():
            if tuple(m.name for m in f.members) == tuple(names):
                return f
        return None

    def step_bytes(self, m: int) -> int:
        """Bytes of weights one decode step of m tokens reads: every projection whole, m rows of
        the embedding (PQ2_0 bytes, FORMATS.md 1.1)."""
        emb_n, emb_k = self.weights[self.plan.embedding].shape
        proj = (self.weights[n].shape for n in self.plan.weights()[1:])
        rows = min(m, emb_n) * formats.pq2_matrix_bytes(1, emb_k)
        return rows + sum(formats.pq2_matrix_bytes(n, k) for n, k in proj)


@dataclass
class Checked:
    """What load checks before it allocates: the plan, the rotation contract, the file's
    original tensors (fused ones split, pyq2.offline.fuse) and the storage of each dense tensor."""

    plan: Plan  # a shard's: with its own Gated-DeltaNet head counts
    rotation: Rotation | None
    contents: Contents
    dense: dict[str, tuple[str, Any]]
    signs: dict[int, np.ndarray | None]  # per input width the weights read (rotation_signs)


def check(gf) -> Checked:
    """Everything about the open file `gf` that load checks before it allocates (module
    docstring); FormatError naming the file and the fault."""
    contents = read_contents(gf)
    plan = decode_plan([e.name for e in contents.entries], gf)
    dense: dict[str, tuple[str, Any]] = {}
    widths = contents.input_widths()
    for e in contents.entries:
        if e.info is not None:
            continue
        if e.tensor.type_id in DENSE_TYPES:
            dense[e.name] = DENSE_TYPES[e.tensor.type_id]
        else:
            raise FormatError(
                f"{gf.path}: tensor '{e.name}' has type {type_name(e.tensor.type_id)}, which pyq2 "
                f"does not load (PQ2_0, PTQ1_0, TQ2_0, F32, F16, BF16)"
            )
    for name in plan.weights():
        if name not in widths:
            raise FormatError(f"{gf.path}: '{name}' is read by a projection but is not ternary")
    rotation = Rotation.from_file(gf, widths)
    stages = {s.projections for s in plan.stages}
    for fname, members in contents.fused.items():
        names = tuple(m.name for m in members)
        if names not in stages:
            raise FormatError(
                f"{gf.path}: fused tensor '{fname}' holds {', '.join(names)}, which are not the "
                f"projections of one stage of the decode step (those that read one activation, "
                f"in its order)"
            )
        if rotation is not None and len({rotation.carries(n) for n in names}) > 1:
            raise FormatError(
                f"{gf.path}: fused tensor '{fname}' holds weights folded with the rotation and "
                f"weights that are not"
            )
    g, rank = contents.shard or (1, 0)
    signs = {}
    if rotation is not None:
        weights = [
            (e.name, e.info.k, e.split)
            for e in contents.entries
            if e.info is not None and rotation.carries(e.name)
        ]
        signs = rank_signs(rotation, weights, rank, gf.path)
    splits = contents.splits()
    head = plan.stages[-1].projections[0]
    if head in splits:  # the step gathers the logits in pyq2.plan.tensor_parallel.head_rows order
        a, b = head_rows(splits[head].extent, g)[rank]
        if splits[head].pieces[rank] != ((a, b),):
            raise FormatError(
                f"{gf.path}: its head holds {splits[head].held(rank)}, but rank {rank} of {g} "
                f"holds rows {a}:{b} (pyq2.plan.tensor_parallel.head_rows)"
            )
    return Checked(local_heads(plan, splits, rank), rotation, contents, dense, signs)


def assemble(
    gf,
    checked: Checked,
    upload: Callable[[Entry, Layout], Any],
    upload_dense: Callable[[Tensor, tuple[str, Any]], Any],
    layout: str,
    rt: int,
    progress: Progress | None = None,
) -> tuple[dict[str, Weight], dict[str, Fused], dict[str, Any]]:
    """The weights, fused matrices and dense tensors of a checked file, in its original order,
    each made by `upload` (an Entry to its bytes as the matrix given, in layout/rt) or
    `upload_dense`. A fused tensor is uploaded as one matrix when its members are whole tiles of
    layout/rt, else member by member."""
    rot = checked.rotation
    fused_in = checked.contents.fused
    tr = Layout(layout, 1, formats.PQ2_BLOCK_WEIGHTS, rt).tile_rows  # the tile height of layout/rt
    weights: dict[str, Weight] = {}
    fused: dict[str, Fused] = {}
    dense: dict[str, Any] = {}
    total, done = sum(t.nbytes for t in gf.tensors), 0

    def width(name: str, k: int) -> int | None:
        return k if rot is not None and rot.carries(name) else None

    def matrix(e: Entry, target: Layout) -> PQ2Weights:
        return PQ2Weights(upload(e, target), target.n, target.k, target.name, target.rt)

    for e in checked.contents.entries:
        info = e.info
        if info is None:
            dense[e.name] = upload_dense(e.tensor, checked.dense[e.name])
        elif e.fused is None or any(m.row0 % tr for m in fused_in[e.fused]):
            source = type_name(info.source_type)
            target = Layout(layout, info.n, info.k, rt)
            weights[e.name] = Weight(e.name, matrix(e, target), source, width(e.name, info.k))
        else:
            if e.fused not in fused:
                assert e.stored is not None
                whole = Entry(e.fused, e.tensor, e.stored, e.stored)
                m = matrix(whole, Layout(layout, e.stored.n, e.stored.k, rt))
                w = Weight(e.fused, m, type_name(info.source_type), width(e.name, info.k))
                fused[e.fused] = Fused(w, fused_in[e.fused])
            f = fused[e.fused].weight
            part = Part(f.matrix, e.row0, info.n)
            weights[e.name] = Weight(e.name, None, f.source, f.rotation_width, part)
        done += e.nbytes
        if progress:
            progress(done, total, e.name)
    return weights, fused, dense


def _upload_weight(
    torch: Any, backend: weight_io.Backend, gf, e: Entry, target: Layout, staging, device
) -> Any:
    """The bytes of weight e as the matrix `target` in one device buffer: converted and placed
    piece by piece (pyq2.gguf.weights.convert), each piece through the pinned `staging` buffer
    (None: copied directly, for a device in host memory)."""
    dev = torch.empty(target.bytes, dtype=torch.uint8, device=device)
    _fill_weight(torch, backend, gf, e, target, staging, dev)
    return dev


def _fill_weight(
    torch: Any, backend: weight_io.Backend, gf, e: Entry, target: Layout, staging, dev
) -> None:
    """_upload_weight into the buffer `dev`, on the current stream."""
    for piece in weight_io.convert(backend, gf, [e], target):
        for at, data in ((piece.code_at, piece.codes), (piece.scale_at, piece.scales)):
            if data is None:
                continue
            src = torch.from_numpy(data)
            if staging is not None:
                if data.size > staging.numel():  # rows wider than the staging buffer
                    staging = torch.empty(data.size, dtype=torch.uint8).pin_memory()
                src = staging[: data.size].copy_(src)
            dev[at : at + data.size].copy_(src, non_blocking=staging is not None)
            if staging is not None:  # the staging buffer is reused
                torch.cuda.current_stream(dev.device).synchronize()


LOAD_THREADS = 8  # at most; and at most the CPUs this process may run on


class _Uploader:
    """upload(e, target) for assemble: the device buffer at once, its bytes filled by a pool of
    threads (_fill_weight), each with its own pinned staging buffer and stream, after the
    buffer's allocation on the caller's stream. At most AHEAD weights a thread are queued (so
    assemble's progress runs at most that far ahead of the copies); a thread's error is raised
    by the first upload call that waits for it or by finish(). close() cancels what has not
    started and waits for the rest."""

    AHEAD = 2

    def __init__(self, torch: Any, backend: weight_io.Backend, gf, device: Any):
        self.torch, self.backend, self.gf, self.device = torch, backend, gf, device
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.threads = max(1, min(LOAD_THREADS, cpus or 1))
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pyq2-load")
        self.pending: deque[Future[None]] = deque()
        self.local = threading.local()

    def __call__(self, e: Entry, target: Layout) -> Any:
        torch = self.torch
        while len(self.pending) >= self.AHEAD * self.threads:
            self.pending.popleft().result()
        dev = torch.empty(target.bytes, dtype=torch.uint8, device=self.device)
        allocated = torch.cuda.Event()
        allocated.record(torch.cuda.current_stream(dev.device))
        self.pending.append(self.pool.submit(self._fill, e, target, dev, allocated))
        return dev

    def _fill(self, e: Entry, target: Layout, dev: Any, allocated: Any) -> None:
        torch, local = self.torch, self.local
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(device=dev.device)
            local.staging = torch.empty(
                2 * weight_io.CONVERT_CHUNK + (1 << 20), dtype=torch.uint8
            ).pin_memory()
        local.stream.wait_event(allocated)  # the buffer's earlier users on the caller's stream
        with torch.cuda.stream(local.stream):
            _fill_weight(torch, self.backend, self.gf, e, target, local.staging, dev)

    def finish(self) -> None:
        """Every queued weight on the device, the threads stopped."""
        while self.pending:
            self.pending.popleft().result()
        self.torch.cuda.synchronize(self.device)
        self.pool.shutdown(wait=True)

    def close(self) -> None:
        for f in self.pending:
            f.cancel()
        self.pool.shutdown(wait=True)
        self.pending.clear()


def _upload_dense(gf, t, storage, device):
    torch = require_torch()
    _, np_type = storage
    arr = np.frombuffer(gf.data(t), dtype=np_type).reshape(tuple(reversed(t.ne)))
    out = torch.from_numpy(arr.copy()).to(device)
    return out.view(torch.bfloat16) if np.dtype(np_type) == np.uint16 else out


def load(
    path,
    layout: str = "tiles",
    rt: int = 2,
    device: str = "cuda",
    progress: Progress | None = None,
) -> Model:
    """The model in the file at `path` on the GPU (module docstring). FormatError (nothing kept
    on the GPU) for a file pyq2 cannot serve."""
    torch = require_torch()
    if layout not in ("planes", "tiles"):
        raise ValueError(f"layout {layout!r}: the matmul reads 'planes' or 'tiles'")
    rt = layouts.layout_rt(layout, rt)
    with gguf_io.open_gguf(path) as gf:
        checked = check(gf)
        uploader = _Uploader(torch, weight_io.Backend("native"), gf, device)
        try:
            weights, fused, dense = assemble(
                gf,
                checked,
                uploader,
                lambda t, storage: _upload_dense(gf, t, storage, device),
                layout,
                rt,
                progress,
            )
            uploader.finish()
        except BaseException as e:
            uploader.close()
            weights = fused = dense = {}  # this frame's hold on what was uploaded
            # The traceback's frames hold what was uploaded: free it now, not with the error.
            traceback.clear_frames(e.__traceback__)
            torch.cuda.empty_cache()
            raise
    rotation = checked.rotation
    rotations: dict[int, DeviceRotation] = {}
    if rotation is not None:
        for width, signs in checked.signs.items():
            rotations[width] = DeviceRotation.from_signs(rotation.block, signs, device)
    grouped = rotation is not None and rotation.gdn_v_grouped
    splits = checked.contents.splits()
    return Model(
        checked.plan,
        rotation,
        weights,
        dense,
        rotations,
        str(Path(path)),
        grouped,
        fused,
        checked.contents.shard,
        splits,
    )


def local_heads(plan: Plan, splits: dict[str, Split], rank: int) -> Plan:
    """The plan with a shard's own Gated-DeltaNet V and K head counts (the mixer's permutation
    works on the rank's heads), from its part of ssm_alpha; the plan itself for a whole model."""
    for name, split in splits.items():
        if name.endswith(".ssm_alpha.weight"):
            v = split.size(rank)
            return replace(plan, v_heads=v, k_heads=v * plan.k_heads // plan.v_heads)
    return plan


def synthetic(
    preset: str | Dims,
    device: str = "cuda",
    block: int = 1024,
    seed: int = 0,
    tp: tuple[int, int] | None = None,
) -> Model:
    """A model of a preset's shapes (pyq2.plan.decode.PRESETS) with random ternary weights (codes
    uniform in 0..2, scales 0.01) in the tiles layout, random signs for every input width
    (rotation blocks of `block`, or 128 when it does not divide every width), norm weights 1,
    the recurrence's parameters of a decaying recurrence (_synthetic_dense), small random side
    projections: real-shaped work for a benchmark of the weight path or the whole model, built on
    the GPU.
    With tp = (G, rank), the rank's shard of it (pyq2.plan.tensor_parallel, every projection folded
    with blocks of `block`)."""
    torch = require_torch()
    dims = PRESETS[preset] if isinstance(preset, str) else preset
    tensors = dims.tensors()
    plan = decode_plan([n for n, _, _ in tensors], dims.keys())
    # one block for every width: `block` where it divides them all (the 27B), else 128
    if any(k % block for _, kind, (k, *_) in tensors if kind == "pq2"):
        block = 128
    splits: dict[str, Split] = {}
    if tp is not None:
        g, rank = tp
        folded = tuple(t for t, kind, _ in tensors if kind == "pq2")
        rot = Rotation(1, block, "identity", {}, folded[1:], folded[:1], True)
        shapes = {t: shape for t, _, shape in tensors}
        splits = shard_plan(shapes, plan, dims.keys(), rot, g, f"preset {preset}").splits
        tensors = [
            (t, kind, splits[t].shape(shape, rank) if t in splits else shape)
            for t, kind, shape in tensors
        ]
        plan = local_heads(plan, splits, rank)
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
            dense[name] = _synthetic_dense(name, tuple(reversed(ne)), gen, device)
            continue
        k, n = ne
        codes, scales = Layout("tiles", n, k, 2).regions
        data = torch.empty(codes + scales, dtype=torch.uint8, device=device)
        idx = torch.randint(0, lut.numel(), (codes,), generator=gen, device=device)
        data[:codes] = lut[idx]
        data[codes:].view(torch.int16).fill_(scale)
        weights[name] = Weight(name, PQ2Weights(data, n, k, "tiles", 2), "PQ2_0", k)
        widths.add(k)
    rotations = {}
    for w in sorted(widths):
        s = torch.randint(0, 2, (w,), generator=gen, device=device, dtype=torch.int8) * 2 - 1
        rotations[w] = DeviceRotation(block, s)
    name = f"synthetic {preset}" + (f", shard {tp[1]} of {tp[0]}" if tp else "")
    return Model(plan, None, weights, dense, rotations, name, True, {}, tp, splits)


def _synthetic_dense(name: str, shape: tuple[int, ...], gen: Any, device: Any) -> Any:
    """A synthetic model's dense tensor (bf16) with the magnitudes of a trained one: norms 1,
    ssm_a = -exp(U[0, log 16]) (a decaying recurrence), dt bias in [-2, 0], a convolution that
    passes its input on, side projections N(0, 0.02)."""
    torch = require_torch()

    def uniform(lo: float, hi: float) -> Any:
        return lo + (hi - lo) * torch.rand(shape, generator=gen, device=device)

    if name.endswith("ssm_a"):
        x = -torch.exp(uniform(0.0, float(np.log(16.0))))
    elif name.endswith("ssm_dt.bias"):
        x = uniform(-2.0, 0.0)
    elif name.endswith("ssm_conv1d.weight"):
        x = 0.3 + 0.2 * torch.randn(shape, generator=gen, device=device)
    elif len(shape) == 2:
        x = 0.02 * torch.randn(shape, generator=gen, device=device)
    else:
        x = torch.ones(shape, device=device)
    return x.to(torch.bfloat16)

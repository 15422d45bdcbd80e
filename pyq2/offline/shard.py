"""A rank's part of a model's tensors (pyq2.plan.tensor_parallel), read from the whole model's file.

`shard_entries(gf, contents, plan, rank)` lists the original tensors as shard r holds them:
a tensor the plan does not cut as the file's own Entry, a cut one as a ShardEntry, an Entry
whose rows (`slices`, for a weight) or bytes (`chunks`, for a dense tensor) are the rank's
pieces of the source. pyq2.offline.repack writes them like any other tensors (`--tp G`), so a shard
is converted, fused and checked exactly as a whole file is.

A weight cut along its rows (axis 1) is read piece by piece, each piece from the tile of the
stored layout it starts in; one cut along its columns (axis 0) is read a slice of rows at a
time, keeping the 128-groups of its pieces (the plan cuts at whole groups). A dense tensor
(F32, F16, BF16) is read whole and cut in numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from ..errors import FormatError
from ..gguf import io as gguf_io
from ..gguf import metadata
from ..gguf import weights as weight_io
from ..gguf.contents import Contents
from ..gguf.io import GGUFFile, OutTensor
from ..gguf.metadata import WeightInfo
from ..gguf.splits import Split
from ..gguf.types import DENSE_TYPES, type_name, type_nbytes
from ..gguf.weights import Entry
from ..plan.decode import decode_plan
from ..plan.tensor_parallel import ShardPlan, piece_indices, shard_plan
from ..spec.formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS
from ..spec.rotation import Rotation


def _item(type_id: int) -> np.dtype:
    """The numpy storage of a dense type (gguf_types.DENSE_TYPES)."""
    return np.dtype(DENSE_TYPES[type_id][1])


@dataclass(frozen=True)
class ShardEntry(Entry):
    """Rank `rank`'s part of the original tensor `source` (`split`, the plan's cut of it, with
    every rank's pieces). For a weight, info is the part's own shape; stored stays the
    source's."""

    source: Entry | None = None
    rank: int = 0

    def _cut(self) -> tuple[Entry, Split]:
        assert self.source is not None and self.split is not None
        return self.source, self.split

    def slices(
        self, backend: weight_io.Backend, gf: GGUFFile, rows: int
    ) -> Iterator[tuple[int, np.ndarray]]:
        src, split = self._cut()
        assert src.info is not None and self.info is not None
        pieces = split.pieces[self.rank]
        if split.axis == 0:
            g = src.info.k // PQ2_BLOCK_WEIGHTS
            blocks = piece_indices(pieces, PQ2_BLOCK_WEIGHTS)
            for r0, raw in src.slices(backend, gf, rows):
                n = raw.size // (g * PQ2_BLOCK_BYTES)
                yield r0, raw.reshape(n, g, PQ2_BLOCK_BYTES)[:, blocks].reshape(-1)
            return
        row_bytes = self.info.k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES
        held: list[np.ndarray] = []
        have, out_row = 0, 0
        for a, b in pieces:
            for piece in rows_of(backend, gf, src, a, b, rows):
                held.append(piece)
                have += piece.size // row_bytes
                while have >= rows:
                    flat = np.concatenate(held)
                    yield out_row, flat[: rows * row_bytes]
                    held, have, out_row = [flat[rows * row_bytes :]], have - rows, out_row + rows
        if have:
            yield out_row, np.concatenate(held)

    def block(
        self, backend: weight_io.Backend, gf: GGUFFile, a: int, b: int, g0: int, g1: int
    ) -> np.ndarray:
        """Rows [a, b) and groups [g0, g1) of the rank's part (Entry.block): the source's rows
        or groups the part's stand for, read run by contiguous run."""
        src, split = self._cut()
        assert src.info is not None
        pieces = split.pieces[self.rank]
        if split.axis == 1:  # the part's rows are the pieces' rows one after another
            out, at = [], 0
            for p0, p1 in pieces:
                lo, hi = max(a, at), min(b, at + p1 - p0)
                if lo < hi:
                    out.append(src.block(backend, gf, p0 + lo - at, p0 + hi - at, g0, g1))
                at += p1 - p0
            return np.concatenate(out) if len(out) > 1 else out[0]
        groups = piece_indices(pieces, PQ2_BLOCK_WEIGHTS)[g0:g1]  # the source's groups
        runs, start = [], 0
        for i in range(1, len(groups) + 1):
            if i == len(groups) or groups[i] != groups[i - 1] + 1:
                runs.append((int(groups[start]), int(groups[i - 1]) + 1))
                start = i
        parts = [
            src.block(backend, gf, a, b, r0, r1).reshape(b - a, r1 - r0, PQ2_BLOCK_BYTES)
            for r0, r1 in runs
        ]
        return np.concatenate(parts, axis=1).reshape(-1)

    def out_tensor(self) -> OutTensor:
        src, split = self._cut()
        t = src.tensor
        ne = split.shape(t.ne, self.rank)
        return OutTensor(t.name, t.type_id, ne, type_nbytes(t.type_id, ne))

    def chunks(self, gf: GGUFFile) -> Iterator[np.ndarray]:
        src, split = self._cut()
        t = src.tensor
        arr = gf.data(t).view(_item(t.type_id)).reshape(tuple(reversed(t.ne)))
        axis = arr.ndim - 1 - split.axis  # numpy order is gguf's reversed
        idx = piece_indices(split.pieces[self.rank])
        part = np.ascontiguousarray(np.take(arr, idx, axis=axis)).view(np.uint8).reshape(-1)
        gf.release(t)
        for start in range(0, part.size, weight_io.PASS_CHUNK):  # as Entry.chunks cuts them
            yield part[start : start + weight_io.PASS_CHUNK]

    @property
    def nbytes(self) -> int:
        src, split = self._cut()
        return src.nbytes * split.size(self.rank) // split.extent


def rows_of(
    backend: weight_io.Backend, gf: GGUFFile, e: Entry, a: int, b: int, rows: int
) -> Iterator[np.ndarray]:
    """Raw PQ2_0 bytes of rows [a, b) of weight e, about `rows` rows at a time (a multiple of
    the stored tile height). A stored layout is read from the tile row a is in."""
    assert e.info is not None and e.stored is not None
    tr = e.stored.layout.tile_rows
    a0 = a - a % tr
    stop = min(-(-b // tr) * tr, e.info.n)
    row_bytes = e.info.k // PQ2_BLOCK_WEIGHTS * PQ2_BLOCK_BYTES
    chunk = max(tr, rows // tr * tr)
    for r0, raw in weight_io.raw_slices(
        backend, gf, e.tensor, e.stored, chunk, e.row0 + a0, stop - a0
    ):
        lo = max(a, a0 + r0) - (a0 + r0)
        hi = min(b, a0 + r0 + raw.size // row_bytes) - (a0 + r0)
        if hi > lo:
            yield raw[lo * row_bytes : hi * row_bytes]


def shard_entries(gf: GGUFFile, contents: Contents, plan: ShardPlan, rank: int) -> list[Entry]:
    """The original tensors as shard `rank` holds them, in their order (module docstring).
    FormatError for a dense tensor the plan cuts that is not F32, F16 or BF16."""
    out: list[Entry] = []
    for e in contents.entries:
        split = plan.split(e.name)
        if split is None:
            out.append(e)
            continue
        if e.info is None:
            tid = e.tensor.type_id
            if tid not in DENSE_TYPES:
                raise FormatError(
                    f"{gf.path}: tensor '{e.name}' is {type_name(tid)}; a shard cuts dense "
                    f"tensors of F32, F16 or BF16 only"
                )
            out.append(ShardEntry(e.name, e.tensor, None, None, source=e, split=split, rank=rank))
            continue
        ne = split.shape(e.info.ne, rank)
        info = WeightInfo(e.info.source_type, ne, replace(e.info.layout, n=ne[1], k=ne[0]))
        out.append(ShardEntry(e.name, e.tensor, info, e.stored, source=e, split=split, rank=rank))
    return out


def plan_of_file(gf: GGUFFile, contents: Contents, g: int) -> ShardPlan:
    """The tensor-parallel plan of the whole model in gf over g ranks. FormatError, naming the
    file, when it does not fit the architecture map or does not split so."""
    names = [e.name for e in contents.entries]
    try:
        plan = decode_plan(names, gf)
        rotation = Rotation.from_file(gf, contents.input_widths())
    except FormatError as e:
        raise FormatError(f"{gf.path}: {e}") from None
    ne = {e.name: e.ne for e in contents.entries}
    return shard_plan(ne, plan, gf, rotation, g, gf.path)


def split_records(entries: list[Entry], g: int, rank: int) -> list[bytes]:
    """The key/value records that say what shard `rank` of g holds (pyq2.gguf.metadata)."""
    splits = [(e.name, e.split) for e in entries if isinstance(e, ShardEntry) and e.split]
    return [gguf_io.encode_kv(*kv) for kv in metadata.split_key_values(g, rank, splits)]

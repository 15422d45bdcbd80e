"""Prove that two GGUF files hold the same model: `pyq2 verify ORIGINAL REPACKED [...]`.

Every PQ2-family weight of both files is decoded to raw PQ2_0 blocks, whatever its stored type
or layout, and compared code for code and scale for scale; every other tensor is compared byte
for byte, and so is every key/value outside pyq2's own (pyq2.gguf.metadata). The first difference is
reported by tensor, row and column (or block, for a scale). A file with fused tensors
(pyq2.offline.fuse) is read as the original tensors it holds: each member's rows are compared with
the tensor of that name in the other file. Both files are read a slice of rows (weights) or a chunk
(other tensors) at a time and the pages read are dropped, so memory stays near a few slices
whatever the size of the files.

Given the shards of a tensor-parallel set (pyq2.plan.tensor_parallel, `pyq2 repack --tp G`), in any
order, it checks that they are ranks 0..G-1 of one G, that each records exactly the parts of each
tensor that the plan of the original gives its rank, and compares each shard with those parts of the
original as above.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import numpy as np

from ..gguf import io as gguf_io
from ..gguf import weights as weight_io
from ..gguf.contents import Contents, read_contents
from ..gguf.io import GGUFFile
from ..gguf.metadata import KEY_PREFIX, shard_of
from ..gguf.splits import order_shards
from ..gguf.weights import Backend, Entry
from ..spec.formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS, pq2_unpack
from . import shard


@dataclass
class VerifyResult:
    ok: bool
    message: str
    weights: int = 0  # PQ2-family tensors compared as codes + scales
    fused: int = 0  # of them, rows of a fused tensor in either file
    others: int = 0  # other tensors compared byte for byte
    n_weights: int = 0  # individual weights compared
    shards: int = 0  # tensor-parallel shards compared (0: one whole file)


def _first_block_mismatch(
    name: str, a: np.ndarray, b: np.ndarray, k: int, row0: int, g0: int = 0
) -> str:
    """Describe the first differing PQ2_0 block of two equal-length raw buffers of rows row0...
    (k wide, from 128-group g0 of the row on)."""
    ba, bb = a.reshape(-1, PQ2_BLOCK_BYTES), b.reshape(-1, PQ2_BLOCK_BYTES)
    i = int(np.argmax((ba != bb).any(axis=1)))
    g = k // PQ2_BLOCK_WEIGHTS
    row, blk = row0 + i // g, g0 + i % g
    ca, da = pq2_unpack(ba[i])
    cb, db = pq2_unpack(bb[i])
    if ba[i, :2].tobytes() != bb[i, :2].tobytes():
        bits_a, bits_b = ba[i, :2].view("<u2")[0], bb[i, :2].view("<u2")[0]
        return (
            f"tensor '{name}' row {row} block {blk}: scale {da[0]} (0x{bits_a:04x}) vs "
            f"{db[0]} (0x{bits_b:04x})"
        )
    j = int(np.argmax(ca[0] != cb[0]))
    return (
        f"tensor '{name}' row {row} column {blk * PQ2_BLOCK_WEIGHTS + j}: code "
        f"{ca[0, j]} ({int(ca[0, j]) - 1:+d}) vs {cb[0, j]} ({int(cb[0, j]) - 1:+d})"
    )


def _compare_bytes(fa: GGUFFile, a: Entry, fb: GGUFFile, b: Entry) -> str | None:
    """Two tensors that are not weights (of equal size), chunk by chunk (Entry.chunks)."""
    off = 0
    for ca, cb in zip(a.chunks(fa), b.chunks(fb), strict=True):
        if not np.array_equal(ca, cb):
            off += int(np.argmax(ca != cb))
            return f"tensor '{a.name}' ({a.tensor.type_name}): bytes differ at offset {off}"
        off += len(ca)
    return None


def _compare_metadata(fa: GGUFFile, fb: GGUFFile) -> str | None:
    keys_a = [k for k in fa.keys() if not k.startswith(KEY_PREFIX)]
    keys_b = [k for k in fb.keys() if not k.startswith(KEY_PREFIX)]
    for ka, kb in zip(keys_a, keys_b, strict=False):  # a longer list is reported below
        if ka != kb:
            return f"metadata differs: key '{ka}' vs '{kb}'"
        if fa.fields[ka].size != fb.fields[kb].size or any(
            ca != cb for ca, cb in zip(fa.kv_chunks(ka), fb.kv_chunks(kb), strict=True)
        ):
            return f"metadata key '{ka}' has a different type or value"
    if len(keys_a) != len(keys_b):
        longer, shorter = (keys_a, keys_b) if len(keys_a) > len(keys_b) else (keys_b, keys_a)
        return f"metadata key '{longer[len(shorter)]}' is only in one file"
    return None


def _blocks(ops: Backend, a: Entry, fa: GGUFFile, b: Entry, fb: GGUFFile, band: int):
    """(row, group, width, raw of a, raw of b) of the same blocks of `band` rows (whole tiles of
    both stored layouts) and a range of groups, from both files (weights.read_block)."""
    assert a.info is not None
    k, n = a.info.k, a.info.n
    g = k // PQ2_BLOCK_WEIGHTS
    cols = weight_io.block_groups(k, band)
    for r0 in range(0, n, band):
        r1 = min(r0 + band, n)
        for g0 in range(0, g, cols):
            g1 = min(g0 + cols, g)
            ra = a.block(ops, fa, r0, r1, g0, g1)
            rb = b.block(ops, fb, r0, r1, g0, g1)
            yield r0, g0, (g1 - g0) * PQ2_BLOCK_WEIGHTS, ra, rb


def _compare_entry(
    ops: Backend, a: Entry, fa: GGUFFile, b: Entry, fb: GGUFFile, res: VerifyResult
) -> str | None:
    """Compare what entry a of fa should hold with entry b of fb (same name); counts in res."""
    ta, tb = a.tensor, b.tensor
    wa, wb = a.info, b.info
    if wa is None or wb is None:
        if wa is not None or wb is not None:
            shape_a = list(a.out_tensor().ne) if wa is None else list(wa.ne)
            shape_b = list(tb.ne) if wb is None else list(wb.ne)
            return (
                f"tensor '{a.name}' is {ta.type_name} {shape_a} in {fa.path} "
                f"but {tb.type_name} {shape_b} in {fb.path}"
            )
        out_a = a.out_tensor()
        if (out_a.type_id, tuple(out_a.ne)) != (tb.type_id, tuple(tb.ne)):
            return (
                f"tensor '{a.name}': {ta.type_name} {list(out_a.ne)} vs {tb.type_name} "
                f"{list(tb.ne)}"
            )
        msg = _compare_bytes(fa, a, fb, b)
        if msg:
            return msg
        res.others += 1
        return None
    if wa.ne != wb.ne:
        return f"tensor '{a.name}': logical shape {list(wa.ne)} vs {list(wb.ne)}"
    # The same rows from both files (the shapes are equal), on the tiles of both.
    tall = ((a.stored or wa).layout.tile_rows, (b.stored or wb).layout.tile_rows)
    if weight_io.column_mode(wa.k, *tall):  # rows too wide for a slice: blocks of them
        pairs = _blocks(ops, a, fa, b, fb, math.lcm(*tall))
    else:
        rows = weight_io.slice_rows(wa.k, *tall)
        slices = zip(a.slices(ops, fa, rows), b.slices(ops, fb, rows), strict=True)
        pairs = ((r0, 0, wa.k, ra, rb) for (r0, ra), (_, rb) in slices)
    for r0, g0, width, ra, rb in pairs:
        if not np.array_equal(ra, rb):
            places = [f"{e.place} in {f.path}" for e, f in ((a, fa), (b, fb)) if e.fused]
            return _first_block_mismatch(a.name, np.asarray(ra), np.asarray(rb), width, r0, g0) + (
                f" ({'; '.join(places)})" if places else ""
            )
    res.weights += 1
    res.fused += bool(a.fused or b.fused)
    res.n_weights += wa.n * wa.k
    return None


def _compare_file(
    ops: Backend,
    fa: GGUFFile,
    entries_a: list[Entry],
    fb: GGUFFile,
    contents_b: Contents,
    res: VerifyResult,
) -> str | None:
    """Compare fb (whose contents are contents_b) with what it should hold (entries_a of fa:
    the original tensors, or a shard's parts of them); the first difference, or None."""
    by_name_b = contents_b.by_name()
    names_a = [e.name for e in entries_a]
    for n in names_a:
        if n not in by_name_b:
            return f"tensor '{n}' is missing from {fb.path}"
    extra = set(by_name_b) - set(names_a)
    if extra:
        return f"tensor '{sorted(extra)[0]}' of {fb.path} is not in {fa.path}"
    msg = _compare_metadata(fa, fb)
    if msg:
        return msg
    for a in entries_a:
        msg = _compare_entry(ops, a, fa, by_name_b[a.name], fb, res)
        if msg:
            return msg
    return None


def _shard_entries(
    fa: GGUFFile, contents: Contents, shards: list[GGUFFile]
) -> list[tuple[list[Entry], Contents]] | str:
    """Per shard file (in the order given), what it should hold (its rank's parts of fa's
    tensors) and its contents; or a message saying why the files are not one complete set of
    fa's shards, or where a shard's recorded parts differ from the plan."""
    found = [(fb.path, shard_of(fb)) for fb in shards]
    try:
        order = order_shards(found)
        g = len(order)
        plan = shard.plan_of_file(fa, contents, g)
    except ValueError as err:  # FormatError too
        return str(err)
    out = []
    for fb in shards:
        rank = order.index(fb.path)
        contents_b = read_contents(fb)
        for held in contents_b.entries:
            got, want = held.split, plan.split(held.name)
            got_s, want_s = (s.held(rank) if s else "the whole tensor" for s in (got, want))
            if got_s != want_s:
                return (
                    f"tensor '{held.name}' of {fb.path} (rank {rank}) holds {got_s}; the "
                    f"plan of {fa.path} over {g} GPUs gives {want_s}"
                )
        out.append((shard.shard_entries(fa, contents, plan, rank), contents_b))
    return out


def verify(original, repacked, backend: str = "auto") -> VerifyResult:
    """Decode every weight of both files and compare; compare everything else byte for byte.
    `repacked` may also be a list of files: one, or every shard of a tensor-parallel set (any
    order), each compared with its rank's parts of the original (pyq2.plan.tensor_parallel)."""
    ops = Backend(backend)
    res = VerifyResult(True, "")
    paths = [repacked] if isinstance(repacked, (str, os.PathLike)) else list(repacked)
    if not paths:
        raise ValueError("verify needs a file to compare with the original")
    with gguf_io.open_gguf(original) as fa, contextlib.ExitStack() as stack:
        files = [stack.enter_context(gguf_io.open_gguf(p)) for p in paths]
        contents = read_contents(fa)
        if contents.shard is not None:
            msg: str | None = f"{fa.path} is a shard; the original is the whole model"
        elif len(files) == 1 and shard_of(files[0]) is None:
            msg = _compare_file(ops, fa, contents.entries, files[0], read_contents(files[0]), res)
        else:
            expected = _shard_entries(fa, contents, files)
            if isinstance(expected, str):
                msg = expected
            else:
                msg = None
                for fb, (entries, contents_b) in zip(files, expected, strict=True):
                    msg = msg or _compare_file(ops, fa, entries, fb, contents_b, res)
                res.shards = len(files)
        if msg:
            res.ok, res.message = False, msg
            return res
    fused = f", {res.fused} of them rows of fused tensors" if res.fused else ""
    where = f" in {res.shards} tensor-parallel shards" if res.shards else ""
    res.message = (
        f"identical{where}: {res.weights} weight tensors ({res.n_weights} weights, codes and "
        f"scales{fused}) and {res.others} other tensors match, metadata matches"
    )
    return res

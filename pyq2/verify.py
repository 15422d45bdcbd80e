"""Prove that two GGUF files hold the same model: `pyq2 verify ORIGINAL REPACKED`.

Every PQ2-family weight of both files is decoded to raw PQ2_0 blocks, whatever its stored type
or layout, and compared code for code and scale for scale; every other tensor is compared byte
for byte, and so is every key/value outside pyq2's own (pyq2.metadata). The first difference is
reported by tensor, row and column (or block, for a scale). A file with fused tensors
(pyq2.fuse) is read as the original tensors it holds: each member's rows are compared with the
tensor of that name in the other file. Both files are read a slice of rows (weights) or a chunk
(other tensors) at a time and the pages read are dropped, so memory stays near a few slices
whatever the size of the files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import fuse, gguf_io, weight_io
from .formats import PQ2_BLOCK_BYTES, PQ2_BLOCK_WEIGHTS, pq2_unpack
from .gguf_io import GGUFFile, Tensor
from .metadata import KEY_PREFIX
from .weight_io import Backend, stored_tile_rows


@dataclass
class VerifyResult:
    ok: bool
    message: str
    weights: int = 0  # PQ2-family tensors compared as codes + scales
    fused: int = 0  # of them, rows of a fused tensor in either file
    others: int = 0  # other tensors compared byte for byte
    n_weights: int = 0  # individual weights compared


def _first_block_mismatch(name: str, a: np.ndarray, b: np.ndarray, k: int, row0: int) -> str:
    """Describe the first differing PQ2_0 block of two equal-length raw buffers of rows row0..."""
    ba, bb = a.reshape(-1, PQ2_BLOCK_BYTES), b.reshape(-1, PQ2_BLOCK_BYTES)
    i = int(np.argmax((ba != bb).any(axis=1)))
    g = k // PQ2_BLOCK_WEIGHTS
    row, blk = row0 + i // g, i % g
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


def _compare_bytes(fa: GGUFFile, ta: Tensor, fb: GGUFFile, tb: Tensor) -> str | None:
    for start in range(0, ta.nbytes, weight_io.PASS_CHUNK):
        stop = min(start + weight_io.PASS_CHUNK, ta.nbytes)
        a, b = fa.data(ta, start, stop), fb.data(tb, start, stop)
        if not np.array_equal(a, b):
            off = start + int(np.argmax(a != b))
            return f"tensor '{ta.name}' ({ta.type_name}): bytes differ at offset {off}"
        del a, b
        fa.release(ta, start, stop)
        fb.release(tb, start, stop)
    return None


def _compare_metadata(fa: GGUFFile, fb: GGUFFile) -> str | None:
    keys_a = [k for k in fa.keys() if not k.startswith(KEY_PREFIX)]
    keys_b = [k for k in fb.keys() if not k.startswith(KEY_PREFIX)]
    for ka, kb in zip(keys_a, keys_b, strict=False):  # a longer list is reported below
        if ka != kb:
            return f"metadata differs: key '{ka}' vs '{kb}'"
        if fa.kv_record(ka) != fb.kv_record(kb):
            return f"metadata key '{ka}' has a different type or value"
    if len(keys_a) != len(keys_b):
        longer, shorter = (keys_a, keys_b) if len(keys_a) > len(keys_b) else (keys_b, keys_a)
        return f"metadata key '{longer[len(shorter)]}' is only in one file"
    return None


def verify(original, repacked, backend: str = "auto") -> VerifyResult:
    """Decode every weight of both files and compare; compare everything else byte for byte."""
    ops = Backend(backend)
    res = VerifyResult(True, "")

    def fail(msg: str) -> VerifyResult:
        res.ok, res.message = False, msg
        return res

    with gguf_io.open_gguf(original) as fa, gguf_io.open_gguf(repacked) as fb:
        entries_a = fuse.contents(fa).entries
        by_name_b = fuse.contents(fb).by_name()
        names_a = [e.name for e in entries_a]
        for n in names_a:
            if n not in by_name_b:
                return fail(f"tensor '{n}' is missing from {fb.path}")
        extra = set(by_name_b) - set(names_a)
        if extra:
            return fail(f"tensor '{sorted(extra)[0]}' of {fb.path} is not in {fa.path}")
        msg = _compare_metadata(fa, fb)
        if msg:
            return fail(msg)

        for a in entries_a:
            b = by_name_b[a.name]
            ta, tb = a.tensor, b.tensor
            wa, wb = a.info, b.info
            if wa is None or wb is None:
                if wa is not None or wb is not None:
                    shape_a = list(ta.ne) if wa is None else list(wa.ne)
                    shape_b = list(tb.ne) if wb is None else list(wb.ne)
                    return fail(
                        f"tensor '{a.name}' is {ta.type_name} {shape_a} in {fa.path} "
                        f"but {tb.type_name} {shape_b} in {fb.path}"
                    )
                if (ta.type_id, ta.ne) != (tb.type_id, tb.ne):
                    return fail(
                        f"tensor '{ta.name}': {ta.type_name} {list(ta.ne)} vs "
                        f"{tb.type_name} {list(tb.ne)}"
                    )
                msg = _compare_bytes(fa, ta, fb, tb)
                if msg:
                    return fail(msg)
                res.others += 1
                continue
            if wa.ne != wb.ne:
                return fail(f"tensor '{a.name}': logical shape {list(wa.ne)} vs {list(wb.ne)}")
            # The same rows from both files (the shapes are equal), on the tiles of both.
            rows = weight_io.slice_rows(wa.k, stored_tile_rows(wa), stored_tile_rows(wb))
            slices_a, slices_b = a.slices(ops, fa, rows), b.slices(ops, fb, rows)
            for (r0, ra), (_, rb) in zip(slices_a, slices_b, strict=True):
                if not np.array_equal(ra, rb):
                    places = [f"{e.place} in {f.path}" for e, f in ((a, fa), (b, fb)) if e.fused]
                    return fail(
                        _first_block_mismatch(a.name, np.asarray(ra), np.asarray(rb), wa.k, r0)
                        + (f" ({'; '.join(places)})" if places else "")
                    )
            res.weights += 1
            res.fused += bool(a.fused or b.fused)
            res.n_weights += wa.n * wa.k
    fused = f", {res.fused} of them rows of fused tensors" if res.fused else ""
    res.message = (
        f"identical: {res.weights} weight tensors ({res.n_weights} weights, codes and "
        f"scales{fused}) and {res.others} other tensors match, metadata matches"
    )
    return res

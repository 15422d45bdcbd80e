"""A file as the original tensors it holds: every reader's view of a GGUF file's contents.

`read_contents(gf)` lists a file's original tensors in their original order (each an Entry,
pyq2.gguf.weights); repack, verify, info, the sharder and the model loader all read a file
through it. A file written by `pyq2 repack --fuse` stores sibling projections as one fused
tensor (pyq2.offline.fuse); the Entry of such a member names the fused tensor and the rows it
takes there. pyq2.gguf.metadata holds the keys that say how to split a fused tensor: its
members, and per member its first row, its rows and its place in the original file's tensor
list. `read_contents` refuses fused metadata that contradicts the rest of the file: a member
also stored as a tensor of its own, a member of two fused tensors, positions repeated or beyond
the original tensor count, member keys of a tensor the file does not hold
(metadata.fused_members checks each fused tensor against its own matrix). It also checks the
checksum of every planes or tiles tensor (check_checksums: its bytes and the keys that describe
it, one read of those tensors on a few threads), so that every reader refuses a damaged or
relabelled tensor by name before it uses a byte of it; `pyq2 info`, which decodes no weight,
skips that.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..errors import FormatError
from . import metadata
from . import weights as weight_io
from .io import GGUFFile, Tensor
from .metadata import Member, WeightInfo
from .splits import Split
from .weights import Entry


@dataclass(frozen=True)
class Contents:
    entries: list[Entry]  # the original tensors, in their original order
    fused: dict[str, tuple[Member, ...]]  # fused tensor name -> its members, in row order
    shard: tuple[int, int] | None = None  # a tensor-parallel shard's (G, rank) (shard_of)

    def by_name(self) -> dict[str, Entry]:
        return {e.name: e for e in self.entries}

    def input_widths(self) -> dict[str, int]:
        """Each weight's input width (Entry.input_width), by name."""
        return {e.name: w for e in self.entries if (w := e.input_width) is not None}

    def splits(self) -> dict[str, Split]:
        """A tensor-parallel shard's parts (Entry.split) by tensor name; {} for a whole model."""
        return {e.name: e.split for e in self.entries if e.split is not None}


CHECKSUM_WORKERS = 8  # threads that compute checksums (zlib and pread release the GIL)
CHECKSUM_CHUNK = 4 << 20  # bytes each of them reads at a time


def _checksum(gf: GGUFFile, t: Tensor, keys: list[str]) -> int:
    crc = metadata.start_checksum(gf.kv_record(k) for k in keys)
    for start in range(0, t.nbytes, CHECKSUM_CHUNK):
        stop = min(start + CHECKSUM_CHUNK, t.nbytes)
        crc = zlib.crc32(gf.read(t.offset + start, stop - start, f"tensor '{t.name}'"), crc)
    return crc


def check_checksums(
    gf: GGUFFile, infos: dict[str, WeightInfo | None], fused: dict[str, tuple[Member, ...]]
) -> None:
    """Every planes or tiles tensor's bytes and describing keys against its recorded CRC-32
    (metadata.CHECKSUM_ATTR; FORMATS.md 5). FormatError naming the first tensor, in file order,
    whose bytes were damaged or whose pyq2 keys were changed. The tensors are read a chunk at a
    time, on up to CHECKSUM_WORKERS threads."""
    stored = [
        t for t in gf.tensors if (i := infos.get(t.name)) is not None and i.layout.name != "raw"
    ]
    if not stored:
        return
    index = metadata.describing_keys(gf.keys())
    jobs = [
        (t, metadata.description_keys(index, t.name, [m.name for m in fused.get(t.name, ())]))
        for t in stored
    ]
    workers = max(1, min(CHECKSUM_WORKERS, os.cpu_count() or 1, len(jobs)))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="pyq2-crc")
    try:
        results = pool.map(lambda job: _checksum(gf, *job), jobs)
        for (t, _), got in zip(jobs, results, strict=True):
            key = metadata.tensor_key(t.name, metadata.CHECKSUM_ATTR)
            want = gf.value(key)
            if got != want:
                raise FormatError(
                    f"{gf.path}: tensor '{t.name}': its bytes and pyq2 keys give the checksum "
                    f"0x{got:08x}, but {key} is 0x{want:08x}: the file is damaged or its pyq2 "
                    f"keys were changed; repack the original GGUF again"
                )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_contents(
    gf: GGUFFile, check_bytes: bool = True, check_sums: bool | None = None
) -> Contents:
    """The file's original tensors (module docstring); with check_bytes also every stored
    weight's byte count and, unless check_sums is False, every planes or tiles tensor's
    checksum (check_checksums: one read of those tensors). FormatError names the file and what
    contradicts what."""
    infos: dict[str, WeightInfo | None] = {}
    fused: dict[str, tuple[Member, ...]] = {}
    for t in gf.tensors:
        info = gf.weight_info(t)
        if info is not None and check_bytes:
            gf.validate_weight_bytes(t, info, weight_io.stored_bytes(info))
        infos[t.name] = info
        members = metadata.fused_members(gf, t.name, info)
        if members is not None:
            fused[t.name] = members
    prefix = metadata.TENSOR_KEY_PREFIX
    for key in gf.keys():
        for attr in metadata.MEMBER_ATTRS:
            if key.startswith(prefix) and key.endswith("." + attr):
                name = key[len(prefix) : -len(attr) - 1]
                if name not in infos:
                    raise FormatError(
                        f"{gf.path}: {key} describes a fused tensor '{name}', which the file "
                        f"does not hold"
                    )
    n_original = len(gf.tensors) - len(fused) + sum(len(m) for m in fused.values())
    slots: list[Entry | None] = [None] * n_original
    owner: dict[str, str] = {}
    for fname, members in fused.items():
        t, finfo = gf.tensor(fname), infos[fname]
        assert finfo is not None  # fused_members refuses a fused tensor that is no weight
        for m in members:
            where = f"{gf.path}: fused tensor '{fname}': member '{m.name}'"
            if m.name in infos:
                raise FormatError(f"{where} is also stored as a tensor of its own")
            if m.name in owner:
                raise FormatError(f"{where} is also a member of '{owner[m.name]}'")
            owner[m.name] = fname
            if m.position >= n_original:
                raise FormatError(
                    f"{where} has position {m.position}; the original file had {n_original} tensors"
                )
            taken = slots[m.position]
            if taken is not None:
                raise FormatError(f"{where} has position {m.position}, as '{taken.name}' has")
            info = metadata.member_info(finfo, m)
            slots[m.position] = Entry(m.name, t, info, finfo, m.row0, fname)
    rest = iter(
        Entry(t.name, t, infos[t.name], infos[t.name]) for t in gf.tensors if t.name not in fused
    )
    entries = [e if e is not None else next(rest) for e in slots]
    shard = metadata.shard_of(gf)
    if shard is not None:
        entries = [
            replace(e, split=metadata.tensor_split(gf, e.name, e.ne, *shard)) for e in entries
        ]
    # The order the positions imply for this file: a fused tensor where its first member stood.
    implied: list[str] = []
    for e in entries:
        stored = e.fused if e.fused is not None else e.name
        if stored not in implied[-1:] and (e.fused is None or stored not in implied):
            implied.append(stored)
    if implied != [t.name for t in gf.tensors]:
        raise FormatError(
            f"{gf.path}: the fused tensors' member positions do not match the file's tensor "
            f"order (a fused tensor stands where its first member stood)"
        )
    if check_bytes if check_sums is None else check_sums:
        check_checksums(gf, infos, fused)
    return Contents(entries, fused, shard)

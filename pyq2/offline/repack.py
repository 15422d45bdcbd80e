"""Repack the PQ2-family weights of a GGUF file into a resident layout.

Every PQ2_0 tensor, every PTQ1_0 and TQ2_0 tensor (both first turned into PQ2_0 blocks, which is
lossless) and every weight an earlier pyq2 run repacked is converted to the requested layout
("raw", "planes" or "tiles"; pyq2.gguf.metadata says how planes/tiles weights are stored). All other
tensors and all metadata pass through byte for byte (key/values as the raw bytes of their
records). The file is streamed: weights are read, checked and converted in slices of rows,
whatever layout they are stored in (in blocks of rows and columns where a row is too wide for a
slice: weights.column_mode), other tensors and large key/values copied in chunks, and every
piece is written and dropped before the next is read, into a temporary file that replaces OUT
only when complete. The scale pieces of a weight (1/17 of its bytes) wait for its code region
in memory up to SPOOL_MEMORY, beyond that in an unnamed temporary file. Peak memory is therefore
a few slices, whatever the size of the model or the shape of its weights
(tools/bench/repack_memory.py and tools/bench/hostile_memory.py measure it; docs/cli.md).

Each planes or tiles weight gets its checksum (pyq2.tensor.<name>.crc32, FORMATS.md 5): the
CRC-32 of its describing key/values and of its bytes, computed as they are written and filled in
the header at the end (pyq2.gguf.io.LateValue). A tiles layout that would pad a weight of fewer
rows than a tile to many times its size is refused (pyq2.offline.fuse.PADDING_LIMIT).

With `fuse`, the sibling projections that read one activation (pyq2.offline.fuse) are written as one
fused tensor each, their rows one after another, streamed member after member; a fused source
is read as the original tensors it holds, so any output (raw, or planes/tiles fused or not)
gives them back under their own names, in their original order.

pyq2.offline.verify proves a repacked file holds the same weights as its source.
"""

from __future__ import annotations

import os
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from .. import atomic
from ..errors import FormatError, RepackError, shown_path
from ..gguf import io as gguf_io
from ..gguf import metadata
from ..gguf import weights as weight_io
from ..gguf.contents import read_contents
from ..gguf.io import GGUFFile, OutTensor
from ..gguf.weights import Backend, Entry, Progress
from ..spec import layouts
from ..spec.layouts import Layout
from . import fuse as fuse_mod
from . import shard


@dataclass
class Summary:
    in_path: str
    out_path: str
    layout: str
    rt: int
    dry_run: bool
    backend: str
    converted: int = 0
    passed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    out_exists: bool = False  # OUT existed when the run began (a dry run notes it)
    force: bool = False
    fuse: bool = False
    fused: int = 0  # fused tensors written
    fused_members: int = 0  # the weights they hold
    separate: list[str] = field(default_factory=list)  # sibling groups --fuse left apart, why
    shards: list[str] = field(default_factory=list)  # the files of a --tp set, by rank

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "mb_per_s": round(self.mb_per_s, 1)}

    def line(self) -> str:
        what = "would write" if self.dry_run else "wrote"
        if not self.converted:
            layout = "nothing to convert: no PQ2_0, PTQ1_0 or TQ2_0 tensors"
        else:
            layout = f"{self.layout} rt={self.rt}" if self.layout == "tiles" else self.layout
            if self.fuse:
                layout += f"; {self.fused} fused tensors hold {self.fused_members} siblings"
                n = len(self.separate)
                if n:
                    layout += f", {n} sibling group{' stays' if n == 1 else 's stay'} separate"
        if self.dry_run and self.out_exists:
            layout += "; it exists: " + ("--force replaces it" if self.force else "needs --force")
        where = shown_path(self.out_path)
        if self.shards:
            where = ", ".join(shown_path(p) for p in self.shards)
            layout += f"; {len(self.shards)} tensor-parallel shards, counts summed over them"
        return (
            f"{what} {where} ({layout}): {self.converted} tensors converted, "
            f"{self.passed} passed through; {self.bytes_in / 1e6:.1f} MB in, "
            f"{self.bytes_out / 1e6:.1f} MB out, {self.seconds:.2f} s, "
            f"{self.mb_per_s:.1f} MB/s [{self.backend}]"
        )


SPOOL_MEMORY = 32 << 20  # scale bytes kept in memory before they go to a temporary file


class _Spool:
    """The scale pieces of one output weight, kept until its code region is written: in memory
    up to SPOOL_MEMORY bytes, then in an unnamed temporary file in `directory` (the run's own
    temporary directory, or the system's for a dry run), which leaves nothing behind."""

    def __init__(self, directory: str | None):
        self.directory, self.size = directory, 0
        self.held: list[np.ndarray] = []
        self.file: IO[bytes] | None = None

    def add(self, piece: np.ndarray) -> None:
        self.size += piece.nbytes
        if self.file is None and self.size <= SPOOL_MEMORY:
            self.held.append(np.array(piece))
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.directory)
            for held in self.held:
                self.file.write(held.tobytes())
            self.held = []
        self.file.write(np.ascontiguousarray(piece).tobytes())

    def pieces(self) -> Iterator[np.ndarray]:
        if self.file is None:
            yield from self.held
            self.held = []
            return
        try:
            self.file.seek(0)
            while chunk := self.file.read(weight_io.PASS_CHUNK):
                yield np.frombuffer(chunk, np.uint8)
        finally:
            self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def convert_weight(
    backend: Backend,
    gf: GGUFFile,
    parts: Sequence[Entry],
    target: Layout,
    spool_dir: str | None = None,
) -> Iterator[np.ndarray]:
    """Yield the bytes of one output weight, the matrix `target`, in file order: the rows of
    `parts` one after another (one weight, or the members of a fused tensor), converted and
    every scale checked by pyq2.gguf.weights.convert. Its code pieces are written as they come
    and its scale pieces (1/17 of the bytes) are kept (_Spool: in a temporary file in spool_dir
    beyond SPOOL_MEMORY) and written after them; in the raw layout every piece is written as it
    comes."""
    spool = _Spool(spool_dir)
    try:
        for piece in weight_io.convert(backend, gf, parts, target):
            yield piece.codes
            if piece.scales is not None:
                spool.add(piece.scales)
            del piece
        yield from spool.pieces()
    finally:
        spool.close()


def _write(
    gf: GGUFFile,
    entries: Sequence[Entry],
    records: Sequence[gguf_io.Record],
    summary: Summary,
    ops: Backend,
    staged: str | None,
    progress: Progress | None,
    notice: atomic.Notice | None,
    done: int,
    total: int,
) -> None:
    """Write the tensors `entries` (the original tensors, or a shard's parts of them) and the
    key/value records (then pyq2's own) as one file to `staged`; None: a dry run. Progress
    counts the source bytes of all files written by the run (`total`), `done` before this one."""
    layout, rt = summary.layout, summary.rt
    groups: list[fuse_mod.Group] = []
    if summary.fuse:
        groups, separate = fuse_mod.plan_groups(gf, entries, layout, rt)
        for line in separate:
            if line not in summary.separate:
                summary.separate.append(line)
                if notice:
                    notice(f"--fuse: {line}")
    plan = fuse_mod.output_plan(entries, groups, layout, rt)
    weights = [(it.out.name, it.info) for it in plan if it.info is not None]
    out_records: list[gguf_io.Record] = list(records)
    checksums: dict[str, gguf_io.LateValue] = {}  # set as each weight is written
    if layout != "raw" and weights:
        # A file without PQ2-family weights stays a plain GGUF file, identical to IN.
        fused = {it.out.name: it.members for it in plan if it.members}
        for kv in metadata.key_values(layout, rt, weights, fused):
            found = metadata.tensor_of_key(kv[0])
            if found is not None and found[1] == metadata.CHECKSUM_ATTR:
                checksums[found[0]] = gguf_io.LateValue(kv[0])
                out_records.append(checksums[found[0]])
            else:
                out_records.append(gguf_io.encode_kv(*kv))
    described = {  # the records a checksum covers (metadata.describing_keys), by key
        key: r
        for r in out_records
        if isinstance(r, bytes) and (key := metadata.record_key(r)).startswith(metadata.KEY_PREFIX)
    }
    index = metadata.describing_keys(described)
    outs = [it.out for it in plan]
    spool_dir = os.path.dirname(os.path.abspath(staged)) if staged is not None else None

    def tensor_data(i: int, out: OutTensor) -> Iterator:
        nonlocal done
        item = plan[i]
        if item.info is None:
            for chunk in item.parts[0].chunks(gf):
                yield chunk
                done += len(chunk)
                if progress:
                    progress(done, total, out.name)
            if out.nbytes == 0:
                yield b""
            summary.passed += 1
            return
        late = checksums.get(out.name)
        members = [m.name for m in item.members]
        keys = metadata.description_keys(index, out.name, members) if late else []
        crc = metadata.start_checksum(described[k] for k in keys)
        assert item.target is not None
        for chunk in convert_weight(ops, gf, item.parts, item.target, spool_dir):
            if late is not None:
                crc = zlib.crc32(np.ascontiguousarray(chunk).data, crc)
            yield chunk
        if late is not None:
            late.value = crc
        done += sum(e.nbytes for e in item.parts)
        summary.converted += len(item.parts)
        if item.members:
            summary.fused += 1
            summary.fused_members += len(item.members)
        if progress:
            progress(done, total, out.name)

    try:
        if staged is None:
            for i, out in enumerate(outs):
                for chunk in tensor_data(i, out):
                    del chunk
            summary.bytes_out += gguf_io.file_size(out_records, outs, gf.alignment, gf.version)
        else:
            summary.bytes_out += gguf_io.write_gguf(
                staged, out_records, outs, tensor_data, alignment=gf.alignment, version=gf.version
            )
    except FormatError as e:
        if not str(e).startswith(gf.path):
            raise FormatError(f"{gf.path}: {e}") from None
        raise


def shard_paths(out_path: str, g: int) -> list[str]:
    """The files of a G-shard set written to OUT: OUT with .tp<G>-<rank> before its .gguf
    suffix (model.gguf: model.tp2-0.gguf, model.tp2-1.gguf)."""
    stem = out_path.removesuffix(".gguf")
    return [f"{stem}.tp{g}-{rank}.gguf" for rank in range(g)]


def default_out_path(in_path, layout: str, fused: bool = False) -> Path:
    """IN with its .gguf suffix (and any earlier .pyq2-<layout>[-fused]) replaced by
    .pyq2-<layout>.gguf, or .pyq2-<layout>-fused.gguf for a fused file."""
    p = Path(in_path)
    stem = p.name.removesuffix(".gguf")
    for old in layouts.LAYOUT_NAMES:
        stem = stem.removesuffix(f".pyq2-{old}-fused").removesuffix(f".pyq2-{old}")
    return p.with_name(f"{stem}.pyq2-{layout}{'-fused' if fused else ''}.gguf")


def _check_out_name(in_path: str, out_path: str, layout: str) -> None:
    """Refuse an OUT (as given, before any shard suffix) that names no file: empty, or a
    directory."""
    if not os.path.exists(in_path):
        raise FileNotFoundError(2, "No such file or directory", in_path)
    if not out_path:
        raise RepackError("the output path is empty; give -o a file name")
    if out_path.endswith(os.sep) or os.path.isdir(out_path):
        what = "is" if os.path.isdir(out_path) else "names"
        example = os.path.join(out_path, default_out_path(in_path, layout).name)
        raise RepackError(
            f"output {shown_path(out_path)} {what} a directory; -o names the file, e.g. "
            f"{shown_path(example)}"
        )


def _check_file(in_path: str, out_path: str, force: bool, dry_run: bool) -> bool:
    """Refuse a file that cannot be written (pyq2.atomic.check_output says what it may be);
    returns whether it exists."""
    same = os.path.realpath(in_path) == os.path.realpath(out_path)
    if not same and os.path.exists(out_path):
        same = os.path.samefile(in_path, out_path)
    if same:
        raise RepackError(f"output {shown_path(out_path)} is the input file; choose another -o")
    return atomic.check_output(out_path, force, dry_run)


def option_error(layout: str, fuse: bool, tp: int | None) -> str | None:
    """Why repack refuses this combination of options, or None: the rule repack() and the
    command line (which answers with a usage error) share. tp None: no tensor-parallel set."""
    if layout not in layouts.LAYOUT_NAMES:
        return f"unknown layout {layout!r}: choose one of {', '.join(layouts.LAYOUT_NAMES)}"
    if fuse and layout == "raw":
        return (
            "--fuse writes fused tensors in the planes or tiles layout, not --layout raw (which "
            "splits a fused file back into its original tensors)"
        )
    if tp is not None and (
        isinstance(tp, bool) or not isinstance(tp, int) or not 2 <= tp <= metadata.TP_MAX
    ):
        return f"--tp {tp!r}: a tensor-parallel set has 2 to {metadata.TP_MAX} shards"
    if tp is not None and layout == "raw":
        return "--tp writes shards in the planes or tiles layout, not --layout raw"
    return None


def repack(
    in_path,
    out_path=None,
    layout: str = "tiles",
    rt: int = 2,
    dry_run: bool = False,
    force: bool = False,
    progress: Progress | None = None,
    backend: str = "auto",
    notice: atomic.Notice | None = None,
    fuse: bool = False,
    tp: int = 0,
) -> Summary:
    """Convert every PQ2-family weight of IN to `layout` and write OUT (see the module doc);
    with `fuse`, sibling projections as fused tensors (planes and tiles only); with `tp` = G
    (at least 2), the G tensor-parallel shards of the model (pyq2.plan.tensor_parallel) as G files
    named shard_paths(OUT, G), each converted (and fused) as a whole file would be.

    OUT is written through pyq2.atomic.atomic_output: it appears complete or not at all; without
    `force` an existing OUT is refused, even one that appears while the repack runs. The shards
    are staged together and appear together, none when any fails. `notice` receives one line
    per stale temporary of an interrupted earlier run that is removed, and one per sibling group
    `fuse` leaves separate.
    """
    t0 = time.perf_counter()
    refused = option_error(layout, fuse, tp if tp else None)
    if refused:
        raise RepackError(refused)
    if layout == "tiles":
        try:
            layouts.check_rt(rt)
        except ValueError as e:
            raise RepackError(str(e)) from None
    rt = layouts.layout_rt(layout, rt)
    in_path = os.fspath(in_path)
    if out_path is None:
        out_path = default_out_path(in_path, layout, fuse)
    out_path = os.fspath(out_path)
    _check_out_name(in_path, out_path, layout)
    paths = shard_paths(out_path, tp) if tp else [out_path]
    out_exists = False
    for path in paths:
        out_exists |= _check_file(in_path, path, force, dry_run)
    ops = Backend(backend)
    summary = Summary(
        in_path,
        out_path,
        layout,
        rt,
        dry_run,
        ops.name,
        out_exists=out_exists,
        force=force,
        fuse=fuse,
        shards=paths if tp else [],
    )

    with gguf_io.open_gguf(in_path) as gf:
        if metadata.shard_of(gf) is not None:
            raise RepackError(
                f"{gf.path} is a tensor-parallel shard; shards are written from the whole "
                f"model (pyq2 repack --tp G MODEL)"
            )
        contents = read_contents(gf)
        records: list[gguf_io.Record] = [
            gf.kv_source(k) for k in gf.keys() if not k.startswith(metadata.KEY_PREFIX)
        ]
        files = [(contents.entries, records)]
        if tp:
            try:
                plan = shard.plan_of_file(gf, contents, tp)
            except FormatError as e:
                raise RepackError(
                    f"--tp {tp} cuts a qwen35 model along its heads, and this one does not "
                    f"split: {e}"
                ) from None
            files = []
            for rank in range(tp):
                entries = shard.shard_entries(gf, contents, plan, rank)
                files.append((entries, [*records, *shard.split_records(entries, tp, rank)]))
        # one progress over all files: each file's bytes after those of the files before it
        sizes = [sum(e.nbytes for e in entries) for entries, _ in files]
        before = [sum(sizes[:i]) for i in range(len(files))]
        if dry_run:
            for (entries, recs), done in zip(files, before, strict=True):
                _write(gf, entries, recs, summary, ops, None, progress, notice, done, sum(sizes))
        else:  # the files appear together, when all are written
            with atomic.atomic_outputs(paths, force, notice) as staged:
                for path, (entries, recs), done in zip(staged, files, before, strict=True):
                    _write(
                        gf, entries, recs, summary, ops, path, progress, notice, done, sum(sizes)
                    )
        summary.bytes_in = gf.size
    summary.seconds = time.perf_counter() - t0
    return summary

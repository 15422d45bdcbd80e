"""Sibling fusion in the file (`pyq2 repack --fuse`): fused tensors and the weights they hold.

Projections that read the same activation (a stage of pyq2.arch's plan with more than one
projection: attention q/k/v, Gated-DeltaNet qkv and gate, FFN gate and up) can be stored as ONE
planes or tiles matrix whose rows are theirs one after another, in plan order. The decode step
then runs them as one matmul on the file's own matrix. pyq2.metadata holds the keys that say
how to split a fused tensor: its members, and per member its first row, its rows and its place
in the original file's tensor list.

`contents(gf)` is a file as the original tensors it holds, in their original order; repack,
verify, info and the model loader all read a file through it. The Entry of a member names the
fused tensor and the rows it takes there. It refuses fused metadata that contradicts the rest
of the file: a member also stored as a tensor of its own, a member of two fused tensors,
positions repeated or beyond the original tensor count, member keys of a tensor the file does
not hold (pyq2.metadata.fused_members checks each fused tensor against its own matrix).

`plan_groups` picks the groups `--fuse` writes: every sibling group whose members are PQ2-family
weights of one K, one source type and one rotation width, each member but the last a whole
number of the output layout's tiles. Each member's rows are then one piece of the fused code
region and one of its scale region (FORMATS.md, "Slices"), with no padding between members.
The other groups stay separate, each with the reason. `output_plan` lays out a repack's output:
every original tensor where it stood, a fused tensor where the first of its members stood.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from . import formats, layouts, metadata, weight_io
from .arch import ARCHITECTURES, Plan, decode_plan
from .errors import FormatError, RepackError
from .gguf_io import GGUFFile, OutTensor, Tensor
from .gguf_types import I8, PQ2_0, type_name
from .metadata import Member, WeightInfo
from .rotation import Rotation
from .tp import Split


@dataclass(frozen=True)
class Entry:
    """One tensor of the original file as this file holds it: a tensor of its own, or rows
    [row0, row0 + info.n) of the fused tensor `fused`."""

    name: str
    tensor: Tensor  # the stored tensor (the fused tensor, for a member)
    info: WeightInfo | None  # the weight itself (a member: shape [K, its rows]); None: no weight
    stored: WeightInfo | None  # the stored tensor's (the fused matrix's, for a member)
    row0: int = 0
    fused: str | None = None
    split: Split | None = None  # in a tensor-parallel shard: the part of the tensor it holds

    def slices(
        self, backend: weight_io.Backend, gf: GGUFFile, rows: int
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(row, PQ2_0 raw bytes) of the weight's rows, `rows` at a time (rows counted from the
        weight's first; `rows` a multiple of the stored tile height)."""
        if self.info is None or self.stored is None:
            raise ValueError(f"tensor '{self.name}' is not a PQ2-family weight")
        return weight_io.raw_slices(
            backend, gf, self.tensor, self.stored, rows, self.row0, self.info.n
        )

    @property
    def ne(self) -> tuple[int, ...]:
        """The logical shape (gguf order): a weight's, else the stored tensor's."""
        return self.info.ne if self.info is not None else self.tensor.ne

    @property
    def input_width(self) -> int | None:
        """The width of the activation a weight reads as the model defines it (its K; for a
        shard's part of a row-parallel weight, the whole weight's): the width whose rotation
        signs it uses. None for a tensor that is not a weight."""
        if self.info is None:
            return None
        return self.split.extent if self.split is not None and self.split.axis == 0 else self.info.k

    def out_tensor(self) -> OutTensor:
        """How a repack writes a tensor that is not a weight: as it is."""
        t = self.tensor
        return OutTensor(t.name, t.type_id, t.ne, t.nbytes)

    def chunks(self, gf: GGUFFile) -> Iterator[np.ndarray]:
        """The bytes of a tensor that is not a weight, weight_io.PASS_CHUNK at a time (each
        chunk's pages dropped once the next is asked for)."""
        t = self.tensor
        for start in range(0, t.nbytes, weight_io.PASS_CHUNK):
            stop = min(start + weight_io.PASS_CHUNK, t.nbytes)
            yield gf.data(t, start, stop)
            gf.release(t, start, stop)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tensor the entry stands for (a member: its share of the fused
        tensor, so that the shares of a tensor add up to its size)."""
        size = self.tensor.nbytes
        if self.fused is None or self.stored is None or self.info is None:
            return size
        n = self.stored.n
        return size * (self.row0 + self.info.n) // n - size * self.row0 // n

    @property
    def place(self) -> str:
        """Where a member's rows are, for messages ("" for a tensor of its own)."""
        if self.fused is None or self.info is None:
            return ""
        return f"rows {self.row0}..{self.row0 + self.info.n - 1} of fused tensor '{self.fused}'"


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


def contents(gf: GGUFFile, check_bytes: bool = True) -> Contents:
    """The file's original tensors (module docstring); with check_bytes also every stored
    weight's byte count. FormatError names the file and what contradicts what."""
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
    return Contents(entries, fused, shard)


# ---- which siblings --fuse writes as one tensor ---------------------------------------------


def sibling_groups(plan: Plan) -> list[tuple[str, ...]]:
    """The projections that read one activation, of every stage that has more than one."""
    return [s.projections for s in plan.stages if len(s.projections) > 1]


def fused_name(members: Sequence[str]) -> str:
    """The name of the tensor fusing members blk.N.a.weight, blk.N.b.weight: blk.N.a+b.weight."""
    head = os.path.commonprefix(list(members))
    head = head[: head.rfind(".") + 1]
    return head + "+".join(m[len(head) :].removesuffix(".weight") for m in members) + ".weight"


@dataclass(frozen=True)
class Group:
    name: str  # the fused tensor's
    members: tuple[Entry, ...]  # in row order (the plan's)


def _why_separate(
    members: Sequence[Entry], rotation: Rotation | None, layout: str, rt: int
) -> str | None:
    """Why a sibling group cannot be one fused tensor of `layout`, or None when it can."""
    for e in members:
        if e.info is None:
            return f"{e.name} is not a PQ2_0, PTQ1_0 or TQ2_0 weight"
    infos = [e.info for e in members if e.info is not None]
    for e, info in zip(members, infos, strict=True):
        if len(info.ne) != 2:
            return f"{e.name} has shape {list(info.ne)}, not a 2-D matrix"
    if len({i.k for i in infos}) > 1:
        return "their input widths differ (K = " + ", ".join(str(i.k) for i in infos) + ")"
    if len({i.source_type for i in infos}) > 1:
        types = ", ".join(type_name(i.source_type) for i in infos)
        return f"their source types differ ({types})"
    folded = [rotation is not None and rotation.carries(e.name) for e in members]
    if len(set(folded)) > 1:
        yes, no = (members[folded.index(v)].name for v in (True, False))
        return f"{yes} is folded with the rotation and {no} is not"
    tr = layouts.tile_rows(layout, rt)
    for e, info in zip(members[:-1], infos, strict=False):
        if info.n % tr:
            return (
                f"{e.name} has {info.n} rows, not a whole number of the {tr}-row tiles of "
                f"{layout} rt {rt}"
            )
    return None


def plan_groups(
    gf: GGUFFile, entries: Sequence[Entry], layout: str, rt: int
) -> tuple[list[Group], list[str]]:
    """The sibling groups to write as fused tensors in `layout`, and a line for each group that
    stays separate, saying why. RepackError when the file does not fit the architecture map."""
    names = [e.name for e in entries]
    try:
        plan = decode_plan(names, gf)
    except FormatError as e:
        raise RepackError(
            f"--fuse fuses the siblings that pyq2's architecture map knows "
            f"({', '.join(ARCHITECTURES)}), and {gf.path} does not fit it: {e}"
        ) from None
    by_name = {e.name: e for e in entries}
    widths = {e.name: e.input_width for e in entries if e.input_width is not None}
    rotation = Rotation.from_file(gf, widths)
    groups, separate = [], []
    for group in sibling_groups(plan):
        members = tuple(by_name[n] for n in group)
        why = _why_separate(members, rotation, layout, rt)
        name = fused_name(group)
        if why is None and name in by_name:
            why = f"their fused name '{name}' is a tensor of the file"
        if why is None:
            groups.append(Group(name, members))
        else:
            separate.append(f"{', '.join(group)} stay separate: {why}")
    return groups, separate


# ---- the tensors of a repacked file ----------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One tensor of a repack's output: its parts in the source (the members, for a fused
    tensor), what it is (a WeightInfo, None for a pass-through tensor) and how it is stored."""

    parts: tuple[Entry, ...]
    info: WeightInfo | None
    out: OutTensor
    members: tuple[Member, ...] = ()


def stored_as(name: str, info: WeightInfo, layout: str, rt: int) -> OutTensor:
    """How a weight of logical shape info.ne is stored in `layout`."""
    if layout == "raw":
        return OutTensor(name, PQ2_0, info.ne, formats.pq2_matrix_bytes(info.n, info.k))
    if len(info.ne) > 2:
        raise FormatError(
            f"tensor '{name}' has shape {list(info.ne)}: the {layout} layout "
            f"holds 2-D matrices only (use --layout raw)"
        )
    nbytes = layouts.layout_bytes(layout, info.n, info.k, rt)
    return OutTensor(name, I8, (nbytes,), nbytes)


def output_plan(
    entries: Sequence[Entry], groups: Sequence[Group], layout: str, rt: int
) -> list[Output]:
    """The output's tensors in order: each original tensor where it was, except that a fused
    group stands where the first of its members (in that order) stood."""
    position = {e.name: i for i, e in enumerate(entries)}
    group_of = {m.name: g for g in groups for m in g.members}
    items: list[Output] = []
    placed: set[str] = set()
    for e in entries:
        g = group_of.get(e.name)
        if e.info is None:
            items.append(Output((e,), None, e.out_tensor()))
        elif g is None:
            items.append(Output((e,), e.info, stored_as(e.name, e.info, layout, rt)))
        elif g.name not in placed:
            placed.add(g.name)
            infos = [m.info for m in g.members if m.info is not None]
            members, row0 = [], 0
            for m, mi in zip(g.members, infos, strict=True):
                members.append(Member(m.name, row0, mi.n, position[m.name]))
                row0 += mi.n
            k = infos[0].k
            info = WeightInfo(infos[0].source_type, "raw", 0, (k, row0), k, row0)
            out = stored_as(g.name, info, layout, rt)
            items.append(Output(g.members, info, out, tuple(members)))
    return items

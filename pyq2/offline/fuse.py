"""Sibling fusion in the file (`pyq2 repack --fuse`): which projections are written as one tensor.

Projections that read the same activation (a stage of the decode plan with more than one
projection: attention q/k/v, Gated-DeltaNet qkv and gate, FFN gate and up) can be stored as ONE
planes or tiles matrix whose rows are theirs one after another, in plan order. The decode step
then runs them as one matmul on the file's own matrix. Reading such a file back is
pyq2.gguf.contents.

`plan_groups` picks the groups `--fuse` writes: every sibling group whose members are PQ2-family
weights of one K, one source type and one rotation width, each member but the last a whole
number of the output layout's tiles. Each member's rows are then one piece of the fused code
region and one of its scale region (FORMATS.md 2, "Slices"), with no padding between members.
The other groups stay separate, each with the reason. `output_plan` lays out a repack's output:
every original tensor where it stood, a fused tensor where the first of its members stood.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import FormatError, RepackError
from ..gguf.io import GGUFFile, OutTensor
from ..gguf.metadata import Member, WeightInfo
from ..gguf.types import I8, PQ2_0, type_name
from ..gguf.weights import Entry
from ..plan.decode import ARCHITECTURES, Plan, decode_plan
from ..spec.layouts import Layout
from ..spec.rotation import Rotation


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
    for e, info in zip(members[:-1], infos, strict=False):
        tr = Layout(layout, info.n, info.k, rt).tile_rows
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


@dataclass(frozen=True, slots=True)
class Output:
    """One tensor of a repack's output: its parts in the source (the members, for a fused
    tensor), what it is (a WeightInfo, None for a pass-through tensor), how it is stored and,
    for a weight, its matrix in the output layout."""

    parts: tuple[Entry, ...]
    info: WeightInfo | None
    out: OutTensor
    members: tuple[Member, ...] = ()
    target: Layout | None = None


# The tiles layout pads a weight to whole tiles of 16*RT rows. A weight of fewer rows than a tile
# is padded up to 63 times its size (one row at rt 4); a repack refuses that past this many bytes
# of padding (a real model's weights pad at most a few hundred KB each: 63 rows of K = 17408).
PADDING_LIMIT = 16 << 20


def stored_as(name: str, info: WeightInfo, target: Layout) -> OutTensor:
    """How a weight of logical shape info.ne is stored as the matrix `target`. RepackError when
    the tiles padding would be more than PADDING_LIMIT and more than the weight's own bytes."""
    if target.name == "raw":
        return OutTensor(name, PQ2_0, info.ne, target.bytes)
    if len(info.ne) > 2:
        raise FormatError(
            f"tensor '{name}' has shape {list(info.ne)}: the {target.name} layout "
            f"holds 2-D matrices only (use --layout raw)"
        )
    nbytes = target.bytes
    padding = nbytes - Layout("raw", target.n, target.k).bytes
    if padding > max(PADDING_LIMIT, nbytes - padding):
        raise RepackError(
            f"tensor '{name}' has {info.n} rows of K = {info.k}: the tiles layout (rt "
            f"{target.rt}) pads it to {target.stored_rows} rows, {padding / 1e6:.1f} MB of "
            f"padding for {(nbytes - padding) / 1e6:.1f} MB of weights; pyq2 refuses padding of "
            f"more than {PADDING_LIMIT >> 20} MiB that is larger than the weight itself (no model "
            f"has such a weight: its rows are fewer than one {target.tile_rows}-row tile and very "
            f"long). Use --layout planes, which pads nothing"
        )
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
            target = Layout(layout, e.info.n, e.info.k, rt)
            out = stored_as(e.name, e.info, target)
            items.append(Output((e,), e.info, out, (), target))
        elif g.name not in placed:
            placed.add(g.name)
            infos = [m.info for m in g.members if m.info is not None]
            members, row0 = [], 0
            for m, mi in zip(g.members, infos, strict=True):
                members.append(Member(m.name, row0, mi.n, position[m.name]))
                row0 += mi.n
            k = infos[0].k
            info = WeightInfo(infos[0].source_type, (k, row0), Layout("raw", row0, k))
            target = Layout(layout, row0, k, rt)
            out = stored_as(g.name, info, target)
            items.append(Output(g.members, info, out, tuple(members), target))
    return items

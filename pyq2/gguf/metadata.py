"""The pyq2.* metadata of a GGUF file: how weights repacked into a resident layout are stored.

FORMATS.md 5 specifies the keys (their names, types, values and order, and the checksum and
what it covers), 5.1 those of a fused tensor and 5.2 those of a tensor-parallel shard; this
module is their schema in code. Why they exist: a weight repacked into the `planes` or `tiles`
layout is no longer PQ2_0 blocks, and a host that does not know pyq2 must never read it as if it
were, so it is stored as a 1-D I8 tensor under its own name (a loader that expects a 2-D PQ2_0
tensor fails loudly on type and shape instead of computing garbage), and the keys say what its
bytes are. Readers hold each key to its type (typed_value: "2" for an rt, floats for a shape are
refused), name a missing one, and read only format version FORMAT_VERSION (PQ2_FORMAT_VERSION of
pq2.h: nothing in the bytes of another version tells them apart).

The module holds the key names, `weight_info` (a file's keys for one tensor to a WeightInfo),
`fused_members` (a fused tensor's members, checked against its shape and layout) and
`key_values` (the keys a repacked file gets); for shards `shard_of` (a file's rank),
`tensor_split` (a tensor's part, checked against its shape) and `split_key_values` (a shard's
keys); and the checksum's coverage (`describing_keys`, `description_keys`, `start_checksum`).
pyq2.gguf.io reads and writes them; pyq2.gguf.contents checks what only the whole file can tell
(member names and positions, the checksums against the bytes).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gguf import GGUFValueType

from ..errors import FormatError, quoted
from ..keyvalues import KeyValues
from ..spec import layouts
from ..spec.formats import PQ2_BLOCK_WEIGHTS
from ..spec.layouts import Layout
from .header import MAX_NAME_BYTES
from .splits import Split
from .types import I8, PQ2_FAMILY, type_name

FORMAT_VERSION = 2  # PQ2_FORMAT_VERSION of native/include/pq2.h (a test checks the two agree)

KEY_PREFIX = "pyq2."
KEY_FORMAT_VERSION = KEY_PREFIX + "format_version"
KEY_LAYOUT = KEY_PREFIX + "layout"
TENSOR_KEY_PREFIX = KEY_PREFIX + "tensor."

# The keys of a fused tensor, in file order (after its layout, rt, shape, source_type).
MEMBER_ATTRS = ("members", "member_offsets", "member_rows", "member_positions")
# The keys of every planes or tiles weight, in file order (then a fused tensor's MEMBER_ATTRS,
# then CHECKSUM_ATTR).
WEIGHT_ATTRS = ("layout", "rt", "shape", "source_type")
MAX_MEMBERS = 64  # members of one fused tensor pyq2 reads (it writes 2 or 3)
# The checksum of a planes or tiles tensor (after its other keys): CRC-32 of the records that
# describe it and of its bytes (`describing_keys`, pyq2.gguf.contents checks it).
CHECKSUM_ATTR = "crc32"

TP_MAX = 1024  # the most shards of a set pyq2 reads or writes (GPUs of one host: far fewer)
KEY_TP_SIZE = KEY_PREFIX + "tp.size"
KEY_TP_RANK = KEY_PREFIX + "tp.rank"
SPLIT_ATTRS = ("tp_axis", "tp_extent", "tp_pieces")  # per tensor of a shard, in file order
MAX_PIECES = 4096  # elements of one tp_pieces array pyq2 reads (it writes a few start/stop pairs)

# The layouts stored as I8 bytes plus metadata; raw weights stay plain ggml tensors.
STORED_LAYOUTS = tuple(name for name in layouts.LAYOUT_NAMES if name != "raw")


@dataclass(frozen=True)
class WeightInfo:
    """A PQ2-family weight: stored raw (PQ2_0/PTQ1_0/TQ2_0) or repacked by pyq2 (I8 + metadata).

    `layout` is the matrix as it is stored: raw for a plain ggml tensor (the raw layout of its
    PQ2_0 blocks, whatever its source type), planes or tiles for a repacked one; N x K is its
    logical shape ne = [K, N, ...] (N the product of the outer dimensions)."""

    source_type: int  # 142, 143 or 35
    ne: tuple[int, ...]  # logical shape, gguf order
    layout: Layout

    @property
    def k(self) -> int:
        return self.layout.k

    @property
    def n(self) -> int:
        return self.layout.n


@dataclass(frozen=True)
class Member:
    """One original weight held as rows [row0, row0 + rows) of a fused tensor."""

    name: str
    row0: int
    rows: int
    position: int  # its index in the original file's tensor list


def tensor_key(tensor_name: str, attr: str) -> str:
    return f"{TENSOR_KEY_PREFIX}{tensor_name}.{attr}"


def _rows(ne: tuple[int, ...]) -> int:
    return math.prod(ne[1:])  # exact Python integers: a crafted shape cannot overflow


class _Missing:
    pass


_MISSING = _Missing()


def _length(kv: KeyValues, key: str) -> int | None:
    """Elements of an array key, known without decoding it (a GGUFFile knows; a dict does not)."""
    array_len = getattr(kv, "array_len", None)
    value_type = getattr(kv, "value_type", None)
    if array_len is None or value_type is None or value_type(key) != GGUFValueType.ARRAY:
        return None
    return int(array_len(key))


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64


def typed_value(kv: KeyValues, key: str, kind: str, where: str, max_items: int = 0) -> Any:
    """The value of pyq2 key `key`, held to its type: kind "str", "uint" (a non-negative
    integer), "strs" or "uints" (arrays of them, at most `max_items` elements, counted before
    the array is decoded). FormatError, naming the file (`where`) and the key, for a missing key
    or a value of another type ("2" as a string, 2.0 as a float, true as a bool)."""
    if not kv.has(key):
        raise FormatError(f"{where}: incomplete pyq2 metadata (no {key})")
    if kind in ("strs", "uints"):
        n = _length(kv, key)
        if n is not None and n > max_items:
            raise FormatError(
                f"{where}: {key} has {n} elements; pyq2 writes at most {max_items} there"
            )
    value = kv.value(key, _MISSING)
    ok = {
        "str": lambda v: isinstance(v, str),
        "uint": _is_uint,
        "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "uints": lambda v: isinstance(v, list) and all(_is_uint(x) for x in v),
    }[kind]
    if not ok(value) or (kind in ("strs", "uints") and len(value) > max_items):
        want = {
            "str": "a string",
            "uint": "an unsigned integer",
            "strs": "an array of strings",
            "uints": f"an array of at most {max_items} unsigned integers",
        }[kind]
        raise FormatError(f"{where}: {key} is {quoted(value)}, not {want}")
    return value


def weight_info(kv: KeyValues, name: str, type_id: int, ne: tuple[int, ...]) -> WeightInfo | None:
    """Describe the tensor `name` (ggml type type_id, shape ne) of the file kv if it is a
    PQ2-family weight, stored raw or repacked; None for any other tensor. FormatError names the
    file and the tensor when its pyq2 metadata is missing (naming the key), of another type,
    inconsistent or of another version, or when its shape cannot be a weight's. The checksum key
    must be there (an unsigned integer); pyq2.gguf.contents checks it against the tensor's
    bytes."""
    where = f"{kv.path}: tensor '{name}'"
    if type_id in PQ2_FAMILY:
        return _weight(where, type_id, ne, "raw", 0)
    if not kv.has(tensor_key(name, "layout")):
        rest = [a for a in (*WEIGHT_ATTRS[1:], CHECKSUM_ATTR) if kv.has(tensor_key(name, a))]
        if rest:  # a weight whose layout key is gone must not pass as a plain I8 tensor
            raise FormatError(
                f"{where}: incomplete pyq2 metadata (no {tensor_key(name, 'layout')}, but "
                f"{tensor_key(name, rest[0])})"
            )
        return None
    version = kv.value(KEY_FORMAT_VERSION)
    if version != FORMAT_VERSION or not _is_uint(version):
        older = _is_uint(version) and version < FORMAT_VERSION
        hint = (
            "written by an older pyq2 (version 2 changed the tiles lane order): repack the "
            "original GGUF again"
            if older
            else "upgrade pyq2"
        )
        raise FormatError(
            f"{kv.path}: {KEY_FORMAT_VERSION} is {quoted(version)}; this pyq2 reads version "
            f"{FORMAT_VERSION} ({hint})"
        )
    layout = typed_value(kv, tensor_key(name, "layout"), "str", where)
    rt = typed_value(kv, tensor_key(name, "rt"), "uint", where)
    shape = tuple(typed_value(kv, tensor_key(name, "shape"), "uints", where, max_items=2))
    source = typed_value(kv, tensor_key(name, "source_type"), "uint", where)
    if not kv.has(tensor_key(name, CHECKSUM_ATTR)):
        raise FormatError(
            f"{where}: incomplete pyq2 metadata (no {tensor_key(name, CHECKSUM_ATTR)}; a file "
            f"repacked by a pyq2 older than its checksums: repack the original GGUF again)"
        )
    typed_value(kv, tensor_key(name, CHECKSUM_ATTR), "uint", where)
    if type_id != I8 or len(ne) != 1:
        raise FormatError(
            f"{where}: pyq2 layout metadata on a {type_name(type_id)} tensor of shape "
            f"{quoted(list(ne))} (expected 1-D I8)"
        )
    if (
        layout not in STORED_LAYOUTS
        or source not in PQ2_FAMILY
        or not 1 <= len(shape) <= 2
        or (layout == "tiles" and rt not in layouts.TILE_RTS)
        or (layout == "planes" and rt != 0)
    ):
        raise FormatError(
            f"{where}: bad pyq2 metadata layout={quoted(layout)} rt={rt} "
            f"shape={quoted(list(shape))} source_type={source}"
        )
    if shape[0] % PQ2_BLOCK_WEIGHTS:
        raise FormatError(f"{where}: K = {shape[0]} is not a multiple of {PQ2_BLOCK_WEIGHTS}")
    return _weight(where, source, shape, layout, rt)


def _weight(where: str, source: int, ne: tuple[int, ...], layout: str, rt: int) -> WeightInfo:
    """The WeightInfo of a weight of shape ne; FormatError for a shape no weight has."""
    k, n = ne[0], _rows(ne)
    if k < 1 or n < 1 or k % PQ2_BLOCK_WEIGHTS:
        raise FormatError(
            f"{where} ({type_name(source)}, {layout}) has shape {quoted(list(ne))}: a weight "
            f"needs K >= 128 and at least one row"
        )
    return WeightInfo(source, ne, Layout(layout, n, k, rt))


def _uints(value: Any) -> bool:
    return isinstance(value, list) and all(_is_uint(x) for x in value)


def fused_members(kv: KeyValues, name: str, info: WeightInfo | None) -> tuple[Member, ...] | None:
    """The members of tensor `name` (described by info) when it is a fused tensor, else None.
    FormatError names the file, the tensor and the fault when its member keys are incomplete,
    of the wrong type, or disagree with each other, with the matrix's rows or with its tiles."""
    present = [a for a in MEMBER_ATTRS if kv.has(tensor_key(name, a))]
    if not present:
        return None
    where = f"{kv.path}: fused tensor '{name}'"
    missing = [tensor_key(name, a) for a in MEMBER_ATTRS if a not in present]
    if missing:
        raise FormatError(f"{where}: incomplete fused metadata (no {', '.join(missing)})")
    if info is None or info.layout.name not in STORED_LAYOUTS:
        what = "not a PQ2-family weight" if info is None else f"a {info.layout.name} weight"
        raise FormatError(f"{where}: fused metadata on {what} (a fused tensor is planes or tiles)")
    names, offsets, rows, positions = (
        typed_value(kv, tensor_key(name, a), kind, where, MAX_MEMBERS)
        for a, kind in zip(MEMBER_ATTRS, ("strs", "uints", "uints", "uints"), strict=True)
    )
    counts = [len(names), len(offsets), len(rows), len(positions)]
    if len(names) < 2 or len(set(counts)) > 1:
        raise FormatError(
            f"{where}: {counts[0]} members, {counts[1]} offsets, {counts[2]} row counts and "
            f"{counts[3]} positions (a fused tensor has at least 2 members, one of each per member)"
        )
    bad = next((n for n in names if not n or len(n) > MAX_NAME_BYTES or not n.isprintable()), None)
    if bad is not None:
        raise FormatError(f"{where}: member name {quoted(bad)} is not a tensor name")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise FormatError(f"{where}: member '{n}' is named twice")
        seen.add(n)
    tr = info.layout.tile_rows
    end = 0
    for member, row0, n in zip(names, offsets, rows, strict=True):
        if n < 1:
            raise FormatError(f"{where}: member '{member}' has {n} rows")
        if row0 != end:
            raise FormatError(
                f"{where}: member '{member}' starts at row {row0}, but the members before it "
                f"end at row {end}"
            )
        if row0 % tr:
            raise FormatError(
                f"{where}: member '{member}' starts at row {row0}, not at a multiple of the "
                f"{tr}-row tiles of {info.layout.name} rt {info.layout.rt} (every member but "
                f"the last must be whole tiles)"
            )
        end += n
    if end != info.n:
        raise FormatError(f"{where}: the members hold {end} rows, the matrix {info.n}")
    return tuple(
        Member(n, r0, r, p) for n, r0, r, p in zip(names, offsets, rows, positions, strict=True)
    )


def member_info(fused: WeightInfo, member: Member) -> WeightInfo:
    """The WeightInfo of a member as its own weight: the fused tensor's type, layout and K, its
    own rows (its original shape [K, rows])."""
    return WeightInfo(fused.source_type, (fused.k, member.rows), fused.layout.rows(0, member.rows))


def key_values(
    layout: str,
    rt: int,
    weights: Iterable[tuple[str, WeightInfo]],
    fused: Mapping[str, Sequence[Member]] | None = None,
) -> list[tuple[Any, ...]]:
    """The pyq2.* key/values of a file whose weights (name, WeightInfo of the source, or of
    the fused matrix) are stored in `layout` (planes or tiles), as pyq2.gguf.io.encode_kv
    arguments, in file order; `fused` maps a fused tensor's name to its members."""
    u32, u64, string, array = (
        GGUFValueType.UINT32,
        GGUFValueType.UINT64,
        GGUFValueType.STRING,
        GGUFValueType.ARRAY,
    )
    rt = layouts.layout_rt(layout, rt)
    items: list[tuple[Any, ...]] = [
        (KEY_FORMAT_VERSION, u32, FORMAT_VERSION),
        (KEY_LAYOUT, string, layout),
    ]
    for name, info in weights:
        items += [
            (tensor_key(name, "layout"), string, layout),
            (tensor_key(name, "rt"), u32, rt),
            (tensor_key(name, "shape"), array, list(info.ne), u64),
            (tensor_key(name, "source_type"), u32, info.source_type),
        ]
        members = (fused or {}).get(name)
        if members:
            items += [
                (tensor_key(name, "members"), array, [m.name for m in members], string),
                (tensor_key(name, "member_offsets"), array, [m.row0 for m in members], u64),
                (tensor_key(name, "member_rows"), array, [m.rows for m in members], u64),
                (tensor_key(name, "member_positions"), array, [m.position for m in members], u64),
            ]
        items.append((tensor_key(name, CHECKSUM_ATTR), u32, 0))  # set as the tensor is written
    return items


def start_checksum(description: Iterable[bytes]) -> int:
    """The CRC-32 (zlib.crc32) of a tensor's description records, in order: its checksum is
    this continued over its bytes, zlib.crc32(bytes, start)."""
    crc = 0
    for record in description:
        crc = zlib.crc32(record, crc)
    return crc


def record_key(record: bytes) -> str:
    """The key of an encoded key/value record."""
    n = int.from_bytes(record[:8], "little")
    return record[8 : 8 + n].decode("utf-8")


def tensor_of_key(key: str) -> tuple[str, str] | None:
    """(tensor name, attribute) of a key pyq2.tensor.<name>.<attr>, else None."""
    if not key.startswith(TENSOR_KEY_PREFIX):
        return None
    name, dot, attr = key[len(TENSOR_KEY_PREFIX) :].rpartition(".")
    return (name, attr) if dot else None


def describing_keys(keys: Iterable[str]) -> dict[str, list[str]]:
    """Per tensor name, the keys pyq2.tensor.<name>.* among `keys` (in their order) other than
    its checksum: with a fused tensor's members' (their tensor-parallel keys), what the
    checksum of a planes or tiles tensor covers besides its bytes (FORMATS.md 5)."""
    out: dict[str, list[str]] = {}
    for key in keys:
        found = tensor_of_key(key)
        if found is not None and found[1] != CHECKSUM_ATTR:
            out.setdefault(found[0], []).append(key)
    return out


def description_keys(
    index: Mapping[str, list[str]], name: str, members: Sequence[str] = ()
) -> list[str]:
    """The keys a tensor's checksum covers (`index` from describing_keys): its own, in file
    order, then each member's, member after member in row order."""
    return [k for n in (name, *members) for k in index.get(n, ())]


def shard_of(kv: KeyValues) -> tuple[int, int] | None:
    """(G, rank) of a tensor-parallel shard, None for a whole model. FormatError for keys that
    are not a rank below a size of at least 2."""
    if not (kv.has(KEY_TP_SIZE) or kv.has(KEY_TP_RANK)):
        return None
    size, rank = kv.value(KEY_TP_SIZE), kv.value(KEY_TP_RANK)
    if not _uints([size, rank]) or not 2 <= size <= TP_MAX or not rank < size:
        raise FormatError(
            f"{kv.path}: {KEY_TP_SIZE} = {quoted(size)} and {KEY_TP_RANK} = {quoted(rank)} are "
            f"not a tensor-parallel size of at least 2 (at most {TP_MAX}) and a rank below it"
        )
    return size, rank


def tensor_split(
    kv: KeyValues, name: str, ne: tuple[int, ...], size: int, rank: int
) -> Split | None:
    """The part of tensor `name` (held as shape ne) a shard holds, None when it holds it whole.
    The Split has this rank's pieces only, at index `rank` (the others empty). FormatError for
    keys that are incomplete, of the wrong type, or disagree with each other or with ne."""
    present = [a for a in SPLIT_ATTRS if kv.has(tensor_key(name, a))]
    if not present:
        return None
    where = f"{kv.path}: tensor '{name}'"
    if len(present) < len(SPLIT_ATTRS):
        missing = [tensor_key(name, a) for a in SPLIT_ATTRS if a not in present]
        raise FormatError(f"{where}: incomplete tensor-parallel metadata (no {', '.join(missing)})")
    axis, extent, flat = (
        typed_value(kv, tensor_key(name, a), kind, where, MAX_PIECES)
        for a, kind in zip(SPLIT_ATTRS, ("uint", "uint", "uints"), strict=True)
    )
    if axis >= max(len(ne), 1) or not flat or len(flat) % 2:
        raise FormatError(
            f"{where}: bad tensor-parallel metadata axis={axis} extent={extent} "
            f"pieces={quoted(flat)} (an axis of the tensor, a size, start/stop pairs)"
        )
    pieces = tuple(zip(flat[0::2], flat[1::2], strict=True))
    end = 0
    for a, b in pieces:
        if a >= b:
            raise FormatError(f"{where}: tensor-parallel piece [{a}, {b}) is empty")
        if a < end:
            raise FormatError(
                f"{where}: tensor-parallel piece [{a}, {b}) starts before the one before it ends"
            )
        if b > extent:
            raise FormatError(
                f"{where}: tensor-parallel piece [{a}, {b}) ends beyond the extent {extent}"
            )
        end = b
    held = sum(b - a for a, b in pieces)
    if held != ne[axis]:
        raise FormatError(
            f"{where}: its tensor-parallel pieces hold {held} along axis {axis}, the tensor "
            f"{ne[axis]}"
        )
    return Split(axis, extent, tuple(pieces if r == rank else () for r in range(size)))


def split_key_values(
    size: int, rank: int, splits: Iterable[tuple[str, Split]]
) -> list[tuple[Any, ...]]:
    """The pyq2.tp.* keys of shard `rank` of `size` and the split keys of each
    (name, Split)."""
    u32, u64, array = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.ARRAY
    items: list[tuple[Any, ...]] = [(KEY_TP_SIZE, u32, size), (KEY_TP_RANK, u32, rank)]
    for name, split in splits:
        flat = [x for piece in split.pieces[rank] for x in piece]
        items += [
            (tensor_key(name, "tp_axis"), u32, split.axis),
            (tensor_key(name, "tp_extent"), u64, split.extent),
            (tensor_key(name, "tp_pieces"), array, flat, u64),
        ]
    return items

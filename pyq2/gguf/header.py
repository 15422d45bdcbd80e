"""The GGUF header (version, key/values, tensor infos): the limits a file is held to, and the
parser that holds it to them.

`parse_header` reads a header from a file descriptor, with pread and a window at a time: no
mapping, so a file that shrinks meanwhile is a FormatError, not SIGBUS, and the parser holds one
window however large the header. Nothing the file says is trusted: every count, length,
dimension and offset is checked against the limits below and against the bytes the file has
before anything is sized by it, so a crafted file fails with one FormatError naming the file and
the byte, never with a huge allocation, a huge output or a deep recursion.

Values are not decoded while parsing: a key/value is the place and type of its record
(`KeyValue`), an array is walked over without keeping its elements, and `decode_value` reads a
value when asked. A 262144-token vocabulary therefore costs one walk over its string lengths,
not a Python object per token, and a repack copies it as the raw bytes of its record.

The rules are those of ggml's reader (gguf.cpp), which every file a llama.cpp-style loader
accepts follows: version 2 or 3, little-endian; keys and tensor names unique; at most 4
dimensions; general.alignment a uint32 power of two; tensor data in tensor order, each tensor
at the offset where the one before it ends, padded to the alignment. pyq2 adds the bounds below
(alignment, array nesting, name length) and asks names to be printable UTF-8.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import FormatError, quoted
from .types import PQ2_0, PTQ1_0, block_size, type_name

# ---- limits ---------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # version 1 had 32-bit counts; ggml and gguf read 2 and 3 only
DEFAULT_ALIGNMENT = 32
# general.alignment must be a power of two (the format). pyq2 also caps it at the largest page
# size of common systems: a larger alignment buys an mmap reader nothing, and the header and every
# tensor are padded to it (a 173-byte file asking for 2^31 would make a 2 GB repack).
MAX_ALIGNMENT = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DIM = (1 << 63) - 1  # ggml's ne is int64
# Arrays of arrays are valid GGUF, but no model file uses them; pyq2 reads them this deep
# (an array of arrays is depth 2) and refuses deeper ones instead of recursing into them.
MAX_ARRAY_DEPTH = 4
# Key and tensor names longer than this are refused (ggml's own tensor names are below 64 bytes):
# a name is read whole and quoted in messages.
MAX_NAME_BYTES = 1 << 16
WINDOW = 1 << 16  # bytes of the file the parser reads at a time
# The smallest record of each kind, which bounds the counts a file of a given size can hold.
HEADER_BYTES = 4 + 4 + 8 + 8  # magic, version, tensor count, key/value count
KV_MIN_BYTES = 8 + 4 + 1  # key length, value type, the smallest value (u8, i8, bool)
TENSOR_INFO_MIN_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, data offset

V = GGUFValueType
# struct formats (little-endian) of the scalar value types; the writer uses them too.
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    V.UINT8: "<B",
    V.INT8: "<b",
    V.UINT16: "<H",
    V.INT16: "<h",
    V.UINT32: "<I",
    V.INT32: "<i",
    V.FLOAT32: "<f",
    V.UINT64: "<Q",
    V.INT64: "<q",
    V.FLOAT64: "<d",
    V.BOOL: "<?",
}
_SCALAR_SIZE = {t: struct.calcsize(f) for t, f in SCALAR_FORMATS.items()}
_NP_DTYPE = {t: np.dtype(f.replace("?", "u1")) for t, f in SCALAR_FORMATS.items()}
_U64 = struct.Struct("<Q")


# ---- what a header holds ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyValue:
    """Where a key/value record lies and what type it holds (the value is decoded on demand)."""

    key: str
    offset: int  # first byte of the record (its key length)
    size: int  # bytes of the whole record
    vtype: GGUFValueType
    value_offset: int  # first byte of the value (of an array: of its element type)
    item_type: GGUFValueType | None  # of an array, else None
    count: int  # elements of an array, 1 otherwise


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    type_id: int
    ne: tuple[int, ...]  # gguf order: ne[0] is the innermost (K for a weight matrix)
    nbytes: int
    offset: int  # absolute byte offset in the file
    index: int

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)


@dataclass(frozen=True)
class Header:
    version: int
    alignment: int
    data_offset: int  # where tensor data starts: the end of the tensor infos, aligned
    kvs: dict[str, KeyValue]  # in file order
    tensors: list[Tensor]


# ---- parsing ------------------------------------------------------------------------------


class _Cursor:
    """Reads little-endian fields of a file in order, refusing to read past its end.

    The source is a buffer (bytes, an mmap) or a file descriptor. A descriptor is read with
    pread through a window of WINDOW bytes at a time, so the parser never touches a mapping (a
    file that shrinks under it gives a short read and a FormatError, not SIGBUS) and holds no
    more than the window however large the header; what it only steps over (a long string, the
    elements of a numeric array) it never reads."""

    def __init__(self, source, size: int, path: str):
        self.size, self.path, self.pos = size, path, 0
        if isinstance(source, int):
            self.fd: int | None = source
            self.buf: Any = b""
        else:
            self.fd, self.buf = None, source
        self.base = 0  # the file offset of self.buf[0]

    def fail(self, message: str) -> FormatError:
        return FormatError(f"{self.path}: {message}")

    def take(self, n: int, what: str) -> int:
        """Offset of the next n bytes (and move past them); FormatError if the file ends first."""
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated at byte {self.size} (reading {what}: {n} bytes at byte {self.pos})"
            )
        at = self.pos
        self.pos += n
        return at

    def window(self, at: int, n: int) -> tuple[Any, int]:
        """(a buffer, the index in it) of the n bytes at file offset `at`, which take() has
        passed: from the window, read again from the file when it does not hold them."""
        i = at - self.base
        if 0 <= i and i + n <= len(self.buf):
            return self.buf, i
        if self.fd is None:
            raise self.fail(f"bytes {at}..{at + n} are beyond the buffer")  # a caller's bug
        want = min(max(n, WINDOW), self.size - at)
        data = os.pread(self.fd, want, at)
        if len(data) < n:
            raise self.fail(shrank(self.fd, self.size, f"reading bytes {at}..{at + n}"))
        self.buf, self.base = data, at
        return data, 0

    def u32(self, what: str) -> int:
        buf, i = self.window(self.take(4, what), 4)
        return int(struct.unpack_from("<I", buf, i)[0])

    def u64(self, what: str) -> int:
        buf, i = self.window(self.take(8, what), 8)
        return int(_U64.unpack_from(buf, i)[0])

    def name(self, what: str) -> str:
        """A string that names something (a key, a tensor): printable UTF-8 of at most
        MAX_NAME_BYTES, so that every message naming it stays one short line."""
        n = self.u64(f"the length of {what}")
        at = self.take(n, what)
        if n > MAX_NAME_BYTES:
            raise self.fail(
                f"{what} at byte {at} is {n} bytes long; pyq2 reads names of at most "
                f"{MAX_NAME_BYTES}"
            )
        buf, i = self.window(at, n)
        raw = bytes(buf[i : i + n])
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {at} is not UTF-8: {quoted(raw)}") from None
        if not name.isprintable():  # a line break, control or bidi character in every message
            raise self.fail(f"{what} at byte {at} has unprintable characters: {quoted(name)}")
        return name

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        t = self.u32(what)
        if t not in GGUFValueType._value2member_map_:
            raise self.fail(f"{what} at byte {at} is {t}, not a GGUF value type")
        return GGUFValueType(t)


def shrank(fd: int, size: int, what: str) -> str:
    """The message for a file that is shorter than when it was opened (another process is
    rewriting it): pyq2 reads with pread, so a shrinking file is a short read, never SIGBUS."""
    try:
        now = f"{os.fstat(fd).st_size} bytes"
    except OSError:
        now = "fewer bytes"
    return (
        f"the file shrank from {size} to {now} while pyq2 read it ({what}): another process is "
        f"changing it"
    )


def _min_value_bytes(t: GGUFValueType) -> int:
    """The fewest bytes a value of type t takes: a string or array needs its length at least."""
    if t == V.STRING:
        return 8
    if t == V.ARRAY:
        return 4 + 8
    return _SCALAR_SIZE[t]


def _skip_value(cur: _Cursor, t: GGUFValueType, what: str, depth: int = 1) -> tuple[Any, int]:
    """Move past a value of type t; returns (element type, count) of an array, else (None, 1)."""
    if t in _SCALAR_SIZE:
        cur.take(_SCALAR_SIZE[t], what)
        return None, 1
    if t == V.STRING:
        cur.take(cur.u64(f"the length of {what}"), what)
        return None, 1
    if depth > MAX_ARRAY_DEPTH:
        raise cur.fail(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
    item = cur.value_type(f"the element type of {what}")
    count = cur.u64(f"the length of {what}")
    need = count * _min_value_bytes(item)
    if need > cur.size - cur.pos:
        raise cur.fail(
            f"truncated at byte {cur.size} (reading {what}: {count} {item.name} elements take "
            f"at least {need} bytes from byte {cur.pos})"
        )
    if item in _SCALAR_SIZE:
        cur.take(need, what)
    elif item == V.STRING:
        pos, end = cur.pos, cur.size
        buf, base = cur.buf, cur.base
        have = base + len(buf)  # the window holds file bytes [base, have)
        for i in range(count):  # the hot loop of a vocabulary: plain arithmetic only
            if pos + 8 > have:
                if end - pos < 8:
                    cur.pos = pos
                    cur.take(8, f"the length of string {i} of {what}")
                buf, _ = cur.window(pos, 8)
                base = cur.base
                have = base + len(buf)
            n = _U64.unpack_from(buf, pos - base)[0]
            pos += 8
            if n > end - pos:
                cur.pos = pos
                cur.take(n, f"string {i} of {what}")
            pos += n
        cur.pos = pos
    else:
        for _ in range(count):
            _skip_value(cur, V.ARRAY, what, depth + 1)
    return item, count


def _check_counts(cur: _Cursor, n_tensors: int, n_kv: int) -> None:
    need = HEADER_BYTES + n_kv * KV_MIN_BYTES + n_tensors * TENSOR_INFO_MIN_BYTES
    if need > cur.size:
        raise cur.fail(
            f"the header claims {n_kv} key/values and {n_tensors} tensors, which take at least "
            f"{need} bytes, but the file has {cur.size}"
        )


def _parse_kv(cur: _Cursor, i: int) -> KeyValue:
    start = cur.pos
    key = cur.name(f"the name of key/value {i}")
    vtype = cur.value_type(f"the value type of key '{key}'")
    value_offset = cur.pos
    item, count = _skip_value(cur, vtype, f"the value of key '{key}'")
    return KeyValue(key, start, cur.pos - start, vtype, value_offset, item, count)


def _alignment(cur: _Cursor, kvs: dict[str, KeyValue]) -> int:
    kv = kvs.get("general.alignment")
    if kv is None:
        return DEFAULT_ALIGNMENT
    if kv.vtype != V.UINT32:
        raise cur.fail(f"general.alignment is a {kv.vtype.name}; GGUF requires a UINT32")
    buf, i = cur.window(kv.value_offset, 4)
    a = int(struct.unpack_from("<I", buf, i)[0])
    if a == 0 or a & (a - 1) or a > MAX_ALIGNMENT:
        raise cur.fail(
            f"general.alignment is {a}: it must be a power of two (GGUF) no larger than "
            f"{MAX_ALIGNMENT} (pyq2)"
        )
    return a


def _parse_tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    """(name, ne, type id, data offset relative to the data section) of tensor info i."""
    name = cur.name(f"the name of tensor {i}")
    what = f"tensor '{name}'"
    n_dims = cur.u32(f"the dimension count of {what}")
    if n_dims > MAX_DIMS:
        raise cur.fail(f"{what} has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")
    at = cur.take(8 * n_dims, f"the dimensions of {what}")
    buf, i = cur.window(at, 8 * n_dims)
    ne = struct.unpack_from(f"<{n_dims}Q", buf, i)
    for j, d in enumerate(ne):
        if d > MAX_DIM:
            raise cur.fail(f"{what}: dimension {j} is {d}, more than ggml's int64 can hold")
    type_id = cur.u32(f"the type of {what}")
    rel = cur.u64(f"the data offset of {what}")
    return name, tuple(int(d) for d in ne), type_id, rel


def _tensor_bytes(cur: _Cursor, name: str, type_id: int, ne: tuple[int, ...]) -> int:
    sizes = block_size(type_id)
    if sizes is None:
        raise cur.fail(f"tensor '{name}': unknown ggml type id {type_id}")
    block, block_bytes = sizes
    k = ne[0] if ne else 1
    if k % block:
        hint = " (K must be a multiple of 128)" if type_id in (PQ2_0, PTQ1_0) else ""
        raise cur.fail(
            f"tensor '{name}' ({type_name(type_id)}): K = {k} is not a multiple of the "
            f"{block}-weight block{hint}"
        )
    return math.prod(ne) // block * block_bytes  # exact Python integers: no overflow


def parse_header(source, size: int, path: str) -> Header:
    """Parse and check the header of the GGUF file of `size` bytes: `source` is its descriptor
    (read with pread) or a buffer of its bytes (see the module doc). The caller has checked the
    magic. FormatError names `path` (as messages show it) and what is wrong."""
    cur = _Cursor(source, size, path)
    cur.take(4, "the magic")
    version = cur.u32("the GGUF version")
    if version not in SUPPORTED_VERSIONS:
        if version and version & 0xFFFF == 0:  # a small version number, byte-swapped
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            raise cur.fail(f"big-endian GGUF (version {swapped}) is not supported")
        raise cur.fail(f"GGUF version {version} is not supported (pyq2 reads version 2 and 3)")
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the key/value count")
    _check_counts(cur, n_tensors, n_kv)

    kvs: dict[str, KeyValue] = {}
    for i in range(n_kv):
        kv = _parse_kv(cur, i)
        if kv.key in kvs:
            raise cur.fail(
                f"key '{kv.key}' appears twice (at bytes {kvs[kv.key].offset} and {kv.offset})"
            )
        kvs[kv.key] = kv
    alignment = _alignment(cur, kvs)

    infos = []
    seen = set()
    for i in range(n_tensors):
        info = _parse_tensor_info(cur, i)
        if info[0] in seen:
            raise cur.fail(f"tensor '{info[0]}' appears twice")
        seen.add(info[0])
        infos.append(info)
    data_offset = -(-cur.pos // alignment) * alignment

    tensors = []
    expected = 0  # where the next tensor starts, relative to data_offset
    for i, (name, ne, type_id, rel) in enumerate(infos):
        nbytes = _tensor_bytes(cur, name, type_id, ne)
        if rel != expected:
            raise cur.fail(
                f"tensor '{name}' has data offset {rel}, expected {expected} (GGUF stores "
                f"tensors in order, each padded to the alignment {alignment})"
            )
        end = data_offset + rel + nbytes
        if end > size:
            raise cur.fail(f"truncated at byte {size} (tensor '{name}' ends at byte {end})")
        tensors.append(Tensor(name, type_id, ne, nbytes, data_offset + rel, i))
        expected = rel + -(-nbytes // alignment) * alignment
    return Header(version, alignment, data_offset, kvs, tensors)


# ---- values -------------------------------------------------------------------------------


def _read(buf, t: GGUFValueType, pos: int) -> tuple[Any, int]:
    """(Python value of type t at pos, the byte after it), of a value parse_header checked."""
    if t in SCALAR_FORMATS:
        value = struct.unpack_from(SCALAR_FORMATS[t], buf, pos)[0]
        return value, pos + _SCALAR_SIZE[t]
    if t == V.STRING:
        n = _U64.unpack_from(buf, pos)[0]
        return bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", errors="replace"), pos + 8 + n
    item = GGUFValueType(struct.unpack_from("<I", buf, pos)[0])
    count = _U64.unpack_from(buf, pos + 4)[0]
    pos += 12
    if item in _NP_DTYPE:
        arr = np.frombuffer(buf, _NP_DTYPE[item], count, pos)
        values = (arr != 0 if item == V.BOOL else arr).tolist()
        del arr  # release the buffer export at once
        return values, pos + count * _SCALAR_SIZE[item]
    out = []
    for _ in range(count):
        v, pos = _read(buf, item, pos)
        out.append(v)
    return out, pos


def decode_value(buf, kv: KeyValue) -> Any:
    """The value of a record as Python data: int, float, bool, str (undecodable bytes replaced)
    or a list (nested lists for arrays of arrays); buf holds the file's bytes from offset 0."""
    return _read(buf, kv.vtype, kv.value_offset)[0]


def decode_record(record, kv: KeyValue) -> Any:
    """decode_value of the bytes of kv's record alone (record = the file's bytes
    kv.offset .. kv.offset + kv.size)."""
    return _read(record, kv.vtype, kv.value_offset - kv.offset)[0]

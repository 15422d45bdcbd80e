"""GGUF reading and streaming writing for pyq2: the file mechanics, on top of the `gguf` package.

The ggml types pyq2 adds to gguf live in pyq2.gguf_types (importing this module registers them);
the pyq2.* keys of repacked files, and what they say about a weight, live in pyq2.metadata.

Reading (`open_gguf`)
    GGUFReader memory-maps the file (np.memmap); tensor bytes are views of a second read-only
    mmap, and `GGUFFile.release()` drops a tensor's pages from this process once it is written,
    so resident memory stays near one tensor however large the file is. Malformed files raise
    pyq2.errors.FormatError naming the problem: bad magic, truncation, unknown type id, a row
    length that is not a whole number of blocks (K % 128 for PQ2_0), misaligned tensor offsets.

Writing (`write_gguf`)
    Header, key/values and tensor infos are written first, then each tensor's bytes are asked
    for, written and dropped, so the model never sits in memory. Key/values copied from a source
    are copied as their raw bytes, which keeps every value type, array and order byte for byte.
    Output goes to a temporary file in the destination directory that is fsynced and renamed over
    the destination at the end; on any failure (exception, KeyboardInterrupt, full disk) the
    temporary file is removed and no output exists.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from . import metadata
from .errors import FormatError
from .gguf_types import F32, I8, PQ2_0, PTQ1_0, TQ2_0, block_size, type_name, type_nbytes
from .metadata import WeightInfo

__all__ = [
    "F32",
    "I8",
    "PQ2_0",
    "PTQ1_0",
    "TQ2_0",
    "GGUFFile",
    "GGUFValueType",
    "OutTensor",
    "Tensor",
    "encode_kv",
    "file_size",
    "open_gguf",
    "write_gguf",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Page faults map a window around the faulting page (fault-around, 64 KB by default), so bytes
# just before a released range may be mapped again: release() drops this much before it too.
RELEASE_BEHIND = 1 << 20


# --------------------------------------------------------------------------------- reading ----


class _Truncated(Exception):
    pass


class _Reader(GGUFReader):
    """GGUFReader that checks bounds and validates tensor infos before building tensors.

    The stock reader silently returns short arrays past the end of the file and fails with bare
    errors (IndexError, a reshape ValueError) that name no tensor; these overrides turn every
    such case into a FormatError with the tensor name and the values. Arrays of scalars and
    strings are parsed without the per-element recursion (same parts/data structure as the
    stock reader), which makes a 262k-token vocabulary load in about a second instead of 15.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
        arr = super()._get(offset, dtype, count, override_order)
        if len(arr) < int(count):
            raise _Truncated(
                f"needs {int(count) * arr.itemsize} bytes at offset {offset}, "
                f"the file has {len(self.data)}"
            )
        return arr

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        sub = GGUFValueType(int(itype[0]))
        n = int(alen[0])
        offs = orig_offs + 12
        parts: list = [itype, alen]
        types = [GGUFValueType.ARRAY] + ([sub] if n else [])
        nptype = self.gguf_scalar_to_np.get(sub)
        if nptype is not None:
            size = np.dtype(nptype).itemsize
            if offs + n * size > len(self.data):
                raise _Truncated(
                    f"array of {n} {sub.name} at offset {offs} runs past the end "
                    f"of the file ({len(self.data)} bytes)"
                )
            whole = self._get(offs, nptype, n)
            parts += [whole[i : i + 1] for i in range(n)]
            return 12 + n * size, parts, list(range(2, 2 + n)), types
        if sub == GGUFValueType.STRING:
            plain = self.data.view(np.ndarray)
            end = len(plain)
            data = []
            for _ in range(n):
                if offs + 8 > end:
                    raise _Truncated(f"string length at offset {offs} is past the end of the file")
                slen = plain[offs : offs + 8].view(np.uint64)
                ln = int(slen[0])
                if offs + 8 + ln > end:
                    raise _Truncated(
                        f"string of {ln} bytes at offset {offs} runs past the end "
                        f"of the file ({end} bytes)"
                    )
                parts.append(slen)
                parts.append(plain[offs + 8 : offs + 8 + ln])
                data.append(len(parts) - 1)
                offs += 8 + ln
            return offs - orig_offs, parts, data, types
        return super()._get_field_parts(orig_offs, raw_type)

    def _build_tensors(self, start_offs, fields):
        file_size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            type_id = int(raw_dtype[0])
            ne = [int(d) for d in dims]
            sizes = block_size(type_id)
            if sizes is None:
                raise FormatError(f"tensor '{name}': unknown ggml type id {type_id}")
            block = sizes[0]
            if ne and ne[0] % block:
                what = " (K must be a multiple of 128)" if type_id in (PQ2_0, PTQ1_0) else ""
                raise FormatError(
                    f"tensor '{name}' ({type_name(type_id)}): K = {ne[0]} is not a "
                    f"multiple of the {block}-weight block{what}"
                )
            rel = int(offset_tensor[0])
            if rel % self.alignment:
                raise FormatError(
                    f"tensor '{name}': data offset {rel} is not a multiple of the "
                    f"alignment {self.alignment}"
                )
            nbytes = type_nbytes(type_id, ne)
            end = start_offs + rel + nbytes
            if end > file_size:
                raise FormatError(
                    f"file is truncated: tensor '{name}' ends at byte {end} but "
                    f"the file has {file_size} bytes"
                )
        super()._build_tensors(start_offs, fields)


@dataclass(frozen=True)
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


class GGUFFile:
    """A GGUF file opened for reading. Use as a context manager or call close()."""

    def __init__(self, path):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)  # OSError (missing, unreadable) goes to the caller
        with open(self.path, "rb") as f:
            head = f.read(8)
        if len(head) < 4 or head[:4] != GGUF_MAGIC:
            raise FormatError(
                f"{self.path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})"
                if head
                else f"{self.path}: empty file"
            )
        try:
            r = _Reader(self.path, "r")
        except FormatError as e:
            raise FormatError(f"{self.path}: {e}") from None
        except _Truncated as e:
            raise FormatError(f"{self.path}: file is truncated: {e}") from None
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
            raise FormatError(f"{self.path}: not a valid GGUF file: {e}") from None
        self._reader: _Reader | None = r
        if r.byte_order != "I":
            raise FormatError(f"{self.path}: big-endian GGUF files are not supported")
        self.size = size
        self.version = int(r.fields["GGUF.version"].parts[0][0])
        self.alignment = int(r.alignment)
        self.data_offset = int(r.data_offset)
        # The reader's first three fields are the header, not key/values.
        self.fields: OrderedDict[str, Any] = OrderedDict(
            (k, v) for i, (k, v) in enumerate(r.fields.items()) if i >= 3
        )
        self.tensors: list[Tensor] = [
            Tensor(
                t.name,
                int(t.tensor_type),
                tuple(int(d) for d in t.shape),
                int(t.n_bytes),
                int(t.data_offset),
                i,
            )
            for i, t in enumerate(r.tensors)
        ]
        self._by_name = {t.name: t for t in self.tensors}
        self._file = open(self.path, "rb")
        self._mm: mmap.mmap | None = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    # -- lifetime --
    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a tensor view; the mapping goes with it
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
        self._reader = None

    def _mapping(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"{self.path} is closed")
        return self._mm

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- key/values --
    def keys(self) -> list[str]:
        return list(self.fields)

    def has(self, key: str) -> bool:
        return key in self.fields

    def value_type(self, key: str) -> GGUFValueType:
        return self.fields[key].types[0]

    def array_type(self, key: str) -> GGUFValueType | None:
        types = self.fields[key].types
        return types[-1] if types[0] == GGUFValueType.ARRAY and len(types) > 1 else None

    def array_len(self, key: str) -> int:
        return len(self.fields[key].data)

    def value(self, key: str, default=None):
        """Python value of a key (str, int, float, bool, or list for arrays)."""
        field = self.fields.get(key)
        if field is None:
            return default
        if field.types[0] == GGUFValueType.ARRAY and len(field.types) == 1:
            return []
        return field.contents()

    def kv_record(self, key: str) -> bytes:
        """The complete key/value record (key, type, value) exactly as stored."""
        field = self.fields[key]
        size = sum(int(p.nbytes) for p in field.parts)
        return self._mapping()[field.offset : field.offset + size]

    # -- tensors --
    def tensor(self, name: str) -> Tensor:
        return self._by_name[name]

    def data(self, t: Tensor, start: int = 0, stop: int | None = None) -> np.ndarray:
        """uint8 view of a tensor's bytes [start:stop) (memory-mapped, read-only)."""
        stop = t.nbytes if stop is None else stop
        return np.frombuffer(
            self._mapping(), dtype=np.uint8, count=stop - start, offset=t.offset + start
        )

    def release(self, t: Tensor, start: int = 0, stop: int | None = None) -> None:
        """Drop the pages of a tensor's bytes from this process (they stay in the page cache)."""
        if self._mm is None or not hasattr(self._mm, "madvise"):
            return
        stop = t.nbytes if stop is None else stop
        page = mmap.PAGESIZE
        lo = max(0, (t.offset + start - RELEASE_BEHIND) // page * page)
        hi = min(-(-(t.offset + stop) // page) * page, len(self._mm))
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def weight_info(self, t: Tensor) -> WeightInfo | None:
        """Describe a PQ2-family weight, or None for any other tensor (see pyq2.metadata)."""
        return metadata.weight_info(self, t.name, t.type_id, t.ne)

    def validate_weight_bytes(self, t: Tensor, info: WeightInfo, expected: int) -> None:
        if t.nbytes != expected:
            raise FormatError(
                f"{self.path}: tensor '{t.name}' holds {t.nbytes} bytes, but a "
                f"{info.layout} {list(info.ne)} weight takes {expected}"
            )


def open_gguf(path) -> GGUFFile:
    return GGUFFile(path)


# --------------------------------------------------------------------------------- writing ----

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<?",
}


def _pack_string(s) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def encode_kv(
    key: str, vtype: GGUFValueType, value, sub_type: GGUFValueType | None = None
) -> bytes:
    """One key/value record. Arrays take any sequence (numpy arrays are packed in one go)."""
    out = [_pack_string(key), struct.pack("<I", int(vtype))]
    if vtype == GGUFValueType.STRING:
        out.append(_pack_string(value))
    elif vtype == GGUFValueType.ARRAY:
        if sub_type is None:
            raise ValueError(f"{key}: an array needs its element type")
        out.append(struct.pack("<IQ", int(sub_type), len(value)))
        if sub_type == GGUFValueType.STRING:
            out += [_pack_string(v) for v in value]
        elif sub_type in _SCALAR_FORMATS:
            dtype = np.dtype(_SCALAR_FORMATS[sub_type].replace("?", "b1"))
            out.append(np.asarray(value, dtype=dtype).tobytes())
        else:
            raise ValueError(f"{key}: unsupported array element type {sub_type!r}")
    elif vtype in _SCALAR_FORMATS:
        out.append(struct.pack(_SCALAR_FORMATS[vtype], value))
    else:
        raise ValueError(f"{key}: unsupported value type {vtype!r}")
    return b"".join(out)


@dataclass(frozen=True)
class OutTensor:
    name: str
    type_id: int
    ne: tuple[int, ...]  # gguf order
    nbytes: int


def _pad(n: int, align: int) -> int:
    return (align - n % align) % align


def _write(f, data) -> None:
    """Every byte of the output goes through here (tests make it fail to simulate a full disk)."""
    f.write(data)


def _ti_record(t: OutTensor, rel_offset: int) -> bytes:
    return (
        _pack_string(t.name)
        + struct.pack("<I", len(t.ne))
        + struct.pack(f"<{len(t.ne)}Q", *t.ne)
        + struct.pack("<IQ", t.type_id, rel_offset)
    )


def _header(kv_records, tensors, alignment: int, version: int) -> bytes:
    """Everything before the tensor data, padded to the alignment."""
    head = [GGUF_MAGIC, struct.pack("<IQQ", version, len(tensors), len(kv_records))]
    head += list(kv_records)
    rel = 0
    for t in tensors:
        head.append(_ti_record(t, rel))
        rel += t.nbytes + _pad(t.nbytes, alignment)
    header = b"".join(head)
    return header + bytes(_pad(len(header), alignment))


def file_size(kv_records, tensors, alignment: int = DEFAULT_ALIGNMENT, version: int = 3) -> int:
    """Bytes write_gguf would write for these key/values and tensors."""
    return len(_header(kv_records, tensors, alignment, version)) + sum(
        t.nbytes + _pad(t.nbytes, alignment) for t in tensors
    )


def write_gguf(
    path,
    kv_records: Sequence[bytes],
    tensors: Sequence[OutTensor],
    tensor_data: Callable[[int, OutTensor], Iterable],
    *,
    alignment: int = DEFAULT_ALIGNMENT,
    version: int = 3,
) -> int:
    """Write a GGUF file, streaming tensor data; returns the bytes written.

    kv_records: complete records (from GGUFFile.kv_record or encode_kv), in file order.
    tensor_data(i, t): an iterable of buffers (bytes, memoryview, uint8 arrays) that together hold
    exactly t.nbytes bytes; it is called once per tensor, in order, after everything before that
    tensor has been written. The file appears at `path` only when complete.
    """
    path = os.fspath(path)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a power of two")
    for t in tensors:
        if t.nbytes != type_nbytes(t.type_id, t.ne):
            raise ValueError(
                f"tensor '{t.name}': {t.nbytes} bytes do not match "
                f"{type_name(t.type_id)} "
                f"of shape {list(t.ne)}"
            )
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            _write(f, _header(kv_records, tensors, alignment, version))
            for i, t in enumerate(tensors):
                written = 0
                for chunk in tensor_data(i, t):
                    mv = memoryview(chunk).cast("B")
                    written += len(mv)
                    if written > t.nbytes:
                        raise ValueError(f"tensor '{t.name}': got more than its {t.nbytes} bytes")
                    _write(f, mv)
                    del mv, chunk
                if written != t.nbytes:
                    raise ValueError(f"tensor '{t.name}': got {written} bytes, expected {t.nbytes}")
                _write(f, bytes(_pad(t.nbytes, alignment)))
            f.flush()
            os.fsync(f.fileno())
            total = f.tell()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
        return total
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

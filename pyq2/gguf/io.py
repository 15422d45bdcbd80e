"""GGUF reading and streaming writing for pyq2: the file mechanics.

The ggml types pyq2 adds to gguf live in pyq2.gguf.types (importing this module registers them);
the header parser and the limits a file is held to live in pyq2.gguf.header; the pyq2.* keys of
repacked files, and what they say about a weight, live in pyq2.gguf.metadata.

Reading (`open_gguf`)
    Only a regular file is opened (a FIFO, device or directory is refused before any read, so
    nothing waits on a writer). The file is memory-mapped once; the header is parsed and checked
    (gguf_header), values are decoded when asked for, and tensor bytes are read-only views of the
    mapping. `GGUFFile.release()` drops the pages of bytes already used from this process, so
    resident memory stays near one slice however large the file or its tensors are. Malformed
    files raise pyq2.errors.FormatError naming the file and the problem.

Writing (`write_gguf`)
    Header, key/values and tensor infos are written first, then each tensor's bytes are asked
    for, written and dropped, so the model never sits in memory. Key/values copied from a source
    are copied as their raw bytes, which keeps every value type, array and order byte for byte.
    Output goes to a temporary file in the destination directory that is fsynced and renamed over
    the destination at the end; on any failure (exception, KeyboardInterrupt, full disk) the
    temporary file is removed and no output exists. The commands write through pyq2.atomic,
    which gives this function a path inside its own temporary directory and publishes the
    result (exclusively without --force).
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import FormatError, file_kind
from . import metadata
from .header import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    SCALAR_FORMATS,
    KeyValue,
    Tensor,
    decode_value,
    parse_header,
)
from .metadata import WeightInfo
from .types import F32, I8, PQ2_0, PTQ1_0, TQ2_0, type_name, type_nbytes

__all__ = [
    "F32",
    "I8",
    "PQ2_0",
    "PTQ1_0",
    "TQ2_0",
    "GGUFFile",
    "GGUFValueType",
    "KeyValue",
    "OutTensor",
    "Tensor",
    "encode_kv",
    "file_size",
    "open_gguf",
    "write_gguf",
]

# Page faults map a window around the faulting page (fault-around, 64 KB by default), so bytes
# just before a released range may be mapped again: release() drops this much before it too.
RELEASE_BEHIND = 1 << 20


# --------------------------------------------------------------------------------- reading ----


def _check_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    raise FormatError(f"{path} is {file_kind(mode)}: pyq2 reads GGUF files from regular files only")


def _open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at path. The type is checked before the open
    (opening a FIFO for reading would wait for a writer) and again on the descriptor, in case
    the path changed in between; O_NONBLOCK keeps even that open from waiting."""
    _check_regular(path, os.stat(path).st_mode)  # OSError (missing, no access) to the caller
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


class GGUFFile:
    """A GGUF file opened for reading. Use as a context manager or call close()."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = None
        self._fd = _open_regular(self.path)
        try:
            self.size = os.fstat(self._fd).st_size
            head = os.pread(self._fd, 8, 0)
            if len(head) < 4 or head[:4] != GGUF_MAGIC:
                raise FormatError(
                    f"{self.path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})"
                    if head
                    else f"{self.path}: empty file"
                )
            self._mm = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ)
            header = parse_header(self._mm, self.size, self.path)
        except BaseException:
            self.close()
            raise
        self.version = header.version
        self.alignment = header.alignment
        self.data_offset = header.data_offset
        self.fields: dict[str, KeyValue] = header.kvs
        self.tensors: list[Tensor] = header.tensors
        self._by_name = {t.name: t for t in self.tensors}

    # -- lifetime --
    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a tensor view; the mapping goes with it
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

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
        return self.fields[key].vtype

    def array_type(self, key: str) -> GGUFValueType | None:
        """The element type of a non-empty array (None for an empty one)."""
        kv = self.fields[key]
        return kv.item_type if kv.count else None

    def array_len(self, key: str) -> int:
        return self.fields[key].count

    def value(self, key: str, default=None) -> Any:
        """Python value of a key (str, int, float, bool, or list for arrays), read when asked."""
        kv = self.fields.get(key)
        if kv is None:
            return default
        return decode_value(self._mapping(), kv)

    def kv_record(self, key: str) -> bytes:
        """The complete key/value record (key, type, value) exactly as stored."""
        kv = self.fields[key]
        return self._mapping()[kv.offset : kv.offset + kv.size]

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
        """Describe a PQ2-family weight, or None for any other tensor (see pyq2.gguf.metadata).
        FormatError names the file and the tensor when its shape cannot be a weight's."""
        info = metadata.weight_info(self, t.name, t.type_id, t.ne)
        if info is not None and (info.k < 1 or info.n < 1):
            raise FormatError(
                f"{self.path}: tensor '{t.name}' ({type_name(info.source_type)}, "
                f"{info.layout}) has shape {list(info.ne)}: a weight needs K >= 128 and "
                f"at least one row"
            )
        return info

    def validate_weight_bytes(self, t: Tensor, info: WeightInfo, expected: int) -> None:
        if t.nbytes != expected:
            raise FormatError(
                f"{self.path}: tensor '{t.name}' holds {t.nbytes} bytes, but a "
                f"{info.layout} {list(info.ne)} weight takes {expected}"
            )


def open_gguf(path) -> GGUFFile:
    return GGUFFile(path)


# --------------------------------------------------------------------------------- writing ----


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
        elif sub_type in SCALAR_FORMATS:
            dtype = np.dtype(SCALAR_FORMATS[sub_type].replace("?", "b1"))
            out.append(np.asarray(value, dtype=dtype).tobytes())
        else:
            raise ValueError(f"{key}: unsupported array element type {sub_type!r}")
    elif vtype in SCALAR_FORMATS:
        out.append(struct.pack(SCALAR_FORMATS[vtype], value))
    else:
        raise ValueError(f"{key}: unsupported value type {vtype!r}")
    return b"".join(out)


def typed(key: str, value: Any) -> tuple[Any, ...]:
    """(key, type, value[, element type]) of a plain Python value, for encode_kv: a str, a bool,
    a float (FLOAT32), an int (UINT32), or a list of strings or of integers (INT32)."""
    if isinstance(value, str):
        return (key, GGUFValueType.STRING, value)
    if isinstance(value, bool):
        return (key, GGUFValueType.BOOL, value)
    if isinstance(value, float):
        return (key, GGUFValueType.FLOAT32, value)
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) and isinstance(value[0], str):
            return (key, GGUFValueType.ARRAY, list(value), GGUFValueType.STRING)
        return (key, GGUFValueType.ARRAY, np.asarray(value, np.int32), GGUFValueType.INT32)
    return (key, GGUFValueType.UINT32, value)


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

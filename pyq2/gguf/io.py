"""GGUF reading and streaming writing for pyq2: the file mechanics.

The ggml types pyq2 adds to gguf live in pyq2.gguf.types (importing this module registers them);
the header parser and the limits a file is held to live in pyq2.gguf.header; the pyq2.* keys of
repacked files, and what they say about a weight, live in pyq2.gguf.metadata.

Reading (`open_gguf`)
    Only a regular file is opened (a FIFO, device or directory is refused before any read, so
    nothing waits on a writer). The header is parsed and checked (pyq2.gguf.header), values are
    decoded when asked for, and tensor bytes are read when asked for, a slice at a time. All of
    it goes through pread; nothing is memory-mapped. A mapped page beyond the end of a file that
    another process has cut meanwhile kills the reader with SIGBUS, which Python cannot catch; a
    pread of it is a short read, and pyq2 says so in one FormatError naming the file and the
    tensor (`GGUFFile.read`). No page stays resident once its array is gone, so memory stays near
    one slice however large the file or its tensors are. Malformed files raise
    pyq2.errors.FormatError naming the file (as errors.shown_path shows it) and the problem.

Writing (`write_gguf`)
    Header, key/values and tensor infos are written first, then each tensor's bytes are asked
    for, written and dropped, so the model never sits in memory. Key/values copied from a source
    are copied as their raw bytes, which keeps every value type, array and order byte for byte.
    A `LateValue` is a u32 key/value known only once the tensors are written (a tensor's
    checksum): its place is written with 0 and filled in before the file is synced.
    Output goes to a temporary file in the destination directory that is fsynced and renamed over
    the destination at the end; on any failure (exception, KeyboardInterrupt, full disk) the
    temporary file is removed and no output exists. The commands write through pyq2.atomic,
    which gives this function a path inside its own temporary directory and publishes the
    result (exclusively without --force).
"""

from __future__ import annotations

import os
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ..errors import FormatError, file_kind, quoted, shown_path
from . import metadata
from .header import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    SCALAR_FORMATS,
    KeyValue,
    Tensor,
    decode_record,
    parse_header,
    shrank,
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
    "CopiedRecord",
    "KeyValue",
    "LateValue",
    "OutTensor",
    "Tensor",
    "encode_kv",
    "file_size",
    "open_gguf",
    "write_gguf",
]

# --------------------------------------------------------------------------------- reading ----

MAX_DECODED = 1 << 22  # elements of an array GGUFFile.value decodes (a vocabulary: 262144)
COPY_CHUNK = 1 << 20  # bytes of a key/value record read at a time (kv_chunks, kv_source)


def _check_regular(shown: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    raise FormatError(
        f"{shown} is {file_kind(mode)}: pyq2 reads GGUF files from regular files only"
    )


def _open_regular(path: str, shown: str) -> int:
    """A read-only descriptor of the regular file at path (`shown` in messages). The type is
    checked before the open (opening a FIFO for reading would wait for a writer) and again on
    the descriptor, in case the path changed in between; O_NONBLOCK keeps even that open from
    waiting."""
    _check_regular(shown, os.stat(path).st_mode)  # OSError (missing, no access) to the caller
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_regular(shown, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


class GGUFFile:
    """A GGUF file opened for reading. Use as a context manager or call close().

    `path` is the path as messages show it (errors.shown_path: the path given, quoted as a shell
    does when it holds a line break or another unprintable character); `file` is the path given.
    """

    def __init__(self, path):
        self.file = os.fspath(path)
        self.path = shown_path(self.file)
        self._fd = -1
        self._fd = _open_regular(self.file, self.path)
        try:
            self.size = os.fstat(self._fd).st_size
            head = os.pread(self._fd, 8, 0)
            if len(head) < 4 or head[:4] != GGUF_MAGIC:
                raise FormatError(
                    f"{self.path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})"
                    if head
                    else f"{self.path}: empty file"
                )
            header = parse_header(self._fd, self.size, self.path)
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
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading --
    def read(self, offset: int, n: int, what: str) -> bytes:
        """The file's n bytes at `offset` (with pread). FormatError when the file no longer has
        them: it shrank after it was opened (another process is rewriting it)."""
        if self._fd < 0:
            raise ValueError(f"{self.path} is closed")
        data = os.pread(self._fd, n, offset) if n else b""
        while len(data) < n:  # pread may return less than asked near a signal: read on
            more = os.pread(self._fd, n - len(data), offset + len(data))
            if not more:
                raise FormatError(f"{self.path}: {shrank(self._fd, self.size, what)}")
            data += more
        return data

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

    def value_bytes(self, key: str) -> int:
        """Bytes of a key's value as stored (a string's length plus 8, an array's elements plus
        12): what decoding it would read."""
        kv = self.fields[key]
        return kv.offset + kv.size - kv.value_offset

    def value(self, key: str, default=None) -> Any:
        """Python value of a key (str, int, float, bool, or list for arrays), read when asked.
        FormatError for an array of more than MAX_DECODED elements (a Python object each; no
        model's metadata has such an array, and a crafted one would take gigabytes)."""
        kv = self.fields.get(key)
        if kv is None:
            return default
        if kv.vtype == GGUFValueType.ARRAY and kv.count > MAX_DECODED:
            raise FormatError(
                f"{self.path}: key '{key}' is an array of {kv.count} elements; pyq2 decodes "
                f"arrays of at most {MAX_DECODED}"
            )
        return decode_record(self.kv_record(key), kv)

    def text_prefix(self, key: str, chars: int) -> tuple[str, int]:
        """(the first `chars` characters or so of a string value, its length in bytes), reading
        no more of it than that."""
        kv = self.fields[key]
        n = struct.unpack("<Q", self.read(kv.value_offset, 8, f"the value of key '{key}'"))[0]
        head = self.read(kv.value_offset + 8, min(n, 4 * chars), f"the value of key '{key}'")
        return head.decode("utf-8", errors="replace")[:chars], n

    def kv_record(self, key: str) -> bytes:
        """The complete key/value record (key, type, value) exactly as stored."""
        kv = self.fields[key]
        return self.read(kv.offset, kv.size, f"key '{key}'")

    def kv_chunks(self, key: str) -> Iterator[bytes]:
        """kv_record's bytes, COPY_CHUNK at a time (a 100 MB array is never read whole)."""
        kv = self.fields[key]
        for at in range(0, kv.size, COPY_CHUNK):
            yield self.read(kv.offset + at, min(COPY_CHUNK, kv.size - at), f"key '{key}'")

    def kv_source(self, key: str) -> Record:
        """The record to give write_gguf to copy it: its bytes, or for one of more than
        COPY_CHUNK bytes a CopiedRecord, read from this file while it is written."""
        kv = self.fields[key]
        return self.kv_record(key) if kv.size <= COPY_CHUNK else CopiedRecord(self, key, kv.size)

    # -- tensors --
    def tensor(self, name: str) -> Tensor:
        return self._by_name[name]

    def data(self, t: Tensor, start: int = 0, stop: int | None = None) -> np.ndarray:
        """uint8 array of a tensor's bytes [start:stop) (read-only; read with pread, so a file
        that shrinks meanwhile is a FormatError naming the tensor, not SIGBUS)."""
        stop = t.nbytes if stop is None else stop
        what = f"tensor '{t.name}', bytes {start}..{stop} of {t.nbytes}"
        return np.frombuffer(self.read(t.offset + start, stop - start, what), dtype=np.uint8)

    def release(self, t: Tensor, start: int = 0, stop: int | None = None) -> None:
        """Kept for callers that drop what they have read: pyq2 reads with pread and maps
        nothing, so no page of a tensor stays in this process once its array is gone."""

    def weight_info(self, t: Tensor) -> WeightInfo | None:
        """Describe a PQ2-family weight, or None for any other tensor (see pyq2.gguf.metadata).
        FormatError names the file and the tensor when its shape cannot be a weight's."""
        return metadata.weight_info(self, t.name, t.type_id, t.ne)

    def validate_weight_bytes(self, t: Tensor, info: WeightInfo, expected: int) -> None:
        if t.nbytes != expected:
            raise FormatError(
                f"{self.path}: tensor '{t.name}' holds {t.nbytes} bytes, but a "
                f"{info.layout.name} {quoted(list(info.ne))} weight takes {expected}"
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


@dataclass
class LateValue:
    """A UINT32 key/value whose value is set while the tensors are written (write_gguf fills
    its place in the header in at the end)."""

    key: str
    value: int = 0

    def record(self) -> bytes:
        return encode_kv(self.key, GGUFValueType.UINT32, self.value)


@dataclass(frozen=True)
class CopiedRecord:
    """A key/value record of an open file, copied into the output as it is written
    (GGUFFile.kv_source): a huge one is never held whole."""

    source: GGUFFile
    key: str
    size: int

    def chunks(self) -> Iterator[bytes]:
        return self.source.kv_chunks(self.key)


Record = bytes | LateValue | CopiedRecord  # a key/value record as write_gguf takes it


def _record_size(piece: Record) -> int:
    if isinstance(piece, LateValue):
        return len(piece.record())
    return piece.size if isinstance(piece, CopiedRecord) else len(piece)


@dataclass(frozen=True, slots=True)
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


def _header_pieces(
    kv_records: Sequence[Record], tensors: Sequence[OutTensor], alignment: int, version: int
) -> tuple[list, int]:
    """(the pieces of everything before the tensor data, a LateValue standing for its record;
    their length with the padding to the alignment)."""
    head: list = [GGUF_MAGIC, struct.pack("<IQQ", version, len(tensors), len(kv_records))]
    head += list(kv_records)
    rel = 0
    for t in tensors:
        head.append(_ti_record(t, rel))
        rel += t.nbytes + _pad(t.nbytes, alignment)
    n = sum(_record_size(p) for p in head)
    return head, n + _pad(n, alignment)


def file_size(
    kv_records: Sequence[Record],
    tensors: Sequence[OutTensor],
    alignment: int = DEFAULT_ALIGNMENT,
    version: int = 3,
) -> int:
    """Bytes write_gguf would write for these key/values and tensors."""
    return _header_pieces(kv_records, tensors, alignment, version)[1] + sum(
        t.nbytes + _pad(t.nbytes, alignment) for t in tensors
    )


def write_gguf(
    path,
    kv_records: Sequence[Record],
    tensors: Sequence[OutTensor],
    tensor_data: Callable[[int, OutTensor], Iterable],
    *,
    alignment: int = DEFAULT_ALIGNMENT,
    version: int = 3,
) -> int:
    """Write a GGUF file, streaming tensor data; returns the bytes written.

    kv_records: complete records (from GGUFFile.kv_record or encode_kv), in file order, or
    LateValues, whose values tensor_data may set: each is written where it stands once every
    tensor is written. tensor_data(i, t): an iterable of buffers (bytes, memoryview, uint8
    arrays) that together hold exactly t.nbytes bytes; it is called once per tensor, in order,
    after everything before that tensor has been written. The file appears at `path` only when
    complete.
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
    head, head_bytes = _header_pieces(kv_records, tensors, alignment, version)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            late: list[tuple[int, LateValue]] = []
            at = 0
            for piece in head:
                if isinstance(piece, LateValue):
                    late.append((at, piece))
                if isinstance(piece, CopiedRecord):
                    for chunk in piece.chunks():
                        _write(f, chunk)
                else:
                    _write(f, piece.record() if isinstance(piece, LateValue) else piece)
                at += _record_size(piece)
            _write(f, bytes(head_bytes - at))
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
            total = f.tell()
            for at, value in late:  # the same length as the placeholder: a u32
                f.seek(at)
                _write(f, value.record())
            f.flush()
            os.fsync(f.fileno())
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

"""The GGUF header parser (pyq2.gguf.header) on crafted files: every count, length, dimension and
offset is held to the format and to the file's size, with one FormatError naming the file and
the problem; non-regular input files are refused before they are read."""

import os
import struct
import tracemalloc

import numpy as np
import pytest
from gguf import GGUFValueType as V

from pyq2.errors import FormatError
from pyq2.gguf import header as gguf_header
from pyq2.gguf import io as gguf_io
from pyq2.gguf.header import MAX_ALIGNMENT, MAX_ARRAY_DEPTH
from pyq2.offline.info import describe
from pyq2.offline.repack import repack
from pyq2.offline.verify import verify

from ..conftest import listing, run_pyq2, tensor_info_offset

# ---- builders -----------------------------------------------------------------------------


def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def u32_kv(key, value) -> bytes:
    return kv(key, V.UINT32, struct.pack("<I", value))


def tinfo(name, ne, type_id=0, offset=0) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)


def gguf(kvs=(), infos=(), data=b"", version=3, n_tensors=None, n_kv=None, alignment=32):
    """A GGUF file from raw key/value records and tensor infos, data after the aligned header."""
    n_tensors = len(infos) if n_tensors is None else n_tensors
    n_kv = len(kvs) if n_kv is None else n_kv
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs)
    head += b"".join(infos)
    return head + bytes(-len(head) % alignment) + data


def f32_tensor(n=4):
    """(tensor info, data) of an F32 tensor "t" of n values."""
    return tinfo("t", (n,)), np.arange(n, dtype="<f4").tobytes()


@pytest.fixture
def write(tmp_path):
    def w(blob, name="x.gguf"):
        p = tmp_path / name
        p.write_bytes(blob)
        return p

    return w


# ---- the limits ---------------------------------------------------------------------------

NESTED = struct.pack("<IQ", V.ARRAY, 1) * 3000 + struct.pack("<IQ", V.UINT8, 0)
INFO, DATA = f32_tensor()

# (id, file bytes, what the message says)
BAD_FILES = [
    (
        "alignment-2^31",
        gguf([u32_kv("general.alignment", 1 << 31)]),
        r"general.alignment is 2147483648: it must be a power of two .* no larger than 65536",
    ),
    ("alignment-0", gguf([u32_kv("general.alignment", 0)]), "general.alignment is 0"),
    ("alignment-48", gguf([u32_kv("general.alignment", 48)]), "power of two"),
    (
        "alignment-u64",
        gguf([kv("general.alignment", V.UINT64, struct.pack("<Q", 64))]),
        "general.alignment is a UINT64; GGUF requires a UINT32",
    ),
    (
        "kv-count",
        gguf(n_kv=1 << 62),
        r"claims 4611686018427387904 key/values and 0 tensors, which take at least \d+ bytes, "
        r"but the file has 32",
    ),
    ("tensor-count", gguf(n_tensors=(1 << 64) - 1), "claims 0 key/values and 18446744073709551615"),
    (
        "array-count",
        gguf([kv("a", V.ARRAY, struct.pack("<IQ", V.UINT32, 1 << 61))]),
        r"truncated at byte \d+ \(reading the value of key 'a': 2305843009213693952 UINT32 "
        r"elements take at least",
    ),
    (
        "string-array-count",
        gguf([kv("a", V.ARRAY, struct.pack("<IQ", V.STRING, 1 << 40))]),
        "1099511627776 STRING elements take at least 8796093022208 bytes",
    ),
    (
        "string-length",
        gguf([kv("s", V.STRING, struct.pack("<Q", (1 << 64) - 1))]),
        r"truncated at byte \d+ \(reading the value of key 's': 18446744073709551615 bytes",
    ),
    (
        "string-in-array",
        gguf([kv("a", V.ARRAY, struct.pack("<IQ", V.STRING, 2) + gstr("ok") + b"\xff" * 8)]),
        "reading string 1 of the value of key 'a'",
    ),
    (
        "key-length",
        b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 50) + bytes(16),
        r"reading the name of key/value 0: 1125899906842624 bytes at byte 32",
    ),
    (
        "nested-arrays",
        gguf([kv("deep", V.ARRAY, NESTED)]),
        f"the value of key 'deep': arrays nested more than {MAX_ARRAY_DEPTH} deep",
    ),
    ("value-type", gguf([kv("k", 13, b"\0")]), "the value type of key 'k' at byte 33 is 13"),
    ("key-not-utf8", gguf([kv(b"\xff\xfe", V.UINT8, b"\0")]), "is not UTF-8"),
    (
        "duplicate-key",
        gguf([u32_kv("k", 1), u32_kv("k", 2)]),
        r"key 'k' appears twice \(at bytes 24 and 41\)",
    ),
    (
        "five-dims",
        gguf(infos=[tinfo("t", (1, 1, 1, 1, 1))], data=bytes(4)),
        "tensor 't' has 5 dimensions; GGUF allows at most 4",
    ),
    (
        "dim-2^63",
        gguf(infos=[tinfo("t", (1 << 63,))]),
        "tensor 't': dimension 0 is 9223372036854775808, more than ggml's int64",
    ),
    (
        "dims-product",  # 2^62 * 2^62 elements: no overflow, just far past the end of the file
        gguf(infos=[tinfo("t", (1 << 62, 1 << 62))]),
        r"truncated at byte 96 \(tensor 't' ends at byte 85070591730234615865843651857942052960\)",
    ),
    (
        "tensor-past-end",
        gguf(infos=[INFO], data=DATA[:-1]),
        r"truncated at byte 79 \(tensor 't' ends at byte 80\)",
    ),
    (
        "tensor-offset",
        gguf(infos=[tinfo("t", (4,), 0, 32)], data=DATA * 3),
        r"tensor 't' has data offset 32, expected 0 \(GGUF stores tensors in order",
    ),
    (
        "overlapping-tensors",
        gguf(infos=[tinfo("a", (4,)), tinfo("b", (4,))], data=DATA * 2),
        "tensor 'b' has data offset 0, expected 32",
    ),
    (
        "duplicate-tensor",
        gguf(infos=[tinfo("a", (4,)), tinfo("a", (4,), 0, 32)], data=DATA * 4),
        "tensor 'a' appears twice",
    ),
    ("unknown-type", gguf(infos=[tinfo("t", (4,), 200)]), "tensor 't': unknown ggml type id 200"),
    ("version-1", gguf(version=1), r"GGUF version 1 is not supported \(pyq2 reads version 2 and 3"),
    ("version-4", gguf(version=4), "GGUF version 4 is not supported"),
    (
        "big-endian",
        b"GGUF" + struct.pack(">IQQ", 3, 0, 0),
        r"big-endian GGUF \(version 3\) is not supported",
    ),
    ("cut-in-version", b"GGUF\x03\x00", r"truncated at byte 6 \(reading the GGUF version"),
    ("cut-in-counts", gguf()[:20], r"truncated at byte 20 \(reading the key/value count"),
    (
        "cut-in-tensor-info",
        gguf(infos=[tinfo("a_long_tensor_name", (4, 4))])[:52],
        r"truncated at byte 52 \(reading the dimension count of tensor 'a_long_tensor_name': 4 "
        r"bytes at byte 50",
    ),
    (
        "cut-in-dims",
        gguf(infos=[tinfo("t", (4, 4))])[:50],
        r"truncated at byte 50 \(reading the dimensions of tensor 't': 16 bytes at byte 37",
    ),
]


@pytest.mark.parametrize("blob,message", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_header_is_one_format_error(write, blob, message):
    p = write(blob)
    with pytest.raises(FormatError, match=message) as e:
        gguf_io.open_gguf(p)
    assert str(e.value).startswith(f"{p}: ")


def test_alignment_bound_keeps_repack_small(tmp_path, write):
    """A tiny file may not ask for gigabytes of padding: the repack is refused, nothing written."""
    src = write(gguf([u32_kv("general.alignment", 1 << 31)]), "a.gguf")
    with pytest.raises(FormatError, match="general.alignment is 2147483648"):
        repack(src, tmp_path / "o.gguf")
    assert listing(tmp_path) == ["a.gguf"]
    ok = write(gguf([u32_kv("general.alignment", MAX_ALIGNMENT)]), "b.gguf")
    s = repack(ok, tmp_path / "o.gguf")
    assert s.bytes_out == MAX_ALIGNMENT == (tmp_path / "o.gguf").stat().st_size


def test_largest_allowed_values_read(write):
    """At the limits, files are read: 4 dimensions, MAX_ARRAY_DEPTH-deep arrays, alignment."""
    deep = struct.pack("<IQ", V.ARRAY, 1) * (MAX_ARRAY_DEPTH - 1) + struct.pack("<IQB", 0, 1, 7)
    blob = gguf(
        [u32_kv("general.alignment", 64), kv("deep", V.ARRAY, deep)],
        [tinfo("t", (1, 2, 1, 2))],
        DATA,
        alignment=64,
    )
    with gguf_io.open_gguf(write(blob)) as f:
        assert f.value("deep") == [[[[7]]]] and f.array_type("deep") == V.ARRAY
        assert f.tensors[0].ne == (1, 2, 1, 2) and f.data(f.tensors[0]).tobytes() == DATA
        assert (f.alignment, f.data_offset) == (64, 192)


def test_version_2_and_empty_names(write):
    blob = gguf([kv("", V.STRING, gstr("")), u32_kv("k", 5)], [tinfo("", (4,))], DATA, version=2)
    with gguf_io.open_gguf(write(blob)) as f:
        assert f.version == 2 and f.keys() == ["", "k"] and f.value("") == ""
        assert f.tensors[0].name == ""


def test_bad_utf8_in_a_value_is_replaced(write):
    with gguf_io.open_gguf(write(gguf([kv("s", V.STRING, gstr(b"a\xffb"))]))) as f:
        assert f.value("s") == "a\ufffdb"
        assert f.kv_record("s").endswith(b"a\xffb")  # copied as it is


def test_vocabulary_is_not_held_per_token(write):
    """A 100k-string array is walked, not stored: opening the file allocates almost nothing, and
    a value is decoded only when asked for."""
    tokens = [f"<tok{i}>" for i in range(100_000)]
    blob = gguf([gguf_io.encode_kv("tokenizer.ggml.tokens", V.ARRAY, tokens, V.STRING)])
    p = write(blob)
    tracemalloc.start()
    try:
        with gguf_io.open_gguf(p) as f:
            _, peak = tracemalloc.get_traced_memory()
            assert f.array_len("tokenizer.ggml.tokens") == len(tokens)
        assert peak < 256 << 10, peak
    finally:
        tracemalloc.stop()
    with gguf_io.open_gguf(p) as f:
        assert f.value("tokenizer.ggml.tokens") == tokens


# ---- weights whose shape cannot be a weight's --------------------------------------------


def test_k_zero_names_file_and_tensor(tmp_path, write):
    src = write(gguf(infos=[tinfo("blk.0.w", (0, 4), gguf_io.PQ2_0)]), "k0.gguf")
    for call in (lambda: repack(src, tmp_path / "o.gguf"), lambda: describe(src)):
        with pytest.raises(FormatError, match=rf"^{src}: tensor 'blk.0.w' \(PQ2_0, raw\) "):
            call()
    with pytest.raises(FormatError, match="tensor 'blk.0.w'"):
        verify(src, src)
    assert listing(tmp_path) == ["k0.gguf"]


def test_n_zero_names_file_and_tensor(tmp_path, write):
    src = write(gguf(infos=[tinfo("w", (128, 0), gguf_io.PQ2_0)]), "n0.gguf")
    with pytest.raises(FormatError, match=r"tensor 'w' .* has shape \[128, 0\]: a weight needs"):
        repack(src, tmp_path / "o.gguf", layout="planes")


def test_tensor_info_cut_of_a_written_file(tmp_path, demo):
    """Cut inside a tensor info of a real file: the message says where, not numpy's words."""
    blob = demo.read_bytes()
    at = tensor_info_offset(blob, "output.weight")
    p = tmp_path / "cut.gguf"
    p.write_bytes(blob[: at + 6])
    with pytest.raises(FormatError, match=rf"truncated at byte {at + 6} \(reading the dim"):
        gguf_io.open_gguf(p)


# ---- input files that are not regular files ----------------------------------------------


def test_non_regular_inputs_are_refused(tmp_path):
    # A FIFO is tried in a child process below, where a regression cannot hang the test run.
    for path, kind in [(tmp_path, "a directory"), ("/dev/null", "a character device")]:
        with pytest.raises(FormatError, match=f"^{path} is {kind}.*regular files only"):
            gguf_io.open_gguf(path)


@pytest.mark.parametrize("command", [["info"], ["repack", "-o", "OUT"], ["verify", "FIFO"]])
def test_fifo_without_writer_does_not_wait(tmp_path, command):
    """A FIFO nobody writes to: one line and exit 1 at once, never a wait for a writer."""
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    argv = [a.replace("OUT", str(tmp_path / "o.gguf")).replace("FIFO", str(fifo)) for a in command]
    p = run_pyq2(argv[0], fifo, *argv[1:], timeout=60)
    assert p.returncode == (2 if command[0] == "verify" else 1), p.stderr  # verify: as cmp
    assert p.stderr.splitlines() == [
        f"pyq2: error: {fifo} is a FIFO: pyq2 reads GGUF files from regular files only"
    ]
    assert listing(tmp_path) == ["fifo.gguf"]


def test_header_limits_are_what_the_format_allows():
    assert gguf_header.MAX_DIMS == 4 and gguf_header.SUPPORTED_VERSIONS == (2, 3)
    assert MAX_ALIGNMENT & (MAX_ALIGNMENT - 1) == 0
    assert gguf_header.KV_MIN_BYTES == len(kv("", V.UINT8, b"\0"))
    assert gguf_header.TENSOR_INFO_MIN_BYTES == len(tinfo("", ()))

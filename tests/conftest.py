"""Helpers and fixtures shared by the test files.

tests/ is a package, so a test file imports these helpers with `from .conftest import ...`;
pytest's importlib mode keeps tests/ and the source tree off sys.path.
"""

import errno
import os
import struct

import numpy as np
import pytest

import pyq2
from pyq2 import formats, gguf_io, layouts
from pyq2.demo import write_demo_model

# ---- subprocesses -------------------------------------------------------------------------

# Children import the same pyq2 as this process (installed or source tree), whatever the cwd.
PYQ2_PARENT = os.path.dirname(os.path.abspath(list(pyq2.__path__)[0]))


def subprocess_env() -> dict:
    """The environment of a child Python that must import this process's pyq2."""
    return dict(os.environ, PYTHONPATH=PYQ2_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))


# ---- PQ2_0 data ---------------------------------------------------------------------------


def random_raw(n, k, seed=0, finite=False):
    """Random PQ2_0 bytes of an n x k matrix: every code 0..3, scales of any fp16 bits (NaN and
    Inf included: they must move like any other bytes), or any finite bits with finite=True."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n * (k // 128), 34), dtype=np.uint8)
    if finite:
        d = raw[:, :2].copy().view(np.float16)
        raw[:, :2] = np.where(np.isfinite(d), d, np.float16(-0.75)).view(np.uint8)
    return raw.reshape(-1)


def random_pq2(rng, n, k):
    """PQ2_0 bytes of an n x k matrix as a model holds them: every code 0..3, small finite fp16
    scales of either sign."""
    blocks = rng.integers(0, 256, (n * k // 128, 34), dtype=np.uint8)
    d = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
    blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def ternary_pq2(rng, n_blocks, finite=True):
    """PQ2_0 blocks without code 3 (so representable in PTQ1_0): small positive scales, or
    scales of any fp16 bits with finite=False."""
    codes = rng.integers(0, 3, (n_blocks, 128), dtype=np.uint8)
    if finite:
        d = (rng.random(n_blocks) * 0.05).astype(np.float16)
    else:
        d = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16).view(np.float16)
    return formats.pq2_pack(codes, d).reshape(-1)


# ---- parametrisation ----------------------------------------------------------------------

# Every layout with every rt it takes.
LAYOUT_RTS = [("raw", 0), ("planes", 0)] + [("tiles", rt) for rt in layouts.TILE_RTS]


def shape_id(shape):
    return f"n{shape[0]}-k{shape[1]}"


def conversion_cases(shapes):
    """(shape, src layout, dst layout, src rt, dst rt): every conversion of every shape."""
    return [
        (shape, src, dst, src_rt, dst_rt)
        for shape in shapes
        for src, src_rt in LAYOUT_RTS
        for dst, dst_rt in LAYOUT_RTS
    ]


def conversion_id(case):
    shape, src, dst, src_rt, dst_rt = case
    return f"{shape_id(shape)}-{src}{src_rt or ''}-to-{dst}{dst_rt or ''}"


# ---- GGUF files ---------------------------------------------------------------------------


def write_gguf_file(path, kv, tensors, alignment=32):
    """Write a GGUF file of key/values kv (encode_kv arguments) and tensors ((OutTensor, data)
    pairs). A general.alignment key goes first when the alignment is not the default 32."""
    records = [gguf_io.encode_kv(*item) for item in kv]
    if alignment != 32:
        records.insert(
            0, gguf_io.encode_kv("general.alignment", gguf_io.GGUFValueType.UINT32, alignment)
        )
    gguf_io.write_gguf(
        path, records, [t for t, _ in tensors], lambda i, t: (tensors[i][1],), alignment=alignment
    )


def tensor_info_offset(blob, name):
    """Byte offset of the n_dims field of tensor `name` in a file's bytes."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return blob.rindex(key) + len(key)  # tensor infos follow the key/values


def patched(src, dst, edit):
    """Copy src to dst (which may be src) with edit(bytearray, GGUFFile of src) applied."""
    blob = bytearray(src.read_bytes())
    with gguf_io.open_gguf(src) as f:
        edit(blob, f)
    dst.write_bytes(bytes(blob))
    return dst


def listing(directory):
    return sorted(os.listdir(directory))


@pytest.fixture
def demo(tmp_path):
    """The demo model (pyq2.demo), written to tmp_path/demo.gguf."""
    return write_demo_model(tmp_path / "demo.gguf")


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(n): the n-th write of the GGUF writer fails with ENOSPC."""

    def arm(n):
        calls = []

        def write(f, data):
            calls.append(1)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, "No space left on device")
            f.write(data)

        monkeypatch.setattr(gguf_io, "_write", write)

    return arm

"""The private ggml types (pyq2.gguf.types): registration with the `gguf` package, and the stock
gguf reader and writer handling PQ2_0 and PTQ1_0 once registered."""

import enum
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyq2.gguf import io as gguf_io
from pyq2.gguf import types as gguf_types
from pyq2.gguf.io import OutTensor

from ..conftest import random_pq2, subprocess_env, write_gguf_file


def write_weights(path, rng, shapes):
    """A file of PQ2_0 weights w0.weight, w1.weight, ... of shapes (K, N); {name: bytes}."""
    tensors = [
        (
            OutTensor(f"w{i}.weight", gguf_types.PQ2_0, (k, n), n * k // 128 * 34),
            random_pq2(rng, n, k),
        )
        for i, (k, n) in enumerate(shapes)
    ]
    write_gguf_file(path, [("general.architecture", gguf.GGUFValueType.STRING, "x")], tensors)
    return {t.name: d.tobytes() for t, d in tensors}


def test_private_types_are_registered():
    assert Q(142) is Q.PQ2_0 and Q.PQ2_0.name == "PQ2_0" and Q.PQ2_0 == 142
    assert Q(143) is Q.PTQ1_0 and Q.PTQ1_0.value == 143
    assert gguf.GGML_QUANT_SIZES[Q.PQ2_0] == (128, 34)
    assert gguf.GGML_QUANT_SIZES[Q.PTQ1_0] == (128, 28)
    assert Q["PQ2_0"] is Q.PQ2_0 and Q.PQ2_0 in list(Q)


def test_registration_is_idempotent():
    before = (list(Q), dict(gguf.GGML_QUANT_SIZES))
    gguf_types.register_types()
    gguf_types.register_types()
    assert (list(Q), dict(gguf.GGML_QUANT_SIZES)) == before


def test_add_enum_member_on_a_fresh_enum():
    class E(enum.IntEnum):
        A = 1

    b = gguf_types._add_enum_member(E, "B", 142)
    assert E(142) is b is E.B and E["B"] is b and isinstance(b, int) and b + 1 == 143
    assert list(E) == [E.A, E.B] and repr(b) == "<E.B: 142>"
    assert gguf_types._add_enum_member(E, "B", 142) is b
    with pytest.raises(RuntimeError, match="already E.B"):
        gguf_types._add_enum_member(E, "C", 142)
    with pytest.raises(RuntimeError, match="already exists"):
        gguf_types._add_enum_member(E, "A", 7)


def test_sizes_and_names():
    assert gguf_types.block_size(142) == (128, 34) and gguf_types.block_size(77) is None
    assert gguf_types.type_name(143) == "PTQ1_0" and gguf_types.type_name(77) == "type77"
    assert gguf_types.type_nbytes(gguf_types.TQ2_0, (512, 3)) == 3 * 2 * 66


def test_gguf_fails_without_registration_and_reads_with_it(tmp_path):
    path = tmp_path / "m.gguf"
    write_weights(path, np.random.default_rng(0), [(256, 3)])
    code = (
        "import sys, gguf\n"
        "try:\n    gguf.GGUFReader(sys.argv[1]); print('read')\n"
        "except ValueError: print('refused')\n"
        "import pyq2.gguf.io\n"
        "r = gguf.GGUFReader(sys.argv[1]); print(r.tensors[0].tensor_type.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        check=True,
    ).stdout.split()
    assert out == ["refused", "PQ2_0"]


def test_stock_reader_reads_private_types(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "m.gguf"
    data = write_weights(path, rng, [(256, 3), (384, 5)])
    r = gguf.GGUFReader(path)
    t0, t1 = r.tensors[0], r.tensors[1]
    assert t0.tensor_type == Q.PQ2_0 and t0.shape.tolist() == [256, 3]
    assert t0.data.shape == (3, 2 * 34) and t0.data.tobytes() == data["w0.weight"]
    assert t1.n_bytes == 5 * 3 * 34 and t1.data.tobytes() == data["w1.weight"]


def test_stock_writer_writes_private_types(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "w.gguf"
    blocks = random_pq2(rng, 4, 256).reshape(4, 68)
    ptq1 = rng.integers(0, 243, (4, 2 * 28), dtype=np.uint8)
    w = gguf.GGUFWriter(path, "test")
    w.add_tensor("a", blocks, raw_dtype=Q.PQ2_0)
    w.add_tensor("b", ptq1, raw_dtype=Q.PTQ1_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with gguf_io.open_gguf(path) as f:
        a, b = f.tensors
        assert (a.type_id, a.ne, b.type_id, b.ne) == (142, (256, 4), 143, (256, 4))
        assert f.data(a).tobytes() == blocks.tobytes() and f.data(b).tobytes() == ptq1.tobytes()

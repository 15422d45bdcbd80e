"""The pyq2.* metadata schema (pyq2.gguf.metadata): the format version the C header defines, and the
keys a repacked file gets read back as the weights they describe."""

import re
from pathlib import Path

import pytest

from pyq2.errors import FormatError
from pyq2.gguf import metadata
from pyq2.gguf.metadata import WeightInfo
from pyq2.gguf.types import F32, I8, PQ2_0, PTQ1_0
from pyq2.spec.layouts import Layout

HEADER = Path(__file__).resolve().parents[2] / "native" / "include" / "pq2.h"


class Keys:
    """The key/values of a file, as metadata.weight_info reads them (a GGUFFile does the same)."""

    path = "model.gguf"

    def __init__(self, items):
        self.values = {key: value for key, _, value, *_ in items}

    def has(self, key):
        return key in self.values

    def value(self, key, default=None):
        return self.values.get(key, default)


def test_format_version_is_the_headers():
    m = re.search(r"#define\s+PQ2_FORMAT_VERSION\s+(\d+)", HEADER.read_text())
    assert m, f"{HEADER} does not define PQ2_FORMAT_VERSION"
    assert int(m.group(1)) == metadata.FORMAT_VERSION


@pytest.mark.parametrize("layout,rt", [("planes", 0), ("tiles", 1), ("tiles", 4)])
def test_key_values_read_back(layout, rt):
    weights = [
        ("w.a", WeightInfo(PQ2_0, (256, 100), Layout("raw", 100, 256))),
        ("w.b", WeightInfo(PTQ1_0, (384, 7), Layout("raw", 7, 384))),
    ]
    keys = Keys(metadata.key_values(layout, rt, weights))
    assert keys.value("pyq2.format_version") == 2 and keys.value("pyq2.layout") == layout
    for name, info in weights:
        got = metadata.weight_info(keys, name, I8, (1000,))
        assert got == WeightInfo(info.source_type, info.ne, Layout(layout, info.n, info.k, rt))


def test_plain_tensors():
    keys = Keys([])
    assert metadata.weight_info(keys, "w", PQ2_0, (128, 3)) == WeightInfo(
        PQ2_0, (128, 3), Layout("raw", 3, 128)
    )
    assert metadata.weight_info(keys, "norm", F32, (128,)) is None


def test_incomplete_metadata():
    info = WeightInfo(PQ2_0, (256, 100), Layout("raw", 100, 256))
    items = [
        kv for kv in metadata.key_values("tiles", 2, [("w", info)]) if not kv[0].endswith(".rt")
    ]
    with pytest.raises(FormatError, match=r"model.gguf: tensor 'w': incomplete pyq2 metadata"):
        metadata.weight_info(Keys(items), "w", I8, (1000,))


def test_fused_key_values_read_back():
    info = WeightInfo(PQ2_0, (256, 96), Layout("raw", 96, 256))
    members = (metadata.Member("w.a", 0, 64, 3), metadata.Member("w.b", 64, 32, 1))
    items = metadata.key_values("tiles", 2, [("w.a+b", info)], {"w.a+b": members})
    keys = Keys(items)
    fused = metadata.weight_info(keys, "w.a+b", I8, (1000,))
    assert metadata.fused_members(keys, "w.a+b", fused) == members
    assert metadata.member_info(fused, members[1]) == WeightInfo(
        PQ2_0, (256, 32), Layout("tiles", 32, 256, 2)
    )
    assert metadata.fused_members(Keys(items[:6]), "w.a+b", fused) is None  # no member keys


def test_fused_members_on_tiles():
    """Every member but the last must be whole tiles (32 rows at rt 2); planes take any rows."""
    info = WeightInfo(PQ2_0, (256, 96), Layout("raw", 96, 256))
    members = (metadata.Member("w.a", 0, 40, 0), metadata.Member("w.b", 40, 56, 1))
    for layout, rt, ok in (("planes", 0, True), ("tiles", 1, False), ("tiles", 2, False)):
        items = metadata.key_values(layout, rt, [("f", info)], {"f": members})
        keys = Keys(items)
        fused = metadata.weight_info(keys, "f", I8, (1000,))
        if ok:
            assert metadata.fused_members(keys, "f", fused) == members
        else:
            with pytest.raises(FormatError, match=r"'w.b' starts at row 40, not at a multiple"):
                metadata.fused_members(keys, "f", fused)

"""The ggml tensor types pyq2 reads and writes, and their registration with the `gguf` package.

PQ2_0 (id 142) and PTQ1_0 (id 143) are defined by the PrismML llama.cpp fork (FORMATS.md 1);
the `gguf` package knows neither. `register_types()` (run on
import of this module, so on import of pyq2.gguf.io too; idempotent) adds both to
`gguf.GGMLQuantizationType` and to `gguf.GGML_QUANT_SIZES`, after which GGUFReader, GGUFWriter
and gguf-dump handle them. This is the one module of pyq2 that reads or changes gguf's type
tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import IntEnum
from typing import TypeVar

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..spec import formats

PQ2_0 = formats.PQ2_TYPE_ID  # 142
PTQ1_0 = formats.PTQ1_TYPE_ID  # 143
TQ2_0 = formats.TQ2_TYPE_ID  # 35, gguf's GGMLQuantizationType.TQ2_0
I8 = int(GGMLQuantizationType.I8)  # 24
F32 = int(GGMLQuantizationType.F32)  # 0

# The types of ternary weights pyq2 converts; every one of them is lossless as PQ2_0.
PQ2_FAMILY = (PQ2_0, PTQ1_0, TQ2_0)

# The dense types pyq2 loads onto the GPU and cuts into tensor-parallel shards: their names and
# numpy storage (BF16 as its 16-bit patterns), one element per weight.
DENSE_TYPES = {F32: ("F32", "<f4"), 1: ("F16", "<f2"), 30: ("BF16", "<u2")}

# (name, id, weights per block, bytes per block) of the private types.
_PRIVATE_TYPES = (
    ("PQ2_0", PQ2_0, formats.PQ2_BLOCK_WEIGHTS, formats.PQ2_BLOCK_BYTES),
    ("PTQ1_0", PTQ1_0, formats.PTQ1_BLOCK_WEIGHTS, formats.PTQ1_BLOCK_BYTES),
)


_E = TypeVar("_E", bound=IntEnum)


def _add_enum_member(cls: type[_E], name: str, value: int) -> _E:
    """Add `name = value` to an existing IntEnum, or return the member if it is already there."""
    existing = cls._value2member_map_.get(value)
    if existing is not None:
        if existing.name != name:
            raise RuntimeError(
                f"ggml type id {value} is already {cls.__name__}.{existing.name}, "
                f"cannot register it as {name}"
            )
        return cls(value)
    if name in cls._member_map_:
        raise RuntimeError(
            f"{cls.__name__}.{name} already exists with id "
            f"{cls._member_map_[name].value}, cannot register id {value}"
        )
    # Build the member the way EnumType does for IntEnum: an int instance with the enum's slots.
    member = int.__new__(cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = cls  # type: ignore[attr-defined]
    member._sort_order_ = len(cls._member_names_)  # type: ignore[attr-defined]
    add_member = getattr(cls, "_add_member_", None)  # Python >= 3.13 keeps its own bookkeeping
    if add_member is not None:
        add_member(name, member)
    else:
        type.__setattr__(cls, name, member)  # EnumType.__setattr__ refuses to bind members
        cls._member_map_[name] = member
    cls._member_names_.append(name)
    cls._value2member_map_[value] = member
    return member


def register_types() -> None:
    """Make gguf know PQ2_0 (142) and PTQ1_0 (143). Safe to call any number of times."""
    for name, value, block, size in _PRIVATE_TYPES:
        member = _add_enum_member(GGMLQuantizationType, name, value)
        known = GGML_QUANT_SIZES.get(member)
        if known is not None and known != (block, size):
            raise RuntimeError(f"gguf already sizes {name} as {known}, expected {(block, size)}")
        GGML_QUANT_SIZES[member] = (block, size)


register_types()


def type_name(type_id: int) -> str:
    member = GGMLQuantizationType._value2member_map_.get(int(type_id))
    return member.name if member is not None else f"type{int(type_id)}"


def block_size(type_id: int) -> tuple[int, int] | None:
    """(weights per block, bytes per block) of a ggml type, or None for an unknown type id."""
    if int(type_id) not in GGMLQuantizationType._value2member_map_:
        return None
    return GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]


def type_nbytes(type_id: int, ne: Sequence[int]) -> int:
    """Bytes of a tensor of logical shape ne (gguf order, ne[0] innermost)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    return math.prod(ne) // block * size  # exact Python integers: no overflow

"""The Prism Hadamard rotation contract of a GGUF file (FORMATS.md 4).

`Rotation.from_file(gf)` reads the `prism.hadamard.*` keys into one object and refuses a
contract pyq2 does not understand, with a message naming the key and the value: an unknown
version, transform, axis or sign mode; a block size that is not a power of two in 64..4096; sign
widths that are not multiples of the block size; sign values other than +-1 or of the wrong
count; a folded weight whose input width has no signs. A file without the keys has no rotation
(`from_file` returns None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError
from ..keyvalues import KeyValues

PREFIX = "prism.hadamard."
VERSIONS = (1, 2)
TRANSFORM = "normalized-sylvester-walsh-hadamard"
AXIS = "input-last-dimension"
SIGN_MODES = ("identity", "explicit")
MIN_BLOCK, MAX_BLOCK = 64, 4096


@dataclass(frozen=True)
class Rotation:
    """A file's rotation contract. signs maps an input width to its +-1 vector (int8); in sign
    mode identity it is empty and every width's signs are +1."""

    version: int
    block: int
    sign_mode: str
    signs: Mapping[int, np.ndarray] = field(repr=False)
    weight_names: tuple[str, ...]
    inverse_weight_names: tuple[str, ...] = ()
    gdn_v_grouped: bool = False

    @classmethod
    def from_file(
        cls, kv: KeyValues, input_widths: Mapping[str, int] | None = None
    ) -> Rotation | None:
        """The contract of a file's keys, or None without them. input_widths (tensor name ->
        input width K), when given, checks that every folded weight has signs for its width."""
        if kv.value(PREFIX + "version") is None and kv.value(PREFIX + "block_size") is None:
            return None

        def get(key: str, kind: type, default: Any = None) -> Any:
            v = kv.value(PREFIX + key, default)
            if v is None:
                raise FormatError(f"rotation contract: {PREFIX}{key} is missing")
            if kind is list and isinstance(v, (list, tuple, np.ndarray)):
                return list(v)
            if kind is int and isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                return int(v)
            if kind is bool and isinstance(v, (bool, np.bool_)):
                return bool(v)
            if kind is str and isinstance(v, str):
                return v
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            raise FormatError(
                f"rotation contract: {PREFIX}{key} = {shown} is not a {kind.__name__}"
            )

        def ints(key: str) -> list[int]:
            v = get(key, list)
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
                raise FormatError(f"rotation contract: {PREFIX}{key} holds non-integer values")
            return [int(x) for x in v]

        version = get("version", int)
        if version not in VERSIONS:
            raise FormatError(
                f"rotation contract: {PREFIX}version {version} is not one pyq2 "
                f"knows ({', '.join(map(str, VERSIONS))}); upgrade pyq2"
            )
        for key, want in (("transform", TRANSFORM), ("axis", AXIS)):
            got = get(key, str)
            if got != want:
                raise FormatError(f"rotation contract: {PREFIX}{key} {got!r} is not {want!r}")
        block = get("block_size", int)
        if not MIN_BLOCK <= block <= MAX_BLOCK or block & (block - 1):
            raise FormatError(
                f"rotation contract: {PREFIX}block_size {block} is not a power of "
                f"two in {MIN_BLOCK}..{MAX_BLOCK}"
            )
        mode = get("sign_mode", str)
        if mode not in SIGN_MODES:
            raise FormatError(
                f"rotation contract: {PREFIX}sign_mode {mode!r} is not {' or '.join(SIGN_MODES)}"
            )
        signs: dict[int, np.ndarray] = {}
        if mode == "explicit":
            widths = ints("sign_widths")
            values = np.asarray(ints("sign_values"), dtype=np.int64)
            bad = [w for w in widths if w <= 0 or w % block]
            if bad:
                raise FormatError(
                    f"rotation contract: sign width {bad[0]} is not a positive "
                    f"multiple of the block size {block}"
                )
            if len(set(widths)) != len(widths):
                raise FormatError(
                    f"rotation contract: {PREFIX}sign_widths {widths} repeats a width"
                )
            if values.size != sum(widths):
                raise FormatError(
                    f"rotation contract: {PREFIX}sign_values holds {values.size} "
                    f"values, the widths {widths} need {sum(widths)}"
                )
            if values.size and not np.isin(values, (-1, 1)).all():
                i = int(np.argmax(~np.isin(values, (-1, 1))))
                raise FormatError(
                    f"rotation contract: {PREFIX}sign_values[{i}] = {values[i]} is not +1 or -1"
                )
            start = 0
            for w in widths:
                signs[w] = values[start : start + w].astype(np.int8)
                start += w
        names = tuple(str(n) for n in get("weight_names", list))
        inverse = tuple(str(n) for n in get("inverse_weight_names", list, []))
        grouped = get("gdn_v_grouped", bool, False)
        rot = cls(version, block, mode, signs, names, inverse, grouped)
        if input_widths is not None:
            rot.check_widths(input_widths)
        return rot

    def check_widths(self, input_widths: Mapping[str, int]) -> None:
        """FormatError for a folded (or inverse-folded) weight whose input width the contract
        cannot rotate: no signs for it (explicit mode), or not a multiple of the block size."""
        for name in self.weight_names + self.inverse_weight_names:
            if name not in input_widths:
                continue  # a folded weight this file does not hold
            w = input_widths[name]
            if w % self.block:
                raise FormatError(
                    f"rotation contract: folded weight '{name}' has input width {w}, "
                    f"not a multiple of the block size {self.block}"
                )
            if self.sign_mode == "explicit" and w not in self.signs:
                raise FormatError(
                    f"rotation contract: folded weight '{name}' has input width {w}, "
                    f"which has no signs (sign widths {sorted(self.signs)})"
                )

    def signs_for(self, width: int) -> np.ndarray | None:
        """The int8 sign vector of an input width, or None for all +1."""
        if self.sign_mode == "identity":
            return None
        if width not in self.signs:
            raise FormatError(
                f"rotation contract: no signs for input width {width} (sign widths "
                f"{sorted(self.signs)})"
            )
        return self.signs[width]

    def folds(self, name: str) -> bool:
        return name in self.weight_names

    def carries(self, name: str) -> bool:
        """Whether the stored values of weight `name` carry the rotation: folded into its input
        side, or (the embedding) to be inverted after the lookup."""
        return name in self.weight_names or name in self.inverse_weight_names

    def summary(self) -> dict[str, Any]:
        """What `pyq2 info` shows."""
        return {
            "version": self.version,
            "block_size": self.block,
            "sign_mode": self.sign_mode,
            "sign_widths": sorted(self.signs),
            "folded_weights": len(self.weight_names),
            "inverse_weights": list(self.inverse_weight_names),
            "gdn_v_grouped": self.gdn_v_grouped,
        }


def contract_keys(
    block: int,
    signs: Mapping[int, Any] | None,
    weight_names: Sequence[str],
    inverse_weight_names: Sequence[str] = (),
    gdn_v_grouped: bool | None = None,
):
    """The (key, value) pairs of a contract in explicit (signs given) or identity sign mode, for
    a writer (the demo model)."""
    items: list[tuple[str, Any]] = [
        ("version", 1),
        ("block_size", block),
        ("transform", TRANSFORM),
        ("axis", AXIS),
        ("sign_mode", "explicit" if signs else "identity"),
        ("weight_names", list(weight_names)),
    ]
    if signs:
        widths = sorted(signs)
        items += [
            ("sign_widths", widths),
            ("sign_values", np.concatenate([np.asarray(signs[w]) for w in widths])),
        ]
    if inverse_weight_names:
        items.append(("inverse_weight_names", list(inverse_weight_names)))
    if gdn_v_grouped is not None:
        items.append(("gdn_v_grouped", gdn_v_grouped))
    return [(PREFIX + k, v) for k, v in items]

"""Tensor parallelism: how the tensors of a qwen35 model split over G GPUs of one host.

Rank r of G holds a shard: every tensor of the model, each either whole (replicated) or the
rank's part of it, cut along one axis (`Split`):

- column-parallel, cut along the output rows (gguf axis 1): the projections that read the
  normed residual stream (attention q/k/v, Gated-DeltaNet qkv and gate, FFN gate and up), the
  recurrence's per-head tensors that follow them (ssm_alpha, ssm_beta, ssm_conv1d, ssm_a,
  ssm_dt.bias) and the output head (its vocabulary rows: the decode step's "gather" call
  collects the logits);
- row-parallel, cut along the input columns (axis 0): attn_output, ssm_out, ffn_down. A rank's
  product is a partial sum over its columns, which the step's "reduce" call sums over the ranks
  before the residual add;
- replicated: the embedding, the norms, attn_q_norm / attn_k_norm / ssm_norm.

A rank takes whole heads, so that the mixer between its column- and row-parallel projections
needs nothing from another rank: whole query heads with the K/V heads they read (two ranks whose
query heads share a K/V head both hold it), whole Gated-DeltaNet K heads with their V heads
(in the tiled V-head order of the qkv rows; FORMATS.md, the rotation's `gdn_v_grouped`). Its
columns of a row-parallel input are whole 128-groups and, for a folded weight, whole rotation
blocks: the rank rotates and quantises its slice alone, with its slice of the width's signs, and
gets the same Q8 values as the whole activation has there. The smallest such piece is a unit;
units go to ranks as evenly as possible, the first ranks taking one more when G does not divide
them (the 27B's FFN, 17 blocks of 1024, splits 9 + 8 over 2 GPUs). A layer with fewer units than
G is refused, with the unit and what makes it that size.

`shard_plan` computes the plan from a file's tensor shapes, keys, decode plan and rotation
contract; pyq2.offline.shard reads a rank's parts from the whole file, pyq2.offline.repack writes
them, pyq2.offline.verify checks them against the original, and pyq2.gguf.metadata holds the keys
that record a shard's part of each tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FormatError
from ..gguf.splits import Range, Split
from ..keyvalues import KeyValues
from ..spec.formats import PQ2_BLOCK_WEIGHTS
from ..spec.rotation import Rotation
from .decode import Plan

HEAD_ROWS_UNIT = 64  # the output head's vocabulary rows go out in multiples of this (whole tiles)


@dataclass(frozen=True)
class ShardPlan:
    splits: dict[str, Split]  # the tensors cut; every other tensor is whole on every rank

    def split(self, name: str) -> Split | None:
        return self.splits.get(name)


def _merge(ranges: list[Range]) -> tuple[Range, ...]:
    """The ranges with adjacent ones joined."""
    out: list[Range] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def unit_ranges(n_units: int, g: int) -> list[Range]:
    """Units [u0, u1) of each of g ranks: as even as possible, the first ranks one more."""
    base, extra = divmod(n_units, g)
    out, u = [], 0
    for r in range(g):
        n = base + (r < extra)
        out.append((u, u + n))
        u += n
    return out


def _units_of(item: int, align: int) -> int:
    """The fewest items of width `item` whose total is a multiple of `align`."""
    return align // math.gcd(item, align)


class _Planner:
    def __init__(
        self, ne: Mapping[str, tuple[int, ...]], rotation: Rotation | None, g: int, where: str
    ):
        self.ne, self.rotation, self.g, self.where = ne, rotation, g, where
        self.splits: dict[str, Split] = {}

    def align(self, weight: str) -> tuple[int, str]:
        """Columns a row-parallel input of `weight` is cut at a multiple of, and why."""
        rot = self.rotation
        if rot is not None and rot.folds(weight):
            return math.lcm(PQ2_BLOCK_WEIGHTS, rot.block), (
                f"whole 128-groups and rotation blocks of {rot.block}"
            )
        return PQ2_BLOCK_WEIGHTS, "whole 128-groups"

    def expect(self, name: str, axis: int, want: int, what: str) -> None:
        got = self.ne[name][axis] if axis < len(self.ne[name]) else None
        if got != want:
            raise FormatError(
                f"{self.where}: '{name}' has {got} {'rows' if axis else 'columns'}, "
                f"but {what} gives {want}"
            )

    def ranks(self, n_units: int, unit: str, why: str) -> list[Range]:
        if n_units < self.g:
            raise FormatError(
                f"{self.where}: cannot split over {self.g} GPUs: {unit} ({why}) gives only "
                f"{n_units} unit{'s' if n_units != 1 else ''}"
            )
        return unit_ranges(n_units, self.g)

    def add(self, name: str, axis: int, pieces: list[list[Range]]) -> None:
        extent = self.ne[name][axis]
        self.splits[name] = Split(axis, extent, tuple(_merge(p) for p in pieces))

    def attention(self, b: str, n_head: int, n_kv: int) -> None:
        out = b + "attn_output.weight"
        k = self.ne[out][0]
        if k % n_head:
            raise FormatError(f"{self.where}: '{out}' has {k} columns for {n_head} query heads")
        hd = k // n_head
        self.expect(b + "attn_q.weight", 1, 2 * n_head * hd, "2 x heads x head width")
        for s in ("attn_k", "attn_v"):
            self.expect(b + s + ".weight", 1, n_kv * hd, "K/V heads x head width")
        align, why = self.align(out)
        u = _units_of(hd, align)
        if n_head % u:
            raise FormatError(
                f"{self.where}: {n_head} query heads of width {hd} do not make whole units of "
                f"{u} heads ({why})"
            )
        group = n_head // n_kv
        q, kv, cols = [], [], []
        for u0, u1 in self.ranks(n_head // u, f"attention in units of {u} query heads", why):
            h0, h1 = u0 * u, u1 * u
            kv0, kv1 = h0 // group, (h1 - 1) // group + 1
            q.append([(h0 * 2 * hd, h1 * 2 * hd)])
            kv.append([(kv0 * hd, kv1 * hd)])
            cols.append([(h0 * hd, h1 * hd)])
        self.add(b + "attn_q.weight", 1, q)
        self.add(b + "attn_k.weight", 1, kv)
        self.add(b + "attn_v.weight", 1, kv)
        self.add(out, 0, cols)

    def recurrence(self, b: str, v_heads: int, k_heads: int) -> None:
        out = b + "ssm_out.weight"
        k = self.ne[out][0]
        if k % v_heads:
            raise FormatError(f"{self.where}: '{out}' has {k} columns for {v_heads} V heads")
        hd, rep = k // v_heads, v_heads // k_heads
        qk = k_heads * hd
        self.expect(b + "attn_qkv.weight", 1, 2 * qk + k, "Q, K of the K heads and V")
        self.expect(b + "attn_gate.weight", 1, k, "V heads x head width")
        # the recurrence's optional per-head tensors: (name, axis, extent, what, pieces it takes)
        side = [
            ("ssm_alpha.weight", 1, v_heads, "V heads", "heads"),
            ("ssm_beta.weight", 1, v_heads, "V heads", "heads"),
            ("ssm_conv1d.weight", 1, 2 * qk + k, "the qkv channels", "qkv"),
            ("ssm_a", 0, v_heads, "V heads", "heads"),
            ("ssm_dt.bias", 0, v_heads, "V heads", "heads"),
        ]
        side = [t for t in side if b + t[0] in self.ne]
        for s, axis, want, what, _ in side:
            self.expect(b + s, axis, want, what)
        grouped = self.rotation is not None and self.rotation.gdn_v_grouped
        align, why = self.align(out)
        if grouped:  # a rank's columns: its K heads' rep V heads each, one range
            u = _units_of(rep * hd, align)
        else:  # rep ranges of its K heads' V heads, each aligned
            u = _units_of(hd, align)
            if qk % align:
                raise FormatError(
                    f"{self.where}: the V heads of one repeat span {qk} columns, not a multiple "
                    f"of {align} ({why}): ssm_out's input splits only in grouped V-head order"
                )
        if k_heads % u:
            raise FormatError(
                f"{self.where}: {k_heads} K heads do not make whole units of {u} ({why})"
            )
        qkv, gate, heads, cols = [], [], [], []
        for u0, u1 in self.ranks(k_heads // u, f"Gated-DeltaNet in units of {u} K heads", why):
            k0, k1 = u0 * u, u1 * u
            v = [((k0 + k_heads * r) * hd, (k1 + k_heads * r) * hd) for r in range(rep)]
            qkv.append([(k0 * hd, k1 * hd), (qk + k0 * hd, qk + k1 * hd)])
            qkv[-1] += [(2 * qk + a, 2 * qk + z) for a, z in v]
            gate.append(v)
            heads.append([(k0 + k_heads * r, k1 + k_heads * r) for r in range(rep)])
            cols.append([(k0 * rep * hd, k1 * rep * hd)] if grouped else v)
        self.add(b + "attn_qkv.weight", 1, qkv)
        self.add(b + "attn_gate.weight", 1, gate)
        self.add(out, 0, cols)
        for s, axis, _, _, which in side:
            self.add(b + s, axis, heads if which == "heads" else qkv)

    def ffn(self, b: str) -> None:
        down = b + "ffn_down.weight"
        width = self.ne[down][0]
        for s in ("ffn_gate", "ffn_up"):
            self.expect(b + s + ".weight", 1, width, "ffn_down's columns")
        align, why = self.align(down)
        if width % align:
            raise FormatError(
                f"{self.where}: '{down}' has {width} columns, not a multiple of {align} ({why})"
            )
        cols = []
        for u0, u1 in self.ranks(width // align, f"the FFN in units of {align} columns", why):
            cols.append([(u0 * align, u1 * align)])
        for s in ("ffn_gate", "ffn_up"):
            self.add(b + s + ".weight", 1, cols)
        self.add(down, 0, cols)

    def head(self, name: str) -> None:
        vocab = self.ne[name][1]
        if vocab < self.g:
            raise FormatError(f"{self.where}: the head's {vocab} rows do not go to {self.g} GPUs")
        self.add(name, 1, [[r] for r in head_rows(vocab, self.g)])

    def check_signs(self) -> None:
        """Refuse a plan under which two weights of a rank read one width with different signs
        (rank_signs)."""
        rot = self.rotation
        if rot is None:
            return
        for rank in range(self.g):
            weights = []
            for name, shape in self.ne.items():
                if len(shape) == 2 and rot.carries(name):
                    split = self.splits.get(name)
                    k = split.size(rank) if split is not None and split.axis == 0 else shape[0]
                    weights.append((name, k, split))
            rank_signs(rot, weights, rank, f"{self.where}: over {self.g} GPUs")


def piece_indices(pieces: tuple[Range, ...], unit: int = 1) -> np.ndarray:
    """The indices a:b of each piece, one after another, counted in units of `unit` (a and b
    multiples of it)."""
    return np.concatenate([np.arange(a // unit, b // unit) for a, b in pieces])


def rank_signs(
    rotation: Rotation,
    weights: Iterable[tuple[str, int, Split | None]],
    rank: int,
    where: str,
) -> dict[int, np.ndarray | None]:
    """The sign vector (None: all +1) of each input width that rank `rank`'s weights (name, the
    rank's K, its Split or None) read: a weight cut along its columns reads those columns of its
    whole width's signs. A rank rotates each width with one vector: FormatError, starting with
    `where`, when two of its weights read one width with different signs."""
    out: dict[int, np.ndarray | None] = {}
    first: dict[int, str] = {}
    for name, k, split in weights:
        if split is not None and split.axis == 0:
            whole = rotation.signs_for(split.extent)
            signs = None if whole is None else whole[piece_indices(split.pieces[rank])]
        else:
            signs = rotation.signs_for(k)
        if k in out and not _same(out[k], signs):
            raise FormatError(
                f"{where}: rank {rank}'s parts of '{first[k]}' and '{name}' read input width {k} "
                f"with different rotation signs, which one GPU cannot hold at once"
            )
        out.setdefault(k, signs)
        first.setdefault(k, name)
    return out


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def head_rows(vocab: int, g: int) -> list[Range]:
    """The output head's rows of each of g ranks: units of HEAD_ROWS_UNIT rows (single rows for
    a vocabulary smaller than g units), as even as possible, the last rank's ending at vocab."""
    unit = HEAD_ROWS_UNIT if vocab >= HEAD_ROWS_UNIT * g else 1
    return [(u0 * unit, min(u1 * unit, vocab)) for u0, u1 in unit_ranges(-(-vocab // unit), g)]


def _positive(kv: KeyValues, key: str) -> int:
    v = kv.value(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise FormatError(f"{key} is {v!r}, not a positive integer (needed to split heads)")
    return v


def shard_plan(
    ne: Mapping[str, tuple[int, ...]],
    plan: Plan,
    kv: KeyValues,
    rotation: Rotation | None,
    g: int,
    where: str = "model",
) -> ShardPlan:
    """How the model's tensors (name -> logical shape, gguf order; every tensor of the file)
    split over g ranks (module docstring). FormatError, starting with `where`, for a model
    that does not split so."""
    if not isinstance(g, int) or g < 1:
        raise ValueError(f"tensor-parallel size {g!r} is not a positive integer")
    p = _Planner(ne, rotation, g, where)
    arch: Any = plan.architecture
    n_head = n_kv = 0
    if plan.attention_layers:
        n_head = _positive(kv, f"{arch}.attention.head_count")
        n_kv = _positive(kv, f"{arch}.attention.head_count_kv")
        if n_head % n_kv:
            raise FormatError(f"{where}: {n_head} query heads for {n_kv} K/V heads")
    for layer in range(plan.n_layers):
        b = f"blk.{layer}."
        if layer in plan.attention_layers:
            p.attention(b, n_head, n_kv)
        else:
            p.recurrence(b, plan.v_heads, plan.k_heads)
        p.ffn(b)
    p.head("output.weight")
    p.check_signs()
    return ShardPlan(p.splits)

"""How a tensor-parallel shard holds a tensor (`Split`), and the order of a set of shard files.

The plan that decides the splits is pyq2.plan.tensor_parallel; the keys that record a shard's
part of each tensor are pyq2.gguf.metadata's.
"""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[int, int]  # [start, stop) along a split's axis


@dataclass(frozen=True)
class Split:
    """One tensor cut along `axis` (gguf order: 0 the input columns K, 1 the output rows N; 0
    for a 1-D tensor) of extent `extent`: rank r holds the ranges pieces[r], one after another."""

    axis: int
    extent: int
    pieces: tuple[tuple[Range, ...], ...]

    def size(self, rank: int) -> int:
        return sum(b - a for a, b in self.pieces[rank])

    def held(self, rank: int) -> str:
        """What rank holds, for messages: "rows 0:512,1024:1536 of 2048" (axis 1) or
        "columns 128:256 of 256" (axis 0)."""
        ranges = ",".join(f"{a}:{b}" for a, b in self.pieces[rank])
        return f"{'rows' if self.axis else 'columns'} {ranges} of {self.extent}"

    def shape(self, ne: tuple[int, ...], rank: int) -> tuple[int, ...]:
        """The rank's part of a tensor of shape ne (gguf order)."""
        out = list(ne)
        out[self.axis] = self.size(rank)
        return tuple(out)


def order_shards(found: list[tuple[str, tuple[int, int] | None]]) -> list[str]:
    """The paths of a shard set ordered by rank, from (path, metadata.shard_of of the file).
    ValueError unless they are ranks 0..G-1 of one G, each once."""
    sets: list[tuple[str, tuple[int, int]]] = []
    for path, shard in found:
        if shard is None:
            raise ValueError(f"{path} is a whole model, not a tensor-parallel shard")
        sets.append((path, shard))
    if not sets:
        raise ValueError("no shard given")
    g = sets[0][1][0]
    ranks = sorted((rank, p) for p, (size, rank) in sets if size == g)
    if [r for r, _ in ranks] != list(range(g)) or len(sets) != g:
        given = ", ".join(f"{rank} of {size}" for _, (size, rank) in sets)
        raise ValueError(
            f"the shards given are ranks {given}; a set is ranks 0..{g - 1} of {g}, each once"
        )
    return [p for _, p in ranks]

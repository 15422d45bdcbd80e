"""The collectives of a tensor-parallel decode step (pyq2.plan.tensor_parallel): what DecodeStep
calls between ranks.

A Collective sums a buffer over its ranks in place (`all_reduce`: after each row-parallel
projection) and gathers one equal-sized buffer of every rank (`all_gather`: the head's logits).
`Nccl` is torch.distributed's NCCL backend, one process per GPU, in a process group its caller
made (pyq2.runtime.launch); its calls go on the current stream and can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..lib.optional import require_torch


class Collective(Protocol):
    size: int
    rank: int

    def all_reduce(self, t: Any) -> None: ...

    def all_gather(self, t: Any, out: Any) -> None: ...


class Nccl:
    """The default torch.distributed process group (backend nccl): size and rank are its."""

    def __init__(self) -> None:
        dist = require_torch().distributed
        if not dist.is_initialized() or dist.get_backend() != "nccl":
            raise RuntimeError(
                "pyq2.runtime.collective.Nccl needs an initialised NCCL process group"
            )
        self.size, self.rank = dist.get_world_size(), dist.get_rank()

    def all_reduce(self, t: Any) -> None:
        require_torch().distributed.all_reduce(t)

    def all_gather(self, t: Any, out: Any) -> None:
        """out[r] = rank r's t (out: [size, *t.shape], contiguous)."""
        require_torch().distributed.all_gather_into_tensor(out, t)

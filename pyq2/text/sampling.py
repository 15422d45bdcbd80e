"""Choosing the next token from logits, in numpy and in torch with the same semantics; stop strings.

The steps, per row of logits (B, V):

1. repetition penalty (HF / llama.cpp): every token seen in the sequence (prompt included) has its
   logit divided by the penalty when positive and multiplied by it otherwise (computed as
   multiplications by float32 constants, so that numpy and torch round alike);
2. temperature 0: the argmax (ties: the lowest id), and nothing below applies;
3. the logits are multiplied by float32(1 / temperature) and sorted by (logit desc, id asc);
4. top-k (0: off) keeps the first k of that order, exactly k even among ties;
5. softmax in float64 over what is kept; top-p (1: off) keeps the shortest prefix whose probability
   reaches top_p (at least one token);
6. inverse-CDF draw: with one uniform u in [0, 1) per row, the first token of the order whose
   cumulative kept probability exceeds u times the kept total.

So given the same uniforms (the `uniforms` argument) both implementations choose the same token,
up to float64 rounding when u falls exactly on a boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """temperature (0: greedy), top_k (0: off), top_p (1: off), repetition_penalty (1: off), seed
    (None: fresh entropy) of the random draws."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        def real(name: str, value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, not {value!r}")
            return float(value)

        if real("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), not {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, Integral) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 is off), not {self.top_k!r}")
        if not 0 < real("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 is off), not {self.top_p!r}")
        if real("repetition_penalty", self.repetition_penalty) <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 is off), not {self.repetition_penalty!r}"
            )
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, Integral)
            or not 0 <= self.seed < 2**63
        ):
            raise ValueError(f"seed must be None or an integer in [0, 2**63), not {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def argmax(self) -> bool:
        """Whether the choice is the logits' argmax alone: greedy without a repetition penalty
        (which needs the tokens seen)."""
        return self.greedy and self.repetition_penalty == 1.0

    def numpy_rng(self) -> np.random.Generator:
        """The generator to pass to sample_numpy for every step of one generation."""
        return np.random.default_rng(self.seed)

    def torch_generator(self, device: Any = "cpu") -> Any:
        """The torch.Generator to pass to sample_torch (seeded when seed is set)."""
        import torch

        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def _penalty_factors(penalty: float) -> tuple[float, float]:
    """(factor of a positive logit, factor of a negative one), as float32 values."""
    return float(np.float32(1.0 / penalty)), float(np.float32(penalty))


def _first_k(z: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k (< V) first tokens of z by (logit desc, id asc), in that order, in O(V)."""
    t = z[np.argpartition(-z, k - 1)[:k]].min()  # the k-th largest logit
    above = np.flatnonzero(z > t)
    ids = np.concatenate([above, np.flatnonzero(z == t)[: k - above.size]])
    return ids[np.argsort(-z[ids], kind="stable")]


def sample_numpy(
    logits: np.ndarray,
    params: SamplingParams,
    history: list[list[int]] | None = None,
    rng: np.random.Generator | None = None,
    *,
    uniforms: np.ndarray | None = None,
) -> np.ndarray:
    """The next token of each row of logits (B, V): an int64 array (B,).

    history[b] holds the ids of sequence b so far (for the repetition penalty); rng draws the
    uniforms unless `uniforms` (B,) in [0, 1) gives them (None: a fresh default_rng()).
    """
    z = np.array(logits, dtype=np.float32, copy=True)
    if z.ndim != 2 or z.shape[1] == 0:
        raise ValueError(f"logits must be (batch, vocab), not of shape {z.shape}")
    if np.isnan(z).any():
        raise ValueError("logits hold NaN")
    b, v = z.shape
    if params.repetition_penalty != 1.0 and history is not None:
        if len(history) != b:
            raise ValueError(f"history has {len(history)} sequences for {b} rows of logits")
        up, down = _penalty_factors(params.repetition_penalty)
        for row, seen in enumerate(history):
            ids = np.unique(np.asarray(seen, dtype=np.int64))
            if ids.size and (ids[0] < 0 or ids[-1] >= v):
                raise ValueError(f"history {row} holds a token id outside [0, {v})")
            x = z[row, ids]
            z[row, ids] = np.where(x > 0, x * np.float32(up), x * np.float32(down))
    if params.greedy:
        return np.argmax(z, axis=1).astype(np.int64)
    z *= np.float32(1.0 / params.temperature)
    k = v if params.top_k == 0 else min(params.top_k, v)
    if k == v:
        order = np.argsort(-z, axis=1, kind="stable")
    else:
        order = np.stack([_first_k(row, k) for row in z])
    vals = np.take_along_axis(z, order, axis=1).astype(np.float64)
    if not np.isfinite(vals[:, 0]).all():
        raise ValueError("a row of logits has no finite value")
    p = np.exp(vals - vals[:, :1])
    p /= p.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        cum = np.cumsum(p, axis=1)
        p = np.where(cum - p < params.top_p, p, 0.0)
    n_keep = np.count_nonzero(p, axis=1)
    cum = np.cumsum(p, axis=1)
    if uniforms is None:
        u = (rng if rng is not None else np.random.default_rng()).random(b)
    else:
        u = np.asarray(uniforms, dtype=np.float64).reshape(b)
    pos = np.count_nonzero(cum <= (u * cum[:, -1])[:, None], axis=1)  # searchsorted, side="right"
    pos = np.minimum(pos, n_keep - 1)
    return order[np.arange(b), pos].astype(np.int64)


def make_history_mask(history: list[list[int]], n_vocab: int, device: Any = "cpu") -> Any:
    """The (B, V) bool mask of the tokens each sequence has seen, for sample_torch. Keep it up to
    date on the device with `mask[torch.arange(B), next_tokens] = True`."""
    import torch

    mask = torch.zeros((len(history), n_vocab), dtype=torch.bool)
    for row, seen in enumerate(history):
        ids = torch.as_tensor(list(seen), dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_vocab):
            raise ValueError(f"history {row} holds a token id outside [0, {n_vocab})")
        mask[row, ids] = True
    return mask.to(device)


def sample_torch(
    logits: Any,
    params: SamplingParams,
    history_mask: Any = None,
    generator: Any = None,
    *,
    uniforms: Any = None,
) -> Any:
    """sample_numpy on the logits' device: a (B,) int64 tensor, with no host synchronisation.

    history_mask (B, V) bool marks the tokens seen (see make_history_mask()); generator (a
    torch.Generator on the logits' device, None: torch's default) draws the uniforms unless
    `uniforms` (B,) gives them. The logits are not checked for NaN (that would synchronise).
    """
    import torch

    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be (batch, vocab), not of shape {tuple(logits.shape)}")
    b, v = logits.shape
    z = logits.to(torch.float32)
    if params.repetition_penalty != 1.0 and history_mask is not None:
        if tuple(history_mask.shape) != (b, v):
            raise ValueError(f"history_mask is {tuple(history_mask.shape)}, not {(b, v)}")
        up, down = _penalty_factors(params.repetition_penalty)
        penalised = torch.where(z > 0, z * up, z * down)
        z = torch.where(history_mask.to(device=z.device, dtype=torch.bool), penalised, z)
    if params.greedy:
        return torch.argmax(z, dim=1)
    z = z * float(np.float32(1.0 / params.temperature))
    k = v if params.top_k == 0 else min(params.top_k, v)
    vals, order = torch.sort(z, dim=1, descending=True, stable=True)
    vals, order = vals[:, :k].to(torch.float64), order[:, :k]
    p = torch.exp(vals - vals[:, :1])
    p = p / p.sum(dim=1, keepdim=True)
    if params.top_p < 1.0:
        cum = torch.cumsum(p, dim=1)
        p = torch.where(cum - p < params.top_p, p, torch.zeros_like(p))
    n_keep = torch.count_nonzero(p, dim=1)
    cum = torch.cumsum(p, dim=1)
    if uniforms is None:
        u = torch.rand(b, generator=generator, device=z.device, dtype=torch.float64)
    else:
        u = torch.as_tensor(uniforms, dtype=torch.float64, device=z.device).reshape(b)
    pos = torch.count_nonzero(cum <= (u * cum[:, -1]).unsqueeze(1), dim=1)
    pos = torch.minimum(pos, n_keep - 1)
    return order.gather(1, pos.unsqueeze(1)).squeeze(1)


class StopChecker:
    """Stop strings over streamed text: push() returns what can be shown, holding back a tail that
    may begin a stop string until the following text decides; at a stop string, what precedes it is
    returned, `stopped` is set and the rest (the stop string included) is dropped."""

    def __init__(self, stop: list[str] | tuple[str, ...] = ()):
        if isinstance(stop, str):
            stop = (stop,)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"a stop string must be a non-empty str, not {s!r}")
        self.stop = tuple(stop)
        self.stopped = False
        self.matched: str | None = None
        self._held = ""

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self._held + text
        hits = [(i, -len(s), s) for s in self.stop if (i := buf.find(s)) >= 0]
        if hits:
            at, _, self.matched = min(hits)
            self.stopped, self._held = True, ""
            return buf[:at]
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """At the end of the stream: the held-back text (it began no stop string after all)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

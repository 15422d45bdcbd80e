"""A qwen35 model on the CPU: the numpy reference (pyq2.spec.qwen35) on the file's weights as
floats (pyq2.gguf.float_weights: dequantised and unfolded), as a generation backend.

It is the oracle the GPU runner is tested against and the path that lets a small model (the
demo's) generate on a machine without a GPU. Every prompt and every step runs in float32 with
float64 reductions; the weights take 4 bytes per parameter (a larger model is refused, with
what it would take).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..gguf.float_weights import DEFAULT_MAX_BYTES, read_float_weights
from ..gguf.io import GGUFFile
from ..spec import qwen35
from ..text.sampling import SamplingParams, sample_numpy


class CpuModel:
    """ModelBackend (pyq2.runtime.generate) over the numpy reference."""

    def __init__(self, gf: GGUFFile, config: qwen35.Config, context: int,
                 max_bytes: int = DEFAULT_MAX_BYTES):  # fmt: skip
        self.config = config
        self.weights = read_float_weights(gf, max_bytes)
        self.n_vocab = int(self.weights["token_embd.weight"].shape[0])
        self.context = context
        self.name = "cpu (numpy reference)"
        self.states: list[qwen35.State] = []
        self._rng: np.random.Generator | None = None  # one per generation, from its seed

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        self._rng = None
        self.states = [qwen35.State.new(self.config, capacity=len(p) + 64) for p in prompts]
        rows = []
        for p, state in zip(prompts, self.states, strict=True):
            logits = qwen35.forward(self.weights, self.config, np.asarray(p, np.int64), state)
            rows.append(logits[-1])
        return np.stack(rows)

    def extend(self, tokens: list[int]) -> np.ndarray:
        """The one sequence on with more prompt tokens from its state: the logits (1, V) of the
        last; sampling starts again from the seed (a new generation)."""
        if len(self.states) != 1 or not tokens:
            raise ValueError(f"extend: one sequence and at least one token ({len(self.states)} "
                             f"sequences, {len(tokens)} tokens)")  # fmt: skip
        if self.states[0].pos + len(tokens) > self.context:
            raise ValueError(f"extend: {self.states[0].pos} + {len(tokens)} positions do not fit "
                             f"the context of {self.context}")  # fmt: skip
        self._rng = None
        logits = qwen35.forward(self.weights, self.config, np.asarray(tokens, np.int64),
                                self.states[0])  # fmt: skip
        return logits[-1:]

    @property
    def lengths(self) -> list[int]:
        """The positions each sequence holds."""
        return [s.pos for s in self.states]

    def score(self, tokens: list[int], chunk: int | None = None) -> np.ndarray:
        """Teacher-forced logits (T, V) of one sequence from an empty state, `chunk` tokens a
        call (default all at once); decode() then continues it."""
        self.states = [qwen35.State.new(self.config, capacity=len(tokens) + 64)]
        size = chunk or max(1, len(tokens))
        rows = [
            qwen35.forward(
                self.weights, self.config, np.asarray(tokens[i : i + size]), self.states[0]
            )
            for i in range(0, len(tokens), size)
        ]
        return np.concatenate(rows)

    def decode(self, tokens: list[int]) -> np.ndarray:
        rows = []
        for t, state in zip(tokens, self.states, strict=True):
            rows.append(qwen35.forward(self.weights, self.config, np.asarray([t]), state)[-1])
        return np.stack(rows)

    def sample(self, logits: Any, params: SamplingParams, history: list[list[int]]) -> list[int]:
        if self._rng is None:
            self._rng = params.numpy_rng()
        return [int(t) for t in sample_numpy(np.asarray(logits), params, history, self._rng)]

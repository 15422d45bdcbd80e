"""Text generation over a model backend: prompts in, streamed text and timings out.

`generate(backend, tokenizer, prompts, options, on_text)` tokenises each prompt (through the
file's chat template with options.chat), runs the prompts through the backend (each sequence its
own caches and positions), then decodes every unfinished sequence together, one token each per
step, sampling with options.sampling. A sequence stops at an end-of-sequence token, at a stop
string (the text before it is kept) or after options.max_tokens tokens. Text is streamed through
on_text(sequence, text) as it becomes complete UTF-8 past any stop string that may still match.

A backend is the model on some device (ModelBackend): pyq2.runtime.cpu_model runs the numpy
reference on the CPU, pyq2.runtime.gpu_model libpq2's weight path with torch mixers on a GPU.
Where the backend chains its steps on the device (ModelBackend, decode_sample), the next step
is started before the host reads the tokens of the one before it, unless every sequence ends
with those tokens by its length or the context: the host's work on a token then overlaps the
next step, and a sequence that ends at an end-of-sequence token or a stop string costs one
step more, whose tokens are dropped.
The timings are what a llama.cpp user expects: prompt tokens/s, decode tokens/s and the time to
first token, and the load time where the caller sets it; a backend that replays decode graphs
(warm) captures those the generation needs after the first token, timed apart from the decode
steps (graphs, graphs_s). An interruption (Ctrl-C) ends the generation early with
`interrupted` set and the timings so far.

A backend that keeps a sequence's caches between generations (ModelBackend, extend) lets a
generation of one prompt start from them: with `held`, the prompt's first `held` tokens are what
the backend's sequence already holds (a conversation's earlier turns, pyq2.runtime.conversation),
and only the rest runs through the model. Generation.chosen then says what the backend holds
after it: the prompt and the chosen tokens, the first `lengths[0]` of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import FormatError
from ..text.chat import render_chat
from ..text.sampling import SamplingParams, StopChecker
from ..text.tokenizer import StreamDecoder, Tokenizer


class ModelBackend(Protocol):
    """A model on some device. One that chains decode steps where the tokens are also has
    decode_sample(tokens | None, params) -> (a function returning the chosen tokens): a step
    and its sampling started, None taking the previous call's choice (pyq2.runtime.gpu_model).
    One that replays decode graphs also has warm(steps, params) -> the number of graphs it
    captured for the next `steps` steps. One that keeps its caches between generations also has
    extend(tokens) -> the logits (1, V) after them: the one sequence goes on with more prompt
    tokens from the positions it holds, and sampling starts again (a new generation: its seed,
    its repetition history); and `lengths`, the positions each sequence holds."""

    name: str  # what runs it, for the timings line ("cpu (numpy)", "gpu (NVIDIA H200)")
    n_vocab: int
    context: int  # the most positions a sequence may hold

    def prefill(self, prompts: list[list[int]]) -> Any:
        """Start one sequence per prompt (fresh caches) and run the prompts through the model;
        the logits (B, V) of each prompt's last token."""

    def decode(self, tokens: list[int]) -> Any:
        """One step: tokens[b] is sequence b's next token; the logits (B, V) after it."""

    def sample(self, logits: Any, params: SamplingParams, history: list[list[int]]) -> list[int]:
        """The next token of each row of logits."""


@dataclass(frozen=True)
class Options:
    max_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    chat: bool = False
    system: str | None = None
    ignore_eos: bool = False  # run on past end-of-sequence tokens (benchmarks, tests)


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None  # "eos", "stop", "length", "context"
    chosen: list[int] = field(default_factory=list)  # every chosen token, end-of-sequence too


@dataclass
class Timings:
    backend: str = ""
    load_s: float = 0.0  # opening the model (the caller's): the file to the device, warm-up
    prompt_tokens: int = 0  # those run through the model (a held prefix not counted)
    held_tokens: int = 0  # the prompt's first tokens already in the backend's caches
    prompt_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    first_token_s: float = 0.0
    graphs: int = 0  # decode graphs captured between the first token and the decode steps
    graphs_s: float = 0.0
    interrupted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "load_s": self.load_s,
            "prompt_tokens": self.prompt_tokens,
            "held_tokens": self.held_tokens,
            "prompt_s": self.prompt_s,
            "prompt_tokens_per_s": _rate(self.prompt_tokens, self.prompt_s),
            "decode_tokens": self.decode_tokens,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": _rate(self.decode_tokens, self.decode_s),
            "time_to_first_token_s": self.first_token_s,
            "decode_graphs": self.graphs,
            "decode_graphs_s": self.graphs_s,
            "interrupted": self.interrupted,
        }

    def lines(self) -> list[str]:
        d = self.as_dict()
        return [
            f"backend: {self.backend}",
            *([f"load: {self.load_s:.1f} s"] if self.load_s else []),
            f"prompt: {self.prompt_tokens} tokens in {self.prompt_s * 1e3:.1f} ms "
            f"({d['prompt_tokens_per_s']:.1f} tokens/s)"
            + (f", after {self.held_tokens} held from before" if self.held_tokens else ""),
            f"decode: {self.decode_tokens} tokens in {self.decode_s * 1e3:.1f} ms "
            f"({d['decode_tokens_per_s']:.1f} tokens/s)",
            f"time to first token: {self.first_token_s * 1e3:.1f} ms"
            + (" (interrupted)" if self.interrupted else ""),
        ] + ([f"decode graphs: {self.graphs} captured in {self.graphs_s * 1e3:.1f} ms "
              "before the decode steps"] if self.graphs else [])  # fmt: skip


def _rate(n: int, s: float) -> float:
    return n / s if s > 0 else 0.0


def encode_prompts(
    tokenizer: Tokenizer, prompts: Sequence[str], options: Options, template: str | None
) -> list[list[int]]:
    """The token ids of each prompt (through the chat template with options.chat)."""
    out = []
    for i, p in enumerate(prompts):
        if options.chat:
            messages = [{"role": "system", "content": options.system}] if options.system else []
            messages.append({"role": "user", "content": p})
            p = render_chat(template, messages, add_generation_prompt=True)
        ids = tokenizer.encode(p)
        if not ids:
            raise ValueError(
                f"prompt {i + 1} is empty: give at least one character of text"
                if len(prompts) > 1
                else "the prompt is empty: give at least one character of text"
            )
        out.append(ids)
    return out


def check_prompts(prompts: list[list[int]], n_vocab: int, context: int, max_tokens: int) -> None:
    """ValueError for a prompt that does not fit the context or holds an unknown token id."""
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise FormatError(
                f"prompt {i + 1} holds token id {bad[0]}, outside the vocabulary of {n_vocab}"
            )
        if len(ids) >= context:
            raise ValueError(
                f"prompt {i + 1} is {len(ids)} tokens, and the context holds {context}: "
                f"shorten it or give a larger --ctx"
            )
    if max_tokens < 0:
        raise ValueError(f"-n {max_tokens}: the number of tokens to generate is at least 0")


def _launcher(
    backend: ModelBackend, params: SamplingParams, history: list[list[int]]
) -> Callable[[list[int] | None], Callable[[], list[int]] | None]:
    """launch(tokens) starts a decode step of the given tokens and returns a function giving
    the chosen ones; launch(None) chains a step on the previous choice where the backend can
    (else None: the caller gives the tokens when it has them)."""
    chained = getattr(backend, "decode_sample", None)
    if chained is not None:
        return lambda tokens: chained(tokens, params)

    def launch(tokens: list[int] | None) -> Callable[[], list[int]] | None:
        if tokens is None:
            return None
        chosen = backend.sample(backend.decode(tokens), params, history)
        return lambda: chosen

    return launch


def generate(
    backend: ModelBackend,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    options: Options,
    on_text: Callable[[int, str], None] | None = None,
    timings: Timings | None = None,
    held: int = 0,
) -> list[Generation]:
    """Run the prompts (token ids) and decode (module docstring); fills `timings` as it goes,
    so that an interrupted caller still has the figures so far. held: the one prompt's first
    tokens that the backend's sequence already holds (its extend runs the rest)."""
    check_prompts(prompts, backend.n_vocab, backend.context, options.max_tokens)
    extend = getattr(backend, "extend", None)
    if held and not (extend is not None and len(prompts) == 1 and 0 < held < len(prompts[0])):
        raise ValueError(
            f"held {held}: a held prefix needs a backend that keeps its caches (extend), one "
            "prompt and at least one token of it past the prefix"
        )
    lengths = list(getattr(backend, "lengths", []))
    if held and lengths != [held]:
        raise ValueError(f"held {held}: the backend's sequences hold {lengths} positions")
    t = timings if timings is not None else Timings()
    t.backend = backend.name
    seqs = [Generation(list(p)) for p in prompts]
    decoders = [StreamDecoder(tokenizer, skip_special=True) for _ in seqs]
    stops = [StopChecker(options.stop) for _ in seqs]
    eos = set() if options.ignore_eos else set(tokenizer.eos_ids)
    emit = on_text or (lambda i, s: None)

    def accept(i: int, token: int) -> None:
        s = seqs[i]
        if token in eos:
            s.finish = "eos"
            return
        s.tokens.append(token)
        shown = stops[i].push(decoders[i].push(token))
        s.text += shown
        if shown:
            emit(i, shown)
        if stops[i].stopped:
            s.finish = "stop"
        elif len(s.tokens) >= options.max_tokens:
            s.finish = "length"
        elif len(s.prompt) + len(s.tokens) >= backend.context:
            s.finish = "context"

    t0 = time.perf_counter()
    try:
        if options.max_tokens == 0:
            return seqs
        t.prompt_tokens = sum(len(p) for p in prompts) - held
        t.held_tokens = held
        if held:
            assert extend is not None
            logits = extend(list(prompts[0][held:]))
        else:
            logits = backend.prefill([list(p) for p in prompts])
        history = [list(p) for p in prompts]
        nxt = backend.sample(logits, options.sampling, history)
        t.prompt_s = t.first_token_s = time.perf_counter() - t0
        for i, tok in enumerate(nxt):
            seqs[i].chosen.append(tok)
            accept(i, tok)
            history[i].append(tok)
        warm = getattr(backend, "warm", None)
        if warm is not None and any(s.finish is None for s in seqs):
            tg = time.perf_counter()
            t.graphs = warm(options.max_tokens - 1, options.sampling)
            t.graphs_s = time.perf_counter() - tg
        t1 = time.perf_counter()
        launch = _launcher(backend, options.sampling, history)

        def may_go_on() -> bool:
            """Whether a sequence may still run after its next token (not ending by length)."""
            return any(
                s.finish is None
                and len(s.tokens) + 1 < options.max_tokens
                and len(s.prompt) + len(s.tokens) + 1 < backend.context
                for s in seqs
            )

        # finished sequences stay in the batch (fixed batch shapes): a repeated token, or
        # (chained on the device) their own choice, unread
        pending = launch([h[-1] for h in history]) if any(s.finish is None for s in seqs) else None
        while pending is not None:
            ahead = launch(None) if may_go_on() else None
            nxt = pending()
            for i, tok in enumerate(nxt):
                if seqs[i].finish is None:
                    seqs[i].chosen.append(tok)
                    accept(i, tok)
                    history[i].append(tok)
                    t.decode_tokens += 1
                else:
                    history[i].append(history[i][-1])
            t.decode_s = time.perf_counter() - t1
            if not any(s.finish is None for s in seqs):
                break
            pending = ahead if ahead is not None else launch([h[-1] for h in history])
    except KeyboardInterrupt:
        t.interrupted = True
        raise
    finally:
        for i, s in enumerate(seqs):
            tail = stops[i].push(decoders[i].flush()) + stops[i].flush()
            if tail:
                s.text += tail
                emit(i, tail)
    return seqs

"""A small, valid byte-level BPE vocabulary for the demo model, as GGUF metadata.

`demo_tokenizer_metadata(n_vocab)` gives the `tokenizer.*` keys of a Qwen3.5-style file with
exactly n_vocab tokens: the 256 byte tokens (GPT-2's byte alphabet, in the order of Qwen's
vocabulary), the tokens of merges learned from the English text below by a tiny deterministic BPE
trainer, `[PAD<i>]` unused tokens (type 5) if the text runs out of merges before the size is
reached (as llama.cpp's converter pads a vocabulary), then `<|endoftext|>`, `<|im_start|>` and
`<|im_end|>` as control tokens (type 3). As in Qwen3.5's GGUF files, eos is `<|im_end|>`, bos and
padding are `<|endoftext|>`, add_bos_token is false and tokenizer.ggml.pre is "qwen35".
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MIN_VOCAB = 256 + 1 + len(SPECIAL_TOKENS)

# Qwen's basic ChatML template (no default system prompt, no tools, no thinking).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TEXT = """\
The little town by the river wakes up early. At six o'clock the baker opens his door, and the
smell of fresh bread drifts down the main street. By seven, the first bus has left for the city,
carrying students, nurses and a few tired workers who didn't sleep well. "We're late again,"
says one of them, but nobody answers; they've heard it every morning for years.

In the afternoon the weather changes. Clouds come in from the west, the wind turns cold, and the
children run home from school before the rain starts. Their parents watch the sky and talk about
the harvest: will the fields be dry enough next week? The old farmer at the end of the road says
he'll wait and see. He has seen 42 summers on this land, and he knows that the river, the hills
and the weather have their own plans.

A machine is only as good as the instructions it is given. When you write a program, you
describe each step in order: read the input, check that it is valid, compute the result and
print it. If one step is wrong, the whole program fails, so good engineers test every part. They
write small tests first, then larger ones, and they run them again after each change. It's slow
at the beginning, but it saves time later, because the errors are found when they are still easy
to fix.

Questions and answers:
- What is the capital of France? The capital of France is Paris.
- How many days are there in a week? There are 7 days in a week.
- What is 12 plus 30? 12 plus 30 is 42.
- Where does the sun rise? The sun rises in the east and sets in the west.

The library on the hill has three floors. The first floor holds newspapers and maps, the second
holds novels and poems, and the third is for science, history and mathematics. Students come
there to read, to write their reports and to meet their friends. The librarian, a patient woman
with grey hair, knows where every book is; if you ask her for a story about ships, she'll find
one in a minute.

I'm sure you'd like to know how the story ends. The ship came back in the spring, with a new
sail and a crew that had learned a great deal. They had crossed the sea twice, lost their way
once, and found it again by following the stars. When they reached the harbour, the whole town
was waiting for them.
"""

# The qwen35 pre-tokenizer restricted to ASCII, which is all the text above uses.
_SPLIT = re.compile(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    re.ASCII,
)


def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte alphabet (byte -> character) in its own order: printable bytes first (standing
    for themselves), then the other 68 as chr(256 + n)."""
    bs = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in bs]
    return {b: chr(b) for b in bs} | {b: chr(256 + n) for n, b in enumerate(shifted)}


@lru_cache(maxsize=8)
def _train(n_merge_tokens: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(new tokens, merges): BPE merges of the text, the most frequent pair first (ties: the
    smallest pair), until n_merge_tokens tokens were added or no pair is left."""
    spell = _byte_spelling()
    words: Counter[tuple[str, ...]] = Counter(
        tuple(spell[b] for b in piece.encode("utf-8")) for piece in _SPLIT.findall(_TEXT)
    )
    have = set(spell.values())
    tokens: list[str] = []
    merges: list[str] = []
    while len(tokens) < n_merge_tokens:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, count in words.items():
            for pair in zip(w, w[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        a, b = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(f"{a} {b}")
        if a + b not in have:
            have.add(a + b)
            tokens.append(a + b)
        merged: Counter[tuple[str, ...]] = Counter()
        for w, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return tuple(tokens), tuple(merges)


def demo_tokenizer_metadata(n_vocab: int) -> dict[str, Any]:
    """The tokenizer.* metadata of a demo model with exactly n_vocab tokens (n_vocab >= 260)."""
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int):
        raise TypeError(f"n_vocab is {type(n_vocab).__name__}, not an int")
    if n_vocab < MIN_VOCAB:
        raise ValueError(
            f"n_vocab is {n_vocab}; a byte-level vocabulary needs at least {MIN_VOCAB} tokens "
            f"(256 bytes, one merge, {len(SPECIAL_TOKENS)} special tokens)"
        )
    n_normal = n_vocab - len(SPECIAL_TOKENS)
    learned, merges = _train(n_normal - 256)
    tokens = [*_byte_spelling().values(), *learned]
    types = [1] * len(tokens)
    pad = n_normal - len(tokens)
    tokens += [f"[PAD{len(tokens) + i}]" for i in range(pad)]
    types += [5] * pad
    tokens += SPECIAL_TOKENS
    types += [3] * len(SPECIAL_TOKENS)
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": list(merges),
        "tokenizer.ggml.eos_token_id": ids["<|im_end|>"],
        "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }

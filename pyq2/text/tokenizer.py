"""Byte-level BPE from a GGUF file's `tokenizer.ggml.*` metadata, as Qwen2 and Qwen3.5 ship it.

The pipeline is llama.cpp's (`llm_tokenizer_bpe`, src/llama-vocab.cpp) and the one the `tokenizers`
package runs for a Qwen `tokenizer.json`:

1. special tokens are cut out of the text whole, leftmost first and longest first at a position:
   control (and unknown) tokens only with ``special=True``, user-defined ones (``<think>``) always;
2. each remaining fragment is split by the pre-tokenizer regex of ``tokenizer.ggml.pre``;
3. each piece's UTF-8 bytes are spelled in GPT-2's byte alphabet and merged by rank (lowest rank
   first, leftmost first among equal ranks).

No Unicode normalisation happens by default (llama.cpp's behaviour and transformers' GGUF loader);
``nfc=True`` adds the NFC normaliser that Qwen's `tokenizer.json` declares. Decoding maps normal
tokens back through the byte alphabet and the others to their text, then UTF-8 (``errors="replace"``
only on the whole result: see StreamDecoder for a stream).

Backends: ``"tokenizers"`` (the HF package, fast) and ``"python"`` (the `regex` module for the
split where installed, else a hand-written scanner over `unicodedata`); both give the same ids.
"""

from __future__ import annotations

import codecs
import heapq
import importlib
import operator
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from pyq2.errors import FormatError

TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL = 0, 1, 2, 3
TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 4, 5, 6

# llama.cpp spells tokenizer.json's `(?i:'s|'t|'re|'ve|'m|'ll|'d)` out as classes (they differ
# only on U+017F, which case-folds to "s"); both backends use this spelling.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# LLAMA_VOCAB_PRE_TYPE_QWEN2 and LLAMA_VOCAB_PRE_TYPE_QWEN35 (src/llama-vocab.cpp); the Qwen3.5 one
# keeps combining marks (\p{M}) with their letters and out of the punctuation runs.
QWEN2_PATTERN = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (pattern, whether \p{M} joins the letters), as llama.cpp maps the names.
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "qwen2": (QWEN2_PATTERN, False),
    "deepseek-r1-qwen": (QWEN2_PATTERN, False),
    "qwen35": (QWEN35_PATTERN, True),
}
# The chat-model end-of-turn tokens that stop generation besides tokenizer.ggml.eos_token_id.
CHAT_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: printable bytes stand for themselves, the other 68 for 256 + n."""
    bs = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


BYTE_TO_UNICODE = bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}
_B2U = [BYTE_TO_UNICODE[b] for b in range(256)]

# Unicode White_Space, what \s is to the `regex` module, to Oniguruma and to llama.cpp's tables.
_WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_CLASS: dict[str, str] = {}
_CONTRACTIONS3 = frozenset(
    a + b for x in ("re", "ve", "ll") for a in x[0] + x[0].upper() for b in x[1] + x[1].upper()
)


def _char_class(c: str) -> str:
    """'W' (White_Space), 'L', 'M', 'N' (the general category's first letter) or 'P' (the rest)."""
    k = _CLASS.get(c)
    if k is None:
        k = "W" if c in _WHITE_SPACE else unicodedata.category(c)[0]
        k = k if k in "WLMN" else "P"
        _CLASS[c] = k
    return k


def scan_split(text: str, marks: bool) -> list[str]:
    """The Qwen pre-tokenizer regex (marks: the qwen35 one) as a scanner, with the regex's result.

    At each position the alternatives are tried in the regex's order and each match is the one the
    backtracking engine finds; every character starts some alternative, so nothing is skipped.
    """
    n = len(text)
    cls = [_char_class(c) for c in text] + ["$", "$"]
    word = ("L", "M") if marks else ("L",)
    punct = ("P",) if marks else ("P", "M")  # [^\s\p{L}(\p{M})\p{N}]
    out = []
    p = 0
    while p < n:
        c, k, k1 = text[p], cls[p], cls[p + 1]
        if c == "'" and p + 1 < n and text[p + 1] in "sStTmMdD":
            end = p + 2
        elif c == "'" and text[p + 1 : p + 3] in _CONTRACTIONS3:
            end = p + 3
        elif k in word or (k1 in word and k not in "LN" and c not in "\r\n"):
            end = p + 1  # [^\r\n\p{L}\p{N}]?[\p{L}(\p{M})]+
            while cls[end] in word:
                end += 1
        elif k == "N":
            end = p + 1
        elif k in punct or (c == " " and k1 in punct):
            end = p + 1 if k in punct else p + 2  # ' ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*'
            while cls[end] in punct:
                end += 1
            while end < n and text[end] in "\r\n":
                end += 1
        else:  # white space: \s*[\r\n]+ | \s+(?!\S) | \s+
            q = p + 1
            while cls[q] == "W":
                q += 1
            last = max(text.rfind("\n", p, q), text.rfind("\r", p, q))
            end = last + 1 if last >= 0 else q if q == n or q - p < 2 else q - 1
        out.append(text[p:end])
        p = end
    return out


def _as_str(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    if not isinstance(value, str):
        raise FormatError(f"{what} is {type(value).__name__}, not a string")
    return value


def _as_int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FormatError(f"{what} is {value!r}, not an integer") from None


def _read_merges(
    merges: Any, token_to_id: Mapping[str, int]
) -> dict[tuple[str, str], tuple[int, str]]:
    """(left, right) -> (rank, merged) of `tokenizer.ggml.merges` ("left right" strings); a pair
    listed twice keeps its first rank, as llama.cpp does."""
    if not merges:
        raise FormatError("the file has no tokenizer.ggml.merges")
    ranks: dict[tuple[str, str], tuple[int, str]] = {}
    for rank, merge in enumerate(merges):
        parts = _as_str(merge, f"merge {rank}").split(" ")
        if len(parts) != 2 or not all(parts):
            raise FormatError(f"merge {rank} {merge!r} is not two tokens separated by a space")
        for piece in (parts[0], parts[1], parts[0] + parts[1]):
            if piece not in token_to_id:
                raise FormatError(f"merge {rank} {merge!r} names {piece!r}, not in the vocabulary")
        ranks.setdefault((parts[0], parts[1]), (rank, parts[0] + parts[1]))
    return ranks


class Tokenizer:
    """Text <-> token ids for a byte-level BPE ("gpt2") vocabulary from GGUF metadata.

    metadata maps full key names (``tokenizer.ggml.tokens``, ...) to Python values. backend is
    "auto" (tokenizers if importable, else python), "python" or "tokenizers"; splitter ("auto",
    "regex", "scan") picks the python backend's split; nfc adds NFC normalisation.
    """

    def __init__(
        self,
        metadata: Mapping[str, Any],
        *,
        backend: str = "auto",
        splitter: str = "auto",
        nfc: bool = False,
    ):
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise FormatError(
                f"tokenizer.ggml.model is {model!r}; pyq2 reads only byte-level BPE ('gpt2')"
            )
        pre = metadata.get("tokenizer.ggml.pre")
        if pre not in PRE_TOKENIZERS:
            raise FormatError(
                f"tokenizer.ggml.pre is {pre!r}; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        self.pre: str = pre
        self.pattern, self._marks = PRE_TOKENIZERS[pre]
        self.nfc = nfc
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise FormatError("the file has no tokenizer.ggml.tokens")
        self.tokens: list[str] = [_as_str(t, f"token {i}") for i, t in enumerate(tokens)]
        n = len(self.tokens)
        types = metadata.get("tokenizer.ggml.token_type")
        self.token_types: list[int] = (
            [TOKEN_NORMAL] * n
            if types is None
            else [_as_int(t, f"token_type[{i}]") for i, t in enumerate(types)]
        )
        if len(self.token_types) != n:
            raise FormatError(
                f"tokenizer.ggml.token_type has {len(self.token_types)} entries for {n} tokens"
            )
        self._token_to_id = {t: i for i, t in enumerate(self.tokens)}  # the last wins (llama.cpp)
        missing = [b for b in range(256) if BYTE_TO_UNICODE[b] not in self._token_to_id]
        if missing:
            raise FormatError(f"the vocabulary lacks the byte token of 0x{missing[0]:02x}")
        self._ranks = _read_merges(metadata.get("tokenizer.ggml.merges"), self._token_to_id)
        self.eos_id = self._optional_id(metadata, "eos_token_id")
        self.bos_id = self._optional_id(metadata, "bos_token_id")
        self.pad_id = self._optional_id(metadata, "padding_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        template = metadata.get("tokenizer.chat_template")
        self.chat_template: str | None = None if template is None else _as_str(template, "template")
        eos = [] if self.eos_id is None else [self.eos_id]
        for text in CHAT_EOS_TOKENS:
            i = self._token_to_id.get(text)
            if i is not None and i not in eos and self.token_types[i] != TOKEN_NORMAL:
                eos.append(i)
        self.eos_ids: tuple[int, ...] = tuple(eos)
        self._bytes = [self._piece_bytes(i) for i in range(n)]
        control = {TOKEN_CONTROL, TOKEN_UNKNOWN}
        self._special_re = self._specials({TOKEN_USER_DEFINED} | control)
        self._user_re = self._specials({TOKEN_USER_DEFINED})
        self._cache: dict[str, list[int]] = {}
        self.backend, self._hf = self._choose(backend, splitter)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def _optional_id(self, metadata: Mapping[str, Any], key: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is None:
            return None
        i = _as_int(value, f"tokenizer.ggml.{key}")
        if not 0 <= i < len(self.tokens):
            raise FormatError(
                f"tokenizer.ggml.{key} is {i}, outside the vocabulary of {len(self.tokens)}"
            )
        return i

    def _piece_bytes(self, i: int) -> bytes:
        text, kind = self.tokens[i], self.token_types[i]
        if kind == TOKEN_NORMAL:
            return b"".join(
                bytes((UNICODE_TO_BYTE[c],)) if c in UNICODE_TO_BYTE else c.encode() for c in text
            )
        if kind == TOKEN_BYTE and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            return bytes((int(text[3:5], 16),))
        if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED):
            return text.encode("utf-8", errors="surrogateescape")
        return b""  # unused and undefined tokens print nothing (llama.cpp's token_to_piece)

    def _specials(self, kinds: set[int]) -> tuple[re.Pattern[str] | None, dict[str, int]]:
        found = {t: i for i, t in enumerate(self.tokens) if t and self.token_types[i] in kinds}
        if not found:
            return None, found
        order = sorted(found, key=lambda t: (-len(t), t))
        return re.compile("|".join(map(re.escape, order))), found

    def _choose(self, backend: str, splitter: str) -> tuple[str, Any]:
        if backend not in ("auto", "python", "tokenizers"):
            raise ValueError(f"backend is {backend!r}; use 'auto', 'python' or 'tokenizers'")
        if splitter not in ("auto", "regex", "scan"):
            raise ValueError(f"splitter is {splitter!r}; use 'auto', 'regex' or 'scan'")
        if backend != "python":
            try:
                return "tokenizers", self._build_hf()
            except ImportError:
                if backend == "tokenizers":
                    raise ImportError(
                        "backend='tokenizers' needs the tokenizers package: pip install tokenizers"
                    ) from None
        self._split = self._python_splitter(splitter)
        return "python", None

    def _python_splitter(self, splitter: str) -> Any:
        if splitter != "scan":
            try:
                regex = importlib.import_module("regex")
            except ImportError:
                if splitter == "regex":
                    raise ImportError("splitter='regex' needs regex: pip install regex") from None
            else:
                return regex.compile(self.pattern).findall
        marks = self._marks
        return lambda text: scan_split(text, marks)

    def _build_hf(self) -> Any:
        from tokenizers import Regex, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.models import BPE

        merges = sorted(self._ranks, key=lambda pair: self._ranks[pair][0])
        hf = HFTokenizer(
            BPE(vocab=self._token_to_id, merges=merges, fuse_unk=False, byte_fallback=False)
        )
        if self.nfc:
            hf.normalizer = normalizers.NFC()
        split = pre_tokenizers.Split(Regex(self.pattern), behavior="isolated", invert=False)
        byte_level = pre_tokenizers.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False
        )
        hf.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
        return hf

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, *, special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of text. special: match control tokens (`<|im_start|>`) in it; add_bos: prepend
        bos_id (None: as tokenizer.ggml.add_bos_token says)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text has a lone surrogate at index {e.start}") from None
        out: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            out.append(self.bos_id)
        pattern, ids = self._special_re if special else self._user_re
        pos = 0
        if pattern is not None:
            for m in pattern.finditer(text):
                if m.start() > pos:
                    out += self._encode_plain(text[pos : m.start()])
                out.append(ids[m.group()])
                pos = m.end()
        if pos < len(text):
            out += self._encode_plain(text[pos:])
        return out

    def _encode_plain(self, text: str) -> list[int]:
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        cache = self._cache
        for piece in self._split(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe("".join([_B2U[b] for b in piece.encode("utf-8")]))
                if len(cache) < 200_000:
                    cache[piece] = ids
            out += ids
        return out

    def _bpe(self, word: str) -> list[int]:
        """Merge by rank, the lowest rank first and the leftmost first among equal ranks."""
        syms = list(word)
        n = len(syms)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        ranks = self._ranks
        heap = []
        for i in range(n - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None:
                heap.append((r[0], i, r[1]))
        heapq.heapify(heap)
        while heap:
            _, i, merged = heapq.heappop(heap)
            j = nxt[i]
            if not syms[i] or j < 0 or syms[i] + syms[j] != merged:
                continue  # a stale pair: one side has been merged since
            syms[i], syms[j] = merged, ""
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
            for a, b in ((prv[i], i), (i, nxt[i])):
                if a >= 0 and b >= 0:
                    r = ranks.get((syms[a], syms[b]))
                    if r is not None:
                        heapq.heappush(heap, (r[0], a, r[1]))
        return [self._token_to_id[s] for s in syms if s]

    # ---- decoding -----------------------------------------------------------------------------

    def _check_id(self, i: Any) -> int:
        j = operator.index(i)  # an int, numpy integer or integer tensor; not a float
        if not 0 <= j < len(self.tokens):
            raise FormatError(
                f"token id {j} is outside the vocabulary of {len(self.tokens)} tokens"
            )
        return j

    def token_bytes(self, token_id: int, *, skip_special: bool = False) -> bytes:
        """The bytes a token stands for (a control token: its text; nothing with skip_special)."""
        i = self._check_id(token_id)
        if skip_special and self.token_types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return b""
        return self._bytes[i]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of ids (invalid UTF-8 becomes U+FFFD)."""
        data = b"".join(self.token_bytes(i, skip_special=skip_special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str:
        """The token as the vocabulary spells it (byte alphabet for normal tokens: 'Ġthe')."""
        return self.tokens[self._check_id(token_id)]

    def piece_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary entry (`<|im_end|>`, 'Ġthe'), or None."""
        return self._token_to_id.get(piece)

    def is_special(self, token_id: int) -> bool:
        return self.token_types[self._check_id(token_id)] in (TOKEN_CONTROL, TOKEN_UNKNOWN)


class StreamDecoder:
    """Incremental detokenisation: push() returns the text completed by one more token, holding
    back an incomplete UTF-8 sequence until its last byte arrives; flush() ends the stream.

    The concatenation of everything push() and flush() return is tokenizer.decode(all ids).
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(
            self.tokenizer.token_bytes(token_id, skip_special=self.skip_special)
        )

    def flush(self) -> str:
        """What is held back (an unfinished sequence becomes U+FFFD); the decoder starts afresh."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

"""pyq2.text.tokenizer and pyq2.text.demo_vocab: byte-level BPE from GGUF metadata.

The modules are loaded from their files next to this test (not from the installed pyq2, which may
be stale); pyq2.errors is imported normally.
"""

import builtins
import importlib.util
import random
import unicodedata

import pytest

from pyq2.errors import FormatError
from pyq2.text import demo_vocab as demo
from pyq2.text import tokenizer as tok

N_VOCAB = 1024

STRINGS = [
    "",
    "Hello world",
    "hello, World! HELLO?",
    "It's I'm you're we've they'll she'd don't IT'S I'M YOU'RE WE'VE THEY'LL SHE'D",
    "'s 't 're 've 'm 'll 'd 'x 'S 'Re rock'n'roll ''",
    "0 12 345 6789 3.14159 1,000,000 -42 +7 x2 v1.2.3",
    "   leading and trailing   ",
    "a  b   c    d\t\te\t \tf",
    "line one\nline two\r\nline three\n\n\nend\n",
    "  \n  \n\t\n x \n",
    "indented:\n    return x\n\tfoo()\n",
    "中文分词测试，你好世界！",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇯🇵 keycap 1️⃣",
    "mixed: Ελληνικά, русский, العربية, עברית, हिन्दी, ไทย",
    "combining: cafe\u0301 n\u0303 a\u0308\u0301 \u0301lone",
    "symbols: $5 €3 ¥ © ® ™ ° ± × ÷ → ← ≤ ≥ ∞ ½ ⅓ Ⅻ",
    "code: def f(x): return x**2 + 1  # comment\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_start|>",
    "<|im_start <|im_end| |im_end|> <|im_end|x",
    "<think>reasoning</think>answer",
    "nbsp\xa0here\u3000ideographic\u2003em \x85nel\x0bvt\x0cff",
    "under_score __init__ a-b a—b «quotes» “curly” ‘single’",
]


def _metadata(**changes):
    """Demo metadata plus the user-defined tokens <think> and </think> (type 4)."""
    md = demo.demo_tokenizer_metadata(N_VOCAB)
    md["tokenizer.ggml.tokens"] = [*md["tokenizer.ggml.tokens"], "<think>", "</think>"]
    md["tokenizer.ggml.token_type"] = [*md["tokenizer.ggml.token_type"], 4, 4]
    md.update(changes)
    return {k: v for k, v in md.items() if v is not None}


@pytest.fixture(scope="module")
def python_tok():
    return tok.Tokenizer(_metadata(), backend="python", splitter="scan")


def _backends(**kw):
    out = [tok.Tokenizer(_metadata(), backend="python", splitter="scan", **kw)]
    if importlib.util.find_spec("regex") is not None:
        out.append(tok.Tokenizer(_metadata(), backend="python", splitter="regex", **kw))
    if importlib.util.find_spec("tokenizers") is not None:
        out.append(tok.Tokenizer(_metadata(), backend="tokenizers", **kw))
    return out


def _random_strings(count, seed=0):
    alphabet = list("aAzZeé\u0301\u0308 \t\n\r\x0b\xa0\u3000'sStTrReEvVlLmMdD019٣½.,!?-_()<>$€")
    alphabet += list("中文한😀\u200d\ufe0f") + [
        "<|im_end|>",
        "<think>",
        "<|im_start|>",
        "\r\n",
        "  ",
    ]
    rnd = random.Random(seed)
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 16))) for _ in range(count)]


def test_demo_metadata_is_what_a_gguf_writer_stores():
    for n in (260, 300, 512, N_VOCAB, 4096):
        md = demo.demo_tokenizer_metadata(n)
        tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
        assert len(tokens) == len(types) == n and len(set(tokens)) == n
        assert all(isinstance(t, str) for t in tokens) and all(type(t) is int for t in types)
        assert all(isinstance(m, str) and m.count(" ") == 1 for m in md["tokenizer.ggml.merges"])
        assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        assert types[-3:] == [3, 3, 3]
        assert md["tokenizer.ggml.eos_token_id"] == n - 1
        assert md["tokenizer.ggml.bos_token_id"] == md["tokenizer.ggml.padding_token_id"] == n - 3
        assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen35"
        assert md["tokenizer.ggml.add_bos_token"] is False
        assert tokens[:3] == ["!", '"', "#"] and tokens[198] == "Ċ" and tokens[220] == "Ġ"
    assert demo.demo_tokenizer_metadata(N_VOCAB) == demo.demo_tokenizer_metadata(N_VOCAB)
    assert len(demo.demo_tokenizer_metadata(512)["tokenizer.ggml.merges"]) > 200
    with pytest.raises(ValueError, match="at least 260"):
        demo.demo_tokenizer_metadata(259)


def test_properties(python_tok):
    t = python_tok
    assert t.n_vocab == N_VOCAB + 2
    assert t.eos_ids == (N_VOCAB - 1, N_VOCAB - 3)  # <|im_end|>, then <|endoftext|>
    assert t.bos_id == N_VOCAB - 3 and t.eos_id == N_VOCAB - 1 and not t.add_bos
    assert t.id_to_piece(220) == "Ġ" and t.piece_to_id("<|im_end|>") == N_VOCAB - 1
    assert t.piece_to_id("no such piece") is None
    assert t.is_special(N_VOCAB - 1) and not t.is_special(N_VOCAB) and not t.is_special(0)
    assert "im_start" in t.chat_template


@pytest.mark.parametrize("text", STRINGS)
def test_backends_agree_and_round_trip(text):
    backends = _backends()
    ids = backends[0].encode(text)
    for t in backends[1:]:
        assert t.encode(text) == ids, t.backend
        assert t.encode(text, special=False) == backends[0].encode(text, special=False)
    assert backends[0].decode(ids) == text
    assert all(0 <= i < backends[0].n_vocab for i in ids)


def test_backends_agree_on_random_strings():
    backends = _backends()
    for text in _random_strings(1500):
        ids = backends[0].encode(text)
        assert backends[0].decode(ids) == text
        for t in backends[1:]:
            assert t.encode(text) == ids, (t.backend, text)


def test_tokenizers_backend():
    pytest.importorskip("tokenizers")
    fast = tok.Tokenizer(_metadata(), backend="tokenizers")
    slow = tok.Tokenizer(_metadata(), backend="python")
    assert fast.backend == "tokenizers" and slow.backend == "python"
    text = "\n".join(STRINGS) * 3
    assert fast.encode(text) == slow.encode(text)


def test_missing_tokenizers_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name.split(".")[0] == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ImportError, match="pip install tokenizers"):
        tok.Tokenizer(_metadata(), backend="tokenizers")
    assert tok.Tokenizer(_metadata()).backend == "python"


def test_auto_backend_prefers_tokenizers():
    expected = "tokenizers" if importlib.util.find_spec("tokenizers") else "python"
    assert tok.Tokenizer(_metadata()).backend == expected


def test_transformers_gguf_conversion_agrees():
    pytest.importorskip("transformers")
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:
        pytest.skip("this transformers has no qwen35 GGUF tokenizer conversion")
    md = _metadata()
    spec = {
        "tokenizer_type": "gpt2",
        "pre_tokenizer_type": "qwen35",
        "tokens": md["tokenizer.ggml.tokens"],
        "merges": md["tokenizer.ggml.merges"],
        "token_type": md["tokenizer.ggml.token_type"],
        "bos_token_id": md["tokenizer.ggml.bos_token_id"],
        "eos_token_id": md["tokenizer.ggml.eos_token_id"],
    }
    hf, _ = convert_gguf_tokenizer("qwen35", spec)
    ours = tok.Tokenizer(md, backend="python")
    for text in STRINGS + _random_strings(300, seed=1):
        assert hf.encode(text, add_special_tokens=False).ids == ours.encode(text), text


def test_split_pinned_examples():
    split = tok.scan_split
    assert split("Hello world's 123!!\n", True) == [
        "Hello",
        " world",
        "'s",
        " ",
        "1",
        "2",
        "3",
        "!!\n",
    ]
    assert split("a   b\n\n  c", True) == ["a", "  ", " b", "\n\n", " ", " c"]
    assert split("(hello) .x", True) == ["(hello", ")", " .", "x"]
    # qwen35 keeps a combining mark with its letters; qwen2 puts it with the punctuation.
    assert split("cafe\u0301!", True) == ["cafe\u0301", "!"]
    assert split("cafe\u0301!", False) == ["cafe", "\u0301!"]
    assert split("", True) == []


def test_scanner_matches_regex_on_every_assigned_code_point():
    regex = pytest.importorskip("regex")
    for pattern, marks in tok.PRE_TOKENIZERS.values():
        compiled = regex.compile(pattern)
        for cp in [*range(0x3000), *range(0x3000, 0x110000, 29)]:  # in context
            c = chr(cp)
            if 0xD800 <= cp < 0xE000 or unicodedata.category(c) == "Cn":
                continue  # the regex module's Unicode may be newer than unicodedata's
            text = f"a{c}b {c}x.{c} {c}{c}1{c}\n{c}  {c}'{c}'s{c}"
            assert tok.scan_split(text, marks) == compiled.findall(text), hex(cp)


def _tiny(merges, extra=()):
    tokens = list(tok.BYTE_TO_UNICODE.values()) + list(extra)
    return tok.Tokenizer(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen35",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges,
        },
        backend="python",
    )


def test_merges_apply_by_rank_then_leftmost():
    def pieces(t, text):
        return [t.id_to_piece(i) for i in t.encode(text)]

    assert pieces(_tiny(["a b", "b c"], ["ab", "bc"]), "abc") == ["ab", "c"]
    assert pieces(_tiny(["b c", "a b"], ["ab", "bc"]), "abc") == ["a", "bc"]
    t = _tiny(["a a", "aa a"], ["aa", "aaa"])
    assert pieces(t, "aaaa") == ["aa", "aa"]
    assert pieces(t, "aaa") == ["aaa"]


def test_special_tokens(python_tok):
    t = python_tok
    start, end = t.piece_to_id("<|im_start|>"), t.piece_to_id("<|im_end|>")
    think = t.piece_to_id("<think>")
    ids = t.encode("<|im_start|>user\nhi<|im_end|><think>")
    assert ids[0] == start and end in ids and ids[-1] == think
    plain = t.encode("<|im_start|>user\nhi<|im_end|><think>", special=False)
    assert start not in plain and end not in plain and plain[-1] == think  # user-defined: always
    assert t.decode(plain) == "<|im_start|>user\nhi<|im_end|><think>"
    assert t.decode(ids, skip_special=True) == "user\nhi<think>"
    assert t.decode([start]) == "<|im_start|>"


def test_bos_and_nfc():
    t = tok.Tokenizer(_metadata(**{"tokenizer.ggml.add_bos_token": True}), backend="python")
    assert t.encode("hi")[0] == t.bos_id and t.encode("hi", add_bos=False)[0] != t.bos_id
    for t in _backends(nfc=True):
        assert t.encode("cafe\u0301") == t.encode("caf\u00e9")
    for t in _backends():
        assert t.encode("cafe\u0301") != t.encode("caf\u00e9")


def test_stream_decoder_holds_incomplete_utf8(python_tok):
    t = python_tok
    text = "héllo 中文 😀 👨‍👩‍👧 done"
    ids = t.encode(text)
    assert len(ids) > len(text) // 2  # the demo vocabulary splits these characters into bytes
    stream = tok.StreamDecoder(t)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    first = t.encode("中")
    assert len(first) == 3
    stream = tok.StreamDecoder(t)
    assert [stream.push(i) for i in first] == ["", "", "中"]
    stream.push(first[0])
    assert stream.flush() == "\ufffd" and stream.flush() == ""


def test_stream_decoder_equals_decode_on_random_ids(python_tok):
    t = python_tok
    rnd = random.Random(3)
    for _ in range(300):
        ids = [rnd.randrange(t.n_vocab) for _ in range(rnd.randint(0, 12))]
        for skip in (False, True):
            stream = tok.StreamDecoder(t, skip_special=skip)
            out = "".join(stream.push(i) for i in ids) + stream.flush()
            assert out == t.decode(ids, skip_special=skip)


def test_errors():
    with pytest.raises(FormatError, match="tokenizer.ggml.model is 'llama'"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(FormatError, match="tokenizer.ggml.pre is 'gpt-4o'"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.pre": "gpt-4o"}))
    md = _metadata()
    del md["tokenizer.ggml.tokens"]
    with pytest.raises(FormatError, match="no tokenizer.ggml.tokens"):
        tok.Tokenizer(md)
    with pytest.raises(FormatError, match="no tokenizer.ggml.merges"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.merges": []}))
    with pytest.raises(FormatError, match="merge 0 'Ġ zq' names 'zq'"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.merges": ["Ġ zq"]}))
    with pytest.raises(FormatError, match="names 'qz'"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.merges": ["q z"]}))
    with pytest.raises(FormatError, match="not two tokens"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.merges": ["abc"]}))
    with pytest.raises(FormatError, match="token_type has 3 entries"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.token_type": [1, 1, 1]}))
    with pytest.raises(FormatError, match="eos_token_id is 5000, outside"):
        tok.Tokenizer(_metadata(**{"tokenizer.ggml.eos_token_id": 5000}))
    md = _metadata()
    md["tokenizer.ggml.tokens"] = ["x"] + md["tokenizer.ggml.tokens"][1:]
    with pytest.raises(FormatError, match="byte token of 0x21"):
        tok.Tokenizer(md)
    with pytest.raises(ValueError, match="backend is 'rust'"):
        tok.Tokenizer(_metadata(), backend="rust")
    t = tok.Tokenizer(_metadata(), backend="python")
    for bad in (N_VOCAB + 2, -1):
        with pytest.raises(FormatError, match=f"token id {bad} is outside the vocabulary of 1026"):
            t.decode([5, bad])
        with pytest.raises(FormatError, match="outside"):
            tok.StreamDecoder(t).push(bad)
    with pytest.raises(TypeError):
        t.encode(b"bytes")
    with pytest.raises(TypeError):
        t.decode([1.0])
    with pytest.raises(ValueError, match="lone surrogate at index 1"):
        t.encode("a\ud800b")

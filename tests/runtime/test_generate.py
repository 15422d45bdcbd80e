"""Generation on the CPU (pyq2.runtime.generate over pyq2.runtime.cpu_model) on the demo model,
and `pyq2 generate` as a command: deterministic greedy text, stop conditions, batches,
the chat template, and every refusal (another architecture, a prompt longer than the context,
an empty prompt, an unknown token id, a GPU asked for where there is none, Ctrl-C)."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pyq2.errors import FormatError
from pyq2.gguf import io as gguf_io
from pyq2.offline.demo import write_demo_model
from pyq2.runtime.cpu_model import CpuModel
from pyq2.runtime.generate import Options, Timings, check_prompts, encode_prompts, generate
from pyq2.runtime.open_model import open_model, read_metadata
from pyq2.spec import qwen35
from pyq2.text.sampling import SamplingParams
from pyq2.text.tokenizer import Tokenizer

from ..conftest import run_pyq2, subprocess_env


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    path = write_demo_model(tmp_path_factory.mktemp("gen") / "demo.gguf")
    with gguf_io.open_gguf(path) as gf:
        kv = read_metadata(gf)
        config = qwen35.Config.from_metadata(kv)
        model = CpuModel(gf, config, context=128)
    return path, model, Tokenizer(kv), kv


def run(model, tok, texts, **kw):
    opts = Options(**kw)
    ids = encode_prompts(tok, texts, opts, None)
    return generate(model, tok, ids, opts)


def test_greedy_generation_is_deterministic_and_streams_what_it_returns(cpu):
    _, model, tok, _ = cpu
    streamed: list[str] = []
    opts = Options(max_tokens=12)
    ids = encode_prompts(tok, ["The ship came back"], opts, None)
    seqs = generate(model, tok, ids, opts, on_text=lambda i, s: streamed.append(s))
    again = run(model, tok, ["The ship came back"], max_tokens=12)
    assert seqs[0].tokens == again[0].tokens and len(seqs[0].tokens) == 12
    assert seqs[0].finish == "length"
    assert "".join(streamed) == seqs[0].text == tok.decode(seqs[0].tokens, skip_special=True)


def test_greedy_is_the_argmax_of_the_reference_logits(cpu):
    _, model, tok, _ = cpu
    prompt = tok.encode("Hello world")
    seq = run(model, tok, ["Hello world"], max_tokens=4)[0]
    logits = model.score(prompt + seq.tokens[:-1])
    assert [int(t) for t in np.argmax(logits[len(prompt) - 1 :], axis=1)] == seq.tokens


def test_a_batch_gives_what_each_prompt_gives_alone(cpu):
    _, model, tok, _ = cpu
    texts = ["Hi", "The library on the hill has three floors.", "Where"]
    together = run(model, tok, texts, max_tokens=6)
    alone = [run(model, tok, [t], max_tokens=6)[0] for t in texts]
    assert [s.tokens for s in together] == [s.tokens for s in alone]


def test_prompt_in_chunks_and_token_by_token_give_the_same_logits(cpu):
    _, model, tok, _ = cpu
    ids = tok.encode("The little town by the river wakes up early.")
    whole = model.score(ids)
    for chunk in (1, 3):
        assert np.allclose(model.score(ids, chunk=chunk), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(
    temperature=1.2, top_k=40, repetition_penalty=1.2, seed=3)])  # fmt: skip
def test_a_held_prefix_runs_only_the_rest_and_gives_what_the_whole_prompt_gives(cpu, sampling):
    _, model, tok, _ = cpu
    first = tok.encode("The ship came back")
    a = generate(model, tok, [first], Options(max_tokens=5, sampling=sampling))[0]
    held = (first + a.chosen)[: model.lengths[0]]
    assert len(held) == len(first) + len(a.chosen) - 1  # the last choice is not run
    more = held + tok.encode(" and then the river", add_bos=False)
    t = Timings()
    opts = Options(max_tokens=8, sampling=sampling)
    got = generate(model, tok, [more], opts, timings=t, held=len(held))[0]
    assert model.lengths == [len(more) + len(got.chosen) - 1]
    want = generate(model, tok, [more], opts)[0]
    assert (got.tokens, got.text) == (want.tokens, want.text)
    assert (t.held_tokens, t.prompt_tokens) == (len(held), len(more) - len(held))
    assert t.lines()[1].endswith(f"after {len(held)} held from before")


def test_a_held_prefix_is_refused_where_it_cannot_be(cpu):
    _, model, tok, _ = cpu
    ids = tok.encode("The ship came back")
    generate(model, tok, [ids], Options(max_tokens=2))
    n = model.lengths[0]
    longer = ids + [5, 6]
    with pytest.raises(ValueError, match="one prompt"):
        generate(model, tok, [longer, longer], Options(max_tokens=2), held=n)
    with pytest.raises(ValueError, match="past the prefix"):
        generate(model, tok, [longer[:n]], Options(max_tokens=2), held=n)
    with pytest.raises(ValueError, match="hold"):
        generate(model, tok, [longer], Options(max_tokens=2), held=n - 1)
    with pytest.raises(ValueError, match="context"):
        model.extend([5] * model.context)
    with pytest.raises(ValueError, match="at least one token"):
        model.extend([])


def test_stop_strings_end_the_text_before_them(cpu):
    _, model, tok, _ = cpu
    free = run(model, tok, ["The ship"], max_tokens=16)[0]
    stop = free.text[3:6]
    assert stop and stop in free.text
    cut = run(model, tok, ["The ship"], max_tokens=16, stop=(stop,))[0]
    assert cut.finish == "stop" and cut.text == free.text[: free.text.index(stop)]


def test_sampling_with_a_seed_repeats_and_differs_from_greedy(cpu):
    _, model, tok, _ = cpu
    params = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=7)
    a = run(model, tok, ["Hello"], max_tokens=16, sampling=params)[0]
    b = run(model, tok, ["Hello"], max_tokens=16, sampling=params)[0]
    greedy = run(model, tok, ["Hello"], max_tokens=16)[0]
    assert a.tokens == b.tokens and a.tokens != greedy.tokens


def test_the_end_of_sequence_token_stops_a_sequence(cpu):
    _, model, tok, _ = cpu

    class Eos:
        """The demo model whose sampler picks the end-of-sequence token at the third step."""

        name, n_vocab, context = "stub", model.n_vocab, model.context
        calls = 0

        def prefill(self, prompts):
            return model.prefill(prompts)

        def decode(self, tokens):
            return model.decode(tokens)

        def sample(self, logits, params, history):
            self.calls += 1
            return [tok.eos_ids[0] if self.calls == 3 else 42 for _ in history]

    seq = generate(Eos(), tok, [tok.encode("Hi")], Options(max_tokens=10))[0]
    assert seq.finish == "eos" and seq.tokens == [42, 42]
    assert seq.chosen == [42, 42, tok.eos_ids[0]]  # what the backend was given or chose
    with pytest.raises(ValueError, match="keeps its caches"):  # no extend
        generate(Eos(), tok, [tok.encode("Hi there")], Options(max_tokens=2), held=1)


class Chained:
    """The demo model with decode_sample: each step's input is the previous step's choice
    where the backend keeps it, as the GPU runner chains its steps on the device; counts the
    steps it runs."""

    def __init__(self, model):
        self.model, self.steps = model, 0
        self.name, self.n_vocab, self.context = "chained", model.n_vocab, model.context

    def prefill(self, prompts):
        return self.model.prefill(prompts)

    def decode(self, tokens):
        raise AssertionError("a chained backend's steps go through decode_sample")

    def sample(self, logits, params, history):  # the prompts' next tokens
        self.history = [list(h) for h in history]
        return self._chose(self.model.sample(logits, params, history))

    def _chose(self, tokens):
        self.last = tokens
        for h, t in zip(self.history, tokens, strict=True):
            h.append(t)
        return list(tokens)

    def decode_sample(self, tokens, params):
        self.steps += 1
        feed = self.last if tokens is None else tokens
        chosen = self._chose(self.model.sample(self.model.decode(feed), params, self.history))
        return lambda: chosen


@pytest.mark.parametrize(
    "texts,kw",
    [
        (["The ship came back"], dict(max_tokens=12, ignore_eos=True)),
        (["The ship"], dict(max_tokens=16, stop=("e",))),
        (["Hi", "The library on the hill has three floors.", "Where"], dict(max_tokens=6)),
        (["Hello"], dict(max_tokens=9, sampling=SamplingParams(
            temperature=1.5, top_k=50, top_p=0.95, repetition_penalty=1.3, seed=7))),
    ],
)  # fmt: skip
def test_chained_steps_give_what_steps_in_turn_give(cpu, texts, kw):
    """generate over a backend that chains its steps (the next started before the host reads
    the tokens of the one before) gives the tokens, text and ends of one that does not; it runs
    no step past the last by length, and at most one past an end by a stop string."""
    _, model, tok, _ = cpu
    want = run(model, tok, texts, **kw)
    chained = Chained(model)
    got = run(chained, tok, texts, **kw)
    assert [(s.tokens, s.text, s.finish) for s in got] == [
        (s.tokens, s.text, s.finish) for s in want
    ]
    longest = max(len(s.tokens) + (s.finish == "eos") for s in want)
    spare = any(s.finish in ("eos", "stop") for s in want)
    assert longest - 1 <= chained.steps <= longest - 1 + spare, [s.finish for s in want]


def test_refusals_before_any_work(cpu):
    _, model, tok, _ = cpu
    with pytest.raises(ValueError, match="is empty"):
        encode_prompts(tok, [""], Options(), None)
    with pytest.raises(ValueError, match="the context holds 128"):
        check_prompts([list(range(200))], model.n_vocab, 128, 4)
    with pytest.raises(FormatError, match="token id 5000, outside the vocabulary of 1024"):
        check_prompts([[1, 5000]], model.n_vocab, 128, 4)


def test_chat_prompts_go_through_the_files_template(cpu):
    _, _, tok, kv = cpu
    ids = encode_prompts(tok, ["Hi"], Options(chat=True), kv["tokenizer.chat_template"])[0]
    text = tok.decode(ids)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_timings_are_counted(cpu):
    _, model, tok, _ = cpu
    t = Timings()
    opts = Options(max_tokens=5)
    generate(model, tok, encode_prompts(tok, ["Hi there"], opts, None), opts, timings=t)
    d = t.as_dict()
    assert d["prompt_tokens"] == len(tok.encode("Hi there")) and d["decode_tokens"] == 4
    assert d["prompt_s"] > 0 and d["decode_tokens_per_s"] > 0 and not d["interrupted"]
    assert d["decode_graphs"] == 0 and not any("graphs" in line for line in t.lines())


class Warming:
    """The CPU model with a backend's warm(): it counts what it is asked for."""

    def __init__(self, model):
        self.model, self.asked = model, []
        self.name, self.n_vocab, self.context = model.name, model.n_vocab, model.context

    def __getattr__(self, name):
        return getattr(self.model, name)

    def warm(self, steps, params):
        self.asked.append(steps)
        return 2


def test_decode_graphs_are_captured_before_the_decode_steps_and_timed_apart(cpu):
    _, model, tok, _ = cpu
    t, backend = Timings(load_s=1.5), Warming(model)
    opts = Options(max_tokens=5)
    generate(backend, tok, encode_prompts(tok, ["Hi there"], opts, None), opts, timings=t)
    assert backend.asked == [4] and t.graphs == 2 and t.as_dict()["load_s"] == 1.5
    assert "load: 1.5 s" in t.lines() and "decode graphs: 2 captured in" in t.lines()[-1]


def test_decode_spans_double_up_to_the_context():
    from pyq2.runtime.gpu_model import SPAN_STEP, _span

    assert [_span(n, 4096) for n in (0, SPAN_STEP - 1, SPAN_STEP, 1000, 2047, 2048)] == [
        SPAN_STEP, SPAN_STEP, 2 * SPAN_STEP, 1024, 2048, 4096,
    ]  # fmt: skip
    assert _span(299, 300) == 300 and _span(5000, 4096) == 4096 and _span(10, 100) == 100


# ---- the command --------------------------------------------------------------------------


def test_generate_command_streams_text_and_prints_timings(cpu):
    path = cpu[0]
    p = run_pyq2("generate", str(path), "-p", "The ship came back", "-n", "8", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    want = run(cpu[1], cpu[2], ["The ship came back"], max_tokens=8)[0].text
    assert p.stdout == want + "\n"
    assert "decode: 7 tokens" in p.stderr and "time to first token" in p.stderr


def test_generate_command_json_and_a_batch_file(cpu, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n\nThe ship\n")
    p = run_pyq2("generate", str(cpu[0]), "-f", str(prompts), "-n", "4", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["prompt"] for r in out["results"]] == ["Hello", "The ship"]
    assert all(r["tokens"] == 4 and r["finish"] == "length" for r in out["results"])
    assert out["timings"]["backend"].startswith("cpu")


@pytest.mark.parametrize(
    "args,message",
    [
        (["-p", ""], "the prompt is empty"),
        (["-p", "x " * 300, "--ctx", "64"], "the context holds 64"),
        (["-p", "hi", "--ctx", "100000"], "more than the model's context_length"),
        (["-p", "hi", "--temp", "-1"], "temperature must be >= 0"),
    ],
)
def test_generate_command_refusals_are_one_line(cpu, args, message):
    p = run_pyq2("generate", str(cpu[0]), *args, "--device", "cpu")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


def test_generate_refuses_another_architecture(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "llama.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    p = run_pyq2("generate", str(path), "-p", "hi")
    assert p.returncode == 1 and "pyq2 generate runs qwen35 models" in p.stderr, p.stderr


def test_generate_on_the_gpu_without_one_says_why(cpu):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    p = run_pyq2("generate", str(cpu[0]), "-p", "hi", "--device", "gpu")
    assert p.returncode == 1 and "--device gpu:" in p.stderr, p.stderr


def test_ctrl_c_stops_cleanly_with_the_timings_so_far(cpu):
    cmd = [sys.executable, "-m", "pyq2", "generate", str(cpu[0]), "-p", "The", "-n", "4000"]
    cmd += ["--ignore-eos"]
    proc = subprocess.Popen(
        [*cmd, "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    time.sleep(4)  # started and generating (the demo decodes some 200 tokens a second)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err and "decode:" in err, err


def test_open_model_picks_the_cpu_where_there_is_no_gpu(cpu):
    m = open_model(str(cpu[0]), device="auto", context=64)
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    assert m.device == "cpu" and m.backend.context == 64


def test_the_demo_ends_by_generating_and_says_where(tmp_path):
    p = run_pyq2("demo", "-o", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("generate ("))
    where = "gpu" if "generate (gpu" in lines[at] else "cpu"
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    assert where == ("gpu" if has_gpu else "cpu"), lines[at]
    assert lines[at + 1].startswith("  'The ship came back' -> ") and "tokens/s" in lines[at + 2]

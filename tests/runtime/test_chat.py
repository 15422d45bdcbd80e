"""`pyq2 chat` on the demo model on the CPU (pyq2.runtime.conversation): the conversation's prompt
through the chat template with its history, turns dropped to fit the context, /reset and /exit,
a reply stopped by Ctrl-C, and the command end to end (the first reply is generate --chat's)."""

import signal

import pytest

from pyq2 import interrupts
from pyq2.errors import Interrupted, terminal_text
from pyq2.offline.demo import write_demo_model
from pyq2.runtime import conversation
from pyq2.runtime.conversation import Conversation, chat_loop
from pyq2.runtime.generate import Options
from pyq2.runtime.open_model import open_model
from pyq2.text.chat import render_chat

from ..conftest import run_pyq2


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("chat") / "demo.gguf")


@pytest.fixture(scope="module")
def model(demo):
    return open_model(demo, device="cpu", context=256)


def test_a_turn_renders_the_system_message_and_the_history_through_the_template(model):
    conv = Conversation(model.tokenizer, model.chat_template, 256, 8, system="Be brief.")
    ids, dropped = conv.prompt("The ship came back")
    want = render_chat(model.chat_template, [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "The ship came back"},
    ])  # fmt: skip
    assert ids == model.tokenizer.encode(want) and dropped == 0
    conv.reply("The ship came back", "in the spring")
    ids, _ = conv.prompt("And then?")
    text = model.tokenizer.decode(ids)
    assert "Be brief." in text and "in the spring" in text and text.rstrip().endswith("assistant")
    conv.reset()
    assert conv.prompt("And then?")[0] == model.tokenizer.encode(render_chat(
        model.chat_template, [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "And then?"}]))  # fmt: skip


def test_the_oldest_turns_are_dropped_to_leave_room_for_a_reply(model):
    conv = Conversation(model.tokenizer, model.chat_template, 160, 16)  # a turn: 38 tokens
    for i in range(6):
        conv.reply(f"message {i} about the river and the town", f"reply {i} about the hills")
    ids, dropped = conv.prompt("last")
    assert dropped == 3 and len(ids) <= 160 - 16
    assert len(conv.turns) == 6 - dropped
    assert conv.turns[-1][0] == "message 5 about the river and the town"  # the newest stay


def test_a_message_too_long_alone_is_refused_and_the_conversation_kept(model):
    conv = Conversation(model.tokenizer, model.chat_template, 32, 8)
    conv.reply("hi", "hello")
    with pytest.raises(ValueError, match="context holds 32"):
        conv.prompt("the river " * 40)
    assert conv.turns == [("hi", "hello")]


def test_a_turn_continues_from_the_held_tokens_when_the_rendering_starts_with_their_text(model):
    tk = model.tokenizer
    conv = Conversation(tk, model.chat_template, 256, 8)
    assert conv.continued("And then?") is None  # nothing held yet
    ids, _ = conv.prompt("The ship came back")
    conv.held = ids + tk.encode("in the spring", add_bos=False)  # a turn's prompt and choices
    conv.reply("The ship came back", "in the spring")
    got = conv.continued("And then?")
    assert got is not None and got[: len(conv.held)] == conv.held
    assert tk.decode(got) == conv._text(conv.turns, "And then?")  # the rest: the template's
    conv.turns[-1] = ("The ship came back", "in the autumn")  # not the text the model holds
    assert conv.continued("And then?") is None
    tight = Conversation(tk, model.chat_template, len(got) + 7, 8)  # no room for a reply
    tight.held, tight.turns = conv.held, [("The ship came back", "in the spring")]
    assert tight.continued("And then?") is None


def test_held_tokens_that_end_inside_a_character_are_not_continued(model):
    """Compared as bytes: held tokens ending inside a character (the model's last byte token
    not run) decode to U+FFFD as a reply's text may; the rest would start inside it."""
    tk = model.tokenizer
    char = tk.encode("\u4f60", add_bos=False)  # one character, three bytes
    conv = Conversation(tk, model.chat_template, 256, 8)
    ids, _ = conv.prompt("The ship came back")
    conv.held = ids + char[:-1]
    for reply in ("\u4f60", "\ufffd"):
        conv.turns = [("The ship came back", reply)]
        assert conv.continued("And then?") is None
    conv.held = ids + char
    conv.turns = [("The ship came back", "\u4f60")]
    assert conv.continued("And then?") is not None


SHORT = Options(max_tokens=6)


def run_loop(model, lines):
    out, notes = [], []
    feed = iter(lines)
    status = chat_loop(model, SHORT, lambda: next(feed, None), out.append, notes.append)
    return status, "".join(out), notes


def test_later_turns_run_only_their_own_tokens_and_reply_as_from_an_empty_cache(model, monkeypatch):
    """With the CPU backend (extend) each later turn runs its own tokens after those the last
    turn left (its prompt and the model's choices, not the reply re-encoded), and replies what
    the same ids give from an empty cache."""
    real, runs = conversation.generate, []

    def recording(backend, tokenizer, prompts, options, on_text=None, timings=None, held=0):
        gens = real(backend, tokenizer, prompts, options, on_text, timings, held)
        runs.append((list(prompts[0]), held, gens[0]))
        return gens

    monkeypatch.setattr(conversation, "generate", recording)
    status, out, notes = run_loop(model, ["The ship came back", "And then?", "Where to?"])
    assert status == 0 and [h > 0 for _, h, _ in runs] == [False, True, True]
    for (ids0, _, g0), (ids1, held, _) in zip(runs, runs[1:], strict=False):
        assert ids1[:held] == (ids0 + g0.chosen)[:held] and held >= len(ids0)
    assert sum("held from before" in n for n in notes) == 2
    for ids, _, g in runs[1:]:
        assert real(model.backend, model.tokenizer, [ids], SHORT)[0].tokens == g.tokens


def test_a_later_turn_that_cannot_be_encoded_is_an_error_and_the_chat_goes_on(model):
    status, out, notes = run_loop(model, ["The ship came back", "bad \udcff", "And then?"])
    assert status == 0 and out.count("\n") == 2
    assert any(n.startswith("error:") and "surrogate" in n for n in notes)


def test_a_chat_of_no_tokens_a_reply_runs_nothing(model):
    out, notes, feed = [], [], iter(["The ship came back", "And then?"])
    status = chat_loop(model, Options(max_tokens=0), lambda: next(feed, None), out.append,
                       notes.append)  # fmt: skip
    assert status == 0 and "".join(out) == "\n\n"


def test_reset_starts_again_and_exit_ends_before_the_rest(model):
    status, out, notes = run_loop(
        model, ["The ship came back", "", "/reset", "The ship came back", "/exit", "never read"]
    )
    first, second = out.split("\n")[:2]
    assert status == 0 and first == second and first  # greedy: the same reply after /reset
    assert "the conversation starts again" in notes
    assert sum("tokens/s" in n for n in notes) == 2  # two replies, each with its timings


def test_ctrl_c_stops_a_reply_keeps_its_text_and_the_conversation_goes_on(model, monkeypatch):
    real = conversation.generate
    calls = []

    def interrupted_once(backend, tokenizer, prompts, options, on_text=None, timings=None, held=0):
        calls.append(prompts[0])
        if len(calls) == 1:
            on_text(0, "half a rep")
            raise Interrupted(signal.SIGINT)
        return real(backend, tokenizer, prompts, options, on_text, timings, held)

    monkeypatch.setattr(conversation, "generate", interrupted_once)
    status, out, notes = run_loop(model, ["The ship came back", "And then?"])
    assert status == 0 and out.startswith("half a rep\n")
    assert any("stopped (Ctrl-C)" in n for n in notes)
    assert "half a rep" in model.tokenizer.decode(calls[1])  # the partial reply is history
    assert interrupts.caught() is None  # the next Ctrl-C raises again


def test_any_other_signal_during_a_reply_ends_the_chat(model, monkeypatch):
    def terminated(*a, **k):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(conversation, "generate", terminated)
    with pytest.raises(Interrupted):
        run_loop(model, ["The ship came back"])


def test_the_command_replies_as_generate_chat_does_and_ends_at_the_end_of_input(demo):
    want = run_pyq2("generate", demo, "--device", "cpu", "-n", "8", "--chat", "-p",
                    "The ship came back", timeout=120)  # fmt: skip
    assert want.returncode == 0, want.stderr
    p = run_pyq2("chat", demo, "--device", "cpu", "-n", "8",
                 input="The ship came back\nAnd then?\n", timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[0] == want.stdout.split("\n")[0]
    assert p.stdout.count("\n") == 2 and "tokens/s" in p.stderr and "/reset" in p.stderr


def test_bad_options_are_usage_errors(demo):
    p = run_pyq2("chat", demo, "--device", "cpu", "-n", "0", input="", timeout=60)
    assert p.returncode == 2 and "-n 0" in p.stderr


def test_text_for_a_terminal_keeps_its_layout_and_loses_its_escapes():
    assert terminal_text("a\tb\nc") == "a\tb\nc"
    assert terminal_text("red \x1b[31mtext\x07") == "red \\x1b[31mtext\\x07"
    assert terminal_text("\u202eevil") == "\\u202eevil"

"""`pyq2 chat`: a conversation with a model, one reply per line the user types.

Each turn renders the whole conversation (the system message, the earlier turns, the new user
message) through the file's chat template and runs it with pyq2.runtime.generate; the reply is
streamed and joins the conversation. Where the backend keeps its caches between generations
(extend), the tokens its sequence holds after a turn (that turn's prompt and the tokens the
model chose) stay, and the next turn runs only the template's text past them, encoded alone, as
llama.cpp's conversation mode does: a turn's time to first token then follows its own message,
not the conversation's length, and the model sees its own tokens, not the reply re-encoded.
That needs the rendered conversation to start with the held tokens' text; otherwise (a
template that rewrites earlier turns, a reply cut at a stop string or by Ctrl-C, turns dropped
to fit the context, another backend) the whole conversation is encoded and runs again. When the
conversation and a reply of max_tokens no longer fit the context, the oldest turns are dropped
(the system message stays); a message too long on its own is refused and the conversation
stays as it was.

chat_loop reads lines until the end of the input or `/exit`; `/reset` starts the conversation
again. Ctrl-C during a reply stops that reply (the text so far is kept as the reply) and the
conversation goes on; Ctrl-C while waiting for a line, or any other signal, ends it
(pyq2.interrupts).
"""

from __future__ import annotations

import codecs
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import interrupts
from ..errors import Interrupted
from ..text.chat import render_chat
from ..text.tokenizer import Tokenizer
from .generate import Options, Timings, generate


class Conversation:
    """The messages of a conversation and the prompt of its next turn."""

    def __init__(self, tokenizer: Tokenizer, template: str | None, context: int,
                 max_tokens: int, system: str | None = None):  # fmt: skip
        self.tokenizer, self.template, self.context = tokenizer, template, context
        self.max_tokens, self.system = max_tokens, system
        self.turns: list[tuple[str, str]] = []  # (user, assistant)
        self.held: list[int] = []  # the tokens the backend's sequence holds after the last turn

    def reset(self) -> None:
        self.turns.clear()
        self.held = []

    def continued(self, user: str) -> list[int] | None:
        """The token ids of the turn that says `user` from the held tokens: those, then the
        rendered conversation's text past theirs, encoded alone; None when the rendering does
        not start with their text, adds nothing to it or does not leave room for a reply, and
        when the held tokens end inside a character (its last bytes not run: their text would
        end in a U+FFFD that a complete character of the reply stands for). ValueError as
        prompt() for text it cannot encode."""
        if not self.held:
            return None
        tk = self.tokenizer
        lead = len(tk.encode("", add_bos=None))  # a beginning-of-sequence token the text lacks
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        past = decoder.decode(b"".join(tk.token_bytes(t) for t in self.held[lead:]))
        if decoder.getstate()[0]:  # bytes of an unfinished character
            return None
        text = self._text(self.turns, user)
        if not text.startswith(past):
            return None
        rest = text[len(past) :]
        ids = self.held + tk.encode(rest, add_bos=False)
        room = self.context - min(self.max_tokens, self.context // 2)
        return ids if len(self.held) < len(ids) <= room else None

    def _ids(self, turns: list[tuple[str, str]], user: str) -> list[int]:
        return self.tokenizer.encode(self._text(turns, user))

    def _text(self, turns: list[tuple[str, str]], user: str) -> str:
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        for u, a in turns:
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": user})
        return render_chat(self.template, messages, True)

    def prompt(self, user: str) -> tuple[list[int], int]:
        """The token ids of the turn that says `user`, and how many of the oldest turns were
        dropped to leave room for a reply of max_tokens. ValueError when the message does not fit
        with an empty history (the conversation is then unchanged)."""
        room = self.context - min(self.max_tokens, self.context // 2)
        for dropped in range(len(self.turns) + 1):
            ids = self._ids(self.turns[dropped:], user)
            if len(ids) <= room:
                del self.turns[:dropped]
                return ids, dropped
        raise ValueError(
            f"this message makes a prompt of {len(ids)} tokens, and the context holds "
            f"{self.context} with room for a reply: shorten it or give a larger --ctx"
        )

    def reply(self, user: str, text: str) -> None:
        self.turns.append((user, text))


def chat_loop(
    model: Any,
    options: Options,
    read_line: Callable[[], str | None],
    write: Callable[[str], None],
    note: Callable[[str], None],
) -> int:
    """Run the conversation (module docstring) with `model` (pyq2.runtime.open_model.OpenModel):
    read_line() gives the next line (None at the end of the input), write(text) shows the reply
    as it comes, note(line) gets the one-line messages (turns dropped, timings, errors). Returns
    the exit status: 0."""
    backend = model.backend
    conv = Conversation(model.tokenizer, model.chat_template, backend.context,
                        options.max_tokens, options.system)  # fmt: skip
    keeps = getattr(backend, "extend", None) is not None  # the caches outlive a generation
    opts = replace(options, chat=False, system=None)  # the conversation renders its own prompt
    shown: list[str] = []  # the reply's text so far

    def on_text(i: int, piece: str) -> None:
        shown.append(piece)
        write(piece)

    while True:
        line = read_line()
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            conv.reset()
            note("the conversation starts again")
            continue
        dropped = 0
        try:
            ids = conv.continued(text) if keeps else None
            held = len(conv.held) if ids is not None else 0
            if ids is None:
                ids, dropped = conv.prompt(text)
        except ValueError as e:
            note(f"error: {e}")
            continue
        if dropped:
            note(
                f"dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the context"
            )
        shown.clear()
        timings = Timings()
        conv.held = []  # until this turn's generation ends
        try:
            gen = generate(backend, model.tokenizer, [ids], opts, on_text, timings, held)[0]
            reply = gen.text
            if keeps and gen.chosen:  # the prompt ran (not with max_tokens 0)
                conv.held = (ids + gen.chosen)[: backend.lengths[0]]
        except KeyboardInterrupt as e:
            if isinstance(e, Interrupted) and e.signum != signal.SIGINT:
                raise
            interrupts.resume()
            reply = "".join(shown)
            write("\n")
            note("stopped (Ctrl-C); the text so far is the reply")
        else:
            write("\n")
        conv.reply(text, reply)
        d = timings.as_dict()
        held_text = f" ({held} held from before)" if held else ""
        note(
            f"{d['decode_tokens_per_s']:.1f} tokens/s, first token after "
            f"{d['time_to_first_token_s'] * 1e3:.0f} ms, a prompt of {d['prompt_tokens']} "
            f"tokens{held_text}"
        )

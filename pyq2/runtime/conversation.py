"""`pyq2 chat`: a conversation with a model, one reply per line the user types.

Each turn renders the whole conversation (the system message, the earlier turns, the new user
message) through the file's chat template and runs it as a new prompt with
pyq2.runtime.generate; the reply is streamed and joins the conversation. The caches are not kept
between turns, so a turn's time to first token grows with the conversation. When the
conversation and a reply of max_tokens no longer fit the context, the oldest turns are dropped
(the system message stays); a message too long on its own is refused and the conversation
stays as it was.

chat_loop reads lines until the end of the input or `/exit`; `/reset` starts the conversation
again. Ctrl-C during a reply stops that reply (the text so far is kept as the reply) and the
conversation goes on; Ctrl-C while waiting for a line, or any other signal, ends it
(pyq2.interrupts).
"""

from __future__ import annotations

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

    def reset(self) -> None:
        self.turns.clear()

    def _ids(self, turns: list[tuple[str, str]], user: str) -> list[int]:
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        for u, a in turns:
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": user})
        return self.tokenizer.encode(render_chat(self.template, messages, True))

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
    conv = Conversation(model.tokenizer, model.chat_template, model.backend.context,
                        options.max_tokens, options.system)  # fmt: skip
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
        try:
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
        try:
            reply = generate(model.backend, model.tokenizer, [ids], opts, on_text, timings)[0].text
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
        note(
            f"{d['decode_tokens_per_s']:.1f} tokens/s, first token after "
            f"{d['time_to_first_token_s'] * 1e3:.0f} ms, a prompt of {d['prompt_tokens']} tokens"
        )

"""Chat messages -> prompt text, with the file's `tokenizer.chat_template` or a built-in ChatML.

A template is rendered the way transformers' `apply_chat_template` does it: jinja2's
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
`tojson` filter that does not escape HTML, and the globals `raise_exception` and `strftime_now`.
Without a template the messages are written as ChatML, what Qwen's templates produce for plain
text messages:

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

MIN_JINJA2 = (3, 1, 6)  # older versions have known sandbox escapes (transformers requires it too)


class ChatTemplateError(ValueError):
    """The chat template does not compile, or raised an error (raise_exception) while rendering."""


def _message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise ValueError(f"{where} has a part that is not text: {part!r}")
            parts.append(_message_text(part.get("text"), where))
        return "".join(parts)
    raise ValueError(f"{where} content is {type(content).__name__}, not a string")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        raise ValueError(f"messages is {type(messages).__name__}, not a list of dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} is {type(message).__name__}, not a dict")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise ValueError(f"message {i} has no 'role' string")


def render_chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The built-in ChatML rendering (for files that carry no chat template)."""
    _check_messages(messages)
    out = []
    for i, message in enumerate(messages):
        text = _message_text(message.get("content", ""), f"message {i}")
        out.append(f"<|im_start|>{message['role']}\n{text}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _jinja2() -> Any:
    try:
        import jinja2
    except ImportError:
        raise ImportError(
            "this model's chat template needs jinja2: pip install jinja2 "
            "(or pass template=None for plain ChatML)"
        ) from None
    version = tuple(int(x) for x in jinja2.__version__.split(".")[:3] if x.isdigit())
    if version < MIN_JINJA2:
        raise ImportError(
            f"jinja2 {jinja2.__version__} is too old to render chat templates safely; "
            "pip install -U 'jinja2>=3.1.6'"
        )
    return jinja2


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    jinja2 = _jinja2()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant marks): kept as is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e} (line {e.lineno})") from e


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """The prompt text of messages: the jinja chat template when there is one, else ChatML.

    extra goes to the template as variables (tools, enable_thinking, bos_token, ...); the built-in
    ChatML ignores it.
    """
    if template is None:
        return render_chatml(messages, add_generation_prompt)
    if not isinstance(template, str):
        raise TypeError(f"template is {type(template).__name__}, not a str")
    _check_messages(messages)
    compiled = _compile(template)
    jinja2 = _jinja2()
    try:
        return str(
            compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
        )
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from e

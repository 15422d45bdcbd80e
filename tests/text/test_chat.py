"""pyq2.text.chat: chat templates (jinja2, as transformers renders them) and the built-in ChatML."""

import builtins

import pytest

from pyq2.text import chat
from pyq2.text import demo_vocab as demo

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!\nHow are you?"},
    {"role": "assistant", "content": "Fine."},
    {"role": "user", "content": "Tell me a joke."},
]
EXPECTED = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi!\nHow are you?<|im_end|>\n"
    "<|im_start|>assistant\nFine.<|im_end|>\n"
    "<|im_start|>user\nTell me a joke.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# A Qwen-style template: whitespace control, namespace, tojson, raise_exception, tools.
QWEN_LIKE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}
    {{- '\\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(seen_user=false) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.seen_user = true %}{%- endif %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
    {%- if not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if not ns.seen_user %}{{- raise_exception('no user message') }}{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def test_builtin_chatml():
    assert chat.render_chat(None, MESSAGES) == EXPECTED
    assert (
        chat.render_chat(None, MESSAGES, add_generation_prompt=False)
        == EXPECTED[: -len("<|im_start|>assistant\n")]
    )
    parts = [{"type": "text", "text": "Hi!\n"}, {"type": "text", "text": "How are you?"}]
    messages = [MESSAGES[0], {"role": "user", "content": parts}, *MESSAGES[2:]]
    assert chat.render_chat(None, messages) == EXPECTED
    assert chat.render_chat(None, []) == "<|im_start|>assistant\n"


def test_demo_template_equals_builtin_chatml():
    pytest.importorskip("jinja2")
    template = demo.demo_tokenizer_metadata(300)["tokenizer.chat_template"]
    assert chat.render_chat(template, MESSAGES) == EXPECTED
    assert chat.render_chat(template, MESSAGES, add_generation_prompt=False) == chat.render_chatml(
        MESSAGES, add_generation_prompt=False
    )


def test_qwen_like_template():
    pytest.importorskip("jinja2")
    assert chat.render_chat(QWEN_LIKE, MESSAGES) == EXPECTED
    out = chat.render_chat(QWEN_LIKE, MESSAGES, enable_thinking=False)
    assert out == EXPECTED + "<think>\n\n</think>\n\n"
    tools = [{"name": "wéather", "parameters": {"city": "<str>"}}]
    out = chat.render_chat(QWEN_LIKE, MESSAGES[1:], tools=tools)
    # tojson as transformers defines it: no HTML escaping, no ASCII escaping.
    assert out.startswith(
        '<|im_start|>system\n# Tools\n<tools>\n{"name": "wéather", "parameters": {"city": "<str>"}}'
        "\n</tools><|im_end|>\n<|im_start|>user\n"
    )


def test_trim_and_lstrip_blocks():
    pytest.importorskip("jinja2")
    template = "{% for m in messages %}\n    {% if m.role %}\n[{{ m.role }}]\n"
    template += "    {% endif %}\n{% endfor %}"
    assert chat.render_chat(template, MESSAGES[:2]) == "[system]\n[user]\n"


def test_template_errors():
    pytest.importorskip("jinja2")
    with pytest.raises(chat.ChatTemplateError, match="unknown role tool"):
        chat.render_chat(
            QWEN_LIKE, [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]
        )
    with pytest.raises(chat.ChatTemplateError, match="no user message"):
        chat.render_chat(QWEN_LIKE, [{"role": "system", "content": "x"}])
    with pytest.raises(chat.ChatTemplateError, match="does not compile"):
        chat.render_chat("{% for m in messages %}", MESSAGES)
    with pytest.raises(chat.ChatTemplateError):  # the sandbox refuses attribute escapes
        chat.render_chat("{{ messages.__class__.__mro__ }}", MESSAGES)
    assert issubclass(chat.ChatTemplateError, ValueError)


def test_bad_messages():
    for bad in ("text", [1], [{"content": "x"}], [{"role": "", "content": "x"}]):
        with pytest.raises(ValueError):
            chat.render_chat(None, bad)
    with pytest.raises(ValueError, match="not text"):
        chat.render_chat(None, [{"role": "user", "content": [{"type": "image"}]}])
    with pytest.raises(ValueError, match="not a string"):
        chat.render_chat(None, [{"role": "user", "content": 3}])


def test_missing_jinja2_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_jinja(name, *args, **kwargs):
        if name == "jinja2" or name.startswith("jinja2."):
            raise ImportError("No module named 'jinja2'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jinja)
    chat._compile.cache_clear()
    with pytest.raises(ImportError, match="pip install jinja2"):
        chat.render_chat("{{ messages }} unseen before", MESSAGES)
    assert chat.render_chat(None, MESSAGES) == EXPECTED  # ChatML needs no jinja2


def test_transformers_renders_the_same():
    pytest.importorskip("transformers")
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        pytest.skip("this transformers has no _compile_jinja_template")
    tools = [{"name": "f", "description": "a & b <c>", "parameters": {"x": "ü"}}]
    for kwargs in ({}, {"enable_thinking": False}, {"tools": tools}):
        expected = _compile_jinja_template(QWEN_LIKE).render(
            messages=MESSAGES, add_generation_prompt=True, **kwargs
        )
        assert chat.render_chat(QWEN_LIKE, MESSAGES, **kwargs) == expected

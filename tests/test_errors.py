"""The helpers every message about a file goes through (pyq2.errors): escaped, shown_path,
quoted."""

import subprocess

from pyq2.errors import escaped, quoted, shown_path


def test_escaped_leaves_printable_text_and_escapes_what_a_terminal_acts_on():
    assert escaped("plain text, é, 日本") == "plain text, é, 日本"
    assert escaped("a\x1b[2Jb\x07\r\n\t\x7f\x9b") == "a\\x1b[2Jb\\x07\\r\\n\\t\\x7f\\x9b"
    assert escaped("\u202eevil\u2066\u200b\ufeff") == "\\u202eevil\\u2066\\u200b\\ufeff"
    assert escaped(escaped("a\x1bb")) == escaped("a\x1bb")  # escaping twice changes nothing
    assert escaped("x" * 50, limit=10) == "x" * 10 + "... (50 chars)"


def test_shown_path_is_what_a_shell_reads_back():
    assert shown_path("/tmp/plain name.gguf") == "/tmp/plain name.gguf"
    odd = "/tmp/a\nb'c\\d\x1b.gguf"
    shown = shown_path(odd)
    assert shown == "$'/tmp/a\\nb\\'c\\\\d\\x1b.gguf'" and "\n" not in shown
    back = subprocess.run(["bash", "-c", f"printf %s {shown}"], capture_output=True, text=True)
    assert back.stdout == odd
    assert shown_path(b"/tmp/x\xff") == "$'/tmp/x\\xff'"  # as a shell writes that byte


def test_quoted_cuts_a_huge_value_without_building_it():
    assert quoted("abc") == "'abc'" and quoted(2) == "2" and quoted([1, 2]) == "[1, 2]"
    big = list(range(10_000_000))
    text = quoted(big)
    assert text == "[0, 1, 2, 3, 4, 5, 6, 7, ... (10000000 items)]"
    assert len(quoted("y" * 10**6)) < 120 and quoted("a\x1bb") == "'a\\x1bb'"
    assert len(quoted([["x" * 1000] * 100] * 100)) < 500

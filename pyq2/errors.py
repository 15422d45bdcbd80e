"""Exceptions of pyq2. Library failures carry the C status and the library's own message."""

import os
import stat

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is (from its st_mode), for a message."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


class Pq2Error(Exception):
    """A libpq2 call returned a non-zero status; the message is pq2_last_error()."""

    def __init__(self, status_name: str, message: str, status: int = -1):
        super().__init__(f"{status_name}: {message}" if message else status_name)
        self.status = status
        self.status_name = status_name
        self.message = message


class LibraryError(Pq2Error):
    """libpq2 could not be found, loaded, or is the wrong ABI version."""

    def __init__(self, message: str):
        super().__init__("libpq2 not loaded", message)


class FormatError(ValueError):
    """Malformed input data or file: bad magic, truncated, unknown type, bad shape, bad scale."""


class RepackError(ValueError):
    """A request pyq2 refuses: output equals input, output exists, bad layout, rt or backend."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP, ...) stopped the work; signum says which.

    A KeyboardInterrupt, so every `except KeyboardInterrupt` and `finally` on the way out (the
    removal of a temporary file among them) treats it as Ctrl-C.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ---- text from outside in a message ------------------------------------------------------------
#
# Everything a file (or a path) says is shown through these helpers before it reaches a terminal:
# `escaped` is the one escaping rule, and the others are built on it.

QUOTE_CHARS = 80  # characters of a value quoted in a message (quoted)
QUOTE_ITEMS = 8  # elements of an array quoted in a message
LINE_CHARS = 2000  # the longest line pyq2 prints about a file (escaped with limit=LINE_CHARS)

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    code = ord(c)
    if c in _ESCAPES:
        return _ESCAPES[c]
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a path that is not UTF-8 (os.fsdecode's escape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escaped(text: str, limit: int | None = None) -> str:
    """text with every character a terminal could act on written as a backslash escape: control
    characters (C0, DEL, C1: escape sequences, line breaks), bidirectional overrides and isolates,
    and every other character that is not printable (str.isprintable: format, separator,
    surrogate, private-use and unassigned characters); a space stays. With `limit`, at most that
    many characters of text are kept (then "... (N chars)"). Printable text is returned as it is,
    so escaping twice changes nothing more."""
    cut = limit is not None and len(text) > limit
    head = text[:limit] if cut else text
    if not head.isprintable():
        head = "".join(c if c.isprintable() else _escape_char(c) for c in head)
    return f"{head}... ({len(text)} chars)" if cut else head


def terminal_text(text: str) -> str:
    """Generated text for a terminal: what `escaped` escapes, except line breaks and tabs, which
    are the text's own layout."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else _escape_char(c) for c in text)


def shown_path(path) -> str:
    """A path for a message: as it is when every character is printable, else quoted as a shell
    (and GNU ls) writes it, $'...' with the escapes of `escaped`, so that it stays on one line,
    does nothing to a terminal and can be pasted back into a shell."""
    p = os.fsdecode(path) if not isinstance(path, str) else path
    if p.isprintable():
        return p
    body = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else c if c.isprintable() else _escape_char(c)
        for c in p
    )
    return f"$'{body}'"


def quoted(value, limit: int = QUOTE_CHARS) -> str:
    """A value read from a file, for a message: its repr (strings quoted, escapes for whatever
    `escaped` escapes), an array as its first QUOTE_ITEMS elements and its length, everything cut
    to about `limit` characters. A huge value costs no more than its first elements."""
    if isinstance(value, (list, tuple)):
        shown = ", ".join(quoted(v, limit) for v in value[:QUOTE_ITEMS])
        more = f", ... ({len(value)} items)" if len(value) > QUOTE_ITEMS else ""
        open_, close = "[]" if isinstance(value, list) else "()"
        text = f"{open_}{shown}{more}{close}"
        return text if len(text) <= limit + 40 else text[:limit] + f"... ({len(value)} items)]"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} chars)"
    if isinstance(value, (bytes, bytearray)) and len(value) > limit:
        return repr(bytes(value[:limit])) + f"... ({len(value)} bytes)"
    return escaped(repr(value), limit)

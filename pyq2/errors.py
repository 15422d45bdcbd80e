"""Exceptions of pyq2. Library failures carry the C status and the library's own message."""

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

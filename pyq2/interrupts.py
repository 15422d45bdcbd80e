"""Signals that stop the `pyq2` command, turned into pyq2.errors.Interrupted.

install() gives every signal whose default action ends the process (SIGHUP, SIGINT, SIGQUIT,
SIGTERM, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU, SIGVTALRM, SIGPROF) a handler that raises Interrupted
in the main thread, so the code holding a temporary file removes it on the way out
(pyq2.atomic). A signal the parent set to be ignored (SIGHUP under nohup, SIGINT of a background
job) stays ignored. Only the first signal raises; later ones are dropped while the cleanup runs.
Steps that must not be cut in half (creating, committing or removing a temporary file) run
inside deferred(): a signal that arrives there is raised when the step ends.

The command then prints `pyq2: error: interrupted (SIGTERM)` and exits with 128 + the signal
number (130 for SIGINT, 143 for SIGTERM), the status a shell reports for a process the signal
itself ended. SIGKILL cannot be caught: pyq2.atomic removes what it leaves on the next run.

Only the standard library and pyq2.errors are imported here: `python -m pyq2` installs the
handlers before the heavy imports (numpy, gguf), so a Ctrl-C during them is one line, not a
traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import Interrupted

_NAMES = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGTERM",
    "SIGALRM",
    "SIGUSR1",
    "SIGUSR2",
    "SIGXCPU",
    "SIGVTALRM",
    "SIGPROF",
)
SIGNALS: tuple[int, ...] = tuple(getattr(signal, n) for n in _NAMES if hasattr(signal, n))

# All state below belongs to the main thread, the only one that runs Python signal handlers.
_previous: dict[int, Any] = {}  # signal -> its handler before install(), while installed
_signum: int | None = None  # the first signal caught
_pending = False  # _signum arrived inside deferred() and is not raised yet
_depth = 0  # nesting of deferred()
_done = False  # finish(): the command is over, signals are dropped


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handle(signum: int, frame: Any) -> None:
    global _signum, _pending
    if _done or _signum is not None:
        return  # already stopping: let the cleanup run to its end
    _signum = signum
    if _depth:
        _pending = True
    else:
        raise Interrupted(signum)


def install() -> bool:
    """Handle every signal of SIGNALS that has its default action now. Returns True when this
    call installed the handlers (the caller then calls uninstall()), False when they were already
    installed or this is not the main thread."""
    global _signum, _pending, _done
    if _previous or not _in_main_thread():
        return False
    _signum, _pending, _done = None, False, False
    for sig in SIGNALS:
        old = signal.getsignal(sig)
        if old is signal.SIG_DFL or old is signal.default_int_handler:
            _previous[sig] = old
            signal.signal(sig, _handle)
    return True


def uninstall() -> None:
    """Give every signal install() took its previous handler back."""
    while _previous:
        sig, old = _previous.popitem()
        signal.signal(sig, old)


def finish() -> None:
    """The command is over: a signal from now on is dropped, the exit status stands."""
    global _done
    _done = True


@contextmanager
def deferred() -> Iterator[None]:
    """Hold off Interrupted for the block: a signal caught inside is raised when it ends. A no-op
    outside the main thread (signals are only handled there)."""
    global _depth, _pending
    if not _in_main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending:
            _pending = False
            assert _signum is not None
            raise Interrupted(_signum)


def resume() -> None:
    """The caught signal was handled and the command goes on (`pyq2 chat` stops a reply on
    Ctrl-C and waits for the next line): the next signal raises again."""
    global _signum, _pending
    _signum, _pending = None, False


def caught() -> int | None:
    """The signal the handlers caught in this run, if any: an exception that follows it (a
    module whose import a signal cut, such as numpy's, raises ImportError instead) is the
    interruption, reported as such."""
    return _signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signum_of(exc: KeyboardInterrupt) -> int:
    """The signal behind an interruption (a plain KeyboardInterrupt counts as SIGINT)."""
    return exc.signum if isinstance(exc, Interrupted) else signal.SIGINT


def report(exc: KeyboardInterrupt, prog: str = "pyq2") -> int:
    """Print the one line for an interruption and return the exit status: 128 + the signal
    number (signum_of)."""
    signum = signum_of(exc)
    try:
        print(f"{prog}: error: interrupted ({signal_name(signum)})", file=sys.stderr, flush=True)
    except OSError:
        pass  # SIGHUP: the terminal may be gone
    return 128 + signum

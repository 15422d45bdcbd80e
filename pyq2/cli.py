"""The `pyq2` command line: repack, info, verify, demo.

Exit status: 0 success, 1 error (one line `pyq2: error: ...` on stderr, no traceback), 2 usage.
Set PYQ2_DEBUG=1 to get the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time

from . import layouts
from .demo import run_demo
from .errors import FormatError, Pq2Error
from .info import describe, format_info
from .repack import repack
from .verify import verify

PROG = "pyq2"


# ------------------------------------------------------------------------------ progress ----


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, stream=None, width: int = 30):
        self.stream, self.width, self.last = stream or sys.stderr, width, 0.0

    def __call__(self, done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        name = name if len(name) <= 40 else "..." + name[-37:]
        self.stream.write(
            f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:5.1f}% "
            f"{done / 1e6:9.1f} MB  {name:<40}"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


# ------------------------------------------------------------------------------ commands ----


def _cmd_repack(args) -> int:
    bar = _Bar() if sys.stderr.isatty() else None
    try:
        summary = repack(
            args.input,
            args.output,
            layout=args.layout,
            rt=args.rt,
            dry_run=args.dry_run,
            force=args.force,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    print(summary.line())
    return 0


def _cmd_info(args) -> int:
    d = describe(args.file)
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        print(format_info(d))
    return 0


def _cmd_verify(args) -> int:
    res = verify(args.original, args.repacked)
    if not res.ok:
        print(f"{PROG}: verify: MISMATCH: {res.message}", file=sys.stderr)
        return 1
    print(f"verify: {res.message}")
    return 0


def _cmd_demo(args) -> int:
    res = run_demo(args.output)
    return 0 if res["verify"].ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="PQ2_0 ternary weights: repack GGUF "
        "files into GPU layouts, inspect and verify them.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser(
        "repack", help="convert the PQ2_0/PTQ1_0/TQ2_0 weights of a GGUF file to a resident layout"
    )
    r.add_argument("input", metavar="IN.gguf")
    r.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output file (default: IN with suffix .pyq2-<layout>.gguf)",
    )
    r.add_argument(
        "--layout",
        choices=layouts.LAYOUT_NAMES,
        default="tiles",
        help="target layout (default: tiles)",
    )
    r.add_argument(
        "--rt",
        type=int,
        choices=layouts.TILE_RTS,
        default=2,
        help="16-row sub-tiles per tile of the tiles layout (default: 2, the fastest "
        "for decode on the H200)",
    )
    r.add_argument(
        "--dry-run", action="store_true", help="check and convert everything, write nothing"
    )
    r.add_argument("--force", action="store_true", help="overwrite an existing OUT")
    r.set_defaults(func=_cmd_repack)

    i = sub.add_parser("info", help="summarise a GGUF file: metadata and tensor table")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=_cmd_info)

    v = sub.add_parser(
        "verify",
        help="prove that two files hold the same weights (codes and "
        "scales) and the same other tensors and metadata",
    )
    v.add_argument("original", metavar="ORIGINAL")
    v.add_argument("repacked", metavar="REPACKED")
    v.set_defaults(func=_cmd_verify)

    d = sub.add_parser("demo", help="generate a small Bonsai-like model, repack, verify, report")
    d.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="directory for the demo files (default: a new temporary directory)",
    )
    d.set_defaults(func=_cmd_demo)
    return p


def _describe_os_error(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return (
            f"no space left on device{f' ({e.filename})' if e.filename else ''}; "
            "nothing was written"
        )
    what = e.strerror or str(e)
    return f"{e.filename}: {what}" if e.filename else what


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # `pyq2 info FILE | head`: the reader left; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted; nothing was written", file=sys.stderr)
        return 1
    except (FormatError, Pq2Error, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: {_describe_os_error(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line unless asked for the traceback
        if os.environ.get("PYQ2_DEBUG"):
            raise
        print(
            f"{PROG}: error: internal error: {type(e).__name__}: {e} "
            f"(PYQ2_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

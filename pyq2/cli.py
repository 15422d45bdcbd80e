"""The `pyq2` command line: generate, repack, info, verify, demo, bench.

Exit status: 0 success, 1 error (one line `pyq2: error: ...` on stderr, no traceback) or a verify
mismatch (`pyq2: verify: MISMATCH: ...`), 2 usage or, for verify, "could not compare" (as cmp),
128 + N when signal N stopped it (130 for Ctrl-C, 143 for SIGTERM; one line `pyq2: error:
interrupted (SIGTERM)`). A stopped repack leaves neither OUT nor a temporary file. Set
PYQ2_DEBUG=1 to get the traceback of an unexpected error.

Every line about a file goes through pyq2.errors.escaped (control characters, bidirectional
overrides and other unprintable characters as backslash escapes; paths quoted as a shell does,
errors.shown_path), so nothing a file holds can act on the terminal or forge a line. What the
command prints on standard output goes out at once (_emit): a full, closed or failing standard
output is one error line and exit 1, saying what was done (a repack's OUT is written); a reader
that left (EPIPE, `pyq2 info FILE | head`) is not an error.

Only light modules are imported here; the commands import the rest after main() has installed
the signal handlers (pyq2.interrupts).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from collections.abc import Sequence

from . import __version__, interrupts
from .errors import (
    LINE_CHARS,
    FormatError,
    Interrupted,
    Pq2Error,
    escaped,
    shown_path,
    terminal_text,
)

PROG = "pyq2"

EPILOG = """\
exit status: 0 success; 1 error (one line "pyq2: error: ...") or verify mismatch ("pyq2: verify:
MISMATCH: ..."); 2 usage error, or verify could not compare (a file missing, unreadable, not
GGUF, malformed or damaged; as cmp); 128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM),
leaving no output and no temporary file. PYQ2_DEBUG=1 shows the traceback of an unexpected error.
"""

REPACK_DESCRIPTION = """\
Convert every PQ2_0, PTQ1_0 and TQ2_0 tensor of IN to a resident layout; copy every other
tensor and all metadata byte for byte.

OUT appears complete or not at all. It is written in a temporary directory next to it,
.OUT.pyq2-PID-XXXX.tmp, and moved into place at the end: without --force OUT must not exist,
neither at the start nor at the end (of two runs racing for one OUT, one fails); with --force
it is replaced, and a symlink stays a link to its file, which is replaced. A directory (or a
name ending in /), device, FIFO or socket is refused, even with --force. A signal removes the
temporary; the next run to OUT removes one that a killed run (SIGKILL) left, and says so.

--fuse writes the sibling projections that read one activation (attention q/k/v, Gated-DeltaNet
qkv and gate, FFN gate and up) as one matrix each, their rows one after another, with metadata
that says how to split it; verify and --layout raw give back the original tensors. A group
whose members differ in K, source type or rotation, or whose members (but the last) are not
whole tiles, stays separate and is named on stderr.

--tp G writes the model's G tensor-parallel shards, one per GPU, as OUT with .tp<G>-<rank>
before .gguf: the projections that read the normed residual stream cut along their output rows
(whole heads), attn_output, ssm_out and ffn_down along their input columns (whole 128-groups and
rotation blocks), the head along its vocabulary rows, everything else whole. The shards appear
together or not at all; verify ORIGINAL SHARD... checks the set. A model whose heads or
rotation blocks do not split G ways is refused, saying which.
"""


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


class StdoutError(Exception):
    """Standard output did not take what the command printed (closed, full, failing)."""


def _drop_stdout() -> None:
    """Point file descriptor 1 at /dev/null: what the buffers still hold goes nowhere, so the
    interpreter's own flush at exit does not fail again (a second message, exit 120)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


def _emit(text: str = "", flush: bool = True) -> None:
    """One line (or lines) on standard output, flushed at once unless not `flush` (then by the
    next flush, at the latest _run's at the end). StdoutError when it is closed or the write
    fails (BrokenPipeError passes: the reader left)."""
    stream = sys.stdout
    if stream is None:
        raise StdoutError("standard output is closed")
    try:
        stream.write(text + "\n")
        if flush:
            stream.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        _drop_stdout()
        raise StdoutError(f"cannot write to standard output: {e.strerror or e}") from None


def _error(message: str) -> None:
    """The one error line on stderr, escaped (pyq2.errors.escaped) and cut to LINE_CHARS."""
    try:
        print(f"{PROG}: error: {escaped(message, LINE_CHARS)}", file=sys.stderr, flush=True)
    except (OSError, AttributeError):
        pass  # no stderr to tell it on: the exit status says it


def _notice(line: str) -> None:
    print(f"{PROG}: {escaped(line, LINE_CHARS)}", file=sys.stderr, flush=True)


def _cmd_generate(args) -> int:
    import json

    from .runtime.generate import Options, Timings, encode_prompts, generate
    from .runtime.open_model import open_model

    if (args.prompt is None) == (args.file is None):
        args.usage_error(
            "give a prompt with -p TEXT or a file of prompts with -f FILE (one a line)"
        )
    if args.file is not None:
        with open(args.file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        if not prompts:
            raise ValueError(f"{args.file} holds no prompt (one prompt a line)")
    else:
        prompts = [args.prompt]
    params = _sampling_params(args, least=0)
    options = Options(args.n, params, tuple(args.stop), args.chat, args.system, args.ignore_eos)
    started = time.perf_counter()
    model = open_model(args.model, device=args.device, context=args.ctx, batch=len(prompts))
    ids = encode_prompts(model.tokenizer, prompts, options, model.chat_template)
    stream = len(prompts) == 1 and not args.json
    timings = Timings(load_s=time.perf_counter() - started)
    shown = _for_stdout()

    def on_text(i: int, text: str) -> None:
        if stream:
            sys.stdout.write(shown(text))
            sys.stdout.flush()

    try:
        seqs = generate(model.backend, model.tokenizer, ids, options, on_text, timings)
    except KeyboardInterrupt:
        if stream:
            sys.stdout.write("\n")
        for line in timings.lines():
            print(f"{PROG}: {line}", file=sys.stderr)
        raise
    if args.json:
        out = {
            "model": args.model,
            "results": [
                {"prompt": p, "text": s.text, "tokens": len(s.tokens), "finish": s.finish}
                for p, s in zip(prompts, seqs, strict=True)
            ],
            "timings": timings.as_dict(),
        }
        print(json.dumps(out, indent=1))
        return 0
    if stream:
        print()
    else:
        for i, s in enumerate(seqs):
            print(f"--- {i + 1}: {shown(prompts[i])}")
            print(shown(s.text))
    for line in timings.lines():
        print(f"{PROG}: {line}", file=sys.stderr)
    return 0


def _sampling_params(args, least: int):
    """The sampling options of generate and chat, checked (-n at least `least`)."""
    from .text.sampling import SamplingParams

    if args.n < least:
        args.usage_error(f"-n {args.n}: the number of tokens to generate is at least {least}")
    if args.ctx is not None and args.ctx < 2:
        args.usage_error(f"--ctx {args.ctx}: the context holds at least 2 tokens")
    return SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repeat_penalty,
        seed=args.seed,
    )


def _for_stdout():
    """How generated text goes to stdout: as it is into a pipe or file, through terminal_text
    into a terminal (no escape sequence of the model's reaches it)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return terminal_text if tty else (lambda text: text)


def _cmd_chat(args) -> int:
    from .runtime.conversation import chat_loop
    from .runtime.generate import Options
    from .runtime.open_model import open_model

    params = _sampling_params(args, least=1)
    options = Options(args.n, params, tuple(args.stop), False, args.system, False)
    model = open_model(args.model, device=args.device, context=args.ctx, batch=1)
    tty_in = sys.stdin.isatty()
    shown = _for_stdout()
    _notice(
        f"chat with {args.model} on {model.backend.name}: a line is a message; /reset starts "
        "again, /exit or the end of the input (Ctrl-D) ends"
    )

    def read_line() -> str | None:
        if tty_in:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        return line if line else None

    def write(text: str) -> None:
        sys.stdout.write(shown(text))
        sys.stdout.flush()

    return chat_loop(model, options, read_line, write, _notice)


def _cmd_repack(args) -> int:
    from .offline.repack import option_error, repack

    if args.output == "":
        args.usage_error("-o/--output: the output path is empty")
    if args.rt is not None and args.layout != "tiles":
        args.usage_error(f"--rt applies to the tiles layout only, not --layout {args.layout}")
    refused = option_error(args.layout, args.fuse, args.tp)
    if refused:
        args.usage_error(refused)
    bar = _Bar() if sys.stderr.isatty() else None
    try:
        summary = repack(
            args.input,
            args.output,
            layout=args.layout,
            dry_run=args.dry_run,
            force=args.force,
            progress=bar,
            notice=_notice,
            fuse=args.fuse,
            tp=args.tp or 0,
            **({} if args.rt is None else {"rt": args.rt}),
        )
    finally:
        if bar is not None:
            bar.close()
    try:
        _emit(summary.line())
    except StdoutError as e:
        if summary.dry_run:
            raise
        done = ", ".join(shown_path(p) for p in summary.shards or [summary.out_path])
        raise StdoutError(f"{e} (the repack itself succeeded: {done} written)") from None
    return 0


def _cmd_info(args) -> int:
    from .offline.info import describe, info_lines, write_json

    d = describe(args.file)
    if args.json:  # strict JSON (no NaN or Infinity), every string JSON-escaped, row by row
        write_json(d, lambda text: _emit(text, flush=False))
    else:
        for line in info_lines(d):
            _emit(line, flush=False)
    return 0


def _cmd_verify(args) -> int:
    from .offline.verify import verify

    try:
        res = verify(args.original, args.repacked)
    except (FormatError, Pq2Error, ValueError, OSError) as e:  # could not compare: 2, as cmp
        _error(_describe_os_error(e) if isinstance(e, OSError) else str(e))
        return 2
    if not res.ok:
        print(f"{PROG}: verify: MISMATCH: {escaped(res.message, LINE_CHARS)}", file=sys.stderr)
        return 1
    _emit(f"verify: {escaped(res.message, LINE_CHARS)}")
    return 0


def _cmd_demo(args) -> int:
    from .offline.demo import run_demo

    res = run_demo(args.output, echo=_emit, keep=args.keep, then=_demo_generate, force=args.force)
    return 0 if res["verify"].ok else 1


DEMO_PROMPT = "The ship came back"


def _demo_generate(res: dict) -> None:
    """The end of `pyq2 demo`: a few greedy tokens from the repacked demo model, on the GPU where
    there is one, else on the CPU, saying which ran."""
    from .runtime.generate import Options, Timings, encode_prompts, generate
    from .runtime.open_model import open_model

    model = open_model(res["repacked"], context=256)
    opts = Options(max_tokens=16)
    ids = encode_prompts(model.tokenizer, [DEMO_PROMPT], opts, None)
    timings = Timings()
    seq = generate(model.backend, model.tokenizer, ids, opts, timings=timings)[0]
    print(f"\ngenerate ({timings.backend}), greedy, 16 tokens of a random model:")
    print(f"  {DEMO_PROMPT!r} -> {seq.text!r}")
    d = timings.as_dict()
    print(
        f"  prompt {d['prompt_tokens_per_s']:.0f} tokens/s, decode {d['decode_tokens_per_s']:.0f} "
        f"tokens/s, first token after {d['time_to_first_token_s'] * 1e3:.1f} ms"
    )
    res["generated"] = seq


def _cmd_bench(args) -> int:
    from .runtime.bench import run

    if bool(args.model) == bool(args.synthetic):
        args.usage_error("give a MODEL file (or the shards of one) or --synthetic PRESET, not both")
    sizes = args.ms.split(",")
    if not all(v.strip().isdigit() and int(v) >= 1 for v in sizes):
        args.usage_error(f"--ms {args.ms}: batch sizes are integers of at least 1, comma-separated")
    for option, value in (("--prompt", args.prompt), ("--replays", args.replays)):
        if value is not None and value < 1:
            args.usage_error(f"{option} {value}: at least 1")
    if args.tp is not None and args.tp < 1:
        args.usage_error(f"--tp {args.tp}: the number of GPUs is at least 1")
    n = len(args.model)
    if n > 1 and args.tp is not None and args.tp != n:
        args.usage_error(f"--tp {args.tp} with {n} files: give the {args.tp} shards of one set")
    if n == 1 and args.tp is not None and args.tp > 1:
        args.usage_error(
            f"--tp {args.tp} runs the {args.tp} shards of a model: write them with "
            f"pyq2 repack --tp {args.tp} and give them all"
        )
    if args.whole and args.tp is not None:
        args.usage_error("--whole runs on one GPU: leave out --tp")
    if args.whole and args.decode < 2:
        args.usage_error(f"--decode {args.decode}: time at least 2 decode steps")
    return run(args)


def version_lines() -> str:
    """`pyq2 --version`: the package's version and the library's, or why it does not load."""
    try:
        from .lib import native as _native

        ffi, lib = _native.load()
        native = (
            f"libpq2 {ffi.string(lib.pq2_version_string()).decode()}, "
            f"ABI {lib.pq2_abi_version()}, {_native.library_path()}"
        )
    except Exception as e:  # the version prints whatever state the library is in
        native = f"libpq2 not loaded: {e.message if isinstance(e, Pq2Error) else e}"
    return f"{PROG} {__version__}\n{native}"


class _VersionAction(argparse.Action):
    """--version, resolved only when asked for (loading the library is not free)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        _emit(version_lines())
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse, with --help written through _emit (a closed or full standard output is an
    error line and exit 1, not a silent success)."""

    def print_help(self, file=None):
        if file is None:
            _emit(self.format_help().rstrip("\n"))
        else:
            super().print_help(file)


def _generation_arguments(p: argparse.ArgumentParser, n_help: str, n_default: int) -> None:
    """The sampling, stop, context and device options of generate and chat."""
    p.add_argument("-n", type=int, default=n_default, help=n_help)
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1: off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (1: off)")
    p.add_argument("--seed", type=int, help="seed of the sampler (default: fresh entropy)")
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop at TEXT (repeatable)"
    )
    p.add_argument("--ctx", type=int, help="context length (default: the model's, at most 4096)")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where to run: the GPU when one is usable, else the CPU (small models only)",
    )


def build_parser() -> argparse.ArgumentParser:
    from .plan.decode import PRESETS
    from .spec import layouts

    p = _Parser(
        prog=PROG,
        description="PQ2_0 ternary weights: generate text from a ternary qwen35 model or chat with "
        "it, repack GGUF files into GPU layouts, inspect and verify them, run the demo, time a "
        "model on the GPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_VersionAction, help="print the versions of pyq2 and libpq2")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    gen = sub.add_parser(
        "generate", help="generate text from a qwen35 GGUF model (GPU, or the CPU for small ones)"
    )
    gen.set_defaults(usage_error=gen.error, func=_cmd_generate)
    gen.add_argument("model", metavar="MODEL.gguf")
    gen.add_argument("-p", "--prompt", help="the prompt text")
    gen.add_argument("-f", "--file", help="a file of prompts, one a line, run as one batch")
    _generation_arguments(gen, "tokens to generate at most (default 64)", 64)
    gen.add_argument("--chat", action="store_true", help="apply the file's chat template")
    gen.add_argument("--ignore-eos", action="store_true", help="go on past end-of-sequence tokens")
    gen.add_argument("--system", help="a system message (with --chat)")
    gen.add_argument("--json", action="store_true", help="print the results and timings as JSON")

    chat = sub.add_parser(
        "chat",
        help="talk with a qwen35 GGUF model through its chat template, a line a message",
    )
    chat.set_defaults(usage_error=chat.error, func=_cmd_chat)
    chat.add_argument("model", metavar="MODEL.gguf")
    _generation_arguments(chat, "tokens a reply has at most (default 256)", 256)
    chat.add_argument("--system", help="the system message")

    r = sub.add_parser(
        "repack",
        help="convert the PQ2_0/PTQ1_0/TQ2_0 weights of a GGUF file to a resident layout",
        description=REPACK_DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.set_defaults(usage_error=r.error)
    r.add_argument("input", metavar="IN.gguf")
    r.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output file (default: IN with suffix .pyq2-<layout>.gguf, or "
        ".pyq2-<layout>-fused.gguf with --fuse); not a directory",
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
        help="tiles layout only: 16-row sub-tiles per tile (default: 2, the fastest for decode "
        "on the H200); an error with another layout",
    )
    r.add_argument(
        "--fuse",
        action="store_true",
        help="store sibling projections that read one activation (q/k/v, qkv+gate, gate+up) as "
        "one matrix each (planes and tiles only; default: separate)",
    )
    r.add_argument(
        "--tp",
        type=int,
        metavar="G",
        help="write the G tensor-parallel shards of the model (G >= 2) as OUT with .tp<G>-<rank> "
        "before .gguf, cut along heads for one GPU each (planes and tiles only)",
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="check and convert everything, write nothing (an existing OUT is only noted)",
    )
    r.add_argument(
        "--force",
        action="store_true",
        help="replace an existing OUT (a regular file, or a symlink to one)",
    )
    r.set_defaults(func=_cmd_repack)

    i = sub.add_parser("info", help="summarise a GGUF file: metadata and tensor table")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=_cmd_info)

    v = sub.add_parser(
        "verify",
        help="prove that two files hold the same weights (codes and "
        "scales) and the same other tensors and metadata",
        epilog="exit status (as cmp): 0 the files hold the same model; 1 they differ (one line "
        '"pyq2: verify: MISMATCH: ..."); 2 they could not be compared: a file missing, '
        'unreadable, not GGUF, malformed or damaged (one line "pyq2: error: ...").',
    )
    v.add_argument("original", metavar="ORIGINAL")
    v.add_argument(
        "repacked",
        metavar="REPACKED",
        nargs="+",
        help="a repacked file, or every shard of a tensor-parallel set (any order)",
    )
    v.set_defaults(func=_cmd_verify)

    d = sub.add_parser("demo", help="generate a small Bonsai-like model, repack, verify, report")
    d.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="directory for the demo files, which stay there (default: a new temporary "
        "directory, removed at the end unless --keep)",
    )
    d.add_argument(
        "--keep", action="store_true", help="keep the temporary directory and print its path"
    )
    d.add_argument(
        "--force",
        action="store_true",
        help="with -o: replace demo files already in DIR (without it an existing file, or a "
        "symlink in its place, is refused before anything is written)",
    )
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser(
        "bench",
        help="time a model on the GPU: its weight path, or with --whole the whole model "
        "(tokens/s against the byte floor)",
    )
    b.set_defaults(usage_error=b.error)
    b.add_argument(
        "model",
        metavar="MODEL",
        nargs="*",
        help="a GGUF file (raw or repacked), or every shard of a tensor-parallel set",
    )
    b.add_argument(
        "--synthetic",
        metavar="PRESET",
        choices=sorted(PRESETS),
        help=f"random ternary weights of a preset's shapes ({', '.join(sorted(PRESETS))})",
    )
    b.add_argument("--ms", default="1,4,8,16", help="decode batch sizes (default 1,4,8,16)")
    b.add_argument("--prompt", type=int, metavar="N", help="also time a prompt of N tokens")
    b.add_argument("--replays", type=int, default=20, help="graph replays per timing")
    b.add_argument(
        "--no-fuse", action="store_true", help="run sibling projections as separate matmuls"
    )
    b.add_argument(
        "--tp",
        type=int,
        metavar="G",
        help="run the step tensor-parallel on G GPUs, one process each, NCCL between them: "
        "the G shards given as MODEL, or a preset's (which is also timed on one GPU)",
    )
    b.add_argument(
        "--whole",
        action="store_true",
        help="time the whole model (attention and the recurrence too): a prompt of --prompt "
        "tokens (default 2048) then --decode steps per batch size of --ms (default 1,4,16)",
    )
    b.add_argument("--decode", type=int, default=256, metavar="N", help="decode steps (--whole)")
    b.add_argument("--json", metavar="FILE", help="write the results as JSON")
    b.set_defaults(func=_cmd_bench)
    return p


def _describe_os_error(e: OSError) -> str:
    """The line for an OSError of the work (standard output's own are StdoutError): the path
    quoted as a shell does (errors.shown_path)."""
    where = shown_path(e.filename) if e.filename is not None else ""
    if e.errno == errno.ENOSPC:  # the output is written to a temporary, removed on failure
        return f"no space left on device{f' ({where})' if where else ''}; nothing was written"
    what = e.strerror or str(e)
    return f"{where}: {what}" if where else what


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (a usage error raises SystemExit(2)).

    Signals are handled (pyq2.interrupts) for the whole call, handlers set up here are put back
    at its end."""
    owner = interrupts.install()
    try:
        return _run(argv)
    except KeyboardInterrupt as e:
        return interrupts.report(e, PROG)
    finally:
        if owner:
            interrupts.uninstall()


def _run(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        status = args.func(args)
        if sys.stdout is not None:  # what a command printed with print() goes out now
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                raise
            except OSError as e:
                _drop_stdout()
                raise StdoutError(f"cannot write to standard output: {e.strerror or e}") from None
        return status
    except SystemExit as e:  # --help, --version (0) and usage errors (2) end here
        if e.code == 0 and sys.stdout is None:
            _error("standard output is closed")
            return 1
        raise
    except BrokenPipeError:
        # `pyq2 info FILE | head`: the reader left; that is not an error of ours.
        _drop_stdout()
        return 0
    except KeyboardInterrupt:
        raise
    except Exception as e:
        signum = interrupts.caught()
        if signum is not None:  # an exception that a signal caused (an import it cut)
            raise Interrupted(signum) from None
        return _report(e)


def _report(e: Exception) -> int:
    """The one line for an exception of a command, and its exit status."""
    if isinstance(e, (FormatError, Pq2Error, ValueError, StdoutError)):
        _error(str(e))
        return 1
    if isinstance(e, OSError):
        _error(_describe_os_error(e))
        return 1
    if os.environ.get("PYQ2_DEBUG"):  # a bug: still one line unless asked for the traceback
        raise e
    _error(f"internal error: {type(e).__name__}: {e} (PYQ2_DEBUG=1 shows the traceback)")
    return 1


if __name__ == "__main__":
    sys.exit(main())

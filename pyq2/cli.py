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

from . import gguf_io
from .errors import FormatError, Pq2Error

PROG = "pyq2"
_SHORT_ARRAY = 8  # arrays up to this many items are shown in full
_STR_SHOW = 72


# ------------------------------------------------------------------------------ info ----

def _array_summary(gf, key: str) -> dict:
    n = gf.array_len(key)
    sub = gf.array_type(key)
    out = {"array": sub.name if sub is not None else None, "len": n}
    if n <= _SHORT_ARRAY:
        out["values"] = gf.value(key)
    return out


def _value_summary(gf, key: str):
    if gf.value_type(key) == gguf_io.GGUFValueType.ARRAY:
        return _array_summary(gf, key)
    return gf.value(key)


def _hadamard_summary(gf) -> dict | None:
    keys = [k for k in gf.keys() if k.startswith("prism.hadamard.")]
    if not keys:
        return None
    h = {}
    for k in keys:
        short = k[len("prism.hadamard."):]
        if gf.value_type(k) != gguf_io.GGUFValueType.ARRAY:
            h[short] = gf.value(k)
        elif short == "sign_widths":
            h[short] = gf.value(k)
        else:  # weight_names, sign_values, inverse_weight_names: counts only
            h[f"n_{short}"] = gf.array_len(k)
    return h


def describe(path) -> dict:
    """Everything `pyq2 info` shows, as JSON-able data."""
    with gguf_io.open_gguf(path) as gf:
        meta = {}
        for k in gf.keys():
            if k.startswith(("prism.hadamard.", "pyq2.tensor.")):
                continue
            meta[k] = _value_summary(gf, k)
        tensors = []
        for t in gf.tensors:
            info = gf.weight_info(t)
            row = {"name": t.name, "type": t.type_name, "layout": None, "rt": None,
                   "shape": list(t.ne), "bytes": t.nbytes}
            if info is not None:
                row.update(layout=info.layout, shape=list(info.ne),
                           source_type=gguf_io.type_name(info.source_type))
                if info.layout == "tiles":
                    row["rt"] = info.rt
            tensors.append(row)
        weights = [r for r in tensors if r["layout"] is not None]
        return {
            "path": gf.path, "file_bytes": gf.size, "gguf_version": gf.version,
            "alignment": gf.alignment, "kv_count": len(gf.keys()), "tensor_count": len(tensors),
            "architecture": gf.value("general.architecture"),
            "name": gf.value("general.name"),
            "file_type": gf.value("general.file_type"),
            "pyq2": ({"format_version": gf.value(gguf_io.KEY_FORMAT_VERSION),
                      "layout": gf.value(gguf_io.KEY_LAYOUT)}
                     if gf.has(gguf_io.KEY_FORMAT_VERSION) else None),
            "prism_hadamard": _hadamard_summary(gf),
            "weights": {"count": len(weights), "bytes": sum(r["bytes"] for r in weights)},
            "metadata": meta,
            "tensors": tensors,
        }


def _show(v) -> str:
    if isinstance(v, dict) and "array" in v:
        if "values" in v:
            return repr(v["values"])
        return f"[{(v['array'] or '').lower()} x {v['len']}]"
    if isinstance(v, float):
        return f"{v:.7g}"  # GGUF floats are mostly f32: print the digits f32 carries
    if isinstance(v, str) and len(v) > _STR_SHOW:
        return repr(v[:_STR_SHOW]) + f"... ({len(v)} chars)"
    return repr(v)


def format_info(path_or_info) -> str:
    d = path_or_info if isinstance(path_or_info, dict) else describe(path_or_info)
    lines = [f"file:      {d['path']} ({d['file_bytes'] / 1e6:.2f} MB, GGUF v{d['gguf_version']}, "
             f"alignment {d['alignment']}, {d['kv_count']} keys, {d['tensor_count']} tensors)",
             f"model:     {d['architecture']} {d['name']!r}, file_type {d['file_type']}"]
    if d["pyq2"]:
        lines.append(f"pyq2:      format_version {d['pyq2']['format_version']}, "
                     f"layout {d['pyq2']['layout']}")
    h = d["prism_hadamard"]
    if h:
        parts = [f"{k} {v}" for k, v in h.items()]
        lines.append("prism.hadamard: " + ", ".join(parts))
    lines.append(f"weights:   {d['weights']['count']} PQ2-family tensors, "
                 f"{d['weights']['bytes'] / 1e6:.2f} MB")
    lines.append("metadata:")
    for k, v in d["metadata"].items():
        lines.append(f"  {k} = {_show(v)}")
    rows = [("name", "type", "layout", "shape", "bytes")]
    for t in d["tensors"]:
        if t["layout"] is None:
            layout = "-"
        else:
            layout = t["layout"] + (f" rt={t['rt']}" if t["rt"] else "")
            if t["source_type"] != "PQ2_0" or t["type"] != "PQ2_0":
                layout += f" ({t['source_type']})" if t["type"] == "I8" else ""
        rows.append((t["name"], t["type"], layout, "x".join(map(str, t["shape"])), str(t["bytes"])))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines.append("tensors:")
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i < 4 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(lines)


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
        self.stream.write(f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:5.1f}% "
                          f"{done / 1e6:9.1f} MB  {name:<40}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


# ------------------------------------------------------------------------------ commands ----

def _cmd_repack(args) -> int:
    from .repack import repack
    bar = _Bar() if sys.stderr.isatty() else None
    try:
        summary = repack(args.input, args.output, layout=args.layout, rt=args.rt,
                         dry_run=args.dry_run, force=args.force, progress=bar)
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
    from .repack import verify
    res = verify(args.original, args.repacked)
    if not res.ok:
        print(f"{PROG}: verify: MISMATCH: {res.message}", file=sys.stderr)
        return 1
    print(f"verify: {res.message}")
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo
    res = run_demo(args.output)
    return 0 if res["verify"].ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="PQ2_0 ternary weights: repack GGUF "
                                "files into GPU layouts, inspect and verify them.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("repack", help="convert the PQ2_0/PTQ1_0/TQ2_0 weights of a GGUF file "
                       "to a resident layout")
    r.add_argument("input", metavar="IN.gguf")
    r.add_argument("-o", "--output", metavar="OUT", help="output file (default: IN with suffix "
                   ".pyq2-<layout>.gguf)")
    r.add_argument("--layout", choices=gguf_io.LAYOUTS, default="tiles",
                   help="target layout (default: tiles)")
    r.add_argument("--rt", type=int, choices=(1, 2, 4), default=2,
                   help="16-row sub-tiles per tile of the tiles layout (default: 2, the fastest for decode on the H200: bench/NOTES.md)")
    r.add_argument("--dry-run", action="store_true", help="check and convert everything, "
                   "write nothing")
    r.add_argument("--force", action="store_true", help="overwrite an existing OUT")
    r.set_defaults(func=_cmd_repack)

    i = sub.add_parser("info", help="summarise a GGUF file: metadata and tensor table")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=_cmd_info)

    v = sub.add_parser("verify", help="prove that two files hold the same weights (codes and "
                       "scales) and the same other tensors and metadata")
    v.add_argument("original", metavar="ORIGINAL")
    v.add_argument("repacked", metavar="REPACKED")
    v.set_defaults(func=_cmd_verify)

    d = sub.add_parser("demo", help="generate a small Bonsai-like model, repack, verify, report")
    d.add_argument("-o", "--output", metavar="DIR", help="directory for the demo files "
                   "(default: a new temporary directory)")
    d.set_defaults(func=_cmd_demo)
    return p


def _describe_os_error(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return f"no space left on device{f' ({e.filename})' if e.filename else ''}; " \
               "nothing was written"
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
        print(f"{PROG}: error: internal error: {type(e).__name__}: {e} "
              f"(PYQ2_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

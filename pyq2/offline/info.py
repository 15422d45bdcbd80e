"""What `pyq2 info` shows: a summary of a GGUF file's metadata and tensors.

`describe` gathers it as JSON-able data (`pyq2 info --json` prints that); `format_info` turns it
into the text table. Long arrays (a tokenizer's vocabulary, the prism.hadamard sign vectors) are
summarised by type and length, never dumped, and so is a string of more than VALUE_BYTES (by
its first characters and its length): what info keeps is bounded whatever the file holds.
Every string from the file is escaped in the text (pyq2.errors.quoted and escaped: control
characters, bidirectional overrides); --json keeps the exact values, JSON-escaped, with the
non-finite floats that strict JSON lacks as strings (strict_json). Weights are described, not
decoded. A fused
tensor (pyq2.offline.fuse) is listed with its members: the original tensors, the rows each takes and
its place in the original file. A tensor-parallel shard (pyq2.plan.tensor_parallel) says its rank
and lists the part of each tensor it holds a part of.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from ..errors import LINE_CHARS, FormatError, escaped, quoted, shown_path
from ..gguf import io as gguf_io
from ..gguf.contents import read_contents
from ..gguf.io import GGUFFile, GGUFValueType, Tensor
from ..gguf.metadata import KEY_FORMAT_VERSION, KEY_LAYOUT, TENSOR_KEY_PREFIX, Member, WeightInfo
from ..gguf.types import type_name
from ..gguf.weights import Entry
from ..spec.rotation import PREFIX as HADAMARD_PREFIX
from ..spec.rotation import Rotation

_SHORT_ARRAY = 8  # arrays up to this many items are shown in full
_STR_SHOW = 72  # characters of a long string value shown
# A value of more bytes than this is summarised, never decoded whole: a string by its first
# _STR_PREFIX characters and its length, an array by its type and length.
VALUE_BYTES = 64 << 10
_STR_PREFIX = 256


def _array_summary(gf: GGUFFile, key: str) -> dict[str, Any]:
    n = gf.array_len(key)
    sub = gf.array_type(key)
    out: dict[str, Any] = {"array": sub.name if sub is not None else None, "len": n}
    if n <= _SHORT_ARRAY and gf.value_bytes(key) <= VALUE_BYTES:
        out["values"] = gf.value(key)
    return out


def _value_summary(gf: GGUFFile, key: str) -> Any:
    """What info keeps of a value: the value itself when short, else a summary (VALUE_BYTES),
    so that memory stays bounded whatever the file holds."""
    if not gf.has(key):
        return None
    vtype = gf.value_type(key)
    if vtype == GGUFValueType.ARRAY:
        return _array_summary(gf, key)
    if vtype == GGUFValueType.STRING and gf.value_bytes(key) > VALUE_BYTES:
        prefix, n = gf.text_prefix(key, _STR_PREFIX)
        return {"string": prefix, "bytes": n}
    return gf.value(key)


def strict_json(value: Any) -> Any:
    """value with every non-finite float as a string ("nan", "inf", "-inf"): strict JSON, which
    has no NaN or Infinity (json.dumps(..., allow_nan=False) then accepts it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def _rotation_summary(gf: GGUFFile, entries: list[Entry]) -> dict[str, Any] | None:
    """The rotation contract (rotation.py), or why pyq2 refuses it: info still shows the rest."""
    widths: dict[str, Any] = {}  # input widths K (logical; a shard's: the whole weight's)
    for e in entries:
        if e.info is not None or e.tensor.ne:
            widths[e.name] = e.input_width if e.info is not None else e.tensor.ne[0]
    try:
        rot = Rotation.from_file(gf, widths)
    except FormatError as e:
        return {"invalid": escaped(str(e), LINE_CHARS)}
    return rot.summary() if rot is not None else None


class TensorRows(Sequence[dict[str, Any]]):
    """describe()'s "tensors": one dict per tensor, made when asked for from the header's
    tensors and the weights' descriptions, so that a file of a million tensors is not also a
    million dicts at once (the text and the JSON are written a row at a time)."""

    def __init__(
        self,
        tensors: list[Tensor],
        infos: dict[str, WeightInfo],
        fused: dict[str, tuple[Member, ...]],
    ):
        self._tensors, self._infos, self._fused = tensors, infos, fused

    def __len__(self) -> int:
        return len(self._tensors)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(t) for t in self._tensors[i]]
        return self._row(self._tensors[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._row(t) for t in self._tensors)

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def _row(self, t: Tensor) -> dict[str, Any]:
        info = self._infos.get(t.name)
        row: dict[str, Any] = {
            "name": t.name,
            "type": t.type_name,
            "layout": None,
            "rt": None,
            "shape": list(t.ne),
            "bytes": t.nbytes,
        }
        if info is not None:
            row.update(
                layout=info.layout.name,
                shape=list(info.ne),
                source_type=type_name(info.source_type),
            )
            if info.layout.name == "tiles":
                row["rt"] = info.layout.rt
        if t.name in self._fused:
            row["members"] = [
                {
                    "name": m.name,
                    "row0": m.row0,
                    "rows": m.rows,
                    "shape": [info.k, m.rows] if info is not None else None,
                    "position": m.position,
                }
                for m in self._fused[t.name]
            ]
        return row


def write_json(d: dict[str, Any], write: Callable[[str], None]) -> None:
    """`pyq2 info --json`: describe()'s data as strict JSON (strict_json: no NaN or Infinity;
    every string JSON-escaped, non-ASCII as \\u escapes), given to `write` a tensor at a time."""
    rest = {k: v for k, v in d.items() if k != "tensors"}
    head = json.dumps(strict_json(rest), indent=1, allow_nan=False, default=str)
    rows = iter(d["tensors"])
    first = next(rows, None)
    if first is None:
        write(head[:-2] + ',\n "tensors": []\n}')
        return
    write(head[:-2] + ',\n "tensors": [')

    def row(r: dict[str, Any]) -> str:
        text = json.dumps(strict_json(r), indent=1, allow_nan=False, default=str)
        return "  " + text.replace("\n", "\n  ")

    write(row(first))
    for r in rows:
        write(",\n" + row(r))
    write(" ]\n}")


def describe(path) -> dict[str, Any]:
    """Everything `pyq2 info` shows, as JSON-able data."""
    with gguf_io.open_gguf(path) as gf:
        contents = read_contents(gf, check_bytes=False)
        meta = {}
        for k in gf.keys():
            if k.startswith((HADAMARD_PREFIX, TENSOR_KEY_PREFIX)):
                continue
            meta[k] = _value_summary(gf, k)
        splits = contents.splits()
        shard = contents.shard
        infos = {e.tensor.name: e.stored for e in contents.entries if e.stored is not None}
        tensors = TensorRows(gf.tensors, infos, contents.fused)
        weights = [gf.tensor(name).nbytes for name in infos]
        members = sum(len(m) for m in contents.fused.values())
        return {
            "path": gf.file,
            "file_bytes": gf.size,
            "gguf_version": gf.version,
            "alignment": gf.alignment,
            "kv_count": len(gf.keys()),
            "tensor_count": len(tensors),
            "architecture": _value_summary(gf, "general.architecture"),
            "name": _value_summary(gf, "general.name"),
            "file_type": _value_summary(gf, "general.file_type"),
            "pyq2": (
                {
                    "format_version": _value_summary(gf, KEY_FORMAT_VERSION),
                    "layout": _value_summary(gf, KEY_LAYOUT),
                }
                if gf.has(KEY_FORMAT_VERSION)
                else None
            ),
            "prism_hadamard": (
                _rotation_summary(gf, contents.entries)
                if any(k.startswith(HADAMARD_PREFIX) for k in gf.keys())
                else None
            ),
            "weights": {"count": len(weights), "bytes": sum(weights)},
            "fused": {"count": len(contents.fused), "members": members},
            "tp": (
                {
                    "size": shard[0],
                    "rank": shard[1],
                    "parts": {name: split.held(shard[1]) for name, split in splits.items()},
                }
                if shard is not None
                else None
            ),
            "metadata": meta,
            "tensors": tensors,
        }


def _show(v: Any) -> str:
    """A value from the file for the text: its repr (strings quoted; control and bidirectional
    characters escaped, errors.quoted), long ones cut."""
    if isinstance(v, dict) and "array" in v:
        if "values" in v:
            return quoted(v["values"], _STR_SHOW)
        return f"[{(v['array'] or '').lower()} x {v['len']}]"
    if isinstance(v, dict) and "string" in v:
        return quoted(v["string"][:_STR_SHOW]) + f"... ({v['bytes']} bytes)"
    if isinstance(v, float):
        return f"{v:.7g}"  # GGUF floats are mostly f32: print the digits f32 carries
    return quoted(v, _STR_SHOW)


def _plain(v: Any) -> str:
    """A value shown bare (an architecture, a layout): as it is when a plain printable string,
    else as _show shows it."""
    if isinstance(v, str) and len(v) <= _STR_SHOW and v.isprintable():
        return v
    return _show(v)


def format_info(path_or_info) -> str:
    """The text of `pyq2 info`, from a file path or from what describe() returned."""
    return "\n".join(info_lines(path_or_info))


def _table_row(t: dict[str, Any]) -> tuple[str, str, str, str, str]:
    if t["layout"] is None:
        layout = "-"
    else:
        layout = t["layout"] + (f" rt={t['rt']}" if t["rt"] else "")
        if t["source_type"] != "PQ2_0" or t["type"] != "PQ2_0":
            layout += f" ({t['source_type']})" if t["type"] == "I8" else ""
    return (t["name"], t["type"], layout, "x".join(map(str, t["shape"])), str(t["bytes"]))


def info_lines(path_or_info) -> Iterator[str]:
    """format_info's lines, one at a time: the tensor table is made a row at a time (twice: its
    column widths first), so the text of a file of a million tensors is never held whole."""
    d = path_or_info if isinstance(path_or_info, dict) else describe(path_or_info)
    yield (
        f"file:      {shown_path(d['path'])} ({d['file_bytes'] / 1e6:.2f} MB, GGUF "
        f"v{d['gguf_version']}, alignment {d['alignment']}, {d['kv_count']} keys, "
        f"{d['tensor_count']} tensors)"
    )
    yield (
        f"model:     {_plain(d['architecture'])} {_show(d['name'])}, file_type "
        f"{_plain(d['file_type'])}"
    )
    if d["pyq2"]:
        p = d["pyq2"]
        version, layout = _plain(p["format_version"]), _plain(p["layout"])
        yield f"pyq2:      format_version {version}, layout {layout}"
    h = d["prism_hadamard"]
    if h:
        parts = [f"{k} {escaped(str(v), LINE_CHARS)}" for k, v in h.items()]
        yield "prism.hadamard: " + ", ".join(parts)
    fused = d["fused"]
    yield (
        f"weights:   {d['weights']['count']} PQ2-family tensors, "
        f"{d['weights']['bytes'] / 1e6:.2f} MB"
        + (
            f"; {fused['count']} of them fused, holding {fused['members']} weights"
            if fused["count"]
            else ""
        )
    )
    if d.get("tp"):
        tp = d["tp"]
        yield (
            f"shard:     rank {tp['rank']} of {tp['size']} tensor-parallel shards; "
            f"{len(tp['parts'])} tensors hold a part of the model's (listed last)"
        )
    yield "metadata:"
    for k, v in d["metadata"].items():
        yield f"  {k} = {_show(v)}"
    head = ("name", "type", "layout", "shape", "bytes")
    widths = [len(c) for c in head]
    for t in d["tensors"]:
        widths = [max(w, len(c)) for w, c in zip(widths, _table_row(t), strict=True)]
    yield "tensors:"
    rows = (_table_row(t) for t in d["tensors"])
    for r in itertools.chain([head], rows):
        # Byte counts right-aligned, so that their digits line up.
        cells = [c.ljust(w) for c, w in zip(r[:4], widths[:4], strict=True)]
        yield "  " + "  ".join([*cells, r[4].rjust(widths[4])]).rstrip()
    first = True
    for t in d["tensors"]:
        if "members" not in t:
            continue
        if first:
            yield "fused tensors (members: rows, shape, position in the original file):"
            first = False
        yield f"  {t['name']}"
        width = max(len(m["name"]) for m in t["members"])
        for m in t["members"]:
            span = f"{m['row0']}..{m['row0'] + m['rows'] - 1}"
            shape = "x".join(map(str, m["shape"] or []))
            yield f"    {m['name']:<{width}}  rows {span:<13} {shape:<11} tensor {m['position']}"
    tp_parts = list(d["tp"]["parts"].items()) if d.get("tp") else []
    if tp_parts:
        yield "tensor-parallel parts (ranges held, of the whole tensor's):"
        pad = max(len(name) for name, _ in tp_parts)
        for name, held in tp_parts:
            yield f"  {name:<{pad}}  {held}"

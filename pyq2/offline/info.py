"""What `pyq2 info` shows: a summary of a GGUF file's metadata and tensors.

`describe` gathers it as JSON-able data (`pyq2 info --json` prints that); `format_info` turns it
into the text table. Long arrays (a tokenizer's vocabulary, the prism.hadamard sign vectors) are
summarised by type and length, never dumped. Weights are described, not decoded. A fused
tensor (pyq2.offline.fuse) is listed with its members: the original tensors, the rows each takes and
its place in the original file. A tensor-parallel shard (pyq2.plan.tensor_parallel) says its rank
and lists the part of each tensor it holds a part of.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError
from ..gguf import io as gguf_io
from ..gguf.contents import Entry, read_contents
from ..gguf.io import GGUFFile, GGUFValueType
from ..gguf.metadata import KEY_FORMAT_VERSION, KEY_LAYOUT, TENSOR_KEY_PREFIX
from ..gguf.types import type_name
from ..spec.rotation import PREFIX as HADAMARD_PREFIX
from ..spec.rotation import Rotation

_SHORT_ARRAY = 8  # arrays up to this many items are shown in full
_STR_SHOW = 72  # characters of a long string value shown


def _array_summary(gf: GGUFFile, key: str) -> dict[str, Any]:
    n = gf.array_len(key)
    sub = gf.array_type(key)
    out: dict[str, Any] = {"array": sub.name if sub is not None else None, "len": n}
    if n <= _SHORT_ARRAY:
        out["values"] = gf.value(key)
    return out


def _value_summary(gf: GGUFFile, key: str) -> Any:
    if gf.value_type(key) == GGUFValueType.ARRAY:
        return _array_summary(gf, key)
    return gf.value(key)


def _rotation_summary(gf: GGUFFile, entries: list[Entry]) -> dict[str, Any] | None:
    """The rotation contract (rotation.py), or why pyq2 refuses it: info still shows the rest."""
    widths: dict[str, Any] = {}  # input widths K (logical; a shard's: the whole weight's)
    for e in entries:
        if e.info is not None or e.tensor.ne:
            widths[e.name] = e.input_width if e.info is not None else e.tensor.ne[0]
    try:
        rot = Rotation.from_file(gf, widths)
    except FormatError as e:
        return {"invalid": str(e)}
    return rot.summary() if rot is not None else None


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
        tensors = []
        for t in gf.tensors:
            info = gf.weight_info(t)
            row = {
                "name": t.name,
                "type": t.type_name,
                "layout": None,
                "rt": None,
                "shape": list(t.ne),
                "bytes": t.nbytes,
            }
            if info is not None:
                row.update(
                    layout=info.layout, shape=list(info.ne), source_type=type_name(info.source_type)
                )
                if info.layout == "tiles":
                    row["rt"] = info.rt
            if t.name in contents.fused:
                row["members"] = [
                    {
                        "name": m.name,
                        "row0": m.row0,
                        "rows": m.rows,
                        "shape": [info.k, m.rows] if info is not None else None,
                        "position": m.position,
                    }
                    for m in contents.fused[t.name]
                ]
            tensors.append(row)
        weights = [r for r in tensors if r["layout"] is not None]
        members = sum(len(m) for m in contents.fused.values())
        return {
            "path": gf.path,
            "file_bytes": gf.size,
            "gguf_version": gf.version,
            "alignment": gf.alignment,
            "kv_count": len(gf.keys()),
            "tensor_count": len(tensors),
            "architecture": gf.value("general.architecture"),
            "name": gf.value("general.name"),
            "file_type": gf.value("general.file_type"),
            "pyq2": (
                {"format_version": gf.value(KEY_FORMAT_VERSION), "layout": gf.value(KEY_LAYOUT)}
                if gf.has(KEY_FORMAT_VERSION)
                else None
            ),
            "prism_hadamard": _rotation_summary(gf, contents.entries),
            "weights": {"count": len(weights), "bytes": sum(r["bytes"] for r in weights)},
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
    """The text of `pyq2 info`, from a file path or from what describe() returned."""
    d = path_or_info if isinstance(path_or_info, dict) else describe(path_or_info)
    lines = [
        f"file:      {d['path']} ({d['file_bytes'] / 1e6:.2f} MB, GGUF v{d['gguf_version']}, "
        f"alignment {d['alignment']}, {d['kv_count']} keys, {d['tensor_count']} tensors)",
        f"model:     {d['architecture']} {d['name']!r}, file_type {d['file_type']}",
    ]
    if d["pyq2"]:
        lines.append(
            f"pyq2:      format_version {d['pyq2']['format_version']}, layout {d['pyq2']['layout']}"
        )
    h = d["prism_hadamard"]
    if h:
        parts = [f"{k} {v}" for k, v in h.items()]
        lines.append("prism.hadamard: " + ", ".join(parts))
    fused = d["fused"]
    lines.append(
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
        lines.append(
            f"shard:     rank {tp['rank']} of {tp['size']} tensor-parallel shards; "
            f"{len(tp['parts'])} tensors hold a part of the model's (listed last)"
        )
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
        # Byte counts right-aligned, so that their digits line up.
        cells = [c.ljust(w) for c, w in zip(r[:4], widths[:4], strict=True)]
        lines.append("  " + "  ".join([*cells, r[4].rjust(widths[4])]).rstrip())
    fused_rows = [t for t in d["tensors"] if "members" in t]
    if fused_rows:
        lines.append("fused tensors (members: rows, shape, position in the original file):")
    for t in fused_rows:
        lines.append(f"  {t['name']}")
        width = max(len(m["name"]) for m in t["members"])
        for m in t["members"]:
            span = f"{m['row0']}..{m['row0'] + m['rows'] - 1}"
            shape = "x".join(map(str, m["shape"] or []))
            lines.append(
                f"    {m['name']:<{width}}  rows {span:<13} {shape:<11} tensor {m['position']}"
            )
    tp_parts = list(d["tp"]["parts"].items()) if d.get("tp") else []
    if tp_parts:
        lines.append("tensor-parallel parts (ranges held, of the whole tensor's):")
        pad = max(len(name) for name, _ in tp_parts)
        lines += [f"  {name:<{pad}}  {held}" for name, held in tp_parts]
    return "\n".join(lines)

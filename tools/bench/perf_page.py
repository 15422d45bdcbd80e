#!/usr/bin/env python3
"""docs/performance.md, and README.md's headline table, from the committed benchmark results.

    python3 tools/bench/perf_page.py            # rewrite both from tools/bench/results/*.json
    python3 tools/bench/perf_page.py --check    # exit 1 if either differs from what it would write

Every figure of the page comes from one results file: per kind (the file's name before its date:
`bench`, `prefill`, `weight-path`, ...) the newest file (by the date in its name), so a refresh
commits one new or replaced results file and the regenerated page. Files whose kind is in
EVIDENCE (same-run A/B runs, tuner runs) back decisions in tools/bench/NOTES.md and are not on
the page; a file of any other kind is an error until a section here reads it. README.md gets the
decode step's headline table between its `<!-- perf:begin -->` and `<!-- perf:end -->` lines.
Only the standard library is used: no GPU, torch or pyq2 needed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "bench" / "results"
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"

NAME = re.compile(r"^(?P<kind>[a-z0-9-]+?)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<tag>[a-z0-9-]+))?$")
EVIDENCE = (
    "ab-house",
    "generate",
    "tune",
    "pyq2-bench-27b-whole-h100",  # the whole model on an H100; the page's runs are the H200's
)  # results NOTES.md cites; no section of the page reads them
KINDS = (  # the kinds the page reads, with the tool that writes each
    ("pyq2-bench-27b-fused", "`pyq2 bench --synthetic bonsai-2-27b --prompt 2048 --json F`"),
    ("pyq2-bench-27b-separate", "`pyq2 bench --synthetic bonsai-2-27b --no-fuse --json F`"),
    ("pyq2-bench-27b-whole", "`pyq2 bench --synthetic bonsai-2-27b --whole --json F`"),
    ("bench", "`tools/bench/bench_matmul.py`"),
    ("prefill", "`tools/bench/bench_prefill.py`"),
    ("weight-path", "`tools/bench/bench_weight_path.py`"),
    ("tp-ranks-27b", "`tools/bench/bench_tp_ranks.py --tp 2`"),
    ("repack-memory", "`tools/bench/repack_memory.py`"),
)
PUBLIC_PASS_MS = 7.65  # the public PQ2_0 kernels' 257-projection M = 1 pass (see TARGETS_NOTE)
TARGETS_NOTE = (
    "The public PQ2_0 kernels (the PrismML llama.cpp fork's, single calls summed) take "
    f"{PUBLIC_PASS_MS} ms for the 257 projections at M = 1 on the same H200, a figure no tool here "
    "measures."
)
FAMILIES = {1: "row-block", 2: "portable GEMM", 3: "sm_90a GEMM"}  # pq2.h PQ2_FAMILY_*
WIDTH = 100  # prose lines of the page; tables stay one line a row


class ResultsError(Exception):
    pass


# ---- reading -------------------------------------------------------------------------------


def newest_results(results: Path = RESULTS) -> dict[str, Path]:
    """The newest results file of each kind the page reads; an unknown kind is an error."""
    known = {kind for kind, _ in KINDS}
    found: dict[str, tuple[str, Path]] = {}
    for path in sorted(results.glob("*.json")):
        m = NAME.match(path.stem)
        if m is None:
            raise ResultsError(f"{path.name}: not named <kind>-<YYYY-MM-DD>[-<tag>].json")
        kind, date = m["kind"], m["date"]
        if kind in EVIDENCE:
            continue
        if kind not in known:
            raise ResultsError(
                f"{path.name}: no section of {PAGE.relative_to(ROOT)} reads kind {kind!r} "
                f"(add one to {Path(__file__).name}, or add the kind to EVIDENCE)"
            )
        if kind not in found or date > found[kind][0]:
            found[kind] = (date, path)
    missing = known - set(found)
    if missing:
        raise ResultsError(f"no results file of kind {', '.join(sorted(missing))}")
    return {kind: path for kind, (_, path) in found.items()}


def load(paths: dict[str, Path]) -> dict[str, dict]:
    out = {}
    for kind, path in paths.items():
        data = json.loads(path.read_text(encoding="utf-8"))
        data["_file"] = path.name
        out[kind] = data
    return out


# ---- formatting ----------------------------------------------------------------------------


def us(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def bandwidth(data: dict) -> float:
    bw = data["read_bandwidth_gbs"]
    return bw[0] if isinstance(bw, list) else bw  # scripts measure twice and use the first


def source(data: dict, tool: str) -> str:
    """One line: which file, which tool, which GPU, commit and date, and the read bandwidth."""
    env = data.get("env", {})
    where = [env.get("gpu") or data.get("gpu") or data.get("machine") or "?"]
    if env.get("commit"):
        where.append(f"commit {env['commit']}")
    date = (env.get("date") or data.get("date") or NAME.match(data["_file"][:-5])["date"])[:10]
    where.append(date)
    line = f"`results/{data['_file']}`, from {tool}: {', '.join(where)}"
    if "read_bandwidth_gbs" in data:
        line += f"; read bandwidth {bandwidth(data):.0f} GB/s"
    return line + "."


def wrap(lines: list[str]) -> str:
    """The lines as markdown text: paragraphs filled to WIDTH, table rows and headings as they
    are."""
    out = []
    for line in lines:
        if not line or line.startswith(("|", "#")):
            out.append(line)
        else:
            out.append(textwrap.fill(line, WIDTH, break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


def table(head: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    align = ["---"] * left + ["---:"] * (len(head) - left)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def tool_of(kind: str) -> str:
    return dict(KINDS)[kind]


# ---- the sections --------------------------------------------------------------------------


def step_rows(fused: dict) -> tuple[list[dict], dict | None]:
    decode = [r for r in fused["rows"] if r["m"] <= 16]
    prompt = [r for r in fused["rows"] if r["m"] > 16]
    return decode, (prompt[0] if prompt else None)


def section_step(d: dict) -> list[str]:
    fused, separate = d["pyq2-bench-27b-fused"], d["pyq2-bench-27b-separate"]
    decode, prompt = step_rows(fused)
    rows = []
    for r in decode + ([prompt] if prompt else []):
        label = f"{r['m']}" if r["m"] <= 16 else f"{r['m']} (a prompt)"
        rows.append(
            [
                label,
                ms(r["ms"]),
                f"{r['tokens_per_s']:.0f}",
                f"{r['x_floor']:.2f}" if r["m"] <= 16 else "",
                ms(r["producers_ms"]),
                ms(r["projections_ms"]),
                ms(r["side_ms"]),
            ]
        )
    first = decode[0]
    sep = separate["rows"][0]
    return [
        "## One decode step of the 27B",
        "",
        source(fused, tool_of("pyq2-bench-27b-fused")),
        "",
        "The weight path of one step of Ternary-Bonsai-2-27B's shapes with random ternary weights "
        "(embedding with the inverse rotation, 257 producers and projections, the head; attention "
        "and the recurrence are the host's), as one CUDA graph, siblings fused at run time. The "
        f"byte floor is {ms(first['floor_ms'])} ms ({fused['step_bytes_m1'] / 1e9:.2f} GB of "
        "weights). Producers, projections and the un-folded side projections (BF16, through torch) "
        "are also timed alone; the step runs the side projections on a second stream.",
        "",
        *table(
            [
                "m",
                "step ms",
                "tokens/s",
                "× floor",
                "producers ms",
                "projections ms",
                "side ms",
            ],
            rows,
        ),
        "",
        "With sibling projections as separate matmuls "
        f"(`--no-fuse`; `results/{separate['_file']}`, "
        f"{separate.get('gpu', '?')}, {NAME.match(separate['_file'][:-5])['date']}; read bandwidth "
        f"{bandwidth(separate):.0f} GB/s): m = {sep['m']} {ms(sep['ms'])} ms, "
        f"{sep['tokens_per_s']:.0f} tokens/s, projections {ms(sep['projections_ms'])} ms.",
    ]


def section_whole(d: dict) -> list[str]:
    """The whole model: attention and the recurrence too (pyq2.runtime.bench_model)."""
    whole = d["pyq2-bench-27b-whole"]
    rows = []
    for r in whole["whole"]:
        rows.append(
            [
                f"{r['batch']}",
                us(r["ttft_ms"]),
                f"{r['prompt_tokens_per_s']:.0f}",
                f"{r['decode_tokens_per_s']:.0f}",
                ms(r["decode_step_ms"]),
                f"{r['x_floor']:.2f}",
                ms(r["weight_path_ms"]),
                ms(r["attention_ms"]),
                ms(r["recurrence_ms"]),
                ms(r["rest_ms"]),
            ]
        )
    first = whole["whole"][0]
    return [
        "## The whole 27B model: prompt and decode",
        "",
        source(whole, tool_of("pyq2-bench-27b-whole")),
        "",
        f"Per batch size, a prompt of {first['prompt']} random tokens per sequence (the sequences "
        f"one after another, in chunks), then {first['decode']} greedy decode steps of the whole "
        "batch, each a CUDA graph replay chained on the last step's choice as `pyq2 generate` "
        "runs them. The time to first token is the whole batch's prompts. The decode step's "
        "byte floor counts the weights, the recurrent and convolution states read and written "
        "and the KV cache read at the last step. The parts are each timed alone as a graph at the "
        "last step's attention span; the rest (sampling, the ids back to the host, launch gaps) "
        "is the step less the three, and can come out below zero where the parts overlap inside "
        "the step (programmatic dependent launch) but not alone. Up to 8 sequences the side "
        "projections (ssm_alpha, ssm_beta) are part of the recurrence, above it of the weight "
        "path; at one sequence the Gated-DeltaNet's gated norm is part of the weight path (its "
        "ssm_out producer), above it of the recurrence.",
        "",
        *table(
            [
                "batch",
                "TTFT ms",
                "prompt tokens/s",
                "decode tokens/s",
                "step ms",
                "× floor",
                "weight path ms",
                "attention ms",
                "recurrence ms",
                "rest ms",
            ],
            rows,
        ),
    ]


def section_decode(d: dict) -> list[str]:
    data = d["bench"]
    ms_list = sorted({r["m"] for r in data["rows"]})
    out = [
        "## Projections at decode batch sizes (m ≤ 16)",
        "",
        source(data, tool_of("bench")),
        "",
        "The six projection shapes of the 27B (siblings fused), one call at a time: µs per call, "
        "% BW, and × cuBLAS bf16.",
    ]
    for layout, rt in (("tiles", 2), ("planes", 0)):
        rows = [r for r in data["rows"] if r["layout"] == layout and r["rt"] == rt]
        if not rows:
            continue
        shapes = list(dict.fromkeys(r["shape"] for r in rows))
        body = []
        for s in shapes:
            by_m = {r["m"]: r for r in rows if r["shape"] == s}
            first = next(iter(by_m.values()))
            cells = [f"{s} ({first['n']} × {first['k']})"]
            for m in ms_list:
                r = by_m.get(m)
                cells += (
                    [us(r["us"]), f"{r['pct_read_bw']:.1f}", f"{r['speedup_vs_cublas']:.1f}"]
                    if r
                    else ["", "", ""]
                )
            body.append(cells)
        head = ["shape (N × K)"]
        for m in ms_list:
            head += [f"M={m} µs", "% BW", "×"]
        name = f"{layout} layout" + (f", rt {rt}" if rt else "")
        out += ["", f"**{name}**", "", *table(head, body)]
    passes = [
        f"{p['layout']}" + (f" rt {p['rt']}" if p["rt"] else "") + f" {ms(p['pass_ms'])} ms "
        f"({p['ratio_to_floor']:.2f}× the floor, {p['tokens_per_s']:.0f} tokens/s)"
        for p in data["decode_pass_m1"]
    ]
    floor = data["decode_pass_m1"][0]["floor_ms"]
    out += [
        "",
        "The 257 projections of one step at M = 1, distinct resident matrices in one graph with "
        f"the plain quantiser (byte floor {ms(floor)} ms): " + "; ".join(passes) + ".",
    ]
    return out


def section_prefill(d: dict) -> list[str]:
    data = d["prefill"]
    ms_list = sorted({r["m"] for r in data["rows"]})
    shapes = list(dict.fromkeys(r["shape"] for r in data["rows"]))
    body = []
    for s in shapes:
        by_m = {r["m"]: r for r in data["rows"] if r["shape"] == s}
        body.append(
            [s]
            + [
                f"{us(by_m[m]['us'])} µs {by_m[m]['speedup_vs_cublas']:.2f}×" if m in by_m else ""
                for m in ms_list
            ]
        )
    tops = [by["tops"] for by in data["rows"] if by["m"] >= 2048]
    p = data["prefill_pass"]
    families = sorted({r["config"]["family"] for r in data["rows"]})
    ran = " and ".join(FAMILIES.get(f, f"family {f}") for f in families)
    return [
        "## Prefill (m ≥ 17)",
        "",
        source(data, tool_of("prefill")),
        "",
        f"µs per call and × cuBLAS bf16 on the same shape (above 1: faster); the dispatcher's "
        f"configurations, every cell on the {ran} kernels.",
        "",
        *table(["shape"] + [f"M={m}" for m in ms_list], body),
        "",
        f"At M ≥ 2048 the kernels reach {min(tops):.0f}–{max(tops):.0f} TOPS (2·M·N·K per "
        f"second). A {p['m']}-token prompt through the 257 projections (one graph): "
        f"{ms(p['pq2_ms'])} ms against cuBLAS bf16's {ms(p['cublas_sum_ms'])} ms (the sum of its "
        f"per-shape times; × cuBLAS {p['speedup']:.2f}).",
    ]


def section_weight_path(d: dict) -> list[str]:
    data = d["weight-path"]
    ops = [r for r in data["ops"] if r["m"] is not None]
    other = [r for r in data["ops"] if r["m"] is None]
    ms_list = sorted({r["m"] for r in ops})
    names = list(dict.fromkeys(r["op"] for r in ops))
    body = []
    for name in names:
        by_m = {r["m"]: r for r in ops if r["op"] == name}
        body.append(
            [name]
            + [
                f"{us(by_m[m]['us'])} ({by_m[m]['pct_read_bw']:.1f}%)" if m in by_m else ""
                for m in ms_list
            ]
        )
    s = data["decode_step_m1"]
    out = [
        "## The rest of the weight path",
        "",
        source(data, tool_of("weight-path")),
        "",
        "The producers of the matmul's Q8 operand (each one kernel, chained as in a step) and the "
        "embedding lookup: µs per call (% of the read bandwidth their bytes need). The width is "
        "the activation's; `quantize_q8` is the plain quantiser the producers replace.",
        "",
        *table(["kernel"] + [f"m={m}" for m in ms_list], body),
    ]
    for r in other:
        out += ["", f"`{r['op']}`: {us(r['us'])} µs ({r['pct_read_bw']:.0f}% of the bandwidth)."]
    out += [
        "",
        "One decode step's weight path at m = 1 (embedding + inverse rotation, 257 producers, 257 "
        f"projections, one graph): {ms(s['bare_ms'])} ms, {s['bare_x_floor']:.2f}× its byte floor "
        f"of {ms(s['floor_ms'])} ms; with a small foreign kernel before each producer (a host's "
        f"attention or recurrence) {ms(s['with_foreign_ms'])} ms, the foreign kernels alone "
        f"{ms(s['foreign_alone_ms'])} ms.",
    ]
    return out


def section_tp(d: dict) -> list[str]:
    data = d["tp-ranks-27b"]
    whole = data["step_bytes_m1"]["whole"]
    shares = ", ".join(
        f"{name} {b / whole:.1%}" for name, b in data["step_bytes_m1"].items() if name != "whole"
    )
    body = [
        [
            str(r["m"]),
            r["model"],
            ms(r["ms"]),
            f"{r['of_whole']:.2f}",
            ms(r["producers_ms"]),
            ms(r["projections_ms"]),
            ms(r["side_ms"]),
        ]
        for r in data["rows"]
    ]
    return [
        f"## Tensor parallel: what each of {data['tp']} GPUs computes",
        "",
        source(data, tool_of("tp-ranks-27b")),
        "",
        f"Each rank's shard of the synthetic 27B ({data['preset']}) run alone on one GPU, with "
        "collectives that do nothing: a rank's step before any communication. Weight bytes per "
        f"rank: {shares} of the whole.",
        "",
        *table(
            ["m", "model", "step ms", "× whole", "producers ms", "projections ms", "side ms"],
            body,
            left=2,
        ),
    ]


def section_memory(d: dict) -> list[str]:
    data = d["repack-memory"]
    body = []
    for r in data["rows"]:
        steps = r["steps"]
        body.append(
            [
                f"{r['bytes'] / 1e9:.2f} GB, {r['tensors']} tensors",
                f"{r['largest_tensor_bytes'] / 1e6:.0f} MB",
                f"{steps['repack']['peak_mb']:.0f} MB",
                f"{steps['verify']['peak_mb']:.0f} MB",
                f"{steps['repack']['seconds']:.1f} s",
                f"{steps['verify']['seconds']:.1f} s",
            ]
        )
    return [
        "## Repack and verify memory",
        "",
        source(data, tool_of("repack-memory")),
        "",
        f"Peak resident memory of `pyq2 repack` (to {data['layout']}, rt {data['rt']}) and "
        "`pyq2 verify`, each in its own process. The first input is the Gemma 3 270M Q4_K_M file "
        "of the slow tests; the others are generated PQ2_0 files.",
        "",
        *table(
            ["input", "largest tensor", "repack peak", "verify peak", "repack", "verify"],
            body,
        ),
    ]


def section_targets(d: dict) -> list[str]:
    """The project's targets and whether the figures above meet them (no figure repeated)."""
    dec = [r for r in d["bench"]["rows"] if r["layout"] == "tiles" and r["rt"] == 2]
    pre = d["prefill"]["rows"]
    tiles_pass = next(p for p in d["bench"]["decode_pass_m1"] if p["layout"] == "tiles")
    step_m = {r["m"]: r for r in d["pyq2-bench-27b-fused"]["rows"]}
    path = d["weight-path"]["decode_step_m1"]

    def bw(shapes, ms_, pct):
        rows = [r for r in dec if r["shape"] in shapes and r["m"] in ms_]
        ok = sorted({r["shape"] for r in rows if r["pct_read_bw"] >= pct})
        no = sorted({r["shape"] for r in rows if r["pct_read_bw"] < pct})
        return verdict(ok, no)

    def vs_cublas(ms_, x):
        rows = [r for r in dec + pre if r["m"] in ms_]
        ok = sorted({r["shape"] for r in rows if r["speedup_vs_cublas"] >= x})
        no = sorted({r["shape"] for r in rows if r["speedup_vs_cublas"] < x})
        return verdict(ok, no)

    def faster_than_cublas():
        rows = sorted(dec + pre, key=lambda r: r["m"])
        slow = {}
        for r in rows:
            if r["speedup_vs_cublas"] < 1:
                slow.setdefault(r["m"], []).append(r["shape"])
        if not slow:
            return "met"
        ok = [m for m in sorted({r["m"] for r in rows}) if m < min(slow)]
        n = len({r["shape"] for r in rows})
        where = ", ".join(
            f"{m} ({', '.join(sorted(s)) if len(s) <= 2 else f'{len(s)} of {n} shapes'})"
            for m, s in sorted(slow.items())
        )
        return (f"met up to M = {ok[-1]}; " if ok else "") + f"slower at M = {where}"

    def verdict(ok, no):
        if not no:
            return "met"
        if not ok:
            return "not met"
        return f"met by {', '.join(ok)}; not by {', '.join(no)}"

    def met(flag):
        return "met" if flag else "not met"

    def tokens(m, per_s):
        return met(step_m[m]["tokens_per_s"] >= per_s)

    whole = {r["batch"]: r for r in d["pyq2-bench-27b-whole"]["whole"]}

    def whole_tokens(b, per_s):
        if b not in whole:
            return "not measured"
        rate = whole[b]["decode_tokens_per_s"]
        return f"{met(rate >= per_s)} ({rate:.0f})"

    def ttft_met():
        prompt = step_rows(d["pyq2-bench-27b-fused"])[1]
        one = whole.get(1)
        if prompt is None or one is None or prompt["m"] != one["prompt"]:
            return "not measured"
        x = one["ttft_ms"] / prompt["ms"]
        return f"{met(x <= 1.25)} ({x:.2f}×)"

    layer = ["gate_up", "down", "in_proj", "qkv"]
    batched = sorted({r["m"] for r in dec if 2 <= r["m"] <= 8})
    public_x = PUBLIC_PASS_MS / tiles_pass["pass_ms"]
    rows = [
        ["M = 1, gate_up and lm_head", "≥ 85% BW", bw(["gate_up", "lm_head"], [1], 85)],
        ["M = 1, in_proj, qkv, down", "≥ 75% BW", bw(["in_proj", "qkv", "down"], [1], 75)],
        ["M = 1, out", "≥ 55% BW", bw(["out"], [1], 55)],
        [
            f"M = {', '.join(map(str, batched))}, " + ", ".join(layer),
            "≥ 75% BW (M = 2..8)",
            bw(layer, batched, 75),
        ],
        ["M = 16, " + ", ".join(layer), "≥ 65% BW", bw(layer, [16], 65)],
        [
            "the 257 projections at M = 1",
            "≤ 1.25× floor",
            met(tiles_pass["ratio_to_floor"] <= 1.25),
        ],
        [
            "the 257 projections at M = 1",
            "≥ 4× the public PQ2_0 kernels",
            f"{met(public_x >= 4)} ({public_x:.1f}×)",
        ],
        ["M = 512 and 2048", "≥ 1.5× cuBLAS bf16", vs_cublas([512, 2048], 1.5)],
        ["every M", "faster than cuBLAS bf16", faster_than_cublas()],
        ["the decode weight path at m = 1", "≤ 1.25× floor", met(path["bare_x_floor"] <= 1.25)],
        ["the 27B step's weight path, m = 1", "≥ 300 tokens/s", tokens(1, 300)],
        ["the 27B step's weight path, m = 16", "≥ 2500 tokens/s", tokens(16, 2500)],
        ["the whole 27B model, batch 1", "≥ 300 tokens/s", whole_tokens(1, 300)],
        ["the whole 27B model, batch 16", "≥ 2500 tokens/s", whole_tokens(16, 2500)],
        [
            "the whole 27B model, batch 1, a 2048-token prompt",
            "TTFT ≤ 1.25× the weight path's prompt",
            ttft_met(),
        ],
    ]
    return [
        "## Against the targets",
        "",
        f"The project's targets on the H200, each judged on the figures above. {TARGETS_NOTE}",
        "",
        *table(["what", "target", "status"], rows, left=3),
    ]


# ---- the page and the README's table -------------------------------------------------------


def page(d: dict) -> str:
    warmup = {data.get("warmup_ms") for data in d.values()} - {None}
    lines = [
        "# Performance",
        "",
        "<!-- Generated by tools/bench/perf_page.py from tools/bench/results/*.json; do not edit: "
        "change a results file or the script and run it (tests/test_docs.py checks). -->",
        "",
        "Each section names its results file (under `tools/bench/results/`), the tool that wrote "
        "it, the GPU, commit and date. Every time is a CUDA-graph replay after "
        f"{' / '.join(f'{w:.0f}' for w in sorted(warmup))} ms of warm-up replays, over weight "
        "copies larger than L2, activation quantisation included. **% BW** is a call's weight "
        "bytes over its time against the read bandwidth measured in the same run; the **byte "
        "floor** is those bytes over that bandwidth and **× floor** a time over it; **× cuBLAS** "
        "is cuBLAS bf16's time on the same shape over pyq2's. How to measure, and the decisions "
        "the measurements back: [tools/bench/NOTES.md](../tools/bench/NOTES.md).",
    ]
    for section in (
        section_step,
        section_whole,
        section_decode,
        section_prefill,
        section_weight_path,
        section_tp,
        section_memory,
        section_targets,
    ):
        lines += ["", *section(d)]
    return wrap(lines) + "\n"


def headline(d: dict) -> str:
    """README's table: the 27B decode step (generated; the page has the rest)."""
    fused = d["pyq2-bench-27b-fused"]
    decode, prompt = step_rows(fused)
    cols = decode + ([prompt] if prompt else [])
    head = [f"m = {r['m']}" for r in decode] + ([f"{prompt['m']}-token prompt"] if prompt else [])
    env = fused.get("env", {})
    lines = [
        BEGIN,
        *table(
            ["`pyq2 bench`, 27B shapes"] + head,
            [
                ["one step's weight path"] + [f"{ms(r['ms'])} ms" for r in cols],
                ["tokens/s"] + [f"{r['tokens_per_s']:.0f}" for r in cols],
            ],
        ),
        "",
        f"{env.get('gpu', '?')}, commit {env.get('commit', '?')}: random ternary weights of "
        "Ternary-Bonsai-2-27B's shapes, embedding to head with every producer and projection "
        "(attention and the recurrence are the host's). Every figure, and how it is measured: "
        "[docs/performance.md](docs/performance.md).",
    ]
    whole = d.get("pyq2-bench-27b-whole")
    if whole is not None:
        rows = sorted(whole["whole"], key=lambda r: r["batch"])
        wenv = whole.get("env", {})
        lines += [
            "",
            *table(
                ["`pyq2 bench --whole`, the 27B model"] + [f"batch {r['batch']}" for r in rows],
                [
                    ["decode tokens/s"] + [f"{r['decode_tokens_per_s']:.0f}" for r in rows],
                    ["time to first token, 2048-token prompts"]
                    + [f"{r['ttft_ms']:.0f} ms" for r in rows],
                ],
            ),
            "",
            f"{wenv.get('gpu', '?')}, commit {wenv.get('commit', '?')}: the whole model, "
            "attention and the recurrence included, each decode step a CUDA graph as `pyq2 "
            "generate` runs it.",
        ]
    return wrap([*lines, END])


def readme_with(text: str, block: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ResultsError(f"README.md needs one '{BEGIN}' line and, after it, one '{END}' line")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    return before + block + after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a file would change")
    args = ap.parse_args(argv)
    try:
        d = load(newest_results())
        want = {
            PAGE: page(d),
            README: readme_with(README.read_text(encoding="utf-8"), headline(d)),
        }
    except (ResultsError, KeyError, ValueError) as e:
        print(f"perf_page: error: {e}", file=sys.stderr)
        return 1
    stale = [p for p, text in want.items() if not p.exists() or p.read_text("utf-8") != text]
    if args.check:
        for p in stale:
            print(
                f"perf_page: {p.relative_to(ROOT)} is not what tools/bench/results/ gives; "
                "run python3 tools/bench/perf_page.py",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(want[p], encoding="utf-8")
        print(f"perf_page: wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The documentation holds each fact once and points at what exists (no GPU needed).

- docs/performance.md and README.md's headline table are what tools/bench/perf_page.py makes of
  the committed results (`--check`); the generator reads the newest file of each kind and refuses
  a results file no section reads.
- README.md stays a front page: at most README_MAX_LINES lines.
- Every relative link of README.md and docs/*.md names a file (or folder) that exists, and a
  `#fragment` into a markdown file names one of its headings.
- tools/bench/NOTES.md's entries have unique ids (`### <id>` headings), and every `NOTES: <id>`
  (or `(NOTES: <id>, <id>)`) a source file or document cites is one of them, or names a dated
  section (`NOTES: 2026-12-02 (the Hadamard stages)`, `NOTES: 2026-11-30`) by its `## ` heading.
"""

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from .conftest import ROOT

README_MAX_LINES = 150
PERF_PAGE = ROOT / "tools" / "bench" / "perf_page.py"
NOTES = ROOT / "tools" / "bench" / "NOTES.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CITING = ("ARCHITECTURE.md", "README.md", "FORMATS.md", "docs", "native", "pyq2", "tools", "tests")
CITED = re.compile(
    r"NOTES: (?:(?P<date>\d{4}-\d{2}-\d{2})(?: \((?P<title>[^()]*)\))?"
    r"|(?P<id>[a-z][a-z0-9-]*[a-z0-9]))"
)
CITED_LIST = re.compile(r"NOTES: ((?:[a-z][a-z0-9-]*[a-z0-9], )+[a-z][a-z0-9-]*[a-z0-9])\)")
NOTE_ID = re.compile(r"^### ([a-z0-9][a-z0-9-]*[a-z0-9])$", re.M)
NOTE_SECTION = re.compile(r"^## (\d{4}-\d{2}-\d{2}.*)$", re.M)
CONTINUATION = re.compile(r"\s*\n\s*(?://+|\*|#)?\s*")  # a comment's next line: one space


def perf_page():
    spec = importlib.util.spec_from_file_location("perf_page", PERF_PAGE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_performance_page_is_generated_from_the_results():
    r = subprocess.run(
        [sys.executable, str(PERF_PAGE), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr + "(run: python3 tools/bench/perf_page.py)"


def test_the_generator_reads_the_newest_file_of_each_kind(tmp_path):
    pp = perf_page()
    for kind, _ in pp.KINDS:
        (tmp_path / f"{kind}-2026-01-01-h200.json").write_text("{}")
    (tmp_path / "bench-2026-02-01-h200.json").write_text("{}")
    (tmp_path / "tune-2026-03-01-all.json").write_text("{}")  # evidence: not on the page
    found = pp.newest_results(tmp_path)
    assert sorted(found) == sorted(kind for kind, _ in pp.KINDS)
    assert found["bench"].name == "bench-2026-02-01-h200.json"
    assert found["prefill"].name == "prefill-2026-01-01-h200.json"


def test_the_generator_refuses_a_results_file_no_section_reads(tmp_path):
    pp = perf_page()
    for kind, _ in pp.KINDS:
        (tmp_path / f"{kind}-2026-01-01-h200.json").write_text("{}")
    (tmp_path / "mystery-2026-01-01-h200.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(pp.ResultsError, match="mystery"):
        pp.newest_results(tmp_path)
    (tmp_path / "mystery-2026-01-01-h200.json").unlink()
    (tmp_path / "prefill-2026-01-01-h200.json").unlink()
    with pytest.raises(pp.ResultsError, match="prefill"):
        pp.newest_results(tmp_path)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to docs/"
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(path) -> list[str]:
    """The targets of a markdown file's inline links, code blocks and code spans left out."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(
                f"{target} (no {dest.relative_to(ROOT) if ROOT in dest.parents else dest})"
            )
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {', '.join(broken)}"


def test_notes_ids_are_unique_and_every_citation_names_one():
    notes = NOTES.read_text(encoding="utf-8")
    ids = NOTE_ID.findall(notes)
    sections = set(NOTE_SECTION.findall(notes))
    assert ids, "tools/bench/NOTES.md has no '### <id>' entries"
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"NOTES.md ids used twice: {twice}"
    missing = []
    for top in CITING:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if path.suffix not in {".md", ".py", ".h", ".c", ".cu", ".cuh", ".inc", ".sh", ".txt"}:
                continue
            text = CONTINUATION.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
            for c in CITED.finditer(text):
                if c["id"]:
                    ok = c["id"] in ids
                else:
                    ok = (c["date"] + (f" ({c['title']})" if c["title"] else "")) in sections
                if not ok:
                    missing.append(f"{path.relative_to(ROOT)}: {c[0]}")
            for c in CITED_LIST.finditer(text):  # a parenthesised list of ids, after the first
                missing += [
                    f"{path.relative_to(ROOT)}: NOTES: ..., {i}"
                    for i in c[1].split(", ")[1:]
                    if i not in ids
                ]
    assert not missing, "citations of no NOTES.md entry:\n" + "\n".join(missing)

"""The tuning tools without a GPU, run as commands: tools/tune/tune_matmul.py re-picks a saved
tune into a table (--from-json: a full re-tune replaces a layout's entries, --partial only the
entries it tuned, the fallback lines always stay; a tune cut short by a signal writes no table and
saves what finished, which only --partial re-picks), and tools/tune/instances.py --check finds
the compiled kernel list in step with the committed table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyq2.lib.cuda import CONFIG_FIELDS

ROOT = Path(__file__).resolve().parents[1]
TUNE = ROOT / "tools" / "tune" / "tune_matmul.py"
INSTANCES = ROOT / "tools" / "tune" / "instances.py"
PYQ2_PARENT = Path(__import__("pyq2").__file__).resolve().parents[1]

HEADER = "// table\n//\n// PQ2_TUNED(layout, m_max, n, k, layout_rt, family, ...)  // file\n"
OLD = [
    "PQ2_TUNED(PLANES, 8, 5120, 6144, 0, ROWBLOCK, 2, 0, 8, 2, 2, 0, 0)  // 8.6 us",
    "PQ2_TUNED(TILES, 1, 5120, 6144, 2, ROWBLOCK, 2, 0, 16, 2, 1, 0, 0)  // 5.3 us",
    "PQ2_TUNED(TILES, 8, 5120, 6144, 2, ROWBLOCK, 2, 0, 8, 4, 1, 0, 0)  // 6.9 us",
    "PQ2_TUNED(TILES, 8, 14336, 5120, 2, ROWBLOCK, 2, 0, 4, 4, 1, 8, 0)  // 10.7 us",
]
FALLBACK = [
    "// Fallback: shapes not listed above.",
    "PQ2_TUNED(TILES, 16, 0, 0, 2, ROWBLOCK, 2, 0, 8, 1, 1, 0, 0)",
]


def run(*argv):
    env = dict(os.environ, PYTHONPATH=str(PYQ2_PARENT))
    return subprocess.run(
        [sys.executable, *map(str, argv)], capture_output=True, text=True, env=env, cwd=ROOT
    )


def write_tune(path, m, cands, commit):
    """A --json tune of tiles rt 2, shape out, at m: (config tuple, us) candidates."""
    at = {"shape": "out", "layout": "tiles", "layout_rt": 2, "m": m}
    rows = [{**at, "config": dict(zip(CONFIG_FIELDS, c, strict=True)), "us": us} for c, us in cands]
    env = {"date": "2026-02-02T00:00:00+00:00", "gpu": "GPU", "nvidia_smi": "GPU, drv"}
    path.write_text(json.dumps({"env": {**env, "commit": commit}, "rows": rows}))


def saved_tune(path):
    """A --json tune of tiles rt 2, M = 8, shape out only: two candidates, the faster wins."""
    write_tune(
        path, 8, [((1, 2, 0, 4, 1, 1, 4, 0), 6.5), ((1, 2, 0, 8, 2, 1, 0, 0), 9.0)], "bbbbbbb"
    )
    return "PQ2_TUNED(TILES, 8, 5120, 6144, 2, ROWBLOCK, 2, 0, 4, 1, 1, 4, 0)  // tune.json"


def entries(text):
    return [line for line in text.splitlines() if line.startswith("PQ2_TUNED(")]


@pytest.fixture
def table(tmp_path):
    t = tmp_path / "tuned_configs.inc"
    t.write_text(HEADER + "\n".join(OLD) + "\n\n" + "\n".join(FALLBACK) + "\n")
    return t


def test_partial_replaces_only_the_tuned_entries(tmp_path, table):
    new = saved_tune(tmp_path / "tune.json")
    r = run(TUNE, "--from-json", tmp_path / "tune.json", "--write", table, "--partial")
    assert r.returncode == 0, r.stderr
    text = table.read_text()
    assert entries(text) == [OLD[0], OLD[1], new, OLD[3], FALLBACK[1]]  # sorted: layout, n, k, m
    assert "commit" not in text  # provenance: the entry cites its results file, nothing else


def test_full_rewrite_replaces_the_layout(tmp_path, table):
    new = saved_tune(tmp_path / "tune.json")
    r = run(TUNE, "--from-json", tmp_path / "tune.json", "--write", table)
    assert r.returncode == 0, r.stderr
    # the other TILES lines go, PLANES and the fallback stay
    assert entries(table.read_text()) == [OLD[0], new, FALLBACK[1]]


SM90_LINE = "PQ2_TUNED(TILES, 128, 5120, 6144, 2, GEMM_SM90, 8, 128, 8, 1, 6, 0, 1)  // tune.json"
PORTABLE_LINE = "PQ2_TUNED(TILES, 128, 5120, 6144, 2, GEMM, 8, 32, 8, 1, 4, 0, 4)  // tune.json"


@pytest.mark.parametrize(
    "sm90_us, want",
    [
        (40.0, [SM90_LINE, PORTABLE_LINE]),  # sm_90a fastest: the portable follows
        (70.0, [PORTABLE_LINE]),  # a portable configuration fastest: its line alone
    ],
)
def test_an_sm90_pick_keeps_the_fastest_portable_line_after_it(tmp_path, table, sm90_us, want):
    """Where an sm_90a configuration is fastest, the fastest portable one follows it: the
    dispatcher passes over sm_90a lines on other devices and takes the next line of the range."""
    cands = [
        ((3, 8, 128, 8, 1, 6, 0, 1), sm90_us),
        ((2, 8, 64, 8, 1, 2, 0, 1), 60.0),
        ((2, 8, 32, 8, 1, 4, 0, 4), 55.0),
    ]
    write_tune(tmp_path / "tune.json", 128, cands, "ccccccc")
    r = run(TUNE, "--from-json", tmp_path / "tune.json", "--write", table, "--partial")
    assert r.returncode == 0, r.stderr
    assert [e for e in entries(table.read_text()) if "TILES, 128," in e] == want


@pytest.mark.parametrize("warps", ["17", "0", "4,x", ""])
def test_warps_option_rejects_bad_lists(warps):
    """--warps is checked before anything runs: a clear usage error, exit status 2."""
    r = run(TUNE, "--warps", warps, "--from-json", "unused.json")
    assert r.returncode == 2 and "--warps" in r.stderr


def test_instance_list_matches_the_table():
    """native/src/cuda/rowblock/instances.inc is what tuned_configs.inc needs, and the tuning
    build's list holds all of it."""
    r = run(INSTANCES, "--check")
    assert r.returncode == 0, r.stderr


def interrupted_tune(monkeypatch, tmp_path, table):
    """Runs tune_matmul.main in-process on fake timings (no GPU): shape out, tiles rt 2, M = 8
    and 16; a real SIGTERM arrives during M = 16's third configuration. Returns (exit status,
    the --json path, M = 8's fastest configuration and time)."""
    import os
    import signal
    import types

    monkeypatch.syspath_prepend(str(TUNE.parent))
    import tune_matmul

    calls = {"m16": 0}

    def time_pq2(ws, m, config, replays):
        if m == 16:
            calls["m16"] += 1
            if calls["m16"] == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # the installed handler raises here
        if config is None:
            return 99.0  # the table's configuration
        return 5.0 + config.warps + 0.1 * config.unroll  # fewest warps, then unroll 1: fastest

    bench = types.SimpleNamespace(
        copies_for=lambda b: 1, resident=lambda *a: None, time_pq2=time_pq2
    )
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(empty_cache=lambda: None))
    monkeypatch.setitem(sys.modules, "bench_matmul", bench)
    monkeypatch.setitem(sys.modules, "torch", torch)
    env = {"date": "2026-02-02T00:00:00+00:00", "nvidia_smi": "GPU, drv", "commit": "ccccccc"}
    monkeypatch.setattr(tune_matmul, "gpu_environment", lambda: env)
    out = tmp_path / "tune.json"
    before = signal.getsignal(signal.SIGTERM)
    status = tune_matmul.main(
        ["--shapes", "out", "--ms", "8,16", "--layouts", "tiles:2", "--json", str(out), "--write",
         str(table)]
    )  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is before  # the tuner's handlers are gone again
    return status, out


def test_an_interrupted_tune_keeps_what_finished_and_leaves_the_table(
    monkeypatch, tmp_path, table, capsys
):
    before = table.read_text()
    status, out = interrupted_tune(monkeypatch, tmp_path, table)
    assert status == 128 + 15  # SIGTERM, as a shell reports it
    assert table.read_text() == before
    assert "interrupted (SIGTERM): the table is not written" in capsys.readouterr().err
    saved = json.loads(out.read_text())
    assert saved["interrupted"] == "SIGTERM"
    assert {r["m"] for r in saved["rows"]} == {8}  # M = 16 was cut short: none of it kept
    assert len(saved["rows"]) > 2
    assert [b["m_max"] for b in saved["best"]] == [8]
    assert not list(tmp_path.glob(".*.tmp"))  # no staging directory left behind


def test_an_interrupted_tune_is_re_picked_only_with_partial(monkeypatch, tmp_path, table):
    _, out = interrupted_tune(monkeypatch, tmp_path, table)
    saved = json.loads(out.read_text())
    before = table.read_text()
    r = run(TUNE, "--from-json", out, "--write", table)
    assert r.returncode == 2 and "was interrupted (SIGTERM)" in r.stderr, r.stderr
    assert table.read_text() == before
    r = run(TUNE, "--from-json", out, "--write", table, "--partial")
    assert r.returncode == 0, r.stderr
    best = saved["best"][0]
    new = [e for e in entries(table.read_text()) if e.startswith("PQ2_TUNED(TILES, 8, 5120, 6144")]
    c = best["config"]
    assert new == [
        f"PQ2_TUNED(TILES, 8, 5120, 6144, 2, ROWBLOCK, {c['row_subtiles']}, 0, {c['warps']}, "
        f"{c['unroll']}, {c['stages']}, {c['blocks']}, {c['splits']})  // tune.json"
    ]
    assert c["warps"] == 2 and c["unroll"] == 1  # the fake timings' fastest

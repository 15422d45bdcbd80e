"""tools/tune_decode.py's table writing, without a GPU (--from-json): a full re-tune replaces a
layout's entries and keeps the other layout's; --partial replaces only the (layout, M bucket,
shape) entries it tuned."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
tune_decode = pytest.importorskip("tune_decode")  # needs pyq2 importable (it is, from the tree)

HEADER = ("// Generated 2026-01-01T00:00:00+00:00 on GPU (drv), commit aaaaaaa (layouts planes, tiles2).\n"
          "//\n")
OLD = [
    "PQ2_TUNED(PLANES, 8, 5120, 6144, 0, ROWBLOCK, 2, 8, 2, 2, 0, 0)  // 8.6 us",
    "PQ2_TUNED(TILES, 1, 5120, 6144, 2, ROWBLOCK, 2, 16, 2, 1, 0, 0)  // 5.3 us",
    "PQ2_TUNED(TILES, 8, 5120, 6144, 2, ROWBLOCK, 2, 8, 4, 1, 0, 0)  // 6.9 us",
    "PQ2_TUNED(TILES, 8, 14336, 5120, 2, ROWBLOCK, 2, 4, 4, 1, 8, 0)  // 10.7 us",
]


def saved_tune(path):
    """A --json tune of tiles rt 2, M = 8, shape out only: two candidates, the faster wins."""
    cfg = dict(zip(tune_decode.CONFIG_FIELDS, (2, 4, 1, 1, 4, 1, 0)))
    slow = dict(zip(tune_decode.CONFIG_FIELDS, (2, 8, 2, 1, 0, 1, 0)))
    rows = [{"shape": "out", "layout": "tiles", "layout_rt": 2, "m": 8, "config": c, "us": us}
            for c, us in ((cfg, 6.5), (slow, 9.0))]
    env = {"date": "2026-02-02T00:00:00+00:00", "gpu": "GPU", "nvidia_smi": "drv", "commit": "bbbbbbb"}
    path.write_text(json.dumps({"env": env, "rows": rows}))
    return "PQ2_TUNED(TILES, 8, 5120, 6144, 2, ROWBLOCK, 2, 4, 1, 1, 4, 0)  // 6.5 us"


def entries(text):
    return [line for line in text.splitlines() if line.startswith("PQ2_TUNED(")]


@pytest.fixture
def table(tmp_path):
    t = tmp_path / "decode_table.inc"
    t.write_text(HEADER + "\n".join(OLD) + "\n")
    return t


def test_partial_replaces_only_the_tuned_entries(tmp_path, table, capsys):
    new = saved_tune(tmp_path / "tune.json")
    assert tune_decode.main(["--from-json", str(tmp_path / "tune.json"), "--write", str(table), "--partial"]) == 0
    text = table.read_text()
    assert entries(text) == [OLD[0], OLD[1], new, OLD[3]]  # sorted: layout, n, k, rt, m
    assert "commit aaaaaaa" in text and "commit bbbbbbb" in text  # both provenance lines


def test_full_rewrite_replaces_the_layout(tmp_path, table, capsys):
    new = saved_tune(tmp_path / "tune.json")
    assert tune_decode.main(["--from-json", str(tmp_path / "tune.json"), "--write", str(table)]) == 0
    assert entries(table.read_text()) == [OLD[0], new]  # the other TILES lines go, PLANES stays


def test_search_space_warps():
    """--warps replaces the register families' warps per block and nothing else; without it
    each family keeps its own default set (the stream family's loop variables must not leak
    into the others)."""
    reg = ("rowblock", "persistent", "splits", "coarse")
    for m in (1, 8, 16):
        default = list(tune_decode.search_space("tiles", 2, m))
        by_family = {f: {c[1] for c in tune_decode.search_space("tiles", 2, m, families=(f,))} for f in reg}
        assert by_family["rowblock"] == {2, 4, 8, 16} and by_family["splits"] == {4, 8, 16}
        assert by_family["persistent"] == {2, 4, 8, 16}
        assert by_family["coarse"] == ({4, 8, 16} if m == 8 else set())
        assert {c[1] for c in default if c[5] == 0} == {4, 8}  # the stream family
        assert {c[1] for c in default if c[5] == 1} == set().union(*by_family.values())
        assert sorted(c for c in default if c[5] == 1) == sorted(
            c for f in reg for c in tune_decode.search_space("tiles", 2, m, families=(f,)))
        wide = list(tune_decode.search_space("tiles", 2, m, families=reg, warps=[3, 5, 6]))
        assert {c[1] for c in wide} == {3, 5, 6}
        assert len(wide) > 0 and all(c[5] == 1 for c in wide)
    # planes: the rowblock family's rt 1 and 2 with the given warps
    planes = list(tune_decode.search_space("planes", 0, 4, families=("rowblock",), warps=[6]))
    assert {(c[0], c[1]) for c in planes} == {(1, 6), (2, 6)}


@pytest.mark.parametrize("warps", ["17", "0", "4,x", ""])
def test_warps_option_rejects_bad_lists(warps, capsys):
    """--warps is checked before anything runs: a clear usage error, exit status 2."""
    with pytest.raises(SystemExit) as e:
        tune_decode.main(["--warps", warps, "--from-json", "unused.json"])
    assert e.value.code == 2 and "--warps" in capsys.readouterr().err

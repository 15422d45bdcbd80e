"""pyq2.offline.synthetic: a preset's shapes as a GGUF file of random ternary weights that pyq2
reads, verifies and generates from (the tiny preset here; the 27B's file the same way on the
GPU machine)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pyq2.errors import RepackError
from pyq2.gguf import io as gguf_io
from pyq2.gguf.contents import read_contents
from pyq2.offline.synthetic import SCALE, write_synthetic_model
from pyq2.plan.decode import PRESETS
from pyq2.runtime.generate import Options, encode_prompts, generate
from pyq2.runtime.open_model import open_model
from pyq2.spec import formats

from ..conftest import ROOT, run_pyq2, subprocess_env


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    seen: list[tuple[int, int]] = []
    path = write_synthetic_model(d / "tiny.gguf", "tiny", seed=3,
                                 progress=lambda a, b: seen.append((a, b)))  # fmt: skip
    return path, seen


def test_every_tensor_of_the_preset_with_ternary_codes_and_the_fixed_scale(tiny):
    path, seen = tiny
    dims = PRESETS["tiny"]
    with gguf_io.open_gguf(path) as gf:
        entries = {e.name: e for e in read_contents(gf).entries}
        assert [n for n, _, _ in dims.tensors()] == list(entries)
        for name, kind, _ in dims.tensors():
            if kind != "pq2":
                continue
            raw = gf.data(gf.tensor(name))
            codes, d = formats.pq2_unpack(raw)
            assert codes.max() <= 2 and np.all(d == np.float16(SCALE)), name
            assert np.bincount(codes.reshape(-1), minlength=3).min() > 0.3 * codes.size / 3
    assert seen[-1][0] == seen[-1][1] and all(
        a <= b for (a, _), (b, _) in zip(seen, seen[1:], strict=False)
    )


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(tiny, tmp_path):
    path, _ = tiny
    again = write_synthetic_model(tmp_path / "again.gguf", "tiny", seed=3)
    other = write_synthetic_model(tmp_path / "other.gguf", "tiny", seed=4)
    assert again.read_bytes() == path.read_bytes()
    assert other.read_bytes() != path.read_bytes()


def test_pyq2_reads_repacks_verifies_and_generates_from_it_on_the_cpu(tiny, tmp_path):
    path, _ = tiny
    p = run_pyq2("info", str(path))
    assert p.returncode == 0 and "qwen35" in p.stdout, p.stderr
    tiles = tmp_path / "tiles.gguf"
    p = run_pyq2("repack", str(path), "-o", str(tiles), "--layout", "tiles")
    assert p.returncode == 0, p.stderr
    p = run_pyq2("verify", str(path), str(tiles))
    assert p.returncode == 0, p.stderr
    m = open_model(path, device="cpu")
    opts = Options(max_tokens=8)
    ids = encode_prompts(m.tokenizer, ["The ship came back"], opts, m.chat_template)
    seq = generate(m.backend, m.tokenizer, ids, opts)[0]
    assert len(seq.tokens) == 8 and isinstance(seq.text, str)


def test_an_existing_file_is_kept_unless_forced_and_an_unknown_preset_refused(tiny, tmp_path):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep")
    with pytest.raises(RepackError):
        write_synthetic_model(out, "tiny")
    assert out.read_bytes() == b"keep"
    write_synthetic_model(out, "tiny", force=True)
    assert out.read_bytes() != b"keep"
    with pytest.raises(ValueError, match="bonsai-2-27b"):
        write_synthetic_model(tmp_path / "y.gguf", "nope")


def test_the_generate_benchmark_runs_the_command_on_a_synthetic_file(tmp_path):
    out = tmp_path / "generate.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "bench_generate.py"), "--preset", "tiny",
         "--prompt", "64", "-n", "6", "--device", "cpu", "--json", str(out)],
        capture_output=True, text=True, env=subprocess_env(), timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["tokens"] == 6 and res["finish"] == "length" and res["write_s"] > 0
    assert 40 <= res["timings"]["prompt_tokens"] <= 90 and res["timings"]["decode_tokens"] == 5

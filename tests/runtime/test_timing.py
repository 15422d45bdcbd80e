"""pyq2.runtime.timing.source_commit: the commit a benchmark result names."""

import os
import shutil
import subprocess

import pytest

from pyq2.runtime import timing


def test_source_commit_takes_pq2_commit(monkeypatch):
    monkeypatch.setenv("PQ2_COMMIT", "abc1234")
    assert timing.source_commit() == "abc1234"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_source_commit_names_the_checkout_head(monkeypatch):
    monkeypatch.delenv("PQ2_COMMIT", raising=False)
    root = subprocess.run(
        ["git", "-C", os.path.dirname(timing.__file__), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
    )
    if root.returncode != 0:
        pytest.skip("pyq2 does not run from a git checkout here")
    head = subprocess.run(
        ["git", "-C", root.stdout.strip(), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    got = timing.source_commit()
    assert got in (head, head + "+dirty")

"""tools/bench_commit.py: the CPU of a commit phase by phase, printed as key=value numbers."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_commit.py"
PHASES = ("commit", "record", "guard", "codec", "encode", "hash", "files")


def test_the_commit_cpu_bench_prints_each_phase_and_its_spread(tmp_path: Path) -> None:
    """A short run (2 rounds of 300 commits) prints every phase with its min and max, the
    rest the phases leave, and leaves nothing in its scratch directory."""
    done = subprocess.run(
        [sys.executable, str(TOOL), "--rounds", "2", "--batch", "300", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    pairs = {k: float(v) for k, v in (line.split("=", 1) for line in done.stdout.splitlines())}
    for phase in PHASES:
        low, mid, high = (pairs[f"{phase}_us{end}"] for end in ("_min", "", "_max"))
        assert 0 < low <= mid <= high, phase
        assert pairs[f"{phase}_user_us"] <= mid * 1.0001
    # rest is the commit less its phases, per round; of two rounds the medians are means.
    parts = sum(pairs[f"{phase}_us"] for phase in ("record", "encode", "hash", "files"))
    assert math.isclose(pairs["commit_us"], pairs["rest_us"] + parts, rel_tol=1e-3)
    assert 0 < pairs["python_us_per_commit"] <= pairs["commit_us"]
    assert (2, 300) == (pairs["rounds"], pairs["batch"])
    assert [] == list(tmp_path.iterdir())

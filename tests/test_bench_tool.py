"""tools/bench.py --quick: a smoke run that prints every key issue 16 asks for, as numbers."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite")

BENCH = Path(__file__).resolve().parent.parent / "tools" / "bench.py"
REQUIRED = (
    "commit_us",
    "commit_p99_us",
    "langgraph_put_us",
    "langgraph_put_p99_us",
    "commit_vs_langgraph",
    "flush_floor_us",
    "flush_floor_p99_us",
    "commit_vs_flush_floor",
    "fsyncs_per_commit",
    "syscalls_per_commit",
    "perform_us",
    "perform_p99_us",
    "bare_send_us",
    "perform_overhead_us",
    "perform_vs_langgraph",
    "agents8_commits_per_s",
    "agents8_async_commits_per_s",
    "langgraph8_best_commits_per_s",
    "agents8_vs_langgraph",
)


@pytest.mark.skipif(shutil.which("strace") is None, reason="the bench counts flushes with strace")
def test_quick_bench_prints_every_required_key_as_a_number(tmp_path: Path) -> None:
    """A quick run ends in key=value lines: every required key, a positive finite number,
    ratios equal to their parts, and the scratch stores removed."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    pairs = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    values = {key: float(pairs[key]) for key in REQUIRED if key in pairs}
    assert list(REQUIRED) == [key for key in REQUIRED if key in values]
    assert [] == [key for key, value in values.items() if not (math.isfinite(value) and value > 0)]
    for ratio, top, bottom in (
        ("commit_vs_langgraph", "commit_us", "langgraph_put_us"),
        ("commit_vs_flush_floor", "commit_us", "flush_floor_us"),
        ("agents8_vs_langgraph", "agents8_commits_per_s", "langgraph8_best_commits_per_s"),
    ):
        assert values[ratio] == pytest.approx(values[top] / values[bottom], rel=1e-2)
    # A commit makes at least its commit point's flush, and never more than today's three.
    assert 1 <= values["fsyncs_per_commit"] <= 3
    assert [] == list(tmp_path.iterdir())

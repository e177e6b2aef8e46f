"""tools/bench.py --quick: a smoke run that prints every key issue 16 asks for, as numbers."""

from __future__ import annotations

import json
import math
import shutil
import statistics
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
    "agents8proc_commits_per_s",
    "agents8proc_vs_langgraph",
)


@pytest.mark.skipif(shutil.which("strace") is None, reason="the bench counts flushes with strace")
def test_quick_bench_prints_every_required_key_as_a_number(tmp_path: Path) -> None:
    """A quick run ends in key=value lines: every required key, a positive finite number,
    each ratio the median of its rounds' ratios, and the scratch stores removed."""
    scratch, raw = tmp_path / "scratch", tmp_path / "rounds.json"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dir", str(scratch), "--json", str(raw)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    pairs = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    values = {key: float(pairs[key]) for key in REQUIRED if key in pairs}
    assert list(REQUIRED) == [key for key in REQUIRED if key in values]
    assert [] == [key for key, value in values.items() if not (math.isfinite(value) and value > 0)]
    rounds = json.loads(raw.read_text())["rounds"]
    best = "langgraph8_" + pairs["langgraph8_best_config"]
    # The rate of each configuration the bench printed, not its CPU per commit
    # (`langgraph8_<config>_cpu`, in µs: on a slow machine larger than the rate).
    rates = [
        key.removesuffix("_commits_per_s")
        for key in pairs
        if key.startswith("langgraph8_") and key.endswith("_commits_per_s") and "_best_" not in key
    ]
    assert len(rates) == 3
    assert best in rates
    assert values["langgraph8_best_commits_per_s"] == pytest.approx(
        max(statistics.median(rounds[key]) for key in rates), rel=1e-3
    )
    for ratio, top, bottom in (
        ("commit_vs_langgraph", "commit", "langgraph_put"),
        ("commit_vs_flush_floor", "commit", "flush_floor"),
        ("perform_vs_langgraph", "perform", "langgraph_effect"),
        ("agents8_vs_langgraph", "agents8", best),
        ("agents8proc_vs_langgraph", "agents8proc", best),
    ):
        paired = statistics.median(a / b for a, b in zip(rounds[top], rounds[bottom], strict=True))
        assert paired == pytest.approx(values[ratio], rel=1e-3)
    # A commit makes at least its commit point's flush, and never more than today's three.
    assert 1 <= values["fsyncs_per_commit"] <= 3
    assert [] == list(scratch.iterdir())

"""tools/bench_langgraph.py, a short run: every key issue 39 asks for, as numbers, last."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite")

BENCH = Path(__file__).resolve().parent.parent / "tools" / "bench_langgraph.py"
RATIOS = (
    "lg_put_vs_sqlite",
    "lg_put_writes_vs_sqlite",
    "lg_get_tuple_vs_sqlite",
    "lg_put_vs_create_floor",
)


def test_a_short_run_prints_the_ratios_their_spread_and_the_flushes(tmp_path: Path) -> None:
    """Each ratio a positive finite number among the last lines, with its rounds listed
    above; castore's flushes per operation counted: a put_writes of a new message makes six
    (its raw object's file and directory, its tree's, then the commit's two), a put four
    (its tree's two, the commit's two; the first put of a thread starts the log too)."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--steps", "6", "--rounds", "2", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    lines = done.stdout.splitlines()
    pairs = dict(line.split("=", 1) for line in lines if "=" in line and ":" not in line)
    for key in RATIOS:
        value = float(pairs[key])
        assert math.isfinite(value), key
        assert value > 0, key
        spread = next(line for line in lines if line.startswith(f"{key}: rounds "))
        listed = spread.removeprefix(f"{key}: rounds ").split(" (min ")[0].split(", ")
        assert 2 == len(listed)
    assert list(RATIOS) == [line.split("=")[0] for line in lines[-6:-2]]
    assert 6.0 == float(pairs["castore_put_writes_flushes"])
    assert 4.0 < float(pairs["castore_put_flushes"]) < 7.0  # 6 puts, the first ~17
    assert float(pairs["castore_get_tuple_flushes"]) == 0.0
    assert [] == list(tmp_path.iterdir())  # the scratch stores removed


def test_the_phases_of_an_operation_add_up_to_its_time(tmp_path: Path) -> None:
    """tools/bench_phases.py: for the commit, a put and a put_writes, every phase a number,
    together their operation's total (`other` is the rest, never negative), and the flushes
    of a commit among them."""
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH.parent / "bench_phases.py"),
            *("--commits", "20", "--steps", "6", "--dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    pairs = {k: float(v) for k, v in (line.split("=", 1) for line in done.stdout.splitlines())}
    for operation in ("commit", "lg_put", "lg_put_writes"):
        phases = {k: v for k, v in pairs.items() if k.startswith(f"{operation}_phase_")}
        assert 10 == len(phases)
        assert phases[f"{operation}_phase_other_us"] >= 0
        assert abs(sum(phases.values()) - pairs[f"{operation}_total_us"]) <= len(phases)
        assert phases[f"{operation}_phase_fsync_file_us"] > 0
        assert phases[f"{operation}_phase_fsync_dir_us"] > 0
    assert pairs["lg_put_phase_serialize_us"] > 0
    assert [] == list(tmp_path.iterdir())

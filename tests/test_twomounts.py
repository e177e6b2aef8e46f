"""The shared-filesystem fixtures' process bookkeeping (tests/twomounts.py), with plain processes:
whatever a fixture started is stopped by PID when its body fails, and what a crashed run left
behind is stopped by the next run, never a process that merely reuses a recorded PID."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import twomounts
from helpers import read_line, wait_for
from twomounts import Reaper, start_time

TESTS = str(Path(__file__).parent)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private REGISTRY, also for child processes (CASTORE_TEST_DAEMONS)."""
    path = tmp_path / "registry"
    monkeypatch.setattr(twomounts, "REGISTRY", path)
    monkeypatch.setenv("CASTORE_TEST_DAEMONS", str(path))
    return path


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """`sleep` processes a test starts itself; killed at the end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


CRASHING_RUN = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from twomounts import Reaper
    state = Path(sys.argv[1])
    (state / "run").mkdir(parents=True)
    reaper = Reaper("fake", state).__enter__()
    pids = [reaper.popen(["sleep", "300"], state / "sleep.log") for _ in range(2)]
    # a daemon that forks away from us and leaves only a pid file (like a Gluster brick)
    daemon = f"{sys.executable} -c 'import time; time.sleep(301)' {state}"
    subprocess.run(["sh", "-c", f"{daemon} & echo $! > {state}/run/brick.pid"], check=True)
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(300)
    """
)


def test_a_crashed_runs_daemons_are_stopped_by_the_next_run(registry: Path, tmp_path: Path) -> None:
    """A run SIGKILLed before its teardown leaves its daemons and its record; the next run of
    the same engine stops every one of them (the forked one found by its pid file)."""
    state = tmp_path / "crashed"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN, str(state), TESTS],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(pid) for pid in read_line(proc).split()]
        brick = int((state / "run" / "brick.pid").read_text())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert [True, True, True] == [alive(pid) for pid in [*pids, brick]]
    assert (registry / "fake.json").exists()
    with Reaper("fake", tmp_path / "next"):
        assert [False, False, False] == [alive(pid) for pid in [*pids, brick]]
    assert not (registry / "fake.json").exists()


def test_a_recorded_pid_now_used_by_another_process_is_left_alone(
    registry: Path, tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """A record naming a PID whose start time differs (the kernel reused it) does not make
    the next run kill that process."""
    sleepers.append(subprocess.Popen(["sleep", "300"]))
    pid = sleepers[0].pid
    registry.mkdir()
    record = {"owner": [1, -1], "state": str(tmp_path / "gone"), "pids": [[pid, -5]], "mounts": []}
    (registry / "fake.json").write_text(json.dumps(record))
    with Reaper("fake", tmp_path / "next"):
        assert alive(pid)
    assert sleepers[0].poll() is None


def test_a_live_run_with_the_same_engine_is_refused_not_killed(
    registry: Path, tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """A record whose owner is still running belongs to a concurrent run: refuse clearly."""
    sleepers.extend(subprocess.Popen(["sleep", "300"]) for _ in range(2))
    owner, daemon = (proc.pid for proc in sleepers)
    registry.mkdir()
    record = {
        "owner": [owner, start_time(owner)],
        "state": str(tmp_path / "other"),
        "pids": [[daemon, start_time(daemon)]],
        "mounts": [],
    }
    (registry / "fake.json").write_text(json.dumps(record))
    with pytest.raises(RuntimeError, match=f"another test run \\(pid {owner}\\)"):
        Reaper("fake", tmp_path / "next").__enter__()
    assert (True, True) == (alive(owner), alive(daemon))


def test_every_daemon_is_stopped_when_the_body_fails(registry: Path, tmp_path: Path) -> None:
    """A fixture body that raises still stops each process it started, one that ignores
    SIGTERM by SIGKILL after the grace period, and removes its record."""
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    pids: list[int] = []
    ignoring = ["sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done"]
    reaper = Reaper("fake", state, grace=0.5)

    def failing_body() -> None:
        with reaper:
            pids.append(reaper.popen(["sleep", "300"], state / "a.log"))
            pids.append(reaper.popen(ignoring, state / "b.log"))
            # Under load the shell may not have run `trap` yet: a TERM then would kill it.
            wait_for(lambda: b"trapped" in (state / "b.log").read_bytes(), what="the trap")
            assert (registry / "fake.json").exists()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_body()
    assert [False, False] == [alive(pid) for pid in pids]
    assert [pids[1]] == reaper.killed
    assert not (registry / "fake.json").exists()


def test_is_mounted_reads_the_mount_table() -> None:
    """'/' is a mount point, a plain directory is not (a dead FUSE mount, which lstat cannot
    reach, is found the same way: by its line in /proc/self/mountinfo)."""
    assert (True, False) == (twomounts.is_mounted(Path("/")), twomounts.is_mounted(Path(TESTS)))

"""What every shared-filesystem fixture yields (`TwoMounts`), and how it stops what it started.

A fixture module (sshfs.py, glusterfs.py, cephfs.py) starts servers and two FUSE clients of one
directory. Whatever happens to the tests, each process is stopped by its own PID (SIGTERM,
then SIGKILL after a bounded wait) and each mount is unmounted (fusermount -u, then lazily).
A run that died before its teardown (SIGKILL, OOM, a power cut of the CI runner) would leave
daemons holding fixed ports (glusterd's 24007) and FUSE mounts that hang every later `ls`:
`Reaper` therefore writes what it started to a record under a fixed base directory
(REGISTRY), and the next run of the same engine stops those processes before starting its own.
A recorded PID counts only while /proc says it is the same process (same start time), so a
PID the kernel has since given to someone else is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

REGISTRY = Path(os.environ.get("CASTORE_TEST_DAEMONS", "/tmp/castore-test-daemons"))
STOP_GRACE = 5.0  # seconds a daemon gets to exit on SIGTERM before it is SIGKILLed


class EngineUnavailable(Exception):
    """This host lacks what the engine needs (packages, FUSE): a skip, or a failure under CI."""


@dataclasses.dataclass(frozen=True)
class TwoMounts:
    """Two independent clients (`mount_a`, `mount_b`) of one shared directory.

    `origin` is where a test prepares a directory and reads back what the servers hold: the
    export itself for sshfs, `mount_a` for engines whose backing store is not a plain
    directory. `locks_coherent`: a flock taken through one client blocks the other.
    `commit_ms` is the engine's measured commit latency, for scaling round counts.
    """

    engine: str
    origin: Path
    mount_a: Path
    mount_b: Path
    locks_coherent: bool
    commit_ms: float

    def new_dir(self, prefix: str) -> tuple[Path, Path, Path]:
        """A fresh subdirectory: (through origin, through mount_a, through mount_b)."""
        name = f"{prefix}-{secrets.token_hex(4)}"
        (self.origin / name).mkdir()
        return self.origin / name, self.mount_a / name, self.mount_b / name

    def rounds(self, at_sshfs: int, *, floor: int = 5) -> int:
        """`at_sshfs` rounds scaled to this engine's commit latency (sshfs: about 4 ms)."""
        return max(floor, min(at_sshfs, round(at_sshfs * 4.0 / self.commit_ms)))


def tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(empty)"
    except OSError:
        return "(no log)"


def port_is_free(port: int) -> bool:
    """Whether a daemon could listen on `port` (as daemons do: despite TIME_WAIT leftovers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fuse_missing() -> str | None:
    """Why FUSE mounts cannot work here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror}); a container needs --device /dev/fuse"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "neither fusermount3 nor fusermount is installed (install fuse3)"
    return None


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if there is no such pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def is_mounted(path: Path) -> bool:
    """Whether `path` is a mount point, from the mount table: os.path.ismount says False for
    a FUSE mount whose daemon died (lstat fails with ENOTCONN), which is exactly the one that
    must still be unmounted."""
    wanted = os.path.abspath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return os.path.ismount(path)
    for line in lines:
        field = line.split(" ")[4]
        point = field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        if point.replace("\\134", "\\") == wanted:
            return True
    return False


def unmount(mountpoint: Path) -> bool:
    """fusermount -u, then lazily (-z, umount -l): True if the mount point is free again."""
    tools = [t for t in ("fusermount3", "fusermount") if shutil.which(t)]
    attempts = [[tools[0], "-u", str(mountpoint)], [tools[0], "-u", "-z", str(mountpoint)]]
    attempts = (attempts if tools else []) + [["umount", "-l", str(mountpoint)]]
    for cmd in attempts:
        if not is_mounted(mountpoint):
            break
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(cmd, capture_output=True, timeout=15, check=False)
    return not is_mounted(mountpoint)


def stop_pids(pids: Iterable[tuple[int, int]], grace: float = STOP_GRACE) -> list[int]:
    """SIGTERM each (pid, start time) that is still that process, SIGKILL what is left after
    `grace` seconds; the PIDs that had to be killed."""
    alive = [(pid, born) for pid, born in pids if born and start_time(pid) == born]
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = [(pid, born) for pid, born in alive if _running(pid, born)]
        time.sleep(0.05)  # a poll interval while the daemons shut down
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(p, b) for p, b in alive):
        time.sleep(0.05)
    return [pid for pid, _ in alive]


def _running(pid: int, born: int) -> bool:
    if start_time(pid) != born:
        return False
    try:  # a zombie has exited (ours are waited for by Reaper): no port, mount or file held
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Reaper:
    """The processes and mounts one fixture started, recorded under REGISTRY/<engine>.json."""

    def __init__(self, engine: str, state: Path, grace: float = STOP_GRACE) -> None:
        self.engine, self.state, self.grace = engine, state, grace
        self.record = REGISTRY / f"{engine}.json"
        self.pids: dict[int, int] = {}
        self.mounts: list[Path] = []
        self.popens: list[subprocess.Popen[bytes]] = []
        self.killed: list[int] = []

    def __enter__(self) -> Reaper:
        stop_leftovers(self.record)
        self._save()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.stop():
            left = [pid for pid, born in self.pids.items() if _running(pid, born)]
            stuck = [str(m) for m in self.mounts if is_mounted(m)]
            raise RuntimeError(
                f"{self.engine} teardown left processes {left} and mounts {stuck} behind "
                f"(recorded in {self.record}: the next run stops them)"
            )

    def popen(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> int:
        """Start a foreground daemon with its output in `log`; its PID, already recorded."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self.popens.append(proc)
        self.adopt([proc.pid])
        return proc.pid

    def adopt(self, pids: Iterable[int]) -> None:
        """Record daemons this fixture caused (bricks glusterd forked, read from pid files)."""
        for pid in pids:
            born = start_time(pid)
            if born is not None:
                self.pids[pid] = born
        self._save()

    def adopt_pidfiles(self) -> None:
        """Every PID in a pid file under the state directory's run/ (never a walk of the whole
        state: that would go through the bricks and into the mounts)."""
        found = []
        for pidfile in (self.state / "run").rglob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                found.append(int(pidfile.read_text().split()[0]))
        self.adopt(found)

    def mounted(self, mountpoint: Path) -> None:
        self.mounts.append(mountpoint)
        self._save()

    def stop(self) -> bool:
        """Unmount, stop every recorded process by PID; True if nothing is left behind."""
        self.adopt_pidfiles()  # a daemon may have been forked since the last look
        freed = [unmount(mp) for mp in self.mounts]  # the clients exit once unmounted
        self.killed = stop_pids(self.pids.items(), self.grace)
        freed = [unmount(mp) for mp in self.mounts]  # a client killed above leaves its mount
        for proc in self.popens:
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                proc.wait(timeout=self.grace)
        left = [pid for pid, born in self.pids.items() if _running(pid, born)]
        if all(freed) and not left:
            self.record.unlink(missing_ok=True)
        return all(freed) and not left

    def _save(self) -> None:
        REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = {
            "owner": [os.getpid(), start_time(os.getpid())],
            "state": str(self.state),
            "pids": sorted(self.pids.items()),
            "mounts": [str(m) for m in self.mounts],
        }
        temp = self.record.with_suffix(f".tmp-{os.getpid()}")
        temp.write_text(json.dumps(data))
        temp.replace(self.record)


def stop_leftovers(record: Path) -> None:
    """Stop what a previous run recorded in `record` and never stopped (it crashed)."""
    try:
        data = json.loads(record.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read the leftover record {record}: {exc}; remove it") from exc
    owner, owner_born = data["owner"]
    if owner != os.getpid() and start_time(owner) == owner_born:
        raise RuntimeError(
            f"another test run (pid {owner}) has its {record.stem} daemons up (see {record}); "
            "wait for it to finish: two runs would fight over the same ports"
        )
    pids = [(int(pid), int(born)) for pid, born in data["pids"]]
    state = Path(data["state"])
    for pidfile in (state / "run").rglob("*.pid") if state.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().split()[0])
            born = start_time(pid)
            if born is not None and str(state) in _cmdline(pid):
                pids.append((pid, born))
    stop_pids(pids, grace=1.0)
    stuck = [m for m in data["mounts"] if not unmount(Path(m))]
    if stuck:
        raise RuntimeError(f"leftover mounts {stuck} of a crashed run cannot be unmounted")
    record.unlink()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""

"""A GlusterFS replica-3 volume on 127.0.0.1, mounted twice with the FUSE client, for tests.

`mount_gluster_pair(workdir, caches=...)` is a context manager yielding a `TwoMounts`: glusterd
runs from a volfile of its own with its working directory, pid files and logs under `workdir`;
the volume has three bricks in local directories; two `glusterfs` FUSE processes (two
clients, each with its own pid file and log) mount it. `caches=False` turns off every client
cache Gluster has (below); `caches=True` keeps Gluster's defaults, under which one client
can read a file the other just wrote as empty, and see a renamed-over name stale (ESTALE).
Everything is stopped by PID on exit (twomounts.Reaper). It raises `EngineUnavailable` when the
packages or FUSE are missing, RuntimeError when the volume does not come up.

Two things Gluster 10 puts outside `workdir` whatever its options: the bricks' unix sockets
(/var/run/gluster/<hash>.socket) and the brick and self-heal logs (/var/log/glusterfs/); the
fixture removes the sockets of the processes it stopped and moves the brick logs it caused
into `workdir/logs`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from twomounts import EngineUnavailable, Reaper, TwoMounts, fuse_missing, port_is_free, tail

GLUSTERD_PORT = 24007  # the brick daemons find glusterd only on its default port
START_TIMEOUT = 60.0
VOLUME = "castore"
# Client-side caches, per volume: md-cache (stat-prefetch), quick-read, open-behind and
# write-behind. With them on a client reads a file another client just created and wrote as
# empty, and a renamed-over name keeps its old inode for about a second.
NO_CACHE_OPTIONS = {
    "performance.stat-prefetch": "off",
    "performance.quick-read": "off",
    "performance.open-behind": "off",
    "performance.write-behind": "off",
}
# The kernel's caches of a FUSE mount: attributes, names, and "no such name" (defaults 1 s).
NO_CACHE_FUSE = ("--attribute-timeout=0", "--entry-timeout=0", "--negative-timeout=0")
# By `caches`: commit p50 measured here (docs/results/benchmarks.md).
COMMIT_MS = {False: 28.0, True: 7.0}
TOOLS = ("glusterd", "gluster", "glusterfs", "glusterfsd")


def missing_prerequisites() -> str | None:
    """Why Gluster mounts cannot work on this host, or None if they can."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-distfs.sh)"
    return fuse_missing()


BRICK_HOST = "castore-gluster"  # .ci/install-distfs.sh maps it to 127.0.0.1 in /etc/hosts


def brick_host() -> str:
    """The name bricks are given: glusterd refuses 127.0.0.1 and localhost for a brick, but
    takes another name that resolves to 127.0.0.1: BRICK_HOST, or the machine's host name
    (which a container's /etc/hosts maps to its external address instead)."""
    for name in (BRICK_HOST, socket.gethostname()):
        with contextlib.suppress(OSError):
            if socket.gethostbyname(name) == "127.0.0.1":
                return name
    raise RuntimeError(
        f"neither {BRICK_HOST!r} nor the host name {socket.gethostname()!r} resolves to "
        f"127.0.0.1, and Gluster's bricks need such a name; add '127.0.0.1 {BRICK_HOST}' to "
        "/etc/hosts (.ci/install-distfs.sh does)"
    )


class _Gluster:
    def __init__(self, workdir: Path, reaper: Reaper) -> None:
        self.dir, self.reaper = workdir, reaper
        self.run, self.logs = workdir / "run", workdir / "logs"
        self.socket = self.run / "glusterd.socket"
        self.outside: list[list[str]] = []  # argv of every daemon, for collect_outside_files

    def cli(self, *args: str, timeout: float = 60.0) -> str:
        """One `gluster` command in script mode (no y/n questions), against our glusterd."""
        argv = [
            "gluster",
            "--mode=script",
            f"--glusterd-sock={self.socket}",
            f"--log-file={self.logs / 'cli.log'}",
            *args,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stdout}{done.stderr}".strip())
        return done.stdout

    def start_glusterd(self) -> None:
        if not port_is_free(GLUSTERD_PORT):
            raise RuntimeError(
                f"port {GLUSTERD_PORT} on 127.0.0.1 is taken (a glusterd not started by this "
                "test run?); the fixture needs it for its own glusterd"
            )
        volfile = self.dir / "glusterd.vol"
        volfile.write_text(
            "volume management\n"
            "    type mgmt/glusterd\n"
            f"    option working-directory {self.dir / 'glusterd'}\n"
            f"    option run-directory {self.run}\n"
            f"    option glusterd-sockfile {self.socket}\n"
            "    option transport-type socket\n"
            "    option transport.socket.bind-address 127.0.0.1\n"
            f"    option transport.socket.listen-port {GLUSTERD_PORT}\n"
            "    option max-port 60999\n"
            "end-volume\n"
        )
        pidfile, log = self.run / "glusterd.pid", self.logs / "glusterd.log"
        argv = ["glusterd", "-N", "-f", str(volfile), "-p", str(pidfile), f"--log-file={log}"]
        pid = self.reaper.popen(argv, self.logs / "glusterd.out")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.cli("pool", "list", timeout=10)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
                    raise RuntimeError(f"glusterd did not answer; its log:\n{tail(log)}") from exc
            else:
                return
            time.sleep(0.1)  # a poll interval while glusterd starts

    def start_volume(self, caches: bool) -> None:
        host = brick_host()
        bricks = [self.dir / f"brick{n}" for n in (1, 2, 3)]
        for brick in bricks:
            brick.mkdir()
        # `force`: the bricks are on the root filesystem, which glusterd otherwise refuses.
        self.cli(
            "volume", "create", VOLUME, "replica", "3", *[f"{host}:{b}" for b in bricks], "force"
        )
        if not caches:
            for key, value in NO_CACHE_OPTIONS.items():
                self.cli("volume", "set", VOLUME, key, value)
        self.cli("volume", "start", VOLUME)
        self.reaper.adopt_pidfiles()  # the bricks and the self-heal daemon, forked by glusterd
        deadline = time.monotonic() + START_TIMEOUT
        while (online := self.online()) < 3:
            if time.monotonic() > deadline:
                status = self.cli("volume", "status", VOLUME)
                raise RuntimeError(f"only {online} of 3 bricks came online:\n{status}")
            time.sleep(0.1)  # a poll interval while the bricks start
        self.reaper.adopt_pidfiles()

    def online(self) -> int:
        """How many bricks `gluster volume status` shows online (and records their PIDs)."""
        out = self.cli("volume", "status", VOLUME, "--xml")
        pids = [int(p) for p in _xml_values(out, "pid") if p.isdigit() and int(p) > 0]
        self.reaper.adopt(pids)
        return _xml_values(out, "status").count("1")

    def mount(self, mountpoint: Path, caches: bool) -> None:
        mountpoint.mkdir()
        name = mountpoint.name
        argv = [
            "glusterfs",
            "-N",  # in the foreground: this process is the client, known by its PID
            "--process-name",
            "fuse",
            "--volfile-server=127.0.0.1",
            f"--volfile-id=/{VOLUME}",
            *(() if caches else NO_CACHE_FUSE),
            "-p",
            str(self.run / f"client-{name}.pid"),
            f"--log-file={self.logs / f'client-{name}.log'}",
            str(mountpoint),
        ]
        pid = self.reaper.popen(argv, self.logs / f"client-{name}.out")
        self.reaper.mounted(mountpoint)
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.ismount(mountpoint):
            if time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
                log = tail(self.logs / f"client-{name}.log")
                if "fuse: device not found" in log or "Operation not permitted" in log:
                    raise EngineUnavailable(f"FUSE mounts are not permitted here: {log}")
                raise RuntimeError(f"glusterfs did not mount {mountpoint}; its log:\n{log}")
            time.sleep(0.05)  # a poll interval while the client connects

    def collect_outside_files(self) -> None:
        """Move the brick logs into logs/, remove the sockets of the (stopped) daemons."""
        for pid_argv in self.outside:
            for flag, path in itertools.pairwise(pid_argv):
                if flag == "-S" and path.startswith("/var/run/gluster/"):
                    Path(path).unlink(missing_ok=True)
                if flag == "-l" and path.startswith("/var/log/glusterfs/"):
                    with contextlib.suppress(OSError):
                        shutil.move(path, self.logs / Path(path).name)

    def note_outside_files(self) -> None:
        for pid in self.reaper.pids:
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                self.outside.append([a.decode() for a in argv])


def _xml_values(xml: str, tag: str) -> list[str]:
    """The text of every <tag>...</tag> in `xml` (the status XML is flat enough for this)."""
    values, start = [], 0
    while (i := xml.find(f"<{tag}>", start)) >= 0:
        j = xml.find(f"</{tag}>", i)
        values.append(xml[i + len(tag) + 2 : j].strip())
        start = j
    return values


def _probe(mounts: TwoMounts) -> None:
    """Both clients are up: what one writes, the other reads (wait for the replicas)."""
    probe_a, probe_b = mounts.mount_a / ".probe", mounts.mount_b / ".probe"
    probe_a.write_text("up")
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with contextlib.suppress(OSError):
            if probe_b.read_text() == "up":
                break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{probe_b} never showed what {probe_a} wrote")
        time.sleep(0.05)  # a poll interval: the default-cache client is stale for about 1 s
    probe_b.unlink()


@contextlib.contextmanager
def mount_gluster_pair(workdir: Path, *, caches: bool) -> Iterator[TwoMounts]:
    """A replica-3 volume in `workdir`, mounted twice; everything stopped by PID on exit."""
    reason = missing_prerequisites()
    if reason is not None:
        raise EngineUnavailable(reason)
    engine = "gluster-default" if caches else "gluster-nocache"
    gluster = _Gluster(workdir, Reaper("glusterfs", workdir))
    for d in (gluster.run, gluster.logs, workdir / "glusterd"):
        d.mkdir(parents=True)
    try:
        with gluster.reaper:
            try:
                gluster.start_glusterd()
                gluster.start_volume(caches)
                mount_a, mount_b = workdir / "mount-a", workdir / "mount-b"
                for mountpoint in (mount_a, mount_b):
                    gluster.mount(mountpoint, caches)
                pair = TwoMounts(engine, mount_a, mount_a, mount_b, True, COMMIT_MS[caches])
                _probe(pair)
                yield pair
            finally:
                gluster.note_outside_files()  # while the daemons still run
    finally:
        gluster.collect_outside_files()

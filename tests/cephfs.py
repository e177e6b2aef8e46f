"""A one-node CephFS on 127.0.0.1 (mon, mgr, memstore OSD, MDS), mounted twice with ceph-fuse.

`mount_ceph_pair(workdir)` is a context manager yielding a `TwoMounts`: every daemon runs in the
foreground (this process knows its PID) from one ceph.conf whose run dir, pid files, admin
sockets, logs and data directories are all under `workdir`; the OSD keeps its data in RAM
(memstore: nothing here is about durability). Two `ceph-fuse` clients with their own ids
(client.fa, client.fb) mount the file system. Authentication is off, which is why it must
stay on 127.0.0.1. Everything is stopped by PID on exit (twomounts.Reaper; the MDS ignores
SIGTERM and is SIGKILLed after the grace period). It raises `EngineUnavailable` when the
packages or FUSE are missing, RuntimeError when the cluster does not come up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from twomounts import EngineUnavailable, Reaper, TwoMounts, free_port, fuse_missing, tail

START_TIMEOUT = 60.0
COMMIT_MS = 8.0  # commit p50 measured here (docs/results/benchmarks.md)
TOOLS = (
    "ceph",
    "ceph-authtool",
    "monmaptool",
    "ceph-mon",
    "ceph-mgr",
    "ceph-osd",
    "ceph-mds",
    "ceph-fuse",
)


def missing_prerequisites() -> str | None:
    """Why CephFS mounts cannot work on this host, or None if they can."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-distfs.sh)"
    return fuse_missing()


def _conf(workdir: Path, fsid: str, port: int) -> str:
    d = workdir
    return f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{port}
public addr = 127.0.0.1
# without it the OSD listens on every address
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd objectstore = memstore
osd mon shutdown timeout = 1
memstore device bytes = 1073741824
run dir = {d}/run
admin socket = {d}/run/$cluster-$name.asok
pid file = {d}/run/$name.pid
log file = {d}/logs/$name.log
mon cluster log file = {d}/logs/cluster.log
mon data = {d}/data/$name
osd data = {d}/data/$name
mds data = {d}/data/$name
mgr data = {d}/data/$name
keyring = {d}/keyring
"""


class _Ceph:
    def __init__(self, workdir: Path, reaper: Reaper) -> None:
        self.dir, self.reaper = workdir, reaper
        self.conf = workdir / "ceph.conf"
        self.logs = workdir / "logs"

    def tool(self, *argv: str, timeout: float = 60.0) -> str:
        done = subprocess.run(
            [argv[0], "-c", str(self.conf), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stdout}{done.stderr}".strip())
        return done.stdout

    def ceph(self, *args: str) -> str:
        return self.tool("ceph", "--connect-timeout", "20", *args)

    def daemon(self, binary: str, name: str, *extra: str) -> int:
        """Start one daemon in the foreground (-f); its PID."""
        argv = [binary, "-f", "-c", str(self.conf), *extra]
        return self.reaper.popen(argv, self.logs / f"{name}.out")

    def start(self) -> None:
        fsid, port = str(uuid.uuid4()), free_port()
        self.conf.write_text(_conf(self.dir, fsid, port))
        for sub in ("run", "logs", "data/mon.a", "data/mgr.x", "data/mds.a"):
            (self.dir / sub).mkdir(parents=True)
        keyring, monmap = self.dir / "keyring", self.dir / "monmap"
        self.tool("ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", "mon.")
        self.tool(
            "monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{port}]", "--fsid", fsid,
            str(monmap),
        )  # fmt: skip
        self.tool("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
        self.daemon("ceph-mon", "mon.a", "-i", "a")
        self.daemon("ceph-mgr", "mgr.x", "-i", "x")
        osd = self.ceph("osd", "create").strip()
        (self.dir / f"data/osd.{osd}").mkdir()
        self.tool("ceph-osd", "-i", osd, "--mkfs")
        self.daemon("ceph-osd", f"osd.{osd}", "-i", osd)
        self.ceph("osd", "crush", "add", f"osd.{osd}", "1.0", "host=castore", "root=default")
        self.ceph("osd", "pool", "create", "cephfs_data", "8")
        self.ceph("osd", "pool", "create", "cephfs_metadata", "8")
        self.ceph("fs", "new", "cephfs", "cephfs_metadata", "cephfs_data")
        self.daemon("ceph-mds", "mds.a", "-i", "a")
        deadline = time.monotonic() + START_TIMEOUT
        while "up:active" not in (stat := self.ceph("mds", "stat")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the MDS never became active: {stat}; {self._logs()}")
            time.sleep(0.2)  # a poll interval while the MDS joins
        self.reaper.adopt_pidfiles()

    def mount(self, mountpoint: Path, client: str) -> None:
        mountpoint.mkdir()
        pid = self.daemon("ceph-fuse", f"client.{client}", "--id", client, str(mountpoint))
        self.reaper.mounted(mountpoint)
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.ismount(mountpoint):
            if time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
                log = tail(self.logs / f"client.{client}.out")
                if "fuse: device not found" in log or "Operation not permitted" in log:
                    raise EngineUnavailable(f"FUSE mounts are not permitted here: {log}")
                raise RuntimeError(f"ceph-fuse did not mount {mountpoint}; its output:\n{log}")
            time.sleep(0.05)  # a poll interval while the client connects

    def _logs(self) -> str:
        return "\n".join(f"{p.name}: {tail(p, 600)}" for p in sorted(self.logs.glob("*.log")))


@contextlib.contextmanager
def mount_ceph_pair(workdir: Path) -> Iterator[TwoMounts]:
    """A CephFS in `workdir`, mounted twice; everything stopped by PID on exit."""
    reason = missing_prerequisites()
    if reason is not None:
        raise EngineUnavailable(reason)
    # The MDS ignores SIGTERM and the OSD waits for the (also stopping) mon: wait less.
    ceph = _Ceph(workdir, Reaper("cephfs", workdir, grace=3.0))
    with ceph.reaper:
        ceph.start()
        mount_a, mount_b = workdir / "mount-a", workdir / "mount-b"
        ceph.mount(mount_a, "fa")
        ceph.mount(mount_b, "fb")
        yield TwoMounts("cephfs", mount_a, mount_a, mount_b, True, COMMIT_MS)

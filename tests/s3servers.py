"""S3 endpoints on 127.0.0.1 for the tests: moto's server, and a one-node Ceph RADOS Gateway.

`start_moto(workdir)` and `start_rgw(workdir)` are context managers yielding an `S3Endpoint`:
every process runs in the foreground, started and stopped by its own PID (twomounts.Reaper,
which also stops what a crashed earlier run left). The RGW cluster is the CephFS fixture's
recipe without the MDS: a mon, a mgr, one memstore OSD (data in RAM: nothing here is about
durability) and radosgw, with cephx off, which is why it stays on 127.0.0.1. radosgw asks the
mon for a "secure" connection by default, which auth "none" cannot give: its client mode is
set to crc. A user with fixed keys is created with radosgw-admin. Each raises
`EngineUnavailable` when its packages are missing, RuntimeError when it does not come up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twomounts import EngineUnavailable, Reaper, free_port, tail

START_TIMEOUT = 90.0
ACCESS_KEY, SECRET_KEY = "castoreaccess", "castoresecretkey"
RGW_TOOLS = (
    "ceph",
    "ceph-authtool",
    "monmaptool",
    "ceph-mon",
    "ceph-mgr",
    "ceph-osd",
    "radosgw",
    "radosgw-admin",
)


@dataclasses.dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 server answers, and how to reach it; `commit_ms` scales round counts."""

    engine: str
    url: str
    commit_ms: float

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """Store.open's options for this endpoint (or for a proxy in front of it)."""
        return {
            "endpoint_url": endpoint or self.url,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
            "region_name": "us-east-1",
        }

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The same, as the environment a child process or the CLI reads (the boto3 way)."""
        return {
            "AWS_ENDPOINT_URL_S3": endpoint or self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def new_bucket(self, prefix: str = "t") -> str:
        """A fresh bucket; the URL of a store prefix in it."""
        import boto3  # noqa: PLC0415 - the s3 extra

        name = f"{prefix}-{secrets.token_hex(6)}"
        boto3.client("s3", **self.options()).create_bucket(Bucket=name)
        return f"s3://{name}/store"


def _wait_http(url: str, pids: list[int], logs: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - our own loopback server
                return
        except OSError as exc:
            if hasattr(exc, "code"):
                return  # an HTTP error answer: the server is up
            if time.monotonic() > deadline or any(not Path(f"/proc/{p}").exists() for p in pids):
                raise RuntimeError(f"no S3 server at {url}: {exc}; {tail(logs)}") from exc
        time.sleep(0.2)  # a poll interval while the server starts


@contextlib.contextmanager
def start_moto(workdir: Path, *, serial: bool = True) -> Iterator[S3Endpoint]:
    """moto's S3 server (a mock that honours If-None-Match) on a free port. `serial`: moto's
    work on one request at a time (moto_serial.py), without which its If-None-Match races."""
    try:
        import moto.server  # noqa: F401, PLC0415 - only to know it is installed
    except ImportError as exc:
        raise EngineUnavailable(f"moto[server] is not installed ({exc})") from None
    workdir.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), workdir / "moto.out"
    served = [str(Path(__file__).with_name("moto_serial.py"))] if serial else ["-m", "moto.server"]
    address = ["127.0.0.1", str(port)] if serial else ["-H", "127.0.0.1", "-p", str(port)]
    with Reaper("moto", workdir) as reaper:
        pid = reaper.popen([sys.executable, *served, *address], log)
        url = f"http://127.0.0.1:{port}"
        _wait_http(url, [pid], log)
        yield S3Endpoint("moto" if serial else "moto-stock", url, 4.0)


def _rgw_conf(workdir: Path, fsid: str, mon_port: int, rgw_port: int) -> str:
    d = workdir
    return f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
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
mgr data = {d}/data/$name
rgw data = {d}/data/$name
keyring = {d}/keyring
[client.rgw.a]
# tcp_nodelay: without it every GET waits out the client's delayed ACK (about 40 ms on
# loopback, where a PUT takes 8): Nagle holds the body back behind the headers
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw dns name = localhost
# auth "none" has no "secure" mode, which radosgw asks the mon for by default
ms mon client mode = crc
"""


class _Rgw:
    def __init__(self, workdir: Path, reaper: Reaper) -> None:
        self.dir, self.reaper = workdir, reaper
        self.conf, self.logs = workdir / "ceph.conf", workdir / "logs"

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

    def daemon(self, binary: str, name: str, *extra: str) -> int:
        return self.reaper.popen(
            [binary, "-f", "-c", str(self.conf), *extra], self.logs / f"{name}.out"
        )

    def start(self) -> str:
        fsid, mon_port, rgw_port = str(uuid.uuid4()), free_port(), free_port()
        for sub in ("run", "logs", "data/mon.a", "data/mgr.x", "data/client.rgw.a"):
            (self.dir / sub).mkdir(parents=True)
        self.conf.write_text(_rgw_conf(self.dir, fsid, mon_port, rgw_port))
        keyring, monmap = self.dir / "keyring", self.dir / "monmap"
        self.tool("ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", "mon.")
        self.tool(
            "monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", "--fsid", fsid,
            str(monmap),
        )  # fmt: skip
        self.tool("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
        self.daemon("ceph-mon", "mon.a", "-i", "a")
        self.daemon("ceph-mgr", "mgr.x", "-i", "x")
        osd = self.tool("ceph", "--connect-timeout", "20", "osd", "create").strip()
        (self.dir / f"data/osd.{osd}").mkdir()
        self.tool("ceph-osd", "-i", osd, "--mkfs")
        self.daemon("ceph-osd", f"osd.{osd}", "-i", osd)
        self.tool(
            "ceph", "osd", "crush", "add", f"osd.{osd}", "1.0", "host=castore", "root=default"
        )
        pid = self.daemon("radosgw", "rgw", "-n", "client.rgw.a")
        url = f"http://127.0.0.1:{rgw_port}"
        _wait_http(url, [pid], self.logs / "rgw.out")
        self.tool(
            "radosgw-admin", "-n", "client.rgw.a", "user", "create", "--uid=castore",
            "--display-name=castore", f"--access-key={ACCESS_KEY}", f"--secret={SECRET_KEY}",
            timeout=120,
        )  # fmt: skip
        self.reaper.adopt_pidfiles()
        return url


def rgw_missing() -> str | None:
    for tool in RGW_TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-distfs.sh)"
    return None


@contextlib.contextmanager
def start_rgw(workdir: Path) -> Iterator[S3Endpoint]:
    """A Ceph RADOS Gateway on a free port of 127.0.0.1; everything stopped by PID on exit."""
    reason = rgw_missing()
    if reason is not None:
        raise EngineUnavailable(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    rgw = _Rgw(workdir, Reaper("rgw", workdir, grace=3.0))
    with rgw.reaper:
        url = rgw.start()
        yield S3Endpoint("rgw", url, 14.0)

"""Two sshfs clients of one export, served by a throwaway sshd on 127.0.0.1, for tests.

`mount_sshfs_pair(workdir)` is a context manager yielding an `SshfsPair` (a twomounts.TwoMounts):
`.origin` is the real directory (the export), `.mount_a` and `.mount_b` are two independent
sshfs mounts of it (two clients, each with its own ssh connection and its own FUSE superblock),
whose flocks do not see each other. Everything it starts it stops
again on exit, also when the body raised. It raises `SshfsUnavailable` when the host lacks
FUSE, sshfs or sshd (the conftest fixture turns that into a skip, or a failure under CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from twomounts import EngineUnavailable, TwoMounts, free_port, tail

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 15.0

# Every cache sshfs 3.7 / libfuse 3.14 lets us turn off, so that one client sees the other's
# changes at its next system call:
#   dir_cache=no         sshfs's own cache of names, attributes and symlink targets
#   entry_timeout=0      kernel dentry cache (name -> inode) for positive lookups
#   negative_timeout=0   kernel cache of "no such name" (already 0 by default; explicit)
#   attr_timeout=0       kernel attribute cache (size, mtime, nlink)
# File data: without kernel_cache/auto_cache (both off by default) FUSE drops a file's page
# cache at every open(), so a reader sees the other client's content from the next open on.
# direct_io is deliberately NOT used: it would also make mmap() fail (ENODEV), which real
# sshfs deployments do not have, so tests would fail for reasons that are not castore's.
# Hard links need no option: sshfs 3.x sends link() as the hardlink@openssh.com extension
# unless -o disable_hardlink is given. rename() uses posix-rename@openssh.com (atomic
# replace); -o workaround=rename must stay off because it emulates it non-atomically.
CACHE_OPTIONS = ("dir_cache=no", "entry_timeout=0", "negative_timeout=0", "attr_timeout=0")


COMMIT_MS = 4.0  # a commit through one sshfs client, measured (docs/results/benchmarks.md)
SshfsPair = TwoMounts


class SshfsUnavailable(EngineUnavailable):
    """This host cannot run sshfs mounts (no FUSE, no sshfs or no sshd)."""


def missing_prerequisites() -> str | None:
    """Why sshfs mounts cannot work on this host, or None if they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror}); a container needs --device /dev/fuse"
    for tool in ("sshfs", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run .ci/install-sshfs.sh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (run .ci/install-sshfs.sh)"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "neither fusermount3 nor fusermount is installed (install fuse3)"
    return None


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "castore-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _sshd_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(2)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _start_sshd(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """sshd -D on a free port of 127.0.0.1 with a config, keys and log of its own."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    log = tmp / "sshd.log"
    last = ""
    for _ in range(3):  # the free port can be taken before sshd binds it: try another
        port = free_port()
        config = tmp / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {port}",
                    f"HostKey {tmp / 'host_key'}",
                    f"PidFile {tmp / 'sshd.pid'}",
                    f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "StrictModes no",
                    "UsePAM no",
                    "UseDNS no",
                    "Subsystem sftp internal-sftp",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        with log.open("ab") as log_file:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if _sshd_answers(port):
                return proc, port
            time.sleep(0.05)
        _terminate(proc)
        last = tail(log)
    raise RuntimeError(f"sshd did not start on 127.0.0.1; its log ends with:\n{last}")


def _terminate(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _mount(
    tmp: Path, port: int, export: Path, mountpoint: Path, log: Path
) -> subprocess.Popen[bytes]:
    """One sshfs client in the foreground (-f), so that this process owns it by its pid."""
    options = [
        f"IdentityFile={tmp / 'client_key'}",
        "IdentitiesOnly=yes",
        "StrictHostKeyChecking=no",
        "UserKnownHostsFile=/dev/null",
        "BatchMode=yes",
        "LogLevel=ERROR",
        "ServerAliveInterval=5",
        "ServerAliveCountMax=3",
        "reconnect",
        *CACHE_OPTIONS,
    ]
    with log.open("ab") as log_file:
        proc = subprocess.Popen(
            [
                "sshfs",
                "-f",
                "-p",
                str(port),
                "-o",
                ",".join(options),
                f"root@127.0.0.1:{export}",
                str(mountpoint),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    _terminate(proc)
    text = tail(log)
    if "fuse: device not found" in text or "Operation not permitted" in text:
        raise SshfsUnavailable(f"FUSE mounts are not permitted here: {text}")
    raise RuntimeError(f"sshfs did not mount {mountpoint}; its log ends with:\n{text}")


def _wait_for_children(pid: int, timeout: float = 3.0) -> None:
    """Give sshd's per-connection children time to exit, so it reaps them itself."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not children.read_text().strip():
                return
        except OSError:
            return
        time.sleep(0.05)


def _unmount(mountpoint: Path, proc: subprocess.Popen[bytes] | None) -> bool:
    """Unmount and stop the sshfs client; True if the mount point is free again."""
    tools = [t for t in ("fusermount3", "fusermount") if shutil.which(t)]
    attempts = [[tools[0], "-u", str(mountpoint)]] if tools else []
    attempts += [[tools[0], "-u", "-z", str(mountpoint)]] if tools else []
    attempts += [["umount", "-l", str(mountpoint)]]
    for cmd in attempts:
        if not os.path.ismount(mountpoint):
            break
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(cmd, capture_output=True, timeout=15, check=False)
    if proc is not None:
        _terminate(proc)  # exits by itself once unmounted; this catches a stuck one
    return not os.path.ismount(mountpoint)


@contextlib.contextmanager
def mount_sshfs_pair(workdir: Path) -> Iterator[SshfsPair]:
    """Serve `workdir/export` over sshd and mount it twice; tear everything down on exit."""
    reason = missing_prerequisites()
    if reason is not None:
        raise SshfsUnavailable(reason)
    tmp = workdir / "ssh"
    tmp.mkdir(mode=0o700)
    export, mount_a, mount_b = workdir / "export", workdir / "mount-a", workdir / "mount-b"
    for d in (export, mount_a, mount_b):
        d.mkdir()
    sshd: subprocess.Popen[bytes] | None = None
    clients: dict[Path, subprocess.Popen[bytes]] = {}
    try:
        _keygen(tmp / "host_key")
        _keygen(tmp / "client_key")
        (tmp / "authorized_keys").write_bytes((tmp / "client_key.pub").read_bytes())
        sshd, port = _start_sshd(tmp)
        for mountpoint in (mount_a, mount_b):
            log = tmp / f"sshfs-{mountpoint.name}.log"
            clients[mountpoint] = _mount(tmp, port, export, mountpoint, log)
        yield TwoMounts("sshfs", export, mount_a, mount_b, False, COMMIT_MS)
    finally:
        freed = [_unmount(mp, clients.get(mp)) for mp in (mount_a, mount_b)]
        if sshd is not None:
            _wait_for_children(sshd.pid)
            _terminate(sshd)
        if all(freed):  # never walk into a mount that is still there
            shutil.rmtree(workdir, ignore_errors=True)

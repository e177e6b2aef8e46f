"""castore doctor: filesystem capability checks, locally and across two sshfs clients."""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sshfs import SshfsPair, mount_sshfs_pair

from castore import doctor
from castore.cli import main
from castore.doctor import flush, run_doctor
from castore.errors import UsageError
from castore.medium import flushpolicy, fsio, mountinfo

REQUIRED = {
    "scratch-directory",
    "exclusive-create",
    "link-exclusive",
    "rename-over",
    "directory-fsync",
    "file-fsync",
    "o-nofollow",
    "exclusive-create-race",
    "link-race",
}


def _listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def test_local_directory_is_safe_and_left_as_found(tmp_path: Path) -> None:
    (tmp_path / "existing-file").write_text("keep me")
    (tmp_path / "existing-dir").mkdir()
    before = _listing(tmp_path)

    report = run_doctor(tmp_path)

    assert _listing(tmp_path) == before  # the scratch directory is gone again
    assert report.path == str(tmp_path)
    assert report.peer is None
    required = {c.name: c for c in report.checks if c.required}
    assert set(required) == REQUIRED
    assert {name: c.verdict for name, c in required.items()} == dict.fromkeys(REQUIRED, "ok")
    assert report.safe
    assert all(c.detail for c in report.checks)
    assert report.check("flock-coherent").verdict == "ok"  # one local client: flock is coherent
    assert "exactly one winner" in report.check("exclusive-create-race").detail
    as_json = json.loads(json.dumps(report.to_json()))
    assert as_json["safe"] is True
    assert [c["name"] for c in as_json["checks"]] == [c.name for c in report.checks]
    assert "safe for castore" in report.to_text()


def test_not_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UsageError, match="is not a directory"):
        run_doctor(a_file)
    with pytest.raises(UsageError, match="is not a directory"):
        run_doctor(tmp_path / "missing")
    with pytest.raises(UsageError, match=r"peer .* is not a directory"):
        run_doctor(tmp_path, peer=a_file)
    assert _listing(tmp_path) == ["file"]


def test_broken_link_fails_link_exclusive_and_makes_it_unsafe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted", str(dst))

    monkeypatch.setattr(os, "link", no_links)
    report = run_doctor(tmp_path)

    link = report.check("link-exclusive")
    assert link.verdict == "fail"
    assert link.required
    assert "EPERM" in link.detail
    assert "link() does not work here" in link.detail
    assert "Traceback" not in link.detail
    assert not report.safe
    assert report.check("exclusive-create").verdict == "ok"  # checks are independent
    assert "NOT SAFE" in report.to_text()
    assert _listing(tmp_path) == []


@pytest.mark.parametrize(
    ("code", "verdict", "safe"), [(errno.EINVAL, "warn", True), (errno.EIO, "fail", False)]
)
def test_directory_fsync_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, verdict: str, safe: bool
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    report = run_doctor(tmp_path)

    check = report.check("directory-fsync")
    assert check.verdict == verdict
    assert errno.errorcode[code] in check.detail
    assert report.safe is safe
    assert report.check("file-fsync").verdict == "ok"


def test_peer_that_is_another_directory_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor.settings, "VISIBILITY_TIMEOUT", 0.2)
    path, other = tmp_path / "path", tmp_path / "other"
    path.mkdir()
    other.mkdir()

    report = run_doctor(path, peer=other)

    peer = report.check("peer-same-directory")
    assert peer.verdict == "fail"
    assert "not a second view of the same directory" in peer.detail
    assert not report.safe
    assert "peer part not run" in report.check("exclusive-create").detail
    assert _listing(path) == []
    assert _listing(other) == []


# --- flush-path: how commits are made durable here ---------------------------------------------


def _filesystem_is(fstype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """flushpolicy sees `fstype` on a Linux 6.1 host, CASTORE_FLUSH=syncfs; the doctor's own
    filesystem check still reads the real mount table."""
    monkeypatch.setenv(flushpolicy.ENV, "syncfs")
    monkeypatch.setattr(mountinfo, "mount_of", lambda path: (fstype, "/dev/x", "/"))
    monkeypatch.setattr(
        os, "uname", lambda: os.uname_result(("Linux", "h", "6.1.0", "#1", "x86_64"))
    )


def _recording_syncfs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the st_mode of every descriptor fsio.syncfs is given, then really call it."""
    calls: list[int] = []
    real_syncfs = fsio.syncfs

    def syncfs(fd: int) -> None:
        calls.append(os.fstat(fd).st_mode)
        real_syncfs(fd)

    monkeypatch.setattr(fsio, "syncfs", syncfs)
    return calls


def test_flush_path_on_a_local_disk_times_syncfs_against_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where commits share a syncfs, flush-path says so, runs syncfs on the checked directory's
    filesystem and reports its time next to one file's fsync."""
    if not fsio.syncfs_available():
        pytest.skip("this C library has no syncfs")
    _filesystem_is("ext4", monkeypatch)
    calls = _recording_syncfs(monkeypatch)

    report = run_doctor(tmp_path)

    check = report.check("flush-path")
    assert ("ok", False) == (check.verdict, check.required)
    assert check.detail.startswith("ext4 on a local disk: concurrent commits share one syncfs")
    assert "syncfs here works: " in check.detail
    assert f"for one file's fsync (median of {flush.ROUNDS})" in check.detail
    assert [stat.S_IFDIR] * flush.ROUNDS == [stat.S_IFMT(mode) for mode in calls]
    assert report.safe
    assert _listing(tmp_path) == []


def test_flush_path_warns_but_stays_safe_when_syncfs_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A syncfs that fails is a warning naming the error and CASTORE_FLUSH=fsync, never
    'unsafe': every commit can still take its own fsyncs."""
    _filesystem_is("xfs", monkeypatch)
    monkeypatch.setattr(fsio, "syncfs_available", lambda: True)

    def failing_syncfs(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fsio, "syncfs", failing_syncfs)
    report = run_doctor(tmp_path)

    check = report.check("flush-path")
    assert "warn" == check.verdict
    assert "syncfs here failed with EIO" in check.detail
    assert "set CASTORE_FLUSH=fsync" in check.detail
    assert report.safe
    assert "safe for castore" in report.to_text()


@pytest.mark.parametrize("fstype", ["fuse.sshfs", "fuse.glusterfs", "nfs4", "ceph"])
def test_flush_path_on_fuse_and_network_filesystems_flushes_file_by_file(
    fstype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On FUSE and network filesystems flush-path says castore flushes file by file and relies
    on the directory fsync, and never calls syncfs there."""
    _filesystem_is(fstype, monkeypatch)
    calls = _recording_syncfs(monkeypatch)

    report = run_doctor(tmp_path)

    check = report.check("flush-path")
    assert "ok" == check.verdict
    assert check.detail.startswith(f"{fstype}: ")
    assert "castore flushes file by file here" in check.detail
    assert "the directory-fsync check is what it relies on" in check.detail
    assert [] == calls
    assert report.safe


def test_flush_path_names_a_forced_fsync_and_an_unknown_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CASTORE_FLUSH=fsync is reported as the reason for flushing file by file; an unknown
    value is a warning that names the allowed values, and the verdict stays safe."""
    _filesystem_is("ext4", monkeypatch)
    monkeypatch.setenv(flushpolicy.ENV, "fsync")
    forced = run_doctor(tmp_path).check("flush-path")
    assert "ok" == forced.verdict
    assert forced.detail.startswith("CASTORE_FLUSH=fsync: every commit flushes its own files")

    monkeypatch.setenv(flushpolicy.ENV, "always")
    report = run_doctor(tmp_path)
    check = report.check("flush-path")
    assert "warn" == check.verdict
    assert "CASTORE_FLUSH='always' is not a flush mode" in check.detail
    assert "'auto'" in check.detail
    assert "'fsync'" in check.detail
    assert report.safe


def test_doctor_json_includes_flush_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore doctor --json` lists flush-path as an informational check, after the others,
    whose detail is the policy decided for that directory."""
    assert 0 == main(["doctor", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert "flush-path" == report["checks"][-1]["name"]
    assert (False, True) == (checks["flush-path"]["required"], report["safe"])
    assert checks["flush-path"]["verdict"] in ("ok", "warn")
    reason = flushpolicy.decide(str(tmp_path)).reason
    assert checks["flush-path"]["detail"].startswith(reason)


# --- across two sshfs clients of one export -----------------------------------------------------


@pytest.mark.sshfs
def test_doctor_across_two_sshfs_clients(sshfs_pair: SshfsPair) -> None:
    export, mount_a, mount_b = sshfs_pair.new_dir("doctor")

    report = run_doctor(mount_a, peer=mount_b)

    verdicts = {c.name: c.verdict for c in report.checks}
    assert report.safe, report.to_text()
    assert verdicts["peer-same-directory"] == "ok"
    for name in ("exclusive-create", "link-exclusive", "rename-over", "file-fsync", "o-nofollow"):
        assert verdicts[name] == "ok", report.to_text()
        assert "peer" in report.check(name).detail
    # Exactly one winner in every cross-client round. The loser, though, usually gets EPERM,
    # not EEXIST: SFTP v3 has no "already exists" status, so OpenSSH's sftp-server answers
    # SSH_FX_FAILURE and sshfs maps that to EPERM. Only when the loser's own lookup already
    # sees the name does its kernel say EEXIST. The doctor reports that as a warning.
    for name in ("exclusive-create-race", "link-race"):
        check = report.check(name)
        assert check.verdict in ("ok", "warn"), report.to_text()
        assert f"{doctor.settings.RACE_ROUNDS}/{doctor.settings.RACE_ROUNDS}" in check.detail
        assert "exactly one winner" in check.detail
        if check.verdict == "warn":
            assert "EPERM" in check.detail
    # Measured: flock is per sshfs client (FUSE handles it in each client's kernel).
    assert verdicts["flock-coherent"] == "warn"
    assert "through peer it also gets the lock" in report.check("flock-coherent").detail
    assert not report.check("flock-coherent").required
    assert "fuse.sshfs" in report.check("filesystem").detail
    assert _listing(export) == []


@pytest.mark.sshfs
def test_doctor_on_one_sshfs_client(sshfs_pair: SshfsPair) -> None:
    export, mount_a, _ = sshfs_pair.new_dir("doctor-one")

    report = run_doctor(mount_a)

    assert report.safe, report.to_text()
    # Within one client the kernel serialises the lookup+create, so losers get EEXIST.
    assert report.check("exclusive-create-race").verdict == "ok"
    assert report.check("link-race").verdict == "ok"
    assert report.check("flock-coherent").verdict == "ok"
    flush_path = report.check("flush-path")
    assert "ok" == flush_path.verdict
    assert flush_path.detail.startswith("fuse.sshfs: a FUSE server may ignore syncfs")
    assert "castore flushes file by file here" in flush_path.detail
    assert _listing(export) == []


LINK_RACER = r"""
import os, sys
directory, me = sys.argv[1], sys.argv[2]
flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
for line in sys.stdin:
    verb, i = line.split()
    temp = os.path.join(directory, f"tmp-{me}-{i}")
    if verb == "prep":
        fd = os.open(temp, flags, 0o600)
        try:
            os.write(fd, f"{me}:{i}:".encode() * 500)
            os.fsync(fd)
        finally:
            os.close(fd)
        print("ready", flush=True)
        continue
    try:
        os.link(temp, os.path.join(directory, f"round-{i}"))
    except OSError as exc:
        print("lost", exc.errno, flush=True)
    else:
        print("won", 0, flush=True)
    os.unlink(temp)
"""

LINK_ROUNDS = 200


def _answer(who: str, proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"racer {who} did not answer within {timeout}s"
    return proc.stdout.readline().strip()


@pytest.mark.sshfs
@pytest.mark.timeout(120)
def test_link_race_across_two_sshfs_clients(sshfs_pair: SshfsPair) -> None:
    """castore's commit point, directly: link() onto one name from two clients at once."""
    export, mount_a, mount_b = sshfs_pair.new_dir("link-race")
    racers = {
        who: subprocess.Popen(
            [sys.executable, "-I", "-c", LINK_RACER, str(where), who],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        for who, where in (("a", mount_a), ("b", mount_b))
    }
    wins: Counter[str] = Counter()
    loser_errors: Counter[str] = Counter()
    started = time.monotonic()
    try:
        for i in range(LINK_ROUNDS):
            for verb in ("prep", "go"):
                for proc in racers.values():
                    assert proc.stdin is not None
                    proc.stdin.write(f"{verb} {i}\n")
                    proc.stdin.flush()
                answers = {who: _answer(who, proc) for who, proc in racers.items()}
            assert verb == "go"
            winners = [who for who, ans in answers.items() if ans == "won 0"]
            assert len(winners) == 1, f"round {i}: {answers}"
            (winner,) = winners
            (loser,) = set(racers) - {winner}
            code = int(answers[loser].split()[1])
            # EEXIST, or EPERM when both lookups missed and the server refused the second
            # link: sshfs turns SFTP's generic failure into EPERM (see the doctor test).
            assert code in (errno.EEXIST, errno.EPERM), f"round {i}: {answers}"
            wins[winner] += 1
            loser_errors[errno.errorcode[code]] += 1
            published = export / f"round-{i}"
            assert published.read_bytes() == f"{winner}:{i}:".encode() * 500
    finally:
        for proc in racers.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=10)
    elapsed = time.monotonic() - started
    names = _listing(export)
    assert names == sorted(f"round-{i}" for i in range(LINK_ROUNDS))  # no temp file left over
    assert all((export / n).stat().st_nlink == 1 for n in names)  # only the one published name
    print(
        f"\n{LINK_ROUNDS} link races in {elapsed:.2f}s: wins {dict(wins)}, "
        f"losers got {dict(loser_errors)}"
    )


@pytest.mark.sshfs
def test_sshfs_helper_tears_down_even_when_the_body_fails(
    sshfs_pair: SshfsPair, tmp_path: Path
) -> None:
    # sshfs_pair (unused) makes this skip, or fail under CI, where sshfs cannot run.
    workdir = tmp_path / "pair"
    workdir.mkdir()
    mounts: list[Path] = []

    def failing_test_body() -> None:
        with mount_sshfs_pair(workdir) as pair:
            mounts.extend([pair.mount_a, pair.mount_b])
            assert all(os.path.ismount(m) for m in mounts)
            (pair.mount_a / "hello").write_text("from a")
            assert (pair.mount_b / "hello").read_text() == "from a"
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_test_body()
    assert len(mounts) == 2
    assert not any(os.path.ismount(m) for m in mounts)
    assert not workdir.exists()

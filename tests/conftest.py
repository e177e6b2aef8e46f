"""Shared fixtures: `sshfs_pair`, two sshfs clients of one export (see tests/sshfs.py), and
`two_mounts`, two clients of one directory on each engine in turn: sshfs, GlusterFS with its
caches off and with its defaults, CephFS (tests/twomounts.py, glusterfs.py, cephfs.py).

Also: the Hypothesis profiles ("ci": derandomised and quick, the default; "deep": 2,000
examples, for local runs: HYPOTHESIS_PROFILE=deep), a fresh `store` per test, and
`tree_snapshot` (tests/helpers.py) for byte-identical comparisons of a directory tree.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId  # pytest 9.2's structured node id (GroupIds)
from cephfs import mount_ceph_pair
from glusterfs import mount_gluster_pair
from helpers import Entry, tree_snapshot
from hypothesis import settings
from s3servers import S3Endpoint, start_moto, start_rgw
from sshfs import SshfsPair, SshfsUnavailable, mount_sshfs_pair
from twomounts import EngineUnavailable, TwoMounts

import castore


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def sshfs_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshfsPair]:
    """sshd on 127.0.0.1 plus two sshfs mounts of one export, shared by the whole session.

    Skips when the host has no FUSE, sshfs or sshd, except under CI (CI=true), where that is
    a failure: CI installs them (.ci/install-sshfs.sh) and must not skip these tests silently.
    Use `sshfs_pair.new_dir(prefix)` for a fresh directory per test.
    """
    reason = ""
    try:
        with mount_sshfs_pair(tmp_path_factory.mktemp("sshfs")) as pair:
            yield pair
    except SshfsUnavailable as exc:  # raised while mounting, never by a test
        reason = str(exc)
    if reason and _in_ci():
        pytest.fail(f"sshfs tests must run in CI (CI is set), but: {reason}", pytrace=False)
    if reason:
        pytest.skip(f"sshfs unavailable: {reason}")


ENGINES: dict[str, Callable[[Path], contextlib.AbstractContextManager[TwoMounts]]] = {
    "gluster-nocache": lambda workdir: mount_gluster_pair(workdir, caches=False),
    "gluster-default": lambda workdir: mount_gluster_pair(workdir, caches=True),
    "cephfs": mount_ceph_pair,
}


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("sshfs", marks=pytest.mark.sshfs),
        pytest.param("gluster-nocache", marks=pytest.mark.glusterfs),
        pytest.param("gluster-default", marks=pytest.mark.glusterfs),
        pytest.param("cephfs", marks=pytest.mark.cephfs),
    ],
)
def two_mounts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoMounts]:
    """Two clients of one directory, on each engine in turn (an engine's tests run on one
    xdist worker, `xdist_group` below, which stops one engine before it starts its next;
    the other worker may have another engine up meanwhile). Skips when the
    engine's packages or FUSE are missing, except under CI, where that fails; an engine that
    is installed but does not come up is an error everywhere."""
    engine: str = request.param
    if engine == "sshfs":
        yield request.getfixturevalue("sshfs_pair")
        return
    reason = ""
    try:
        with ENGINES[engine](tmp_path_factory.mktemp(engine)) as pair:
            yield pair
    except EngineUnavailable as exc:  # raised while mounting, never by a test
        reason = str(exc)
    if reason and _in_ci():
        pytest.fail(f"{engine} tests must run in CI (CI is set), but: {reason}", pytrace=False)
    if reason:
        pytest.skip(f"{engine} unavailable: {reason}")


S3_ENGINES: dict[str, Callable[[Path], contextlib.AbstractContextManager[S3Endpoint]]] = {
    "moto": start_moto,
    "rgw": start_rgw,
}


@pytest.fixture(
    scope="session",
    params=[pytest.param(engine, marks=pytest.mark.s3) for engine in S3_ENGINES],
)
def s3_endpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[S3Endpoint]:
    """An S3 server on 127.0.0.1, each engine in turn: moto's server (a mock) and a Ceph RADOS
    Gateway (tests/s3servers.py). Skips when its packages are missing, except under CI."""
    engine: str = request.param
    reason = ""
    try:
        with S3_ENGINES[engine](tmp_path_factory.mktemp(engine)) as endpoint:
            yield endpoint
    except EngineUnavailable as exc:
        reason = str(exc)
    if reason and _in_ci():
        pytest.fail(f"{engine} tests must run in CI (CI is set), but: {reason}", pytrace=False)
    if reason:
        pytest.skip(f"{engine} unavailable: {reason}")


@pytest.fixture
def s3(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> S3Endpoint:
    """`s3_endpoint`, with the environment (the boto3 way: AWS_ENDPOINT_URL_S3, keys, region)
    pointing at it, for this process, its children and the CLI."""
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_endpoint


settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# The xdist group of a test that uses a server fixture, by its engine: the group runs on one
# worker, which starts the engine once, and no two workers fight over one port or daemon
# (both Gluster engines share glusterd's fixed port 24007, hence one group).
ENGINE_GROUPS = {
    "sshfs": "sshfs",
    "gluster-nocache": "glusterfs",
    "gluster-default": "glusterfs",
    "cephfs": "cephfs",
    "moto": "moto",
    "rgw": "rgw",
}


def xdist_group(item: pytest.Item) -> str | None:
    """The group `item` must run in under pytest-xdist (addopts: -n 3 --dist loadgroup), or
    None: anywhere. A test module's own module-scoped fixture (a power-loss exploration, a
    template store) is also built once, by keeping that module's users on one worker."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    for fixture in ("two_mounts", "s3_endpoint"):
        if fixture in params:
            return ENGINE_GROUPS[params[fixture]]
    if "sshfs_pair" in item.fixturenames:
        return "sshfs"
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        if defs[-1].scope == "module" and defs[-1].baseid:  # a baseid: not a plugin's
            return f"module:{item.nodeid.split('::')[0]}"
    return None


class GroupIds:
    """What pytest-xdist 3.8's loadgroup does to a grouped test's id (`<id>@<group>`, the
    scheduler's unit), for pytest 9.2, whose Node.nodeid no longer reads the `_nodeid` that
    xdist sets: without it every test is its own unit and two workers start one engine."""

    @pytest.hookimpl(trylast=True)  # after xdist's own attempt
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not getattr(config.option, "loadgroup", False):  # set on an xdist worker
            return
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            suffix = f"@{mark.args[0]}" if mark is not None else ""
            if suffix and not item.nodeid.endswith(suffix):
                item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GroupIds(), "castore-group-ids")
    if not hasattr(config, "workerinput"):  # once, in the process that starts the workers
        _compile_sources()


def _compile_sources() -> None:
    """Write the bytecode of castore and of the tests' helpers before any test runs. The
    suite starts thousands of Python processes (workers it kills and restarts, clients,
    servers); where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), each
    would compile every module it imports from source again, about 0.3 s of CPU apiece.
    Bytecode is still read when that variable is set; only writing it is turned off."""
    project = Path(__file__).resolve().parent.parent
    for tree in ("castore", "tests", "tools"):
        compileall.compile_dir(project / tree, quiet=1, workers=1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test in its xdist group; skip tests marked `slow` unless the -m expression
    asks for them (as the marker says)."""
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow campaign: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    """A fresh, empty store in this test's tmp_path (at tmp_path/"store")."""
    return castore.Store.init(tmp_path / "store")


@pytest.fixture(name="tree_snapshot")
def tree_snapshot_fixture() -> Callable[[str | os.PathLike[str]], dict[str, Entry]]:
    """`tree_snapshot(path)`: relpath -> (mode, size, mtime_ns, sha) of every entry under path."""
    return tree_snapshot


@pytest.fixture(name="children")
def children_fixture() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts (append them): any still alive at the end, stopped ones
    included, are continued and killed by their own pid, whatever the test did."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=60)

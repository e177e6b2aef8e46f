"""A LangGraph saver's reads never write (issue 38, hole 4): the writer is SIGKILLed right
after a seal's commit (HEAD carries the anchor, the mark is behind), and `get_tuple` and
`list` on a read-only store read the thread, and leave every byte of the store as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

from castore import Store
from castore.langgraph import CastoreSaver

WRITER = textwrap.dedent(
    """
    import sys
    from langgraph.checkpoint.base import empty_checkpoint
    from castore import Store
    from castore.langgraph import CastoreSaver, threadlog
    threadlog.SEAL_EVERY = 4  # seal soon: the crash point is the first seal's commit
    saver = CastoreSaver(Store.open(sys.argv[1], create=True))
    parent = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for step in range(12):
        checkpoint = empty_checkpoint()
        version = saver.get_next_version(None, None)
        checkpoint["channel_values"] = {"n": step}
        checkpoint["channel_versions"] = {"n": version}
        metadata = {"source": "loop", "step": step, "parents": {}}
        parent = saver.put(parent, checkpoint, metadata, {"n": version})
    """
)


def _contents(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(path.relative_to(root)): (path.lstat().st_mode, path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_reads_of_a_thread_whose_writer_died_after_sealing_write_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"
    env = {**os.environ, "CASTORE_CRASH_AT": "seal.committed"}
    died = subprocess.run(
        [sys.executable, "-c", WRITER, str(root)], env=env, capture_output=True, check=False
    )
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()
    before = _contents(root)
    # A store that could write (what a saver's reads are given), then a read-only one.
    for store in (Store.open(root), Store.open(root, read_only=True)):
        saver = CastoreSaver(store)
        latest = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest is not None
        # The log seals at its 4th entry: the meta event and 3 puts.
        assert latest.checkpoint["channel_values"] == {"n": 2}
        assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 3
        saver.close()  # its open logs closed, as at the end of a program
        assert _contents(root) == before

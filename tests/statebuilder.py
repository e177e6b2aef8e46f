"""Crash states as real trees, built by changing the previous state rather than from nothing.

tests/test_power_loss.py checks thousands of crash states, each a store of a few dozen
directories and files, most differing from the one checked before by a handful of names.
Building each from an empty directory and removing it afterwards cost more than checking it
(when init made 256 fan-out directories); this builder keeps one tree and applies
to it only what the next state changes: names removed, directories made, files written
anew where their bytes or mode differ, hard links made where an inode gains a name.

A checker that writes to a state (gc's healing, a resumed run) says so (`checker_writes`):
each of its states is built from nothing, as before. Any other checker is castore reading,
which never writes; the builder holds it to that. After a build it lstats every file and
every directory holding a name, and every 32nd build every name of the tree; before the next
build it lstats them again and fails the test if one changed (a name made or removed
changes its directory's size on tmpfs, where timestamps are too coarse: a write in the same
tick leaves them equal; a file replaced has another inode). Without tmpfs (no size per name)
every state is built from nothing. tests/test_statebuilder.py compares the two ways of
building on every state of a real exploration.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

Tree = dict[str, tuple[Any, ...]]  # rel path -> ("d",) | ("f", ino)


def _depth_order(path: str) -> tuple[int, str]:
    return (path.count("/"), path)


def materialize(dest: str, tree: Tree, contents: dict[int, bytes], modes: dict[int, int]) -> None:
    """Build the crash state as a real tree from nothing: one file per inode, more names as
    hard links."""
    os.mkdir(dest)
    first: dict[int, str] = {}
    for path in sorted(tree, key=_depth_order):
        target = tree[path]
        full = os.path.join(dest, path)
        if target[0] == "d":
            os.mkdir(full)
            continue
        _place(full, target[1], contents, modes, first)


def _place(
    full: str, ino: int, contents: dict[int, bytes], modes: dict[int, int], named: dict[int, str]
) -> None:
    """Give inode `ino` the name `full`: a hard link to its file in `named`, else a new file
    with its bytes and mode, then in `named`."""
    if ino in named:
        os.link(named[ino], full)
        return
    with open(full, "xb") as handle:
        handle.write(contents[ino])
    os.chmod(full, modes.get(ino, 0o644))
    named[ino] = full


def remove_trees(paths: list[str]) -> None:
    """rm -rf a batch of trees (shutil.rmtree is 10x slower on 260 dirs each)."""
    if paths:
        subprocess.run(["rm", "-rf", "--", *paths], check=True)
        paths.clear()


class StateBuilder:
    """One real tree under `scratch`, changed into each state asked for."""

    def __init__(
        self, scratch: str, modes: dict[int, int], *, checker_writes: bool = False
    ) -> None:
        self.scratch = scratch
        self.modes = modes
        self.reuses = not checker_writes and _sizes_count_names(scratch)
        self.rebuilt = 0  # states built from nothing (the first; each one without reuse)
        self.changed = 0  # states built by changing the previous one
        self._dest: str | None = None
        self._tree: Tree = {}
        self._contents: dict[int, bytes] = {}
        self._seen: dict[str, tuple[int, ...]] = {}
        self._spent: list[str] = []

    def build(self, tree: Tree, contents: dict[int, bytes]) -> str:
        """The directory that now holds exactly `tree` with `contents` (and modes)."""
        if self._dest is not None and self.reuses:
            self._check_untouched()
        if self._dest is None or not self.reuses:
            self._discard()
            self._dest = os.path.join(self.scratch, f"state-{self.rebuilt}")
            materialize(self._dest, tree, contents, self.modes)
            self.rebuilt += 1
        else:
            self._change(self._dest, tree, contents)
            self.changed += 1
        self._tree, self._contents = tree, contents
        if self.reuses:
            every = (self.rebuilt + self.changed) % 32 == 1
            watched = {"", *tree} if every else _holding_names(tree)
            self._seen = {path: _signature(self._dest, path) for path in watched}
        return self._dest

    def check_last(self) -> None:
        """The last state is as built (the checks of the others come at each build)."""
        if self._dest is not None and self.reuses:
            self._check_untouched()

    def close(self) -> None:
        self._discard()
        remove_trees(self._spent)

    def _discard(self) -> None:
        if self._dest is not None:
            self._spent.append(self._dest)
            self._dest = None
            if len(self._spent) >= 50:
                remove_trees(self._spent)

    def _check_untouched(self) -> None:
        """The names watched since the last build are as it left them: the checker wrote
        nothing (castore reading a store never writes)."""
        assert self._dest is not None
        for path, seen in self._seen.items():
            try:
                now: tuple[int, ...] | None = _signature(self._dest, path)
            except FileNotFoundError:
                now = None
            assert now == seen, f"the checker changed {path or '.'!r} of a crash state"

    def _same_file(self, path: str, tree: Tree, contents: dict[int, bytes]) -> bool:
        old, new = self._tree.get(path), tree.get(path)
        if old is None or new is None or old[0] != "f" or new[0] != "f" or old[1] != new[1]:
            return False
        ino = new[1]
        return self._contents[ino] == contents[ino]  # the same inode keeps its mode

    def _change(self, dest: str, tree: Tree, contents: dict[int, bytes]) -> None:
        old = self._tree
        kept = {
            path for path in old if old[path][0] == "f" and self._same_file(path, tree, contents)
        }
        for path, target in old.items():
            if target[0] == "f" and path not in kept:
                os.unlink(os.path.join(dest, path))
        for path in sorted(old, key=_depth_order, reverse=True):
            if old[path][0] == "d" and tree.get(path, ("f",))[0] != "d":
                os.rmdir(os.path.join(dest, path))
        named: dict[int, str] = {tree[path][1]: os.path.join(dest, path) for path in kept}
        for path in sorted(tree, key=_depth_order):
            target = tree[path]
            full = os.path.join(dest, path)
            if target[0] == "d":
                if old.get(path, ("f",))[0] != "d":
                    os.mkdir(full)
                continue
            if path not in kept:
                _place(full, target[1], contents, self.modes, named)


def _signature(dest: str, path: str) -> tuple[int, ...]:
    info = os.lstat(os.path.join(dest, path))
    return (info.st_ino, info.st_mode, info.st_size, info.st_nlink, info.st_mtime_ns)


def _holding_names(tree: Tree) -> set[str]:
    """Every file of `tree`, and every directory holding a name (and the root)."""
    return {"", *(path for path, target in tree.items() if target[0] == "f")} | {
        os.path.dirname(path) for path in tree
    }


def _sizes_count_names(scratch: str) -> bool:
    """True if a directory's size here changes with each name made in it (tmpfs: the
    check that a checker wrote nothing relies on it)."""
    probe = os.path.join(scratch, "size-probe")
    os.mkdir(probe)
    try:
        before = os.lstat(probe).st_size
        with open(os.path.join(probe, "a"), "xb"):
            pass
        return os.lstat(probe).st_size != before
    finally:
        remove_trees([probe])

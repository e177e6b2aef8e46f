"""The crash-state builder (tests/statebuilder.py) builds exactly the state a fresh tree would:
the same names, bytes, modes and hard links, state after state of a real exploration; and it
fails a test whose read-only checker wrote to a state."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from statebuilder import StateBuilder, Tree, materialize, remove_trees
from test_power_loss import Model, crash_states, real_tree, record, scratch_dir, state_key

# Which states are compared whole with one built from nothing (each costs ~20 ms): of the
# ~2,800 of an interrupted init (directories only: which fan-out mkdirs survived) every 100th,
# of the ~2,500 holding files every 25th. Every state is built, in the exploration's order.
COMPARED_EVERY = {False: 100, True: 25}


def described(root: str) -> dict[str, tuple[Any, ...]]:
    """The real tree at `root`: each directory, and each file with its bytes, its mode and
    the names of its inode (hard links as one group), whatever its inode number."""
    tree, contents, modes = real_tree(Path(root))
    names: dict[int, list[str]] = {}
    for path, target in tree.items():
        if target[0] == "f":
            names.setdefault(target[1], []).append(path)
    return {
        path: ("d",)
        if target[0] == "d"
        else ("f", contents[target[1]], modes[target[1]], tuple(sorted(names[target[1]])))
        for path, target in tree.items()
    }


def distinct_states(model: Model) -> list[tuple[Tree, dict[int, bytes]]]:
    seen: set[frozenset[Any]] = set()
    found = []
    for _, _, _, tree, contents in crash_states(model):
        key = state_key(tree, contents)
        if key not in seen:
            seen.add(key)
            found.append((tree, contents))
    return found


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    return Model(record(tmp_path_factory.mktemp("builder") / "base"))


@pytest.fixture(scope="module")
def states(model: Model) -> list[tuple[Tree, dict[int, bytes]]]:
    return distinct_states(model)


def test_every_state_built_by_change_equals_the_state_built_from_nothing(
    model: Model, states: list[tuple[Tree, dict[int, bytes]]], tmp_path: Path
) -> None:
    assert len(states) > 1000  # a real exploration: init, commits, a batch, an effect
    with scratch_dir(tmp_path) as scratch:
        builder = StateBuilder(str(scratch), model.modes)
        assert builder.reuses  # tmpfs: the states below are built by change
        fresh = os.path.join(scratch, "fresh")
        try:
            for index, (tree, contents) in enumerate(states):
                built = builder.build(tree, contents)
                holds_files = any(target[0] == "f" for target in tree.values())
                if index % COMPARED_EVERY[holds_files] and index != len(states) - 1:
                    continue
                materialize(fresh, tree, contents, model.modes)
                assert described(fresh) == described(built), f"state {index}"
                remove_trees([fresh])
            builder.check_last()
        finally:
            builder.close()
    assert (1, len(states) - 1) == (builder.rebuilt, builder.changed)


def test_a_read_only_checker_that_writes_fails_the_test(
    model: Model, states: list[tuple[Tree, dict[int, bytes]]], tmp_path: Path
) -> None:
    """A name made where the state holds names is seen at the next build."""
    (first, first_contents), (second, second_contents) = states[-2:]
    with scratch_dir(tmp_path) as scratch:
        builder = StateBuilder(str(scratch), model.modes)
        try:
            built = builder.build(first, first_contents)
            slot = next(path for path in first if "/chain/" in path)
            Path(built, slot + ".planted").write_bytes(b"")
            with pytest.raises(AssertionError, match="the checker changed"):
                builder.build(second, second_contents)
        finally:
            builder.close()


def test_a_checker_that_writes_gets_every_state_built_from_nothing(
    model: Model, states: list[tuple[Tree, dict[int, bytes]]], tmp_path: Path
) -> None:
    with scratch_dir(tmp_path) as scratch:
        builder = StateBuilder(str(scratch), model.modes, checker_writes=True)
        try:
            for tree, contents in states[-3:]:
                built = builder.build(tree, contents)
                assert set(tree) == set(described(built))  # nothing the last checker wrote
                Path(built, "written-by-the-checker").write_bytes(b"")
        finally:
            builder.close()
    assert (3, 0) == (builder.rebuilt, builder.changed)

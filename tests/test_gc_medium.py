"""gc through a medium without hard links (FORMAT.md §19): there `link` is a copy, made when
gc sets an object aside, so the copy's age says nothing of the object's. The medium here is
the POSIX directory with `aliases` False and a `link` that copies (as S3's server-side copy
does), which is what gc's set-aside and put back must work with."""

from __future__ import annotations

import os
import time
from pathlib import Path

import castore
from castore.format.layout import object_relpath, parse_temp_name
from castore.maintenance.gc import collect
from castore.medium.posix import PosixMedium

PLAN = castore.Plan.build("gcm", "a", "b")
DAY = 86400.0


class CopyingMedium(PosixMedium):
    """A POSIX store whose `link` writes a new file with the source's bytes (its mtime is
    now), and that says it has no hard links."""

    aliases = False

    def link(self, source: str, key: str) -> bool:
        return self.create(key, self.read(source))


def aged(store: castore.Store, object_id: str, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(store.objects.path(object_id), (then, then))


def temp_files(store: castore.Store) -> list[str]:
    return [p.name for p in Path(store.root).rglob("*") if parse_temp_name(p.name)]


def test_gc_through_a_copying_medium_removes_old_garbage_and_keeps_what_a_slot_names(
    tmp_path: Path,
) -> None:
    """Without hard links gc removes an old unnamed blob (its set-aside copy is young: that
    is not the object's age) and keeps an old blob a commit names; no copy is left."""
    medium = CopyingMedium(str(tmp_path / "store"))
    store = castore.Store.init(medium)
    named = store.put_blob({"named": True})
    with store.start("t", PLAN) as run:
        run.commit_step("a", named)
    garbage = store.put_blob({"garbage": True}).blob
    for object_id in (named.blob, garbage):
        aged(store, object_id, 30)
    report = collect(medium, grace_s=14 * DAY)
    assert [object_relpath(garbage)] == report.removed
    assert (False, True) == (store.objects.exists(garbage), store.objects.exists(named.blob))
    assert [] == temp_files(store)


def test_a_refresh_between_the_copy_and_the_removal_keeps_the_object(tmp_path: Path) -> None:
    """A writer refreshes an old unnamed blob right after gc copied it aside: gc looks at
    the object's own age once more before its name goes, and leaves it where it is."""
    blob: list[str] = []

    class RefreshedAfterTheCopy(CopyingMedium):
        def link(self, source: str, key: str) -> bool:
            copied = super().link(source, key)
            if blob and source == object_relpath(blob[0]):
                assert self.touch(source)  # the writer's refresh (a put of the same blob)
            return copied

    medium = RefreshedAfterTheCopy(str(tmp_path / "store"))
    store = castore.Store.init(medium)
    blob.append(store.put_blob({"refreshed": True}).blob)
    aged(store, blob[0], 30)
    report = collect(medium, grace_s=14 * DAY)
    assert [] == report.removed
    assert store.objects.exists(blob[0])
    assert {"refreshed": True} == store.get_blob(blob[0])
    assert [] == temp_files(store)

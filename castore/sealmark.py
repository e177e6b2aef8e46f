"""The sealed mark `tasks/<task>/sealed`: how far a task's slots may be pruned.

Slots 0 … `through` of a task whose mark says `through` may be gone; every slot above it, up
to HEAD, is there. A mark is written only after a durable commit above `through` names the
pack holding `through` (or is the task's tombstone), so HEAD is always above it, and it only
ever grows.

Pruning frees slot names a stale writer (one that paused since HEAD was lower) could still
link(): the link would succeed, an acknowledged commit outside the chain. So every commit
reads the mark after its link and before it is acknowledged (refs.py): a link into a pruned
range happened after its name was freed, hence after the mark that allowed it was durable,
hence that read sees it, and the writer takes its slot back and loses (docs/FORMAT.md §9.5).
"""

from __future__ import annotations

import os

import attrs

from castore import codec, crashpoints, fsio
from castore.errors import ChainError, OversizedFileError, UnsafeFileError
from castore.layout import MARK_NAME, MAX_SEQ, validate_object_id

# A mark is one short line; anything longer was not written by castore.
_MAX_MARK = 256


@attrs.frozen
class Mark:
    """Slots up to `through` may be pruned; `pack` holds sequence `through` (None: the task
    was forgotten, and what it named is reclaimed rather than sealed)."""

    pack: str | None
    through: int

    def encode(self) -> bytes:
        return codec.encode_value({"pack": self.pack, "through": self.through}) + b"\n"


def _damaged(task_id: str, path: str, why: str) -> ChainError:
    return ChainError(task_id, f"its sealed mark {path} is damaged: {why}", path)


def parse(task_id: str, path: str, data: bytes) -> Mark:
    """The mark these bytes are, or ChainError saying why they are not one castore wrote."""
    try:
        value = codec.decode_value(data[:-1]) if data.endswith(b"\n") else None
    except ValueError as exc:
        raise _damaged(task_id, path, f"not canonical JSON ({exc})") from None
    if not isinstance(value, dict) or sorted(value) != ["pack", "through"]:
        raise _damaged(task_id, path, 'not a {"pack": …, "through": …} line')
    pack, through = value["pack"], value["through"]
    if type(through) is not int or not 0 <= through < MAX_SEQ:
        raise _damaged(task_id, path, f"`through` is {through!r}, not a sequence number")
    if pack is not None:
        try:
            validate_object_id(pack)
        except ValueError:
            raise _damaged(task_id, path, f"`pack` is {pack!r}, not an object id") from None
    mark = Mark(pack, through)
    if mark.encode() != data:
        raise _damaged(task_id, path, "not in canonical form")
    return mark


def read(task_id: str, task_dir: str) -> Mark | None:
    """The task's mark, None if it has none; ChainError if it cannot be trusted. A mark that
    cannot be read is never taken for no mark: that would hide every slot below it."""
    path = os.path.join(task_dir, MARK_NAME)
    try:
        data = fsio.read_regular(path, limit=_MAX_MARK)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise _damaged(task_id, path, f"it is a {exc.found}, not a regular file") from None
    except OversizedFileError:
        raise _damaged(task_id, path, f"it is over {_MAX_MARK} bytes") from None
    return parse(task_id, path, data)


def write(task_dir: str, mark: Mark) -> None:
    """Durably replace the task's mark with `mark` (the caller checked it only grows)."""
    crashpoints.reach("mark.before_write")
    fsio.replace_file(task_dir, MARK_NAME, mark.encode())
    crashpoints.reach("mark.written")

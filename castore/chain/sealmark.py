"""The sealed mark of a task: how far its slots may be pruned, moved only forward, and only by
an exclusive create (docs/FORMAT.md §9.7).

Slots 0 … `through` of a task whose mark says `through` may be gone; every slot above it, up
to HEAD, is there. A mark is set only after a durable commit above `through` names the pack
holding `through` (or is the task's tombstone), so HEAD is always above it.

The mark is a sequence of generations `tasks/<task>/marks/<gen>`, each a file created once
with link() and never changed or removed; the mark is the newest generation. Generation g + 1
is created only by a writer that read generation g and is ahead of it, so two sealers (or a
sealer and gc) that race for the same number meet at the exclusive create: one wins, the other
reads the winner's and writes again only if it is still ahead. However long any of them paused
between reading and writing, the mark never goes back: there is nothing to write over. (The
earlier single file `tasks/<task>/sealed`, replaced by rename, let a stalled sealer move the
mark back over a newer one; stores that hold one are read with it as the mark's floor, and it
is never written again.)

Pruning frees slot names a stale writer (one that paused since HEAD was lower) could still
link(): the link would succeed, an acknowledged commit outside the chain. So every commit
reads the mark after its link and before it is acknowledged (refs.py): a link into a pruned
range happened after its name was freed, hence after the generation that allowed it was
durable, hence that read sees it, and the writer takes its slot back and loses.
"""

from __future__ import annotations

from castore import crashpoints
from castore.errors import ChainError, OversizedFileError, UnsafeFileError
from castore.format import codec, layout
from castore.format.layout import LEGACY_MARK_NAME, MARKS_DIR, MAX_SEQ, validate_object_id
from castore.format.model import attrs
from castore.medium.base import Medium

# A mark is one short line; anything longer was not written by castore.
_MAX_MARK = 256
# Each lost race means another writer moved the mark; this many in a row is not a race.
_ADVANCE_TRIES = 1000


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


def read_file(medium: Medium, task_id: str, key: str) -> Mark | None:
    """The mark file `key`, None if there is none; ChainError if it cannot be trusted. A mark
    that cannot be read is never taken for no mark: that would hide every slot below it."""
    path = medium.where(key)
    try:
        data = medium.read(key, limit=_MAX_MARK)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise _damaged(task_id, path, f"it is a {exc.found}, not a regular file") from None
    except OversizedFileError:
        raise _damaged(task_id, path, f"it is over {_MAX_MARK} bytes") from None
    return parse(task_id, path, data)


def newer(first: Mark | None, second: Mark | None) -> Mark | None:
    """The one of two marks that lets more be pruned (the later, since marks only grow)."""
    if first is None or (second is not None and second.through > first.through):
        return second
    return first


class TaskMarks:
    """The mark of one task, read and moved forward. Generations are immutable, so what was
    read of one is kept; only whether a newer one exists is asked again (one lookup)."""

    def __init__(self, medium: Medium, task_id: str, task_key: str) -> None:
        self.task_id = task_id
        self.medium = medium
        self.task_key = task_key
        self.directory = f"{task_key}/{MARKS_DIR}"
        self._newest = -1  # the highest generation known to exist (-1: none seen yet)
        self._read: dict[int, Mark] = {}
        self._legacy: tuple[Mark | None] | None = None  # read once: nothing writes it now

    def key(self, generation: int) -> str:
        return f"{self.directory}/{layout.slot_name(generation)}"

    def path(self, generation: int) -> str:
        """Where generation `generation` is, as a person is told."""
        return self.medium.where(self.key(generation))

    def legacy(self) -> Mark | None:
        """The pre-revision file `tasks/<task>/sealed`, if the store has one (its floor)."""
        if self._legacy is None:
            key = f"{self.task_key}/{LEGACY_MARK_NAME}"
            self._legacy = (read_file(self.medium, self.task_id, key),)
        return self._legacy[0]

    def started(self) -> bool:
        """True if the task has a mark at all (a task whose slot 0 was pruned has started)."""
        return self.medium.exists(self.key(0)) or self.medium.exists(
            f"{self.task_key}/{LEGACY_MARK_NAME}"
        )

    def _exists(self, generation: int) -> bool:
        return self.medium.exists(self.key(generation))

    def newest_generation(self) -> int | None:
        """The highest generation present (None: none), by the search HEAD lookup uses
        (FORMAT.md 9.4), started from the newest one seen: usually one lookup."""
        exists = self._exists
        low = self._newest
        if low < 0:
            if not exists(0):
                return None
            low = 0
        base, high = low, low + 1  # invariant: generation `low` exists
        while exists(high):
            low, high = high, base + 2 * (high - base)
        while high - low > 1:
            middle = (low + high) // 2
            if exists(middle):
                low = middle
            else:
                high = middle
        self._newest = low
        return low

    def generation(self, number: int) -> Mark:
        """Generation `number`'s mark (ChainError if it is missing or damaged)."""
        mark = self._read.get(number)
        if mark is None:
            found = read_file(self.medium, self.task_id, self.key(number))
            if found is None:
                raise _damaged(
                    self.task_id, self.path(number), "a generation below the newest is missing"
                )
            mark = self._read[number] = found
        return mark

    def current(self) -> Mark | None:
        """The task's mark now: its newest generation (or the legacy floor, if higher)."""
        number = self.newest_generation()
        mark = None if number is None else self.generation(number)
        return newer(self.legacy(), mark)

    def advance(self, want: Mark) -> Mark:
        """Move the mark to at least `want` (the caller knows a durable commit allows it):
        create the next generation if the mark is behind `want`, never overwrite one. Returns
        the mark now, which is `want` or one already past it."""
        for _ in range(_ADVANCE_TRIES):
            number = self.newest_generation()
            mark = newer(self.legacy(), None if number is None else self.generation(number))
            if mark is not None and mark.through >= want.through:
                return mark
            self.medium.make_dir(self.directory)
            crashpoints.reach("mark.before_write")
            following = 0 if number is None else number + 1
            if self.medium.create(self.key(following), want.encode()):
                self._newest, self._read[following] = following, want
                crashpoints.reach("mark.written")
                return want
            # Lost the number to another writer: read what it wrote, then judge again.
        raise ChainError(
            self.task_id,
            f"its sealed mark kept moving while this writer tried {_ADVANCE_TRIES} times to "
            "move it; run the operation again",
            self.medium.where(self.directory),
        )


def started_by_mark(medium: Medium, task_key: str) -> bool:
    """True if the task directory `task_key` holds a mark (generations or the legacy file): a
    task whose slot 0 was pruned has started."""
    return TaskMarks(medium, "", task_key).started()

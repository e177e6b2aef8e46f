"""What each finished step left, for a verified chain: the tail's outcomes in memory, the
sealed ones looked up lazily in the packs that hold them (FORMAT.md 7.5, section 3).

A 1,000,000-step task has a million outcomes; holding them all would cost more than the
resume is allowed to (100 MB). So only the tail's are held; a sealed step is found through
the index of its pack, newest pack first, each pack read and hash-checked again when its
index is not in the bounded cache. Packs never change, so a step found in none of them stays
not-found until the run records it (in the tail).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from castore.chain import packs
from castore.chain.objects import ObjectStore
from castore.errors import CastoreError, ChainError, FormatVersionError, StoreIOError
from castore.format.links import decode_snapshot
from castore.format.model import attrs
from castore.format.records import Snapshot, TransitionKind

# Pack indexes kept in memory: at most this many steps' worth (about 100 bytes each).
_CACHED_STEPS = 1 << 16
_CACHED_MISSES = 1 << 12


@attrs.frozen
class Outcome:
    """What a finished step or effect left: its result (inline or blob) or its receipt;
    `args`, the argument digest of a journaled call; `index`, the step's position (the
    frontier index it was done at)."""

    step: str
    seq: int
    result: Any = None
    result_ref: str | None = None
    receipt: str | None = None
    args: str | None = None
    index: int | None = None

    @property
    def effect(self) -> bool:
        """True for an effect's outcome (a receipt: every receipt is a non-empty str)."""
        return self.receipt is not None


def outcome_of(snapshot: Snapshot) -> Outcome | None:
    """The outcome `snapshot` records, if it records one (a STEP result, a CONFIRMED receipt)."""
    transition = snapshot.transition
    step = packs.outcome_step(snapshot)  # the one rule, which pack indexes follow too
    if step is None:
        return None
    # Both move the frontier one step on: the step was done at the index before.
    index = snapshot.frontier.index - 1
    if transition.kind is TransitionKind.STEP:
        return Outcome(
            step,
            snapshot.seq,
            transition.result,
            transition.result_ref,
            args=transition.args,
            index=index,
        )
    return Outcome(step, snapshot.seq, receipt=transition.receipt, index=index)


def _by_seq(outcome: Outcome) -> int:
    return outcome.seq


def _by_value(item: tuple[str, int]) -> int:
    return item[1]


@attrs.frozen
class PackRef:
    """A pack of a verified chain, as the walk found it."""

    id: str
    first_seq: int
    last_seq: int


class Outcomes(Mapping[str, Outcome]):
    """step id -> its newest Outcome. Lookups cost the tail (a dict) or one pack index each;
    iterating or taking len() reads every pack's index."""

    def __init__(
        self,
        objects: ObjectStore | None = None,
        task: str = "",
        tail: dict[str, Outcome] | None = None,
        sealed: tuple[PackRef, ...] = (),
    ) -> None:
        self._objects = objects
        self._task = task
        self._tail: dict[str, Outcome] = dict(tail or {})
        self._packs = sealed  # newest first
        self._indexes: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._cached = 0
        self._misses: set[str] = set()
        self._found: OrderedDict[str, Outcome] = OrderedDict()
        self._inflated: tuple[str, list[bytes]] | None = None  # the last pack inflated
        self._sealed_hashes: list[array[int]] | None = None  # per pack, sorted: `has`

    @property
    def pack_refs(self) -> tuple[PackRef, ...]:
        return self._packs

    def copy(self) -> Outcomes:
        """Another view of the same outcomes (a run adds its own to it)."""
        return Outcomes(self._objects, self._task, self._tail, self._packs)

    def record(self, outcome: Outcome) -> None:
        """A newer outcome of its step, committed by the run."""
        self._tail[outcome.step] = outcome

    def __getitem__(self, step: str) -> Outcome:
        found = self._tail.get(step) or self._found.get(step)
        if found is not None:
            return found
        if step in self._misses or not self._packs:
            raise KeyError(step)
        for pack in self._candidates(step):
            seq = self._index(pack).get(step)
            if seq is not None:
                return self._load(pack, step, seq)
        if len(self._misses) >= _CACHED_MISSES:
            self._misses.clear()
        self._misses.add(step)
        raise KeyError(step)

    def has(self, step: str) -> bool:
        """True if `step` has an outcome (a growing plan asks it of every step it decides:
        a repeated id is refused)."""
        return step in self

    def _candidates(self, step: str) -> Iterator[PackRef]:
        """The packs that may hold `step`, newest first. Past the newest, a look-up must not
        read every pack's index each time (a replay from position 0 of a long task asks for
        steps of the oldest packs, a new step of a growing plan is in none): the first such
        look-up reads each index once and keeps 8 bytes per sealed step, a sorted array of
        short hashes per pack; a pack is read only when its array has the step's hash."""
        yield self._packs[0]
        if len(self._packs) == 1:
            return
        if self._sealed_hashes is None:
            self._sealed_hashes = [
                array("Q", sorted(_short_hash(name) for name in self._index(pack)))
                for pack in self._packs
            ]
        short = _short_hash(step)
        for pack, hashes in zip(self._packs[1:], self._sealed_hashes[1:], strict=True):
            at = bisect.bisect_left(hashes, short)
            if at < len(hashes) and hashes[at] == short:
                yield pack

    def snapshot_bytes(self, seq: int) -> bytes | None:
        """The framed snapshot at `seq` if a sealed pack of the chain holds it (read and
        hash-checked again), else None. For error messages and rare look-backs only: it
        inflates the pack."""
        for pack in self._packs:
            if pack.first_seq <= seq <= pack.last_seq:
                with self._reading(pack):
                    if self._inflated is None or self._inflated[0] != pack.id:
                        self._inflated = (pack.id, self._read(pack).inflate())
                    return self._inflated[1][seq - pack.first_seq]
        return None

    def __iter__(self) -> Iterator[str]:
        yield from self._tail
        seen = set(self._tail)
        for pack in self._packs:
            for step in self._index(pack):
                if step not in seen:
                    seen.add(step)
                    yield step

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def newest(self, count: int) -> list[Outcome]:
        """The `count` newest outcomes of distinct steps, newest first: the tail's, then the
        newest packs' (at most `count` packs read, so the cost never grows with the history)."""
        found = {o.step: o for o in heapq.nlargest(count, self._tail.values(), key=_by_seq)}
        newer: list[dict[str, int]] = []  # a step a newer pack holds has its newest outcome there
        for pack in self._packs[:count]:
            if len(found) >= count:
                break
            index = self._index(pack)
            for step, seq in heapq.nlargest(count, index.items(), key=_by_value):
                if len(found) >= count or step in self._tail or any(step in n for n in newer):
                    continue
                found[step] = self._load(pack, step, seq)
            newer.append(index)
        return sorted(found.values(), key=_by_seq, reverse=True)

    @contextlib.contextmanager
    def _reading(self, pack: PackRef) -> Iterator[None]:
        """Damage met in a pack after the walk verified it is said as the walk would say it."""
        try:
            yield
        except (ChainError, FormatVersionError, StoreIOError):
            raise
        except CastoreError as exc:
            raise ChainError(self._task, f"pack {pack.id}: {exc}", object_id=pack.id) from exc

    def _read(self, pack: PackRef) -> packs.Pack:
        """A pack of the chain, read and hash-checked again (a file changed since the walk is
        damage)."""
        if self._objects is None:
            raise ChainError(self._task, f"pack {pack.id} read without a store")
        with self._reading(pack):
            return packs.parse(pack.id, self._objects.read(pack.id), self._objects.path(pack.id))

    def _index(self, pack: PackRef) -> dict[str, int]:
        index = self._indexes.get(pack.id)
        if index is not None:
            self._indexes.move_to_end(pack.id)
            return index
        with self._reading(pack):
            index = self._read(pack).index()
        self._indexes[pack.id] = index
        self._cached += len(index)
        while self._cached > _CACHED_STEPS and len(self._indexes) > 1:
            self._cached -= len(self._indexes.popitem(last=False)[1])
        return index

    def _load(self, pack: PackRef, step: str, seq: int) -> Outcome:
        """The outcome of `step` recorded at `seq` inside `pack` (inflating its data)."""
        with self._reading(pack):
            if self._inflated is None or self._inflated[0] != pack.id:
                self._inflated = (pack.id, self._read(pack).inflate())
            framed = self._inflated[1][seq - pack.first_seq]
        outcome = outcome_of(decode_snapshot(self._task, pack.id, framed))
        if outcome is None or outcome.step != step or outcome.seq != seq:
            raise ChainError(
                self._task,
                f"pack {pack.id}: its index puts step {step!r} at {seq}, whose snapshot "
                "records no outcome of it",
                object_id=pack.id,
            )
        self._found[step] = outcome  # a run asks again for what it just read
        if len(self._found) > _CACHED_MISSES:
            self._found.popitem(last=False)
        return outcome


def _short_hash(step: str) -> int:
    """64 bits of a step id, for membership only (a hit is confirmed by the real look-up)."""
    return hash(step) & 0xFFFF_FFFF_FFFF_FFFF

"""Which object ids an object names: the one place gc, fsck and writers learn it from.

A snapshot names its plan, its parent, its `transition.result_ref`, its `sealed.pack` and its
`fork.outcomes` (a tombstone, transition kind `forget`, names its plan only); a tree names the
values of its `refs`; a pack names `prev`, `plans`, `refs` and `first_parent` (its last
snapshot is bytes inside it, not a reference). Plans, blobs and raw objects name nothing.

Some of these ids are *followed*: they may name a tree or a pack, whose own names count too
(result_ref, sealed.pack, fork.outcomes, a tree's refs, a pack's prev and refs). The others
(plan, parent, first_parent, a pack's plans) are kept but never read for more names: a parent
is another slot, and reading it again would make gc read every chain twice.

Bodies are read as they are, unverified, and whatever is well-formed counts: a reader that
keeps objects alive must not trust a checksum to decide what it may delete.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from castore.errors import CastoreError
from castore.format import codec
from castore.format.model import attrs
from castore.medium.base import Medium

# Kinds whose bodies name objects that must be followed further.
FOLLOWED_KINDS = frozenset({"tree", "pack"})
FORGET = "forget"  # the transition kind of a tombstone (V5)


@attrs.frozen
class Names:
    """The ids one object names: `kept` are only kept, `followed` may name more."""

    kept: tuple[str, ...] = ()
    followed: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[str]:
        yield from self.kept
        yield from self.followed


class UnreadableNames(ValueError):
    """An object that may name others (a tree, a pack) whose body cannot be read as one."""


def named_by(kind: str, body: bytes) -> Iterator[str]:
    """Every id the object of `kind` with `body` names (unverified; UnreadableNames if a
    snapshot, tree or pack body cannot be read)."""
    yield from names(kind, body)


def names(kind: str, body: bytes) -> Names:
    """The ids the object of `kind` with `body` names, kept and followed."""
    if kind not in ("snapshot", "tree", "pack"):
        return Names()
    try:
        if kind == "pack":
            newline = body.find(b"\n")
            return pack_names(codec.decode_value(body[: newline if newline >= 0 else len(body)]))
        value = codec.decode_value(body)
    except ValueError as exc:
        raise UnreadableNames(f"a {kind} whose body does not decode: {exc}") from exc
    return snapshot_names(value) if kind == "snapshot" else tree_names(value)


def _ids(*values: object) -> tuple[str, ...]:
    return tuple(value for value in values if isinstance(value, str))


def _field(record: object, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else None


def snapshot_names(entry: object) -> Names:
    """The ids a decoded snapshot names (any dict: an unverified slot is read as it is)."""
    if not isinstance(entry, dict):
        return Names()
    if _field(entry.get("transition"), "kind") == FORGET:
        # A tombstone keeps its plan (status, brief and fsck read it) and nothing else: the
        # history below it and what only that history named age out; its slot, hence the
        # tombstone itself, stays. Its parent and its anchor's pack went with the reclaim.
        return Names(_ids(entry.get("plan")))
    followed = _ids(
        _field(entry.get("transition"), "result_ref"),
        _field(entry.get("sealed"), "pack"),
        _field(entry.get("fork"), "outcomes"),
    )
    return Names(_ids(entry.get("plan"), entry.get("parent")), followed)


def tree_names(value: object) -> Names:
    """The ids a decoded tree names: every str value of its `refs`."""
    refs = _field(value, "refs")
    if not isinstance(refs, dict):
        raise UnreadableNames("a tree without a refs record")
    return Names(followed=_ids(*refs.values()))


def pack_names(header: object) -> Names:
    """The ids a pack's decoded header line names."""
    if not isinstance(header, dict):
        raise UnreadableNames("a pack without a header record")
    plans, refs = header.get("plans"), header.get("refs")
    kept = _ids(header.get("first_parent"), *(plans if isinstance(plans, list) else ()))
    followed = _ids(header.get("prev"), *(refs if isinstance(refs, list) else ()))
    return Names(kept, followed)


# What a walk's loader says of an id: (kind, body) of an object to follow, a kind alone for
# an object that names nothing more (its body unread), or None when there is no such object.
# A loader raises UnreadableNames for an object that may name others but cannot be read.
Loaded = tuple[str, bytes] | str | None


def load_key(medium: Medium, key: str) -> Loaded:
    """What the object file `key` names, for a walk: its header only, unless it is a tree or
    a pack (then its whole body, unframed, not hash-checked). UnreadableNames when it may
    name others but cannot be read as what it is (damaged, planted, a later version)."""
    where = medium.where(key)
    try:
        head = medium.read_head(key, codec.MAX_HEADER)
        parts = head.split(b"\n", 1)[0].split(b" ")
        kind = parts[2].decode("ascii", "replace") if len(parts) == 4 else None
        if kind is not None and kind not in FOLLOWED_KINDS:
            return kind
        return codec.unframe(medium.read(key), where)
    except FileNotFoundError:
        return None
    except (CastoreError, ValueError) as exc:
        raise UnreadableNames(f"{where}: {exc}") from exc


@attrs.define
class Walk:
    """What following references from some roots reached."""

    reached: set[str] = attrs.field(factory=set)  # every id named, present or not
    missing: set[str] = attrs.field(factory=set)  # followed ids with no object (yet)
    unreadable: dict[str, str] = attrs.field(factory=dict)  # id -> why its names are unknown


def walk(
    roots: Names | Iterable[Names],
    load: Callable[[str], Loaded],
    seen: set[str],
    into: Walk | None = None,
) -> Walk:
    """Follow references breadth first from `roots`, loading each followed id once.

    `seen`: the followed ids an earlier walk loaded; they are not loaded again, and the ones
    this walk loads are added. Kept ids are only recorded in `reached`, never loaded.
    Iterative with a visited set: a forged cycle, or a tree deeper than any limit, ends the
    walk instead of hanging it or overflowing the stack. A missing
    object is recorded in `missing` and NOT added to `seen`, so a later walk (gc's second
    read) loads it again: a writer may be storing it again right now.
    """
    found = into if into is not None else Walk()
    queue: deque[str] = deque()
    for group in [roots] if isinstance(roots, Names) else roots:
        found.reached.update(group.kept)
        queue.extend(group.followed)
    while queue:
        object_id = queue.popleft()
        if object_id in seen:
            continue
        found.reached.add(object_id)
        try:
            loaded = load(object_id)
        except UnreadableNames as exc:
            found.unreadable[object_id] = str(exc)
            continue
        if loaded is None:
            found.missing.add(object_id)
            continue
        found.missing.discard(object_id)
        seen.add(object_id)
        if isinstance(loaded, str):
            continue
        try:
            more = names(*loaded)
        except UnreadableNames as exc:
            found.unreadable[object_id] = str(exc)
            continue
        found.reached.update(more.kept)
        queue.extend(more.followed)
    return found

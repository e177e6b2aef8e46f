"""Channel values as content-addressed castore objects.

A value is one raw object (LangGraph's serializer's bytes, its type name before them). A
list is a tree of raw elements: LangGraph keeps a conversation as a list that grows by a few
messages a step, and serializing it whole at every checkpoint stores the history once per
step (quadratic). A list whose previous version is its prefix is stored as a delta tree
naming that version (`base`) and the new elements only, so a step costs its new messages;
every DELTA_DEPTH deltas, a flat tree names every element again, which bounds a read to
that many trees (and keeps trees within castore's nesting limit).
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any

import attrs

from castore.digest import hash_bytes
from castore.langgraph.deps import SerializerProtocol
from castore.store import Store
from castore.trees import RawRef, TreeRef, raw_bytes

DELTA_DEPTH = 32
_CACHE_BYTES = 64 << 20  # raw bodies kept (immutable, verified once): repeat reads are free
_LIST = "lg-list"


@attrs.frozen
class ListInfo:
    """A stored list: its tree, its elements' ids in order, how many deltas deep it is."""

    tree: str
    elements: tuple[str, ...]
    depth: int


class Parts:
    """Writes and reads values for one store, with caches of what it has seen."""

    def __init__(self, store: Store, serde: SerializerProtocol) -> None:
        self.store = store
        self.serde = serde
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lists: dict[str, ListInfo] = {}

    # -- raw values ------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        """The serializer's type name, NUL, its bytes; zlib-compressed (type name prefixed
        'z:') when that saves a tenth. Deterministic, so equal values are still one object."""
        kind, data = self.serde.dumps_typed(value)
        packed = zlib.compress(data, 6)
        if len(packed) < len(data) * 0.9:
            return b"z:" + kind.encode("utf-8") + b"\0" + packed
        return kind.encode("utf-8") + b"\0" + data

    def decode(self, body: bytes) -> Any:
        kind, _, data = body.partition(b"\0")
        if kind.startswith(b"z:"):
            kind, data = kind[2:], zlib.decompress(data)
        return self.serde.loads_typed((kind.decode("utf-8"), data))

    def put_body(self, body: bytes, known: frozenset[str] | set[str] = frozenset()) -> str:
        """Store `body` as a raw object (unless `known` says a committed tree names it)."""
        object_id = hash_bytes(raw_bytes(body))
        # Stored or read by this saver already: a commit naming it looks for it after its
        # link and fails (ObjectMissingError, nothing committed) if gc took it meanwhile.
        if object_id not in known and object_id not in self._bodies:
            object_id = self.store.put_raw(body).raw
        self._keep(object_id, body)
        return object_id

    def body(self, object_id: str) -> bytes:
        found = self._bodies.get(object_id)
        if found is not None:
            self._bodies.move_to_end(object_id)
            return found
        body = self.store.get_raw(RawRef(object_id))
        self._keep(object_id, body)
        return body

    def _keep(self, object_id: str, body: bytes) -> None:
        if object_id in self._bodies:
            return
        self._bodies[object_id] = body
        self._size += len(body)
        while self._size > _CACHE_BYTES and self._bodies:
            _, dropped = self._bodies.popitem(last=False)
            self._size -= len(dropped)

    # -- values of channels --------------------------------------------------------------
    def put_value(self, value: Any, previous: str | None, body: bytes | None = None) -> str:
        """Store a channel's value (`body`: its encoding, if made already); `previous`: the
        id of that channel's last stored value (a list whose prefix this one may extend)."""
        if type(value) is not list or not value:
            return self.put_body(body if body is not None else self.encode(value))
        prev = self.list_info(previous) if previous is not None else None
        known = set(prev.elements) if prev is not None else set()
        elements = tuple(self.put_body(self.encode(item), known) for item in value)
        n = len(prev.elements) if prev is not None else 0
        if prev is not None and prev.depth < DELTA_DEPTH and elements[:n] == prev.elements:
            refs = {"base": prev.tree, **{f"e{i}": elements[i] for i in range(n, len(elements))}}
            depth = prev.depth + 1
        else:
            refs, depth = {f"e{i}": part for i, part in enumerate(elements)}, 0
        tree = self.store.put_tree(refs, {"k": _LIST, "n": len(elements)}).tree
        self._lists[tree] = ListInfo(tree, elements, depth)
        return tree

    def list_info(self, object_id: str) -> ListInfo | None:
        """The list stored at `object_id`, or None if it holds no list."""
        found = self._lists.get(object_id)
        if found is not None or object_id in self._bodies:  # a cached body is a raw value
            return found
        if self.store.objects.kind_of(object_id) != "tree":
            return None
        chain: list[tuple[str, dict[str, str]]] = []
        cursor: str | None = object_id
        while cursor is not None and cursor not in self._lists:
            tree = self.store.get_tree(TreeRef(cursor))
            if not isinstance(tree.data, dict) or tree.data.get("k") != _LIST:
                return None
            chain.append((cursor, dict(tree.refs)))
            cursor = tree.refs.get("base")
        base = self._lists[cursor] if cursor is not None else None
        for tree_id, refs in reversed(chain):
            kept, depth = (base.elements, base.depth + 1) if base and "base" in refs else ((), 0)
            start = len(kept)
            added = tuple(refs[f"e{i}"] for i in range(start, start + len(refs) - bool(start)))
            base = ListInfo(tree_id, kept + added, depth)
            self._lists[tree_id] = base
        return base

    def get_value(self, object_id: str | tuple[str, ...]) -> Any:
        """A stored value: one part (a raw value or a list tree), or a list's element parts."""
        if isinstance(object_id, tuple):
            return [self.decode(self.body(part)) for part in object_id]
        info = self.list_info(object_id)
        if info is None:
            return self.decode(self.body(object_id))
        return [self.decode(self.body(part)) for part in info.elements]

"""Channel values as content-addressed castore objects.

A value is one raw object (LangGraph's serializer's bytes, its type name before them). A
list is kept by element, in the put tree that stores it: LangGraph keeps a conversation as a
list that grows by a few messages a step, and serializing it whole at every checkpoint stores
the history once per step (quadratic). At slot `v<i>` of a put tree, a list whose previous
version is its prefix names that version (`v<i>.b.<its slot>`: the earlier put tree) and its
new elements only (`v<i>.e<index>`), so a step costs its new messages; every DELTA_DEPTH
deltas it names every element again, which bounds a read to that many trees (and keeps trees
within castore's nesting limit).
"""

from __future__ import annotations

import contextlib
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from castore.chain.trees import RawRef, TreeRef, raw_bytes
from castore.format.digest import hash_bytes
from castore.format.model import attrs
from castore.langgraph.deps import JsonPlusSerializer, SerializerProtocol
from castore.store import Store

DELTA_DEPTH = 90  # castore nests trees at most 100 deep (trees.MAX_TREE_DEPTH)
_CACHE_BYTES = 64 << 20  # raw bodies kept (immutable, verified once): repeat reads are free
# Bodies by their serializer's bytes: a conversation's messages are serialized again at every
# step (the value is the whole list), but compressed and hashed once (~2/3 of an element's cost).
_PACKED_BYTES = 16 << 20


@attrs.frozen
class ListInfo:
    """A stored list: its key (put tree and slot), its elements' ids in order, how many
    deltas deep it is; `refs`, while it is being stored, what its put tree names for it."""

    tree: str
    elements: tuple[str, ...]
    depth: int
    refs: dict[str, str] = attrs.field(factory=dict)


class Parts:
    """Writes and reads values for one store, with caches of what it has seen."""

    def __init__(self, store: Store, serde: SerializerProtocol) -> None:
        self.store = store
        self.serde = serde
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lists: dict[str, ListInfo] = {}
        self._packed: OrderedDict[tuple[str, bytes], tuple[bytes, str]] = OrderedDict()
        self._packed_size = 0
        # LangGraph's own serializer reads a msgpack array as the list of its items: a list's
        # elements are then decoded in one call (another serializer: one call each).
        self._arrays = type(serde) is JsonPlusSerializer

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The puts of one event published together (store.batch). If it fails, what this
        cache says was stored may not be: it starts over, so nothing is named unstored."""
        try:
            with self.store.batch():
                yield
        except BaseException:
            self._bodies.clear()
            self._size = 0
            self._lists.clear()
            raise

    # -- raw values ------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        """The serializer's type name, NUL, its bytes; zlib-compressed (type name prefixed
        'z:') when that saves a tenth. Deterministic, so equal values are still one object."""
        kind, data = self.serde.dumps_typed(value)
        return self._pack(kind, data)

    @staticmethod
    def _pack(kind: str, data: bytes) -> bytes:
        packed = zlib.compress(data, 6)
        if len(packed) < len(data) * 0.9:
            return b"z:" + kind.encode("utf-8") + b"\0" + packed
        return kind.encode("utf-8") + b"\0" + data

    def element(self, value: Any) -> tuple[bytes, str]:
        """(`encode(value)`, its raw object's id), compressed and hashed once per distinct
        serialization (a pure function of the serializer's bytes, so kept across batches)."""
        kind, data = self.serde.dumps_typed(value)
        key = (kind, data)
        found = self._packed.get(key)
        if found is not None:
            self._packed.move_to_end(key)
            return found
        body = self._pack(kind, data)
        found = (body, hash_bytes(raw_bytes(body)))
        self._packed[key] = found
        self._packed_size += len(data) + len(body)
        while self._packed_size > _PACKED_BYTES and self._packed:
            (_, dropped), (dropped_body, _) = self._packed.popitem(last=False)
            self._packed_size -= len(dropped) + len(dropped_body)
        return found

    def decode(self, body: bytes) -> Any:
        kind, _, data = body.partition(b"\0")
        if kind.startswith(b"z:"):
            kind, data = kind[2:], zlib.decompress(data)
        return self.serde.loads_typed((kind.decode("utf-8"), data))

    def put_body(
        self,
        body: bytes,
        known: frozenset[str] | set[str] = frozenset(),
        object_id: str | None = None,
    ) -> str:
        """Store `body` as a raw object (unless `known` says a committed tree names it);
        `object_id`: its id, when the caller has it (`element`)."""
        if object_id is None:
            object_id = hash_bytes(raw_bytes(body))
        # Stored or read by this saver already: a commit naming it looks for it after its
        # link and fails (ObjectMissingError, nothing committed) if gc took it meanwhile.
        if object_id not in known and object_id not in self._bodies:
            object_id = self.store.put_raw(body).raw
        self._keep(object_id, body)
        return object_id

    def put_element(self, value: Any, known: frozenset[str] | set[str] = frozenset()) -> str:
        """Store one element of a list (a message) as a raw object, as `put_body` does."""
        body, object_id = self.element(value)
        return self.put_body(body, known, object_id)

    def body(self, object_id: str) -> bytes:
        found = self._bodies.get(object_id)
        if found is not None:
            self._bodies.move_to_end(object_id)
            return found
        body = self.store.get_raw(RawRef(object_id))
        self._keep(object_id, body)
        return self._bodies.get(object_id, body)  # as kept: inflated once, not again to decode

    def _keep(self, object_id: str, body: bytes) -> None:
        if object_id in self._bodies:
            return
        # Kept uncompressed: a conversation's messages are read at every get_tuple, and
        # inflated once here instead of at each read (decode treats both forms alike).
        kind, _, data = body.partition(b"\0")
        if kind.startswith(b"z:"):
            body = kind[2:] + b"\0" + zlib.decompress(data)
        self._bodies[object_id] = body
        self._size += len(body)
        while self._size > _CACHE_BYTES and self._bodies:
            _, dropped = self._bodies.popitem(last=False)
            self._size -= len(dropped)

    # -- values of channels --------------------------------------------------------------
    def put_value(self, value: Any, body: bytes | None = None) -> str:
        """Store a value that is not kept by element: one raw object."""
        return self.put_body(body if body is not None else self.encode(value))

    def list_refs(self, value: list[Any], previous: str | None, slot: str) -> ListInfo:
        """The parts of list `value` for the put tree that will hold it at `slot`: its
        `tree` field is left "" (the put's tree is not made yet) and `refs` say what to
        name. `previous`: the key of the channel's last stored list, whose prefix it may be."""
        prev = self.list_info(previous) if previous is not None else None
        known = set(prev.elements) if prev is not None else set()
        elements = tuple(self.put_element(item, known) for item in value)
        n = len(prev.elements) if prev is not None else 0
        if prev is not None and prev.depth < DELTA_DEPTH and elements[:n] == prev.elements:
            base_tree, base_slot = prev.tree.split("#")
            refs = {f"{slot}.b.{base_slot}": base_tree}
            refs.update({f"{slot}.e{i}": elements[i] for i in range(n, len(elements))})
            return ListInfo("", elements, prev.depth + 1, refs)
        refs = {f"{slot}.e{i}": part for i, part in enumerate(elements)}
        return ListInfo("", elements, 0, refs)

    def stored_list(self, tree_id: str, slot: str, info: ListInfo) -> str:
        """The key of a list once its put tree is stored; remembered for the next delta."""
        key = f"{tree_id}#{slot}"
        self._lists[key] = ListInfo(key, info.elements, info.depth)
        return key

    def list_info(self, key: str) -> ListInfo | None:
        """The list at `key` ("<put tree>#<slot>"), or None for a raw value's id."""
        if "#" not in key:
            return None
        chain: list[tuple[str, str, dict[str, str]]] = []
        cursor: str | None = key
        while cursor is not None and cursor not in self._lists:
            tree_id, slot = cursor.split("#")
            refs = self.store.get_tree(TreeRef(tree_id)).refs
            mine = {
                name[len(slot) + 1 :]: part
                for name, part in refs.items()
                if name.startswith(slot + ".")
            }
            chain.append((cursor, slot, mine))
            base = next((name for name in mine if name.startswith("b.")), None)
            cursor = f"{mine[base]}#{base[2:]}" if base is not None else None
        found = self._lists[cursor] if cursor is not None else None
        for list_key, _, mine in reversed(chain):
            has_base = any(name.startswith("b.") for name in mine)
            kept, depth = (found.elements, found.depth + 1) if found and has_base else ((), 0)
            added = tuple(mine[f"e{i}"] for i in range(len(kept), len(kept) + len(mine) - has_base))
            found = ListInfo(list_key, kept + added, depth)
            self._lists[list_key] = found
        return found

    def get_value(self, key: str | tuple[str, ...]) -> Any:
        """A stored value: a raw object's id, a list's key, or a list's element parts."""
        if isinstance(key, tuple):
            return self.decode_list([self.body(part) for part in key])
        info = self.list_info(key)
        if info is None:
            return self.decode(self.body(key))
        return self.decode_list([self.body(part) for part in info.elements])

    def decode_list(self, bodies: list[bytes]) -> list[Any]:
        """The elements `bodies` encode, in order. Where each is msgpack (LangGraph's own
        serializer), one msgpack array of them is decoded: the same values, with one call
        into the serializer instead of one per element (a conversation's every message)."""
        if self._arrays and len(bodies) > 1:
            items: list[bytes] = []
            for body in bodies:
                kind, _, data = body.partition(b"\0")
                if kind == b"z:msgpack":
                    data = zlib.decompress(data)
                elif kind != b"msgpack":
                    break
                items.append(data)
            else:
                decoded = self.serde.loads_typed(
                    ("msgpack", _array_header(len(items)) + b"".join(items))
                )
                if type(decoded) is list and len(decoded) == len(bodies):
                    return decoded
        return [self.decode(body) for body in bodies]


def _array_header(count: int) -> bytes:
    """The msgpack header of an array of `count` items (fixarray, array 16, array 32)."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")

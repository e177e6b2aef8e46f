"""Objects that name objects (kind `tree`) and raw bytes (kind `raw`): their records, bytes
and the references a caller holds to them.

A tree's body is the canonical record `{"data": <any value>, "refs": {name: id}}`. What its
`refs` name, gc keeps and fsck checks, transitively (castore/chain/references.py). A raw object's
body is the caller's bytes, verbatim: no encoding, so no secret guard can look inside.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from castore.chain.objects import ObjectStore
from castore.errors import EncodingError
from castore.format import codec
from castore.format.layout import validate_object_id
from castore.format.model import attrs
from castore.format.records import BlobRef

# The header version of raw and tree objects: a v1 reader refuses them as a later format's
# objects, never as corrupt ones (FORMAT.md §18).
VERSION = 2
# Trees nested in trees, the outermost counted. Readers follow refs with a visited set, so a
# forged cycle cannot hang them; the limit keeps every honest tree within what fsck accepts.
MAX_TREE_DEPTH = 100
# What a tree may name, and a step's result_ref too.
PART_KINDS = ("blob", "raw", "tree")


@attrs.frozen
class Tree:
    """A record naming other objects: `refs` maps a part's name to its object id; `data` is
    any value of the data model (what the parts are, in the caller's words)."""

    data: Any = None
    refs: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class TreeRef:
    """A reference to a tree object (`store.put_tree`), usable as a step's result."""

    tree: str


@attrs.frozen
class RawRef:
    """A reference to a raw object (`store.put_raw`), usable as a step's result."""

    raw: str


Ref = BlobRef | RawRef | TreeRef


def ref_id(ref: Ref | str) -> str:
    """The object id a reference (or a plain id) names, validated."""
    if isinstance(ref, BlobRef):
        return validate_object_id(ref.blob)
    if isinstance(ref, RawRef):
        return validate_object_id(ref.raw)
    if isinstance(ref, TreeRef):
        return validate_object_id(ref.tree)
    return validate_object_id(ref)


def stored_result(result: object) -> tuple[str, str] | None:
    """(id, kind) of a step result passed by reference; None for an inline result."""
    if isinstance(result, BlobRef):
        return result.blob, "blob"
    if isinstance(result, RawRef):
        return result.raw, "raw"
    if isinstance(result, TreeRef):
        return result.tree, "tree"
    return None


def raw_bytes(data: bytes) -> bytes:
    """The framed object of raw bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise EncodingError("$", f"put_raw takes bytes, not {type(data).__name__}")
    return codec.frame("raw", bytes(data), version=VERSION)


def tree_bytes(tree: Tree) -> bytes:
    """The framed object of a tree (ids validated; the data within the canonical model)."""
    for name, object_id in tree.refs.items():
        if not isinstance(name, str):
            raise EncodingError("$.refs", f"part name {name!r} is not a str")
        validate_object_id(object_id)
    body = codec.encode_value({"data": tree.data, "refs": dict(tree.refs)})
    return codec.frame("tree", body, version=VERSION)


def decode_tree(body: bytes) -> Tree:
    """A tree body as its record; ValueError (SchemaError included) names what is wrong."""
    value = codec.decode_value(body)
    if not isinstance(value, dict) or sorted(value) != ["data", "refs"]:
        raise codec.SchemaError('a tree is a record of exactly "data" and "refs"')
    tree = codec.from_builtins(value, Tree)
    for object_id in tree.refs.values():
        validate_object_id(object_id)  # an InvalidObjectIdError is a ValueError too
    return tree


def tree_of(refs: Mapping[str, Ref | str], data: Any = None) -> Tree:
    """A Tree from references or ids (every id validated)."""
    return Tree(data, {name: ref_id(ref) for name, ref in refs.items()})


def height(root: str, tree_children: Callable[[str], Iterable[str]], memo: dict[str, int]) -> int:
    """How many trees deep the tree `root` nests, itself counted; `tree_children(id)` gives
    the ids of the trees a tree names. Iterative and memoised in `memo` (ids are immutable,
    so heights are); ValueError on a cycle (only forged objects can make one: a tree's id is
    the hash of the ids it names)."""
    if root in memo:
        return memo[root]
    # Frames of the depth-first walk: [tree id, its tree children left, tallest child so far].
    stack: list[list[Any]] = [[root, list(tree_children(root)), 0]]
    on_path = {root}
    while stack:
        frame = stack[-1]
        pending: list[str] = frame[1]
        if pending:
            child = pending.pop()
            if child in memo:
                frame[2] = max(frame[2], memo[child])
            elif child in on_path:
                raise ValueError(f"tree {frame[0]} names {child}, which names it back (a cycle)")
            else:
                on_path.add(child)
                stack.append([child, list(tree_children(child)), 0])
            continue
        stack.pop()
        on_path.discard(frame[0])
        memo[frame[0]] = frame[2] + 1
        if stack:
            stack[-1][2] = max(stack[-1][2], frame[2] + 1)
    return memo[root]


def parts_reached(objects: ObjectStore, root: str, known: Collection[str] = ()) -> list[str]:
    """`root` and every object it reaches through trees, breadth first, each once: what a
    commit naming `root` relies on. Trees in `known` (reached by an acknowledged commit
    already, hence protected by it) are not opened again. The order matters: a commit looks
    for each after its link and stores it again if gone, parents before parts, so a gc that
    sets a part aside after that look finds the tree that names it (gc.py)."""
    order, queue, seen = [], deque([root]), {root}
    while queue:
        object_id = queue.popleft()
        order.append(object_id)
        if object_id in known or objects.kind_of(object_id) != "tree":
            continue
        for part in decode_tree(objects.get(object_id, "tree")).refs.values():
            if part not in seen:
                seen.add(part)
                queue.append(part)
    return order


def load_result(objects: ObjectStore, ref: str) -> Any:
    """A step result stored by reference: a blob's value, a raw object's bytes, a Tree."""
    kind = objects.kind_of(ref) or "blob"  # absent: the blob read says it is missing
    body = objects.get(ref, kind if kind in PART_KINDS else "blob")
    if kind == "raw":
        return body
    return decode_tree(body) if kind == "tree" else codec.decode_value(body)

"""What a store holds besides chains: plans, blobs, raw objects and trees, stored and read
back verified (the object-side half of castore.Store, which inherits it)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from typing import Any

from castore.chain import trees
from castore.chain.objects import ObjectStore
from castore.chain.trees import RawRef, Tree, TreeRef
from castore.errors import EncodingError, ObjectCorruptError, UsageError
from castore.format import codec
from castore.format.guard import refuse_secrets
from castore.format.layout import object_key
from castore.format.plans import plan_bytes, validate_plan
from castore.format.records import BlobRef, Plan
from castore.medium.base import Medium

_HEIGHTS_KEPT = 1 << 16  # tree heights remembered by one store (put_tree's depth check)


class Values:
    """Puts and gets of the objects a step's result or a plan is (castore.Store's)."""

    medium: Medium
    objects: ObjectStore
    root: str
    format_version: int
    _heights: dict[str, int]

    def _require_v2(self, verb: str) -> None:
        """A v1 store is written as v1 until it is upgraded: nothing v2-only (a raw or tree
        object, a tombstone, a fork) goes into it, so every reader of it still reads it all."""
        if self.format_version < 2:
            raise UsageError(
                f"{verb} writes format-2 records, and {self.root} is a "
                f"format-{self.format_version} store; run `castore upgrade {self.root}` first "
                "(a castore that reads only format 1 then refuses the store)"
            )

    def put_plan(self, plan: Plan) -> str:
        """Store a plan object (after validating it); return its id, the plan digest."""
        validate_plan(plan)
        refuse_secrets(codec.to_builtins(plan))
        return self.objects.put_framed(plan_bytes(plan))

    def put_blob(self, value: Any, *, allow_fields: Collection[str] = ()) -> BlobRef:
        """Store a large result as a blob; record the returned BlobRef in its place."""
        codec.check_depth(value)  # before the secret scan, which recurses
        refuse_secrets(value, allow_fields)
        return BlobRef(self.objects.put("blob", codec.encode_value(value)))

    def get_blob(self, ref: BlobRef | str) -> Any:
        """The value of a blob, verified."""
        blob_id = ref.blob if isinstance(ref, BlobRef) else ref
        try:
            return codec.decode_value(self.objects.get(blob_id, "blob"))
        except ValueError as exc:  # hash-valid but not a value castore writes (too deep, ...)
            raise ObjectCorruptError(blob_id, self.objects.path(blob_id), str(exc)) from exc

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Objects put in this thread inside the block (put_blob, put_raw, put_tree) are
        published together when it ends: two flushes for all of them instead of two each,
        on filesystems whose flushes castore shares (FORMAT.md 9.2; elsewhere each put
        publishes itself). A commit inside the block publishes what was put so far with its
        own snapshot, sharing their flushes (three for the objects and the commit instead of
        four), so commit inside it when the commit is what the objects are for:

            with store.batch():
                parts = {name: store.put_raw(body) for name, body in bodies.items()}
                run.commit_step("save", store.put_tree(parts))
        """
        return self.objects.batch()

    def put_raw(self, data: bytes) -> RawRef:
        """Store bytes verbatim (serialized framework state, an encrypted payload) as one raw
        object; record the returned RawRef as a step's result or name it in a tree.

        The secret guard cannot look inside: bytes have no fields to judge and may be
        compressed or encrypted, so a credential in them is stored as it is. Encrypt what
        must not be at rest in the store."""
        framed = trees.raw_bytes(data)
        self._require_v2("put_raw")
        return RawRef(self.objects.put_framed(framed))

    def get_raw(self, ref: RawRef | str) -> bytes:
        """The bytes of a raw object, verified."""
        return self.objects.get(trees.ref_id(ref), "raw")

    def put_tree(
        self,
        refs: Mapping[str, trees.Ref | str],
        data: Any = None,
        *,
        allow_fields: Collection[str] = (),
    ) -> TreeRef:
        """Store a tree: `refs` names its parts (blobs, raw objects, trees) by name, `data`
        is any value. gc keeps and fsck checks every part a committed tree names. Each part
        must be stored already (UsageError otherwise) and is made young again, as storing it
        again would. `data` and the part names pass the secret guard, as a blob does."""
        tree = trees.tree_of(refs, data)
        codec.check_depth(data)  # before the secret scan, which recurses
        refuse_secrets(data, allow_fields, "$.data")
        refuse_secrets(list(tree.refs), allow_fields, "$.refs")  # names as text: a token?
        framed = trees.tree_bytes(tree)
        self._require_v2("put_tree")
        tallest = 0
        for name, part in sorted(tree.refs.items()):
            kind = self.objects.kind_of(part)
            # A part put in this thread's open batch is named when the batch is published.
            fresh = self.objects.pending(part) is not None
            if kind not in trees.PART_KINDS or not (fresh or self.medium.touch(object_key(part))):
                found = "no such object" if kind is None else f"a {kind}"
                raise UsageError(
                    f"part {name!r} of the tree names {part}: {found} in {self.root}; store "
                    "it first with put_blob, put_raw or put_tree and name what they return"
                )
            if kind == "tree":
                tallest = max(tallest, self._tree_height(part))
        if tallest >= trees.MAX_TREE_DEPTH:
            raise EncodingError(
                "$.refs",
                f"the tree would nest {tallest + 1} trees deep (castore's limit is "
                f"{trees.MAX_TREE_DEPTH})",
                "name the parts of the deep trees from a flatter tree",
            )
        return TreeRef(self.objects.put_framed(framed))

    def get_tree(self, ref: TreeRef | str) -> Tree:
        """The record of a tree object, verified: its `data` and `refs` (name -> id)."""
        tree_id = trees.ref_id(ref)
        body = self.objects.get(tree_id, "tree")
        try:
            return trees.decode_tree(body)
        except ValueError as exc:  # hash-valid but not a tree castore writes
            raise ObjectCorruptError(tree_id, self.objects.path(tree_id), str(exc)) from exc

    def _tree_height(self, tree_id: str) -> int:
        """How many trees deep a stored tree nests (memoised: an id's height never changes)."""

        def tree_children(parent: str) -> list[str]:
            refs = self.get_tree(parent).refs.values()
            return [part for part in refs if self.objects.kind_of(part) == "tree"]

        if len(self._heights) > _HEIGHTS_KEPT:
            self._heights.clear()
        try:
            return trees.height(tree_id, tree_children, self._heights)
        except ValueError as exc:
            path = self.objects.path(tree_id)
            raise ObjectCorruptError(tree_id, path, str(exc)) from exc

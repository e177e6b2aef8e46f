"""fsck's damage catalogue for raw and tree objects (kinds `raw`, `tree`): every damage to
them or to what a tree names has its finding, a clean store with trees has none, and fsck
follows a chain's trees (parts included) as gc does."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from helpers import flip_bit, rewrite
from test_fsck import ERROR, INFO, WARNING, check, fsck, put_raw, row, within_deadline

import castore
from castore.chain.trees import MAX_TREE_DEPTH, Tree
from castore.format import codec
from castore.maintenance.fsck import check_store
from castore.maintenance.fsck.named import NamedObjects
from castore.maintenance.fsck.objects import ObjectReport
from castore.maintenance.gc import collect

PLAN = castore.Plan.build("kinds", "a", "b", "c")


@attrs.frozen
class Trees:
    """A task whose step a returned a tree (naming a raw object, a blob and a subtree with a
    raw part), step b a raw object, step c another tree sharing a part."""

    store: castore.Store
    top: str
    sub: str
    raw: str  # the top tree's raw part
    deep: str  # the subtree's raw part
    blob: str
    result_raw: str  # step b's result
    snaps: list[str]

    def obj(self, object_id: str) -> Path:
        return Path(self.store.objects.path(object_id))

    def rel(self, object_id: str) -> str:
        return self.obj(object_id).relative_to(self.store.root).as_posix()

    def slot_rel(self, seq: int) -> str:
        return Path(self.store.layout.slot_path("k", seq)).relative_to(self.store.root).as_posix()


@pytest.fixture
def trees(store: castore.Store) -> Trees:
    deep = store.put_raw(b"\x00deep")
    sub = store.put_tree({"deep": deep}, {"what": "sub"})
    raw = store.put_raw(b"\xffraw")
    blob = store.put_blob({"rows": [1, 2, 3]})
    top = store.put_tree({"raw": raw, "blob": blob, "sub": sub}, {"what": "top"})
    result_raw = store.put_raw(b"step b's bytes")
    with store.start("k", PLAN) as run:
        run.commit_step("a", top)
        run.commit_step("b", result_raw)
        run.commit_step("c", store.put_tree({"shared": raw}))
    snaps = [snapshot_id for snapshot_id, _ in reversed(store.history("k"))]
    return Trees(store, top.tree, sub.tree, raw.raw, deep.raw, blob.blob, result_raw.raw, snaps)


def test_a_clean_store_with_trees_and_raw_objects_has_no_finding(trees: Trees) -> None:
    """Trees, raw results and shared parts are all clean, and every part counts as reached."""
    assert [] == [row(f) for f in fsck(trees.store.root)]


@pytest.mark.parametrize("kind", ["raw", "tree"])
def test_a_bit_flip_in_a_result_is_a_hash_mismatch_and_a_missing_object(
    trees: Trees, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A damaged raw or tree result is a hash mismatch on its path, and the slot naming it
    reports a missing object."""
    object_id, seq = (trees.result_raw, 2) if kind == "raw" else (trees.top, 1)
    rewrite(trees.obj(object_id), lambda data: flip_bit(data, len(data) - 2))
    check(
        capsys,
        trees.store.root,
        [
            ("hash-mismatch", ERROR, trees.rel(object_id), object_id, None),
            ("missing-object", ERROR, trees.slot_rel(seq), trees.snaps[seq], "k"),
        ],
        cascade=("unreachable-object",) if kind == "tree" else (),
    )


@pytest.mark.parametrize("damage", ["deleted", "bit-flip", "empty"])
def test_a_damaged_part_of_a_nested_tree_is_tree_missing_part(
    trees: Trees, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """A part two trees down that is gone or damaged is `tree-missing-part` on the tree that
    names it (with the part's name), besides the part's own finding."""
    path = trees.obj(trees.deep)
    own: list[tuple[str, str, str, str | None, str | None]] = []
    if damage == "deleted":
        path.unlink()
    elif damage == "bit-flip":
        rewrite(path, lambda data: flip_bit(data, len(data) - 1))
        own = [("hash-mismatch", ERROR, trees.rel(trees.deep), trees.deep, None)]
    else:
        rewrite(path, lambda data: b"")
        own = [("object-empty", ERROR, trees.rel(trees.deep), trees.deep, None)]
    findings = check(
        capsys,
        trees.store.root,
        [("tree-missing-part", ERROR, trees.rel(trees.sub), trees.sub, None), *own],
    )
    (missing,) = [f for f in findings if f.code == "tree-missing-part"]
    assert f"part 'deep' names {trees.deep}: missing or damaged" == missing.message


def test_a_damaged_tree_part_is_reported_and_ends_the_walk_below_it(
    trees: Trees, capsys: pytest.CaptureFixture[str]
) -> None:
    """A subtree that no longer decodes is its own finding and a missing part of its parent;
    its own part, reached through nothing else, is then unreachable (gc would remove it)."""
    body = b'{"data":1,"refs":{"deep":"nope"}}'
    damaged = put_raw(trees.store, codec.frame("tree", body, version=2))
    path = trees.obj(trees.sub)
    rewrite(path, lambda data: trees.obj(damaged).read_bytes())
    trees.obj(damaged).chmod(0o644)
    trees.obj(damaged).unlink()
    check(
        capsys,
        trees.store.root,
        [
            ("hash-mismatch", ERROR, trees.rel(trees.sub), trees.sub, None),
            ("tree-missing-part", ERROR, trees.rel(trees.top), trees.top, None),
            ("unreachable-object", INFO, trees.rel(trees.deep), trees.deep, None),
        ],
    )


def craft_tree(store: castore.Store, refs: dict[str, str], data: object = None) -> str:
    """A hash-valid tree object, written by hand (no check of what it names)."""
    body = codec.encode_value({"data": data, "refs": refs})
    return put_raw(store, codec.frame("tree", body, version=2))


def commit_result(store: castore.Store, task: str, tree_id: str) -> str:
    with store.start(task, PLAN) as run:
        return run.commit_step("a", castore.TreeRef(tree_id))


def test_a_tree_naming_a_plan_is_tree_missing_part(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree may name blobs, raw objects and trees only: a plan as a part is reported with
    the kind found."""
    plan_id = store.put_plan(PLAN)
    tree_id = craft_tree(store, {"plan": plan_id})
    commit_result(store, "t", tree_id)
    findings = check(
        capsys, store.root, [("tree-missing-part", ERROR, rel(store, tree_id), tree_id, None)]
    )
    assert [f"part 'plan' names {plan_id}: a plan"] == [f.message for f in findings]


def rel(store: castore.Store, object_id: str) -> str:
    return Path(store.objects.path(object_id)).relative_to(store.root).as_posix()


@pytest.mark.parametrize("levels", [MAX_TREE_DEPTH, MAX_TREE_DEPTH + 1, MAX_TREE_DEPTH + 2])
def test_trees_nested_deeper_than_castore_writes_are_a_warning(
    store: castore.Store, capsys: pytest.CaptureFixture[str], levels: int
) -> None:
    """A chain of trees deeper than the limit (written by hand: put_tree refuses it) is one
    `tree-too-deep` warning, on the tree that heads 101 of them; 100 is clean."""
    chain = [craft_tree(store, {"leaf": store.put_raw(b"leaf").raw})]
    for _ in range(levels - 1):
        chain.append(craft_tree(store, {"down": chain[-1]}))
    commit_result(store, "t", chain[-1])
    expected = []
    if levels > MAX_TREE_DEPTH:
        heads = chain[MAX_TREE_DEPTH]
        expected = [("tree-too-deep", WARNING, rel(store, heads), heads, None)]
    assert expected == [row(f) for f in check(capsys, store.root, expected)]


def test_a_cycle_of_trees_is_a_finding_not_a_hang(tmp_path: Path) -> None:
    """Trees that name each other (only forged ids can) are `tree-cycle` on the tree whose
    part closes the loop; the walk ends."""
    a, b = "aa" * 32, "bb" * 32
    named = NamedObjects(str(tmp_path))
    for this, other in ((a, b), (b, a)):
        report = ObjectReport(this, f"objects/{this[:2]}/{this}", "tree")
        named.reports[this] = attrs.evolve(report, record=Tree(None, {"next": other}))
    report = within_deadline(lambda: named.report(a))
    assert report is not None
    cycle = [(f.code, f.object_id, f.message) for f in named.reports[b].findings]
    assert [("tree-cycle", b, f"part 'next' names {a}, which names it back")] == cycle
    assert {a, b} == set(named.drain_reached())


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"data":null, "refs":{}}', "not-canonical"),
        (b'{"refs":{}}', "schema-invalid"),
        (b'{"data":{"refs":{}}}', "schema-invalid"),
        (b'{"data":null,"refs":{"x":"ABC"}}', "schema-invalid"),
        (b'{"data":null,"refs":{"x":1}}', "schema-invalid"),
        (b'{"data":null,"extra":1,"refs":{}}', "schema-invalid"),
        (b"\xff", "undecodable"),
    ],
)
def test_a_crafted_tree_body_is_judged_like_any_record(
    store: castore.Store, capsys: pytest.CaptureFixture[str], body: bytes, code: str
) -> None:
    """A tree body that is not the canonical record of exactly data and refs (ids as refs)."""
    object_id = put_raw(store, codec.frame("tree", body, version=2))
    check(
        capsys,
        store.root,
        [(code, ERROR, rel(store, object_id), object_id, None)],
        cascade=("unreachable-object",),
    )


def test_any_bytes_are_a_valid_raw_object(store: castore.Store) -> None:
    """A raw body has no encoding: invalid UTF-8, NUL bytes, JSON-looking text are all fine."""
    for data in (b"\xff\xfe\x00", b'{"a": 1}', b""):
        store.put_raw(data)
    assert {"unreachable-object"} == {f.code for f in fsck(store.root)}


def test_what_fsck_calls_unreachable_in_trees_is_what_gc_removes(trees: Trees) -> None:
    """An uncommitted tree and its own parts are unreachable; the parts it shares with a live
    tree are not; gc's dry run names the same files."""
    store = trees.store
    own = store.put_raw(b"only the orphan tree names me")
    orphan = store.put_tree({"own": own, "shared": trees.raw})
    unreachable = {f.object_id for f in fsck(store.root) if f.code == "unreachable-object"}
    assert {orphan.tree, own.raw} == unreachable
    report = collect(store.root, grace_s=0, dry_run=True)
    assert {orphan.tree, own.raw} == {Path(path).name for path in report.removed}


def test_fsck_of_one_task_checks_the_parts_of_its_trees(
    trees: Trees, capsys: pytest.CaptureFixture[str]
) -> None:
    """--task follows the task's trees: a damaged part two trees down is found."""
    rewrite(trees.obj(trees.deep), lambda data: flip_bit(data, len(data) - 1))
    found = {(f.code, f.object_id) for f in check_store(trees.store.root, task="k", jobs=1)}
    assert {("hash-mismatch", trees.deep), ("tree-missing-part", trees.sub)} == found

"""Raw bytes and trees (kinds `raw` and `tree`): storing and reading them, their bytes on disk,
the checks on what a tree names, and step results stored as a blob, a raw object or a tree."""

from __future__ import annotations

from pathlib import Path

import pytest

import castore
from castore.chain.trees import MAX_TREE_DEPTH, height
from castore.format import codec

PLAN = castore.Plan.build("kinds", "a", "b", "c")


def test_raw_bytes_round_trip_verbatim_under_a_version_2_header(store: castore.Store) -> None:
    """put_raw stores the bytes as they are (no encoding) and get_raw returns them, verified."""
    data = bytes(range(256)) * 3
    ref = store.put_raw(data)
    framed = Path(store.objects.path(ref.raw)).read_bytes()
    assert b"castore 2 raw 768\n" + data == framed
    assert data == store.get_raw(ref)
    assert data == store.get_raw(ref.raw)


def test_identical_bytes_are_one_object(store: castore.Store) -> None:
    """The same bytes stored twice, or the same tree twice, give one id and one file."""
    first, second = store.put_raw(b"state"), store.put_raw(bytearray(b"state"))
    assert first == second
    blob = store.put_blob({"v": 1})
    trees = {store.put_tree({"a": first, "b": blob}, {"n": 1}) for _ in range(2)}
    assert 1 == len(trees)
    tree_files = [p for p in Path(store.root, "objects").rglob("*") if p.is_file()]
    assert 3 == len(tree_files)  # the raw object, the blob, the tree


def test_a_tree_reads_back_as_its_record(store: castore.Store) -> None:
    """get_tree gives the data and the refs (name -> id) the tree was stored with."""
    part = store.put_raw(b"\x00\x01")
    inner = store.put_tree({"part": part})
    ref = store.put_tree({"inner": inner, "plain": part.raw}, data=[1, "two"])
    assert castore.Tree([1, "two"], {"inner": inner.tree, "plain": part.raw}) == store.get_tree(ref)
    body = codec.unframe(Path(store.objects.path(ref.tree)).read_bytes())[1]
    expected = codec.encode_value({"data": [1, "two"], "refs": store.get_tree(ref).refs})
    assert expected == body


def test_a_tree_naming_an_object_not_stored_is_refused(store: castore.Store) -> None:
    """Every part must exist before the tree that names it: a UsageError names the part."""
    with pytest.raises(castore.UsageError, match=r"part 'gone'.*no such object"):
        store.put_tree({"gone": "ab" * 32})
    plan_id = store.put_plan(PLAN)
    with pytest.raises(castore.UsageError, match="a plan"):
        store.put_tree({"plan": plan_id})
    with pytest.raises(castore.InvalidObjectIdError):
        store.put_tree({"bad": "../../etc/passwd"})


def test_the_secret_guard_judges_tree_data_and_part_names(store: castore.Store) -> None:
    """A credential in a tree's data, or a part named by a credential, is refused as in a
    blob; allow_fields vouches for a field."""
    part = store.put_raw(b"x")
    with pytest.raises(castore.SecretInPayloadError, match=r"\$\.data\.password"):
        store.put_tree({"p": part}, {"password": "hunter2"})
    token = "ghp_" + "a1B2" * 9
    with pytest.raises(castore.SecretInPayloadError, match=r"\$\.refs"):
        store.put_tree({token: part})
    store.put_tree({"p": part}, {"password": "hunter2"}, allow_fields=["password"])


def test_raw_bytes_are_opaque_to_the_secret_guard(store: castore.Store) -> None:
    """Raw bytes are stored as they are, whatever they hold: the guard cannot look inside."""
    data = b"Authorization: Bearer " + b"x" * 40
    assert data == store.get_raw(store.put_raw(data))


def test_put_raw_takes_bytes_only(store: castore.Store) -> None:
    """A str (or any non-bytes) is refused before anything is written."""
    with pytest.raises(castore.EncodingError, match="takes bytes, not str"):
        store.put_raw("text")  # type: ignore[arg-type]


def test_trees_nest_at_most_the_depth_limit(store: castore.Store) -> None:
    """A tree of MAX_TREE_DEPTH trees is stored; one more level is refused, naming the limit."""
    ref = store.put_tree({"leaf": store.put_raw(b"leaf")})
    for _ in range(MAX_TREE_DEPTH - 1):
        ref = store.put_tree({"down": ref})
    assert MAX_TREE_DEPTH == store._tree_height(ref.tree)
    with pytest.raises(castore.EncodingError, match=f"{MAX_TREE_DEPTH + 1} trees deep"):
        store.put_tree({"down": ref})


def test_height_ends_on_a_cycle_instead_of_hanging() -> None:
    """A forged cycle of trees (impossible without forged ids) is a ValueError, not a hang."""
    names = {"a": ["b"], "b": ["c"], "c": ["a"]}
    with pytest.raises(ValueError, match="cycle"):
        height("a", names.__getitem__, {})
    assert 3 == height("x", {"x": ["y", "z"], "y": ["z"], "z": []}.__getitem__, {})


@pytest.mark.parametrize("kind", ["blob", "raw", "tree"])
def test_a_step_result_may_be_a_blob_a_raw_object_or_a_tree(
    store: castore.Store, kind: str
) -> None:
    """commit_step takes a BlobRef, RawRef or TreeRef; the result reads back after a resume
    as the value, the bytes or the Tree."""
    raw = store.put_raw(b"\x89state")
    stored = {
        "blob": lambda: (store.put_blob({"big": 1}), {"big": 1}),
        "raw": lambda: (raw, b"\x89state"),
        "tree": lambda: (store.put_tree({"s": raw}, 7), castore.Tree(7, {"s": raw.raw})),
    }
    ref, expected = stored[kind]()
    with store.start("t", PLAN) as run:
        run.commit_step("a", ref)
    with store.resume("t", PLAN) as run:
        assert expected == run.result("a")


def test_a_step_result_ref_of_the_wrong_kind_is_refused(store: castore.Store) -> None:
    """A TreeRef naming a raw object is refused before anything is committed."""
    raw = store.put_raw(b"r")
    with store.start("t", PLAN) as run:
        with pytest.raises(castore.UsageError, match="put_tree"):
            run.commit_step("a", castore.TreeRef(raw.raw))
        assert 0 == run.head.seq


def test_a_v1_store_gets_no_raw_or_tree_object(store: castore.Store) -> None:
    """A format-1 store (read and written as v1 until upgraded) refuses put_raw and put_tree
    before anything is written: a v1 reader could not read them."""
    blob = store.put_blob({"v": 1})
    marker = Path(store.layout.marker)
    marker.unlink()
    marker.write_bytes(b'{"format":"castore","version":1}\n')
    v1 = castore.Store.open(store.root)
    before = sorted(p.name for p in Path(store.root, "objects").rglob("*") if p.is_file())
    with pytest.raises(castore.UsageError, match=r"format-1 store.*castore upgrade"):
        v1.put_raw(b"x")
    with pytest.raises(castore.UsageError, match=r"format-1 store.*castore upgrade"):
        v1.put_tree({"b": blob})
    after = sorted(p.name for p in Path(store.root, "objects").rglob("*") if p.is_file())
    assert before == after

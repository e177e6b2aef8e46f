"""CastoreSaver beyond LangGraph's conformance suite: a real graph, hostile thread ids,
storage that grows with the news only, two writers, and SIGKILL in the middle of a put."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, MessagesState, StateGraph

from castore import Store
from castore.errors import ConflictError, UsageError
from castore.langgraph import CastoreSaver
from castore.langgraph.names import task_base
from castore.langgraph.parts import Parts
from castore.maintenance.fsck import Severity, check_store
from tests.helpers import read_line, spawn_child, wait_stopped

WORDS = "the agent read the page, kept three facts and chose the next tool to call; "


def message(i: int) -> Any:
    text = (f"step {i}: " + WORDS * 3)[:200]
    return (HumanMessage if i % 2 == 0 else AIMessage)(content=text, id=f"m{i}")


def config(thread: str, checkpoint_id: str | None = None) -> Any:
    found: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        found["checkpoint_id"] = checkpoint_id
    return {"configurable": found}


def put(saver: CastoreSaver, thread: str, values: dict[str, Any], parent: Any = None) -> Any:
    """One checkpoint holding `values`, every channel at a new version."""
    checkpoint = empty_checkpoint()
    versions = {name: saver.get_next_version(None, None) for name in values}
    checkpoint["channel_values"] = dict(values)
    checkpoint["channel_versions"] = versions
    target = parent if parent is not None else config(thread)
    return saver.put(target, checkpoint, {"source": "loop", "step": 0, "parents": {}}, versions)


def store_bytes(root: Path) -> int:
    """Bytes of every file in the store, each inode once (a slot is a link to its snapshot)."""
    seen, total = set(), 0
    for path in root.rglob("*"):
        st = path.lstat()
        if path.is_file() and st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


def build_graph(saver: CastoreSaver) -> Any:
    """A one-node chat graph whose 'model' answers with the count of messages it saw."""

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"seen {len(state['messages'])}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    return builder.compile(checkpointer=saver)


def test_import_castore_does_not_load_langgraph() -> None:
    """`import castore` loads neither castore.langgraph nor LangGraph/LangChain."""
    code = (
        "import sys, castore, castore.store, castore.run.run; "
        "print(sorted(m for m in sys.modules if m.startswith(('castore.langgraph', "
        "'langgraph', 'langchain'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "[]" == done.stdout.strip()


def test_a_graph_resumes_its_thread_from_a_new_saver(tmp_path: Path) -> None:
    """A graph's conversation survives the saver (and store handle) that wrote it."""
    with CastoreSaver(tmp_path / "new-store") as saver:
        build_graph(saver).invoke({"messages": [HumanMessage("hi")]}, config("chat"))
    with CastoreSaver(Store.open(tmp_path / "new-store")) as saver:
        state = build_graph(saver).invoke({"messages": [HumanMessage("again")]}, config("chat"))
    assert ["hi", "seen 1", "again", "seen 3"] == [m.content for m in state["messages"]]


def test_a_closed_saver_refuses_work(tmp_path: Path) -> None:
    """After its with-block the saver says it is closed instead of writing."""
    with CastoreSaver(tmp_path) as saver:
        put(saver, "t", {"x": 1})
    with pytest.raises(UsageError, match="closed"):
        saver.get_tuple(config("t"))


def test_hostile_thread_ids_map_to_distinct_tasks(tmp_path: Path) -> None:
    """Ids that differ only in case, escapes, separators or length are separate threads."""
    hostile = ["a", "A", "a_b", "a__b", "a_62", "../x", "%41", "", "é", "e\u0301", "x" * 500]
    hostile += ["x" * 499 + "y", "a_nb", "tab\there", "_n", "_g0"]
    with CastoreSaver(tmp_path) as saver:
        for i, thread in enumerate(hostile):
            put(saver, thread, {"who": i})
        found = [saver.get_tuple(config(thread)) for thread in hostile]
    assert list(range(len(hostile))) == [t.checkpoint["channel_values"]["who"] for t in found]
    assert len(hostile) == len({task_base(thread, "") for thread in hostile})


def test_a_growing_conversation_costs_its_new_messages(tmp_path: Path) -> None:
    """Steps 100-160 of a thread whose list grows a message a step add a few KB each, not
    the whole list (which is over 35 KB serialized by then)."""
    with CastoreSaver(tmp_path / "s") as saver:
        messages: list[Any] = []
        parent = None
        sizes = {}
        for step in range(160):
            messages = [*messages, message(step)]
            parent = put(saver, "conv", {"messages": messages}, parent)
            if step in (100, 159):
                sizes[step] = store_bytes(tmp_path / "s")
        whole = len(saver.serde.dumps_typed(messages[:100])[1])
        latest = saver.get_tuple(config("conv"))
    assert messages == latest.checkpoint["channel_values"]["messages"]
    per_step = (sizes[159] - sizes[100]) / 59
    assert whole > 35_000
    assert per_step < 4_000, per_step


def test_a_message_is_compressed_and_hashed_once_however_often_its_list_is_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each put serializes the whole list (the value is the list), but packs (zlib) only the
    message it has not seen: the put of step 30 packs its new message and its header."""
    packed: list[bytes] = []
    real = Parts._pack

    def pack(kind: str, data: bytes) -> bytes:
        packed.append(data)
        return real(kind, data)

    monkeypatch.setattr(Parts, "_pack", staticmethod(pack))
    with CastoreSaver(tmp_path / "s") as saver:
        messages: list[Any] = []
        parent = None
        for step in range(31):
            messages = [*messages, message(step)]
            packed.clear()
            parent = put(saver, "conv", {"messages": messages}, parent)
        latest = saver.get_tuple(config("conv"))
    assert 2 == len(packed)  # the new message, the put's header
    assert messages == latest.checkpoint["channel_values"]["messages"]


def test_a_lists_elements_decode_in_one_call_to_the_same_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of messages, dicts, numbers and strs reads back equal through one msgpack
    array (one call into the serializer, not one per element); a list holding an element
    the serializer stores as another kind (bytes: "bytes", None: "null") is read element
    by element, to the same values."""
    values = [message(0), {"k": [1, 2.5, None, b"\x00raw"]}, 7, message(1), "x" * 300]
    with CastoreSaver(tmp_path / "s") as saver:
        parts = saver._parts
        bodies = [parts.encode(value) for value in values]
        calls: list[str] = []
        real = saver.serde.loads_typed

        def counted(typed: tuple[str, bytes]) -> Any:
            calls.append(typed[0])
            return real(typed)

        monkeypatch.setattr(saver.serde, "loads_typed", counted)
        assert values == parts.decode_list(bodies)
        assert ["msgpack"] == calls
        calls.clear()
        others = [b"\x00raw", None]
        mixed = [*bodies, *(parts.encode(value) for value in others)]
        assert [*values, *others] == parts.decode_list(mixed)
        assert len(mixed) == len(calls)  # not one array: one call each
        monkeypatch.undo()
        parent = put(saver, "conv", {"messages": [message(i) for i in range(40)]})
        put(saver, "conv", {"messages": [message(i) for i in range(41)]}, parent)
    with CastoreSaver(tmp_path / "s") as reader:  # a new saver: read from the store
        latest = reader.get_tuple(config("conv"))
    assert [message(i) for i in range(41)] == latest.checkpoint["channel_values"]["messages"]


def raw_objects(root: Path) -> int:
    """How many raw objects (castore.chain.trees: kind `raw`) the store holds."""
    return sum(
        1
        for path in (root / "objects").rglob("*")
        if path.is_file() and b" raw " in path.read_bytes()[:40].split(b"\n")[0]
    )


def test_the_same_messages_in_two_threads_are_stored_once(tmp_path: Path) -> None:
    """20 messages two threads hold are 20 objects: the second thread adds no raw object
    (its headers are in its own trees), hence no message."""
    with CastoreSaver(tmp_path / "s") as saver:
        put(saver, "one", {"messages": [message(i) for i in range(20)]})
        before = raw_objects(tmp_path / "s")
        put(saver, "two", {"messages": [message(i) for i in range(20)]})
        after = raw_objects(tmp_path / "s")
        two = saver.get_tuple(config("two")).checkpoint["channel_values"]["messages"]
    assert 0 == after - before
    assert 20 == before
    assert [message(i) for i in range(20)] == two


def test_put_writes_first_write_wins_special_channels_replace(tmp_path: Path) -> None:
    """A repeated (task, idx) keeps its first value; an error write (special channel)
    is replaced by the later one; a repeat that adds nothing commits nothing."""
    with CastoreSaver(tmp_path) as saver:
        stored = put(saver, "w", {"x": 1})
        saver.put_writes(stored, [("a", "first"), ("__error__", "e1")], "task")
        task = saver.store.verify(task_base("w", "") + "_g0").head.seq
        saver.put_writes(stored, [("a", "second")], "task")
        unchanged = saver.store.verify(task_base("w", "") + "_g0").head.seq
        saver.put_writes(stored, [("a", "third"), ("__error__", "e2")], "task")
        writes = saver.get_tuple(stored).pending_writes
    assert task == unchanged
    assert [("task", "__error__", "e2"), ("task", "a", "first")] == sorted(writes)


def test_a_second_saver_on_the_same_thread_is_refused(tmp_path: Path) -> None:
    """Two savers load a thread; the first to put wins, the other's put is ConflictError
    and, after reading the thread again, it sees the winner's checkpoint."""
    first, second = CastoreSaver(tmp_path), CastoreSaver(tmp_path)
    base = put(first, "t", {"x": 0})
    assert first.get_tuple(config("t")) is not None
    assert second.get_tuple(config("t")) is not None
    won = put(second, "t", {"x": 2}, base)
    with pytest.raises(ConflictError):
        put(first, "t", {"x": 1}, base)
    latest = first.get_tuple(config("t"))
    assert won["configurable"]["checkpoint_id"] == latest.config["configurable"]["checkpoint_id"]
    assert {"x": 2} == latest.checkpoint["channel_values"]
    first.close()
    second.close()


WRITER = """
import sys
from castore.langgraph import CastoreSaver
from tests.test_langgraph_saver import config, put, message
saver = CastoreSaver(sys.argv[1])
tup = saver.get_tuple(config("t"))
print("loaded", flush=True)
try:
    put(saver, "t", {"messages": [message(i) for i in range(int(sys.argv[2]))]}, tup.config)
except Exception as exc:
    print("refused", type(exc).__name__, flush=True)
else:
    print("put", flush=True)
"""


def test_a_second_process_on_the_same_thread_is_refused(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A writer process paused just before its commit point loses to a put made meanwhile:
    it gets ConflictError, and the thread holds the other writer's checkpoint only."""
    with CastoreSaver(tmp_path) as saver:
        base = put(saver, "t", {"messages": [message(0)]})
        child = spawn_child(children, WRITER, str(tmp_path), "3", pause="commit.before_link")
        assert "loaded\n" == read_line(child)
        wait_stopped(child)
        put(saver, "t", {"messages": [message(0), message(1)]}, base)
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
        latest = saver.get_tuple(config("t"))
    assert "refused ConflictError\n" == out, err
    assert 2 == len(latest.checkpoint["channel_values"]["messages"])


@pytest.mark.parametrize(
    ("point", "lands"),
    [
        ("object.temp_synced:1", False),
        ("object.published:2", False),
        ("object.published:4", False),
        ("commit.before_link:1", False),
        ("commit.linked:1", True),
        ("commit.done:1", True),
    ],
)
def test_sigkill_during_a_put_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path, children: list[subprocess.Popen[str]], point: str, lands: bool
) -> None:
    """A writer killed at a named point of a put leaves the thread readable: at the new
    checkpoint once its slot is linked, else at the previous one, every value intact."""
    expected = [message(i) for i in range(5 if lands else 1)]
    assert expected == killed_during_a_put(tmp_path, children, point)


def killed_during_a_put(
    tmp_path: Path, children: list[subprocess.Popen[str]], point: str
) -> list[Any]:
    """The messages thread `t` holds once a writer putting 5 (over 1) was SIGKILLed at
    `point`; its chain verifies and fsck finds no error."""
    with CastoreSaver(tmp_path) as saver:
        put(saver, "t", {"messages": [message(0)]})
    child = spawn_child(children, WRITER, str(tmp_path), "5", crash=point)
    child.communicate(timeout=60)
    assert -signal.SIGKILL == child.returncode
    with CastoreSaver(tmp_path) as saver:
        latest = saver.get_tuple(config("t"))
        assert saver.store.verify(task_base("t", "") + "_g0") is not None
    assert [] == [f for f in check_store(str(tmp_path), jobs=1) if f.severity is Severity.ERROR]
    messages: list[Any] = latest.checkpoint["channel_values"]["messages"]
    return messages


@pytest.mark.parametrize(
    ("point", "lands"),
    [
        ("object.linked:1", False),  # the batch's first name: its bytes durable, no slot
        ("object.linked:6", False),  # 4 messages, the tree, the snapshot: all named
        ("object.published:6", False),  # every name durable, the slot not linked
        ("commit.before_link:1", False),
        ("commit.linked:1", True),
        ("commit.done:1", True),
    ],
)
def test_sigkill_during_a_put_whose_commit_shares_the_batchs_flushes(
    tmp_path: Path,
    children: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    lands: bool,
) -> None:
    """With shared flushes (CASTORE_FLUSH=syncfs) a put commits inside its batch: its parts,
    tree and snapshot are published together before the slot's link. Killed anywhere in
    that, the thread reads the old checkpoint or the new one, and fsck finds no error."""
    monkeypatch.setenv("CASTORE_FLUSH", "syncfs")
    expected = [message(i) for i in range(5 if lands else 1)]
    assert expected == killed_during_a_put(tmp_path, children, point)


def test_get_tuple_reads_as_many_objects_at_step_20_as_at_step_200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the latest checkpoint of a thread of constant-size state reads the same
    objects however long the thread is (no walk over its history)."""
    reads: list[str] = []
    counts = []
    with CastoreSaver(tmp_path) as saver:
        original = saver.store.objects.read

        def counted(object_id: str) -> bytes:
            reads.append(object_id)
            return original(object_id)

        parent = None
        for step in range(200):
            parent = put(saver, "long", {"doc": "x" * 1000 + str(step)}, parent)
            if step in (19, 199):
                saver._parts._bodies.clear()  # cold values: each read shows
                monkeypatch.setattr(saver.store.objects, "read", counted)
                found = saver.get_tuple(config("long"))
                monkeypatch.undo()
                counts.append(len(reads))
                reads.clear()
                assert "x" * 1000 + str(step) == found.checkpoint["channel_values"]["doc"]
    assert counts[0] == counts[1]


def test_delete_thread_forgets_its_task_and_the_id_starts_afresh(tmp_path: Path) -> None:
    """delete_thread commits a castore tombstone (gc may reclaim it); a later put to the
    same thread id starts a new, empty history."""
    with CastoreSaver(tmp_path) as saver:
        put(saver, "gone", {"x": 1})
        saver.delete_thread("gone")
        assert saver.get_tuple(config("gone")) is None
        put(saver, "gone", {"x": 2})
        history = list(saver.list(config("gone")))
        status = saver.store.status(task_base("gone", "") + "_g0")
    assert status.forgotten
    assert [{"x": 2}] == [t.checkpoint["channel_values"] for t in history]


def test_prune_keep_latest_moves_the_thread_to_a_new_task_and_forgets_the_old(
    tmp_path: Path,
) -> None:
    """prune keeps the latest checkpoint (its whole list, its writes) in the thread's next
    task and forgets the old one (gc may reclaim it); the thread goes on from there."""
    with CastoreSaver(tmp_path) as saver:
        parent = None
        for step in range(5):
            parent = put(saver, "p", {"messages": [message(i) for i in range(step + 1)]}, parent)
        saver.put_writes(parent, [("messages", [message(5)])], "task")
        saver.prune(["p"], strategy="keep_latest")
        kept = list(saver.list(config("p")))
        old = saver.store.status(task_base("p", "") + "_g0")
        put(saver, "p", {"messages": [message(i) for i in range(6)]}, parent)
        after = saver.get_tuple(config("p"))
    assert old.forgotten
    assert [parent["configurable"]["checkpoint_id"]] == [
        t.config["configurable"]["checkpoint_id"] for t in kept
    ]
    assert [message(i) for i in range(5)] == kept[0].checkpoint["channel_values"]["messages"]
    assert [("task", "messages", [message(5)])] == kept[0].pending_writes
    assert 6 == len(after.checkpoint["channel_values"]["messages"])

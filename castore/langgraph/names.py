"""Task ids for LangGraph threads: one castore task per (thread_id, checkpoint_ns, generation).

A thread id is any string LangGraph was given (a UUID, a user's name for a chat, a path), so
it is encoded, never used as it is: the encoding is injective and its output is only
lowercase letters, digits, '-' and '_', which castore keeps verbatim in a directory name.
"""

from __future__ import annotations

from castore.digest import hash_bytes

PREFIX = "lg-"
# castore's limit is 200 bytes per task id: a thread's part, a namespace's, and room left for
# the generation and segment suffixes.
_MAX_THREAD = 100
_MAX_NS = 60
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def encode(text: str, limit: int) -> str:
    """`text` in [a-z0-9-_]: kept characters as they are, '_' as '__', any other UTF-8 byte
    as '_' and two hex digits. '_' followed by anything but '_' or a hex digit never occurs,
    so '_n', '_g' can separate encoded fields. Too long: 'h' and a digest of the text (a
    collision is a blake3 collision)."""
    out: list[str] = []
    for byte in text.encode("utf-8", "surrogatepass"):
        ch = chr(byte)
        out.append(ch if ch in _KEPT else "__" if ch == "_" else f"_{byte:02x}")
    encoded = "".join(out)
    if len(encoded) > limit:
        return "h" + hash_bytes(text.encode("utf-8", "surrogatepass"))[:48]
    return "t" + encoded


def thread_prefix(thread_id: str) -> str:
    """The start every task id of thread `thread_id` shares (all namespaces, generations)."""
    return f"{PREFIX}{encode(thread_id, _MAX_THREAD)}_n"


def task_base(thread_id: str, checkpoint_ns: str) -> str:
    """What the task ids of a thread's namespace start with, before their generation."""
    return f"{thread_prefix(thread_id)}{encode(checkpoint_ns, _MAX_NS)}"


def generation(base: str, number: int) -> str:
    """The castore task (family) of one generation of a namespace. A generation ends when
    the thread is deleted (its task forgotten, whose id castore never reuses)."""
    return f"{base}_g{number}"


def base_of(task_id: str) -> str | None:
    """The namespace base of a castore task id this module made, else None."""
    if not task_id.startswith(PREFIX) or "_g" not in task_id:
        return None
    return task_id[: task_id.rindex("_g")]

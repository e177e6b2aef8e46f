"""Task ids for LangGraph threads: one castore task per (thread_id, checkpoint_ns, generation).

A namespace's first generation is `<base>_g0`; a later one is named by the commit that made
it: `<base>_s<id>`, the id's first SUCCESSOR_HEX digits (generations.py says which id).
`<base>_g<n>` for n > 0 are the generations of stores written before (the old successor rule).

A thread id is any string LangGraph was given (a UUID, a user's name for a chat, a path), so
it is encoded, never used as it is: the encoding is injective and its output is only
lowercase letters, digits, '-' and '_', which castore keeps verbatim in a directory name.
"""

from __future__ import annotations

import re

from castore.format.digest import hash_bytes

PREFIX = "lg-"
# castore's limit is 200 bytes per task id: a thread's part (at most 101 bytes), a
# namespace's (61), the prefix and '_n' (5), and room left for the generation's suffix (33).
_MAX_THREAD = 100
_MAX_NS = 60
# A successor's suffix '_s' and this many hex digits of a snapshot id (120 bits): at most 199.
SUCCESSOR_HEX = 30
_SUFFIX = re.compile(rf"g(?:0|[1-9][0-9]*)|s[0-9a-f]{{{SUCCESSOR_HEX}}}")
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
    """A numbered generation: `number` 0 is every namespace's first; the others are only
    read (stores of the old successor rule). A generation ends with its task forgotten,
    whose id castore never reuses."""
    return f"{base}_g{number}"


def successor(base: str, snapshot_id: str) -> str:
    """The generation that follows the commit `snapshot_id` (a rewrite's intent, or a
    deletion's tombstone): a task nobody can have written before that commit existed."""
    return f"{base}_s{snapshot_id[:SUCCESSOR_HEX]}"


def number_of(base: str, task_id: str) -> int | None:
    """n of a numbered generation `<base>_g<n>`, else None."""
    suffix = task_id[len(base) + 1 :]
    return int(suffix[1:]) if base_of(task_id) == base and suffix.startswith("g") else None


def is_successor(base: str, task_id: str) -> bool:
    """True for a generation `<base>_s<id>` (one `successor` names)."""
    return base_of(task_id) == base and task_id[len(base) + 1 :].startswith("s")


def base_of(task_id: str) -> str | None:
    """The namespace base of a castore task id this module made, else None (the suffix has
    no '_': the last one separates them)."""
    base, _, suffix = task_id.rpartition("_")
    if not task_id.startswith(PREFIX) or not _SUFFIX.fullmatch(suffix):
        return None
    return base

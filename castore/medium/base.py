"""The storage seam: what castore needs from the place that holds a store (docs/FORMAT.md §19).

Everything above this floor names a store's files by **key**: the relative path of the
format (`castore.json`, `objects/ab/<id>`, `tasks/<enc>/chain/<seq>`, ...; built only by
castore.format.layout), never by an absolute path, and reaches them only through a Medium.
The POSIX directory (castore.medium.posix) is one implementation, an S3 bucket prefix
another. The contract every implementation keeps, and that the chain's correctness rests on:

- **Exclusive create.** `create` and `link` make a name that did not exist; of any number of
  callers, on any number of hosts, at most one succeeds for a name, and every other learns
  the name exists (False). This is the commit point. Nothing else ever makes a name the
  format gives (no rename, no overwrite), but `replace`, for the store marker alone.
- **Durability after flush.** The bytes of a name `create` returned are durable when it
  returns; the name itself is durable after `flush_dir` of its directory (or at once, with
  `sync_name`). What a crash leaves is what FORMAT.md §13 lists: complete names only.
- **What a reader sees while a writer works.** A reader sees a name whole or not at all,
  never partial bytes under a final name. Right after another client creates a name, a
  reader may still see it absent for a moment (a cache); `still_named` asks past every cache,
  and `read_fresh` reads past them.
- **Removing.** `remove` takes a name away. Where that frees it for a new exclusive create
  (`frees_names`, POSIX), a commit must read the sealed mark after its claim (FORMAT.md 9.3,
  step 3a); `retire` is how pruning takes away what a name holds while keeping, where the
  medium can, the name itself (then no stale writer can claim it again).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from typing import Literal

from castore.format.limits import MAX_OBJECT_SIZE
from castore.format.model import attrs
from castore.medium.tasklock import HeldLock


@attrs.frozen
class Entry:
    """One name in a listing, with what the medium knows of it."""

    name: str
    kind: str  # "regular file", "directory", "symlink", "FIFO", ... (oserrors.file_kind's words)
    size: int
    mtime: float  # seconds since the epoch: gc's age
    mode: int | None = None  # permission bits, where the medium has them
    inode: int | None = None  # two names of one inode are one stored file (a hard link)
    links: int | None = None  # how many names the inode has, where the medium knows

    @property
    def regular(self) -> bool:
        return self.kind == "regular file"


# fsck's question before it sets a damaged file aside: is it (still) damaged?
Judge = Callable[[bytes | None, Entry], bool]
# What `set_aside` did: moved the file; copied it aside and left it (no request could remove
# only what was judged); kept it (gone, or intact again, since it was judged).
SetAside = Literal["moved", "copied", "kept"]


class Medium(abc.ABC):
    """A place that holds one store's files, addressed by keys (see the module docstring)."""

    #: how a person names this store (a directory path, or s3://bucket/prefix)
    url: str
    #: "posix" or "s3": what `castore doctor` checks, and which findings fsck can make
    kind: str
    #: a removed name can be created again by an exclusive create (see `retire`)
    frees_names: bool = True
    #: a chain slot is a second name of its snapshot's object (POSIX hard links)
    aliases: bool = True
    #: `retire` leaves a pruned slot's key and bytes as they are (S3): a prune then has no
    #: slot to list, read or take away, only the sealed mark to move
    keeps_retired: bool = False
    #: directories are names of their own, made and kept apart from the files in them; False
    #: where a "directory" is a key prefix, present only while some key is under it
    directories: bool = True
    #: how many commits a run makes between seals, where the medium wants fewer than the
    #: format's most (None: SEAL_EVERY). A resume reads every slot above the sealed mark, one
    #: request each where a read is a round trip (S3): a short tail keeps it a few reads.
    seal_every: int | None = None
    #: the store is a directory a filesystem observer (watchdog) can follow; False where a
    #: watcher sees commits only by listing (S3)
    file_events: bool = True
    #: names at the top of a store that the medium keeps for itself (not the format's)
    private_names: frozenset[str] = frozenset()
    #: every write raises ReadOnlyStoreError (castore.medium.readonly: a reader's view)
    read_only: bool = False

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """What the store is, as the medium itself knows it (a directory's device and inode;
        an endpoint, bucket and prefix): two Store objects of one store have one identity
        however they were opened, from any working directory. Every promise kept in this
        process by a key (the in-flight registry) is keyed by it, never by a path string."""

    # -- reading ---------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        """The bytes of `key`. FileNotFoundError if there is none; UnsafeFileError if it is
        not a regular file (a symlink is never followed); OversizedFileError above `limit`;
        StoreIOError (with the errno) if the medium fails."""

    @abc.abstractmethod
    def read_fresh(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        """`read`, past every cache of this client: for bytes that did not hash to their
        name, read once more before they count as corrupt (FORMAT.md 11.5)."""

    @abc.abstractmethod
    def read_head(self, key: str, size: int) -> bytes:
        """At most the first `size` bytes of `key` (an object's header)."""

    @abc.abstractmethod
    def hash(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> str:
        """The blake3 digest of `key`'s bytes, read in pieces (a large plan is never held)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True if `key` names anything (of any kind); False if not; StoreIOError if the
        medium cannot say."""

    @abc.abstractmethod
    def still_named(self, key: str) -> bool:
        """`exists`, as the medium's server knows it now (a cached name another client
        removed answers False). A False is always safe for the callers: they store again."""

    @abc.abstractmethod
    def names(self, key: str) -> list[str]:
        """The names directly under `key` (a directory, or a key prefix); FileNotFoundError
        if there is no such directory."""

    def names_after(self, key: str, after: str) -> list[str]:
        """`names` that sort after `after` (gc skips the slots at or below a sealed mark on a
        medium that keeps them: a listing that starts there costs what is above it)."""
        return [name for name in self.names(key) if name > after]

    def names_if_small(self, key: str) -> list[str] | None:
        """`names`, where one listing costs less than a few lookups (a small directory); None
        where it would not ([] for a directory that does not exist). Something other than a
        directory at `key` (a symlink to one included) is refused as `require_dir` refuses it:
        HEAD lookup relies on this check alone."""
        self.require_dir(key)
        return None

    @abc.abstractmethod
    def scan(self, key: str) -> list[Entry]:
        """Every name directly under `key`, with what is known of each (fsck and gc)."""

    @abc.abstractmethod
    def stat(self, key: str) -> Entry:
        """What is known of `key` (FileNotFoundError if nothing is there)."""

    def same_file(self, key: str, other: str) -> bool:
        """True if `key` and `other` are two names of one stored file (an alias: `aliases`);
        False if either is missing or they are two files. Pruning asks it of every slot."""
        try:
            inode = self.stat(key).inode
            return inode is not None and inode == self.stat(other).inode
        except FileNotFoundError:
            return False

    # -- fsck's reads: what a file holds, and what it is -------------------------------------
    @abc.abstractmethod
    def read_entry(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, Entry]:
        """`read`, and what is known of the very file those bytes came from (one open: never
        a later lookup's answer, which could be another file's by then)."""

    @contextlib.contextmanager
    def reader(self, key: str) -> Iterator[Callable[[str], tuple[bytes, Entry]]]:
        """A `read_entry` of names in the directory `key`, for many reads in a row (fsck
        reads every slot of a chain so): POSIX opens the directory once, with no path walk
        from the root for each name. Errors are `read_entry`'s, for each name read."""
        prefix = f"{key}/" if key else ""
        yield lambda name: self.read_entry(prefix + name)

    def names_and_inodes(self, key: str) -> list[tuple[str, int | None]]:
        """`names`, each with the inode of what it names where the listing itself says it
        (POSIX: from the directory read, no lookup per name); None where the medium has no
        inodes. Two names of one inode are one stored file (a slot and its object)."""
        return [(name, None) for name in self.names(key)]

    def lock_held(self, key: str) -> bool:
        """True if a worker holds the task lock `key` now; asked without taking it and
        without writing anything. False where the medium has no locks."""
        del key
        return False

    @abc.abstractmethod
    def set_aside(self, key: str, target: str, still_bad: Judge) -> SetAside:
        """Move what `key` names (a file; a symlink or a directory as itself, never followed)
        to the new name `target`, creating the directories `target` needs, never writing
        through a symlink on either way (UnsafeFileError). Nothing is ever lost: the new
        name is durable before the old one goes, and `still_bad(bytes, entry)` (bytes None:
        not a regular file) is asked of `key` right before the move and once more of what
        `target` holds before `key` goes; when it says False (a writer stored the file
        again, intact), the new name is taken away and `key` stays ("kept"). "moved" if
        `key` moved. POSIX: a hard link, made durable, then the old name unlinked (a
        directory: renamed). S3: a copy, then a DELETE of the original carrying the judged
        ETag (If-Match), where the endpoint honours it; where not, "copied": the copy is made
        and `key` left, since no request could remove only the judged bytes. Never atomic on
        S3 (a crash between them leaves both keys, the copy under `target`)."""

    # -- writing ---------------------------------------------------------------------------
    @abc.abstractmethod
    def create(self, key: str, data: bytes, *, sync_name: bool = True, mode: int = 0o444) -> bool:
        """Create `key` holding `data`, exclusively: True if this call created it, False if
        the name existed (the caller reads it to see what it holds). The bytes are durable
        when this returns; so is the name, with `sync_name` (else after `flush_dir`).
        DurabilityError if that could not be done (nothing was published);
        FileNotFoundError if the directory it belongs in does not exist (`make_dir`)."""

    @abc.abstractmethod
    def claim(self, key: str, data: bytes, *, alias_of: str, alias_durable: bool) -> bool:
        """The commit point (FORMAT.md 9.3 steps 2 and 3): create `key` (a chain slot) holding
        the snapshot bytes `data`, exclusively; True if this call made it, False if the name
        existed (the caller reads it: its own snapshot, or another writer's). `alias_of` is
        the snapshot's object key: a medium with hard links (`aliases`) stores the object
        there first, its name durable only with `alias_durable`, and makes the slot a second
        name of it; another stores `key` alone, and readers find the snapshot by its slot.
        The slot's name is durable only after `flush_dir` of its directory. Never part of a
        batch: a commit inside one publishes its snapshot with the batch first and links it
        (castore.chain.refs, FORMAT.md 9.2)."""

    @abc.abstractmethod
    def link(self, source: str, key: str) -> bool:
        """Give the bytes of `source` the new name `key`, exclusively (False: `key` existed;
        FileNotFoundError: `source` is gone). POSIX: a hard link, the same inode."""

    @abc.abstractmethod
    def flush_dir(self, key: str) -> None:
        """Make every name created in directory `key` durable (DurabilityError if not)."""

    @abc.abstractmethod
    def remove(self, key: str) -> None:
        """Take the name `key` away (a missing one is fine). Where a request can go
        unanswered (S3), the removal may still take effect later, until `settle` returns."""

    def heal(self, key: str, data: bytes) -> bool:
        """Put `data`, verified to be the very bytes the object key `key` names (its hash),
        in place of damaged ones stored there; True if done. Only a content-addressed key
        is ever healed: no state anyone relies on holds other bytes under it, so the write
        can only replace damage with the one content the name may hold, and a late or
        repeated one lands the same bytes. POSIX: False (fsck --quarantine moves the file
        aside, and the next put stores it anew)."""
        del key, data
        return False

    def settle(self) -> None:  # noqa: B027 - a medium whose removals are answered: nothing
        """Return once no removal this medium sent can still take effect: a remover that
        checks what writers did after its removals (gc's read of new slots) calls it first."""

    def retire(self, key: str) -> None:
        """Take away what `key` holds, for good, once nothing needs it (a pruned slot). Where
        the medium can keep the name so that no exclusive create of it succeeds again, it
        does (and sets `frees_names` False); else it removes it."""
        self.remove(key)

    @abc.abstractmethod
    def make_dir(self, key: str) -> bool:
        """Create directory `key` durably (its name synced in its parent); True if created,
        False if it existed (then its name is synced again: a crashed creator may not have).
        UnsafeFileError if something else is there. Media without directories: False."""

    @abc.abstractmethod
    def require_dir(self, key: str) -> None:
        """UnsafeFileError if `key` exists and is not a directory itself (a symlink to one
        is refused: a planted link must not receive the store's files)."""

    @abc.abstractmethod
    def touch(self, key: str) -> bool:
        """Make `key` young again for gc's age rule; False if it is gone."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes) -> None:
        """Durably replace what `key` holds in one step (readers see old or new, never a
        mix). Only the store marker is ever replaced (castore upgrade)."""

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[tuple[str, bytes]]]:
        """Objects created in this thread inside the block may be published together when it
        ends, with fewer flushes (FORMAT.md 9.2), or earlier by `publish_batch` (a commit
        inside the block publishes them with its snapshot, and the block goes on); the list
        it yields holds, once the block has ended, (key, bytes) of the names that existed
        already (the caller checks them as it checks any create that returned False). Only
        objects join a batch: any other create is exclusive and answers at once. Media that
        cannot share flushes do each create on its own, as outside a block."""
        yield []

    def batch_open(self) -> bool:
        """True inside this thread's open batch (one whose creates wait for its end)."""
        return False

    def publish_batch(self) -> list[tuple[str, bytes]]:
        """Publish this thread's open batch now, as its end would (FORMAT.md 9.2), and keep
        it open for what the block creates next; (key, bytes) of the names that existed
        already, for the caller to check. Without an open batch, nothing to do."""
        return []

    def pending(self, key: str) -> bytes | None:
        """The bytes of `key` if it was created in this thread's open batch and is not
        published yet (it has no name until the batch ends or `publish_batch` publishes it)."""
        del key
        return None

    # -- locks and the store as a whole ---------------------------------------------------------
    @abc.abstractmethod
    def lock(self, key: str, task_id: str, timeout: float) -> HeldLock | None:
        """The task's local queueing lock `key` (FORMAT.md §14), held when this returns;
        TaskBusyError after `timeout` seconds; None where the medium has no lock. A lock only
        spares local workers a lost race: correctness never rests on it."""

    @abc.abstractmethod
    def init_store(self, marker: bytes) -> None:
        """Create (or complete) an empty store here, the marker (`castore.json`, these bytes)
        last, so that a store without its marker is an interrupted init. Safe to repeat and
        to race (FORMAT.md §10.1)."""

    @abc.abstractmethod
    def interrupted_init(self, *, but_marker: bool = False) -> str | None:
        """None if nothing is here, or only what an interrupted init leaves (the marker too,
        with `but_marker`); else a short description of the first other thing found."""

    @abc.abstractmethod
    def is_void(self) -> bool:
        """True if nothing at all is here (no directory, or an empty one; no key)."""

    @abc.abstractmethod
    def content_counts(self) -> tuple[int, int]:
        """(objects, task directories) present: what a store whose marker is gone holds."""

    def check_safe(self) -> None:  # noqa: B027 - most media need no check: a no-op default
        """Refuse (a CastoreError saying why) a medium whose commit point cannot be trusted:
        one whose exclusive create was seen to let a second caller succeed."""

    def where(self, key: str) -> str:
        """How to name `key` to a person (a path; a URL)."""
        return f"{self.url}/{key}" if key else self.url

    def names_are_coherent(self) -> bool:
        """True when a lookup is the truth (no client cache can answer for another client)."""
        return True

    # -- gc's look through a store (FORMAT.md §17) -------------------------------------------
    @abc.abstractmethod
    def walk(self, key: str) -> Iterator[tuple[str, list[str]]]:
        """(directory key, the names in it that are not directories) for `key` and every
        directory below it, top down; nothing if `key` does not exist. Never descends
        through a symlink, and lists a symlink to a directory as neither (gc removes nothing
        through one). StoreIOError if a directory cannot be listed: an unlistable directory
        never looks empty. Media without directories: each key prefix that holds names."""

    @abc.abstractmethod
    def flush_file(self, key: str) -> None:
        """Make the bytes `key` holds durable, whoever wrote them: a temp file whose writer
        may never have synced it, before gc gives it an object's name (FORMAT.md §17).
        A medium whose every write is durable when it is made has nothing to do."""

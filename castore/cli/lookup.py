"""An object named by a unique prefix of its id, as `castore log` prints them (12 hex)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from castore.errors import UsageError
from castore.format.layout import OBJECTS_DIR, display_name, fanout_key, is_object_name

if TYPE_CHECKING:
    from castore.store import Store

# Fewer digits than this would match many objects in any real store, so they are refused
# rather than answered with a long list of candidates.
MIN_PREFIX = 6
_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_PREFIX},63}}")
_CANDIDATES = 10  # candidates named in an ambiguity error


def is_prefix(ref: str) -> bool:
    """True if `ref` reads as an abbreviated object id (MIN_PREFIX to 63 lowercase hex)."""
    return _PREFIX.fullmatch(ref) is not None


def object_by_prefix(store: Store, prefix: str) -> str:
    """The one object whose id starts with `prefix`; UsageError if none or several do.

    Only the fan-out directory of the first two digits is listed, so the lookup costs one
    small directory read whatever the size of the store."""
    if not is_prefix(prefix):
        raise UsageError(
            f"{prefix!r} is not an object id: give the 64 hex digits, or at least "
            f"{MIN_PREFIX} of them (lowercase) as `castore log` prints them"
        )
    # Every id with this prefix lives in the same fan-out directory as the padded prefix.
    fanout = fanout_key(prefix.ljust(64, "0"))
    try:
        names = store.medium.names(fanout)
    except FileNotFoundError:  # fan-out directories are made on first use
        names = []
    found = sorted(name for name in names if name.startswith(prefix) and is_object_name(name))
    if not found:
        raise UsageError(
            f"no object with that prefix: {prefix!r} in {store.medium.where(OBJECTS_DIR)}; "
            "see `castore log TASK` for the ids of a task's snapshots"
        )
    if len(found) > 1:
        # The kind comes from a header anyone could have planted: printed escaped.
        candidates = ", ".join(
            f"{name[:16]} ({display_name(str(store.objects.kind_of(name)))})"
            for name in found[:_CANDIDATES]
        )
        more = f" and {len(found) - _CANDIDATES} more" if len(found) > _CANDIDATES else ""
        raise UsageError(
            f"prefix {prefix!r} is ambiguous: {len(found)} objects match: {candidates}{more}; "
            "give more digits"
        )
    return found[0]

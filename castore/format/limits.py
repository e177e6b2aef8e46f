"""The largest and deepest things castore writes, hence the most a reader ever has to hold.

Readers refuse anything beyond them before it can exhaust memory or the interpreter's
stack: a file larger than MAX_OBJECT_SIZE is never read, a value nested deeper than
MAX_DEPTH is never encoded nor accepted on decode (docs/FORMAT.md, 6.1 and 11.1).
"""

from __future__ import annotations

MAX_HEADER = 64  # an object's header line, newline included, is shorter than this
MAX_BODY_SIZE = 1 << 30  # a blob's body; snapshots are held to a far smaller budget
MAX_OBJECT_SIZE = MAX_BODY_SIZE + MAX_HEADER  # the largest file in objects/ or a chain
MAX_GROWN_STEPS = 10_000_000  # steps a growing plan may decide (docs/FORMAT.md 7.9)
MAX_DEPTH = 100  # lists and dicts nested in one encoded value, the outermost counted

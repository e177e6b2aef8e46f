"""A task lease on S3, where there is no lock (docs/FORMAT.md §19.5): opt-in, `lease_s=`.

Without it two workers may run one task at once on S3: neither commit is lost (the commit
point decides), but both do each step's work, and a journaled model call is paid twice. The
lease spares that, as the directory's lock does for the workers of one host. No commit rests
on it: a holder paused past its term (a stopped process, a long GC) may find itself taken
over, and its next commit then loses at the commit point as it would without a lease.

The claims are keys `tasks/<enc>/lease/<n>`, n = 0, 1, 2, ... (16 digits), each made by
`PUT If-None-Match: *`; the holder is whoever made the highest one. Its JSON says who
(`holder`: host, pid and run), for how long (`term_s`) and whether it frees the lease
(`released`). No claim is ever removed (so no number is ever made twice, and the highest is
found by HEADs, doubling then bisecting, as HEAD lookup finds a chain's). The holder renews by
claiming the next number every third of its term, and frees the lease by claiming the next
number with `released`. A taker claims the next number when the highest is released, or when
that same highest claim has stood for a whole term plus DRIFT on the taker's *own* monotonic
clock: no two hosts' wall clocks are compared, so no clock-skew bound is needed; what is
assumed is that no clock runs more than DRIFT slower than another's (rate, not offset).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Protocol

from castore.errors import TaskBusyError
from castore.format import identity
from castore.format.layout import LEASE_DIR, SEQ_WIDTH

DRIFT = 0.1  # a term is waited out with this margin: clocks' rates differ by less
POLL_S = 1.0  # how often a waiting taker looks again, at most
_LOGGER = "castore.lock"  # the directory lock's logger: one place to hear of waits


class Keys(Protocol):
    """What the lease needs of its medium: exclusive creates and reads of keys."""

    def create(
        self, key: str, data: bytes, *, sync_name: bool = True, mode: int = 0o444
    ) -> bool: ...
    def read(self, key: str, *, limit: int = ...) -> bytes: ...
    def exists(self, key: str) -> bool: ...


def claim_key(task_key: str, number: int) -> str:
    return f"{task_key}/{LEASE_DIR}/{number:0{SEQ_WIDTH}d}"


class Lease:
    """One worker's lease on one task: `acquire`, then `release` (a HeldLock)."""

    def __init__(self, keys: Keys, task_key: str, task_id: str, term_s: float) -> None:
        self._keys = keys
        self._task_key = task_key
        self._task_id = task_id
        self._term_s = term_s
        self._holder = {
            "host": identity.host_name(),
            "pid": os.getpid(),
            "run": identity.token_hex(8),
        }
        self._number: int | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False  # taken over while held (the holder was paused past its term)

    # -- taking it ---------------------------------------------------------------------------
    def acquire(self, timeout: float) -> bool:
        """Claim the lease, waiting up to `timeout` seconds (negative: forever) while another
        worker holds it; TaskBusyError after that."""
        started = time.monotonic()
        seen: tuple[int, float] | None = None  # (highest claim, when this worker first saw it)
        told = False
        while True:
            highest = self._highest()
            record = self._record(highest) if highest is not None else {}
            now = time.monotonic()
            if highest is not None and seen is not None and seen[0] == highest:
                expired = now - seen[1] >= float(record.get("term_s", 0)) * (1 + DRIFT)
            else:
                expired = False
                seen = (highest, now) if highest is not None else None
            free = highest is None or record.get("released") is True or expired
            if free and self._claim(0 if highest is None else highest + 1, released=False):
                self._start_renewing()
                return True
            if not free:
                waited = now - started
                if 0 <= timeout <= waited:
                    raise TaskBusyError(self._task_id, timeout, lease=True)
                if not told and timeout != 0:
                    logging.getLogger(_LOGGER).warning(
                        "task %r is leased by another worker; waiting %s for its lease",
                        self._task_id,
                        "with no time limit" if timeout < 0 else f"up to {timeout:g}s",
                    )
                    told = True
                pause = POLL_S if timeout < 0 else min(POLL_S, max(0.0, timeout - waited))
                time.sleep(max(pause, 0.01))

    def _highest(self) -> int | None:
        """The highest claim's number (claims are never removed: there are no gaps)."""
        if not self._keys.exists(claim_key(self._task_key, 0)):
            return None
        low, high = 0, 1
        while self._keys.exists(claim_key(self._task_key, high)):
            low, high = high, high * 2
        while high - low > 1:  # low exists, high does not
            middle = (low + high) // 2
            if self._keys.exists(claim_key(self._task_key, middle)):
                low = middle
            else:
                high = middle
        return low

    def _record(self, number: int) -> dict[str, Any]:
        try:
            found = json.loads(self._keys.read(claim_key(self._task_key, number), limit=4096))
        except (FileNotFoundError, ValueError):
            return {}  # unreadable: its term is 0, so it is taken over once seen twice
        return found if isinstance(found, dict) else {}

    def _claim(self, number: int, *, released: bool) -> bool:
        body = {"holder": self._holder, "term_s": self._term_s, "released": released}
        data = json.dumps(body, sort_keys=True).encode() + b"\n"
        if not self._keys.create(claim_key(self._task_key, number), data):
            return False  # another worker claimed this number first
        self._number = number
        return True

    # -- holding it ----------------------------------------------------------------------------
    def _start_renewing(self) -> None:
        self._renewer = threading.Thread(
            target=self._renew, name=f"castore-lease-{self._task_id}", daemon=True
        )
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self._term_s / 3):
            number = self._number
            if number is None or not self._claim(number + 1, released=False):
                self.lost = True  # taken over: our commits, if any, lose at the commit point
                logging.getLogger(_LOGGER).warning(
                    "the lease of task %r was taken over by another worker", self._task_id
                )
                return

    def release(self) -> None:
        """Free the lease: the next number, claimed as released (a taker need not wait out
        the term). Nothing to do if it was taken over meanwhile."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        number = self._number
        if number is not None and not self.lost:
            self._claim(number + 1, released=True)
        self._number = None

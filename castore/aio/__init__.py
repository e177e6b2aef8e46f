"""asyncio API: the sync store and run, driven from an event loop without blocking it
(public: AsyncStore, AsyncRun, AsyncCall, AsyncEffect, DEFAULT_WORKERS, in_thread).

Every blocking step (reads, writes, fsyncs, the commit point) runs in a thread pool the
`AsyncStore` owns, so one loop can drive many agents, each committing to its own task at
the same time. The protocol and the journaled call are the sync generators of
castore.run.protocol and castore.run.journal; this package only drives them (one implementation).

Cancellation: a commit already in its thread is never abandoned half way; the awaiting
coroutine waits for it to end, so the run's HEAD is what the store holds, then
`CancelledError` is raised. A commit not yet started is dropped (nothing happened). A
cancellation during the caller's send leaves the effect SUBMITTED (it was committed before
the send): the next resume reconciles it. Timeouts are the caller's (`asyncio.wait_for`).

A sync send or journaled call cancelled while it runs in the pool cannot be stopped: the await
ends at once, the function runs on, and its step is in flight until it returns
(castore.run.inflight). A retry in this process (perform, effect, reconcile, settle, call) first
waits for it to return, so a reconcile then asks a service that has seen the request.

One run has one driver: a second coroutine or thread that calls into a run while a call is
in progress gets a UsageError (two runs of one task are refused by the task lock as ever).

May import: castore.store, castore.run and everything below them; nothing else.
"""

from castore.aio.effect import AsyncCall, AsyncEffect
from castore.aio.pool import in_thread
from castore.aio.run import AsyncRun
from castore.aio.store import DEFAULT_WORKERS, AsyncStore

__all__ = ["DEFAULT_WORKERS", "AsyncCall", "AsyncEffect", "AsyncRun", "AsyncStore", "in_thread"]

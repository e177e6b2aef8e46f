"""The thread pool side of castore.aio: blocking steps awaited without blocking the loop,
and cancellation that never abandons a commit half way (see castore.aio)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from castore.run import journal

T = TypeVar("T")


async def in_thread(
    pool: ThreadPoolExecutor, fn: Callable[[], T], on_cancel: Callable[[T], object] | None = None
) -> T:
    """`fn()` in the pool, awaited. Cancelled while it runs: wait for it to end (a commit is
    not abandoned half way), hand its result to `on_cancel` (to release what it took), then
    raise CancelledError. Cancelled before it starts: it never runs."""
    job: Future[T] = pool.submit(fn)
    waiter = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(waiter)
    except asyncio.CancelledError:
        if job.cancel():
            raise  # still queued: nothing happened
        while not waiter.done():
            # A second cancel changes nothing: the commit must end before the state is known.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([waiter])
        failure = job.exception()
        if failure is None and on_cancel is not None:
            on_cancel(job.result())
        raise


async def answered(
    pool: ThreadPoolExecutor,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    abandoned: Callable[[Future[Any]], object],
) -> Any:
    """The caller's function: awaited on the loop if async, else in the pool (a sync SDK
    call blocks); a sync function that returns an awaitable has it awaited. Cancelled while
    a sync function runs, the await ends at once (a timeout must not wait for a hung SDK),
    but the thread cannot be stopped: `abandoned` is handed the job that runs on."""
    if journal.is_async(fn):
        return await fn(*args, **kwargs)
    job = pool.submit(fn, *args, **kwargs)
    try:
        result = await asyncio.wrap_future(job)
    except asyncio.CancelledError:
        if not job.cancel():  # it had started: its step is in flight until it returns
            abandoned(job)
        raise
    return await result if inspect.isawaitable(result) else result


async def ended(job: Future[Any]) -> None:
    """Wait for `job` to end, however it ends (its outcome is not ours to raise)."""
    waiter = asyncio.wrap_future(job)
    waiter.add_done_callback(_retrieved)
    await asyncio.wait([waiter])


def _retrieved(waiter: asyncio.Future[Any]) -> None:
    # Looked at, so asyncio does not log "exception was never retrieved" for it.
    if not waiter.cancelled():
        waiter.exception()


def advance(steps: Generator[Any, Any, Any], reply: Any, first: bool) -> tuple[bool, Any]:
    """One step of a step generator: (False, its next request) or (True, its result)."""
    try:
        return False, next(steps) if first else steps.send(reply)
    except StopIteration as stop:
        return True, stop.value

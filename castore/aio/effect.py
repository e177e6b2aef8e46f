"""The async effect block of castore.aio: `async with arun.effect(step, service) as call`."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from castore.aio.pool import in_thread
from castore.format.effects import Service
from castore.run import protocol

if TYPE_CHECKING:
    from castore.run.run import Run


class Driver(Protocol):
    """What an effect block needs of the AsyncRun that opened it."""

    run: Run
    pool: ThreadPoolExecutor

    def claim(self, doing: str) -> None: ...

    def release(self) -> None: ...

    async def wait_in_flight(self, step_id: str | None) -> None: ...


class AsyncCall:
    """The async face of protocol.Call: `key` to send with, then confirm or not_done."""

    def __init__(self, call: protocol.Call, pool: ThreadPoolExecutor) -> None:
        self._call = call
        self.pool = pool
        self.step = call.step
        self.attempt = call.attempt
        self.done = call.done

    @property
    def key(self) -> str:
        """The idempotency key to send the request with (ends the block of a done effect)."""
        return self._call.key

    @property
    def receipt(self) -> str | None:
        return self._call.receipt

    async def confirm(self, receipt: str) -> str:
        """Commit CONFIRMED with the service's receipt; durable before this returns."""
        return await in_thread(self.pool, lambda: self._call.confirm(receipt))

    async def not_done(self, reason: str) -> str:
        """Commit NOT_DONE: the service definitively did not apply the operation."""
        return await in_thread(self.pool, lambda: self._call.not_done(reason))


class AsyncEffect:
    """`async with arun.effect(step, service) as call:` (see AsyncRun.effect). The run is
    claimed from entry to exit: nothing else may commit to it while the block runs."""

    def __init__(self, arun: Driver, step_id: str, service: Service, key: str | None) -> None:
        self._arun = arun
        self._step = step_id
        self._service = service
        self._key = key
        self._manager: contextlib.AbstractContextManager[protocol.Call] | None = None

    def _enter(self) -> tuple[contextlib.AbstractContextManager[protocol.Call], protocol.Call]:
        # Run.effect first decides a growing plan's step (a commit) or checks its replay.
        manager = self._arun.run.effect(self._step, self._service, key=self._key)
        return manager, manager.__enter__()

    async def __aenter__(self) -> AsyncCall:
        self._arun.claim(f"effect({self._step!r})")
        try:
            await self._arun.wait_in_flight(self._step)
            # Cancelled after SUBMITTED was committed: unwind the manager as a failed body.
            manager, call = await in_thread(
                self._arun.pool,
                self._enter,
                on_cancel=lambda entered: entered[0].__exit__(
                    asyncio.CancelledError, asyncio.CancelledError(), None
                ),
            )
        except BaseException:
            self._arun.release()
            raise
        self._manager = manager
        return AsyncCall(call, self._arun.pool)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            # The manager's exit only checks the block settled (no I/O): run on the loop.
            assert self._manager is not None  # noqa: S101 - set by a successful __aenter__
            return bool(self._manager.__exit__(exc_type, exc, tb))
        finally:
            self._arun.release()

"""AsyncRun: a run driven from asyncio, each blocking step in the store's pool, one driver
at a time (see castore.aio)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from castore import crashpoints
from castore.aio.effect import AsyncEffect
from castore.aio.pool import advance, answered, ended, in_thread
from castore.errors import UsageError
from castore.format.effects import NextAction, Service
from castore.format.records import Snapshot
from castore.run import inflight, journal, protocol
from castore.run.brief import Brief, make_brief
from castore.run.contract import Position
from castore.run.run import Run

T = TypeVar("T")
R = TypeVar("R")


class AsyncRun:
    """A run driven from asyncio: each method awaits the sync Run's, in the store's pool.
    `run` is the sync Run (its reading properties are safe to use between awaits)."""

    def __init__(self, run: Run, pool: ThreadPoolExecutor) -> None:
        self.run = run
        self.pool = pool
        self._busy = threading.Lock()
        self._doing: str | None = None

    # -- reading (in memory: no I/O) -----------------------------------------------------
    @property
    def task_id(self) -> str:
        return self.run.task_id

    @property
    def head(self) -> Snapshot:
        return self.run.head

    @property
    def next_step(self) -> str | None:
        return self.run.next_step

    @property
    def finished(self) -> bool:
        return self.run.finished

    @property
    def stale(self) -> bool:
        return self.run.stale

    @property
    def grows(self) -> bool:
        return self.run.grows

    @property
    def plan_digest(self) -> str:
        return self.run.plan_digest

    @property
    def position(self) -> int:
        return self.run.position

    def done(self, step_id: str) -> bool:
        return self.run.done(step_id)

    def receipt(self, step_id: str) -> str | None:
        return self.run.receipt(step_id)

    async def result(self, step_id: str) -> Any:
        """The result of a finished plain step (a blob is read in the pool)."""
        return await self._do("result", lambda: self.run.result(step_id))

    # -- one driver at a time --------------------------------------------------------------
    def claim(self, doing: str) -> None:
        """Take the run for `doing`; UsageError if another coroutine or thread has it."""
        if not self._busy.acquire(blocking=False):
            raise UsageError(
                f"the run of task {self.task_id!r} is busy with {self._doing} for another "
                f"coroutine or thread, so {doing} is refused: one run has one driver. Await "
                "the first call before the next, or give each agent its own task"
            )
        self._doing = doing

    def release(self) -> None:
        self._doing = None
        self._busy.release()

    @contextlib.contextmanager
    def _claimed(self, doing: str) -> Iterator[None]:
        self.claim(doing)
        try:
            yield
        finally:
            self.release()

    async def _do(self, doing: str, fn: Callable[[], T]) -> T:
        with self._claimed(doing):
            return await in_thread(self.pool, fn)

    async def wait_in_flight(self, step_id: str | None) -> None:
        """Wait until no send or call of step `step_id` that a cancelled await left running
        in the pool is still running (castore.run.inflight): only then may the step be
        reconciled, sent or called again (None: no step, nothing to wait for). Cancelled
        while it waits, nothing happened."""
        if step_id is None:
            return
        while jobs := inflight.running(self.run, step_id):
            crashpoints.reach("aio.in_flight_awaited")
            await ended(jobs[0])

    def _abandoned(self, step_id: str) -> Callable[[Future[Any]], None]:
        return lambda job: inflight.hold(self.run, step_id, job)

    async def _drive(
        self,
        doing: str,
        step_id: str,
        steps: Generator[R, Any, T],
        answer: Callable[[R], Awaitable[Any]],
    ) -> T:
        """Run a step generator: its steps in the pool, its requests answered on the loop;
        not before the step's earlier send or call, if one still runs, has returned."""
        with self._claimed(doing):
            await self.wait_in_flight(step_id)
            finished, value = await in_thread(
                self.pool,
                functools.partial(advance, steps, None, True),
                on_cancel=lambda _: steps.close(),
            )
            while not finished:
                try:
                    reply = await answer(value)
                except BaseException:
                    steps.close()  # at its request: nothing more is committed
                    raise
                finished, value = await in_thread(
                    self.pool,
                    functools.partial(advance, steps, reply, False),
                    on_cancel=lambda _: steps.close(),
                )
            result: T = value
            return result

    # -- committing ----------------------------------------------------------------------
    async def at(self, step_id: str, *, effect: bool = False, args: str | None = None) -> Position:
        """`Run.at`: DONE (recorded here) or PENDING (decided; a new decision of a growing
        plan is durable before this returns)."""
        return await self._do(
            f"at({step_id!r})", lambda: self.run.at(step_id, effect=effect, args=args)
        )

    async def decide(self, step_id: str, *, effect: bool = False, args: str | None = None) -> None:
        """`Run.decide`: `at` for a step that must not be done yet."""
        await self._do(
            f"decide({step_id!r})", lambda: self.run.decide(step_id, effect=effect, args=args)
        )

    async def append(
        self, step_id: str, result: Any = None, *, args: str | None = None
    ) -> str | None:
        """`Run.append`: decide a plain step and record its result in one commit."""
        return await self._do(
            f"append({step_id!r})", lambda: self.run.append(step_id, result, args=args)
        )

    async def finish(self) -> str:
        """`Run.finish`: a growing task says it is done (a FINISH commit)."""
        return await self._do("finish", self.run.finish)

    async def commit_step(
        self, step_id: str, result: Any = None, *, args: str | None = None
    ) -> str:
        """`Run.commit_step`, durable before this returns."""
        return await self._do(
            f"commit_step({step_id!r})", lambda: self.run.commit_step(step_id, result, args=args)
        )

    async def call(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`Run.call` with `fn` sync (run in the pool) or async (awaited): run once, record
        the result; a replay returns the recorded result without calling `fn`."""
        steps = journal.call_steps(self.run, step_id, fn, args, kwargs)

        async def invoke(_: journal.Invoke) -> Any:
            return await answered(self.pool, fn, args, kwargs, self._abandoned(step_id))

        return await self._drive(f"call({step_id!r})", step_id, steps, invoke)

    async def perform(
        self,
        step_id: str,
        service: Service,
        send: Callable[[str], Any],
        *,
        key: str | None = None,
    ) -> str:
        """`Run.perform` with `send(key)` async (awaited) or sync (run in the pool): drive
        the effect to CONFIRMED; returns the receipt. SUBMITTED is durable before `send`.
        A sync send still running after an earlier perform of the step was cancelled is
        waited for first: then the effect goes by the table (a reconcile finds it)."""
        steps = protocol.perform_steps(self.run, step_id, service, key)

        async def deliver(request: protocol.Send) -> Any:
            return await answered(self.pool, send, (request.key,), {}, self._abandoned(step_id))

        return await self._drive(f"perform({step_id!r})", step_id, steps, deliver)

    def effect(self, step_id: str, service: Service, *, key: str | None = None) -> AsyncEffect:
        """`async with arun.effect(step, service) as call:` send with `call.key`, then
        `await call.confirm(receipt)` (or `await call.not_done(reason)`)."""
        return AsyncEffect(self, step_id, service, key)

    async def settle(self, service: Service) -> NextAction:
        """`Run.settle`: reconcile or mark unresolved the frontier effect (once a send of it
        that a cancelled perform left running has returned)."""
        with self._claimed("settle"):
            await self.wait_in_flight(self.run.next_step)
            return await in_thread(self.pool, lambda: self.run.settle(service))

    async def reconcile(self, step_id: str, service: Service) -> NextAction:
        """`Run.reconcile`: look the effect up by key and commit the answer (once a send of
        it that a cancelled perform left running has returned)."""
        with self._claimed(f"reconcile({step_id!r})"):
            await self.wait_in_flight(step_id)
            return await in_thread(self.pool, lambda: self.run.reconcile(step_id, service))

    async def next_action(self, step_id: str | None = None) -> NextAction:
        """`Run.next_action` (it may read the clock and HEAD only; cheap, but kept uniform)."""
        return await self._do("next_action", lambda: self.run.next_action(step_id))

    async def brief(self, **options: Any) -> Brief:
        """The resume brief of this run's task."""
        return await self._do("brief", lambda: make_brief(self.run, **options))

    # -- lifetime --------------------------------------------------------------------------
    async def close(self, *, finish: bool = True) -> None:
        """`Run.close`: seal a finished task (v2), release the task lock."""
        await self._do("close", lambda: self.run.close(finish=finish))

    async def __aenter__(self) -> AsyncRun:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close(finish=exc is None)

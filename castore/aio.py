"""asyncio API: the sync store and run, driven from an event loop without blocking it.

Every blocking step (reads, writes, fsyncs, the commit point) runs in a thread pool the
`AsyncStore` owns, so one loop can drive many agents, each committing to its own task at
the same time. The protocol and the journaled call are the sync generators of
castore.protocol and castore.journal; this module only drives them (one implementation).

Cancellation: a commit already in its thread is never abandoned half way; the awaiting
coroutine waits for it to end, so the run's HEAD is what the store holds, then
`CancelledError` is raised. A commit not yet started is dropped (nothing happened). A
cancellation during the caller's send leaves the effect SUBMITTED (it was committed before
the send): the next resume reconciles it. Timeouts are the caller's (`asyncio.wait_for`).

A sync send or journaled call cancelled while it runs in the pool cannot be stopped: the await
ends at once, the function runs on, and its step is in flight until it returns
(castore.inflight). A retry in this process (perform, effect, reconcile, settle, call) first
waits for it to return, so a reconcile then asks a service that has seen the request.

One run has one driver: a second coroutine or thread that calls into a run while a call is
in progress gets a UsageError (two runs of one task are refused by the task lock as ever).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from castore import crashpoints, inflight, journal, protocol
from castore.aioeffect import AsyncCall, AsyncEffect
from castore.aiopool import advance, answered, ended, in_thread
from castore.brief import Brief, make_brief
from castore.effects import NextAction, Service
from castore.errors import UsageError
from castore.records import Plan, Snapshot
from castore.replay import Position
from castore.run import Run
from castore.store import Store

__all__ = ["DEFAULT_WORKERS", "AsyncCall", "AsyncEffect", "AsyncRun", "AsyncStore", "in_thread"]

T = TypeVar("T")
R = TypeVar("R")

# Threads wait on fsync far more than they compute: many agents need many threads, not cores.
DEFAULT_WORKERS = 64


class AsyncStore:
    """A castore store for asyncio code: `await astore.open_task(task, plan)` -> AsyncRun.

    `store_or_path`: a Store, or the path of one (opened in the pool on first use; pass
    `Store.open` options as keywords). `max_workers`: the size of the pool that runs every
    blocking step; an agent uses one thread while it commits."""

    def __init__(
        self,
        store_or_path: Store | str | os.PathLike[str],
        *,
        max_workers: int = DEFAULT_WORKERS,
        **open_options: Any,
    ) -> None:
        self._store = store_or_path if isinstance(store_or_path, Store) else None
        self._path = None if isinstance(store_or_path, Store) else store_or_path
        self._open_options = open_options
        self._opening = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="castore-aio")

    def _opened(self) -> Store:
        with self._opening:
            store = self._store
            if store is None:
                assert self._path is not None  # noqa: S101 - one of the two is always set
                store = self._store = Store.open(self._path, **self._open_options)
            return store

    async def store(self) -> Store:
        """The sync Store underneath (opened in the pool the first time)."""
        if self._store is not None:
            return self._store
        return await in_thread(self.pool, self._opened)

    async def _run(self, verb: str, task_id: str, plan: Plan, options: dict[str, Any]) -> AsyncRun:
        store = await self.store()
        method: Callable[..., Run] = getattr(store, verb)
        # Cancelled while it opens: the run it made holds the task lock, released here.
        run = await in_thread(
            self.pool,
            functools.partial(method, task_id, plan, **options),
            on_cancel=lambda opened: opened.close(finish=False),
        )
        return AsyncRun(run, self.pool)

    async def start(self, task_id: str, plan: Plan, **options: Any) -> AsyncRun:
        """`Store.start`: create the task; TaskExistsError if it exists."""
        return await self._run("start", task_id, plan, options)

    async def resume(self, task_id: str, plan: Plan, **options: Any) -> AsyncRun:
        """`Store.resume`: verify the task and pass the gate."""
        return await self._run("resume", task_id, plan, options)

    async def open_task(self, task_id: str, plan: Plan, **options: Any) -> AsyncRun:
        """`Store.open_task`: start the task, or resume it if it exists."""
        return await self._run("open_task", task_id, plan, options)

    async def resolve(self, task_id: str, step_id: str, **decision: Any) -> str:
        """`Store.resolve`: a person's decision on an in-flight effect."""
        store = await self.store()
        return await in_thread(
            self.pool, functools.partial(store.resolve, task_id, step_id, **decision)
        )

    async def brief(self, task_id: str, **options: Any) -> Brief:
        """The resume brief of a task (castore.brief.make_brief of its verified chain)."""
        store = await self.store()
        return await in_thread(self.pool, lambda: make_brief(store.verify(task_id), **options))

    async def close(self) -> None:
        """Stop taking work; blocking steps already started end in their threads."""
        self.pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


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
        in the pool is still running (castore.inflight): only then may the step be
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

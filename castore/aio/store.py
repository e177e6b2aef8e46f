"""AsyncStore: a castore store for asyncio code; its pool runs every blocking step."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from castore.aio.pool import in_thread
from castore.aio.run import AsyncRun
from castore.format.records import Plan
from castore.run.brief import Brief, make_brief
from castore.run.run import Run
from castore.store import Store

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

    async def _run(
        self, verb: str, task_id: str, plan: Plan | None, options: dict[str, Any]
    ) -> AsyncRun:
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

    async def resume(self, task_id: str, plan: Plan | None = None, **options: Any) -> AsyncRun:
        """`Store.resume`: verify the task and pass the gate (`plan_id=` instead of a plan:
        the task's stored plan)."""
        return await self._run("resume", task_id, plan, options)

    async def open_task(self, task_id: str, plan: Plan | None = None, **options: Any) -> AsyncRun:
        """`Store.open_task`: start the task, or resume it if it exists (`plan_id=` instead
        of a plan: the stored plan of that id)."""
        return await self._run("open_task", task_id, plan, options)

    async def resolve(self, task_id: str, step_id: str, **decision: Any) -> str:
        """`Store.resolve`: a person's decision on an in-flight effect."""
        store = await self.store()
        return await in_thread(
            self.pool, functools.partial(store.resolve, task_id, step_id, **decision)
        )

    async def brief(self, task_id: str, **options: Any) -> Brief:
        """The resume brief of a task (castore.run.brief.make_brief of its verified chain)."""
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

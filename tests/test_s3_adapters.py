"""The adapters on an S3 store, each engine (issue 25 item 1): a CastoreSaver keeping a thread
across savers, castore.aio's effect protocol (an effect performed once, a resumed run that
skips it), and in the slow set LangGraph's own checkpointer conformance suite against a
CastoreSaver whose store is s3://..."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from s3servers import S3Endpoint

import castore
from castore.aio import AsyncStore

PLAN = castore.Plan.build("order", "quote", castore.effect("pay"), "ship")


def test_an_async_run_on_s3_performs_an_effect_once_and_resumes_past_it(s3: S3Endpoint) -> None:
    """A coroutine commits a step, performs a payment (key durable before the send, receipt
    after), and a second run of the task skips all of it: the service saw one request."""
    url = s3.new_bucket()
    castore.Store.init(url)
    sent: list[str] = []
    service = castore.Service(
        "pay", reconcile=lambda key: castore.found(key) if key in sent else castore.NOT_FOUND
    )

    async def send(key: str) -> str:
        sent.append(key)
        return f"receipt-{len(sent)}"

    async def worker() -> None:
        async with (
            AsyncStore(castore.Store.open(url)) as astore,
            await astore.open_task("o-1", PLAN, lock_timeout=None) as run,
        ):
            while (step := run.next_step) is not None:
                if step == "pay":
                    await run.perform("pay", service, send)
                else:
                    await run.commit_step(step, {"total": 12} if step == "quote" else "sent")

    asyncio.run(worker())
    asyncio.run(worker())
    assert 1 == len(sent)
    store = castore.Store.open(url)
    assert store.status("o-1").finished
    with store.resume("o-1", PLAN, lock_timeout=None) as run:
        assert "receipt-1" == run.receipt("pay")


def test_a_castore_saver_on_s3_keeps_a_thread_across_savers(s3: S3Endpoint) -> None:
    """Checkpoints of a growing conversation put through one CastoreSaver on S3 read back
    whole through a second one (a restarted process), newest first; deleting the thread
    leaves nothing to read."""
    pytest.importorskip("langgraph")
    from test_langgraph_saver import config, message, put  # noqa: PLC0415 - langgraph extra

    from castore.langgraph import CastoreSaver  # noqa: PLC0415

    url = s3.new_bucket("lg")
    messages: list[object] = []
    with CastoreSaver(castore.Store.open(url, create=True)) as saver:
        parent = None
        for step in range(12):
            messages = [*messages, message(step)]
            parent = put(saver, "conv", {"messages": messages}, parent)
    with CastoreSaver(castore.Store.open(url)) as again:
        latest = again.get_tuple(config("conv"))
        assert latest is not None
        assert messages == latest.checkpoint["channel_values"]["messages"]
        assert 12 == len(list(again.list(config("conv"))))
        again.delete_thread("conv")
        assert again.get_tuple(config("conv")) is None


@pytest.mark.slow
@pytest.mark.asyncio
async def test_langgraph_conformance_passes_on_s3(s3: S3Endpoint) -> None:
    """LangGraph's checkpointer conformance suite (base and extended cases), each case on a
    CastoreSaver over a fresh S3 store (the slow set: on POSIX it runs by default)."""
    await conformance_on(s3)


async def conformance_on(s3: S3Endpoint) -> None:
    conformance = pytest.importorskip("langgraph.checkpoint.conformance")
    from langgraph.checkpoint.conformance.report import ProgressCallbacks  # noqa: PLC0415

    from castore.langgraph import CastoreSaver  # noqa: PLC0415 - the langgraph extra

    results: list[tuple[str, str, bool, str | None]] = []

    @conformance.checkpointer_test(name="CastoreSaver on S3")
    async def factory() -> AsyncGenerator[CastoreSaver, None]:
        url = s3.new_bucket("lg")
        async with CastoreSaver(castore.Store.open(url, create=True)) as saver:
            yield saver

    def record(capability: str, name: str, passed: bool, error: str | None) -> None:
        results.append((capability, name, passed, error))

    report = await conformance.validate(factory, progress=ProgressCallbacks(on_test_result=record))
    failed = [f"{cap}/{name}: {error}" for cap, name, passed, error in results if not passed]
    assert [] == failed
    assert len(results) == 81
    assert "FULL" == report.conformance_level()

"""The adapters on an S3 store, each engine (issue 25 item 1): LangGraph's own checkpointer
conformance suite against a CastoreSaver whose store is s3://..., and castore.aio's effect
protocol there (an effect performed once, a resumed run that skips it)."""

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


@pytest.mark.asyncio
async def test_langgraph_conformance_passes_on_s3(s3: S3Endpoint) -> None:
    """LangGraph's checkpointer conformance suite (base and extended cases), each case on a
    CastoreSaver over a fresh S3 store."""
    if s3.engine != "moto":
        pytest.skip("on RGW the suite takes minutes: test_langgraph_conformance_on_rgw, -m slow")
    await conformance_on(s3)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_langgraph_conformance_on_rgw(s3: S3Endpoint) -> None:
    """The same suite on the RADOS Gateway (the slow set: each case makes a store)."""
    if s3.engine != "rgw":
        pytest.skip("moto runs it in the default set")
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

"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance 0.0.2:
58 base and 23 extended cases) against CastoreSaver."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncGenerator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from castore.langgraph import CastoreSaver

BASE = ("put", "put_writes", "get_tuple", "list", "delete_thread")
EXTENDED = ("delete_for_runs", "copy_thread", "prune")


@pytest.mark.asyncio
async def test_conformance_passes_every_base_and_extended_case() -> None:
    """CastoreSaver passes all 81 cases (58 base, 23 extended); a failure names the case."""
    results: list[tuple[str, str, bool]] = []
    roots: list[tempfile.TemporaryDirectory[str]] = []

    @checkpointer_test(name="CastoreSaver")
    async def factory() -> AsyncGenerator[CastoreSaver, None]:
        root = tempfile.TemporaryDirectory()
        roots.append(root)
        async with CastoreSaver(root.name) as saver:
            yield saver

    def record(capability: str, name: str, passed: bool, error: str | None) -> None:
        results.append((capability, name, passed))

    try:
        report = await validate(factory, progress=ProgressCallbacks(on_test_result=record))
    finally:
        for root in roots:
            root.cleanup()
    failed = [f"{cap}/{name}" for cap, name, passed in results if not passed]
    assert [] == failed
    base = sum(1 for cap, _, ok in results if ok and cap in BASE)
    extended = sum(1 for cap, _, ok in results if ok and cap in EXTENDED)
    assert (58, 23) == (base, extended)
    assert "FULL" == report.conformance_level()

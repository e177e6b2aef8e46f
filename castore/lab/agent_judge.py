"""The agent campaign's judge: the fake model's bill and the fake service's ledger, read from
their files, against what castore had committed when each attempt started.

A model call billed again is a *re-bill* if its result was committed before the attempt that
repeated it (castore had it and paid anyway: must never happen), an *in-flight repeat* if it
was not (the kill came between the bill and the commit: allowed, reported). An operation the
ledger holds twice under one key is a *duplicate*.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from castore.format.model import attrs


@attrs.frozen
class Attempt:
    """One process of the agent: its task, its pid (the bill names it) and the steps castore
    had committed for the task when it started (read from the store after the last one died)."""

    task: str
    pid: int
    committed: frozenset[str]


@attrs.define
class Bills:
    """What the model log says about repeated calls."""

    calls: int = 0
    rebilled: int = 0
    inflight_repeats: int = 0
    changed_args: int = 0
    stray: int = 0
    problems: list[str] = attrs.field(factory=list)


def judge_bills(log: Iterable[dict[str, Any]], attempts: Iterable[Attempt]) -> Bills:
    """Classify every billed call by the attempt (task, pid) that made it, in order."""
    by_attempt: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for entry in log:
        by_attempt.setdefault((str(entry["task"]), int(entry["pid"])), []).append(entry)
    bills = Bills()
    billed: dict[str, dict[str, str]] = {}  # task -> step -> args digest of its first bill
    for attempt in attempts:
        seen = billed.setdefault(attempt.task, {})
        here: set[str] = set()
        for entry in by_attempt.pop((attempt.task, attempt.pid), []):
            bills.calls += 1
            step, digest = str(entry["step"]), str(entry["args"])
            where = f"{attempt.task} {step} (pid {attempt.pid})"
            if step in attempt.committed or step in here:
                bills.rebilled += 1
                bills.problems.append(f"{where}: billed again although its result was committed")
            elif step in seen:
                bills.inflight_repeats += 1
            if step in seen and seen[step] != digest:
                bills.changed_args += 1
                bills.problems.append(f"{where}: asked with other messages than its first bill")
            seen.setdefault(step, digest)
            here.add(step)
    for (task, pid), entries in by_attempt.items():
        bills.calls += len(entries)
        bills.stray += len(entries)
        bills.problems.append(f"{task}: {len(entries)} call(s) by pid {pid}, no attempt of ours")
    return bills


def duplicates(ledger: Iterable[dict[str, Any]]) -> tuple[int, list[str]]:
    """Operations applied more than once under one key: (surplus applications, problems)."""
    counts = Counter(str(entry["key"]) for entry in ledger)
    over = {key: count for key, count in sorted(counts.items()) if count > 1}
    return sum(count - 1 for count in over.values()), [
        f"key {key} applied {count} times" for key, count in over.items()
    ]

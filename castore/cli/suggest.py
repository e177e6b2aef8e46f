"""`did you mean ...?` for a task id nobody wrote: the store's ids nearest by edit distance."""

from __future__ import annotations

from collections.abc import Iterable

# As git's "did you mean" (help.c): a candidate this many edits away or closer, and not more
# than a third of the id's length, so that a short id does not suggest every other short id.
_MAX_EDITS = 3
_MAX_SHOWN = 3
# Ids compared at most: an error line must not take seconds in a store of a million tasks.
_MAX_COMPARED = 20_000


def distance(a: str, b: str) -> int:
    """The Damerau-Levenshtein (optimal string alignment) distance: a swap of two
    neighbouring characters, the commonest typo, counts as one edit, as in git."""
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            cost = min(
                previous[j] + 1,
                current[j - 1] + 1,
                previous[j - 1] + (char_a != char_b),
            )
            if i > 1 and j > 1 and char_a == b[j - 2] and a[i - 2] == char_b:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, previous = previous, current
    return previous[-1]


def nearest(wanted: str, known: Iterable[str]) -> list[str]:
    """The ids of `known` nearest to `wanted` (all at the least distance, at most three,
    sorted), or none if even the nearest is too far to be a typo."""
    limit = min(_MAX_EDITS, max(1, len(wanted) // 3))
    # An id whose length differs by more than the limit is further than the limit.
    near = [each for each in known if abs(len(each) - len(wanted)) <= limit and each != wanted]
    scored = sorted((distance(wanted, each), each) for each in near[:_MAX_COMPARED])
    if not scored or scored[0][0] > limit:
        return []
    best = scored[0][0]
    return [each for score, each in scored if score == best][:_MAX_SHOWN]


def did_you_mean(wanted: str, known: Iterable[str]) -> str:
    """`; did you mean 'tally-1'?` (or `'a' or 'b'`), or '' when nothing is near."""
    found = nearest(wanted, known)
    if not found:
        return ""
    return f"; did you mean {' or '.join(repr(each) for each in found)}?"

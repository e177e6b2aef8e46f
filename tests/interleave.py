"""A deterministic interleaving harness: a few actors (threads) run castore operations one at a
time, switching only at castore's named points, and a driver runs them through *every* order
of the points a scenario calls interesting (stateless model checking, as CHESS does).

How it controls the threads: `castore.crashpoints.install_hook` makes every point, in whatever
thread reaches it, stop and wait for the scheduler's turn; `crashpoints.wait(name, ready)`,
which castore calls just before it blocks on another of its own threads (a sealer's queue, a
drain), is a point whose actor may go on only once `ready()` holds. Threads an actor starts
(a run's sealer) become actors of their own, named after their parent, and run alone to their
first point before the parent goes on. At every point the scheduler waits until every actor
has stopped or ended, then lets exactly one go on:

- the actor that just stopped goes on alone, without a choice, if its point is not one the
  scenario calls interesting (so an operation between two interesting points is one step);
- otherwise every actor that may go on is a choice, and the driver tries each in turn:
  depth first over the tree of choices, each path a fresh run of the scenario from its setup.

A run that, given the same choices, offers other choices than before is nondeterministic
(something not under the scheduler raced): that is an error, never explored past. An actor
that neither stops at a point nor ends within `STUCK_S` blocks on something the harness cannot
see: an error too, naming the actor and its stack.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from castore import crashpoints

STUCK_S = 20.0
START = "actor.start"  # every actor's first point: which one starts first is a choice

Ready = Callable[[], bool]
# The points at which the schedule may switch, by actor name ("*": every other actor). An
# actor's START is always one; an actor listed with no points runs each turn to its end.
Interest = dict[str, frozenset[str]]


class HarnessError(AssertionError):
    """The harness lost control of the threads (nondeterminism, an actor stuck elsewhere)."""


@attrs.define(eq=False)
class Actor:
    name: str
    thread: threading.Thread | None = None
    state: str = "starting"  # starting, running, stopped, done
    point: str = START
    ready: Ready | None = None
    turn: bool = False
    error: BaseException | None = None
    children: int = 0


@attrs.define
class Step:
    """One choice: who could go on (their names and points), and who did."""

    options: tuple[tuple[str, str], ...]
    chosen: int


@attrs.define
class Trace:
    """What one run did: its choices, and every (actor, point) in the order they passed."""

    steps: list[Step] = attrs.field(factory=list)
    passed: list[tuple[str, str]] = attrs.field(factory=list)
    errors: dict[str, BaseException] = attrs.field(factory=dict)

    def schedule(self) -> str:
        return " ".join(f"{actor}@{point}" for actor, point in self.passed)


class Scheduler:
    """Runs actors one at a time under `crashpoints`' hook, following `prefix` (the index of
    the option to take at each choice; 0 past its end)."""

    def __init__(
        self,
        interesting: Interest,
        prefix: list[int],
        chooser: Callable[[int, tuple[tuple[str, str], ...]], int] | None = None,
    ) -> None:
        self.interesting = interesting
        self.prefix = prefix
        # (choice index, options as (actor, point)) -> the option to take past the prefix: a
        # seeded random walk (tests/simworld.py) instead of the depth-first default, 0.
        self.chooser = chooser
        self.trace = Trace()
        self._cv = threading.Condition()
        self._actors: dict[threading.Thread, Actor] = {}
        self._order: list[Actor] = []
        self._free = False  # after an error: every actor runs on unchecked, to its end

    # -- actors --------------------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], object]) -> None:
        """An actor that runs `body`, starting at the point START."""
        actor = Actor(name)

        def run() -> None:
            self._hook(START, None)
            body()

        thread = threading.Thread(target=self._body(actor, run), name=f"actor-{name}", daemon=True)
        actor.thread = thread
        with self._cv:
            self._actors[thread] = actor
            self._order.append(actor)
        Scheduler._original_start(thread)

    def _body(self, actor: Actor, run: Callable[[], object]) -> Callable[[], None]:
        def body() -> None:
            try:
                run()
            except BaseException as exc:  # recorded: the scenario's checks report it  # noqa: BLE001
                actor.error = exc
                self.trace.errors[actor.name] = exc
            finally:
                with self._cv:
                    actor.state = "done"
                    self._cv.notify_all()

        return body

    _original_start = threading.Thread.start

    def _start_thread(self, thread: threading.Thread) -> None:
        """Thread.start while installed: a thread an actor starts becomes an actor."""
        parent = self._actors.get(threading.current_thread())
        if parent is None:
            Scheduler._original_start(thread)
            return
        parent.children += 1
        child = Actor(f"{parent.name}.{parent.children}", thread=thread, state="starting")
        child.point = "(started)"
        run = thread.run
        thread.run = self._body(child, run)  # type: ignore[method-assign]
        with self._cv:
            self._actors[thread] = child
            self._order.append(child)
        Scheduler._original_start(thread)
        # The child runs alone to its first point before the parent goes on: were both to run
        # at once, which reached its point first (and what the other saw of it: a byte in an
        # event loop's self-pipe, say) would be a race, and the choices after it would differ
        # from run to run.
        with self._cv:
            self._cv.wait_for(lambda: self._free or child.state in ("stopped", "done"), STUCK_S)

    def current(self) -> str | None:
        """The name of the actor whose thread calls this (None outside any actor)."""
        actor = self._actors.get(threading.current_thread())
        return actor.name if actor is not None else None

    # -- the hook --------------------------------------------------------------------------------
    def _hook(self, point: str, ready: Ready | None) -> None:
        actor = self._actors.get(threading.current_thread())
        if actor is None:
            return
        with self._cv:
            if self._free:
                return
            actor.state, actor.point, actor.ready, actor.turn = "stopped", point, ready, False
            self._cv.notify_all()
            while not actor.turn and not self._free:
                self._cv.wait()
            actor.state = "running"
            self.trace.passed.append((actor.name, point))

    # -- the schedule ------------------------------------------------------------------------------
    def _quiet(self) -> None:
        """Wait until no actor runs: each has stopped at a point or ended."""
        deadline = STUCK_S
        while any(a.state in ("starting", "running") for a in self._order):
            if not self._cv.wait(timeout=deadline):
                busy = [a for a in self._order if a.state in ("starting", "running")]
                raise HarnessError(
                    "actor(s) neither reached a point nor ended in "
                    f"{STUCK_S} s: {', '.join(a.name for a in busy)}\n" + _stacks(busy)
                )

    def _options(self) -> list[Actor]:
        return [a for a in self._order if a.state == "stopped" and (a.ready is None or a.ready())]

    def _interesting(self, actor: Actor) -> bool:
        points = self.interesting.get(actor.name, self.interesting.get("*", frozenset()))
        return actor.point in points or actor.point == START

    def drive(self) -> None:
        """Run the actors to their ends, one at a time, choosing as the prefix says."""
        last: Actor | None = None
        with self._cv:
            while True:
                self._quiet()
                options = self._options()
                if not options:
                    waiting = [a for a in self._order if a.state == "stopped"]
                    if any(not a.point.endswith(".idle") for a in waiting):
                        raise HarnessError(
                            "deadlock: every actor left waits: "
                            + ", ".join(f"{a.name}@{a.point}" for a in waiting)
                        )
                    return
                if (
                    last is not None
                    and last in options
                    and last.ready is None
                    and not self._interesting(last)
                ):
                    chosen = last
                else:
                    index = len(self.trace.steps)
                    described = tuple((a.name, a.point) for a in options)
                    if index < len(self.prefix):
                        pick = self.prefix[index]
                    elif self.chooser is not None:
                        pick = self.chooser(index, described)
                    else:
                        pick = 0
                    if pick >= len(options):
                        raise HarnessError(
                            f"nondeterminism at choice {index}: option {pick} was there before, "
                            f"now only {described}"
                        )
                    self.trace.steps.append(Step(described, pick))
                    chosen = options[pick]
                chosen.turn, chosen.state = True, "running"
                last = chosen
                self._cv.notify_all()

    def release(self) -> None:
        """Let every actor run on unchecked to its end (after an error)."""
        with self._cv:
            self._free = True
            self._cv.notify_all()
        for actor in list(self._order):
            if actor.point.endswith(".idle"):
                continue  # a worker thread with nothing to do: it stays, as in a process
            if actor.thread is not None and actor.thread is not threading.current_thread():
                actor.thread.join(timeout=STUCK_S)

    @contextmanager
    def installed(self) -> Iterator[Scheduler]:
        crashpoints.install_hook(self._hook)
        scheduler = self

        def start(thread: threading.Thread) -> None:
            scheduler._start_thread(thread)

        threading.Thread.start = start  # type: ignore[method-assign]
        try:
            yield self
        finally:
            threading.Thread.start = Scheduler._original_start  # type: ignore[method-assign]
            crashpoints.install_hook(None)


def _stacks(actors: list[Actor]) -> str:
    frames = sys._current_frames()  # the only way to see where another thread is
    out = []
    for actor in actors:
        ident = actor.thread.ident if actor.thread is not None else None
        frame = frames.get(ident) if ident is not None else None
        if frame is not None:
            out.append(f"--- {actor.name}\n" + "".join(traceback.format_stack(frame)[-8:]))
    return "\n".join(out)


# -- the driver ----------------------------------------------------------------------------------
@attrs.define
class Failure:
    schedule: str
    problems: list[str]


@attrs.define
class Exploration:
    runs: int = 0
    choices: int = 0  # choice points met over all runs
    longest: int = 0  # the most choices one run made
    failures: list[Failure] = attrs.field(factory=list)

    def summary(self) -> str:
        return (
            f"{self.runs} schedules, {self.choices} choice points (at most {self.longest} in "
            f"one), {len(self.failures)} failing"
        )


# A scenario: given a fresh scheduler, set the world up, spawn the actors, and return the
# check to run once they have all ended (a list of problems; empty if all is well).
Scenario = Callable[[Scheduler], Callable[[Trace], list[str]]]


def explore(
    scenario: Scenario,
    interesting: Interest,
    *,
    limit: int = 20_000,
    stop_at_first: bool = False,
    stop_when: Callable[[Failure], bool] | None = None,
) -> Exploration:
    """Run `scenario` once per order of its interesting points, depth first; every run's
    check must pass. `limit`: refuse to go on past this many runs (the scenario is too big
    for "every order"). `stop_at_first` / `stop_when`: stop at the first failure (that
    `stop_when` accepts), as a self-test needs only one."""
    found = Exploration()
    prefix: list[int] = []
    while True:
        scheduler = Scheduler(interesting, prefix)
        with scheduler.installed():
            check = scenario(scheduler)
            try:
                scheduler.drive()
            finally:
                scheduler.release()
        trace = scheduler.trace
        found.runs += 1
        found.choices += len(trace.steps)
        found.longest = max(found.longest, len(trace.steps))
        problems = check(trace)
        if problems:
            failure = Failure(trace.schedule(), problems)
            found.failures.append(failure)
            if stop_at_first or (stop_when is not None and stop_when(failure)):
                return found
        steps = trace.steps
        while steps and steps[-1].chosen + 1 >= len(steps[-1].options):
            steps.pop()
        if not steps:
            return found
        prefix = [step.chosen for step in steps[:-1]] + [steps[-1].chosen + 1]
        if found.runs >= limit:
            raise HarnessError(f"over {limit} schedules: make the scenario smaller")


def describe(error: BaseException | None) -> str:
    return "" if error is None else f"{type(error).__name__}: {error}"


def unexpected(trace: Trace, expected: tuple[type[BaseException], ...] = ()) -> list[str]:
    """A problem for each actor that ended with an exception the scenario does not expect."""
    return [
        f"actor {name} raised {describe(exc)}"
        for name, exc in trace.errors.items()
        if not isinstance(exc, expected)
    ]


def any_of(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(values.items()))

"""The two-process races: one exclusive create or link() winner each round, no gap in rename."""

from __future__ import annotations

import json
import os
import time

from castore.doctor import settings
from castore.doctor.helpers import errno_answer, expect_line, read_line, send, spawn, stop
from castore.doctor.primitives import Context, describe, ms, read_bytes, write_new
from castore.doctor.report import Verdict

_RACER = r"""
import os, sys
directory, me, op = sys.argv[1], sys.argv[2], sys.argv[3]
flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
out = sys.stdout.buffer

def write_new(path, data):
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)

for line in sys.stdin.buffer:
    words = line.split()
    if len(words) != 2:
        break
    verb, name = words[0].decode(), words[1].decode()
    target = os.path.join(directory, name)
    temp = os.path.join(directory, f"tmp-{me}-{name}")
    content = f"{me}:{name}".encode()
    try:
        if verb == "prep":
            if op == "link":
                write_new(temp, content)
            answer = b"ready"
        elif op == "link":
            try:
                os.link(temp, target)
            finally:
                os.unlink(temp)
            answer = b"won"
        else:
            write_new(target, content)
            answer = b"won"
    except FileExistsError:
        answer = b"lost"
    except OSError as exc:
        answer = b"error %d" % (exc.errno or 0)
    out.write(answer + b"\n")
    out.flush()
"""

_RACE_OPS = {"create": "O_CREAT|O_EXCL", "link": "link()"}
# What turns off the client caches that serve a file another client just wrote as empty
# (GlusterFS with its defaults: md-cache, quick-read, open-behind, write-behind, and FUSE's
# attribute and entry caches of 1 s each).
STALE_READ_FIX = (
    "on GlusterFS set performance.stat-prefetch, performance.quick-read, "
    "performance.open-behind and performance.write-behind off, and mount with "
    "--attribute-timeout=0 --entry-timeout=0 --negative-timeout=0"
)


def _race(ctx: Context, op: str) -> tuple[Verdict, str]:
    """RACE_ROUNDS rounds of two processes, one per side, making the same new name at once."""
    a, what, rounds = ctx.a, _RACE_OPS[op], settings.RACE_ROUNDS
    other, other_label = (ctx.b, "peer") if ctx.b is not None else (a, "path-2")
    labels = ["path", other_label]
    racers = [spawn(_RACER, a, "path", op), spawn(_RACER, other, other_label, op)]
    wins = [0, 0]
    loser_errors: dict[str, int] = {}
    stale_delays: list[float] = []
    problems: list[str] = []
    try:
        for rnd in range(rounds):
            name = f"race-{rnd}"
            for verb in ("prep", "go"):  # prep writes the temp files; go makes the name
                for proc in racers:
                    send(proc, f"{verb} {name}")
                answers = [read_line(proc).decode() for proc in racers]
                if verb == "prep" and answers != ["ready", "ready"]:
                    problems.append(f"round {rnd}: preparing failed: {_answers(answers)}")
                    break
            else:
                problem = _judge_round(
                    a,
                    name,
                    labels,
                    answers,
                    wins=wins,
                    loser_errors=loser_errors,
                    stale_delays=stale_delays,
                )
                if problem:
                    problems.append(f"round {rnd}: {problem}")
    finally:
        for proc in racers:
            stop(proc)
    who = "path and peer" if ctx.b is not None else "two processes through path"
    if problems:
        shown = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
        return "fail", (
            f"{len(problems)} of {rounds} {what} races between {who} did not have exactly "
            f"one winner: {shown}"
        )
    detail = (
        f"{rounds}/{rounds} {what} races between {who} had exactly one winner, whose "
        f"content is intact (first racer won {wins[0]}, second {wins[1]})"
    )
    if ctx.peer_given and ctx.b is None:
        detail += ctx.peer_note
    warnings = _warnings(loser_errors, stale_delays, rounds)
    if not warnings:
        return "ok", detail + "; every loser got EEXIST"
    return "warn", f"{detail}; but " + "; and ".join(warnings)


def _warnings(loser_errors: dict[str, int], stale_delays: list[float], rounds: int) -> list[str]:
    """What held only with help: losers that did not get EEXIST, winners read stale first."""
    warnings = []
    if any(k != "EEXIST" for k in loser_errors):
        seen = ", ".join(f"{k} {v}x" for k, v in sorted(loser_errors.items()))
        warnings.append(
            f"losers did not always get EEXIST ({seen}): the name was still made exactly "
            "once, so castore must treat any failed exclusive create or link as 'maybe lost' "
            "and lstat the name before calling it an error (sshfs reports SFTP's generic "
            "failure, which is what the server sends for EEXIST, as EPERM)"
        )
    if stale_delays:
        warnings.append(
            f"{len(stale_delays)} of {rounds} winners' files first read empty or short through "
            f"path, and whole after re-reading for up to {ms(max(stale_delays))}: this client "
            "serves stale reads of a file another process just wrote (castore never reads a "
            "name written in place, so it holds; a tool that does would not); to turn these "
            f"caches off, {STALE_READ_FIX}"
        )
    return warnings


def _answers(answers: list[str]) -> str:
    return ", ".join(errno_answer(x) for x in answers)


def _judge_round(
    directory: str,
    name: str,
    labels: list[str],
    answers: list[str],
    *,
    wins: list[int],
    loser_errors: dict[str, int],
    stale_delays: list[float],
) -> str | None:
    """What was wrong with one round, or None; counts wins and the losers' errors, and
    records how long the winner's file took to read whole when it first read short."""
    winners = [i for i, ans in enumerate(answers) if ans == "won"]
    if len(winners) != 1:
        return f"{len(winners)} winners ({_answers(answers)})"
    winner = winners[0]
    expected = f"{labels[winner]}:{name}".encode()
    try:
        content, delay = _read_winner(os.path.join(directory, name), expected)
    except OSError as exc:
        return f"the winner's file cannot be read: {describe(exc)}"
    if content != expected:
        return f"the file holds {content[:40]!r}, not the winner's content"
    if delay is not None:
        stale_delays.append(delay)
    wins[winner] += 1
    loser = answers[1 - winner]
    key = "EEXIST" if loser == "lost" else errno_answer(loser).split()[0]
    loser_errors[key] = loser_errors.get(key, 0) + 1
    return None


def _read_winner(path: str, expected: bytes) -> tuple[bytes, float | None]:
    """The content of the winner's file, read again while it reads as a strict prefix of
    `expected` (empty, most often), for at most settings.STALE_READ_TIMEOUT: a client may
    serve its cached empty view of a file the other client has since written (GlusterFS'
    default caches, for up to 1 s). The seconds until it read whole, None if at once."""
    content = read_bytes(path)
    if content == expected or not expected.startswith(content):
        return content, None
    started = time.monotonic()
    deadline = started + settings.STALE_READ_TIMEOUT
    while expected.startswith(content) and content != expected and time.monotonic() < deadline:
        time.sleep(0.01)  # a poll interval while the client's cache expires
        content = read_bytes(path)
    return content, time.monotonic() - started


def check_create_race(ctx: Context) -> tuple[Verdict, str]:
    return _race(ctx, "create")


def check_link_race(ctx: Context) -> tuple[Verdict, str]:
    return _race(ctx, "link")


_RENAME_READER = r"""
import json, os, sys, time
path, duration, size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
reads = missing = torn = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
end = time.monotonic() + duration
while time.monotonic() < end:
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        missing += 1
        continue
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
    reads += 1
    if len(data) != size or data != data[:16] * (size // 16):
        torn += 1
sys.stdout.write(json.dumps({"reads": reads, "missing": missing, "torn": torn}) + "\n")
"""


def check_rename_no_gap(ctx: Context) -> tuple[Verdict, str]:
    a = ctx.a
    reader_dir = ctx.b if ctx.b is not None else a
    target = os.path.join(a, "gap-target")
    size = 16 * 64

    def content(n: int) -> bytes:
        return f"gen-{n:011d}\n".encode() * 64

    write_new(target, content(0))
    proc = spawn(_RENAME_READER, os.path.join(reader_dir, "gap-target"), "0.4", str(size))
    renames = 0
    try:
        expect_line(proc, b"ready")
        while proc.poll() is None:
            renames += 1
            tmp = os.path.join(a, f"gap-tmp-{renames}")
            write_new(tmp, content(renames))
            os.replace(tmp, target)
        result = json.loads(read_line(proc))
    finally:
        stop(proc)
    side = "peer" if ctx.b is not None else "path"
    summary = (
        f"{result['reads']} reads through {side} during {renames} renames through path: "
        f"{result['missing']} found the name missing, {result['torn']} read torn content"
    )
    if result["torn"]:
        return "fail", summary
    if result["missing"]:
        return "warn", summary + "; a reader can briefly miss a file being replaced"
    if result["reads"] == 0:
        return "warn", summary + "; the reader never got a read in"
    return "ok", summary

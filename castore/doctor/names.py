"""Probes of names: O_CREAT|O_EXCL and link() refuse a taken name, rename replaces, unlink frees."""

from __future__ import annotations

import os

from castore.doctor import settings
from castore.doctor.primitives import (
    CheckFailed,
    Context,
    describe,
    expect_eexist,
    ms,
    read_bytes,
    reads,
    wait_for,
    write_new,
)
from castore.doctor.report import Verdict


def check_exclusive_create(ctx: Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    first = os.path.join(a, "excl-1")
    write_new(first, b"first")
    expect_eexist(lambda: write_new(first, b"second"), "O_CREAT|O_EXCL on an existing name")
    detail = "O_CREAT|O_EXCL on an existing name fails with EEXIST"
    if b is not None:
        expect_eexist(
            lambda: write_new(os.path.join(b, "excl-1"), b"peer"),
            "O_CREAT|O_EXCL through peer on a name created through path",
        )
        write_new(os.path.join(b, "excl-2"), b"from peer")
        expect_eexist(
            lambda: write_new(os.path.join(a, "excl-2"), b"path"),
            "O_CREAT|O_EXCL through path on a name created through peer",
        )
        detail += ", also across path and peer in both directions"
    elif ctx.peer_given:
        detail += ctx.peer_note
    if read_bytes(first) != b"first":
        raise CheckFailed("the losing O_CREAT|O_EXCL changed the winner's content")
    return "ok", detail


def check_link_exclusive(ctx: Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    src1, dst = os.path.join(a, "link-src-1"), os.path.join(a, "link-dst")
    write_new(src1, b"one")
    try:
        os.link(src1, dst)
    except OSError as exc:
        raise CheckFailed(
            f"link() does not work here: {describe(exc)}; castore commits by hard-linking "
            "a finished temp file, so this filesystem cannot hold a store"
        ) from exc
    src2 = os.path.join(a, "link-src-2")
    write_new(src2, b"two")
    expect_eexist(lambda: os.link(src2, dst), "link() onto an existing name")
    detail = "link() works and link() onto an existing name fails with EEXIST"
    if b is not None:
        src3 = os.path.join(b, "link-src-3")
        write_new(src3, b"three")
        expect_eexist(
            lambda: os.link(src3, os.path.join(b, "link-dst")),
            "link() through peer onto a name linked through path",
        )
        os.link(src3, os.path.join(b, "link-dst-2"))
        expect_eexist(
            lambda: os.link(src2, os.path.join(a, "link-dst-2")),
            "link() through path onto a name linked through peer",
        )
        if read_bytes(os.path.join(a, "link-dst-2")) != b"three":
            raise CheckFailed("the name linked through peer does not read back through path")
        detail += ", also across path and peer in both directions"
    elif ctx.peer_given:
        detail += ctx.peer_note
    if read_bytes(dst) != b"one":
        raise CheckFailed("the losing link() changed the winner's content")
    return "ok", detail


def check_rename_over(ctx: Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    target, tmp = os.path.join(a, "ren-target"), os.path.join(a, "ren-tmp-1")
    write_new(target, b"old", sync=True)
    write_new(tmp, b"new-1", sync=True)
    os.replace(tmp, target)
    if read_bytes(target) != b"new-1":
        raise CheckFailed("after os.replace the target does not hold the new content")
    if os.path.lexists(tmp):
        raise CheckFailed("after os.replace the source name still exists")
    detail = "os.replace over an existing file leaves exactly the new content"
    if b is not None:
        took = wait_for(reads(os.path.join(b, "ren-target"), b"new-1"))
        if took is None:
            raise CheckFailed(
                f"peer still does not read the new content {settings.VISIBILITY_TIMEOUT:g}s after "
                "the rename through path"
            )
        tmp2 = os.path.join(b, "ren-tmp-2")
        write_new(tmp2, b"new-2", sync=True)
        os.replace(tmp2, os.path.join(b, "ren-target"))
        took2 = wait_for(reads(target, b"new-2"))
        if took2 is None:
            raise CheckFailed(
                f"path still does not read the new content {settings.VISIBILITY_TIMEOUT:g}s after "
                "the rename through peer"
            )
        detail += (
            f"; the other side reads it (path->peer after {ms(took)}, peer->path after {ms(took2)})"
        )
    elif ctx.peer_given:
        detail += ctx.peer_note
    return "ok", detail


def check_unlink_visible(ctx: Context) -> tuple[Verdict, str]:
    a = ctx.a
    other, label = (ctx.b, "peer") if ctx.b is not None else (a, "path")
    name = os.path.join(a, "unlink-me")
    write_new(name, b"doomed")
    os.unlink(name)
    again = os.path.join(other, "unlink-me")

    def recreate() -> bool:
        try:
            write_new(again, b"again")
        except FileExistsError:
            return False
        return True

    took = wait_for(recreate)
    if took is None:
        return "warn", (
            f"{settings.VISIBILITY_TIMEOUT:g}s after an unlink through path, O_CREAT|O_EXCL "
            f"through {label} still says EEXIST"
        )
    return "ok", (
        f"after an unlink through path, O_CREAT|O_EXCL through {label} can reuse the name "
        f"(after {ms(took)})"
    )

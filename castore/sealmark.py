"""SHIM (coordinator's module lands on main)."""

from __future__ import annotations

import os

import attrs

from castore import codec, fsio


@attrs.frozen
class Mark:
    pack: str | None
    through: int


def read(task_dir: str) -> Mark | None:
    try:
        data = fsio.read_regular(os.path.join(task_dir, "sealed"))
    except FileNotFoundError:
        return None
    value = codec.decode_value(data.rstrip(b"\n"))
    return Mark(value["pack"], value["through"])


def write(task_dir: str, mark: Mark) -> None:
    path = os.path.join(task_dir, "sealed")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(codec.encode_value({"pack": mark.pack, "through": mark.through}) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsio.fsync_dir(task_dir)

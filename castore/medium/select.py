"""Which medium holds a store: a directory path (the POSIX medium), or an s3:// URL (the S3
medium, castore[s3], loaded only when asked for)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from castore.medium.base import Medium
from castore.medium.posix import PosixMedium

S3_SCHEME = "s3://"


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for a location that names an object store rather than a directory."""
    return isinstance(location, str) and location.startswith(S3_SCHEME)


def open_medium(location: str | os.PathLike[str] | Medium, **options: Any) -> Medium:
    """The medium of the store at `location`: a Medium as it is, an s3://bucket/prefix URL
    (with `options` for its client: endpoint_url, region_name, profile_name, ...), else a
    directory path (made absolute; no option applies)."""
    if isinstance(location, Medium):
        return location
    if is_url(location):
        # The optional extra castore[s3] (boto3), loaded only for an s3:// store.
        s3 = importlib.import_module("castore.medium.s3")
        medium: Medium = s3.S3Medium.from_url(str(location), **options)
        return medium
    if options:
        raise TypeError(f"options {sorted(options)} apply to an s3:// store only")
    return PosixMedium(os.path.abspath(os.fspath(location)))

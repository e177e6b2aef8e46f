"""A worker's S3 client starts without what it does not use (issue 42, item 8): botocore alone
(boto3's session, resources and transfer manager are never imported), the S3 model read once
per process however many clients it makes, and no listing of every service the SDK knows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.loaders
import pytest

from castore.medium import s3client

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_loaders() -> Iterator[None]:
    s3client._client.cache_clear()
    s3client._loader.cache_clear()
    yield
    s3client._client.cache_clear()
    s3client._loader.cache_clear()


def test_opening_an_s3_store_imports_no_boto3() -> None:
    """In a new process: the client is made, and boto3 and s3transfer were never imported."""
    code = (
        "import sys, json; from castore.medium.s3client import Client; "
        "Client('b', endpoint_url='http://127.0.0.1:9', region_name='us-east-1', "
        "aws_access_key_id='a', aws_secret_access_key='b'); "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = set(json.loads(done.stdout))
    assert "botocore" in loaded
    assert not loaded & {"boto3", "s3transfer"}


def test_clients_of_two_configurations_read_the_s3_model_once(
    fresh_loaders: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients (two endpoints, two keys): one loader, and each data file parsed once; the
    SDK's list of its services is never made."""
    loaded: list[str] = []
    original = s3client._JSONFiles.load_file

    def load_file(self: Any, file_path: str) -> Any:
        loaded.append(Path(file_path).name)
        return original(self, file_path)

    def listed(self: Any, type_name: str) -> list[str]:
        raise AssertionError(f"every service was listed for {type_name}")

    monkeypatch.setattr(s3client._JSONFiles, "load_file", load_file)
    monkeypatch.setattr(botocore.loaders.Loader, "list_available_services", listed)
    first = s3client.Client("b", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    made_first = list(loaded)
    second = s3client.Client(
        "c",
        endpoint_url="http://127.0.0.1:10",
        region_name="us-east-1",
        aws_access_key_id="other",
        aws_secret_access_key="other",  # noqa: S106 - a test key
    )
    assert first.endpoint != second.endpoint
    assert "service-2" in made_first
    assert "endpoint-rule-set-1" in made_first
    assert len(loaded) == len(set(loaded)), loaded  # nothing parsed twice


def test_an_unknown_service_is_botocores_own_error(fresh_loaders: None) -> None:
    """The loader's shortcut does not hide a service that does not exist."""
    loader = s3client._loader(None)
    with pytest.raises(botocore.exceptions.UnknownServiceError):
        loader.load_service_model("no-such-service", "service-2")
    assert loader.load_service_model("s3", "service-2")["metadata"]["endpointPrefix"] == "s3"

"""The S3 API as castore's S3 medium calls it (the only importer of botocore, boto3's core,
from the optional extra castore[s3]): every request retried with backoff where retrying is
safe, and every failure said in castore's words.

Which failures are retried, and why that never duplicates or loses a commit: a timeout, a
reset connection, a 5xx and throttling (503 SlowDown, 429) say nothing about whether the
request took effect, and a retried request is a second request. So a request is retried only
where a second one is harmless in castore's protocol (docs/FORMAT.md §19.4): reads; an
exclusive create (`If-None-Match: *`), whose repeat after its first attempt committed answers
412, which the caller resolves by reading the key back (its own bytes: committed; other
bytes: it lost); an unconditional PUT or a copy of a key whose every writer writes the same
bytes (an object, the endpoint's record); and a DELETE that carries `If-Match`. A plain
DELETE is never retried: between a lost answer and its repeat a writer may have stored the
key again, and the repeat would remove that. Its failure is remembered (`unanswered`) and
`settle` waits until it can no longer land. botocore's own retries are off: these are the
only ones.
"""

from __future__ import annotations

import errno
import functools
import gzip
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.session

from castore.errors import BucketNotFoundError, StoreIOError
from castore.errors.storage import EndpointAnswer
from castore.format.fastdecode import decode_json

T = TypeVar("T")

ATTEMPTS = 8  # a request that failed this many times in a row is reported
# How long after it was sent a request that got no answer may still take effect at the
# endpoint (a request delayed in a proxy or a server's queue): past it, it never will. An
# assumption, as the clock-skew bound is (docs/FORMAT.md §19.4): three read timeouts.
LATE_BOUND_S = 60.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.05, 2.0
_RETRIED_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "ServiceUnavailable",
    "InternalError",
}
_CONNECTION_ERRORS = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
)


class Missing(Exception):
    """The key is not there: 404."""


class Unanswered(Exception):
    """A request that is not retried (a plain DELETE) got no answer: it may have taken
    effect, or may still (within LATE_BOUND_S)."""


class Exists(Exception):
    """An exclusive create found the key there already: 412 Precondition Failed.
    `after_retry`: an earlier attempt of this request failed without an answer, so it may be
    that attempt's own success the 412 reports (the caller reads the key back)."""

    def __init__(self, where: str, *, after_retry: bool) -> None:
        super().__init__(where)
        self.after_retry = after_retry


def status_of(error: botocore.exceptions.ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def code_of(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _retried(error: BaseException) -> bool:
    if isinstance(error, _CONNECTION_ERRORS):
        return True
    if isinstance(error, botocore.exceptions.ClientError):
        status = status_of(error)
        # 409 ConditionalRequestConflict (AWS): another conditional write of the key was in
        # flight; the repeat gets 200 or 412, which `Exists` resolves as after any retry.
        conflict = status == 409 and code_of(error) == "ConditionalRequestConflict"
        return status >= 500 or status == 429 or conflict or code_of(error) in _RETRIED_CODES
    return False


class Client:
    """One bucket's S3 API, for one prefix's keys (`where` names them for people)."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        profile_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 20.0,
        max_pool_connections: int = 64,
    ) -> None:
        self.bucket = bucket
        self._s3: Any = _client(
            endpoint_url=endpoint_url,
            region_name=region_name,
            profile_name=profile_name,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            environment=tuple(os.environ.get(name) for name in _ENVIRONMENT),
        )
        # How the endpoint was chosen, for the errors that name it (issue 42, item 2).
        self.endpoint_source = _endpoint_source(endpoint_url)
        self.requests = 0  # every request sent, retries included: the benchmark's count
        self.unanswered: float | None = None  # when the last unanswered DELETE was sent

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to, as boto3 chose it (an option, the environment, the
        AWS config files, or AWS's own for the region)."""
        return str(self._s3.meta.endpoint_url).rstrip("/")

    @property
    def identity(self) -> str:
        """The endpoint and bucket as the client resolved them: two URLs naming one bucket
        of one endpoint have one identity, and one bucket name on two endpoints two."""
        return f"{self.endpoint}/{self.bucket}"

    def call(self, where: str, operation: str, **params: Any) -> Any:
        """`operation` (a client method name) with `params`, retried where a second request
        is harmless (module docstring). Missing on 404 (BucketNotFoundError for the bucket), Exists
        on 412, Unanswered for a plain DELETE without an answer, StoreIOError naming `where`
        on anything else, or once ATTEMPTS tries failed."""
        method: Callable[..., Any] = getattr(self._s3, operation)
        attempts = 1 if operation == "delete_object" and "IfMatch" not in params else ATTEMPTS
        return self._retrying(
            where, operation, lambda: method(Bucket=self.bucket, **params), attempts
        )

    def settle(self) -> None:
        """Return once no unanswered DELETE of this client can still take effect."""
        if self.unanswered is not None:
            time.sleep(max(0.0, self.unanswered + LATE_BOUND_S - time.monotonic()))
            self.unanswered = None

    def _retrying(self, where: str, operation: str, request: Callable[[], T], attempts: int) -> T:
        pause = _BACKOFF_FIRST_S
        for attempt in range(1, attempts + 1):
            self.requests += 1
            try:
                return request()
            except botocore.exceptions.ClientError as exc:
                status = status_of(exc)
                if code_of(exc) == "NoSuchBucket":
                    url = where.split("/", 3)
                    store = "/".join(url[:3]) if len(url) >= 3 else where
                    raise BucketNotFoundError(store, self.bucket, self.endpoint) from exc
                if status == 404 or code_of(exc) in ("NoSuchKey", "NotFound"):
                    raise Missing(where) from exc
                if status == 412 or code_of(exc) == "PreconditionFailed":
                    raise Exists(where, after_retry=attempt > 1) from exc
                if not _retried(exc):
                    raise self._io_error(where, operation, exc) from exc
                if attempt == attempts:
                    raise self._gave_up(where, operation, exc, attempts) from exc
            except _CONNECTION_ERRORS as exc:
                if attempt == attempts:
                    raise self._gave_up(where, operation, exc, attempts) from exc
            # Full jitter: clients that failed together do not retry together.
            time.sleep(random.uniform(0, pause))  # noqa: S311 - backoff jitter, not a secret
            pause = min(pause * 2, _BACKOFF_MAX_S)
        raise AssertionError("not reached")

    def _gave_up(self, where: str, operation: str, exc: BaseException, attempts: int) -> Exception:
        if attempts == 1 and operation == "delete_object":
            self.unanswered = time.monotonic()
            return Unanswered(where)
        return self._io_error(where, operation, exc)

    def _io_error(self, where: str, operation: str, exc: BaseException) -> StoreIOError:
        if isinstance(exc, botocore.exceptions.ClientError) and status_of(exc) in (401, 403):
            advice = (
                f"check the access key and secret key for {self.endpoint} "
                "(aws_access_key_id= and aws_secret_access_key=, $AWS_ACCESS_KEY_ID and "
                "$AWS_SECRET_ACCESS_KEY, or the profile) and that they may use the bucket"
            )
        elif isinstance(exc, botocore.exceptions.ClientError):
            advice = f"the endpoint {self.endpoint} refused the request"
        else:
            advice = (
                f"check that {self.endpoint} is the endpoint you mean ({self.endpoint_source}) "
                "and that it answers; set it with endpoint_url= or $AWS_ENDPOINT_URL_S3 "
                "(docs/howto/object-storage.md)"
            )
        return _io_error(where, operation, exc, advice)

    def body(self, response: Any, where: str, limit: int) -> bytes:
        """The bytes of a GetObject answer, at most `limit` (OverflowError past it)."""
        length = int(response.get("ContentLength", 0))
        if length > limit:
            response["Body"].close()
            raise OverflowError(length)
        try:
            data: bytes = response["Body"].read()
        except _CONNECTION_ERRORS as exc:  # reset mid-body: the caller reads again
            raise self._io_error(where, "reading the body of", exc) from exc
        return data

    def chunks(self, response: Any, size: int) -> Iterator[bytes]:
        """The bytes of a GetObject answer, `size` at a time."""
        stream = response["Body"]
        while chunk := stream.read(size):
            yield chunk

    def pages(self, where: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every page of a ListObjectsV2 of `params` (each page's request retried)."""
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self.call(where, "list_objects_v2", **params, **extra)
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")


@functools.lru_cache(maxsize=32)
def _client(
    *,
    endpoint_url: str | None,
    region_name: str | None,
    profile_name: str | None,
    aws_access_key_id: str | None,
    aws_secret_access_key: str | None,
    aws_session_token: str | None,
    connect_timeout: float,
    read_timeout: float,
    max_pool_connections: int,
    environment: tuple[str | None, ...],
) -> Any:
    """One client per configuration in a process (a client is safe to share between threads),
    all made from one loader of the SDK's data files (`_loader`: the S3 model is read once
    per process). `environment`: the variables the SDK reads (an endpoint, keys, a region, a
    profile), so a changed one makes a new client.

    botocore's own session, not boto3's: boto3 adds its resources and transfer manager, which
    castore does not use, and which cost a worker's start about a third of the client's
    making again (tools/bench_s3_open.py)."""
    del environment
    session = botocore.session.Session(profile=profile_name)
    session.register_component("data_loader", _loader(session.get_config_variable("data_path")))
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},  # retried here, not there
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path"},
    )
    return session.create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_name,
        aws_access_key_id=aws_access_key_id,
        aws_secret_access_key=aws_secret_access_key,
        aws_session_token=aws_session_token,
        config=config,
    )


class _JSONFiles(botocore.loaders.JSONFileLoader):  # type: ignore[misc]
    """The SDK's data files (`name.json` or `name.json.gz`), parsed in C."""

    def load_file(self, file_path: str) -> Any:
        for extension, opener in ((".json", open), (".json.gz", gzip.open)):
            try:
                with opener(file_path + extension, "rb") as stream:
                    data = stream.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
            return decode_json(data)
        return None


class _Loader(botocore.loaders.Loader):  # type: ignore[misc]
    """botocore's loader, which knows a service by its own directory: botocore's lists every
    service's directories first (about 450, a quarter of a client's making) only to check
    that the one asked for is among them. An unknown service is left to botocore's own
    check, and its error."""

    @botocore.loaders.instance_cache  # type: ignore[untyped-decorator]
    def load_service_model(
        self, service_name: str, type_name: str, api_version: str | None = None
    ) -> Any:
        try:
            version = api_version or self.determine_latest_version(service_name, type_name)
            model = self.load_data(os.path.join(service_name, version, type_name))
            extras = self._find_extras(service_name, type_name, version)
            self._extras_processor.process(model, extras)
        except (botocore.exceptions.DataNotFoundError, AttributeError):
            # Not found (botocore words it) or a botocore whose insides differ: its own way.
            return super().load_service_model(service_name, type_name, api_version)
        return model


@functools.lru_cache(maxsize=4)
def _loader(data_path: str | None) -> Any:
    """One loader per process for each AWS_DATA_PATH: what it reads it keeps, so every client
    after the first skips the S3 model, the endpoint rules and the partitions."""
    paths = [os.path.expanduser(p) for p in (data_path or "").split(os.pathsep) if p]
    return _Loader(extra_search_paths=paths, file_loader=_JSONFiles())


_ENVIRONMENT = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
# A forked child must not share its parent's connections (two processes reading one socket
# take each other's answers): it makes clients of its own.
os.register_at_fork(after_in_child=_client.cache_clear)


def _endpoint_source(endpoint_url: str | None) -> str:
    """How boto3 will choose the endpoint, said for a person."""
    if endpoint_url:
        return "the endpoint_url option"
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return f"${name}"
    return (
        "no endpoint was set, so boto3 chose AWS's own for the region (or the AWS config "
        "file's endpoint_url)"
    )


def _io_error(where: str, operation: str, exc: BaseException, advice: str) -> StoreIOError:
    reason = exc.__class__.__name__
    if isinstance(exc, botocore.exceptions.ClientError):
        reason = (
            f"{status_of(exc)} {code_of(exc)}: {exc.response.get('Error', {}).get('Message', '')}"
        )
    if isinstance(exc, botocore.exceptions.ClientError):
        code = errno.EACCES if status_of(exc) in (401, 403) else errno.EAGAIN
        answer = f"the S3 endpoint answered {reason}"
    else:
        code, answer = errno.ETIMEDOUT, f"no answer from the S3 endpoint ({reason})"
    return StoreIOError(
        where,
        f"{operation} (S3)",
        EndpointAnswer(code, answer),
        "nothing castore acknowledged is lost",
        advice,
    )

"""What an S3 endpoint that loses answers, resets connections, answers slowly or asks for
less load does to castore's commits (issue 25 item 3), with a fault-injecting proxy between
castore and each engine (tests/s3proxy.py): a commit is made exactly once or not at all,
never twice, never lost once acknowledged, and an effect is sent once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3proxy import Fault, FaultProxy
from s3servers import S3Endpoint

import castore
from castore.errors import CommitUncertainError, DurabilityError
from castore.medium import s3client

TASK = "t"
PLAN = castore.Plan.build("faults", "a", castore.effect("pay", "a"), "b")
SLOT_1 = r"/chain/0000000000000001$"


@pytest.fixture
def proxy(s3: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(s3.url) as running:
        yield running


def through(s3: S3Endpoint, proxy: FaultProxy, url: str, **extra: float) -> castore.Store:
    """The store at `url`, its every request going through `proxy`."""
    return castore.Store.open(url, **s3.options(proxy.url), **extra)


def started(s3: S3Endpoint) -> str:
    url = s3.new_bucket()
    castore.Store.init(url).start(TASK, PLAN, lock_timeout=None).close()
    return url


def puts_of(proxy: FaultProxy, pattern: str) -> list[str]:
    return [entry.done for entry in proxy.log if entry.method == "PUT" and pattern in entry.path]


@pytest.mark.parametrize("fault", ["drop_response", "reset_response"])
def test_a_commit_whose_answer_is_lost_is_made_once_and_acknowledged(
    s3: S3Endpoint, proxy: FaultProxy, fault: str
) -> None:
    """The server commits the slot, the client hears nothing (or half an answer, which the
    client may take for the whole: then there is no retry): the retry gets 412 for its own
    write, reads the slot back, finds its bytes, and acknowledges the commit, which is in
    the chain once."""
    url = started(s3)
    store = through(s3, proxy, url)
    proxy.arm(Fault(fault, path=SLOT_1))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        made = run.commit_step("a", 1)
    assert puts_of(proxy, "/chain/0000000000000001") in ([fault, "relayed"], [fault])
    history = castore.Store.open(url).history(TASK)
    assert [1, 0] == [snapshot.seq for _, snapshot in history]
    assert made == history[0][0]


def test_a_request_reset_before_the_server_had_it_is_sent_again(
    s3: S3Endpoint, proxy: FaultProxy
) -> None:
    """The connection breaks before the server has the whole request: nothing is committed
    by it, the retry commits, once."""
    url = started(s3)
    store = through(s3, proxy, url)
    proxy.arm(Fault("reset_request", path=SLOT_1, times=2))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        run.commit_step("a", 1)
    assert ["reset_request", "reset_request", "relayed"] == puts_of(
        proxy, "/chain/0000000000000001"
    )
    assert 2 == castore.Store.open(url).verify(TASK).length


@pytest.mark.parametrize("status", [503, 500, 409])
def test_throttling_and_server_errors_are_retried_with_backoff(
    s3: S3Endpoint, proxy: FaultProxy, status: int
) -> None:
    """503 SlowDown, 500 and 409 ConditionalRequestConflict (AWS: a conditional write of the
    key in flight) are retried (with backoff) until the commit is made, once."""
    url = started(s3)
    store = through(s3, proxy, url)
    proxy.arm(Fault("status", path=SLOT_1, times=3, status=status))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        run.commit_step("a", 1)
    assert ["status"] * 3 + ["relayed"] == puts_of(proxy, "/chain/0000000000000001")
    assert 2 == castore.Store.open(url).verify(TASK).length


def test_a_slow_answer_times_out_and_the_retry_commits_once(
    s3: S3Endpoint, proxy: FaultProxy
) -> None:
    """The first attempt waits longer than the read timeout (it reaches the server later,
    and finds the slot taken): the retry commits; the chain holds the commit once."""
    url = started(s3)
    store = through(s3, proxy, url, read_timeout=0.5)
    proxy.arm(Fault("delay", path=SLOT_1, seconds=1.5))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        run.commit_step("a", 1)
    history = castore.Store.open(url).history(TASK)
    assert [1, 0] == [snapshot.seq for _, snapshot in history]


def test_an_effect_whose_submitted_answer_is_lost_is_sent_once(
    s3: S3Endpoint, proxy: FaultProxy
) -> None:
    """The SUBMITTED commit's answer is lost (the server committed it): the run learns it
    committed, sends once, confirms; the service saw one request."""
    url = started(s3)
    store = through(s3, proxy, url)
    sent: list[str] = []
    service = castore.Service(
        "pay", reconcile=lambda key: castore.found(sent[0]) if sent else castore.NOT_FOUND
    )
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        run.commit_step("a", 1)
        proxy.arm(Fault("drop_response", path=r"/chain/0000000000000002$"))
        receipt = run.perform("pay", service, lambda key: sent.append(f"r-{key}") or sent[-1])
    assert [receipt] == sent
    assert "CONFIRMED" not in [r.state for r in castore.Store.open(url).status(TASK).effects]


def test_a_commit_the_store_never_answers_is_not_made_and_says_so(
    s3: S3Endpoint, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every attempt fails (500, more times than the retries): the slot is read back, it is
    absent, and the commit fails with DurabilityError (nothing made; the run may try again)."""
    monkeypatch.setattr(s3client, "ATTEMPTS", 3)
    url = started(s3)
    store = through(s3, proxy, url)
    proxy.arm(Fault("status", path=SLOT_1, times=3, status=500))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        with pytest.raises(DurabilityError) as failed:
            run.commit_step("a", 1)
        assert not isinstance(failed.value, CommitUncertainError)
        run.commit_step("a", 1)  # the fault is over: the run goes on
    assert 2 == castore.Store.open(url).verify(TASK).length


def test_a_commit_whose_outcome_cannot_be_read_back_stops_the_run(
    s3: S3Endpoint, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PUTs fail and so does the read that would tell: CommitUncertainError, the run is
    stale, and a resume decides from what the store holds."""
    monkeypatch.setattr(s3client, "ATTEMPTS", 2)
    url = started(s3)
    store = through(s3, proxy, url)
    proxy.arm(Fault("drop_response", path=SLOT_1, times=2))
    proxy.arm(Fault("status", method="GET", path=SLOT_1, times=10, status=500))
    proxy.arm(Fault("status", method="HEAD", path=SLOT_1, times=10, status=500))
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        with pytest.raises(CommitUncertainError, match="unknown"):
            run.commit_step("a", 1)
        assert run.stale
        run.close(finish=False)
    chain = castore.Store.open(url).verify(TASK)
    assert 2 == chain.length  # the first attempt reached the server: the commit stands

"""The retry policy of ranged S3 reads (zephon_dask.data.remote), without a server: which failures
are retried, how many tries a range gets, and that the waits stay bounded and never hit a 412."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_dask.data import remote
from zephon_dask.errors import DataChangedError

pytest.importorskip("botocore")
from botocore.exceptions import ClientError  # noqa: E402


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


FAULTS = {
    "slowdown": lambda: _client_error(503, "SlowDown"),
    "internal": lambda: _client_error(500, "InternalError"),
    "reset": lambda: ConnectionResetError(104, "Connection reset by peer"),
    "short": lambda: remote.ShortBody("3 of 8 bytes"),
    "timeout": lambda: TimeoutError("read timed out"),
    "missing": lambda: _client_error(404, "NoSuchKey"),
    "denied": lambda: _client_error(403, "AccessDenied"),
    "changed": lambda: _client_error(412, "PreconditionFailed"),
}
TRANSIENT = {"slowdown", "internal", "reset", "short", "timeout"}


def _run(faults: list[str], attempts: int, monkeypatch) -> tuple[object, int, list[float]]:
    """``retried`` over a call failing with ``faults`` in turn, then answering; (result or error,
    calls made, waits asked)."""
    waits: list[float] = []
    calls = 0

    async def sleep(s: float) -> None:
        waits.append(s)

    async def call() -> bytes:
        nonlocal calls
        calls += 1
        if calls <= len(faults):
            raise FAULTS[faults[calls - 1]]()
        return b"bytes"

    monkeypatch.setattr(remote.asyncio, "sleep", sleep)
    pin = remote.Pin("b/k", "etag")
    try:
        out: object = asyncio.run(remote.retried(attempts, "s3://b/k", pin, call))
    except Exception as exc:  # the oracle below says which
        out = exc
    return out, calls, waits


@settings(max_examples=60, deadline=None)
@given(faults=st.lists(st.sampled_from(sorted(FAULTS)), max_size=12), attempts=st.integers(1, 10))
def test_transient_faults_are_retried_within_the_tries_and_nothing_else_is(faults, attempts):
    with pytest.MonkeyPatch.context() as mp:
        out, calls, waits = _run(faults, attempts, mp)
    # the oracle: walk the faults; a transient one costs a try, anything else ends the range
    expect_calls, outcome = 0, "ok"
    for f in faults:
        expect_calls += 1
        if f not in TRANSIENT:
            outcome = f
            break
        if expect_calls == attempts:
            outcome = f
            break
    else:
        expect_calls += 1
    assert calls == expect_calls
    assert len(waits) == calls - 1  # a wait between two tries, never after the last
    assert all(0 < w <= remote.LAST_WAIT for w in waits)
    assert sum(waits) <= sum(min(remote.LAST_WAIT, remote.FIRST_WAIT * 2**i) for i in range(attempts))
    if outcome == "ok":
        assert out == b"bytes"
    elif outcome == "changed":
        assert isinstance(out, DataChangedError) and "'etag'" in str(out)
    elif outcome == "missing":
        assert isinstance(out, FileNotFoundError)
    elif outcome == "denied":
        assert isinstance(out, PermissionError)
    else:  # transient, tries spent: the last failure, as the store said it
        assert isinstance(out, OSError) and not isinstance(out, DataChangedError)


def test_reads_try_twelve_times_unless_the_user_sets_max_attempts():
    pytest.importorskip("s3fs")
    from zephon_dask.data.paths import filesystem

    opts = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}  # never contacted
    assert remote.reader(filesystem("s3://b/k", opts)[0])[1] == remote.ATTEMPTS == 12
    mine = {**opts, "config_kwargs": {"retries": {"max_attempts": 3}}}
    client, tries = remote.reader(filesystem("s3://b/k", mine)[0])
    assert tries == 3 and client.storage_options["config_kwargs"]["retries"] == {"total_max_attempts": 1,
                                                                             "mode": "standard"}


@settings(max_examples=200, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 60)), max_size=30),
       hole=st.integers(0, 100), part=st.integers(1, 300))
def test_a_plan_covers_every_range_with_gets_apart_by_the_hole_and_no_longer_than_a_part(ranges, hole, part):
    starts = [lo for lo, _ in ranges]
    ends = [lo + n for lo, n in ranges]
    gets = remote.plan(starts, ends, hole, part)
    # the oracle: a byte is fetched iff a range holds it or it lies in a gap under the hole
    wanted = sorted((lo, hi) for lo, hi in zip(starts, ends) if hi > lo)
    fetched = {b for lo, hi in gets for b in range(lo, hi)}
    assert all(b in fetched for lo, hi in wanted for b in range(lo, hi))
    assert all(0 < hi - lo <= part for lo, hi in gets) and gets == sorted(gets)
    assert all(a[1] <= b[0] for a, b in zip(gets, gets[1:]))  # disjoint
    for a, b in zip(gets, gets[1:]):
        if a[1] < b[0]:  # two GETs apart: no range bridges them and the gap is over the hole
            assert b[0] - a[1] > hole
            assert not any(lo < b[0] and hi > a[1] for lo, hi in wanted)
        else:  # parts of one span: each as long as a part but the last
            assert a[1] - a[0] == part
    kept = {b for lo, hi in wanted for b in range(lo, hi)}
    spans: list[list[int]] = []
    for lo, hi in gets:  # the parts joined back into spans
        if spans and spans[-1][1] == lo:
            spans[-1][1] = hi
        else:
            spans.append([lo, hi])
    for lo, hi in spans:  # nothing fetched outside the ranges but the holes between them
        assert lo in kept and hi - 1 in kept


def test_waits_are_a_pure_function_of_the_request_and_the_try():
    waits = [remote.backoff(a, "s3://b/k\0" + str(lo)) for a in range(6) for lo in (0, 1 << 20)]
    assert waits == [remote.backoff(a, "s3://b/k\0" + str(lo)) for a in range(6) for lo in (0, 1 << 20)]
    assert len(set(waits)) == len(waits)  # requests of one read spread apart

"""The pure parts: policy values, backoff, Retry-After, error classes, budget, stacking."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx2
import pytest

from payonce.client import (
    ErrorClass,
    RetryBudget,
    RetryPolicy,
    classify_exception,
    classify_status,
    stacked_attempts,
)
from payonce.client._classify import retry_after_seconds
from payonce.errors import ConfigError


def test_defaults_follow_the_incident_report() -> None:
    policy = RetryPolicy()
    assert policy.attempts == 3
    assert policy.deadline == 120
    assert policy.connect_timeout == 5
    assert policy.read_timeout == 60
    assert policy.budget_tokens == 10
    assert policy.budget_ratio == 0.1


def test_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.attempts = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"deadline": 0},
        {"connect_timeout": -1},
        {"read_timeout": float("inf")},
        {"backoff_initial": -0.1},
        {"budget_tokens": 0.5},
        {"budget_ratio": float("nan")},
        {"status_wait": 301},
        {"status_backoff_initial": -1},
        {"status_backoff_max": float("inf")},
    ],
)
def test_bad_values_fail_loudly(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_status_pauses_are_full_jitter_from_a_tenth_of_a_second_to_two() -> None:
    policy = RetryPolicy()
    rng = random.Random(3)
    for check, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (40, 2.0)]:
        pauses = [policy.status_pause(check, rng) for _ in range(200)]
        assert all(0 <= pause <= ceiling for pause in pauses)
        assert max(pauses) > ceiling * 0.9, "the whole range is used"


def test_backoff_is_full_jitter_under_a_capped_exponential() -> None:
    policy = RetryPolicy(backoff_initial=0.5, backoff_max=8.0)
    rng = random.Random(1)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (9, 8.0)]:
        waits = [policy.backoff(retry, rng) for _ in range(500)]
        assert all(0 <= wait <= ceiling for wait in waits)
        assert max(waits) > ceiling * 0.9  # full jitter spreads over the whole range
        assert min(waits) < ceiling * 0.1


def test_worst_case_attempts_multiply_stacked_layers() -> None:
    policy = RetryPolicy(attempts=3)
    assert policy.worst_case_attempts() == 3
    # application loop 3 x SDK max_retries=2 (3 attempts) x this client 3
    assert policy.worst_case_attempts(3, 3) == 27
    assert stacked_attempts(3, 1, 3) == 9  # protect() sets the SDK layer to 1
    with pytest.raises(ConfigError):
        stacked_attempts(3, 0)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "whenever"}, None),
        ({}, None),
    ],
)
def test_retry_after_in_seconds_or_milliseconds(
    headers: dict[str, str], expected: float | None
) -> None:
    assert retry_after_seconds(httpx2.Headers(headers), now=0.0) == expected


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    later = format_datetime(datetime.fromtimestamp(now + 30, UTC), usegmt=True)
    assert retry_after_seconds(httpx2.Headers({"retry-after": later}), now=now) == 30.0
    earlier = format_datetime(datetime.fromtimestamp(now - 30, UTC), usegmt=True)
    assert retry_after_seconds(httpx2.Headers({"retry-after": earlier}), now=now) == 0.0


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, None),
        (302, None),
        (408, ErrorClass.REJECTED),
        (409, ErrorClass.REJECTED),
        (429, ErrorClass.REJECTED),
        (503, ErrorClass.REJECTED),
        (529, ErrorClass.REJECTED),
        (500, ErrorClass.AMBIGUOUS),
        (502, ErrorClass.AMBIGUOUS),
        (504, ErrorClass.AMBIGUOUS),
        (400, ErrorClass.PERMANENT),
        (401, ErrorClass.PERMANENT),
        (403, ErrorClass.PERMANENT),
        (404, ErrorClass.PERMANENT),
        (413, ErrorClass.PERMANENT),
        (422, ErrorClass.PERMANENT),
        (501, ErrorClass.PERMANENT),
    ],
)
def test_status_classes(status: int, expected: ErrorClass | None) -> None:
    assert classify_status(status, httpx2.Headers(), b"") is expected


def test_x_should_retry_overrides_the_status_either_way() -> None:
    no = httpx2.Headers({"x-should-retry": "false"})
    yes = httpx2.Headers({"x-should-retry": "true"})
    assert classify_status(503, no, b"") is ErrorClass.PERMANENT
    assert classify_status(500, no, b"") is ErrorClass.PERMANENT
    assert classify_status(400, yes, b"") is ErrorClass.REJECTED
    assert classify_status(504, yes, b"") is ErrorClass.AMBIGUOUS  # still: ask first


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"code":"context_length_exceeded","message":"too long"}}',
        b'{"type":"error","error":{"message":"prompt is too long: 210000 tokens > 200000"}}',
        b'{"error":{"code":"content_policy_violation"}}',
        b'{"error":{"code":"content_filter"}}',
    ],
)
def test_context_length_and_content_policy_are_permanent_whatever_the_status(body: bytes) -> None:
    assert classify_status(400, httpx2.Headers(), body) is ErrorClass.PERMANENT
    assert classify_status(500, httpx2.Headers(), body) is ErrorClass.PERMANENT
    assert classify_status(503, httpx2.Headers(), body) is ErrorClass.PERMANENT


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx2.ConnectError("refused"), ErrorClass.NOT_SENT),
        (httpx2.ConnectTimeout("slow"), ErrorClass.NOT_SENT),
        (httpx2.PoolTimeout("busy"), ErrorClass.NOT_SENT),
        (httpx2.ProxyError("no tunnel"), ErrorClass.NOT_SENT),
        (httpx2.ReadTimeout("slow"), ErrorClass.AMBIGUOUS),
        (httpx2.WriteTimeout("slow"), ErrorClass.AMBIGUOUS),
        (httpx2.ReadError("reset"), ErrorClass.AMBIGUOUS),
        (httpx2.RemoteProtocolError("closed"), ErrorClass.AMBIGUOUS),
        (httpx2.LocalProtocolError("bad header"), ErrorClass.PERMANENT),
        (httpx2.UnsupportedProtocol("ftp"), ErrorClass.PERMANENT),
    ],
)
def test_exception_classes(exc: httpx2.TransportError, expected: ErrorClass) -> None:
    assert classify_exception(exc) is expected


def test_budget_allows_the_floor_then_about_one_retry_per_ten_successes() -> None:
    budget = RetryBudget(max_tokens=10, token_ratio=0.1)
    assert budget.floor == 5
    allowed = [budget.record_failure_and_allow_retry() for _ in range(10)]
    assert allowed == [True] * 4 + [False] * 6  # 9, 8, 7, 6 tokens left > 5; then no
    assert budget.tokens == 0
    for _ in range(60):
        budget.record_success()
    assert budget.record_failure_and_allow_retry() is False  # 6 - 1 = 5: not above half
    for _ in range(20):
        budget.record_success()
    assert budget.record_failure_and_allow_retry() is True  # 7 - 1 = 6
    for _ in range(1000):
        budget.record_success()
    assert budget.tokens == 10  # capped


def test_policy_budget_none_switches_it_off() -> None:
    from payonce.client import IdempotentTransport

    transport = IdempotentTransport(
        httpx2.MockTransport(lambda r: httpx2.Response(200)),
        policy=RetryPolicy(budget_tokens=None),
        hooks=(),
    )
    assert transport.budget is None

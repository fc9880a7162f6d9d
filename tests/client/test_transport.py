"""The transports' decisions, seen through httpx2.MockTransport and a manual clock.

These pin behaviour the simulator cannot force on its own (x-should-retry,
Retry-After values, gateway answers) and never sleep: waits advance the clock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import httpx2
import pytest
from prometheus_client import CollectorRegistry

from payonce.client import (
    AsyncIdempotentTransport,
    ErrorClass,
    IdempotentTransport,
    Outcome,
    PrometheusHook,
    RetryPolicy,
    attempt_history,
)
from payonce.testing import ManualClock, zero_backoff
from tests.client.conftest import Recorder

Handler = Callable[[httpx2.Request], httpx2.Response]
URL = "http://llm.test/v1/chat/completions"
GATEWAY_PROBLEM = "https://github.com/payonce/payonce/blob/main/docs/problems.md#"


def client(
    handler: Handler, *, clock: ManualClock | None = None, **kwargs: object
) -> tuple[httpx2.Client, Recorder]:
    recorder = Recorder()
    transport = IdempotentTransport(
        httpx2.MockTransport(handler),
        clock=clock or ManualClock(),
        hooks=[recorder],
        **kwargs,  # type: ignore[arg-type]
    )
    return httpx2.Client(transport=transport), recorder


def script(*answers: httpx2.Response | Exception) -> tuple[Handler, list[httpx2.Request]]:
    """A handler answering in order (the last answer repeats), and the requests it saw."""
    seen: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        answer = answers[min(len(seen), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle, seen


def test_one_key_per_call_sent_on_every_attempt_and_a_new_one_per_call() -> None:
    handler, seen = script(httpx2.Response(503), httpx2.Response(503), httpx2.Response(200))
    with client(handler)[0] as http:
        assert http.post(URL, json={}).status_code == 200
        assert http.post(URL, json={}).status_code == 200
    keys = [request.headers["Idempotency-Key"] for request in seen]
    assert len(keys) == 4
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert len(keys[0]) == 36  # UUID v4


def test_the_callers_key_is_kept() -> None:
    handler, seen = script(httpx2.Response(503), httpx2.Response(200))
    with client(handler)[0] as http:
        http.post(URL, json={}, headers={"Idempotency-Key": "order-42"})
    assert [request.headers["Idempotency-Key"] for request in seen] == ["order-42", "order-42"]


def test_key_factory_and_safe_methods() -> None:
    handler, seen = script(httpx2.Response(200))
    with client(handler, key_factory=lambda: "from-factory")[0] as http:
        http.post(URL, json={})
        http.get("http://llm.test/v1/models")
    assert seen[0].headers["Idempotency-Key"] == "from-factory"
    assert "Idempotency-Key" not in seen[1].headers


def test_retry_after_is_honoured_and_recorded() -> None:
    busy = httpx2.Response(429, headers={"Retry-After": "2"})
    handler, _seen = script(
        busy, httpx2.Response(503, headers={"retry-after-ms": "1500"}), httpx2.Response(200)
    )
    clock = ManualClock()
    with client(handler, clock=clock)[0] as http:
        response = http.post(URL, json={})
    assert response.status_code == 200
    assert clock.slept == [2.0, 1.5]
    history = attempt_history(response)
    assert [a.outcome for a in history] == [Outcome.RETRIED, Outcome.RETRIED, Outcome.SUCCESS]
    assert [a.wait for a in history] == [2.0, 1.5, 0.0]


def test_retry_after_past_the_deadline_gives_up_at_once() -> None:
    handler, seen = script(httpx2.Response(429, headers={"Retry-After": "30"}))
    clock = ManualClock()
    with client(handler, clock=clock, policy=RetryPolicy(deadline=10))[0] as http:
        response = http.post(URL, json={})
    assert response.status_code == 429
    assert len(seen) == 1
    assert clock.slept == []


def test_backoff_sleeps_are_bounded_by_the_formula() -> None:
    handler, seen = script(httpx2.ConnectError("refused"))
    clock = ManualClock()
    policy = RetryPolicy(attempts=5, backoff_initial=0.5, backoff_max=1.0)
    with client(handler, clock=clock, policy=policy)[0] as http, pytest.raises(httpx2.ConnectError):
        http.post(URL, json={})
    assert len(seen) == 5
    assert len(clock.slept) == 4
    for wait, ceiling in zip(clock.slept, [0.5, 1.0, 1.0, 1.0], strict=True):
        assert 0 <= wait <= ceiling


def test_zero_backoff_never_waits() -> None:
    handler, seen = script(httpx2.Response(429, headers={"Retry-After": "30"}))
    clock = ManualClock()
    with zero_backoff(), client(handler, clock=clock)[0] as http:
        assert http.post(URL, json={}).status_code == 429
    assert len(seen) == 3
    assert clock.slept == []


def test_x_should_retry_false_stops_a_retryable_status() -> None:
    handler, seen = script(httpx2.Response(503, headers={"x-should-retry": "false"}))
    with client(handler)[0] as http:
        assert http.post(URL, json={}).status_code == 503
    assert len(seen) == 1


def test_x_should_retry_true_retries_a_permanent_status() -> None:
    handler, seen = script(
        httpx2.Response(400, headers={"x-should-retry": "true"}), httpx2.Response(200)
    )
    with client(handler)[0] as http:
        assert http.post(URL, json={}).status_code == 200
    assert len(seen) == 2


def test_context_length_is_never_retried() -> None:
    body = {"error": {"code": "context_length_exceeded", "message": "too long"}}
    handler, seen = script(httpx2.Response(500, json=body))
    with client(handler)[0] as http:
        assert http.post(URL, json={}).status_code == 500
    assert len(seen) == 1


def test_the_last_error_is_raised_unchanged_with_its_history() -> None:
    errors = [httpx2.ConnectError("one"), httpx2.ConnectError("two"), httpx2.ConnectError("three")]
    handler, _seen = script(*errors)
    with client(handler)[0] as http, pytest.raises(httpx2.ConnectError) as caught:
        http.post(URL, json={})
    assert caught.value is errors[2]
    history = attempt_history(caught.value)
    assert [a.number for a in history] == [1, 2, 3]
    assert [a.error_class for a in history] == [ErrorClass.NOT_SENT] * 3
    assert history[-1].outcome is Outcome.FAILURE
    assert any("payonce: gave up after 3 attempts" in note for note in caught.value.__notes__)


def test_ambiguous_without_gateway_resends_with_the_key_or_raises_when_told() -> None:
    # The first ambiguous failure asks the status endpoint once, in case the server
    # is a gateway not seen yet; it is not one, so it is not asked again.
    handler, seen = script(httpx2.ReadTimeout("slow"))
    with client(handler)[0] as http, pytest.raises(httpx2.ReadTimeout):
        http.post(URL, json={})
    assert [request.method for request in seen] == ["POST", "GET", "POST", "POST"]
    posts = [request for request in seen if request.method == "POST"]
    assert len({request.headers["Idempotency-Key"] for request in posts}) == 1

    handler, seen = script(httpx2.ReadTimeout("slow"))
    policy = RetryPolicy(resend_ambiguous=False)
    with client(handler, policy=policy)[0] as http, pytest.raises(httpx2.ReadTimeout):
        http.post(URL, json={})
    assert [request.method for request in seen] == ["POST", "GET"]


def test_ambiguous_safe_method_is_resent() -> None:
    handler, seen = script(httpx2.ReadTimeout("slow"), httpx2.Response(200))
    with client(handler, policy=RetryPolicy(resend_ambiguous=False))[0] as http:
        assert http.get("http://llm.test/v1/models").status_code == 200
    assert len(seen) == 2


def test_per_attempt_timeouts_are_cut_to_the_time_left() -> None:
    clock = ManualClock()
    timeouts: list[dict[str, float]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        timeouts.append(dict(request.extensions["timeout"]))
        clock.advance(3.0)
        return httpx2.Response(503)

    policy = RetryPolicy(deadline=10, connect_timeout=5, read_timeout=60, attempts=3)
    with zero_backoff(), client(handler, clock=clock, policy=policy)[0] as http:
        http.post(URL, json={}, timeout=httpx2.Timeout(30, connect=3))
    assert timeouts[0] == {"connect": 3, "read": 10, "write": 10, "pool": 5}
    assert timeouts[1] == {"connect": 3, "read": 7, "write": 7, "pool": 5}
    assert timeouts[2] == {"connect": 3, "read": 4, "write": 4, "pool": 4}


class FakeGateway:
    """Answers like a payonce gateway: the call, then its status endpoints."""

    def __init__(self, first: Exception | httpx2.Response, states: list[str | int]) -> None:
        self.first = first
        self.states = states  # "completed", "in_progress" or a status such as 404
        self.seen: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        path = request.url.path
        if path.endswith("/response"):
            return httpx2.Response(
                200, json={"answer": 42}, headers={"Idempotent-Replayed": "true"}
            )
        if path.startswith("/_payonce/requests/"):
            state = self.states.pop(0)
            if isinstance(state, int):
                problem = {"type": GATEWAY_PROBLEM + "not-found", "status": state}
                return httpx2.Response(
                    state,
                    content=json.dumps(problem).encode(),
                    headers={"content-type": "application/problem+json"},
                )
            return httpx2.Response(200, json={"key": "k", "state": state})
        if isinstance(self.first, Exception):
            first, self.first = (
                self.first,
                httpx2.Response(
                    200, json={"fresh": True}, headers={"Idempotent-Replayed": "false"}
                ),
            )
            raise first
        return self.first


def test_after_a_read_timeout_the_gateway_result_is_fetched_not_recomputed() -> None:
    fake = FakeGateway(httpx2.ReadTimeout("slow"), ["in_progress", "completed"])
    http, recorder = client(fake, gateway=True)
    with http:
        response = http.post(URL, json={}, headers={"Authorization": "Bearer sk-a", "X": "y"})
    assert response.json() == {"answer": 42}
    paths = [request.url.path for request in fake.seen]
    key = fake.seen[0].headers["Idempotency-Key"]
    assert paths == [
        "/v1/chat/completions",
        f"/_payonce/requests/{key}",
        f"/_payonce/requests/{key}",
        f"/_payonce/requests/{key}/response",
    ]
    status_check = fake.seen[1]
    assert status_check.headers["Authorization"] == "Bearer sk-a"
    assert "X" not in status_check.headers
    assert float(status_check.url.params["wait"]) > 0
    assert recorder.outcomes == ["recovered"]
    assert attempt_history(response)[0].outcome is Outcome.RECOVERED


def test_after_a_read_timeout_a_404_means_resend_with_the_same_key() -> None:
    fake = FakeGateway(httpx2.ReadTimeout("slow"), [404])
    with zero_backoff(), client(fake, gateway=True)[0] as http:
        response = http.post(URL, json={})
    assert response.json() == {"fresh": True}
    calls = [r for r in fake.seen if r.url.path == "/v1/chat/completions"]
    assert len(calls) == 2
    assert calls[0].headers["Idempotency-Key"] == calls[1].headers["Idempotency-Key"]


def test_an_abandoned_record_means_resend_with_the_same_key() -> None:
    # The gateway holding the key died; its lease lapsed: nobody runs it.
    fake = FakeGateway(httpx2.RemoteProtocolError("server disconnected"), ["abandoned"])
    with zero_backoff(), client(fake, gateway=True)[0] as http:
        response = http.post(URL, json={})
    assert response.json() == {"fresh": True}
    calls = [r for r in fake.seen if r.url.path == "/v1/chat/completions"]
    assert len(calls) == 2
    assert calls[0].headers["Idempotency-Key"] == calls[1].headers["Idempotency-Key"]
    assert [a.outcome for a in attempt_history(response)] == [Outcome.RETRIED, Outcome.SUCCESS]


class ImpatientGateway:
    """A gateway whose long-poll returns at once with ``in_progress``, every time.

    What gateways before issue 12 answered about a record whose holder died.
    """

    def __init__(self) -> None:
        self.status_requests = 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/_payonce/requests/"):
            self.status_requests += 1
            # A guard, not the measure: a client that never waits would loop forever
            # on a manual clock.
            assert self.status_requests < 1000, "status checks without any pause"
            return httpx2.Response(200, json={"key": "k", "state": "in_progress"})
        raise httpx2.RemoteProtocolError("server disconnected")


@pytest.mark.parametrize(("initial", "ceiling"), [(0.1, 2.0), (0.05, 1.0)])
def test_status_checks_back_off_with_full_jitter_within_the_deadline(
    initial: float, ceiling: float
) -> None:
    fake = ImpatientGateway()
    clock = ManualClock()
    policy = RetryPolicy(
        attempts=1, deadline=30, status_backoff_initial=initial, status_backoff_max=ceiling
    )
    rng = random.Random(7)
    with (
        client(fake, clock=clock, policy=policy, gateway=True, rng=rng)[0] as http,
        pytest.raises(httpx2.RemoteProtocolError),
    ):
        http.post(URL, json={})
    # One pause between two checks: pause(n) = uniform(0, min(max, initial * 2**(n-1))).
    assert len(clock.slept) == fake.status_requests - 1
    for n, pause in enumerate(clock.slept, start=1):
        assert 0 <= pause <= min(ceiling, initial * 2 ** (n - 1)), (n, pause)
    assert sum(clock.slept) <= 30, "never past the deadline"
    # Expected pause at the cap is ceiling/2, so ~30/(ceiling/2) checks, plus the ramp.
    assert fake.status_requests < 4 * 30 / ceiling + 20


async def test_async_status_checks_back_off_too() -> None:
    fake = ImpatientGateway()
    clock = ManualClock()
    transport = AsyncIdempotentTransport(
        httpx2.MockTransport(fake),
        clock=clock,
        hooks=(),
        gateway=True,
        policy=RetryPolicy(attempts=1, deadline=30),
    )
    async with httpx2.AsyncClient(transport=transport) as http:
        with pytest.raises(httpx2.RemoteProtocolError):
            await http.post(URL, json={})
    assert clock.slept and all(0 <= pause <= 2.0 for pause in clock.slept)
    assert fake.status_requests < 4 * 30 / 2.0 + 20


def test_a_failed_status_check_falls_back_to_a_keyed_resend() -> None:
    fake = FakeGateway(httpx2.ReadTimeout("slow"), [500])
    with zero_backoff(), client(fake, gateway=True)[0] as http:
        assert http.post(URL, json={}).json() == {"fresh": True}


def test_checking_needs_no_attempt_left() -> None:
    fake = FakeGateway(httpx2.ReadTimeout("slow"), ["completed"])
    with client(fake, gateway=True, policy=RetryPolicy(attempts=1))[0] as http:
        assert http.post(URL, json={}).json() == {"answer": 42}


def test_a_gateway_is_recognised_from_its_answers() -> None:
    replayed = httpx2.Response(200, headers={"Idempotent-Replayed": "false"})
    fake = FakeGateway(replayed, ["completed"])
    with client(fake)[0] as http:
        http.post(URL, json={})  # learns the origin from this answer
        fake.first = httpx2.ReadTimeout("slow")
        assert http.post(URL, json={}).json() == {"answer": 42}


@pytest.mark.parametrize(
    "answer",
    [
        httpx2.Response(200, headers={"Via": "1.1 payonce"}),
        httpx2.Response(
            503,
            content=json.dumps({"type": GATEWAY_PROBLEM + "store-unavailable"}).encode(),
            headers={"content-type": "application/problem+json"},
        ),
    ],
)
def test_via_and_problem_documents_also_reveal_a_gateway(answer: httpx2.Response) -> None:
    from payonce.client._gateway import looks_like_gateway

    assert looks_like_gateway(answer.headers, answer.read())
    assert not looks_like_gateway(httpx2.Headers({"Via": "1.1 nginx"}), b"")


def test_gateway_false_never_asks() -> None:
    replayed = httpx2.Response(200, headers={"Idempotent-Replayed": "false"})
    fake = FakeGateway(replayed, [])
    with zero_backoff(), client(fake, gateway=False)[0] as http:
        http.post(URL, json={})
        fake.first = httpx2.ReadTimeout("slow")
        http.post(URL, json={})
    assert not any(r.url.path.startswith("/_payonce") for r in fake.seen)


def test_budget_stops_retries_and_is_counted() -> None:
    registry = CollectorRegistry()
    handler, seen = script(httpx2.Response(503))
    policy = RetryPolicy(budget_tokens=4)  # floor: 2 retries
    recorder = Recorder()
    transport = IdempotentTransport(
        httpx2.MockTransport(handler),
        policy=policy,
        clock=ManualClock(),
        hooks=[recorder, PrometheusHook(registry)],
    )
    with zero_backoff(), httpx2.Client(transport=transport) as http:
        for _ in range(3):
            http.post(URL, json={})
    # tokens 4 -> 3 (retry) -> 2 (not above half: no) -> 1 (no) -> 0 (no)
    assert len(seen) == 4
    assert sum(d.budget_exhausted for d in recorder.details) == 3

    def sample(name: str, **labels: str) -> float:
        value = registry.get_sample_value(name, labels)
        return value or 0.0

    assert sample("payonce_client_attempts_total", outcome="retried") == 1
    assert sample("payonce_client_attempts_total", outcome="failure") == 3
    assert sample("payonce_client_retries_total", reason="rejected") == 1
    assert sample("payonce_client_budget_exhausted_total") == 3


def test_logging_hook_reports_retries(caplog: pytest.LogCaptureFixture) -> None:
    from payonce.client import LoggingHook

    handler, _ = script(httpx2.Response(503), httpx2.Response(200))
    transport = IdempotentTransport(
        httpx2.MockTransport(handler), clock=ManualClock(), hooks=[LoggingHook()]
    )
    with (
        caplog.at_level("DEBUG", logger="payonce.client"),
        httpx2.Client(transport=transport) as http,
    ):
        http.post(URL, json={})
    messages = [record.getMessage() for record in caplog.records if record.name == "payonce.client"]
    assert any("attempt 1 of POST" in m and "retrying" in m for m in messages)


def test_default_hooks_include_prometheus_when_installed() -> None:
    from payonce.client import LoggingHook, default_hooks

    hooks = default_hooks()
    assert isinstance(hooks[0], LoggingHook)
    assert any(isinstance(hook, PrometheusHook) for hook in hooks)


async def test_async_transport_same_decisions() -> None:
    handler, seen = script(
        httpx2.ConnectError("x"),
        httpx2.Response(429, headers={"Retry-After": "1"}),
        httpx2.Response(200),
    )
    clock = ManualClock()
    recorder = Recorder()
    transport = AsyncIdempotentTransport(
        httpx2.MockTransport(handler), clock=clock, hooks=[recorder]
    )
    async with httpx2.AsyncClient(transport=transport) as http:
        response = await http.post(URL, json={})
    assert response.status_code == 200
    assert len(seen) == 3
    assert clock.slept[1] == 1.0
    assert recorder.outcomes == ["retried", "retried", "success"]
    assert len(recorder.keys) == 1


async def test_async_gateway_check() -> None:
    fake = FakeGateway(httpx2.ReadTimeout("slow"), ["completed"])
    transport = AsyncIdempotentTransport(
        httpx2.MockTransport(fake), clock=ManualClock(), hooks=(), gateway="http://gw.test/"
    )
    async with httpx2.AsyncClient(transport=transport) as http:
        response = await http.post(URL, json={})
    assert response.json() == {"answer": 42}
    assert fake.seen[1].url.host == "gw.test"


class SlowBody(httpx2.SyncByteStream):
    """A body whose every chunk takes 2 s on the manual clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in range(10):
            self.clock.advance(2.0)
            yield b"x" * 10


def test_a_body_trickling_past_the_deadline_is_cut_off() -> None:
    clock = ManualClock()
    handler, seen = script(httpx2.Response(200, stream=SlowBody(clock)))
    policy = RetryPolicy(deadline=5)
    with client(handler, clock=clock, policy=policy)[0] as http, pytest.raises(httpx2.ReadTimeout):
        http.post(URL, json={})
    assert len(seen) == 1  # ambiguous, and no time left for another attempt
    assert clock.now() - 1_000.0 == 6.0  # three chunks read, then it stopped


def test_attempt_history_of_something_else_is_empty() -> None:
    assert attempt_history(ValueError("x")) == ()
    assert attempt_history(httpx2.Response(200)) == ()
    assert attempt_history(None) == ()

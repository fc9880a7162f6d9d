"""Each error class sends exactly the attempts the table says, counted by the simulator.

The simulator's ledger counts the requests that reached it and the generations it
billed; a manual clock stands in for every wait, so nothing here sleeps on a
backoff (the simulator's ``Retry-After: 1`` is checked, not waited for).
"""

from __future__ import annotations

import threading

import httpx2
import pytest

from payonce.client import ErrorClass, IdempotentTransport, Outcome, RetryPolicy, attempt_history
from payonce.testing import ManualClock, zero_backoff
from tests.client.conftest import AUTH, CHAT_BODY, Recorder, post_chat, wait_for_billed
from tests.support.processes import free_port
from tests.support.sim import Sim


def make_client(
    *, policy: RetryPolicy | None = None, inner: httpx2.BaseTransport | None = None
) -> tuple[httpx2.Client, Recorder, ManualClock]:
    recorder, clock = Recorder(), ManualClock()
    transport = IdempotentTransport(
        inner or httpx2.HTTPTransport(),
        policy=policy or RetryPolicy(attempts=3),
        hooks=[recorder],
        clock=clock,
        gateway=False,
    )
    return httpx2.Client(transport=transport), recorder, clock


# -- not sent: retried, and nothing reaches the server until it can ---------------


# The port is found at collection, so the id names what it is rather than its number:
# parallel test workers must collect the same ids.
@pytest.mark.parametrize(
    "url",
    [f"http://127.0.0.1:{free_port()}", "http://payonce-client-test.invalid"],
    ids=["closed-port", "unresolvable-name"],
)
def test_connect_errors_and_dns_failures_use_every_attempt(url: str) -> None:
    http, recorder, clock = make_client()
    with http, pytest.raises(httpx2.ConnectError) as caught:
        post_chat(http, url)
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert {d.error_class for d in recorder.details} == {ErrorClass.NOT_SENT}
    assert len(attempt_history(caught.value)) == 3
    assert len(clock.slept) == 2


class RefuseFirst(httpx2.BaseTransport):
    """Sends the first ``n`` attempts to a closed port (a real refusal), then to the sim."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.real = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.n > 0:
            self.n -= 1
            dead = request.url.copy_with(port=free_port())
            request = httpx2.Request(
                request.method,
                dead,
                headers=request.headers,
                content=request.content,
                extensions=request.extensions,
            )
        return self.real.handle_request(request)

    def close(self) -> None:
        self.real.close()


def test_connect_error_then_success_bills_once(fresh_sim: Sim) -> None:
    http, recorder, _ = make_client(inner=RefuseFirst(2))
    with http:
        response = post_chat(http, fresh_sim.url)
    assert response.status_code == 200
    assert recorder.outcomes == ["retried", "retried", "success"]
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_pool_timeout_is_retried_and_reaches_nothing(fresh_sim: Sim) -> None:
    shared = httpx2.HTTPTransport(limits=httpx2.Limits(max_connections=1))
    busy = threading.Thread(
        target=lambda: httpx2.Client(transport=shared, timeout=10).post(
            fresh_sim.url + "/v1/chat/completions",
            json=CHAT_BODY,
            headers={"X-Sim-Delay-Ms": "1500"},
        )
    )
    busy.start()
    wait_until_requests(fresh_sim, 1)
    policy = RetryPolicy(attempts=3, connect_timeout=0.2)
    transport = IdempotentTransport(
        shared, policy=policy, hooks=[recorder := Recorder()], gateway=False
    )
    with zero_backoff(), pytest.raises(httpx2.PoolTimeout):
        httpx2.Client(transport=transport).post(
            fresh_sim.url + "/v1/chat/completions", json=CHAT_BODY
        )
    assert recorder.outcomes == ["retried", "retried", "failure"]
    busy.join()
    shared.close()
    assert fresh_sim.requests() == 1  # only the call that held the connection


def wait_until_requests(sim: Sim, n: int) -> None:
    for _ in range(200):
        if sim.requests() >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"the simulator never saw {n} requests")


# -- rejected before work: retried after Retry-After, nothing billed --------------


@pytest.mark.parametrize("status", [429, 503, 529, 408])
def test_rejected_before_work_uses_every_attempt_after_retry_after(
    fresh_sim: Sim, status: int
) -> None:
    http, recorder, clock = make_client()
    with http:
        response = post_chat(http, fresh_sim.url, **{"X-Sim-Fail": str(status)})
    assert response.status_code == status  # the last answer, unchanged
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert {d.error_class for d in recorder.details} == {ErrorClass.REJECTED}
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (3, 0)
    if status != 408:  # the simulator sends Retry-After: 1 with 429, 503 and 529
        assert clock.slept == [1.0, 1.0]


# -- ambiguous: never blind; without a gateway, re-sent with the same key ------------


@pytest.mark.parametrize("status", [500, 502, 504])
def test_ambiguous_statuses_are_resent_with_the_same_key(fresh_sim: Sim, status: int) -> None:
    http, recorder, _ = make_client()
    with http:
        response = post_chat(http, fresh_sim.url, **{"X-Sim-Fail": str(status)})
    assert response.status_code == status
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert {d.error_class for d in recorder.details} == {ErrorClass.AMBIGUOUS}
    assert len(recorder.keys) == 1
    assert fresh_sim.requests() == 3


def test_read_timeout_without_a_gateway_resends_and_every_attempt_is_billed(
    fresh_sim: Sim,
) -> None:
    # Why a gateway matters: the upstream ignores the key, so each re-send runs again.
    http, recorder, _ = make_client(policy=RetryPolicy(attempts=3, read_timeout=0.2))
    with http, pytest.raises(httpx2.ReadTimeout):
        post_chat(http, fresh_sim.url, **{"X-Sim-Delay-Ms": "500"})
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert len(recorder.keys) == 1
    ledger = wait_for_billed(fresh_sim, 3)
    assert (ledger["requests"], ledger["billed"]) == (3, 3)


def test_read_timeout_with_resend_ambiguous_off_sends_once(fresh_sim: Sim) -> None:
    policy = RetryPolicy(attempts=3, read_timeout=0.2, resend_ambiguous=False)
    http, recorder, _ = make_client(policy=policy)
    with http, pytest.raises(httpx2.ReadTimeout):
        post_chat(http, fresh_sim.url, **{"X-Sim-Delay-Ms": "300"})
    assert recorder.outcomes == ["failure"]
    ledger = wait_for_billed(fresh_sim, 1)
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_disconnect_after_compute_is_ambiguous(fresh_sim: Sim) -> None:
    http, recorder, _ = make_client()
    with http, pytest.raises(httpx2.RemoteProtocolError):
        post_chat(http, fresh_sim.url, **{"X-Sim-Drop": "1"})
    assert {d.error_class for d in recorder.details} == {ErrorClass.AMBIGUOUS}
    ledger = wait_for_billed(fresh_sim, 3)
    assert (ledger["requests"], ledger["billed"]) == (3, 3)


# -- permanent: answered at once ------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_permanent_errors_are_answered_at_once(fresh_sim: Sim, status: int) -> None:
    http, recorder, clock = make_client()
    with http:
        response = post_chat(http, fresh_sim.url, **{"X-Sim-Fail": str(status)})
    assert response.status_code == status
    assert recorder.outcomes == ["failure"]
    assert recorder.details[0].error_class is ErrorClass.PERMANENT
    assert attempt_history(response)[0].outcome is Outcome.FAILURE
    assert clock.slept == []
    assert fresh_sim.requests() == 1


def test_success_sends_once_with_a_key(fresh_sim: Sim) -> None:
    http, recorder, _ = make_client()
    with http:
        response = http.post(fresh_sim.url + "/v1/chat/completions", json=CHAT_BODY, headers=AUTH)
    assert response.json()["choices"][0]["message"]["content"]
    assert recorder.outcomes == ["success"]
    assert fresh_sim.requests() == 1

"""Through a real payonce gateway: after an ambiguous failure, ask, don't re-send.

The gateway keeps a keyed upstream call running when its client times out. The
client then fetches the stored result through ``/_payonce/requests/{key}``: the
provider bills one generation and the caller gets the completion.
"""

from __future__ import annotations

import uuid

import httpx2
import pytest

from payonce.client import (
    AsyncIdempotentTransport,
    ErrorClass,
    IdempotentTransport,
    Outcome,
    RetryPolicy,
    attempt_history,
)
from payonce.testing import zero_backoff
from tests.client.conftest import AUTH, CHAT_BODY, Recorder, post_chat
from tests.support.processes import Process
from tests.support.sim import Sim

# The upstream takes 1 s; each attempt gives up reading after 0.3 s.
SLOW = {"X-Sim-Delay-Ms": "1000"}
POLICY = RetryPolicy(attempts=3, read_timeout=0.3, deadline=20)


def sync_client(gateway: bool | str | None) -> tuple[httpx2.Client, Recorder]:
    recorder = Recorder()
    transport = IdempotentTransport(policy=POLICY, gateway=gateway, hooks=[recorder])
    return httpx2.Client(transport=transport), recorder


@pytest.mark.parametrize("gateway_setting", [True, "url"])
def test_read_timeout_fetches_the_stored_result_and_bills_once(
    gateway: Process, fresh_sim: Sim, gateway_setting: bool | str
) -> None:
    setting = gateway.url if gateway_setting == "url" else gateway_setting
    http, recorder = sync_client(setting)
    with http:
        response = post_chat(http, gateway.url, **SLOW)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]
    assert response.headers["idempotent-replayed"] == "true"  # the stored answer
    assert recorder.outcomes == ["recovered"]
    assert recorder.details[0].error_class is ErrorClass.AMBIGUOUS
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_the_gateway_is_recognised_from_an_earlier_answer(gateway: Process, fresh_sim: Sim) -> None:
    http, recorder = sync_client(None)
    with http:
        assert post_chat(http, gateway.url).headers["idempotent-replayed"] == "false"
        response = post_chat(http, gateway.url, **SLOW)
    assert response.status_code == 200
    assert recorder.outcomes == ["success", "recovered"]
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 2)  # two calls, one bill each


def test_status_check_uses_the_callers_key_and_credential(gateway: Process, fresh_sim: Sim) -> None:
    key = f"order-{uuid.uuid4()}"
    http, recorder = sync_client(True)
    with http:
        response = post_chat(http, gateway.url, **SLOW, **{"Idempotency-Key": key})
    assert recorder.outcomes == ["recovered"]
    assert recorder.keys == {key}
    record = httpx2.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH, timeout=5)
    assert record.json()["state"] == "completed"
    other_tenant = {"Authorization": "Bearer sk-someone-else"}
    assert (
        httpx2.get(
            f"{gateway.url}/_payonce/requests/{key}", headers=other_tenant, timeout=5
        ).status_code
        == 404
    )
    assert response.json()["id"]
    assert fresh_sim.billed() == 1


def test_upstream_5xx_released_so_the_check_says_resend(gateway: Process, fresh_sim: Sim) -> None:
    # The gateway releases a key whose upstream answered 500: the status endpoint
    # says 404, so re-sending with the same key is safe, and each re-send reaches it.
    http, recorder = sync_client(True)
    with zero_backoff(), http:
        response = post_chat(http, gateway.url, **{"X-Sim-Fail": "500"})
    assert response.status_code == 500
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert len(recorder.keys) == 1
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (3, 0)


def test_rejected_through_the_gateway_is_retried_without_asking(
    gateway: Process, fresh_sim: Sim
) -> None:
    http, recorder = sync_client(True)
    with zero_backoff(), http:
        response = post_chat(http, gateway.url, **{"X-Sim-Fail": "429"})
    assert response.status_code == 429
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert fresh_sim.requests() == 3


def test_permanent_through_the_gateway_is_answered_at_once(
    gateway: Process, fresh_sim: Sim
) -> None:
    http, recorder = sync_client(True)
    with http:
        response = post_chat(http, gateway.url, **{"X-Sim-Fail": "400"})
    assert response.status_code == 400
    assert recorder.outcomes == ["failure"]
    assert fresh_sim.requests() == 1


async def test_async_read_timeout_fetches_the_stored_result(
    gateway: Process, fresh_sim: Sim
) -> None:
    recorder = Recorder()
    transport = AsyncIdempotentTransport(policy=POLICY, gateway=True, hooks=[recorder])
    async with httpx2.AsyncClient(transport=transport) as http:
        response = await http.post(
            gateway.url + "/v1/chat/completions", json=CHAT_BODY, headers={**AUTH, **SLOW}
        )
    assert response.status_code == 200
    assert attempt_history(response)[0].outcome is Outcome.RECOVERED
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_status_lookups_carry_every_credential_header_the_gateway_reads() -> None:
    from payonce.client._gateway import CREDENTIAL_HEADERS, status_request
    from payonce.gateway.keys import DEFAULT_CREDENTIAL_HEADERS

    # One list for both parts (payonce/credentials.py), Gemini's header included.
    assert tuple(name.encode() for name in CREDENTIAL_HEADERS) == DEFAULT_CREDENTIAL_HEADERS
    assert "x-goog-api-key" in CREDENTIAL_HEADERS
    source = httpx2.Headers({"X-Goog-Api-Key": "k-1", "X-Team": "t", "Content-Type": "x"})
    request = status_request("http://gw", "order-1", 1.0, source, ["x-team"], {})
    assert {name.lower() for name in request.headers} >= {"x-goog-api-key", "x-team"}
    assert "content-type" not in {name.lower() for name in request.headers}

"""``protect()`` on the official SDKs: their retries off, payonce's policy on, same results.

Unprotected, an SDK retries a 503 three times on its own; protected, the policy
decides (three attempts here too, one key for all of them), and a read timeout
through the gateway gets the stored answer instead of a second bill.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import anthropic
import httpx2
import openai
import pytest

from payonce.client import ErrorClass, Outcome, RetryPolicy, attempt_history, protect
from payonce.testing import ManualClock, zero_backoff
from tests.client.conftest import Recorder
from tests.support.processes import Process
from tests.support.sim import Sim

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SLOW = {"X-Sim-Delay-Ms": "1000"}
FAST_READS = RetryPolicy(attempts=3, read_timeout=0.3, deadline=20)

T = TypeVar("T")


@pytest.fixture
def closing() -> Iterator[Any]:
    """``closing(client)`` returns the client and closes it after the test."""
    clients: list[Any] = []

    def register(client: T) -> T:
        clients.append(client)
        return client

    yield register
    for client in clients:
        client.close()


def openai_chat(client: openai.OpenAI, **headers: str) -> object:
    return client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=16,
        extra_headers=headers,  # type: ignore[arg-type]
    )


def anthropic_message(client: anthropic.Anthropic, **headers: str) -> object:
    return client.messages.create(
        model="claude-3-5-haiku-latest",
        messages=MESSAGES,
        max_tokens=16,
        extra_headers=headers,  # type: ignore[arg-type]
    )


def test_protect_switches_the_sdk_retries_off_and_leaves_the_original_alone() -> None:
    original = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test")
    protected = protect(original, hooks=())
    assert original.max_retries == 2
    assert protected.max_retries == 0
    assert protected.timeout.read == 60  # type: ignore[union-attr]
    assert protected.timeout.connect == 5  # type: ignore[union-attr]
    assert protected.base_url == original.base_url


def test_protect_refuses_what_it_cannot_wrap() -> None:
    with pytest.raises(TypeError, match="protect"):
        protect(object())


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_503_costs_the_policys_attempts_not_the_sdks_times_ours(
    closing: Any, fresh_sim: Sim, sdk: str
) -> None:
    recorder = Recorder()
    if sdk == "openai":
        client = closing(
            protect(
                openai.OpenAI(base_url=fresh_sim.url + "/v1", api_key="sk-test"),
                hooks=[recorder],
                clock=ManualClock(),
            )
        )
        with pytest.raises(openai.InternalServerError) as caught:
            openai_chat(client, **{"X-Sim-Fail": "503"})
    else:
        client_a = closing(
            protect(
                anthropic.Anthropic(base_url=fresh_sim.url, api_key="sk-test"),
                hooks=[recorder],
                clock=ManualClock(),
            )
        )
        with pytest.raises(anthropic.InternalServerError) as caught:
            anthropic_message(client_a, **{"X-Sim-Fail": "503"})
    assert caught.value.status_code == 503
    assert fresh_sim.requests() == 3
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert len(recorder.keys) == 1
    history = attempt_history(caught.value)
    assert [a.error_class for a in history] == [ErrorClass.REJECTED] * 3


def test_an_sdk_connection_error_carries_the_history(closing: Any, fresh_sim: Sim) -> None:
    from tests.support.processes import free_port

    client = closing(
        protect(
            openai.OpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-test"),
            hooks=(),
            clock=ManualClock(),
        )
    )
    with pytest.raises(openai.APIConnectionError) as caught:
        openai_chat(client)
    assert [a.error_class for a in attempt_history(caught.value)] == [ErrorClass.NOT_SENT] * 3


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_read_timeout_through_the_gateway_returns_the_completion_billed_once(
    closing: Any, gateway: Process, fresh_sim: Sim, sdk: str
) -> None:
    recorder = Recorder()
    if sdk == "openai":
        client = closing(
            protect(
                openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test"),
                policy=FAST_READS,
                gateway=True,
                hooks=[recorder],
            )
        )
        completion = client.chat.completions.create(  # type: ignore[call-overload]
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=16, extra_headers=SLOW
        )
        assert completion.choices[0].message.content
    else:
        client_a = closing(
            protect(
                anthropic.Anthropic(base_url=gateway.url, api_key="sk-test"),
                policy=FAST_READS,
                gateway=True,
                hooks=[recorder],
            )
        )
        message = client_a.messages.create(  # type: ignore[call-overload]
            model="claude-3-5-haiku-latest", messages=MESSAGES, max_tokens=16, extra_headers=SLOW
        )
        assert message.content[0].text
    assert recorder.outcomes == ["recovered"]
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_a_business_key_passed_by_the_caller_is_the_key(
    closing: Any, gateway: Process, fresh_sim: Sim
) -> None:
    client = closing(
        protect(
            openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test"), hooks=(), gateway=True
        )
    )
    key = f"ticket-{uuid.uuid4()}"
    first = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=16,  # type: ignore[arg-type]
        extra_headers={"Idempotency-Key": key},
    )
    again = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=16,  # type: ignore[arg-type]
        extra_headers={"Idempotency-Key": key},
    )
    assert first.headers["idempotent-replayed"] == "false"
    assert again.headers["idempotent-replayed"] == "true"
    assert first.parse().id == again.parse().id
    assert fresh_sim.billed() == 1


def test_the_sdks_own_idempotency_header_is_kept(
    closing: Any, gateway: Process, fresh_sim: Sim
) -> None:
    # The documented one-line alternative to protect(): the SDK sends its own key.
    original = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test")
    original._idempotency_header = "Idempotency-Key"
    recorder = Recorder()
    client = closing(protect(original, hooks=[recorder], gateway=True))
    assert client._idempotency_header == "Idempotency-Key"
    openai_chat(client)
    (key,) = recorder.keys
    assert key is not None
    assert key.startswith("stainless-python-retry-")


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_async_sdks_are_protected_too(gateway: Process, fresh_sim: Sim, sdk: str) -> None:
    recorder = Recorder()
    if sdk == "openai":
        client = protect(
            openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="sk-test"),
            policy=FAST_READS,
            gateway=True,
            hooks=[recorder],
        )
        assert client.max_retries == 0
        completion = await client.chat.completions.create(  # type: ignore[call-overload]
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=16, extra_headers=SLOW
        )
        assert completion.choices[0].message.content
        await client.close()
    else:
        client_a = protect(
            anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-test"),
            policy=FAST_READS,
            gateway=True,
            hooks=[recorder],
        )
        message = await client_a.messages.create(  # type: ignore[call-overload]
            model="claude-3-5-haiku-latest", messages=MESSAGES, max_tokens=16, extra_headers=SLOW
        )
        assert message.content[0].text
        await client_a.close()
    assert recorder.outcomes == ["recovered"]
    assert fresh_sim.billed() == 1


async def test_async_sdk_rejected_uses_the_policy(fresh_sim: Sim) -> None:
    recorder = Recorder()
    client = protect(
        openai.AsyncOpenAI(base_url=fresh_sim.url + "/v1", api_key="sk-test"), hooks=[recorder]
    )
    with zero_backoff(), pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(  # type: ignore[call-overload]
            model="gpt-4o-mini",
            messages=MESSAGES,
            max_tokens=16,
            extra_headers={"X-Sim-Fail": "429"},
        )
    await client.close()
    assert recorder.outcomes == ["retried", "retried", "failure"]
    assert fresh_sim.requests() == 3
    assert Outcome.FAILURE.value == recorder.outcomes[-1]


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_protect_keeps_the_timeout_set_on_the_client(sdk: str) -> None:
    # Issue 13, item 4: protect() used to replace it with the policy's (5 s / 60 s).
    factory: Any = openai.OpenAI if sdk == "openai" else anthropic.Anthropic
    assert protect(factory(api_key="sk-test", timeout=0.5)).timeout.read == 0.5
    both = protect(factory(api_key="sk-test", timeout=httpx2.Timeout(7.0, connect=1.0))).timeout
    assert (both.read, both.connect) == (7.0, 1.0)
    default = protect(factory(api_key="sk-test")).timeout
    assert (default.read, default.connect) == (60.0, 5.0), "the SDK default: the policy's"


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_first_call_asks_a_gateway_it_has_not_seen_and_gets_the_paid_answer(
    closing: Any, gateway: Process, fresh_sim: Sim, sdk: str
) -> None:
    # Issue 13, item 5: with gateway=None the first call could not ask, so when every
    # attempt timed out it raised while the gateway held the completed, billed answer.
    slow = {"X-Sim-Delay-Ms": "2100"}
    policy = RetryPolicy(attempts=2, deadline=20)
    if sdk == "openai":
        client = closing(
            protect(openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-t"), policy=policy)
        )
        completion = client.chat.completions.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=16, extra_headers=slow, timeout=0.5
        )
        assert completion.choices[0].message.content
    else:
        client_a = closing(
            protect(anthropic.Anthropic(base_url=gateway.url, api_key="sk-t"), policy=policy)
        )
        message = client_a.messages.create(
            model="claude-3-5-haiku-latest",
            messages=MESSAGES,
            max_tokens=16,
            extra_headers=slow,
            timeout=0.5,
        )
        assert message.content[0].text
    assert fresh_sim.billed() == 1

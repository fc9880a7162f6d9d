"""The SDK's own key yields to an explicit one, in any key header (issue 13, item 6).

With ``client._idempotency_header = "Idempotency-Key"`` (the README's one-line
setup) the official SDKs send a key they minted (``stainless-python-retry-<uuid>``)
on every call. A business key passed in another key header (``X-Idempotency-Key``)
used to make every call a 400 "several different idempotency keys".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.gateway.conftest import AUTH, CHAT, Sim, chat, module_gateway
from tests.support.processes import Process

MINTED = "stainless-python-retry-6f1c9f0e-1d1b-4a3c-9a3b-0b7f0e7b2c11"


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module: every test's keys are its own (uuids), or
    refused before anything is claimed; each counts only the simulator's ledger
    (emptied by ``fresh_sim``) and has its answers before it returns."""
    yield from module_gateway(sim, tmp_path_factory)


def test_openai_sdk_key_yields_to_an_explicit_x_idempotency_key(
    gateway: Process, fresh_sim: Sim
) -> None:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0) as client:
        client._idempotency_header = "Idempotency-Key"
        business = f"ticket-{uuid.uuid4()}"
        answers = [
            client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "Summarise the ticket."}],
                extra_headers={"X-Idempotency-Key": business},
            )
            for _ in range(2)  # two calls: two SDK keys, one business key
        ]
        assert [raw.headers["idempotent-replayed"] for raw in answers] == ["false", "true"]
        assert answers[0].parse().id == answers[1].parse().id
        assert fresh_sim.billed() == 1


def test_anthropic_sdk_key_yields_to_an_explicit_x_idempotency_key(
    gateway: Process, fresh_sim: Sim
) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="sk-ant-test", max_retries=0) as client:
        client._idempotency_header = "Idempotency-Key"
        business = f"ticket-{uuid.uuid4()}"
        answers = [
            client.messages.with_raw_response.create(
                model="claude-sonnet-4-20250514",
                max_tokens=16,
                messages=[{"role": "user", "content": "Name a colour."}],
                extra_headers={"X-Idempotency-Key": business},
            )
            for _ in range(2)
        ]
        assert [raw.headers["idempotent-replayed"] for raw in answers] == ["false", "true"]
        assert fresh_sim.billed() == 1


@pytest.mark.parametrize("explicit_header", ["Idempotency-Key", "X-Idempotency-Key"])
def test_a_minted_key_in_either_header_yields(
    gateway: Process, fresh_sim: Sim, explicit_header: str
) -> None:
    other = "X-Idempotency-Key" if explicit_header == "Idempotency-Key" else "Idempotency-Key"
    business = f"order-{uuid.uuid4()}"
    first = chat(gateway.url, headers={explicit_header: business, other: MINTED})
    again = chat(gateway.url, headers={explicit_header: business, other: MINTED[:-1] + "0"})
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert fresh_sim.billed() == 1


def test_two_explicit_keys_that_disagree_are_still_refused(gateway: Process) -> None:
    answer = chat(
        gateway.url, headers={**AUTH, "Idempotency-Key": "a-1", "X-Idempotency-Key": "b-2"}
    )
    assert answer.status_code == 400
    assert "several different" in answer.json()["detail"]


def test_two_minted_keys_that_disagree_are_refused(gateway: Process) -> None:
    headers = {"Idempotency-Key": MINTED, "X-Idempotency-Key": MINTED[:-1] + "0"}
    assert chat(gateway.url, body=CHAT, headers=headers).status_code == 400


def test_the_sdk_shows_why_the_gateway_refused(gateway: Process) -> None:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"Idempotency-Key": "c-3", "X-Idempotency-Key": "d-4"},
            )
        assert "several different idempotency keys" in str(raised.value)

"""The gateway's own refusals read by the official SDKs: the message, type and code.

A problem document (RFC 9457) has no member the SDKs read: openai-node printed
"422 status code (no body)" for a reused key. Each document now also carries
``error: {message, type, code}``, which openai (Python and Node) and anthropic
read. A real gateway and simulator; the official Python SDKs as the clients.
"""

from __future__ import annotations

import uuid

import anthropic
import httpx2 as httpx
import openai
import pytest

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim

DETAIL = "was first used with a different request"


def test_the_openai_sdk_reads_message_type_and_code_of_a_reused_key(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    key = str(uuid.uuid4())
    with openai.OpenAI(
        base_url=gateway.url + "/v1", api_key="sk-errors", max_retries=0,
        default_headers={"Idempotency-Key": key},
    ) as client:  # fmt: skip
        client.chat.completions.create(**CHAT)
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.chat.completions.create(**{**CHAT, "max_tokens": 5})
    assert DETAIL in refused.value.message
    assert refused.value.code == refused.value.type == "fingerprint-mismatch"


def test_the_anthropic_sdk_reads_the_message_of_a_refusal(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel", "--require-key")
    with (
        anthropic.Anthropic(base_url=gateway.url, api_key="sk-ant-errors", max_retries=0) as client,
        pytest.raises(anthropic.BadRequestError) as refused,
    ):
        client.messages.create(
            model="claude-sonnet-4-0", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert "requires an Idempotency-Key" in refused.value.message
    assert refused.value.body["error"]["type"] == "key-required"  # type: ignore[index]


def test_every_problem_document_carries_the_error_member(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    answer = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=b"{}",
        headers={**AUTH, "Idempotency-Key": "x" * 300, "Content-Type": "application/json"},
    )
    document = answer.json()
    assert answer.headers["content-type"] == "application/problem+json"
    assert document["error"] == {
        "message": document["detail"],
        "type": document["type"].rsplit("#", 1)[1],
        "code": document["type"].rsplit("#", 1)[1],
    }

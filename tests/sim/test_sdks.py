"""The official openai and anthropic SDKs talk to ``payonce sim`` as to the real APIs."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.sim.conftest import Sim


def openai_client(sim: Sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0, timeout=10)


def anthropic_client(sim: Sim) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0, timeout=10)


def test_openai_chat(fresh_sim: Sim) -> None:
    with openai_client(fresh_sim) as client:
        completion = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=8,
        )
    assert completion.id.startswith("chatcmpl-")
    assert completion._request_id == completion.id
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (8, 8)
    [entry] = fresh_sim.ledger()["entries"]
    assert entry["provider_request_id"] == completion.id


def test_openai_completion_and_embeddings(fresh_sim: Sim) -> None:
    with openai_client(fresh_sim) as client:
        completion = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hi")
        embeddings = client.embeddings.create(
            model="text-embedding-3-small", input=["one", "two"], dimensions=64
        )
        models = client.models.list()
    assert completion.choices[0].text
    assert [len(item.embedding) for item in embeddings.data] == [64, 64]
    assert embeddings.usage.prompt_tokens == 2
    assert "gpt-4o" in {model.id for model in models}
    assert fresh_sim.ledger()["billed"] == 2


def test_openai_sdk_reads_simulated_errors(fresh_sim: Sim) -> None:
    with openai_client(fresh_sim) as client:
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Sim-Fail": "429"},
            )
        with pytest.raises(openai.BadRequestError) as invalid:
            client.chat.completions.create(model="gpt-4o", messages=[])
    assert limited.value.code == "rate_limit_exceeded"
    assert limited.value.response.headers["retry-after"] == "1"
    assert invalid.value.param == "messages"
    assert fresh_sim.ledger()["billed"] == 0


def test_anthropic_message(fresh_sim: Sim) -> None:
    with anthropic_client(fresh_sim) as client:
        message = client.messages.create(
            model="claude-sonnet-4-0",
            max_tokens=64,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
    assert message.id.startswith("msg_")
    assert message._request_id == message.id
    assert message.content[0].type == "text"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (8, 16)
    [entry] = fresh_sim.ledger()["entries"]
    assert entry["provider_request_id"] == message.id


def test_anthropic_sdk_reads_simulated_errors(fresh_sim: Sim) -> None:
    with anthropic_client(fresh_sim) as client:
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(
                model="claude-sonnet-4-0",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Sim-Fail": "429"},
            )
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            client.messages.create(
                model="claude-sonnet-4-0",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Sim-Fail": "529"},
            )
    assert limited.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Simulated 429 error (payonce sim)."},
    }
    assert overloaded.value.status_code == 529
    assert fresh_sim.ledger()["billed"] == 0

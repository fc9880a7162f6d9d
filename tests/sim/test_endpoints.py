"""Each endpoint of a real ``payonce sim`` process: body shapes, usage, ids, errors."""

from __future__ import annotations

import base64
import math
import re
import struct
import time
from typing import Any

import httpx2 as httpx
import pytest

from payonce.sim.pricing import cost_usd
from tests.sim.conftest import CHAT_BODY, Sim

HEX24 = "[0-9a-f]{24}"


def only_entry(sim: Sim) -> dict[str, Any]:
    ledger = sim.ledger()
    assert ledger["billed"] == 1
    assert ledger["requests"] == 1
    return dict(ledger["entries"][0])


def test_chat_completion(fresh_sim: Sim) -> None:
    response = fresh_sim.chat()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert re.fullmatch(f"chatcmpl-{HEX24}", body["id"])
    assert response.headers["x-request-id"] == body["id"]
    assert body["object"] == "chat.completion"
    assert abs(body["created"] - time.time()) < 60
    assert body["model"] == "gpt-4o"
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    # "hello there friend" is 18 characters: ceil(18/4) = 5 input tokens; the answer is
    # the input clamped to at least 16 tokens, 4 characters each.
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
    assert len(choice["message"]["content"]) == 16 * 4

    entry = only_entry(fresh_sim)
    assert entry["provider_request_id"] == body["id"]
    assert entry["model"] == "gpt-4o"
    assert entry["endpoint"] == "/v1/chat/completions"
    assert (entry["input_tokens"], entry["output_tokens"]) == (5, 16)
    assert entry["cost_usd"] == pytest.approx((5 * 2.50 + 16 * 10.00) / 1e6)
    assert entry["client_connected"] is True
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["finished_at"])


def test_chat_max_tokens_truncates_and_n_multiplies(fresh_sim: Sim) -> None:
    body = {**CHAT_BODY, "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 30}
    response = fresh_sim.post("/v1/chat/completions", {**body, "n": 2})
    data = response.json()
    assert [choice["finish_reason"] for choice in data["choices"]] == ["length", "length"]
    assert data["usage"] == {"prompt_tokens": 100, "completion_tokens": 60, "total_tokens": 160}
    assert only_entry(fresh_sim)["output_tokens"] == 60


def test_text_completion(fresh_sim: Sim) -> None:
    response = fresh_sim.post(
        "/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "y" * 400}
    )
    body = response.json()
    assert response.status_code == 200
    assert re.fullmatch(f"cmpl-{HEX24}", body["id"])
    assert response.headers["x-request-id"] == body["id"]
    assert body["object"] == "text_completion"
    # max_tokens defaults to 16 on the legacy endpoint, so a long prompt is cut short.
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"]) == 64
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 16, "total_tokens": 116}
    entry = only_entry(fresh_sim)
    assert (entry["endpoint"], entry["provider_request_id"]) == ("/v1/completions", body["id"])


def test_embeddings_as_floats(fresh_sim: Sim) -> None:
    response = fresh_sim.post(
        "/v1/embeddings", {"model": "text-embedding-3-small", "input": ["abcd", "abcdefgh"]}
    )
    body = response.json()
    assert response.status_code == 200
    assert re.fullmatch(f"req_{HEX24}", response.headers["x-request-id"])
    assert body["object"] == "list"
    assert body["model"] == "text-embedding-3-small"
    assert [item["index"] for item in body["data"]] == [0, 1]
    vector = body["data"][0]["embedding"]
    assert len(vector) == 1536
    assert math.sqrt(sum(value * value for value in vector)) == pytest.approx(1.0, abs=1e-4)
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    entry = only_entry(fresh_sim)
    assert entry["provider_request_id"] == response.headers["x-request-id"]
    assert (entry["input_tokens"], entry["output_tokens"]) == (3, 0)


def test_embeddings_as_base64_with_dimensions(fresh_sim: Sim) -> None:
    response = fresh_sim.post(
        "/v1/embeddings",
        {
            "model": "text-embedding-3-large",
            "input": "hi",
            "dimensions": 256,
            "encoding_format": "base64",
        },
    )
    packed = base64.b64decode(response.json()["data"][0]["embedding"])
    values = struct.unpack("<256f", packed)
    assert math.sqrt(sum(value * value for value in values)) == pytest.approx(1.0, abs=1e-4)


def test_anthropic_message(fresh_sim: Sim) -> None:
    response = fresh_sim.post(
        "/v1/messages",
        {
            "model": "claude-sonnet-4-0",
            "max_tokens": 10,
            "system": "s" * 40,
            "messages": [{"role": "user", "content": "u" * 40}],
        },
    )
    body = response.json()
    assert response.status_code == 200
    assert re.fullmatch(f"msg_{HEX24}", body["id"])
    assert response.headers["x-request-id"] == response.headers["request-id"] == body["id"]
    assert body["type"] == "message"
    assert body["role"] == "assistant"
    assert body["model"] == "claude-sonnet-4-0"
    assert body["content"] == [{"type": "text", "text": body["content"][0]["text"]}]
    assert len(body["content"][0]["text"]) == 40
    assert body["stop_reason"] == "max_tokens"
    assert body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 20, "output_tokens": 10}
    entry = only_entry(fresh_sim)
    assert entry["endpoint"] == "/v1/messages"
    assert entry["cost_usd"] == pytest.approx(cost_usd("claude-sonnet-4-0", 20, 10))


def test_models_in_both_shapes(sim: Sim) -> None:
    openai_list = httpx.get(sim.url + "/v1/models", timeout=10).json()
    assert openai_list["object"] == "list"
    ids = {model["id"] for model in openai_list["data"]}
    assert {"gpt-4o", "claude-sonnet-4-0", "text-embedding-3-small"} <= ids
    assert all(model["object"] == "model" for model in openai_list["data"])
    anthropic_list = httpx.get(
        sim.url + "/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=10
    ).json()
    assert anthropic_list["has_more"] is False
    assert all(model["type"] == "model" for model in anthropic_list["data"])


def test_health(sim: Sim) -> None:
    response = httpx.get(sim.url + "/_sim/health", timeout=10)
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_invalid_json_is_an_openai_400(fresh_sim: Sim, path: str) -> None:
    response = httpx.post(fresh_sim.url + path, content=b'{"model": ', timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 0)


def test_missing_field_is_an_openai_400_naming_it(fresh_sim: Sim) -> None:
    response = fresh_sim.post("/v1/chat/completions", {"model": "gpt-4o"})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "Missing required parameter: 'messages'.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "missing_required_parameter",
        }
    }


@pytest.mark.parametrize(
    "body", [b"not json", b'{"model": "claude-sonnet-4-0", "messages": []}', b"\xff\xfe"]
)
def test_bad_anthropic_request_is_an_anthropic_400(fresh_sim: Sim, body: bytes) -> None:
    response = httpx.post(fresh_sim.url + "/v1/messages", content=body, timeout=10)
    assert response.status_code == 400
    data = response.json()
    assert data["type"] == "error"
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["message"]
    assert fresh_sim.ledger()["billed"] == 0


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": "usage"}, "stream_options"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
    ],
)
def test_bad_stream_parameters_are_a_400(fresh_sim: Sim, extra: dict[str, Any], param: str) -> None:
    response = fresh_sim.post("/v1/chat/completions", {**CHAT_BODY, **extra})
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["param"] == param
    assert fresh_sim.ledger()["billed"] == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("POST", "/v1/unknown"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/_sim/ledger"),
    ],
)
def test_unknown_route_is_a_json_404(fresh_sim: Sim, method: str, path: str) -> None:
    response = httpx.request(method, fresh_sim.url + path, timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == f"Invalid URL ({method} {path})"
    assert fresh_sim.ledger()["requests"] == 0


def test_unknown_anthropic_route_is_an_anthropic_404(sim: Sim) -> None:
    response = httpx.get(sim.url + "/v1/messages/batches", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Sim-Delay-Ms", "soon"),
        ("X-Sim-Delay-Ms", "-5"),
        ("X-Sim-Fail", "200"),
        ("X-Sim-Fail", "boom"),
        ("X-Sim-Drop", "maybe"),
        ("X-Sim-Token-Ms", "fast"),
        ("X-Sim-Token-Ms", "-1"),
        ("X-Sim-Token-Ms", "60001"),
        ("X-Sim-Token-Ms", "nan"),
        ("X-Sim-Die-After", "-1"),
        ("X-Sim-Die-After", "three"),
        ("X-Sim-Die-After", "1.5"),
    ],
)
def test_bad_control_header_is_a_400(fresh_sim: Sim, header: str, value: str) -> None:
    response = fresh_sim.chat(headers={header: value})
    assert response.status_code == 400
    assert header in response.json()["error"]["message"]
    assert fresh_sim.ledger()["billed"] == 0

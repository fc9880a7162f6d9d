"""``payonce sim --wire`` / ``X-Sim-Wire``: streams framed as the real upstreams frame them.

Each profile's marks, read from the raw bytes; the official SDKs parsing every
profile straight from the simulator; a bad wire refused before any work.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from payonce.sim.profiles import PROFILES
from tests.sim.conftest import CHAT_BODY, Sim, SimFactory

STREAM: dict[str, Any] = {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}}
MESSAGE: dict[str, Any] = {
    "model": "claude-sonnet-4-0",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "What is the capital of France? " * 4}],
}
OPENAI_SHAPED = [name for name in PROFILES if name != "anthropic"]


def _raw(sim: Sim, wire: str, body: dict[str, Any] = STREAM, **headers: str) -> httpx.Response:
    path = "/v1/messages" if "max_tokens" in body and "claude" in body["model"] else None
    response = httpx.post(
        sim.url + (path or "/v1/chat/completions"),
        json=body,
        headers={"X-Sim-Wire": wire, "X-Sim-Token-Ms": "0", **headers},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def test_openrouter_comments_first_and_names_its_generation(fresh_sim: Sim) -> None:
    response = _raw(fresh_sim, "openrouter")
    body = response.content
    assert b"\n: OPENROUTER PROCESSING\n\n" in body
    assert body.index(b": OPENROUTER PROCESSING") < body.index(b'"delta":{"content":"')
    assert response.headers["x-generation-id"] == response.headers["x-request-id"]
    assert body.endswith(b"data: [DONE]\n\n")


def _data(body: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")
    ]


def _billed(sim: Sim, request_id: str) -> dict[str, Any]:
    entries = sim.ledger()["entries"]
    [entry] = [e for e in entries if e["provider_request_id"] == request_id]
    return dict(entry)


@pytest.mark.parametrize("stream", [True, False])
def test_openrouter_states_the_cost_it_bills_in_the_usage(fresh_sim: Sim, stream: bool) -> None:
    """usage.cost, as OpenRouter sends it: what the ledger bills for the call (issue 34)."""
    body = STREAM if stream else CHAT_BODY
    response = _raw(fresh_sim, "openrouter", body)
    entry = _billed(fresh_sim, response.headers["x-request-id"])
    if stream:
        usages = [chunk["usage"] for chunk in _data(response.content) if chunk.get("usage")]
        [usage] = usages
    else:
        usage = response.json()["usage"]
    assert usage["cost"] == pytest.approx(entry["cost_usd"], abs=1e-12) and entry["cost_usd"] > 0
    assert usage["prompt_tokens"] == entry["input_tokens"]
    # Other profiles state no cost.
    plain = _raw(fresh_sim, "openai", body)
    assert b'"cost":' not in plain.content


def test_openrouter_states_the_cost_of_a_message_and_a_response(fresh_sim: Sim) -> None:
    """Anthropic's shape states it in message_delta (not message_start); the Responses
    API in response.completed; whole answers in their usage."""
    message = {**MESSAGE, "model": "claude-sonnet-4-5-20250929"}
    streamed = _raw(fresh_sim, "openrouter", message)
    entry = _billed(fresh_sim, streamed.headers["x-request-id"])
    events = _data(streamed.content)
    [start] = [e for e in events if e["type"] == "message_start"]
    assert "cost" not in start["message"]["usage"]
    [delta] = [e for e in events if e["type"] == "message_delta"]
    assert delta["usage"]["cost"] == pytest.approx(entry["cost_usd"], abs=1e-12)
    # claude-sonnet-4-5 (and its snapshots) at $3 / $15 per million tokens.
    expected = (entry["input_tokens"] * 3 + entry["output_tokens"] * 15) / 1e6
    assert entry["cost_usd"] == pytest.approx(expected, abs=1e-12)
    whole = httpx.post(
        fresh_sim.url + "/v1/messages",
        json={**message, "stream": False},
        headers={"X-Sim-Wire": "openrouter"},
        timeout=30,
    )
    billed = _billed(fresh_sim, whole.headers["request-id"])
    assert whole.json()["usage"]["cost"] == pytest.approx(billed["cost_usd"], abs=1e-12)
    for stream in (True, False):
        response = httpx.post(
            fresh_sim.url + "/v1/responses",
            json={"model": "gpt-4o-mini", "input": "hello", "stream": stream},
            headers={"X-Sim-Wire": "openrouter", "X-Sim-Token-Ms": "0"},
            timeout=30,
        )
        billed = _billed(fresh_sim, response.headers["x-request-id"])
        if stream:
            [done] = [e for e in _data(response.content) if e["type"] == "response.completed"]
            usage = done["response"]["usage"]
        else:
            usage = response.json()["usage"]
        assert usage["cost"] == pytest.approx(billed["cost_usd"], abs=1e-12)


def test_sse_starlette_frames_with_crlf_pings_and_sends_no_usage_or_request_id(
    fresh_sim: Sim,
) -> None:
    response = _raw(fresh_sim, "sse-starlette")
    body = response.content
    assert b"\n" not in body.replace(b"\r\n", b""), "every line ends in CRLF"
    assert b"\r\n: ping - 20" in body and body.endswith(b"data: [DONE]\r\n\r\n")
    assert b'"usage":{' not in body, "no usage chunk, though it was asked for"
    assert "x-request-id" not in response.headers
    assert fresh_sim.billed() == 1


def test_tgi_keeps_alive_with_a_bare_colon(fresh_sim: Sim) -> None:
    body = _raw(fresh_sim, "tgi").content
    assert b"\n:\n\n" in body and "x-request-id" not in _raw(fresh_sim, "tgi").headers


def test_mock_ids_gives_every_chunk_its_own_id(fresh_sim: Sim) -> None:
    body = _raw(fresh_sim, "mock-ids").content
    ids = [line.split(b'"id":"')[1].split(b'"')[0] for line in body.split(b"\n") if b'"id"' in line]
    assert len(ids) > 5 and len(set(ids)) == len(ids)


def test_anthropic_pings_between_deltas(fresh_sim: Sim) -> None:
    body = _raw(fresh_sim, "anthropic", MESSAGE).content
    events = body.split(b"\n\n")
    pings = [i for i, event in enumerate(events) if event.startswith(b"event: ping")]
    assert len(pings) >= 2 and pings[1] > pings[0] + 1, "a ping after deltas, not only the head's"


def test_a_dying_anthropic_stream_sends_overloaded_on_its_200_and_ends_cleanly(
    fresh_sim: Sim,
) -> None:
    body = _raw(fresh_sim, "anthropic", MESSAGE, **{"X-Sim-Die-After": "6"}).content
    assert body.endswith(b"event: error\ndata: " + body.rsplit(b"data: ", 1)[1])
    assert b'"overloaded_error"' in body and b"message_stop" not in body
    assert fresh_sim.billed() == 0


def test_a_dying_openrouter_stream_sends_an_error_chunk_and_ends_cleanly(fresh_sim: Sim) -> None:
    body = _raw(fresh_sim, "openrouter", **{"X-Sim-Die-After": "4"}).content
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[1]
    assert b'"finish_reason":"error"' in last and b'"error":{"code":"server_error"' in last
    assert b"[DONE]" not in body and fresh_sim.billed() == 0


def test_variations_line_endings_last_blank_line_and_one_large_event(fresh_sim: Sim) -> None:
    body = _raw(fresh_sim, "openai,crlf,no-final-blank").content
    assert body.endswith(b"\r\n\r\ndata: [DONE]\r\n") and b"\n" not in body.replace(b"\r\n", b"")
    large = _raw(fresh_sim, "openai,event-bytes=1000000").content
    sizes = sorted(len(event) + 2 for event in large.split(b"\n\n"))  # with its blank line
    assert sizes[-1] >= 1_000_000 > sizes[-2]


def test_trickled_stream_is_the_same_bytes(fresh_sim: Sim) -> None:
    body = {**STREAM, "max_tokens": 4}
    plain = _raw(fresh_sim, "openai", body).content
    trickled = _raw(fresh_sim, "openai,trickle", body).content
    strip = [e.split(b'"id":')[0] for e in plain.split(b"\n\n")]
    assert [e.split(b'"id":')[0] for e in trickled.split(b"\n\n")] == strip


@pytest.mark.parametrize(
    "wire",
    ["x", "openai,nope", "openai,event-bytes=0", "openai,event-bytes=99999999999", "openai,crlf=1"],
)
def test_a_bad_wire_is_refused_before_any_work(fresh_sim: Sim, wire: str) -> None:
    response = httpx.post(
        fresh_sim.url + "/v1/chat/completions", json=STREAM, headers={"X-Sim-Wire": wire}
    )
    assert response.status_code == 400 and "X-Sim-Wire" in response.text
    assert fresh_sim.billed() == 0


def test_the_flag_refuses_a_bad_wire_in_one_line(start_sim: SimFactory) -> None:
    with pytest.raises(Exception) as failed:  # noqa: PT011 (start_sim's own error type)
        start_sim("--wire", "nosuch")
    assert "--wire: unknown profile 'nosuch'" in str(failed.value)


@pytest.mark.parametrize("wire", [*OPENAI_SHAPED, "sse-starlette,no-final-blank,trickle"])
def test_the_openai_sdk_reads_every_profile(fresh_sim: Sim, wire: str) -> None:
    client = openai.OpenAI(
        base_url=fresh_sim.url + "/v1",
        api_key="x",
        max_retries=0,
        default_headers={"X-Sim-Wire": wire, "X-Sim-Token-Ms": "0"},
    )
    with client:
        chunks = list(client.chat.completions.create(**STREAM))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = fresh_sim.chat().json()["choices"][0]["message"]["content"]
    assert text == plain


@pytest.mark.parametrize("wire", ["anthropic", "anthropic,crlf,no-final-blank"])
def test_the_anthropic_sdk_reads_its_profile(fresh_sim: Sim, wire: str) -> None:
    client = anthropic.Anthropic(
        base_url=fresh_sim.url,
        api_key="x",
        max_retries=0,
        default_headers={"X-Sim-Wire": wire, "X-Sim-Token-Ms": "0"},
    )
    body = {k: v for k, v in MESSAGE.items() if k != "stream"}
    with client, client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
    assert text and stream.get_final_message().usage.output_tokens > 0


@pytest.mark.parametrize(
    ("variation", "length"), [("content-length", True), ("close-delimited", False)]
)
def test_a_stream_body_delimited_by_length_or_by_the_connection_closing(
    fresh_sim: Sim, variation: str, length: bool
) -> None:
    host, port = fresh_sim.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json", "X-Sim-Wire": f"openai,{variation}"}
    connection.request("POST", "/v1/chat/completions", json.dumps(STREAM), headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status == 200 and response.getheader("Transfer-Encoding") is None
    assert (response.getheader("Content-Length") == str(len(body))) is length
    assert length or response.getheader("Connection") == "close"
    assert body.startswith(b"data: ") and body.endswith(b"data: [DONE]\n\n")
    assert fresh_sim.billed() == 1

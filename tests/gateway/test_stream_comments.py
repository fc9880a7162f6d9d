"""SSE comments from the upstream (keep-alives) on keyed streams, read by the official SDKs.

OpenRouter sends ``: OPENROUTER PROCESSING`` while a model thinks, sse-starlette
``: ping`` every 15 s. The gateway used to give every block an ``id:`` line,
comment-only blocks included; the openai SDK's decoder then dispatched an event
with empty data and raised ``JSONDecodeError`` (``json.loads("")``), on the first
call and on every replay. Once one block has carried an id, the SDK dispatches
at every blank line, so a comment keeps breaking it even unnumbered: comments
must be relayed without their blank line (issue 29, defect 5).

A real simulator (``X-Sim-Keep-Alive-Ms``: comments while the model thinks and
between slow tokens) and gateway; the SDKs as clients; the ledger says what was billed.
"""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from tests.gateway.conftest import AUTH, Sim
from tests.support.processes import Process
from tests.support.sse import decode, read_stream

# 300 ms to the first token and 120 ms between tokens, a comment every 50 ms of
# silence: comments before the first event and between every two tokens.
KEEP_ALIVES = {"X-Sim-Delay-Ms": "300", "X-Sim-Keep-Alive-Ms": "50", "X-Sim-Token-Ms": "120"}
COMMENT = b": OPENROUTER PROCESSING"
MESSAGES: Any = [{"role": "user", "content": "Tell me about keep-alives, briefly."}]


def _openai_text(base_url: str, key: str | None) -> str:
    headers = {**KEEP_ALIVES, **({"Idempotency-Key": key} if key else {})}
    with openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=8, stream=True, extra_headers=headers
        )
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def _anthropic_text(base_url: str, key: str | None) -> str:
    headers = {**KEEP_ALIVES, **({"Idempotency-Key": key} if key else {})}
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant", max_retries=0)
    with (
        client,
        client.messages.stream(
            model="claude-sonnet-4-20250514", max_tokens=8, messages=MESSAGES, extra_headers=headers
        ) as stream,
    ):
        return "".join(stream.text_stream)


def _choices(events: Any) -> list[object]:
    """What each event says, without the ids and times of its generation."""
    return [
        "[DONE]" if event.data == "[DONE]" else json.loads(event.data)["choices"]
        for event in events
    ]


def _wait_completed(gateway: Process, key: str, credential: dict[str, str]) -> None:
    url = f"{gateway.url}/_payonce/requests/{key}?wait=30"
    assert httpx.get(url, headers=credential, timeout=40).json()["state"] == "completed"


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_sdks_read_a_keyed_stream_with_keep_alive_comments_first_and_on_replay(
    gateway: Process, fresh_sim: Sim, sdk: str
) -> None:
    text = _openai_text if sdk == "openai" else _anthropic_text
    credential = {"Authorization": "Bearer sk-test"} if sdk == "openai" else {"x-api-key": "sk-ant"}
    reference = text(fresh_sim.url, None)
    fresh_sim.reset()
    key = f"keepalive-{sdk}-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # A second client of the same key follows the first one's live stream.
        first = pool.submit(text, gateway.url, key)
        follower = pool.submit(text, gateway.url, key)
        assert first.result() == reference
        assert follower.result() == reference
    _wait_completed(gateway, key, credential)
    assert text(gateway.url, key) == reference, "the replay, from the store"
    assert fresh_sim.billed() == 1


def test_comments_are_relayed_in_place_without_blank_lines_or_ids(
    gateway: Process, fresh_sim: Sim
) -> None:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    direct = read_stream(fresh_sim.url + "/v1/chat/completions", body, KEEP_ALIVES)
    assert direct.body.count(COMMENT) >= 5
    key = f"keepalive-raw-{uuid.uuid4()}"
    headers = {**AUTH, **KEEP_ALIVES, "Idempotency-Key": key}
    first = read_stream(gateway.url + "/v1/chat/completions", body, headers)
    _wait_completed(gateway, key, AUTH)
    replay = read_stream(gateway.url + "/v1/chat/completions", body, headers)
    assert replay.headers["idempotent-replayed"] == "true"
    for read in (first, replay):
        assert not read.broken
        assert read.body.count(COMMENT) == direct.body.count(COMMENT), "relayed, not dropped"
        assert COMMENT + b"\n\n" not in read.body and COMMENT + b"\nid:" not in read.body
        assert _choices(read.events) == _choices(direct.events)
    assert replay.body == first.body
    # The SDK's decoder, which dispatches at every blank line once an id was seen.
    events = list(openai._streaming.SSEDecoder().iter_bytes(iter([replay.body])))
    assert _choices(events) == _choices(decode(direct.body))
    assert fresh_sim.billed() == 2

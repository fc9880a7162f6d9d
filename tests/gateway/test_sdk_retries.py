"""SDK retries matched at the gateway without a key (gateway/sdk_retries.py).

The official openai and anthropic SDKs send ``x-stainless-retry-count`` on every
attempt. With a timeout shorter than the upstream's answer, an SDK with no key
billed three generations per call through payonce, as it does direct. Now its
retries join the first attempt's run: one bill. Two first attempts with the same
body stay two business requests. A real simulator and gateway, the real SDKs,
the simulator's ledger as the bill.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import orjson
import pytest

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim
from tests.support.exposition import metric
from tests.support.waiting import wait_until

SLOW = {"X-Sim-Delay-Ms": "2500"}
MESSAGE: dict[str, Any] = {
    "model": "claude-sonnet-4-0",
    "max_tokens": 32,
    "messages": [{"role": "user", "content": "Say hello"}],
}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _openai_call(url: str, **options: Any) -> str:
    with openai.OpenAI(
        base_url=url + "/v1", api_key="sk-sdk-retries", timeout=1.0, max_retries=2, **options
    ) as client:
        answer = client.chat.completions.create(**CHAT)
    return answer.choices[0].message.content or ""


def _anthropic_call(url: str, **options: Any) -> str:
    with anthropic.Anthropic(
        base_url=url, api_key="sk-ant-sdk-retries", timeout=1.0, max_retries=2, **options
    ) as client:
        message = client.messages.create(**MESSAGE)
    return "".join(block.text for block in message.content if block.type == "text")


CALLS = {"openai": _openai_call, "anthropic": _anthropic_call}


@pytest.mark.parametrize("sdk", CALLS)
def test_an_sdk_that_times_out_and_retries_without_a_key_is_billed_once(
    start_gateway: GatewayFactory, fresh_sim: Sim, sdk: str, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    gateway = start_gateway("--no-otel", "--call-log", str(calls))
    answer = CALLS[sdk](gateway.url, default_headers=SLOW)
    assert answer
    assert fresh_sim.billed() == 1, "the retries joined the first attempt's run"
    wait_until(
        lambda: any(line["status"] == 200 for line in _lines(calls)), "the answered attempt's line"
    )
    lines = _lines(calls)
    assert [line["sdk_match"] for line in lines].count("first") == 1
    answered = [
        line["outcome"] for line in lines if line["sdk_match"] == "retry" and line["status"] == 200
    ]
    assert answered in (["joined"], ["replayed"]), "the retry the SDK returned was matched"
    assert not any(line["unprotected_retry"] for line in lines)
    scraped = httpx.get(gateway.url + "/_payonce/metrics").text
    assert metric(scraped, "payonce_sdk_retries_matched_total") >= 1
    assert metric(scraped, "payonce_unprotected_retries_total") == 0


def test_without_matching_the_same_sdk_bills_every_attempt(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel", "--no-match-sdk-retries")
    with pytest.raises(openai.APITimeoutError):
        _openai_call(gateway.url, default_headers=SLOW)
    wait_until(lambda: fresh_sim.billed() == 3, "three attempts, three bills", timeout=15)


def test_two_first_attempts_with_one_body_are_two_business_requests(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    gateway = start_gateway("--no-otel", "--call-log", str(calls))
    headers = {**AUTH, **SLOW, "x-stainless-retry-count": "0"}
    statuses: list[int] = []

    def first_attempt() -> None:
        response = httpx.post(
            gateway.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=30
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=first_attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200, 200]
    assert fresh_sim.billed() == 2
    wait_until(lambda: len(_lines(calls)) == 2, "two call-log lines")
    assert sorted(line["sdk_match"] for line in _lines(calls)) == ["first", "on_its_own"]


def test_a_retry_after_its_first_attempt_completed_replays_its_answer(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    url = gateway.url + "/v1/chat/completions"
    first = httpx.post(url, json=CHAT, headers={**AUTH, "x-stainless-retry-count": "0"})
    retry = httpx.post(url, json=CHAT, headers={**AUTH, "x-stainless-retry-count": "1"})
    assert first.status_code == retry.status_code == 200
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == first.json()
    other = httpx.post(
        url, json={**CHAT, "max_tokens": 15}, headers={**AUTH, "x-stainless-retry-count": "1"}
    )
    assert other.headers.get("idempotent-replayed") != "true", "another body is another call"
    assert fresh_sim.billed() == 2


def _leave_after_two_events(url: str, headers: dict[str, str]) -> None:
    body = {**CHAT, "stream": True}
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        received = b""
        for piece in response.iter_raw():
            received += piece
            if received.count(b"\n\n") >= 2:
                return  # the SDK's read timeout: it hangs up


def test_an_sdk_stream_nobody_came_back_for_is_cancelled_after_the_grace(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    # 16 tokens a second apart: the stream outlasts the grace (10 s) by far.
    gateway = start_gateway("--no-otel")
    headers = {**AUTH, "x-stainless-retry-count": "0", "X-Sim-Token-Ms": "1000"}
    _leave_after_two_events(gateway.url, headers)
    time.sleep(3)
    assert "no retry came" not in gateway.output(), "kept for the SDK's backoff"
    wait_until(
        lambda: "no retry came for the SDK stream" in gateway.output(), "the cancel", timeout=20
    )
    # A retry after that runs the call again: its record was released.
    retry = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={**AUTH, "x-stainless-retry-count": "1", "X-Sim-Token-Ms": "0"},
        timeout=30,
    )
    assert retry.status_code == 200 and b"[DONE]" in retry.content
    assert retry.headers.get("idempotent-replayed") != "true"


def test_an_sdk_stream_whose_retry_came_back_in_time_is_read_to_its_end(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    headers = {**AUTH, "x-stainless-retry-count": "0", "X-Sim-Token-Ms": "100"}
    _leave_after_two_events(gateway.url, headers)
    time.sleep(1)  # the SDK's backoff
    retry = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={**headers, "x-stainless-retry-count": "1"},
        timeout=30,
    )
    assert retry.status_code == 200 and b"[DONE]" in retry.content
    # Requests, not bills: the stream the test before this one abandoned is still
    # paced by the simulator and billed at its end, which may fall in this test.
    assert fresh_sim.requests() == 1, "the retry joined the first attempt's stream"

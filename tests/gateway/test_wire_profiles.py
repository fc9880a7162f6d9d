"""Keyed streams through the gateway, from every upstream profile the simulator speaks.

The first answer (relayed while recorded) and its replay (from the store), read by
the official SDKs: the same text as a plain call, the replay the same bytes as the
first, one bill; the call log's upstream request id and usage the bill's; a resume
with ``Last-Event-ID`` the rest of the same run. Parametrized over ``payonce sim
--wire`` profiles and variations (docs/sim.md), because every shape the suite
never drove hid a defect (issue 29).
"""

from __future__ import annotations

import http.client
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import orjson
import pytest

from payonce.sim.profiles import PROFILES
from tests.gateway.conftest import AUTH, GatewayFactory, Sim, module_gateway
from tests.support.processes import Process
from tests.support.sse import read_stream
from tests.support.waiting import wait_until

STREAM: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "stream": True,
    "messages": [{"role": "user", "content": "twenty tokens. " * 5 + "hello"}],
}
MESSAGE: dict[str, Any] = {
    "model": "claude-sonnet-4-0",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "What is the capital of France? " * 4}],
}
WIRES = [
    *(name for name in PROFILES if name != "anthropic"),
    "openai,crlf",
    "openai,no-final-blank",
    "openrouter,crlf,no-final-blank",
    "sse-starlette,trickle",
    "openai,event-bytes=3000000",
    "openai,content-length",
    "openai,close-delimited",
    "sse-starlette,close-delimited,no-final-blank",
]


@pytest.fixture(scope="module")
def relay_gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One ``--no-otel`` gateway for the relay-and-replay tests of every profile: each
    uses its own key and reads every stream to its end (17 gateway starts were most
    of these tests' time). The tests that read metrics or a call log keep their own."""
    yield from module_gateway(sim, tmp_path_factory, "--no-otel")


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("wire", WIRES)
def test_a_keyed_stream_from_every_openai_shaped_profile_is_relayed_and_replayed(
    relay_gateway: Process, fresh_sim: Sim, wire: str
) -> None:
    gateway = relay_gateway
    key = f"wire-{uuid.uuid4()}"
    headers = {"X-Sim-Wire": wire, "X-Sim-Token-Ms": "0", "Idempotency-Key": key}
    raws, texts = [], []
    with openai.OpenAI(
        base_url=gateway.url + "/v1", api_key="sk-wire", max_retries=0, default_headers=headers
    ) as client:
        for _ in range(2):
            with client.chat.completions.with_streaming_response.create(**STREAM) as response:
                raws.append(response.http_response.read())
            texts.append(_text(list(client.chat.completions.create(**STREAM))))
    direct = httpx.post(fresh_sim.url + "/v1/chat/completions", json={**STREAM, "stream": False})
    expected = direct.json()["choices"][0]["message"]["content"]
    if "event-bytes" not in wire:
        assert texts == [expected, expected]
    assert raws[1] == raws[0], "the replay is the first answer, byte for byte"
    assert fresh_sim.billed() == 2, "one generation for the key, one for the direct call"


@pytest.mark.parametrize("wire", ["anthropic", "anthropic,crlf,no-final-blank"])
def test_a_keyed_anthropic_stream_is_relayed_and_replayed(
    relay_gateway: Process, fresh_sim: Sim, wire: str
) -> None:
    gateway = relay_gateway
    headers = {"X-Sim-Wire": wire, "X-Sim-Token-Ms": "0", "Idempotency-Key": str(uuid.uuid4())}
    texts = []
    with anthropic.Anthropic(
        base_url=gateway.url, api_key="sk-ant-wire", max_retries=0, default_headers=headers
    ) as client:
        for _ in range(2):
            with client.messages.stream(**MESSAGE) as stream:
                texts.append("".join(stream.text_stream))
    assert texts[0] and texts[1] == texts[0]
    assert fresh_sim.billed() == 1


@pytest.mark.parametrize(
    ("wire", "path", "body", "error"),
    [
        ("anthropic", "/v1/messages", {**MESSAGE, "stream": True}, b"overloaded_error"),
        ("openrouter", "/v1/chat/completions", STREAM, b'"finish_reason":"error"'),
    ],
)
def test_a_stream_that_failed_in_band_is_not_kept_as_the_answer(
    start_gateway: GatewayFactory,
    fresh_sim: Sim,
    wire: str,
    path: str,
    body: dict[str, Any],
    error: bytes,
) -> None:
    # The upstream sent its error as an event on a 200 and ended the body cleanly
    # (Anthropic's overloaded_error, OpenRouter's error chunk): nothing was
    # generated whole, nothing billed. The retry runs it again, and gets an answer.
    gateway = start_gateway("--no-otel")
    headers = {
        "X-Sim-Wire": wire,
        "X-Sim-Token-Ms": "0",
        "Idempotency-Key": str(uuid.uuid4()),
        "Authorization": "Bearer sk-inband",
        "x-api-key": "sk-ant-inband",
    }
    failed = httpx.post(
        gateway.url + path, json=body, headers={**headers, "X-Sim-Die-After": "5"}, timeout=30
    )
    assert failed.status_code == 200 and error in failed.content
    retried = httpx.post(gateway.url + path, json=body, headers=headers, timeout=30)
    assert retried.status_code == 200, retried.text
    assert error not in retried.content
    assert retried.headers["idempotent-replayed"] == "false"
    assert fresh_sim.billed() == 1
    # Said so in the metrics (a label this reason once lacked: the run's task died
    # with a KeyError, found by payonce torture).
    metrics = httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text
    assert 'payonce_unstored_responses_total{reason="upstream_error"} 1.0' in metrics
    assert "Traceback" not in gateway.output()


@pytest.mark.parametrize("key", [None, "keyed"])
def test_a_close_delimited_stream_cut_before_its_end_is_broken_not_whole(
    start_gateway: GatewayFactory, fresh_sim: Sim, key: str | None
) -> None:
    # Neither a length nor chunks: the body ends when the upstream's connection
    # does, so a provider that died after 5 events looked like a finished stream.
    # The gateway relayed it as whole, stored it, and replayed the cut answer to
    # every retry (found by payonce torture). A raw socket shows the framing.
    gateway = start_gateway("--no-otel")
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-cut",
        "X-Sim-Wire": "openai,close-delimited",
        "X-Sim-Token-Ms": "0",
    }
    if key is not None:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "POST", "/v1/chat/completions", orjson.dumps(STREAM), {**headers, "X-Sim-Die-After": "5"}
    )
    response = connection.getresponse()
    assert response.status == 200
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    connection.close()
    again = httpx.post(
        gateway.url + "/v1/chat/completions", content=orjson.dumps(STREAM), headers=headers
    )
    assert again.status_code == 200 and b"\ndata: [DONE]\n" in again.content
    assert again.headers.get("idempotent-replayed", "false") == "false"
    assert fresh_sim.billed() == 1, "the crashed generation was not billed; the retry was"


@pytest.mark.parametrize("wire", WIRES)
def test_every_profile_keeps_its_usage_and_request_id_and_resumes_one_run(
    start_gateway: GatewayFactory, fresh_sim: Sim, wire: str, tmp_path: Path
) -> None:
    """The call log's request id and usage are the bill's, and a client that left
    after three events resumes with ``Last-Event-ID`` to the same events a replay has."""
    calls = tmp_path / "calls.jsonl"
    gateway = start_gateway("--no-otel", "--call-log", str(calls))
    key = f"wire-{uuid.uuid4()}"
    url = gateway.url + "/v1/chat/completions"
    headers = {**AUTH, "X-Sim-Wire": wire, "X-Sim-Token-Ms": "1", "Idempotency-Key": key}
    first = read_stream(url, STREAM, headers, stop_after=3)
    assert first.status == 200
    status = f"{gateway.url}/_payonce/requests/{key}"
    wait_until(
        lambda: httpx.get(status, headers=AUTH).json().get("state") == "completed",
        "the key's run completed after its client left",
    )
    resumed = read_stream(url, STREAM, {**headers, "Last-Event-ID": first.last_event_id})
    replay = read_stream(url, STREAM, headers)
    assert resumed.status == replay.status == 200
    assert not resumed.broken and not replay.broken
    assert first.events + resumed.events == replay.events, "a resume continues its own run"
    assert replay.events[-1].data == "[DONE]"

    (entry,) = httpx.get(fresh_sim.url + "/_sim/ledger?entries=1").json()["entries"]
    wait_until(lambda: len(_lines(calls)) == 3, "three call-log lines")
    forwarded = [line for line in _lines(calls) if line["outcome"] == "forwarded"]
    assert [line["upstream_request_id"] for line in forwarded] == [entry["provider_request_id"]], (
        "the bill's request id, from the header or, without one, the body's id"
    )
    usage = (forwarded[0]["input_tokens"], forwarded[0]["output_tokens"])
    if PROFILES[wire.split(",")[0]].usage:
        assert usage == (entry["input_tokens"], entry["output_tokens"]), "the bill's tokens"
    else:  # the server sends no usage chunk: the line says so, and counts nothing
        assert usage == (None, None)
        assert forwarded[0]["usage_missing_reason"]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]

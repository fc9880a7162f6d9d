"""Whole answers larger than the upstream connection's read-ahead (256 KiB), end to end.

The upstream connection stops reading once 256 KiB of body wait to be taken
(flow control for a slow reader). A whole answer was taken only once complete,
so past 256 KiB both sides waited for each other until ``--upstream-timeout``:
the client got 504, the key was released, and every retry ran and billed again
(a 20-input ``text-embedding-3-large`` call, 701 KB; 64 ``text-embedding-3-small``
inputs, 1.1 MB, with the openai SDK: 504 and 3 bills).

A real simulator and gateway; the official openai SDK and urllib as clients;
the simulator's ledger says what was billed. ``--upstream-timeout 5s``: a hang
fails the test as a 504 rather than stalling it for ten minutes.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import pytest

from tests.gateway.conftest import GatewayFactory, Sim
from tests.support.processes import Process

openai = pytest.importorskip("openai")

AUTH = {"Authorization": "Bearer sk-large", "Content-Type": "application/json"}


@pytest.fixture
def stack(fresh_sim: Sim, start_gateway: GatewayFactory) -> tuple[Sim, Process]:
    return fresh_sim, start_gateway("--upstream-timeout", "5s", "--no-otel")


def _embeddings(url: str, body: dict[str, Any], key: str | None) -> tuple[int, bytes, str]:
    headers = dict(AUTH)
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(
        url + "/v1/embeddings", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.read(), response.headers.get("idempotent-replayed", "")


@pytest.mark.parametrize("key", [None, "keyed"])
def test_an_answer_of_700_kb_arrives_whole(stack: tuple[Sim, Process], key: str | None) -> None:
    sim, gateway = stack
    body = {"model": "text-embedding-3-large", "input": [f"text {n}" for n in range(20)]}
    direct = _embeddings(sim.url, body, None)[1]
    assert len(direct) > 600_000
    key = None if key is None else f"large-{uuid.uuid4()}"
    status, answer, replayed = _embeddings(gateway.url, body, key)
    assert status == 200 and replayed != "true"
    assert len(answer) == len(direct) and json.loads(answer)["data"][19]["index"] == 19
    if key is not None:
        status, again, replayed = _embeddings(gateway.url, body, key)
        assert (status, replayed, again) == (200, "true", answer)
    assert sim.billed() == 2  # the direct call, and one through the gateway


def test_the_openai_sdk_gets_1_mb_of_embeddings_billed_once(
    stack: tuple[Sim, Process],
) -> None:
    sim, gateway = stack
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-large", max_retries=2) as client:
        key = f"sdk-{uuid.uuid4()}"
        inputs = [f"input {n}" for n in range(64)]
        result = client.embeddings.create(
            model="text-embedding-3-small",
            input=inputs,
            encoding_format="float",
            extra_headers={"Idempotency-Key": key},
        )
        assert len(result.data) == 64 and len(result.data[63].embedding) == 1536
        again = client.embeddings.with_raw_response.create(
            model="text-embedding-3-small",
            input=inputs,
            encoding_format="float",
            extra_headers={"Idempotency-Key": key},
        )
        assert again.headers["idempotent-replayed"] == "true"
    assert sim.billed() == 1

"""Naming the business scenario from the application (issue 34): payonce.client.scenario()
on payonce's transports, payonce.auto.scenario() and payonce run --scenario on the SDKs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx2
import pytest

import payonce.client
from payonce.client import AsyncIdempotentTransport, IdempotentTransport

URL = "http://llm.test/v1/chat/completions"


def test_the_transport_sends_the_scenario_named_around_the_call() -> None:
    seen: list[str | None] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("x-payonce-scenario"))
        return httpx2.Response(200, json={})

    with httpx2.Client(transport=IdempotentTransport(httpx2.MockTransport(handler))) as client:
        client.post(URL, json={})
        with payonce.client.scenario("invoice-summary"):
            client.post(URL, json={})
            with payonce.client.scenario("refunds"):
                client.post(URL, json={})
            # A header the call sets itself wins.
            client.post(URL, json={}, headers={"X-Payonce-Scenario": "explicit"})
        client.post(URL, json={})
    assert seen == [None, "invoice-summary", "refunds", "explicit", None]
    with pytest.raises(ValueError, match="scenario"):
        payonce.client.scenario("two\nlines").__enter__()


def test_each_asyncio_task_names_its_own_scenario() -> None:
    seen: dict[str, str | None] = {}

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen[request.url.params["task"]] = request.headers.get("x-payonce-scenario")
        return httpx2.Response(200, json={})

    async def main() -> None:
        transport = AsyncIdempotentTransport(httpx2.MockTransport(handler))
        async with httpx2.AsyncClient(transport=transport) as client:

            async def one(task: str) -> None:
                with payonce.client.scenario(f"feature-{task}"):
                    await asyncio.sleep(0)
                    await client.post(URL, params={"task": task}, json={})

            await asyncio.gather(one("a"), one("b"))

    asyncio.run(main())
    assert seen == {"a": "feature-a", "b": "feature-b"}


# Importing payonce.auto patches the SDKs for the whole process: these run in a child.
CHILD = """
import httpx2, openai
import payonce.auto, payonce.client
seen = []

def handler(request):
    seen.append(request.headers.get("x-payonce-scenario"))
    return httpx2.Response(200, json={"object": "list", "data": []})

http = httpx2.Client(transport=httpx2.MockTransport(handler))
client = openai.OpenAI(base_url="http://llm.test/v1", api_key="sk-x", http_client=http)
client.models.list()
with payonce.auto.scenario("invoice-summary"):
    client.models.list()
    with payonce.client.scenario("one-variable"):  # the same variable as payonce.auto's
        client.models.list()
    client.models.list(extra_headers={"X-Payonce-Scenario": "explicit"})
print(seen)

from payonce.auto.launch import environment
from payonce.errors import ConfigError
env = environment({}, "http://gw", key_header="Idempotency-Key", base_urls=True,
                  scenario="nightly-batch")
print(env["PAYONCE_SCENARIO"])
try:
    environment({}, "http://gw", key_header="Idempotency-Key", base_urls=True, scenario=" ")
except ConfigError as exc:
    print(exc)
"""


def test_payonce_auto_and_payonce_run_name_the_scenario_of_sdk_calls() -> None:
    pytest.importorskip("openai")
    env = {**os.environ, "PAYONCE_SCENARIO": "whole-process"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(["whole-process", "invoice-summary", "one-variable", "explicit"])
    assert lines[1] == "nightly-batch"
    assert lines[2].startswith("--scenario:")

"""payonce in front of the LiteLLM proxy, which routes to ``payonce sim``.

client (openai SDK, retrying) -> payonce -> LiteLLM proxy 1.108.7 -> payonce sim

The simulator's ledger counts what the "provider" billed. With one idempotency
key per business request, the SDK's timed-out retries cost one generation
through both proxies, for chat, streams, embeddings and the Responses API. What
payonce cannot undo is a retry behind it: LiteLLM's own ``num_retries`` (or its
Router's default of 2 when nothing sets it) re-sends a timed-out call that the
provider goes on to bill, and payonce only ever saw one call. ``payonce lint``
reports exactly those deployments (PO503).

LiteLLM runs from its own virtualenv (``tests/support/litellm.py``), built by
the first run and reused after. Its ``forward_client_headers_to_llm_api`` passes
the callers' ``X-Sim-*`` headers on to the simulator.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from tests.support.litellm import MASTER_KEY, Installation, config_text, prepare, start_proxy
from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim

# The first test pays for starting the proxy (about 30 s), and for building
# LiteLLM's virtualenv (minutes, once) if nothing did before the tests
# (tests/support/prepare.py): pytest-timeout counts fixture setup.
pytestmark = [pytest.mark.litellm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]

DEPLOYMENTS: dict[str, dict[str, object]] = {
    # One retry layer: LiteLLM's off, the callers' SDKs keep theirs.
    "gpt-4o-mini": {"model": "openai/gpt-4o-mini", "num_retries": 0},
    "text-embedding-3-small": {"model": "openai/text-embedding-3-small", "num_retries": 0},
    # LiteLLM gives up after 1 s: with retries off, one generation per call...
    "gpt-4o-mini-impatient": {"model": "openai/gpt-4o-mini", "timeout": 1, "num_retries": 0},
    # ... and with its retries, one more generation per retry (PO503).
    "gpt-4o-mini-retrying": {"model": "openai/gpt-4o-mini", "timeout": 1, "num_retries": 1},
    # Nothing says num_retries: the Router's default, 2 (PO503).
    "gpt-4o-mini-defaulted": {"model": "openai/gpt-4o-mini", "timeout": 1},
}


@pytest.fixture(scope="module")
def installation() -> Installation:
    started = time.monotonic()
    found = prepare()
    print(
        f"\nLiteLLM virtualenv: {'built' if found.created else 'reused'} in {time.monotonic() - started:.1f} s"
    )
    return found


@pytest.fixture(scope="module")
def litellm_config(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("litellm") / "litellm.yaml"
    path.write_text(config_text(sim.url, DEPLOYMENTS))
    return path


@pytest.fixture(scope="module")
def litellm(installation: Installation, litellm_config: Path) -> Iterator[Process]:
    started = time.monotonic()
    proxy = start_proxy(installation, litellm_config, litellm_config.parent)
    print(f"LiteLLM proxy answering after {time.monotonic() - started:.1f} s")
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def call_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway") / "calls.jsonl"


@pytest.fixture(scope="module")
def gateway(litellm: Process, call_log: Path) -> Iterator[Process]:
    process = start_payonce(
        ["serve", "--upstream", litellm.url, "--store", "memory://", "--call-log", str(call_log)],
        log_dir=call_log.parent,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()


def client(gateway: Process, *, timeout: float, max_retries: int) -> openai.OpenAI:
    """The official SDK through payonce, with LiteLLM's master key as its API key."""
    sdk = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=MASTER_KEY, timeout=timeout, max_retries=max_retries
    )
    sdk._idempotency_header = "Idempotency-Key"  # its own per-call key, sent
    return sdk


def settled_ledger(sim: Sim, *, deadline: float = 30.0) -> list[dict[str, Any]]:
    """The ledger's entries once nothing is generating (abandoned calls still finish and bill)."""
    end = time.monotonic() + deadline
    while True:
        ledger = sim.ledger()
        if ledger["generating"] == 0 or time.monotonic() > end:
            return list(ledger["entries"])
        time.sleep(0.1)


def logged(call_log: Path, key: str, count: int, *, deadline: float = 10.0) -> list[dict[str, Any]]:
    """The call log's lines for ``key``, once there are at least ``count``."""
    end = time.monotonic() + deadline
    while True:
        lines = [json.loads(line) for line in call_log.read_text().splitlines()]
        mine = [line for line in lines if line["key"] == key]
        if len(mine) >= count or time.monotonic() > end:
            return mine
        time.sleep(0.05)


# -- One business request, one generation, through both proxies -----------------------

SLOW = {"X-Sim-Delay-Ms": "2500"}  # the generation outlasts the SDK's 1 s timeout


def _chat(sdk: openai.OpenAI, headers: dict[str, str]) -> Any:
    return sdk.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Summarise ticket 42 for the on-call engineer"}],
        extra_headers=headers,
    )


def _chat_stream(sdk: openai.OpenAI, headers: dict[str, str]) -> Any:
    return sdk.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Stream the summary of ticket 42, please"}],
        stream=True,
        extra_headers=headers,
    )


def _embeddings(sdk: openai.OpenAI, headers: dict[str, str]) -> Any:
    return sdk.embeddings.with_raw_response.create(
        model="text-embedding-3-small",
        input="ticket 42: the printer is on fire",
        extra_headers=headers,
    )


def _responses(sdk: openai.OpenAI, headers: dict[str, str]) -> Any:
    return sdk.responses.with_raw_response.create(
        model="gpt-4o-mini", input="Summarise ticket 42 (Responses API)", extra_headers=headers
    )


def _responses_stream(sdk: openai.OpenAI, headers: dict[str, str]) -> Any:
    return sdk.responses.with_raw_response.create(
        model="gpt-4o-mini",
        input="Stream the summary of ticket 42 (Responses API)",
        stream=True,
        extra_headers=headers,
    )


def _content(kind: str, parsed: Any) -> str:
    """What the caller got: the text (or the vector's length), read to the end."""
    if kind == "chat":
        return str(parsed.choices[0].message.content)
    if kind == "embeddings":
        return str(len(parsed.data[0].embedding))
    if kind == "responses":
        return str(parsed.output_text)
    events = list(parsed)
    if kind == "chat-stream":
        assert all(chunk.usage is None for chunk in events), "usage the caller did not ask for"
        return "".join(chunk.choices[0].delta.content or "" for chunk in events if chunk.choices)
    assert events[-1].type == "response.completed"
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


CALLS = {
    "chat": (_chat, "/v1/chat/completions"),
    "chat-stream": (_chat_stream, "/v1/chat/completions"),
    "embeddings": (_embeddings, "/v1/embeddings"),
    "responses": (_responses, "/v1/responses"),
    "responses-stream": (_responses_stream, "/v1/responses"),
}


@pytest.mark.parametrize("kind", list(CALLS))
def test_timed_out_sdk_retries_cost_one_generation_through_litellm(
    kind: str, gateway: Process, fresh_sim: Sim, call_log: Path
) -> None:
    call, endpoint = CALLS[kind]
    key = f"ticket-42-{kind}-{uuid.uuid4().hex[:8]}"
    headers = {"Idempotency-Key": key, **SLOW}
    # Every attempt but the last times out after 1 s; the retries join the call
    # payonce keeps running, or get its stored answer.
    impatient = client(gateway, timeout=1.0, max_retries=4)
    first: str | None = None
    # If every attempt was too early (a slow machine), the replay below still counts.
    with contextlib.suppress(openai.APITimeoutError):
        first = _content(kind, call(impatient, headers).parse())
    replay = call(client(gateway, timeout=30.0, max_retries=0), headers)
    again = _content(kind, replay.parse())
    assert replay.headers["idempotent-replayed"] == "true"
    assert first is None or first == again

    (entry,) = settled_ledger(fresh_sim)  # one generation billed, not one per attempt
    assert entry["endpoint"] == endpoint
    lines = logged(call_log, key, 3)
    assert len(lines) >= 3, lines  # the first attempt, a retry at least, the replay
    assert [line["outcome"] for line in lines].count("forwarded") == 1
    assert {line["outcome"] for line in lines} <= {"forwarded", "joined", "replayed"}
    (forwarded,) = [line for line in lines if line["outcome"] == "forwarded"]
    assert forwarded["upstream_attempts"] == 1
    assert forwarded["output_tokens"] == entry["output_tokens"]
    # LiteLLM answers without x-request-id: the simulator's id comes back as
    # request-id and llm_provider-x-request-id, and joins the call log to the bill.
    assert "x-request-id" not in replay.headers
    assert replay.headers["request-id"] == entry["provider_request_id"]
    assert replay.headers["llm_provider-x-request-id"] == entry["provider_request_id"]
    assert forwarded["upstream_request_id"] == entry["provider_request_id"]


def test_responses_ids_are_litellms_own(gateway: Process, fresh_sim: Sim) -> None:
    """LiteLLM rewrites a response's id (it encodes its deployment in it); the header keeps the provider's."""
    sdk = client(gateway, timeout=30.0, max_retries=0)
    key = f"resp-ids-{uuid.uuid4().hex[:8]}"
    raw = _responses(sdk, {"Idempotency-Key": key})
    body = raw.parse()
    (entry,) = settled_ledger(fresh_sim)
    assert entry["provider_request_id"].startswith("resp_")
    assert body.id.startswith("resp_")
    assert body.id != entry["provider_request_id"]
    assert raw.headers["request-id"] == entry["provider_request_id"]


def test_background_response_is_generated_once_and_polled_through_both(
    gateway: Process, fresh_sim: Sim
) -> None:
    sdk = client(gateway, timeout=30.0, max_retries=0)
    headers = {"Idempotency-Key": f"background-{uuid.uuid4().hex[:8]}", "X-Sim-Delay-Ms": "500"}
    created = sdk.responses.create(
        model="gpt-4o-mini",
        input="Summarise ticket 42 later",
        background=True,
        extra_headers=headers,
    )
    assert created.status == "queued"
    retried = sdk.responses.with_raw_response.create(
        model="gpt-4o-mini",
        input="Summarise ticket 42 later",
        background=True,
        extra_headers=headers,
    )
    assert retried.headers["idempotent-replayed"] == "true"
    deadline = time.monotonic() + 20
    while (polled := sdk.responses.retrieve(created.id)).status != "completed":
        assert time.monotonic() < deadline, polled.status
        time.sleep(0.2)
    assert polled.output_text
    (entry,) = settled_ledger(fresh_sim)
    assert entry["endpoint"] == "/v1/responses"
    assert entry["client_connected"] is False  # nobody waits on a background response


def test_without_a_key_the_sdks_retries_are_matched_to_one_generation(
    gateway: Process, fresh_sim: Sim
) -> None:
    """The same timed-out SDK retries, no key, through the same stack: payonce matches
    each retry (x-stainless-retry-count) to its first attempt's run. Without that
    (--no-match-sdk-retries, tests/gateway/test_sdk_retries.py) all three are billed."""
    sdk = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=MASTER_KEY, timeout=1.0, max_retries=2
    )  # _idempotency_header left unset, as the SDK ships
    answer = _chat(sdk, dict(SLOW))
    assert answer.http_response.status_code == 200
    assert len(settled_ledger(fresh_sim)) == 1


# -- A retry behind payonce: what PO503 is about ----------------------------------------


@pytest.mark.parametrize(
    ("deployment", "billed"),
    [("gpt-4o-mini-impatient", 1), ("gpt-4o-mini-retrying", 2), ("gpt-4o-mini-defaulted", 3)],
)
def test_litellm_retries_behind_payonce_bill_again(
    deployment: str, billed: int, gateway: Process, fresh_sim: Sim, call_log: Path
) -> None:
    """LiteLLM times out after 1 s on a 2 s generation and re-sends it: payonce sees one call."""
    sdk = client(gateway, timeout=60.0, max_retries=0)
    key = f"behind-{deployment}-{uuid.uuid4().hex[:8]}"
    with pytest.raises(openai.APIStatusError) as raised:
        sdk.chat.completions.create(
            model=deployment,
            messages=[{"role": "user", "content": "Summarise ticket 42"}],
            extra_headers={"Idempotency-Key": key, "X-Sim-Delay-Ms": "2000"},
        )
    assert raised.value.status_code == 408  # LiteLLM's timeout, after its retries
    entries = settled_ledger(fresh_sim)
    assert len(entries) == billed  # one key, one call from payonce, `billed` generations
    assert all(entry["client_connected"] is False for entry in entries)
    (line,) = logged(call_log, key, 1)
    assert (line["outcome"], line["status"], line["upstream_attempts"]) == ("forwarded", 408, 1)
    # A 408 releases the key: the caller's own retry would run, and bill, all over again.
    status = httpx.get(
        f"{gateway.url}/_payonce/requests/{key}",
        headers={"Authorization": f"Bearer {MASTER_KEY}"},
        timeout=10,
    )
    assert status.status_code == 404


def _lint(path: Path) -> tuple[int, list[tuple[int, str]]]:
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "lint", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(done.stdout)["findings"]
    return done.returncode, sorted((finding["line"], finding["code"]) for finding in findings)


def test_payonce_lint_reports_the_deployments_that_billed_twice(litellm_config: Path) -> None:
    lines = litellm_config.read_text().splitlines()

    def line_of(deployment: str, key: str) -> int:
        start = lines.index(f"  - model_name: {deployment}")
        return next(n for n, text in enumerate(lines[start:], start + 1) if f"{key}:" in text)

    code, found = _lint(litellm_config)
    assert code == 1
    assert found == sorted(
        [
            (line_of("gpt-4o-mini-retrying", "num_retries"), "PO503"),
            (1, "PO503"),  # model_list: gpt-4o-mini-defaulted gets the Router's default
            *[
                (line_of(name, "timeout"), "PO301")
                for name in (
                    "gpt-4o-mini-impatient",
                    "gpt-4o-mini-retrying",
                    "gpt-4o-mini-defaulted",
                )
            ],
        ]
    )


def test_the_litellm_config_in_the_docs_lints_clean(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "upstreams.md").read_text()
    (block,) = re.findall(
        r"<!-- linted by tests/upstreams/test_litellm.py -->\n```yaml\n(.*?)```", text, re.S
    )
    path = tmp_path / "litellm.yaml"
    path.write_text(block)
    assert _lint(path) == (0, [])

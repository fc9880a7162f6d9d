"""The providers' admin usage and cost reports, served by a real ``payonce sim`` from its ledger."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx2 as httpx
import pytest

from tests.support.sim import Sim

OPENAI_KEYS = ("sk-test-alpha-0123456789", "sk-test-bravo-9876543210")
ANTHROPIC_KEYS = ("sk-ant-test-charlie-0123", "sk-ant-test-delta-45678")
OPENAI_ADMIN = {"Authorization": "Bearer sk-admin-test-echo"}
ANTHROPIC_ADMIN = {"x-api-key": "sk-ant-admin01-test-foxtrot", "anthropic-version": "2023-06-01"}
SECRETS = (*OPENAI_KEYS, *ANTHROPIC_KEYS, "sk-admin-test-echo", "sk-ant-admin01-test-foxtrot")

USAGE = "/v1/organization/usage/completions"
COSTS = "/v1/organization/costs"
MESSAGES = "/v1/organizations/usage_report/messages"
COST_REPORT = "/v1/organizations/cost_report"


def chat(sim: Sim, key: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there friend"}]}
    headers = {"Authorization": f"Bearer {key}"}
    assert sim.post("/v1/chat/completions", body, headers=headers).status_code == 200


def message(sim: Sim, key: str, model: str) -> None:
    body = {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi you"}]}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    assert sim.post("/v1/messages", body, headers=headers).status_code == 200


@pytest.fixture(scope="module")
def billed(sim: Sim) -> Iterator[tuple[Sim, dict[str, Any]]]:
    """Three OpenAI chats, one embedding and three Anthropic messages; two keys for each."""
    sim.reset()
    chat(sim, OPENAI_KEYS[0], "gpt-4o")
    chat(sim, OPENAI_KEYS[0], "gpt-4o-mini")
    chat(sim, OPENAI_KEYS[1], "gpt-4o")
    embedding = {"model": "text-embedding-3-small", "input": "some words to embed"}
    headers = {"Authorization": f"Bearer {OPENAI_KEYS[1]}"}
    assert sim.post("/v1/embeddings", embedding, headers=headers).status_code == 200
    message(sim, ANTHROPIC_KEYS[0], "claude-3-5-haiku-latest")
    message(sim, ANTHROPIC_KEYS[0], "claude-sonnet-4-0")
    message(sim, ANTHROPIC_KEYS[1], "claude-sonnet-4-0")
    yield sim, sim.ledger()
    sim.reset()


def get(sim: Sim, path: str, params: Any, headers: dict[str, str]) -> dict[str, Any]:
    response = httpx.get(sim.url + path, params=params, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    for secret in SECRETS:
        assert secret not in response.text
    return dict(response.json())


def pages(sim: Sim, path: str, params: dict[str, Any], headers: dict[str, str]) -> list[Any]:
    """Every bucket, following ``next_page`` until ``has_more`` is false."""
    buckets: list[Any] = []
    page: str | None = None
    for _ in range(100):
        document = get(sim, path, {**params, **({"page": page} if page else {})}, headers)
        buckets.extend(document["data"])
        if not document["has_more"]:
            assert document["next_page"] is None
            return buckets
        page = document["next_page"]
        assert isinstance(page, str) and page.startswith("page_")
    raise AssertionError("pagination never ended")


def entries(ledger: dict[str, Any], *endpoints: str) -> list[dict[str, Any]]:
    return [e for e in ledger["entries"] if e["endpoint"] in endpoints]


def results(buckets: list[Any]) -> list[dict[str, Any]]:
    return [result for bucket in buckets for result in bucket["results"]]


def rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


CHATS = ("/v1/chat/completions", "/v1/completions")


def test_ledger_entries_carry_ids_from_the_credential_never_the_credential(
    billed: tuple[Sim, dict[str, Any]],
) -> None:
    _, ledger = billed
    text = json.dumps(ledger)
    for secret in SECRETS:
        assert secret not in text
    openai = entries(ledger, *CHATS)
    assert openai[0]["api_key_id"] == openai[1]["api_key_id"] != openai[2]["api_key_id"]
    assert openai[0]["api_key_id"].startswith("key_")
    assert openai[0]["project_id"].startswith("proj_")
    anthropic = entries(ledger, "/v1/messages")
    assert anthropic[0]["api_key_id"] == anthropic[1]["api_key_id"] != anthropic[2]["api_key_id"]
    assert anthropic[0]["api_key_id"].startswith("apikey_")
    assert anthropic[0]["project_id"].startswith("wrkspc_")


def test_openai_usage_day_buckets_total_the_ledger(billed: tuple[Sim, dict[str, Any]]) -> None:
    sim, ledger = billed
    start = int(time.time()) - 3 * 86400
    buckets = pages(sim, USAGE, {"start_time": start}, OPENAI_ADMIN)
    assert len(buckets) >= 4  # every day in range, empty ones included
    for bucket, following in itertools.pairwise(buckets):
        assert bucket["object"] == "bucket"
        assert bucket["end_time"] - bucket["start_time"] == 86400
        assert bucket["start_time"] % 86400 == 0
        assert following["start_time"] == bucket["end_time"]
    assert any(bucket["results"] == [] for bucket in buckets)
    chats = entries(ledger, *CHATS)
    found = results(buckets)
    assert sum(r["input_tokens"] for r in found) == sum(e["input_tokens"] for e in chats)
    assert sum(r["output_tokens"] for r in found) == sum(e["output_tokens"] for e in chats)
    assert sum(r["num_model_requests"] for r in found) == len(chats) == 3
    result = found[0]
    assert result["object"] == "organization.usage.completions.result"
    assert result["input_cached_tokens"] == result["input_audio_tokens"] == 0
    for dimension in ("project_id", "user_id", "api_key_id", "model", "batch", "service_tier"):
        assert result[dimension] is None  # not grouped by


def test_openai_usage_group_by_and_filters(billed: tuple[Sim, dict[str, Any]]) -> None:
    sim, ledger = billed
    chats = entries(ledger, *CHATS)
    start = int(time.time()) - 86400
    grouped = results(
        pages(sim, USAGE, {"start_time": start, "group_by": "api_key_id,model"}, OPENAI_ADMIN)
    )
    assert sorted(
        (r["api_key_id"], r["model"], r["num_model_requests"]) for r in grouped
    ) == sorted((e["api_key_id"], e["model"], 1) for e in chats)
    assert all(r["project_id"] is None for r in grouped)
    repeated = {"start_time": start, "group_by": ["project_id", "model"]}  # group_by=..&group_by=..
    by_project = results(pages(sim, USAGE, repeated, OPENAI_ADMIN))
    assert {r["project_id"] for r in by_project} == {e["project_id"] for e in chats}

    alpha = chats[0]["api_key_id"]
    only_alpha = results(
        pages(sim, USAGE, {"start_time": start, "api_key_ids": alpha}, OPENAI_ADMIN)
    )
    assert sum(r["num_model_requests"] for r in only_alpha) == 2
    mini = results(pages(sim, USAGE, {"start_time": start, "models": "gpt-4o-mini"}, OPENAI_ADMIN))
    assert sum(r["num_model_requests"] for r in mini) == 1
    other = results(pages(sim, USAGE, {"start_time": start, "project_ids": "proj_x"}, OPENAI_ADMIN))
    assert other == []


@pytest.mark.parametrize(("width", "seconds"), [("1m", 60), ("1h", 3600)])
def test_openai_usage_small_buckets_paginate(
    billed: tuple[Sim, dict[str, Any]], width: str, seconds: int
) -> None:
    sim, ledger = billed
    start = int(time.time()) - 10 * seconds
    params = {"start_time": start, "bucket_width": width, "limit": 3}
    first = get(sim, USAGE, params, OPENAI_ADMIN)
    assert len(first["data"]) == 3 and first["has_more"]
    buckets = pages(sim, USAGE, params, OPENAI_ADMIN)
    assert len(buckets) in (11, 12)
    assert all(b["end_time"] - b["start_time"] == seconds for b in buckets)
    assert [b["start_time"] for b in buckets] == sorted({b["start_time"] for b in buckets})
    found = results(buckets)
    assert sum(r["num_model_requests"] for r in found) == 3
    chats = entries(ledger, *CHATS)
    assert sum(r["output_tokens"] for r in found) == sum(e["output_tokens"] for e in chats)


def test_openai_costs_total_and_line_items(billed: tuple[Sim, dict[str, Any]]) -> None:
    sim, ledger = billed
    openai = [e for e in ledger["entries"] if e["endpoint"] != "/v1/messages"]
    start = int(time.time()) - 86400
    found = results(pages(sim, COSTS, {"start_time": start}, OPENAI_ADMIN))
    assert found[0]["object"] == "organization.costs.result"
    assert found[0]["amount"]["currency"] == "usd"
    assert (found[0]["line_item"], found[0]["project_id"]) == (None, None)
    total = sum(r["amount"]["value"] for r in found)
    assert total == pytest.approx(sum(e["cost_usd"] for e in openai))
    params = {"start_time": start, "group_by": ["line_item", "project_id"]}
    items = results(pages(sim, COSTS, params, OPENAI_ADMIN))
    assert {r["line_item"] for r in items} >= {"gpt-4o, input", "gpt-4o, output"}
    assert {r["project_id"] for r in items} == {e["project_id"] for e in openai}
    assert sum(r["amount"]["value"] for r in items) == pytest.approx(total)
    project = openai[0]["project_id"]
    only = results(pages(sim, COSTS, {"start_time": start, "project_ids": project}, OPENAI_ADMIN))
    assert sum(r["amount"]["value"] for r in only) == pytest.approx(
        sum(e["cost_usd"] for e in openai if e["project_id"] == project)
    )


def test_anthropic_usage_report(billed: tuple[Sim, dict[str, Any]]) -> None:
    sim, ledger = billed
    messages = entries(ledger, "/v1/messages")
    start = rfc3339(time.time() - 2 * 86400)
    buckets = pages(sim, MESSAGES, {"starting_at": start}, ANTHROPIC_ADMIN)
    assert "object" not in get(sim, MESSAGES, {"starting_at": start}, ANTHROPIC_ADMIN)
    assert all(b["starting_at"].endswith("T00:00:00Z") for b in buckets)
    found = results(buckets)
    assert sum(r["uncached_input_tokens"] for r in found) == sum(
        e["input_tokens"] for e in messages
    )
    assert sum(r["output_tokens"] for r in found) == sum(e["output_tokens"] for e in messages)
    assert "num_model_requests" not in found[0]
    assert found[0]["cache_creation"] == {
        "ephemeral_1h_input_tokens": 0,
        "ephemeral_5m_input_tokens": 0,
    }
    assert found[0]["api_key_id"] is None

    params = {"starting_at": start, "group_by[]": ["api_key_id", "model"]}
    grouped = results(pages(sim, MESSAGES, params, ANTHROPIC_ADMIN))
    assert sorted((r["api_key_id"], r["model"]) for r in grouped) == sorted(
        (e["api_key_id"], e["model"]) for e in messages
    )
    workspace = messages[2]["project_id"]
    params = {"starting_at": start, "workspace_ids[]": workspace, "group_by[]": "workspace_id"}
    only = results(pages(sim, MESSAGES, params, ANTHROPIC_ADMIN))
    assert [r["workspace_id"] for r in only] == [workspace]
    assert only[0]["output_tokens"] == messages[2]["output_tokens"]

    minutes = {"starting_at": rfc3339(time.time() - 600), "bucket_width": "1m", "limit": 4}
    small = pages(sim, MESSAGES, minutes, ANTHROPIC_ADMIN)
    assert len(small) in (11, 12)
    assert sum(r["output_tokens"] for r in results(small)) == sum(
        e["output_tokens"] for e in messages
    )


def test_anthropic_cost_report_in_cents(billed: tuple[Sim, dict[str, Any]]) -> None:
    sim, ledger = billed
    messages = entries(ledger, "/v1/messages")
    start = rfc3339(time.time() - 86400)
    found = results(pages(sim, COST_REPORT, {"starting_at": start}, ANTHROPIC_ADMIN))
    assert all(r["currency"] == "USD" and isinstance(r["amount"], str) for r in found)
    assert all(r["description"] is None and r["workspace_id"] is None for r in found)
    cents = sum(Decimal(r["amount"]) for r in found)
    assert float(cents / 100) == pytest.approx(sum(e["cost_usd"] for e in messages))
    params = {"starting_at": start, "group_by[]": ["workspace_id", "description"]}
    lines = results(pages(sim, COST_REPORT, params, ANTHROPIC_ADMIN))
    assert "claude-sonnet-4-0 Usage - Output Tokens" in {r["description"] for r in lines}
    assert {r["token_type"] for r in lines} == {"uncached_input_tokens", "output_tokens"}
    assert {r["workspace_id"] for r in lines} == {e["project_id"] for e in messages}
    assert sum(Decimal(r["amount"]) for r in lines) == pytest.approx(cents)


@pytest.mark.parametrize(
    ("path", "params", "headers"),
    [
        (USAGE, {"start_time": 0}, {}),
        (USAGE, {"start_time": 0}, {"Authorization": f"Bearer {OPENAI_KEYS[0]}"}),
        (COSTS, {"start_time": 0}, {"Authorization": "sk-admin-no-bearer"}),
        (MESSAGES, {"starting_at": "2026-01-01T00:00:00Z"}, {"anthropic-version": "2023-06-01"}),
        (COST_REPORT, {"starting_at": "2026-01-01T00:00:00Z"}, OPENAI_ADMIN),
        (
            COST_REPORT,
            {"starting_at": "2026-01-01T00:00:00Z"},
            {"x-api-key": ANTHROPIC_KEYS[0], "anthropic-version": "2023-06-01"},
        ),
    ],
)
def test_401_without_an_admin_key(
    sim: Sim, path: str, params: dict[str, Any], headers: dict[str, str]
) -> None:
    response = httpx.get(sim.url + path, params=params, headers=headers, timeout=10)
    assert response.status_code == 401
    for secret in SECRETS:
        assert secret not in response.text
    body = response.json()
    if path.startswith("/v1/organizations/"):
        assert body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("path", "params", "headers"),
    [
        (USAGE, {}, OPENAI_ADMIN),
        (USAGE, {"start_time": "yesterday"}, OPENAI_ADMIN),
        (USAGE, {"start_time": 0, "bucket_width": "1w"}, OPENAI_ADMIN),
        (USAGE, {"start_time": 0, "group_by": "colour"}, OPENAI_ADMIN),
        (USAGE, {"start_time": 0, "limit": 32}, OPENAI_ADMIN),
        (USAGE, {"start_time": 0, "page": "nonsense"}, OPENAI_ADMIN),
        (COSTS, {"start_time": 0, "bucket_width": "1h"}, OPENAI_ADMIN),
        (MESSAGES, {"starting_at": "noon"}, ANTHROPIC_ADMIN),
        (MESSAGES, {"starting_at": "2026-01-01T00:00:00Z"}, {"x-api-key": "sk-ant-admin-x"}),
        (COST_REPORT, {"starting_at": "2026-01-01T00:00:00Z", "limit": 32}, ANTHROPIC_ADMIN),
    ],
)
def test_400_for_a_query_the_provider_would_refuse(
    sim: Sim, path: str, params: dict[str, Any], headers: dict[str, str]
) -> None:
    response = httpx.get(sim.url + path, params=params, headers=headers, timeout=10)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert ("type" in body) == path.startswith("/v1/organizations/")  # Anthropic's shape

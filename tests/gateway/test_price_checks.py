"""A provider's stated cost, end to end: the simulator's openrouter profile states each
call's cost in its usage (``usage.cost``), the gateway prices the call by it and logs
its list price beside it (issue 34).

Through a real simulator and gateway: whole answers and streams, keyed (recorded),
replayed and unkeyed (passed through), OpenAI's and Anthropic's shapes.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from tests.gateway.conftest import AUTH, GatewayFactory, Sim

OPENROUTER = {"X-Sim-Wire": "openrouter", "X-Sim-Token-Ms": "0"}
CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "what did it cost"}],
    "max_tokens": 20,
}
MESSAGE = {
    "model": "claude-sonnet-4-5-20250929",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "what did it cost"}],
}
# The list price the gateway is given for gpt-4o-mini: twice what the simulator bills,
# so a stated cost and its list price differ.
PRICES = '[models."gpt-4o-mini"]\ninput = 0.30\noutput = 1.20\n'


def _post(url: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    response = httpx.post(
        url + path, json=body, headers={**AUTH, "x-api-key": "sk-x", **headers}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response


def test_a_stated_cost_prices_the_call_and_its_list_price_is_logged_beside_it(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    log_path = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log_path), "--prices", str(prices))
    url, run = gateway.url, uuid.uuid4().hex[:8]
    key = {"Idempotency-Key": f"whole-{run}"}
    _post(url, "/v1/chat/completions", CHAT, **OPENROUTER, **key)
    _post(url, "/v1/chat/completions", CHAT, **OPENROUTER, **key)  # replayed
    _post(
        url,
        "/v1/chat/completions",
        {**CHAT, "stream": True},
        **OPENROUTER,
        **{"Idempotency-Key": f"stream-{run}"},
    )
    _post(url, "/v1/messages", MESSAGE, **OPENROUTER)  # unkeyed: passed through
    _post(
        url,
        "/v1/messages",
        {**MESSAGE, "stream": True},
        **OPENROUTER,
        **{"Idempotency-Key": f"message-{run}"},
    )
    _post(url, "/v1/chat/completions", CHAT, **{"X-Sim-Token-Ms": "0"})  # no stated cost
    billed = {entry["provider_request_id"]: entry for entry in fresh_sim.ledger()["entries"]}
    gateway.stop()  # flushes the call log
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [line["outcome"] for line in lines] == [
        "forwarded", "replayed", "forwarded", "passthrough", "forwarded", "passthrough"
    ]  # fmt: skip
    forwarded = [line for line in lines if line["outcome"] != "replayed"]
    stated, plain = forwarded[:4], forwarded[4]
    for line in stated:
        entry = billed[line["upstream_request_id"]]
        assert line["price_source"] == "provider", line
        assert line["cost_usd"] == pytest.approx(entry["cost_usd"], abs=1e-9), line
        assert entry["cost_usd"] > 0
    whole, stream, message, message_stream = stated
    assert stream["stream"] and message_stream["stream"]
    # gpt-4o-mini's list price is the --prices file's, twice what was billed.
    for line in (whole, stream):
        tokens = line["input_tokens"] * 0.30 + line["output_tokens"] * 1.20
        assert line["list_cost_usd"] == pytest.approx(tokens / 1e6)
        assert line["list_cost_usd"] == pytest.approx(2 * line["cost_usd"], rel=1e-3)
    # claude-sonnet-4-5's, from genai-prices: $3 / $15 per million, as the simulator bills.
    for line in (message, message_stream):
        tokens = line["input_tokens"] * 3 + line["output_tokens"] * 15
        assert line["list_cost_usd"] == pytest.approx(tokens / 1e6)
        assert line["list_cost_usd"] == pytest.approx(line["cost_usd"], abs=1e-9)
    # A replay costs nothing and saved what was stated; no list price of its own.
    replay = lines[1]
    assert replay["cost_usd"] == 0 and replay["saved_usd"] == pytest.approx(whole["cost_usd"])
    assert replay["list_cost_usd"] is None
    # Without a stated cost the list price is the cost, and not repeated beside it.
    assert plain["price_source"] == "prices-file" and plain["list_cost_usd"] is None
    tokens = plain["input_tokens"] * 0.30 + plain["output_tokens"] * 1.20
    assert plain["cost_usd"] == pytest.approx(tokens / 1e6)

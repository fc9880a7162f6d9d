"""Cost per call, the call log and the metrics, after scripted scenarios against real processes."""

from __future__ import annotations

import concurrent.futures
import re
import time
import urllib.request
import uuid
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from payonce.observe.pricing import USUAL_MODELS, priced_name
from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim, chat
from tests.support.exposition import metric
from tests.support.waiting import settled_record

NO_PACING = {"X-Sim-Token-Ms": "0"}


def call_log(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_a_scripted_scenario_is_counted_exactly(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "calls.jsonl"
    # Without matching, an SDK's retry without a key is an unprotected one
    # (test_sdk_retries.py counts the matched kind).
    gateway = start_gateway("--call-log", str(log_path), "--no-match-sdk-retries")
    first = chat(gateway.url, "obs-a")  # forwarded
    chat(gateway.url, "obs-a")  # replayed
    chat(gateway.url, "obs-a")  # replayed
    assert chat(gateway.url, "obs-a", body={**CHAT, "max_tokens": 3}).status_code == 422  # mismatch
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # 1 forwarded + 2 joined
        list(
            pool.map(
                lambda _: chat(gateway.url, "obs-b", headers={"X-Sim-Delay-Ms": "1500"}), range(3)
            )
        )
    chat(gateway.url)  # passthrough
    chat(gateway.url, headers={"x-stainless-retry-count": "1"})  # passthrough, an unprotected retry
    assert chat(gateway.url, "bad key").status_code == 400  # rejected
    text = httpx.get(gateway.url + "/_payonce/metrics").text
    counts = {
        outcome: metric(text, "payonce_requests_total", outcome=outcome, status_class=cls)
        for outcome, cls in [("forwarded", "2xx"), ("replayed", "2xx"), ("joined", "2xx"),
                             ("mismatch", "4xx"), ("passthrough", "2xx"), ("rejected", "4xx")]
    }  # fmt: skip
    assert counts == {
        "forwarded": 2,
        "replayed": 2,
        "joined": 2,
        "mismatch": 1,
        "passthrough": 2,
        "rejected": 1,
    }
    assert metric(text, "payonce_duplicates_prevented_total", kind="replayed") == 2
    assert metric(text, "payonce_duplicates_prevented_total", kind="joined") == 2
    assert metric(text, "payonce_unprotected_retries_total") == 1
    assert metric(text, "payonce_upstream_calls_total", status="200") == 4
    ledger = fresh_sim.ledger()
    assert ledger["billed"] == 4
    spent = metric(text, "payonce_cost_usd_total", model="gpt-4o-mini")
    assert spent == pytest.approx(ledger["cost_usd"])
    saved = metric(text, "payonce_saved_cost_usd_total", model="gpt-4o-mini")
    assert saved == pytest.approx(4 * ledger["entries"][0]["cost_usd"])
    assert float(first.headers["x-payonce-cost-usd"]) == pytest.approx(
        ledger["entries"][0]["cost_usd"]
    )
    assert metric(text, "payonce_upstream_latency_seconds_count") == 4
    assert metric(text, "payonce_in_flight_requests") == 0

    gateway.stop()  # a graceful stop flushes the call log
    lines = call_log(log_path)
    outcomes = sorted(str(line["outcome"]) for line in lines)
    assert outcomes == sorted(
        ["forwarded", "replayed", "replayed", "mismatch", "forwarded", "joined", "joined",
         "passthrough", "passthrough", "rejected"]
    )  # fmt: skip
    assert all(line["v"] == 2 and line["tenant"] and "Bearer" not in str(line) for line in lines)
    assert len({line["request_id"] for line in lines}) == len(lines)
    billed_ids = {entry["provider_request_id"] for entry in ledger["entries"]}
    forwarded = [line for line in lines if line["outcome"] in ("forwarded", "passthrough")]
    assert {line["upstream_request_id"] for line in forwarded} == billed_ids
    assert all(line["upstream_attempts"] == 1 and line["cost_usd"] for line in forwarded)
    for line in lines:
        if line["outcome"] in ("replayed", "joined"):
            assert line["upstream_attempts"] == 0 and line["cost_usd"] == 0
            assert line["saved_usd"] == pytest.approx(ledger["entries"][0]["cost_usd"])
            assert line["upstream_request_id"] in billed_ids
    retries = [line for line in lines if line["unprotected_retry"]]
    assert len(retries) == 1 and retries[0]["client_retry"] == 1
    assert all(line["model"] == "gpt-4o-mini" for line in lines if line["outcome"] != "rejected")


CASES = [
    (
        "/v1/chat/completions",
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "price me"}],
            "max_tokens": 40,
        },
    ),
    (
        "/v1/completions",
        {"model": "gpt-3.5-turbo-instruct", "prompt": "price me please", "max_tokens": 30},
    ),
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "price me"}),
    (
        "/v1/messages",
        {
            "model": "claude-sonnet-4-20250514",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "price me"}],
        },
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "stream"),
    # Every case streamed and not, except embeddings, which do not stream.
    [(path, body, False) for path, body in CASES]
    + [(path, body, True) for path, body in CASES if path != "/v1/embeddings"],
)
def test_known_token_counts_give_exactly_the_expected_cost(
    start_gateway: GatewayFactory, fresh_sim: Sim, path: str, body: dict[str, object], stream: bool
) -> None:
    gateway = start_gateway(store="memory://")
    key = f"cost-{uuid.uuid4()}"
    sent = {**body, "stream": True} if stream else body
    headers = {**AUTH, **NO_PACING, "Idempotency-Key": key, "x-api-key": "sk-x"}
    with httpx.stream(
        "POST", gateway.url + path, json=sent, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        response.read()
    doc = settled_record(gateway.url, key, headers)
    entry = fresh_sim.ledger()["entries"][0]
    assert doc["usage"]["input_tokens"] == entry["input_tokens"]
    assert doc["usage"]["output_tokens"] == entry["output_tokens"]
    assert doc["cost_usd"] == pytest.approx(entry["cost_usd"], rel=1e-9)


def test_metrics_can_require_a_token(start_gateway: GatewayFactory) -> None:
    gateway = start_gateway("--metrics-token", "s3cret")
    assert httpx.get(gateway.url + "/_payonce/metrics").status_code == 401
    ok = httpx.get(gateway.url + "/_payonce/metrics", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and "payonce_requests_total" in ok.text


def test_the_call_log_rotates_by_size(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "rot.jsonl"
    gateway = start_gateway(
        "--call-log", str(log_path), "--call-log-max-bytes", "2KB", "--call-log-backups", "2"
    )
    for _ in range(4):  # ~11 KB in four or more flushes: at least three rotations
        for _ in range(5):
            chat(gateway.url)
        time.sleep(1.3)  # the call log is flushed once a second
    gateway.stop()
    files = sorted(p.name for p in tmp_path.glob("rot.jsonl*"))
    assert files == ["rot.jsonl", "rot.jsonl.1", "rot.jsonl.2"], "two backups kept, no more"
    for path in tmp_path.glob("rot.jsonl*"):
        assert all(orjson.loads(line)["outcome"] for line in path.read_bytes().splitlines())


def _series(text: str) -> dict[str, set[str]]:
    """Every sample name in an exposition with its label sets (as text)."""
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? \S+$", line)
        if match:
            series.setdefault(match.group(1), set()).add(match.group(2) or "")
    return series


def test_made_up_model_names_add_no_metric_series(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    """Issue 12, item 9: the upstream echoes the caller's model name, which became a label."""
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."acme-tuned"]\ninput = 1.0\noutput = 2.0\n')
    gateway = start_gateway("--prices", str(prices))
    # Dated snapshots of priced models and of a --prices model (priced as them), and
    # names with secrets in them: priced names with more after them (other models,
    # unpriced: claude-opus-4-5 is not claude-opus-4) and unknown ones.
    stems = ["gpt-4o-mini", "claude-sonnet-4", "acme-tuned", "made-up"]
    names = [
        f"{stems[index % 3]}-{20260101 + index % 28}"
        if index % 2
        else f"{stems[index % 4]}-acme-corp-secret-{index}"
        for index in range(1000)
    ]

    def send(numbered: tuple[int, str]) -> None:
        index, name = numbered
        body = orjson.dumps({**CHAT, "model": name})
        for _ in range(2):  # the retry is a replay: saved cost, counted by model too
            request = urllib.request.Request(
                gateway.url + "/v1/chat/completions",
                data=body,
                headers={
                    **AUTH,
                    **NO_PACING,
                    "Idempotency-Key": f"{name}-{index}",
                    "Content-Type": "application/json",
                },
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, enumerate(names)))
    text = httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text
    assert "secret" not in text
    series = _series(text)
    for family in ("payonce_cost_usd_total", "payonce_saved_cost_usd_total"):
        # The usual models and the --prices entries are series from the start, at 0;
        # nothing else is. The names the calls were priced as have counts.
        usual = [*(priced_name(name) for name in USUAL_MODELS), "acme-tuned"]
        assert series[family] == {f'model="{name}"' for name in usual}, family
        counted = {
            match.group(1)
            for match in re.finditer(rf"^{family}{{(.*)}} (\S+)$", text, re.MULTILINE)
            if float(match.group(2)) > 0
        }
        assert counted == {
            'model="gpt-4o-mini"',
            'model="claude-sonnet-4-0"',  # genai-prices' id of it
            'model="acme-tuned"',
        }, family
    # No other family carries a model label at all.
    assert not [
        name
        for name, labels in series.items()
        if any("model=" in label for label in labels)
        if not name.startswith(("payonce_cost_usd", "payonce_saved_cost_usd"))
    ]
    assert metric(text, "payonce_unknown_cost_calls_total") == 500  # the secret-bearing half
    assert fresh_sim.billed() == 1000


def test_the_provider_request_id_header_of_each_provider() -> None:
    from payonce.gateway.observing import provider_request_id

    # OpenAI, Anthropic, and AWS Bedrock (the requestId of its invocation log).
    assert provider_request_id((("X-Request-Id", "req-openai"),)) == "req-openai"
    assert provider_request_id((("request-id", "req_anthropic"),)) == "req_anthropic"
    bedrock = (("Content-Type", "application/json"), ("x-amzn-RequestId", "6f2c-bedrock"))
    assert provider_request_id(bedrock) == "6f2c-bedrock"
    assert provider_request_id((("apim-request-id", "azure"),)) is None
    # OpenRouter: the generation id its bill is keyed by, whatever else is there.
    openrouter = (("x-request-id", "edge-1"), ("X-Generation-Id", "gen-3bhG"))
    assert provider_request_id(openrouter) == "gen-3bhG"

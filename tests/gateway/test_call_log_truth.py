"""The call log and the metrics say what the client received and what the upstream did.

Issue 13, items 1-3: a client that left was logged as served (200), an unkeyed
call cancelled after its client left was logged as a 500 nobody sent, and
upstreams without ``x-request-id`` left ``upstream_request_id`` null. Each case
is checked line by line in the call log, in the metrics, and in reconcile's
figures against the simulator's ledger.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import uuid
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from payonce.reconcile.run import reconcile
from payonce.sim.ledger import CSV_FIELDS
from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim, chat
from tests.support.exposition import metric
from tests.support.processes import Process
from tests.support.waiting import settled_record, wait_until

SLOW = {"X-Sim-Delay-Ms": "2000"}


def _lines(gateway: Process, path: Path) -> list[dict[str, object]]:
    gateway.stop()  # a graceful stop flushes the call log
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _metrics(gateway: Process) -> str:
    return httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text


def _give_up(gateway: Process, key: str | None, timeout: float = 0.5) -> None:
    with pytest.raises(httpx.TimeoutException):
        chat(gateway.url, key, headers=SLOW, timeout=timeout)


def _bill(sim: Sim, path: Path) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_FIELDS)
        writer.writeheader()
        writer.writerows(sim.ledger()["entries"])
    return path


def _settled(gateway: Process, key: str) -> None:
    assert settled_record(gateway.url, key, AUTH)["state"] == "completed"


def test_a_keyed_client_that_left_is_logged_499_with_the_upstream_call_it_paid_for(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))
    key = f"left-{uuid.uuid4()}"
    _give_up(gateway, key)
    _settled(gateway, key)
    text = _metrics(gateway)
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="499") == 1
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 0
    assert metric(text, "payonce_upstream_calls_total", status="200") == 1
    (line,) = _lines(gateway, log)
    (entry,) = fresh_sim.ledger()["entries"]
    assert line["v"] == 2
    assert line["outcome"] == "forwarded" and line["status"] == 499
    assert line["client_disconnected"] is True and line["upstream_cancelled"] is False
    assert line["upstream_status"] == 200 and line["upstream_attempts"] == 1
    assert line["upstream_request_id"] == entry["provider_request_id"]
    assert line["cost_usd"] == pytest.approx(entry["cost_usd"])
    assert line["output_tokens"] == entry["output_tokens"]

    # Nobody received an answer: reconcile counts the business request, not a success.
    report = reconcile([log], [_bill(fresh_sim, tmp_path / "bill.csv")])
    assert report.totals.business_requests == 1
    assert report.totals.successful_business_requests == 0
    assert report.totals.billed_generations == 1 and report.totals.unmatched_bill_lines == 0


def test_the_retry_that_got_the_answer_makes_the_business_request_successful(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))
    key = f"retried-{uuid.uuid4()}"
    _give_up(gateway, key)
    assert chat(gateway.url, key, headers=SLOW).status_code == 200  # joins, then gets it
    lines = _lines(gateway, log)
    assert [(line["outcome"], line["status"]) for line in lines] == [
        ("forwarded", 499),
        ("joined", 200),
    ]
    assert lines[1]["client_disconnected"] is False
    report = reconcile([log], [_bill(fresh_sim, tmp_path / "bill.csv")])
    assert report.totals.business_requests == report.totals.successful_business_requests == 1
    assert report.totals.duplicate_generations == 0


def test_joined_duplicates_and_409s_sent_to_clients_that_left_are_499(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log), "--wait-timeout", "1s")
    key = f"dup-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, gateway.url, key, headers=SLOW, timeout=10)
        wait_until(lambda: fresh_sim.requests(), "the first call upstream")
        _give_up(gateway, key)  # joins, leaves at 0.5 s; its 409 comes at 1 s
        assert first.result().status_code == 200
    text = _metrics(gateway)
    assert metric(text, "payonce_requests_total", outcome="conflict", status_class="499") == 1
    lines = {line["outcome"]: line for line in _lines(gateway, log)}
    assert lines["forwarded"]["status"] == 200
    assert lines["conflict"]["status"] == 499 and lines["conflict"]["client_disconnected"]
    assert fresh_sim.billed() == 1


def test_an_unkeyed_call_cancelled_after_its_client_left_is_not_a_500(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))  # --on-disconnect cancel, the default
    _give_up(gateway, None)

    def counted() -> bool:
        text = _metrics(gateway)
        upstream = sum(
            metric(text, "payonce_upstream_calls_total", status=status)
            for status in ("cancelled", "error")
        )
        answered = sum(
            metric(text, "payonce_requests_total", outcome="passthrough", status_class=status)
            for status in ("2xx", "499", "5xx")
        )
        return upstream > 0 and answered > 0

    wait_until(counted, "the request and its upstream call counted")
    text = _metrics(gateway)
    assert metric(text, "payonce_requests_total", outcome="passthrough", status_class="499") == 1
    assert metric(text, "payonce_requests_total", outcome="passthrough", status_class="5xx") == 0
    assert metric(text, "payonce_upstream_calls_total", status="error") == 0
    assert metric(text, "payonce_upstream_calls_total", status="cancelled") == 1
    (line,) = _lines(gateway, log)
    assert line["outcome"] == "passthrough" and line["status"] == 499
    assert line["client_disconnected"] is True
    assert line["upstream_cancelled"] is True and line["upstream_status"] is None
    assert line["upstream_attempts"] == 1, "the request was sent once"
    # The simulator finishes the generation (2 s) and bills it, although nobody got it:
    # the log says why. (Awaited here, or it would land in the next test's ledger.)
    wait_until(lambda: fresh_sim.billed(), "the generation billed")
    assert fresh_sim.billed() == 1
    # The cancelled call never learnt its provider id: reconcile shows the spend as
    # unmatched, and no success.
    report = reconcile([log], [_bill(fresh_sim, tmp_path / "bill.csv")])
    assert report.totals.successful_business_requests == 0
    assert report.totals.unmatched_bill_lines == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_the_body_id_is_the_request_id_when_the_upstream_sends_no_header(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, stream: bool, keyed: bool
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))
    key = f"noid-{uuid.uuid4()}" if keyed else None
    headers = {"X-Sim-No-Request-Id": "1", "X-Sim-Token-Ms": "0"}
    body = {**CHAT, "stream": True} if stream else CHAT
    response = chat(gateway.url, key, body=body, headers=headers)
    assert response.status_code == 200 and "x-request-id" not in response.headers
    (line,) = _lines(gateway, log)
    (entry,) = fresh_sim.ledger()["entries"]
    assert line["upstream_request_id"] == entry["provider_request_id"]
    report = reconcile([log], [_bill(fresh_sim, tmp_path / "bill.csv")])
    assert report.totals.unmatched_bill_lines == 0
    assert report.totals.business_requests == report.totals.successful_business_requests == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_replays_and_the_status_endpoint_carry_the_body_id_when_no_header_did(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, stream: bool
) -> None:
    # A stream's replay read the id from the stored headers only: its call log
    # line had none, and the status endpoint never said which call it was.
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))
    key = f"noid-replay-{uuid.uuid4()}"
    headers = {"X-Sim-No-Request-Id": "1", "X-Sim-Token-Ms": "0"}
    body = {**CHAT, "stream": True} if stream else CHAT
    first = chat(gateway.url, key, body=body, headers=headers)
    again = chat(gateway.url, key, body=body, headers=headers)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    (entry,) = fresh_sim.ledger()["entries"]
    status = httpx.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH, timeout=10)
    assert status.json()["upstream_request_id"] == entry["provider_request_id"]
    lines = _lines(gateway, log)
    assert [line["outcome"] for line in lines] == ["forwarded", "replayed"]
    assert [line["upstream_request_id"] for line in lines] == [entry["provider_request_id"]] * 2


def test_the_status_endpoint_names_the_provider_request_id_from_its_header(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"withid-{uuid.uuid4()}"
    response = chat(gateway.url, key)
    status = httpx.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH, timeout=10)
    assert status.json()["upstream_request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("keyed", None),
        ("whole", None),
        ("not-requested", "not_requested"),
        ("unkeyed", "not_read"),
        ("broken", "no_response"),
    ],
)
def test_the_call_log_says_why_a_stream_has_no_usage(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, case: str, reason: str | None
) -> None:
    # Unknown usage is logged as null tokens, never a made-up count, and the line
    # says why (llama.cpp's server sends no usage chunk: tests/upstreams).
    log = tmp_path / "calls.jsonl"
    flags = ["--no-inject-stream-usage"] if case == "not-requested" else []
    gateway = start_gateway("--call-log", str(log), *flags)
    key = None if case == "unkeyed" else f"why-{case}-{uuid.uuid4()}"
    headers = {"X-Sim-Token-Ms": "0"}
    if case == "broken":
        headers["X-Sim-Die-After"] = "2"
    body = CHAT if case == "whole" else {**CHAT, "stream": True}
    with contextlib.suppress(httpx.TransportError):  # the broken stream
        chat(gateway.url, key, body=body, headers=headers)
    if case == "not-requested":
        assert chat(gateway.url, key, body=body, headers=headers).status_code == 200  # replayed
    lines = _lines(gateway, log)
    assert [line["usage_missing_reason"] for line in lines] == [reason] * len(lines)
    for line in lines:
        if reason is not None:
            assert line["input_tokens"] is None and line["output_tokens"] is None
            # Unknown, not free: a replay costs 0, and what it saved is unknown too.
            assert line["cost_usd" if line["outcome"] != "replayed" else "saved_usd"] is None
        else:
            assert line["output_tokens"] == fresh_sim.ledger()["entries"][0]["output_tokens"]


def test_a_keyed_stream_whose_client_left_is_logged_when_its_run_ends_with_its_cost(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    gateway = start_gateway("--call-log", str(log))
    key = f"stream-left-{uuid.uuid4()}"
    headers = {**AUTH, "Idempotency-Key": key, "X-Sim-Token-Ms": "30"}
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json={**CHAT, "stream": True, "max_tokens": 40},
        headers=headers,
        timeout=10,
    ) as response:
        assert response.status_code == 200
        next(response.iter_bytes())  # one chunk, then the client goes
    _settled(gateway, key)  # the gateway read the stream to its end for the retry
    (line,) = _lines(gateway, log)
    (entry,) = fresh_sim.ledger()["entries"]
    assert line["status"] == 499 and line["client_disconnected"] is True
    assert line["stream"] is True and line["upstream_status"] == 200
    assert line["upstream_request_id"] == entry["provider_request_id"]
    assert line["output_tokens"] == entry["output_tokens"]
    assert line["cost_usd"] == pytest.approx(entry["cost_usd"])

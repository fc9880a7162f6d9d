"""Answers fetched after a timed-out attempt are in the records (issue 29, "also found").

A client (``payonce.client``) whose attempt timed out asks the gateway for the
stored result (``GET /_payonce/requests/{key}/response``) instead of re-sending.
The timed-out attempt is logged 499; the answer the client then received must be
logged too, or the call log, ``payonce reconcile`` and the success ratio say
that business calls answered in full failed.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx2
import orjson
import pytest

from payonce.client import IdempotentTransport, RetryPolicy
from payonce.reconcile.run import reconcile
from tests.client.conftest import AUTH, CHAT_BODY
from tests.support.processes import running

CALLS = 4
SLOW = {"X-Sim-Delay-Ms": "1500"}
# Each attempt gives up reading after 0.3 s: every call is answered by a fetch.
POLICY = RetryPolicy(attempts=3, read_timeout=0.3, deadline=30)


def _metric(text: str, outcome: str, status_class: str) -> float:
    pattern = (
        r'^payonce_requests_total\{[^}]*outcome="'
        + outcome
        + r'"[^}]*status_class="'
        + status_class
        + r'"[^}]*\} (\S+)$'
    )
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


@pytest.mark.slow
def test_a_fetched_answer_is_logged_counted_and_reconciled(tmp_path: Path) -> None:
    (tmp_path / "sim").mkdir()
    (tmp_path / "gw").mkdir()
    ledger, call_log = tmp_path / "ledger.csv", tmp_path / "calls.jsonl"
    sim_args = ["sim", "--latency", "fixed:0", "--seed", "3", "--ledger", str(ledger)]
    with running(sim_args, log_dir=tmp_path / "sim", ready_path="/_sim/health") as sim:
        serve = ["serve", "--upstream", sim.url, "--store", "memory://"]
        serve += ["--call-log", str(call_log)]
        with running(serve, log_dir=tmp_path / "gw", ready_path="/_payonce/health") as gateway:
            transport = IdempotentTransport(policy=POLICY, gateway=True)
            keys = []
            with httpx2.Client(transport=transport) as http:
                for _ in range(CALLS):
                    key = f"order-{uuid.uuid4()}"
                    keys.append(key)
                    response = http.post(
                        gateway.url + "/v1/chat/completions",
                        json=CHAT_BODY,
                        headers={**AUTH, **SLOW, "Idempotency-Key": key},
                    )
                    assert response.status_code == 200
                    assert response.headers["idempotent-replayed"] == "true"
            metrics = httpx2.get(gateway.url + "/_payonce/metrics", timeout=10).text
        summary = httpx2.get(sim.url + "/_sim/ledger", timeout=10).json()
    assert summary["billed"] == CALLS

    lines = [orjson.loads(line) for line in call_log.read_bytes().splitlines()]
    for key in keys:
        mine = [line for line in lines if line["key"] == key]
        timed_out = [line for line in mine if line["status"] == 499]
        fetched = [line for line in mine if line["path"].endswith("/response")]
        assert timed_out, mine
        assert len(fetched) == 1, mine
        line = fetched[0]
        assert (line["method"], line["status"], line["outcome"]) == ("GET", 200, "replayed")
        assert line["endpoint"] is None
        assert line["upstream_attempts"] == 0
        assert line["cost_usd"] == 0
        assert line["saved_usd"] and line["saved_usd"] > 0
        forwarded = next(other for other in mine if other["outcome"] == "forwarded")
        assert line["upstream_request_id"] == forwarded["upstream_request_id"]
        assert line["output_tokens"] == forwarded["output_tokens"]

    # Prometheus: every business call has a 2xx among its requests.
    assert _metric(metrics, "replayed", "2xx") == CALLS

    report = reconcile([call_log], [ledger])
    totals = report.totals
    assert totals.business_requests == totals.successful_business_requests == CALLS
    assert totals.billed_generations == CALLS
    assert totals.duplicate_generations == 0
    # The fetch's path is not an endpoint of the provider's (its line names none): every
    # call is the chat one, read from the call log's endpoint field by default.
    assert [s.key for s in report.by_endpoint] == ["chat"]
    assert report.endpoint_column == "endpoint"

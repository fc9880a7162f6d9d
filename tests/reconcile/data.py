"""One hand-made scenario, written in every input format, with every figure known.

Six business requests over two UTC days, nine billed generations:

=====  =========================  ==========================  =======================
key    calls (status)             bill                        what it shows
=====  =========================  ==========================  =======================
A      r1 (200)                   r1 gpt-4o-mini 0.10         billed once
B      r2 (504) r3 (200) r4 (200) r2 0.30, r3 0.20, r4 0.25    3 generations: r3 (the
       + a replay naming r3       (gpt-4o)                    cheapest) needed, r2 and
                                                              r4 wasted (0.55)
C      r5 (500) r6 (500)          r5 0.10, r6 0.10 mini       failed; tie on cost: r5
                                                              (earlier) needed, r6 0.10
D      r7 (200), day 2            r7 1.00 mini                an outlier (10x median)
E      r8 (200), day 2            r8 0.10 mini
F      r10 (200), day 2           (nothing)                   an unbilled call
—      —                          r9 gpt-4o 0.40, day 2       unmatched spend
=====  =========================  ==========================  =======================
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

DAY1 = "2026-11-30"
DAY2 = "2026-12-01"


@dataclass(frozen=True)
class Call:
    key: str
    pid: str
    status: int
    model: str
    tenant: str
    ts: str
    outcome: str = "forwarded"


@dataclass(frozen=True)
class Line:
    pid: str
    model: str
    cost: str
    ts: str
    input_tokens: int = 100
    output_tokens: int = 50


CALLS = [
    Call("A", "r1", 200, "gpt-4o-mini", "t-a", f"{DAY1}T10:00:00.000Z"),
    Call("B", "r2", 504, "gpt-4o", "t-a", f"{DAY1}T10:01:00.000Z"),
    Call("B", "r3", 200, "gpt-4o", "t-a", f"{DAY1}T10:02:00.000Z"),
    Call("B", "r4", 200, "gpt-4o", "t-a", f"{DAY1}T10:03:00.000Z"),
    Call("B", "r3", 200, "gpt-4o", "t-a", f"{DAY1}T10:04:00.000Z", outcome="replayed"),
    Call("C", "r5", 500, "gpt-4o-mini", "t-a", f"{DAY1}T11:00:00.000Z"),
    Call("C", "r6", 500, "gpt-4o-mini", "t-a", f"{DAY1}T11:01:00.000Z"),
    Call("D", "r7", 200, "gpt-4o-mini", "t-b", f"{DAY2}T09:00:00.000Z"),
    Call("E", "r8", 200, "gpt-4o-mini", "t-b", f"{DAY2}T09:30:00.000Z"),
    Call("F", "r10", 200, "gpt-4o", "t-b", f"{DAY2}T10:00:00.000Z"),
]

BILL = [
    Line("r1", "gpt-4o-mini", "0.10", f"{DAY1}T10:00:01.000Z"),
    Line("r2", "gpt-4o", "0.30", f"{DAY1}T10:01:01.000Z"),
    Line("r3", "gpt-4o", "0.20", f"{DAY1}T10:02:01.000Z"),
    Line("r4", "gpt-4o", "0.25", f"{DAY1}T10:03:01.000Z"),
    Line("r5", "gpt-4o-mini", "0.10", f"{DAY1}T11:00:01.000Z"),
    Line("r6", "gpt-4o-mini", "0.10", f"{DAY1}T11:01:01.000Z"),
    Line("r7", "gpt-4o-mini", "1.00", f"{DAY2}T09:00:01.000Z"),
    Line("r8", "gpt-4o-mini", "0.10", f"{DAY2}T09:30:01.000Z"),
    Line("r9", "gpt-4o", "0.40", f"{DAY2}T11:00:00.000Z"),
]

TOTALS = {
    "billed_generations": 9,
    "matched_generations": 8,
    "business_requests": 6,
    "successful_business_requests": 5,
    "duplicate_generations": 3,
    "duplicate_ratio": 3 / 9,
    "wasted_cost_usd": 0.65,
    "total_cost_usd": 2.55,
    "cost_per_successful_call_usd": 0.51,
    "bill_lines": 9,
    "unmatched_bill_lines": 1,
    "unmatched_cost_usd": 0.4,
    "unbilled_calls": 1,
    "conflicting_request_ids": 0,
    "malformed_rows": 0,
}

BY_MODEL = {
    "gpt-4o-mini": {
        "billed_generations": 5,
        "duplicate_generations": 1,
        "wasted_cost_usd": 0.1,
        "total_cost_usd": 1.4,
        "unmatched_cost_usd": 0.0,
        "business_requests": 4,
        "successful_business_requests": 3,
        "cost_per_successful_call_usd": 0.4666666667,
    },
    "gpt-4o": {
        "billed_generations": 4,
        "duplicate_generations": 2,
        "wasted_cost_usd": 0.55,
        "total_cost_usd": 1.15,
        "unmatched_cost_usd": 0.4,
        "business_requests": 2,
        "successful_business_requests": 2,
        "cost_per_successful_call_usd": 0.575,
    },
}

DAILY = [
    {
        "date": DAY1,
        "billed_generations": 6,
        "duplicate_generations": 3,
        "wasted_cost_usd": 0.65,
        "total_cost_usd": 1.05,
        "unmatched_cost_usd": 0.0,
        "business_requests": 3,
        "successful_business_requests": 2,
        "cost_per_successful_call_usd": 0.525,
    },
    {
        "date": DAY2,
        "billed_generations": 3,
        "duplicate_generations": 0,
        "wasted_cost_usd": 0.0,
        "total_cost_usd": 1.5,
        "unmatched_cost_usd": 0.4,
        "business_requests": 3,
        "successful_business_requests": 3,
        "cost_per_successful_call_usd": 0.5,
    },
]

OUTLIERS = {"count": 1, "cost_usd": 1.0, "excess_cost_usd": 0.9}


# ------------------------------------------------------------------ call logs


def payonce_line(call: Call, **extra: object) -> dict[str, object]:
    """One line of the gateway's call log (docs/call-log.md, schema v1)."""
    line: dict[str, object] = {
        "v": 1,
        "ts": call.ts,
        "request_id": f"gw-{call.pid}-{call.outcome}",
        "key": call.key,
        "tenant": call.tenant,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": call.model,
        "stream": False,
        "outcome": call.outcome,
        "status": call.status,
        "upstream_status": call.status,
        "upstream_request_id": call.pid,
        "upstream_attempts": 0 if call.outcome == "replayed" else 1,
        "client_retry": None,
        "unprotected_retry": False,
        "input_tokens": 100,
        "output_tokens": 50,
        "cached_input_tokens": None,
        "reasoning_tokens": None,
        "cost_usd": None,
        "saved_usd": None,
        "latency_ms": 120.5,
        "upstream_latency_ms": 100.25,
    }
    line.update(extra)
    return line


def write_jsonl(path: Path, records: list[dict[str, object]], *, zipped: bool = False) -> Path:
    text = "".join(json.dumps(record) + "\n" for record in records)
    if zipped:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def payonce_calls(directory: Path, *, zipped: bool = False) -> Path:
    name = "calls.jsonl.gz" if zipped else "calls.jsonl"
    return write_jsonl(directory / name, [payonce_line(c) for c in CALLS], zipped=zipped)


def generic_calls_csv(directory: Path) -> Path:
    header = ["business_id", "provider_request_id", "model", "endpoint", "tag", "status", "ts"]
    rows: list[list[object]] = [
        [c.key, c.pid, c.model, "/v1/chat/completions", c.tenant, c.status, c.ts] for c in CALLS
    ]
    return write_csv(directory / "calls.csv", header, rows)


def generic_calls_jsonl(directory: Path) -> Path:
    records: list[dict[str, object]] = [
        {
            "business_id": c.key,
            "provider_request_id": c.pid,
            "model": c.model,
            "endpoint": "/v1/chat/completions",
            "tag": c.tenant,
            "status": "success" if c.status == 200 else "failure",
            "ts": c.ts,
        }
        for c in CALLS
    ]
    return write_jsonl(directory / "calls-generic.jsonl", records)


def mapped_calls_csv(directory: Path) -> Path:
    """Generic calls under other column names (needs --calls-map)."""
    header = ["order_id", "req", "llm", "route", "team", "http_status", "when"]
    rows: list[list[object]] = [
        [c.key, c.pid, c.model, "/v1/chat/completions", c.tenant, c.status, c.ts] for c in CALLS
    ]
    return write_csv(directory / "orders.csv", header, rows)


CALLS_MAP = {
    "business_id": "order_id",
    "provider_request_id": "req",
    "model": "llm",
    "endpoint": "route",
    "tag": "team",
    "status": "http_status",
    "ts": "when",
}


# ------------------------------------------------------------------ bills


def ledger_csv(directory: Path) -> Path:
    """The simulator's export (src/payonce/sim/ledger.py, CSV_FIELDS)."""
    header = [
        "provider_request_id",
        "model",
        "endpoint",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "finished_at",
        "client_connected",
    ]
    rows: list[list[object]] = [
        [
            b.pid,
            b.model,
            "/v1/chat/completions",
            b.input_tokens,
            b.output_tokens,
            b.cost,
            b.ts,
            "true",
        ]
        for b in BILL
    ]
    return write_csv(directory / "ledger.csv", header, rows)


def _litellm_record(b: Line) -> dict[str, object]:
    start = b.ts.replace("T", " ").replace("Z", "")
    return {
        "request_id": b.pid,
        "call_type": "acompletion",
        "api_key": "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539800c9f1243fe6b4b",
        "spend": float(b.cost),
        "total_tokens": b.input_tokens + b.output_tokens,
        "prompt_tokens": b.input_tokens,
        "completion_tokens": b.output_tokens,
        "startTime": start,
        "endTime": start,
        "model": b.model,
        "model_group": b.model,
        "user": "",
        "metadata": {"user_api_key_alias": "team-a", "tags": ["job:1"]},
        "cache_hit": "False",
        "request_tags": ["job:1"],
        "status": "success",
    }


def litellm_csv(directory: Path) -> Path:
    """A LiteLLM SpendLogs export: JSON columns quoted, a comma inside metadata."""
    records = [_litellm_record(b) for b in BILL]
    header = list(records[0])
    rows = [
        [json.dumps(r[k]) if isinstance(r[k], dict | list) else r[k] for k in header]
        for r in records
    ]
    return write_csv(directory / "spend_logs.csv", header, rows)


def litellm_json(directory: Path) -> Path:
    path = directory / "spend_logs.json"
    path.write_text(json.dumps([_litellm_record(b) for b in BILL], indent=2))
    return path


def generic_bill_jsonl(directory: Path) -> Path:
    records: list[dict[str, object]] = [
        {
            "provider_request_id": b.pid,
            "cost_usd": float(b.cost),
            "model": b.model,
            "input_tokens": b.input_tokens,
            "output_tokens": b.output_tokens,
            "ts": b.ts,
        }
        for b in BILL
    ]
    return write_jsonl(directory / "bill.jsonl", records)


def mapped_bill_csv(directory: Path) -> Path:
    """A bill whose input and output tokens are separate lines (summed per request id)."""
    header = ["req_id", "amount", "sku", "day"]
    rows: list[list[object]] = []
    for b in BILL:
        cost = float(b.cost)
        rows.append([b.pid, f"{cost * 0.4:.4f}", b.model, b.ts])
        rows.append([b.pid, f"{cost * 0.6:.4f}", b.model, b.ts])
    return write_csv(directory / "invoice.csv", header, rows)


BILL_MAP = {"provider_request_id": "req_id", "cost_usd": "amount", "model": "sku", "ts": "day"}

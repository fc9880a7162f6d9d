"""Per-request bills from Bedrock, OpenRouter and Azure API Management, every figure known.

One call log: business request A was sent twice (r1, r2: one duplicate), B once
(r3). Each provider's bill names r1..r3 plus one line the call log does not know
(r9) and one row that cannot be read.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from payonce.reconcile.run import ReconcileOptions, reconcile
from payonce.reconcile.schema import Side
from payonce.reconcile.sniff import Container, detect_format, sniff


def _calls(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    rows = [("A", "r1"), ("A", "r2"), ("B", "r3")]
    path.write_text(
        "".join(json.dumps({"business_id": b, "provider_request_id": p}) + "\n" for b, p in rows)
    )
    return path


def _bedrock(pid: str, model: str, tokens_in: int, tokens_out: int) -> dict[str, object]:
    return {
        "schemaType": "ModelInvocationLog",
        "schemaVersion": "1.0",
        "timestamp": "2026-11-30T10:00:00Z",
        "accountId": "123456789012",
        "identity": {"arn": "arn:aws:iam::123456789012:user/app"},
        "region": "us-east-1",
        "requestId": pid,
        "operation": "Converse",
        "modelId": model,
        "input": {"inputContentType": "application/json", "inputTokenCount": tokens_in},
        "output": {"outputContentType": "application/json", "outputTokenCount": tokens_out},
    }


# Nova Micro $0.035/$0.14 per million, Claude 3.5 Haiku $0.80/$4.00 per million.
BEDROCK = [
    _bedrock("r1", "amazon.nova-micro-v1:0", 1_000_000, 1_000_000),  # 0.175
    _bedrock("r2", "us.anthropic.claude-3-5-haiku-20241022-v1:0", 1000, 100),  # 0.0012
    _bedrock(
        "r3",
        "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-haiku-20241022-v1:0",
        2000,
        0,
    ),  # 0.0016
    _bedrock("r9", "amazon.nova-micro-v1:0", 0, 1_000_000),  # 0.14, unmatched
    # A custom model no price database knows: no price, malformed (genai-prices
    # knows Bedrock's Llama, which the hand-kept table did not).
    _bedrock("r8", "acme.custom-model-v1:0", 10, 10),
]


def _openrouter(pid: str, cost: float, cancelled: bool = False) -> dict[str, object]:
    return {
        "data": {
            "id": pid,
            "total_cost": cost,
            "tokens_prompt": 10,
            "tokens_completion": 25,
            "native_tokens_prompt": 10,
            "native_tokens_completion": 25,
            "created_at": "2026-11-30T10:00:00.433273+00:00",
            "cancelled": cancelled,
            "streamed": True,
            "model": "meta-llama/llama-3.1-8b-instruct",
        }
    }


OPENROUTER = [
    _openrouter("gen-r1", 0.30),
    _openrouter("gen-r2", 0.05, cancelled=True),  # cancelled after tokens: billed
    _openrouter("gen-r3", 0.20),
    _openrouter("gen-r4", 0.0, cancelled=True),  # cancelled before any cost: no bill line
    _openrouter("gen-r9", 0.40),
]


def _openrouter_calls(tmp_path: Path) -> Path:
    # The gateway logs OpenRouter's gen-... id (the response body's id).
    text = _calls(tmp_path).read_text().replace('"r', '"gen-r')
    path = tmp_path / "calls_openrouter.jsonl"
    path.write_text(text)
    return path


AZURE_HEADER = [
    "TenantId",
    "TimeGenerated",
    "OperationName",
    "ApiVersion",
    "CorrelationId",
    "DeploymentName",
    "IsStreamCompletion",
    "ModelName",
    "PromptTokens",
    "CompletionTokens",
    "TotalTokens",
    "RequestId",
    "SequenceNumber",
    "Region",
]

# gpt-4o-mini $0.15/$0.60 per million, gpt-4o $2.50/$10.00 per million.
AZURE = [
    ("r1", "gpt-4o-mini-2024-07-18", 1_000_000, 0),  # 0.15
    ("r2", "gpt-4o-mini-2024-07-18", 0, 1_000_000),  # 0.60
    ("r3", "gpt-4o-2024-08-06", 1000, 1000),  # 0.0125
    ("r9", "gpt-4o-2024-08-06", 100_000, 0),  # 0.25, unmatched
]


def _azure_rows() -> list[dict[str, object]]:
    return [
        {
            "TenantId": "ws",
            "TimeGenerated": "2026-11-30T10:00:00Z",
            "OperationName": "ChatCompletions_Create",
            "ApiVersion": "2024-10-21",
            "CorrelationId": pid,
            "DeploymentName": "chat",
            "IsStreamCompletion": False,
            "ModelName": model,
            "PromptTokens": tokens_in,
            "CompletionTokens": tokens_out,
            "TotalTokens": tokens_in + tokens_out,
            "RequestId": f"llm-{pid}",
            "SequenceNumber": 0,
            "Region": "westeurope",
        }
        for pid, model, tokens_in, tokens_out in AZURE
    ]


def _write(path: Path, records: list[dict[str, object]], shape: str) -> Path:
    if shape == "array":
        text = json.dumps(records, indent=2)
    else:
        text = "".join(json.dumps(record) + "\n" for record in records)
        if shape != "gzip":
            text += "{not json\n"
    if shape == "gzip":
        path.write_bytes(gzip.compress((text + "{not json\n").encode()))
    else:
        path.write_text(text)
    return path


def _azure_csv(path: Path) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, AZURE_HEADER)
        writer.writeheader()
        writer.writerows(_azure_rows())
        out.write("ws,2026-11-30T10:00:00Z,x,y,r7,chat,False,gpt-4o,many,1,1,z,0,w\n")
    return path


def _figures(tmp_path: Path, calls: Path, bill: Path) -> dict[str, object]:
    report = reconcile([calls], [bill])
    totals = report.totals.as_json()
    return {
        "format": report.inputs[1].format,
        "rows": report.inputs[1].rows,
        "malformed": report.inputs[1].malformed_rows,
        "total": totals["total_cost_usd"],
        "generations": totals["billed_generations"],
        "duplicates": totals["duplicate_generations"],
        "wasted": totals["wasted_cost_usd"],
        "unmatched": totals["unmatched_cost_usd"],
    }


@pytest.mark.parametrize("shape", ["jsonl", "array", "gzip"])
def test_bedrock_invocation_logs(tmp_path: Path, shape: str) -> None:
    bill = _write(tmp_path / "bedrock.json", BEDROCK, shape)
    sniffed = sniff(bill)
    assert detect_format(sniffed, Side.BILL, None).name == "bedrock-invocations"
    assert sniffed.container is (Container.JSON if shape == "array" else Container.JSONL)
    assert sniffed.gzip is (shape == "gzip")
    assert _figures(tmp_path, _calls(tmp_path), bill) == {
        "format": "bedrock-invocations",
        "rows": 4,
        # The custom model's line has no price; the JSON lines shapes also have a bad line.
        "malformed": 1 if shape == "array" else 2,
        "total": 0.3178,  # 0.175 + 0.0012 + 0.0016 + 0.14, summed exactly
        "generations": 4,
        "duplicates": 1,
        "wasted": 0.175,  # A: r1 (0.175) and r2 (0.0012); the cheaper one was needed
        "unmatched": 0.14,
    }


def test_a_bedrock_line_without_a_price_or_tokens_is_malformed(tmp_path: Path) -> None:
    record = _bedrock("r1", "amazon.nova-micro-v1:0", 1, 1)
    del record["input"], record["output"]
    bill = _write(tmp_path / "bedrock.jsonl", [record, BEDROCK[4]], "jsonl")
    report = reconcile([_calls(tmp_path)], [bill])
    assert [(row.line, row.reason) for row in report.malformed] == [
        (1, "no token counts to price"),
        (2, "no price for model acme.custom-model-v1:0"),
        (3, "not a JSON object"),
    ]


@pytest.mark.parametrize("shape", ["jsonl", "array", "gzip"])
def test_openrouter_generations(tmp_path: Path, shape: str) -> None:
    bill = _write(tmp_path / "generations.json", OPENROUTER, shape)
    sniffed = sniff(bill)
    assert sniffed.enveloped
    assert detect_format(sniffed, Side.BILL, None).name == "openrouter-generations"
    assert _figures(tmp_path, _openrouter_calls(tmp_path), bill) == {
        "format": "openrouter-generations",
        "rows": 4,  # gen-r4 was cancelled before costing anything: no generation
        "malformed": 0 if shape == "array" else 1,
        "total": 0.95,
        "generations": 4,
        "duplicates": 1,
        "wasted": 0.30,  # A: gen-r1 0.30 and the cancelled gen-r2 0.05
        "unmatched": 0.40,
    }


def test_bare_openrouter_records(tmp_path: Path) -> None:
    bill = _write(tmp_path / "bare.jsonl", [item["data"] for item in OPENROUTER], "jsonl")  # type: ignore[misc]
    assert not sniff(bill).enveloped
    figures = _figures(tmp_path, _openrouter_calls(tmp_path), bill)
    assert (figures["format"], figures["total"], figures["rows"]) == (
        "openrouter-generations",
        0.95,
        4,
    )


def test_azure_apim_llm_log_csv(tmp_path: Path) -> None:
    bill = _azure_csv(tmp_path / "llmlog.csv")
    assert detect_format(sniff(bill), Side.BILL, None).name == "azure-apim-llm"
    assert _figures(tmp_path, _calls(tmp_path), bill) == {
        "format": "azure-apim-llm",
        "rows": 4,
        "malformed": 1,  # PromptTokens "many"
        "total": 1.0125,  # 0.15 + 0.60 + 0.0125 + 0.25
        "generations": 4,
        "duplicates": 1,
        "wasted": 0.60,
        "unmatched": 0.25,
    }


@pytest.mark.parametrize("shape", ["jsonl", "array"])
def test_azure_apim_llm_log_json(tmp_path: Path, shape: str) -> None:
    bill = _write(tmp_path / "llmlog.json", _azure_rows(), shape)
    figures = _figures(tmp_path, _calls(tmp_path), bill)
    assert (figures["format"], figures["total"], figures["wasted"]) == (
        "azure-apim-llm",
        1.0125,
        0.60,
    )


def test_the_format_can_be_named_and_the_join_column_remapped(tmp_path: Path) -> None:
    bill = _azure_csv(tmp_path / "llmlog.csv")
    # Joining by the language model's request id instead (no call names one here).
    options = ReconcileOptions(
        bill_format="azure-apim-llm", bill_map={"provider_request_id": "RequestId"}
    )
    report = reconcile([_calls(tmp_path)], [bill], options)
    assert report.totals.as_json()["matched_generations"] == 0
    assert report.inputs[1].format == "azure-apim-llm"


def test_a_split_azure_entry_counts_once(tmp_path: Path) -> None:
    rows = _azure_rows()
    # r3's messages were large: APIM logged its entry in two parts, both with its counts.
    rows.insert(3, {**rows[2], "SequenceNumber": 1, "RequestMessages": "...rest"})
    path = tmp_path / "split.csv.gz"
    with gzip.open(path, "wt", newline="") as out:
        writer = csv.DictWriter(out, [*AZURE_HEADER, "RequestMessages"])
        writer.writeheader()
        writer.writerows(rows)
    report = reconcile([_calls(tmp_path)], [path])
    assert report.inputs[1].format == "azure-apim-llm" and sniff(path).gzip
    assert float(report.totals.total_cost_usd) == 1.0125
    assert report.inputs[1].rows == 4
    assert "1 continuation rows (SequenceNumber after a request's first) left out" in (
        report.inputs[1].note or ""
    )


def test_a_cloudwatch_logs_export_of_bedrock_records(tmp_path: Path) -> None:
    # A CloudWatch Logs export task to S3: gzip, each event as "<timestamp> <message>".
    lines = [f"2026-11-30T10:00:00.000Z {json.dumps(record)}" for record in BEDROCK]
    path = tmp_path / "000000.gz"
    path.write_bytes(
        gzip.compress(("\n".join([*lines, "2026-11-30T10:00:01.000Z {oops"]) + "\n").encode())
    )
    sniffed = sniff(path)
    assert sniffed.stamped and sniffed.container is Container.JSONL
    figures = _figures(tmp_path, _calls(tmp_path), path)
    assert (figures["format"], figures["total"], figures["rows"], figures["malformed"]) == (
        "bedrock-invocations",
        0.3178,
        4,
        2,
    )


def test_the_command_line_names_each_format(tmp_path: Path) -> None:
    from payonce.cli import main

    calls = str(_calls(tmp_path))
    bills = {
        "bedrock-invocations": _write(tmp_path / "b.jsonl", BEDROCK, "jsonl"),
        "openrouter-generations": _write(tmp_path / "o.jsonl", OPENROUTER, "jsonl"),
        "azure-apim-llm": _azure_csv(tmp_path / "a.csv"),
    }
    for name, bill in bills.items():
        out = tmp_path / f"{name}.json"
        argv = ["reconcile", "--calls", calls, "--bill", str(bill), "--bill-format", name]
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "-q", "--json", str(out)])
        assert exit_.value.code in (0, None)
        assert json.loads(out.read_text())["inputs"][1]["format"] == name

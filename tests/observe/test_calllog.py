"""The call log line and the observer's counts, in-process (the gateway tests cover them end to end)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from payonce.clock import ManualClock
from payonce.gateway.keys import Tenants, tenant_of
from payonce.gateway.observing import Observer, UpstreamFacts
from payonce.observe.calllog import CallLog, CallLogPipe, CallLogWriter, CallRecord, _timestamp
from payonce.observe.metrics import Metrics
from tests.support.exposition import metric

DOC = Path(__file__).resolve().parents[2] / "docs" / "call-log.md"


def documented_fields() -> list[str]:
    """Field names in the order of docs/call-log.md's schema table."""
    names: list[str] = []
    table = DOC.read_text().split("| field | type | meaning |", 1)[1].split("\n\n", 1)[0]
    for row in table.splitlines()[2:]:
        names += re.findall(r"`([a-z_]+)`", row.split("|")[1])
    return names


def record(**fields: object) -> CallRecord:
    base = CallRecord("00000000000000ff", "POST", "/v1/chat/completions", "t" * 32, started=100.0)
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def test_a_line_is_one_json_object_with_exactly_the_documented_fields_in_order() -> None:
    line = record().line(100.25, 1_700_000_000.0)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    document = orjson.loads(line)
    assert list(document) == documented_fields()
    assert len(documented_fields()) == 34


def test_every_field_of_a_forwarded_request() -> None:
    line = record(
        key="order-42",
        model="gpt-4o-mini",
        stream=True,
        outcome="forwarded",
        status=200,
        upstream_status=200,
        upstream_request_id="chatcmpl-1",
        upstream_attempts=2,
        client_retry=0,
        usage={"input_tokens": 5, "output_tokens": 7, "cached_input_tokens": 1},
        cost_usd=0.00125,
        price_source="genai-prices",
        endpoint="chat",
        scenario="invoice-summary",
        upstream_latency=0.0123456,
    ).line(100.0021234, 1_700_000_000.5)
    assert orjson.loads(line) == {
        "v": 2,
        "ts": "2023-11-14T22:13:20.500Z",
        "request_id": "00000000000000ff",
        "key": "order-42",
        "tenant": "t" * 32,
        "method": "POST",
        "path": "/v1/chat/completions",
        "endpoint": "chat",
        "scenario": "invoice-summary",
        "model": "gpt-4o-mini",
        "stream": True,
        "outcome": "forwarded",
        "status": 200,
        "client_disconnected": False,
        "upstream_status": 200,
        "upstream_request_id": "chatcmpl-1",
        "upstream_attempts": 2,
        "upstream_cancelled": False,
        "client_retry": 0,
        "unprotected_retry": False,
        "sdk_match": None,
        "store_bypassed": False,
        "not_stored": None,
        "input_tokens": 5,
        "output_tokens": 7,
        "cached_input_tokens": 1,
        "reasoning_tokens": None,
        "usage_missing_reason": None,
        "cost_usd": 0.00125,
        "list_cost_usd": None,
        "saved_usd": None,
        "price_source": "genai-prices",
        "latency_ms": 2.123,
        "upstream_latency_ms": 12.346,
    }


def test_nulls_and_defaults_of_a_rejected_request() -> None:
    document = orjson.loads(record(outcome="rejected", status=400).line(100.0, 1_700_000_000.0))
    for name in ("key", "model", "upstream_status", "upstream_request_id", "client_retry"):
        assert document[name] is None
    for name in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"):
        assert document[name] is None
    assert document["cost_usd"] is None and document["saved_usd"] is None
    assert document["list_cost_usd"] is None
    assert document["upstream_latency_ms"] is None and document["latency_ms"] == 0
    assert document["upstream_attempts"] == 0 and document["stream"] is False


def test_a_stated_cost_is_logged_beside_the_list_price() -> None:
    """Issue 34: the provider's own cost prices the call; its list price stays beside it."""
    document = orjson.loads(
        record(
            model="gpt-4o-mini",
            outcome="forwarded",
            cost_usd=0.000125,
            list_cost_usd=0.00012,
            price_source="provider",
        ).line(100.0, 1.0)
    )
    assert document["cost_usd"] == 0.000125 and document["price_source"] == "provider"
    assert document["list_cost_usd"] == 0.00012


def test_a_fetched_answer_names_no_endpoint() -> None:
    """A line of the gateway's own path (/_payonce/...) has endpoint null, not "other"."""
    rec = record(path="/_payonce/requests/k/response", endpoint=None, outcome="replayed")
    assert orjson.loads(rec.line(100.0, 1.0))["endpoint"] is None


@pytest.mark.parametrize(
    ("key", "client_retry", "unprotected"),
    [(None, 1, True), (None, 3, True), (None, 0, False), (None, None, False), (None, -1, False),
     ("k", 1, False)],
)  # fmt: skip
def test_unprotected_retry_is_a_retry_without_a_key(
    key: str | None, client_retry: int | None, unprotected: bool
) -> None:
    rec = record(key=key, client_retry=client_retry)
    assert orjson.loads(rec.line(100.0, 1.0))["unprotected_retry"] is unprotected
    assert rec.unprotected_retry is unprotected


def test_hostile_strings_stay_valid_json() -> None:
    key = 'a"b\\c,d}'
    path = '/v1/"x",\\y/\u00e9\x01'
    upstream_id = '"},{"v":2'
    line = record(key=key, path=path, model="m,\x7f\u2028", upstream_request_id=upstream_id).line(
        100.0, 1.0
    )
    document = orjson.loads(line)
    assert document["key"] == key and document["path"] == path
    assert document["model"] == "m,\x7f\u2028" and document["upstream_request_id"] == upstream_id
    assert line.count(b"\n") == 1 and list(document) == documented_fields()


@pytest.mark.parametrize(
    "now", [1_700_000_000.0, 1_700_000_000.123, 1_700_000_000.999, 1_700_000_059.9995, 0.001]
)
def test_timestamp_is_iso_utc_with_milliseconds(now: float) -> None:
    millis = int(now * 1000)
    expected = datetime.fromtimestamp(millis // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert _timestamp(now) == f"{expected}.{millis % 1000:03d}Z"
    assert _timestamp(now) == _timestamp(now)  # from the millisecond's memory


def test_timestamps_across_seconds_and_back() -> None:
    assert _timestamp(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"
    assert _timestamp(1_700_000_001.0) == "2023-11-14T22:13:21.000Z"
    assert _timestamp(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"  # a clock that stepped back


def test_the_log_buffers_lines_until_flushed(tmp_path: Path) -> None:
    log = CallLog(str(tmp_path / "calls.jsonl"))
    lines = [record(request_id=f"{i:016x}").line(100.0, 1.0) for i in range(3)]
    for line in lines:
        log.write(line)
    assert (tmp_path / "calls.jsonl").read_bytes() == b""
    log.flush()
    assert (tmp_path / "calls.jsonl").read_bytes() == b"".join(lines)
    log.write(lines[0])
    log.close()
    assert (tmp_path / "calls.jsonl").read_bytes() == b"".join([*lines, lines[0]])


def _line(index: int, size: int = 100) -> bytes:
    """A JSON line of exactly ``size`` bytes."""
    head = b'{"i":%d,"pad":"' % index
    return head + b"x" * (size - len(head) - 3) + b'"}\n'


def test_rotation_falls_between_lines(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = CallLog(str(path), max_bytes=250, backups=10)
    lines = [_line(index) for index in range(9)]
    for line in lines:
        log.write(line)
    log.flush()  # one flush of 900 bytes: five files of two whole lines, the last of one
    log.close()
    files = [path.with_name(f"calls.jsonl.{n}") for n in range(4, 0, -1)] + [path]
    assert [file.read_bytes() for file in files] == [
        b"".join(lines[0:2]),
        b"".join(lines[2:4]),
        b"".join(lines[4:6]),
        b"".join(lines[6:8]),
        lines[8],
    ]


def test_a_line_longer_than_the_limit_has_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = CallLog(str(path), max_bytes=250, backups=10)
    lines = [_line(0), _line(1, 600), _line(2)]
    for line in lines:
        log.write(line)
    log.close()
    assert path.with_name("calls.jsonl.2").read_bytes() == lines[0]
    assert path.with_name("calls.jsonl.1").read_bytes() == lines[1]
    assert path.read_bytes() == lines[2]


def test_the_writer_keeps_whole_lines_from_each_pipe(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    writer = CallLogWriter(CallLog(str(path), max_bytes=10_000, backups=3))
    first_r, first_w = os.pipe()
    second_r, second_w = os.pipe()
    writer.add(first_r)
    writer.add(second_r)
    one, two = _line(1), _line(2)
    # Halves of lines from both pipes, interleaved: never interleaved in the file.
    os.write(first_w, one[:40])
    os.write(second_w, two[:60])
    os.write(first_w, one[40:] + one[:10])
    os.write(second_w, two[60:])
    os.close(second_w)
    os.close(first_w)  # ends in the middle of its second line: that part is lost
    writer.close()
    assert sorted(path.read_bytes().splitlines(keepends=True)) == sorted([one, two])


def test_a_worker_pipe_never_blocks_and_hands_everything_over_at_close(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    pipe = CallLogPipe(write_end)
    lines = [_line(index, 500) for index in range(1000)]  # 500 KB: far more than the pipe holds
    received = bytearray()

    async def worker() -> None:
        for line in lines[:500]:
            pipe.write(line)
        pipe.flush()  # the pipe fills: the rest waits in memory, nothing blocks
        assert len(pipe._pending) > 0
        reader = threading.Thread(target=lambda: received.extend(_read_all(read_end)))
        reader.start()
        for _ in range(200):  # the event loop hands the rest over as the reader reads
            await asyncio.sleep(0.005)
            if not pipe._pending:
                break
        assert not pipe._pending
        for line in lines[500:]:
            pipe.write(line)
        pipe.close()  # blocks until all is handed over
        reader.join(10)

    asyncio.run(worker())
    os.close(read_end)
    assert bytes(received) == b"".join(lines)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


HEADER_CASES = [
    [(b"authorization", b"Bearer sk-1")],
    [(b"authorization", b"bearer   sk-1 ")],
    [(b"x-api-key", b"sk-1")],
    [(b"host", b"h"), (b"api-key", b"sk-2"), (b"authorization", b"Bearer sk-1")],
    [(b"authorization", b"Bearer "), (b"x-api-key", b"sk-3")],
    [(b"authorization", b"")],
    [],
    [(b"x-team", b"a")],
]


@pytest.mark.parametrize("tenant_header", [None, b"x-team"])
def test_tenants_name_the_same_tenant_as_tenant_of(tenant_header: bytes | None) -> None:
    tenants = Tenants(tenant_header)
    for _ in range(2):  # computed, then remembered
        for headers in HEADER_CASES:
            assert tenants.of(headers) == tenant_of(headers, tenant_header)


def test_tenants_never_keep_the_credential_and_stay_bounded() -> None:
    tenants = Tenants(size=8)
    secrets = [f"sk-secret-{i:04d}".encode() for i in range(20)]
    for secret in secrets:
        assert tenants.of([(b"authorization", b"Bearer " + secret)]) == tenant_of(
            [(b"x-api-key", secret)]
        )
        kept = repr(tenants._known).encode()
        assert not any(s in kept or s.hex().encode() in kept for s in secrets)
        assert len(tenants._known) <= 8
    assert tenants.of([(b"authorization", b"Bearer " + secrets[0])]) == tenant_of(
        [(b"x-api-key", secrets[0])]
    )


def answer(observer: Observer, outcome: str, status: int, **fields: object) -> None:
    rec = observer.start("POST", "/v1/chat/completions", "t", [])
    rec.outcome, rec.status = outcome, status
    for name, value in fields.items():
        setattr(rec, name, value)
    observer.finish(rec)


def test_the_counts_of_answered_requests_and_upstream_calls() -> None:
    metrics = Metrics()
    observer = Observer(metrics, None, ManualClock())
    answer(observer, "forwarded", 200, key="a", upstream_latency=0.0)
    answer(observer, "replayed", 200, key="a")
    answer(observer, "replayed", 200, key="a")
    answer(observer, "joined", 200, key="b")
    answer(observer, "error", 503, key="c")
    answer(observer, "error", 502, key="d")
    answer(observer, "passthrough", 200, client_retry=2, upstream_latency=0.0)
    answer(observer, "passthrough", 200, client_retry=0)
    answer(observer, "rejected", 499)
    gpt = UpstreamFacts(status=200, model="gpt-4o-mini", cost_usd=0.5, latency=0.02, attempts=1)
    gpt.usage = {"input_tokens": 3, "output_tokens": 4}
    observer.upstream_call(gpt, "/v1/chat/completions")
    observer.upstream_call(gpt, "/v1/chat/completions")
    observer.upstream_call(UpstreamFacts(status=200, model="mystery"), "/v1/x")
    observer.upstream_call(UpstreamFacts(status=None, latency=1.0), "/v1/x")
    observer.upstream_call(UpstreamFacts(status=None, cancelled=True, attempts=1), "/v1/x")
    text = metrics.render().decode()
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 1
    assert metric(text, "payonce_requests_total", outcome="replayed", status_class="2xx") == 2
    assert metric(text, "payonce_requests_total", outcome="joined", status_class="2xx") == 1
    assert metric(text, "payonce_requests_total", outcome="error", status_class="5xx") == 2
    assert metric(text, "payonce_requests_total", outcome="passthrough", status_class="2xx") == 2
    # A client that left is not a 4xx answer it received: a class of its own.
    assert metric(text, "payonce_requests_total", outcome="rejected", status_class="499") == 1
    assert metric(text, "payonce_requests_total", outcome="rejected", status_class="4xx") == 0
    assert metric(text, "payonce_duplicates_prevented_total", kind="replayed") == 2
    assert metric(text, "payonce_duplicates_prevented_total", kind="joined") == 1
    assert metric(text, "payonce_store_errors_total") == 1
    assert metric(text, "payonce_unprotected_retries_total") == 1
    assert metric(text, "payonce_gateway_overhead_seconds_count") == 2
    assert metric(text, "payonce_in_flight_requests") == 0
    assert metric(text, "payonce_upstream_calls_total", status="200") == 3
    assert metric(text, "payonce_upstream_calls_total", status="error") == 1
    assert metric(text, "payonce_upstream_calls_total", status="cancelled") == 1
    assert metric(text, "payonce_upstream_latency_seconds_count") == 3
    assert metric(text, "payonce_upstream_latency_seconds_sum") == pytest.approx(1.04)
    assert metric(text, "payonce_tokens_total", kind="spent", direction="input") == 6
    assert metric(text, "payonce_tokens_total", kind="spent", direction="output") == 8
    assert metric(text, "payonce_cost_usd_total", model="gpt-4o-mini") == 1.0
    assert metric(text, "payonce_unknown_cost_calls_total") == 1
    # Counts are applied once: a second scrape adds nothing.
    assert metrics.render().decode() == text

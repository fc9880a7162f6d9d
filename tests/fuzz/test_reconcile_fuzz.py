"""reconcile's CSV and JSON readers, fed broken, undecodable and oddly written bills.

Whatever a bill holds, ``reconcile`` gives a report (bad rows counted as
malformed) or a ConfigError (exit 2, one line); never another exception.
"""

from __future__ import annotations

import json
import tempfile
from decimal import Decimal
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from payonce.errors import ConfigError
from payonce.reconcile.run import reconcile
from tests.reconcile.data import BILL, TOTALS, ledger_csv, payonce_calls

READERS = settings(max_examples=10, deadline=None)
_directory = Path(tempfile.mkdtemp(prefix="payonce-fuzz-reconcile-"))
CALLS = payonce_calls(_directory)
LEDGER = ledger_csv(_directory).read_bytes()
_count = iter(range(10**9))


def run(bill: bytes, name: str = "bill.csv") -> object:
    path = _directory / f"{next(_count)}-{name}"
    path.write_bytes(bill)
    try:
        return reconcile([CALLS], [path])
    except ConfigError as exc:
        error = exc
    assert "\n" not in str(error).strip(), "one line for the terminal"
    return error


edits = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=len(LEDGER)),
        st.integers(min_value=0, max_value=8),
        st.sampled_from(
            [b"\xff", b"\xc3", b'"', b",", b"\r", b"\n", b"\x00", b"\xef\xbb\xbf", b"1e400"]
        ),
    ),
    min_size=1,
    max_size=6,
)


@READERS
@given(edits)
@example([(0, 0, b"\xef\xbb\xbf")])
@example([(len(LEDGER) // 2, 0, b"\xff\xfe")])
@example([(120, 4, b'"')])
def test_a_damaged_csv_bill_is_a_report_or_a_config_error(
    changes: list[tuple[int, int, bytes]],
) -> None:
    bill = bytearray(LEDGER)
    for at, cut, inserted in changes:
        bill[at : at + cut] = inserted
    run(bytes(bill))


@READERS
@given(st.binary(max_size=200), st.sampled_from(["bill.csv", "bill.jsonl", "bill.json"]))
def test_random_bytes_as_a_bill_are_a_report_or_a_config_error(bill: bytes, name: str) -> None:
    run(bill, name)


def _line(pid: str, model: str, cost: str, ts: str, extra: str = "") -> bytes:
    return (
        f'{{"provider_request_id":"{pid}","model":"{model}","endpoint":"/v1/chat/completions",'
        f'"input_tokens":100,"output_tokens":50,"cost_usd":{cost},"finished_at":"{ts}"{extra}}}\n'
    ).encode()


spellings = st.sampled_from(["{}", '"{}"', "{}0", "{}e0", "{}E+0"])


@READERS
@given(st.lists(spellings, min_size=len(BILL), max_size=len(BILL)))
def test_a_cost_written_any_way_costs_the_same(written: list[str]) -> None:
    bill = b"".join(
        _line(line.pid, line.model, spelling.format(line.cost), line.ts)
        for line, spelling in zip(BILL, written, strict=True)
    )
    report = run(bill, "bill.jsonl")
    assert not isinstance(report, ConfigError), report
    assert report.totals.total_cost_usd == Decimal(str(TOTALS["total_cost_usd"]))


def test_a_repeated_member_in_a_json_bill_line_is_its_first() -> None:
    first = BILL[0]
    repeated = _line(first.pid, first.model, "0.10", first.ts, ',"cost_usd":5')
    rest = b"".join(_line(b.pid, b.model, b.cost, b.ts) for b in BILL[1:])
    report = run(repeated + rest, "bill.jsonl")
    assert not isinstance(report, ConfigError), report
    assert report.totals.total_cost_usd == Decimal(str(TOTALS["total_cost_usd"]))


@settings(max_examples=5, deadline=None)
@given(st.integers(min_value=100, max_value=20_000))
def test_a_deeply_nested_json_bill_line_is_malformed_not_a_crash(depth: int) -> None:
    nested = '{"x":' * depth + "1" + "}" * depth
    lines = [_line(b.pid, b.model, b.cost, b.ts) for b in BILL]
    lines[1] = _line(BILL[1].pid, BILL[1].model, BILL[1].cost, BILL[1].ts, f',"deep":{nested}')
    lines.append(("[" * depth + "]" * depth + "\n").encode())
    report = run(b"".join(lines), "bill.jsonl")
    assert not isinstance(report, ConfigError), report
    assert report.malformed_rows >= 1
    # On the first line, which decides how the file is read: past what json reads
    # (about 1,000 levels) it is no JSON line, so the file is taken for a document,
    # which it is not either: a ConfigError (exit 2), not a traceback.
    run(b"".join(lines[1:]), "bill.jsonl")


def test_json_written_as_python_would_write_it_is_read() -> None:
    records = [
        {"provider_request_id": b.pid, "model": b.model, "endpoint": "/v1/chat/completions",
         "input_tokens": 100, "output_tokens": 50, "cost_usd": float(b.cost), "finished_at": b.ts}
        for b in BILL
    ]  # fmt: skip
    report = run(json.dumps(records).encode(), "bill.json")
    assert not isinstance(report, ConfigError), report
    assert report.totals.total_cost_usd == Decimal(str(TOTALS["total_cost_usd"]))

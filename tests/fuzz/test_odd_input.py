"""docs/gateway.md, "Odd input: what the gateway decides": one test per row of its table.

Each row's first cell names a check below (``@row``); a row without a check, or
a check without a row, fails ``test_every_row_of_the_table_has_a_test``. Keyed
rows are shown from the outside, on a live gateway in front of the simulator.
"""

from __future__ import annotations

import itertools
import socket
import tempfile
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import httpx2 as httpx
import pytest

from payonce.errors import ConfigError
from payonce.gateway.sse import EventSplitter, relayed
from payonce.reconcile.run import reconcile
from tests.fuzz.wire import exchange, request
from tests.reconcile.data import BILL, TOTALS, payonce_calls
from tests.support.processes import Process
from tests.support.sim import Sim

ROOT = Path(__file__).resolve().parents[2]
Check = Callable[[Process, Sim], None]
ROWS: dict[str, Check] = {}
_keys = itertools.count()
AUTH = b"Bearer sk-odd-input"
RUN = b"3fa94c1e"  # a run's tag in event ids (payonce.gateway.sse.run_tag)


def row(label: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        assert label not in ROWS, label
        ROWS[label] = check
        return check

    return register


def _table_labels() -> list[str]:
    text = (ROOT / "docs/gateway.md").read_text()
    section = text.split("## Odd input: what the gateway decides", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [line[2:].split(" | ", 1)[0] for line in lines[1:]]  # after the header row


def test_every_row_of_the_table_has_a_test() -> None:
    assert _table_labels() == list(ROWS)


# --- helpers ---------------------------------------------------------------------------


def fresh_key() -> bytes:
    return b"odd-%d" % next(_keys)


def send(
    gateway: Process,
    key: bytes | None,
    body: bytes,
    *,
    content_type: bytes = b"application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    fields = [(b"Authorization", AUTH)] + ([(b"Idempotency-Key", key)] if key is not None else [])
    head = request([*fields, *(extra or [])]).replace(
        b"Content-Type: application/json", b"Content-Type: " + content_type
    )
    return exchange(gateway, head, body)


def chat_with(value: bytes) -> bytes:
    return (
        b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"x":%s}'
        % value
    )


def same_request(
    gateway: Process, first: bytes, then: bytes, content_type: bytes = b"application/json"
) -> bool:
    """Send ``first`` with a new key, then ``then`` with it: replayed (True) or 422 (False)."""
    key = fresh_key()
    status, _, body = send(gateway, key, first, content_type=content_type)
    assert status < 500, body
    again, headers, body = send(gateway, key, then, content_type=content_type)
    if again == 422:
        return False
    assert again == status and headers[b"idempotent-replayed"] == b"true", (again, body)
    return True


def problem_type(answer: tuple[int, dict[bytes, bytes], bytes]) -> tuple[int, str]:
    status, headers, body = answer
    assert headers[b"content-type"] == b"application/problem+json", body
    return status, body.split(b"problems.md#", 1)[1].split(b'"', 1)[0].decode()


# --- the fingerprint -------------------------------------------------------------------


@row('`{"n":1}` and `{"n":1.0}`')
def _(gateway: Process, sim: Sim) -> None:
    assert not same_request(gateway, chat_with(b"1"), chat_with(b"1.0"))


@row("`1.0` and `1.00`; `1e2`, `1E+2` and `100.0`")
def _(gateway: Process, sim: Sim) -> None:
    assert same_request(gateway, chat_with(b"1.0"), chat_with(b"1.00"))
    assert same_request(gateway, chat_with(b"1e2"), chat_with(b"1E+2"))
    assert same_request(gateway, chat_with(b"1e2"), chat_with(b"100.0"))


@row("`1e2` and `100`")
def _(gateway: Process, sim: Sim) -> None:
    assert not same_request(gateway, chat_with(b"1e2"), chat_with(b"100"))


@row("`-0` and `0`; `-0.0` and `0.0`")
def _(gateway: Process, sim: Sim) -> None:
    assert same_request(gateway, chat_with(b"-0"), chat_with(b"0"))
    assert not same_request(gateway, chat_with(b"-0.0"), chat_with(b"0.0"))


@row("integers past 2^64 (`18446744073709551616`, `18446744073709551617`)")
def _(gateway: Process, sim: Sim) -> None:
    assert same_request(
        gateway, chat_with(b"18446744073709551616"), chat_with(b"18446744073709551617")
    )


@row("numbers past a double (`1e400`, `2e999`, `Infinity`)")
def _(gateway: Process, sim: Sim) -> None:
    assert same_request(gateway, chat_with(b"1e400"), chat_with(b"2e999"))
    assert same_request(gateway, chat_with(b"1e400"), chat_with(b"Infinity"))


@row('a repeated member (`{"a":1,"a":2}`)')
def _(gateway: Process, sim: Sim) -> None:
    repeated = chat_with(b'{"a":1,"a":2}')
    assert same_request(gateway, repeated, chat_with(b'{"a":2}'))
    assert not same_request(gateway, repeated, chat_with(b'{"a":1}'))


@row('`"\\u00e9"` and `"é"`')
def _(gateway: Process, sim: Sim) -> None:
    assert same_request(gateway, chat_with(b'"\\u00e9"'), chat_with('"é"'.encode()))


@row("a UTF-8 byte order mark before the JSON")
def _(gateway: Process, sim: Sim) -> None:
    body = chat_with(b"1")
    assert same_request(gateway, b"\xef\xbb\xbf" + body, body)


@row("a body that is not UTF-8, not JSON, or nested past 1,024 levels")
def _(gateway: Process, sim: Sim) -> None:
    nested = chat_with(b"[" * 1100 + b"]" * 1100)
    for body in (b'{"x":"\xff\xfe"}', b'{"a": 1} trailing', nested):
        assert same_request(gateway, body, body), "byte for byte: replayed"
        assert not same_request(gateway, body, body.replace(b":", b": ", 1)), "one space: another"


@row("a JSON body sent as `text/plain`")
def _(gateway: Process, sim: Sim) -> None:
    plain = b"text/plain"
    assert not same_request(gateway, b'{"a":1,"b":2}', b'{"b":2,"a":1}', plain)
    assert same_request(gateway, b'{"a":1,"b":2}', b'{"b":2,"a":1}')


# --- the key ---------------------------------------------------------------------------


def _replays(gateway: Process, first: bytes, then: bytes) -> bool:
    status, _, body = send(gateway, first, chat_with(b"1"))
    assert status == 200, body
    again, headers, _ = send(gateway, then, chat_with(b"1"))
    return again == 200 and headers[b"idempotent-replayed"] == b"true"


@row('`order-42` and `"order-42"`')
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    assert _replays(gateway, key, b'"' + key + b'"')


@row("blanks around the key (`  order-42<tab>`)")
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    assert _replays(gateway, key, b"  " + key + b"\t")


@row("a space inside a bare key (`order 42`)")
def _(gateway: Process, sim: Sim) -> None:
    assert problem_type(send(gateway, b"order 42", chat_with(b"1"))) == (400, "invalid-key")
    quoted = b'"' + fresh_key() + b' 42"'
    assert send(gateway, quoted, chat_with(b"1"))[0] == 200


@row("a key of 256 characters")
def _(gateway: Process, sim: Sim) -> None:
    assert problem_type(send(gateway, b"k" * 256, chat_with(b"1"))) == (400, "invalid-key")
    assert send(gateway, fresh_key().ljust(255, b"k"), chat_with(b"1"))[0] == 200


@row("non-ASCII bytes in the key (UTF-8 `ключ`, latin-1 `\\xe9`)")
def _(gateway: Process, sim: Sim) -> None:
    for key in ("ключ".encode(), b"caf\xe9"):
        assert problem_type(send(gateway, key, chat_with(b"1"))) == (400, "invalid-key")


@row("`a,b` and `a, b`")
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key() + b",b"
    assert send(gateway, key, chat_with(b"1"))[0] == 200
    status = httpx.get(
        f"{gateway.url}/_payonce/requests/{key.decode().replace(',', '%2C')}",
        headers={"Authorization": AUTH.decode()},
        timeout=10,
    )
    assert status.json()["key"] == key.decode()
    assert problem_type(send(gateway, b"a, b", chat_with(b"1"))) == (400, "invalid-key")


@row("the same key in several header fields")
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    extra = [(b"Idempotency-Key", key), (b"X-Idempotency-Key", key)]
    assert send(gateway, key, chat_with(b"1"), extra=extra)[0] == 200
    again = send(gateway, key, chat_with(b"1"))
    assert again[0] == 200 and again[1][b"idempotent-replayed"] == b"true"


@row("two different keys (two `Idempotency-Key` fields, or it and `X-Idempotency-Key`)")
def _(gateway: Process, sim: Sim) -> None:
    for name in (b"Idempotency-Key", b"X-Idempotency-Key"):
        extra = [(name, fresh_key())]
        assert problem_type(send(gateway, fresh_key(), chat_with(b"1"), extra=extra)) == (
            400,
            "invalid-key",
        )
    business = fresh_key()
    minted = [(b"Idempotency-Key", b"stainless-python-retry-0d3c")]
    assert (
        send(gateway, None, chat_with(b"1"), extra=[*minted, (b"X-Idempotency-Key", business)])[0]
        == 200
    )
    assert _replays(gateway, business, business)


@row("an empty key")
def _(gateway: Process, sim: Sim) -> None:
    assert problem_type(send(gateway, b"", chat_with(b"1"))) == (400, "invalid-key")


# --- header fields ---------------------------------------------------------------------


@row("a credential that is not ASCII (`x-api-key: \\xff\\xfe`)")
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    head = request([(b"X-Api-Key", b"\xff\xfe"), (b"Idempotency-Key", key)])
    assert exchange(gateway, head, chat_with(b"1"))[0] == 200
    assert exchange(gateway, head, chat_with(b"1"))[1][b"idempotent-replayed"] == b"true"
    other = request([(b"X-Api-Key", b"\xff\xfd"), (b"Idempotency-Key", key)])
    assert exchange(gateway, other, chat_with(b"1"))[1][b"idempotent-replayed"] == b"false"


@row("NUL, CR or LF in a header value; a header name that is not a token")
def _(gateway: Process, sim: Sim) -> None:
    for field in ((b"X-A", b"a\x00b"), (b"X-A", b"a\rb"), (b"Bad Name", b"1"), (b"X-\xff", b"1")):
        answer = exchange(gateway, request([field]))
        assert problem_type(answer) == (400, "malformed-request"), field
        assert answer[1][b"connection"] == b"close"


@row("`Transfer-Encoding` with `Content-Length`, two `Content-Length`s, a folded (obs-fold) line")
def _(gateway: Process, sim: Sim) -> None:
    port = int(gateway.url.rsplit(":", 1)[1])
    start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    for fields in (
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Idempotency-Key: odd\r\n  folded\r\nContent-Length: 2\r\n",
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(start + fields + b"\r\n{}")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]
        assert b"problems.md#malformed-request" in answer and b"connection: close" in answer


def _raw(gateway: Process, data: bytes) -> bytes:
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@row("`Transfer-Encoding: gzip, chunked` (a coding besides chunked)")
def _(gateway: Process, sim: Sim) -> None:
    before = sim.requests()
    start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    for coding, status, slug in (
        (b"gzip, chunked", 501, b"transfer-coding-not-implemented"),
        (b"gzip", 400, b"malformed-request"),
        (b"chunked, chunked", 400, b"malformed-request"),
    ):
        answer = _raw(
            gateway, start + b"Transfer-Encoding: " + coding + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:100]
        assert b"problems.md#" + slug in answer and b"connection: close" in answer
    assert sim.requests() == before


@row("an HTTP/1.1 request without `Host`, with two, or with an empty one")
def _(gateway: Process, sim: Sim) -> None:
    before = sim.requests()
    for hosts in (b"", b"Host: a\r\nHost: b\r\n", b"Host: \r\n"):
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\n"
            + hosts
            + b"Content-Type: application/json\r\n"
        )
        answer = exchange(gateway, head)
        assert problem_type(answer) == (400, "malformed-request"), hosts
    assert sim.requests() == before
    status, _, body = exchange(gateway, b"POST /v1/chat/completions HTTP/1.0\r\n")
    assert status == 200, body


@row("`Expect` other than `100-continue` (`Expect: foo`, `100-continue, foo`)")
def _(gateway: Process, sim: Sim) -> None:
    before = sim.requests()
    for value in (b"foo", b"100-continue, foo"):
        for key in (None, fresh_key()):
            answer = send(gateway, key, chat_with(b"1"), extra=[(b"Expect", value)])
            assert problem_type(answer) == (417, "expectation-failed"), value
    assert sim.requests() == before
    status, _, body = send(gateway, None, chat_with(b"1"), extra=[(b"Expect", b"100-Continue")])
    # The interim 100 Continue first, then the answer.
    assert status == 100 and body.startswith(b"HTTP/1.1 200 "), body


@row("a `HEAD` with an `Idempotency-Key`")
def _(gateway: Process, sim: Sim) -> None:
    length = len(httpx.get(sim.url + "/v1/models", timeout=10).content)
    key = fresh_key().decode()
    head = httpx.head(gateway.url + "/v1/models", headers={"Idempotency-Key": key}, timeout=10)
    assert head.status_code == 200 and "idempotent-replayed" not in head.headers
    assert head.headers["content-length"] == str(length)
    get = httpx.get(gateway.url + "/v1/models", headers={"Idempotency-Key": key}, timeout=10)
    assert get.headers["idempotent-replayed"] == "false", "a new key for the GET"


@row('`/_payonce/requests/%22k1%22` (or `"k1"`)')
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    assert send(gateway, key, chat_with(b"1"))[0] == 200
    headers = {"Authorization": AUTH.decode()}
    for path in (b"%22" + key + b"%22", key, b'"' + key + b'"'):
        status = httpx.get(f"{gateway.url}/_payonce/requests/{path.decode()}", headers=headers)
        assert status.json()["key"] == key.decode(), path


@row("a head over 64 KiB, or more than 100 header fields (repeated keys count)")
def _(gateway: Process, sim: Sim) -> None:
    assert problem_type(exchange(gateway, request([(b"X-Big", b"b" * 70_000)]))) == (
        431,
        "headers-too-large",
    )
    repeated = [(b"Idempotency-Key", fresh_key())] * 101
    assert problem_type(exchange(gateway, request(repeated))) == (431, "headers-too-large")


@row("a field the upstream refuses (`Content-Type` twice; a field over 8 KiB for aiohttp)")
def _(gateway: Process, sim: Sim) -> None:
    for extra in ([(b"Content-Type", b"application/json")], [(b"X-Big", b"b" * 9000)]):
        key = fresh_key()
        status, headers, body = send(gateway, key, chat_with(b"1"), extra=extra)
        assert status == 400 and headers[b"idempotent-replayed"] == b"false", body
        assert headers[b"content-type"].startswith(b"text/plain"), "aiohttp's own answer"
        again = send(gateway, key, chat_with(b"1"), extra=extra)
        assert again[0] == 400 and again[1][b"idempotent-replayed"] == b"true", "stored"


@row("`Last-Event-ID` that is no id this gateway sends (`seven`, `-1`)")
def _(gateway: Process, sim: Sim) -> None:
    for value in (b"seven", b"-1", b"5-xyz", b"5-3fa94c1e-1"):
        answer = send(gateway, fresh_key(), chat_with(b"1"), extra=[(b"Last-Event-ID", value)])
        assert problem_type(answer) == (400, "invalid-key"), value


@row("`Last-Event-ID` that is a plain number (`5`: an earlier version's id)")
def _(gateway: Process, sim: Sim) -> None:
    key = fresh_key()
    assert send(gateway, key, chat_with(b"1"))[0] == 200
    for target in (key, fresh_key()):
        answer = send(gateway, target, chat_with(b"1"), extra=[(b"Last-Event-ID", b"5")])
        assert problem_type(answer) == (412, "stream-not-resumable")
        assert answer[1][b"x-should-retry"] == b"false"
    status, headers, _ = send(gateway, key, chat_with(b"1"), extra=[(b"Last-Event-ID", b"0")])
    assert (status, headers[b"idempotent-replayed"]) == (200, b"true")


# --- streams ---------------------------------------------------------------------------


def _events(stream: bytes) -> list[bytes]:
    splitter = EventSplitter()
    return splitter.feed(stream) + splitter.close()


@row("mixed line endings in a stream (`data: a\\n\\r\\n`)")
def _(gateway: Process, sim: Sim) -> None:
    assert _events(b"data: a\n\r\ndata: b\r\n\n") == [b"data: a\n\r\n", b"data: b\r\n\n"]
    assert relayed(b"data: a\n\r\n", 1, RUN) == b"data: a\nid: 1-%s\r\n\r\n" % RUN


@row("empty lines before an event")
def _(gateway: Process, sim: Sim) -> None:
    assert _events(b"\n\r\n\ndata: a\n\n") == [b"\n\r\n\ndata: a\n\n"]
    assert _events(b"\n\n\n") == []
    assert relayed(b"\n\r\n\ndata: a\n\n", 2, RUN) == b"data: a\nid: 2-%s\n\n" % RUN


@row("a block without data (a comment such as `: ping`, or `event: x` alone)")
def _(gateway: Process, sim: Sim) -> None:
    assert _events(b": ping\r\n\r\ndata: a\n\n") == [b": ping\r\n\r\n", b"data: a\n\n"]
    assert relayed(b": ping\r\n\r\n", 1, RUN) == b": ping\n"
    assert relayed(b"\n: a\rretry: 5\nevent: x\nid: 7\n\n", 2, RUN) == b": a\nretry: 5\n"
    assert relayed(b"event: x\n\n", 3, RUN) == b""


@row("a stream that ends without its empty line")
def _(gateway: Process, sim: Sim) -> None:
    assert _events(b"data: a") == [b"data: a\n\n"]
    assert _events(b"data: a\r\n") == [b"data: a\r\n\n"]
    assert _events(b"data: a\r") == [b"data: a\r\r"]
    assert relayed(_events(b"data: a")[0], 3, RUN) == b"data: a\nid: 3-%s\n\n" % RUN


@row("a stream cut at any byte")
def _(gateway: Process, sim: Sim) -> None:
    stream = b"data: a\r\n\r\ndata: b\r\rdata: c\n\n: ping\r\n\n"
    whole = _events(stream)
    for at in range(len(stream) + 1):
        splitter = EventSplitter()
        assert splitter.feed(stream[:at]) + splitter.feed(stream[at:]) + splitter.close() == whole


# --- the simulator ---------------------------------------------------------------------


@row("the simulator: a body nested past 1,000 levels, or not UTF-8")
def _(gateway: Process, sim: Sim) -> None:
    for body in (b"[" * 5000 + b"]" * 5000, b'{"model":"\xff"}'):
        response = httpx.post(
            sim.url + "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=10,
        )
        assert response.status_code == 400
        assert "could not parse the JSON body" in response.json()["error"]["message"]


# --- reconcile -------------------------------------------------------------------------

_directory = Path(tempfile.mkdtemp(prefix="payonce-odd-input-"))
_files = itertools.count()


def _reconciled(bill: bytes, name: str = "bill.jsonl") -> object:
    path = _directory / f"{next(_files)}-{name}"
    path.write_bytes(bill)
    try:
        return reconcile([payonce_calls(_directory)], [path])
    except ConfigError as exc:
        return exc


def _line(index: int, cost: str | None = None, extra: str = "") -> bytes:
    b = BILL[index]
    return (
        f'{{"provider_request_id":"{b.pid}","model":"{b.model}","endpoint":"/v1/chat/completions",'
        f'"input_tokens":100,"output_tokens":50,"cost_usd":{cost or b.cost},'
        f'"finished_at":"{b.ts}"{extra}}}\n'
    ).encode()


def _bill(first: bytes) -> bytes:
    return first + b"".join(_line(index) for index in range(1, len(BILL)))


@row("reconcile: a bill line nested past 1,000 levels")
def _(gateway: Process, sim: Sim) -> None:
    deep = ',"deep":' + '{"x":' * 5000 + "1" + "}" * 5000
    lines = [_line(0), _line(1, extra=deep), *map(_line, range(2, len(BILL)))]
    report = _reconciled(b"".join(lines))
    assert not isinstance(report, ConfigError), report
    assert report.malformed_rows == 0, "only the members it needs are read"  # type: ignore[attr-defined]
    report = _reconciled(b"".join(lines) + b"[" * 5000 + b"]" * 5000 + b"\n")
    assert report.malformed_rows == 1, "a line that is no object"  # type: ignore[attr-defined]
    assert isinstance(_reconciled(_bill(_line(0, extra=deep))), ConfigError)


@row('reconcile: a cost written `0.10`, `"0.10"`, `0.100` or `0.10e0`')
def _(gateway: Process, sim: Sim) -> None:
    for spelling in ("0.10", '"0.10"', "0.100", "0.10e0"):
        report = _reconciled(_bill(_line(0, cost=spelling)))
        assert report.totals.total_cost_usd == Decimal(str(TOTALS["total_cost_usd"]))  # type: ignore[attr-defined]


@row("reconcile: a repeated member in a JSON bill line")
def _(gateway: Process, sim: Sim) -> None:
    report = _reconciled(_bill(_line(0, extra=',"cost_usd":5')))
    assert report.totals.total_cost_usd == Decimal(str(TOTALS["total_cost_usd"]))  # type: ignore[attr-defined]


@row("reconcile: invalid UTF-8 or random bytes in a bill")
def _(gateway: Process, sim: Sim) -> None:
    csv = b"provider_request_id,model,endpoint,input_tokens,output_tokens,cost_usd,finished_at\n"
    csv += b"".join(
        f"{b.pid},{b.model},/v1/chat/completions,100,50,{b.cost},{b.ts}\n".encode() for b in BILL
    )
    report = _reconciled(csv.replace(b"r2,gpt-4o", b"r2,gpt-\xff4o"), "bill.csv")
    assert [row.line for row in report.malformed] == [3]  # type: ignore[attr-defined]
    refused = _reconciled(_bill(_line(0).replace(b"gpt-4o-mini", b"gpt-\xff\xfe")))
    assert isinstance(refused, ConfigError) and "\n" not in str(refused), refused
    assert isinstance(_reconciled(b"\x00\xff\xfe\x01", "bill.csv"), ConfigError)


@pytest.mark.parametrize("label", list(ROWS))
def test_the_decision(label: str, fuzz_gateway: Process, fuzz_sim: Sim) -> None:
    ROWS[label](fuzz_gateway, fuzz_sim)

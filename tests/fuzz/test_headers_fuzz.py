"""Header handling, from raw sockets against a live gateway.

Every request gets an HTTP answer, never a reset or a 5xx: the upstream's, or
one of the gateway's problem documents. Huge, repeated and undecodable header
fields included.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.conftest import LIVE
from tests.fuzz.wire import answered_well, exchange, request
from tests.support.processes import Process

_keys = itertools.count()


@pytest.fixture
def gateway(fuzz_gateway: Process) -> Process:
    return fuzz_gateway


names = st.sampled_from(
    [
        b"Idempotency-Key",
        b"X-Idempotency-Key",
        b"Authorization",
        b"X-Api-Key",
        b"Last-Event-ID",
        b"Content-Type",
        b"X-Custom",
        b"Accept-Encoding",
        b"X-\xff\xfe",
        b"Bad Name",
        b"",
    ]
)
values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [b"\xe9t\xe9", b"\xff\xfe", b'"quoted key"', b"a, b", b"a,b", b"\x00", b"Bearer "]
    ),
)


@LIVE
@given(st.lists(st.tuples(names, values), max_size=6))
@example([(b"Idempotency-Key", b"same"), (b"Idempotency-Key", b"same")])
@example([(b"Idempotency-Key", b"one"), (b"Idempotency-Key", b"two")])
@example([(b"X-Api-Key", b"\xff\xfe"), (b"Idempotency-Key", b"latin-credential")])
@example([(b"Idempotency-Key", b"\xe9t\xe9")])
@example([(b"Content-Type", b"\xff/json")])
@example([(b"X-Custom", b"a\rb")])
def test_any_header_fields_get_an_answer(
    gateway: Process, fields: list[tuple[bytes, bytes]]
) -> None:
    answered_well(*exchange(gateway, request(fields, keyed=True)))


@LIVE
@given(
    st.integers(min_value=60_000, max_value=300_000),
    st.sampled_from([b"X-Big", b"Idempotency-Key"]),
)
@example(65_536, b"X-Big")
def test_a_huge_header_is_served_or_431(gateway: Process, size: int, name: bytes) -> None:
    status, headers, body = exchange(
        gateway, request([(name, b"k" * size)], keyed=name == b"X-Big")
    )
    answered_well(status, headers, body)
    assert status in (200, 400, 431), status


@LIVE
@given(st.integers(min_value=1, max_value=400))
@example(95)
@example(96)
def test_repeated_key_headers_are_one_key_or_431(gateway: Process, count: int) -> None:
    key = b"repeated-%d" % next(_keys)
    fields = [(b"Authorization", b"Bearer sk-repeat")] + [(b"Idempotency-Key", key)] * count
    status, headers, body = exchange(gateway, request(fields))
    answered_well(status, headers, body)
    # Host, Content-Type, Authorization, Content-Length and Connection besides.
    if count + 5 > 100:
        assert status == 431
        return
    assert status == 200 and headers[b"idempotent-replayed"] == b"false"
    again = exchange(gateway, request(fields[:2]))
    assert again[0] == 200 and again[1][b"idempotent-replayed"] == b"true"

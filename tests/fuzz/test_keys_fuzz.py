"""The key parser and the fingerprint, fed random bytes and JSON written every way there is."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from payonce.errors import InvalidIdempotencyKey
from payonce.gateway.keys import MAX_KEY_LENGTH, fingerprint, parse_key, read_key
from tests.fuzz.conftest import FUZZ

KEY_HEADERS = (b"idempotency-key", b"x-idempotency-key")
printable = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def sf_string(key: str) -> bytes:
    return b'"' + key.replace("\\", "\\\\").replace('"', '\\"').encode() + b'"'


@FUZZ
@given(st.binary(max_size=300))
@example(b'"\\')
@example(b'"a\\x"')
@example(b"\xff\xfe")
@example(b'"' + b"a" * 255 + b'"')
def test_any_header_value_is_a_key_or_an_invalid_key_error(raw: bytes) -> None:
    try:
        key = parse_key(raw)
    except InvalidIdempotencyKey:
        return
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert all(0x20 <= ord(ch) <= 0x7E for ch in key)


@FUZZ
@given(st.text(printable, min_size=1, max_size=MAX_KEY_LENGTH))
def test_every_key_round_trips_as_an_rfc_8941_string(key: str) -> None:
    assert parse_key(sf_string(key)) == key
    if " " not in key and not key.startswith('"'):
        assert parse_key(key.encode()) == key, "bare and quoted are the same key"
        assert parse_key(b" \t" + key.encode() + b"\t ") == key, "surrounding blanks go"


@FUZZ
@given(
    st.builds(
        lambda key, extra: (key * (MAX_KEY_LENGTH + 40))[: MAX_KEY_LENGTH + extra],
        st.text(printable, min_size=1, max_size=3),
        st.integers(min_value=1, max_value=40),
    )
)
def test_keys_past_255_characters_are_refused(key: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        parse_key(sf_string(key))


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*KEY_HEADERS, b"authorization", b"x-other"]), st.binary(max_size=20)
        ),
        max_size=8,
    )
)
def test_any_set_of_key_headers_gives_one_key_none_or_an_invalid_key_error(
    headers: list[tuple[bytes, bytes]],
) -> None:
    try:
        key = read_key(headers, KEY_HEADERS)
    except InvalidIdempotencyKey:
        return
    carried = [value for name, value in headers if name in KEY_HEADERS]
    assert (key is None) == (not carried)


# --- the fingerprint -------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
content_types = st.sampled_from(
    [None, b"application/json", b"Application/JSON; charset=utf-8", b"text/plain", b"\xff/json"]
)


def fp(body: bytes, content_type: bytes | None = None) -> str:
    return fingerprint("POST", "/v1/chat/completions", body, content_type)


@FUZZ
@given(st.binary(max_size=200), content_types)
@example(b"\xef\xbb\xbf{}", None)
@example(b'"\\ud83d"', None)
@example(b"[" * 2000 + b"]" * 2000, None)
@example(b'{"a":NaN,"b":' + b"[" * 1500 + b"]" * 1500 + b"}", None)
def test_any_body_has_a_fingerprint(body: bytes, content_type: bytes | None) -> None:
    value = fp(body, content_type)
    assert len(value) == 64 and value == fp(body, content_type)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1000, max_value=3000), st.sampled_from([b"[", b'{"a":']))
def test_deep_nesting_near_the_parsers_limits_is_fingerprinted(depth: int, opener: bytes) -> None:
    closer = b"]" if opener == b"[" else b"}"
    inner = b"1" if opener != b"[" else b""
    body = opener * depth + inner + closer * depth
    assert fp(body) != fp(opener * depth + inner + closer * (depth - 1)), "another body"


@FUZZ
@given(json_values)
def test_the_canonical_json_parses_back_to_the_same_value(value: object) -> None:
    compact = json.dumps(value, separators=(",", ":")).encode()
    spaced = json.dumps(value, indent=2, sort_keys=True).encode()
    assert fp(compact) == fp(spaced)


@FUZZ
@given(st.integers(min_value=-(2**53), max_value=2**53))
def test_an_integer_and_the_same_number_as_a_float_are_different_requests(number: int) -> None:
    as_int = b'{"n":%d}' % number
    as_float = b'{"n":%d.0}' % number
    assert fp(as_int) != fp(as_float)
    assert fp(as_float) == fp(b'{"n":%d.000}' % number), "how many zeros does not matter"


@FUZZ
@given(st.integers(min_value=0, max_value=15), st.integers(min_value=1, max_value=9))
def test_an_exponent_is_a_float_whatever_its_spelling(exponent: int, mantissa: int) -> None:
    written = [b"%de%d" % (mantissa, exponent), b"%dE+%d" % (mantissa, exponent)]
    as_float = b"%r" % float(mantissa * 10**exponent)
    as_int = b"%d" % (mantissa * 10**exponent)
    prints = {fp(b'{"n":%s}' % spelling) for spelling in [*written, as_float]}
    assert len(prints) == 1, "1e2, 1E+2 and 100.0 are one number"
    assert fp(b'{"n":%s}' % as_int) not in prints, "100 is an integer"


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(max_size=3), json_values, min_size=1, max_size=4), st.data())
def test_a_repeated_member_is_the_last_one(
    document: dict[str, object], data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(document)))
    earlier = data.draw(json_values)
    assume(earlier != document[name])
    members = [json.dumps(name) + ":" + json.dumps(earlier)]
    members += [json.dumps(k) + ":" + json.dumps(v) for k, v in document.items()]
    repeated = ("{" + ",".join(members) + "}").encode()
    assert fp(repeated) == fp(json.dumps(document).encode())


def test_numbers_past_a_double_are_all_infinity() -> None:
    assert fp(b'{"n":1e400}') == fp(b'{"n":2e999}') == fp(b'{"n":Infinity}')

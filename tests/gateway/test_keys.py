"""Key parsing, tenant hashing and fingerprints, as pure functions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from payonce.errors import InvalidIdempotencyKey
from payonce.gateway.keys import Tenants, fingerprint, is_json, parse_key, read_key, tenant_of


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b"abc", "abc"),
        (b"  padded  ", "padded"),
        (b'"quoted value"', "quoted value"),
        (b'"with \\"escapes\\" and \\\\"', 'with "escapes" and \\'),
        (
            b"stainless-python-retry-6f1c9f0e-1d1b-4a3c-9a3b-0b7f0e7b2c11",
            "stainless-python-retry-6f1c9f0e-1d1b-4a3c-9a3b-0b7f0e7b2c11",
        ),
        (b"x" * 255, "x" * 255),
    ],
)
def test_valid_keys(raw: bytes, key: str) -> None:
    assert parse_key(raw) == key


@pytest.mark.parametrize(
    "raw",
    [b"", b"   ", b"x" * 256, b"a b", b"caf\xc3\xa9", b'"open', b'"a"b', b'"\\n"', b'""', b"\x01"],
)
def test_invalid_keys(raw: bytes) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        parse_key(raw)


def test_read_key_accepts_agreeing_duplicates_and_refuses_disagreeing_ones() -> None:
    names = (b"idempotency-key", b"x-idempotency-key")
    assert read_key([(b"idempotency-key", b"a"), (b"x-idempotency-key", b'"a"')], names) == "a"
    assert read_key([(b"other", b"a")], names) is None
    with pytest.raises(InvalidIdempotencyKey):
        read_key([(b"idempotency-key", b"a"), (b"idempotency-key", b"b")], names)


def test_tenant_is_a_hash_and_ignores_the_bearer_prefix() -> None:
    bearer = tenant_of([(b"authorization", b"Bearer sk-1")])
    assert bearer == tenant_of([(b"x-api-key", b"sk-1")]) == tenant_of([(b"api-key", b"sk-1")])
    assert "sk-1" not in bearer and len(bearer) == 32
    assert bearer != tenant_of([(b"authorization", b"Bearer sk-2")])
    assert tenant_of([]) == "anonymous"
    assert tenant_of([(b"x-team", b"a")], b"x-team") != tenant_of([(b"x-team", b"b")], b"x-team")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6))
def test_fingerprint_ignores_key_order_and_whitespace(document: dict[str, object]) -> None:
    compact = json.dumps(document, separators=(",", ":")).encode()
    reordered = json.dumps(dict(reversed(list(document.items()))), indent=2).encode()
    assert fingerprint("POST", "/v1/x", compact, b"application/json") == fingerprint(
        "POST", "/v1/x", reordered, b"application/json"
    )


def test_fingerprint_keeps_array_order_method_path_and_raw_bodies_apart() -> None:
    base = fingerprint("POST", "/v1/x", b'{"a":[1,2]}', b"application/json")
    assert base != fingerprint("POST", "/v1/x", b'{"a":[2,1]}', b"application/json")
    assert base != fingerprint("PUT", "/v1/x", b'{"a":[1,2]}', b"application/json")
    assert base != fingerprint("POST", "/v1/y", b'{"a":[1,2]}', b"application/json")
    assert fingerprint("POST", "/u", b"not json {", None) != fingerprint(
        "POST", "/u", b"not json  {", None
    )


# Every JSON value an upstream could be sent, including what orjson refuses:
# integers past 64 bits, NaN and infinities, lone surrogates (a cut emoji).
any_text = st.text(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=6)
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=16,
)


@given(any_json)
def test_every_json_value_has_a_fingerprint_that_ignores_key_order_and_whitespace(
    value: object,
) -> None:
    def reordered(item: object) -> object:
        if isinstance(item, dict):
            return {key: reordered(item[key]) for key in reversed(list(item))}
        if isinstance(item, list):
            return [reordered(element) for element in item]
        return item

    # ensure_ascii: a lone surrogate travels as its escape, as JSON.stringify sends it.
    compact = json.dumps(value, separators=(",", ":")).encode()
    spaced = json.dumps(reordered(value), indent=1, ensure_ascii=False)
    for content_type in (b"application/json", b"Application/JSON; charset=utf-8", None):
        first = fingerprint("POST", "/v1/x", compact, content_type)
        try:
            other = spaced.encode()
        except UnicodeEncodeError:
            other = json.dumps(reordered(value), indent=1).encode()
        assert fingerprint("POST", "/v1/x", other, content_type) == first


@given(st.binary(max_size=64))
def test_any_body_has_a_fingerprint(body: bytes) -> None:
    assert len(fingerprint("POST", "/v1/x", body, b"application/json")) == 64


def test_lone_surrogates_are_told_apart() -> None:
    def of(body: bytes) -> str:
        return fingerprint("POST", "/v1/x", body, b"application/json")

    assert of(b'{"a":"\\ud83d","b":1}') == of(b'{ "b": 1, "a": "\\ud83d" }')
    assert of(b'{"a":"\\ud83d"}') != of(b'{"a":"\\ud83e"}')


@pytest.mark.parametrize(("opening", "closing"), [(b"[", b"]"), (b'{"a":', b"}")])
def test_a_body_nested_100_000_levels_is_fingerprinted_by_its_bytes(
    opening: bytes, closing: bytes
) -> None:
    depth = 100_000
    body = opening * depth + b"1" + closing * depth
    deeper = opening * (depth + 1) + b"1" + closing * (depth + 1)
    print_ = fingerprint("POST", "/v1/x", body, b"application/json")
    assert print_ == fingerprint("POST", "/v1/x", body, b"application/json")
    assert print_ != fingerprint("POST", "/v1/x", deeper, b"application/json")
    # Raw bytes past the parsers' depth: whitespace counts there (docs/gateway.md, "Same request?").
    assert print_ != fingerprint("POST", "/v1/x", body + b" ", b"application/json")


@pytest.mark.parametrize(
    ("content_type", "canonical"),
    [
        (None, True),
        (b"application/json", True),
        (b"Application/JSON", True),
        (b"application/json ; charset=UTF-8", True),
        (b"application/problem+json", True),
        (b"APPLICATION/VND.API+JSON", True),
        (b"text/plain", False),
        (b"text/plain; note=json", False),
        (b"application/octet-stream", False),
    ],
)
def test_json_media_types_are_matched_case_insensitively_without_parameters(
    content_type: bytes | None, canonical: bool
) -> None:
    assert is_json(content_type) is canonical
    same = fingerprint("POST", "/x", b'{"a":1,"b":2}', content_type) == fingerprint(
        "POST", "/x", b'{"b":2,"a":1}', content_type
    )
    assert same is canonical


def test_the_known_credential_headers_and_configured_ones_name_the_tenant() -> None:
    alone = tenant_of([(b"x-goog-api-key", b"k-1")])
    assert alone == tenant_of([(b"authorization", b"Bearer k-1")]) != "anonymous"
    assert tenant_of([(b"x-goog-api-key", b"k-2")]) != alone
    assert tenant_of([(b"x-team", b"k-1")]) == "anonymous"
    assert tenant_of([(b"x-team", b"k-1")], credential_headers=[b"x-team"]) == alone
    assert tenant_of([(b"authorization", b"Bearer  ")]) == "anonymous"


def test_several_credentials_are_one_tenant_of_all_of_them() -> None:
    proxy = (b"authorization", b"Bearer proxy")
    alice = tenant_of([proxy, (b"x-goog-api-key", b"alice")])
    assert alice != tenant_of([proxy, (b"x-goog-api-key", b"bob")])
    assert alice != tenant_of([proxy]) and alice != tenant_of([(b"x-goog-api-key", b"alice")])
    # Order and an empty extra header do not matter.
    assert alice == tenant_of([(b"x-goog-api-key", b"alice"), proxy, (b"api-key", b" ")])


@given(
    st.lists(
        st.sampled_from([b"authorization", b"x-api-key", b"x-goog-api-key", b"other"]), max_size=4
    ),
    st.lists(st.binary(min_size=0, max_size=6), min_size=4, max_size=4),
)
def test_remembered_tenants_are_the_same_as_computed_ones(
    names: list[bytes], values: list[bytes]
) -> None:
    headers = list(zip(names, values, strict=False))
    tenants = Tenants()
    assert tenants.of(headers) == tenant_of(headers)
    assert tenants.of(headers) == tenant_of(headers)  # from memory the second time

"""Bodies an upstream accepts get a fingerprint through a real gateway, never a 500.

Issue 12, item 5: a lone surrogate escape (what ``JSON.stringify`` writes for a
cut emoji) raised ``UnicodeEncodeError`` and deep nesting ``RecursionError``;
``Application/JSON`` was not canonicalised. Sent with urllib, as a client would.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from tests.gateway.conftest import GatewayFactory, Sim


def _post(
    url: str, path: str, body: bytes, key: str, content_type: str = "application/json"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        url + path,
        data=body,
        method="POST",
        headers={
            "Authorization": "Bearer sk-fingerprint",
            "Idempotency-Key": key,
            "Content-Type": content_type,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _replayed_once(url: str, path: str, body: bytes, key: str, retry: bytes | None = None) -> None:
    status, headers, first = _post(url, path, body, key)
    assert status < 500, (status, first)
    assert headers["idempotent-replayed"] == "false"
    status_again, headers, second = _post(url, path, retry or body, key)
    assert (status_again, headers["idempotent-replayed"], second) == (status, "true", first)


def test_a_lone_surrogate_escape_is_fingerprinted_and_replayed(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway()
    body = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"cut \\ud83d"}]}'
    reordered = b'{"messages":[{"content":"cut \\ud83d","role":"user"}],"model":"gpt-4o-mini"}'
    _replayed_once(gateway.url, "/v1/chat/completions", body, "surrogate", reordered)
    # Another lone surrogate is another request.
    other = body.replace(b"d83d", b"d83e")
    status, _, _ = _post(gateway.url, "/v1/chat/completions", other, "surrogate")
    assert status == 422
    assert fresh_sim.requests() == 1


def test_a_body_nested_100_000_levels_is_fingerprinted_and_replayed(
    start_gateway: GatewayFactory,
) -> None:
    gateway = start_gateway()
    depth = 100_000
    body = b'{"model":"gpt-4o-mini","x":' + b"[" * depth + b"]" * depth + b"}"
    started = time.monotonic()
    # The simulator's own JSON reader recurses (a 500 there), so this goes to a
    # path it answers 404 without reading the body: a 4xx is stored and replayed.
    _replayed_once(gateway.url, "/v1/batches", body, "deep")
    # A bound that catches a stalled event loop, not a performance threshold.
    assert time.monotonic() - started < 20
    one_less = b'{"model":"gpt-4o-mini","x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    assert _post(gateway.url, "/v1/batches", one_less, "deep")[0] == 422


def test_content_type_is_matched_case_insensitively_without_its_parameters(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway()
    document = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps(document).encode()
    reordered = json.dumps(dict(reversed(list(document.items()))), indent=2).encode()
    for index, content_type in enumerate(
        ["Application/JSON", "APPLICATION/JSON; charset=UTF-8", "application/vnd.api+JSON"]
    ):
        key = f"media-{index}"
        status, headers, first = _post(gateway.url, "/v1/chat/completions", body, key, content_type)
        assert status == 200 and headers["idempotent-replayed"] == "false"
        status, headers, second = _post(
            gateway.url, "/v1/chat/completions", reordered, key, content_type
        )
        assert (status, headers["idempotent-replayed"], second) == (200, "true", first)
    assert fresh_sim.requests() == 3

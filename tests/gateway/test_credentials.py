"""Tenants from every common credential header, and --require-credential (issue 12, "Also").

Before, a credential in a header the gateway did not know (``x-goog-api-key``,
Gemini's) left the request in the shared anonymous tenant: one caller's key
replayed another caller's answer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.gateway.conftest import CHAT, GatewayFactory, Sim

NO_PACING = {"X-Sim-Token-Ms": "0"}


def _call(
    url: str, headers: dict[str, str], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps(CHAT).encode() if path.startswith("/v1/") else None
    request = urllib.request.Request(
        url + path,
        data=body,
        headers={"Content-Type": "application/json", **NO_PACING, **headers},
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


@pytest.mark.parametrize("header", ["x-goog-api-key", "x-api-key", "api-key", "Authorization"])
def test_two_credentials_in_a_known_header_never_share_a_key(
    start_gateway: GatewayFactory, fresh_sim: Sim, header: str
) -> None:
    gateway = start_gateway()
    alice = {header: "Bearer key-alice" if header == "Authorization" else "key-alice"}
    bob = {header: "Bearer key-bob" if header == "Authorization" else "key-bob"}
    for caller in (alice, bob):
        status, headers, _ = _call(gateway.url, {**caller, "Idempotency-Key": "shared"})
        assert (status, headers["idempotent-replayed"]) == (200, "false"), caller
    status, headers, _ = _call(gateway.url, {**alice, "Idempotency-Key": "shared"})
    assert (status, headers["idempotent-replayed"]) == (200, "true")
    assert fresh_sim.billed() == 2
    # Each reads its own record, and only with its own credential.
    assert _call(gateway.url, bob, "/_payonce/requests/shared")[0] == 200
    assert _call(gateway.url, {header: "key-eve"}, "/_payonce/requests/shared")[0] == 404


def test_a_shared_proxy_token_beside_a_provider_key_does_not_share_records(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway()
    proxy = {"Authorization": "Bearer team-proxy-token"}
    for user in ("key-alice", "key-bob"):
        headers = {**proxy, "x-goog-api-key": user, "Idempotency-Key": "same"}
        status, answer, _ = _call(gateway.url, headers)
        assert (status, answer["idempotent-replayed"]) == (200, "false"), user
    assert fresh_sim.billed() == 2


def _separate_runs(url: str, header: str) -> None:
    for user in ("alice", "bob"):
        status, answer, _ = _call(url, {header: user, "Idempotency-Key": f"{header}-key"})
        assert (status, answer["idempotent-replayed"]) == (200, "false"), (header, user)


def test_configured_credential_headers_from_flags_and_the_environment(
    start_gateway: GatewayFactory, fresh_sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Repeated flags add to the known headers...
    gateway = start_gateway("--credential-header", "X-Team-Key", "--credential-header", "x-b")
    for header in ("x-team-key", "x-b", "x-goog-api-key"):
        _separate_runs(gateway.url, header)
    gateway.stop()
    # ...and so does the variable, its names separated by commas or spaces.
    monkeypatch.setenv("PAYONCE_CREDENTIAL_HEADER", "x-litellm-api-key, x-portkey-api-key x-c")
    gateway = start_gateway()
    for header in ("x-litellm-api-key", "x-portkey-api-key", "x-c", "x-api-key"):
        _separate_runs(gateway.url, header)
    assert fresh_sim.billed() == 14


def test_require_credential_refuses_keyed_requests_without_one(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    config = tmp_path / "payonce.toml"
    config.write_text('require-credential = true\ncredential-header = "x-team-key"\n')
    gateway = start_gateway("--config", str(config))
    status, headers, body = _call(gateway.url, {"Idempotency-Key": "anon"})
    problem = json.loads(body)
    assert status == 401 and headers["content-type"] == "application/problem+json"
    assert headers["x-should-retry"] == "false"
    assert problem["type"].endswith("#credential-required")
    assert _call(gateway.url, {}, "/_payonce/requests/anon")[0] == 401
    # Unkeyed requests are plain proxying and still pass; credentials let keyed ones in.
    assert _call(gateway.url, {})[0] == 200
    assert _call(gateway.url, {"x-goog-api-key": "k", "Idempotency-Key": "a"})[0] == 200
    assert _call(gateway.url, {"x-team-key": "k", "Idempotency-Key": "b"})[0] == 200
    assert _call(gateway.url, {"x-other-key": "k", "Idempotency-Key": "c"})[0] == 401
    assert fresh_sim.billed() == 3

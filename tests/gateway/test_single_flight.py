"""Concurrent duplicates share one execution; tenants never share anything."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx2 as httpx

from tests.gateway.conftest import CHAT, GatewayFactory, Sim, chat
from tests.support.processes import Process


async def _burst(url: str, n: int, key: str) -> list[tuple[int, bytes, str]]:
    headers = {"Authorization": "Bearer sk-burst", "Idempotency-Key": key, "X-Sim-Delay-Ms": "1000"}
    connector = aiohttp.TCPConnector(limit=n)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> tuple[int, bytes, str]:
            async with session.post(
                url + "/v1/chat/completions", json=CHAT, headers=headers
            ) as resp:
                return resp.status, await resp.read(), resp.headers["idempotent-replayed"]

        return await asyncio.gather(*(one() for _ in range(n)))


def test_200_concurrent_requests_with_one_key_make_one_upstream_call(
    gateway: Process, fresh_sim: Sim
) -> None:
    results = asyncio.run(_burst(gateway.url, 200, "burst-1"))
    assert {status for status, _, _ in results} == {200}
    assert len({body for _, body, _ in results}) == 1, "200 identical bodies"
    assert sum(marker == "false" for _, _, marker in results) == 1
    ledger = fresh_sim.ledger()
    assert ledger["requests"] == 1 and ledger["billed"] == 1
    status = httpx.get(
        gateway.url + "/_payonce/requests/burst-1", headers={"Authorization": "Bearer sk-burst"}
    ).json()
    assert status["replays"] == 199, "every joined duplicate counts as a replay"


def test_two_credentials_with_one_key_are_two_executions(gateway: Process, fresh_sim: Sim) -> None:
    alice = {"Authorization": "Bearer sk-alice"}
    bob = {"x-api-key": "sk-bob"}  # the Anthropic SDK's header
    a = chat(gateway.url, "shared-key", headers=alice)
    b = chat(gateway.url, "shared-key", headers=bob)
    assert a.headers["idempotent-replayed"] == b.headers["idempotent-replayed"] == "false"
    assert a.json()["id"] != b.json()["id"]
    assert fresh_sim.billed() == 2
    # Each tenant replays its own record, never the other's.
    assert chat(gateway.url, "shared-key", headers=alice).content == a.content
    assert chat(gateway.url, "shared-key", headers=bob).content == b.content
    # A third credential sees nothing through the status endpoints...
    eve = {"Authorization": "Bearer sk-eve"}
    for suffix in ("", "/response"):
        leaked = httpx.get(gateway.url + "/_payonce/requests/shared-key" + suffix, headers=eve)
        assert leaked.status_code == 404
        leaked = httpx.get(gateway.url + "/_payonce/requests/shared-key" + suffix)
        assert leaked.status_code == 404
    # ...and a different body under its own tenant is not a mismatch with theirs.
    other = chat(gateway.url, "shared-key", headers=eve, body={**CHAT, "max_tokens": 5})
    assert other.status_code == 200
    assert fresh_sim.billed() == 3


def test_the_same_secret_in_either_header_is_one_tenant(gateway: Process, fresh_sim: Sim) -> None:
    first = chat(gateway.url, "k-hdr", headers={"Authorization": "Bearer sk-same"})
    second = chat(gateway.url, "k-hdr", headers={"Authorization": "", "x-api-key": "sk-same"})
    assert second.headers["idempotent-replayed"] == "true" and second.content == first.content


def test_a_configured_tenant_header_scopes_records(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--tenant-header", "X-Team")
    chat(gateway.url, "k-team", headers={"X-Team": "search"})
    other_team = chat(gateway.url, "k-team", headers={"X-Team": "ads"})
    assert other_team.headers["idempotent-replayed"] == "false"
    same_team = chat(
        gateway.url, "k-team", headers={"X-Team": "search", "Authorization": "Bearer x"}
    )
    assert same_team.headers["idempotent-replayed"] == "true"


def test_records_never_hold_the_credential(gateway: Process, fresh_sim: Sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = "sk-very-secret-credential-123"
    chat(gateway.url, "k-secret", headers={"Authorization": f"Bearer {secret}"})
    database = (tmp_path / "payonce.db").read_bytes()
    wal = tmp_path / "payonce.db-wal"
    stored = database + (wal.read_bytes() if wal.exists() else b"")
    assert secret.encode() not in stored
    assert secret not in gateway.output()
    assert json.dumps(CHAT["messages"]).encode() not in stored, "request bodies are not stored"

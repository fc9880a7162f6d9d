"""Encryption at rest through the real gateway: what the store file and Redis hold, rotation, wrong keys.

Each gateway is a real ``payonce serve`` process with its key in
``PAYONCE_ENCRYPTION_KEY`` (or a file), in front of the simulator. The simulator
gives every call a unique id (``chatcmpl-...``) that appears in the body, the
``x-request-id`` header and every streamed event: finding that id in the store
would mean a response was stored in the clear.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import redis

from payonce.store.sealing import MAGIC, key_id, new_key, parse_keys
from tests.gateway.conftest import AUTH, CHAT, chat
from tests.support.processes import Process, start_payonce
from tests.support.redis import running_redis
from tests.support.sim import Sim

KEY_A, KEY_B = new_key(), new_key()


def _gateway(sim: Sim, store: str, log_dir: Path, keys: str | None, *flags: str) -> Process:
    # "" removes a PAYONCE_ENCRYPTION_KEY this test process may have inherited.
    env = {"PAYONCE_ENCRYPTION_KEY": keys if keys is not None else ""}
    args = ["serve", "--upstream", sim.url, "--store", store, *flags]
    return start_payonce(args, log_dir=log_dir, ready_path="/_payonce/health", env=env)


def _stream(url: str, key: str) -> str:
    body = {**CHAT, "stream": True}
    headers = {**AUTH, "Idempotency-Key": key}
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        return response.read().decode()


def _raw_sqlite(path: Path) -> bytes:
    # The WAL holds the latest commits until a checkpoint: read both, as a thief would.
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def _id(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def _unreadable(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["x-should-retry"] == "false"
    problem: dict[str, Any] = response.json()
    assert problem["type"].endswith("#record-unreadable")
    return problem


def test_rotation_loses_no_record_and_a_missing_key_is_a_problem_not_a_500(
    fresh_sim: Sim, tmp_path: Path
) -> None:
    db = tmp_path / "payonce.db"
    store = f"sqlite:///{db}"
    # Before encryption: a record in the clear.
    plain = _gateway(fresh_sim, store, tmp_path, None)
    before = _id(chat(plain.url, "before"))
    plain.stop()

    # Key A: the old record still replays; new ones are ciphertext in the file and its WAL.
    gateway = _gateway(fresh_sim, store, tmp_path, KEY_A)
    replay = chat(gateway.url, "before")
    assert (_id(replay), replay.headers["idempotent-replayed"]) == (before, "true")
    sealed = _id(chat(gateway.url, "sealed-a"))
    events = _stream(gateway.url, "stream-a")
    streamed = events.split('"id":"', 1)[1].split('"', 1)[0]
    raw = _raw_sqlite(db)
    assert before.encode() in raw, "the control: a plain record is there to be found"
    assert sealed.encode() not in raw and streamed.encode() not in raw
    gateway.stop()

    # "B,A": everything written with A replays, new records are sealed with B.
    gateway = _gateway(fresh_sim, store, tmp_path, f"{KEY_B},{KEY_A}")
    assert _id(chat(gateway.url, "sealed-a")) == sealed
    assert _stream(gateway.url, "stream-a") == events
    rotated = _id(chat(gateway.url, "sealed-b"))
    gateway.stop()
    (body,) = (
        sqlite3.connect(db)
        .execute("SELECT body FROM payonce_records WHERE key = 'sealed-b'")
        .fetchone()
    )
    assert body.startswith(MAGIC + key_id(parse_keys(KEY_B, "B")[0]))
    billed = fresh_sim.billed()

    # Only B: A's records are reported, on the replay path and the status endpoint.
    gateway = _gateway(fresh_sim, store, tmp_path, KEY_B)
    assert _id(chat(gateway.url, "sealed-b")) == rotated
    problem = _unreadable(chat(gateway.url, "sealed-a"))
    assert key_id(parse_keys(KEY_A, "A")[0]).hex() in problem["detail"]
    _unreadable(httpx.get(gateway.url + "/_payonce/requests/sealed-a", headers=AUTH))
    _unreadable(httpx.get(gateway.url + "/_payonce/requests/stream-a/response", headers=AUTH))
    _unreadable(chat(gateway.url, "stream-a", body={**CHAT, "stream": True}))
    assert fresh_sim.billed() == billed, "an unreadable record is never run again"
    gateway.stop()
    log = gateway.output()
    assert "not configured" in log and "Traceback" not in log

    # No key at all: sealed records are refused, never replayed as ciphertext.
    plain = _gateway(fresh_sim, store, tmp_path, None)
    assert "has no encryption key" in _unreadable(chat(plain.url, "sealed-b"))["detail"]
    assert _id(chat(plain.url, "before")) == before
    plain.stop()
    assert fresh_sim.billed() == billed


def test_redis_with_two_workers_holds_only_ciphertext(fresh_sim: Sim, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(new_key() + "\n")
    keys.chmod(0o600)
    (tmp_path / "redis").mkdir()
    with running_redis(tmp_path / "redis") as server:
        gateway = _gateway(
            fresh_sim,
            server.url,
            tmp_path,
            None,
            "--workers",
            "2",
            "--encryption-key-file",
            str(keys),
        )
        try:
            first = _id(chat(gateway.url, "whole"))
            events = _stream(gateway.url, "streamed")
            # Fresh connections, spread over both workers: each reads the other's records.
            for _ in range(4):
                assert _id(chat(gateway.url, "whole")) == first
                assert _stream(gateway.url, "streamed") == events
        finally:
            gateway.stop()
        client = redis.Redis(host="127.0.0.1", port=server.port)
        raw = b"".join(name + _value(client, name) for name in client.keys("*"))
    assert b"whole" in raw and b"streamed" in raw, "the records are there"
    streamed = events.split('"id":"', 1)[1].split('"', 1)[0]
    for secret in (first, streamed, "simulated answer", "content-type"):
        assert secret.encode() not in raw
    assert fresh_sim.billed() == 2
    output = gateway.output()
    assert "Traceback" not in output, output  # all of it: a worker's failure is rare


def _payonce(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )


def test_a_key_on_the_command_line_is_refused_and_keys_are_made_by_a_subcommand(
    tmp_path: Path,
) -> None:
    key = new_key()
    refused = _payonce("serve", "--store", "memory://", "--encryption-key", key)
    assert refused.returncode == 2 and "process list" in refused.stderr
    assert key not in refused.stderr
    made = _payonce("encryption-key")
    (fresh,) = parse_keys(made.stdout, "stdout")
    assert made.stderr.strip() == f"key id: {key_id(fresh).hex()}"
    ids = subprocess.run(
        [sys.executable, "-m", "payonce", "encryption-key", "--id"],
        input=f"{made.stdout}{key}\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert ids.stdout.split() == [key_id(fresh).hex(), key_id(parse_keys(key, "k")[0]).hex()]
    config = tmp_path / "payonce.toml"
    config.write_text(f'encryption-key = "{key}"\n')
    in_config = _payonce("serve", "--config", str(config))
    assert in_config.returncode == 2 and "file of their own" in in_config.stderr
    assert key not in in_config.stderr


def _value(client: redis.Redis, name: bytes) -> bytes:
    """Everything a Redis key holds: a list's items, a hash's fields, a string."""
    kind = client.type(name)
    if kind == b"list":
        return b"".join(client.lrange(name, 0, -1))
    if kind == b"hash":
        return b"".join(k + v for k, v in client.hgetall(name).items())
    return client.get(name) or b""  # a replay batch's mark

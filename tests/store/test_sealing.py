"""Encryption at rest (payonce.store.sealing): the codec alone, then every store that serialises.

The stores are real: SQLite files, and Redis and Redis Cluster servers started
for the session (tests/store/conftest.py). What they hold is read back raw (the
database file and its WAL, the Redis keys) and searched for the plaintext.
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from payonce.clock import ManualClock
from payonce.config import GatewaySettings
from payonce.errors import ConfigError, RecordUnreadable
from payonce.store import SQLiteStore, Store, StoredResponse
from payonce.store import sealing as sealing_module
from payonce.store.postgres import PostgresStore
from payonce.store.redis import RedisStore
from payonce.store.sealing import PLAIN, Codec, Sealing, key_id, new_key, parse_keys
from tests.store.conftest import empty_postgres
from tests.support.postgres import Postgres
from tests.support.redis import RedisCluster, RedisServer

KEY_A, KEY_B = parse_keys(f"{new_key()},{new_key()}", "test")
ANSWER = b'{"choices":[{"message":{"content":"the secret answer is 42"}}]}'
HEADERS = (("content-type", "application/json"), ("x-request-id", "req-secret-7"))
EVENTS = [
    b'data: {"delta":"the secret"}\n\n',
    b'data: {"delta":" answer"}\n\n',
    b"data: [DONE]\n\n",
]
SECRETS = (b"secret", b"req-secret-7")


RESPONSE = StoredResponse(200, HEADERS, ANSWER)
STREAM = StoredResponse(200, HEADERS, b"", stream=True)


def _read(codec: Codec, stored: tuple[bytes, bytes], tenant: str = "t", key: str = "k") -> bytes:
    return codec.response_in(tenant, key, 200, *stored, False).body


def test_sealed_values_hold_no_plaintext_and_open_to_what_was_sealed() -> None:
    codec = Sealing([KEY_A])
    headers, body = codec.response_out("t", "k", RESPONSE)
    assert headers == sealing_module.MAGIC, "a whole response is one value, in the body's place"
    stream_headers, stream_body = codec.response_out("t", "k", STREAM)
    assert stream_body == b"" and codec.headers_out("t", "k", HEADERS)[:4] == sealing_module.MAGIC
    events = codec.events_out("t", "k", 1, EVENTS)
    for value in (body, stream_headers, *events):
        assert value.startswith(sealing_module.MAGIC)
        assert not any(secret in value for secret in SECRETS)
    assert codec.response_in("t", "k", 200, headers, body, False) == RESPONSE
    assert codec.response_in("t", "k", 200, stream_headers, b"", True) == STREAM
    assert codec.events_in("t", "k", 0, events) == EVENTS
    assert codec.events_in("t", "k", 1, events[1:]) == EVENTS[1:]
    # A nonce per value: the same plaintext never gives the same ciphertext.
    assert codec.response_out("t", "k", RESPONSE)[1] != body
    empty = StoredResponse(204, (), b"")
    assert codec.response_in("t", "k", 204, *codec.response_out("t", "k", empty), False) == empty


@pytest.mark.parametrize(
    "where",
    ["another key", "another tenant", "stream headers as a response", "another event number"],
)
def test_a_value_moved_to_another_place_does_not_decrypt(where: str) -> None:
    codec = Sealing([KEY_A])
    stored = codec.response_out("t", "k", RESPONSE)
    stream_headers = codec.headers_out("t", "k", HEADERS)
    events = codec.events_out("t", "k", 1, EVENTS)
    reads: dict[str, Callable[[], object]] = {
        "another key": lambda: _read(codec, stored, key="k2"),
        "another tenant": lambda: _read(codec, stored, tenant="t2"),
        "stream headers as a response": lambda: _read(codec, (stored[0], stream_headers)),
        "another event number": lambda: codec.events_in("t", "k", 0, [events[1], events[0]]),
    }
    with pytest.raises(RecordUnreadable, match="altered, or copied from another record"):
        reads[where]()


def test_rotation_decrypts_with_any_key_and_encrypts_with_the_first() -> None:
    old = Sealing([KEY_A]).response_out("t", "k", RESPONSE)
    rotated = Sealing([KEY_B, KEY_A])
    assert _read(rotated, old) == ANSWER
    new = rotated.response_out("t", "k", RESPONSE)
    assert new[1][4:8] == key_id(KEY_B) and old[1][4:8] == key_id(KEY_A)
    assert rotated.key_ids == [key_id(KEY_B).hex(), key_id(KEY_A).hex()]


def test_a_key_the_gateway_lacks_is_named_in_the_error() -> None:
    stored = Sealing([KEY_A]).response_out("t", "k", RESPONSE)
    with pytest.raises(RecordUnreadable) as caught:
        _read(Sealing([KEY_B]), stored)
    assert f"encrypted with key {key_id(KEY_A).hex()}" in caught.value.detail
    assert (caught.value.status, caught.value.should_retry) == (503, False)
    for sealed in (stored, (Sealing([KEY_A]).headers_out("t", "k", HEADERS), b"")):
        with pytest.raises(RecordUnreadable, match="has no encryption key"):
            _read(PLAIN, sealed)
    with pytest.raises(RecordUnreadable, match="damaged"):
        _read(Sealing([KEY_A]), (sealing_module.MAGIC, ANSWER))


def test_records_written_before_encryption_was_turned_on_still_read() -> None:
    stored = PLAIN.response_out("t", "k", RESPONSE)
    assert Sealing([KEY_A]).response_in("t", "k", 200, *stored, False) == RESPONSE
    assert Sealing([KEY_A]).events_in("t", "k", 0, EVENTS) == EVENTS


def test_a_new_derived_key_after_its_quota_and_the_old_values_still_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sealing_module, "_VALUES_PER_SALT", 2)
    codec = Sealing([KEY_A])
    first, second, third = (codec.response_out("t", "k", RESPONSE) for _ in range(3))
    assert first[1][8:16] == second[1][8:16] != third[1][8:16]  # the salt: another derived key
    for stored in (first, second, third):
        assert _read(codec, stored) == ANSWER


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no key"),
        ("c2hvcnQ", "key 1 is not 32 bytes"),
        (f"{new_key()},not-base64-at-all!", "key 2 is not 32 bytes"),
        (f"{base64.urlsafe_b64encode(KEY_A).decode()}\n{new_key()}\n"
         f"{base64.urlsafe_b64encode(KEY_A).decode().rstrip('=')}", "key 3 repeats"),
    ],
    # Fixed ids: the keys are random, and pytest-xdist workers must collect the same names.
    ids=["empty", "short", "not-base64", "repeated"],
)  # fmt: skip
def test_bad_keys_fail_at_start_up_without_repeating_them(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        GatewaySettings(encryption_key=text)
    for item in text.replace(",", "\n").split():
        assert item not in str(caught.value)


def test_keys_come_from_the_environment_or_a_file_not_both(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{new_key()}\n{new_key()}\n")
    assert "encryption_key=" not in repr(GatewaySettings(encryption_key=new_key()))
    GatewaySettings(encryption_key_file=str(keys))
    with pytest.raises(ConfigError, match="use one of the two"):
        GatewaySettings(encryption_key=new_key(), encryption_key_file=str(keys))
    with pytest.raises(ConfigError, match="does not exist"):
        GatewaySettings(encryption_key_file=str(tmp_path / "missing"))


# Every store that writes records down: a response and a stream, then the raw bytes.
SERIALISING = ("sqlite", "redis", "redis-cluster", "postgres")


def _raw_sqlite(path: Path) -> bytes:
    # Keys and values as the table holds them, to see the records are there at all.
    rows = sqlite3.connect(path).execute("SELECT tenant || ':' || key FROM payonce_records")
    names = b"".join(row[0].encode() for row in rows)
    # The WAL holds the latest commits until a checkpoint.
    return names + b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def _raw_redis(*ports: int) -> bytes:
    raw = b""
    for port in ports:  # every node of a cluster, each on its own
        raw += _raw_node(redis.Redis(host="127.0.0.1", port=port))
    return raw


def _raw_node(client: redis.Redis) -> bytes:  # type: ignore[type-arg]
    raw = b""
    for name in client.keys("*"):
        raw += name
        kind = client.type(name)
        if kind == b"hash":
            raw += b"".join(k + v for k, v in client.hgetall(name).items())
        elif kind == b"list":
            raw += b"".join(client.lrange(name, 0, -1))
    return raw


def _raw_postgres(server: Postgres) -> bytes:
    # bytea in escape form: printable bytes as they are, so a plaintext would show.
    records = server.psql(
        "SELECT tenant || ':' || key || encode(coalesce(headers, ''::bytea), 'escape')"
        " || encode(coalesce(body, ''::bytea), 'escape') FROM payonce_records"
    )
    events = server.psql("SELECT encode(data, 'escape') FROM payonce_events")
    return (records + events).encode()


Opener = Callable[[Codec], Store]


@pytest.fixture(params=SERIALISING)
def serialising(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> tuple[Opener, Callable[[], bytes]]:
    """Opens stores with a codec on one empty backend; reads all it holds, raw."""
    if request.param == "sqlite":
        path = tmp_path / "sealed.db"
        return lambda codec: SQLiteStore(str(path), clock, codec=codec), lambda: _raw_sqlite(path)
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.flush()
        return (
            lambda codec: RedisStore(server.url, clock, codec=codec),
            lambda: _raw_redis(server.port),
        )
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres_server")
        empty_postgres(pg)
        return lambda codec: PostgresStore(pg.url, clock, codec=codec), lambda: _raw_postgres(pg)
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    cluster.flush()
    ports = [node.port for node in cluster.nodes]
    return lambda codec: RedisStore(cluster.url, clock, codec=codec), lambda: _raw_redis(*ports)


async def test_every_serialising_store_holds_only_ciphertext(
    serialising: tuple[Opener, Callable[[], bytes]],
) -> None:
    open_store, raw = serialising
    store, plain = open_store(Sealing([KEY_A])), open_store(PLAIN)
    try:
        whole = await store.claim("tenant-a", "whole", "fp", lease=30, ttl=3600)
        response = StoredResponse(200, HEADERS, ANSWER)
        assert await store.complete("tenant-a", "whole", whole.record.token, response, ttl=3600)
        streamed = await store.claim("tenant-a", "stream", "fp", lease=30, ttl=3600)
        token = streamed.record.token
        assert await store.begin_stream("tenant-a", "stream", token, 200, HEADERS)
        assert await store.append_events("tenant-a", "stream", token, 1, EVENTS[:2])
        assert await store.append_events("tenant-a", "stream", token, 3, EVENTS[2:])
        stored = await store.get("tenant-a", "whole")
        assert stored is not None and stored.response == response
        again = await store.claim("tenant-a", "stream", "fp", lease=30, ttl=3600)
        assert again.record.response is not None and again.record.response.headers == HEADERS
        assert await store.read_events("tenant-a", "stream") == EVENTS
        assert await store.read_events("tenant-a", "stream", after=2) == EVENTS[2:]
        written = raw()
        # The raw read sees both records (on a cluster they may live on two nodes).
        assert b"tenant-a:whole" in written and b"tenant-a:stream" in written
        for secret in (*SECRETS, b"content-type", b"DONE"):
            assert secret not in written
        # The control: without a key the same answer is there to be found.
        control = await plain.claim("tenant-a", "control", "fp", lease=30, ttl=3600)
        assert await plain.complete("tenant-a", "control", control.record.token, response, ttl=3600)
        assert b"the secret answer is 42" in raw()
        with pytest.raises(RecordUnreadable, match="has no encryption key"):
            await plain.get("tenant-a", "whole")
    finally:
        await store.close()
        await plain.close()

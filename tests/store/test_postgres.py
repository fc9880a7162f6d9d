"""The PostgreSQL store beyond the contract suite: its URL, its schema, PgBouncer, faults.

Every test runs against a server of our own (tests/support/postgres.py); the
contract and fencing suites run on it too (tests/store/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import asyncpg
import pytest

from payonce.clock import ManualClock
from payonce.errors import ConfigError, StorageError, StorageTimeout
from payonce.store import ClaimStatus, StoredResponse, open_store
from payonce.store.postgres import PostgresStore, parse_postgres_url
from payonce.store.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from tests.store.conftest import empty_postgres
from tests.support.postgres import Postgres, running_pgbouncer, running_postgres

pytestmark = pytest.mark.slow

ANSWER = StoredResponse(200, (("content-type", "application/json"),), b'{"ok": true}')


@pytest.fixture
def pg(postgres_server: Postgres) -> Postgres:
    empty_postgres(postgres_server)
    return postgres_server


# -- the URL --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:secret@h/db", "PAYONCE_STORE_PASSWORD"),
        ("postgresql://u@/db", "has no host"),
        ("postgresql://u@h", "names no database"),
        ("postgresql://u@h:99999/db", "bad port"),
        ("postgresql://u@h/db?sslmode=maybe", "sslmode='maybe'"),
        ("postgresql://u@h/db?timeout=0", "timeout must be above 0"),
        ("postgresql://u@h/db?pool=1", "pool must be at least 2"),
        ("postgresql://u@h/db?prepared=sometimes", "prepared='sometimes' must be on or off"),
        ("postgresql://u@h/db?application_name=x", "unknown PostgreSQL option 'application_name'"),
    ],
)
def test_bad_urls_are_one_line_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--store") as caught:
        open_store(url)
    assert message in str(caught.value)
    assert "secret" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_url_keeps_sslmode_for_the_driver_and_its_own_options_for_payonce() -> None:
    parsed = parse_postgres_url(
        "postgres://payonce@db.internal:6432/records?sslmode=require&timeout=2&pool=4"
        "&prepared=off&listen=off"
    )
    assert parsed.dsn == "postgresql://payonce@db.internal:6432/records?sslmode=require"
    assert (parsed.timeout, parsed.pool, parsed.prepared, parsed.listen) == (2.0, 4, False, False)
    assert parsed.where == "db.internal:6432/records"


async def test_the_password_comes_from_the_environment_never_the_url(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_postgres(["password_encryption = scram-sha-256"]) as server:
        server.psql("ALTER USER payonce PASSWORD 'pw-from-env'")
        hba = server.folder / "data" / "pg_hba.conf"
        hba.write_text(
            "host all payonce 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\n"
        )
        server.psql("SELECT pg_reload_conf()")
        refused = PostgresStore(server.url)
        with pytest.raises(StorageError, match="password"):
            await refused.ping()
        await refused.close()
        monkeypatch.setenv("PAYONCE_STORE_PASSWORD", "pw-from-env")
        store = PostgresStore(server.url)
        await store.ping()
        await store.close()


# -- the schema -----------------------------------------------------------------


async def test_replicas_starting_together_migrate_once(pg: Postgres) -> None:
    pg.psql(
        "DROP TABLE IF EXISTS payonce_meta, payonce_records, payonce_events, payonce_replay_batches"
    )
    stores = [PostgresStore(pg.url) for _ in range(4)]
    applied = await asyncio.gather(*(store.prepare() for store in stores))
    for store in stores:
        await store.close()
    assert sorted(applied) == [[], [], [], list(range(1, SCHEMA_VERSION + 1))]
    assert pg.psql("SELECT value FROM payonce_meta") == str(SCHEMA_VERSION)


async def test_no_migrate_refuses_a_missing_schema_and_migrate_applies_it(pg: Postgres) -> None:
    pg.psql(
        "DROP TABLE IF EXISTS payonce_meta, payonce_records, payonce_events, payonce_replay_batches"
    )
    checking = PostgresStore(pg.url, migrate=False)
    with pytest.raises(ConfigError, match="run `payonce migrate"):
        await checking.ping()
    await checking.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "migrate", "--store", pg.url],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    every = ", ".join(str(number) for number, _ in MIGRATIONS)
    assert done.stdout.strip() == f"schema {SCHEMA_VERSION}: applied {every}"
    again = subprocess.run(
        [sys.executable, "-m", "payonce", "migrate", "--store", pg.url],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert again.stdout.strip() == f"schema {SCHEMA_VERSION}: up to date"
    checked = PostgresStore(pg.url, migrate=False)
    await checked.ping()
    await checked.close()


async def test_a_newer_schema_is_refused_in_one_line(pg: Postgres) -> None:
    store = PostgresStore(pg.url)
    await store.prepare()
    await store.close()
    pg.psql("UPDATE payonce_meta SET value = '99'")
    try:
        older = PostgresStore(pg.url)
        with pytest.raises(ConfigError, match="schema 99, newer than this payonce's"):
            await older.ping()
        await older.close()
    finally:
        pg.psql(f"UPDATE payonce_meta SET value = '{SCHEMA_VERSION}'")


# -- PgBouncer --------------------------------------------------------------------


@pytest.fixture(scope="module")
def bouncer(postgres_server: Postgres) -> Iterator[str]:
    with running_pgbouncer(postgres_server) as pgbouncer:
        yield pgbouncer.url


async def test_through_pgbouncer_in_transaction_mode(pg: Postgres, bouncer: str) -> None:
    """Debian's PgBouncer 1.18: no prepared statements across transactions, no LISTEN."""
    clock = ManualClock()
    store = PostgresStore(bouncer + "?prepared=off&listen=off", clock)
    follower = PostgresStore(bouncer + "?prepared=off&listen=off", clock)
    try:
        for round_ in range(3):  # statements on whichever server connection comes
            claim = await store.claim("t", f"k{round_}", "fp", lease=30, ttl=60)
            assert claim.status is ClaimStatus.ACQUIRED
            assert await store.begin_stream("t", f"k{round_}", claim.record.token, 200, ())
            assert await store.append_events("t", f"k{round_}", claim.record.token, 1, [b"a", b"b"])
            waited = asyncio.create_task(follower.wait("t", f"k{round_}", 5))
            await asyncio.sleep(0.05)
            assert await store.complete("t", f"k{round_}", claim.record.token, ANSWER, ttl=60)
            started = time.monotonic()
            record = await waited
            assert record is not None and record.response == ANSWER
            assert time.monotonic() - started < 2, "the follower polled"
            assert await follower.read_events("t", f"k{round_}") == [b"a", b"b"]
    finally:
        await store.close()
        await follower.close()


# -- faults -----------------------------------------------------------------------------


async def test_a_follower_in_another_process_is_woken_by_notify(pg: Postgres) -> None:
    clock = ManualClock()
    holder, follower = PostgresStore(pg.url, clock), PostgresStore(pg.url, clock)
    try:
        claim = await holder.claim("t", "k", "fp", lease=30, ttl=60)
        await follower.ping()
        await asyncio.sleep(0.3)  # its LISTEN connection is up
        waited = asyncio.create_task(follower.wait("t", "k", 10))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        assert await holder.complete("t", "k", claim.record.token, ANSWER, ttl=60)
        record = await waited
        took = time.monotonic() - started
        assert record is not None and record.response == ANSWER
        assert took < 1.5, f"woken after {took:.2f} s: the follower polled"
    finally:
        await holder.close()
        await follower.close()


async def test_a_row_locked_from_psql_is_a_storage_timeout_not_a_hang(pg: Postgres) -> None:
    store = PostgresStore(pg.url + "?timeout=0.5")
    claim = await store.claim("t", "locked", "fp", lease=30, ttl=60)
    holder = pg.psql_background(
        "BEGIN; SELECT * FROM payonce_records WHERE key = 'locked' FOR UPDATE; SELECT pg_sleep(30);"
    )
    try:
        await asyncio.sleep(0.5)
        started = time.monotonic()
        with pytest.raises(StorageTimeout):
            await store.complete("t", "locked", claim.record.token, ANSWER, ttl=60)
        assert time.monotonic() - started < 5
        assert await store.get("t", "locked") is not None, "reads go past a row lock"
    finally:
        holder.kill()
        holder.wait()
        await store.close()


async def test_a_full_pool_is_a_storage_timeout_not_a_hang(pg: Postgres) -> None:
    store = PostgresStore(pg.url + "?timeout=0.5&pool=2")
    pool = await store._open()
    taken = [await pool.acquire(), await pool.acquire()]  # every connection busy elsewhere
    try:
        started = time.monotonic()
        with pytest.raises(StorageTimeout):
            await store.get("t", "k")
        assert time.monotonic() - started < 5
    finally:
        for connection in taken:
            await pool.release(connection)
    assert await store.get("t", "k") is None, "served again once a connection is free"
    await store.close()


async def test_a_server_out_of_connections_is_a_storage_error_not_a_hang() -> None:
    with running_postgres(["max_connections = 5", "superuser_reserved_connections = 0"]) as server:
        hogs = [server.psql_background("SELECT pg_sleep(30)") for _ in range(5)]
        try:
            time.sleep(1)
            store = PostgresStore(server.url + "?timeout=2")
            started = time.monotonic()
            with pytest.raises(StorageError, match=r"too many|remaining connection"):
                await store.ping()
            assert time.monotonic() - started < 10
            await store.close()
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()


async def test_terminated_connections_and_a_restart_are_survived(pg: Postgres) -> None:
    store = PostgresStore(pg.url)
    try:
        claim = await store.claim("t", "k", "fp", lease=30, ttl=60)
        pg.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'payonce'"
        )
        # The pool's connections died; the next calls connect again (one may fail).
        for _ in range(3):
            try:
                assert await store.renew("t", "k", claim.record.token, lease=30)
                break
            except StorageError:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the store never connected again after pg_terminate_backend")
        pg.stop("fast")
        with pytest.raises(StorageError):
            await store.get("t", "k")
        pg.start()
        for _ in range(50):
            try:
                record = await store.get("t", "k")
                break
            except StorageError:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the store never connected again after the restart")
        assert record is not None and record.token == claim.record.token
        assert await store.complete("t", "k", claim.record.token, ANSWER, ttl=60)
    finally:
        await store.close()


async def test_purge_works_in_chunks_and_keeps_running_calls(pg: Postgres) -> None:
    clock = ManualClock()
    store = PostgresStore(pg.url, clock)
    await store.prepare()
    try:
        pg.psql(
            "INSERT INTO payonce_records (tenant, key, fingerprint, state, token, created_at,"
            " lease_expires_at, expires_at, status, body, stream)"
            " SELECT 't', 'old-' || i, 'fp', 'completed', 'x', 0, 0, 1, 200, '', false"
            " FROM generate_series(1, 2500) AS i"
        )
        running = await store.claim("t", "running", "fp", lease=1e9, ttl=1)
        clock.advance(10)
        assert await store.purge_expired(limit=1000) == 1000
        assert await store.purge_expired() == 1500
        assert (await store.get("t", "running")) is not None
        assert running.status is ClaimStatus.ACQUIRED
    finally:
        await store.close()


# -- statements grouped, notifications only for watched records --------------------


async def test_a_schema_1_database_is_migrated_to_the_current_one(pg: Postgres) -> None:
    pg.psql(
        "DROP TABLE IF EXISTS payonce_meta, payonce_records, payonce_events, payonce_replay_batches"
    )
    _, first = MIGRATIONS[0]
    connection = await asyncpg.connect(pg.url)  # as payonce's user: its tables
    try:
        await connection.execute(first)
        await connection.execute(
            "INSERT INTO payonce_meta VALUES ('schema_version', '1');"
            " INSERT INTO payonce_records (tenant, key, fingerprint, state, token, created_at,"
            " lease_expires_at, expires_at) VALUES ('t', 'old', 'fp', 'completed', 'x', 1, 1, 1e12)"
        )
    finally:
        await connection.close()
    store = PostgresStore(pg.url)
    try:
        assert await store.prepare() == [number for number, _ in MIGRATIONS[1:]]
        record = await store.get("t", "old")
        assert record is not None and record.fingerprint == "fp"
    finally:
        await store.close()


async def test_concurrent_claims_and_completions_share_statements(pg: Postgres) -> None:
    store = PostgresStore(pg.url)
    try:
        await store.ping()
        keys = [f"k{number}" for number in range(200)]
        claims = await asyncio.gather(
            *(store.claim("t", key, "fp", lease=30, ttl=60) for key in keys),
            store.claim("t", "k0", "fp", lease=30, ttl=60),  # the same key twice at once
        )
        statuses = [claim.status for claim in claims]
        assert statuses.count(ClaimStatus.ACQUIRED) == 200
        assert statuses.count(ClaimStatus.IN_PROGRESS) == 1
        assert store._claims.items == 201
        assert store._claims.statements < 201 / 4, "claims were not grouped"
        done = await asyncio.gather(
            *(
                store.complete("t", key, claim.record.token, ANSWER, ttl=60)
                for key, claim in zip(keys, claims, strict=False)
            ),
            store.complete("t", "k1", "not-the-token", ANSWER, ttl=60),  # fenced, in a batch
        )
        assert done == [True] * 200 + [False]
        assert store._completions.statements < 201 / 4
        assert pg.psql("SELECT count(*) FROM payonce_records WHERE state = 'completed'") == "200"
    finally:
        await store.close()


async def test_concurrent_renewals_share_statements_and_stay_fenced(pg: Postgres) -> None:
    store = PostgresStore(pg.url)
    try:
        await store.ping()
        keys = [f"r{number}" for number in range(100)]
        claims = [await store.claim("t", key, "fp", lease=30, ttl=60) for key in keys]
        renewed = await asyncio.gather(
            *(
                store.renew("t", key, claim.record.token, lease=90)
                for key, claim in zip(keys, claims, strict=True)
            ),
            store.renew("t", "r1", "not-the-token", lease=90),  # fenced, in a batch
            store.renew("t", "nobody", "no-token", lease=90),
        )
        assert renewed == [True] * 100 + [False, False]
        assert store._renewals.items == 102
        assert store._renewals.statements < 102 / 4, "renewals were not grouped"
        lease_ends = pg.psql(
            "SELECT count(*) FROM payonce_records"
            " WHERE lease_expires_at - created_at > 60 AND key LIKE 'r%'"
        )
        assert lease_ends == "100"
    finally:
        await store.close()


async def test_a_claim_whose_caller_left_is_released_not_left_to_its_lease(pg: Postgres) -> None:
    store = PostgresStore(pg.url)
    try:
        await store.ping()
        claiming = asyncio.create_task(store.claim("t", "gone", "fp", lease=300, ttl=600))
        while store._claims.items == 0 and not store._claims._pending:  # queued
            await asyncio.sleep(0)
        while store._claims._pending:  # taken into a statement, on its way
            await asyncio.sleep(0)
        claiming.cancel()
        await asyncio.gather(claiming, return_exceptions=True)
        assert claiming.cancelled(), "the claim's answer came before the cancel: run again"
        deadline = time.monotonic() + 10
        while store._claims.items == 0 or store._releasing:  # answered, then released
            assert time.monotonic() < deadline, "the claim was neither answered nor released"
            await asyncio.sleep(0.02)
        assert pg.psql("SELECT count(*) FROM payonce_records WHERE key = 'gone'") == "0"
        again = await store.claim("t", "gone", "fp", lease=300, ttl=600)
        assert again.status is ClaimStatus.ACQUIRED
    finally:
        await store.close()


async def test_only_writes_to_a_watched_record_are_announced(pg: Postgres) -> None:
    """NOTIFY wakes every listening backend and gateway: sent only when a follower
    in another process marked the record, and then it arrives."""
    holder, follower = PostgresStore(pg.url), PostgresStore(pg.url)
    heard: list[str] = []
    listener = await asyncpg.connect(pg.url)
    await listener.add_listener("payonce_records", lambda *args: heard.append(args[-1]))
    try:
        await follower.ping()
        await asyncio.sleep(0.3)  # the follower's LISTEN connection is up
        alone = await holder.claim("t", "alone", "fp", lease=30, ttl=60)
        assert await holder.complete("t", "alone", alone.record.token, ANSWER, ttl=60)
        watched = await holder.claim("t", "watched", "fp", lease=30, ttl=60)
        waiting = asyncio.create_task(follower.wait("t", "watched", 20))
        deadline = time.monotonic() + 10
        while pg.psql("SELECT watched FROM payonce_records WHERE key = 'watched'") != "t":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        started = time.monotonic()
        assert await holder.complete("t", "watched", watched.record.token, ANSWER, ttl=60)
        record = await waiting
        assert record is not None and record.response == ANSWER
        assert time.monotonic() - started < 5, "the follower was not woken: it polled"
        await asyncio.sleep(0.2)  # a NOTIFY for "alone" would have come by now
        assert len(heard) == 1, heard
    finally:
        await listener.close()
        await holder.close()
        await follower.close()

"""The store contract suite runs against every backend through this fixture.

The Redis backends run on real servers this session starts on free ports
(:mod:`tests.support.redis`): one standalone server and one 3-master cluster,
flushed before each test. PostgreSQL is a server of our own too
(:mod:`tests.support.postgres`), its tables emptied before each test.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from payonce.clock import ManualClock
from payonce.store import MemoryStore, SQLiteStore, Store
from payonce.store.postgres import PostgresStore
from payonce.store.redis import RedisStore
from tests.support.postgres import Postgres, running_postgres
from tests.support.redis import RedisCluster, RedisServer, running_cluster, running_redis

BACKENDS = ("memory", "redis", "redis-cluster", "sqlite", "postgres")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Postgres]:
    with running_postgres() as server:
        yield server


def empty_postgres(server: Postgres) -> None:
    """Every payonce table emptied (the schema stays: the first store made it)."""
    server.psql(
        "DO $$ BEGIN IF to_regclass('payonce_records') IS NOT NULL THEN"
        " TRUNCATE payonce_records, payonce_events, payonce_replay_batches; END IF; END $$"
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[str, ManualClock], Store]:
    """Opens a fresh, empty store of a backend; Redis servers start on first use."""

    opened = itertools.count()

    def make(backend: str, clock: ManualClock) -> Store:
        if backend == "memory":
            return MemoryStore(clock)
        if backend == "sqlite":
            return SQLiteStore(
                str(tmp_path / f"store-{next(opened)}.db"), clock, poll_interval=0.02
            )
        if backend == "redis":
            server: RedisServer = request.getfixturevalue("redis_server")
            server.flush()
            return RedisStore(server.url, clock)
        if backend == "redis-cluster":
            cluster: RedisCluster = request.getfixturevalue("redis_cluster")
            cluster.flush()
            return RedisStore(cluster.url, clock)
        if backend == "postgres":
            pg: Postgres = request.getfixturevalue("postgres_server")
            empty_postgres(pg)
            # Polls as SQLite's does here: the manual clock's jumps are seen by a look.
            return PostgresStore(pg.url, clock, poll_interval=0.02)
        raise AssertionError(backend)

    return make


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest,
    make_store: Callable[[str, ManualClock], Store],
    clock: ManualClock,
) -> AsyncIterator[Store]:
    backend = make_store(request.param, clock)
    yield backend
    await backend.close()

"""How fast a follower on another replica sees a PostgreSQL record change, and what waiting costs.

Two stores on one server stand for two gateway processes (each has its own pool,
its own listening connection and its own waiters). For ``listen=on`` (NOTIFY,
the default) and ``listen=off`` (polling, for PgBouncer in transaction mode):

- wake-up: one follower waits on a key, the holder completes it; the time from
  the completion's return to the follower's ``wait`` returning (median, p99);
- cost of waiting: N followers wait 5 s on keys nobody completes; the server's
  committed transactions per second meanwhile (``pg_stat_database``: each
  statement outside a transaction block commits), against the same 5 s with
  nobody waiting.

Run: ``python benchmarks/postgres_followers.py`` (starts its own server; needs
Debian's postgresql). The baseline is the same server idle, in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import free_port

from payonce.store import StoredResponse
from payonce.store.postgres import PostgresStore
from payonce.torture.postgres import LocalPostgres

ANSWER = StoredResponse(200, (), b"{}")
TRIALS = 200
WAITERS = 500


async def wake_ups(url: str) -> list[float]:
    holder, follower = PostgresStore(url), PostgresStore(url)
    await holder.prepare()
    await follower.prepare()
    await asyncio.sleep(0.5)  # the listening connection is up
    took = []
    for trial in range(TRIALS):
        key = f"wake-{trial}-{time.monotonic_ns()}"
        claim = await holder.claim("t", key, "fp", lease=30, ttl=60)
        waiting = asyncio.create_task(follower.wait("t", key, 10))
        await asyncio.sleep(0.02)  # the follower is waiting
        await holder.complete("t", key, claim.record.token, ANSWER, ttl=60)
        done = time.perf_counter()
        await waiting
        took.append(time.perf_counter() - done)
    await holder.close()
    await follower.close()
    return took


async def commits(server: LocalPostgres) -> int:
    return int(server.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'payonce'"))


async def waiting_cost(server: LocalPostgres, url: str, waiters: int) -> float:
    holder, follower = PostgresStore(url), PostgresStore(url + "&pool=20")
    await holder.prepare()
    await follower.prepare()
    keys = [f"idle-{i}-{time.monotonic_ns()}" for i in range(waiters)]
    for key in keys:
        await holder.claim("t", key, "fp", lease=60, ttl=120)
    await asyncio.sleep(0.5)
    before = await commits(server)
    started = time.monotonic()
    await asyncio.gather(*(follower.wait("t", key, 5) for key in keys), asyncio.sleep(5))
    rate = (await commits(server) - before) / (time.monotonic() - started)
    await holder.close()
    await follower.close()
    return rate


def main() -> None:
    server = LocalPostgres(free_port())
    server.create()
    try:
        base = server.url + "?timeout=5"
        idle = asyncio.run(waiting_cost(server, base + "&listen=on", 0))
        print(f"idle server: {idle:.0f} commits/s")
        for listen in ("on", "off"):
            url = f"{base}&listen={listen}"
            took = sorted(asyncio.run(wake_ups(url)))
            median, p99 = statistics.median(took), took[int(len(took) * 0.99) - 1]
            rate = asyncio.run(waiting_cost(server, url, WAITERS))
            print(
                f"listen={listen}: wake-up median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms;"
                f" {WAITERS} followers waiting 5 s: {rate:.0f} commits/s"
            )
    finally:
        server.remove()


if __name__ == "__main__":
    main()

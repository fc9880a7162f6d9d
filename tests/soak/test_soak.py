"""The soak: mixed traffic at a steady rate, on SQLite and on Redis at once.

For ``--soak-minutes`` (1.5 by default; ``--soak-minutes 10`` or
``PAYONCE_SOAK_MINUTES=10`` for the long run) each store gets its own stack
(tests/soak/stack.py) and its own traffic (tests/soak/traffic.py): keyed and
unkeyed calls, streams, concurrent duplicates and duplicates after completion,
same key with another body, clients that leave mid-request and mid-stream, the
simulator's random failures, drops after compute and streams dying midway, and
one gateway's SIGTERM and restart halfway. At the end:

- the simulator's ledger, per operation (each body names its operation in
  ``user``), equals 1 for every keyed call, 1 for every unkeyed call that was
  answered, plus the documented double bills, counted by category;
- no record is left in progress, in the store itself or on the status endpoint;
- the steady gateway's RSS grew less than 10% between minute 1 and the end;
- no process logged a traceback.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.soak.stack import Stack, bill_report
from tests.soak.traffic import Traffic
from tests.support.redis import running_redis

RATE = 8.0  # operations per second per store (about 14 HTTP requests per second)
RSS_GROWTH = 0.10

pytestmark = pytest.mark.soak


async def _soak(stack: Stack, seconds: float, seed: int) -> tuple[list[str], list[str]]:
    traffic = Traffic(stack.name, [stack.steady.url, stack.restarted.url], random.Random(seed))
    async with traffic:
        await stack.drive(traffic, seconds, RATE)
        defects = [f"{op.id}: {d}" for op in traffic.ops for d in op.defects]
        defects += [f"{op.id}: never finished" for op in traffic.ops if not op.finished]
        if stack.restart_code != 0:
            defects.append(f"the SIGTERMed gateway exited with {stack.restart_code}")
        billed = await asyncio.to_thread(stack.ledger_by_user)
        bill_defects, summary = bill_report(traffic.ops, billed)
        defects += bill_defects
        stuck = await asyncio.to_thread(stack.records_in_progress)
        defects += [f"record left in progress in the store: {name}" for name in stuck]
        for op in traffic.ops:
            if op.key is None or op.defects:
                continue
            record = await traffic.status(stack.steady.url, op.key, op.headers)
            if record is None or record["state"] != "completed":
                defects.append(f"{op.id}: status endpoint says {record} for key {op.key}")
    in_flight = Counter(op.attempts[0].outcome for op in traffic.ops if "-restart-" in op.id)
    summary.append(f"in flight at the SIGTERM (first attempts): {dict(in_flight)}")
    base, end = stack.rss_growth()
    growth = (end - base) / base
    by_minute = {int(at // 60): kib for at, kib in stack.rss}  # the last sample of each
    summary.append(
        f"steady gateway RSS: {base} KiB at minute 1, {end} KiB at the end ({growth:+.1%});"
        f" by minute {list(by_minute.values())}; restart took {stack.restart_seconds:.1f}s"
    )
    if growth >= RSS_GROWTH:
        defects.append(f"RSS grew {growth:.1%} between minute 1 and the end: {stack.rss}")
    defects += [f"traceback in {t}" for t in stack.tracebacks()]
    return defects, [f"[{stack.name}] {line}" for line in summary]


async def test_soak_on_sqlite_and_redis_at_once(tmp_path: Path, soak_minutes: float) -> None:
    seconds = soak_minutes * 60 - 22  # start-up, draining and checks fit in the rest
    (tmp_path / "sqlite").mkdir()
    (tmp_path / "redis").mkdir()
    with running_redis(tmp_path / "redis") as server:
        stacks = [
            Stack.start(
                "sqlite", f"sqlite:///{tmp_path}/sqlite/payonce.db", tmp_path / "sqlite", 1
            ),
            Stack.start("redis", server.url, tmp_path / "redis", 2),
        ]
        try:
            results = await asyncio.gather(
                *(_soak(stack, seconds, seed) for seed, stack in enumerate(stacks, 18))
            )
        finally:
            for stack in stacks:
                stack.stop()
    report = [line for _, summary in results for line in summary]
    defects = [defect for found, _ in results for defect in found]
    print("\n".join(report))
    assert not defects, "\n".join([*defects[:40], f"({len(defects)} defects)", *report])

"""The journal: every stream's due events in one store call per tick, each fenced alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from payonce.clock import SystemClock
from payonce.gateway.journal import Journal
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.recording import _Recorder
from payonce.store import Append, SQLiteStore


class _Counted(SQLiteStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.calls: list[int] = []  # appends per append_events_many call

    async def append_events_many(self, appends: Sequence[Append]) -> list[bool]:
        self.calls.append(len(appends))
        return await super().append_events_many(appends)


async def test_sqlite_appends_many_streams_in_one_call_each_fenced_by_its_token(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "p.db"))
    try:
        tokens = []
        for key in ("a", "b"):
            claim = await store.claim("t", key, "print", lease=30, ttl=600)
            assert await store.begin_stream("t", key, claim.record.token, 200, ())
            tokens.append(claim.record.token)
        results = await store.append_events_many(
            [
                ("t", "a", tokens[0], 1, [b"data: a1\n\n", b"data: a2\n\n"]),
                ("t", "b", tokens[1], 1, [b"data: b1\n\n"]),
                ("t", "b", "not-its-token", 2, [b"data: forged\n\n"]),
            ]
        )
        assert results == [True, True, False]
        assert [e.split(b"\n")[0] for e in await store.read_events("t", "a")] == [
            b"data: a1",
            b"data: a2",
        ]
        assert [e.split(b"\n")[0] for e in await store.read_events("t", "b")] == [b"data: b1"]
    finally:
        await store.close()


async def test_streams_due_in_one_tick_are_written_together_in_order(tmp_path: Path) -> None:
    store = _Counted(str(tmp_path / "p.db"))
    journal = Journal(store, tick=0.02)
    recorders = []
    try:
        for key in ("a", "b", "c"):
            claim = await store.claim("t", key, "print", lease=30, ttl=600)
            lease = Lease.of(store, claim.record, clock=SystemClock(), duration=30, ttl=600)
            recorder = _Recorder(lease, LiveStream(200, ()), journal=journal)
            recorder.begin(200, ())
            recorders.append(recorder)
        await asyncio.sleep(0.05)  # the heads are written
        for number in range(1, 6):
            for recorder in recorders:
                await recorder.add([b"data: %s%d\n\n" % (recorder.key.encode(), number)])
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        for recorder in recorders:
            await recorder.finish()
        assert max(store.calls) == 3, store.calls  # the three streams in one call
        assert len(store.calls) < 5, store.calls  # not one call per event
        for key in ("a", "b", "c"):
            read = [e.split(b"\n")[0] for e in await store.read_events("t", key)]
            assert read == [b"data: %s%d" % (key.encode(), n) for n in range(1, 6)]
    finally:
        await store.close()

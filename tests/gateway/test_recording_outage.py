"""The stream recorder through a store outage, in one process (issue 29, defect 2).

:mod:`tests.gateway.test_stream_store_outage` shows it with real stores; these pin
the recorder's rules with a store that fails on command: the relay never waits
for a failing write, the events are written in order once the store is back, and
past the bound (4 MiB, one lease) the stream is given up, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from payonce.clock import SystemClock
from payonce.errors import StorageTimeout
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.recording import record_stream
from payonce.observe.facts import UpstreamFacts
from payonce.store import MemoryStore, RecordState, StoredResponse


class _Flaky(MemoryStore):
    """A store whose writes fail while ``down``, each after ``stall`` seconds (a timeout)."""

    def __init__(self, stall: float = 0.0) -> None:
        super().__init__()
        self.down = False
        self.stall = stall
        self.failed: list[tuple[Any, ...]] = []  # the appends that "timed out"
        self.replay_stale = False

    async def _fail(self) -> None:
        await asyncio.sleep(self.stall)
        raise StorageTimeout("the store did not answer")

    async def begin_stream(self, *args: Any) -> bool:
        if self.down:
            await self._fail()
        return await super().begin_stream(*args)

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> bool:
        if self.down:
            self.failed.append((tenant, key, token, first, list(events)))
            await self._fail()
        written = await super().append_events(tenant, key, token, first, events)
        if self.replay_stale and self.failed:
            # As a Redis back from SIGSTOP may: a write that timed out runs late,
            # after a newer one, and cuts the events that one wrote.
            await super().append_events(*self.failed[0])
            self.replay_stale = False
        return written

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        if self.down:
            await self._fail()
        return await super().renew(tenant, key, token, lease=lease)


class _Upstream:
    """An upstream stream of ``count`` events, ``gap`` seconds apart, with hooks per event."""

    status = 200
    headers = (("content-type", "text/event-stream"),)

    def __init__(self, events: list[bytes], gap: float, hooks: dict[int, Any]) -> None:
        self.events, self.gap, self.hooks = events, gap, hooks
        self.asked: list[float] = []  # when the relay asked for each next chunk

    async def chunks(self, take: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        # As the upstream connection does: each chunk offered to ``take`` first, as
        # it arrives, and yielded only if it is left.
        loop = asyncio.get_running_loop()
        for number, event in enumerate(self.events):
            self.asked.append(loop.time())
            if number in self.hooks:
                self.hooks[number]()
            await asyncio.sleep(self.gap)
            if take is None or not take(event):
                yield event


def _events(count: int, size: int = 100) -> list[bytes]:
    return [b'data: {"n": %d, "pad": "%s"}\n\n' % (n, b"x" * size) for n in range(count)]


async def _record(
    store: _Flaky, upstream: _Upstream, lease: float = 30.0
) -> tuple[StoredResponse | None, UpstreamFacts, LiveStream, str]:
    claim = await store.claim("tenant", "key", "print", lease=lease, ttl=600)
    live, facts = LiveStream(200, ()), UpstreamFacts()
    held = Lease.of(store, claim.record, clock=SystemClock(), duration=lease, ttl=600)
    stored = await record_stream(
        held,
        upstream,  # type: ignore[arg-type]
        live,
        strip_usage=False,
        on_last_event=lambda: None,
        joined=lambda: 0,
        facts=facts,
    )
    return stored, facts, live, claim.record.token


async def _recorded_data(store: _Flaky) -> list[bytes]:
    """The recorded events' data lines (the store frames them with their ids)."""
    return [event.split(b"\n", 1)[0] for event in await store.read_events("tenant", "key")]


def _data(events: list[bytes]) -> list[bytes]:
    return [event.split(b"\n", 1)[0] for event in events]


async def test_events_that_met_an_outage_are_written_once_it_ends_and_the_relay_never_waits() -> (
    None
):
    store = _Flaky(stall=0.3)  # each failing write takes 0.3 s, as a timeout does
    events = _events(60)

    def up() -> None:
        store.down = False

    def down() -> None:
        store.down = True

    upstream = _Upstream(events, 0.02, {5: down, 40: up})
    stored, facts, live, _ = await _record(store, upstream)
    assert stored is not None and stored.stream
    assert facts.not_stored is None
    record = await store.get("tenant", "key")
    assert record is not None and record.state is RecordState.COMPLETED
    assert await _recorded_data(store) == _data(events)
    assert live.total == 60
    # The relay asked for the next chunk every 20 ms, through the whole outage.
    gaps = [b - a for a, b in zip(upstream.asked, upstream.asked[1:], strict=False)]
    assert max(gaps) < 0.2, max(gaps)


async def test_a_late_write_from_the_outage_is_undone_by_the_second_write() -> None:
    store = _Flaky()
    events = _events(60)

    def up() -> None:
        store.down, store.replay_stale = False, True

    def down() -> None:
        store.down = True

    stored, _, _, _ = await _record(store, _Upstream(events, 0.02, {5: down, 30: up}))
    assert stored is not None
    assert await _recorded_data(store) == _data(events)


async def test_an_outage_past_one_lease_gives_the_stream_up_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="payonce.gateway")
    store = _Flaky()
    events = _events(60)

    def up() -> None:
        store.down = False

    def down() -> None:
        store.down = True

    # Down from event 5 to 55: about a second, past a lease of 0.5 s.
    stored, facts, live, _ = await _record(
        store, _Upstream(events, 0.02, {5: down, 55: up}), lease=0.5
    )
    assert (stored, facts.not_stored) == (None, "store_unavailable")
    assert live.total == 60  # relayed whole
    assert await store.get("tenant", "key") is None  # released: a retry runs again
    given_up = [r for r in caplog.records if "gave up recording" in r.getMessage()]
    assert len(given_up) == 1, [r.getMessage() for r in caplog.records]
    assert "one --lease passed" in given_up[0].getMessage()


async def test_more_than_4_mib_waiting_for_the_store_gives_the_stream_up() -> None:
    store = _Flaky()
    events = _events(12, size=512 * 1024)  # 6 MiB

    def up() -> None:
        store.down = False

    def down() -> None:
        store.down = True

    stored, facts, live, _ = await _record(store, _Upstream(events, 0.01, {1: down, 11: up}))
    assert (stored, facts.not_stored) == (None, "store_unavailable")
    assert live.total == 12
    assert await store.get("tenant", "key") is None


async def test_a_lease_lost_during_the_outage_stops_recording_without_blaming_the_store() -> None:
    store = _Flaky()
    events = _events(40)

    def down() -> None:
        store.down = True

    def taken_over() -> None:
        # Another holder took the key meanwhile: this run's writes are refused (fencing).
        name = ("tenant", "key")
        store._records[name] = dataclasses.replace(store._records[name], token="other")
        store.down = False

    stored, facts, live, _ = await _record(
        store, _Upstream(events, 0.02, {5: down, 20: taken_over})
    )
    assert stored is None
    assert facts.not_stored is None  # the lease was lost, not the store: as before
    assert live.total == 40
    record = await store.get("tenant", "key")
    assert record is not None and record.token == "other"  # the new holder's, untouched

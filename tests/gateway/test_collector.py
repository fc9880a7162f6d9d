"""The cycle collector on a timer (collector.py): its schedule, and what it reports.

The schedule with an injected clock, heap size and collect function; the metrics
from outside, by scraping real gateways (one process, and ``--workers 2``).
"""

from __future__ import annotations

import time

import httpx2 as httpx

from payonce.collector import FULL_AFTER, FULL_EVERY, QUIET, YOUNG_EVERY, Collector
from tests.gateway.conftest import GatewayFactory, chat
from tests.support.exposition import metric
from tests.support.processes import Process


class _Heap:
    def __init__(self) -> None:
        self.now = 0.0
        self.blocks = 1000
        self.collected: list[int] = []
        self.in_flight = 0

    def collector(self) -> Collector:
        return Collector(
            clock=lambda: self.now,
            blocks=lambda: self.blocks,
            collect=lambda generation: self.collected.append(generation) or 0,
            busy=lambda: self.in_flight,
        )


def test_each_tick_collects_the_young_generations_only() -> None:
    heap = _Heap()
    collector = heap.collector()
    for _ in range(50):
        heap.now += 0.1
        heap.blocks += 1000  # the heap grows fast: still no full collection this early
        collector.tick()
    assert heap.collected == [1] * 50


def test_a_full_collection_waits_five_minutes_and_a_quarter_more_heap() -> None:
    heap = _Heap()
    collector = heap.collector()
    heap.now = FULL_AFTER + 1
    heap.blocks = 1200  # grown by a fifth: not yet
    assert collector.tick() == 1
    heap.blocks = 1250  # by a quarter
    assert collector.tick() == 2
    assert collector.full_collections == 1
    # Measured again from this one: the next needs as long again and another quarter.
    heap.blocks = 2000
    heap.now += FULL_AFTER / 2
    assert collector.tick() == 1
    heap.now += FULL_AFTER / 2 + 1
    assert collector.tick() == 2


def test_a_due_full_collection_waits_for_few_calls_in_flight() -> None:
    heap = _Heap()
    collector = heap.collector()
    heap.now, heap.blocks, heap.in_flight = FULL_AFTER + 1, 5000, 5000
    for _ in range(100):  # thousands in flight: a full collection would stop them all
        heap.now += 0.1
        assert collector.tick() == 1
    heap.in_flight = QUIET
    assert collector.tick() == 2


def test_a_full_collection_comes_every_half_hour_whatever_the_heap_did() -> None:
    heap = _Heap()
    collector = heap.collector()
    heap.now = FULL_EVERY - 1
    heap.blocks = 900  # shrank
    heap.in_flight = 5000  # and never quiet
    assert collector.tick() == 1
    heap.now = FULL_EVERY
    assert collector.tick() == 2


def _scrape(gateway: Process) -> str:
    return httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text


def _lag(gateway: Process) -> tuple[float, float]:
    """The loop-lag histogram's count and sum of ticks."""
    text = _scrape(gateway)
    return (
        metric(text, "payonce_event_loop_lag_seconds_count"),
        metric(text, "payonce_event_loop_lag_seconds_sum"),
    )


def test_the_gateway_reports_its_loop_lag_and_collector_pauses(
    start_gateway: GatewayFactory,
) -> None:
    gateway = start_gateway()
    for number in range(20):
        assert chat(gateway.url, f"collector-{number}").status_code == 200
    started = time.monotonic()
    first, _ = _lag(gateway)
    time.sleep(1.0)
    text = _scrape(gateway)
    # Both counts were read inside this window, which is longer than the 1 s
    # slept when the machine is busy (the scrapes wait for a core).
    window = time.monotonic() - started
    # A tick waits 0.1 s after the last one ended: at most one per 0.1 s of the window.
    ticks = metric(text, "payonce_event_loop_lag_seconds_count") - first
    assert 0 < ticks <= window / YOUNG_EVERY + 1, (ticks, window)
    assert metric(text, "payonce_gc_pause_seconds_count") > 0
    assert metric(text, "payonce_gc_pause_seconds_sum") > 0


def test_every_worker_reports_its_loop_lag_even_idle(start_gateway: GatewayFactory) -> None:
    gateway = start_gateway("--workers", "2")
    started = time.monotonic()
    count, lag = _lag(gateway)
    time.sleep(3.0)
    more, later = _lag(gateway)
    window = time.monotonic() - started
    # Each tick comes 0.1 s and its lag after the one before, so a worker's ticks
    # in the window account for no more of it than the window and one tick (0.1 s
    # and its lag, however late the ticks ran on a busy machine). Both workers'
    # account for about twice the window, though neither answered a request that
    # would publish its counts.
    accounted = (more - count) * YOUNG_EVERY + (later - lag)
    assert accounted > 1.5 * window, (accounted, window)

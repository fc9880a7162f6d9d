"""The simulator's server: its cycle collector runs on a timer, as the gateway's does.

On CPython's own schedule the simulator made full collections of 28-286 ms while
5,000 calls were starting (payonce/collector.py); every call it served then was
late, the benchmark's direct ones included. Run in this process, so that the
collector's settings can be read while it serves.
"""

from __future__ import annotations

import asyncio
import gc
import urllib.request

from payonce.collector import THRESHOLDS
from payonce.sim.config import SimConfig
from payonce.sim.server import serve
from tests.support.processes import free_port


def _health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/health", timeout=5) as response:
        status: int = response.status
        return status


async def test_the_simulator_collects_on_a_timer_and_restores_the_schedule() -> None:
    before = gc.get_threshold()
    assert before != THRESHOLDS
    port = free_port()
    server = asyncio.create_task(serve(SimConfig(host="127.0.0.1", port=port, seed=1)))
    try:
        loop = asyncio.get_running_loop()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if gc.get_threshold() == THRESHOLDS:
                break
        assert await loop.run_in_executor(None, _health, port) == 200
        # Serving: generations 1 and 2 are the timer's, start-up objects are frozen.
        assert gc.get_threshold() == THRESHOLDS
        assert gc.get_freeze_count() > 0
        collections = gc.get_stats()[1]["collections"]
        await asyncio.sleep(0.35)  # the timer collects generation 1 every 0.1 s
        assert gc.get_stats()[1]["collections"] >= collections + 2
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        gc.unfreeze()  # the rest of this test process as it was
    assert gc.get_threshold() == before

"""Run the simulated provider on a socket until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable

from aiohttp import web

from payonce.clock import Clock
from payonce.collector import Collector
from payonce.listening import BACKLOG, close_all, listen
from payonce.open_files import raise_open_files_limit
from payonce.sim import parent
from payonce.sim.app import LEDGER, build_app
from payonce.sim.config import SimConfig, describe_token_interval

__all__ = ["SHUTDOWN_SECONDS", "run", "serve"]

# Generations still running at shutdown get this long to finish (and be billed);
# past it they are cancelled and never billed, like a provider replica going away.
SHUTDOWN_SECONDS = 2.0


def run(config: SimConfig, sockets: list[socket.socket] | None = None) -> None:
    """Serve ``config`` on uvloop when it is installed, else on the default event loop.

    Given ``sockets`` (started by a gateway), it ends with its parent (sim/parent.py).
    """
    raise_open_files_limit()
    watch = sockets is not None and not parent.end_with_parent()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(config, sockets=sockets, watch_parent=watch))


async def serve(
    config: SimConfig,
    *,
    clock: Clock | None = None,
    sockets: list[socket.socket] | None = None,
    watch_parent: bool = False,
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully (flushing the CSV export).

    ``sockets``: serve these, already listening (the gateway's ``--upstream sim``
    binds its simulator's port itself), instead of binding ``config.host:port``.
    ``watch_parent``: stop once the parent process is gone (where the kernel
    cannot be asked to say so: sim/parent.py).

    While it serves, this process's cycle collector runs on the simulator's timer
    (:class:`payonce.collector.Collector`; the schedule is restored when it stops)
    and the objects alive at start-up are frozen out of collections.

    Raises :class:`ConfigError` when the address cannot be listened on or the
    ledger file cannot be opened.
    """
    if sockets is None:
        # Bound first: a port in use is one line that names the flag (payonce/listening.py).
        sockets = listen(config.host, config.port)
    watcher = asyncio.create_task(parent.watch_parent()) if watch_parent else None
    try:
        await _serve_on(config, clock, sockets)
    finally:
        close_all(sockets)
        if watcher is not None:
            watcher.cancel()


async def _serve_on(config: SimConfig, clock: Clock | None, sockets: list[socket.socket]) -> None:
    runner = web.AppRunner(
        build_app(config, clock=clock),
        # The default, said out loud because the product depends on it: a handler
        # keeps running when its client disconnects, so the generation finishes and
        # is billed, exactly as at a real provider.
        handler_cancellation=False,
        # No access log: with --latency fixed:0 the sim is a benchmark upstream.
        access_log=None,
        shutdown_timeout=SHUTDOWN_SECONDS,
        handle_signals=False,
    )
    await runner.setup()
    try:
        for listener in sockets:
            # aiohttp's default backlog is 128 (payonce/listening.py says why not).
            await web.SockSite(runner, listener, backlog=BACKLOG).start()
        print(_startup_line(config), file=sys.stderr, flush=True)
        # As in the gateway: collected on a timer between requests, a full
        # collection only while few generations run (payonce/collector.py). On
        # CPython's own schedule the simulator stopped for up to 286 ms at 5,000
        # calls in flight.
        ledger = runner.app[LEDGER]
        collector = Collector(busy=lambda: ledger.generating).start()
        try:
            await _until_signalled()
        finally:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
    finally:
        await runner.cleanup()


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def _startup_line(config: SimConfig) -> str:
    parts = [
        f"payonce sim listening on http://{config.host}:{config.port}",
        f"latency {config.latency.describe()}",
        f"token-rate {describe_token_interval(config.token_interval)}",
        f"fail {config.failures.describe()}",
        f"drop-after-compute {config.drop_after_compute:g}",
        f"die-mid-stream {config.die_mid_stream:g}",
        f"keep-alive {config.keep_alive:g}s",
        f"seed {'random' if config.seed is None else config.seed}",
    ]
    if config.ledger_path is not None:
        parts.append(f"ledger {config.ledger_path}")
    return ", ".join(parts)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # optional dependency: absent on Windows
    except ImportError:
        return None
    return uvloop.new_event_loop

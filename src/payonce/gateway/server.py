"""Running the gateway: open the store, start the upstream client, serve with uvicorn.

uvicorn (httptools, uvloop) serves the pure ASGI app; aiohttp is the upstream
client. Both were chosen by measurement (benchmarks/NOTEBOOK.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

import aiohttp
import uvicorn

from payonce.clock import Clock
from payonce.collector import Collector
from payonce.config import GatewaySettings
from payonce.errors import ConfigError, StorageError
from payonce.gateway.accepting import Acceptor
from payonce.gateway.app import Gateway
from payonce.gateway.asgi import BROKEN_ON_PURPOSE, broken_reason
from payonce.gateway.protocol import HttpLimits, protocol_class
from payonce.gateway.upstream import Upstream, parse_upstream_url
from payonce.listening import close_all, listen
from payonce.observe.calllog import CallLog, CallLogPipe, CallLogSink
from payonce.observe.pricing import install_prices, load_prices
from payonce.open_files import raise_open_files_limit
from payonce.sim.parent import PARENT_VARIABLE
from payonce.store import Codec, Sealing, open_store
from payonce.store.redis import redacted
from payonce.store.sealing import PLAIN, load_keys

__all__ = [
    "WorkerLink",
    "bind_simulator",
    "run",
    "serve",
    "simulator_command",
    "simulator_env",
]

log = logging.getLogger("payonce.gateway")

# How long the simulator of --upstream sim may take to answer its health check.
SIM_START_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class WorkerLink:
    """What a ``--workers`` worker shares with its supervisor (gateway/workers.py).

    ``metrics_dir``: the directory of everyone's metrics (None with ``--no-metrics``);
    ``call_log_fd``: the write end of this worker's pipe to the call log's one
    writer (None without ``--call-log``).
    """

    metrics_dir: str | None = None
    call_log_fd: int | None = None


class _Server(uvicorn.Server):
    """uvicorn's server without its habit of re-raising SIGTERM after shutdown.

    uvicorn re-raises the captured signal once it stops serving, which kills the
    process before ``serve()`` can drain keyed upstream calls and close the store.
    At the signal it tells the gateway, which then answers the requests uvicorn
    cancels after its grace (``ShuttingDown``) instead of letting them crash.
    """

    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self._gateway = gateway
        # Accepts waiting connections in batches, beside libuv's one a turn
        # (gateway/accepting.py).
        self.acceptor = Acceptor(self)
        self._delayed: asyncio.TimerHandle | None = None  # --shutdown-delay

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.acceptor.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.acceptor.stop()  # with uvicorn's servers: no new connection from here
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not ready from the first signal on; with --shutdown-delay the gateway
        # serves on that long (load balancers and Kubernetes take it out of
        # rotation on the failing readiness probe), then stops. A second signal
        # stops it at once.
        self._gateway.draining = True
        delay = self._gateway.settings.shutdown_delay
        if delay > 0 and self._delayed is None:
            log.info("not ready: stopping in %g s (--shutdown-delay)", delay)
            loop = asyncio.get_running_loop()
            self._delayed = loop.call_later(delay, self._stop, sig, frame)
            return
        if self._delayed is not None:
            self._delayed.cancel()
        self._stop(sig, frame)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        self._gateway.stopping = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


class _BrokenOnPurpose(logging.Filter):
    """Drop uvicorn's complaint about a response the gateway broke off on purpose.

    A stream whose upstream died is ended without its last chunk so the client
    sees it broken (:func:`payonce.gateway.asgi.break_response`); the gateway
    logs that in one line of its own. uvicorn's generic error about the same
    response would only mislead. Any other unfinished response is still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return broken_reason() is None or not record.getMessage().startswith(BROKEN_ON_PURPOSE)


def bind_simulator(port: int) -> socket.socket:
    """The port of the simulator ``--upstream sim`` starts, bound here, by the gateway.

    Its child then serves this very socket (:func:`simulator_command`), so the
    gateway cannot take another program on the port for its simulator: when
    ``--sim-port`` is taken, it refuses to start.
    """
    return listen("127.0.0.1", port, host_flag="--sim-port", port_flag="--sim-port")[0]


def simulator_command(listener: socket.socket) -> list[str]:
    """``payonce sim`` serving ``listener``: start it with ``pass_fds=(listener.fileno(),)``."""
    port = listener.getsockname()[1]
    return [
        sys.executable, "-m", "payonce", "sim", "--host", "127.0.0.1", "--port", str(port),
        "--listen-fd", str(listener.fileno()),
    ]  # fmt: skip


def simulator_env() -> dict[str, str]:
    """The environment of ``payonce sim`` started by this process: it knows its parent.

    The simulator ends when its parent is gone, and takes a parent of pid 1 for
    init (it was orphaned) unless told that pid 1 is its gateway, as in a container.
    """
    return {**os.environ, PARENT_VARIABLE: str(os.getpid())}


@contextlib.asynccontextmanager
async def embedded_sim(listener: socket.socket) -> AsyncIterator[str]:
    """Start ``payonce sim`` on ``listener`` (for ``--upstream sim``) and stop it after."""
    port = listener.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        *simulator_command(listener), pass_fds=(listener.fileno(),), env=simulator_env()
    )
    # The child's alone now: if it dies, nothing listens on the port any more.
    listener.close()
    url = f"http://127.0.0.1:{port}"
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SIM_START_SECONDS
        # Requests wait in the socket's queue until the child serves: one second each.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            while True:
                if process.returncode is not None:
                    raise ConfigError(
                        f"--upstream sim: the simulator exited with {process.returncode}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url + "/_sim/health") as response:
                        if response.status == 200:
                            break
                if loop.time() > deadline:
                    raise ConfigError(f"--upstream sim: the simulator did not start on port {port}")
                await asyncio.sleep(0.05)
        log.info("simulated LLM upstream on %s (billing ledger: %s/_sim/ledger)", url, url)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)
        if process.returncode is None:
            process.kill()


async def serve(
    settings: GatewaySettings,
    clock: Clock | None = None,
    sockets: list[socket.socket] | None = None,
    worker: WorkerLink | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then let keyed upstream calls finish (up to one lease).

    ``sockets``: listen there instead of ``host:port``, and ``worker``: metrics and
    call log shared with the other workers (a worker of ``--workers``).
    """
    if settings.upstream != "sim":
        parse_upstream_url(settings.upstream)
    if settings.prices is not None:
        install_prices(load_prices(settings.prices))
    with contextlib.ExitStack() as bound:
        # Both ports bound before the store is opened or anything logged, so that a
        # port in use is the one line of a refusal (payonce/listening.py).
        if sockets is None:
            sockets = listen(settings.host, settings.port)
            bound.callback(close_all, sockets)
            # --port 0: the port the system chose, in the log.
            settings = replace(settings, port=sockets[0].getsockname()[1])
        simulator = None
        if settings.upstream == "sim":
            simulator = bind_simulator(settings.sim_port)
            bound.callback(simulator.close)
        await _serve(settings, clock, sockets, worker, simulator)


async def _prepare_store(store: Any) -> None:
    """Connect to a PostgreSQL store and apply (or check) its schema before serving.

    A schema this payonce cannot use ends the start-up with one line
    (ConfigError). A server that cannot be reached does not: requests get 503
    (or, with --on-store-failure open, go through unprotected) until it is back.
    """
    prepare = getattr(store, "prepare", None)
    if prepare is None:
        return
    try:
        await prepare()
    except StorageError as exc:
        log.warning("store not reachable at start-up; keyed requests fail until it is: %s", exc)


async def _serve(
    settings: GatewaySettings,
    clock: Clock | None,
    sockets: list[socket.socket],
    worker: WorkerLink | None,
    simulator: socket.socket | None,
) -> None:
    store = open_store(settings.store, clock, _codec(settings), migrate=settings.migrate)
    await _prepare_store(store)
    try:
        async with contextlib.AsyncExitStack() as stack:
            upstream_url = settings.upstream
            if simulator is not None:
                upstream_url = await stack.enter_async_context(embedded_sim(simulator))
            upstream = Upstream(
                upstream_url,
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.upstream_timeout,
                connect_retries=settings.connect_retries,
            )
            await upstream.start()
            stack.push_async_callback(upstream.close)
            call_log: CallLogSink | None = None
            if worker is not None and worker.call_log_fd is not None:
                call_log = CallLogPipe(worker.call_log_fd)
                stack.callback(call_log.close)
            elif settings.call_log is not None:
                call_log = CallLog(
                    settings.call_log,
                    max_bytes=settings.call_log_max_bytes,
                    backups=settings.call_log_backups,
                )
                stack.callback(call_log.close)
            metrics_dir = worker.metrics_dir if worker is not None else None
            gateway = Gateway(settings, store, upstream, clock, call_log, metrics_dir)
            config = uvicorn.Config(
                gateway,
                host=settings.host,
                port=settings.port,
                # httptools, bounded: head size and count, header and body timeouts,
                # lingering close (gateway/protocol.py).
                http=protocol_class(HttpLimits.of(settings)),
                ws="none",  # the gateway serves no WebSocket; upgrades are not special
                loop="none",  # the running loop (uvloop, set up by run())
                lifespan="off",
                access_log=False,
                server_header=False,  # relay the upstream's own Server and Date
                date_header=False,
                log_level=settings.log_level,
                proxy_headers=False,  # the gateway never reads the client address
                timeout_graceful_shutdown=5,
                # uvicorn's own SSL context (TLS 1.2 and up, Python's default ciphers);
                # the pair was loaded once already by GatewaySettings.
                ssl_certfile=settings.tls_cert,
                ssl_keyfile=settings.tls_key,
            )
            # After the Config: it (re)configures uvicorn's loggers.
            logging.getLogger("uvicorn.error").addFilter(_BrokenOnPurpose())
            server = _Server(config, gateway)
            housekeeping = asyncio.create_task(gateway.background())
            # Collected on a timer between requests (payonce/collector.py).
            running = gateway.running
            collector = Collector(gateway.metrics, busy=lambda: len(running)).start()
            log.info(
                "payonce gateway on %s://%s:%d -> %s (store %s)",
                "https" if settings.tls_cert else "http",
                settings.host,
                settings.port,
                upstream_url,
                redacted(settings.store),
            )
            try:
                await server.serve(sockets=sockets)
            finally:
                try:
                    await gateway.drain(grace=settings.lease, housekeeping=housekeeping)
                finally:
                    housekeeping.cancel()
                    collector.cancel()
    finally:
        await store.close()


def _codec(settings: GatewaySettings) -> Codec:
    """How the store keeps response bodies, headers and events: sealed with the keys, or not."""
    keys = load_keys(settings.encryption_key, settings.encryption_key_file)
    if keys is None:
        return PLAIN
    if settings.store == "memory://":
        log.info("memory:// keeps records in this process only: nothing to encrypt at rest")
        return PLAIN
    sealing = Sealing(keys)
    ids = sealing.key_ids
    log.info(
        "encryption at rest: key %s encrypts%s",
        ids[0],
        f"; {', '.join(ids[1:])} only decrypt{'s' if len(ids) == 2 else ''}" if ids[1:] else "",
    )
    return sealing


def run(
    settings: GatewaySettings,
    clock: Clock | None = None,
    sockets: list[socket.socket] | None = None,
    worker: WorkerLink | None = None,
) -> None:
    """Blocking entry point used by ``payonce serve`` (and by each of its ``--workers``)."""
    raise_open_files_limit()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(serve(settings, clock, sockets, worker))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(settings, clock, sockets, worker))

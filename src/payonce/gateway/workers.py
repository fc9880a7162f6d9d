"""``payonce serve --workers N``: N gateway processes on one port and one store, supervised.

::

    supervisor ─ binds host:port once; starts the simulator once (--upstream sim)
    ├── worker 1 ─ uvicorn + Gateway ─┐
    ├── worker 2 ─ uvicorn + Gateway ─┼─ accept from the one listening socket;
    └── worker N ─ ...               ─┘  share records through SQLite or Redis

The supervisor binds the socket, then forks the workers, so each inherits it and
serves it with its own event loop (``uvicorn.Server.serve(sockets=...)``); the
kernel gives each new connection to one of the workers waiting in ``accept``.
Duplicates that land on different workers meet in the store, exactly as they do
on different hosts: the one that claims the key runs it, the others wait for its
record (woken by Pub/Sub on Redis, by polling on SQLite) and replay it.

The workers' metrics and call log are the host's, not each worker's:

* **Metrics.** The supervisor makes a private directory (``mkdtemp``, mode 0700)
  and each worker keeps its metrics there in prometheus-client's multiprocess
  files (``payonce.observe.metrics``), written as each request counts; a
  scrape, whichever worker takes it, sums all the files. A worker that dies
  leaves its counter and histogram files, so its counts stay in the totals (its
  replacement has another pid, another file); the supervisor removes its gauge
  file (``mark_process_dead``), so what it had in flight does not linger. The
  directory is removed when the supervisor exits.
* **Call log.** The supervisor is its one writer (:class:`CallLogWriter`, a
  thread): each worker hands its lines, once a second, to a pipe of its own;
  the supervisor writes whole lines and rotates the file.

The supervisor:

* restarts a worker that exits on its own (a crash, the OOM killer). A worker
  that fails its start-up on bad configuration (exit code 2) stops all of them
  with exit code 2; five deaths in a row, each within two seconds of a start,
  stop all of them with exit code 1;
* forwards SIGTERM and SIGINT to every worker, which then drain their keyed
  upstream calls (up to one lease) as a single gateway does; a second signal, or
  a drain past ``lease + 10 s``, kills them;
* exits when every worker has exited.

A worker whose supervisor was killed notices within a second and stops
gracefully, so no orphan keeps the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace

from prometheus_client.multiprocess import mark_process_dead

from payonce.config import GatewaySettings
from payonce.errors import ConfigError, PayonceError, StorageError
from payonce.gateway import server
from payonce.gateway.upstream import parse_upstream_url
from payonce.listening import close_all, listen
from payonce.observe.calllog import CallLog, CallLogWriter
from payonce.store import open_store, validate_store_url
from payonce.store.postgres import SCHEMES as POSTGRES_SCHEMES
from payonce.store.redis import redacted

__all__ = ["run_workers"]

log = logging.getLogger("payonce.gateway")

_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
_STOPPING = (signal.SIGTERM, signal.SIGINT)
_QUICK_DEATH = 2.0  # seconds: a worker that dies sooner probably cannot start at all
_MAX_QUICK_DEATHS = 5
_DRAIN_MARGIN = 10.0  # past the lease: uvicorn's own graceful shutdown (5 s) and slack


@dataclass(slots=True)
class _Worker:
    number: int
    pid: int
    started: float


def run_workers(settings: GatewaySettings) -> None:
    """Run ``settings.workers`` gateway processes until SIGTERM/SIGINT; blocking."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    validate_store_url(settings.store)
    if settings.upstream != "sim":
        parse_upstream_url(settings.upstream)
    # Both ports bound before anything is opened, started or logged, so that a port
    # in use is the one line of a refusal (payonce/listening.py).
    listeners = listen(settings.host, settings.port)
    simulator_listener: socket.socket | None = None
    simulator: subprocess.Popen[bytes] | None = None
    writer: CallLogWriter | None = None
    metrics_dir: str | None = None
    try:
        if settings.upstream == "sim":
            simulator_listener = server.bind_simulator(settings.sim_port)
        _create_store(settings.store, settings.migrate)
        settings = replace(settings, port=listeners[0].getsockname()[1])
        if settings.call_log is not None:
            call_log = CallLog(
                settings.call_log,
                max_bytes=settings.call_log_max_bytes,
                backups=settings.call_log_backups,
            )
            writer = CallLogWriter(call_log)
        if settings.metrics:
            metrics_dir = tempfile.mkdtemp(prefix="payonce-metrics-")  # 0700
        if simulator_listener is not None:
            simulator, url = _start_simulator(simulator_listener)
            settings = replace(settings, upstream=url)
        code = _Supervisor(settings, listeners, metrics_dir, writer).run()
    finally:
        close_all(listeners)
        if simulator_listener is not None:
            simulator_listener.close()
        if simulator is not None:
            _stop_simulator(simulator)
        if writer is not None:
            writer.close()  # every worker is gone: the rest of their lines, then the file
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if code == 2:
        raise ConfigError("--workers: a worker could not start (its error is logged above)")
    if code:
        raise PayonceError("--workers: workers kept dying at start-up (see the log above)")


def _create_store(url: str, migrate: bool = True) -> None:
    """Fail in the supervisor, with one line, on a store no worker could open."""
    if url.startswith("sqlite:///"):
        # Creates the file and its tables once, before the workers race to.
        asyncio.run(open_store(url).close())
    elif url.partition("://")[0] in POSTGRES_SCHEMES:
        # The schema checked (or applied) once, before the workers start: a schema
        # no worker could use ends here, in one line, not in N restarts.
        asyncio.run(_prepare(url, migrate))


async def _prepare(url: str, migrate: bool) -> None:
    store = open_store(url, migrate=migrate)
    try:
        await store.prepare()  # type: ignore[attr-defined]
    except StorageError as exc:
        log.warning("store not reachable at start-up; keyed requests fail until it is: %s", exc)
    finally:
        await store.close()


def _start_simulator(listener: socket.socket) -> tuple[subprocess.Popen[bytes], str]:
    """One ``payonce sim`` for every worker (``--upstream sim``), serving ``listener``."""
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        server.simulator_command(listener),
        pass_fds=(listener.fileno(),),
        env=server.simulator_env(),
    )
    # The child's alone now: if it dies, nothing listens on the port any more.
    listener.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + server.SIM_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(f"--upstream sim: the simulator exited with {process.returncode}")
        if _answers(port, "/_sim/health"):
            log.info("simulated LLM upstream on %s (billing ledger: %s/_sim/ledger)", url, url)
            return process, url
        time.sleep(0.05)
    _stop_simulator(process)
    raise ConfigError(f"--upstream sim: the simulator did not start on port {port}")


def _answers(port: int, path: str) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _stop_simulator(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _Supervisor:
    """Forks the workers, restarts the ones that die, stops them all on a signal."""

    def __init__(
        self,
        settings: GatewaySettings,
        listeners: list[socket.socket],
        metrics_dir: str | None = None,
        writer: CallLogWriter | None = None,
    ) -> None:
        self.settings = settings
        self.listeners = listeners
        self.metrics_dir = metrics_dir
        self.writer = writer
        self.workers: dict[int, _Worker] = {}
        self.stopping = False
        self.deadline = 0.0
        self.exit_code = 0
        self.quick_deaths = 0

    def run(self) -> int:
        # Signals are taken synchronously (sigtimedwait), never by a handler that
        # could interrupt a fork or a waitpid half-way.
        signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
        try:
            for number in range(1, self.settings.workers + 1):
                self._spawn(number)
            log.info(
                "payonce gateway on %s://%s:%d -> %s (store %s), %d workers",
                "https" if self.settings.tls_cert else "http",
                self.settings.host,
                self.settings.port,
                self.settings.upstream,
                redacted(self.settings.store),
                self.settings.workers,
            )
            while self.workers:
                received = signal.sigtimedwait(_WATCHED, 1.0)
                # Only SIGTERM and SIGINT stop: after a SIGSTOP and SIGCONT, Python's
                # sigtimedwait can return an uninitialised siginfo (EINTR past its
                # deadline), which once counted as a first, then a second, signal.
                if received is not None and received.si_signo in _STOPPING:
                    self._stop(force=self.stopping)
                self._reap()
                if self.stopping and time.monotonic() > self.deadline:
                    log.warning("workers still draining after %.0fs: killing them", self.grace)
                    self._stop(force=True)
            return self.exit_code
        finally:
            for worker in self.workers.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)

    @property
    def grace(self) -> float:
        # Each worker serves on for --shutdown-delay before its drain begins.
        return self.settings.shutdown_delay + self.settings.lease + _DRAIN_MARGIN

    def _spawn(self, number: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # A pipe of its own to the call log's writer: a worker's death ends only its pipe.
        lines_r, lines_w = os.pipe() if self.writer is not None else (None, None)
        try:
            pid = os.fork()
        except OSError:
            for fd in (lines_r, lines_w):
                if fd is not None:
                    os.close(fd)
            raise
        if pid == 0:  # the worker
            if lines_r is not None:
                os.close(lines_r)
            link = server.WorkerLink(self.metrics_dir, lines_w)
            os._exit(_worker_main(self.settings, self.listeners, number, link))
        if lines_r is not None and lines_w is not None and self.writer is not None:
            os.close(lines_w)  # the worker's alone: its end closes when it exits
            self.writer.add(lines_r)
        self.workers[pid] = _Worker(number, pid, time.monotonic())
        log.debug("worker %d started (pid %d)", number, pid)

    def _stop(self, *, force: bool) -> None:
        if not self.stopping:
            self.stopping = True
            self.deadline = time.monotonic() + self.grace
        sig = signal.SIGKILL if force else signal.SIGTERM
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, sig)

    def _reap(self) -> None:
        for pid in list(self.workers):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            worker = self.workers.pop(pid)
            log.debug("worker %d (pid %d) exit status %d", worker.number, pid, status)
            if self.metrics_dir is not None:
                # Its in-flight gauges leave the sums; its counts stay in the totals.
                mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            if not self.stopping:
                self._replace(worker, os.waitstatus_to_exitcode(status))

    def _replace(self, worker: _Worker, code: int) -> None:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if code == 2:
            log.error("worker %d (pid %d) %s: stopping", worker.number, worker.pid, how)
            self.exit_code = 2
            self._stop(force=False)
            return
        if time.monotonic() - worker.started < _QUICK_DEATH:
            self.quick_deaths += 1
        else:
            self.quick_deaths = 0
        if self.quick_deaths >= _MAX_QUICK_DEATHS:
            log.error("worker %d (pid %d) %s, again: stopping", worker.number, worker.pid, how)
            self.exit_code = 1
            self._stop(force=False)
            return
        log.warning("worker %d (pid %d) %s: restarting it", worker.number, worker.pid, how)
        time.sleep(0.2 * self.quick_deaths)  # back off while workers die at start-up
        self._spawn(worker.number)


def _worker_main(
    settings: GatewaySettings, listeners: list[socket.socket], number: int, link: server.WorkerLink
) -> int:
    """A forked worker: serve the inherited sockets until told to stop; the exit code.

    It inherits the supervisor's other descriptors too (the call log writer's
    ends of the other workers' pipes, its file): it never uses them.
    """
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        supervisor = os.getppid()
        watch = threading.Thread(
            target=_stop_when_orphaned, args=(supervisor,), name="payonce-supervisor", daemon=True
        )
        watch.start()
        log.debug("worker %d serving", number)
        server.run(settings, sockets=listeners, worker=link)
        return 0
    except ConfigError as exc:
        print(f"payonce: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:  # the process ends here: say why, whatever it was
        log.exception("worker %d failed", number)
        return 1


def _stop_when_orphaned(supervisor: int) -> None:
    while os.getppid() == supervisor:
        time.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone: stopping", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)

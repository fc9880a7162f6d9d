"""The call log: one JSON line per client request (schema in docs/call-log.md).

Writes go through a buffer flushed every second and at shutdown, so logging a
request costs a serialisation and a copy into that buffer on the hot path, not a
syscall.
Files rotate by size (``PATH`` → ``PATH.1`` → … → ``PATH.<backups>``).

With ``--workers N`` the file has one writer, the supervisor (:class:`CallLogWriter`):
each worker hands its buffer, once a second, to a pipe of its own
(:class:`CallLogPipe`, never blocking its event loop), and the supervisor writes
whole lines from every pipe and rotates the file (docs/call-log.md, "Workers").
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import selectors
import signal
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from payonce.errors import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "CallLog",
    "CallLogPipe",
    "CallLogSink",
    "CallLogWriter",
    "CallRecord",
]

log = logging.getLogger("payonce.gateway")

# Lines kept in memory while the call log cannot be written (a full disk): past
# this, the oldest are dropped, counted and said, rather than the gateway's memory.
_MAX_HELD = 64 * 1024 * 1024

SCHEMA_VERSION = 2


_MILLIS = tuple(f"{milli:03d}Z" for milli in range(1000))
_LINE = orjson.OPT_APPEND_NEWLINE
# The last whole second formatted (its text ends with "."), and the last millisecond's text.
_second: list[object] = [None, ""]
_last: list[object] = [None, ""]


def _timestamp(now: float) -> str:
    """ISO 8601 UTC with milliseconds; the date part is formatted once a second."""
    millis = int(now * 1000)
    if _last[0] == millis:  # a busy gateway finishes several requests per millisecond
        return _last[1]  # type: ignore[return-value]
    second = millis // 1000
    if _second[0] != second:
        _second[0] = second
        _second[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    text = f"{_second[1]}{_MILLIS[millis - second * 1000]}"
    _last[0], _last[1] = millis, text
    return text


@dataclass(slots=True)
class CallRecord:
    """What the gateway learns about one request while answering it."""

    request_id: str
    method: str
    path: str
    tenant: str
    started: float  # time.perf_counter() at arrival
    key: str | None = None
    model: str | None = None
    stream: bool = False
    outcome: str = "error"
    status: int = 500
    upstream_status: int | None = None
    upstream_request_id: str | None = None
    upstream_attempts: int = 0
    client_retry: int | None = None
    # An SDK attempt without a key (gateway/sdk_retries.py): "first" (recorded for its
    # retries), "on_its_own" (a first attempt another call's record was busy for),
    # "retry" (answered through its first attempt's record) or "identical" (any
    # request under --dedupe-identical); None otherwise.
    sdk_match: str | None = None
    usage: dict[str, int] | None = None
    # Why ``usage`` is null although an upstream call was made or replayed.
    usage_missing_reason: str | None = None
    cost_usd: float | None = None
    saved_usd: float | None = None
    # Who priced cost_usd (or saved_usd): "provider" (the response's own cost, e.g.
    # OpenRouter's usage.cost), "prices-file" (--prices) or "genai-prices"; None: unpriced.
    price_source: str | None = None
    # The list price of the call (--prices, genai-prices) when the provider stated
    # its cost (price_source "provider"), so both can be compared; None otherwise.
    list_cost_usd: float | None = None
    # The API the request calls (observe/scenarios.py ENDPOINTS) and the business
    # scenario it names, exactly as sent; scenario_label is its metrics label. None:
    # the gateway's own path (/_payonce/...), no provider API (metrics: "other").
    endpoint: str | None = "other"
    scenario: str | None = None
    scenario_label: str = "none"
    upstream_latency: float | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # A keyed request forwarded unprotected: the store was down (--on-store-failure open).
    store_bypassed: bool = False
    # The answer was relayed but not stored, its key released ("too_large").
    not_stored: str | None = None
    # The client left before its response was complete (status is then 499).
    client_disconnected: bool = False
    # The gateway stopped the upstream call (its client left, --on-disconnect cancel).
    upstream_cancelled: bool = False
    # The response's head went out: from then on an error can only break the body.
    response_started: bool = False
    # Its OpenTelemetry span while the request is answered (observe/tracing.py), else None.
    span: Any = None

    @property
    def unprotected_retry(self) -> bool:
        return self.key is None and (self.client_retry or 0) > 0 and self.sdk_match is None

    def line(self, finished: float, now: float) -> bytes:
        """The call log line of this request: one JSON object and a newline (docs/call-log.md).

        On every logged request, so written for speed: one dict literal (the
        fastest thing orjson serialises; a dataclass or a template were slower or
        unsafe), each value read once.
        """
        usage = self.usage
        if usage:
            get = usage.get
            input_tokens, output_tokens = get("input_tokens"), get("output_tokens")
            cached, reasoning = get("cached_input_tokens"), get("reasoning_tokens")
        else:
            input_tokens = output_tokens = cached = reasoning = None
        upstream_latency = self.upstream_latency
        return orjson.dumps(
            {
                "v": SCHEMA_VERSION,
                "ts": _timestamp(now),
                "request_id": self.request_id,
                "key": self.key,
                "tenant": self.tenant,
                "method": self.method,
                "path": self.path,
                "endpoint": self.endpoint,
                "scenario": self.scenario,
                "model": self.model,
                "stream": self.stream,
                "outcome": self.outcome,
                "status": self.status,
                "client_disconnected": self.client_disconnected,
                "upstream_status": self.upstream_status,
                "upstream_request_id": self.upstream_request_id,
                "upstream_attempts": self.upstream_attempts,
                "upstream_cancelled": self.upstream_cancelled,
                "client_retry": self.client_retry,
                "unprotected_retry": self.unprotected_retry,
                "sdk_match": self.sdk_match,
                "store_bypassed": self.store_bypassed,
                "not_stored": self.not_stored,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cached_input_tokens": cached,
                "reasoning_tokens": reasoning,
                "usage_missing_reason": self.usage_missing_reason,
                "cost_usd": self.cost_usd,
                "list_cost_usd": self.list_cost_usd,
                "saved_usd": self.saved_usd,
                "price_source": self.price_source,
                # round(x * 1000, 3) is slower than all the rest of a field: integers.
                "latency_ms": int((finished - self.started) * 1e6 + 0.5) / 1000,
                "upstream_latency_ms": (
                    None if upstream_latency is None else int(upstream_latency * 1e6 + 0.5) / 1000
                ),
            },
            option=_LINE,
        )


class CallLog:
    """Buffered JSONL writer with size-based rotation; ``"-"`` writes to stdout."""

    def __init__(self, target: str, *, max_bytes: int = 100 * 1024**2, backups: int = 5) -> None:
        self.target = target
        self._stdout = target == "-"
        self._path = Path(target)
        self._max_bytes = max_bytes
        self._backups = backups
        # One growing buffer rather than a list of lines: each line's bytes object
        # is freed at once (and its memory reused by the next), nothing to join.
        self._pending = bytearray()
        self._written = 0  # bytes of the flush in progress written
        self._failing = False  # the last flush could not write
        self.dropped = 0  # lines dropped while the file could not be written
        self._file: IO[bytes] | None = None
        if not self._stdout:
            if not self._path.parent.is_dir():
                raise ConfigError(f"--call-log: directory {self._path.parent} does not exist")
            try:
                self._file = self._path.open("ab", buffering=0)
            except OSError as exc:
                raise ConfigError(f"--call-log: cannot open {target}: {exc.strerror}") from exc

    def write(self, line: bytes) -> None:
        self._pending += line

    def flush(self) -> None:
        if not self._pending:
            return
        data, self._pending = self._pending, bytearray()
        if self._stdout:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        self._written = 0
        try:
            if self._file is None or self._file.closed:  # a rotation that could not reopen it
                self._file = self._path.open("ab", buffering=0)
            self._write_rotating(data)
        except OSError as exc:
            # A full disk, a lost mount: keep what was not written for the next
            # flush, so the log goes on when the disk does (bounded, see _hold).
            self._hold(data, exc)
            return
        if self._failing:
            log.warning(
                "call log: writing to %s again (%d lines dropped meanwhile)",
                self._path, self.dropped,
            )  # fmt: skip
            self._failing = False

    def _write_rotating(self, data: bytearray) -> None:
        assert self._file is not None
        # Rotation falls between lines: a file holds the whole lines that fit.
        view, start, end = memoryview(data), 0, len(data)
        while end - start > self._max_bytes - (size := self._file.tell()):
            fits = data.rfind(b"\n", start, start + max(self._max_bytes - size, 0)) + 1
            if fits:
                self._write_all(view[start:fits])
                start = fits
            elif size == 0:  # a line longer than the limit: alone in its file
                fits = data.find(b"\n", start) + 1 or end
                self._write_all(view[start:fits])
                start = fits
                continue
            self._rotate()
        self._write_all(view[start:end])  # unbuffered: nothing left to flush

    def _write_all(self, view: memoryview) -> None:
        # Counted as it goes (the file is unbuffered): a write that fails part way
        # leaves the rest of ``data`` to hold, nothing written twice.
        assert self._file is not None
        while view:
            done = self._file.write(view) or 0
            self._written += done
            view = view[done:]

    def _hold(self, data: bytearray, exc: OSError) -> None:
        rest = data[self._written :]
        rest += self._pending
        if len(rest) > _MAX_HELD:  # the oldest whole lines go: counted, and said
            cut = rest.find(b"\n", len(rest) - _MAX_HELD) + 1
            self.dropped += rest.count(b"\n", 0, cut)
            del rest[:cut]
        self._pending = rest
        if not self._failing:
            log.error(
                "call log: cannot write to %s (%s); lines are kept in memory up to %d MiB"
                " until it can",
                self._path, exc.strerror or exc, _MAX_HELD >> 20,
            )  # fmt: skip
            self._failing = True

    def _rotate(self) -> None:
        # PATH.(n-1) -> PATH.n, ..., PATH -> PATH.1; the oldest is overwritten.
        assert self._file is not None
        self._file.close()
        name = self._path.name
        for index in range(self._backups, 1, -1):
            older = self._path.with_name(f"{name}.{index - 1}")
            if older.exists():
                older.replace(self._path.with_name(f"{name}.{index}"))
        if self._backups > 0:
            self._path.replace(self._path.with_name(f"{name}.1"))
        else:
            self._path.unlink(missing_ok=True)
        self._file = self._path.open("ab", buffering=0)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()


# A worker's lines waiting for its pipe, at most: past it, new lines are dropped
# (and counted in the log) until the supervisor reads again.
_PIPE_BACKLOG = 64 * 1024**2


class CallLogPipe:
    """A ``--workers`` worker's call log: lines go to the supervisor through a pipe.

    Same interface as :class:`CallLog`. :meth:`write` appends to a buffer;
    :meth:`flush` (once a second) hands the buffer to the pipe without blocking:
    what does not fit waits, and goes as the supervisor reads (the event loop
    watches the pipe). Only :meth:`close`, at shutdown, blocks until all is handed over.
    A worker killed with SIGKILL loses what it had not handed over yet: the lines
    of its last second, and any backlog the supervisor had not read.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._pending = bytearray()
        self._watched: asyncio.AbstractEventLoop | None = None
        self._dropped = 0

    def write(self, line: bytes) -> None:
        if len(self._pending) < _PIPE_BACKLOG:
            self._pending += line
        else:
            self._dropped += 1

    def flush(self) -> None:
        if self._dropped:
            log.warning(
                "call log: %d lines dropped, the supervisor is not reading its pipe", self._dropped
            )
            self._dropped = 0
        if self._watched is None and self._pending:
            self._send()
            if self._pending:
                # The pipe is full: go on when the supervisor has read some of it.
                self._watched = asyncio.get_running_loop()
                self._watched.add_writer(self._fd, self._more)

    def _send(self) -> None:
        try:
            sent = os.write(self._fd, self._pending)
        except BlockingIOError:
            return
        del self._pending[:sent]

    def _more(self) -> None:
        try:
            self._send()
        except OSError as exc:  # the supervisor is gone
            log.warning("call log: %d bytes lost: %s", len(self._pending), exc)
            self._pending.clear()
        if not self._pending and self._watched is not None:
            self._watched.remove_writer(self._fd)
            self._watched = None

    def close(self) -> None:
        if self._watched is not None:
            self._watched.remove_writer(self._fd)
            self._watched = None
        os.set_blocking(self._fd, True)
        try:
            while self._pending:
                sent = os.write(self._fd, self._pending)
                del self._pending[:sent]
        except OSError as exc:
            log.warning("call log: %d bytes lost: %s", len(self._pending), exc)
        finally:
            os.close(self._fd)


class CallLogWriter:
    """The one writer of a ``--workers`` gateway's call log, in the supervisor.

    A thread reads each worker's pipe (:meth:`add`), keeps the end of a line
    that has not fully arrived, and writes whole lines to the :class:`CallLog`,
    which rotates the file: one writer, so lines never interleave and the file
    rotates once. A pipe at its end (the worker exited or was killed) is read to
    its last whole line first. :meth:`close`, once every worker has exited,
    writes what is left and closes the file.
    """

    def __init__(self, call_log: CallLog) -> None:
        self._log = call_log
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._added: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._partial: dict[int, bytearray] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="payonce-call-log", daemon=True)
        # Signals are the main thread's (the supervisor waits for them with
        # sigtimedwait): the thread starts with all of them blocked.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def add(self, fd: int) -> None:
        """Read the pipe ``fd`` (its read end; the writer closes it at its end)."""
        self._added.put(fd)
        os.write(self._wake_w, b"+")

    def close(self, timeout: float = 30.0) -> None:
        self._closing = True
        os.write(self._wake_w, b".")
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("call log: the writer did not finish in %.0fs", timeout)
            return
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._log.close()

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                fd = key.fd
                if fd == self._wake_r:
                    os.read(fd, 4096)
                    while not self._added.empty():
                        added = self._added.get()
                        self._partial[added] = bytearray()
                        self._selector.register(added, selectors.EVENT_READ)
                else:
                    self._read(fd)
            try:
                self._log.flush()
            except OSError as exc:
                log.warning("call log: cannot write %s: %s", self._log.target, exc)
            if self._closing and not self._partial and self._added.empty():
                return

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        partial = self._partial[fd]
        if data:
            partial += data
            end = partial.rfind(b"\n") + 1
            if end:
                self._log.write(bytes(partial[:end]))
                del partial[:end]
            return
        # The worker is gone and everything it handed over is read.
        if partial:
            log.warning(
                "call log: a worker ended in the middle of a line (%d bytes lost)", len(partial)
            )
        del self._partial[fd]
        self._selector.unregister(fd)
        os.close(fd)


# What a gateway process writes its lines to: the file, or its pipe to the supervisor.
CallLogSink = CallLog | CallLogPipe

"""The call log: one JSON line per client request (schema in docs/call-log.md).

Writes go through a buffer flushed every second and at shutdown, so logging a
request costs a serialisation and a copy into that buffer on the hot path, not a
syscall.
Files rotate by size (``PATH`` → ``PATH.1`` → … → ``PATH.<backups>``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from payonce.errors import ConfigError

__all__ = ["SCHEMA_VERSION", "CallLog", "CallRecord"]

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
    usage: dict[str, int] | None = None
    # Why ``usage`` is null although an upstream call was made or replayed.
    usage_missing_reason: str | None = None
    cost_usd: float | None = None
    saved_usd: float | None = None
    upstream_latency: float | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # A keyed request forwarded unprotected: the store was down (--on-store-failure open).
    store_bypassed: bool = False
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
        return self.key is None and (self.client_retry or 0) > 0

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
                "store_bypassed": self.store_bypassed,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cached_input_tokens": cached,
                "reasoning_tokens": reasoning,
                "usage_missing_reason": self.usage_missing_reason,
                "cost_usd": self.cost_usd,
                "saved_usd": self.saved_usd,
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
        self._stdout = target == "-"
        self._path = Path(target)
        self._max_bytes = max_bytes
        self._backups = backups
        # One growing buffer rather than a list of lines: each line's bytes object
        # is freed at once (and its memory reused by the next), nothing to join.
        self._pending = bytearray()
        self._file: IO[bytes] | None = None
        if not self._stdout:
            if not self._path.parent.is_dir():
                raise ConfigError(f"--call-log: directory {self._path.parent} does not exist")
            try:
                self._file = self._path.open("ab")
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
        assert self._file is not None
        if self._file.tell() + len(data) > self._max_bytes and self._file.tell() > 0:
            self._rotate()
        self._file.write(data)
        self._file.flush()

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
        self._file = self._path.open("ab")

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()

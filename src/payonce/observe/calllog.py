"""The call log: one JSON line per client request (schema in docs/call-log.md).

Writes go through a buffer flushed every second and at shutdown, so logging a
request costs a serialisation and a list append on the hot path, not a syscall.
Files rotate by size (``PATH`` → ``PATH.1`` → … → ``PATH.<backups>``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import orjson

from payonce.errors import ConfigError

__all__ = ["SCHEMA_VERSION", "CallLog", "CallRecord"]

SCHEMA_VERSION = 1


_second: list[object] = [None, ""]  # the last whole second formatted, and its text


def _timestamp(now: float) -> str:
    """ISO 8601 UTC with milliseconds; the date part is formatted once a second."""
    second = int(now)
    if _second[0] != second:
        _second[0] = second
        _second[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_second[1]}.{int((now - second) * 1000):03d}Z"


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
    cost_usd: float | None = None
    saved_usd: float | None = None
    upstream_latency: float | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # A keyed request forwarded unprotected: the store was down (--on-store-failure open).
    store_bypassed: bool = False

    @property
    def unprotected_retry(self) -> bool:
        return self.key is None and (self.client_retry or 0) > 0

    def line(self, finished: float, now: float) -> bytes:
        usage = self.usage or {}
        document = {
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
            "upstream_status": self.upstream_status,
            "upstream_request_id": self.upstream_request_id,
            "upstream_attempts": self.upstream_attempts,
            "client_retry": self.client_retry,
            "unprotected_retry": self.unprotected_retry,
            "store_bypassed": self.store_bypassed,
            "input_tokens": usage.get("input_tokens"),
            "output_tokens": usage.get("output_tokens"),
            "cached_input_tokens": usage.get("cached_input_tokens"),
            "reasoning_tokens": usage.get("reasoning_tokens"),
            "cost_usd": self.cost_usd,
            "saved_usd": self.saved_usd,
            "latency_ms": round((finished - self.started) * 1000, 3),
            "upstream_latency_ms": (
                round(self.upstream_latency * 1000, 3)
                if self.upstream_latency is not None
                else None
            ),
        }
        return orjson.dumps(document) + b"\n"


class CallLog:
    """Buffered JSONL writer with size-based rotation; ``"-"`` writes to stdout."""

    def __init__(self, target: str, *, max_bytes: int = 100 * 1024**2, backups: int = 5) -> None:
        self._stdout = target == "-"
        self._path = Path(target)
        self._max_bytes = max_bytes
        self._backups = backups
        self._pending: list[bytes] = []
        self._file: IO[bytes] | None = None
        if not self._stdout:
            if not self._path.parent.is_dir():
                raise ConfigError(f"--call-log: directory {self._path.parent} does not exist")
            try:
                self._file = self._path.open("ab")
            except OSError as exc:
                raise ConfigError(f"--call-log: cannot open {target}: {exc.strerror}") from exc

    def write(self, line: bytes) -> None:
        self._pending.append(line)

    def flush(self) -> None:
        if not self._pending:
            return
        data, self._pending = b"".join(self._pending), []
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

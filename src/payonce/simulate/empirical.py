"""Observed latencies from a file, for ``--latency empirical:FILE``.

Two forms, told apart by the first non-blank line:

* **Plain numbers**: one latency in seconds per line (``4.2``). Blank lines and
  lines starting with ``#`` are skipped.
* **A payonce call log** (JSON lines, docs/call-log.md): a line starting with ``{``.
  The field read is ``upstream_latency_ms``, the time the gateway waited for the
  provider, which is the generation time the model needs. ``latency_ms`` would add
  the gateway's own overhead and, on replays and joins, measure the wait for
  someone else's generation. Only lines that ran upstream and got a whole answer
  count: outcome ``forwarded`` or ``passthrough``, a 2xx ``upstream_status``, not
  ``upstream_cancelled``. A keyed call whose client timed out is still measured to
  its end (the gateway kept it running), so a call log is an uncensored sample of
  the tail, unlike a client's own log, which stops at its timeout.

Gzip is recognised by its magic bytes, so rotated and compressed logs work too.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from payonce.errors import ConfigError

__all__ = ["read_latencies"]

_RAN_UPSTREAM = frozenset({"forwarded", "passthrough"})


def read_latencies(path: str, *, flag: str = "--latency") -> tuple[float, ...]:
    """The latencies in seconds from ``path`` (either form above); at least one."""
    lines = list(_lines(path, flag=flag))
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("{"):
        values = _from_call_log(lines, path=path, flag=flag)
    else:
        values = _from_numbers(lines, path=path, flag=flag)
    if not values:
        raise ConfigError(f"{flag}: {path}: no latencies found")
    return tuple(values)


def _lines(path: str, *, flag: str) -> Iterator[str]:
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path!r}: {exc.strerror}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ConfigError(f"{flag}: {path}: not a valid gzip file") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{flag}: {path}: not UTF-8 text") from exc
    yield from text.splitlines()


def _from_numbers(lines: list[str], *, path: str, flag: str) -> list[float]:
    values = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"{flag}: {path}:{number}: {text[:40]!r} is not a number of seconds"
            ) from None
        values.append(_checked(value, path=path, number=number, flag=flag))
    return values


def _from_call_log(lines: list[str], *, path: str, flag: str) -> list[float]:
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except ValueError:
            raise ConfigError(f"{flag}: {path}:{number}: not a JSON line") from None
        if not isinstance(record, dict) or not _ran_upstream(record):
            continue
        milliseconds = record.get("upstream_latency_ms")
        if isinstance(milliseconds, int | float) and not isinstance(milliseconds, bool):
            values.append(_checked(milliseconds / 1000, path=path, number=number, flag=flag))
    return values


def _ran_upstream(record: dict[str, Any]) -> bool:
    status = record.get("upstream_status")
    return (
        record.get("outcome") in _RAN_UPSTREAM
        and isinstance(status, int)
        and 200 <= status < 300
        and not record.get("upstream_cancelled", False)
    )


def _checked(value: float, *, path: str, number: int, flag: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{flag}: {path}:{number}: latency must be >= 0 seconds, got {value:g}")
    return float(value)

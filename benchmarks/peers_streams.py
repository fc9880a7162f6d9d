"""Workload 5 of ``benchmarks/peers.py``: streams at token rate, CPU per event against nginx.

Each load is ``streams`` chat streams at once, each of ``--stream-events`` events
(one token each, ~240 bytes with its SSE framing) ``token_ms`` apart, through
every system in turn (interleaved, ``--rounds`` rounds): direct, nginx, and each
payonce store unkeyed (``nokey``) and keyed (``keyed``: a fresh key per stream,
so every event is recorded). For each: CPU per event of the process under test
(utime + stime over the run / events delivered; for Redis, redis-server's CPU
reported beside it and added in ``cpu_us_per_event_with_store``), its ratio to
nginx's in the same round, and the gaps between consecutive events as the
clients read them (p50, p99, max), with the p99 added to direct's in the same
round. Issue 33's loads are the defaults: 200 streams x 50 events/s and
1,000 x 20 events/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (streams, milliseconds between events) per load.
LOADS = ((200, 20), (1000, 50))
QUICK_LOADS = ((20, 20), (50, 50))


def variants(systems: Sequence[str]) -> list[tuple[str, bool]]:
    """(system, keyed) pairs in the order run: direct and nginx, then payonce both ways."""
    chosen: list[tuple[str, bool]] = [("direct", False)]
    if "nginx" in systems:
        chosen.append(("nginx", False))
    if "python-relay" in systems:
        chosen.append(("python-relay", False))  # the floor of a Python relay
    if "python-http-relay" in systems:
        chosen.append(("python-http-relay", False))  # ... of one that parses HTTP
    for system in systems:
        if system.startswith("payonce"):
            chosen += [(system, False), (system, True)]
    return chosen


def label(system: str, keyed: bool) -> str:
    if not system.startswith("payonce"):
        return system
    return f"{system} {'keyed' if keyed else 'nokey'}"


def row_of(
    document: dict[str, Any],
    streams: int,
    events: int,
    cpu_us: float,
    store_cpu_us: float | None,
    call_stats: Callable[[Sequence[Sequence[Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """One run's figures from its load document and the CPU it cost."""
    stats = call_stats(document["results"])
    # Counted by the load generator; documents of older runs carry no count.
    delivered = document.get("events") or stats["answered"] * events or 1
    row: dict[str, Any] = {
        "streams": streams,
        "answered": stats["answered"],
        "failures": stats["failures"],
        "events": delivered,
        "events_per_stream": delivered / max(1, stats["answered"]),
        "cpu_us_per_event": cpu_us / delivered,
        "gap_p50_ms": document["gaps"]["p50_ms"],
        "gap_p99_ms": document["gaps"]["p99_ms"],
        "gap_max_ms": document["gaps"]["max_ms"],
    }
    if store_cpu_us is not None:
        row["store_cpu_us_per_event"] = store_cpu_us / delivered
        row["cpu_us_per_event_with_store"] = (cpu_us + store_cpu_us) / delivered
    return row


def compared(row: dict[str, Any], nginx: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its ratio to nginx's CPU per event and its p99 gap added to direct's."""
    own = row.get("cpu_us_per_event_with_store", row["cpu_us_per_event"])
    if nginx.get("cpu_us_per_event"):
        row["x_nginx"] = own / nginx["cpu_us_per_event"]
    if direct.get("gap_p99_ms") is not None and row.get("gap_p99_ms") is not None:
        row["added_gap_p99_ms"] = row["gap_p99_ms"] - direct["gap_p99_ms"]
    return row

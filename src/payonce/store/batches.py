"""A batch of a stream's events as one stored value.

A recorder writes a stream's events in batches (gateway/recording.py), and a
store that keeps each event as a row of its own pays for every row: its key
repeated, a B-tree cell, its share of the WAL and of the checkpoint that copies
it. Stored as one value per batch, a 50-event batch of token chunks cost SQLite
1.6 µs an event instead of 5.2 (benchmarks/NOTEBOOK.md, "A stream's events
stored a batch to a row").

The form: a single event as it is; several as their count and sizes (4-byte
big-endian integers each), then the events one after the other. Which one a
value is, the store keeps beside it (its span: how many events it holds), so a
value of one event reads back as it was written by any version.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["pack", "unpack"]


def pack(events: Sequence[bytes]) -> bytes:
    """``events`` (at least one) as one value; :func:`unpack` with ``len(events)`` reads it."""
    if len(events) == 1:
        return events[0]
    count = len(events)
    return struct.pack(f">{count + 1}I", count, *map(len, events)) + b"".join(events)


def unpack(value: bytes, span: int) -> list[bytes]:
    """The ``span`` events of a value :func:`pack` made; :class:`ValueError` if it is not one."""
    if span == 1:
        return [value]
    header = 4 * (span + 1)
    if span < 1 or len(value) < header or struct.unpack_from(">I", value)[0] != span:
        raise ValueError(f"a stored batch of {span} events is damaged (its header)")
    events = []
    at = header
    for size in struct.unpack_from(f">{span}I", value, 4):
        events.append(value[at : at + size])
        at += size
    if at != len(value):
        raise ValueError(f"a stored batch of {span} events is damaged (its sizes)")
    return events

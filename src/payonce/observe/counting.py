"""How the gateway's metric values are kept between updates and scrapes.

One process: counts are plain numbers in memory (:class:`Deferred`,
:class:`Buckets`), applied to prometheus-client when someone scrapes. With
``--workers``: each value is a double in the worker's prometheus-client
multiprocess file, updated in place through its :class:`Slots` entry, and a
scrape sums the files. :mod:`payonce.observe.metrics` builds the metrics on these.

This module is also the one place that uses prometheus-client beyond its
documented API (the value classes, the multiprocess file's layout, a
histogram's buckets): :data:`CHECKED` names the releases the suite passed on,
:data:`INTERNALS` what is used, checked against the installed release by
``tests/observe/test_prometheus_internals.py``; ``pyproject.toml`` bounds
prometheus-client below the next minor release.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any

from prometheus_client import Histogram, values

__all__ = ["CHECKED", "INTERNALS", "Buckets", "Deferred", "Slot", "Slots", "use_values"]

# Releases the whole suite passed on (uv.lock's, and those before it).
CHECKED = ("0.26.0",)
# (object, attribute) pairs used here: module-level names of prometheus_client.values,
# attributes of a multiprocess value and of its file, a histogram's children.
INTERNALS = (
    ("values", "ValueClass"),
    ("values", "MutexValue"),
    ("values", "MultiProcessValue"),
    ("MmapedValue", "_file"),
    ("MmapedValue", "_key"),
    ("MmapedDict", "_m"),
    ("MmapedDict", "_positions"),
    ("Histogram", "_buckets"),
    ("Histogram", "_sum"),
)

# prometheus-client's multiprocess value class of each shared directory (one per process).
_shared_values: dict[str, Any] = {}


def use_values(shared: str | None) -> None:
    """Make the metrics this process creates from now on in-memory, or files in ``shared``.

    prometheus-client picks its value class once, when it is first imported, from
    ``PROMETHEUS_MULTIPROC_DIR``. A ``--workers`` supervisor has imported it before
    it forks, and a variable inherited from the operator's shell is not the
    gateway's directory: so the choice is made here, for the process, before its
    metrics exist. ``PROMETHEUS_MULTIPROC_DIR`` is also set, in this process only:
    prometheus-client reads it again for each value it creates.
    """
    if shared is None:
        values.ValueClass = values.MutexValue
        return
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = shared
    value_class = _shared_values.get(shared)
    if value_class is None:
        value_class = _shared_values[shared] = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    values.ValueClass = value_class


# A multiprocess value's place in its worker's file: the file's bytes seen as
# doubles, and the index of the value's double.
Slot = tuple["memoryview[float]", int]


class Slots:
    """Where each multiprocess value of this worker lives in its file, found once.

    prometheus-client's ``inc`` and ``set`` take a lock and call ``os.getpid()``
    (a system call) on every update, to survive a fork after the metric was
    made, then pack 16 bytes into the file through three Python calls. A
    worker's metrics are made after its fork and only its event loop's thread
    updates them, so an update here is one store of a double, 8-byte aligned,
    into the mapped file: ``view[index] += amount``. The value's own copy in
    memory (``MmapedValue._value``) is not kept up to date: the file is the
    truth, and every scrape reads the files; so each value is updated one way
    only, through its slot (the one exception, ``payonce_unprotected_forwards_total``,
    rare, only ever through prometheus-client's ``inc``). A file that grows is mapped anew
    by prometheus-client; a view keeps its older mapping, of the same pages,
    alive. ``_file``, ``_m``, ``_positions`` and ``_key`` are prometheus-client's
    (pinned by tests/observe/test_metrics_shared.py).
    """

    def __init__(self) -> None:
        self._views: dict[int, tuple[Any, memoryview[float]]] = {}  # id(mmap) -> (mmap, view)
        self.of_value: dict[Any, Slot] = {}  # MmapedValue -> its slot

    def of(self, value: Any) -> Slot:
        slot = self.of_value.get(value)
        if slot is None:
            file = value._file
            mapped = file._m
            known = self._views.get(id(mapped))
            if known is None:
                known = self._views[id(mapped)] = (mapped, memoryview(mapped).cast("d"))
            # The value's double; its timestamp, the next one, stays 0.
            slot = self.of_value[value] = (known[1], file._positions[value._key] // 8)
        return slot


class Deferred:
    """Counts kept as plain numbers on the request path, applied to Prometheus at scrape time.

    A prometheus-client update takes a lock and several calls (about a
    microsecond each); the gateway makes a dozen per request. Summing into a
    dict and applying the sums when someone scrapes costs a tenth of that
    (benchmarks/NOTEBOOK.md, observability).
    """

    def __init__(self) -> None:
        self.counts: dict[Any, float] = {}
        self.histograms: list[Buckets] = []

    def add(self, child: Any, amount: float = 1.0) -> None:
        counts = self.counts
        counts[child] = counts.get(child, 0.0) + amount

    def apply(self) -> None:
        counts, self.counts = self.counts, {}
        for child, amount in counts.items():
            if amount:
                child.inc(amount)
        for histogram in self.histograms:
            histogram.apply()


class Buckets:
    """A histogram's bucket counts and sum, kept as plain numbers until :meth:`apply`."""

    def __init__(self, histogram: Histogram, bounds: tuple[float, ...]) -> None:
        self.histogram = histogram
        # Floats: bisect compares each one with a float, and float < int is the slow path.
        self.bounds = tuple(float(bound) for bound in bounds)
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        # With workers: where each bucket and the sum live in the worker's file.
        self.slots: list[Slot] = []
        self.sum_slot: Slot = (memoryview(b"").cast("d"), 0)

    def share(self, places: Slots) -> None:
        self.slots = [places.of(bucket) for bucket in self.histogram._buckets]
        self.sum_slot = places.of(self.histogram._sum)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def apply(self) -> None:
        counts, self.counts = self.counts, [0] * len(self.counts)
        total, self.total = self.total, 0.0
        if not any(counts):
            return
        # prometheus-client has no bulk observe: add to its bucket values directly
        # (Histogram._buckets and ._sum, stable since 0.4; pinned by the tests).
        for index, count in enumerate(counts):
            if count:
                self.histogram._buckets[index].inc(count)
        self.histogram._sum.inc(total)

    def publish(self) -> None:
        """With workers: add the counts kept in memory to their slots in the file."""
        counts = self.counts
        if any(counts):
            slots = self.slots
            for index, count in enumerate(counts):
                if count:
                    view, at = slots[index]
                    view[at] += count
                    counts[index] = 0
            view, at = self.sum_slot
            view[at] += self.total
            self.total = 0.0

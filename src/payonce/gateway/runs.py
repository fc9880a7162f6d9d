"""The runs this gateway executes: the one owner of single-flight.

A run is a keyed request this process claimed and is forwarding upstream. While
it runs, every duplicate that reaches this process joins it instead of claiming
the key; the status endpoint, resumes, lease renewals and the in-flight metric
read it. Every change goes through :class:`RunTable`: a run enters once, when
its claim is won, and leaves once, when its last event was relayed or it ended
otherwise; a run that is no longer the key's (a later one took its place) can
never remove its successor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["RunTable"]


class _Run(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def key(self) -> str: ...


R = TypeVar("R", bound=_Run)


class RunTable(Generic[R]):
    """The runs in progress here, one per (tenant, key)."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], R] = {}

    def get(self, tenant: str, key: str) -> R | None:
        """The run of ``key`` in progress here, if any."""
        return self._runs.get((tenant, key))

    def start(self, run: R) -> None:
        """``run`` won its key's claim: duplicates here join it from now on."""
        name = (run.tenant, run.key)
        if name in self._runs:
            # Two runs of one key in one process would both bill: the claim that
            # let the second start is a store that broke its contract.
            raise RuntimeError(f"key {run.key!r} already runs here")
        self._runs[name] = run

    def finish(self, run: R) -> None:
        """``run`` is over here (answered, failed or abandoned); idempotent."""
        name = (run.tenant, run.key)
        if self._runs.get(name) is run:
            del self._runs[name]

    def holds(self, run: R) -> bool:
        """Whether ``run`` is still the run of its key here."""
        return self._runs.get((run.tenant, run.key)) is run

    def __contains__(self, name: object) -> bool:
        return name in self._runs

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._runs.values()))

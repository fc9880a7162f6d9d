"""The store protocol: where idempotency records live, behind one narrow atomic interface.

In brief, with the gateway's side: docs/design.md, "The store protocol".

A record's life::

    claim ──► IN_PROGRESS ──complete(token, ttl)──► COMPLETED ──(ttl)──► purged
                 │   ▲                                  │
                 │   └─renew(token) every lease/3       └─ claim → Claim(COMPLETED): replay,
                 │                                         counted later with add_replays
                 └──release(token)──► (gone: the next claim runs again)

    lease expiry (the holder died):
    t0 claim(token=A, lease 30 s) ... holder silent ... t0+30 s: lease over
    t0+31 claim ──► token=B takes over; complete(token=A) is refused (fencing)

Expiry (docs/gateway.md, "Expiry"): a record's ``expires_at`` is never inside a
live lease. A claim sets it to the later of ``ttl`` from the claim and a lease
past the lease's end (:func:`held_expiry`); every renewal pushes it to at least
a lease past the new lease's end; completion resets it to ``ttl`` from the
completion. So a call that runs longer than ``ttl`` keeps its record as long as
its holder renews, and its answer is replayed for ``ttl`` after it was stored.
A record whose lease is live is never expired, whatever its ``expires_at`` says
(:meth:`Record.expired`: a record an earlier version wrote), so neither a claim
nor a purge can take a running call's key.

Tokens are random and unique per claim. The store is the only party that checks
them (compare-and-set on every write), so uniqueness is what fencing needs here;
they need not be ordered.
"""

from __future__ import annotations

import enum
import math
import os
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Appended",
    "Claim",
    "ClaimStatus",
    "Record",
    "RecordState",
    "Store",
    "StoredResponse",
    "held_expiry",
    "new_token",
]

_tokens = random.Random()  # seeded from os.urandom once; see new_token
# Forked workers must not share a token sequence: two takeovers of one key
# with equal tokens would defeat fencing.
os.register_at_fork(after_in_child=_tokens.seed)


def new_token() -> str:
    """A fresh fencing token: 64 random bits as hex.

    Tokens only need to be unique among the claims of one key, and nobody gains
    by guessing one (the store checks them, clients never see them), so a
    ``random.Random`` seeded from the OS (again in every forked child) is
    enough and spares a syscall per claim.
    """
    return f"{_tokens.getrandbits(64):016x}"


def held_expiry(lease_end: float, lease: float, expires_at: float = -math.inf) -> float:
    """The expiry of a record whose lease ends at ``lease_end``: never inside the lease.

    At least one ``lease`` past the lease's end, and never earlier than
    ``expires_at`` (the ttl-based expiry a claim computes, or the record's
    current one for a renewal). The extra lease is slack for a holder that
    finishes just as its lease lapses (its ``complete`` still finds the record
    held while nobody took it over) and for clocks of replicas that differ.
    """
    return max(expires_at, lease_end + lease)


class RecordState(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class Appended(enum.IntEnum):
    """What :meth:`Store.append_events` did; false only when nothing was written.

    ``WATCHED`` tells the writer that a follower in another process (another
    worker, another replica) reads this run's events from the store, so they
    should be written often (every 50 ms) rather than now and then: a stream
    nobody else follows is written in larger batches (gateway/recording.py).
    A store learns it from the follower's own mark (PostgreSQL, in the append's
    own statement) or from its notification's receivers (Redis). SQLite never
    says it here (it would take a read of its own after every write): its
    writers learn it from :meth:`Store.watched_runs`, which the gateway asks
    every 250 ms for all its quiet streams. Once a run is watched it stays so.
    """

    LOST = 0  # the key is no longer held by this token: nothing written
    WRITTEN = 1
    WATCHED = 2  # written, and a follower in another process waits for more


class ClaimStatus(enum.Enum):
    ACQUIRED = "acquired"  # the caller holds the lease and must run the request
    COMPLETED = "completed"  # a stored response to replay
    IN_PROGRESS = "in_progress"  # someone else holds a live lease: wait for it
    MISMATCH = "mismatch"  # the key exists with another fingerprint: 422


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """An upstream response as it will be replayed. Never holds request headers.

    A streamed response (``stream``) has no body: its server-sent events are
    recorded one by one (:meth:`Store.append_events`) and read back with
    :meth:`Store.read_events`.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """One idempotency record, scoped by tenant (a credential hash) and key."""

    tenant: str
    key: str
    fingerprint: str
    state: RecordState
    token: str
    created_at: float
    lease_expires_at: float
    expires_at: float
    completed_at: float | None = None
    response: StoredResponse | None = None
    replays: int = 0
    usage: Mapping[str, int] | None = None
    cost_usd: float | None = None
    events: int = 0  # events recorded so far, for a streamed response

    @property
    def streaming(self) -> bool:
        """A stream has begun (its status and headers are known), finished or not."""
        return self.response is not None and self.response.stream

    def lease_lapsed(self, now: float) -> bool:
        """In progress, but its holder stopped renewing: nobody runs it any more.

        The holder died or froze for longer than a lease. The next claim with
        the same fingerprint takes the key over and runs the request again, so
        re-sending it is safe; the status endpoint reports it as ``abandoned``.
        """
        return self.state is RecordState.IN_PROGRESS and self.lease_expires_at <= now

    def expired(self, now: float) -> bool:
        """Past its expiry and not running: absent for reads and claims, purged.

        A record whose lease is live is never expired, whatever its
        ``expires_at``: its holder is running the call (the stores keep
        ``expires_at`` past a live lease themselves; this covers records an
        earlier version wrote, whose renewals did not push it).
        """
        if self.expires_at > now:
            return False
        return not (self.state is RecordState.IN_PROGRESS and self.lease_expires_at > now)


@dataclass(frozen=True, slots=True)
class Claim:
    """What :meth:`Store.claim` found or made."""

    status: ClaimStatus
    record: Record


class Store(Protocol):
    """Atomic operations on records. Every method is one atomic step in the backend.

    Writes that take a ``token`` succeed only while that token is the record's
    current one and the record is in progress; they return ``False`` otherwise.
    Failures of the backend raise :class:`payonce.errors.StorageError`
    (:class:`~payonce.errors.StorageTimeout` when it did not answer in time), never a
    problem: the gateway answers callers at its edge. (A stored value that cannot be
    decrypted is :class:`~payonce.errors.RecordUnreadable`, which is one.)
    """

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        """Take the key, or report what holds it.

        ACQUIRED when the key is new, its record expired (:meth:`Record.expired`),
        or its lease ran out and the fingerprint matches (take-over with a new
        token). The new record's expiry is :func:`held_expiry` of its lease and
        of ``ttl`` from now.
        COMPLETED when a response is stored under the same fingerprint (the
        caller counts the replay with :meth:`add_replays`, in batches: a write
        per replay would double its cost). MISMATCH when the fingerprint
        differs. IN_PROGRESS otherwise.
        """
        ...

    async def begin_stream(
        self, tenant: str, key: str, token: str, status: int, headers: tuple[tuple[str, str], ...]
    ) -> bool:
        """Record the status and headers of a streamed response that is starting.

        Clears events a previous holder of the key may have left.
        """
        ...

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        """Record events numbered ``first``, ``first + 1``, ... (numbers start at 1).

        ``Appended.LOST`` (false) when the key is no longer held by ``token``;
        ``WATCHED`` when a follower in another process is known to read them
        (a store may leave that to :meth:`watched_runs`: see :class:`Appended`).
        """
        ...

    async def watched_runs(self, runs: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these running streams, by ``(tenant, key)``, a follower elsewhere reads.

        What :meth:`append_events` would answer ``WATCHED`` for, asked for many
        streams in one go and without a write: a writer of streams nobody else
        follows asks now and then, so that a follower who comes does not wait
        for the next quiet write. Unknown keys and finished runs are left out.
        """
        ...

    async def read_events(self, tenant: str, key: str, after: int = 0) -> list[bytes]:
        """The recorded events numbered above ``after``, in order."""
        ...

    async def add_replays(self, counts: Mapping[tuple[str, str], int], *, batch: str = "") -> None:
        """Add replay counts to completed records, by ``(tenant, key)``; skip gone ones.

        ``batch`` names these counts: a caller whose call failed sends the same
        counts again under the same name, and a store whose failed write may still
        have been applied (Redis: a timeout after the command was sent) adds each
        named batch once. ``""``: no name, added every time.
        """
        ...

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        """Extend the lease of the current holder to ``lease`` from now.

        The record's expiry is pushed to at least :func:`held_expiry` of the new
        lease (never pulled back), so a call renewed past its ``ttl`` keeps its
        record: no claim takes it over and no purge deletes it while it runs.
        """
        ...

    async def complete(
        self,
        tenant: str,
        key: str,
        token: str,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None = None,
        cost_usd: float | None = None,
        replays: int = 0,
        ttl: float,
    ) -> bool:
        """Store the response; ``replays`` counts duplicates already answered with it.

        The record's expiry is reset to ``ttl`` from now: an answer is replayed
        for ``ttl`` after it was stored, however long its call ran (and
        whatever its claim's expiry was).
        """
        ...

    async def release(self, tenant: str, key: str, token: str) -> bool:
        """Give the key up without a result, so the next claim runs the request again."""
        ...

    async def get(self, tenant: str, key: str) -> Record | None:
        """The live record, or ``None`` (absent or :meth:`Record.expired`)."""
        ...

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        """The record once it changes, or as it is after ``timeout`` seconds.

        A record nobody runs (gone, completed, or its lease lapsed) cannot
        change by itself, so it is returned at once. Otherwise the wait ends
        when the record completes, is released, records new events, is taken
        over by a new holder, or when its lease lapses (at ``lease_expires_at``
        by the store's clock: a lapse is a change, since nobody runs the key
        from then on). A renewal is not a change: the wait goes on to the new
        lease end. It never ends early with nothing new, except that a store
        may notice a change up to its poll interval late.
        """
        ...

    async def purge_expired(self, limit: int | None = None) -> int:
        """Delete expired records (:meth:`Record.expired`), at most ``limit``; return how many.

        A running call's record (in progress, its lease live) is never deleted,
        whatever its ``expires_at``. A return of ``limit`` means more may be
        left for another round.
        """
        ...

    async def ping(self) -> None:
        """Raise :class:`payonce.errors.StorageError` when the backend cannot answer."""
        ...

    async def close(self) -> None: ...

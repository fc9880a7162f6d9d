"""Per-tenant limits: keyed calls in flight, and the rate of new keys (docs/gateway.md).

A tenant is the hash of the caller's credential (:mod:`payonce.gateway.keys`),
the anonymous tenant included. Both limits live in this process's memory and
cost nothing when they are not configured (the gateway holds ``None``).

**In flight** (``--max-inflight-per-tenant``). A keyed request holds a slot from
the moment its headers are read (before its body: a tenant's bodies in memory
are bounded too) until it is answered. The request that starts an upstream run
hands its slot to the run, which keeps it until the run ends, since a run goes
on for the retry after its client leaves: a flood of requests whose clients
disconnect at once still holds one slot per run. So a tenant has at most N
keyed requests and runs here, replays and waiting duplicates included.

**New keys** (``--max-new-keys-per-tenant COUNT/PERIOD``). A token bucket per
tenant, COUNT deep, refilled at COUNT per PERIOD: every claim that starts a run
(a new key, or the take-over of an expired or abandoned one) takes a token. A
request with an empty bucket is refused 429 unless its key already has a
record (a replay, or a duplicate of a run in progress, which create nothing).
Since records live for ``--ttl``, a tenant holds at most
``COUNT * (1 + ttl / PERIOD)`` records. Requests that pass the check at the same
time may overdraw the bucket (by at most the calls in flight at once); the
debt is paid back before the tenant's next new key.

**Workers.** With ``--workers W`` each worker enforces its share: ``ceil(N / W)``
in flight and ``COUNT / W`` per PERIOD (bucket depth ``ceil(COUNT / W)``). The
host never admits more than ``W * ceil(N / W)`` and ``COUNT`` per PERIOD; a
tenant whose connections crowd onto one worker is refused sooner, from that
worker's share. Exact host-wide counts would need a store write per request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from payonce.config import GatewaySettings, parse_rate
from payonce.errors import StorageError, TooManyInFlight, TooManyNewKeys
from payonce.gateway.execution import Execution
from payonce.store import Store

__all__ = ["InFlight", "NewKeys", "Slot", "in_a_slot", "limits_of", "refuse_new_key"]

# Buckets remembered at most; past it the idlest are forgotten (and start full
# again): tenants are as many as the credentials callers send, valid or not.
MAX_BUCKETS = 100_000


class Slot:
    """One keyed call's place in its tenant's in-flight count."""

    __slots__ = ("_limits", "_tenant", "held")

    def __init__(self, limits: InFlight, tenant: str) -> None:
        self._limits = limits
        self._tenant = tenant
        self.held = True

    def release(self) -> None:
        """The request is answered: leave the count (unless a run took the slot over)."""
        if self.held:
            self.held = False
            self._limits.leave(self._tenant)

    def hand_over(self, task: asyncio.Task[object]) -> None:
        """The run ``task`` holds the slot from now on, until it ends."""
        if self.held:
            self.held = False
            task.add_done_callback(self._run_ended)

    def _run_ended(self, _task: object) -> None:
        self._limits.leave(self._tenant)


class InFlight:
    """Keyed calls in flight, per tenant, at most ``limit`` each."""

    __slots__ = ("counts", "limit", "workers")

    def __init__(self, limit: int, workers: int = 1) -> None:
        self.limit = math.ceil(limit / workers)
        self.workers = workers
        self.counts: dict[str, int] = {}  # only tenants with something in flight

    def enter(self, tenant: str) -> Slot:
        """A slot for one more keyed call of ``tenant``, or :class:`TooManyInFlight`."""
        count = self.counts.get(tenant, 0)
        if count >= self.limit:
            share = f" (this worker's share of {self.workers})" if self.workers > 1 else ""
            raise TooManyInFlight(
                f"this credential already has {count} keyed requests in flight{share};"
                f" the gateway admits {self.limit} (--max-inflight-per-tenant)",
                retry_after=1,
            )
        self.counts[tenant] = count + 1
        return Slot(self, tenant)

    def leave(self, tenant: str) -> None:
        count = self.counts[tenant] - 1
        if count:
            self.counts[tenant] = count
        else:
            del self.counts[tenant]


class NewKeys:
    """A token bucket of new keys per tenant (``count`` per ``period`` seconds)."""

    __slots__ = ("_buckets", "_now", "capacity", "rate", "share")

    def __init__(
        self,
        count: int,
        period: float,
        workers: int = 1,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = float(math.ceil(count / workers))
        self.rate = count / workers / period  # tokens a second
        share = f"{count / workers:g} (this worker's share) " if workers > 1 else f"{count} "
        self.share = f"{share}per {period:g}s"
        self._now = now
        # tenant -> (tokens, when); least recently spent first. A bucket that has
        # refilled is the same as none, so only recently active tenants are kept.
        self._buckets: dict[str, tuple[float, float]] = {}

    def _tokens(self, tenant: str, now: float) -> float:
        entry = self._buckets.get(tenant)
        if entry is None:
            return self.capacity
        tokens, at = entry
        return min(self.capacity, tokens + (now - at) * self.rate)

    def allows(self, tenant: str) -> bool:
        """Whether ``tenant`` may start a new key now (the fast path: no clock read)."""
        entry = self._buckets.get(tenant)
        if entry is None or entry[0] >= 1.0:
            return True
        tokens, at = entry
        return tokens + (self._now() - at) * self.rate >= 1.0

    def check(self, tenant: str) -> TooManyNewKeys | None:
        """None when ``tenant`` may start a new key now, else the refusal to raise."""
        if self.allows(tenant):
            return None
        tokens = self._tokens(tenant, self._now())
        return TooManyNewKeys(
            f"this credential started the new Idempotency-Keys it may ({self.share}:"
            " --max-new-keys-per-tenant); retry later with the same key",
            retry_after=(1.0 - tokens) / self.rate,
        )

    def spend(self, tenant: str) -> None:
        """A claim of ``tenant`` started a run: take a token (the balance may go negative)."""
        now = self._now()
        tokens = self._tokens(tenant, now) - 1.0
        buckets = self._buckets
        buckets.pop(tenant, None)  # re-inserted last: the dict stays in order of use
        buckets[tenant] = (tokens, now)
        if len(buckets) > MAX_BUCKETS:
            self._forget(now)

    def _forget(self, now: float) -> None:
        rate, capacity = self.rate, self.capacity
        full = [
            tenant
            for tenant, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * rate >= capacity
        ]
        for tenant in full:
            del self._buckets[tenant]
        # Down to nine tenths, so that the scan above runs at most once in
        # MAX_BUCKETS / 10 new keys, however many tenants are active.
        while len(self._buckets) > MAX_BUCKETS * 9 // 10:
            del self._buckets[next(iter(self._buckets))]


def limits_of(settings: GatewaySettings) -> tuple[InFlight | None, NewKeys | None]:
    """The limits ``settings`` ask for, each this worker's share (None: not configured)."""
    workers = settings.workers
    in_flight = None
    if settings.max_inflight_per_tenant is not None:
        in_flight = InFlight(settings.max_inflight_per_tenant, workers)
    new_keys = None
    if settings.max_new_keys_per_tenant is not None:
        count, period = parse_rate(settings.max_new_keys_per_tenant, "--max-new-keys-per-tenant")
        new_keys = NewKeys(count, period, workers)
    return in_flight, new_keys


async def in_a_slot(
    in_flight: InFlight, tenant: str, answer: Callable[[], Awaitable[Execution | None]]
) -> Execution | None:
    """``answer()`` the request in a slot of ``tenant``, or :class:`TooManyInFlight`.

    The run the request started, if it outlives the request, keeps the slot.
    """
    slot = in_flight.enter(tenant)
    try:
        run = await answer()
        if run is not None and run.task is not None and not run.task.done():
            slot.hand_over(run.task)
        return run
    finally:
        slot.release()


async def refuse_new_key(new_keys: NewKeys, store: Store, tenant: str, key: str) -> None:
    """``tenant`` spent its new keys: 429, unless ``key`` has a record already.

    Only then is the store asked: a replay or a duplicate of a run in progress
    creates nothing, and goes on to the claim.
    """
    refusal = new_keys.check(tenant)
    if refusal is None:
        return
    try:
        existing = await store.get(tenant, key)
    except StorageError:
        return  # the claim meets the outage too, and answers it as configured
    if existing is None:
        raise refusal

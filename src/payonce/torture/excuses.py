"""What excuses a second bill, or allows one: the faults a run played, and records' lives.

A double bill is a violation unless a fault docs/guarantees.md names explains it
(:func:`explains`, or faults back to back: :func:`held_together`), or the key's
record expired after ``--ttl`` and a later call began its next life (:func:`record_lives`).
"""

from __future__ import annotations

import datetime
from typing import Any

from payonce.torture.driver import Observation
from payonce.torture.nemesis import Played

__all__ = [
    "arrival",
    "expired",
    "explains",
    "faults_during",
    "held_together",
    "record_lives",
    "stamp",
]


def explains(played: Played, served: set[int], lease: float, store: str) -> bool:
    """Whether docs/guarantees.md lets this fault bill a key twice.

    A gateway that served the key killed (its run's lease lapses while the
    upstream still finishes and bills it), or stopped for two thirds of a lease
    or more (a renewal can then come too late), or, on SQLite, its disk full as
    long (its renewals cannot be written); a store held still longer than a
    lease (a stream's unstored events are kept that long, then the key is
    released). Shorter stalls and stops, a full disk under any other store (the
    call log only), and graceful SIGTERM, excuse nothing.
    """
    fault = played.fault
    if fault.kind == "kill":
        return fault.target in served
    if fault.kind == "stop" or (fault.kind == "disk" and store == "sqlite"):
        return fault.target in served and fault.seconds >= lease * 2 / 3
    if fault.kind == "stall":
        return fault.seconds > lease
    return False


def stamp(text: object) -> float:
    if not isinstance(text, str):
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# After a stop or a stall, a gateway works through what queued meanwhile: a request
# that waited may be claimed this long after the fault ended.
_CATCH_UP = 0.5


def arrival(observation: Observation, played: list[Played]) -> float:
    """The latest moment (wall clock) the gateway may have seen ``observation``'s
    request: when it was sent, or, if its gateway was stopped or the store held
    still then, when that fault ended and the gateway caught up (the request
    waited in a socket or a queue). Faults back to back chain: a request still
    waiting when the first ended may be held by the next, which began after it
    was sent (found by a PostgreSQL run: two stops of one gateway, seed 2128899638).
    """
    waiting = observation.started  # run time: how long the request may have waited
    for fault in sorted(played, key=lambda p: p.started):
        kind, target = fault.fault.kind, fault.fault.target
        holds = kind in ("stall", "disk") or (kind == "stop" and target == observation.call.gateway)
        if holds and fault.started <= waiting <= fault.ended + _CATCH_UP:
            waiting = max(waiting, fault.ended + _CATCH_UP)
    return observation.sent_at + (waiting - observation.started)


def record_lives(
    observations: list[Observation],
    bills: list[dict[str, Any]],
    ttl: float | None,
    played: list[Played],
) -> int:
    """How many generations a key may have been billed: one per life of its record.

    A record lives ``ttl`` after its answer was stored; a call that reaches the
    gateway after that starts a new business request, as documented. An answer
    is stored after the upstream finished it, which is when the ledger billed it,
    so a call that arrived more than ``ttl`` after that bill may have found the
    record gone (an upper bound: the answer is stored a moment after the bill,
    and a call may arrive late: :func:`arrival`). A record that expires while
    its call still runs is the defect this guards against (a second bill during
    the first call): it gets no new life.
    """
    if ttl is None or not bills:
        return 1
    finished = sorted(stamp(entry.get("finished_at")) for entry in bills)
    lives = 1
    expires = finished[0] + ttl
    for arrived in sorted(arrival(o, played) for o in observations if o.sent_at):
        if arrived > expires:
            lives += 1
            later = [moment for moment in finished if moment > arrived]
            if not later:
                break
            expires = later[0] + ttl
    return lives


def expired(sent: float, bills: list[dict[str, Any]], ttl: float) -> bool:
    """Whether every answer of the key billed before ``sent`` had expired by then."""
    finished = [stamp(entry.get("finished_at")) for entry in bills]
    return all(moment < sent - ttl for moment in finished if moment < sent)


def held_together(played: list[Played], served: set[int], lease: float, store: str) -> list[Played]:
    """Faults that, back to back, kept a gateway that served the key from renewing its
    lease for two thirds of a lease or longer, though none did alone (the nemesis
    plays faults one after another: a full disk, then a stop of the same gateway).

    Each gateway's stops (and full disks, on SQLite) and every store stall are
    joined when less than a renewal period (a third of a lease) lies between them.
    """
    for gateway in sorted(served):
        held = sorted(
            (p for p in played if _holds_renewals(p, gateway, store)), key=lambda p: p.started
        )
        run: list[Played] = []
        for fault in held:
            if run and fault.started - max(p.ended for p in run) > lease / 3:
                run = []
            run.append(fault)
            if len(run) > 1 and max(p.ended for p in run) - run[0].started >= lease * 2 / 3:
                return list(run)
    return []


def _holds_renewals(played: Played, gateway: int, store: str) -> bool:
    """Whether ``played`` kept ``gateway`` from renewing its leases while it lasted."""
    kind, target = played.fault.kind, played.fault.target
    if kind == "stall":
        return True
    if kind == "stop" or (kind == "disk" and store == "sqlite"):
        return target == gateway
    return False


def faults_during(played: list[Played], start: float, end: float, slack: float) -> list[Played]:
    return [p for p in played if p.started <= end + slack and p.ended + slack >= start]

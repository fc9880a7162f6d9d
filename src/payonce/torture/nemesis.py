"""The nemesis: each fault of the plan played on the real processes at its time.

Every fault is undone before the run's checks (a stopped gateway continued, a
killed one started again on its port, the store released), and its real start
and end are recorded, so a check can say which fault a double bill is owed to.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from payonce.torture.cluster import Cluster
from payonce.torture.plan import Fault, Plan

__all__ = ["Played", "play_faults"]

log = logging.getLogger("payonce.torture")


@dataclass
class Played:
    """A fault as it happened: seconds after the run started."""

    fault: Fault
    started: float
    ended: float


def _play(cluster: Cluster, fault: Fault) -> None:
    if fault.kind == "disk":
        cluster.fill_disk(fault.target)
        time.sleep(fault.seconds)
        cluster.free_disk(fault.target)
        return
    if fault.kind == "stall":
        holder: subprocess.Popen[bytes] | None = cluster.hold_store(fault.seconds, fault.target)
        if holder is not None:
            holder.wait()
        else:
            time.sleep(fault.seconds)
            cluster.release_store()
        return
    gateway = cluster.gateways[fault.target]
    if fault.kind == "stop":
        gateway.signal(signal.SIGSTOP)
        time.sleep(fault.seconds)
        gateway.signal(signal.SIGCONT)
        return
    gateway.signal(signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM)
    gateway.wait()
    time.sleep(fault.seconds)
    gateway.start()


def play_faults(
    plan: Plan, cluster: Cluster, started: float, stop: threading.Event
) -> list[Played]:
    """Play ``plan``'s faults in order (one at a time); return when they happened."""
    played: list[Played] = []
    for fault in plan.faults:
        delay = started + fault.at - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        begin = time.monotonic() - started
        try:
            _play(cluster, fault)
        except RuntimeError as exc:  # a gateway that would not start again
            log.error("fault %d (%s) could not be undone: %s", fault.number, fault.kind, exc)
            raise
        played.append(Played(fault, begin, time.monotonic() - started))
    return played

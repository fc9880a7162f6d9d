"""Failures the simulated provider injects, and which of them it bills.

Two kinds, mirroring what a real provider does to a retrying client:

* **Refusals before work** (:class:`FaultPlan`, ``--fail 500:0.05,429:0.02``): an error
  status answered before any generation starts. Nothing is billed. 429, 503 and 529
  carry ``Retry-After`` as providers do, so clients can test that they honour it.
* **Drops after compute** (``--drop-after-compute RATE``): the generation finishes and
  is billed, then the connection closes without a response (a stream: without its
  terminating event, ``[DONE]`` or ``message_stop``). The client sees a disconnect
  and cannot tell whether it was billed; this is the case an idempotency key exists
  for (docs/sim.md, billing ledger).

And one for streams only:

* **Deaths mid-stream** (``--die-mid-stream RATE``, or ``X-Sim-Die-After: N`` for one
  request): the provider crashes part-way through a stream. The connection closes
  after some events (a uniformly random number from 1 to all but the terminating
  one; exactly N with the header) and, since nothing finished, nothing is billed.
  The client sees the same cut-short stream as after a drop, billed or not: only the
  provider's bill tells them apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["RETRY_AFTER_SECONDS", "RETRY_AFTER_STATUSES", "FaultPlan", "validate_status"]

# Statuses that tell the client to come back later; real providers send Retry-After
# with them (OpenAI on 429/503, Anthropic on 429/529).
RETRY_AFTER_STATUSES = frozenset({429, 503, 529})
# Short so that tests and demos that honour it do not crawl.
RETRY_AFTER_SECONDS = 1


def validate_status(status: int) -> int:
    """Return ``status`` if it is an error status a provider could answer (400-599)."""
    if not 400 <= status <= 599:
        raise ValueError(f"status must be between 400 and 599, got {status}")
    return status


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Random refusals: each ``(status, rate)`` fails that fraction of requests.

    One uniform draw per request decides: the rates are laid end to end on [0, 1),
    so ``((500, 0.05), (429, 0.02))`` answers 500 when the draw is below 0.05, 429
    when it is in [0.05, 0.07), and lets the request through otherwise. The rates
    must therefore add up to at most 1. An empty plan never draws, so it does not
    move the seeded random sequence.
    """

    failures: tuple[tuple[int, float], ...] = ()
    _thresholds: tuple[tuple[float, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: set[int] = set()
        thresholds: list[tuple[float, int]] = []
        upto = 0.0
        for status, rate in self.failures:
            validate_status(status)
            if status in seen:
                raise ValueError(f"status {status} is listed twice")
            seen.add(status)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"rate for {status} must be between 0 and 1, got {rate:g}")
            upto += rate
            thresholds.append((upto, status))
        # Allow float noise such as 0.7 + 0.2 + 0.1 = 1.0000000000000002.
        if upto > 1.0 + 1e-9:
            raise ValueError(f"rates add up to {upto:g}, more than 1")
        object.__setattr__(self, "_thresholds", tuple(thresholds))

    def draw(self, rng: random.Random) -> int | None:
        """The status to fail this request with, or ``None`` to let it through."""
        if not self._thresholds:
            return None
        point = rng.random()
        for upto, status in self._thresholds:
            if point < upto:
                return status
        return None

    def describe(self) -> str:
        """The plan in ``--fail`` syntax (``none`` when empty)."""
        if not self.failures:
            return "none"
        return ",".join(f"{status}:{rate:g}" for status, rate in self.failures)

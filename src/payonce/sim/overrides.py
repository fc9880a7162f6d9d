"""Per-request control headers, so one test can force one outcome.

=================  =====================================================================
header             effect on this request
=================  =====================================================================
``X-Sim-Delay-Ms`` generation time in milliseconds, instead of a ``--latency`` sample
``X-Sim-Fail``     answer this status (400-599) before any work; not billed
``X-Sim-Drop``     ``1``/``true``: bill, then close the connection without a response;
                   ``0``/``false``: never drop, whatever ``--drop-after-compute`` says
=================  =====================================================================

A bad header value is answered 400 (not billed), so a typo in a test fails loudly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from payonce.sim.faults import validate_status
from payonce.sim.provider_errors import BadRequest

__all__ = ["DELAY_HEADER", "DROP_HEADER", "FAIL_HEADER", "NO_OVERRIDES", "Overrides"]

DELAY_HEADER = "X-Sim-Delay-Ms"
FAIL_HEADER = "X-Sim-Fail"
DROP_HEADER = "X-Sim-Drop"

# One hour: longer is certainly a mistake, and would pin a handler for ever.
_MAX_DELAY_MS = 3_600_000.0
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


@dataclass(frozen=True, slots=True)
class Overrides:
    """What the control headers of one request ask for; ``None`` means "not asked"."""

    delay: float | None = None  # seconds
    fail_status: int | None = None
    drop: bool | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Overrides:
        """Read the ``X-Sim-*`` headers (``headers`` must be case-insensitive)."""
        delay_text = headers.get(DELAY_HEADER)
        fail_text = headers.get(FAIL_HEADER)
        drop_text = headers.get(DROP_HEADER)
        # The common case, on the benchmark path: no control header at all.
        if delay_text is None and fail_text is None and drop_text is None:
            return NO_OVERRIDES
        return cls(
            delay=None if delay_text is None else _delay(delay_text),
            fail_status=None if fail_text is None else _status(fail_text),
            drop=None if drop_text is None else _flag(drop_text),
        )


NO_OVERRIDES = Overrides()


def _delay(text: str) -> float:
    try:
        millis = float(text)
    except ValueError:
        millis = math.nan
    if not 0 <= millis <= _MAX_DELAY_MS:  # also refuses nan
        raise BadRequest(
            f"{DELAY_HEADER}: expected milliseconds 0-{_MAX_DELAY_MS:.0f}, got {text!r}"
        )
    return millis / 1000


def _status(text: str) -> int:
    try:
        return validate_status(int(text))
    except ValueError:
        raise BadRequest(f"{FAIL_HEADER}: expected a status 400-599, got {text!r}") from None


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"{DROP_HEADER}: expected 1 or 0, got {text!r}")

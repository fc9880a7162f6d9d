"""How long a server asked a client to wait: ``retry-after-ms`` or ``Retry-After``.

Shared by the client (its retries to the gateway) and reconcile's ``--fetch`` (its
retries to the providers' admin APIs), which read headers from different libraries:
anything with ``get(name)`` will do.
"""

from __future__ import annotations

import email.utils
import math
from typing import Protocol

__all__ = ["retry_after_seconds"]


class Headers(Protocol):
    """Case-insensitive header lookup (httpx's ``Headers``, ``email.message.Message``)."""

    def get(self, name: str, /) -> str | None: ...


def retry_after_seconds(headers: Headers, now: float) -> float | None:
    """How long the server asked us to wait, or ``None``.

    ``retry-after-ms`` (milliseconds, sent by OpenAI and Anthropic) wins over
    ``Retry-After``, which is delta-seconds or an HTTP date (RFC 9110, 10.2.3);
    ``now`` is the wall-clock time the date is compared with. Unparseable or
    negative values are ignored, as urllib3 does.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if 0 <= value < math.inf:
            return value
    text = headers.get("retry-after")
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - now)
    return value if 0 <= value < math.inf else None

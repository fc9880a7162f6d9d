"""SDK retries matched without a key: the attempt counter the Stainless SDKs send.

The openai and anthropic SDKs, and every SDK Stainless generates for Python and
Node, send ``x-stainless-retry-count`` on every attempt of a call: ``0`` on the
first, ``1``, ``2``… on its retries, which send the same body. A retry thus
declares itself a copy of an earlier attempt, and the gateway can answer it from
that attempt's run without any key (docs/gateway.md, "SDK retries without a key"):

* a first attempt (``0``) takes the record of its body (tenant, method, path,
  canonical body: the fingerprint) when nothing holds it, and runs as a keyed
  call (kept running if its client leaves, its answer stored); when another call
  with that body is running or answered within the window, it runs on its own,
  unrecorded: two first attempts are two business requests, never merged;
* a retry (``1`` or more) joins the running call with its body, replays its
  answer when it completed within the window, or runs and records it.

The window is how long an answer waits for retries: the read timeout the SDK
declares (``x-stainless-read-timeout``, 600 s by default in openai-python), at
least :data:`MIN_WINDOW` (the SDKs wait at most 8 s between attempts, or a
``Retry-After`` of up to 60 s), at most ``--sdk-retry-window`` and ``--ttl``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from payonce.config import GatewaySettings
from payonce.gateway.request import header

__all__ = [
    "KEY_PREFIX",
    "MIN_WINDOW",
    "STREAM_GRACE",
    "SdkAttempt",
    "implicit_key",
    "is_implicit",
    "sdk_attempt",
]

READ_TIMEOUT = b"x-stainless-read-timeout"
# Records of SDK attempts live beside keyed ones, under their fingerprint. A
# client that sent such a key itself would meet only its own tenant's records of
# the same body, which a retry of its own would get anyway.
KEY_PREFIX = "sdk-attempt:"
MIN_WINDOW = 60.0
# How long a first attempt's stream goes on once its client left, for a retry to
# join it: the SDKs wait at most 8 s between attempts. Then, with nobody reading,
# it is cancelled upstream (a provider may stop billing), and a later retry runs.
STREAM_GRACE = 10.0
# More retries than any SDK makes: a larger count is not an SDK's.
_MAX_COUNT = 100


@dataclass(frozen=True, slots=True)
class SdkAttempt:
    """One attempt of an SDK call: its number and how long its answer waits for retries.

    ``identical``: not declared by an SDK but any request without a key under
    ``--dedupe-identical``, which treats every identical request as a retry.
    """

    number: int
    window: float
    identical: bool = False

    @property
    def first(self) -> bool:
        return self.number == 0 and not self.identical

    @property
    def match(self) -> str:
        """What the call log's ``sdk_match`` says of it before its outcome is known."""
        return "identical" if self.identical else "first" if self.first else "retry"


def sdk_attempt(
    settings: GatewaySettings, retry_count: int | None, headers: list[tuple[bytes, bytes]]
) -> SdkAttempt | None:
    """The attempt a request without a key makes, or ``None``: not one to match.

    ``retry_count`` is the ``x-stainless-retry-count`` the call record already
    read (``CallRecord.client_retry``). A window is never longer than ``--ttl``,
    which bounds every record.
    """
    if settings.dedupe_identical is not None:
        return SdkAttempt(1, min(settings.dedupe_identical, settings.ttl), identical=True)
    if not settings.match_sdk_retries or retry_count is None:
        return None
    if not 0 <= retry_count <= _MAX_COUNT:
        return None
    most = min(settings.sdk_retry_window, settings.ttl)
    window = min(MIN_WINDOW, most)
    declared = header(headers, READ_TIMEOUT)
    if declared is not None:
        try:
            seconds = float(declared)
        except ValueError:
            seconds = 0.0
        if math.isfinite(seconds) and seconds > window:
            window = seconds
    return SdkAttempt(retry_count, min(window, most))


def implicit_key(fingerprint: str) -> str:
    """The record key of every attempt with this fingerprint."""
    return KEY_PREFIX + fingerprint


def is_implicit(key: str) -> bool:
    """Whether ``key`` is an SDK call's record rather than a client's key."""
    return key.startswith(KEY_PREFIX)

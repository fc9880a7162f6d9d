"""The parts of the official SDKs that :func:`payonce.client.protect` uses beyond
their documented API, named in one place.

``protect()`` needs an SDK client's ``with_options()`` and ``timeout``
(documented) and two private attributes: ``_client``, the httpx2 client it
sends through, and ``_idempotency_header``, the header the SDK sends its own
per-call key in (``None``: the key is minted but not sent). payonce depends on
neither SDK, so its metadata cannot bound their releases; instead :data:`CHECKED`
names the releases the suite passed on and ``tests/client/test_sdk_internals.py``
checks :data:`PRIVATE` on real clients of the installed SDKs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHECKED", "PRIVATE", "http_client", "idempotency_header", "set_idempotency_header"]

# Releases the whole suite passed on (uv.lock's, and those before it).
CHECKED = {"openai": ("1.109.1", "2.54.0", "3.60.0"), "anthropic": ("1.17.0", "2.17.0")}
PRIVATE = ("_client", "_idempotency_header")


def http_client(sdk: Any) -> object | None:
    """The httpx2 client an SDK client sends through (``None`` if it has none)."""
    return getattr(sdk, "_client", None)


def idempotency_header(sdk: Any) -> str | None:
    """The header an SDK client sends its own per-call key in, or ``None`` (not sent)."""
    header = getattr(sdk, "_idempotency_header", None)
    return header if isinstance(header, str) else None


def set_idempotency_header(sdk: Any, header: str | None) -> None:
    """Make ``sdk`` send its own per-call key in ``header`` (``None``: not at all)."""
    sdk._idempotency_header = header

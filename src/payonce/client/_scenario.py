"""``with payonce.client.scenario("invoice-summary"):``: the business scenario of the calls inside.

Requests sent through payonce's transports inside the ``with`` carry
``X-Payonce-Scenario``; the gateway logs it and labels the metrics with it
(docs/observability.md, "Cost by endpoint and scenario"). The context variable is
the one :func:`payonce.auto.scenario` sets (one per process, whichever module
made it first), so either context manager names the scenario of both kinds of
client.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import types
from collections.abc import Iterator

__all__ = ["SCENARIO_HEADER", "current_scenario", "scenario"]

SCENARIO_HEADER = "X-Payonce-Scenario"

_state = sys.modules.get("_payonce_auto_state")
if _state is None:
    _state = types.ModuleType("_payonce_auto_state")
    _state.scenario = contextvars.ContextVar("payonce_scenario", default=None)  # type: ignore[attr-defined]
    sys.modules["_payonce_auto_state"] = _state
_SCENARIO: contextvars.ContextVar[str | None] = _state.scenario


def current_scenario() -> str | None:
    """The scenario named by the innermost :func:`scenario` around this code, or ``None``."""
    return _SCENARIO.get()


@contextlib.contextmanager
def scenario(name: str) -> Iterator[None]:
    """Name ``name`` as the business scenario of every call made inside (each thread
    and asyncio task has its own; the innermost ``with`` wins)."""
    if not name or not name.strip() or not name.isprintable():
        raise ValueError(f"scenario: {name!r} is not a header value")
    token = _SCENARIO.set(name.strip())
    try:
        yield
    finally:
        _SCENARIO.reset(token)

"""The simulated LLM provider (``payonce sim``).

An OpenAI- and Anthropic-compatible HTTP server that generates nothing, takes a
configurable time to do it, fails and drops connections on demand, and bills every
generation that finishes, whether or not its client is still connected, in a ledger
(``GET /_sim/ledger``, optionally a CSV export). It is how users try payonce without
spending money, and the real upstream process of the tests and benchmarks.

Modules, one concept each: :mod:`~payonce.sim.config` (settings and flag parsers),
:mod:`~payonce.sim.latency`, :mod:`~payonce.sim.faults`, :mod:`~payonce.sim.overrides`
(per-request headers), :mod:`~payonce.sim.prompts` (request parsing, token estimates),
:mod:`~payonce.sim.bodies` (response bodies), :mod:`~payonce.sim.streams` (the
same answers as server-sent events), :mod:`~payonce.sim.responses` (the Responses
API's object and events) and :mod:`~payonce.sim.response_store` (stored ones),
:mod:`~payonce.sim.provider_errors`, :mod:`~payonce.sim.pricing`,
:mod:`~payonce.sim.ledger`, :mod:`~payonce.sim.provider` (the request path),
:mod:`~payonce.sim.wire` (writing answers, events and faults), :mod:`~payonce.sim.app`
(routes), :mod:`~payonce.sim.server` and :mod:`~payonce.sim.cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from payonce.sim.config import SimConfig
from payonce.sim.faults import FaultPlan
from payonce.sim.latency import FixedLatency, LatencyModel, LogNormalLatency
from payonce.sim.ledger import Ledger, LedgerEntry
from payonce.sim.pricing import Price, cost_usd, price_for

if TYPE_CHECKING:
    from payonce.sim.app import build_app

__all__ = [
    "FaultPlan",
    "FixedLatency",
    "LatencyModel",
    "Ledger",
    "LedgerEntry",
    "LogNormalLatency",
    "Price",
    "SimConfig",
    "build_app",
    "cost_usd",
    "price_for",
]


def __getattr__(name: str) -> object:
    # build_app imports aiohttp (~0.3 s); load it on first use so that the CLI, which
    # imports this package for every command, starts fast.
    if name == "build_app":
        from payonce.sim.app import build_app

        return build_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

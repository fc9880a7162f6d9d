"""The counters of the per-tenant limits (docs/gateway.md, "Limits per tenant").

Kept apart from :mod:`payonce.observe.metrics` only for size: they are part of
its registry, and counted like its other counters (``Metrics.deferred``).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

__all__ = ["UNSTORED_REASONS", "limit_counters"]

# Every value of UpstreamFacts.not_stored (the call log's not_stored), each a child
# made at 0: one missing here would be a KeyError when its first answer is counted.
UNSTORED_REASONS = ("too_large", "upstream_error", "store_unavailable")


def limit_counters(registry: CollectorRegistry) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both counters in ``registry``, as their children by label value (all made at 0)."""
    rejections = Counter(
        "payonce_tenant_limit_rejections",
        "Keyed requests refused with 429 by a per-tenant limit: in_flight"
        " (--max-inflight-per-tenant) or new_keys (--max-new-keys-per-tenant).",
        ["limit"],
        registry=registry,
    )
    unstored = Counter(
        "payonce_unstored_responses",
        "Upstream answers relayed to their client but not stored, their key released so"
        " that a retry runs again (too_large: over --max-stored-body; upstream_error: a"
        " stream that reported its failure in-band; store_unavailable: a stream whose"
        " events the store could not take within 4 MiB and one --lease).",
        ["reason"],
        registry=registry,
    )
    return (
        {limit: rejections.labels(limit) for limit in ("in_flight", "new_keys")},
        {reason: unstored.labels(reason) for reason in UNSTORED_REASONS},
    )

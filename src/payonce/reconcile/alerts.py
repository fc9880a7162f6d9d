"""Thresholds for cron and CI (exit code 3), and the webhook that carries the summary."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from payonce.errors import ConfigError, PayonceError
from payonce.reconcile.report import Alert, Report
from payonce.reconcile.usage_report import UsageReport

__all__ = ["ALERT_EXIT_CODE", "Thresholds", "evaluate", "post_webhook"]

# 1 is an error, 2 bad input: 3 tells a cron job "it ran, and the bill moved".
ALERT_EXIT_CODE = 3


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Limits; ``None`` means not checked."""

    max_duplicate_ratio: float | None = None
    max_cost_per_call: float | None = None
    max_unexplained_cost: float | None = None


def evaluate(report: Report | UsageReport, thresholds: Thresholds) -> tuple[Alert, ...]:
    """The thresholds the report goes past (none when every figure is within them).

    Against usage reports, the duplicate ratio is by requests where the provider
    counts them, else by money (``duplicate_cost_ratio``: Anthropic); the
    unexplained cost is the cost report's when one was given. Against a
    per-request bill, the unexplained cost is the unmatched spend.
    """
    alerts = []
    ratio: float | None
    if isinstance(report, UsageReport):
        ratio, metric = report.totals.duplicate_ratio, "duplicate_ratio"
        if ratio is None:
            ratio, metric = report.totals.duplicate_cost_ratio, "duplicate_cost_ratio"
        cost = report.totals.cost_per_successful_call_usd
        unexplained = report.unexplained_cost_usd
        unexplained_metric = "unexplained_cost_usd"
    else:
        ratio, metric = report.totals.duplicate_ratio, "duplicate_ratio"
        cost = report.totals.cost_per_successful_call_usd
        unexplained = report.totals.unmatched_cost_usd
        unexplained_metric = "unmatched_cost_usd"
    limit = thresholds.max_duplicate_ratio
    if limit is not None and ratio is not None and ratio > limit:
        alerts.append(Alert(metric, ratio, limit, "--max-duplicate-ratio"))
    limit = thresholds.max_cost_per_call
    if limit is not None and cost is not None and cost > limit:
        alerts.append(Alert("cost_per_successful_call_usd", cost, limit, "--max-cost-per-call"))
    limit = thresholds.max_unexplained_cost
    if limit is not None and unexplained is not None and float(unexplained) > limit:
        alerts.append(
            Alert(unexplained_metric, float(unexplained), limit, "--max-unexplained-cost")
        )
    return tuple(alerts)


def check_webhook_url(url: str) -> str:
    """Refuse anything but http(s) early (exit 2), before minutes of work."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--webhook: expected an http:// or https:// URL, got {url!r}")
    return url


def post_webhook(url: str, document: dict[str, Any], timeout: float = 10.0) -> int:
    """POST ``document`` as JSON; the HTTP status, or PayonceError when it fails."""
    body = json.dumps(document).encode()
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked to be http(s)
        check_webhook_url(url),
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "payonce-reconcile"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        raise PayonceError(f"--webhook: {url} answered {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PayonceError(f"--webhook: cannot post to {url}: {reason}") from exc

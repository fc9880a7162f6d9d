"""OpenTelemetry spans, when ``opentelemetry-api`` is installed and ``--otel`` is on.

One span per client request (``payonce.request``, kind SERVER) and one per
upstream call (``payonce.upstream``, kind CLIENT) with the ``gen_ai.*``
attributes of the OpenTelemetry semantic conventions for generative AI. The
spans are built when the work is done, with its real start and end times, so
tracing adds nothing to the hot path while the request runs. Without an SDK
configured (``opentelemetry-instrument``, or the application's own setup), the
API's tracer is a no-op.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from payonce.observe.calllog import CallRecord
    from payonce.observe.facts import UpstreamFacts

__all__ = ["Tracing", "open_tracing"]

_PERF_TO_EPOCH_NS = time.time_ns() - time.perf_counter_ns()


def _epoch_ns(perf_seconds: float) -> int:
    return int(perf_seconds * 1e9) + _PERF_TO_EPOCH_NS


def _system(path: str) -> str:
    return "anthropic" if path.startswith("/v1/messages") else "openai"


class Tracing:
    """Emits the gateway's spans through the OpenTelemetry API."""

    def __init__(self, trace: Any) -> None:
        self._trace = trace
        self._tracer = trace.get_tracer("payonce")

    def request(self, record: CallRecord, finished: float) -> None:
        span = self._tracer.start_span(
            "payonce.request",
            kind=self._trace.SpanKind.SERVER,
            start_time=_epoch_ns(record.started),
            attributes={
                "http.request.method": record.method,
                "url.path": record.path,
                "http.response.status_code": record.status,
                "payonce.outcome": record.outcome,
                "payonce.request_id": record.request_id,
                "payonce.keyed": record.key is not None,
                "payonce.tenant": record.tenant,
            },
        )
        if record.status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end(end_time=_epoch_ns(finished))

    def upstream(self, facts: UpstreamFacts, path: str, started: float) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.system": _system(path),
            "gen_ai.operation.name": "chat" if "chat" in path or "messages" in path else path,
            "payonce.upstream_attempts": facts.attempts,
            "payonce.stream": facts.stream,
        }
        if facts.status is not None:
            attributes["http.response.status_code"] = facts.status
        if facts.model:
            attributes["gen_ai.request.model"] = facts.model
        if facts.request_id:
            attributes["gen_ai.response.id"] = facts.request_id
        if facts.usage:
            attributes["gen_ai.usage.input_tokens"] = facts.usage.get("input_tokens", 0)
            attributes["gen_ai.usage.output_tokens"] = facts.usage.get("output_tokens", 0)
        if facts.cost_usd is not None:
            attributes["payonce.cost_usd"] = facts.cost_usd
        span = self._tracer.start_span(
            "payonce.upstream",
            kind=self._trace.SpanKind.CLIENT,
            start_time=_epoch_ns(started),
            attributes=attributes,
        )
        if facts.status is None or facts.status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end(end_time=_epoch_ns(started + (facts.latency or 0.0)))


def open_tracing() -> Tracing | None:
    """A :class:`Tracing` when ``opentelemetry-api`` is importable and a tracer provider is set.

    Without a provider (no SDK configured before the gateway starts, e.g. by
    ``opentelemetry-instrument``) every span would be a no-op that still costs
    its attributes on each request, so tracing stays off.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    if type(trace.get_tracer_provider()).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None
    return Tracing(trace)

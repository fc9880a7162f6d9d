"""OpenTelemetry spans, when ``opentelemetry-api`` is installed and ``--otel`` is on.

The spans follow the OpenTelemetry semantic conventions v1.37.0: HTTP for the
gateway's own span, GenAI (client inference spans) for the call to the model:

* one span per client request, kind SERVER, named by its method (``POST``: the
  gateway has no low-cardinality route), child of the caller's span when the
  request carries W3C trace context (``traceparent``), with ``payonce.outcome``;
* one span per upstream call, kind CLIENT, child of the request span of the
  request that made it, named ``{gen_ai.operation.name} {gen_ai.request.model}``
  (``chat gpt-4o-mini``) with ``gen_ai.operation.name``, ``gen_ai.provider.name``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens``, ``server.address`` /
  ``server.port`` and, when it failed, ``error.type``. It covers the whole call,
  connect retries included, to the end of a stream; it outlives its parent when the
  client left and the gateway finished the call for the retry. A call to a path that
  is no GenAI operation (``GET /v1/models``) is a plain HTTP client span.
* A replayed or joined request made no upstream call: it has no CLIENT child. A
  joined one links to the upstream span of the run it waited for (a span link: that
  span is in another request's trace).

Spans start when the work starts. Without an SDK configured (``opentelemetry-instrument``,
or the application's own setup), no tracer provider is set and tracing stays off
(:func:`open_tracing`): nothing is built per request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from payonce.observe.calllog import CallRecord
    from payonce.observe.facts import UpstreamFacts

__all__ = ["SEMCONV_VERSION", "Tracing", "open_tracing", "operation_of", "provider_of"]

SEMCONV_VERSION = "1.37.0"

_PERF_TO_EPOCH_NS = time.time_ns() - time.perf_counter_ns()

# gen_ai.operation.name by how the path ends (OpenAI, Anthropic and compatible APIs).
_OPERATIONS = (
    ("/chat/completions", "chat"),
    ("/messages", "chat"),  # Anthropic Messages
    ("/responses", "chat"),  # OpenAI Responses
    ("/completions", "text_completion"),
    ("/embeddings", "embeddings"),
    (":generateContent", "generate_content"),
    (":streamGenerateContent", "generate_content"),
)
# gen_ai.provider.name by upstream host (a suffix of it); otherwise by the API's flavor.
_PROVIDERS = (
    ("api.openai.com", "openai"),
    ("api.anthropic.com", "anthropic"),
    ("openai.azure.com", "azure.ai.openai"),
    ("services.ai.azure.com", "azure.ai.inference"),
    ("amazonaws.com", "aws.bedrock"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.cohere.com", "cohere"),
    ("api.cohere.ai", "cohere"),
)


def _epoch_ns(perf_seconds: float) -> int:
    return int(perf_seconds * 1e9) + _PERF_TO_EPOCH_NS


def operation_of(path: str) -> str | None:
    """The GenAI operation a request path is, or ``None`` when it is none (``/v1/models``)."""
    path = path.partition("?")[0].rstrip("/")
    return next((name for suffix, name in _OPERATIONS if path.endswith(suffix)), None)


def provider_of(host: str | None, path: str) -> str:
    """``gen_ai.provider.name``: the upstream's host when it is a known provider's.

    Any other upstream (vLLM, TGI, a proxy) is named by the API it speaks: Anthropic's
    Messages, else OpenAI's (the attribute names the telemetry's flavour, per the
    conventions; ``server.address`` tells which server it was).
    """
    if host:
        for suffix, name in _PROVIDERS:
            if host == suffix or host.endswith("." + suffix):
                return name
    return "anthropic" if path.rstrip("/").endswith("/messages") else "openai"


class _Headers:
    """The OpenTelemetry propagators' getter over an ASGI header list."""

    @staticmethod
    def get(carrier: Sequence[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        found = [value.decode("latin-1") for header, value in carrier if header == name]
        return found or None

    @staticmethod
    def keys(carrier: Sequence[tuple[bytes, bytes]]) -> list[str]:
        return [header.decode("latin-1") for header, _ in carrier]


class Tracing:
    """Emits the gateway's spans through the OpenTelemetry API.

    ``provider``: a tracer provider of its own (tests); by default the global one.
    :attr:`server`: the upstream's (host, port), for ``server.address`` / ``server.port``.
    """

    def __init__(self, trace: Any, provider: Any = None) -> None:
        from opentelemetry import propagate

        self._trace = trace
        self._extract = propagate.extract
        self._getter: Any = _Headers()  # duck-typed: opentelemetry-api is optional here
        from payonce import __version__

        self._tracer = (provider if provider is not None else trace).get_tracer(
            "payonce",
            __version__,
            schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}",
        )
        self.server: tuple[str, int] | None = None

    def start_request(self, record: CallRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Start the request's SERVER span (on ``record.span``), in the caller's trace if any."""
        record.span = self._tracer.start_span(
            record.method,
            context=self._extract(headers, getter=self._getter),
            kind=self._trace.SpanKind.SERVER,
            start_time=_epoch_ns(record.started),
        )

    def request(self, record: CallRecord, finished: float) -> None:
        """End the request's span, with what the client received."""
        span = record.span
        if span is None:  # started before tracing was set up: a span of its own
            self.start_request(record, ())
            span = record.span
        record.span = None
        span.set_attributes(
            {
                "http.request.method": record.method,
                "url.path": record.path,
                "url.scheme": "http",
                "http.response.status_code": record.status,
                "payonce.outcome": record.outcome,
                "payonce.request_id": record.request_id,
                "payonce.keyed": record.key is not None,
                "payonce.tenant": record.tenant,
            }
        )
        if record.status >= 500:
            span.set_attribute("error.type", str(record.status))
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end(end_time=_epoch_ns(finished))

    def start_upstream(self, facts: UpstreamFacts, record: CallRecord) -> None:
        """Start the CLIENT span of the call ``record``'s request makes (on ``facts.span``)."""
        operation = operation_of(record.path)
        parent = record.span
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        attributes: dict[str, Any]
        if operation is None:
            name, attributes = record.method, {"http.request.method": record.method}
        else:
            model = record.model
            name = f"{operation} {model}" if model else operation
            attributes = {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": provider_of(
                    self.server[0] if self.server else None, record.path
                ),
            }
            if model:
                attributes["gen_ai.request.model"] = model
        if self.server is not None:
            attributes["server.address"], attributes["server.port"] = self.server
        facts.span = self._tracer.start_span(
            name, context=context, kind=self._trace.SpanKind.CLIENT, attributes=attributes
        )

    def joined(self, record: CallRecord, facts: UpstreamFacts) -> None:
        """Link a request that waited for another's run to that run's upstream span."""
        if record.span is not None and facts.span is not None:
            record.span.add_link(facts.span.get_span_context())

    def upstream(self, facts: UpstreamFacts, path: str) -> None:
        """End the upstream call's span with what came back."""
        span = facts.span
        facts.span = None  # the replay cache keeps the facts, not the span
        if span is None:  # not started through start_upstream: a root span of its own
            span = self._tracer.start_span(
                operation_of(path) or "upstream",
                kind=self._trace.SpanKind.CLIENT,
                start_time=_epoch_ns(facts.started),
            )
        attributes: dict[str, Any] = {
            "payonce.upstream_attempts": facts.attempts,
            "payonce.stream": facts.stream,
        }
        status = facts.status
        if status is not None:
            attributes["http.response.status_code"] = status
        if operation_of(path) is not None:
            if facts.model:
                attributes["gen_ai.response.model"] = facts.model
            if facts.request_id:
                attributes["gen_ai.response.id"] = facts.request_id
            if facts.usage:
                attributes["gen_ai.usage.input_tokens"] = facts.usage.get("input_tokens", 0)
                attributes["gen_ai.usage.output_tokens"] = facts.usage.get("output_tokens", 0)
        if facts.cost_usd is not None:
            attributes["payonce.cost_usd"] = facts.cost_usd
        # error.type: the status the provider answered, or why there was no answer.
        error = None
        if facts.cancelled:
            error = "cancelled"  # the gateway stopped it: its client left
        elif status is None:
            error = "_OTHER"  # no response (connection failed or lost)
        elif status >= 400:
            error = str(status)
        if error is not None:
            attributes["error.type"] = error
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.set_attributes(attributes)
        span.end(end_time=_epoch_ns(facts.started + (facts.latency or 0.0)))


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

"""OpenTelemetry spans from the observer, captured with the SDK's in-memory exporter."""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from payonce.clock import ManualClock
from payonce.gateway.observing import Observer, UpstreamFacts
from payonce.observe.metrics import Metrics
from payonce.observe.tracing import Tracing


def test_one_span_per_request_and_per_upstream_call_with_gen_ai_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(trace)
    tracing._tracer = provider.get_tracer("payonce")
    observer = Observer(Metrics(), None, ManualClock(), tracing)

    record = observer.start("POST", "/v1/chat/completions", "tenant", [])
    record.outcome, record.status, record.key = "forwarded", 200, "k"
    started = time.perf_counter()
    facts = UpstreamFacts(
        status=200,
        request_id="chatcmpl-1",
        model="gpt-4o-mini",
        usage={"input_tokens": 5, "output_tokens": 7},
        cost_usd=0.001,
        latency=0.25,
        attempts=1,
        started=started,
    )
    observer.upstream_call(facts, "/v1/chat/completions")
    observer.finish(record)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"payonce.request", "payonce.upstream"}
    upstream = spans["payonce.upstream"].attributes
    assert upstream["gen_ai.system"] == "openai"
    assert upstream["gen_ai.request.model"] == "gpt-4o-mini"
    assert upstream["gen_ai.response.id"] == "chatcmpl-1"
    assert upstream["gen_ai.usage.input_tokens"] == 5
    assert upstream["gen_ai.usage.output_tokens"] == 7
    span = spans["payonce.upstream"]
    assert span.end_time - span.start_time == 250_000_000
    request = spans["payonce.request"].attributes
    assert request["payonce.outcome"] == "forwarded"
    assert request["http.response.status_code"] == 200
    assert request["payonce.keyed"] is True
